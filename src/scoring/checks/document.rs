//! `document`: a Markdown text of the final world has the sections asked for and keeps
//! its word counts.

use super::{CheckResult, FILE_SCAN_CAP, Scene, verdict};
use crate::domain::document::Document;
use crate::scoring::ScoringFault;

/// The text at `path` has `sections` and keeps the word counts; every miss is named.
pub(crate) async fn check(
    scene: &Scene<'_>,
    path: &str,
    sections: &[String],
    min_words: Option<usize>,
    max_words: Option<usize>,
    max_section_words: Option<usize>,
) -> Result<CheckResult, ScoringFault> {
    Ok(match scene.read_back(path, FILE_SCAN_CAP).await? {
        Ok(file) => judge(path, &file.text, sections, min_words, max_words, max_section_words),
        Err(why) => verdict(false, why),
    })
}

/// A Markdown text's sections and word counts against what the scorer asks.
fn judge(
    path: &str,
    text: &str,
    sections: &[String],
    min_words: Option<usize>,
    max_words: Option<usize>,
    max_section_words: Option<usize>,
) -> CheckResult {
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
