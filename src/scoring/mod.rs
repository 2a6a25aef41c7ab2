//! Scoring: a finished episode — its final answer, its trajectory and its final world —
//! into scores. Scores are weighted; a task passes when every scorer that counts passes,
//! or when its weighted score reaches the suite's `pass_score`.

mod checks;
pub mod grader;
pub mod workers;
pub use crate::domain::scorer as spec;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::domain::text::Text;
use crate::domain::{MockTurn, Task};
use crate::environment::{Ending, World};
use crate::log::UnscoredCause;
use crate::model::config::ModelConfig;
use crate::model::embedding::Embedder;
use crate::model::{Backend, BackendOptions, LanguageModel, Role, lend_beside, open_beside};
pub use checks::FILE_SCAN_CAP;
pub use checks::communicated::told_user;
#[cfg(test)]
pub(crate) use checks::text::PATTERNS;
pub use checks::text::keep_pattern;
use checks::{Answer, CheckResult, Scene};
pub use spec::{ArgMatch, Budget, Check, ExpectedCall, GraderKind, JsonCheck, ScorerSpec, TextOp};

/// One scorer's verdict on one episode.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    pub scorer: String,
    pub value: f64,
    pub passed: bool,
    pub explanation: String,
    pub weight: f64,
    /// For graders: model, template digest, raw outputs, agreement, tokens and cost.
    pub grader: Option<Value>,
    /// What the scorer checked (its argument and options), to recognise it in a regrade.
    pub check: std::sync::Arc<Value>,
}

/// A scorer that could not reach a verdict (a grader that could not be parsed): the
/// episode is unscored, never 0 — unless the other scorers' verdicts already settle it
/// ([`ScoringFault::settled`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{cause}: {message}")]
pub struct ScoringFault {
    pub cause: UnscoredCause,
    pub message: String,
    /// The verdicts the other scorers gave: logged, so that a regrade can carry over those
    /// about the final world, which is gone.
    pub scores: Vec<Score>,
    /// The weight of the scorers that gave no verdict; infinite when some were not tried.
    pub missing_weight: f64,
}

/// Logs scores under a scoring id.
pub fn log_scores(recorder: &crate::log::Recorder, scoring_id: &str, scores: &[Score]) {
    for s in scores {
        recorder.emit(&crate::log::Event::Score {
            scoring_id: scoring_id.to_owned(),
            scorer: s.scorer.clone(),
            value: s.value,
            passed: s.passed,
            weight: s.weight,
            explanation: s.explanation.clone(),
            grader: s.grader.clone(),
            check: s.check.clone(),
        });
    }
}

impl ScoringFault {
    pub fn new(cause: UnscoredCause, message: impl Into<String>) -> Self {
        ScoringFault { cause, message: message.into(), scores: Vec::new(), missing_weight: f64::INFINITY }
    }

    fn grader(message: String) -> Self {
        ScoringFault::new(UnscoredCause::GraderError, message)
    }

    /// The episode's score and verdict when the scorers that gave a verdict settle it
    /// whatever the others would have said: it failed, because a scorer that counts failed
    /// (or, with `pass_score`, even full marks from the others could not reach it). `None`
    /// while the others could still make it pass: the episode is then unscored.
    pub fn settled(&self, pass_score: Option<f64>) -> Option<(f64, bool)> {
        let counted = self.scores.iter().filter(|s| s.weight > 0.0);
        let failed = match pass_score {
            None => counted.clone().any(|s| !s.passed),
            Some(threshold) => {
                let (given, weight) = counted.fold((0.0, 0.0), |(v, w), s| (v + s.weight * s.value, w + s.weight));
                let best = (given + self.missing_weight) / (weight + self.missing_weight);
                best < threshold
            }
        };
        failed.then(|| (aggregate(&self.scores, pass_score).0, false))
    }
}

/// What scorers look at.
pub struct Finished<'a> {
    pub task: &'a Task,
    pub episode_id: &'a str,
    /// The model under test, when it is at hand (not in a regrade): a replay serves the
    /// grader's recorded calls too.
    pub under_test: Option<&'a Backend>,
    /// The name of the model under test, as the episode logged it (a replay takes the name
    /// of the model it recorded).
    pub model: &'a str,
    /// Where the grader's calls are logged, as `model_call` events marked with the scorer.
    pub recorder: Option<&'a crate::log::Recorder>,
    pub ending: &'a Ending,
    pub wall_s: f64,
    /// The suite's grader model, when it names one.
    pub suite_grader: Option<&'a str>,
    /// The suite's grader template, when it has one.
    pub suite_template: Option<&'a str>,
    /// How long each scorer of the final world (files, `check:`) may take: the episode's
    /// time limit. The world is the agent's work, so one that makes a scorer hang (a named
    /// pipe where a file was expected) fails that scorer.
    pub world_limit: Duration,
    /// Whether code scorers' workers run in the sandbox (off when the suite or the command
    /// line turned it off).
    pub sandbox: crate::sandbox::SandboxMode,
    /// When the episode is an earlier run's scored again: that run's grader answers and the
    /// episode's id there; a grader request made then is answered from them.
    pub recalled: Option<(&'a std::sync::Arc<crate::model::recalled::Recalled>, &'a str)>,
}

