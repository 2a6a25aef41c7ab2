//! `runner eval --since RUN`: each episode reused, regraded or run again by what changed
//! since RUN, and the new run equal to a run of everything (timings aside); the plan of
//! `--dry-run`; an earlier run that cannot give what is asked of it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::shards::differences;
use crate::{Run, Sandbox, of_type, read_jsonl};

/// One task of the suite: its id, input, the answer its mock script gives, and its own
/// scorers (YAML flow, or empty).
fn task(id: &str, input: &str, answer: &str, scorers: &str) -> String {
    let scorers = if scorers.is_empty() { String::new() } else { format!(", scorers: {scorers}") };
    format!(
        "  - {{id: {id}, input: {input}, mock: [{{tool_calls: [{{name: get, arguments: {{key: k}}}}]}}, {{text: \"{answer}\"}}]{scorers}}}\n"
    )
}

fn suite(name: &str, tasks: &[String]) -> String {
    format!("suite: {name}\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{}", tasks.concat())
}

/// The nightly suite: six tasks, `t2` answering wrongly.
fn nightly() -> Vec<String> {
    (0..6).map(|i| task(&format!("t{i}"), &format!("q{i}"), if i == 2 { "no" } else { "ok" }, "")).collect()
}

/// Today's: `t0`'s input changed (run again), `t1` scored by one more scorer that it fails
/// (regraded), `t3`'s script changed (run again), `t6` new (run again); the rest as they were.
fn today() -> Vec<String> {
    let mut tasks = nightly();
    tasks[0] = task("t0", "q0 again", "ok", "");
    tasks[1] = task("t1", "q1", "ok", "[{includes: nope}]");
    tasks[3] = task("t3", "q3", "okay", "");
    tasks.push(task("t6", "q6", "ok", ""));
    tasks
}

fn eval(sb: &Sandbox, extra: &[&str]) -> Run {
    let args: Vec<&str> = ["eval", "s.yaml", "--model", "mock", "--out", "results", "-q"]
        .iter()
        .copied()
        .chain(extra.iter().copied())
        .collect();
    sb.run(&args)
}

/// The events of `results/RUN`.
fn events(sb: &Sandbox, run: &str) -> Vec<serde_json::Value> {
    read_jsonl(&sb.path().join(format!("results/{run}/events.jsonl")))
}

/// By episode: how it was carried (`reuse` or `regrade`) and from which episode.
fn carried(events: &[serde_json::Value]) -> BTreeMap<String, (String, String)> {
    of_type(events, "episode_carried")
        .iter()
        .map(|e| {
            let id = e["episode_id"].as_str().unwrap_or_default().to_owned();
            let plan = e["plan"].as_str().unwrap_or_default().to_owned();
            (id, (plan, e["from_episode"].as_str().unwrap_or_default().to_owned()))
        })
        .collect()
}

/// Task id by episode id.
fn tasks_of(events: &[serde_json::Value]) -> BTreeMap<String, String> {
    of_type(events, "episode_started")
        .iter()
        .map(|e| (e["episode_id"].as_str().unwrap().to_owned(), e["task_id"].as_str().unwrap().to_owned()))
        .collect()
}

/// The agent's model calls of each episode, as the log has them (without the line's header).
fn agent_calls(events: &[serde_json::Value]) -> BTreeMap<String, Vec<serde_json::Value>> {
    let mut calls: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
    for e in of_type(events, "model_call").into_iter().filter(|e| e["scorer"].is_null()) {
        let mut body = e.clone();
        for key in ["v", "run_id", "seq", "episode_id"] {
            body.as_object_mut().unwrap().remove(key);
        }
        calls.entry(e["episode_id"].as_str().unwrap().to_owned()).or_default().push(body);
    }
    calls
}

