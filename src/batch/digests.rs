//! What an episode is made of, part by part ([`EpisodeDigests`]), so that `--since` can
//! tell which part changed: what the agent sees of the task, the environment, the agent,
//! the model, the scorers and the grader. Each digest is over the part as loaded (its
//! settings, rendered prompts, tool specs), so that an edit that changes nothing of it
//! (a comment, a reordering of keys) changes no digest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::EpisodeSpec;
use crate::domain::Task;
use crate::environment::definition::Definition;
use crate::log::event::EpisodeDigests;
use crate::suite::Suite;

/// The first 16 hex digits of the SHA-256 of `text`: enough to tell versions apart.
fn short(text: &str) -> String {
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

/// The parts of an episode that its suite (and variant) fix, worked out once for all
/// the suite's episodes; the task's and the model's are added per episode.
#[derive(Clone)]
struct SuiteParts {
    environment: String,
    agent: String,
    /// Whether the agent's prompts show the task's target: it is then part of what the
    /// agent sees.
    shows_target: bool,
}

/// Works out episodes' digests, keeping what a suite fixes for its next episodes: one for
/// the run, shared by its episodes, so that an environment's file is read and its tools
/// serialised once, not once per episode.
#[derive(Default)]
pub struct Digester {
    /// By suite (its address: the run holds each once) and variant.
    suites: Mutex<HashMap<(usize, Option<usize>), SuiteParts>>,
    /// The `--grader` given, which stands over every suite's and scorer's.
    forced_grader: Option<String>,
}

impl Digester {
    pub fn new(forced_grader: Option<String>) -> Self {
        Digester { suites: Mutex::default(), forced_grader }
    }

    /// The digests of one episode.
    pub fn of(&self, spec: &EpisodeSpec) -> EpisodeDigests {
        let key = (Arc::as_ptr(&spec.suite) as usize, spec.variant);
        let parts = {
            let mut suites = self.suites.lock().unwrap_or_else(PoisonError::into_inner);
            suites.entry(key).or_insert_with(|| suite_parts(spec)).clone()
        };
        let suite = spec.suite.as_ref();
        let task = match spec.variant() {
            Some(v) => v.task(&suite.tasks[spec.task]),
            None => std::borrow::Cow::Borrowed(&suite.tasks[spec.task]),
        };
        let toolset = suite.toolset_for(&spec.id).map(|t| (t.name.as_str(), short(&environment_text(&t.environment))));
        EpisodeDigests {
            task: short(&task_seen(&task, parts.shows_target).to_string()),
            environment: match toolset {
                Some((name, env)) => short(&format!("{}\0{name}\0{env}", parts.environment)),
                None => parts.environment,
            },
            agent: parts.agent,
            model: short(&model_text(spec, &task)),
            scorers: short(&scorers_text(suite, &task, false)),
            world_scorers: short(&scorers_text(suite, &task, true)),
            grader: short(&self.grader_text(suite)),
        }
    }

    fn grader_text(&self, suite: &Suite) -> String {
        let (model, template) = suite.grader.as_ref().map_or((None, None), |g| (Some(&g.model), g.template.as_ref()));
        json!({"forced": self.forced_grader, "model": model, "template": template}).to_string()
    }
}

/// The environment's and the agent's digests under the episode's suite and variant.
fn suite_parts(spec: &EpisodeSpec) -> SuiteParts {
    let suite = spec.suite.as_ref();
    let variant = spec.variant();
    let agent = variant.map_or(&suite.agent, |v| &v.agent);
    let environment = variant.and_then(|v| v.environment.as_ref()).unwrap_or(&suite.environment);
    let prompt = variant.and_then(|v| v.prompt.as_deref()).unwrap_or_default();
    let shows_target = agent.system.as_deref().unwrap_or_default().contains("target") || prompt.contains("target");
    let agent_text = format!(
        "{}\0{:?}\0{:?}\0{:?}\0{:?}\0{:?}\0{prompt}",
        agent.kind.name(),
        agent.system,
        agent.settings,
        suite.limits,
        suite.permissions,
        suite.sandbox,
    );
    SuiteParts { environment: short(&environment_text(environment)), agent: short(&agent_text), shows_target }
}

/// What an environment is as loaded: its kind, its file's bytes, its tools as the agent is
/// shown them, its files, limits, sandbox and settings.
fn environment_text(d: &Definition) -> String {
    let file = d.path.as_ref().and_then(|p| std::fs::read(p).ok()).map(|b| hex::encode(Sha256::digest(b)));
    format!(
        "{}\0{:?}\0{:?}\0{}\0{:?}\0{:?}\0{:?}\0{:?}\0{:?}\0{:?}\0{}",
        d.name,
        d.kind.map(|k| k.name()),
        file,
        serde_json::to_string(&d.specs).unwrap_or_default(),
        d.files,
        d.limits,
        d.sandbox,
        d.scripts,
        d.settings,
        d.permissions,
        d.system_addition,
    )
}

/// What the agent sees of a task: everything but its target and scorers (the target too
/// when a prompt shows it).
fn task_seen(task: &Task, shows_target: bool) -> Value {
    let user = task.user.as_ref().map(|u| format!("{u:?}"));
    let shared = task.shared.as_ref().map(|s| s.digest.clone());
    let mut seen = json!({
        "input": task.input,
        "files": task.files,
        "metadata": task.metadata,
        "user": user,
        "memory": format!("{:?}", task.memory),
        "shared": shared,
        "copies": format!("{:?}", task.copies),
        "unavailable": task.unavailable,
    });
    if shows_target {
        seen["target"] = json!(task.target);
    }
    seen
}

/// The model under test and its sampling; for `mock`, the scripts it plays.
fn model_text(spec: &EpisodeSpec, task: &Task) -> String {
    let agent = spec.variant().map_or(&spec.suite.agent, |v| &v.agent);
    let sampling = Value::Object(agent.sampling.clone());
    let mut text = format!("{}\0{sampling}\0{}", spec.model.name(), Value::Object(spec.model.provider_sampling()));
    if spec.model.name() == "mock" {
        text.push_str(&format!("\0{:?}\0{:?}", task.mock, task.mock_subagents));
    }
    text
}

/// The scorers an episode is scored by (the suite's, then the task's), with what they
/// compare against; `world` keeps only those that read the final world, which a regrade
/// cannot read again.
fn scorers_text(suite: &Suite, task: &Task, world: bool) -> String {
    let scorers: Vec<Value> = suite
        .scorers
        .iter()
        .chain(&task.scorers)
        .filter(|s| !world || s.reads_world())
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .collect();
    if world {
        return json!({"scorers": scorers}).to_string();
    }
    json!({
        "scorers": scorers,
        "target": task.target,
        "answers": task.answers,
        "metadata": task.metadata,
        "pass_score": suite.pass_score,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_sixteen_hex_digits_and_follows_its_text() {
        assert_eq!(short("a").len(), 16);
        assert_eq!(short("a"), short("a"));
        assert_ne!(short("a"), short("b"));
    }

    #[test]
    fn the_target_is_seen_only_when_a_prompt_shows_it() {
        let mut task = Task::new("t", "do it");
        task.target = Some("42".into());
        let hidden = task_seen(&task, false);
        let mut other = task.clone();
        other.target = Some("43".into());
        assert_eq!(hidden, task_seen(&other, false));
        assert_ne!(task_seen(&task, true), task_seen(&other, true));
        other.input = "do it now".into();
        assert_ne!(hidden, task_seen(&other, false));
    }
}
