//! Typed decoding of YAML configuration, with errors that name file, line and column.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::yaml::{self, Locations, Position};

/// A mistake in a suite, environment or dataset file.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub position: Option<Position>,
    pub message: String,
}

impl ConfigError {
    pub fn at(file: &Path, position: Position, message: impl Into<String>) -> Self {
        ConfigError { file: file.to_owned(), position: Some(position), message: message.into() }
    }

    pub fn whole(file: &Path, message: impl Into<String>) -> Self {
        ConfigError { file: file.to_owned(), position: None, message: message.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some(p) => write!(f, "{}:{}:{}: {}", self.file.display(), p.line, p.column, self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A parsed YAML file: its value and where each part of it came from.
pub struct Source {
    pub file: PathBuf,
    pub value: Value,
    pub locations: Locations,
}

impl Source {
    pub fn read(file: &Path) -> Result<(Self, Vec<u8>), ConfigError> {
        let bytes = std::fs::read(file).map_err(|e| ConfigError::whole(file, format!("failed to read: {e}")))?;
        let text = std::str::from_utf8(&bytes).map_err(|e| ConfigError::whole(file, format!("not UTF-8: {e}")))?;
        let source = Self::parse(file, text)?;
        Ok((source, bytes))
    }

    /// Reads a file whose top-level `key` is a long list (a suite's `tasks:`): each item is
    /// handed to `take` as soon as it is parsed, with its index and the file's [`Items`]
    /// to decode it by, and is not kept in the value (its place holds `null`).
    pub fn read_taking(
        file: &Path,
        key: &str,
        mut take: impl FnMut(usize, Value, Items<'_>),
    ) -> Result<(Self, Vec<u8>), ConfigError> {
        let bytes = std::fs::read(file).map_err(|e| ConfigError::whole(file, format!("failed to read: {e}")))?;
        let text = std::str::from_utf8(&bytes).map_err(|e| ConfigError::whole(file, format!("not UTF-8: {e}")))?;
        let (value, locations) =
            yaml::parse_taking(text, key, &mut |i, value, locations| take(i, value, Items { file, locations }))
                .map_err(|e| ConfigError::at(file, e.position, format!("invalid YAML: {}", e.message)))?;
        Ok((Source { file: file.to_owned(), value, locations }, bytes))
    }

    pub fn parse(file: &Path, text: &str) -> Result<Self, ConfigError> {
        let (value, locations) =
            yaml::parse(text).map_err(|e| ConfigError::at(file, e.position, format!("invalid YAML: {}", e.message)))?;
        Ok(Source { file: file.to_owned(), value, locations })
    }

    /// The mapping at the top-level `key` as a source of its own (a suite's inline
    /// `environment:`): its errors name this file and the part's own lines.
    pub fn part(&self, key: &str) -> Source {
        Source {
            file: self.file.clone(),
            value: self.value.get(key).cloned().unwrap_or(Value::Null),
            locations: self.locations.under(key),
        }
    }

    /// An error about the part of the file at `path` (e.g. `tasks[1].scorers[0]`).
    pub fn error(&self, path: &str, message: impl fmt::Display) -> ConfigError {
        let message = if path.is_empty() { message.to_string() } else { format!("{path}: {message}") };
        ConfigError::at(&self.file, self.locations.find(path), message)
    }

    /// Decodes the value at `path` into `T`, failing on unknown keys and wrong types.
    pub fn decode<T: DeserializeOwned>(&self, path: &str, value: &Value) -> Result<T, ConfigError> {
        Items { file: &self.file, locations: &self.locations }.decode(path, value)
    }
}

/// What the items of a file read by [`Source::read_taking`] are decoded by: the file and
/// the positions parsed so far.
#[derive(Clone, Copy)]
pub struct Items<'a> {
    file: &'a Path,
    locations: &'a Locations,
}

impl Items<'_> {
    fn error(&self, path: &str, message: impl fmt::Display) -> ConfigError {
        let message = if path.is_empty() { message.to_string() } else { format!("{path}: {message}") };
        ConfigError::at(self.file, self.locations.find(path), message)
    }

    /// As [`Source::decode`].
    pub fn decode<T: DeserializeOwned>(&self, path: &str, value: &Value) -> Result<T, ConfigError> {
        // Unquoted numbers whose text would change stay text (`target: 1.50`); a field that
        // wants a number gets them as numbers, one at a time as the decoder asks for them.
        let mut value = Cow::Borrowed(value);
        let mut written: HashMap<String, String> = HashMap::new();
        loop {
            let e = match serde_path_to_error::deserialize::<_, T>(value.as_ref()) {
                Ok(decoded) => return Ok(decoded),
                Err(e) => e,
            };
            let mut at = path.to_owned();
            for segment in e.path().iter() {
                at = match segment {
                    serde_path_to_error::Segment::Seq { index } => yaml::item(&at, *index),
                    serde_path_to_error::Segment::Map { key } => yaml::child(&at, key),
                    serde_path_to_error::Segment::Enum { variant } => yaml::child(&at, variant),
                    serde_path_to_error::Segment::Unknown => at,
                };
            }
            let message = e.inner().to_string();
            if message.starts_with("invalid type: string") && self.locations.is_plain_number(&at) {
                let slot = value_at(value.to_mut(), e.path());
                if let Some(slot @ Value::String(_)) = slot {
                    let text = slot.as_str().unwrap_or_default().to_owned();
                    match yaml::number(&text) {
                        Some(Ok(number)) => {
                            *slot = Value::Number(number);
                            written.insert(at, text);
                            continue;
                        }
                        Some(Err(why)) => return Err(self.error(&at, why)),
                        None => {}
                    }
                }
            }
            // `1e2` is read as a float; where a count is expected, a whole one is that count.
            if let Some(max) = integer_max(&message)
                && message.starts_with("invalid type: floating point")
                && let Some(slot) = value_at(value.to_mut(), e.path())
                && let Some(whole) = slot.as_f64().filter(|x| x.fract() == 0.0 && *x >= 0.0 && *x <= max as f64)
            {
                *slot = Value::Number((whole as u64).into());
                continue;
            }
            let message = integer_range(&message, written.get(&at).map(String::as_str)).unwrap_or(message);
            // The path ends at the offending key when the error is about an unknown one.
            if let Some(key) = unknown_key(&message)
                && !at.ends_with(&format!(".{key}"))
                && at != key
            {
                at = yaml::child(&at, key);
            }
            return Err(self.error(&at, message));
        }
    }
}

/// The value a decoder's error path points at.
fn value_at<'v>(mut value: &'v mut Value, path: &serde_path_to_error::Path) -> Option<&'v mut Value> {
    for segment in path.iter() {
        value = match (segment, value) {
            (serde_path_to_error::Segment::Seq { index }, Value::Array(items)) => items.get_mut(*index)?,
            (serde_path_to_error::Segment::Map { key }, Value::Object(map)) => map.get_mut(key)?,
            _ => return None,
        };
    }
    Some(value)
}

/// Says what is wrong with a number given where a count is expected, instead of serde's
/// `invalid type: floating point ..., expected u32`.
fn integer_range(message: &str, written: Option<&str>) -> Option<String> {
    let max = integer_max(message)?;
    let found = message.split('`').nth(1)?;
    let is_number =
        message.starts_with("invalid type: floating point") || message.starts_with("invalid value: integer");
    is_number.then(|| format!("expected a whole number from 0 to {max}, found {}", written.unwrap_or(found)))
}

/// The largest value of the unsigned type a decoder's error `message` expected.
fn integer_max(message: &str) -> Option<u64> {
    Some(match message.rsplit_once(", expected ")?.1 {
        "u8" => u64::from(u8::MAX),
        "u16" => u64::from(u16::MAX),
        "u32" => u64::from(u32::MAX),
        "u64" | "usize" => u64::MAX,
        _ => return None,
    })
}

/// Checks a number of seconds: positive, finite, at most `max`.
pub fn check_seconds(source: &Source, path: &str, value: f64, min: f64, max: f64) -> Result<(), ConfigError> {
    if value.is_finite() && value >= min && value <= max {
        Ok(())
    } else {
        Err(source.error(path, format!("must be a number of seconds from {min} to {max}, got {value}")))
    }
}

fn unknown_key(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    rest.split('`').next()
}
