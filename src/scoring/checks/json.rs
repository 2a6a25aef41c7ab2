//! `json`: the answer is valid JSON, matches a schema, or holds a value at a path.

use serde_json::Value;

use super::{Answer, CheckResult, verdict};
use crate::domain::scorer::JsonCheck;

/// The answer (bare, or in a fenced block) against `check`.
pub(crate) fn check(answer: &Answer<'_>, check: &JsonCheck) -> CheckResult {
    let Some(text) = answer.text() else { return answer.missing() };
    let trimmed = text.trim();
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