#[test]
fn since_reuses_regrades_and_reruns_each_episode_by_what_changed() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("night", &nightly()));
    assert_eq!(eval(&sb, &["--run-id", "nightly"]).code, 0);
    sb.write("s.yaml", &suite("night", &today()));

    // The plan alone: nothing is made.
    let plan = eval(&sb, &["--since", "results/nightly", "--dry-run"]);
    assert_eq!(plan.code, 0, "{plan:?}");
    assert!(plan.stdout.contains("3 reused, 1 regraded, 3 to run again"), "{plan:?}");
    for line in [
        "reuse   night/t2 mock epoch 1: unchanged",
        "regrade night/t1 mock epoch 1: the scorers changed",
        "rerun   night/t0 mock epoch 1: the task's input, files or user changed",
        "rerun   night/t3 mock epoch 1: the model, its sampling or its mock script changed",
        "rerun   night/t6 mock epoch 1: not in nightly",
    ] {
        assert!(plan.stdout.contains(line), "`{line}` missing from:\n{}", plan.stdout);
    }
    let made: BTreeSet<String> = std::fs::read_dir(sb.path().join("results"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(made, BTreeSet::from(["nightly".to_owned()]), "a dry run makes no run");

    let run = eval(&sb, &["--since", "results/nightly", "--run-id", "since"]);
    assert_eq!(run.code, 0, "{run:?}");
    let full = eval(&sb, &["--run-id", "full"]);
    assert_eq!(full.code, 0, "{full:?}");
    let root = sb.path().join("results");
    assert_eq!(differences(&root.join("since"), &root.join("full")), None, "the run equals a run of everything");

    // run.json records the plan.
    let run_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("since/run.json")).unwrap()).unwrap();
    let since = &run_json["since"];
    assert_eq!(
        (since["reuse"].as_u64(), since["regrade"].as_u64(), since["rerun"].as_u64()),
        (Some(3), Some(1), Some(3))
    );
    assert_eq!(since["run_id"], "nightly");

    // The carried episodes are marked, and what their agent said is the nightly's, not asked again.
    let (before, after) = (events(&sb, "nightly"), events(&sb, "since"));
    let tasks = tasks_of(&after);
    let marked: BTreeMap<String, String> =
        carried(&after).iter().map(|(id, (plan, _))| (tasks[id].clone(), plan.clone())).collect();
    let expected: BTreeMap<String, String> = [("t1", "regrade"), ("t2", "reuse"), ("t4", "reuse"), ("t5", "reuse")]
        .map(|(t, p)| (t.into(), p.into()))
        .into();
    assert_eq!(marked, expected);
    let (calls_before, calls_after) = (agent_calls(&before), agent_calls(&after));
    for (id, (_, from)) in carried(&after) {
        assert_eq!(calls_after.get(&id), calls_before.get(&from), "episode {id} ({}) carried its calls", tasks[&id]);
    }
    let ran: BTreeSet<&String> =
        tasks.iter().filter(|(id, _)| !carried(&after).contains_key(*id)).map(|(_, t)| t).collect();
    assert_eq!(ran, BTreeSet::from([&"t0".to_owned(), &"t3".to_owned(), &"t6".to_owned()]));
    // The regraded episode failed the scorer it was given: scored again, not copied.
    let regraded = of_type(&after, "score").into_iter().filter(|s| s["scorer"] == "includes").count();
    assert_eq!(regraded, 1);

    // The new run stands on its own: a later --since of it finds nothing changed, and it
    // reports and compares like any run.
    let again = eval(&sb, &["--since", "results/since", "--run-id", "again"]);
    assert!(again.stdout.contains("7 reused, 0 regraded, 0 to run again"), "{again:?}");
    let markers = of_type(&events(&sb, "again"), "episode_carried").into_iter().cloned().collect::<Vec<_>>();
    assert_eq!(markers.len(), 7, "one mark an episode, naming the run it came from: {markers:?}");
    assert!(markers.iter().all(|m| m["from_run"] == "since"), "{markers:?}");
    assert_eq!(differences(&root.join("again"), &root.join("full")), None);
    let compare = sb.run(&["compare", "results/full", "results/since"]);
    assert_eq!(compare.code, 0, "{compare:?}");
    assert!(compare.stdout.contains("over 7 shared tasks (0 worse, 0 better)"), "{compare:?}");
    let report = sb.run(&["report", "results/since"]);
    assert_eq!(report.code, 0, "{report:?}");
    let export = sb.run(&["export", "results/since", "--format", "sharegpt"]);
    assert_eq!(export.code, 0, "{export:?}");
}

