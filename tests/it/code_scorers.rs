//! Code scorers (`python:`, `js:`) in long-lived workers: a verdict, an exception that
//! leaves the episode unscored, a timeout, a crash and the worker started again, a value
//! that is no verdict, and the sandbox that keeps a worker to the episode's files.

use serde_json::Value;

use crate::{Sandbox, have_python, of_type};

/// A task that writes `out.txt` and answers `answer`.
fn task(id: &str, answer: &str) -> String {
    format!(
        "  - id: {id}\n    input: Write hello.\n    target: hello\n    mock:\n      - tool_calls: [{{name: write_file, \
         arguments: {{path: out.txt, content: \"hello\\n\"}}}}]\n      - text: {answer}\n"
    )
}

/// The outcome of each task's episode, by task id.
fn outcomes(events: &[Value]) -> std::collections::BTreeMap<String, Value> {
    let started = of_type(events, "episode_started");
    of_type(events, "episode_finished")
        .into_iter()
        .map(|f| {
            let task = started.iter().find(|s| s["episode_id"] == f["episode_id"]).map(|s| &s["task_id"]);
            (task.and_then(Value::as_str).unwrap_or_default().to_owned(), f["outcome"].clone())
        })
        .collect()
}

const PYTHON_SCORER: &str = r#"
import os, time
calls = 0

def score(output, context):
    global calls
    calls += 1
    task = context["task"]["id"]
    if task == "raises":
        raise ValueError("no verdict for " + task)
    if task == "slow":
        time.sleep(30)
    if task == "crashes":
        os._exit(3)
    if task == "odd":
        return "maybe"
    if task == "peeks":
        return open(os.environ.get("SECRET", "SECRET_PATH")).read() == ""
    wrote = context["files"]["out.txt"]
    return {"pass": output == context["answer"] and wrote == "hello\n", "score": 1 if output == "hello" else 0,
            "reason": "call %d, %d tool call(s), out.txt %r" % (calls, len(context["trajectory"]), wrote)}
"#;

const JS_SCORER: &str = r#"
let calls = 0;
async function score(output, context) {
  calls += 1;
  const task = context.task.id;
  if (task === "raises") throw new Error("no verdict for " + task);
  if (task === "slow") await new Promise((r) => setTimeout(r, 30000));
  if (task === "crashes") process.exit(3);
  if (task === "odd") return "maybe";
  if (task === "peeks") return require("fs").readFileSync("SECRET_PATH", "utf8") === "";
  const wrote = context.files["out.txt"];
  return { pass: output === context.answer && wrote === "hello\n", score: output === "hello" ? 1 : 0,
           reason: `call ${calls}, ${context.trajectory.length} tool call(s), out.txt ${JSON.stringify(wrote)}` };
}
module.exports = { score };
"#;

