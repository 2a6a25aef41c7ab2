//! Whole runs as users handle them: resumed after a crash, sharded and merged, compared,
//! gated on a baseline, reported.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::{Sandbox, of_type, read_jsonl};

/// `n` tasks; those whose index is in `wrong` answer wrongly under `--model mock`.
fn suite(n: usize, wrong: &[usize]) -> String {
    let tasks: String = (0..n)
        .map(|i| {
            let answer = if wrong.contains(&i) { "no" } else { "ok" };
            format!("  - {{id: t{i:03}, input: q{i}, mock: [{{tool_calls: [{{name: get, arguments: {{key: k}}}}]}}, {{text: \"{answer}\"}}]}}\n")
        })
        .collect();
    format!("suite: runs\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}")
}

/// The columns that do not depend on timing or on which run (or process) made the row.
const TIMINGS: [&str; 5] = ["latency_ms", "wall_ms", "started_at", "finished_at", "run_id"];

/// `episodes.csv` without its timing columns, in file order.
pub(crate) fn table(dir: &Path) -> Vec<BTreeMap<String, String>> {
    let mut reader = csv::Reader::from_path(dir.join("episodes.csv")).expect("episodes.csv");
    let headers = reader.headers().expect("header").clone();
    reader
        .records()
        .map(|r| {
            let r = r.expect("a row");
            headers
                .iter()
                .zip(r.iter())
                .filter(|(h, _)| !TIMINGS.contains(h))
                .map(|(h, v)| (h.to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

/// `results/RUN/summary.json`.
fn summary_json(sb: &Sandbox, run: &str) -> serde_json::Value {
    let path = sb.path().join(format!("results/{run}/summary.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

fn finished_count(events: &Path) -> usize {
    std::fs::read_to_string(events).map(|t| t.matches("\"type\":\"episode_finished\"").count()).unwrap_or(0)
}

#[test]
fn a_run_killed_mid_way_resumes_to_the_tables_of_an_uninterrupted_run() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(12, &[3, 7]));
    let common = ["eval", "s.yaml", "--model", "mock", "--epochs", "3", "--out", "results"];
    let whole = sb.run(&[&common[..], &["--run-id", "whole", "-j", "4"]].concat());
    assert_eq!(whole.code, 0, "failures without a gate still exit 0: {whole:?}");

    // The same run, killed with SIGKILL once some episodes have finished.
    let mut child = sb
        .command()
        .args([&common[..], &["--run-id", "crash", "-j", "2", "--mock-delay-ms", "40", "-q"]].concat())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn runner");
    let events = sb.path().join("results/crash/events.jsonl");
    let deadline = Instant::now() + Duration::from_secs(60);
    while finished_count(&events) < 6 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("kill -9");
    child.wait().expect("reap");
    let before = finished_count(&events);
    assert!((6..36).contains(&before), "killed after {before} of 36 episodes");
    // A crash mid-write leaves a torn last line.
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new().append(true).open(&events).unwrap();
    f.write_all(b"{\"v\":1,\"run_id\":\"crash\",\"seq\":99999,\"ts\":\"2026-").unwrap();
    drop(f);

    // Its report says what happened.
    let report = sb.run(&["report", "results/crash"]);
    assert_eq!(report.code, 0, "{report:?}");
    let killed = summary_json(&sb, "crash");
    assert_eq!(killed["interrupted"], true, "a run without run_finished was interrupted");
    if killed["unfinished"].as_u64().unwrap() > 0 {
        assert!(report.stdout.contains("started and never finished"), "{report:?}");
    }
    let resumed = sb.run(&[&common[..], &["--resume", "results/crash", "-j", "4"]].concat());
    assert_eq!(resumed.code, 0, "{resumed:?}");
    assert!(resumed.stderr.contains(&format!("{before} scored episodes kept")), "{resumed:?}");
    // No finished episode was lost or run twice: each kept one finished once.
    let log = read_jsonl(&events);
    let finished = of_type(&log, "episode_finished");
    assert_eq!(finished.len(), 36, "kept {before} + ran the rest");
    let resumed_at = log.iter().position(|e| e["type"] == "run_resumed").expect("a run_resumed event");
    let seqs: Vec<u64> = log.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "event numbers continue across the resume");
    assert!(log[..resumed_at].iter().filter(|e| e["type"] == "episode_finished").count() == before);

    let (a, b) = (table(&sb.path().join("results/whole")), table(&sb.path().join("results/crash")));
    assert_eq!(a.len(), 36);
    assert_eq!(a, b, "the resumed run's table differs from the uninterrupted one");
    let summary = summary_json(&sb, "crash");
    assert_eq!(summary["total"]["episodes"], 36);
    assert_eq!(summary["total"]["failed"], 6);
    assert_eq!(summary["unfinished"], 0);
}

#[test]
fn resume_reruns_unscored_episodes_and_refuses_another_run() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(6, &[]));
    let rec =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--record", "tape.jsonl", "--run-id", "rec", "--out", "results"]);
    assert_eq!(rec.code, 0, "{rec:?}");
    // A cassette that lacks some answers: those episodes go unscored (a provider outage, say).
    let full = std::fs::read_to_string(sb.path().join("tape.jsonl")).unwrap();
    let lines: Vec<&str> = full.lines().collect();
    sb.write("tape.jsonl", &format!("{}\n", lines[..lines.len() - 3].join("\n")));
    let first = sb.run(&["eval", "s.yaml", "--model", "replay:tape.jsonl", "--run-id", "r", "--out", "results"]);
    assert_eq!(first.code, 3, "unscored episodes: {first:?}");
    let before = table(&sb.path().join("results/r"));
    let unscored: Vec<&String> = before.iter().filter(|r| r["outcome"] == "unscored").map(|r| &r["task_id"]).collect();
    assert!(!unscored.is_empty() && unscored.len() < 6, "{before:?}");

    sb.write("tape.jsonl", &full);
    let again = sb.run(&["eval", "s.yaml", "--model", "replay:tape.jsonl", "--resume", "r", "--out", "results"]);
    assert_eq!(again.code, 0, "{again:?}");
    let expected = format!("{} scored episodes kept, {} to run", 6 - unscored.len(), unscored.len());
    assert!(again.stderr.contains(&expected), "{again:?}");
    let log = read_jsonl(&sb.path().join("results/r/events.jsonl"));
    let rerun: Vec<&String> = log
        .iter()
        .skip_while(|e| e["type"] != "run_resumed")
        .filter(|e| e["type"] == "episode_started")
        .map(|e| e["task_id"].as_str().map(String::from).unwrap())
        .collect::<Vec<String>>()
        .iter()
        .filter_map(|t| unscored.iter().find(|u| **u == t).copied())
        .collect();
    assert_eq!(rerun.len(), unscored.len(), "only the unscored ones ran again");
    assert_eq!(table(&sb.path().join("results/r")).iter().filter(|r| r["outcome"] == "passed").count(), 6);

    // Other models, or a suite whose tasks changed, make another run.
    let model =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--model", "ollama/other", "--resume", "r", "--out", "results"]);
    assert_eq!(model.code, 2);
    assert!(model.stderr.contains("resume with the same models"), "{model:?}");
    sb.write("s.yaml", &suite(7, &[]));
    let changed = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "r", "--out", "results"]);
    assert_eq!(changed.code, 2);
    assert!(changed.stderr.contains("changed since") && changed.stderr.contains("s.yaml"), "{changed:?}");
    let missing = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "nope", "--out", "results"]);
    assert_eq!(missing.code, 2);
    assert!(missing.stderr.contains("nope: no run there"), "{missing:?}");
}

