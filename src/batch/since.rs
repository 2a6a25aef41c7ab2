//! `runner eval ... --since RUN`: each episode of the new run is planned from what changed
//! since RUN, part by part ([`super::digests`]): **reused** when nothing did (its events are
//! copied into the new run), **regraded** when only its scorers or grader did (its logged
//! trajectory is scored again, no agent runs), **run again** when anything the agent sees
//! did, or when RUN did not score it. The new run holds every episode, so it stands on its
//! own: reports, comparisons, exports and a later `--since` read it like any other.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{EpisodeSpec, RunOptions, Tally, episodes};
use crate::log::event::{
    EpisodeDigests, EpisodeFinishedRow, INITIAL_SCORING, ModelCallTiming, PlannedEpisode, SCHEMA_VERSION, SincePlan,
};
use crate::log::reader::{LineHeader, for_each_line_of, header_episode_id, split_line};
use crate::log::{Event, EventLog, Outcome};
use crate::model::recalled::Recalled;
use crate::scoring::Graders;
use crate::suite::Suite;

/// How many episodes of each kind the plan shows.
const SHOWN: usize = 5;

/// What becomes of an episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Reuse,
    Regrade,
    Rerun,
}

impl Fate {
    pub fn as_str(self) -> &'static str {
        match self {
            Fate::Reuse => "reuse",
            Fate::Regrade => "regrade",
            Fate::Rerun => "rerun",
        }
    }
}

/// An episode carried from the earlier run, reused or regraded.
pub struct Carried {
    pub kind: Fate,
    /// Its id in the earlier run.
    pub from: String,
    pub reason: String,
    /// Its parts now, and its task's digest now (its `episode_started` says these).
    digests: EpisodeDigests,
    task_digest: String,
    /// Its task's tags and logged metadata now (tags are not part of the task's digest).
    tags: Vec<String>,
    metadata: serde_json::Map<String, serde_json::Value>,
    /// Its outcome there: a reused episode's outcome here.
    outcome: Outcome,
}

/// The plan of a `--since` run.
pub struct Since {
    pub dir: PathBuf,
    pub run_id: String,
    /// The episodes carried, by their id in the new run.
    pub carried: HashMap<String, Carried>,
    /// The counts and the first episodes of each kind, as `run_started` records them.
    pub summary: SincePlan,
    /// What a person should know about the earlier run: a cut log, suites it did not have.
    pub notes: Vec<String>,
    /// How long the plan took to make, in seconds (set by whoever timed it).
    pub planned_s: f64,
}

/// An episode of the earlier run, as its log tells it.
struct Before {
    id: String,
    digests: Option<EpisodeDigests>,
    task_digest: String,
    /// Its last finish since its last start; `None` when it did not finish.
    outcome: Option<Outcome>,
}

/// Suite, task id, model, epoch and variant: the same episode in both runs.
type Key = (String, String, String, u32, Option<String>);

/// The earlier run as the plan needs it.
struct Earlier {
    run_id: String,
    /// Its suites: name and digest.
    suites: Vec<(String, String)>,
    episodes: HashMap<Key, Before>,
    /// The regrade whose verdicts count, when it was regraded.
    scoring: Option<String>,
    /// Whether its log ends as a finished run's does.
    finished: bool,
    torn: bool,
}

