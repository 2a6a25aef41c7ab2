//! The git commit a run's suites were checked out at, for `run_started.git_revision`.
//!
//! Read from the repository's own files (`.git`, `HEAD`, the ref it names, `packed-refs`)
//! when they settle it, since starting `git` costs a run more than the rest of its start;
//! `git rev-parse HEAD` answers whatever they do not settle (a reftable, a repository
//! owned by another user, a bare repository, a layout not recognised).

use std::path::{Path, PathBuf};

/// What `git rev-parse HEAD` says in the folder of `near` (the first suite's file), or the
/// current folder; `None` outside a repository or before the first commit.
pub fn git_revision(near: Option<&Path>) -> Option<String> {
    let dir = near.and_then(Path::parent).filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match from_files(dir) {
        Found::Commit(id) => Some(id),
        Found::NoRepository => None,
        Found::Unsettled => from_git(dir),
    }
}

/// What the repository's files say.
#[derive(Debug, PartialEq)]
enum Found {
    Commit(String),
    /// No `.git` in the folder or any above it, and the folder is no bare repository.
    NoRepository,
    /// Something only git itself can settle.
    Unsettled,
}

fn from_git(dir: &Path) -> Option<String> {
    // git gets no secrets: only what it needs to find itself and the repository.
    let mut git = std::process::Command::new("git");
    git.args(["rev-parse", "HEAD"]).current_dir(dir).env_clear().stderr(std::process::Stdio::null());
    for var in ["PATH", "HOME"] {
        if let Some(value) = std::env::var_os(var) {
            git.env(var, value);
        }
    }
    let out = git.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn from_files(dir: &Path) -> Found {
    // The real folder, links and `..` resolved, as git climbs it: a path's text may climb
    // into another repository (`/a/b/../suites` is not in `/a/b`) or miss its own (a link).
    let Ok(start) = std::fs::canonicalize(dir) else { return Found::Unsettled };
    let Ok(discovered) = discover(&start) else { return Found::Unsettled };
    let Some((top, git_dir)) = discovered else {
        // git also takes a bare repository (or a `.git` folder itself) for the repository.
        let bare = start.ancestors().any(|a| a.join("HEAD").is_file() && a.join("objects").is_dir());
        return if bare { Found::Unsettled } else { Found::NoRepository };
    };
    // git refuses a repository owned by another user unless its configuration says it is
    // safe: leave that to git.
    if !owned_by_me(&top) || !owned_by_me(&git_dir) {
        return Found::Unsettled;
    }
    let common = match std::fs::read_to_string(git_dir.join("commondir")) {
        Ok(text) => git_dir.join(text.trim_end_matches(['\n', '\r'])),
        Err(_) => git_dir.clone(),
    };
    if common.join("reftable").exists() {
        return Found::Unsettled;
    }
    resolve(&git_dir, &common, "HEAD", 0)
}

/// The folder holding `.git` and the git directory, from `start` up to the end of its
/// file system (where git stops looking too); `Err` for a `.git` file not understood.
fn discover(start: &Path) -> Result<Option<(PathBuf, PathBuf)>, ()> {
    use std::os::unix::fs::MetadataExt as _;
    let device = std::fs::metadata(start).map_err(|_| ())?.dev();
    for folder in start.ancestors() {
        if std::fs::metadata(folder).map_err(|_| ())?.dev() != device {
            return Ok(None);
        }
        let dot_git = folder.join(".git");
        let Ok(meta) = std::fs::metadata(&dot_git) else { continue };
        if meta.is_dir() {
            return Ok(Some((folder.to_path_buf(), dot_git)));
        }
        // A worktree's or a submodule's `.git` is a file naming the git directory.
        let text = std::fs::read_to_string(&dot_git).map_err(|_| ())?;
        let named = text.strip_prefix("gitdir:").ok_or(())?.trim();
        return Ok(Some((folder.to_path_buf(), folder.join(named))));
    }
    Ok(None)
}

fn owned_by_me(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    std::fs::metadata(path).is_ok_and(|m| m.uid() == me)
}

/// The commit `name` (`HEAD` or a full ref name) points at, following symbolic refs.
fn resolve(git_dir: &Path, common: &Path, name: &str, depth: u32) -> Found {
    if depth > 5 {
        return Found::Unsettled;
    }
    // A worktree keeps HEAD and a few ref families of its own; the rest are shared.
    let own =
        name == "HEAD" || ["refs/bisect/", "refs/worktree/", "refs/rewritten/"].iter().any(|p| name.starts_with(p));
    let file = if own { git_dir.join(name) } else { common.join(name) };
    match std::fs::read_to_string(&file) {
        Ok(text) => {
            let text = text.trim_end_matches(['\n', '\r']);
            if let Some(target) = text.strip_prefix("ref:") {
                let target = target.trim();
                if !target.starts_with("refs/") || target.split('/').any(|part| part.is_empty() || part == "..") {
                    return Found::Unsettled;
                }
                return resolve(git_dir, common, target, depth + 1);
            }
            object_id(text).map_or(Found::Unsettled, Found::Commit)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !own => packed(common, name),
        Err(_) => Found::Unsettled,
    }
}

/// `name` in `packed-refs`; a branch without a commit yet is no revision.
fn packed(common: &Path, name: &str) -> Found {
    let text = match std::fs::read_to_string(common.join("packed-refs")) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return unborn(common),
        Err(_) => return Found::Unsettled,
    };
    for line in text.lines() {
        if line.starts_with('#') || line.starts_with('^') {
            continue;
        }
        if let Some((id, ref_name)) = line.split_once(' ')
            && ref_name == name
        {
            return object_id(id).map_or(Found::Unsettled, Found::Commit);
        }
    }
    unborn(common)
}

/// A branch not yet made (a new repository before its first commit): git says no
/// revision, as long as the repository is one git reads as this module does.
fn unborn(common: &Path) -> Found {
    if common.join("objects").is_dir() { Found::NoRepository } else { Found::Unsettled }
}

/// A full object id (SHA-1 or SHA-256) in lowercase hex.
fn object_id(text: &str) -> Option<String> {
    let ok = matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let status = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    }

    fn revision_is_gits(dir: &Path) {
        let read = from_files(dir);
        assert!(matches!(read, Found::Commit(_) | Found::NoRepository), "{read:?} in {}", dir.display());
        let by_files = match read {
            Found::Commit(id) => Some(id),
            _ => None,
        };
        assert_eq!(by_files, from_git(dir), "in {}", dir.display());
    }

    #[test]
    fn the_files_say_what_git_says_for_loose_packed_detached_worktree_and_unborn_heads() {
        let Ok(_) = std::process::Command::new("git").arg("--version").output() else { return };
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("repo");
        std::fs::create_dir_all(repo.join("suites")).unwrap();
        git(&repo, &["init", "-q"]);
        revision_is_gits(&repo.join("suites")); // unborn: no revision
        git(&repo, &["commit", "-q", "--allow-empty", "-m", "one"]);
        revision_is_gits(&repo.join("suites")); // a loose ref
        git(&repo, &["commit", "-q", "--allow-empty", "-m", "two"]);
        git(&repo, &["pack-refs", "--all"]);
        revision_is_gits(&repo); // a packed ref
        git(&repo, &["worktree", "add", "-q", "-b", "side", "../side"]);
        git(&root.path().join("side"), &["commit", "-q", "--allow-empty", "-m", "three"]);
        revision_is_gits(&root.path().join("side")); // a worktree's own branch
        git(&repo, &["checkout", "-q", "--detach", "HEAD~1"]);
        revision_is_gits(&repo); // detached
        // A path whose text climbs out of the repository, and a link into it: git resolves
        // both before it looks for `.git`.
        std::fs::create_dir_all(root.path().join("plain")).unwrap();
        revision_is_gits(&repo.join("../plain"));
        std::os::unix::fs::symlink(repo.join("suites"), root.path().join("link")).unwrap();
        revision_is_gits(&root.path().join("link"));
        let outside = tempfile::tempdir_in("/").or_else(|_| tempfile::tempdir()).unwrap();
        if from_files(outside.path()) == Found::NoRepository {
            revision_is_gits(outside.path());
        }
    }
}