#[test]
fn shards_run_as_separate_processes_merge_into_the_unsharded_run() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(20, &[2, 5, 11]));
    let common = ["eval", "s.yaml", "--model", "mock", "--epochs", "2", "--out", "results"];
    let whole = sb.run(&[&common[..], &["--run-id", "whole"]].concat());
    assert_eq!(whole.code, 0, "{whole:?}");
    let shards: Vec<std::process::Child> = (1..=3)
        .map(|i| {
            sb.command()
                .args([&common[..], &["--run-id", &format!("s{i}"), "--shard", &format!("{i}/3"), "-q"]].concat())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn a shard")
        })
        .collect();
    for mut s in shards {
        s.wait().expect("shard");
    }
    let merged = sb.run(&["merge", "results/s1", "results/s2", "results/s3", "--run-id", "merged", "--out", "results"]);
    assert_eq!(merged.code, 0, "{merged:?}");
    assert!(merged.stdout.contains("merged 3 runs, 40 episodes"), "{merged:?}");
    let (a, b) = (table(&sb.path().join("results/whole")), table(&sb.path().join("results/merged")));
    assert_eq!(a.len(), 40);
    assert_eq!(a, b);
    let summary = |run: &str| -> serde_json::Value {
        let mut s = summary_json(&sb, run);
        for row in s["rows"].as_array_mut().unwrap().iter_mut() {
            row["wall_s"] = 0.into();
        }
        s["total"]["wall_s"] = 0.into();
        s["run_id"] = "".into();
        s
    };
    assert_eq!(summary("whole"), summary("merged"));

    // Merging a shard twice, or leaving one out, is caught.
    let twice = sb.run(&["merge", "results/s1", "results/s1", "--run-id", "bad", "--out", "results"]);
    assert_eq!(twice.code, 2);
    assert!(twice.stderr.contains("shards must not overlap"), "{twice:?}");
    let partial = sb.run(&["merge", "results/s1", "results/s2", "--run-id", "partial", "--out", "results"]);
    assert_eq!(partial.code, 2, "a verdict on part of the shards is refused: {partial:?}");
    assert!(
        partial.stderr.contains("shard(s) 3/3 missing") && partial.stderr.contains("--allow-partial"),
        "{partial:?}"
    );
    let allowed =
        sb.run(&["merge", "results/s1", "results/s2", "--run-id", "partial", "--out", "results", "--allow-partial"]);
    assert_eq!(allowed.code, 0, "{allowed:?}");
    assert!(allowed.stderr.contains("warning: shard(s) 3/3 missing"), "{allowed:?}");
}