/// Runs the scorer `file` (of `language`) over one task of each kind, one episode at a
/// time, and checks every outcome.
fn scores_each_case(language: &str, file: &str, scorer: &str) {
    let sb = Sandbox::new();
    let secret = sb.write("secret.txt", "not for scorers\n");
    sb.write(&format!("tasks/{file}"), &scorer.replace("SECRET_PATH", &secret.to_string_lossy()));
    let mut suite = format!(
        "suite: code\nenvironment: shell\nscorers:\n  - {language}: {file}:score\n    timeout_s: 2\n  - {language}: \
         \"output.length >= 0\"\n    weight: 0\ntasks:\n"
    )
    .replace(
        "output.length >= 0",
        if language == "python" { "len(output) >= 0 and len(trajectory) == 2" } else { "output.length >= 0" },
    );
    for (id, answer) in
        [("passes", "hello"), ("fails", "bye"), ("raises", "hello"), ("slow", "hello"), ("crashes", "hello")]
            .into_iter()
            .chain([("after", "hello"), ("odd", "hello"), ("peeks", "hello")])
    {
        suite.push_str(&task(id, answer));
    }
    sb.write("tasks/code.yaml", &suite);
    let run =
        sb.run(&["eval", "tasks/code.yaml", "--model", "mock", "--run-id", "test", "--out", "results", "-j", "1"]);
    let events = sb.events();
    let outcome = outcomes(&events);
    let scores = of_type(&events, "score");
    let explanation = |task: &str| {
        let id = of_type(&events, "episode_started").into_iter().find(|s| s["task_id"] == task).unwrap()["episode_id"]
            .clone();
        scores.iter().find(|s| s["episode_id"] == id && s["weight"] == 1.0).map(|s| s["explanation"].clone())
    };
    let passes = &outcome["passes"];
    assert_eq!((passes["status"].as_str(), passes["passed"].as_bool()), (Some("scored"), Some(true)), "{run:?}");
    let said = explanation("passes").unwrap();
    assert!(
        said.as_str().unwrap().contains(r#"call 1, 2 tool call(s), out.txt "hello\n""#)
            || said.as_str().unwrap().contains(r#"call 1, 2 tool call(s), out.txt 'hello\n'"#),
        "{said}"
    );
    assert_eq!(outcome["fails"]["passed"], false, "{}", outcome["fails"]);
    let second = explanation("fails").unwrap();
    assert!(second.as_str().unwrap().contains("call 2,"), "the same worker served the second episode: {second}");
    let unscored = |task: &str, says: &str| {
        let o = &outcome[task];
        assert_eq!(
            (o["status"].as_str(), o["cause"].as_str()),
            (Some("unscored"), Some("scorer_error")),
            "{task}: {o}"
        );
        let message = o["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{task}: `{says}` not in {message}");
    };
    unscored("raises", "no verdict for raises");
    unscored("slow", "did not answer within 2s");
    unscored("crashes", "the worker crashed");
    let after = &outcome["after"];
    assert_eq!(after["passed"], true, "a new worker serves the call after a crash: {after}");
    assert!(explanation("after").unwrap().as_str().unwrap().contains("call 1,"), "a fresh worker counts from 1");
    unscored("odd", r#"returned "\"maybe\"", not a bool, a number or {pass, score, reason}"#);
    unscored("peeks", "ermission denied");
}

#[test]
fn python_scorers_run_in_a_worker_that_outlives_episodes_and_is_restarted_after_a_crash() {
    if !have_python() {
        return;
    }
    scores_each_case("python", "check.py", PYTHON_SCORER);
}

#[test]
fn js_scorers_run_in_a_worker_that_outlives_episodes_and_is_restarted_after_a_crash() {
    let node =
        std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("node").is_file()));
    if !node {
        eprintln!("skipped: no node on PATH");
        return;
    }
    scores_each_case("js", "check.js", JS_SCORER);
}

#[test]
fn a_scorer_file_that_fails_to_load_leaves_each_episode_unscored_with_its_traceback() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    sb.write(
        "broken.py",
        "import json\n\ndef score(output, context):\n    return True\n\nraise RuntimeError('half written')\n",
    );
    sb.write(
        "s.yaml",
        "suite: s\nenvironment: kv\nscorers:\n  - python: broken.py:score\ntasks:\n  - {id: a, input: hi, mock: [{text: hi}]}\n  - {id: b, input: hi, mock: [{text: hi}]}\n",
    );
    let run = sb.eval(&["s.yaml"]);
    let events = sb.events();
    for (task, o) in outcomes(&events) {
        assert_eq!(o["cause"], "scorer_error", "{task}: {o} {run:?}");
        assert!(o["message"].as_str().unwrap_or_default().contains("RuntimeError: half written"), "{o}");
    }
}

#[test]
fn a_python_scorer_written_async_is_awaited() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    sb.write(
        "check.py",
        "import asyncio\n\nasync def score(output, context):\n    await asyncio.sleep(0)\n    return output == 'hi'\n",
    );
    sb.write(
        "s.yaml",
        "suite: s\nenvironment: kv\nscorers:\n  - python: check.py:score\ntasks:\n  - {id: a, input: hi, mock: [{text: hi}]}\n  - {id: b, input: hi, mock: [{text: no}]}\n",
    );
    let run = sb.eval(&["s.yaml"]);
    let outcomes = outcomes(&sb.events());
    assert_eq!(outcomes["a"]["passed"], true, "{outcomes:?} {run:?}");
    assert_eq!(outcomes["b"]["passed"], false, "{outcomes:?} {run:?}");
}

