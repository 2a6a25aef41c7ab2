//! `numeric`: the first number in the answer against a number, within a tolerance.

use super::{Answer, CheckResult, Scene, quote, verdict};

/// The answer's first number is within `tolerance` of `expected` (a template).
pub(crate) fn check(scene: &Scene<'_>, answer: &Answer<'_>, expected: &str, tolerance: f64) -> CheckResult {
    let Some(text) = answer.text() else { return answer.missing() };
    let expected = scene.render(expected).ok().and_then(|e| e.trim().replace(',', "").parse::<f64>().ok());
    let Some(expected) = expected else {
        return verdict(false, "the expected value is not a number".into());
    };
    match first_number(text) {
        Some(got) if (got - expected).abs() <= tolerance => {
            verdict(true, format!("{got} is within {tolerance} of {expected}"))
        }
        Some(got) => verdict(false, format!("{got} is not within {tolerance} of {expected}")),
        None => verdict(false, format!("the answer {} holds no number", quote(text))),
    }
}

/// The first number in a text: `-3`, `1,234.5`, `42`.
fn first_number(text: &str) -> Option<f64> {
    static NUMBER: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    let re = NUMBER.get_or_init(|| regex::Regex::new(r"-?\d[\d,]*(\.\d+)?([eE][-+]?\d+)?").ok()).as_ref()?;
    re.find(text).and_then(|m| m.as_str().replace(',', "").parse().ok())
}
