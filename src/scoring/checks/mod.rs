//! The checks a scorer can make, one file each, and what they share: the scene they look
//! at (the finished episode, the task's template values, the final world), the text a check
//! of text reads, and the verdict they give. `scoring::apply` matches a scorer to its check.

pub(crate) mod budget;
pub(crate) mod code;
pub(crate) mod command;
pub(crate) mod communicated;
pub(crate) mod document;
pub(crate) mod file;
pub(crate) mod graded;
pub(crate) mod json;
pub(crate) mod literal;
pub(crate) mod numeric;
pub(crate) mod similar;
pub(crate) mod text;
pub(crate) mod tool_called;
pub(crate) mod tool_sequence;
pub(crate) mod verifier;

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::{Finished, ScoringFault};
use crate::config::template;
use crate::environment::{ReadBack, ToolFailure, World};

/// How much of a file `file_contains` searches: the start of a larger file only.
pub const FILE_SCAN_CAP: usize = 16 << 20;

/// What a check found: whether it passed, its value, its explanation and, for graders, the
/// grader's provenance.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CheckResult {
    pub passed: bool,
    pub value: f64,
    pub explanation: String,
    pub provenance: Option<Value>,
}

impl CheckResult {
    /// A result of `value`, with no grader behind it.
    pub fn valued(passed: bool, value: f64, explanation: String) -> Self {
        CheckResult { passed, value, explanation, provenance: None }
    }
}

/// A result worth 1 or 0.
pub(crate) fn verdict(passed: bool, explanation: String) -> CheckResult {
    CheckResult::valued(passed, if passed { 1.0 } else { 0.0 }, explanation)
}

/// What a check looks at: the finished episode, the task's template values and the final
/// world.
pub(crate) struct Scene<'a> {
    pub episode: &'a Finished<'a>,
    pub context: &'a Map<String, Value>,
    pub world: &'a dyn World,
}

impl Scene<'_> {
    /// A scorer's text rendered with the task's values; a template that fails is the
    /// scorer's failing verdict.
    pub fn render(&self, text: &str) -> Result<String, CheckResult> {
        template::render(text, self.context).map_err(|e| verdict(false, format!("the scorer's template failed: {e}")))
    }

    /// A file of the final world, read within the episode's time limit; or why it could
    /// not be (the scorer fails); or a fault of the runner (the episode is unscored).
    pub async fn read_back(&self, path: &str, cap: usize) -> Result<Result<ReadBack, String>, ScoringFault> {
        let limit = self.episode.world_limit;
        match tokio::time::timeout(limit, self.world.read_back(path, cap)).await {
            Ok(Ok(file)) => Ok(Ok(file)),
            Ok(Err(failure)) => {
                world_fault(&failure)?;
                Ok(Err(failure.message))
            }
            Err(_) => Ok(Err(format!("`{path}` could not be read within {}s", limit.as_secs_f64()))),
        }
    }
}

/// A scorer's failure to look at the world that is the runner's fault, not the agent's.
pub(crate) fn world_fault(failure: &ToolFailure) -> Result<(), ScoringFault> {
    match &failure.fault {
        Some(cause) => Err(ScoringFault::new((*cause).into(), failure.message.clone())),
        None => Ok(()),
    }
}

/// The text a check of text reads: the final answer, or with `from:` a text of the world.
pub(crate) struct Answer<'a> {
    text: Option<Cow<'a, str>>,
    from: Option<&'a str>,
    episode: &'a Finished<'a>,
}

impl<'a> Answer<'a> {
    /// Reads the text: the final answer, or the world's text at `from` (one that cannot be
    /// read is the scorer's failing verdict).
    pub async fn read(from: Option<&'a str>, scene: &Scene<'a>) -> Result<Result<Self, CheckResult>, ScoringFault> {
        let episode = scene.episode;
        let text = match from {
            None => episode.ending.final_answer.as_deref().map(Cow::Borrowed),
            Some(path) => match scene.read_back(path, FILE_SCAN_CAP).await? {
                Ok(file) => Some(Cow::Owned(file.text)),
                Err(why) => return Ok(Err(verdict(false, why))),
            },
        };
        Ok(Ok(Answer { text, from, episode }))
    }

    /// The text, when there is one.
    pub fn text(&self) -> Option<&str> {
        self.text.as_deref()
    }

    /// The verdict on an episode without a final answer.
    pub fn missing(&self) -> CheckResult {
        verdict(false, format!("no final answer (the episode ended by {})", self.episode.ending.termination.as_str()))
    }

    /// The text as an explanation names it: the answer, quoted, or the world's path.
    /// The explanation is built on it: room is left for what follows.
    pub fn subject(&self, text: &str) -> String {
        let mut subject = String::with_capacity(text.len().min(QUOTED_CHARS * 2) + 64);
        match self.from {
            None => {
                subject.push_str("the answer ");
                push_quoted(&mut subject, text);
            }
            Some(path) => {
                let _ = write!(subject, "`{path}`");
            }
        }
        subject
    }
}

/// The characters of an answer an explanation shows.
const QUOTED_CHARS: usize = 200;

/// The answer as explanations show it: quoted, and cut when long.
pub(crate) fn quote(answer: &str) -> String {
    let mut quoted = String::new();
    push_quoted(&mut quoted, answer);
    quoted
}

fn push_quoted(out: &mut String, answer: &str) {
    match answer.char_indices().nth(QUOTED_CHARS) {
        None => {
            let _ = write!(out, "{answer:?}");
        }
        Some((cut, _)) => {
            let _ = write!(out, "{:?}…", &answer[..cut]);
        }
    }
}