/// An embedding model and the base URL it is asked at, when not its provider's.
type EmbedderKey = (String, Option<String>);

/// The grader models of a run, opened once.
#[derive(Default)]
pub struct Graders {
    /// `--grader`: overrides the suite's and the scorer's choice.
    pub forced: Option<String>,
    backends: HashMap<String, Arc<Backend>>,
    /// The code scorers' workers, started when first needed and kept for the run.
    pub workers: workers::Workers,
    /// The providers, for the embedding models of `similar` scorers.
    config: ModelConfig,
    /// Those embedding models, opened when first needed, by model and base URL.
    embedders: std::sync::Mutex<HashMap<EmbedderKey, Arc<Embedder>>>,
}

impl Graders {
    /// Opens every grader model the suites and `forced` name (`mock` needs nothing), cached
    /// and recorded as `options` ask. A grader whose calls every model under test replays
    /// is not opened: a replay needs no grader endpoint or key.
    pub fn open(
        names: impl IntoIterator<Item = String>,
        forced: Option<String>,
        config: &ModelConfig,
        options: BackendOptions,
        under_test: &[Arc<Backend>],
    ) -> Result<Self, String> {
        let mut backends = HashMap::new();
        for name in names.into_iter().chain(forced.clone()) {
            if name == "mock" || backends.contains_key(&name) {
                continue;
            }
            if let Some(backend) =
                open_beside(&name, config, options.clone(), under_test).map_err(|e| format!("grader: {e}"))?
            {
                backends.insert(name, Arc::new(backend));
            }
        }
        let config = config.clone();
        Ok(Graders { forced, backends, workers: workers::Workers::default(), config, embedders: Default::default() })
    }

    /// The embedding model `name` (at `base_url` when given), opened once for the run.
    fn embedder(&self, name: &str, base_url: Option<&str>) -> Result<Arc<Embedder>, String> {
        let key = (name.to_owned(), base_url.map(String::from));
        let mut opened = self.embedders.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(embedder) = opened.get(&key) {
            return Ok(embedder.clone());
        }
        let embedder = Arc::new(Embedder::open(name, base_url, &self.config)?);
        opened.insert(key, embedder.clone());
        Ok(embedder)
    }

    /// The grader `name` for one scorer on one episode: scripted turns for `mock`, the
    /// recorded calls when the model under test replays them, else the opened backend.
    fn model(
        &self,
        name: &str,
        episode: &Finished<'_>,
        scorer: &str,
        mock: &[String],
    ) -> Option<Arc<dyn LanguageModel>> {
        let model: Arc<dyn LanguageModel> = if name == "mock" {
            let turns: Vec<MockTurn> =
                mock.iter().map(|t| MockTurn { text: Some(Text(t.clone())), tool_calls: Vec::new() }).collect();
            Arc::new(crate::model::mock::MockModel::new(turns.into()))
        } else {
            let role = Role::Grader { scorer };
            let opened = self.backends.get(name).map(|b| &**b);
            lend_beside(name, role, episode.under_test, opened, episode.task, episode.episode_id)?
        };
        Some(match episode.recalled {
            Some((recalled, from)) => recalled.grader(from, model),
            None => model,
        })
    }
}

/// The grader model of an LLM-graded scorer: `--grader` over the scorer's `model:` over the
/// suite's `grader:`. `None` when nobody named one: never the model under test.
pub fn grader_model(forced: Option<&str>, scorer: Option<&str>, suite: Option<&str>) -> Option<String> {
    forced.or(scorer).or(suite).map(String::from)
}

