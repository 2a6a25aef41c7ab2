//! Reading a run's log back: tolerant of a torn last line (a crash mid-write) and of
//! fields and event types this version does not know.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::LazyLock;

use memchr::memmem::Finder;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::event::Event;

/// One line of the log, with the header fields every event has.
#[derive(Debug, Clone, Deserialize)]
pub struct LoggedEvent {
    pub v: u32,
    pub run_id: String,
    pub seq: u64,
    pub ts: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub episode_id: Option<String>,
    /// Every field, the header's included.
    #[serde(skip)]
    pub fields: Map<String, Value>,
}

/// The header of a line ([`LoggedEvent`]'s fields that a fold needs), decoded without the
/// rest of the line.
#[derive(Debug, Clone, Deserialize)]
pub struct LineHeader {
    pub seq: u64,
    pub ts: String,
    #[serde(default)]
    pub run_id: Option<String>,
    #[serde(default)]
    pub episode_id: Option<String>,
}

impl LineHeader {
    /// The header of `text`, read from the writer's layout when it has it (no escapes in
    /// its strings), else decoded from the whole line.
    pub fn of(text: &str) -> Result<LineHeader, serde_json::Error> {
        match header_of(text) {
            Some(head) => Ok(head),
            None => serde_json::from_str(text),
        }
    }
}

/// The header as the writer lays it out (`{"v":…,"run_id":"…","seq":…,"ts":"…"[,"episode_id":"…"],"type":`),
/// read without parsing the rest; `None` when the line is laid out otherwise.
fn header_of(text: &str) -> Option<LineHeader> {
    fn number(text: &str) -> Option<(u64, &str)> {
        let digits = text.bytes().take_while(u8::is_ascii_digit).count();
        Some((text[..digits].parse().ok()?, &text[digits..]))
    }
    /// A string without escapes, and what follows its closing quote.
    fn plain(text: &str) -> Option<(&str, &str)> {
        let end = text.find('"')?;
        let value = &text[..end];
        (!value.contains('\\')).then(|| (value, &text[end + 1..]))
    }
    let (_, rest) = number(text.strip_prefix("{\"v\":")?)?;
    let (run_id, rest) = plain(rest.strip_prefix(",\"run_id\":\"")?)?;
    let (seq, rest) = number(rest.strip_prefix(",\"seq\":")?)?;
    let (ts, rest) = plain(rest.strip_prefix(",\"ts\":\"")?)?;
    let (episode_id, rest) = match rest.strip_prefix(",\"episode_id\":\"") {
        Some(rest) => {
            let (id, rest) = plain(rest)?;
            (Some(id.to_owned()), rest)
        }
        None => (None, rest),
    };
    rest.starts_with(",\"type\":\"").then(|| LineHeader {
        seq,
        ts: ts.to_owned(),
        run_id: Some(run_id.to_owned()),
        episode_id,
    })
}

/// A line's header and its body: the event's own fields as a JSON object (`{"type":…}`),
/// which a writer can put under another header. Read from the writer's layout when the
/// line has it, else decoded and encoded again.
pub fn split_line(text: &str) -> Result<(LineHeader, std::borrow::Cow<'_, [u8]>), String> {
    if let Some(head) = header_of(text)
        && let Some(at) = TYPE_KEY.find(text.as_bytes())
    {
        // `,"type":"` — the body starts at its quote, after a brace of its own.
        let mut body = Vec::with_capacity(text.len() - at);
        body.push(b'{');
        body.extend_from_slice(&text.as_bytes()[at + 1..]);
        return Ok((head, std::borrow::Cow::Owned(body)));
    }
    let mut fields: Map<String, Value> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let head = LineHeader::deserialize(Value::Object(fields.clone())).map_err(|e| e.to_string())?;
    for key in ["v", "run_id", "seq", "ts", "episode_id"] {
        fields.remove(key);
    }
    Ok((head, std::borrow::Cow::Owned(serde_json::to_vec(&fields).map_err(|e| e.to_string())?)))
}

impl LoggedEvent {
    /// The event as this version knows it; `None` for a type it does not know.
    pub fn event(&self) -> Option<Event> {
        Event::deserialize(&self.fields).ok()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("failed to read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}:{line}: not a valid event: {message}")]
    Invalid { path: String, line: usize, message: String },
}

