//! `runner merge RUN...`: the shards of a run (or any runs of the same suites and models on
//! disjoint episodes) combined into one run folder, as if one process had made them.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::log::Event;
use crate::log::projection::Projection;
use crate::log::reader::for_each_line_of;
use crate::log::writer::write_event;

/// The merged run's folder and how many episodes it holds.
pub struct Merged {
    pub dir: PathBuf,
    pub events_path: PathBuf,
    pub episodes: u64,
    /// Shards of the same split that were not among the inputs.
    pub missing_shards: Vec<String>,
}

/// Merges `runs` into `<out_dir>/<run_id>/`. Every input must have the same suites (by
/// digest) and models; an episode may appear in one input only.
/// Incomplete inputs — a missing shard of an `I/N` split, a run that was interrupted or
/// killed — are refused unless `allow_partial`: a merged verdict would pass on part of
/// the episodes.
pub fn merge(
    runs: &[PathBuf],
    out_dir: &Path,
    run_id: String,
    command_line: Vec<String>,
    allow_partial: bool,
) -> Result<Merged, String> {
    if runs.len() < 2 {
        return Err("merge needs at least two runs".into());
    }
    let projections = read_inputs(runs)?;
    check_alike(runs, &projections)?;
    let missing_shards = missing_shards(&projections);
    if !allow_partial {
        check_complete(runs, &projections, &missing_shards)?;
    }
    // Written in a staged folder and renamed into place at the end: a merge that is
    // killed leaves no half-merged run behind to refuse the next one.
    let staged = super::StagedRun::new(out_dir, &run_id).map_err(|e| e.to_string())?;
    let episodes = write_log(staged.path(), runs, &projections, (&run_id, command_line))?;
    carry_state(runs, staged.path())?;
    let dir = staged.publish().map_err(|e| e.to_string())?;
    let events_path = dir.join("events.jsonl");
    Ok(Merged { dir, events_path, episodes, missing_shards })
}

/// Each input's log, folded; one never started, or regraded, is refused.
fn read_inputs(runs: &[PathBuf]) -> Result<Vec<Projection>, String> {
    let mut projections = Vec::new();
    for run in runs {
        let p = Projection::from_log(&run.join("events.jsonl")).map_err(|e| e.to_string())?;
        if p.header.suites.is_empty() {
            return Err(format!("{}: the log has no run_started event", run.display()));
        }
        if let Some(scoring) = &p.scoring_id {
            return Err(format!(
                "{} was regraded (`{scoring}`): merge the shards as they ran, then regrade the merged run",
                run.display()
            ));
        }
        projections.push(p);
    }
    Ok(projections)
}

/// Refuses inputs that are not parts of one run: other models, other limits, other suites
/// (or versions or epochs of them), or an episode in two of them.
fn check_alike(runs: &[PathBuf], projections: &[Projection]) -> Result<(), String> {
    let first = &projections[0];
    let mut owner: HashMap<&str, usize> = HashMap::new();
    for (i, p) in projections.iter().enumerate() {
        let (a, b) = (runs[0].display(), runs[i].display());
        if p.header.models != first.header.models {
            return Err(format!(
                "{b} ran --model {}, but {a} ran {}: only runs of the same models merge",
                p.header.models.join(", "),
                first.header.models.join(", ")
            ));
        }
        if p.header.limits != first.header.limits {
            return Err(format!(
                "{b} ran with {}, but {a} with {}: only runs under the same limits merge",
                p.header.limits.as_flags(),
                first.header.limits.as_flags()
            ));
        }
        let digests = |p: &Projection| {
            let mut v: Vec<(String, String, u32)> =
                p.header.suites.iter().map(|s| (s.name.clone(), s.digest.clone(), s.epochs)).collect();
            v.sort();
            v
        };
        if digests(p) != digests(first) {
            return Err(format!(
                "{b} and {a} were run from different suites (or different versions or epochs of them): only runs of the same suites merge"
            ));
        }
        for e in &p.episodes {
            if let Some(j) = owner.insert(&e.episode_id, i)
                && j != i
            {
                return Err(format!(
                    "episode {} ({} / {} epoch {}) is in both {} and {}: shards must not overlap",
                    e.episode_id,
                    e.suite,
                    e.task_id,
                    e.epoch,
                    runs[j].display(),
                    b
                ));
            }
        }
    }
    Ok(())
}

