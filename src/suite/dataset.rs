//! Tasks from a data file: `dataset: {path: data/qa.csv, columns: {input: question}}`.
//! CSV (with a header row) and JSONL, one task per row; unmapped columns become metadata.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::TaskFile;
use crate::config::decode::{ConfigError, Source};
use crate::config::yaml::Position;
use crate::domain::text::Text;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSpec {
    /// Relative to the suite file.
    pub path: String,
    /// `csv` or `jsonl`; by default taken from the file's extension.
    pub format: Option<Format>,
    #[serde(default)]
    pub columns: Columns,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Csv,
    Jsonl,
    /// LongMemEval's JSON list of questions, each with its haystack of sessions
    /// (`longmemeval.rs`).
    Longmemeval,
    /// LoCoMo's JSON list of samples, a conversation and its QA items each (`locomo.rs`).
    Locomo,
}

/// Which column holds each task field.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Columns {
    /// When absent (and no `id` column exists), tasks are named `row-N`.
    pub id: Option<String>,
    pub input: String,
    pub target: Option<String>,
}

impl Default for Columns {
    fn default() -> Self {
        Columns { id: None, input: "input".into(), target: None }
    }
}

/// A row as read: where it starts, and its columns.
pub(crate) type Record = (Position, Map<String, Value>);

pub(crate) struct DatasetRow {
    pub file: PathBuf,
    pub position: Position,
    /// How the suite's own errors refer to this row.
    pub origin: String,
    pub task: TaskFile,
}

/// Reads the rows; returns them with the file's bytes (for the suite's digest).
pub(crate) fn load(suite: &Source, spec: &DatasetSpec) -> Result<(Vec<DatasetRow>, Vec<u8>), ConfigError> {
    let dir = suite.file.parent().unwrap_or(std::path::Path::new("."));
    let path = dir.join(&spec.path);
    let bytes = std::fs::read(&path)
        .map_err(|e| suite.error("dataset.path", format!("failed to read {}: {e}", path.display())))?;
    let format = match spec.format {
        Some(f) => f,
        None => match path.extension().and_then(|e| e.to_str()) {
            Some("csv") => Format::Csv,
            Some("jsonl") | Some("ndjson") => Format::Jsonl,
            _ => {
                return Err(suite.error(
                    "dataset.path",
                    "cannot tell the format from the extension: add `format: csv` or `format: jsonl`",
                ));
            }
        },
    };
    let records = match format {
        Format::Csv => read_csv(&path, &bytes)?,
        Format::Jsonl => read_jsonl(&path, &bytes)?,
        Format::Longmemeval | Format::Locomo => {
            let tasks = match format {
                Format::Locomo => super::locomo::read(&path, &bytes)?,
                _ => super::longmemeval::read(&path, &bytes)?,
            };
            let rows = tasks.into_iter().enumerate().map(|(i, task)| DatasetRow {
                file: path.clone(),
                position: Position { line: 1, column: 1 },
                origin: format!("question [{i}]"),
                task,
            });
            return Ok((rows.collect(), bytes));
        }
    };
    let mut rows = Vec::with_capacity(records.len());
    for (n, (position, record)) in records.into_iter().enumerate() {
        let task = map_row(suite, spec, &path, position, n + 1, record)?;
        rows.push(DatasetRow { file: path.clone(), position, origin: format!("dataset row {}", n + 1), task });
    }
    Ok((rows, bytes))
}

fn map_row(
    suite: &Source,
    spec: &DatasetSpec,
    path: &std::path::Path,
    position: Position,
    row: usize,
    mut record: Map<String, Value>,
) -> Result<TaskFile, ConfigError> {
    let cols = &spec.columns;
    let mut take = |column: &str, field: &str, required: bool| -> Result<Option<Text>, ConfigError> {
        // An empty cell is a missing value, not an empty text every answer contains.
        let value = record.remove(column).filter(|v| !matches!(v, Value::String(s) if s.trim().is_empty()));
        match value {
            Some(Value::Null) | None if required => {
                if row == 1 {
                    Err(suite.error(
                        &format!("dataset.columns.{field}"),
                        format!("column `{column}` is not in {}", path.display()),
                    ))
                } else {
                    Err(ConfigError::at(path, position, format!("row {row} has no `{column}` (the task's {field})")))
                }
            }
            Some(Value::Null) | None => Ok(None),
            Some(Value::String(s)) => Ok(Some(Text(s))),
            Some(Value::Number(n)) => Ok(Some(Text(n.to_string()))),
            Some(Value::Bool(b)) => Ok(Some(Text(b.to_string()))),
            Some(_) => Err(ConfigError::at(
                path,
                position,
                format!("row {row}: `{column}` must be text, not a list or object"),
            )),
        }
    };
    let input = take(&cols.input, "input", true)?.unwrap_or_default();
    let target = match &cols.target {
        Some(c) => take(c, "target", true)?,
        None => take("target", "target", false)?,
    };
    let id = match &cols.id {
        Some(c) => take(c, "id", true)?,
        None => take("id", "id", false)?,
    };
    let id = id.unwrap_or_else(|| Text(format!("row-{row}")));
    Ok(TaskFile { id, input, target, metadata: record, ..TaskFile::default() })
}

pub(crate) fn read_csv(path: &std::path::Path, bytes: &[u8]) -> Result<Vec<Record>, ConfigError> {
    let mut reader = csv::ReaderBuilder::new().has_headers(true).from_reader(bytes);
    let headers = reader
        .headers()
        .map_err(|e| ConfigError::at(path, Position { line: 1, column: 1 }, format!("invalid CSV header: {e}")))?
        .clone();
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| {
            let line = e.position().map(|p| p.line() as usize).unwrap_or(0);
            ConfigError::at(path, Position { line, column: 1 }, format!("invalid CSV row: {e}"))
        })?;
        let line = record.position().map(|p| p.line() as usize).unwrap_or(0);
        let map = headers.iter().zip(record.iter()).map(|(h, v)| (h.to_owned(), Value::String(v.to_owned()))).collect();
        rows.push((Position { line, column: 1 }, map));
    }
    Ok(rows)
}

pub(crate) fn read_jsonl(path: &std::path::Path, bytes: &[u8]) -> Result<Vec<Record>, ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::whole(path, format!("not UTF-8: {e}")))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = Position { line: i + 1, column: 1 };
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(map)) => rows.push((at, map)),
            Ok(_) => return Err(ConfigError::at(path, at, "each line must be a JSON object")),
            Err(e) => {
                return Err(ConfigError::at(
                    path,
                    Position { line: i + 1, column: e.column() },
                    format!("invalid JSON: {e}"),
                ));
            }
        }
    }
    Ok(rows)
}