#[test]
fn a_cut_log_gives_what_it_finished_and_the_rest_runs_again() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("night", &nightly()));
    assert_eq!(eval(&sb, &["--run-id", "nightly", "-j", "1"]).code, 0);
    // Cut in the middle of the fourth episode, inside a line.
    let path = sb.path().join("results/nightly/events.jsonl");
    let log = std::fs::read_to_string(&path).unwrap();
    let starts: Vec<usize> = log.match_indices("\"type\":\"episode_started\"").map(|(i, _)| i).collect();
    let cut = starts[3] + log[starts[3]..].find('\n').unwrap() + 1 + 50;
    std::fs::write(&path, &log[..cut]).unwrap();

    let plan = eval(&sb, &["--since", "results/nightly", "--dry-run"]);
    assert_eq!(plan.code, 0, "{plan:?}");
    assert!(plan.stdout.contains("3 reused, 0 regraded, 3 to run again"), "{plan:?}");
    assert!(plan.stdout.contains("did not finish in nightly"), "{plan:?}");
    assert!(
        plan.stderr.contains("ends before the run finished")
            && plan.stderr.contains("the 3 episode(s) it finished can still be reused"),
        "{plan:?}"
    );
    assert_eq!(eval(&sb, &["--since", "results/nightly", "--run-id", "since"]).code, 0);
    assert_eq!(eval(&sb, &["--run-id", "full"]).code, 0);
    let root = sb.path().join("results");
    assert_eq!(differences(&root.join("since"), &root.join("full")), None);
}

#[test]
fn an_earlier_run_that_cannot_be_reused_is_refused_with_why() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("night", &nightly()));
    assert_eq!(eval(&sb, &["--run-id", "nightly"]).code, 0);

    // Another suite set.
    sb.write("other.yaml", &suite("other", &nightly()));
    let other = sb.run(&["eval", "other.yaml", "--model", "mock", "--out", "results", "--since", "results/nightly"]);
    assert_eq!(other.code, 2, "{other:?}");
    assert!(
        other.stderr.contains("ran the suite(s) night, and this run's are other: no episode of it can be reused"),
        "{other:?}"
    );

    // A log of another format.
    let path = sb.path().join("results/nightly/events.jsonl");
    let log = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, log.replacen("{\"v\":1,", "{\"v\":2,", 1)).unwrap();
    let newer = eval(&sb, &["--since", "results/nightly"]);
    assert_eq!(newer.code, 2, "{newer:?}");
    assert!(
        newer.stderr.contains("events.jsonl:1: the log is in format 2, and this runner reads format 1"),
        "{newer:?}"
    );
    assert!(newer.stderr.contains("nothing of it can be reused"), "{newer:?}");

    // Not a run, and --dry-run alone.
    let missing = eval(&sb, &["--since", "results/none"]);
    assert_eq!(missing.code, 2, "{missing:?}");
    assert!(missing.stderr.contains("no run there"), "{missing:?}");
    let alone = eval(&sb, &["--dry-run"]);
    assert_eq!(alone.code, 2, "{alone:?}");
    assert!(!Path::new(&sb.path().join("results/none")).exists());
}