/// Two versions of the same suite: the tasks are the same, the scripted answers differ.
fn two_versions(sb: &Sandbox, n: usize, wrong_a: &[usize], wrong_b: &[usize]) {
    sb.write("a/s.yaml", &suite(n, wrong_a));
    sb.write("b/s.yaml", &suite(n, wrong_b));
    for v in ["a", "b"] {
        let run = sb.run(&["eval", &format!("{v}/s.yaml"), "--model", "mock", "--run-id", v, "--out", "results"]);
        assert_eq!(run.code, 0, "{run:?}");
    }
}

#[test]
fn compare_counts_flips_and_tests_them_exactly() {
    let sb = Sandbox::new();
    // B fails 12 tasks that pass in A; A fails task 39, which B passes.
    let wrong_b: Vec<usize> = (0..12).collect();
    two_versions(&sb, 40, &[39], &wrong_b);
    let run = sb.run(&["compare", "results/a", "results/b", "--markdown", "cmp.md", "--csv", "cmp.csv"]);
    assert_eq!(run.code, 0, "without --fail-on-regression compare only reports: {run:?}");
    assert!(run.stdout.contains("12 passed in A, failed in B: runs/t000, runs/t001"), "{run:?}");
    assert!(run.stdout.contains("1 failed in A, passed in B: runs/t039\n"), "{run:?}");
    let mut groups = csv::Reader::from_path(sb.path().join("cmp.csv")).unwrap();
    let rows: Vec<csv::StringRecord> = groups.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 2);
    // 39 of 40 and 28 of 40, with the Wilson interval by its formula at z = 1.96.
    let wilson = |k: f64, n: f64| {
        let z: f64 = 1.959963984540054;
        let p = k / n;
        let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
        let half = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / (1.0 + z * z / n);
        (centre - half, centre + half)
    };
    for (row, passed) in rows.iter().zip([39.0, 28.0]) {
        assert_eq!(row[8].parse::<f64>().unwrap(), passed / 40.0);
        let (lo, hi) = wilson(passed, 40.0);
        assert!((row[9].parse::<f64>().unwrap() - lo).abs() < 1e-9, "{row:?} vs {lo}");
        assert!((row[10].parse::<f64>().unwrap() - hi).abs() < 1e-9, "{row:?} vs {hi}");
    }
    let mut pairs = csv::Reader::from_path(sb.path().join("cmp.pairs.csv")).unwrap();
    let pair = pairs.records().next().unwrap().unwrap();
    assert_eq!((&pair[2], &pair[3], &pair[4]), ("40", "12", "1"));
    // Exact McNemar: 2 * P[X <= 1], X ~ Binomial(13, 1/2) = 2 * 14 / 8192.
    let p: f64 = pair[8].parse().unwrap();
    assert!((p - 28.0 / 8192.0).abs() < 1e-12, "McNemar p {p}");
    assert_eq!(pair[7].parse::<f64>().unwrap(), -11.0 / 40.0, "effect B - A");
    let md = std::fs::read_to_string(sb.path().join("cmp.md")).unwrap();
    assert!(md.contains("| a/mock | a | 40 | 40 | 0 | 39 | 97.5% |"), "{md}");
    assert!(md.contains("`runs/t000`"), "{md}");

    let gated = sb.run(&["compare", "results/a", "results/b", "--fail-on-regression"]);
    assert_eq!(gated.code, 1, "{gated:?}");
}

