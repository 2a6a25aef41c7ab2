//! Typed decoding of YAML configuration, with errors that name file, line and column.

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

    pub fn parse(file: &Path, text: &str) -> Result<Self, ConfigError> {
        let (value, locations) =
            yaml::parse(text).map_err(|e| ConfigError::at(file, e.position, format!("invalid YAML: {}", e.message)))?;
        Ok(Source { file: file.to_owned(), value, locations })
    }

    /// An error about the part of the file at `path` (e.g. `tasks[1].scorers[0]`).
    pub fn error(&self, path: &str, message: impl fmt::Display) -> ConfigError {
        let message = if path.is_empty() { message.to_string() } else { format!("{path}: {message}") };
        ConfigError::at(&self.file, self.locations.find(path), message)
    }

    /// Decodes the value at `path` into `T`, failing on unknown keys and wrong types.
    pub fn decode<T: DeserializeOwned>(&self, path: &str, value: &Value) -> Result<T, ConfigError> {
        serde_path_to_error::deserialize(value).map_err(|e| {
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
            // The path ends at the offending key when the error is about an unknown one.
            if let Some(key) = unknown_key(&message)
                && !at.ends_with(&format!(".{key}"))
                && at != key
            {
                at = yaml::child(&at, key);
            }
            self.error(&at, message)
        })
    }
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
