//! A world's sandbox made when the world starts its first process, not when the world is
//! set up: an episode that runs no command makes no Landlock ruleset and no pids cgroup.
//! What it will enforce is known before, from its definition's [`ConfinementPlan`].

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::confinement::{Confinement, ConfinementPlan};

pub struct LazyConfinement {
    plan: Option<Arc<ConfinementPlan>>,
    /// The world's own folders, writable by its processes.
    writable: Vec<PathBuf>,
    made: OnceLock<Result<Arc<Confinement>, String>>,
}

impl LazyConfinement {
    /// A sandbox to make from `plan` over `writable` at its first use.
    pub fn new(plan: Arc<ConfinementPlan>, writable: Vec<PathBuf>) -> Self {
        LazyConfinement { plan: Some(plan), writable, made: OnceLock::new() }
    }

    /// A sandbox made already (a world in an image's root, whose place made it).
    pub fn made(confinement: Arc<Confinement>) -> Self {
        LazyConfinement { plan: None, writable: Vec::new(), made: OnceLock::from(Ok(confinement)) }
    }

    /// The sandbox, made now if it was not: `first` runs before, once (to make the folders
    /// it covers). A failure is kept: every later process is refused with it too.
    pub fn get(&self, first: impl FnOnce() -> Result<(), String>) -> Result<&Arc<Confinement>, String> {
        let made = self.made.get_or_init(|| {
            let Some(plan) = &self.plan else { return Err("the world's sandbox was never made".into()) };
            first()?;
            let writable: Vec<&std::path::Path> = self.writable.iter().map(PathBuf::as_path).collect();
            plan.confine(&writable)
        });
        made.as_ref().map_err(Clone::clone)
    }

    /// What it enforces, made or not, as `run.json` and the first observation record it.
    pub fn enforced(&self) -> &Value {
        match (self.made.get(), &self.plan) {
            (Some(Ok(made)), _) => made.enforced(),
            (_, Some(plan)) => plan.enforced(),
            (_, None) => &Value::Null,
        }
    }

    /// Kills every process left in the world's cgroup, if it was made.
    pub fn kill_all(&self) {
        if let Some(Ok(made)) = self.made.get() {
            made.kill_all();
        }
    }

    /// Whether the sandbox was made: a process was started, or tried to be.
    pub fn is_made(&self) -> bool {
        self.made.get().is_some()
    }
}
