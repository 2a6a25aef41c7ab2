//! Shards merged back into one run: the merged run's tables equal one unsharded run's, for
//! random suites and shard counts, and for a memory that carries from one epoch to the next.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::runs::table;
use crate::{Sandbox, read_jsonl};

/// `summary.json` without what depends on timing or on the run's name.
pub fn summary_without_timings(dir: &Path) -> serde_json::Value {
    let path = dir.join("summary.json");
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut summary: serde_json::Value = serde_json::from_slice(&text).expect("summary.json is JSON");
    if let Some(rows) = summary["rows"].as_array_mut() {
        for row in rows {
            row["wall_s"] = 0.into();
        }
    }
    summary["total"]["wall_s"] = 0.into();
    summary["run_id"] = "".into();
    summary
}

/// Runs `suites` whole and as `n` shards (each its own process), merges the shards, and
/// returns what differs between the merged run and the whole one (nothing, when all is well).
fn merged_differs_from_whole(sb: &Sandbox, suites: &[&str], n: u64, epochs: Option<u32>) -> Option<String> {
    run_whole_and_shards(sb, suites, n, epochs);
    merge_shards(sb, n, &[]);
    differences(&sb.path().join("results/whole"), &sb.path().join("results/merged"))
}

/// Runs `suites` as `results/whole` and as `n` shards `results/shard-I`, each its own
/// process; returns the arguments of `runner eval` they share.
fn run_whole_and_shards(sb: &Sandbox, suites: &[&str], n: u64, epochs: Option<u32>) -> Vec<String> {
    let mut common: Vec<String> = vec!["eval".into()];
    common.extend(suites.iter().map(|s| s.to_string()));
    common.extend(["--model", "mock", "--out", "results", "-q"].map(String::from));
    if let Some(k) = epochs {
        common.extend(["--epochs".into(), k.to_string()]);
    }
    let run = |extra: &[String]| {
        let args: Vec<&str> = common.iter().chain(extra).map(String::as_str).collect();
        let run = sb.run(&args);
        assert_eq!(run.code, 0, "{args:?}: {run:?}");
    };
    run(&["--run-id".into(), "whole".into()]);
    for i in 1..=n {
        run(&["--run-id".into(), format!("shard-{i}"), "--shard".into(), format!("{i}/{n}")]);
    }
    common
}

