//! Scoring through the CLI: world-state scorers on real files, LLM graders with scripted
//! verdicts, and tasks over several epochs.

use crate::{Sandbox, of_type};

#[test]
fn world_state_scorers_read_the_final_working_directory() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        r#"
suite: world
environment: shell
scorers:
  - file_exists: out/report.txt
  - file_contains: {path: out/report.txt, text: "{{ target }}"}
  - check: "test $(wc -l < out/report.txt) -eq 2"
  - file_exists: never.txt
    weight: 0
tasks:
  - id: write
    input: Write the report.
    target: total 7
    mock:
      - tool_calls: [{name: write_file, arguments: {path: out/report.txt, content: "report\ntotal 7\n"}}]
      - text: done
  - id: forget
    input: Write the report.
    target: total 7
    mock:
      - text: done
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "no gate is set: {run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    let outcome = |task: &str| {
        let id = of_type(&events, "episode_started").into_iter().find(|e| e["task_id"] == task).unwrap()["episode_id"]
            .clone();
        finished.iter().find(|f| f["episode_id"] == id).unwrap()["outcome"].clone()
    };
    assert_eq!(outcome("write")["passed"], true, "{}", outcome("write"));
    assert_eq!(outcome("forget")["passed"], false);
    let scores = of_type(&events, "score");
    let never: Vec<_> = scores.iter().filter(|s| s["scorer"] == "file_exists" && s["weight"] == 0.0).collect();
    assert!(never.iter().all(|s| s["passed"] == false), "the informational scorer failed but did not block");
    let check = scores.iter().find(|s| s["scorer"] == "check" && s["passed"] == false).unwrap();
    assert!(check["explanation"].as_str().unwrap().contains("exited"), "{check}");
}

const GRADED: &str = r#"
suite: graded
environment: kv
grader: {model: mock}
scorers:
  - llm_rubric: The answer names a colour.
    samples: 3
    mock: [MOCK]
tasks:
  - id: colour
    input: Name a colour.
    mock:
      - text: Blue.
"#;

fn graded(sb: &Sandbox, outputs: &str) -> crate::Run {
    sb.write("s.yaml", &GRADED.replace("MOCK", outputs));
    sb.eval(&["s.yaml"])
}

#[test]
fn a_grader_that_agrees_passes_with_its_provenance_logged() {
    let sb = Sandbox::new();
    let ok = r#""The answer says blue, a colour.\n{\"score\": 1}""#;
    let run = graded(&sb, &[ok, ok, ok].join(", "));
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let score = of_type(&events, "score")[0].clone();
    assert_eq!(score["passed"], true);
    assert_eq!(score["grader"]["model"], "mock");
    assert_eq!(score["grader"]["agreement"], 1.0);
    assert_eq!(score["grader"]["raw_outputs"].as_array().unwrap().len(), 3);
    assert!(score["grader"]["template_digest"].as_str().unwrap().len() == 64);
    assert!(score["explanation"].as_str().unwrap().contains("blue"), "{score}");
}