#[test]
fn a_baseline_gate_fails_only_on_a_significant_regression() {
    let sb = Sandbox::new();
    sb.write("base/s.yaml", &suite(40, &[]));
    let base = sb.run(&["eval", "base/s.yaml", "--model", "mock", "--run-id", "baseline", "--out", "results"]);
    assert_eq!(base.code, 0, "{base:?}");
    // One task worse: not significant (p = 1), the gate passes.
    sb.write("s.yaml", &suite(40, &[4]));
    let slight = sb.run(&[
        "eval",
        "s.yaml",
        "--model",
        "mock",
        "--run-id",
        "slight",
        "--out",
        "results",
        "--baseline",
        "results/baseline",
    ]);
    assert_eq!(slight.code, 0, "{slight:?}");
    assert!(
        slight.stderr.contains("1 regressed, 0 improved") && slight.stderr.contains("no significant regression"),
        "{slight:?}"
    );
    // Ten tasks worse: p = 2 / 1024, the gate fails.
    sb.write("s.yaml", &suite(40, &(0..10).collect::<Vec<_>>()));
    let worse = sb.run(&[
        "eval",
        "s.yaml",
        "--model",
        "mock",
        "--run-id",
        "worse",
        "--out",
        "results",
        "--baseline",
        "results/baseline",
    ]);
    assert_eq!(worse.code, 1, "{worse:?}");
    assert!(
        worse.stderr.contains("10 regressed") && worse.stderr.contains("p = 0.0020: significant regression"),
        "{worse:?}"
    );
    // Within the tolerance it passes.
    let tolerated = sb.run(&[
        "eval",
        "s.yaml",
        "--model",
        "mock",
        "--run-id",
        "tolerated",
        "--out",
        "results",
        "--baseline",
        "results/baseline",
        "--tolerance",
        "0.3",
    ]);
    assert_eq!(tolerated.code, 0, "{tolerated:?}");
    let bad = sb.run(&["eval", "s.yaml", "--model", "mock", "--out", "results", "--baseline", "results/none"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("results/none: no run there"), "{bad:?}");
}

#[test]
fn report_rebuilds_the_tables_from_the_log_alone() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(5, &[1]));
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    let dir = sb.path().join("results/test");
    let original = std::fs::read(dir.join("episodes.csv")).unwrap();
    let summary = std::fs::read(dir.join("summary.json")).unwrap();
    for f in ["episodes.csv", "episodes.parquet", "summary.json", "run.json"] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    let report = sb.run(&["report", "results/test"]);
    assert_eq!(report.code, 0, "{report:?}");
    assert_eq!(std::fs::read(dir.join("episodes.csv")).unwrap(), original);
    assert_eq!(std::fs::read(dir.join("summary.json")).unwrap(), summary);
    // The Parquet table holds the same rows as the CSV one.
    use polars::prelude::{ParquetReader, SerReader};
    let df = ParquetReader::new(std::fs::File::open(dir.join("episodes.parquet")).unwrap()).finish().unwrap();
    assert_eq!(df.height(), 5);
    assert_eq!(df.get_column_names().len(), 27, "26 columns, and `variant`");
    let outcome = df.column("outcome").unwrap().str().unwrap().clone();
    let outcomes: Vec<Option<&str>> = (0..df.height()).map(|i| outcome.get(i)).collect();
    let csv_outcomes: Vec<String> = table(&dir).iter().map(|r| r["outcome"].clone()).collect();
    assert_eq!(outcomes.iter().map(|o| o.unwrap().to_owned()).collect::<Vec<_>>(), csv_outcomes);
    assert_eq!(csv_outcomes.iter().filter(|o| *o == "failed").count(), 1);
    let steps = df.column("steps").unwrap().u32().unwrap().clone();
    let steps: Vec<u32> = (0..df.height()).map(|i| steps.get(i).unwrap()).collect();
    assert_eq!(steps, vec![2; 5], "a tool call then the answer");
}

