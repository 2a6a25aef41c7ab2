//! One episode from start to finish, as five named stages over one [`Episode`]: open it
//! (its task as asked, its notes, `episode_started`), set up its world and its agent's
//! set-up, play the loop, score against the final world, close it (its notes kept,
//! `episode_finished`). A failure to set up makes the episode unscored and skips to close.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::cast::{Cast, Roster};
use super::kept_notes::NotesSlot;
use super::{EpisodeReport, EpisodeSpec};
use crate::agent::notes::{SharedStores, Stores};
use crate::agent::{Agent, AgentConfig, AgentSetup, EpisodeState, Lent, ProgramRoom, RoomInImage, WorldFacts};
use crate::config::template;
use crate::contract::Actor;
use crate::domain::Task;
use crate::environment::{Definition, Ending, Environment, SetupContext, World};
use crate::log::event::{INITIAL_SCORING, ProgramEnd, Stage};
use crate::log::{Event, EventLog, Outcome, Recorder, Termination, UnscoredCause, Usage};
use crate::model::{LanguageModel, Role};
use crate::sandbox::{Confinement, SandboxMode};
use crate::scoring::{self, Finished};
use crate::suite::Suite;

/// Where a run's episodes run: its scratch folder (removed with the run), its own folder
/// (`results/<run-id>`, kept), and the sandbox the command line asked for.
#[derive(Debug, Clone)]
pub struct Grounds {
    pub scratch: Arc<super::Scratch>,
    pub run_dir: std::path::PathBuf,
    pub sandbox: SandboxMode,
    /// Where each episode's world is kept instead of removed (`--keep-worlds`).
    pub keep_worlds: Option<std::path::PathBuf>,
    /// The run's own stop (Ctrl-C). The episodes' stop is its child, which a hard budget
    /// cancels alone: an episode stopped while this one is not was stopped by the budget.
    pub run_stop: CancellationToken,
}

/// Runs one episode: open, set up, play, score, close.
pub async fn run_episode(
    spec: EpisodeSpec,
    memory: Option<NotesSlot>,
    log: &EventLog,
    roster: &Roster,
    grounds: &Grounds,
    stop: &CancellationToken,
) -> EpisodeReport {
    let episode = Episode::open(&spec, memory, log, roster, grounds).await;
    let lend_again = |task: &Task| episode.lend_again(task);
    let played = match episode.set_up(&lend_again).await {
        Err((cause, message)) => {
            episode.recorder.emit(&Event::Error { step: 0, cause: cause.clone(), message: message.clone() });
            Played::not_set_up(Outcome::Unscored { cause, message })
        }
        Ok((world, setup)) => {
            let mut played = episode.play(&world, setup, stop).await;
            if played.ending.termination == Termination::UserStop && !grounds.run_stop.is_cancelled() {
                played.ending.termination = Termination::Budget;
            }
            played.outcome = episode.score(&played.ending, world.world(), played.wall_s).await;
            let agent = played.agent.take();
            played.program = episode.tear_down(world, agent, (played.ending.termination, &played.outcome)).await;
            played
        }
    };
    episode.close(played)
}

/// One episode under way: its spec, the task as it is asked, its agent, its world's
/// definition, its cast, its notes and where it logs.
struct Episode<'a> {
    spec: &'a EpisodeSpec,
    suite: &'a Suite,
    /// The task as the episode asks it (under a variant, its input rendered from its prompt).
    task: Cow<'a, Task>,
    /// The suite's agent, or its variant's.
    agent: &'a AgentConfig,
    /// The environment the episode's world is set up from: its variant's or its toolset's,
    /// else the suite's.
    environment: &'a Arc<Definition>,
    grounds: &'a Grounds,
    cast: Cast<'a>,
    recorder: Recorder,
    started: Instant,
    /// With `scope: task`, the task's turn at the notes kept across its epochs.
    slot: Option<NotesSlot>,
    /// The agent's notes, when it keeps them; or why those an earlier epoch left could not
    /// be read back.
    notes: Result<Option<SharedStores>, String>,
}

/// What playing (or failing to set up) an episode came to.
struct Played {
    ending: Ending,
    outcome: Outcome,
    /// The agent, until it is told how the episode ended.
    agent: Option<Box<dyn Agent>>,
    /// How a program agent's program ended.
    program: Option<ProgramEnd>,
    /// The loop's wall time, and what the task's simulated user spent.
    wall_s: f64,
    loop_ms: Option<f64>,
    user_spent: Option<(Usage, Option<f64>)>,
}

