//! The final world's files, as scorers read them: a view that only kinds with files (or
//! texts read like files: `kv` keys, a writing room's documents) implement.

use async_trait::async_trait;

use super::{ToolFailure, World};
use crate::contract::ErrorType;

/// The files of a world, for scorers of the final state (`file_exists`, `file_contains`,
/// `document`, `from:`, `check:`). A kind with files hands it out through [`World::files`].
#[async_trait]
pub trait FileWorld: Send + Sync {
    /// The start of a file (or a key's value, in `kv`), at most `cap` bytes of it. A file
    /// that is not a regular file is refused.
    async fn read_back(&self, path: &str, cap: usize) -> Result<ReadBack, ToolFailure>;

    /// For `check:` scorers: runs a shell command in the final world; its exit code and
    /// output. Most worlds with files cannot.
    async fn run_check(&self, _command: &str, _timeout_s: f64) -> Result<(i32, String), ToolFailure> {
        Err(cannot_run_commands())
    }

    /// The working directory on the host, for a verifier that copies its tests into the
    /// final world before it runs them; `None` for worlds whose files are not a folder.
    fn working_directory(&self) -> Option<&std::path::Path> {
        None
    }

    /// The image's root the world runs in, for what must land at the image's own paths (a
    /// verifier's `/tests`) and the programs started there (a `cli` agent); `None` for a
    /// world on the host.
    fn image_root(&self) -> Option<ImageRoot> {
        None
    }
}

/// An image's root a world runs in, as the runner and the programs it starts there reach
/// it: the root's folder on the host, the host ids of the image's user (who owns what the
/// runner makes there), the working folder and variables its processes start with, and,
/// when the root is runner's own, the root and the user namespace programs enter it by.
#[derive(Clone)]
pub struct ImageRoot {
    pub path: std::path::PathBuf,
    pub owner: (u32, u32),
    /// The working folder, as the world's processes name it.
    pub workdir: std::path::PathBuf,
    pub env: std::collections::BTreeMap<String, String>,
    /// The root, its ids and the image's user (image ids); `None` in a container of
    /// another provider's, which runner's programs cannot enter.
    pub own: Option<OwnRoot>,
}

/// A root of runner's own: what a program needs to enter it.
#[derive(Clone)]
pub struct OwnRoot {
    pub root: std::sync::Arc<crate::sandbox::root::Root>,
    pub ids: std::sync::Arc<crate::sandbox::root::IdMap>,
    pub user: (u32, u32),
}

impl ImageRoot {
    /// The root's folder on the host.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The host ids of the image's user.
    pub fn owner(&self) -> (u32, u32) {
        self.owner
    }

    /// The working folder as the runner reaches it.
    pub fn workdir_on_host(&self) -> std::path::PathBuf {
        self.path().join(self.workdir.strip_prefix("/").unwrap_or(&self.workdir))
    }
}

/// What a scorer reads back from the final world.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadBack {
    /// The text, cut to the cap asked for.
    pub text: String,
    /// The size of the whole file, in bytes.
    pub size: u64,
}

impl ReadBack {
    /// Whether `text` holds less than the whole file.
    pub fn is_cut(&self) -> bool {
        self.size > self.text.len() as u64
    }
}

/// Any world, asked for its files: a world without them has none to read and no commands
/// to run, and says so.
impl dyn World + '_ {
    /// The start of a file of the final world, at most `cap` bytes of it.
    pub async fn read_back(&self, path: &str, cap: usize) -> Result<ReadBack, ToolFailure> {
        match self.files() {
            Some(files) => files.read_back(path, cap).await,
            None => Err(ToolFailure::new(
                ErrorType::ExecutionError,
                format!("`{path}` does not exist: this environment has no files"),
            )),
        }
    }

    /// Runs a `check:` command in the final world; its exit code and output.
    pub async fn run_check(&self, command: &str, timeout_s: f64) -> Result<(i32, String), ToolFailure> {
        match self.files() {
            Some(files) => files.run_check(command, timeout_s).await,
            None => Err(cannot_run_commands()),
        }
    }
}

fn cannot_run_commands() -> ToolFailure {
    ToolFailure::new(ErrorType::ExecutionError, "this environment cannot run commands")
}
