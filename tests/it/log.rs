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
