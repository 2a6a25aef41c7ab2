//! Where a shell world is: on the host (an episode folder, the host's programs), or in an
//! image's root (`crates/sandbox/src/root.rs`: the image's files under a private layer,
//! its own namespaces), whose paths, variables and user are the image's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::domain::Task;
use crate::environment::beneath::{Beneath, Links};
use crate::image::user::{Account, Accounts};
pub use crate::image::{ID_BASE, ID_RANGE, ReadyImage};
use crate::sandbox::root::{Bind, IdMap, Root, RootSpec};

/// An episode's place in an image's root.
pub struct InImage {
    pub root: Arc<Root>,
    pub ids: Arc<IdMap>,
    /// The image's user and group ids.
    pub user: (u32, u32),
    /// The working folder, as the world's processes name it.
    pub workdir: PathBuf,
    /// The variables every process of the world starts with: the image's, `HOME` its
    /// user's, `PATH` Docker's when the image sets none.
    pub env: BTreeMap<String, String>,
}

use crate::image::id_map;

/// Docker's `PATH` for an image that sets none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The variables of a process started in an image, as a container of it starts with: the
/// image's, Docker's `PATH` when it sets none, `HOME` its user's.
pub(super) fn image_env(config_env: &[String], home: &str) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> =
        config_env.iter().filter_map(|e| e.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    env.entry("PATH".into()).or_insert_with(|| DEFAULT_PATH.into());
    env.insert("HOME".into(), home.to_owned());
    env
}

impl InImage {
    /// Starts the episode's root from `image` (its private layer in `private`), resolves
    /// the image's user in its own `/etc/passwd` and `/etc/group`, makes its working folder
    /// and writes the task's files there, as that user's.
    pub fn start(
        image: &ReadyImage,
        private: &Path,
        files: &BTreeMap<String, String>,
        task: &Task,
        binds: &[Bind],
    ) -> Result<Self, String> {
        let ids = id_map()?;
        let spec = RootSpec { layers: image.layers.clone(), private: private.to_owned(), binds: binds.to_vec() };
        let root = Root::start(&spec).map_err(|e| format!("the image {}: {e}", image.name))?;
        let user = resolve_user(root.path(), image.user())
            .map_err(|e| format!("the image {}: USER {}: {e}", image.name, image.user().unwrap_or("")))?;
        let place = InImage {
            root: Arc::new(root),
            ids,
            user: (user.uid, user.gid),
            workdir: image.workdir(),
            env: BTreeMap::new(),
        };
        let workdir = place.files()?;
        seed(&workdir, files, task)?;
        place.harbor_folders(task)?;
        let env = image_env(&image.config.env, &user.home);
        Ok(InImage { env, ..place })
    }

    /// The host ids of the image's user, which own what the runner makes in the root.
    pub fn owner(&self) -> (u32, u32) {
        (self.ids.base + self.user.0, self.ids.base + self.user.1)
    }

    /// The working folder as the runner reaches it, through the root's holder.
    pub fn workdir_on_host(&self) -> PathBuf {
        in_root(self.root.path(), &self.workdir)
    }

    fn harbor_folders(&self, task: &Task) -> Result<(), String> {
        harbor_folders(self.root.path(), self.owner(), task)
    }

    /// The working folder held open, the image's user owning what the runner makes there;
    /// made when the image lacks it.
    pub fn files(&self) -> Result<Beneath, String> {
        open_workdir(self.root.path(), &self.workdir, self.owner())
    }
}

