//! Bad suites: each error names the file, the line and the column, and what was expected.

use crate::Sandbox;

/// Validates `suite` (and any extra files) and returns stderr; the exit code must be 2.
fn error_for(suite: &str, extra: &[(&str, &str)]) -> String {
    let sb = Sandbox::new();
    for (name, content) in extra {
        sb.write(name, content);
    }
    sb.write("tasks/bad.yaml", suite);
    let run = sb.run(&["validate", "tasks/bad.yaml"]);
    assert_eq!(run.code, 2, "{run:?}");
    // `eval` refuses the same suite before running anything.
    let eval = sb.run(&["eval", "tasks/bad.yaml", "--model", "mock", "--out", "r"]);
    assert_eq!(eval.code, 2, "{eval:?}");
    assert!(!sb.path().join("r").exists(), "eval created a run for a bad suite");
    run.stderr
}

const GOOD_HEAD: &str = "suite: s\nenvironment: kv\nscorers:\n  - includes: x\ntasks:\n";

#[test]
fn malformed_yaml_names_the_line() {
    let err = error_for(&format!("{GOOD_HEAD}  - id: a\n    input: [unclosed\n"), &[]);
    assert!(err.contains("tasks/bad.yaml:"), "{err}");
    assert!(err.contains("invalid YAML"), "{err}");
    let line: usize = err.split(':').nth(2).and_then(|l| l.trim().parse().ok()).unwrap_or(0);
    assert!(line >= 7, "the error should point at or after line 7: {err}");
}

#[test]
fn an_unknown_key_names_file_line_column_and_the_expected_keys() {
    let err = error_for(&format!("{GOOD_HEAD}  - id: a\n    inptu: hello\n"), &[]);
    assert!(err.contains("tasks/bad.yaml:7:5: tasks[0].inptu: unknown field `inptu`"), "{err}");
    assert!(err.contains("`input`"), "the expected keys should be listed: {err}");
}

#[test]
fn an_unknown_key_holding_a_mapping_is_located_at_the_key() {
    let err = error_for(&format!("{GOOD_HEAD}  - id: a\n    input: hi\n    bogus:\n      deep: 1\n"), &[]);
    assert!(err.contains("tasks/bad.yaml:8:5: tasks[0].bogus: unknown field `bogus`"), "{err}");
}

#[test]
fn a_wrong_type_names_the_field() {
    let err = error_for(&format!("{GOOD_HEAD}  - id: a\n    input: hi\nlimits:\n  max_steps: many\n"), &[]);
    assert!(err.contains("tasks/bad.yaml:9:3:"), "{err}");
    assert!(err.contains("limits.max_steps"), "{err}");
    assert!(err.contains("invalid type"), "{err}");
}

#[test]
fn an_unknown_tool_in_a_scorer_names_the_tools_there_are() {
    let err = error_for(
        &format!("{GOOD_HEAD}  - id: a\n    input: hi\n    scorers:\n      - tool_called: run_command\n"),
        &[],
    );
    assert!(err.contains("tasks/bad.yaml:9:9:"), "{err}");
    assert!(err.contains("unknown tool `run_command`"), "{err}");
    assert!(err.contains("kv_get"), "{err}");
}

#[test]
fn an_unknown_environment_says_where_it_looked() {
    let err =
        error_for("suite: s\nenvironment: nowhere\nscorers: [{includes: x}]\ntasks:\n  - {id: a, input: hi}\n", &[]);
    assert!(err.contains("tasks/bad.yaml:2:1:"), "{err}");
    assert!(err.contains("unknown environment `nowhere`"), "{err}");
}

#[test]
fn an_unknown_scorer_lists_the_scorers() {
    let err = error_for("suite: s\nenvironment: kv\nscorers:\n  - contains: x\ntasks:\n  - {id: a, input: hi}\n", &[]);
    assert!(err.contains("tasks/bad.yaml:4:"), "{err}");
    assert!(err.contains("(found contains)"), "{err}");
    assert!(err.contains("a scorer needs one of: includes, not_includes"), "{err}");
}

#[test]
fn an_option_a_scorer_does_not_have_names_the_ones_it_has() {
    let err = error_for(
        "suite: s\nenvironment: kv\nscorers:\n  - equals: x\n    tolerance: 1\ntasks:\n  - {id: a, input: hi}\n",
        &[],
    );
    assert!(err.contains("tasks/bad.yaml:4:5: scorers[0]: `tolerance` is not an option of `equals`"), "{err}");
}

