//! `runner eval` and `runner validate` on the example suites and on small suites.

use crate::{Sandbox, of_type, tool_observations};
use std::path::Path;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn example_suites() -> Vec<String> {
    let mut suites: Vec<String> = std::fs::read_dir(repo().join("tasks"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| p.display().to_string())
        .collect();
    suites.sort();
    suites
}

#[test]
fn the_example_suites_pass_offline_with_the_mock_model() {
    let sb = Sandbox::new();
    let suites = example_suites();
    assert!(suites.len() >= 3, "expected the example suites, found {suites:?}");
    let mut args: Vec<&str> = vec!["eval"];
    args.extend(suites.iter().map(String::as_str));
    args.extend(["--model", "mock", "--run-id", "test"]);
    let run =
        sb.command().current_dir(repo()).args(&args).arg("--out").arg(sb.path().join("results")).output().unwrap();
    let run = crate::Run::from(run);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("results:"), "{run:?}");
    let events = sb.events();
    let started = of_type(&events, "episode_started");
    let finished = of_type(&events, "episode_finished");
    assert_eq!(started.len(), finished.len());
    assert!(finished.len() >= 10, "{} episodes", finished.len());
    for f in &finished {
        assert_eq!(f["outcome"]["status"], "scored", "{f}");
        assert_eq!(f["outcome"]["passed"], true, "{f}");
    }
    // The features the examples are there to show.
    let dispatched = of_type(&events, "action_dispatched");
    let mut per_turn = std::collections::HashMap::new();
    for d in &dispatched {
        *per_turn.entry((d["episode_id"].as_str().unwrap(), d["step"].as_u64().unwrap())).or_insert(0) += 1;
    }
    assert!(per_turn.values().any(|n| *n >= 3), "no turn with parallel tool calls");
    let errors: Vec<_> = crate::tool_observations(&events).into_iter().filter(|o| !o["error"].is_null()).collect();
    assert!(errors.iter().any(|o| o["error"]["type"] == "ValidationError"));
    assert!(errors.iter().any(|o| o["error"]["type"] == "ExecutionError"));
    assert!(errors.iter().any(|o| o["error"]["type"] == "PermissionError"), "no call was denied");
    assert!(of_type(&events, "permission").iter().any(|p| p["decided_by"] == "user"), "no user answered an ask");
    assert!(dispatched.iter().any(|d| d["call"]["name"] == "restore"), "no checkpoint was restored");
    assert!(!of_type(&events, "inner_call").is_empty(), "no script called a tool");
    let first = of_type(&events, "observation").into_iter().map(|o| &o["observation"]["info"]);
    assert!(first.clone().any(|i| i["sandbox"]["enabled"] == true), "no shell episode recorded its sandbox");
    let suites_run: std::collections::HashSet<&str> = started.iter().map(|e| e["suite"].as_str().unwrap()).collect();
    assert!(suites_run.contains("arithmetic"), "the dataset suite did not run");
}

#[test]
fn the_example_suites_validate() {
    let run =
        crate::Run::from(Sandbox::new().command().current_dir(repo()).args(["validate", "tasks"]).output().unwrap());
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout.lines().filter(|l| l.starts_with("ok ")).count(), example_suites().len());
}

const ONE_TASK: &str = r#"
suite: one
environment: kv
scorers:
  - equals: "{{ target }}"
tasks:
  - id: a
    input: say 4
    target: "4"
    mock:
      - text: "4"
  - id: b
    input: say 5
    target: "5"
    mock:
      - text: "6"
"#;

#[test]
fn every_event_has_the_envelope_fields_and_seq_counts_up() {
    let sb = Sandbox::new();
    sb.write("s.yaml", ONE_TASK);
    sb.eval(&["s.yaml"]);
    let events = sb.events();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["v"], 1);
        assert_eq!(e["run_id"], "test");
        assert_eq!(e["seq"], i as u64 + 1);
        assert!(chrono::DateTime::parse_from_rfc3339(e["ts"].as_str().unwrap()).is_ok(), "{e}");
        let run_level = e["type"] == "run_started" || e["type"] == "run_finished";
        assert_eq!(e["episode_id"].is_null(), run_level, "{e}");
    }
    assert_eq!(events.first().unwrap()["type"], "run_started");
    assert_eq!(events.last().unwrap()["type"], "run_finished");
}