/// Plans the run `options` describe against the earlier run in `dir`: checks that the
/// earlier run can be read and shares suites with this one, then decides each episode.
pub fn plan(dir: &Path, suites: &[Arc<Suite>], options: &RunOptions) -> Result<Since, String> {
    let shown = dir.display().to_string();
    let earlier = read(&dir.join("events.jsonl"))?;
    let known: Vec<&str> = suites.iter().map(|s| s.name.as_str()).filter(|n| earlier.has_suite(n)).collect();
    if known.is_empty() {
        let had: Vec<&str> = earlier.suites.iter().map(|(n, _)| n.as_str()).collect();
        let asked: Vec<&str> = suites.iter().map(|s| s.name.as_str()).collect();
        return Err(format!(
            "{shown} ran the suite(s) {}, and this run's are {}: no episode of it can be reused; run without --since",
            had.join(", "),
            asked.join(", ")
        ));
    }
    let mut notes = Vec::new();
    for s in suites.iter().filter(|s| !earlier.has_suite(&s.name)) {
        notes.push(format!("suite `{}` was not part of {shown}: its episodes run again", s.name));
    }
    let unfinished = earlier.episodes.values().filter(|b| b.outcome.is_none()).count();
    if !earlier.finished || earlier.torn || unfinished > 0 {
        let finished = earlier.episodes.len() - unfinished;
        notes.push(format!(
            "{shown}/events.jsonl ends before the run finished (cut, or killed): the {finished} episode(s) it finished can still be reused; the {unfinished} it started and did not finish run again"
        ));
    }
    let mut since = Since {
        dir: dir.to_path_buf(),
        run_id: earlier.run_id.clone(),
        carried: HashMap::new(),
        summary: SincePlan { run_id: earlier.run_id.clone(), path: shown, ..SincePlan::default() },
        notes,
        planned_s: 0.0,
    };
    for spec in episodes(suites, &options.models, options.epochs).filter(|e| options.plans(e)) {
        let digests = options.roster.digester.of(&spec);
        let key: Key = (
            spec.suite.name.clone(),
            spec.suite.tasks[spec.task].id.clone(),
            spec.model.name().to_owned(),
            spec.epoch,
            spec.variant().map(|v| v.name.clone()),
        );
        let before = earlier.episodes.get(&key);
        let suite_unchanged = earlier.suites.iter().any(|(n, d)| *n == spec.suite.name && *d == spec.suite.digest);
        let task_digest = spec.suite.tasks[spec.task].digest.clone();
        let (kind, reason) = decide(before, (&digests, &task_digest), suite_unchanged, &earlier);
        since.count(&spec, &key, kind, &reason);
        if let (Some(before), Fate::Reuse | Fate::Regrade) = (before, kind) {
            let outcome = before.outcome.clone().unwrap_or(Outcome::Cancelled);
            let task = &spec.suite.tasks[spec.task];
            let (tags, metadata) = (task.tags.clone(), task.logged_metadata());
            let from = before.id.clone();
            let carried = Carried { kind, from, reason, digests, task_digest, tags, metadata, outcome };
            since.carried.insert(spec.id.clone(), carried);
        }
    }
    Ok(since)
}

impl Since {
    fn count(&mut self, spec: &EpisodeSpec, key: &Key, kind: Fate, reason: &str) {
        let s = &mut self.summary;
        let (n, first) = match kind {
            Fate::Reuse => (&mut s.reuse, &mut s.first_reused),
            Fate::Regrade => (&mut s.regrade, &mut s.first_regraded),
            Fate::Rerun => (&mut s.rerun, &mut s.first_rerun),
        };
        *n += 1;
        if first.len() < SHOWN {
            first.push(PlannedEpisode {
                suite: key.0.clone(),
                task_id: key.1.clone(),
                model: key.2.clone(),
                epoch: spec.epoch,
                variant: key.4.clone(),
                reason: reason.to_owned(),
            });
        }
    }
}

impl Earlier {
    fn has_suite(&self, name: &str) -> bool {
        self.suites.iter().any(|(n, _)| n == name)
    }
}

/// What becomes of one episode, and why.
fn decide(
    before: Option<&Before>,
    (now, task_digest): (&EpisodeDigests, &str),
    suite_unchanged: bool,
    earlier: &Earlier,
) -> (Fate, String) {
    let run = &earlier.run_id;
    let Some(before) = before else { return (Fate::Rerun, format!("not in {run}")) };
    match &before.outcome {
        None => return (Fate::Rerun, format!("did not finish in {run} (its events stop before episode_finished)")),
        Some(Outcome::Cancelled) => return (Fate::Rerun, format!("cancelled in {run}")),
        Some(Outcome::Unscored { cause, .. }) => {
            return (Fate::Rerun, format!("unscored in {run} ({})", cause.as_str()));
        }
        Some(Outcome::Scored { .. }) => {}
    }
    let Some(then) = &before.digests else {
        // A log from before per-episode digests: only an unchanged suite file says enough.
        return if suite_unchanged && before.task_digest == task_digest && earlier.scoring.is_none() {
            (Fate::Reuse, format!("its suite file is unchanged ({run} has no per-episode digests)"))
        } else {
            (Fate::Rerun, format!("its suite changed, and {run} has no per-episode digests to tell which part"))
        };
    };
    let seen = [
        (then.task != now.task, "the task's input, files or user changed"),
        (then.environment != now.environment, "the environment changed"),
        (then.agent != now.agent, "the agent changed (kind, settings, prompts or limits)"),
        (then.model != now.model, "the model, its sampling or its mock script changed"),
        (
            then.world_scorers != now.world_scorers,
            "a scorer that reads the final world changed, and that world is gone",
        ),
    ];
    let changed: Vec<&str> = seen.iter().filter(|(c, _)| *c).map(|(_, why)| *why).collect();
    if !changed.is_empty() {
        return (Fate::Rerun, changed.join("; "));
    }
    let graded =
        [(then.scorers != now.scorers, "the scorers changed"), (then.grader != now.grader, "the grader changed")];
    let changed: Vec<&str> = graded.iter().filter(|(c, _)| *c).map(|(_, why)| *why).collect();
    if !changed.is_empty() {
        return (Fate::Regrade, changed.join("; "));
    }
    match &earlier.scoring {
        Some(scoring) => (Fate::Regrade, format!("{run} was regraded (`{scoring}`): scored again as the suite scores")),
        None => (Fate::Reuse, "unchanged".into()),
    }
}