/// The events of a log, and whether its last line was torn.
#[derive(Debug, Default)]
pub struct Events {
    pub events: Vec<LoggedEvent>,
    pub torn_last_line: bool,
}

/// Reads every event of `path`, calling `each` on them in order, without holding them all.
/// Returns whether the last line was torn.
pub fn for_each_event(path: &Path, each: impl FnMut(LoggedEvent)) -> Result<bool, ReadError> {
    for_each_event_of(path, None, each)
}

/// Like [`for_each_event`], but only for events whose `type` is in `kinds`; the others are
/// skipped without being decoded (a complete line of another type is not checked).
pub fn for_each_event_of(
    path: &Path,
    kinds: Option<&[&str]>,
    mut each: impl FnMut(LoggedEvent),
) -> Result<bool, ReadError> {
    for_each_line_of(path, kinds, |_, text, _| {
        let fields: Map<String, Value> = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut event = LoggedEvent::deserialize(Value::Object(fields.clone())).map_err(|e| e.to_string())?;
        event.fields = fields;
        each(event);
        Ok(())
    })
}

/// The lines of a log whose `type` is in `kinds` (every line when `None`), as text with
/// their type and the byte offset where they start, for readers that decode only the
/// fields they need. An error returned by `each` stops the reading with that line's
/// number. A last line without its newline is torn (a crash mid-write, or a writer still
/// at work): it is not given to `each`. Returns whether the last line was torn.
pub fn for_each_line_of(
    path: &Path,
    kinds: Option<&[&str]>,
    mut each: impl FnMut(&str, &str, u64) -> Result<(), String>,
) -> Result<bool, ReadError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| ReadError::Io { path: shown.clone(), source })?;
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let mut buf = Vec::new();
    let mut line_no = 0;
    let mut next_offset = 0u64;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(|source| ReadError::Io { path: shown.clone(), source })?;
        if n == 0 {
            return Ok(false);
        }
        line_no += 1;
        let offset = next_offset;
        next_offset += n as u64;
        // A line is complete when its newline is written: the writer cuts a last line
        // without one before appending (`drop_torn_tail`), so a reader must not count it,
        // even when it happens to be whole JSON. It may even end inside a character.
        if !buf.ends_with(b"\n") {
            return Ok(!buf.iter().all(u8::is_ascii_whitespace));
        }
        let handled = std::str::from_utf8(&buf).map_err(|e| e.to_string()).and_then(|text| {
            let text = text.trim_end();
            if text.is_empty() {
                return Ok(());
            }
            match line_kind(text, kinds)? {
                Some(kind) => each(&kind, text, offset),
                None => Ok(()),
            }
        });
        if let Err(message) = handled {
            return Err(ReadError::Invalid { path: shown, line: line_no, message });
        }
    }
}

/// The line that starts at `offset` (as [`for_each_line_of`] gave it), without its newline.
pub fn line_at<'a>(file: &std::fs::File, offset: u64, buf: &'a mut Vec<u8>) -> std::io::Result<&'a str> {
    use std::os::unix::fs::FileExt as _;
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = file.read_at(&mut chunk, offset + buf.len() as u64)?;
        if n == 0 {
            break;
        }
        match chunk[..n].iter().position(|b| *b == b'\n') {
            Some(end) => {
                buf.extend_from_slice(&chunk[..end]);
                break;
            }
            None => buf.extend_from_slice(&chunk[..n]),
        }
    }
    std::str::from_utf8(buf).map_err(std::io::Error::other)
}

/// The number (from 1) of the line that starts at byte `offset`, for errors found after
/// the reading: the newlines before it, plus one. `0` when the file cannot be read.
pub fn line_number_at(path: &Path, offset: u64) -> usize {
    use std::io::Read as _;
    let Ok(file) = std::fs::File::open(path) else { return 0 };
    let mut reader = BufReader::with_capacity(256 * 1024, file.take(offset));
    let mut newlines = 0;
    loop {
        let chunk = match reader.fill_buf() {
            Ok([]) => return newlines + 1,
            Ok(chunk) => chunk,
            Err(_) => return 0,
        };
        newlines += chunk.iter().filter(|b| **b == b'\n').count();
        let n = chunk.len();
        reader.consume(n);
    }
}