#[test]
fn a_js_scorer_written_async_is_awaited_and_a_long_request_is_read_whole() {
    if !have_node() {
        return;
    }
    let sb = Sandbox::new();
    sb.write(
        "check.mjs",
        "export async function score(output, context) {\n  await new Promise((done) => setTimeout(done, 1));\n  \
         return output === 'hi' && context.task.input.length === 200000;\n}\n",
    );
    // A request of over 200 KB arrives in several reads of the worker's pipe.
    let long = "x".repeat(200_000);
    sb.write(
        "s.yaml",
        &format!(
            "suite: s\nenvironment: kv\nscorers:\n  - js: check.mjs:score\ntasks:\n  - {{id: a, input: {long}, mock: [{{text: hi}}]}}\n  - {{id: b, input: {long}, mock: [{{text: no}}]}}\n  - {{id: c, input: short, mock: [{{text: hi}}]}}\n"
        ),
    );
    let run = sb.eval(&["s.yaml"]);
    let outcomes = outcomes(&sb.events());
    assert_eq!(outcomes["a"]["passed"], true, "{outcomes:?} {run:?}");
    assert_eq!(outcomes["b"]["passed"], false, "{outcomes:?} {run:?}");
    assert_eq!(outcomes["c"]["passed"], false, "{outcomes:?} {run:?}");
}

/// Whether a `node` is on PATH; says so when a test is skipped for want of one.
fn have_node() -> bool {
    let found =
        std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("node").is_file()));
    if !found {
        eprintln!("skipped: no node on PATH");
    }
    found
}

/// Runs one scorer over episodes whose model, about to fail, plants something other than
/// a file at `out.txt`; each must be failed (the file is missing), never unscored.
fn planted_files_are_missing(language: &str, scorer: &str) {
    let sb = Sandbox::new();
    let plants = [
        ("fifo", "mkfifo out.txt"),
        ("zero", "ln -s /dev/zero out.txt"),
        ("sparse", "truncate -s 900M out.txt"),
        ("linked", "echo hello > real.txt && ln -s real.txt out.txt"),
        ("folder", "mkdir -p out.txt"),
        ("deep", "mkdir -p d && ln -s /dev d/dev"),
    ];
    let mut suite = format!(
        "suite: planted\nenvironment: shell\nscorers:\n  - {language}: \"{scorer}\"\n    timeout_s: 5\ntasks:\n"
    );
    for (id, command) in plants {
        suite.push_str(&format!(
            "  - id: {id}\n    input: Write hello.\n    mock:\n      - tool_calls: [{{name: run_command, arguments: \
             {{command: \"{command}\"}}}}]\n      - text: done\n"
        ));
    }
    sb.write("s.yaml", &suite);
    let run = sb.eval(&["s.yaml"]);
    let outcomes = outcomes(&sb.events());
    assert_eq!(outcomes.len(), plants.len(), "{run:?}");
    let wrong: Vec<String> = outcomes
        .iter()
        .filter(|(_, o)| (o["status"].as_str(), o["passed"].as_bool()) != (Some("scored"), Some(false)))
        .map(|(task, o)| format!("{task}: {o}"))
        .collect();
    assert!(wrong.is_empty(), "not failed:\n{}", wrong.join("\n"));
}

#[test]
fn a_python_scorer_takes_a_planted_pipe_device_link_or_huge_file_as_missing() {
    if !have_python() {
        return;
    }
    let scorer = "files.get('out.txt') == 'hello\\\\n' or 'out.txt' in files or files.get('d/dev/zero') is not None";
    planted_files_are_missing("python", scorer);
}

#[test]
fn a_js_scorer_takes_a_planted_pipe_device_link_or_huge_file_as_missing() {
    if !have_node() {
        return;
    }
    let scorer = "files['out.txt'] === 'hello\\\\n' || 'out.txt' in files || files['d/dev/zero'] !== undefined";
    planted_files_are_missing("js", scorer);
}
