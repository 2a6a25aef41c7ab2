//! Models handed out by role: the one place a [`Backend`] lends an episode the model an
//! agent, the simulated user or a grader talks to — which script `mock` plays, which tape
//! a replay serves, and how the cache and the cassette wrap it.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::cache::Cached;
use super::config::ModelConfig;
use super::http::Sampled;
use super::replay::Recording;
use super::{Backend, BackendOptions, LanguageModel, Source, echo, mock};
use crate::contract::Actor;
use crate::domain::{MockTurn, Task};

/// Who a model is lent to on one episode.
#[derive(Debug, Clone, Copy)]
pub enum Role<'a> {
    /// One of the episode's agents: `main`, or a subagent (`main.1`, …).
    Agent(&'a Actor),
    /// The task's simulated user.
    User,
    /// The grader of one scorer: its calls are nobody's in the episode.
    Grader { scorer: &'a str },
}

impl Role<'_> {
    /// The turns `mock` plays in this role: the task's `mock:` for the main agent, a
    /// subagent's own `mock_subagents:` script, the user's `mock_user:`; none for a grader
    /// (a scorer's `mock:` is played without a backend).
    fn script(self, task: &Task) -> Arc<[MockTurn]> {
        match self {
            Role::Agent(Actor::Main) => task.mock.clone(),
            Role::Agent(actor) => {
                task.mock_subagents.get(&actor.to_string()).cloned().unwrap_or_else(|| Vec::new().into())
            }
            Role::User => task.user.as_ref().map_or_else(|| Vec::new().into(), |u| u.mock.clone()),
            Role::Grader { .. } => Vec::new().into(),
        }
    }

    /// Only the agents wait out `--mock-delay-ms`: it stands in for the model under test.
    fn delayed(self) -> bool {
        matches!(self, Role::Agent(_))
    }

    /// How a call is kept on the cassette: the user's calls under its actor, a grader's
    /// marked with its scorer, the agents' (subagents' too) as the main agent's.
    fn recorded_as(self) -> (Actor, Option<String>) {
        match self {
            Role::Agent(_) => (Actor::Main, None),
            Role::User => (Actor::User, None),
            Role::Grader { scorer } => (Actor::Main, Some(scorer.to_owned())),
        }
    }
}

impl Backend {
    /// The model `role` talks to on one episode of `task`: `mock` plays the role's script,
    /// a replay serves the recorded agent's calls, a provider is called; then cached and
    /// recorded as the run asked.
    pub fn lend(&self, role: Role<'_>, task: &Task, episode_id: &str) -> Arc<dyn LanguageModel> {
        self.lend_in_epoch(role, task, episode_id, None, &Map::new())
    }

    /// [`Backend::lend`], the cache keyed by `epoch` too (`None`: shared by the epochs), so
    /// that an episode's repeats are answered anew rather than from each other's entries,
    /// and a provider's model asked with `sampling` over the provider's settings (an
    /// agent's: its suite's or variant's `agent.sampling`). `mock`, `echo` and replays
    /// answer as scripted or recorded, whatever the sampling.
    pub fn lend_in_epoch(
        &self,
        role: Role<'_>,
        task: &Task,
        episode_id: &str,
        epoch: Option<u32>,
        sampling: &Map<String, Value>,
    ) -> Arc<dyn LanguageModel> {
        let model: Arc<dyn LanguageModel> = match &self.source {
            Source::Mock => {
                let model = mock::MockModel::new(role.script(task));
                Arc::new(if role.delayed() { model.with_delay(self.options.mock_delay_ms) } else { model })
            }
            Source::Echo => Arc::new(echo::EchoModel),
            Source::Http(m) if sampling.is_empty() => m.clone(),
            Source::Http(m) => Arc::new(Sampled::new(m.clone(), sampling)),
            Source::Endpoint(m) => Arc::new(m.for_task(task.template_context())),
            Source::Replay(r) => r.episode(None, episode_id, &task.id),
            Source::Lent(m) => m.clone(),
        };
        self.wrap(role, model, episode_id, epoch)
    }

    /// Whether this backend replays a recording that holds the calls of `model` (a grader
    /// or a simulated user of the recorded run).
    pub fn replays(&self, model: &str) -> bool {
        matches!(&self.source, Source::Replay(r) if r.records_grader(model))
    }

    /// When this backend replays a recording that holds the calls of `model`: `role`
    /// played by `model` as it answered on one episode.
    fn lend_recorded(
        &self,
        model: &str,
        role: Role<'_>,
        task: &Task,
        episode_id: &str,
    ) -> Option<Arc<dyn LanguageModel>> {
        match &self.source {
            Source::Replay(r) if r.records_grader(model) => {
                Some(self.wrap(role, r.episode(Some(model), episode_id, &task.id), episode_id, None))
            }
            _ => None,
        }
    }