/// Whether the bytes `needle` occur anywhere in the log, read without decoding a line: a
/// cheap test before a reading that matters only when some event holds them (the name of
/// an event type, quoted, is in every line of that type however it is laid out).
pub fn contains_bytes(path: &Path, needle: &[u8]) -> Result<bool, ReadError> {
    use std::io::Read as _;
    let shown = || path.display().to_string();
    let mut file = std::fs::File::open(path).map_err(|source| ReadError::Io { path: shown(), source })?;
    let finder = memchr::memmem::Finder::new(needle);
    let keep = needle.len().saturating_sub(1);
    let mut buf = vec![0u8; 256 * 1024 + keep];
    // The last `keep` bytes of each chunk are carried over: a needle across two chunks.
    let mut carried = 0;
    loop {
        let n = match file.read(&mut buf[carried..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(ReadError::Io { path: shown(), source }),
        };
        if n == 0 {
            return Ok(false);
        }
        let filled = carried + n;
        if finder.find(&buf[..filled]).is_some() {
            return Ok(true);
        }
        carried = keep.min(filled);
        buf.copy_within(filled - carried..filled, 0);
    }
}

/// Reads a whole log into memory.
pub fn read_events(path: &Path) -> Result<Events, ReadError> {
    let mut events = Vec::new();
    let torn_last_line = for_each_event(path, |e| events.push(e))?;
    Ok(Events { events, torn_last_line })
}

// The keys the header's fields are found by, each searcher built once: every line of a
// log is looked at through them when the tables are made.
static TYPE_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b",\"type\":\""));
static SEQ_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b",\"seq\":"));
static EPISODE_ID_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b",\"episode_id\":\""));

/// The `type` of a line as the writer lays it out (`{"v":…,"seq":…,"ts":"…"[,"episode_id":"…"],"type":"…"`),
/// found without parsing the rest; `None` when the line is laid out otherwise.
fn header_kind(text: &str) -> Option<&str> {
    let cut = (0..=text.len().min(256)).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    let head = &text[..cut];
    let start = TYPE_KEY.find(head.as_bytes())? + 9;
    let rest = &text[start..];
    let end = rest.find('"')?;
    let kind = &rest[..end];
    kind.bytes().all(|b| b.is_ascii_lowercase() || b == b'_').then_some(kind)
}

/// The `seq` of a line as the writer lays it out (`{"v":…,"run_id":…,"seq":N,…`), found
/// without parsing the rest; `None` when it is not there.
pub fn header_seq(text: &str) -> Option<u64> {
    let cut = (0..=text.len().min(256)).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    let start = SEQ_KEY.find(&text.as_bytes()[..cut])? + 7;
    let digits = text[start..].bytes().take_while(u8::is_ascii_digit).count();
    text[start..start + digits].parse().ok()
}

/// The `episode_id` of a line as the writer lays it out (in the header, before `type`),
/// found without parsing the rest; `None` when it has none there.
pub fn header_episode_id(text: &str) -> Option<&str> {
    let cut = (0..=text.len().min(256)).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    let head = &text[..cut];
    let start = EPISODE_ID_KEY.find(head.as_bytes())? + 15;
    let kind_at = TYPE_KEY.find(head.as_bytes())?;
    if start > kind_at {
        return None;
    }
    let rest = &text[start..];
    let end = rest.find('"')?;
    let id = &rest[..end];
    id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-').then_some(id)
}

/// Whether the last complete line of the log is `run_finished`: nothing (no regrade) was
/// appended after the run.
pub fn ends_with_run_finished(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else { return false };
    let Ok(len) = file.seek(SeekFrom::End(0)) else { return false };
    let from = len.saturating_sub(64 * 1024);
    let mut tail = Vec::new();
    if file.seek(SeekFrom::Start(from)).is_err() || file.read_to_end(&mut tail).is_err() {
        return false;
    }
    let text = String::from_utf8_lossy(&tail);
    let last = text.trim_end_matches('\n').rsplit('\n').next().unwrap_or("");
    text.ends_with('\n') && header_kind(last) == Some("run_finished")
}

/// The part of a line needed to decide whether to decode the rest.
#[derive(Deserialize)]
struct Kind<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
}