/// Reads what the plan needs of the earlier run's log: its first line must be a
/// `run_started` of this format.
fn read(events: &Path) -> Result<Earlier, String> {
    let shown = events.display();
    check_first_line(events)?;
    let mut earlier = Earlier {
        run_id: String::new(),
        suites: Vec::new(),
        episodes: HashMap::new(),
        scoring: None,
        finished: false,
        torn: false,
    };
    // Where each episode id's key is: an episode's later lines name only its id.
    let mut keys: HashMap<String, Key> = HashMap::new();
    let kinds = ["run_started", "episode_started", "episode_finished", "episode_scored", "run_finished", "run_resumed"];
    let torn = for_each_line_of(events, Some(&kinds), |kind, text, _| {
        let head = LineHeader::of(text).map_err(|e| e.to_string())?;
        let id = head.episode_id.clone();
        match kind {
            "run_finished" => earlier.finished = true,
            "run_resumed" => earlier.finished = false,
            "episode_finished" | "episode_scored" => {
                let outcome = match kind {
                    "episode_finished" => serde_json::from_str::<EpisodeFinishedRow>(text).map(|r| r.outcome),
                    _ => serde_json::from_str::<Scored>(text).map(|s| {
                        earlier.scoring = Some(s.scoring_id);
                        s.outcome
                    }),
                }
                .map_err(|e| e.to_string())?;
                if let Some(before) = id.and_then(|id| keys.get(&id)).and_then(|k| earlier.episodes.get_mut(k)) {
                    before.outcome = Some(outcome);
                }
            }
            "episode_started" => {
                let Some(id) = id else { return Ok(()) };
                let Started { suite, task_id, task_digest, model, epoch, variant, digests } =
                    serde_json::from_str(text).map_err(|e| e.to_string())?;
                let key: Key = (suite, task_id, model, epoch, variant);
                keys.insert(id.clone(), key.clone());
                earlier.episodes.insert(key, Before { id, digests, task_digest, outcome: None });
            }
            _ => match serde_json::from_str::<Event>(text).map_err(|e| e.to_string())? {
                Event::RunStarted { suites, .. } if earlier.run_id.is_empty() => {
                    earlier.run_id = head.run_id.unwrap_or_default();
                    earlier.suites = suites.into_iter().map(|s| (s.name, s.digest)).collect();
                }
                _ => {}
            },
        }
        Ok(())
    })
    .map_err(|e| format!("{e}: the run cannot be read, so nothing of it can be reused"))?;
    earlier.torn = torn;
    if earlier.run_id.is_empty() {
        return Err(format!("{shown}: the log has no run_started event; nothing of it can be reused"));
    }
    Ok(earlier)
}

/// What the plan reads of an `episode_started` line (decoded as a plain struct: an event
/// is decoded through a buffer of its fields).
#[derive(serde::Deserialize)]
struct Started {
    suite: String,
    task_id: String,
    task_digest: String,
    model: String,
    epoch: u32,
    #[serde(default)]
    variant: Option<String>,
    #[serde(default)]
    digests: Option<EpisodeDigests>,
}

/// An episode's outcome under a regrade.
#[derive(serde::Deserialize)]
struct Scored {
    scoring_id: String,
    outcome: Outcome,
}

