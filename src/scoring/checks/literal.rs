//! Checks of the answer exactly as the model gave it, nothing trimmed: `equals` with
//! `exact: true`, `starts_with`, `contains_any`/`contains_all`, `levenshtein`, `is_json` and
//! `contains_json`. Their semantics are promptfoo's assertions of the same names, so that a
//! promptfoo config read by `runner` gives the verdicts promptfoo gives.

use serde_json::Value;

use super::{Answer, CheckResult, Scene, verdict};
use crate::domain::scorer::Literal;

pub(crate) fn check(scene: &Scene<'_>, answer: &Answer<'_>, literal: &Literal) -> CheckResult {
    let Some(text) = answer.text() else { return answer.missing() };
    let subject = answer.subject(text);
    let rendered = |t: &str| scene.render(t);
    match literal {
        Literal::Equals { expected, negate } => {
            let expected = match rendered(expected) {
                Ok(e) => e,
                Err(failed) => return failed,
            };
            let found = text == expected;
            let what = if found { "equals" } else { "does not equal" };
            verdict(found != *negate, format!("{subject} {what} {expected:?}"))
        }
        Literal::StartsWith { expected, negate } => {
            let expected = match rendered(expected) {
                Ok(e) => e,
                Err(failed) => return failed,
            };
            let found = text.starts_with(&expected);
            let what = if found { "starts with" } else { "does not start with" };
            verdict(found != *negate, format!("{subject} {what} {expected:?}"))
        }
        Literal::Contains { values, all, negate, ignore_case } => {
            let mut expected = Vec::with_capacity(values.len());
            for v in values {
                match rendered(v) {
                    Ok(e) => expected.push(e),
                    Err(failed) => return failed,
                }
            }
            let fold = |s: &str| if *ignore_case { s.to_lowercase() } else { s.to_owned() };
            let haystack = fold(text);
            let missing: Vec<&String> = expected.iter().filter(|v| !haystack.contains(&fold(v))).collect();
            let found = if *all { missing.is_empty() } else { missing.len() < expected.len() };
            let what = match (*all, found) {
                (true, true) => format!("contains all of {expected:?}"),
                (true, false) => format!("lacks {missing:?} of {expected:?}"),
                (false, true) => format!("contains one of {expected:?}"),
                (false, false) => format!("contains none of {expected:?}"),
            };
            verdict(found != *negate, format!("{subject} {what}"))
        }
        Literal::Levenshtein { expected, max_distance } => {
            let expected = match rendered(expected) {
                Ok(e) => e,
                Err(failed) => return failed,
            };
            let distance = levenshtein(text, &expected);
            let within = distance as f64 <= *max_distance;
            let what = if within { "within" } else { "over" };
            verdict(within, format!("{subject} is {distance} edits from {expected:?}, {what} {max_distance}"))
        }
        Literal::Json { schema, anywhere, negate } => {
            let candidates =
                if *anywhere { json_objects(text) } else { serde_json::from_str(text).into_iter().collect() };
            let validator = match schema.as_ref().map(jsonschema::validator_for).transpose() {
                Ok(v) => v,
                Err(e) => return verdict(false, format!("the scorer's schema is invalid: {e}")),
            };
            let found = candidates.iter().any(|c| validator.as_ref().is_none_or(|v| v.is_valid(c)));
            let what = match (*anywhere, schema.is_some(), found) {
                (false, false, true) => "is valid JSON",
                (false, false, false) => "is not valid JSON",
                (false, true, true) => "is JSON that matches the schema",
                (false, true, false) => "is not JSON that matches the schema",
                (true, false, true) => "contains a JSON object",
                (true, false, false) => "contains no JSON object",
                (true, true, true) => "contains a JSON object that matches the schema",
                (true, true, false) => "contains no JSON object that matches the schema",
            };
            verdict(found != *negate, format!("{subject} {what}"))
        }
    }
}

/// The edit distance in UTF-16 code units, as JavaScript counts a string's length.
pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
    let (a, b): (Vec<u16>, Vec<u16>) = (a.encode_utf16().collect(), b.encode_utf16().collect());
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, x) in a.iter().enumerate() {
        current[0] = i + 1;
        for (j, y) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(x != y);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// The JSON objects in a text: from each `{`, the object that starts there when one does;
/// the search goes on after it (objects inside one found are not counted again).
pub(crate) fn json_objects(text: &str) -> Vec<Value> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = text[at..].find('{') {
        let start = at + offset;
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        match stream.next() {
            Some(Ok(value @ Value::Object(_))) => {
                at = start + stream.byte_offset();
                found.push(value);
            }
            _ => at = start + 1,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("same", "same"), 0);
        // JavaScript counts an astral character as two units.
        assert_eq!(levenshtein("a😀", "a"), 2);
    }

    #[test]
    fn objects_are_found_anywhere_and_broken_ones_skipped() {
        let text = r#"Here: {"a": 1} and {broken and {"b": {"c": 2}} end"#;
        let found = json_objects(text);
        assert_eq!(found, vec![serde_json::json!({"a": 1}), serde_json::json!({"b": {"c": 2}})]);
        assert!(json_objects("[1, 2] no object").is_empty());
    }
}
