//! YAML text to a JSON value, remembering where every key and item came from, so that
//! errors found later (a wrong type, an unknown tool) can name the line and column.
//!
//! A file is one document of printable text; aliases are bounded, so that a few hundred
//! bytes cannot expand into gigabytes. (The parser bounds nesting itself.)

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
    /// Unquoted numbers kept as text because their text would change (`1e3`, `1.50`,
    /// `.inf`): a field that wants a number may still read them as one.
    plain_numbers: std::collections::HashSet<String>,
}

impl Locations {
    /// The locations of the part at the top-level key `key`, as paths within that part
    /// (`environment.kind` becomes `kind`): for a part read as a file of its own.
    pub fn under(&self, key: &str) -> Locations {
        let inside = |path: &str| -> Option<String> {
            match path.strip_prefix(key) {
                Some("") => Some(String::new()),
                Some(rest) => {
                    rest.strip_prefix('.').map(str::to_owned).or_else(|| rest.starts_with('[').then(|| rest.to_owned()))
                }
                None => None,
            }
        };
        Locations {
            by_path: self.by_path.iter().filter_map(|(p, at)| inside(p).map(|p| (p, *at))).collect(),
            plain_numbers: self.plain_numbers.iter().filter_map(|p| inside(p)).collect(),
        }
    }

    /// Whether the value at `path` was written as an unquoted number.
    pub fn is_plain_number(&self, path: &str) -> bool {
        self.plain_numbers.contains(path)
    }

    /// Gives `path` the position of `from` (or of its nearest recorded ancestor): for a
    /// value made from another part of the same file, so that its errors point there.
    pub fn alias(&mut self, path: &str, from: &str) {
        let at = self.find(from);
        self.by_path.insert(path.to_owned(), at);
    }

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

/// How many values and characters the aliases of one file may expand to, in all.
pub const MAX_ALIAS_EXPANSION: usize = 1_000_000;

/// Parses one YAML document; a second one (after `---`) is an error, not ignored.
pub fn parse(text: &str) -> Result<(Value, Locations), YamlError> {
    parse_with(text, None)
}

/// Hands each item of the list at the top-level `key` to `take` once it is parsed,
/// with the positions so far, and keeps `null` in its place: a list of a hundred
/// thousand tasks is never held whole as values.
pub fn parse_taking(
    text: &str,
    key: &str,
    take: &mut dyn FnMut(usize, Value, &Locations),
) -> Result<(Value, Locations), YamlError> {
    parse_with(text, Some((key, take)))
}

/// The top-level key whose list's items are handed out as they are parsed, and to what.
type Taker<'a> = (&'a str, &'a mut dyn FnMut(usize, Value, &Locations));

fn parse_with<'a>(text: &str, take: Option<Taker<'a>>) -> Result<(Value, Locations), YamlError> {
    // A byte-order mark is not part of the text (editors on Windows write one).
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    check_printable(text)?;
    let mut builder = Builder { take, ..Builder::default() };
    let mut parser = Parser::new_from_str(text);
    parser
        .load(&mut builder, true)
        .map_err(|e| YamlError { position: Position::of(*e.marker()), message: e.info().to_owned() })?;
    if let Some(error) = builder.error {
        return Err(error);
    }
    let value = builder.root.unwrap_or(Value::Null);
    Ok((value, builder.locations))
}

/// Refuses the characters YAML does not allow in a file (its `c-printable`): the parser
/// takes a NUL for the end of the text and silently drops what follows.
fn check_printable(text: &str) -> Result<(), YamlError> {
    let printable = |c: char| {
        matches!(c, '\t' | '\n' | '\r' | '\u{85}')
            || (' '..='~').contains(&c)
            || ('\u{a0}'..='\u{d7ff}').contains(&c)
            || ('\u{e000}'..='\u{fffd}').contains(&c)
            || c >= '\u{10000}'
    };
    for (i, line) in text.split('\n').enumerate() {
        if let Some((column, c)) = line.chars().enumerate().find(|(_, c)| !printable(*c)) {
            let name =
                if c == '\0' { "a NUL byte".to_owned() } else { format!("the control character U+{:04X}", c as u32) };
            return Err(YamlError {
                position: Position { line: i + 1, column: column + 1 },
                message: format!("{name} is not allowed in YAML text (inside double quotes, write it as an escape)"),
            });
        }
    }
    Ok(())
}

enum Frame {
    Seq {
        items: Vec<Value>,
        anchor: usize,
        path: String,
        /// The values and characters inside, to bound what an alias of it expands to.
        weight: usize,
    },
    Map {
        entries: Map<String, Value>,
        key: Option<String>,
        anchor: usize,
        path: String,
        /// Whether the mapping's own start event placed its position (not a parent's key).
        placed: bool,
        weight: usize,
    },
}

