//! Reading a run's log back: tolerant of a torn last line (a crash mid-write) and of
//! fields and event types this version does not know.

use std::io::{BufRead, BufReader};
use std::path::Path;

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
/// checked for well-formedness and skipped without being decoded.
pub fn for_each_event_of(
    path: &Path,
    kinds: Option<&[&str]>,
    mut each: impl FnMut(LoggedEvent),
) -> Result<bool, ReadError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| ReadError::Io { path: shown.clone(), source })?;
    let mut reader = BufReader::new(file);
    let mut buf = Vec::new();
    let mut line_no = 0;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(|source| ReadError::Io { path: shown.clone(), source })?;
        if n == 0 {
            return Ok(false);
        }
        line_no += 1;
        // Only the last line can be torn, and a torn line has no newline yet; it may even
        // end inside a multi-byte character.
        let complete = buf.ends_with(b"\n");
        let parsed = std::str::from_utf8(&buf).map_err(|e| e.to_string()).and_then(|text| {
            let text = text.trim_end();
            if text.is_empty() { Ok(None) } else { parse_line(text, kinds) }
        });
        match parsed {
            Ok(Some(event)) => each(event),
            Ok(None) => {}
            Err(_) if !complete => return Ok(true),
            Err(message) => return Err(ReadError::Invalid { path: shown, line: line_no, message }),
        }
    }
}

/// Reads a whole log into memory.
pub fn read_events(path: &Path) -> Result<Events, ReadError> {
    let mut events = Vec::new();
    let torn_last_line = for_each_event(path, |e| events.push(e))?;
    Ok(Events { events, torn_last_line })
}

/// The part of a line needed to decide whether to decode the rest.
#[derive(Deserialize)]
struct Kind<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
}

fn parse_line(text: &str, kinds: Option<&[&str]>) -> Result<Option<LoggedEvent>, String> {
    if let Some(kinds) = kinds {
        let head: Kind = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if !kinds.contains(&head.kind.as_ref()) {
            return Ok(None);
        }
    }
    let fields: Map<String, Value> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut event = LoggedEvent::deserialize(Value::Object(fields.clone())).map_err(|e| e.to_string())?;
    event.fields = fields;
    Ok(Some(event))
}