#[test]
fn the_baseline_test_counts_tasks_not_epochs() {
    let sb = Sandbox::new();
    // One task of ten fails in every epoch: across six epochs that is six flipped episodes,
    // but one flipped task — not evidence of a regression.
    sb.write("base/s.yaml", &suite(10, &[]));
    let base = sb.run(&[
        "eval",
        "base/s.yaml",
        "--model",
        "mock",
        "--epochs",
        "6",
        "--run-id",
        "baseline",
        "--out",
        "results",
    ]);
    assert_eq!(base.code, 0, "{base:?}");
    sb.write("s.yaml", &suite(10, &[0]));
    let one = sb.run(&[
        "eval",
        "s.yaml",
        "--model",
        "mock",
        "--epochs",
        "6",
        "--run-id",
        "one",
        "--out",
        "results",
        "--baseline",
        "baseline",
    ]);
    assert_eq!(one.code, 0, "{one:?}");
    assert!(
        one.stderr.contains("10 shared tasks (60 episodes), 1 regressed") && one.stderr.contains("p = 1.0000"),
        "{one:?}"
    );
    let cmp = sb.run(&["compare", "results/baseline", "results/one"]);
    assert!(cmp.stdout.contains("runs/t000 (6/6 → 0/6)"), "{cmp:?}");
}

#[test]
fn a_baseline_that_cannot_judge_a_model_does_not_pass_the_gate() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(4, &[]));
    let empty = sb.write("results/empty/events.jsonl", "");
    assert!(empty.exists());
    let run =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "x", "--out", "results", "--baseline", "empty"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("events.jsonl:1: the log is empty"), "{run:?}");
    // A baseline of other tasks: nothing in common, so no verdict, and no pass.
    sb.write("other.yaml", &suite(4, &[]).replace("id: t", "id: other"));
    assert_eq!(sb.run(&["eval", "other.yaml", "--model", "mock", "--run-id", "other", "--out", "results"]).code, 0);
    let run =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "y", "--out", "results", "--baseline", "other"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("cannot judge mock (no task scored in both)"), "{run:?}");
}

#[test]
fn junit_has_one_case_per_episode_after_a_resume() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(6, &[2]));
    let rec =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--record", "tape.jsonl", "--run-id", "rec", "--out", "results"]);
    assert_eq!(rec.code, 0, "{rec:?}");
    let full = std::fs::read_to_string(sb.path().join("tape.jsonl")).unwrap();
    let lines: Vec<&str> = full.lines().collect();
    sb.write("tape.jsonl", &format!("{}\n", lines[..lines.len() - 4].join("\n")));
    assert_eq!(
        sb.run(&["eval", "s.yaml", "--model", "replay:tape.jsonl", "--run-id", "r", "--out", "results"]).code,
        3
    );
    sb.write("tape.jsonl", &full);
    let again = sb.run(&[
        "eval",
        "s.yaml",
        "--model",
        "replay:tape.jsonl",
        "--resume",
        "r",
        "--out",
        "results",
        "--junit",
        "j.xml",
    ]);
    assert_eq!(again.code, 0, "{again:?}");
    let xml = std::fs::read_to_string(sb.path().join("j.xml")).unwrap();
    assert_eq!(xml.matches("<testcase ").count(), 6, "{xml}");
    assert!(xml.contains(r#"tests="6" failures="1" errors="0""#), "{xml}");
    assert_eq!(xml.matches("<failure ").count(), 1, "{xml}");
    assert!(xml.contains("does not equal"), "the failed scorer explains the failure: {xml}");
    assert!(!xml.contains("<error "), "the unscored first tries are gone: {xml}");
}

#[test]
fn a_regraded_run_is_not_resumed_or_merged() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(3, &[]));
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    assert_eq!(sb.run(&["regrade", "results/test"]).code, 0);
    let resume = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results"]);
    assert_eq!(resume.code, 2);
    assert!(resume.stderr.contains("was regraded (`regrade-1`)"), "{resume:?}");
    assert_eq!(sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "plain", "--out", "results"]).code, 0);
    let merge = sb.run(&["merge", "results/test", "results/plain", "--run-id", "m", "--out", "results"]);
    assert_eq!(merge.code, 2);
    assert!(merge.stderr.contains("was regraded"), "{merge:?}");
}