/// Refuses a log that does not start as a run of this format does.
fn check_first_line(events: &Path) -> Result<(), String> {
    use std::io::BufRead as _;
    let shown = events.display();
    let file = std::fs::File::open(events).map_err(|e| format!("failed to read {shown}: {e}"))?;
    let mut first = String::new();
    std::io::BufReader::new(file).read_line(&mut first).map_err(|e| format!("failed to read {shown}: {e}"))?;
    let value: serde_json::Value = serde_json::from_str(&first).map_err(|_| {
        format!("{shown}:1: not a run's log (its first line is not a whole event); nothing of it can be reused")
    })?;
    let version = value["v"].as_u64();
    if version != Some(u64::from(SCHEMA_VERSION)) {
        let was = version.map_or("no `v`".to_owned(), |v| format!("format {v}"));
        return Err(format!(
            "{shown}:1: the log is in {was}, and this runner reads format {SCHEMA_VERSION}: nothing of it can be reused; run without --since, or with the runner that wrote it"
        ));
    }
    if value["type"] != "run_started" {
        return Err(format!("{shown}:1: not a run's log: it must start with a run_started event"));
    }
    Ok(())
}

/// Writes the carried episodes into the new run's log (before any episode runs): a reused
/// one's events as they were, a regraded one's trajectory with new scores and its finish
/// with the new outcome; each `episode_started` says its parts now and is followed by
/// `episode_carried`. Their outcomes, counted.
pub(super) async fn carry(
    since: &Since,
    suites: &[Arc<Suite>],
    log: &EventLog,
    graders: &Graders,
) -> Result<Tally, String> {
    let mut tally = Tally::default();
    // By the id in the earlier run: the id here.
    let from: HashMap<&str, &str> = since.carried.iter().map(|(id, c)| (c.from.as_str(), id.as_str())).collect();
    let mut regraded: std::collections::BTreeMap<String, Regraded> = Default::default();
    for_each_line_of(&since.dir.join("events.jsonl"), None, |kind, text, _| {
        // Another episode's line, or where an earlier run had carried this one from: its own
        // `episode_carried` takes that place.
        let elsewhere = header_episode_id(text).is_some_and(|old| !from.contains_key(old));
        if elsewhere || kind == "episode_carried" {
            return Ok(());
        }
        let (head, body) = split_line(text)?;
        let Some(id) = head.episode_id.as_deref().and_then(|old| from.get(old)) else { return Ok(()) };
        let Some(carried) = since.carried.get(*id) else { return Ok(()) };
        let here: Arc<str> = Arc::from(*id);
        let mut lines = Vec::new();
        if kind == "episode_started" {
            lines.push((Some(head.ts.clone()), restarted(text, carried)?));
            let marker = Event::EpisodeCarried {
                from_run: since.run_id.clone(),
                from_episode: carried.from.clone(),
                plan: carried.kind.as_str().into(),
                reason: carried.reason.clone(),
            };
            lines.push((None, serde_json::to_vec(&marker).map_err(|e| e.to_string())?));
        } else {
            lines.push((Some(head.ts.clone()), body.into_owned()));
        }
        match carried.kind {
            Fate::Reuse => emit_lines(log, &here, lines),
            _ => {
                let r = regraded.entry((*id).to_owned()).or_default();
                match kind {
                    // A new attempt: what came before it was a killed one's.
                    "episode_started" => *r = Regraded { lines, finished: None },
                    // Its scoring is done again: the scores and the grader's calls of the earlier one go.
                    "score" | "episode_scored" => {}
                    "model_call" if graders_call(text)? => {}
                    "episode_finished" => r.finished = Some(serde_json::from_str(text).map_err(|e| e.to_string())?),
                    _ => r.lines.extend(lines),
                }
            }
        }
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    for carried in since.carried.values().filter(|c| c.kind == Fate::Reuse) {
        tally.add(&carried.outcome);
    }
    if !regraded.is_empty() {
        let run = super::regrade::LoggedRun::read(&since.dir).map_err(|e| e.to_string())?;
        let froms: std::collections::HashSet<&str> =
            regraded.keys().filter_map(|id| since.carried.get(id)).map(|c| c.from.as_str()).collect();
        let recalled = Arc::new(Recalled::of_log(&since.dir.join("events.jsonl"), &froms)?);
        for (id, r) in regraded {
            let here: Arc<str> = Arc::from(id.as_str());
            let Some(carried) = since.carried.get(&id) else { continue };
            emit_lines(log, &here, r.lines);
            let recorder = log.recorder(&id);
            let outcome = run
                .score_as((&carried.from, &id), suites, graders, (&recorder, INITIAL_SCORING), Some(&recalled))
                .await
                .unwrap_or_else(|| carried.outcome.clone());
            // Its finish as it was, with the new outcome.
            let mut finished = r.finished;
            if let Some(Event::EpisodeFinished { outcome: was, .. }) = &mut finished {
                *was = outcome.clone();
            }
            if let Some(finished) = &finished {
                recorder.emit(finished);
            }
            tally.add(&outcome);
        }
    }
    Ok(tally)
}

/// Whether a `model_call` line is a grader's.
fn graders_call(text: &str) -> Result<bool, String> {
    let call: ModelCallTiming = serde_json::from_str(text).map_err(|e| e.to_string())?;
    Ok(call.scorer.is_some())
}

/// A regraded episode's lines, held until it is scored again, and its finish.
#[derive(Default)]
struct Regraded {
    lines: Vec<(Option<String>, Vec<u8>)>,
    finished: Option<Event>,
}

/// Lines written as they were stamped (`None`: now).
fn emit_lines(log: &EventLog, id: &Arc<str>, lines: Vec<(Option<String>, Vec<u8>)>) {
    for (ts, body) in lines {
        log.emit_copied(id, ts.as_deref(), body);
    }
}

/// An `episode_started` line as the new run says it: the task's digest, tags, metadata and
/// the parts now.
fn restarted(text: &str, carried: &Carried) -> Result<Vec<u8>, String> {
    let mut event = serde_json::from_str::<Event>(text).map_err(|e| e.to_string())?;
    if let Event::EpisodeStarted { task_digest, digests, tags, metadata, .. } = &mut event {
        *task_digest = carried.task_digest.clone();
        *digests = Some(carried.digests.clone());
        *tags = carried.tags.clone();
        *metadata = carried.metadata.clone();
    }
    serde_json::to_vec(&event).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digests(task: &str, scorers: &str) -> EpisodeDigests {
        EpisodeDigests { task: task.into(), scorers: scorers.into(), ..EpisodeDigests::default() }
    }

    fn earlier() -> Earlier {
        Earlier {
            run_id: "nightly".into(),
            suites: Vec::new(),
            episodes: HashMap::new(),
            scoring: None,
            finished: true,
            torn: false,
        }
    }

    fn before(outcome: Option<Outcome>, digests: Option<EpisodeDigests>) -> Before {
        Before { id: "ep_1".into(), digests, task_digest: "d".into(), outcome }
    }

    #[test]
    fn each_change_decides_its_kind_with_its_reason() {
        let passed = Some(Outcome::Scored { score: 1.0, passed: true });
        let run = earlier();
        let same = before(passed.clone(), Some(digests("t", "s")));
        assert_eq!(decide(Some(&same), (&digests("t", "s"), "d"), false, &run), (Fate::Reuse, "unchanged".into()));
        let (kind, why) = decide(Some(&same), (&digests("t", "s2"), "d"), false, &run);
        assert_eq!((kind, why.as_str()), (Fate::Regrade, "the scorers changed"));
        let (kind, why) = decide(Some(&same), (&digests("t2", "s2"), "d"), false, &run);
        assert_eq!((kind, why.as_str()), (Fate::Rerun, "the task's input, files or user changed"));
        let (kind, why) = decide(None, (&digests("t", "s"), "d"), true, &run);
        assert_eq!((kind, why.as_str()), (Fate::Rerun, "not in nightly"));
        let cut = before(None, Some(digests("t", "s")));
        assert_eq!(decide(Some(&cut), (&digests("t", "s"), "d"), true, &run).0, Fate::Rerun);
        let unscored = Outcome::Unscored { cause: crate::log::UnscoredCause::ProviderError, message: String::new() };
        let failed = before(Some(unscored), Some(digests("t", "s")));
        let (kind, why) = decide(Some(&failed), (&digests("t", "s"), "d"), true, &run);
        assert_eq!((kind, why.as_str()), (Fate::Rerun, "unscored in nightly (provider_error)"));
        let old = before(passed, None);
        assert_eq!(decide(Some(&old), (&digests("t", "s"), "d"), true, &run).0, Fate::Reuse);
        assert_eq!(decide(Some(&old), (&digests("t", "s"), "d"), false, &run).0, Fate::Rerun);
        let regraded = Earlier { scoring: Some("regrade-1".into()), ..earlier() };
        assert_eq!(decide(Some(&same), (&digests("t", "s"), "d"), true, &regraded).0, Fate::Regrade);
    }
}