/// The type of a line when it is one of `kinds` (or `kinds` is `None`).
pub(crate) fn line_kind<'a>(
    text: &'a str,
    kinds: Option<&[&str]>,
) -> Result<Option<std::borrow::Cow<'a, str>>, String> {
    let kind = match header_kind(text) {
        Some(kind) => std::borrow::Cow::Borrowed(kind),
        None => serde_json::from_str::<Kind>(text).map_err(|e| e.to_string())?.kind,
    };
    Ok(kinds.is_none_or(|kinds| kinds.contains(&kind.as_ref())).then_some(kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_type_is_read_from_the_header_or_by_parsing() {
        let line =
            r#"{"v":1,"run_id":"r","seq":3,"ts":"t","episode_id":"ep_1","type":"model_call","x":{"type":"nope"}}"#;
        assert_eq!(header_kind(line), Some("model_call"));
        assert_eq!(header_episode_id(line), Some("ep_1"));
        assert_eq!(header_seq(line), Some(3));
        assert_eq!(
            header_episode_id(r#"{"v":1,"run_id":"r","seq":3,"ts":"t","type":"run_started","episode_id":"x"}"#),
            None
        );
        let long_id = format!(r#"{{"v":1,"run_id":"{}","seq":1,"ts":"t","type":"run_started"}}"#, "x".repeat(300));
        assert_eq!(header_kind(&long_id), None, "past the header window it falls back to parsing");
        let parsed = line_kind(&long_id, Some(&["run_started"])).unwrap().unwrap();
        assert_eq!(parsed, "run_started");
        assert!(line_kind(&long_id, Some(&["other"])).unwrap().is_none());
        // Regression: a multi-byte character across the header window must not panic.
        let wide = format!(r#"{{"v":1,"run_id":"{}","seq":1,"ts":"t","type":"run_started"}}"#, "é".repeat(200));
        assert_eq!(line_kind(&wide, Some(&["run_started"])).unwrap().unwrap(), "run_started");
    }

    #[test]
    fn bytes_are_found_across_the_reading_chunks_and_not_where_they_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.jsonl");
        let needle = b"\"memory_answered\"";
        for at in [0, 256 * 1024 - 5, 256 * 1024 + 3, 700_000] {
            let mut text = vec![b'x'; 800_000];
            text[at..at + needle.len()].copy_from_slice(needle);
            std::fs::write(&path, &text).unwrap();
            assert!(contains_bytes(&path, needle).unwrap(), "at {at}");
            text[at + 3] = b'y';
            std::fs::write(&path, &text).unwrap();
            assert!(!contains_bytes(&path, needle).unwrap(), "broken at {at}");
        }
    }

    #[test]
    fn a_header_read_from_the_layout_is_the_decoded_one() {
        let lines = [
            r#"{"v":1,"run_id":"r","seq":3,"ts":"2026-01-01T00:00:00Z","episode_id":"ep_1","type":"final","x":1}"#,
            r#"{"v":1,"run_id":"r","seq":4,"ts":"2026-01-01T00:00:00Z","type":"run_finished"}"#,
            r#"{"v":1,"run_id":"a \"quoted\" id","seq":5,"ts":"t","type":"run_finished"}"#,
            r#"{"type":"run_finished","v":1,"seq":6,"ts":"t","run_id":"r"}"#,
        ];
        for (i, line) in lines.iter().enumerate() {
            let decoded: LineHeader = serde_json::from_str(line).unwrap();
            let read = LineHeader::of(line).unwrap();
            let fields = |h: &LineHeader| (h.seq, h.ts.clone(), h.run_id.clone(), h.episode_id.clone());
            assert_eq!(fields(&read), fields(&decoded), "{line}");
            assert_eq!(header_of(line).is_some(), i < 2, "only the writer's plain layout is read directly: {line}");
        }
    }

    #[test]
    fn a_log_that_ends_with_run_finished_was_not_regraded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.jsonl");
        std::fs::write(&path, "{\"v\":1,\"run_id\":\"r\",\"seq\":1,\"ts\":\"t\",\"type\":\"run_finished\"}\n").unwrap();
        assert!(ends_with_run_finished(&path));
        std::fs::write(&path, "{\"v\":1,\"run_id\":\"r\",\"seq\":1,\"ts\":\"t\",\"type\":\"run_finished\"}\n{\"v\":1,\"run_id\":\"r\",\"seq\":2,\"ts\":\"t\",\"type\":\"scoring_finished\"}\n").unwrap();
        assert!(!ends_with_run_finished(&path));
    }
}