#[test]
fn one_process_at_a_time_writes_a_run() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(8, &[]));
    let mut first = sb
        .command()
        .args([
            "eval",
            "s.yaml",
            "--model",
            "mock",
            "--run-id",
            "busy",
            "--out",
            "results",
            "-j",
            "1",
            "--mock-delay-ms",
            "300",
            "-q",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let events = sb.path().join("results/busy/events.jsonl");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&events).is_ok_and(|t| t.contains("episode_started")) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "busy", "--out", "results"]);
    let _ = first.kill();
    let _ = first.wait();
    assert_eq!(second.code, 2, "{second:?}");
    assert!(second.stderr.contains("another runner is writing to"), "{second:?}");
}

#[test]
fn compare_gates_each_model_against_the_same_model_of_the_first_run() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(12, &[]));
    assert_eq!(sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "g", "--out", "results"]).code, 0);
    // A second run of the same model, much worse.
    sb.write("s.yaml", &suite(12, &(0..10).collect::<Vec<_>>()));
    assert_eq!(sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "bad", "--out", "results"]).code, 0);
    let gated = sb.run(&["compare", "results/g", "results/bad", "--fail-on-regression"]);
    assert_eq!(gated.code, 1, "{gated:?}");
    let reversed = sb.run(&["compare", "results/bad", "results/g", "--fail-on-regression"]);
    assert_eq!(reversed.code, 0, "an improvement is not a regression: {reversed:?}");
}

#[test]
fn compare_ends_with_one_verdict_sentence_per_gated_pair() {
    let sb = Sandbox::new();
    let wrong_b: Vec<usize> = (0..12).collect();
    two_versions(&sb, 40, &[39], &wrong_b);
    let gated = sb.run(&["compare", "results/a", "results/b", "--fail-on-regression"]);
    assert_eq!(gated.code, 1, "{gated:?}");
    // 39 of 40 against 28 of 40; McNemar on 12 against 1 discordant tasks: p = 28/8192.
    let last = gated.stdout.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        "verdict: b/mock vs a/mock: pass rate -27.5 pts (97.5% -> 70.0%) over 40 shared tasks (12 worse, 1 better), McNemar p = 0.0034; REGRESSED: the drop is beyond the tolerance of 0.0 pts and p < alpha 0.05",
        "{gated:?}"
    );
    let tolerated = sb.run(&["compare", "results/a", "results/b", "--fail-on-regression", "--tolerance", "0.3"]);
    assert_eq!(tolerated.code, 0, "{tolerated:?}");
    assert!(
        tolerated.stdout.trim_end().ends_with("no regression: the change is within the tolerance of 30.0 pts"),
        "{tolerated:?}"
    );
    let strict = sb.run(&["compare", "results/a", "results/b", "--fail-on-regression", "--alpha", "0.001"]);
    assert_eq!(strict.code, 0, "{strict:?}");
    assert!(strict.stdout.trim_end().ends_with("no significant regression: p >= alpha 0.001"), "{strict:?}");
}

#[test]
fn a_run_cut_after_any_event_resumes_with_the_next_number() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(4, &[1]));
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    let events = sb.path().join("results/test/events.jsonl");
    let text = std::fs::read_to_string(&events).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // Cut after the last observation: the log ends on an event the table does not read.
    let last = lines.iter().rposition(|l| l.contains("\"type\":\"observation\"")).unwrap();
    std::fs::write(&events, format!("{}\n", lines[..=last].join("\n"))).unwrap();
    let again = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results"]);
    assert_eq!(again.code, 0, "{again:?}");
    let seqs: Vec<u64> = read_jsonl(&events).iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "numbers repeat or skip: {seqs:?}");
}