/// Applies each scorer (the suite's, then the task's) to the episode and its final world.
pub async fn score(
    suite_scorers: &[ScorerSpec],
    task_scorers: &[ScorerSpec],
    episode: &Finished<'_>,
    world: &dyn World,
    graders: &Graders,
) -> Result<Vec<Score>, ScoringFault> {
    let context = episode.task.template_context();
    let mut scores = Vec::new();
    let mut fault = None;
    let mut missing_weight = 0.0;
    for spec in suite_scorers.iter().chain(task_scorers) {
        match apply(spec, episode, &context, world, graders).await {
            Ok(CheckResult { passed, value, explanation, provenance: grader }) => scores.push(Score {
                scorer: spec.name.clone(),
                value,
                passed,
                explanation,
                weight: spec.weight,
                grader,
                check: spec.check_value(),
            }),
            // The first fault decides; the other scorers still give their verdicts.
            Err(f) => {
                missing_weight += spec.weight;
                fault.get_or_insert(f);
            }
        }
    }
    match fault {
        Some(f) => Err(ScoringFault { scores, missing_weight, ..f }),
        None => Ok(scores),
    }
}

/// The episode's weighted score and whether it passed: every scorer with a weight passed,
/// or, with `pass_score`, the weighted score reached it.
pub fn aggregate(scores: &[Score], pass_score: Option<f64>) -> (f64, bool) {
    let counted: Vec<&Score> = scores.iter().filter(|s| s.weight > 0.0).collect();
    if counted.is_empty() {
        return (0.0, false);
    }
    let total: f64 = counted.iter().map(|s| s.weight).sum();
    let score = counted.iter().map(|s| s.weight * s.value).sum::<f64>() / total;
    let passed = match pass_score {
        Some(threshold) => score >= threshold,
        None => counted.iter().all(|s| s.passed),
    };
    (score, passed)
}

/// One scorer's verdict: the check its key names, on the text it reads.
async fn apply(
    spec: &ScorerSpec,
    episode: &Finished<'_>,
    context: &Map<String, Value>,
    world: &dyn World,
    graders: &Graders,
) -> Result<CheckResult, ScoringFault> {
    let scene = Scene { episode, context, world };
    let answer = match Answer::read(spec.from.as_deref(), &scene).await? {
        Ok(answer) => answer,
        Err(unread) => return Ok(unread),
    };
    let trajectory = &episode.ending.trajectory;
    Ok(match &spec.check {
        Check::Text { op, expected, negate, ignore_case } => {
            checks::text::check(&scene, &answer, *op, expected, *negate, *ignore_case)
        }
        Check::Numeric { expected, tolerance } => checks::numeric::check(&scene, &answer, expected, *tolerance),
        Check::Json(check) => checks::json::check(&answer, check),
        Check::Literal(literal) => checks::literal::check(&scene, &answer, literal),
        Check::Communicated { expected, ignore_case } => checks::communicated::check(&scene, expected, *ignore_case),
        Check::ToolCalled { name, negate, actor } => {
            checks::tool_called::check(trajectory, name, *negate, actor.as_ref())
        }
        Check::ToolSequence { calls, ordered, arguments, partial, actor } => {
            checks::tool_sequence::check(trajectory, calls, *ordered, *arguments, *partial, actor.as_ref())
        }
        Check::Budget { what, max } => checks::budget::check(episode, *what, *max)?,
        Check::FileExists { path } => checks::file::exists(&scene, path).await?,
        Check::FileContains { path, text, regex } => checks::file::contains(&scene, path, text, *regex).await?,
        Check::Document { path, sections, min_words, max_words, max_section_words } => {
            checks::document::check(&scene, path, sections, *min_words, *max_words, *max_section_words).await?
        }
        Check::Command { command, timeout_s } => checks::command::check(&scene, command, *timeout_s).await?,
        Check::Verifier { tests, workdir, timeout_s, env } => {
            let verifier = checks::verifier::Verifier { tests, workdir, timeout_s: *timeout_s, env };
            checks::verifier::check(world, &verifier).await?
        }
        Check::Code(code) => checks::code::check(&scene, code, &graders.workers).await?,
        Check::Similar { expected, threshold, embedding, embedding_url, negate } => {
            let asked = checks::similar::Asked {
                expected,
                threshold: *threshold,
                embedding,
                embedding_url: embedding_url.as_deref(),
                negate: *negate,
            };
            checks::similar::check(&scene, &answer, &asked, graders).await?
        }
        Check::Grader { kind, criteria, model, template, samples, threshold, mock } => {
            let asked = checks::graded::Asked {
                kind: *kind,
                criteria: criteria.as_deref(),
                model: model.as_deref(),
                template: template.as_deref(),
                samples: *samples,
                threshold: *threshold,
                mock,
            };
            checks::graded::check(&scene, &spec.name, &answer, &asked, graders).await?
        }
    })
}

#[cfg(test)]
mod tests;
