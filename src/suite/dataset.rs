//! Tasks from a data file: `dataset: {path: data/qa.csv, columns: {input: question}}`.
//! CSV (with a header row) and JSONL, one task per row; unmapped columns become metadata.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

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

pub(crate) struct DatasetRow {
    pub file: PathBuf,
    pub position: Position,
    /// How the suite's own errors refer to this row.
    pub origin: String,
    pub task: TaskFile,
}

/// Reads the rows one at a time, handing each to `each` as it is read, so that a suite
/// that checks its rows without keeping them (`validate`) holds one row at a time. The
/// file's bytes go through `digest` on the way, the same bytes a whole read would give.
pub(crate) fn read(
    suite: &Source,
    spec: &DatasetSpec,
    digest: &mut Sha256,
    mut each: impl FnMut(DatasetRow) -> Result<(), ConfigError>,
) -> Result<(), ConfigError> {
    let dir = suite.file.parent().unwrap_or(std::path::Path::new("."));
    let path = dir.join(&spec.path);
    let failed = |e: std::io::Error| suite.error("dataset.path", format!("failed to read {}: {e}", path.display()));
    let file = std::fs::File::open(&path).map_err(failed)?;
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
    let reader = Digesting { inner: BufReader::with_capacity(64 * 1024, file), digest };
    let mut row = 0;
    let mut mapped = |position: Position, record: Map<String, Value>| {
        row += 1;
        let task = map_row(suite, spec, &path, position, row, record)?;
        each(DatasetRow { file: path.clone(), position, origin: format!("dataset row {row}"), task })
    };
    match format {
        Format::Csv => read_csv(&path, reader, &mut mapped),
        Format::Jsonl => read_jsonl(&path, reader, &mut mapped),
        Format::Longmemeval | Format::Locomo => {
            // A JSON list, read whole: its questions share what they are asked about.
            let mut bytes = Vec::new();
            let mut reader = reader;
            reader.read_to_end(&mut bytes).map_err(failed)?;
            let tasks = match format {
                Format::Locomo => super::locomo::read(&path, &bytes)?,
                _ => super::longmemeval::read(&path, &bytes)?,
            };
            drop(bytes);
            for (i, task) in tasks.into_iter().enumerate() {
                let position = Position { line: 1, column: 1 };
                each(DatasetRow { file: path.clone(), position, origin: format!("question [{i}]"), task })?;
            }
            Ok(())
        }
    }
}

/// A reader that passes every byte it reads through a digest.
struct Digesting<'d, R> {
    inner: R,
    digest: &'d mut Sha256,
}

impl<R: Read> Read for Digesting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.digest.update(&buf[..n]);
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Digesting<'_, R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        // What is consumed is digested once, whichever way it was read.
        if let Ok(buf) = self.inner.fill_buf() {
            self.digest.update(&buf[..amount.min(buf.len())]);
        }
        self.inner.consume(amount);
    }
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

/// Each row of a CSV file with a header row, as a map of its columns, with its line.
pub(crate) fn read_csv(
    path: &std::path::Path,
    bytes: impl Read,
    each: &mut impl FnMut(Position, Map<String, Value>) -> Result<(), ConfigError>,
) -> Result<(), ConfigError> {
    let mut reader = csv::ReaderBuilder::new().has_headers(true).from_reader(bytes);
    let headers = reader
        .headers()
        .map_err(|e| ConfigError::at(path, Position { line: 1, column: 1 }, format!("invalid CSV header: {e}")))?
        .clone();
    let mut record = csv::StringRecord::new();
    loop {
        match reader.read_record(&mut record) {
            Ok(false) => return Ok(()),
            Ok(true) => {}
            Err(e) => {
                let line = e.position().map(|p| p.line() as usize).unwrap_or(0);
                return Err(ConfigError::at(path, Position { line, column: 1 }, format!("invalid CSV row: {e}")));
            }
        }
        let line = record.position().map(|p| p.line() as usize).unwrap_or(0);
        let map = headers.iter().zip(record.iter()).map(|(h, v)| (h.to_owned(), Value::String(v.to_owned()))).collect();
        each(Position { line, column: 1 }, map)?;
    }
}

