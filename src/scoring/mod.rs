//! Scoring: a finished episode — its final answer, its trajectory and its final world —
//! into scores. Scores are weighted; a task passes when every scorer that counts passes,
//! or when its weighted score reaches the suite's `pass_score`.

pub mod grader;
pub use crate::domain::scorer as spec;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::config::template;
use crate::contract::{ASK_USER, CLARIFY, EXIT_PLAN_MODE, FINAL_TOOL, ToolCall};
use crate::domain::document::Document;
use crate::domain::text::Text;
use crate::domain::{MockTurn, Task};
use crate::environment::{Ending, ReadBack, ToolFailure, World};
use crate::log::UnscoredCause;
use crate::model::config::ModelConfig;
use crate::model::{Backend, BackendOptions, LanguageModel};
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
    pub check: Value,
}

/// A scorer that could not reach a verdict (a grader that could not be parsed): the
/// episode is unscored, never 0.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{cause}: {message}")]
pub struct ScoringFault {
    pub cause: UnscoredCause,
    pub message: String,
    /// The verdicts the other scorers gave: logged, so that a regrade can carry over those
    /// about the final world, which is gone.
    pub scores: Vec<Score>,
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
    fn grader(message: String) -> Self {
        ScoringFault { cause: UnscoredCause::GraderError, message, scores: Vec::new() }
    }
}

/// What scorers look at.
pub struct Finished<'a> {
    pub task: &'a Task,
    pub episode_id: &'a str,
    /// The model under test, when it is at hand (not in a regrade): a replay serves the
    /// grader's recorded calls too.
    pub under_test: Option<&'a Backend>,
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
}

/// How long past its own timeout a `check:` may take to be stopped and report.
const CHECK_GRACE: Duration = Duration::from_secs(2);

/// How much of a file `file_contains` searches: the start of a larger file only.
pub const FILE_SCAN_CAP: usize = 16 << 20;

/// The grader models of a run, opened once.
#[derive(Default)]
pub struct Graders {
    /// `--grader`: overrides the suite's and the scorer's choice.
    pub forced: Option<String>,
    backends: HashMap<String, Arc<Backend>>,
    /// The models that play the suites' simulated users, by name (`mock` included).
    users: HashMap<String, Arc<Backend>>,
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
            let replayed = !under_test.is_empty() && under_test.iter().all(|m| m.replays_grader(&name));
            if name != "mock" && !replayed && !backends.contains_key(&name) {
                let backend = Backend::open(&name, config, options.clone()).map_err(|e| format!("grader: {e}"))?;
                backends.insert(name, Arc::new(backend));
            }
        }
        Ok(Graders { forced, backends, users: HashMap::new() })
    }

    /// Opens the models that play simulated users (the suites' user models, as
    /// [`user_played_by`] picks them for each model under test), cached and recorded as
    /// `options` ask; one whose calls every model under test replays is not opened. They
    /// sit beside the graders: models of the run that are not under test.
    pub fn with_users(
        mut self,
        names: impl IntoIterator<Item = String>,
        config: &ModelConfig,
        options: BackendOptions,
        under_test: &[Arc<Backend>],
    ) -> Result<Self, String> {
        let mut played: Vec<String> = Vec::new();
        for name in names {
            for m in under_test {
                let by = user_played_by(m.name(), &name).to_owned();
                if !played.contains(&by) {
                    played.push(by);
                }
            }
        }
        for name in played {
            let replayed = !under_test.is_empty() && under_test.iter().all(|m| m.replays_grader(&name));
            if !replayed && !self.users.contains_key(&name) {
                let backend =
                    Backend::open(&name, config, options.clone()).map_err(|e| format!("simulated user: {e}"))?;
                self.users.insert(name, Arc::new(backend));
            }
        }
        Ok(self)
    }

    /// The opened backend of a simulated user's model.
    pub fn user_backend(&self, name: &str) -> Option<&Arc<Backend>> {
        self.users.get(name)
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
        if name == "mock" {
            let turns: Vec<MockTurn> =
                mock.iter().map(|t| MockTurn { text: Some(Text(t.clone())), tool_calls: Vec::new() }).collect();
            return Some(Arc::new(crate::model::mock::MockModel::new(turns.into())));
        }
        let (task, id) = (episode.task, episode.episode_id);
        episode
            .under_test
            .and_then(|m| m.recorded_grader(name, task, id, scorer))
            .or_else(|| self.backends.get(name).map(|b| b.as_grader(task, id, scorer)))
    }
}

