//! Permission rules on paths through a whole run: a path spelt another way is the same
//! path, and a `grep` over the folder shows nothing of a file the rules keep from reading.

use crate::{Sandbox, tool_observations};

#[test]
fn a_denied_file_spelt_another_way_is_still_denied_and_grep_does_not_print_it() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        r#"suite: guarded
environment: shell
permissions:
  - write_file(secret.txt): deny
  - read_file(secret.txt): deny
scorers: [{includes: ok}]
tasks:
  - id: t
    input: go
    files: {secret.txt: "TOKEN=hunter2\n", notes.txt: "TOKEN is in secret.txt\n"}
    mock:
      - tool_calls:
          - {name: write_file, id: w1, arguments: {path: ./secret.txt, content: x}}
          - {name: write_file, id: w2, arguments: {path: secret.txt/., content: x}}
          - {name: write_file, id: w3, arguments: {path: .//secret.txt, content: x}}
          - {name: read_file, id: r1, arguments: {path: ./secret.txt}}
          - {name: grep, id: g1, arguments: {pattern: TOKEN, path: .}}
      - text: ok
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let obs = tool_observations(&events);
    let by_id = |id: &str| obs.iter().find(|o| o["call_id"] == id).copied().unwrap_or_else(|| panic!("no {id}"));
    for id in ["w1", "w2", "w3", "r1"] {
        assert_eq!(by_id(id)["error"]["type"], "PermissionError", "{}", by_id(id));
    }
    let grep = by_id("g1");
    let matches = grep["tool_result"]["matches"].as_str().unwrap_or_default();
    assert!(matches.contains("notes.txt:1:TOKEN is in secret.txt"), "{grep}");
    assert!(!matches.contains("hunter2"), "grep printed the denied file: {grep}");
}
