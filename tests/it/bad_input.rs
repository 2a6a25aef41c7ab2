//! Bad suites: each error names the file, the line and the column, and what was expected.
//!
//! Most cases are data in `tests/fixtures/bad_input/`: a suite `NAME.yaml` (run as
//! `tasks/bad.yaml`), or a folder `NAME/` copied as it is (with `tasks/bad.yaml` and the
//! files it needs, or a Harbor task directory `tasks/bad/` instead), and beside it
//! `NAME.expected`, each line of which stderr must contain.
//! The tests here are the cases that need more than that.

use std::path::{Path, PathBuf};

use crate::Sandbox;

const GOOD_HEAD: &str = "suite: s\nenvironment: kv\nscorers:\n  - includes: x\ntasks:\n";

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/bad_input");

/// Runs `validate` and `eval` on `tasks/bad.yaml` (or the task directory `tasks/bad/`):
/// both must refuse it with exit 2, and `eval` before it creates a run. Returns what
/// `validate` said on stderr.
fn refused(sb: &Sandbox) -> Result<String, String> {
    let target = if sb.path().join("tasks/bad").is_dir() { "tasks/bad" } else { "tasks/bad.yaml" };
    let run = sb.run(&["validate", target]);
    if run.code != 2 {
        return Err(format!("validate should exit 2: {run:?}"));
    }
    let eval = sb.run(&["eval", target, "--model", "mock", "--out", "r"]);
    if eval.code != 2 {
        return Err(format!("eval should exit 2: {eval:?}"));
    }
    if sb.path().join("r").exists() {
        return Err("eval created a run for a bad suite".into());
    }
    Ok(run.stderr)
}

/// Validates `suite` (given inline, for the cases that cannot be a fixture file) and
/// returns stderr; the suite must be refused.
fn error_for(suite: &str) -> String {
    let sb = Sandbox::new();
    sb.write("tasks/bad.yaml", suite);
    refused(&sb).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the fixture `name` and compares stderr with `name.expected`; returns stderr.
fn check(name: &str) -> Result<String, String> {
    let dir = Path::new(FIXTURES);
    let sb = Sandbox::new();
    let folder = dir.join(name);
    if folder.is_dir() {
        copy_tree(&folder, sb.path()).map_err(|e| format!("failed to copy {}: {e}", folder.display()))?;
    } else {
        let suite = std::fs::read(dir.join(format!("{name}.yaml"))).map_err(|e| format!("no {name}.yaml: {e}"))?;
        std::fs::create_dir_all(sb.path().join("tasks")).map_err(|e| e.to_string())?;
        std::fs::write(sb.path().join("tasks/bad.yaml"), suite).map_err(|e| e.to_string())?;
    }
    let expected = std::fs::read_to_string(dir.join(format!("{name}.expected")))
        .map_err(|e| format!("no {name}.expected beside it: {e}"))?;
    let stderr = refused(&sb)?;
    compare(&expected, &stderr)?;
    Ok(stderr)
}

/// Every non-empty line of `expected` must be in `stderr`; an empty `expected` checks
/// nothing and is a mistake.
fn compare(expected: &str, stderr: &str) -> Result<(), String> {
    let lines: Vec<&str> = expected.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return Err("the .expected file says nothing to look for".into());
    }
    let missing: Vec<&str> = lines.into_iter().filter(|line| !stderr.contains(line)).collect();
    if missing.is_empty() { Ok(()) } else { Err(format!("stderr lacks {missing:?}\n--- stderr\n{stderr}")) }
}

pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The fixtures' names: every `NAME.yaml`, `NAME/` and `NAME.expected` in the folder.
fn fixture_names() -> Vec<String> {
    let entries = std::fs::read_dir(FIXTURES).unwrap_or_else(|e| panic!("read {FIXTURES}: {e}"));
    let mut names: Vec<String> = entries
        .map(|e| e.unwrap_or_else(|e| panic!("read {FIXTURES}: {e}")).path())
        .filter_map(|path: PathBuf| {
            let stem = path.file_stem()?.to_str()?.to_owned();
            let is_case = path.is_dir() || matches!(path.extension()?.to_str()?, "yaml" | "expected");
            is_case.then_some(stem)
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn every_bad_input_fixture_is_refused_with_its_expected_message() {
    let names = fixture_names();
    assert!(!names.is_empty(), "no fixtures in {FIXTURES}");
    let failures: Vec<String> =
        names.iter().filter_map(|name| check(name).err().map(|e| format!("fixture `{name}`: {e}"))).collect();
    assert!(failures.is_empty(), "{} of {} fixtures failed:\n\n{}", failures.len(), names.len(), failures.join("\n\n"));
}

#[test]
fn a_fixture_fails_when_stderr_lacks_a_line_or_it_expects_nothing() {
    // The harness itself: a check that could not fail would pass every fixture.
    assert_eq!(compare("b.yaml:3:\nunknown field\n", "error: b.yaml:3:1: unknown field `x`"), Ok(()));
    let err = compare("b.yaml:3:\nunknown tool\n", "error: b.yaml:3:1: unknown field `x`").unwrap_err();
    assert!(err.starts_with("stderr lacks [\"unknown tool\"]"), "{err}");
    assert!(compare("\n  \n", "anything").is_err());
    assert!(check("no_such_fixture").unwrap_err().contains("no no_such_fixture.yaml"));
}

#[test]
fn malformed_yaml_names_the_line() {
    let err = check("malformed_yaml").unwrap_or_else(|e| panic!("{e}"));
    let line: usize = err.split(':').nth(2).and_then(|l| l.trim().parse().ok()).unwrap_or(0);
    assert!(line >= 7, "the error should point at or after line 7: {err}");
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
fn validate_refuses_two_suites_with_one_name_as_eval_does() {
    let sb = Sandbox::new();
    let suite = "suite: same\nenvironment: kv\nscorers: [{includes: x}]\ntasks: [{id: a, input: hi}]\n";
    sb.write("a.yaml", suite);
    sb.write("b.yaml", suite);
    let run = sb.run(&["validate", "a.yaml", "b.yaml"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("b.yaml: suite name `same` is already used by a.yaml"), "{run:?}");
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
    let err = error_for(&format!("{GOOD_HEAD}  - {{id: a, input: hi}}\n\0\n  - {{id: b, input: ho}}\n"));
    assert!(err.contains("tasks/bad.yaml:7:1:") && err.contains("NUL"), "{err}");
    let err = error_for(&format!("{GOOD_HEAD}  - {{id: a, input: hi\0there}}\n"));
    assert!(err.contains("tasks/bad.yaml:6:22:") && err.contains("NUL"), "{err}");
    let err = error_for(&format!("{GOOD_HEAD}  - {{id: a, input: \"bell\x07\"}}\n"));
    assert!(err.contains("tasks/bad.yaml:6:") && err.contains("U+0007"), "{err}");
}

#[test]
fn a_byte_order_mark_is_accepted() {
    let out = accepted(&format!("\u{feff}{GOOD_HEAD}  - {{id: a, input: hi}}\n"));
    assert!(out.contains("suite `s`: 1 tasks"), "{out}");
}

#[test]
fn unquoted_numbers_written_another_way_are_read_as_numbers_where_numbers_are_expected() {
    accepted(
        "suite: s\nenvironment: kv\nlimits: {time_s: 1e3, max_cost_usd: 1.50}\n\
         scorers: [{numeric: \"{{ target }}\", tolerance: 1e-3}]\ntasks:\n  - {id: a, input: hi, target: 1e3}\n",
    );
}

#[test]
fn an_explicit_start_of_the_one_yaml_document_is_fine() {
    accepted(&format!("---\n{GOOD_HEAD}  - {{id: a, input: hi}}\n"));
}

#[test]
fn an_agent_of_kind_tool_calling_is_accepted() {
    accepted(&format!("agent: {{kind: tool_calling, system: be brief}}\n{GOOD_HEAD}  - {{id: a, input: hi}}\n"));
}

#[test]
fn a_whole_number_written_with_an_exponent_is_accepted_where_a_count_is_expected() {
    // The manual: "where a number is expected, an unquoted one may be written any YAML way".
    let out = accepted(
        "suite: s\nenvironment: kv\nlimits: {max_steps: 1e2, max_tokens: 2.5e4}\nepochs: 1e0\n\
         scorers: [{includes: x}]\ntasks:\n  - {id: a, input: hi}\n",
    );
    assert!(out.contains("suite `s`: 1 tasks"), "{out}");
    // A fraction is still not a count.
    let err = error_for(&format!("limits: {{max_steps: 1.5e0}}\n{GOOD_HEAD}  - {{id: a, input: hi}}\n"));
    assert!(err.contains("tasks/bad.yaml:1:") && err.contains("found 1.5e0"), "{err}");
}
