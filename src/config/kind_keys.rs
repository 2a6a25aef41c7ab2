//! A mapping whose keys are partly common and partly a kind's own (an environment file, a
//! suite's `agent:`): the one split of its keys, and the one refusal of a key that belongs
//! to another kind, so that every kind of environment and of agent is told the same way.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::decode::{ConfigError, Source};
use super::yaml;

/// A kind's own keys of one mapping, handed to the kind to decode.
pub struct KindKeys<'a> {
    /// The file, for errors that name its line and column.
    pub source: &'a Source,
    /// The file's path: relative paths in it are its folder's.
    pub path: &'a Path,
    /// Where the mapping is in the file (`agent`, `variants.terse.agent`); empty for the
    /// whole file.
    pub at: String,
    /// Those of the kind's keys that the mapping gives.
    pub given: BTreeMap<&'a str, &'a Value>,
}

impl KindKeys<'_> {
    /// The value the mapping gives `key`, if it gives one.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.given.get(key).copied()
    }

    /// The folder of the file.
    pub fn folder(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Where `key` of the mapping is, as errors name it.
    pub fn path_of(&self, key: &str) -> String {
        yaml::child(&self.at, key)
    }

    /// An error about `key` of the mapping.
    pub fn error(&self, key: &str, message: impl std::fmt::Display) -> ConfigError {
        self.source.error(&self.path_of(key), message)
    }

    /// Decodes `key`'s value, when the mapping gives it.
    pub fn decode<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ConfigError> {
        self.get(key).map(|value| self.source.decode(&self.path_of(key), value)).transpose()
    }
}

/// The keys of `mapping` (at `at` in `source`) beside `common` that are the kind's `own`.
/// A key given no value is a key not given. A key of another kind is refused with that
/// kind's words (`refusal`), a key of none as unknown, listing the keys this kind takes.
pub fn split<'a>(
    (source, path, at): (&'a Source, &'a Path, &str),
    mapping: &'a Map<String, Value>,
    (common, own): (&[&str], &[&str]),
    refusal: impl Fn(&str) -> Option<String>,
) -> Result<KindKeys<'a>, ConfigError> {
    let mut given = BTreeMap::new();
    for (key, value) in mapping.iter().filter(|(k, v)| !common.contains(&k.as_str()) && !v.is_null()) {
        if own.contains(&key.as_str()) {
            given.insert(key.as_str(), value);
            continue;
        }
        let message = refusal(key).unwrap_or_else(|| {
            let known: Vec<String> = common.iter().chain(own).map(|k| format!("`{k}`")).collect();
            format!("unknown field `{key}`, expected one of {}", known.join(", "))
        });
        return Err(source.error(&yaml::child(at, key), message));
    }
    Ok(KindKeys { source, path, at: at.to_owned(), given })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(text: &str) -> Source {
        Source::parse(Path::new("s.yaml"), text).unwrap()
    }

    #[test]
    fn a_key_of_another_kind_is_refused_in_its_words_and_a_key_of_none_as_unknown() {
        let refusal = |key: &str| (key == "theirs").then(|| "is for `kind: other` only".to_owned());
        let file = source("agent:\n  system: hi\n  mine: 1\n  unset:\n");
        let mapping = file.value["agent"].as_object().unwrap();
        let keys =
            split((&file, Path::new("s.yaml"), "agent"), mapping, (&["system"], &["mine", "unset"]), refusal).unwrap();
        assert_eq!(keys.given.keys().copied().collect::<Vec<_>>(), ["mine"], "a key given no value is not given");
        assert_eq!(keys.path_of("mine"), "agent.mine");

        let file = source("agent:\n  system: hi\n  theirs: 1\n");
        let mapping = file.value["agent"].as_object().unwrap();
        let err = split((&file, Path::new("s.yaml"), "agent"), mapping, (&["system"], &["mine"]), refusal);
        assert_eq!(err.err().unwrap().to_string(), "s.yaml:3:3: agent.theirs: is for `kind: other` only");

        let file = source("agent:\n  nobody: 1\n");
        let mapping = file.value["agent"].as_object().unwrap();
        let err = split((&file, Path::new("s.yaml"), "agent"), mapping, (&["system"], &["mine"]), refusal);
        assert_eq!(
            err.err().unwrap().to_string(),
            "s.yaml:2:3: agent.nobody: unknown field `nobody`, expected one of `system`, `mine`"
        );
    }
}