#[test]
fn a_grader_that_disagrees_takes_the_majority_and_records_agreement() {
    let sb = Sandbox::new();
    let yes = r#""Fine.\n{\"score\": 1}""#;
    let no = r#""Not a colour.\n{\"score\": 0}""#;
    let run = graded(&sb, &[no, yes, no].join(", "));
    assert_eq!(run.code, 0, "{run:?}");
    let score = of_type(&sb.events(), "score")[0].clone();
    assert_eq!(score["passed"], false);
    assert!((score["grader"]["agreement"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9, "{score}");
}

#[test]
fn an_unparseable_or_refusing_grader_leaves_the_episode_unscored_not_zero() {
    for outputs in [r#""I think it is fine.""#, r#""I can't help with grading this.""#] {
        let sb = Sandbox::new();
        let run = graded(&sb, &[outputs; 9].join(", "));
        assert_eq!(run.code, 3, "{run:?}");
        let finished = of_type(&sb.events(), "episode_finished")[0].clone();
        assert_eq!(finished["outcome"]["status"], "unscored", "{finished}");
        assert_eq!(finished["outcome"]["cause"], "grader_error");
        assert!(of_type(&sb.events(), "score").is_empty());
    }
}

#[test]
fn a_grader_that_cannot_answer_leaves_a_failed_verdict_standing() {
    let sb = Sandbox::new();
    let unparseable = [r#""I think it is fine.""#; 3].join(", ");
    let suite = GRADED.replace("MOCK", &unparseable).replace("scorers:\n", "scorers:\n  - equals: Red.\n");
    sb.write("s.yaml", &suite);
    let run = sb.eval(&["s.yaml"]);
    let events = sb.events();
    let finished = of_type(&events, "episode_finished")[0].clone();
    assert_eq!(
        finished["outcome"]["status"], "scored",
        "the answer failed `equals` whatever the grader says: {finished}"
    );
    assert_eq!(finished["outcome"]["passed"], false, "{finished}");
    assert_ne!(run.code, 3, "no episode is unscored: {run:?}");
    let scores = of_type(&events, "score");
    assert!(scores.iter().any(|s| s["scorer"] == "equals" && s["passed"] == false), "{scores:?}");
    let errors = of_type(&events, "error");
    assert!(errors.iter().any(|e| e["cause"] == "grader_error"), "the grader's fault is still in the log: {errors:?}");
}

#[test]
fn a_grader_scorer_without_a_model_is_refused_before_running() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &GRADED.replace("grader: {model: mock}\n", "").replace("MOCK", "x"));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("needs a grader model"), "{run:?}");
    // --grader names it.
    let ok = r#""Blue is a colour.\n{\"score\": 0.9}""#;
    sb.write("s.yaml", &GRADED.replace("grader: {model: mock}\n", "").replace("MOCK", &[ok, ok, ok].join(", ")));
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--grader", "mock", "--out", "r"]);
    assert_eq!(run.code, 0, "{run:?}");
}

const FLAKY: &str = r#"
suite: flaky
environment: kv
epochs: 4
k_of_n: 3
scorers: [{equals: "yes"}]
tasks:
  - id: steady
    input: say yes
    mock: [{text: "yes"}]
"#;

#[test]
fn epochs_show_pass_at_k_and_k_of_n_gates_each_task() {
    let sb = Sandbox::new();
    sb.write("s.yaml", FLAKY);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let row =
        run.stdout.lines().find(|l| l.starts_with("flaky") && l.contains("1.000")).unwrap_or_else(|| panic!("{run:?}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    // suite, model, tasks, tasks passed, pass@1, pass@k, pass^k, k, task score
    assert_eq!(cells, ["flaky", "mock", "1", "1", "1.000", "1.000", "1.000", "4", "1.000"], "{row}");

    // A task that always fails its epochs fails the k_of_n gate.
    sb.write("s.yaml", &FLAKY.replace("mock: [{text: \"yes\"}]", "mock: [{text: \"no\"}]"));
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--out", "r"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("k_of_n: steady"), "{run:?}");
}

const REGRADED: &str = r#"
suite: regraded
environment: kv
grader: {model: mock}
scorers:
  - equals: "{{ target }}"
  - file_exists: saved
  - llm_rubric: RUBRIC
    mock: [VERDICT]
tasks:
  - id: save
    input: Save a note and say ok.
    target: ok
    mock:
      - tool_calls: [{name: kv_set, arguments: {key: saved, value: "1"}}]
      - text: ok
"#;

fn regraded_suite(rubric: &str, score: f64) -> String {
    REGRADED.replace("RUBRIC", rubric).replace("VERDICT", &format!("\"Judged.\\n{{\\\"score\\\": {score}}}\""))
}

fn scores_of(events: &[serde_json::Value], scoring: &str) -> Vec<(String, bool, f64)> {
    of_type(events, "score")
        .into_iter()
        .filter(|s| s["scoring_id"] == scoring)
        .map(|s| {
            (s["scorer"].as_str().unwrap().to_owned(), s["passed"].as_bool().unwrap(), s["value"].as_f64().unwrap())
        })
        .collect()
}

#[test]
fn regrade_gives_the_same_scores_when_nothing_changed_and_new_ones_when_a_rubric_does() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &regraded_suite("The answer is ok.", 1.0));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let initial = scores_of(&sb.events(), "initial");
    assert_eq!(initial.len(), 3);
    assert!(initial.iter().all(|(_, passed, _)| *passed), "{initial:?}");

    // Nothing changed: the same verdicts, under a new scoring id, no agent call.
    // The agent's calls: the grader's are marked with their scorer.
    let agent_calls = |events: &[serde_json::Value]| {
        of_type(events, "model_call").into_iter().filter(|c| c["scorer"].is_null()).count()
    };
    let calls_before = agent_calls(&sb.events());
    let again = sb.run(&["regrade", "results/test"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stdout.contains("scoring `regrade-1`: 1 episodes re-scored (1 passed"), "{again:?}");
    let events = sb.events();
    assert_eq!(scores_of(&events, "regrade-1"), initial);
    assert_eq!(agent_calls(&events), calls_before, "regrade called the agent's model");
    let carried = of_type(&events, "score")
        .into_iter()
        .find(|s| s["scoring_id"] == "regrade-1" && s["scorer"] == "file_exists")
        .unwrap()
        .clone();
    assert!(carried["explanation"].as_str().unwrap().contains("carried over"), "{carried}");

    // A changed rubric (and a grader that now judges it failed) changes the verdict, and
    // the summary follows the latest scoring.
    sb.write("changed.yaml", &regraded_suite("The answer quotes a poem.", 0.0));
    let changed = sb.run(&["regrade", "results/test", "--suite", "changed.yaml"]);
    assert_eq!(changed.code, 0, "{changed:?}");
    let events = sb.events();
    let rubric = scores_of(&events, "regrade-2").into_iter().find(|(n, _, _)| n == "llm_rubric").unwrap();
    assert_eq!(rubric, ("llm_rubric".to_owned(), false, 0.0));
    let row = changed.stdout.lines().find(|l| l.starts_with("regraded ")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[..6], ["regraded", "mock", "1", "0", "1", "0"], "{row}");
    let last = of_type(&events, "episode_scored").last().cloned().unwrap();
    assert_eq!(last["scoring_id"], "regrade-2");
    assert_eq!(last["outcome"]["passed"], false);
    // seq keeps counting across the appended events.
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "seq restarted: {seqs:?}");
}