/// Each line of a JSONL file that is not blank, as the object it holds, with its line.
pub(crate) fn read_jsonl(
    path: &std::path::Path,
    mut bytes: impl BufRead,
    each: &mut impl FnMut(Position, Map<String, Value>) -> Result<(), ConfigError>,
) -> Result<(), ConfigError> {
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        let read = bytes
            .read_until(b'\n', &mut line)
            .map_err(|e| ConfigError::at(path, Position { line: number, column: 1 }, format!("failed to read: {e}")))?;
        if read == 0 {
            break;
        }
        let at = Position { line: number, column: 1 };
        let text = std::str::from_utf8(&line).map_err(|e| ConfigError::at(path, at, format!("not UTF-8: {e}")))?;
        let text = text.strip_suffix('\n').map_or(text, |t| t.strip_suffix('\r').unwrap_or(t));
        if text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => each(at, map)?,
            Ok(_) => return Err(ConfigError::at(path, at, "each line must be a JSON object")),
            Err(e) => {
                return Err(ConfigError::at(
                    path,
                    Position { line: number, column: e.column() },
                    format!("invalid JSON: {e}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of JSONL made as they are read, `bad` (counted from 1) not JSON: a file of a
    /// million rows that is never held whole, not even by the test.
    struct Rows {
        next: usize,
        total: usize,
        bad: usize,
        line: Vec<u8>,
        at: usize,
    }

    impl Read for Rows {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.at == self.line.len() {
                if self.next == self.total {
                    return Ok(0);
                }
                self.next += 1;
                self.line = if self.next == self.bad {
                    b"{\"id\": \"r\", \"input\": oops}\n".to_vec()
                } else {
                    format!("{{\"id\": \"r{}\", \"input\": \"q\"}}\n", self.next).into_bytes()
                };
                self.at = 0;
            }
            let n = buf.len().min(self.line.len() - self.at);
            buf[..n].copy_from_slice(&self.line[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    #[test]
    fn a_bad_row_deep_in_a_streamed_file_is_reported_with_its_line() {
        let rows = Rows { next: 0, total: 1_000_000, bad: 900_000, line: Vec::new(), at: 0 };
        let mut seen = 0;
        let error = read_jsonl(std::path::Path::new("big.jsonl"), BufReader::new(rows), &mut |_, _| {
            seen += 1;
            Ok(())
        })
        .err()
        .unwrap_or_else(|| panic!("row 900,000 is not JSON"));
        assert_eq!(seen, 899_999, "every row before the bad one was handed out");
        assert_eq!(error.position.map(|p| p.line), Some(900_000), "{error}");
        assert!(error.to_string().starts_with("big.jsonl:900000:"), "{error}");
    }

    #[test]
    fn a_streamed_file_is_digested_byte_for_byte_whichever_way_it_is_read() {
        let text = "id,input\r\na,\"two\nlines\"\nb,c\n";
        for (i, by_lines) in [false, true].into_iter().enumerate() {
            let mut digest = Sha256::new();
            let mut reader = Digesting { inner: BufReader::with_capacity(3 + i, text.as_bytes()), digest: &mut digest };
            let mut read = Vec::new();
            if by_lines {
                while reader.read_until(b'\n', &mut read).map_or(0, |n| n) > 0 {}
            } else {
                reader.read_to_end(&mut read).unwrap_or_else(|e| panic!("{e}"));
            }
            assert_eq!(read, text.as_bytes());
            assert_eq!(digest.finalize()[..], Sha256::digest(text.as_bytes())[..], "read by lines: {by_lines}");
        }
    }
}
