//! YAML text to a JSON value, remembering where every key and item came from, so that
//! errors found later (a wrong type, an unknown tool) can name the line and column.

use std::collections::HashMap;

use serde_json::{Map, Number, Value};
use yaml_rust2::Yaml;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A line and column, both counted from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

impl Position {
    fn of(mark: Marker) -> Self {
        Position { line: mark.line(), column: mark.col() + 1 }
    }
}

/// Where each path (`tasks[2].scorers[0]`) starts in the source.
#[derive(Debug, Default, Clone)]
pub struct Locations {
    by_path: HashMap<String, Position>,
}

impl Locations {
    /// The position of `path`, or of its nearest recorded ancestor.
    pub fn find(&self, path: &str) -> Position {
        let mut path = path;
        loop {
            if let Some(pos) = self.by_path.get(path) {
                return *pos;
            }
            match path.rfind(['.', '[']) {
                Some(cut) => path = &path[..cut],
                None => {
                    return self.by_path.get("").copied().unwrap_or(Position { line: 1, column: 1 });
                }
            }
        }
    }
}

/// Joins a path and a key the way [`Locations`] spells paths.
pub fn child(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") }
}

pub fn item(path: &str, index: usize) -> String {
    format!("{path}[{index}]")
}

#[derive(Debug)]
pub struct YamlError {
    pub position: Position,
    pub message: String,
}

/// Parses one YAML document.
pub fn parse(text: &str) -> Result<(Value, Locations), YamlError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser
        .load(&mut builder, false)
        .map_err(|e| YamlError { position: Position::of(*e.marker()), message: e.info().to_owned() })?;
    if let Some(error) = builder.error {
        return Err(error);
    }
    let value = builder.root.unwrap_or(Value::Null);
    Ok((value, builder.locations))
}

enum Frame {
    Seq {
        items: Vec<Value>,
        anchor: usize,
        path: String,
    },
    Map {
        entries: Map<String, Value>,
        key: Option<String>,
        anchor: usize,
        path: String,
        /// Whether the mapping's own start event placed its position (not a parent's key).
        placed: bool,
    },
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    root: Option<Value>,
    anchors: HashMap<usize, Value>,
    locations: Locations,
    error: Option<YamlError>,
}

impl Builder {
    /// The path of the value about to start, and whether it is a map key.
    fn next_path(&self) -> (String, bool) {
        match self.stack.last() {
            None => (String::new(), false),
            Some(Frame::Seq { items, path, .. }) => (item(path, items.len()), false),
            Some(Frame::Map { key: None, path, .. }) => (path.clone(), true),
            Some(Frame::Map { key: Some(key), path, .. }) => (child(path, key), false),
        }
    }

    fn fail(&mut self, mark: Marker, message: String) {
        if self.error.is_none() {
            self.error = Some(YamlError { position: Position::of(mark), message });
        }
    }