#[test]
fn a_template_with_an_undefined_variable_is_caught_at_load() {
    let err = error_for(
        "suite: s\nenvironment: kv\nscorers:\n  - equals: \"{{ tagret }}\"\ntasks:\n  - {id: a, input: hi, target: x}\n",
        &[],
    );
    assert!(err.contains("tasks/bad.yaml:4:"), "{err}");
    assert!(err.contains("undefined"), "{err}");
}

#[test]
fn duplicate_task_ids_are_refused() {
    let err = error_for(&format!("{GOOD_HEAD}  - {{id: a, input: hi}}\n  - {{id: a, input: ho}}\n"), &[]);
    assert!(err.contains("duplicate task id `a`"), "{err}");
    assert!(err.contains("tasks/bad.yaml:7:"), "{err}");
}

#[test]
fn a_task_without_scorers_is_refused() {
    let err = error_for("suite: s\nenvironment: kv\ntasks:\n  - {id: a, input: hi}\n", &[]);
    assert!(err.contains("no scorers"), "{err}");
}

#[test]
fn an_environment_file_with_an_unknown_tool_names_its_own_line() {
    let err = error_for(
        "suite: s\nenvironment: box\nscorers: [{includes: x}]\ntasks:\n  - {id: a, input: hi}\n",
        &[("environments/box.yaml", "kind: shell\ntools: [run_command, rm_rf]\n")],
    );
    assert!(err.contains("environments/box.yaml:2:"), "{err}");
    assert!(err.contains("unknown tool `rm_rf`"), "{err}");
}

#[test]
fn a_dataset_missing_its_input_column_names_the_mapping() {
    let err = error_for(
        "suite: s\nenvironment: kv\nscorers: [{includes: x}]\ndataset:\n  path: q.csv\n  columns: {input: question}\n",
        &[("tasks/q.csv", "prompt,answer\nhi,1\n")],
    );
    assert!(err.contains("tasks/bad.yaml:6:"), "{err}");
    assert!(err.contains("column `question`"), "{err}");
}

#[test]
fn a_bad_dataset_row_names_the_data_file_and_line() {
    let err = error_for(
        "suite: s\nenvironment: kv\nscorers: [{includes: x}]\ndataset: q.jsonl\n",
        &[("tasks/q.jsonl", "{\"input\": \"ok\"}\n{\"input\": \"broken\"\n")],
    );
    assert!(err.contains("tasks/q.jsonl:2:"), "{err}");
    assert!(err.contains("invalid JSON"), "{err}");
}

#[test]
fn a_task_file_outside_the_working_directory_is_refused() {
    let err = error_for(&format!("{GOOD_HEAD}  - id: a\n    input: hi\n    files: {{../escape.txt: x}}\n"), &[]);
    assert!(err.contains("relative paths inside"), "{err}");
}