/// Merges the `n` shards into `results/merged`.
fn merge_shards(sb: &Sandbox, n: u64, extra: &[&str]) {
    let mut merge = vec!["merge".to_string()];
    merge.extend((1..=n).map(|i| format!("results/shard-{i}")));
    merge.extend(["--out", "results", "--run-id", "merged"].map(String::from));
    merge.extend(extra.iter().map(|s| s.to_string()));
    let merged = sb.run(&merge.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(merged.code, 0, "{merge:?}: {merged:?}");
}

/// The episodes that were told how long a tool took (`execute_code`'s `duration_s`): what
/// the mock model counts of their transcripts — four characters a token — is a timing too.
fn told_a_duration(run: &Path) -> BTreeSet<String> {
    read_jsonl(&run.join("events.jsonl"))
        .iter()
        .filter(|e| e["type"] == "observation" && !e["observation"]["tool_result"]["duration_s"].is_null())
        .filter_map(|e| e["episode_id"].as_str().map(String::from))
        .collect()
}

/// What differs between two runs' tables, timings apart: `None` when nothing does. The
/// token counts of episodes told a duration are timings; so are their suites' sums.
pub fn differences(first: &Path, other: &Path) -> Option<String> {
    let timed: BTreeSet<String> = told_a_duration(first).union(&told_a_duration(other)).cloned().collect();
    let mut timed_suites = BTreeSet::new();
    let untimed = |rows: Vec<BTreeMap<String, String>>, suites: &mut BTreeSet<String>| -> Vec<_> {
        rows.into_iter()
            .map(|mut row| {
                if timed.contains(&row["episode_id"]) {
                    suites.insert(row["suite"].clone());
                    row.remove("input_tokens");
                    row.remove("tokens");
                }
                row
            })
            .collect()
    };
    let (a, b) = (untimed(table(first), &mut timed_suites), untimed(table(other), &mut timed_suites));
    if a != b {
        let rows: Vec<String> = a
            .iter()
            .zip(&b)
            .filter(|(x, y)| x != y)
            .map(|(x, y)| {
                let columns: Vec<String> = x
                    .iter()
                    .filter(|(k, v)| y.get(*k) != Some(v))
                    .map(|(k, v)| {
                        format!("{k}: {v} in the first, {} in the other", y.get(k).map_or("-", String::as_str))
                    })
                    .collect();
                format!("{} / {}: {}", x["suite"], x["task_id"], columns.join(", "))
            })
            .collect();
        return Some(format!(
            "episodes.csv: {} rows in the first, {} in the other; {}",
            a.len(),
            b.len(),
            rows.join("; ")
        ));
    }
    let untimed = |mut summary: serde_json::Value| {
        if !timed_suites.is_empty() {
            summary["total"]["tokens"] = 0.into();
        }
        for row in summary["rows"].as_array_mut().into_iter().flatten() {
            if row["suite"].as_str().is_some_and(|s| timed_suites.contains(s)) {
                row["tokens"] = 0.into();
            }
        }
        summary
    };
    let (a, b) = (untimed(summary_without_timings(first)), untimed(summary_without_timings(other)));
    (a != b).then(|| format!("summary.json:\n{a:#}\nthe other:\n{b:#}"))
}

/// A suite whose agent keeps a memory across a task's epochs: the first epoch adds a
/// fact, every later one starts with it in its prompt.
fn remembering(name: &str, tasks: usize) -> String {
    let tasks: String = (0..tasks)
        .map(|i| {
            format!(
                "  - id: t{i}\n    input: q{i}\n    mock:\n      - tool_calls: [{{name: memory, arguments: {{action: add, target: user, content: \"fact {i}\"}}}}]\n      - tool_calls: [{{name: final_answer, arguments: {{answer: ok}}}}]\n"
            )
        })
        .collect();
    format!(
        "suite: {name}\nenvironment: kv\nagent:\n  system: Keep what you learn in memory.\n  require_final_answer: true\n  memory: {{memory_chars: 2200, user_chars: 1375, scope: task}}\nscorers: [{{includes: ok}}]\ntasks:\n{tasks}"
    )
}

/// A suite of `tasks` tasks; those in `wrong` answer wrongly under `--model mock`.
fn answering(name: &str, tasks: usize, wrong: &[usize]) -> String {
    let tasks: String = (0..tasks)
        .map(|i| {
            let answer = if wrong.contains(&i) { "no" } else { "ok" };
            format!("  - {{id: t{i:02}, input: q{i}, mock: [{{tool_calls: [{{name: get, arguments: {{key: k}}}}]}}, {{text: \"{answer}\"}}]}}\n")
        })
        .collect();
    format!("suite: {name}\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}")
}

#[test]
fn a_tasks_epochs_run_in_one_shard_so_its_memory_carries_from_epoch_to_epoch() {
    let sb = Sandbox::new();
    sb.write("recall.yaml", &remembering("recall", 6));
    let differs = merged_differs_from_whole(&sb, &["recall.yaml"], 3, Some(3));
    assert_eq!(differs, None, "an epoch sharded away from its task's first epoch starts with an empty memory");
}

/// Regression: a merge left the shards' kept memory behind, so a merged run resumed ran a
/// task's later epochs from an empty memory (first seen as the Slurm example's resume
/// giving other token counts than one run).
#[test]
fn a_merged_run_resumed_goes_on_from_the_memory_its_shards_kept() {
    let sb = Sandbox::new();
    sb.write("recall.yaml", &remembering("recall", 4));
    let common = run_whole_and_shards(&sb, &["recall.yaml"], 2, Some(3));
    // Shard 1's node was lost right after its first episode finished: its log ends there,
    // its folder (the memory its epochs kept) stays.
    let events = sb.path().join("results/shard-1/events.jsonl");
    crate::memory::cut_after_the_first_finish(&events);
    merge_shards(&sb, 2, &["--allow-partial"]);

    let mut resume: Vec<&str> = common.iter().map(String::as_str).collect();
    resume.extend(["--resume", "merged"]);
    let resumed = sb.run(&resume);
    assert_eq!(resumed.code, 0, "{resumed:?}");
    assert!(resumed.stderr.contains("to run"), "{resumed:?}");
    let merged = sb.path().join("results/merged");
    assert_eq!(differences(&sb.path().join("results/whole"), &merged), None, "the unsharded run, then the resumed one");
}

/// A seeded loop, not a shrinking property tester: each case is a handful of processes.
/// `RUNNER_SHARD_SEED=N` replays one seed's cases.
#[test]
fn merging_the_shards_of_random_suites_gives_the_summary_of_one_run() {
    let seed: u64 = std::env::var("RUNNER_SHARD_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(23);
    let mut rng = fastrand::Rng::with_seed(seed);
    for case in 0..8 {
        let sb = Sandbox::new();
        let mut files = Vec::new();
        let mut described = Vec::new();
        for s in 0..rng.usize(1..=3) {
            let name = format!("s{s}");
            let tasks = rng.usize(1..=9);
            let text = if rng.u8(0..4) == 0 {
                described.push(format!("{name}: {tasks} remembering tasks"));
                remembering(&name, tasks)
            } else {
                let wrong: Vec<usize> = (0..tasks).filter(|_| rng.bool()).collect();
                described.push(format!("{name}: {tasks} tasks, {wrong:?} wrong"));
                answering(&name, tasks, &wrong)
            };
            sb.write(&format!("{name}.yaml"), &text);
            files.push(format!("{name}.yaml"));
        }
        let shards = rng.u64(2..=5);
        let epochs = rng.u32(1..=3);
        let suites: Vec<&str> = files.iter().map(String::as_str).collect();
        if let Some(diff) = merged_differs_from_whole(&sb, &suites, shards, Some(epochs)) {
            panic!(
                "seed {seed}, case {case}: {} in {shards} shards, {epochs} epochs: the merged run differs from one run: {diff}",
                described.join("; ")
            );
        }
    }
}

#[test]
fn a_slurm_array_of_another_size_than_the_shards_is_refused_naming_the_variable() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &answering("s", 3, &[]));
    let run = |id: &str, min: &str, count: &str| {
        let output = sb
            .command()
            .args(["eval", "s.yaml", "--model", "mock", "--shard", "auto/4", "--out", "results", "--run-id", "fourth"])
            .env_remove("JOB_COMPLETION_INDEX")
            .env("SLURM_ARRAY_TASK_ID", id)
            .env("SLURM_ARRAY_TASK_MIN", min)
            .env("SLURM_ARRAY_TASK_STEP", "1")
            .env("SLURM_ARRAY_TASK_COUNT", count)
            .output()
            .expect("run runner");
        crate::Run::from(output)
    };
    let five = run("4", "0", "5");
    assert_eq!(five.code, 2, "{five:?}");
    assert!(five.stderr.contains("$SLURM_ARRAY_TASK_COUNT is 5") && five.stderr.contains("--array=0-3"), "{five:?}");
    assert!(!sb.path().join("results").exists(), "nothing ran");

    // `--array=1-4`: task 4 is the fourth shard.
    let fourth = run("4", "1", "4");
    assert_eq!(fourth.code, 0, "{fourth:?}");
    let events = crate::read_jsonl(&sb.path().join("results/fourth/events.jsonl"));
    assert_eq!(events[0]["shard"], "4/4", "{:?}", events[0]);
}