#[test]
fn a_failed_task_counts_as_failed_and_the_threshold_gates_the_exit_code() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &format!("{ONE_TASK}pass_threshold: 0.9\n"));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("pass_threshold"), "{run:?}");
    let row = run.stdout.lines().find(|l| l.starts_with("one ")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[..7], ["one", "mock", "2", "1", "1", "0", "50.0%"], "{row}");
    let scores = of_type(&sb.events(), "score").into_iter().cloned().collect::<Vec<_>>();
    assert!(scores.iter().any(|s| s["passed"] == false && s["explanation"].as_str().unwrap().contains("\"6\"")));
}

#[test]
fn fail_under_gates_the_whole_run() {
    let sb = Sandbox::new();
    sb.write("s.yaml", ONE_TASK);
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--out", "r", "--fail-under", "0.75"]);
    assert_eq!(run.code, 1, "{run:?}");
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--out", "r", "--fail-under", "0.5"]);
    assert_eq!(run.code, 0, "{run:?}");
}

#[test]
fn a_script_that_runs_out_makes_the_episode_unscored_not_failed() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: short\nenvironment: kv\nscorers: [{equals: x}]\ntasks:\n  - id: a\n    input: go\n    mock:\n      - tool_calls: [{name: kv_list}]\n",
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stdout.contains("mock_exhausted"), "{run:?}");
    let finished = of_type(&sb.events(), "episode_finished")[0].clone();
    assert_eq!(finished["outcome"]["status"], "unscored");
    assert_eq!(finished["outcome"]["cause"], "mock_exhausted");
    assert_eq!(finished["termination"], "agent_error");
    assert!(of_type(&sb.events(), "score").is_empty(), "an unscored episode has no scores");
    // Allowed by --max-unscored, the same run passes its gate.
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--out", "r", "--max-unscored", "1"]);
    assert_eq!(run.code, 0, "{run:?}");
}

#[test]
fn episode_ids_are_stable_across_runs_and_differ_by_epoch() {
    let sb = Sandbox::new();
    sb.write("s.yaml", ONE_TASK);
    let ids = |run_id: &str| -> Vec<String> {
        let run =
            sb.run(&["eval", "s.yaml", "--model", "mock", "--epochs", "2", "--run-id", run_id, "--out", "results"]);
        assert_eq!(run.code, 0, "{run:?}");
        let events = crate::read_jsonl(&sb.path().join(format!("results/{run_id}/events.jsonl")));
        let mut ids: Vec<String> =
            of_type(&events, "episode_started").iter().map(|e| e["episode_id"].as_str().unwrap().to_owned()).collect();
        ids.sort();
        ids
    };
    let first = ids("r1");
    assert_eq!(first.len(), 4);
    assert_eq!(first.iter().collect::<std::collections::HashSet<_>>().len(), 4, "ids repeat: {first:?}");
    assert_eq!(first, ids("r2"));
}

