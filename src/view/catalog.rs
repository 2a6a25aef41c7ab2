//! The runs a viewer shows: the folders named on its command line, each a run (a folder
//! with an `events.jsonl`) or a results folder whose runs are its subfolders. The folders
//! are listed again on each request, so a run started after the viewer appears; a run's log
//! is projected once, and again only when it has grown.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use serde_json::Value;

use crate::log::projection::{Index, Projection};
use crate::log::reader::{LineHeader, for_each_line_of, header_episode_id, line_kind};

/// A run's log, read and projected.
pub struct Loaded {
    /// The run's name in the viewer's addresses: its folder's name.
    pub key: String,
    pub dir: PathBuf,
    /// The log's length and modification time when it was read.
    stamp: (u64, SystemTime),
    /// The `ts` of the log's first event: when the run started.
    pub started: String,
    /// The episodes the run planned (`run_started`; the latest resumption's).
    pub planned: u64,
    pub projection: Projection,
    /// Each episode's latest start: where its events begin in the log. Read on first need
    /// (an episode's page), not when the run opens: it is one more pass over the log.
    starts: OnceLock<HashMap<String, u64>>,
}

impl Loaded {
    pub fn events(&self) -> PathBuf {
        self.dir.join("events.jsonl")
    }

    /// The log's length when it was read: where a live view continues from.
    pub fn log_bytes(&self) -> u64 {
        self.stamp.0
    }

    /// Where each episode's latest start is in the log.
    pub fn starts(&self) -> Result<&HashMap<String, u64>, String> {
        if let Some(starts) = self.starts.get() {
            return Ok(starts);
        }
        let starts = episode_starts(&self.events())?;
        Ok(self.starts.get_or_init(|| starts))
    }

    /// Episodes started (their latest start) that have no finish yet.
    pub fn running(&self) -> Result<Vec<&str>, String> {
        if self.projection.unfinished == 0 {
            return Ok(Vec::new());
        }
        let finished: std::collections::HashSet<&str> =
            self.projection.episodes.iter().map(|e| &*e.episode_id).collect();
        let mut ids: Vec<(&str, u64)> = self
            .starts()?
            .iter()
            .filter(|(id, _)| !finished.contains(id.as_str()))
            .map(|(id, at)| (id.as_str(), *at))
            .collect();
        ids.sort_by_key(|(_, at)| *at);
        Ok(ids.into_iter().map(|(id, _)| id).collect())
    }
}

/// The folders the viewer was given and the runs read so far.
pub struct Catalog {
    roots: Vec<PathBuf>,
    loaded: Mutex<HashMap<PathBuf, Arc<Loaded>>>,
}

impl Catalog {
    /// A catalog of `roots`, each a run folder or a folder of runs; an error names a root
    /// that is neither.
    pub fn new(roots: Vec<PathBuf>) -> Result<Catalog, String> {
        for root in &roots {
            if !root.is_dir() {
                return Err(format!("{}: not a folder (give a run's folder or a results folder)", root.display()));
            }
        }
        Ok(Catalog { roots, loaded: Mutex::default() })
    }

    /// Every run folder under the roots, each with its key: the folder's name, numbered
    /// (`name~2`) when two roots hold runs of one name.
    pub fn runs(&self) -> Vec<(String, PathBuf)> {
        let mut dirs = Vec::new();
        for root in &self.roots {
            if root.join("events.jsonl").is_file() {
                dirs.push(root.clone());
                continue;
            }
            let Ok(entries) = std::fs::read_dir(root) else { continue };
            let mut found: Vec<PathBuf> =
                entries.flatten().map(|e| e.path()).filter(|p| p.join("events.jsonl").is_file()).collect();
            found.sort();
            dirs.extend(found);
        }
        let mut out: Vec<(String, PathBuf)> = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
            let mut key = name.clone();
            let mut n = 1;
            while out.iter().any(|(k, _)| *k == key) {
                n += 1;
                key = format!("{name}~{n}");
            }
            out.push((key, dir));
        }
        out
    }

    /// The run of `key`, read (again when its log grew since).
    pub fn load(&self, key: &str) -> Result<Arc<Loaded>, Missing> {
        let dir = self.runs().into_iter().find(|(k, _)| k == key).map(|(_, d)| d).ok_or(Missing::Run)?;
        self.load_dir(key, &dir).map_err(Missing::Unreadable)
    }

    fn load_dir(&self, key: &str, dir: &Path) -> Result<Arc<Loaded>, String> {
        let events = dir.join("events.jsonl");
        let meta = std::fs::metadata(&events).map_err(|e| format!("failed to read {}: {e}", events.display()))?;
        let stamp = (meta.len(), meta.modified().unwrap_or(SystemTime::UNIX_EPOCH));
        if let Some(l) = lock(&self.loaded).get(dir)
            && l.stamp == stamp
            && l.key == key
        {
            return Ok(l.clone());
        }
        let loaded = Arc::new(read(key, dir, stamp)?);
        lock(&self.loaded).insert(dir.to_path_buf(), loaded.clone());
        Ok(loaded)
    }
}