#[test]
fn a_missing_suite_file_is_a_usage_error() {
    let run = Sandbox::new().run(&["validate", "nope.yaml"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("nope.yaml"), "{run:?}");
}

#[test]
fn every_bad_file_is_reported_not_only_the_first() {
    let sb = Sandbox::new();
    sb.write("a.yaml", "suite: a\nenvironment: kv\n  bad: indent\n");
    sb.write("b.yaml", "suite: b\nenvironment: nowhere\nscorers: [{includes: x}]\ntasks: [{id: a, input: hi}]\n");
    let run = sb.run(&["validate", "a.yaml", "b.yaml"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("a.yaml:") && run.stderr.contains("b.yaml:"), "{run:?}");
}

#[test]
fn a_time_limit_too_large_to_count_is_refused_at_load() {
    let err = error_for(&format!("{GOOD_HEAD}  - {{id: a, input: hi}}\nlimits: {{time_s: 1e20}}\n"), &[]);
    assert!(err.contains("tasks/bad.yaml:7:") && err.contains("limits.time_s"), "{err}");
    let err = error_for(
        "suite: s\nenvironment: box\nscorers: [{includes: x}]\ntasks:\n  - {id: a, input: hi}\n",
        &[("environments/box.yaml", "kind: shell\nlimits:\n  tool_timeout_s: 1e20\n")],
    );
    assert!(err.contains("environments/box.yaml:3:") && err.contains("tool_timeout_s"), "{err}");
    let err = error_for(
        "suite: s\nenvironment: box\nscorers: [{includes: x}]\ntasks:\n  - {id: a, input: hi}\n",
        &[("environments/box.yaml", "kind: shell\nlimits: {command_timeout_s: 0.0001}\n")],
    );
    assert!(err.contains("command_timeout_s"), "{err}");
}

#[test]
fn an_environment_fixture_outside_the_directory_is_refused_at_load() {
    let err = error_for(
        "suite: s\nenvironment: box\nscorers: [{includes: x}]\ntasks:\n  - {id: a, input: hi}\n",
        &[("environments/box.yaml", "kind: kv\nfiles:\n  /etc/x: y\n")],
    );
    assert!(err.contains("environments/box.yaml:3:") && err.contains("relative paths"), "{err}");
}

#[test]
fn a_scorer_that_needs_a_target_the_task_lacks_is_refused_at_load() {
    let err = error_for(
        "suite: s\nenvironment: kv\nscorers:\n  - includes: \"{{ target }}\"\ntasks:\n  - {id: a, input: hi}\n",
        &[],
    );
    assert!(err.contains("tasks/bad.yaml:4:") && err.contains("in task `a`") && err.contains("undefined"), "{err}");
}

#[test]
fn an_empty_target_cell_is_missing_not_empty_text() {
    let err = error_for(
        "suite: s\nenvironment: kv\nscorers: [{includes: \"{{ target }}\"}]\ndataset: {path: q.csv, columns: {target: answer}}\n",
        &[("tasks/q.csv", "input,answer\nwhat is 2+2?,4\nwhat is 3+3?,\n")],
    );
    assert!(err.contains("tasks/q.csv:3:") && err.contains("`answer`"), "{err}");
}

#[test]
fn validate_refuses_two_suites_with_one_name_as_eval_does() {
    let sb = Sandbox::new();
    let suite = "suite: same\nenvironment: kv\nscorers: [{includes: x}]\ntasks: [{id: a, input: hi}]\n";
    sb.write("a.yaml", suite);
    sb.write("b.yaml", suite);
    let run = sb.run(&["validate", "a.yaml", "b.yaml"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("b.yaml: suite name `same` is already used by a.yaml"), "{run:?}");
}

#[test]
fn model_graded_qa_on_a_task_without_a_target_is_refused_at_load() {
    let err = error_for(
        "suite: s\nenvironment: kv\ngrader: {model: mock}\nscorers:\n  - model_graded_qa: true\ntasks:\n  - {id: a, input: hi}\n",
        &[],
    );
    assert!(err.contains("tasks/bad.yaml:5:") && err.contains("needs the task's `target`"), "{err}");
}

/// Validates `suite` and returns stderr, expecting it to be accepted (exit 0).
fn accepted(suite: &str) -> String {
    let sb = Sandbox::new();
    sb.write("tasks/ok.yaml", suite);
    let run = sb.run(&["validate", "tasks/ok.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    run.stdout
}

#[test]
fn an_alias_bomb_is_refused_not_expanded() {
    // "Billion laughs": nine levels of nine aliases each, a few hundred bytes.
    let mut suite = String::from(
        "suite: s\nenvironment: kv\nscorers: [{includes: x}]\nl0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
    );
    for i in 1..=9 {
        let p = i - 1;
        suite.push_str(&format!("l{i}: &l{i} [*l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}]\n"));
    }
    suite.push_str("tasks: [{id: a, input: hi}]\n");
    let sb = Sandbox::new();
    let path = sb.write("tasks/bad.yaml", &suite);
    // Under a 1 GB address-space cap: expanding it would need tens of gigabytes.
    let output = std::process::Command::new("sh")
        .current_dir(sb.path())
        .args(["-c", "ulimit -v 1048576 && exec \"$0\" validate \"$1\""])
        .arg(env!("CARGO_BIN_EXE_runner"))
        .arg(&path)
        .output()
        .expect("run sh");
    let run = crate::Run::from(output);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("tasks/bad.yaml:") && run.stderr.contains("aliases in this file expand"), "{run:?}");
}

#[test]
fn a_nul_byte_is_refused_not_taken_for_the_end_of_the_file() {
    let err = error_for(&format!("{GOOD_HEAD}  - {{id: a, input: hi}}\n\0\n  - {{id: b, input: ho}}\n"), &[]);
    assert!(err.contains("tasks/bad.yaml:7:1:") && err.contains("NUL"), "{err}");
    let err = error_for(&format!("{GOOD_HEAD}  - {{id: a, input: hi\0there}}\n"), &[]);
    assert!(err.contains("tasks/bad.yaml:6:22:") && err.contains("NUL"), "{err}");
    let err = error_for(&format!("{GOOD_HEAD}  - {{id: a, input: \"bell\x07\"}}\n"), &[]);
    assert!(err.contains("tasks/bad.yaml:6:") && err.contains("U+0007"), "{err}");
}

#[test]
fn a_second_yaml_document_is_refused_not_ignored() {
    let err = error_for(&format!("{GOOD_HEAD}  - {{id: a, input: hi}}\n---\nsuite: t\n"), &[]);
    assert!(err.contains("tasks/bad.yaml:7:") && err.contains("second YAML document"), "{err}");
    // An explicit start of the one document is fine.
    accepted(&format!("---\n{GOOD_HEAD}  - {{id: a, input: hi}}\n"));
}

#[test]
fn a_byte_order_mark_is_accepted() {
    let out = accepted(&format!("\u{feff}{GOOD_HEAD}  - {{id: a, input: hi}}\n"));
    assert!(out.contains("suite `s`: 1 tasks"), "{out}");
}

#[test]
fn numbers_that_cannot_be_used_are_refused_saying_what_is_wrong() {
    let task = "  - {id: a, input: hi}\n";
    let cases = [
        ("scorers: [{numeric: abc}]", "tasks/bad.yaml:3:", "expected a number, found \"abc\""),
        ("scorers: [{numeric: 1e999}]", "tasks/bad.yaml:3:", "not a finite number: 1e999"),
        ("scorers: [{check: \"true\", timeout_s: -1}]", "tasks/bad.yaml:3:", "`timeout_s` of `check`"),
        ("scorers: [{includes: x, weight: .nan}]", "tasks/bad.yaml:3:", "not a finite number: .nan"),
        (
            "scorers: [{includes: x}]\nlimits: {max_cost_usd: -1}",
            "tasks/bad.yaml:4:",
            "limits.max_cost_usd: must be a positive",
        ),
        (
            "scorers: [{includes: x}]\nlimits: {max_tokens: 0}",
            "tasks/bad.yaml:4:",
            "limits.max_tokens: must be at least 1",
        ),
        (
            "scorers: [{includes: x}]\nlimits: {max_steps: 1e20}",
            "tasks/bad.yaml:4:",
            "expected a whole number from 0 to 4294967295, found 1e20",
        ),
        (
            "scorers: [{includes: x}]\nlimits: {max_tokens: -1}",
            "tasks/bad.yaml:4:",
            "expected a whole number from 0 to 18446744073709551615, found -1",
        ),
        (
            "scorers: [{includes: x}]\nlimits: {time_s: .inf}",
            "tasks/bad.yaml:4:",
            "limits.time_s: not a finite number: .inf",
        ),
        (
            "scorers: [{includes: x}]\nlimits: {time_s: .nan}",
            "tasks/bad.yaml:4:",
            "limits.time_s: not a finite number: .nan",
        ),
        (
            "scorers: [{includes: x}]\nepochs: 1e20",
            "tasks/bad.yaml:4:",
            "epochs: expected a whole number from 0 to 4294967295, found 1e20",
        ),
    ];
    for (settings, at, message) in cases {
        let err = error_for(&format!("suite: s\nenvironment: kv\n{settings}\ntasks:\n{task}"), &[]);
        assert!(err.contains(at) && err.contains(message), "{settings}: {err}");
    }
    let err = error_for(
        &format!("suite: s\nenvironment: box\nscorers: [{{includes: x}}]\ntasks:\n{task}"),
        &[("environments/box.yaml", "kind: kv\nlimits:\n  output_cap_bytes: 0\n")],
    );
    assert!(err.contains("environments/box.yaml:3:") && err.contains("output_cap_bytes"), "{err}");
}

#[test]
fn unquoted_numbers_written_another_way_are_read_as_numbers_where_numbers_are_expected() {
    accepted(
        "suite: s\nenvironment: kv\nlimits: {time_s: 1e3, max_cost_usd: 1.50}\n\
         scorers: [{numeric: \"{{ target }}\", tolerance: 1e-3}]\ntasks:\n  - {id: a, input: hi, target: 1e3}\n",
    );
}

#[test]
fn an_llm_rubric_with_no_grader_anywhere_is_refused_by_validate_at_its_line() {
    let err = error_for(
        "suite: s\nenvironment: kv\nscorers:\n  - includes: x\n  - llm_rubric: says hi\ntasks:\n  - {id: a, input: hi}\n",
        &[],
    );
    assert!(err.contains("tasks/bad.yaml:5:") && err.contains("`llm_rubric` needs a grader model"), "{err}");
}

#[test]
fn an_undefined_template_variable_is_named() {
    let err = error_for(
        "suite: s\nenvironment: kv\nscorers:\n  - equals: \"{{ tagret }}\"\ntasks:\n  - {id: a, input: hi, target: x}\n",
        &[],
    );
    assert!(err.contains("tasks/bad.yaml:4:") && err.contains("undefined variable `tagret`"), "{err}");
}