#[derive(Default)]
struct Builder<'a> {
    /// The top-level key whose list's items are handed out as they are parsed, and to what.
    take: Option<Taker<'a>>,
    stack: Vec<Frame>,
    root: Option<Value>,
    /// Each anchor's value and its weight (values and characters).
    anchors: HashMap<usize, (Value, usize)>,
    /// What the aliases so far expanded to, in values and characters.
    expanded: usize,
    documents: usize,
    locations: Locations,
    error: Option<YamlError>,
}

impl Builder<'_> {
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

    fn push_value(&mut self, value: Value, weight: usize, anchor: usize, mark: Marker) {
        if anchor > 0 {
            self.anchors.insert(anchor, (value.clone(), weight));
        }
        let value = match (&mut self.take, self.stack.as_slice()) {
            (Some((key, take)), [Frame::Map { key: Some(at), .. }, Frame::Seq { items, .. }]) if at == key => {
                take(items.len(), value, &self.locations);
                Value::Null
            }
            _ => value,
        };
        match self.stack.last_mut() {
            None => self.root = Some(value),
            Some(Frame::Seq { items, weight: total, .. }) => {
                *total = total.saturating_add(weight);
                items.push(value);
            }
            Some(Frame::Map { entries, key, path, placed, weight: total, .. }) => match key.take() {
                Some(k) => {
                    *total = total.saturating_add(weight);
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
                    *total = total.saturating_add(weight);
                    *key = Some(name);
                }
            },
        }
    }
}

impl MarkedEventReceiver for Builder<'_> {
    fn on_event(&mut self, event: Event, mark: Marker) {
        // After the first error the rest is not built: an alias bomb stops where it was caught.
        if self.error.is_some() {
            return;
        }
        match event {
            Event::Scalar(text, style, anchor, _tag) => {
                let (path, is_key) = self.next_path();
                let weight = 1 + text.len();
                let plain = style == TScalarStyle::Plain;
                let value = if plain { plain_scalar(text) } else { Value::String(text) };
                if !is_key {
                    if plain && matches!(&value, Value::String(t) if number(t).is_some()) {
                        self.locations.plain_numbers.insert(path.clone());
                    }
                    self.locations.by_path.entry(path).or_insert(Position::of(mark));
                }
                self.push_value(value, weight, anchor, mark);
            }
            Event::SequenceStart(anchor, _) => {
                let (path, _) = self.next_path();
                self.locations.by_path.entry(path.clone()).or_insert(Position::of(mark));
                self.stack.push(Frame::Seq { items: Vec::new(), anchor, path, weight: 1 });
            }
            Event::MappingStart(anchor, _) => {
                let (path, is_key) = self.next_path();
                if is_key {
                    self.fail(mark, "a mapping key must be a plain scalar".into());
                }
                let placed = !self.locations.by_path.contains_key(&path);
                self.locations.by_path.entry(path.clone()).or_insert(Position::of(mark));
                self.stack.push(Frame::Map { entries: Map::new(), key: None, anchor, path, placed, weight: 1 });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (value, anchor, weight) = match self.stack.pop() {
                    Some(Frame::Seq { items, anchor, weight, .. }) => (Value::Array(items), anchor, weight),
                    Some(Frame::Map { entries, anchor, weight, .. }) => (Value::Object(entries), anchor, weight),
                    None => return,
                };
                self.push_value(value, weight, anchor, mark);
            }
            Event::Alias(anchor) => {
                let Some(weight) = self.anchors.get(&anchor).map(|(_, w)| *w) else {
                    return self.fail(mark, "an alias refers to an unknown anchor".into());
                };
                // Checked before the copy is made, so that the copy itself stays small.
                self.expanded = self.expanded.saturating_add(weight);
                if self.expanded > MAX_ALIAS_EXPANSION {
                    return self.fail(
                        mark,
                        format!(
                            "the aliases in this file expand to more than {MAX_ALIAS_EXPANSION} values and characters; \
                             write the repeated parts out, or reuse less"
                        ),
                    );
                }
                let Some((value, _)) = self.anchors.get(&anchor).cloned() else { return };
                let (path, is_key) = self.next_path();
                if !is_key {
                    self.locations.by_path.entry(path).or_insert(Position::of(mark));
                }
                self.push_value(value, weight, 0, mark);
            }
            Event::DocumentStart => {
                self.documents += 1;
                if self.documents > 1 {
                    self.fail(
                        mark,
                        "a second YAML document (after `---`): a file holds one suite, in one document".into(),
                    );
                }
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
        }
    }
}

/// The number an unquoted scalar stands for, when it is one: an error says what is wrong
/// with it (`.nan`, `.inf`, `1e999` are not finite).
pub fn number(text: &str) -> Option<Result<Number, String>> {
    match Yaml::from_str(text) {
        Yaml::Integer(i) => Some(Ok(Number::from(i))),
        real @ Yaml::Real(_) => {
            let x = real.as_f64()?;
            Some(Number::from_f64(x).filter(|_| x.is_finite()).ok_or_else(|| format!("not a finite number: {text}")))
        }
        _ => None,
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
