//! Who plays each part of an episode: the agent and its subagents (the model under test),
//! the task's simulated user, the graders. The run opens its models once ([`Roster`]);
//! each episode's [`Cast`] is decided here, once, from them.

use std::collections::HashMap;
use std::sync::Arc;

use super::EpisodeSpec;
use crate::agent::ModelFor;
use crate::contract::Actor;
use crate::domain::UserKind;
use crate::model::config::ModelConfig;
use crate::model::{Backend, BackendOptions, LanguageModel, Role, lend_beside, open_beside};
use crate::scoring::Graders;
use crate::suite::Suite;

/// The models a run opened besides those under test: the graders, and the models that play
/// the suites' simulated users.
#[derive(Default)]
pub struct Roster {
    pub graders: Graders,
    /// The backends that play simulated users, by model name (`mock` included).
    users: HashMap<String, Arc<Backend>>,
    /// `--user-model`: plays every simulated user, over the suites' choice.
    forced_user: Option<String>,
    /// The episodes' digests (`episode_started.digests`), what each suite fixes worked out
    /// once for the run.
    pub(crate) digester: super::digests::Digester,
}

impl Roster {
    /// The run's graders, and beside them the models that play the suites' simulated users
    /// (as [`user_played_by`] picks them for each model under test, `forced_user` over the
    /// suites' choice), cached and recorded as `options` ask; one whose calls every model
    /// under test replays is not opened. A model that cannot be opened is named with the
    /// first `user:` that asks for it, by file and line.
    pub fn open(
        graders: Graders,
        suites: &[Arc<Suite>],
        forced_user: Option<String>,
        config: &ModelConfig,
        options: BackendOptions,
        under_test: &[Arc<Backend>],
    ) -> Result<Self, String> {
        let mut users = HashMap::new();
        for name in played_users(suites, forced_user.as_deref(), under_test) {
            if users.contains_key(&name) {
                continue;
            }
            let opened = open_beside(&name, config, options.clone(), under_test).map_err(|e| match &forced_user {
                Some(_) => format!("--user-model {name}: {e}"),
                None => user_not_opened(suites, &name, &e),
            })?;
            if let Some(backend) = opened {
                users.insert(name, Arc::new(backend));
            }
        }
        let digester = super::digests::Digester::new(graders.forced.clone());
        Ok(Roster { graders, users, forced_user, digester })
    }

    /// The model a simulated user asks for: `--user-model` when given, else the task's.
    fn user_model<'a>(&'a self, task_model: &'a str) -> &'a str {
        self.forced_user.as_deref().unwrap_or(task_model)
    }
}

/// Why the simulated users' model `name` could not be opened, at the first task whose
/// `user:` names it (its suite file is read again for the line), and what to do.
fn user_not_opened(suites: &[Arc<Suite>], name: &str, error: &str) -> String {
    let asking = suites.iter().flat_map(|s| s.tasks.iter().enumerate().map(move |(i, t)| (s, i, t))).filter(
        |(_, _, t)| matches!(t.user.as_ref().map(|u| &u.kind), Some(UserKind::Simulated { model, .. }) if model == name),
    );
    let (mut first, mut others) = (None, 0);
    for (suite, index, _) in asking {
        match first {
            None => first = Some((suite, index)),
            Some((s, _)) if Arc::ptr_eq(s, suite) => {}
            Some(_) => others += 1,
        }
    }
    let message = format!(
        "the simulated user's model `{name}` could not be opened: {error}{}; pass --user-model MODEL to play every simulated user with another (`--user-model mock` plays the tasks' `mock_user:` turns)",
        if others > 0 { format!(" (other suites ask for it too: {others} tasks)") } else { String::new() }
    );
    let Some((suite, index)) = first else { return format!("simulated user: {message}") };
    let field = format!("tasks[{index}].user.simulated.model");
    match crate::config::decode::Source::read(&suite.path) {
        Ok((source, _)) => source.error(&field, message).to_string(),
        Err(_) => format!("{}: {field}: {message}", suite.path.display()),
    }
}

