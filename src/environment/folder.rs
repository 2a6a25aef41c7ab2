//! An episode's folder, for worlds that have files: `work/`, the working directory (and
//! `HOME`), seeded with the definition's and the task's `files:`, and `tmp/`, the
//! processes' `TMPDIR`. Both are what the sandbox lets a world's processes write.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::domain::Task;

pub struct EpisodeFolder {
    dir: tempfile::TempDir,
    /// The working directory, with symlinks resolved.
    pub work: PathBuf,
    pub tmp: PathBuf,
}

impl EpisodeFolder {
    /// Makes `runner-episode-XXXX/{work,tmp}` in `work_root` and writes the files: the
    /// definition's `files`, then the task's.
    pub fn create(files: &BTreeMap<String, String>, task: &Task, work_root: &Path) -> Result<Self, String> {
        let made = |what: &str| {
            let what = what.to_owned();
            move |e: std::io::Error| format!("failed to create {what}: {e}")
        };
        let dir = tempfile::Builder::new()
            .prefix("runner-episode-")
            .tempdir_in(work_root)
            .map_err(made("the episode's folder"))?;
        let base = dir.path().canonicalize().map_err(|e| format!("failed to resolve the episode's folder: {e}"))?;
        let (work, tmp) = (base.join("work"), base.join("tmp"));
        std::fs::create_dir(&work).map_err(made("the working directory"))?;
        std::fs::create_dir(&tmp).map_err(made("the temp dir"))?;
        for (name, content) in files.iter().chain(&task.files) {
            if !crate::domain::is_relative_inside(name) {
                return Err(format!("file `{name}` would land outside the working directory"));
            }
            let path = work.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| format!("failed to create {}: {e}", parent.display()))?;
            }
            std::fs::write(&path, content).map_err(|e| format!("failed to write {name}: {e}"))?;
        }
        Ok(EpisodeFolder { dir, work, tmp })
    }

    /// Removes the folder, off the runtime's threads (it may hold many files); dropping
    /// the value then finds nothing, or retries what failed here.
    pub async fn remove(&self) {
        let _ = tokio::fs::remove_dir_all(self.dir.path()).await;
    }
}
