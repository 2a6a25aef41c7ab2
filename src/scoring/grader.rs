//! The LLM grader behind the `llm_rubric` and `model_graded_qa` scorers: renders a prompt,
//! asks a model one or more times, parses each reply strictly and takes the majority.
//! An output that cannot be parsed is never a score of 0: it is retried, then a
//! `GraderError`, which leaves the episode unscored.

use std::sync::Arc;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::config::template;
use crate::domain::scorer::GraderKind;
use crate::log::Usage;
use crate::model::{LanguageModel, Message, ModelError, ModelRequest, ModelResponse};

/// The default prompt of `llm_rubric`.
pub const RUBRIC_TEMPLATE: &str = r#"You are grading the work of an AI agent against a rubric.

[Task]
{{ input }}
{% if target %}
[Reference answer]
{{ target }}
{% endif %}
[The agent's tool calls]
{% if trajectory %}{{ trajectory }}{% else %}(no tool calls){% endif %}

[The agent's final answer]
{% if answer %}{{ answer }}{% else %}(the agent gave no final answer){% endif %}

[Criteria]
{{ criteria }}

Judge how well the agent's final answer meets the criteria; look at its tool calls only where the criteria ask about them. Reason step by step first. Then end your reply with exactly one line holding a JSON object with your score, a number from 0 (does not meet the criteria at all) to 1 (fully meets them), for example:
{"score": 0.8}
The last line of your reply must be that JSON object only: no other text, no code fence."#;

/// The default prompt of `model_graded_qa`.
pub const QA_TEMPLATE: &str = r#"You are checking whether an AI agent's answer to a task is correct.

[Task]
{{ input }}

[Expert answer]
{{ target }}

[The agent's tool calls]
{% if trajectory %}{{ trajectory }}{% else %}(no tool calls){% endif %}

[The agent's final answer]
{% if answer %}{{ answer }}{% else %}(the agent gave no final answer){% endif %}

Compare the agent's final answer with the expert answer. Ignore differences of style, formatting and wording; judge only whether the substance agrees. The tool calls are context, not the answer. Reason step by step first. Then end your reply with exactly one line holding a JSON object with your score: 1 if the answer is correct, 0 if it is incorrect, or a number in between if it is partly correct, for example:
{"score": 1}
The last line of your reply must be that JSON object only: no other text, no code fence."#;

/// The default prompt of `model_graded_closedqa`: promptfoo's question, whether the
/// submission meets the criterion, answered Y or N on the last line.
pub const CLOSEDQA_TEMPLATE: &str = r#"You are assessing a submitted answer to a task against a criterion.

[Task]
{{ input }}

[Submission]
{% if answer %}{{ answer }}{% else %}(no answer was submitted){% endif %}

[Criterion]
{{ criteria }}

Does the submission meet the criterion? Reason step by step first, so that your conclusion is right; do not state it at the start. Then end your reply with a line holding only the letter Y if the submission meets the criterion, or N if it does not, without quotes or punctuation."#;

/// The default prompt of `factuality`: promptfoo's five relations between a submission and
/// an expert answer, chosen by letter on the last line.
pub const FACTUALITY_TEMPLATE: &str = r#"You are comparing the factual content of a submitted answer with an expert answer.

[Question]
{{ input }}

[Expert answer]
{{ criteria }}

[Submission]
{% if answer %}{{ answer }}{% else %}(no answer was submitted){% endif %}

Compare the factual content of the submission with the expert answer; ignore differences of style, grammar and punctuation. They relate in one of these ways:
(A) The submission is a subset of the expert answer and fully consistent with it.
(B) The submission is a superset of the expert answer and fully consistent with it.
(C) The submission contains all the same details as the expert answer.
(D) There is a disagreement between the submission and the expert answer.
(E) The answers differ, but these differences do not matter for factuality.
Reason step by step first. Then end your reply with a line holding only the letter of your choice: A, B, C, D or E."#;

/// What each of `factuality`'s choices means, and whether it passes (promptfoo's default:
/// all but a disagreement).
const FACTUALITY_CHOICES: [(char, &str, bool); 5] = [
    ('A', "a consistent subset of the expert answer", true),
    ('B', "a consistent superset of the expert answer", true),
    ('C', "the same details as the expert answer", true),
    ('D', "disagrees with the expert answer", false),
    ('E', "differs from the expert answer in ways that do not matter for factuality", true),
];

/// The longest explanation kept, in characters.
const MAX_EXPLANATION_CHARS: usize = 2000;

/// The template a grader of `kind` is asked with when neither the scorer nor the suite
/// gives one.
pub fn default_template(kind: GraderKind) -> &'static str {
    match kind {
        GraderKind::Rubric => RUBRIC_TEMPLATE,
        GraderKind::Qa => QA_TEMPLATE,
        GraderKind::ClosedQa => CLOSEDQA_TEMPLATE,
        GraderKind::Factuality => FACTUALITY_TEMPLATE,
    }
}

/// What the grader looks at.
#[derive(Debug, Clone, Copy)]
pub struct GraderInput<'a> {
    pub kind: GraderKind,
    /// The task's input.
    pub input: &'a str,
    /// The task's target.
    pub target: Option<&'a str>,
    /// The agent's final answer; `None` when it gave none.
    pub answer: Option<&'a str>,
    /// The rubric text (`Rubric` only).
    pub criteria: Option<&'a str>,
    /// A compact text of the tool calls, arguments and errors, made by the caller.
    pub trajectory: &'a str,
}

#[derive(Clone)]
pub struct GraderSettings {
    pub model: Arc<dyn LanguageModel>,
    /// A minijinja template overriding the default; it sees `input`, `target`, `answer`,
    /// `criteria`, `trajectory` and `kind` (`"rubric"` or `"qa"`).
    pub template: Option<String>,
    /// How many times to ask; the majority of pass/fail wins (0 counts as 1).
    pub samples: u32,
    /// A sample passes when its score is at least this.
    pub threshold: f64,
    /// The trajectory is cut in its middle so that the rendered prompt fits.
    pub max_prompt_chars: usize,
    /// Extra attempts per sample when the output cannot be parsed.
    pub retries: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The mean score of the samples on the majority side.
    pub score: f64,
    /// Whether most samples passed; a tie does not pass.
    pub passed: bool,
    /// The fraction of samples on the majority side.
    pub agreement: f64,
    /// The reasoning of the first sample on the majority side.
    pub explanation: String,
    pub model: String,
    /// sha256 hex of the template text used.
    pub template_digest: String,
    /// Every raw model output, in order, including unparseable ones.
    pub raw_outputs: Vec<String>,
    /// Summed over all grader calls.
    pub usage: Usage,
    /// Summed; `None` if any call had no price.
    pub cost_usd: Option<f64>,
}

/// The grader gave no verdict: its model failed, or no output could be parsed.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct GraderError {
    pub message: String,
    pub raw_outputs: Vec<String>,
}

/// Logs each of a grader's calls as a `model_call` event marked with its scorer, answered
/// or not: its raw outputs are in the log even when none can be parsed, and a replay of
/// the run's log serves them back.
pub struct Logged {
    pub inner: Arc<dyn LanguageModel>,
    pub recorder: crate::log::Recorder,
    /// The episode's last step: grading comes after it.
    pub step: u32,
    pub scorer: String,
}

#[async_trait::async_trait]
impl LanguageModel for Logged {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn sampling(&self) -> Map<String, Value> {
        self.inner.sampling()
    }

    fn endpoint(&self) -> Option<&str> {
        self.inner.endpoint()
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let caller = crate::model::Caller::Scorer(self.scorer.clone());
        let (result, event) =
            crate::model::respond_logged(self.inner.as_ref(), self.inner.name(), request, self.step, caller).await;
        self.recorder.emit(&event);
        result
    }
}

/// One parsed grader reply.
struct Sample {
    score: f64,
    explanation: String,
}

/// Grades one episode: `samples` calls one after another, each retried while its output
/// cannot be parsed, then the majority of pass/fail.
pub async fn grade(input: &GraderInput<'_>, settings: &GraderSettings) -> Result<Verdict, GraderError> {
    let model = settings.model.name().to_owned();
    let template_text = settings.template.as_deref().unwrap_or(default_template(input.kind));
    let prompt = render_prompt(template_text, input, settings.max_prompt_chars).map_err(|e| GraderError {
        message: format!("failed to render the grader's template: {e}"),
        raw_outputs: vec![],
    })?;
    let messages = [Message::User { content: prompt }];
    let request = ModelRequest::new(&messages, &[]);

    let mut raw_outputs = Vec::new();
    let mut usage = Usage::default();
    let mut cost_usd = Some(0.0);
    let mut samples = Vec::new();
    for _ in 0..settings.samples.max(1) {
        let mut last_problem = String::new();
        let mut sample = None;
        for _ in 0..=settings.retries {
            let response = match settings.model.respond(&request).await {
                Ok(response) => response,
                Err(e) => {
                    return Err(GraderError {
                        message: format!("failed to grade with {model}: {}", e.message),
                        raw_outputs,
                    });
                }
            };
            usage.add(response.usage);
            cost_usd = cost_usd.zip(response.cost_usd).map(|(a, b)| crate::log::add_cost(a, b));
            let text = response.text.unwrap_or_default();
            let parsed = parse(input.kind, &text);
            raw_outputs.push(text);
            match parsed {
                Ok(parsed) => {
                    sample = Some(parsed);
                    break;
                }
                Err(problem) => last_problem = problem,
            }
        }
        let Some(sample) = sample else {
            let last = raw_outputs.last().map(|t| cut(t, 200)).unwrap_or_default();
            return Err(GraderError {
                message: format!(
                    "failed to grade with {model}: its output could not be parsed in {} attempt(s) ({last_problem}); the last was {last:?}",
                    settings.retries + 1
                ),
                raw_outputs,
            });
        };
        samples.push(sample);
    }

    let (passing, failing): (Vec<Sample>, Vec<Sample>) =
        samples.into_iter().partition(|s| s.score >= settings.threshold);
    let total = (passing.len() + failing.len()) as f64;
    let passed = passing.len() > failing.len();
    let majority = if passed { passing } else { failing };
    let score = majority.iter().map(|s| s.score).sum::<f64>() / majority.len() as f64;
    Ok(Verdict {
        score,
        passed,
        agreement: majority.len() as f64 / total,
        explanation: majority.into_iter().next().map(|s| s.explanation).unwrap_or_default(),
        model,
        template_digest: hex::encode(Sha256::digest(template_text.as_bytes())),
        raw_outputs,
        usage,
        cost_usd,
    })
}

/// Everything of a judge that decides its verdicts, save the answer it is shown: its model
/// and the sampling it is sent with (the provider's, from `runner.yaml`), its template, the
/// kind, the criteria as rendered for the task, how many samples and the pass threshold,
/// the retries and the prompt's size limit. Texts are given as their sha256 digests.
pub fn judge_settings(input: &GraderInput<'_>, settings: &GraderSettings, verdict: &Verdict) -> Value {
    let digest = |text: &str| hex::encode(Sha256::digest(text.as_bytes()));
    serde_json::json!({
        "model": verdict.model,
        "sampling": settings.model.sampling(),
        "template": verdict.template_digest,
        "kind": input.kind.as_str(),
        "criteria": input.criteria.map(digest),
        "samples": settings.samples.max(1),
        "threshold": settings.threshold,
        "retries": settings.retries,
        "max_prompt_chars": settings.max_prompt_chars,
    })
}

/// The judge's one digest: the sha256 of its [`judge_settings`] (keys sorted).
pub fn judge_digest(settings: &Value) -> String {
    hex::encode(Sha256::digest(serde_json::to_vec(settings).unwrap_or_default()))
}

/// Renders the prompt, cutting the middle of the trajectory until the prompt fits in
/// `max_chars` (or the trajectory is gone: the rest of the prompt is never cut).
fn render_prompt(template_text: &str, input: &GraderInput<'_>, max_chars: usize) -> Result<String, String> {
    let mut budget = input.trajectory.chars().count();
    loop {
        let trajectory = trim_middle(input.trajectory, budget);
        let prompt = template::render(template_text, &context(input, &trajectory))?;
        let len = prompt.chars().count();
        if len <= max_chars || budget == 0 {
            return Ok(prompt);
        }
        budget = budget.saturating_sub(len - max_chars);
    }
}

/// Every variable a template may use; missing ones are empty, as templates are strict.
fn context(input: &GraderInput<'_>, trajectory: &str) -> Map<String, Value> {
    let text = |s: Option<&str>| Value::String(s.unwrap_or_default().to_owned());
    let mut context = Map::new();
    context.insert("kind".into(), Value::String(input.kind.as_str().to_owned()));
    context.insert("input".into(), Value::String(input.input.to_owned()));
    context.insert("target".into(), text(input.target));
    context.insert("answer".into(), text(input.answer));
    context.insert("criteria".into(), text(input.criteria));
    context.insert("trajectory".into(), Value::String(trajectory.to_owned()));
    context
}

/// Keeps the start and end of `text` with a visible marker between them, in at most
/// `max_chars` characters (the marker alone when even that does not fit).
fn trim_middle(text: &str, max_chars: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max_chars {
        return text.to_owned();
    }
    let marker = |cut: usize| format!("\n[… {cut} characters cut …]\n");
    // The marker for the whole text is at least as long as the one finally used.
    let keep = max_chars.saturating_sub(marker(chars.len()).chars().count());
    let head = keep - keep / 2;
    let tail = keep / 2;
    let mut trimmed: String = chars[..head].iter().collect();
    trimmed.push_str(&marker(chars.len() - keep));
    trimmed.extend(&chars[chars.len() - tail..]);
    trimmed
}

/// A grader's reply as its kind asks for it: a JSON score, a Y or N, or a letter from A to E.
fn parse(kind: GraderKind, output: &str) -> Result<Sample, String> {
    match kind {
        GraderKind::Rubric | GraderKind::Qa => parse_score(output),
        GraderKind::ClosedQa | GraderKind::Factuality => parse_choice(kind, output),
    }
}

/// The last non-empty line holds only a letter (`Y`/`N`, or `A`–`E`; quotes, brackets,
/// `*` and a final `.` aside); what comes before it is the explanation.
fn parse_choice(kind: GraderKind, output: &str) -> Result<Sample, String> {
    let lines: Vec<&str> = output.lines().collect();
    let Some(last) = lines.iter().rposition(|l| !l.trim().is_empty()) else {
        return Err("the output is empty".into());
    };
    let letter = lines[last].trim().trim_end_matches('.').trim_matches(|c: char| "\"'*()[]` ".contains(c));
    let before = cut(lines[..last].join("\n").trim(), MAX_EXPLANATION_CHARS);
    let mut chars = letter.chars();
    let (Some(letter), None) = (chars.next().map(|c| c.to_ascii_uppercase()), chars.next()) else {
        return Err("its last line is not a single letter".into());
    };
    let (score, meaning) = match kind {
        GraderKind::ClosedQa => match letter {
            'Y' => (1.0, "meets the criterion"),
            'N' => (0.0, "does not meet the criterion"),
            _ => return Err("its last line is neither Y nor N".into()),
        },
        _ => match FACTUALITY_CHOICES.iter().find(|(c, _, _)| *c == letter) {
            Some((_, meaning, passes)) => (if *passes { 1.0 } else { 0.0 }, *meaning),
            None => return Err("its last line is not one of A, B, C, D, E".into()),
        },
    };
    let explanation =
        if before.is_empty() { format!("({letter}) {meaning}") } else { format!("({letter}) {meaning}: {before}") };
    Ok(Sample { score, explanation: cut(&explanation, MAX_EXPLANATION_CHARS) })
}

/// The last non-empty line (fences aside) must be a JSON object whose `score` is a
/// number in [0, 1]; what comes before it is the explanation.
fn parse_score(output: &str) -> Result<Sample, String> {
    let lines: Vec<&str> = output.lines().collect();
    let is_fence = |line: &str| {
        let line = line.trim();
        line.strip_prefix("```").is_some_and(|rest| rest.chars().all(|c| c.is_ascii_alphanumeric()))
    };
    let Some(last) = lines.iter().rposition(|l| !l.trim().is_empty() && !is_fence(l)) else {
        return Err("the output is empty".into());
    };
    let line = lines[last].trim();
    let line = line.strip_prefix("```json").or_else(|| line.strip_prefix("```")).unwrap_or(line);
    let line = line.strip_suffix("```").unwrap_or(line).trim();
    let object = match serde_json::from_str::<Value>(line) {
        Ok(Value::Object(object)) => object,
        _ => return Err("its last line is not a JSON object".into()),
    };
    let score = match object.get("score") {
        Some(Value::Number(n)) => n.as_f64().filter(|s| (0.0..=1.0).contains(s)),
        Some(_) => None,
        None => return Err("its last line has no `score`".into()),
    };
    let Some(score) = score else {
        return Err("its `score` is not a number from 0 to 1".into());
    };
    let mut before = &lines[..last];
    while let Some((tail, rest)) = before.split_last() {
        if !(tail.trim().is_empty() || is_fence(tail)) {
            break;
        }
        before = rest;
    }
    Ok(Sample { score, explanation: cut(before.join("\n").trim(), MAX_EXPLANATION_CHARS) })
}

/// At most `max_chars` characters of `text`, with `…` when cut.
fn cut(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;

    /// Replies with the given texts in order (`None`: no price), recording each prompt.
    struct Scripted {
        outputs: Vec<(String, Option<f64>)>,
        prompts: Mutex<Vec<String>>,
    }

    impl Scripted {
        fn new(outputs: &[&str]) -> Arc<Self> {
            Self::priced(outputs.iter().map(|o| (*o, Some(0.01))).collect())
        }

        fn priced(outputs: Vec<(&str, Option<f64>)>) -> Arc<Self> {
            let outputs = outputs.into_iter().map(|(o, c)| (o.to_owned(), c)).collect();
            Arc::new(Scripted { outputs, prompts: Mutex::new(Vec::new()) })
        }

        fn prompts(&self) -> Vec<String> {
            self.prompts.lock().map(|p| p.clone()).unwrap_or_default()
        }

        fn calls(&self) -> usize {
            self.prompts().len()
        }
    }

    #[async_trait]
    impl LanguageModel for Scripted {
        fn name(&self) -> &str {
            "scripted/judge"
        }

        async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
            assert!(request.tools.is_empty(), "the grader sends no tools");
            let [Message::User { content }] = request.messages else {
                panic!("the grader sends one user message, not {:?}", request.messages);
            };
            let mut prompts = self.prompts.lock().map_err(|_| ModelError::new("test".into(), "poisoned"))?;
            let n = prompts.len();
            prompts.push(content.clone());
            let Some((text, cost_usd)) = self.outputs.get(n) else {
                return Err(ModelError::new(
                    crate::log::UnscoredCause::MockExhausted,
                    format!("the script has no turn {}", n + 1),
                ));
            };
            Ok(ModelResponse {
                text: Some(text.clone()),
                usage: Usage { input_tokens: 10, output_tokens: 5, cached_tokens: 0 },
                cost_usd: *cost_usd,
                ..ModelResponse::default()
            })
        }
    }

    fn settings(model: Arc<Scripted>, samples: u32, retries: u32) -> GraderSettings {
        GraderSettings { model, template: None, samples, threshold: 0.5, max_prompt_chars: 100_000, retries }
    }

    fn qa<'a>(answer: Option<&'a str>) -> GraderInput<'a> {
        GraderInput {
            kind: GraderKind::Qa,
            input: "What is 6 times 7?",
            target: Some("42"),
            answer,
            criteria: None,
            trajectory: "calc(expr=\"6*7\") -> 42",
        }
    }

    fn digest(text: &str) -> String {
        hex::encode(Sha256::digest(text.as_bytes()))
    }

    #[tokio::test]
    async fn agreeing_samples_pass_unanimously() {
        let model = Scripted::new(&[
            "The answer is 42.\nIt matches.\n{\"score\": 1}",
            "Correct.\n{\"score\": 1}",
            "{\"score\": 1.0}",
        ]);
        let verdict = grade(&qa(Some("42")), &settings(model.clone(), 3, 0)).await.unwrap();
        assert!(verdict.passed);
        assert_eq!(verdict.agreement, 1.0);
        assert_eq!(verdict.score, 1.0);
        assert_eq!(verdict.explanation, "The answer is 42.\nIt matches.");
        assert_eq!(verdict.model, "scripted/judge");
        assert_eq!(verdict.raw_outputs.len(), 3);
        assert_eq!(verdict.usage, Usage { input_tokens: 30, output_tokens: 15, cached_tokens: 0 });
        assert!((verdict.cost_usd.unwrap() - 0.03).abs() < 1e-9, "{:?}", verdict.cost_usd);
        assert_eq!(verdict.template_digest, digest(QA_TEMPLATE));
        assert_eq!(model.calls(), 3);
    }

    #[tokio::test]
    async fn disagreeing_samples_take_the_majority() {
        let model = Scripted::new(&["fail\n{\"score\": 0.2}", "good\n{\"score\": 0.9}", "fine\n{\"score\": 0.7}"]);
        let verdict = grade(&qa(Some("42")), &settings(model, 3, 0)).await.unwrap();
        assert!(verdict.passed);
        assert!((verdict.agreement - 2.0 / 3.0).abs() < 1e-9, "{}", verdict.agreement);
        assert!((verdict.score - 0.8).abs() < 1e-9, "{}", verdict.score);
        assert_eq!(verdict.explanation, "good");

        let model = Scripted::new(&["good\n{\"score\": 0.9}", "bad\n{\"score\": 0.1}", "worse\n{\"score\": 0.0}"]);
        let verdict = grade(&qa(Some("41")), &settings(model, 3, 0)).await.unwrap();
        assert!(!verdict.passed);
        assert!((verdict.score - 0.05).abs() < 1e-9, "{}", verdict.score);
        assert_eq!(verdict.explanation, "bad");
    }

    #[tokio::test]
    async fn a_tie_does_not_pass() {
        let model = Scripted::new(&["yes\n{\"score\": 1}", "no\n{\"score\": 0}"]);
        let verdict = grade(&qa(Some("42")), &settings(model, 2, 0)).await.unwrap();
        assert!(!verdict.passed);
        assert_eq!(verdict.agreement, 0.5);
        assert_eq!(verdict.score, 0.0);
    }

    #[tokio::test]
    async fn the_threshold_is_applied_in_code() {
        let strict = GraderSettings { threshold: 0.7, ..settings(Scripted::new(&["{\"score\": 0.6}"]), 1, 0) };
        let verdict = grade(&qa(Some("42")), &strict).await.unwrap();
        assert!(!verdict.passed);
        assert_eq!(verdict.score, 0.6);

        let lenient = GraderSettings { threshold: 0.6, ..settings(Scripted::new(&["{\"score\": 0.6}"]), 1, 0) };
        assert!(grade(&qa(Some("42")), &lenient).await.unwrap().passed);
    }

    #[tokio::test]
    async fn an_unparseable_output_is_retried() {
        let model = Scripted::new(&["Looks right to me.", "Looks right.\n{\"score\": 1}"]);
        let verdict = grade(&qa(Some("42")), &settings(model.clone(), 1, 1)).await.unwrap();
        assert!(verdict.passed);
        assert_eq!(verdict.raw_outputs, ["Looks right to me.", "Looks right.\n{\"score\": 1}"]);
        assert_eq!(verdict.usage.input_tokens, 20);
        assert_eq!(model.calls(), 2);
    }

    #[tokio::test]
    async fn unparseable_every_time_is_an_error_with_the_outputs() {
        let model = Scripted::new(&["maybe", "score: 1", "{\"verdict\": \"pass\"}", "{\"score\": 1}"]);
        let err = grade(&qa(Some("42")), &settings(model.clone(), 1, 2)).await.unwrap_err();
        assert_eq!(err.raw_outputs, ["maybe", "score: 1", "{\"verdict\": \"pass\"}"]);
        assert!(err.message.contains("3 attempt(s)"), "{}", err.message);
        assert_eq!(model.calls(), 3);
    }

    #[tokio::test]
    async fn a_refusal_is_an_error_not_a_zero() {
        let model = Scripted::new(&["I can't help with that"]);
        let err = grade(&qa(Some("42")), &settings(model, 1, 0)).await.unwrap_err();
        assert_eq!(err.raw_outputs, ["I can't help with that"]);
        assert!(err.message.contains("could not be parsed"), "{}", err.message);
    }

    #[tokio::test]
    async fn a_score_out_of_range_is_unparseable() {
        let model = Scripted::new(&["Great!\n{\"score\": 1.5}"]);
        let err = grade(&qa(Some("42")), &settings(model, 1, 0)).await.unwrap_err();
        assert!(err.message.contains("not a number from 0 to 1"), "{}", err.message);
    }

    #[tokio::test]
    async fn a_model_error_is_a_grader_error_with_its_message() {
        let model = Scripted::new(&[]);
        let err = grade(&qa(Some("42")), &settings(model, 1, 3)).await.unwrap_err();
        assert!(err.message.contains("the script has no turn 1"), "{}", err.message);
        assert!(err.raw_outputs.is_empty());
    }

    #[tokio::test]
    async fn cost_is_unknown_when_any_call_had_no_price() {
        let model = Scripted::priced(vec![("{\"score\": 1}", Some(0.01)), ("{\"score\": 1}", None)]);
        let verdict = grade(&qa(Some("42")), &settings(model, 2, 0)).await.unwrap();
        assert_eq!(verdict.cost_usd, None);
    }

    #[tokio::test]
    async fn a_long_trajectory_is_trimmed_to_fit() {
        let trajectory = format!("START{}END", "x".repeat(10_000));
        let input = GraderInput { trajectory: &trajectory, ..qa(Some("42")) };
        let model = Scripted::new(&["{\"score\": 1}"]);
        let limited = GraderSettings { max_prompt_chars: 3_000, ..settings(model.clone(), 1, 0) };
        grade(&input, &limited).await.unwrap();
        let prompt = &model.prompts()[0];
        assert!(prompt.chars().count() <= 3_000, "{} chars", prompt.chars().count());
        assert!(prompt.contains("characters cut …]"), "{prompt}");
        assert!(prompt.contains("START") && prompt.contains("END"), "{prompt}");
        assert!(prompt.contains("What is 6 times 7?"));
    }

    #[tokio::test]
    async fn a_short_trajectory_is_kept_whole() {
        let model = Scripted::new(&["{\"score\": 1}"]);
        grade(&qa(Some("42")), &settings(model.clone(), 1, 0)).await.unwrap();
        let prompt = &model.prompts()[0];
        assert!(prompt.contains("calc(expr=\"6*7\") -> 42"), "{prompt}");
        assert!(!prompt.contains("characters cut"), "{prompt}");
    }

    #[tokio::test]
    async fn a_template_override_is_used() {
        let model = Scripted::new(&["{\"score\": 1}"]);
        let template = "Grade {{ answer }} ({{ kind }}) for {{ input }}; criteria: [{{ criteria }}]".to_owned();
        let custom = GraderSettings { template: Some(template.clone()), ..settings(model.clone(), 1, 0) };
        let verdict = grade(&qa(Some("42")), &custom).await.unwrap();
        assert_eq!(model.prompts()[0], "Grade 42 (qa) for What is 6 times 7?; criteria: []");
        assert_eq!(verdict.template_digest, digest(&template));
        assert_ne!(verdict.template_digest, digest(QA_TEMPLATE));
    }

    #[tokio::test]
    async fn a_broken_template_is_an_error() {
        let model = Scripted::new(&["{\"score\": 1}"]);
        let custom = GraderSettings { template: Some("{{ answr }}".into()), ..settings(model.clone(), 1, 0) };
        let err = grade(&qa(Some("42")), &custom).await.unwrap_err();
        assert!(err.message.contains("template"), "{}", err.message);
        assert_eq!(model.calls(), 0);
    }

    #[tokio::test]
    async fn the_rubric_prompt_holds_the_criteria() {
        let model = Scripted::new(&["{\"score\": 1}"]);
        let input = GraderInput {
            kind: GraderKind::Rubric,
            criteria: Some("Mentions the unit (metres)."),
            target: None,
            ..qa(Some("It is 42 metres."))
        };
        let verdict = grade(&input, &settings(model.clone(), 1, 0)).await.unwrap();
        let prompt = &model.prompts()[0];
        assert!(prompt.contains("Mentions the unit (metres)."), "{prompt}");
        assert!(prompt.contains("It is 42 metres."), "{prompt}");
        assert!(prompt.contains("What is 6 times 7?"), "{prompt}");
        assert!(prompt.contains("The last line of your reply must be that JSON object only"), "{prompt}");
        assert!(!prompt.contains("[Reference answer]"), "{prompt}");
        assert_eq!(verdict.template_digest, digest(RUBRIC_TEMPLATE));
    }

    #[tokio::test]
    async fn the_qa_prompt_holds_the_target() {
        let model = Scripted::new(&["{\"score\": 1}"]);
        grade(&qa(None), &settings(model.clone(), 1, 0)).await.unwrap();
        let prompt = &model.prompts()[0];
        assert!(prompt.contains("[Expert answer]\n42\n"), "{prompt}");
        assert!(prompt.contains("(the agent gave no final answer)"), "{prompt}");
        assert!(prompt.contains("The last line of your reply must be that JSON object only"), "{prompt}");
    }

    /// `Some(score)` when `output` parses, `None` when it must not.
    fn check(output: &str, expected: Option<f64>) {
        let parsed = parse_score(output).map(|s| s.score);
        assert_eq!(parsed.as_ref().ok().copied(), expected, "{output:?} parsed as {parsed:?}");
    }

    #[test]
    fn closedqa_reads_y_or_n_and_factuality_a_letter_failing_only_d() {
        let choice = |kind, output: &str| parse(kind, output).map(|s| s.score);
        assert_eq!(choice(GraderKind::ClosedQa, "It names Paris.\nY"), Ok(1.0));
        assert_eq!(choice(GraderKind::ClosedQa, "No city.\n\nN\n"), Ok(0.0));
        assert_eq!(choice(GraderKind::ClosedQa, "**y**"), Ok(1.0));
        assert!(choice(GraderKind::ClosedQa, "Yes").is_err(), "a word is not the letter");
        assert!(choice(GraderKind::ClosedQa, "Y\nbecause").is_err(), "the letter is the last line");
        for (letter, score) in [("A", 1.0), ("(B)", 1.0), ("C.", 1.0), ("(D)", 0.0), ("E", 1.0)] {
            assert_eq!(choice(GraderKind::Factuality, &format!("Step by step.\n{letter}")), Ok(score), "{letter}");
        }
        assert!(choice(GraderKind::Factuality, "F").is_err());
        assert!(choice(GraderKind::Factuality, "Y").is_err());
        let why = parse(GraderKind::Factuality, "It says 1900.\nD").unwrap().explanation;
        assert_eq!(why, "(D) disagrees with the expert answer: It says 1900.");
    }

    #[test]
    fn parsing_is_strict() {
        check("reasoning\n{\"score\": 0.25}", Some(0.25));
        check("  {\"score\": 0}  \n\n", Some(0.0));
        check("reasoning\n```json\n{\"score\": 1}\n```\n", Some(1.0));
        check("```{\"score\": 1}```", Some(1.0));
        check("{\"score\": 1, \"reason\": \"ok\"}", Some(1.0));
        check("{\"score\": 7}", None);
        check("{\"score\": -0.1}", None);
        check("{\"score\": \"1\"}", None);
        check("{\"grade\": 1}", None);
        check("{\"score\": 1}\nThat is my verdict.", None);
        check("[1]", None);
        check("", None);
        check("```\n```", None);
    }

    #[test]
    fn the_explanation_is_the_text_before_the_score() {
        let sample = parse_score("  Step 1: ok.\nStep 2: ok.\n```json\n{\"score\": 1}\n```").unwrap();
        assert_eq!(sample.explanation, "Step 1: ok.\nStep 2: ok.");
        let long = format!("{}\n{{\"score\": 1}}", "é".repeat(5_000));
        assert_eq!(parse_score(&long).unwrap().explanation.chars().count(), MAX_EXPLANATION_CHARS + 1);
    }

    #[test]
    fn trimming_keeps_both_ends_within_the_limit() {
        let text = format!("{}{}", "a".repeat(500), "b".repeat(500));
        let trimmed = trim_middle(&text, 100);
        assert!(trimmed.chars().count() <= 100, "{trimmed}");
        assert!(trimmed.starts_with('a') && trimmed.ends_with('b'), "{trimmed}");
        let head = trimmed.split('\n').next().unwrap_or_default().len();
        let tail = trimmed.rsplit('\n').next().unwrap_or_default().len();
        let kept = head + tail;
        assert!(head > 0 && tail > 0, "{trimmed}");
        assert!(trimmed.contains(&format!("[… {} characters cut …]", 1000 - kept)), "{trimmed}");
        assert_eq!(trim_middle("short", 100), "short");
    }
}