/// `path`, as the image's processes name it, in the image's root `root` on the host.
pub(super) fn in_root(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The working folder `workdir` of the image's root `root` (on the host) held open, made
/// when the image lacks it, `owner` (host ids) owning what the runner makes there.
pub(super) fn open_workdir(root: &Path, workdir: &Path, owner: (u32, u32)) -> Result<Beneath, String> {
    let opened =
        Beneath::in_root(root, Path::new("/"), owner).map_err(|e| format!("failed to open the image's root: {e}"))?;
    let relative = workdir.strip_prefix("/").unwrap_or(workdir);
    opened.create_dir_all(relative).map_err(|e| format!("failed to make {}: {e}", workdir.display()))?;
    Beneath::in_root(&in_root(root, workdir), workdir, owner)
        .map_err(|e| format!("failed to open {}: {e}", workdir.display()))
}

/// A Harbor task's folders in an image's root (`root` on the host), as its container has
/// them: `/logs/agent` and `/logs/verifier` for its logs, and `/solution` (empty: the oracle
/// copies the solution there) when it has one, `owner`'s (host ids).
pub(super) fn harbor_folders(root: &Path, owner: (u32, u32), task: &Task) -> Result<(), String> {
    if !task.metadata.contains_key("harbor") {
        return Ok(());
    }
    let root =
        Beneath::in_root(root, Path::new("/"), owner).map_err(|e| format!("failed to open the image's root: {e}"))?;
    let solution = (!task.solution.is_empty()).then_some("solution");
    for folder in ["logs/agent", "logs/verifier"].into_iter().chain(solution) {
        root.create_dir_all(Path::new(folder)).map_err(|e| format!("failed to make /{folder}: {e}"))?;
    }
    Ok(())
}

/// Writes the definition's and the task's files in the working folder, and copies the
/// task's host files there.
pub(super) fn seed(workdir: &Beneath, files: &BTreeMap<String, String>, task: &Task) -> Result<(), String> {
    let write = |name: &str, bytes: &[u8]| -> Result<(), String> {
        if !crate::domain::is_relative_inside(name) {
            return Err(format!("file `{name}` would land outside the working directory"));
        }
        let path = Path::new(name);
        if let Some(parent) = path.parent() {
            workdir.create_dir_all(parent).map_err(|e| format!("failed to create {}: {e}", parent.display()))?;
        }
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW;
        let mut file =
            workdir.file(path, flags, 0o644, Links::None).map_err(|e| format!("failed to write {name}: {e}"))?;
        std::io::Write::write_all(&mut file, bytes).map_err(|e| format!("failed to write {name}: {e}"))
    };
    for (name, content) in files.iter().chain(&task.files) {
        write(name, content.as_bytes())?;
    }
    for copy in &task.copies {
        let failed = |e: std::io::Error| format!("failed to read {}: {e}", copy.root.join(&copy.from).display());
        let (mut from, _) = crate::environment::folder::open_copy(copy).map_err(failed)?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut from, &mut bytes).map_err(failed)?;
        write(&copy.to, &bytes)?;
    }
    Ok(())
}

/// `USER` resolved in the image's `/etc/passwd` and `/etc/group` (read in `root`): a name or
/// an id, with an optional `:group`. Root when none is given.
pub(super) fn resolve_user(root: &Path, user: Option<&str>) -> Result<Account, String> {
    let read = |file: &str| std::fs::read_to_string(root.join(file)).unwrap_or_default();
    Accounts { passwd: read("etc/passwd"), group: read("etc/group") }.user(user.unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_images_user_is_found_by_name_or_number_with_its_group() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::write(
            root.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(root.path().join("etc/group"), "root:x:0:\napp:x:1000:\nstaff:x:50:\n").unwrap();
        let user = |u: Option<&str>| resolve_user(root.path(), u);
        assert_eq!(user(None), Ok(Account { uid: 0, gid: 0, home: "/root".into() }));
        assert_eq!(user(Some("app")), Ok(Account { uid: 1000, gid: 1000, home: "/home/app".into() }));
        assert_eq!(user(Some("1000:staff")).map(|u| (u.uid, u.gid)), Ok((1000, 50)));
        assert_eq!(user(Some("4242")).map(|u| (u.uid, u.gid)), Ok((4242, 4242)), "a number with no account is itself");
        assert_eq!(user(Some("nobody")), Err("no user `nobody` in the image's /etc/passwd".into()));
        assert_eq!(user(Some("app:wheel")), Err("no group `wheel` in the image's /etc/group".into()));
        assert!(user(Some("70000")).is_err(), "beyond the image's ids");
    }
}
