//! Each scorer with cases that pass and cases that fail.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::*;
use crate::contract::{ErrorType, ToolCall, ToolError};
use crate::environment::{CallError, FileWorld, ReadBack, ToolFailure, Trajectory};
use crate::log::{Termination, Usage};

/// How long a scorer of the final world may take, in these tests.
const LIMIT: std::time::Duration = std::time::Duration::from_millis(200);

/// A world with one file, `out.txt`, one that never answers, `hang`, and commands that exit
/// with the code they name (or find the runner out of open files: `exhausted`).
struct FakeWorld;

#[async_trait]
impl World for FakeWorld {
    async fn call(&self, _: &crate::contract::Actor, _: &str, _: Value) -> Result<Value, ToolFailure> {
        Ok(Value::Null)
    }

    fn files(&self) -> Option<&dyn FileWorld> {
        Some(self)
    }
}

#[async_trait]
impl FileWorld for FakeWorld {
    async fn read_back(&self, path: &str, _: usize) -> Result<ReadBack, ToolFailure> {
        match path {
            "out.txt" => Ok(ReadBack { text: "hello world\n".into(), size: 12 }),
            "doc:r" => Ok(ReadBack { text: REPORT.into(), size: REPORT.len() as u64 }),
            "hang" => std::future::pending().await,
            _ => Err(ToolFailure::new(ErrorType::ExecutionError, format!("`{path}` does not exist"))),
        }
    }

    async fn run_check(&self, command: &str, _: f64) -> Result<(i32, String), ToolFailure> {
        if command == "exhausted" {
            let e = std::io::Error::from_raw_os_error(libc::EMFILE);
            return Err(ToolFailure::io("failed to start the shell", e));
        }
        command
            .strip_prefix("exit ")
            .and_then(|c| c.parse().ok())
            .map(|c| (c, "some output".into()))
            .ok_or(ToolFailure::new(ErrorType::ExecutionError, "no"))
    }
}

/// A document of the world, `doc:r`: 1 + 4 + 3 words, a preamble and two headed sections.
const REPORT: &str = "Draft.\n\n# Report\n\nRevenue grew 12 percent.\n\n## Next Steps\n\nHire two engineers.\n";

fn task() -> Task {
    Task { target: Some("3".into()), ..Task::new("t", "q") }
}

fn ending(answer: Option<&str>, calls: &[(&str, Value)]) -> Ending {
    Ending {
        termination: if answer.is_some() { Termination::FinalAnswer } else { Termination::MaxSteps },
        final_answer: answer.map(String::from),
        steps: 4,
        usage: Usage { input_tokens: 900, output_tokens: 100, cached_tokens: 0 },
        cost_usd: Some(0.02),
        fault: None,
        trajectory: Trajectory {
            calls: calls.iter().enumerate().map(|(i, (n, a))| ToolCall::new(format!("c{i}"), *n, a.clone())).collect(),
            errors: vec![CallError {
                call_id: "c0".into(),
                error: ToolError::new(ErrorType::ExecutionError, "no such file"),
            }],
            told_user: Vec::new(),
            ..Trajectory::default()
        },
    }
}

/// An episode of `task` that ended as `ending`, as the scorers see it.
fn finished<'a>(task: &'a Task, ending: &'a Ending, wall_s: f64) -> Finished<'a> {
    Finished {
        task,
        episode_id: "ep_1",
        under_test: None,
        model: "mock",
        recorder: None,
        ending,
        wall_s,
        suite_grader: None,
        suite_template: None,
        world_limit: LIMIT,
        sandbox: crate::sandbox::SandboxMode::On,
        recalled: None,
    }
}

/// Scores one scorer, written as YAML would decode it, against an episode that ended as
/// `ending` in `world`: its score, or the fault it gives instead.
fn score_in(world: &dyn World, scorer: Value, ending: &Ending, wall_s: f64) -> Result<Score, ScoringFault> {
    let spec: ScorerSpec = serde_json::from_value(scorer).unwrap();
    let task = task();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let scored = runtime.block_on(score(&[spec], &[], &finished(&task, ending, wall_s), world, &Graders::default()));
    scored.map(|mut scores| scores.remove(0))
}