impl Played {
    fn not_set_up(outcome: Outcome) -> Self {
        let ending = Ending::new(Termination::EnvironmentError);
        Played { ending, outcome, agent: None, program: None, wall_s: 0.0, loop_ms: None, user_spent: None }
    }
}

impl<'a> Episode<'a> {
    /// Opens the episode: the task as its variant asks it, the notes an earlier epoch left
    /// (waiting for that epoch to end), the cast, and `episode_started`.
    async fn open(
        spec: &'a EpisodeSpec,
        mut slot: Option<NotesSlot>,
        log: &EventLog,
        roster: &'a Roster,
        grounds: &'a Grounds,
    ) -> Episode<'a> {
        let suite = spec.suite.as_ref();
        let variant = spec.variant();
        // A variant's settings stand in for the suite's, and its prompt for the task's input.
        let agent = variant.map_or(&suite.agent, |v| &v.agent);
        let task = match variant {
            Some(v) => v.task(&suite.tasks[spec.task]),
            None => Cow::Borrowed(&suite.tasks[spec.task]),
        };
        let notes = open_notes(suite, &task, slot.as_mut()).await;
        let started = Instant::now();
        let toolset = suite.toolset_for(&spec.id);
        let environment = variant
            .and_then(|v| v.environment.as_ref())
            .or(toolset.map(|t| &t.environment))
            .unwrap_or(&suite.environment);
        let recorder = log.recorder(&spec.id);
        recorder.emit(&Event::EpisodeStarted {
            suite: suite.name.clone(),
            task_id: task.id.clone(),
            task_digest: task.digest.clone(),
            model: spec.model.name().to_owned(),
            epoch: spec.epoch,
            environment: suite.environment.name.clone(),
            toolset: toolset.map(|t| t.name.clone()),
            variant: variant.map(|v| v.name.clone()),
            sampling: agent.sampling.clone(),
            digests: Some(roster.digester.of(spec)),
            tags: task.tags.clone(),
            metadata: task.logged_metadata(),
        });
        let cast = Cast::of(spec, roster);
        Episode { spec, suite, task, agent, environment, grounds, cast, recorder, started, slot, notes }
    }

    /// The main agent's model lent again, for the task as given.
    fn lend_again(&self, task: &Task) -> Arc<dyn LanguageModel> {
        let epoch = (!self.suite.share_epochs).then_some(self.spec.epoch);
        self.spec.model.lend_in_epoch(Role::Agent(&Actor::Main), task, &self.spec.id, epoch, &self.agent.sampling)
    }

    /// Sets up the agent's set-up (its kind prepares it) and the episode's world; why not,
    /// as an unscored cause, when either cannot be had.
    async fn set_up<'s>(
        &'s self,
        lend_again: &'s (dyn Fn(&Task) -> Arc<dyn LanguageModel> + Send + Sync),
    ) -> Result<(Environment, AgentSetup<'s>), (UnscoredCause, String)> {
        let task: &Task = &self.task;
        let mut setup = AgentSetup {
            episode_id: &self.spec.id,
            task,
            config: self.agent,
            model: self.cast.agent.clone(),
            model_name: self.cast.under_test.name().to_owned(),
            lend_again,
            subagent_models: self.cast.subagents.clone(),
            system: system_prompt(self.suite, self.agent, task),
            notes: self.notes.clone().ok().flatten(),
            conversation: task.user.as_ref().is_some_and(|u| u.conversation),
            run_dir: Some(&self.grounds.run_dir),
            world: world_facts(self.environment, &self.grounds.run_dir, &self.spec.id),
            prepared: None,
        };
        // The runner's own file, not the agent's doing: nothing runs, the episode is unscored.
        let memory_error = |message: &String| (UnscoredCause::Other("memory_error".into()), message.clone());
        self.notes.as_ref().map_err(memory_error)?;
        self.agent.kind.prepare(&mut setup).await.map_err(|m| memory_error(&m))?;
        // A world this host cannot give (a Harbor task's image): nobody's answer.
        if let Some(why) = &task.unavailable {
            return Err((UnscoredCause::EnvironmentError, format!("the task cannot run here: {why}")));
        }
        self.grounds.scratch.made_for(self.environment).map_err(|m| (UnscoredCause::EnvironmentError, m))?;
        let context = SetupContext {
            binds: self.agent.settings.binds(),
            keep: self.grounds.keep_worlds.as_ref().map(|dir| dir.join(&self.spec.id)),
            sandbox: self.sandbox(),
            user_model: self.cast.user.clone(),
            run_dir: Some(&self.grounds.run_dir),
            ..SetupContext::new(self.grounds.scratch.path(), &self.spec.id)
        };
        let world = Environment::setup(self.environment.clone(), task, &context)
            .await
            .map_err(|e| (UnscoredCause::EnvironmentError, e.to_string()))?;
        Ok((world.with_permissions(self.suite.permissions.clone()), setup))
    }

    /// Plays the episode's loop: its agent built (a program's room given), its state's clock
    /// started, its turns run until it ends.
    async fn play(&self, world: &Environment, setup: AgentSetup<'_>, stop: &CancellationToken) -> Played {
        let state = Arc::new(EpisodeState::new(self.suite.limits).stopped_by(stop.clone()));
        let kind = self.agent.kind;
        let room = kind.runs_in_the_world().then(|| program_room(self.suite, world.world(), self.sandbox()));
        let mut agent = kind.build(setup, Lent { room: room.flatten() });
        let ending = world.run(agent.as_mut(), &self.task, &state, &self.recorder).await;
        let wall_s = self.started.elapsed().as_secs_f64();
        Played {
            ending,
            outcome: Outcome::Cancelled,
            agent: Some(agent),
            program: None,
            wall_s,
            loop_ms: Some(wall_s * 1e3),
            user_spent: world.user().spent(),
        }
    }

    /// Scores the episode against its final world, before it is torn down: unscored when
    /// nobody answered, cancelled when the run was stopped, scored otherwise.
    async fn score(&self, ending: &Ending, world: &dyn World, wall_s: f64) -> Outcome {
        if let Some(fault) = &ending.fault {
            return Outcome::Unscored { cause: fault.cause.clone(), message: fault.message.clone() };
        }
        if matches!(ending.termination, Termination::UserStop | Termination::Budget) {
            return Outcome::Cancelled;
        }
        let suite = self.suite;
        let finished = Finished {
            task: &self.task,
            episode_id: &self.spec.id,
            under_test: Some(&self.cast.under_test),
            model: self.cast.under_test.name(),
            recorder: Some(&self.recorder),
            ending,
            wall_s,
            suite_grader: suite.grader.as_ref().map(|g| g.model.as_str()),
            suite_template: suite.grader.as_ref().and_then(|g| g.template.as_deref()),
            world_limit: suite.limits.time,
            sandbox: self.sandbox(),
            recalled: None,
        };
        if suite.agent.kind.logs_stages() {
            self.recorder.emit(&Event::Stage { stage: Stage::Judge, ingestion: None });
        }
        match scoring::score(&suite.scorers, &self.task.scorers, &finished, world, self.cast.graders).await {
            Ok(scores) => {
                scoring::log_scores(&self.recorder, INITIAL_SCORING, &scores);
                let (score, passed) = scoring::aggregate(&scores, suite.pass_score);
                Outcome::Scored { score, passed }
            }
            Err(fault) => {
                // The verdicts the other scorers gave stand in the log (a regrade carries over
                // those about the world); the episode is unscored, unless they settle it.
                scoring::log_scores(&self.recorder, INITIAL_SCORING, &fault.scores);
                let (cause, message) = (fault.cause.clone(), fault.message.clone());
                self.recorder.emit(&Event::Error { step: ending.steps, cause, message });
                match fault.settled(suite.pass_score) {
                    Some((score, passed)) => Outcome::Scored { score, passed },
                    None => Outcome::Unscored { cause: fault.cause, message: fault.message },
                }
            }
        }
    }

    /// Tells the agent how the episode ended (a program agent's program then goes), and
    /// tears the world down; how a program ended.
    async fn tear_down(
        &self,
        world: Environment,
        agent: Option<Box<dyn Agent>>,
        (termination, outcome): (Termination, &Outcome),
    ) -> Option<ProgramEnd> {
        let program = match agent {
            Some(mut agent) => agent.finish(termination, outcome, &self.recorder).await,
            None => None,
        };
        world.teardown().await;
        program
    }

    /// Closes the episode: what a scored epoch left of its notes is what the next one starts
    /// from (an unscored or cancelled one is run again on resume, from the notes it started
    /// with), then `episode_finished`.
    fn close(self, played: Played) -> EpisodeReport {
        let Played { ending, mut outcome, program, loop_ms, user_spent, .. } = played;
        if let (Some(slot), Ok(Some(stores)), Outcome::Scored { .. }) = (&self.slot, &self.notes, &outcome) {
            let entries = stores.lock().unwrap_or_else(|p| p.into_inner()).entries().clone();
            if let Err(message) = slot.save(&entries) {
                let cause = UnscoredCause::Other("memory_error".into());
                self.recorder.emit(&Event::Error {
                    step: ending.steps,
                    cause: cause.clone(),
                    message: message.clone(),
                });
                outcome = Outcome::Unscored { cause, message };
            }
        }
        // The next epoch of the task may start.
        drop(self.slot);
        let wall_ms = self.started.elapsed().as_secs_f64() * 1e3;
        self.recorder.emit(&Event::EpisodeFinished {
            outcome: outcome.clone(),
            termination: ending.termination,
            steps: ending.steps,
            tool_calls: ending.trajectory.tool_calls(),
            tool_errors: ending.trajectory.tool_errors(),
            usage: ending.usage,
            cost_usd: ending.cost_usd,
            wall_ms,
            loop_ms,
            user_usage: user_spent.map(|(usage, _)| usage),
            user_cost_usd: user_spent.and_then(|(_, cost)| cost),
            agent_program: program,
        });
        let spec = self.spec;
        EpisodeReport {
            id: spec.id.clone(),
            suite: self.suite.name.clone(),
            task_id: self.task.id.clone(),
            model: spec.model.name().to_owned(),
            variant: spec.variant().map(|v| v.name.clone()),
            epoch: spec.epoch,
            outcome,
            termination: ending.termination,
            steps: ending.steps,
            wall_ms,
        }
    }

    fn sandbox(&self) -> SandboxMode {
        super::sandbox_mode(self.suite, self.grounds.sandbox)
    }
}

