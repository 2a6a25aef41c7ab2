//! Reading logs back: a torn last line is tolerated, unknown fields and types are kept.

use runner::log::{Event, read_events};

use crate::Sandbox;

#[test]
fn a_torn_last_line_and_unknown_fields_are_tolerated() {
    let sb = Sandbox::new();
    sb.write("s.yaml", "suite: s\nenvironment: kv\nscorers: [{equals: \"4\"}]\ntasks:\n  - {id: a, input: hi, mock: [{text: \"4\"}]}\n");
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    let path = sb.path().join("results/test/events.jsonl");
    let complete = read_events(&path).unwrap();
    assert!(!complete.torn_last_line);
    let n = complete.events.len();

    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"v\":2,\"run_id\":\"test\",\"seq\":999,\"ts\":\"2026-01-01T00:00:00Z\",\"type\":\"from_the_future\",\"extra\":[1]}\n");
    text.push_str("{\"v\":1,\"run_id\":\"test\",\"seq\":1000,\"ts\":\"2026-01-01T00:00:00Z\",\"type\":\"epis");
    std::fs::write(&path, text).unwrap();
    let read = read_events(&path).unwrap();
    assert!(read.torn_last_line);
    assert_eq!(read.events.len(), n + 1);
    let future = read.events.last().unwrap();
    assert_eq!(future.kind, "from_the_future");
    assert!(future.event().is_none());
    assert_eq!(future.fields["extra"], serde_json::json!([1]));
    assert!(matches!(read.events[0].event(), Some(Event::RunStarted { .. })));
}

#[test]
fn a_bad_line_in_the_middle_is_an_error_that_names_the_line() {
    let sb = Sandbox::new();
    let path = sb.write("events.jsonl", "{\"v\":1,\"run_id\":\"r\",\"seq\":1,\"ts\":\"t\",\"type\":\"x\"}\nnot json\n{\"v\":1,\"run_id\":\"r\",\"seq\":3,\"ts\":\"t\",\"type\":\"x\"}\n");
    let err = read_events(&path).unwrap_err().to_string();
    assert!(err.contains(":2:"), "{err}");
}

#[test]
fn a_last_line_torn_inside_a_multibyte_character_is_tolerated() {
    let sb = Sandbox::new();
    let mut bytes = b"{\"v\":1,\"run_id\":\"r\",\"seq\":1,\"ts\":\"t\",\"type\":\"x\"}\n".to_vec();
    bytes.extend_from_slice(
        "{\"v\":1,\"run_id\":\"r\",\"seq\":2,\"ts\":\"t\",\"type\":\"final\",\"answer\":\"caf".as_bytes(),
    );
    bytes.push("é".as_bytes()[0]);
    let path = sb.path().join("events.jsonl");
    std::fs::write(&path, bytes).unwrap();
    let read = read_events(&path).unwrap();
    assert!(read.torn_last_line);
    assert_eq!(read.events.len(), 1);
}

/// The log of a fixed mock run, byte for byte, with what varies from run to run (the time
/// of each event, timings, the command line) masked: a change to how events are built or
/// written must not change what is written.
#[test]
fn a_mock_runs_log_is_written_byte_for_byte_as_expected() {
    let sb = Sandbox::new();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/log");
    sb.write("s.yaml", &std::fs::read_to_string(fixtures.join("logged.yaml")).unwrap());
    // One episode at a time, so that the events come in one order.
    let run = sb.run(&[
        "eval", "s.yaml", "--model", "mock", "--epochs", "2", "-j", "1", "--run-id", "golden", "--out", "results",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    let written = std::fs::read_to_string(sb.path().join("results/golden/events.jsonl")).unwrap();
    let expected = std::fs::read_to_string(fixtures.join("logged.expected.jsonl")).unwrap();
    let masked = mask_varying(&written);
    for (i, (got, want)) in masked.lines().zip(expected.lines()).enumerate() {
        assert_eq!(got, want, "line {} of the log", i + 1);
    }
    assert_eq!(masked.lines().count(), expected.lines().count(), "{masked}");
    assert!(masked.ends_with('\n'));
}

/// The log's text with each event's time, each timing and the command line replaced by
/// fixed values.
fn mask_varying(log: &str) -> String {
    let masks = [
        (r#""ts":"[^"]*""#, r#""ts":"T""#),
        (r#""(wall_ms|loop_ms|latency_ms)":[0-9.eE+-]+"#, r#""$1":0"#),
        (r#""command_line":\[[^\]]*\]"#, r#""command_line":[]"#),
    ];
    let mut text = log.to_owned();
    for (pattern, with) in masks {
        text = regex::Regex::new(pattern).unwrap().replace_all(&text, with).into_owned();
    }
    text
}
