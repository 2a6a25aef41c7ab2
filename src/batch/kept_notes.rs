//! The notes kept across a task's epochs (`agent.memory.scope: task`): the agent's notes (per
//! model) in the run folder, one file per epoch that saved them,
//! `results/<run-id>/memory/<suite>.<task>.<model>.<hash>.e<N>.json`. The epochs of one task
//! run one after another, in epoch order, each starting from what the last scored epoch
//! before it left — never its own earlier save, so an epoch run again by a resume starts
//! where it first started.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use super::EpisodeSpec;
use crate::agent::notes::{Entries, NotesScope};

/// The folder of the run folder that holds the stores.
pub const FOLDER: &str = "memory";

/// Hands each episode of a `scope: task` suite its slot, in the order of the plan.
pub struct KeptNotes {
    dir: PathBuf,
    /// Per file, the signal that the episode before ends (its slot is dropped).
    last: HashMap<PathBuf, oneshot::Receiver<()>>,
}

/// One episode's turn at a task's stored memory: it waits for the epoch before it, reads
/// the stores, and writes them back when it was scored.
pub struct NotesSlot {
    /// The task's file; each epoch saves beside it as `….eN.json`.
    path: PathBuf,
    epoch: u32,
    /// The file `open` read the stores from.
    read: Option<PathBuf>,
    after: Option<oneshot::Receiver<()>>,
    /// Dropped with the slot: the next epoch may start.
    _done: oneshot::Sender<()>,
}

impl KeptNotes {
    pub fn new(run_dir: &Path) -> Self {
        KeptNotes { dir: run_dir.join(FOLDER), last: HashMap::new() }
    }

    /// The episode's slot, when its suite keeps memory across epochs; slots are taken in
    /// plan order, so an epoch waits for the one planned before it.
    pub fn slot(&mut self, spec: &EpisodeSpec) -> Option<NotesSlot> {
        let scope = spec.suite.agent.settings.notes().map(|m| m.scope);
        if scope != Some(NotesScope::Task) {
            return None;
        }
        let task = &spec.suite.tasks[spec.task];
        // Each variant keeps its own memory, as each model does.
        let model = match spec.variant() {
            Some(variant) => format!("{}+{}", spec.model.name(), variant.name),
            None => spec.model.name().to_owned(),
        };
        let path = self.dir.join(file_name(&spec.suite.name, &task.id, &model));
        let (done, next) = oneshot::channel();
        let after = self.last.insert(path.clone(), next);
        Some(NotesSlot { path, epoch: spec.epoch, read: None, after, _done: done })
    }
}

/// A readable, unique file name for a (suite, task, model).
fn file_name(suite: &str, task: &str, model: &str) -> String {
    let clean = |s: &str| -> String {
        let cut: String = s.chars().take(40).collect();
        cut.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
    };
    let mut h = Sha256::new();
    for part in [suite, task, model] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let hash = hex::encode(h.finalize());
    format!("{}.{}.{}.{}.json", clean(suite), clean(task), clean(model), &hash[..8])
}

impl NotesSlot {
    /// Waits for the epoch before (however it ended), then reads the stores it left; `None`
    /// when no epoch has left any yet.
    pub async fn open(&mut self) -> Result<Option<Entries>, String> {
        if let Some(after) = self.after.take() {
            // An error only says the slot before was dropped: it ended either way.
            let _ = after.await;
        }
        // The latest epoch before this one that left stores: never this epoch's own, so an
        // epoch run again (a resume after a crash) starts where it first started.
        for epoch in (1..self.epoch).rev() {
            let path = self.saved_by(epoch);
            match std::fs::read(&path) {
                Ok(bytes) => {
                    self.read = Some(path.clone());
                    return serde_json::from_slice(&bytes)
                        .map(Some)
                        .map_err(|e| format!("failed to read the task's memory {}: {e}", path.display()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("failed to read the task's memory {}: {e}", path.display())),
            }
        }
        Ok(None)
    }

    /// The file epoch `epoch` saved its stores in.
    fn saved_by(&self, epoch: u32) -> PathBuf {
        self.path.with_extension(format!("e{epoch}.json"))
    }

    /// The file the stores were read from (else the task's file, beside which each epoch
    /// saves its own).
    pub fn path(&self) -> &Path {
        self.read.as_deref().unwrap_or(&self.path)
    }

    /// Writes this epoch's stores in one step (a temporary file renamed into place).
    pub fn save(&self, entries: &Entries) -> Result<(), String> {
        let path = self.saved_by(self.epoch);
        let failed = |e: std::io::Error| format!("failed to write the task's memory {}: {e}", path.display());
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(failed)?;
        let bytes = serde_json::to_vec_pretty(entries).unwrap_or_default();
        let staged = path.with_extension("json.tmp");
        std::fs::write(&staged, crate::log::secrets::scrub_bytes(&bytes)).map_err(failed)?;
        std::fs::rename(&staged, &path).map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_readable_and_tell_models_apart() {
        let a = file_name("memory", "recall", "openai/gpt-4o-mini");
        assert!(a.starts_with("memory.recall.openai_gpt-4o-mini.") && a.ends_with(".json"), "{a}");
        assert_ne!(a, file_name("memory", "recall", "openai/gpt-4o"));
        // Cleaned alike, told apart by the hash.
        assert_ne!(file_name("s", "a/b", "m"), file_name("s", "a_b", "m"));
    }
}