#[test]
fn regrade_with_another_grader_needs_no_agent_and_names_it() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &regraded_suite("The answer is ok.", 1.0));
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    let run = sb.run(&["regrade", "results/test", "--grader", "nobody/none"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("unknown provider `nobody`"), "{run:?}");
}

/// Regression: appending after a torn last line corrupted the log.
#[test]
fn regrade_after_a_crash_cuts_the_torn_line_and_keeps_the_log_readable() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &regraded_suite("The answer is ok.", 1.0));
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    let log = sb.path().join("results/test/events.jsonl");
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str("{\"v\":1,\"run_id\":\"test\",\"seq\":999,\"ts\":\"2026");
    std::fs::write(&log, text).unwrap();
    let first = sb.run(&["regrade", "results/test"]);
    assert_eq!(first.code, 0, "{first:?}");
    let second = sb.run(&["regrade", "results/test"]);
    assert_eq!(second.code, 0, "the log is still readable: {second:?}");
    assert!(sb.events().iter().all(|e| e["seq"] != 999));
}

/// Regression: a regrade that skipped some suites reverted their episodes to the first scoring.
#[test]
fn a_later_partial_regrade_keeps_the_latest_outcome_of_the_others() {
    let sb = Sandbox::new();
    sb.write("a.yaml", &regraded_suite("The answer is ok.", 1.0));
    sb.write(
        "b.yaml",
        "suite: other\nenvironment: kv\nscorers: [{equals: x}]\ntasks: [{id: t, input: q, mock: [{text: x}]}]\n",
    );
    assert_eq!(
        sb.run(&["eval", "a.yaml", "b.yaml", "--model", "mock", "--run-id", "test", "--out", "results"]).code,
        0
    );
    sb.write("a-failing.yaml", &regraded_suite("The answer quotes a poem.", 0.0));
    assert_eq!(sb.run(&["regrade", "results/test", "--suite", "a-failing.yaml", "--suite", "b.yaml"]).code, 0);
    let run = sb.run(&["regrade", "results/test", "--suite", "b.yaml"]);
    let row = run.stdout.lines().find(|l| l.starts_with("regraded ")).unwrap();
    assert!(row.split_whitespace().nth(3) == Some("0"), "the first regrade's failure stands: {row}");
}