#[test]
fn the_lock_is_held_while_a_resume_reads_its_plan() {
    use std::os::fd::AsRawFd as _;
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(3, &[]));
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    // Another process (this test) holds the run's lock.
    let lock = std::fs::File::options().write(true).open(sb.path().join("results/test/.lock")).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    let resume = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results"]);
    assert_eq!(resume.code, 2, "{resume:?}");
    assert!(resume.stderr.contains("another runner is writing to"), "{resume:?}");
    let regrade = sb.run(&["regrade", "results/test"]);
    assert_eq!(regrade.code, 2, "{regrade:?}");
    drop(lock);
    let resume = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results"]);
    assert_eq!(resume.code, 0, "{resume:?}");
}

#[test]
fn compare_refuses_to_gate_runs_with_nothing_in_common() {
    let sb = Sandbox::new();
    sb.write("a.yaml", &suite(3, &[]));
    sb.write("b.yaml", &suite(3, &[]).replace("id: t", "id: other"));
    for (file, id) in [("a.yaml", "a"), ("b.yaml", "b")] {
        assert_eq!(sb.run(&["eval", file, "--model", "mock", "--run-id", id, "--out", "results"]).code, 0);
    }
    assert_eq!(sb.run(&["compare", "results/a", "results/b"]).code, 0, "showing is fine");
    let gated = sb.run(&["compare", "results/a", "results/b", "--fail-on-regression"]);
    assert_eq!(gated.code, 2, "{gated:?}");
    assert!(gated.stderr.contains("cannot judge"), "{gated:?}");
}

#[test]
fn a_run_id_that_is_a_path_is_refused_before_anything_runs() {
    let sb = Sandbox::new();
    sb.write("s.yaml", "suite: r\nenvironment: kv\ntasks:\n  - {id: t, input: hi, mock: [{text: hi}]}\n");
    for id in ["../x", "1/2"] {
        let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", id, "--out", "results"]);
        assert_eq!(run.code, 2, "{run:?}");
        assert!(run.stderr.contains("--run-id") && run.stderr.contains("one folder under --out"), "{run:?}");
        assert!(!sb.path().join("x").exists() && !sb.path().join("results").exists(), "nothing was made");
    }
}

/// Regression: a regrade gathered an episode's trajectory from every attempt in the log, so
/// the calls of an attempt killed before it finished counted again in the one that did.
#[test]
fn a_regrade_reads_only_the_attempt_that_finished() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: r\nenvironment: kv\nscorers: [{equals: ok}, {max_tool_errors: 1}]\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls: [{name: nope, arguments: {}}]\n      - tool_calls: [{name: final_answer, arguments: {answer: ok}}]\n",
    );
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    // The log as a killed attempt and a resumed one leave it: the attempt's first events
    // (its failed call included) come twice, the first time without a finish.
    let path = sb.path().join("results/test/events.jsonl");
    let log = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    let at = |kind: &str| lines.iter().position(|l| l.contains(&format!("\"type\":\"{kind}\""))).unwrap();
    let (started, finished) = (at("episode_started"), at("episode_finished"));
    let killed = &lines[started..finished];
    assert!(killed.iter().any(|l| l.contains("ToolNotFound")), "{killed:?}");
    let mut twice: Vec<&str> = lines[..started].to_vec();
    twice.extend_from_slice(killed);
    twice.extend_from_slice(&lines[started..]);
    let renumbered: Vec<String> = twice
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut e: serde_json::Value = serde_json::from_str(l).unwrap();
            e["seq"] = (i as u64 + 1).into();
            e.to_string()
        })
        .collect();
    std::fs::write(&path, renumbered.join("\n") + "\n").unwrap();

    let regrade = sb.run(&["regrade", "results/test"]);
    assert_eq!(regrade.code, 0, "{regrade:?}");
    let events = sb.events();
    let rescored = of_type(&events, "score");
    let budget: Vec<_> =
        rescored.iter().filter(|e| e["scoring_id"] == "regrade-1" && e["scorer"] == "max_tool_errors").collect();
    assert_eq!(budget.len(), 1, "{rescored:?}");
    assert_eq!(budget[0]["passed"], true, "one tool error in the attempt that finished: {}", budget[0]);
}
