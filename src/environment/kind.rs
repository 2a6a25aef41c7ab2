//! What a kind of environment is given to set up a world ([`SetupContext`]), and the
//! state the episodes of a run share ([`RunStore`]). The kinds themselves are in `kinds/`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::model::Backend;
use crate::sandbox::SandboxMode;

/// What a kind may use to set up a world, besides its definition and the task.
pub struct SetupContext<'a> {
    /// The run's scratch folder, removed with the run: a world that needs a folder makes
    /// it in here.
    pub work_root: &'a Path,
    pub episode_id: &'a str,
    /// Model backends the world may call (to play a simulated user, say).
    pub models: Vec<Arc<Backend>>,
    /// State shared by the run's episodes (a memory kept across them, say).
    pub run_store: Option<Arc<RunStore>>,
    /// Whether the processes a world starts run in the sandbox: off only when the suite or
    /// the command line says so.
    pub sandbox: SandboxMode,
    /// The model that plays the task's simulated user, already lent to this episode.
    pub user_model: Option<Arc<dyn crate::model::LanguageModel>>,
    /// The run folder (`results/<run-id>`), kept after the run: for what every episode of
    /// the run, and the run resumed, must see the same (the `web` kind's page cache).
    /// `None` outside a run.
    pub run_dir: Option<&'a Path>,
    /// Where images come from and are kept (runner.yaml's `images:`); the defaults when
    /// `None`.
    pub images: Option<Arc<crate::image::Images>>,
    /// Host folders a world in an image's root binds into it (a `cli` agent's program, read
    /// only); a world on the host has no use for them.
    pub binds: Vec<crate::sandbox::root::Bind>,
    /// Where the world is to be kept instead of removed when the episode ends
    /// (`--keep-worlds`); `None`: removed.
    pub keep: Option<std::path::PathBuf>,
}

impl<'a> SetupContext<'a> {
    /// A context with no models and no run-wide state.
    pub fn new(work_root: &'a Path, episode_id: &'a str) -> Self {
        SetupContext {
            work_root,
            episode_id,
            models: Vec::new(),
            run_store: None,
            sandbox: SandboxMode::On,
            user_model: None,
            run_dir: None,
            images: None,
            binds: Vec::new(),
            keep: None,
        }
    }

    /// Where images come from and are kept.
    pub fn images(&self) -> &crate::image::Images {
        static DEFAULT: std::sync::OnceLock<crate::image::Images> = std::sync::OnceLock::new();
        self.images.as_deref().unwrap_or_else(|| DEFAULT.get_or_init(crate::image::Images::default))
    }
}

/// Values that outlive one episode, by key, shared by the episodes of a run.
#[derive(Debug, Default)]
pub struct RunStore {
    values: Mutex<BTreeMap<String, Value>>,
}

impl RunStore {
    pub fn get(&self, key: &str) -> Option<Value> {
        self.with_values(|values| values.get(key).cloned())
    }

    /// Replaces the value under `key` with what `change` makes of the old one, at once for
    /// all episodes; returns the new value.
    pub fn update(&self, key: &str, change: impl FnOnce(Option<&Value>) -> Value) -> Value {
        self.with_values(|values| {
            let new = change(values.get(key));
            values.insert(key.to_owned(), new.clone());
            new
        })
    }

    fn with_values<T>(&self, f: impl FnOnce(&mut BTreeMap<String, Value>) -> T) -> T {
        // A poisoned lock only means another episode panicked; the map itself is intact.
        let mut guard = self.values.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }
}