/// Refuses inputs that are part of a run only: a shard missing, or one that did not finish.
fn check_complete(runs: &[PathBuf], projections: &[Projection], missing_shards: &[String]) -> Result<(), String> {
    if !missing_shards.is_empty() {
        return Err(format!(
            "shard(s) {} missing from the merge; pass --allow-partial to merge what there is",
            missing_shards.join(", ")
        ));
    }
    for (run, p) in runs.iter().zip(projections) {
        if p.interrupted || !p.finished || p.unfinished > 0 {
            return Err(format!(
                "{} did not finish (interrupted or killed): resume it with `runner eval ... --resume {}`, or pass --allow-partial",
                run.display(),
                run.display()
            ));
        }
    }
    Ok(())
}

/// Writes the merged run's `run.json` and log in `dir`: its own `run_started`, every
/// input's events but their run-level ones, in order, renumbered and renamed to the merged
/// run, and its `run_finished`. The episodes it holds.
fn write_log(
    dir: &Path,
    runs: &[PathBuf],
    projections: &[Projection],
    (run_id, command_line): (&str, Vec<String>),
) -> Result<u64, String> {
    let events_path = dir.join("events.jsonl");
    let file =
        std::fs::File::create(&events_path).map_err(|e| format!("failed to create {}: {e}", events_path.display()))?;
    let mut out = std::io::BufWriter::with_capacity(256 * 1024, file);
    let write_failed = |e: std::io::Error| format!("failed to write {}: {e}", events_path.display());
    let first = &projections[0];
    let episodes: u64 = projections.iter().map(|p| p.episodes.len() as u64).sum();
    let started = Event::RunStarted {
        runner_version: env!("CARGO_PKG_VERSION").into(),
        command_line,
        models: first.header.models.clone(),
        suites: first.header.suites.clone(),
        episodes,
        jobs: 0,
        git_revision: first.header.git_revision.clone(),
        shard: None,
        merged_from: projections.iter().map(|p| p.run_id.clone()).collect(),
        limits: first.header.limits,
        warnings: first.header.warnings.clone(),
        selection: first.header.selection.clone(),
        since: None,
    };
    super::write_run_json(dir, run_id, &started).map_err(|e| format!("failed to write run.json: {e}"))?;
    let mut seq = 1u64;
    write_event(&mut out, run_id, seq, &started).map_err(write_failed)?;
    let quoted_id = serde_json::to_string(run_id).unwrap_or_default();
    // The run-level events of the inputs stay behind; everything else is copied in order,
    // renumbered and renamed to the merged run.
    let run_level = ["run_started", "run_resumed", "run_finished"];
    for (run, p) in runs.iter().zip(projections) {
        let old_prefix = format!(
            "{{\"v\":{},\"run_id\":{},\"seq\":",
            crate::log::event::SCHEMA_VERSION,
            serde_json::to_string(&p.run_id).unwrap_or_default()
        );
        let mut failure = None;
        for_each_line_of(&run.join("events.jsonl"), None, |kind, text, _| {
            if run_level.contains(&kind) || failure.is_some() {
                return Ok(());
            }
            seq += 1;
            let line = renumber(text, &old_prefix, &quoted_id, seq)?;
            if let Err(e) = out.write_all(line.as_bytes()).and_then(|_| out.write_all(b"\n")) {
                failure = Some(e);
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
        if let Some(e) = failure {
            return Err(write_failed(e));
        }
    }
    let mut tally = super::Tally::default();
    for e in projections.iter().flat_map(|p| &p.episodes) {
        tally.add(&e.outcome);
    }
    let done = tally.finished(
        projections.iter().any(|p| p.interrupted || !p.finished),
        projections.iter().map(|p| p.wall_ms).fold(0.0, f64::max),
    );
    seq += 1;
    write_event(&mut out, run_id, seq, &done).map_err(write_failed)?;
    out.flush().map_err(write_failed)?;
    out.get_ref().sync_data().map_err(write_failed)?;
    Ok(episodes)
}

/// What a run keeps besides its log for a resume to go on from: the memory kept across a
/// task's epochs, the memory stores, the memory agent's checkpoints and ingestions, the pages
/// a live web answered. Carried into the merged run, so that resuming it starts each
/// episode where its shard would have.
fn carry_state(runs: &[PathBuf], to: &Path) -> Result<(), String> {
    use crate::environment::kinds::{memory_store, web};
    for run in runs {
        // Kept per task or per episode: only overlapping runs hold one twice, differently.
        for folder in [super::kept_notes::FOLDER, memory_store::FOLDER] {
            copy_files(&run.join(folder), &to.join(folder), Twice::Refuse)?;
        }
        // The first answer to a request is the one a run keeps.
        copy_files(&run.join(web::CACHE_FOLDER), &to.join(web::CACHE_FOLDER), Twice::KeepFirst)?;
        for kind in crate::agent::kinds::AGENT_KINDS {
            kind.carry(run, to)?;
        }
    }
    Ok(())
}

/// What to do with a file two inputs hold with different contents.
#[derive(Clone, Copy, PartialEq)]
enum Twice {
    Refuse,
    KeepFirst,
}

/// Copies the files of the folder `from` (none when it is missing) into `to`.
fn copy_files(from: &Path, to: &Path, twice: Twice) -> Result<(), String> {
    let failed = |path: &Path, e: std::io::Error| format!("failed to copy {}: {e}", path.display());
    let entries = match std::fs::read_dir(from) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(failed(from, e)),
    };
    std::fs::create_dir_all(to).map_err(|e| failed(to, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| failed(from, e))?;
        if !entry.file_type().map_err(|e| failed(&entry.path(), e))?.is_file() {
            continue;
        }
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        if target.exists() {
            let same = std::fs::read(&source).ok() == std::fs::read(&target).ok();
            if same || twice == Twice::KeepFirst {
                continue;
            }
            return Err(format!(
                "{} is also in another of the runs, with other contents: runs that overlap do not merge",
                source.display()
            ));
        }
        std::fs::copy(&source, &target).map_err(|e| failed(&source, e))?;
    }
    Ok(())
}

/// The line under the merged run's id and number: the header is rewritten in place when it
/// is laid out as the writer lays it out, else the line is decoded and encoded again.
fn renumber(text: &str, old_prefix: &str, new_id: &str, seq: u64) -> Result<String, String> {
    if let Some(rest) = text.strip_prefix(old_prefix)
        && let Some(comma) = rest.find(',')
        && rest[..comma].bytes().all(|b| b.is_ascii_digit())
    {
        return Ok(format!(
            "{{\"v\":{},\"run_id\":{new_id},\"seq\":{seq}{}",
            crate::log::event::SCHEMA_VERSION,
            &rest[comma..]
        ));
    }
    let mut fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e| e.to_string())?;
    fields.insert("run_id".into(), serde_json::from_str(new_id).map_err(|e| e.to_string())?);
    fields.insert("seq".into(), seq.into());
    serde_json::to_string(&fields).map_err(|e| e.to_string())
}

/// When the inputs are shards `i/n` of one split, the shards not among them.
fn missing_shards(projections: &[Projection]) -> Vec<String> {
    let shards: Vec<(u64, u64)> =
        projections.iter().filter_map(|p| p.header.shard.as_deref().and_then(|s| super::parse_shard(s).ok())).collect();
    let Some(&(_, n)) = shards.first() else { return Vec::new() };
    if shards.len() != projections.len() || shards.iter().any(|s| s.1 != n) {
        return Vec::new();
    }
    (1..=n).filter(|i| !shards.iter().any(|s| s.0 == *i)).map(|i| format!("{i}/{n}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_two_runs_hold_differently_is_refused_or_the_first_kept_as_asked() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, to) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("to"));
        for (run, text) in [(&a, "first"), (&b, "other")] {
            std::fs::create_dir_all(run).unwrap();
            std::fs::write(run.join("same.json"), "same").unwrap();
            std::fs::write(run.join("t.e1.json"), text).unwrap();
        }
        std::fs::write(a.join("only-a.json"), "a").unwrap();
        copy_files(&a, &to, Twice::Refuse).unwrap();
        let error = copy_files(&b, &to, Twice::Refuse).unwrap_err();
        let named = format!("{} is also in another of the runs", b.join("t.e1.json").display());
        assert!(error.starts_with(&named), "{error}");
        copy_files(&b, &to, Twice::KeepFirst).unwrap();
        assert_eq!(std::fs::read_to_string(to.join("t.e1.json")).unwrap(), "first");
        assert_eq!(std::fs::read_to_string(to.join("only-a.json")).unwrap(), "a");
        copy_files(&dir.path().join("missing"), &to, Twice::Refuse).unwrap();
    }

    #[test]
    fn a_line_is_renamed_and_renumbered_in_place_or_by_decoding() {
        let prefix = "{\"v\":1,\"run_id\":\"a\",\"seq\":";
        let line = "{\"v\":1,\"run_id\":\"a\",\"seq\":17,\"ts\":\"t\",\"type\":\"final\",\"step\":2}";
        assert_eq!(
            renumber(line, prefix, "\"m\"", 4).unwrap(),
            "{\"v\":1,\"run_id\":\"m\",\"seq\":4,\"ts\":\"t\",\"type\":\"final\",\"step\":2}"
        );
        let odd = "{\"type\":\"final\",\"seq\":17,\"run_id\":\"a\",\"v\":1}";
        let out: serde_json::Value = serde_json::from_str(&renumber(odd, prefix, "\"m\"", 4).unwrap()).unwrap();
        assert_eq!(out["run_id"], "m");
        assert_eq!(out["seq"], 4);
        assert_eq!(out["type"], "final");
    }
}