/// The agent's notes for the episode, when it keeps them: with `scope: task`, those the
/// epoch before left (waiting for that epoch to end), read back with the checks the
/// suite's own entries got; else the task's.
async fn open_notes(suite: &Suite, task: &Task, slot: Option<&mut NotesSlot>) -> Result<Option<SharedStores>, String> {
    let kept = match slot {
        Some(slot) => slot.open().await.and_then(|kept| match (kept, suite.agent.settings.notes()) {
            (Some(entries), Some(config)) => {
                Stores::checked(config, &entries).map(|_| Some(entries)).map_err(|(store, i, why)| {
                    format!(
                        "the task's memory {}: {store}[{i}] is not what the memory tool accepts: {why}",
                        slot.path().display()
                    )
                })
            }
            (kept, _) => Ok(kept),
        })?,
        None => None,
    };
    Ok(suite
        .agent
        .settings
        .notes()
        .map(|config| Stores::new(config, kept.unwrap_or_else(|| task.memory.clone())).shared()))
}

/// Where a program agent runs: the world's folder, confined with the gateway's port as
/// its only network; `None` for a world without a folder.
fn program_room(suite: &Suite, world: &dyn World, mode: SandboxMode) -> Option<ProgramRoom> {
    if let Some(place) = world.files().and_then(|files| files.image_root()) {
        // In an image's root: the program runs there, as the image's user; a container of
        // another provider's it cannot enter.
        let own = place.own.clone()?;
        let spec = suite.environment.sandbox.clone().unwrap_or_default();
        let image =
            RoomInImage { root: place.path().to_owned(), workdir: place.workdir.clone(), env: place.env.clone() };
        let (folder, tmp) = (place.workdir_on_host(), place.path().join("tmp"));
        let confine = move |port| {
            Confinement::prepare_in_root_for_gateway(&spec, own.root.clone(), own.ids.clone(), own.user, port)
        };
        return Some(ProgramRoom { folder, tmp, image: Some(image), confine: Box::new(confine) });
    }
    world.program_folders().map(|(folder, tmp)| {
        let definition = suite.environment.clone();
        let (own, own_tmp) = (folder.clone(), tmp.clone());
        let confine = move |port| definition.confinement_for_gateway(mode, &[own.as_path(), own_tmp.as_path()], port);
        ProgramRoom { folder, tmp, image: None, confine: Box::new(confine) }
    })
}

/// The episode's world as an agent that fills its store sees it before it starts.
fn world_facts(environment: &Definition, run_dir: &Path, episode_id: &str) -> WorldFacts {
    WorldFacts {
        environment: format!("{}:{}", environment.kind.map_or("", |k| k.name()), environment.name),
        store: environment.kind.and_then(|k| k.store_file(run_dir, episode_id)),
    }
}

/// The suite's system prompt rendered for the task, then what the environment adds (an
/// MCP server's prompts).
fn system_prompt(suite: &Suite, agent: &AgentConfig, task: &Task) -> Option<String> {
    // Every template was rendered against every task when the suite loaded.
    let system = agent.system.as_deref().map(|s| {
        template::render(s, &task.template_context())
            .unwrap_or_else(|e| format!("(the system prompt failed to render: {e})"))
    });
    match (system, suite.environment.system_addition.trim()) {
        (system, "") => system,
        (Some(own), added) => Some(format!("{own}\n\n{added}")),
        (None, added) => Some(added.to_owned()),
    }
}
