//! `llm_rubric`, `model_graded_qa`, `model_graded_closedqa` and `factuality`: a grader model's verdict on the answer, with the
//! trajectory as context. The grading itself (template, verdict parsing, samples) is
//! `scoring::grader`; here the grader model is chosen, logged, and asked.

use std::sync::Arc;

use serde_json::json;

use super::{Answer, CheckResult, Scene};
use crate::domain::scorer::GraderKind;
use crate::model::LanguageModel;
use crate::scoring::{Finished, Graders, ScoringFault, grader, grader_model};

/// The grader that plays a scorer's scripted `mock:` verdicts, and the model that plays
/// the task's scripted turns.
const MOCK: &str = "mock";

/// What a graded scorer asks: its kind, criteria and model, and how it grades.
pub(crate) struct Asked<'a> {
    pub kind: GraderKind,
    pub criteria: Option<&'a str>,
    pub model: Option<&'a str>,
    pub template: Option<&'a str>,
    pub samples: u32,
    pub threshold: f64,
    /// A `mock` grader's scripted verdicts.
    pub mock: &'a [String],
}

/// Asks the grader model about the answer. A scorer with no grader model, or one that was
/// not opened, or a verdict that cannot be read, is a fault: the episode is unscored.
pub(crate) async fn check(
    scene: &Scene<'_>,
    scorer: &str,
    answer: &Answer<'_>,
    asked: &Asked<'_>,
    graders: &Graders,
) -> Result<CheckResult, ScoringFault> {
    let episode = scene.episode;
    let Some(name) = grader_model(graders.forced.as_deref(), asked.model, episode.suite_grader) else {
        return Err(ScoringFault::grader(format!(
            "`{scorer}` has no grader model: set `grader: {{model: …}}` in the suite, `model:` on the scorer, or --grader"
        )));
    };
    // A `mock` grader's verdicts are written before any answer: they judge the task's own
    // scripted turns, never a real model's, unless the command line asks for them.
    if name == MOCK && episode.model != MOCK && graders.forced.as_deref() != Some(MOCK) {
        return Err(ScoringFault::grader(format!(
            "`{scorer}`: scripted verdicts cannot judge a real model's answers; pass --grader MODEL (or --grader mock to take them)"
        )));
    }
    // Nothing to judge: the grader is not asked, and the scorer fails.
    let Some(text) = answer.text() else { return Ok(answer.missing()) };
    let Some(model) = graders.model(&name, episode, scorer, asked.mock) else {
        return Err(ScoringFault::grader(format!("the grader model `{name}` was not opened")));
    };
    let model = match episode.recorder {
        Some(recorder) => Arc::new(grader::Logged {
            inner: model,
            recorder: recorder.clone(),
            step: episode.ending.steps,
            scorer: scorer.to_owned(),
        }) as Arc<dyn LanguageModel>,
        None => model,
    };
    let criteria = match asked.criteria.map(|c| scene.render(c)).transpose() {
        Ok(c) => c,
        Err(failed) => return Ok(failed),
    };
    let trajectory = compact_trajectory(episode);
    let input = grader::GraderInput {
        kind: asked.kind,
        input: &episode.task.input,
        target: episode.task.target.as_deref(),
        answer: Some(text),
        criteria: criteria.as_deref(),
        trajectory: &trajectory,
    };
    let settings = grader::GraderSettings {
        model,
        template: asked.template.or(episode.suite_template).map(String::from),
        samples: asked.samples,
        threshold: asked.threshold,
        max_prompt_chars: 24_000,
        retries: 2,
    };
    match grader::grade(&input, &settings).await {
        Ok(v) => {
            let judge = grader::judge_settings(&input, &settings, &v);
            let provenance = json!({
                "model": v.model, "template_digest": v.template_digest, "samples": asked.samples,
                "agreement": v.agreement, "raw_outputs": v.raw_outputs, "usage": v.usage, "cost_usd": v.cost_usd,
                "judge": grader::judge_digest(&judge), "judge_settings": judge,
            });
            Ok(CheckResult {
                passed: v.passed,
                value: v.score,
                explanation: v.explanation,
                provenance: Some(provenance),
            })
        }
        Err(e) => Err(ScoringFault::grader(format!("{} ({} raw outputs)", e.message, e.raw_outputs.len()))),
    }
}

/// The trajectory as a grader reads it: one line per call, with its arguments and error.
pub(crate) fn compact_trajectory(episode: &Finished<'_>) -> String {
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