/// The fault that scoring `scorer` on `ending` gives instead of scores.
fn fault_of(scorer: Value, ending: &Ending) -> ScoringFault {
    score_in(&FakeWorld, scorer, ending, 1.0).unwrap_err()
}

/// Scores one scorer against an episode with this answer and these calls.
fn check_with(scorer: Value, answer: Option<&str>, calls: &[(&str, Value)]) -> Score {
    score_in(&FakeWorld, scorer, &ending(answer, calls), 12.0).unwrap()
}

fn check(scorer: Value, answer: Option<&str>) -> Score {
    check_with(scorer, answer, &[])
}

#[test]
fn text_scorers_with_negation_and_case() {
    assert!(check(json!({"includes": "{{ target }}"}), Some("it is 3 lines")).passed);
    let failed = check(json!({"includes": "{{ target }}"}), Some("four"));
    assert!(!failed.passed && failed.value == 0.0);
    assert!(failed.explanation.contains("\"four\" does not contain \"3\""), "{}", failed.explanation);
    assert!(check(json!({"not_includes": "error"}), Some("all fine")).passed);
    assert!(!check(json!({"not_includes": "error"}), Some("an error")).passed);
    assert!(!check(json!({"includes": "DONE"}), Some("done")).passed);
    assert!(check(json!({"includes": "DONE", "ignore_case": true}), Some("done")).passed);
    assert!(check(json!({"equals": "3"}), Some(" 3\n")).passed);
    assert!(!check(json!({"equals": "3"}), Some("33")).passed);
    assert!(check(json!({"not_equals": "3"}), Some("33")).passed);
    assert!(check(json!({"regex": r"^\d+$"}), Some("42")).passed);
    assert!(!check(json!({"regex": r"^\d+$"}), Some("42 lines")).passed);
    assert!(check(json!({"regex": "^yes", "ignore_case": true}), Some("YES")).passed);
    assert!(check(json!({"not_regex": "sorry"}), Some("here")).passed);
}

#[test]
fn a_missing_answer_fails_answer_scorers_and_says_why() {
    let s = check(json!({"includes": "3"}), None);
    assert!(!s.passed);
    assert!(s.explanation.contains("max_steps"), "{}", s.explanation);
    assert!(!check(json!({"not_includes": "3"}), None).passed, "no answer cannot pass a negated scorer either");
}

#[test]
fn numeric_within_a_tolerance() {
    assert!(check(json!({"numeric": "{{ target }}"}), Some("The answer is 3.")).passed);
    assert!(check(json!({"numeric": "3.14", "tolerance": 0.01}), Some("about 3.141")).passed);
    assert!(!check(json!({"numeric": "3.14", "tolerance": 0.001}), Some("about 3.15")).passed);
    assert!(check(json!({"numeric": "1234.5"}), Some("1,234.5 dollars")).passed);
    assert!(check(json!({"numeric": "-2"}), Some("-2")).passed);
    let none = check(json!({"numeric": "3"}), Some("three"));
    assert!(!none.passed && none.explanation.contains("no number"), "{}", none.explanation);
}

#[test]
fn json_valid_schema_and_path() {
    assert!(check(json!({"json": "valid"}), Some("```json\n{\"a\": 1}\n```")).passed);
    assert!(!check(json!({"json": "valid"}), Some("{a: 1}")).passed);
    let schema = json!({"json": {"schema": {"type": "object", "required": ["name"]}}});
    assert!(check(schema.clone(), Some("{\"name\": \"x\"}")).passed);
    assert!(!check(schema, Some("{\"other\": 1}")).passed);
    assert!(check(json!({"json": {"path": "a.b", "equals": 2}}), Some("{\"a\": {\"b\": 2}}")).passed);
    assert!(check(json!({"json": {"path": "/list/1", "equals": "y"}}), Some("{\"list\": [\"x\", \"y\"]}")).passed);
    assert!(!check(json!({"json": {"path": "a.b", "equals": 2}}), Some("{\"a\": {\"b\": 3}}")).passed);
    assert!(!check(json!({"json": {"path": "a.c", "equals": 2}}), Some("{\"a\": {\"b\": 2}}")).passed);
}