    fn push_value(&mut self, value: Value, anchor: usize, mark: Marker) {
        if anchor > 0 {
            self.anchors.insert(anchor, value.clone());
        }
        match self.stack.last_mut() {
            None => self.root = Some(value),
            Some(Frame::Seq { items, .. }) => items.push(value),
            Some(Frame::Map { entries, key, path, placed, .. }) => match key.take() {
                Some(k) => {
                    entries.insert(k, value);
                }
                None => {
                    let name = match value {
                        Value::String(s) => s,
                        Value::Number(n) => n.to_string(),
                        Value::Bool(b) => b.to_string(),
                        _ => {
                            self.fail(mark, "a mapping key must be a plain scalar".into());
                            return;
                        }
                    };
                    if entries.contains_key(&name) {
                        let message = format!("duplicate key `{name}`");
                        self.fail(mark, message);
                        return;
                    }
                    // A block mapping's start event is marked after its first key; the
                    // first key is where a reader sees the mapping begin.
                    if entries.is_empty() && *placed {
                        self.locations.by_path.insert(path.clone(), Position::of(mark));
                    }
                    let entry_path = child(path, &name);
                    self.locations.by_path.insert(entry_path, Position::of(mark));
                    *key = Some(name);
                }
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        match event {
            Event::Scalar(text, style, anchor, _tag) => {
                let (path, is_key) = self.next_path();
                if !is_key {
                    self.locations.by_path.entry(path).or_insert(Position::of(mark));
                }
                let value = if style == TScalarStyle::Plain { plain_scalar(text) } else { Value::String(text) };
                self.push_value(value, anchor, mark);
            }
            Event::SequenceStart(anchor, _) => {
                let (path, _) = self.next_path();
                self.locations.by_path.entry(path.clone()).or_insert(Position::of(mark));
                self.stack.push(Frame::Seq { items: Vec::new(), anchor, path });
            }
            Event::MappingStart(anchor, _) => {
                let (path, is_key) = self.next_path();
                if is_key {
                    self.fail(mark, "a mapping key must be a plain scalar".into());
                }
                let placed = !self.locations.by_path.contains_key(&path);
                self.locations.by_path.entry(path.clone()).or_insert(Position::of(mark));
                self.stack.push(Frame::Map { entries: Map::new(), key: None, anchor, path, placed });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (value, anchor) = match self.stack.pop() {
                    Some(Frame::Seq { items, anchor, .. }) => (Value::Array(items), anchor),
                    Some(Frame::Map { entries, anchor, .. }) => (Value::Object(entries), anchor),
                    None => return,
                };
                self.push_value(value, anchor, mark);
            }
            Event::Alias(anchor) => match self.anchors.get(&anchor).cloned() {
                Some(value) => {
                    let (path, is_key) = self.next_path();
                    if !is_key {
                        self.locations.by_path.entry(path).or_insert(Position::of(mark));
                    }
                    self.push_value(value, 0, mark);
                }
                None => self.fail(mark, "an alias refers to an unknown anchor".into()),
            },
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentStart | Event::DocumentEnd => {}
        }
    }
}

/// Resolves an unquoted scalar the YAML 1.2 core schema way, except that a number whose
/// text would change (`1.50`, `0x10`, `007`, `1e3`) stays text: `target: 1.50` means "1.50".
fn plain_scalar(text: String) -> Value {
    let number = match Yaml::from_str(&text) {
        Yaml::Null => return Value::Null,
        Yaml::Boolean(b) => return Value::Bool(b),
        Yaml::Integer(i) => Some(Number::from(i)),
        Yaml::Real(r) => r.parse::<f64>().ok().and_then(Number::from_f64),
        _ => None,
    };
    match number {
        Some(n) if n.to_string() == text => Value::Number(n),
        _ => Value::String(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn converts_scalars_and_collections() {
        let (v, _) = parse("a: 1\nb: '1'\nc: [true, null, 2.5]\nd: {e: x}\n").unwrap();
        assert_eq!(v, json!({"a": 1, "b": "1", "c": [true, null, 2.5], "d": {"e": "x"}}));
    }

    #[test]
    fn remembers_positions_of_keys_and_items() {
        let text = "suite: s\ntasks:\n  - id: one\n    input: hi\n  - id: two\n";
        let (_, locs) = parse(text).unwrap();
        assert_eq!(locs.find("tasks[0].input"), Position { line: 4, column: 5 });
        assert_eq!(locs.find("tasks[1]"), Position { line: 5, column: 5 });
        // Unknown paths fall back to the nearest ancestor.
        assert_eq!(locs.find("tasks[1].missing"), Position { line: 5, column: 5 });
    }

    #[test]
    fn numbers_whose_text_would_change_stay_text() {
        let (v, _) = parse("a: 1.50\nb: 0x10\nc: 007\nd: 1.5\ne: 42\nf: -3\ng: 0.25\n").unwrap();
        assert_eq!(v, json!({"a": "1.50", "b": "0x10", "c": "007", "d": 1.5, "e": 42, "f": -3, "g": 0.25}));
    }

    #[test]
    fn resolves_aliases() {
        let (v, _) = parse("base: &b {x: 1}\nother: *b\n").unwrap();
        assert_eq!(v["other"], json!({"x": 1}));
    }

    #[test]
    fn rejects_duplicate_keys_with_position() {
        let err = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(err.position.line, 3);
        assert!(err.message.contains("duplicate key `a`"), "{}", err.message);
    }

    #[test]
    fn reports_syntax_errors_with_position() {
        let err = parse("a: 1\nb: [1, 2\nc: 3\n").unwrap_err();
        assert!(err.position.line >= 2, "the error is on or after line 2, not at {:?}", err.position);
        assert!(!err.message.is_empty());
    }

    #[test]
    fn a_key_whose_value_is_a_mapping_keeps_its_own_position() {
        let (_, locs) = parse("top:\n  bogus:\n    deep: 1\n").unwrap();
        assert_eq!(locs.find("top.bogus"), Position { line: 2, column: 3 });
        assert_eq!(locs.find("top.bogus.deep"), Position { line: 3, column: 5 });
        assert_eq!(locs.find("top"), Position { line: 1, column: 1 });
    }
}
