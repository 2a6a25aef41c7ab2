//! Continuing a run: `runner eval ... --resume RUN` keeps the scored episodes of RUN and
//! runs the unscored, cancelled and missing ones again, appending to the same log.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Resume;
use crate::log::Outcome;
use crate::log::event::LimitOverrides;
use crate::log::projection::Projection;
use crate::model::Backend;
use crate::suite::Suite;

/// Finds the run folder: a path to it (or to its `events.jsonl`), or a run id under `out_dir`.
pub fn find_run(run: &Path, out_dir: &Path) -> Result<PathBuf, String> {
    let candidates = [run.to_path_buf(), out_dir.join(run)];
    for c in candidates {
        if c.is_file() && c.file_name().is_some_and(|n| n == "events.jsonl") {
            return Ok(c.parent().map(Path::to_path_buf).unwrap_or_default());
        }
        if c.join("events.jsonl").is_file() {
            return Ok(c);
        }
    }
    Err(format!("{}: no run there (a run folder holds events.jsonl)", run.display()))
}

/// Finds the run folder like [`find_run`], and checks that its log starts as a run's does.
pub fn find_logged_run(run: &Path, out_dir: &Path) -> Result<PathBuf, String> {
    use std::io::BufRead as _;
    let dir = find_run(run, out_dir)?;
    let events = dir.join("events.jsonl");
    let file = std::fs::File::open(&events).map_err(|e| format!("failed to read {}: {e}", events.display()))?;
    let mut first = String::new();
    std::io::BufReader::new(file)
        .read_line(&mut first)
        .map_err(|e| format!("failed to read {}: {e}", events.display()))?;
    let kind =
        serde_json::from_str::<serde_json::Value>(&first).ok().and_then(|v| v["type"].as_str().map(String::from));
    match kind.as_deref() {
        Some("run_started") => Ok(dir),
        _ if first.trim().is_empty() => Err(format!("{}:1: the log is empty; no run was recorded", events.display())),
        _ => Err(format!("{}:1: not a run's log: it must start with a run_started event", events.display())),
    }
}

/// What a resumption asks for besides its suites: each must be what the run had.
pub struct Given<'a> {
    pub models: &'a [Arc<Backend>],
    pub epochs: Option<u32>,
    pub shard: Option<(u64, u64)>,
    /// The limit flags: episodes run under other limits would not be the run's.
    pub limits: LimitOverrides,
    /// The tasks chosen: another choice would make another run.
    pub selection: &'a crate::domain::selection::Selection,
}

/// What to keep of the run in `dir`, after checking that the same suites, models, epochs,
/// shard and limits are asked for: the same episode ids, so "missing" means what it says.
pub fn plan(dir: &Path, suites: &[Arc<Suite>], asked: &Given<'_>) -> Result<Resume, String> {
    let Given { models, epochs, shard, limits, selection } = *asked;
    let lock = super::lock(dir)?;
    let events = dir.join("events.jsonl");
    let p = Projection::from_log(&events).map_err(|e| e.to_string())?;
    let shown = dir.display();
    if p.header.suites.is_empty() {
        return Err(format!("{shown}: the log has no run_started event; it cannot be resumed"));
    }
    if let Some(scoring) = &p.scoring_id {
        return Err(format!(
            "{shown} was regraded (`{scoring}`): episodes run now would be scored by the suite's scorers, not the regrade's, and the run would mix two scorings; resume before regrading, or start a new run"
        ));
    }
    let asked: Vec<&str> = models.iter().map(|m| m.name()).collect();
    if asked != p.header.models.iter().map(String::as_str).collect::<Vec<_>>() {
        return Err(format!(
            "{shown} was run with --model {}, not {}: resume with the same models",
            p.header.models.join(", "),
            asked.join(", ")
        ));
    }
    for s in suites {
        let Some(before) = p.suite(&s.name) else {
            return Err(format!("{shown}: suite `{}` was not part of the run", s.name));
        };
        if before.digest != s.digest {
            return Err(format!(
                "{}: suite `{}` changed since {shown} was run (digest {} then, {} now); start a new run",
                s.path.display(),
                s.name,
                short(&before.digest),
                short(&s.digest)
            ));
        }
        let now = epochs.unwrap_or(s.epochs);
        if before.epochs != now {
            return Err(format!("{shown}: suite `{}` ran {} epoch(s), not {now}", s.name, before.epochs));
        }
        let variants = crate::suite::variants::names(&s.variants);
        if before.variants != variants {
            let list = |names: &[String]| if names.is_empty() { "none".to_owned() } else { names.join(", ") };
            return Err(format!(
                "{shown}: suite `{}` ran the variants {}, not {}; pick the same with --variant",
                s.name,
                list(&before.variants),
                list(&variants)
            ));
        }
    }
    if let Some(missing) = p.header.suites.iter().find(|b| !suites.iter().any(|s| s.name == b.name)) {
        return Err(format!("{shown}: the run also had suite `{}` ({}); name it too", missing.name, missing.path));
    }
    if p.header.limits != limits {
        return Err(format!(
            "{shown} was run with {}, not {}: resume with the same limits",
            p.header.limits.as_flags(),
            limits.as_flags()
        ));
    }
    if p.header.selection != *selection {
        return Err(format!(
            "{shown} was run with {}, not {}: resume with the same task selection",
            p.header.selection.as_flags(),
            selection.as_flags()
        ));
    }
    let shard_now = shard.map(|(i, n)| format!("{i}/{n}"));
    if p.header.shard != shard_now {
        let show = |s: &Option<String>| s.clone().map_or("no shard".to_string(), |s| format!("shard {s}"));
        return Err(format!("{shown} was {}, not {}", show(&p.header.shard), show(&shard_now)));
    }
    let mut keep = std::collections::HashSet::new();
    let mut spent = Vec::new();
    for e in p.episodes.into_iter().filter(|e| matches!(e.outcome, Outcome::Scored { .. })) {
        let spend = crate::budget::Spend {
            cost_usd: e.cost_usd.unwrap_or(0.0),
            tokens: e.usage.total(),
            model_calls: u64::from(e.model_calls),
        };
        spent.push((e.model.to_string(), spend));
        keep.insert(String::from(e.episode_id));
    }
    Ok(Resume { dir: dir.to_path_buf(), run_id: p.run_id, last_seq: p.last_seq, keep, spent, lock })
}

fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}