#[test]
fn a_suite_of_the_earlier_run_and_a_new_one_plan_together() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("night", &nightly()));
    assert_eq!(eval(&sb, &["--run-id", "nightly"]).code, 0);
    sb.write("new.yaml", &suite("fresh", &nightly()[..2]));
    let both = sb.run(&[
        "eval",
        "s.yaml",
        "new.yaml",
        "--model",
        "mock",
        "--out",
        "results",
        "--since",
        "results/nightly",
        "--dry-run",
    ]);
    assert_eq!(both.code, 0, "{both:?}");
    assert!(both.stdout.contains("6 reused, 0 regraded, 2 to run again"), "{both:?}");
    assert!(both.stderr.contains("suite `fresh` was not part of"), "{both:?}");
}

/// Two tasks judged by a `mock` grader, each with its own rubric and verdict.
fn graded(rubrics: [(&str, u32); 2]) -> String {
    let tasks: String = rubrics
        .iter()
        .enumerate()
        .map(|(i, (rubric, score))| {
            let verdict = format!("\"Judged.\\n{{\\\"score\\\": {score}}}\"");
            format!("  - id: g{i}\n    input: say ok\n    mock: [{{text: ok}}]\n    scorers:\n      - llm_rubric: {rubric}\n        mock: [{verdict}]\n")
        })
        .collect();
    format!("suite: graded\nenvironment: kv\ngrader: {{model: mock}}\ntasks:\n{tasks}")
}

#[test]
fn a_regrade_recalls_the_graders_answer_to_a_request_it_asks_again() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &graded([("The answer is ok.", 1), ("The answer is ok.", 1)]));
    assert_eq!(eval(&sb, &["--run-id", "nightly"]).code, 0);
    // Both scorers change (their scripted verdicts); only g1's request to the grader does.
    sb.write("s.yaml", &graded([("The answer is ok.", 0), ("The answer says ok.", 0)]));
    let run = eval(&sb, &["--since", "results/nightly", "--run-id", "since"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("0 reused, 2 regraded, 0 to run again"), "{run:?}");

    let events = events(&sb, "since");
    let tasks = tasks_of(&events);
    let outcome = |task: &str| {
        let finished = of_type(&events, "episode_finished");
        let f = finished.iter().find(|f| tasks[f["episode_id"].as_str().unwrap()] == task).unwrap();
        f["outcome"]["passed"].clone()
    };
    let recalled = |task: &str| {
        let calls = of_type(&events, "model_call");
        let graded: Vec<bool> = calls
            .iter()
            .filter(|c| c["scorer"] == "llm_rubric" && tasks[c["episode_id"].as_str().unwrap()] == task)
            .map(|c| c["cache_hit"].as_bool().unwrap())
            .collect();
        graded
    };
    // g0 asked the grader what it asked the night before: the night's verdict, recalled.
    assert_eq!((outcome("g0"), recalled("g0")), (serde_json::json!(true), vec![true]));
    // g1 asked something else: the grader (its new script) answered.
    assert_eq!((outcome("g1"), recalled("g1")), (serde_json::json!(false), vec![false]));
}

/// Tags are no part of a task's digest: an episode reused after its task's tags changed is
/// logged with the tags it has now.
#[test]
fn a_reused_episode_is_logged_with_its_tasks_tags_now() {
    let sb = Sandbox::new();
    let tagged = |tags: &str| {
        format!(
            "suite: night\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n  - {{id: t0, input: q, tags: {tags}, metadata: {{n: 1}}, mock: [{{text: ok}}]}}\n"
        )
    };
    sb.write("s.yaml", &tagged("[old]"));
    assert_eq!(eval(&sb, &["--run-id", "nightly"]).code, 0);
    sb.write("s.yaml", &tagged("[new, fast]"));
    let run = eval(&sb, &["--since", "results/nightly", "--run-id", "since"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = read_jsonl(&sb.path().join("results/since/events.jsonl"));
    assert_eq!(of_type(&events, "episode_carried").len(), 1, "the episode is reused");
    let started = of_type(&events, "episode_started");
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["tags"], serde_json::json!(["new", "fast"]));
    assert_eq!(started[0]["metadata"], serde_json::json!({"n": 1}));
}
