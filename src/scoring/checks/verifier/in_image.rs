//! The verifier in an image's root, as Harbor runs it in the task's container: the task's
//! `tests/` copied to `/tests`, `/logs/verifier` made anew and `/logs/agent` kept, both the
//! image's user's, then `bash /tests/test.sh` run in the image's working folder as that
//! user; the reward is read from `/logs/verifier`. Paths are the image's own: nothing is
//! rewritten. What the agent left at `/tests` or `/logs/verifier` (a planted reward, say)
//! is removed first.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{Verifier, fault, read_reward, run_test, shell_quote, verdict};
use crate::environment::beneath::{Beneath, Links};
use crate::environment::{ImageRoot, World, remove_tree_at};
use crate::scoring::ScoringFault;
use crate::scoring::checks::CheckResult;

pub(super) async fn check(
    world: &dyn World,
    image: &ImageRoot,
    verifier: &Verifier<'_>,
) -> Result<CheckResult, ScoringFault> {
    let root = Beneath::in_root(image.path(), Path::new("/"), image.owner())
        .map_err(|e| fault(format!("failed to open the image's root: {e}")))?;
    prepare(&root, Path::new(verifier.tests))
        .map_err(|e| fault(format!("failed to copy the task's tests into the final world: {e}")))?;
    let mut command = String::new();
    for (name, value) in verifier.env {
        command.push_str(&format!("export {name}={}; ", shell_quote(value)));
    }
    command.push_str("bash /tests/test.sh");
    let how = run_test(world, &command, verifier.timeout_s).await?;
    verdict(read_reward(&root, Path::new("logs/verifier")), &how)
}

/// Removes what is at `/tests` and `/logs/verifier`, makes `/logs/verifier` and
/// `/logs/agent`, and copies the task's tests (on the host, at `tests`) to `/tests`.
fn prepare(root: &Beneath, tests: &Path) -> std::io::Result<()> {
    for (parent, name) in [("", "tests"), ("logs", "verifier")] {
        root.create_dir_all(Path::new(parent))?;
        let folder = root.dir(Path::new(parent), Links::Inside)?;
        let name = CString::new(name).map_err(std::io::Error::other)?;
        remove_tree_at(std::os::fd::AsRawFd::as_raw_fd(&folder), &name)?;
    }
    root.create_dir_all(Path::new("logs/verifier"))?;
    root.create_dir_all(Path::new("logs/agent"))?;
    copy_in(root, tests, Path::new("tests"))
}

/// Copies the host folder `from` to `to` beneath the root, keeping each file's mode. Links
/// in the task's tests are not followed (the task folder was read beneath itself at load).
fn copy_in(root: &Beneath, from: &Path, to: &Path) -> std::io::Result<()> {
    root.create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(Path::new(std::ffi::OsStr::from_bytes(entry.file_name().as_bytes())));
        if kind.is_dir() {
            copy_in(root, &entry.path(), &target)?;
        } else if kind.is_file() {
            let bytes = std::fs::read(entry.path())?;
            let mode = entry.metadata()?.permissions().mode() & 0o7777;
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
            let mut file = root.file(&target, flags, mode, Links::None)?;
            file.write_all(&bytes)?;
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}
