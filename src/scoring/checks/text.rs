//! `includes`, `equals`, `regex` and their `not_` forms: the answer (or a text of the world,
//! with `from:`) against a text, a template of the task.

use super::{Answer, Scene, Verdict, verdict};
use crate::domain::scorer::TextOp;

/// The answer contains, equals or matches `expected` (or, negated, does not).
pub(crate) fn check(
    scene: &Scene<'_>,
    answer: &Answer<'_>,
    op: TextOp,
    expected: &str,
    negate: bool,
    ignore_case: bool,
) -> Verdict {
    let expected = match scene.render(expected) {
        Ok(e) => e,
        Err(failed) => return failed,
    };
    let Some(text) = answer.text() else { return answer.missing() };
    match matches(op, text, &expected, ignore_case) {
        Ok(found) => {
            let what = match (op, found) {
                (TextOp::Includes, true) => format!("contains {expected:?}"),
                (TextOp::Includes, false) => format!("does not contain {expected:?}"),
                (TextOp::Equals, true) => format!("equals {expected:?}"),
                (TextOp::Equals, false) => format!("does not equal {expected:?}"),
                (TextOp::Regex, true) => format!("matches /{expected}/"),
                (TextOp::Regex, false) => format!("does not match /{expected}/"),
            };
            verdict(found != negate, format!("{} {what}", answer.subject(text)))
        }
        Err(e) => verdict(false, e),
    }
}

/// Whether `haystack` contains, equals (trimmed) or matches `expected`; an invalid regex
/// says so.
pub(crate) fn matches(op: TextOp, haystack: &str, expected: &str, ignore_case: bool) -> Result<bool, String> {
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