    /// The cache (never in front of a replay, nor of a user's script) and the cassette, as
    /// the run asked.
    fn wrap(
        &self,
        role: Role<'_>,
        mut model: Arc<dyn LanguageModel>,
        episode_id: &str,
        epoch: Option<u32>,
    ) -> Arc<dyn LanguageModel> {
        let uncached = match self.source {
            Source::Replay(_) => true,
            Source::Mock => matches!(role, Role::User),
            // Nothing to save: it answers at once.
            Source::Echo => true,
            // Its requests are rendered from the task's fields too, which the request
            // digest does not see: two tasks asking the same prompt are not the same call.
            Source::Endpoint(_) => true,
            Source::Http(_) => false,
            // Another's decisions, each asked once.
            Source::Lent(_) => true,
        };
        if let (Some(options), false) = (&self.options.cache, uncached) {
            model = Arc::new(Cached::new(model, options.clone()).in_epoch(epoch));
        }
        if let Some(cassette) = &self.options.record {
            let (actor, scorer) = role.recorded_as();
            model = Arc::new(Recording {
                inner: model,
                cassette: cassette.clone(),
                episode_id: episode_id.to_owned(),
                scorer,
                actor,
            });
        }
        model
    }
}

/// Opens `spec` to play a part beside the models under test (a grader, a simulated user),
/// unless every model under test replays a recording that holds its calls: a replay needs
/// no endpoint or key of its own. `None` then.
pub fn open_beside(
    spec: &str,
    config: &ModelConfig,
    options: BackendOptions,
    under_test: &[Arc<Backend>],
) -> Result<Option<Backend>, String> {
    if !under_test.is_empty() && under_test.iter().all(|m| m.replays(spec)) {
        return Ok(None);
    }
    Backend::open(spec, config, options).map(Some)
}

/// The model `name` playing `role` (a grader, a simulated user) on one episode: its
/// recorded calls when the model under test replays a recording that holds them, else lent
/// by the backend the run opened for it. `None` when neither has it.
pub fn lend_beside(
    name: &str,
    role: Role<'_>,
    under_test: Option<&Backend>,
    opened: Option<&Backend>,
    task: &Task,
    episode_id: &str,
) -> Option<Arc<dyn LanguageModel>> {
    under_test
        .and_then(|m| m.lend_recorded(name, role, task, episode_id))
        .or_else(|| opened.map(|b| b.lend(role, task, episode_id)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::text::Text;
    use crate::domain::{UserKind, UserSpec};

    fn turns(text: &str) -> Arc<[MockTurn]> {
        vec![MockTurn { text: Some(Text(text.to_owned())), tool_calls: Vec::new() }].into()
    }

    #[test]
    fn mock_plays_each_role_its_own_script() {
        let mut task = Task::new("t", "do it");
        task.mock = turns("main");
        task.mock_subagents = Arc::new([("main.1".to_owned(), turns("child"))].into_iter().collect());
        task.user = Some(Arc::new(UserSpec {
            kind: UserKind::Simulated { model: "openai/m".into(), persona: String::new(), instructions: String::new() },
            conversation: false,
            stop: crate::domain::DEFAULT_STOP.into(),
            mock: turns("user"),
        }));
        let first = |role: Role<'_>| role.script(&task).first().and_then(|t| t.text.clone()).map(|t| t.0);
        assert_eq!(first(Role::Agent(&Actor::Main)).as_deref(), Some("main"));
        assert_eq!(first(Role::Agent(&Actor::Subagent(vec![1]))).as_deref(), Some("child"));
        assert_eq!(first(Role::Agent(&Actor::Subagent(vec![2]))), None, "a child without a script has none");
        assert_eq!(first(Role::User).as_deref(), Some("user"));
        assert_eq!(first(Role::Grader { scorer: "llm_rubric" }), None);
    }

    #[test]
    fn the_cassette_keeps_the_users_calls_as_its_own_and_a_graders_with_its_scorer() {
        let child = Actor::Subagent(vec![1]);
        assert_eq!(Role::Agent(&child).recorded_as(), (Actor::Main, None));
        assert_eq!(Role::User.recorded_as(), (Actor::User, None));
        assert_eq!(Role::Grader { scorer: "s" }.recorded_as(), (Actor::Main, Some("s".to_owned())));
        assert!(Role::Agent(&child).delayed() && !Role::User.delayed() && !Role::Grader { scorer: "s" }.delayed());
    }
}