/// The model that plays a simulated user whose model is `user_model` when the model under
/// test is `under_test`: `mock` (the task's `mock_user:` turns) under `--model mock`, so that
/// a suite runs offline whatever its user's model; the user's own model otherwise.
pub fn user_played_by<'a>(under_test: &str, user_model: &'a str) -> &'a str {
    if under_test == "mock" { "mock" } else { user_model }
}

/// What the agent told the user: its conversation replies, the questions of `ask_user` and
/// `clarify` (with their choices), and the plans of `exit_plan_mode`, in order.
pub fn told_user(trajectory: &crate::environment::Trajectory) -> Vec<String> {
    let asked = trajectory.calls.iter().filter_map(|call| {
        let field = |name: &str| call.arguments.get(name).and_then(Value::as_str).map(str::to_owned);
        match call.name.as_str() {
            ASK_USER => field("question"),
            CLARIFY => {
                let choices: Vec<&str> = call
                    .arguments
                    .get("choices")
                    .and_then(Value::as_array)
                    .map(|c| c.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                field("question").map(|q| format!("{q} ({})", choices.join(" / ")))
            }
            EXIT_PLAN_MODE => field("plan"),
            _ => None,
        }
    });
    asked.chain(trajectory.told_user.iter().cloned()).collect()
}

fn communicated(trajectory: &crate::environment::Trajectory, expected: &str, ignore_case: bool) -> Verdict {
    let told = told_user(trajectory);
    if told.is_empty() {
        return verdict(false, "the agent told the user nothing".into());
    }
    let found = told.iter().any(|text| {
        if ignore_case { text.to_lowercase().contains(&expected.to_lowercase()) } else { text.contains(expected) }
    });
    if found {
        verdict(true, format!("the agent told the user {expected:?}"))
    } else {
        let last = told.last().map(String::as_str).unwrap_or_default();
        verdict(false, format!("the agent never told the user {expected:?} (its last words: {})", quote(last)))
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
    for spec in suite_scorers.iter().chain(task_scorers) {
        match apply(spec, episode, &context, world, graders).await {
            Ok((passed, value, explanation, grader)) => scores.push(Score {
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
                fault.get_or_insert(f);
            }
        }
    }
    match fault {
        Some(f) => Err(ScoringFault { scores, ..f }),
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

type Verdict = (bool, f64, String, Option<Value>);

fn verdict(passed: bool, explanation: String) -> Verdict {
    (passed, if passed { 1.0 } else { 0.0 }, explanation, None)
}

async fn apply(
    spec: &ScorerSpec,
    episode: &Finished<'_>,
    context: &Map<String, Value>,
    world: &dyn World,
    graders: &Graders,
) -> Result<Verdict, ScoringFault> {
    let render = |text: &str| template::render(text, context);
    let ending = episode.ending;
    // The text a check of text reads: the final answer, or with `from:` a text of the world.
    let read;
    let answer = match &spec.from {
        None => ending.final_answer.as_deref(),
        Some(path) => match read_back(world, path, FILE_SCAN_CAP, episode.world_limit).await? {
            Ok(file) => {
                read = file.text;
                Some(read.as_str())
            }
            Err(why) => return Ok(verdict(false, why)),
        },
    };
    let subject = |answer: &str| match &spec.from {
        None => format!("the answer {}", quote(answer)),
        Some(path) => format!("`{path}`"),
    };
    let no_answer =
        || verdict(false, format!("no final answer (the episode ended by {})", ending.termination.as_str()));
    Ok(match &spec.check {
        Check::Text { op, expected, negate, ignore_case } => {
            let expected = match render(expected) {
                Ok(e) => e,
                Err(e) => return Ok(verdict(false, format!("the scorer's template failed: {e}"))),
            };
            let Some(answer) = answer else { return Ok(no_answer()) };
            match text_matches(*op, answer, &expected, *ignore_case) {
                Ok(found) => {
                    let what = match (op, found) {
                        (TextOp::Includes, true) => format!("contains {expected:?}"),
                        (TextOp::Includes, false) => format!("does not contain {expected:?}"),
                        (TextOp::Equals, true) => format!("equals {expected:?}"),
                        (TextOp::Equals, false) => format!("does not equal {expected:?}"),
                        (TextOp::Regex, true) => format!("matches /{expected}/"),
                        (TextOp::Regex, false) => format!("does not match /{expected}/"),
                    };
                    verdict(found != *negate, format!("{} {what}", subject(answer)))
                }
                Err(e) => verdict(false, e),
            }
        }
        Check::Numeric { expected, tolerance } => {
            let Some(answer) = answer else { return Ok(no_answer()) };
            let expected = render(expected).ok().and_then(|e| e.trim().replace(',', "").parse::<f64>().ok());
            let Some(expected) = expected else {
                return Ok(verdict(false, "the expected value is not a number".into()));
            };
            match first_number(answer) {
                Some(got) if (got - expected).abs() <= *tolerance => {
                    verdict(true, format!("{got} is within {tolerance} of {expected}"))
                }
                Some(got) => verdict(false, format!("{got} is not within {tolerance} of {expected}")),
                None => verdict(false, format!("the answer {} holds no number", quote(answer))),
            }
        }
        Check::Json(check) => {
            let Some(answer) = answer else { return Ok(no_answer()) };
            json_check(check, answer)
        }
        Check::Communicated { expected, ignore_case } => {
            let expected = match render(expected) {
                Ok(e) => e,
                Err(e) => return Ok(verdict(false, format!("the scorer's template failed: {e}"))),
            };
            communicated(&ending.trajectory, &expected, *ignore_case)
        }
        Check::ToolCalled { name, negate, actor } => {
            let by = |c: &&ToolCall| actor.as_ref().is_none_or(|a| a.matches(&c.actor));
            let count = ending.trajectory.calls.iter().filter(by).filter(|c| &c.name == name).count();
            let whom = actor.as_ref().map(|a| format!(" by {a}")).unwrap_or_default();
            match (count > 0, negate) {
                (true, false) => verdict(true, format!("`{name}` was called{whom} {count} time(s)")),
                (false, false) => verdict(false, format!("`{name}` was never called{whom}")),
                (true, true) => verdict(false, format!("`{name}` was called{whom} {count} time(s)")),
                (false, true) => verdict(true, format!("`{name}` was never called{whom}")),
            }
        }
        Check::ToolSequence { calls, ordered, arguments, partial, actor } => {
            let made: Vec<ToolCall> = match actor {
                Some(a) => ending.trajectory.calls.iter().filter(|c| a.matches(&c.actor)).cloned().collect(),
                None => ending.trajectory.calls.clone(),
            };
            sequence(&made, calls, *ordered, *arguments, *partial)
        }
        Check::Budget { what: Budget::CostUsd, .. } if episode.ending.cost_usd.is_none() => {
            // Nobody's answer: the model has no price, so the budget cannot be judged.
            return Err(ScoringFault {
                cause: UnscoredCause::CostUnknown,
                message: "`max_cost` needs the model's price: add it under `prices:` in runner.yaml".into(),
                scores: Vec::new(),
            });
        }
        Check::Budget { what, max } => budget(*what, *max, episode),
        Check::FileExists { path } => match read_back(world, path, 0, episode.world_limit).await? {
            Ok(_) => verdict(true, format!("`{path}` exists")),
            Err(why) => verdict(false, why),
        },
        Check::FileContains { path, text, regex } => {
            let file = match read_back(world, path, FILE_SCAN_CAP, episode.world_limit).await? {
                Ok(file) => file,
                Err(why) => return Ok(verdict(false, why)),
            };
            let expected = match render(text) {
                Ok(e) => e,
                Err(e) => return Ok(verdict(false, format!("the scorer's template failed: {e}"))),
            };
            let op = if *regex { TextOp::Regex } else { TextOp::Includes };
            let searched = if file.is_cut() {
                format!(" (`{path}` has {} bytes; only the first {} were searched)", file.size, file.text.len())
            } else {
                String::new()
            };
            match text_matches(op, &file.text, &expected, false) {
                Ok(true) => verdict(true, format!("`{path}` contains {expected:?}{searched}")),
                Ok(false) => verdict(false, format!("`{path}` does not contain {expected:?}{searched}")),
                Err(e) => verdict(false, e),
            }
        }
        Check::Document { path, sections, min_words, max_words, max_section_words } => {
            let file = match read_back(world, path, FILE_SCAN_CAP, episode.world_limit).await? {
                Ok(file) => file,
                Err(why) => return Ok(verdict(false, why)),
            };
            document_check(path, &file.text, sections, *min_words, *max_words, *max_section_words)
        }
        Check::Command { command, timeout_s } => {
            // run_check stops the command at its timeout and says so; the outer bound, a
            // little later, is for a world whose check would not start or end at all.
            let limit = timeout_s.min(episode.world_limit.as_secs_f64());
            let bound = Duration::from_secs_f64(limit) + CHECK_GRACE;
            let ran = tokio::time::timeout(bound, world.run_check(command, limit)).await;
            match ran {
                Ok(Ok((0, _))) => verdict(true, format!("`{command}` exited 0")),
                Ok(Ok((code, output))) => {
                    let tail: String = output.chars().rev().take(300).collect::<Vec<_>>().into_iter().rev().collect();
                    verdict(false, format!("`{command}` exited {code}: {}", tail.trim()))
                }
                Ok(Err(failure)) => {
                    world_fault(&failure)?;
                    verdict(false, format!("`{command}` could not run: {}", failure.message))
                }
                Err(_) => verdict(false, format!("`{command}` did not end within {}s", limit)),
            }
        }
        Check::Grader { kind, criteria, model, template: custom, samples, threshold, mock } => {
            let Some(name) = grader_model(graders.forced.as_deref(), model.as_deref(), episode.suite_grader) else {
                return Err(ScoringFault::grader(format!(
                    "`{}` has no grader model: set `grader: {{model: …}}` in the suite, `model:` on the scorer, or --grader",
                    spec.name
                )));
            };
            // Nothing to judge: the grader is not asked, and the scorer fails.
            let Some(answer) = answer else { return Ok(no_answer()) };
            let Some(model) = graders.model(&name, episode, &spec.name, mock) else {
                return Err(ScoringFault::grader(format!("the grader model `{name}` was not opened")));
            };
            let model = match episode.recorder {
                Some(recorder) => Arc::new(grader::Logged {
                    inner: model,
                    recorder: recorder.clone(),
                    step: episode.ending.steps,
                    scorer: spec.name.clone(),
                }) as Arc<dyn LanguageModel>,
                None => model,
            };
            let criteria = match criteria.as_deref().map(render).transpose() {
                Ok(c) => c,
                Err(e) => return Ok(verdict(false, format!("the scorer's template failed: {e}"))),
            };
            let trajectory = compact_trajectory(episode);
            let input = grader::GraderInput {
                kind: match kind {
                    GraderKind::Rubric => grader::GraderKind::Rubric,
                    GraderKind::Qa => grader::GraderKind::Qa,
                },
                input: &episode.task.input,
                target: episode.task.target.as_deref(),
                answer: Some(answer),
                criteria: criteria.as_deref(),
                trajectory: &trajectory,
            };
            let settings = grader::GraderSettings {
                model,
                template: custom.clone().or_else(|| episode.suite_template.map(String::from)),
                samples: *samples,
                threshold: *threshold,
                max_prompt_chars: 24_000,
                retries: 2,
            };
            match grader::grade(&input, &settings).await {
                Ok(v) => {
                    let provenance = json!({
                        "model": v.model, "template_digest": v.template_digest, "samples": samples,
                        "agreement": v.agreement, "raw_outputs": v.raw_outputs, "usage": v.usage, "cost_usd": v.cost_usd,
                    });
                    (v.passed, v.score, v.explanation, Some(provenance))
                }
                Err(e) => {
                    return Err(ScoringFault::grader(format!("{} ({} raw outputs)", e.message, e.raw_outputs.len())));
                }
            }
        }
    })
}

/// A Markdown text's sections and word counts against what the scorer asks; every miss is
/// named.
fn document_check(
    path: &str,
    text: &str,
    sections: &[String],
    min_words: Option<usize>,
    max_words: Option<usize>,
    max_section_words: Option<usize>,
) -> Verdict {
    let doc = Document::parse_markdown(text);
    let mut misses = Vec::new();
    let missing: Vec<&str> = sections.iter().filter(|h| doc.find(h).is_none()).map(String::as_str).collect();
    if !missing.is_empty() {
        misses.push(format!("no section {}", missing.iter().map(|h| format!("`{h}`")).collect::<Vec<_>>().join(", ")));
    }
    let words = doc.words();
    if let Some(min) = min_words
        && words < min
    {
        misses.push(format!("{words} words, under {min}"));
    }
    if let Some(max) = max_words
        && words > max
    {
        misses.push(format!("{words} words, over {max}"));
    }
    if let Some(max) = max_section_words {
        for entry in doc.outline().into_iter().filter(|e| e.words > max) {
            misses.push(format!("section `{}` has {} words, over {max}", entry.heading, entry.words));
        }
    }
    if misses.is_empty() {
        let n = doc.sections.len();
        verdict(true, format!("`{path}` has the sections asked for and {words} words ({n} sections)"))
    } else {
        verdict(false, format!("`{path}`: {}", misses.join("; ")))
    }
}

/// A file of the final world, read within `limit`; or why it could not be (the scorer
/// fails); or a fault of the runner (the episode is unscored).
async fn read_back(
    world: &dyn World,
    path: &str,
    cap: usize,
    limit: Duration,
) -> Result<Result<ReadBack, String>, ScoringFault> {
    match tokio::time::timeout(limit, world.read_back(path, cap)).await {
        Ok(Ok(file)) => Ok(Ok(file)),
        Ok(Err(failure)) => {
            world_fault(&failure)?;
            Ok(Err(failure.message))
        }
        Err(_) => Ok(Err(format!("`{path}` could not be read within {}s", limit.as_secs_f64()))),
    }
}

/// A scorer's failure to look at the world that is the runner's fault, not the agent's.
fn world_fault(failure: &ToolFailure) -> Result<(), ScoringFault> {
    match &failure.fault {
        Some(cause) => {
            Err(ScoringFault { cause: (*cause).into(), message: failure.message.clone(), scores: Vec::new() })
        }
        None => Ok(()),
    }
}

fn text_matches(op: TextOp, haystack: &str, expected: &str, ignore_case: bool) -> Result<bool, String> {
    let fold = |s: &str| if ignore_case { s.to_lowercase() } else { s.to_owned() };
    Ok(match op {
        TextOp::Includes => fold(haystack).contains(&fold(expected)),
        TextOp::Equals => fold(haystack.trim()) == fold(expected.trim()),
        TextOp::Regex => regex::RegexBuilder::new(expected)
            .case_insensitive(ignore_case)
            .build()
            .map_err(|e| format!("invalid regex /{expected}/: {e}"))?
            .is_match(haystack),
    })
}

/// The first number in a text: `-3`, `1,234.5`, `42`.
fn first_number(text: &str) -> Option<f64> {
    static NUMBER: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    let re = NUMBER.get_or_init(|| regex::Regex::new(r"-?\d[\d,]*(\.\d+)?([eE][-+]?\d+)?").ok()).as_ref()?;
    re.find(text).and_then(|m| m.as_str().replace(',', "").parse().ok())
}

fn json_check(check: &JsonCheck, answer: &str) -> Verdict {
    let trimmed = answer.trim();
    let body = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|s| s.strip_suffix("```"))
        .unwrap_or(trimmed)
        .trim();
    let value: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => return verdict(false, format!("the answer is not valid JSON: {e}")),
    };
    match check {
        JsonCheck::Valid => verdict(true, "the answer is valid JSON".into()),
        JsonCheck::Schema(schema) => match jsonschema::validator_for(schema) {
            Err(e) => verdict(false, format!("the scorer's schema is invalid: {e}")),
            Ok(v) => {
                let errors: Vec<String> = v.iter_errors(&value).map(|e| e.to_string()).take(3).collect();
                if errors.is_empty() {
                    verdict(true, "the answer matches the schema".into())
                } else {
                    verdict(false, format!("the answer does not match the schema: {}", errors.join("; ")))
                }
            }
        },
        JsonCheck::PathEquals { path, value: expected } => {
            let pointer = if path.starts_with('/') { path.clone() } else { format!("/{}", path.replace('.', "/")) };
            match value.pointer(&pointer) {
                Some(found) if found == expected => verdict(true, format!("{path} is {expected}")),
                Some(found) => verdict(false, format!("{path} is {found}, not {expected}")),
                None => verdict(false, format!("the answer has no {path}")),
            }
        }
    }
}

fn arguments_match(mode: ArgMatch, expected: Option<&Value>, actual: &Value) -> bool {
    let Some(expected) = expected else { return true };
    match mode {
        ArgMatch::Exact => expected == actual,
        ArgMatch::Subset | ArgMatch::Pattern => {
            let (Some(want), Some(got)) = (expected.as_object(), actual.as_object()) else { return expected == actual };
            want.iter().all(|(k, w)| {
                let Some(g) = got.get(k) else { return false };
                match (mode, w) {
                    (ArgMatch::Pattern, Value::String(pattern)) => {
                        let text = g.as_str().map(String::from).unwrap_or_else(|| g.to_string());
                        regex::Regex::new(pattern).is_ok_and(|re| re.is_match(&text))
                    }
                    _ => w == g,
                }
            })
        }
    }
}

/// How many expected calls the trajectory holds (in order, or in any order), and the F1
/// of matched calls against the calls made.
fn sequence(actual: &[ToolCall], expected: &[ExpectedCall], ordered: bool, mode: ArgMatch, partial: bool) -> Verdict {
    let made: Vec<&ToolCall> = actual.iter().filter(|c| c.name != FINAL_TOOL).collect();
    let matches =
        |e: &ExpectedCall, c: &ToolCall| e.name == c.name && arguments_match(mode, e.arguments.as_ref(), &c.arguments);
    let matched = if ordered {
        let mut next = 0;
        for call in &made {
            if next < expected.len() && matches(&expected[next], call) {
                next += 1;
            }
        }
        next
    } else {
        // The most expected calls that can each have a made call of their own (bipartite
        // matching by augmenting paths; the lists are short).
        let edges: Vec<Vec<usize>> =
            expected.iter().map(|e| (0..made.len()).filter(|&i| matches(e, made[i])).collect()).collect();
        let mut owner: Vec<Option<usize>> = vec![None; made.len()];
        fn augment(e: usize, edges: &[Vec<usize>], owner: &mut [Option<usize>], seen: &mut [bool]) -> bool {
            for &c in &edges[e] {
                if !seen[c] {
                    seen[c] = true;
                    if owner[c].is_none_or(|other| augment(other, edges, owner, seen)) {
                        owner[c] = Some(e);
                        return true;
                    }
                }
            }
            false
        }
        (0..expected.len()).filter(|&e| augment(e, &edges, &mut owner, &mut vec![false; made.len()])).count()
    };
    let recall = matched as f64 / expected.len() as f64;
    let precision = if made.is_empty() { 0.0 } else { matched as f64 / made.len() as f64 };
    let f1 = if matched == 0 { 0.0 } else { 2.0 * precision * recall / (precision + recall) };
    let passed = matched == expected.len();
    let how = if ordered { "in order" } else { "in any order" };
    let explanation =
        format!("{matched} of {} expected calls made {how} ({} calls in all; F1 {f1:.2})", expected.len(), made.len());
    (
        passed,
        if partial {
            f1
        } else if passed {
            1.0
        } else {
            0.0
        },
        explanation,
        None,
    )
}

fn budget(what: Budget, max: f64, episode: &Finished<'_>) -> Verdict {
    let ending = episode.ending;
    let (used, unit) = match what {
        Budget::Steps => (Some(ending.steps as f64), "steps"),
        Budget::ToolErrors => (Some(ending.trajectory.tool_errors() as f64), "tool errors"),
        Budget::Tokens => (Some(ending.usage.total() as f64), "tokens"),
        Budget::CostUsd => (ending.cost_usd, "USD"),
        Budget::LatencyS => (Some(episode.wall_s), "seconds"),
    };
    match used {
        Some(used) if used <= max => verdict(true, format!("{used} {unit}, within {max}")),
        Some(used) => verdict(false, format!("{used} {unit}, over {max}")),
        None => verdict(false, "the cost is unknown: the model has no price in the config".into()),
    }
}

/// The trajectory as a grader reads it: one line per call, with its arguments and error.
fn compact_trajectory(episode: &Finished<'_>) -> String {
    let trajectory = &episode.ending.trajectory;
    let mut lines = Vec::new();
    for call in &trajectory.calls {
        let mut line = format!("- {}({})", call.name, call.arguments);
        if let Some(failed) = trajectory.errors.iter().find(|e| e.call_id == call.call_id) {
            line.push_str(&format!(" -> {}: {}", failed.error.kind.as_str(), failed.error.message));
        }
        lines.push(line);
    }
    if lines.is_empty() {
        lines.push("(no tool calls)".into());
    }
    lines.push(format!(
        "({} steps, {} tool errors, ended by {})",
        episode.ending.steps,
        trajectory.tool_errors(),
        episode.ending.termination.as_str()
    ));
    lines.join("\n")
}

/// The answer as explanations show it: quoted, and cut when long.
fn quote(answer: &str) -> String {
    const MAX: usize = 200;
    if answer.chars().count() <= MAX {
        format!("{answer:?}")
    } else {
        let cut: String = answer.chars().take(MAX).collect();
        format!("{cut:?}…")
    }
}

#[cfg(test)]
pub(crate) fn compact_for_tests(episode: &Finished<'_>) -> String {
    compact_trajectory(episode)
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