/// Why a run could not be shown.
#[derive(Debug)]
pub enum Missing {
    /// No run of that key.
    Run,
    /// Its log could not be read.
    Unreadable(String),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads a run: the projection every report reads, and when it started and how many
/// episodes it planned (its first line, `run_started`).
fn read(key: &str, dir: &Path, stamp: (u64, SystemTime)) -> Result<Loaded, String> {
    use std::io::BufRead as _;
    let events = dir.join("events.jsonl");
    let index = Index::build(&events).map_err(|e| e.to_string())?;
    let projection = Projection::from_index(&index).map_err(|e| e.to_string())?;
    let mut first = String::new();
    let file = std::fs::File::open(&events).map_err(|e| format!("failed to read {}: {e}", events.display()))?;
    std::io::BufReader::new(file)
        .read_line(&mut first)
        .map_err(|e| format!("failed to read {}: {e}", events.display()))?;
    let run: Value = serde_json::from_str(&first).unwrap_or_default();
    let started = run["ts"].as_str().unwrap_or_default().to_owned();
    let planned = run["episodes"].as_u64().unwrap_or(0);
    Ok(Loaded {
        key: key.to_owned(),
        dir: dir.to_path_buf(),
        stamp,
        started,
        planned,
        projection,
        starts: OnceLock::new(),
    })
}

/// Where each episode's latest start is in the log at `events`.
fn episode_starts(events: &Path) -> Result<HashMap<String, u64>, String> {
    let mut starts = HashMap::new();
    for_each_line_of(events, Some(&["episode_started"]), |_, text, offset| {
        let id = match header_episode_id(text) {
            Some(id) => id.to_owned(),
            None => match serde_json::from_str::<LineHeader>(text) {
                Ok(LineHeader { episode_id: Some(id), .. }) => id,
                _ => return Ok(()),
            },
        };
        starts.insert(id, offset);
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    Ok(starts)
}

/// The events of episode `id` as logged, from its latest start on; the lines of other
/// episodes are skipped by their header. The log is read from the start to its finish, or
/// to its end when the run was regraded (a regrade's scores come later).
pub fn episode_events(loaded: &Loaded, id: &str) -> Result<Vec<String>, String> {
    use std::io::{BufRead as _, Seek as _};
    let Some(&start) = loaded.starts()?.get(id) else { return Err(format!("no episode {id} in run {}", loaded.key)) };
    let path = loaded.events();
    let failed = |e: std::io::Error| format!("failed to read {}: {e}", path.display());
    let mut file = std::fs::File::open(&path).map_err(failed)?;
    file.seek(std::io::SeekFrom::Start(start)).map_err(failed)?;
    let mut reader = std::io::BufReader::with_capacity(256 * 1024, file);
    let regraded = loaded.projection.scorings > 0;
    let mut out = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).map_err(failed)? == 0 || !line.ends_with('\n') {
            break;
        }
        let text = line.trim_end();
        let of_this = match header_episode_id(text) {
            Some(other) => other == id,
            None => serde_json::from_str::<LineHeader>(text).is_ok_and(|h| h.episode_id.as_deref() == Some(id)),
        };
        if !of_this {
            continue;
        }
        out.push(text.to_owned());
        if !regraded && line_kind(text, Some(&["episode_finished"])).ok().flatten().is_some() {
            break;
        }
    }
    Ok(out)
}