/// The models that play the suites' simulated users under the models under test, each once.
fn played_users(suites: &[Arc<Suite>], forced_user: Option<&str>, under_test: &[Arc<Backend>]) -> Vec<String> {
    let mut named: Vec<&str> = Vec::new();
    for task in suites.iter().flat_map(|s| &s.tasks) {
        if let Some(UserKind::Simulated { model, .. }) = task.user.as_ref().map(|u| &u.kind) {
            let model = forced_user.unwrap_or(model);
            if !named.contains(&model) {
                named.push(model);
            }
        }
    }
    let mut played: Vec<String> = Vec::new();
    for name in named {
        for m in under_test {
            let by = user_played_by(m.name(), name).to_owned();
            if !played.contains(&by) {
                played.push(by);
            }
        }
    }
    played
}

/// The model that plays a simulated user whose model is `user_model` when the model under
/// test is `under_test`: `mock` (the task's `mock_user:` turns) under `--model mock`, so that
/// a suite runs offline whatever its user's model; the user's own model otherwise.
pub fn user_played_by<'a>(under_test: &str, user_model: &'a str) -> &'a str {
    if under_test == "mock" { "mock" } else { user_model }
}

/// Who plays each part of one episode.
pub struct Cast<'a> {
    /// The model under test.
    pub under_test: Arc<Backend>,
    /// The main agent's model: the model under test, lent to this episode.
    pub agent: Arc<dyn LanguageModel>,
    /// Each subagent's model, by actor: the model under test (under `mock`, the subagent's
    /// own `mock_subagents:` script).
    pub subagents: ModelFor,
    /// The task's simulated user, when it has one whose model is open.
    pub user: Option<Arc<dyn LanguageModel>>,
    /// The graders; a replay of the model under test serves the calls it recorded of them.
    pub graders: &'a Graders,
}

impl<'a> Cast<'a> {
    pub fn of(spec: &EpisodeSpec, roster: &'a Roster) -> Self {
        let task = &spec.suite.tasks[spec.task];
        let (backend, suite, index, episode_id) = (spec.model.clone(), spec.suite.clone(), spec.task, spec.id.clone());
        // Each epoch answered anew, unless the suite shares the cache between them.
        let epoch = (!spec.suite.share_epochs).then_some(spec.epoch);
        // The agents' sampling: the suite's, or its variant's over it.
        let sampling = spec.variant().map_or(&spec.suite.agent.sampling, |v| &v.agent.sampling).clone();
        let agent = spec.model.lend_in_epoch(Role::Agent(&Actor::Main), task, &spec.id, epoch, &sampling);
        let subagents: ModelFor = Arc::new(move |actor| {
            backend.lend_in_epoch(Role::Agent(actor), &suite.tasks[index], &episode_id, epoch, &sampling)
        });
        Cast {
            under_test: spec.model.clone(),
            agent,
            subagents,
            user: user_model(spec, roster),
            graders: &roster.graders,
        }
    }
}

/// The model that plays the task's simulated user on this episode: `mock` (its `mock_user:`
/// turns) when the model under test is `mock`, else the user's own model; served from the
/// recording when the model under test replays one that holds its calls, else by the run's
/// backend of that name. `None` when the task has no simulated user, or its model is not open.
fn user_model(spec: &EpisodeSpec, roster: &Roster) -> Option<Arc<dyn LanguageModel>> {
    let task = &spec.suite.tasks[spec.task];
    let UserKind::Simulated { model, .. } = &task.user.as_ref()?.kind else { return None };
    let played_by = user_played_by(spec.model.name(), roster.user_model(model));
    let opened = roster.users.get(played_by).map(|b| &**b);
    lend_beside(played_by, Role::User, Some(&spec.model), opened, task, &spec.id)
}