#[test]
fn epochs_from_the_command_line_reach_the_summary_and_k_of_n_must_fit() {
    let sb = Sandbox::new();
    sb.write("s.yaml", "suite: e\nenvironment: kv\nscorers: [{equals: \"yes\"}]\ntasks: [{id: t, input: q, mock: [{text: \"yes\"}]}]\n");
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--epochs", "3", "--out", "r"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.lines().any(|l| l.starts_with("e ") && l.trim_end().ends_with("1.000") && l.contains(" 3 ")),
        "{run:?}"
    );
    sb.write("k.yaml", &FLAKY.replace("suite: flaky", "suite: k"));
    let run = sb.run(&["eval", "k.yaml", "--model", "mock", "--epochs", "1", "--out", "r"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("k_of_n 3 is more than the 1 epoch"), "{run:?}");
}

/// Regression: a grader that failed lost the world-state verdicts, so a regrade could
/// never score the episode (`world_gone`).
#[test]
fn world_verdicts_survive_a_failed_grader_and_a_regrade_uses_them() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &REGRADED.replace("RUBRIC", "The answer is ok.").replace("VERDICT", "\"I refuse.\""));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 3, "the grader refused: unscored {run:?}");
    let initial = scores_of(&sb.events(), "initial");
    assert!(initial.iter().any(|(n, passed, _)| n == "file_exists" && *passed), "{initial:?}");
    sb.write("fixed.yaml", &regraded_suite("The answer is ok.", 1.0));
    let regrade = sb.run(&["regrade", "results/test", "--suite", "fixed.yaml"]);
    assert_eq!(regrade.code, 0, "{regrade:?}");
    assert!(regrade.stdout.contains("(1 passed, 0 unscored)"), "{regrade:?}");
}

/// Regression: a world-state verdict was carried over to a different check of the same kind.
#[test]
fn a_changed_world_check_is_not_carried_over() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &regraded_suite("The answer is ok.", 1.0));
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    sb.write(
        "other.yaml",
        &regraded_suite("The answer is ok.", 1.0).replace("file_exists: saved", "file_exists: elsewhere"),
    );
    let regrade = sb.run(&["regrade", "results/test", "--suite", "other.yaml"]);
    assert_eq!(regrade.code, 3, "{regrade:?}");
    let events = sb.events();
    let last = of_type(&events, "episode_scored").last().cloned().cloned().unwrap();
    assert_eq!(last["outcome"]["cause"], "world_gone", "{last}");
}

#[test]
fn regrade_checks_its_flags_before_touching_the_log() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &regraded_suite("The answer is ok.", 1.0));
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    let before = sb.events().len();
    let run = sb.run(&["regrade", "results/test", "--fail-under", "80"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(sb.events().len(), before, "a bad flag appended a scoring");
}

#[test]
fn a_mock_grader_judging_a_real_models_answers_leaves_them_unscored_unless_asked_for() {
    // `echo` answers with the question: garbage the scripted verdicts would pass.
    let sb = Sandbox::new();
    let graded = concat!(env!("CARGO_MANIFEST_DIR"), "/tasks/graded.yaml");
    let run = sb.run(&["eval", graded, "--model", "echo", "--run-id", "test", "--out", "results"]);
    assert_eq!(run.code, 3, "every episode unscored: {run:?}");
    assert!(run.stdout.contains("those episodes are unscored (grader_error)"), "{run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 4);
    for f in &finished {
        assert_eq!(f["outcome"]["status"], "unscored", "{f}");
        assert_eq!(f["outcome"]["cause"], "grader_error", "{f}");
        let message = f["outcome"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("scripted verdicts cannot judge a real model's answers; pass --grader"), "{f}");
    }
    let started = &of_type(&events, "run_started")[0];
    assert!(started["warnings"][0].as_str().unwrap_or_default().contains("judged by the `mock` grader"), "{started}");
    // Asked for on the command line, the scripted verdicts are taken, and the warning says so.
    let asked = ["eval", graded, "--model", "echo", "--grader", "mock", "--run-id", "asked", "--out", "results"];
    let run = sb.run(&asked);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("--grader mock takes them as they are"), "{run:?}");
    let events = crate::read_jsonl(&sb.path().join("results/asked/events.jsonl"));
    assert!(of_type(&events, "episode_finished").iter().all(|f| f["outcome"]["status"] == "scored"));
}
