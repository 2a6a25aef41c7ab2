//! The server's queue, kept where a `kill -9` cannot take it: `serve.jsonl` in the run's
//! folder, one line when an episode is admitted (what it runs, never the caller's key) and
//! one when it ends. After a restart on the same run, an episode admitted and never ended
//! was interrupted: it is reported so, and `retry` runs it again under its own id.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::log::Outcome;

/// The file's name in the run folder.
pub const FILE: &str = "serve.jsonl";

/// Who plays the agent of a served episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Policy {
    /// A model runner opens by its name: `mock`, `replay:PATH`, `provider/model`.
    Named { model: String },
    /// The caller's OpenAI-compatible endpoint; its key is never written.
    Endpoint {
        base_url: String,
        model: String,
        #[serde(default)]
        sampling: Map<String, Value>,
    },
    /// The caller itself, step by step (`/reset`, `/step`).
    Steps,
}

/// An episode admitted: enough to run it again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Admitted {
    pub episode_id: String,
    pub suite: String,
    pub task: String,
    pub epoch: u32,
    pub policy: Policy,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line {
    Admitted(Admitted),
    Ended { episode_id: String, outcome: Outcome },
}

/// What the file said when the server started: every episode's latest admission, and the
/// outcome of those that ended since.
#[derive(Default)]
pub struct Restored {
    pub admitted: HashMap<String, Admitted>,
    pub ended: HashMap<String, Outcome>,
}

impl Restored {
    /// The episodes admitted and never ended: interrupted by the server's end.
    pub fn interrupted(&self) -> impl Iterator<Item = &Admitted> {
        self.admitted.values().filter(|a| !self.ended.contains_key(&a.episode_id))
    }
}

pub struct Journal {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl Journal {
    /// Opens the run folder's journal, reading what it holds; a torn last line (a kill
    /// mid-write) is cut, any other bad line is an error naming it.
    pub fn open(run_dir: &Path) -> Result<(Journal, Restored), String> {
        let path = run_dir.join(FILE);
        let shown = path.display();
        let restored = match std::fs::read(&path) {
            Ok(bytes) => read(&bytes, &shown.to_string())?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Restored::default(),
            Err(e) => return Err(format!("failed to read {shown}: {e}")),
        };
        crate::log::writer::drop_torn_tail(&path).map_err(|e| format!("failed to open {shown}: {e}"))?;
        let file = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("failed to open {shown}: {e}"))?;
        Ok((Journal { path, file: Mutex::new(file) }, restored))
    }

    pub fn admitted(&self, admitted: &Admitted) -> Result<(), String> {
        self.append(&Line::Admitted(admitted.clone()))
    }

    pub fn ended(&self, episode_id: &str, outcome: &Outcome) -> Result<(), String> {
        self.append(&Line::Ended { episode_id: episode_id.to_owned(), outcome: outcome.clone() })
    }

    /// One whole line in one write: a kill leaves it whole or torn at the end, never mixed.
    fn append(&self, line: &Line) -> Result<(), String> {
        let mut bytes = serde_json::to_vec(line).map_err(|e| e.to_string())?;
        bytes.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        file.write_all(&bytes).map_err(|e| format!("failed to write {}: {e}", self.path.display()))
    }
}

fn read(bytes: &[u8], shown: &str) -> Result<Restored, String> {
    let mut restored = Restored::default();
    let whole = bytes.ends_with(b"\n");
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    for (i, line) in lines.iter().enumerate() {
        let last = i + 1 == lines.len();
        if line.iter().all(u8::is_ascii_whitespace) || (last && !whole) {
            continue;
        }
        let line: Line =
            serde_json::from_slice(line).map_err(|e| format!("{shown}:{}: not a queue line: {e}", i + 1))?;
        match line {
            Line::Admitted(a) => {
                // Admitted again (a retry): it has not ended since.
                restored.ended.remove(&a.episode_id);
                restored.admitted.insert(a.episode_id.clone(), a);
            }
            Line::Ended { episode_id, outcome } => {
                restored.ended.insert(episode_id, outcome);
            }
        }
    }
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(id: &str) -> Admitted {
        Admitted {
            episode_id: id.into(),
            suite: "s".into(),
            task: "t".into(),
            epoch: 1,
            policy: Policy::Named { model: "mock".into() },
        }
    }

    #[test]
    fn an_episode_admitted_and_never_ended_is_interrupted_and_a_retry_reopens_one_that_ended() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (journal, restored) = Journal::open(dir.path()).unwrap();
            assert!(restored.admitted.is_empty());
            journal.admitted(&admitted("a")).unwrap();
            journal.admitted(&admitted("b")).unwrap();
            journal.ended("a", &Outcome::Cancelled).unwrap();
            journal.ended("b", &Outcome::Cancelled).unwrap();
            journal.admitted(&admitted("b")).unwrap();
        }
        // A kill mid-write leaves a torn line: cut, the rest read.
        let path = dir.path().join(FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(b"{\"type\":\"ended\",\"episode_id\":\"b\",\"outc");
        std::fs::write(&path, bytes).unwrap();
        let (journal, restored) = Journal::open(dir.path()).unwrap();
        let interrupted: Vec<&str> = restored.interrupted().map(|a| a.episode_id.as_str()).collect();
        assert_eq!(interrupted, ["b"]);
        journal.ended("b", &Outcome::Cancelled).unwrap();
        let (_, restored) = Journal::open(dir.path()).unwrap();
        assert_eq!(restored.interrupted().count(), 0, "the line after the torn one is read");
    }

    #[test]
    fn a_bad_line_in_the_middle_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "{\"type\":\"nope\"}\n{}\n").unwrap();
        let Err(e) = Journal::open(dir.path()) else { panic!("a bad line was read") };
        assert!(e.contains("serve.jsonl:1: not a queue line"), "{e}");
    }
}
