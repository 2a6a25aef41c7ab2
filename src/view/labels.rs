//! The labels people set in the page: a verdict (pass or fail), a score and a comment on an
//! episode as a whole or on one graded scorer's verdict, appended to the run's
//! `labels.jsonl` (one line each, with who and when) in the format `runner judge-check`
//! reads. A later label of the same person on the same thing supersedes the earlier one in
//! the page; the file keeps both.

use std::io::Write as _;
use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::report::judge_check::{EPISODE_LABEL, LABELS_FILE, read_labels};

/// A label as the page sends it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewLabel {
    pub episode_id: String,
    /// The graded scorer the label is about; absent for the episode as a whole.
    #[serde(default)]
    pub scorer: Option<String>,
    /// `pass` or `fail`.
    pub verdict: String,
    #[serde(default)]
    pub score: Option<f64>,
    #[serde(default)]
    pub comment: Option<String>,
    pub rater: String,
}

/// The label's line, checked: each mistake names its field.
pub fn line(label: &NewLabel, now: &str) -> Result<Value, String> {
    let verdict = match label.verdict.trim().to_ascii_lowercase().as_str() {
        "pass" => "pass",
        "fail" => "fail",
        other => return Err(format!("field `verdict`: {other:?} is not a verdict: pass or fail")),
    };
    if let Some(score) = label.score
        && !(0.0..=1.0).contains(&score)
    {
        return Err(format!("field `score`: {score} is not from 0 to 1"));
    }
    let rater = label.rater.trim();
    if rater.is_empty() {
        return Err("field `rater`: missing (who set the label)".into());
    }
    let scorer = label.scorer.as_deref().map(str::trim).filter(|s| !s.is_empty()).unwrap_or(EPISODE_LABEL);
    let mut line = json!({
        "episode_id": label.episode_id,
        "scorer": scorer,
        "verdict": verdict,
        "rater": rater,
        "ts": now,
    });
    if let Some(score) = label.score {
        line["score"] = json!(score);
    }
    if let Some(comment) = label.comment.as_deref().map(str::trim).filter(|c| !c.is_empty()) {
        line["explanation"] = json!(comment);
    }
    Ok(line)
}

/// Appends `line` to the run's labels file as one write, so that a reader sees whole lines.
pub fn append(dir: &Path, line: &Value) -> Result<(), String> {
    let path = dir.join(LABELS_FILE);
    let mut text = line.to_string();
    text.push('\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("failed to write {}: {e}", path.display()))
}

/// The run's labels as written, in order; none when it has no labels file. A file that
/// `judge-check` could not read is an error naming its line and field.
pub fn read(dir: &Path) -> Result<Vec<Value>, String> {
    let path = dir.join(LABELS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("failed to read {}: {e}", path.display())),
    };
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    read_labels(&path)?;
    Ok(text.lines().filter(|l| !l.trim().is_empty()).filter_map(|l| serde_json::from_str(l).ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(verdict: &str, scorer: Option<&str>) -> NewLabel {
        NewLabel {
            episode_id: "e1".into(),
            scorer: scorer.map(String::from),
            verdict: verdict.into(),
            score: Some(0.5),
            comment: Some("  close, but no  ".into()),
            rater: "ana".into(),
        }
    }

    #[test]
    fn a_label_written_is_one_judge_check_reads() {
        let dir = tempfile::tempdir().unwrap();
        append(dir.path(), &line(&new("Fail", Some("llm_rubric")), "2026-01-01T00:00:00Z").unwrap()).unwrap();
        append(dir.path(), &line(&new("pass", None), "2026-01-01T00:00:01Z").unwrap()).unwrap();
        let labels = read_labels(&dir.path().join(LABELS_FILE)).unwrap();
        assert_eq!(labels.len(), 2);
        assert!(!labels[0].passed);
        assert_eq!(labels[0].scorer, "llm_rubric");
        assert_eq!(labels[0].explanation.as_deref(), Some("close, but no"));
        assert_eq!(labels[1].scorer, EPISODE_LABEL);
        assert_eq!(read(dir.path()).unwrap()[1]["ts"], "2026-01-01T00:00:01Z");
    }

    #[test]
    fn a_bad_label_names_its_field() {
        assert!(line(&new("maybe", None), "t").unwrap_err().contains("`verdict`"));
        let mut far = new("pass", None);
        far.score = Some(3.0);
        assert!(line(&far, "t").unwrap_err().contains("`score`"));
        let mut nobody = new("pass", None);
        nobody.rater = " ".into();
        assert!(line(&nobody, "t").unwrap_err().contains("`rater`"));
    }
}