#[test]
fn tool_called_and_not_called() {
    let calls = [("read_file", json!({})), ("run_command", json!({}))];
    assert!(check_with(json!({"tool_called": "run_command"}), None, &calls).passed);
    assert!(!check_with(json!({"tool_called": "write_file"}), None, &calls).passed);
    assert!(check_with(json!({"tool_not_called": "write_file"}), None, &calls).passed);
    assert!(!check_with(json!({"tool_not_called": "run_command"}), None, &calls).passed);
}

#[test]
fn tool_sequence_in_order_and_any_order_with_partial_credit() {
    let calls = [
        ("list_dir", json!({"path": "."})),
        ("read_file", json!({"path": "a.txt", "encoding": "utf8"})),
        ("run_command", json!({"command": "wc -l a.txt"})),
        ("final_answer", json!({"answer": "3"})),
    ];
    let seq = |extra: Value| {
        let mut v = json!({"tool_sequence": [{"name": "read_file", "arguments": {"path": "a.txt"}}, "run_command"]});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    // Subset matching (the default) ignores the extra `encoding` argument.
    assert!(check_with(seq(json!({})), None, &calls).passed);
    // Exact matching does not.
    assert!(!check_with(seq(json!({"arguments": "exact"})), None, &calls).passed);
    // Order matters by default, not when unordered.
    let reversed = json!({"tool_sequence": ["run_command", "read_file"]});
    assert!(!check_with(reversed.clone(), None, &calls).passed);
    let mut unordered = reversed;
    unordered["order"] = json!("unordered");
    assert!(check_with(unordered, None, &calls).passed);
    // Patterns are regular expressions over the argument values.
    let pattern =
        json!({"tool_sequence": [{"name": "run_command", "arguments": {"command": "^wc "}}], "arguments": "pattern"});
    assert!(check_with(pattern, None, &calls).passed);
    let pattern =
        json!({"tool_sequence": [{"name": "run_command", "arguments": {"command": "^cat "}}], "arguments": "pattern"});
    assert!(!check_with(pattern, None, &calls).passed);
    // A pattern of plain text is looked for as text (an invalid one is refused when read).
    let in_call = |p: &str| json!({"tool_sequence": [{"name": "run_command", "arguments": {"command": p}}], "arguments": "pattern"});
    assert!(check_with(in_call("l a.txt"), None, &calls).passed);
    assert!(!check_with(in_call("l b.txt"), None, &calls).passed);
    // Partial credit is the F1 of matched calls: 1 of 2 expected, 1 of 3 made.
    let partial = json!({"tool_sequence": ["read_file", "write_file"], "partial": true});
    let s = check_with(partial, None, &calls);
    assert!(!s.passed);
    let (p, r) = (1.0 / 3.0, 0.5);
    assert!((s.value - 2.0 * p * r / (p + r)).abs() < 1e-9, "{}", s.value);
}

#[test]
fn budgets_compare_what_the_episode_used() {
    assert!(check(json!({"max_steps": 4}), None).passed);
    assert!(!check(json!({"max_steps": 3}), None).passed);
    assert!(check(json!({"max_tool_errors": 1}), None).passed);
    assert!(!check(json!({"max_tool_errors": 0}), None).passed);
    assert!(check(json!({"max_tokens": 1000}), None).passed);
    assert!(!check(json!({"max_tokens": 999}), None).passed);
    assert!(check(json!({"max_cost": 0.05}), None).passed, "the episode cost 0.02");
    assert!(!check(json!({"max_cost": 0.01}), None).passed);
    assert!(check(json!({"max_latency": 12.5}), None).passed);
    assert!(!check(json!({"max_latency": 10}), None).passed);
}

#[test]
fn world_state_scorers_look_at_the_final_world() {
    assert!(check(json!({"file_exists": "out.txt"}), None).passed);
    assert!(!check(json!({"file_exists": "missing.txt"}), None).passed);
    assert!(check(json!({"file_contains": {"path": "out.txt", "text": "hello"}}), None).passed);
    assert!(!check(json!({"file_contains": {"path": "out.txt", "text": "bye"}}), None).passed);
    assert!(check(json!({"file_contains": {"path": "out.txt", "regex": "^hello \\w+"}}), None).passed);
    assert!(check(json!({"check": "exit 0"}), None).passed);
    let failed = check(json!({"check": "exit 2"}), None);
    assert!(!failed.passed && failed.explanation.contains("exited 2"), "{}", failed.explanation);
}

#[test]
fn a_world_scorer_that_hangs_fails_at_the_episodes_time_limit() {
    let hung = check(json!({"file_contains": {"path": "hang", "text": "x"}}), None);
    assert!(!hung.passed && hung.explanation.contains("could not be read within 0.2s"), "{}", hung.explanation);
    assert!(!check(json!({"file_exists": "hang"}), None).passed);
}

#[test]
fn a_runner_out_of_open_files_leaves_a_check_unscored_not_failed() {
    let fault = fault_of(json!({"check": "exhausted"}), &ending(None, &[]));
    assert_eq!(fault.cause, "resource_exhausted", "{fault}");
}

#[test]
fn weights_and_pass_score_decide_the_task() {
    let s = |value: f64, weight: f64| Score {
        scorer: "x".into(),
        value,
        passed: value >= 1.0,
        explanation: String::new(),
        weight,
        grader: None,
        check: Default::default(),
    };
    assert_eq!(aggregate(&[s(1.0, 3.0), s(0.0, 1.0)], None), (0.75, false));
    assert_eq!(aggregate(&[s(1.0, 3.0), s(0.0, 1.0)], Some(0.7)), (0.75, true));
    assert_eq!(aggregate(&[s(1.0, 3.0), s(0.0, 1.0)], Some(0.8)), (0.75, false));
    // Weight 0 is informational: it neither counts toward the score nor blocks passing.
    assert_eq!(aggregate(&[s(1.0, 1.0), s(0.0, 0.0)], None), (1.0, true));
}

#[test]
fn a_fault_leaves_the_episode_unscored_unless_the_other_verdicts_settle_it() {
    let s = |value: f64, weight: f64| Score {
        scorer: "x".into(),
        value,
        passed: value >= 1.0,
        explanation: String::new(),
        weight,
        grader: None,
        check: Default::default(),
    };
    let fault = |scores: Vec<Score>, missing_weight: f64| ScoringFault {
        scores,
        missing_weight,
        ..ScoringFault::new(UnscoredCause::GraderError, "no verdict")
    };
    // Every scorer must pass, and one that counts failed: failed, whatever the grader says.
    assert_eq!(fault(vec![s(0.0, 1.0), s(1.0, 1.0)], 1.0).settled(None), Some((0.5, false)));
    // Only passes and an informational failure: the grader could still decide.
    assert_eq!(fault(vec![s(1.0, 1.0), s(0.0, 0.0)], 1.0).settled(None), None);
    // With pass_score 0.8: 0 of weight 3 and a missing weight 1 reach 0.25 at best.
    assert_eq!(fault(vec![s(0.0, 3.0)], 1.0).settled(Some(0.8)), Some((0.0, false)));
    // 1 of weight 3 and a missing weight 1 could still reach 1.0.
    assert_eq!(fault(vec![s(1.0, 3.0)], 1.0).settled(Some(0.8)), None);
    // Scorers that were never tried could weigh anything.
    assert_eq!(fault(vec![s(0.0, 3.0)], f64::INFINITY).settled(Some(0.8)), None);
}

#[test]
fn a_grader_without_a_model_is_a_fault_not_a_zero() {
    let fault = fault_of(json!({"llm_rubric": "is polite"}), &ending(Some("hi"), &[]));
    assert_eq!(fault.cause, "grader_error");
}

#[test]
fn the_grader_sees_each_call_with_its_arguments_and_error() {
    let task = task();
    let ending =
        ending(Some("3"), &[("read_file", json!({"path": "a.txt"})), ("run_command", json!({"command": "ls"}))]);
    let finished = finished(&task, &ending, 1.0);
    let text = checks::graded::compact_trajectory(&finished);
    assert!(text.contains(r#"- read_file({"path":"a.txt"}) -> ExecutionError: no such file"#), "{text}");
    assert!(text.contains(r#"- run_command({"command":"ls"})"#) && !text.contains("ls\"}) ->"), "{text}");
    assert!(text.contains("1 tool errors"), "{text}");
}

/// Regression: greedy matching gave 1 of 2 here.
#[test]
fn unordered_sequences_find_the_best_assignment() {
    let calls = [("kv_set", json!({"key": "a"})), ("kv_set", json!({"key": "b"}))];
    let seq = json!({"tool_sequence": ["kv_set", {"name": "kv_set", "arguments": {"key": "a"}}], "order": "unordered"});
    let s = check_with(seq, None, &calls);
    assert!(s.passed, "{}", s.explanation);
}

#[test]
fn invalid_scorer_options_are_refused_when_read() {
    let bad = |v: Value| serde_json::from_value::<ScorerSpec>(v).unwrap_err().to_string();
    assert!(bad(json!({"numeric": "3", "tolerance": -1})).contains("at least 0"));
    let e = bad(json!({"tool_sequence": [{"name": "f", "arguments": {"a": "(unclosed"}}], "arguments": "pattern"}));
    assert!(e.contains("not a valid regex"), "{e}");
}

#[test]
fn a_grader_is_not_asked_about_an_episode_without_a_final_answer() {
    // A `mock` grader with no verdicts would be a fault if it were asked.
    let score = check(json!({"llm_rubric": "is polite", "model": "mock"}), None);
    assert!(!score.passed);
    assert!(score.explanation.contains("no final answer"), "{}", score.explanation);
    assert_eq!(score.grader, None);
}

#[test]
fn trajectory_scorers_can_look_at_one_agent_or_the_subagents() {
    use crate::contract::Actor;
    let mut ending =
        ending(Some("done"), &[("read_file", json!({})), ("write_file", json!({})), ("run_command", json!({}))]);
    ending.trajectory.calls[1].actor = Actor::Subagent(vec![1]);
    ending.trajectory.calls[2].actor = Actor::Subagent(vec![1, 2]);
    let score_of = |v: Value| score_in(&FakeWorld, v, &ending, 1.0).unwrap();
    // write_file was called, but only by main.1.
    assert!(score_of(json!({"tool_called": "write_file"})).passed);
    assert!(score_of(json!({"tool_called": "write_file", "actor": "main.1"})).passed);
    assert!(score_of(json!({"tool_called": "write_file", "actor": "subagents"})).passed);
    let by_main = score_of(json!({"tool_called": "write_file", "actor": "main"}));
    assert!(!by_main.passed);
    assert_eq!(by_main.explanation, "`write_file` was never called by main");
    assert!(score_of(json!({"tool_not_called": "write_file", "actor": "main"})).passed);
    // run_command was called by main.1.2 only: not by main.1 itself.
    assert!(!score_of(json!({"tool_called": "run_command", "actor": "main.1"})).passed);
    assert!(score_of(json!({"tool_called": "run_command", "actor": "main.1.2"})).passed);
    assert!(!score_of(json!({"tool_called": "read_file", "actor": "subagents"})).passed);
    // A sequence of the subagents' calls alone.
    assert!(score_of(json!({"tool_sequence": ["write_file", "run_command"], "actor": "subagents"})).passed);
    assert!(!score_of(json!({"tool_sequence": ["read_file", "write_file"], "actor": "subagents"})).passed);
    let bad = serde_json::from_value::<ScorerSpec>(json!({"tool_called": "x", "actor": "boss"})).unwrap_err();
    assert!(bad.to_string().contains("`actor` is `main`, `main.1`, `main.1.2`, … or `subagents`, not `boss`"), "{bad}");
}

#[test]
fn a_text_scorer_with_from_reads_a_text_of_the_world_instead_of_the_answer() {
    let found = check(json!({"includes": "grew 12", "from": "doc:r"}), Some("nothing here"));
    assert!(found.passed, "{}", found.explanation);
    assert!(found.explanation.starts_with("`doc:r` contains \"grew 12\""), "{}", found.explanation);
    assert!(!check(json!({"includes": "nothing here", "from": "doc:r"}), Some("nothing here")).passed);
    assert!(check(json!({"regex": "(?m)^## Next Steps$", "from": "doc:r"}), None).passed, "no answer needed");
    assert!(check(json!({"numeric": "12", "from": "doc:r"}), None).passed);
    let missing = check(json!({"includes": "x", "from": "doc:gone"}), Some("x"));
    assert!(!missing.passed && missing.explanation.contains("`doc:gone` does not exist"), "{}", missing.explanation);
    // The scorer's record says where its text came from, so a regrade tells it apart.
    assert_eq!(
        *found.check,
        json!({"from": "doc:r", "check": {"Text": {"op": "Includes", "expected": "grew 12", "negate": false, "ignore_case": false}}})
    );
}

#[test]
fn the_document_scorer_checks_sections_and_word_counts() {
    let all =
        check(json!({"document": "doc:r", "sections": ["report", "Next Steps"], "min_words": 8, "max_words": 8}), None);
    assert!(all.passed, "{}", all.explanation);
    assert!(all.explanation.contains("8 words (2 sections)"), "{}", all.explanation);
    let short = check(json!({"document": "doc:r", "sections": ["Risks", "Report", "Budget"], "min_words": 10}), None);
    assert!(!short.passed);
    assert_eq!(short.explanation, "`doc:r`: no section `Risks`, `Budget`; 8 words, under 10");
    let long = check(json!({"document": "doc:r", "max_words": 7, "max_section_words": 3}), None);
    assert_eq!(long.explanation, "`doc:r`: 8 words, over 7; section `Report` has 4 words, over 3");
    let gone = check(json!({"document": "nope.md", "sections": ["A"]}), None);
    assert!(!gone.passed && gone.explanation.contains("does not exist"), "{}", gone.explanation);
}

#[test]
fn from_and_document_are_refused_where_they_do_not_belong() {
    let bad = |v: Value| serde_json::from_value::<ScorerSpec>(v).unwrap_err().to_string();
    assert!(bad(json!({"tool_called": "x", "from": "doc:r"})).contains("`from` is not an option of `tool_called`"));
    assert!(bad(json!({"document": "doc:r"})).contains("`document` needs something to check"));
    assert!(bad(json!({"document": "doc:r", "min_words": -1})).contains("`min_words` of `document`"));
}

/// A world without files, as `web` or `mcp` is.
struct NoFiles;

#[async_trait]
impl World for NoFiles {
    async fn call(&self, _: &crate::contract::Actor, _: &str, _: Value) -> Result<Value, ToolFailure> {
        Ok(Value::Null)
    }
}

#[test]
fn a_world_without_files_fails_its_file_scorers_and_says_why() {
    let ending = ending(Some("x"), &[]);
    let score_of = |v: Value| score_in(&NoFiles, v, &ending, 1.0).unwrap();
    let exists = score_of(json!({"file_exists": "out.txt"}));
    assert!(!exists.passed);
    assert_eq!(exists.explanation, "`out.txt` does not exist: this environment has no files");
    let ran = score_of(json!({"check": "exit 0"}));
    assert!(!ran.passed);
    assert_eq!(ran.explanation, "`exit 0` could not run: this environment cannot run commands");
    let from = score_of(json!({"includes": "x", "from": "doc:r"}));
    assert!(!from.passed && from.explanation.contains("this environment has no files"), "{}", from.explanation);
}