#[test]
fn a_dataset_suite_makes_one_task_per_row() {
    let sb = Sandbox::new();
    sb.write("data/q.jsonl", "{\"q\": \"2+2\", \"a\": 4}\n{\"q\": \"3*3\", \"a\": 9, \"note\": \"x\"}\n");
    sb.write(
        "s.yaml",
        "suite: d\nenvironment: kv\ndataset: {path: data/q.jsonl, columns: {input: q, target: a}}\nscorers: [{equals: \"{{ target }}\"}]\nmock:\n  - tool_calls: [{name: calc, arguments: {expression: \"{{ input }}\"}}]\n  - text: \"{{ target }}\"\n",
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let tasks: Vec<&str> = of_type(&events, "episode_started").iter().map(|e| e["task_id"].as_str().unwrap()).collect();
    assert_eq!(tasks.len(), 2);
    assert!(tasks.contains(&"row-1") && tasks.contains(&"row-2"), "{tasks:?}");
    let results: Vec<f64> =
        crate::tool_observations(&events).iter().filter_map(|o| o["tool_result"]["value"].as_f64()).collect();
    assert!(results.contains(&4.0) && results.contains(&9.0), "{results:?}");
}

#[test]
fn a_model_given_twice_is_refused() {
    let sb = Sandbox::new();
    sb.write("s.yaml", ONE_TASK);
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--model", "mock", "--out", "r"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("more than once"), "{run:?}");
}

#[test]
fn an_unknown_model_is_a_usage_error() {
    let sb = Sandbox::new();
    sb.write("s.yaml", ONE_TASK);
    let run = sb.run(&["eval", "s.yaml", "--model", "nobody/none", "--out", "r"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("nobody/none"), "{run:?}");
}

#[cfg(unix)]
#[test]
fn ctrl_c_cancels_episodes_flushes_the_log_and_exits_130() {
    let sb = Sandbox::new();
    // The command marks its start in the test's folder, which the sandbox lets it write.
    sb.write(
        "environments/slow.yaml",
        &format!(
            "kind: shell\nlimits: {{command_timeout_s: 60, tool_timeout_s: 60}}\nsandbox: {{write_paths: [{}]}}\n",
            sb.path().display()
        ),
    );
    let mark = sb.path().join("started");
    sb.write(
        "s.yaml",
        &format!("suite: slow\nenvironment: slow\nscorers: [{{includes: x}}]\ntasks:\n  - id: a\n    input: wait\n    mock:\n      - tool_calls: [{{name: run_command, arguments: {{command: \"touch {}; sleep 50\"}}}}]\n", mark.display()),
    );
    let run = sb.eval_interrupted_at(&mark);
    assert_eq!(run.code, 130, "{run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["outcome"]["status"], "cancelled");
    assert_eq!(finished[0]["termination"], "user_stop");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "run_finished");
    assert_eq!(last["interrupted"], true);
}

#[test]
fn a_suites_tools_narrow_what_its_environment_offers() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        r#"suite: s
environment: kv
tools: [kv_get]
scorers: [{equals: done}]
tasks:
  - id: a
    input: go
    mock:
      - tool_calls: [{name: kv_get, arguments: {key: k}}, {name: kv_set, arguments: {key: k, value: v}}]
      - tool_calls: [{name: final_answer, arguments: {answer: done}}]
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let obs = tool_observations(&events);
    // kv_get is offered (a missing key is its own answer, not an unknown tool); kv_set,
    // which kv offers but the suite does not, is an unknown tool here.
    assert_ne!(obs[0]["error"]["type"], "ToolNotFound", "{}", obs[0]);
    assert_eq!(obs[1]["error"]["type"], "ToolNotFound", "{}", obs[1]);
}

#[test]
fn the_summary_shows_the_first_message_of_each_unscored_cause() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: um\nenvironment: kv\nscorers: [{equals: ok}]\ntasks:\n  - {id: a, input: Say nothing., mock: []}\n  - {id: b, input: Say nothing., mock: []}\n",
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 3, "{run:?}");
    let shown = "  mock_exhausted, the first: the task's mock script has 0 turns and the agent asked for turn 1\n";
    assert_eq!(run.stdout.matches(shown).count(), 1, "one line per cause, not per episode: {run:?}");
    let report = sb.run(&["report", "results/test"]);
    assert!(report.stdout.contains(shown), "the report says it too: {report:?}");
}

#[test]
fn a_suite_finds_its_repositorys_environments_from_any_folder() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.path().join("repo/.git")).unwrap();
    sb.write("repo/environments/store.yaml", "name: store\nkind: kv\n");
    let suite = "suite: deep\nenvironment: store\nscorers: [{equals: ok}]\ntasks:\n  - {id: a, input: hi, mock: [{text: ok}]}\n";
    sb.write("repo/tasks/nested/deep.yaml", suite);
    std::fs::create_dir_all(sb.path().join("elsewhere")).unwrap();
    // From a folder outside the repository, and from the suite's own folder.
    for (cwd, path) in [("elsewhere", "../repo/tasks/nested/deep.yaml"), ("repo/tasks/nested", "deep.yaml")] {
        let mut command = sb.command();
        command.current_dir(sb.path().join(cwd)).args(["validate", path]);
        let run = crate::Run::from(command.output().unwrap());
        assert_eq!(run.code, 0, "from {cwd}: {run:?}");
        assert!(run.stdout.contains("environment `store`"), "from {cwd}: {run:?}");
    }
    // Outside a repository, no further than the folder above the suite's.
    std::fs::remove_dir(sb.path().join("repo/.git")).unwrap();
    let mut command = sb.command();
    command.current_dir(sb.path().join("elsewhere")).args(["validate", "../repo/tasks/nested/deep.yaml"]);
    let run = crate::Run::from(command.output().unwrap());
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("unknown environment `store`"), "{run:?}");
}
