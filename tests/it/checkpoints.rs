//! `checkpoint` and `restore` in a whole run: the working directory rolls back, and a
//! checkpoint over the environment's limit is refused with the numbers.

use crate::{Sandbox, of_type, tool_observations};

#[test]
fn restore_rolls_the_working_directory_back_and_a_checkpoint_over_the_limit_is_refused() {
    let sb = Sandbox::new();
    sb.write("environments/box.yaml", "kind: shell\nlimits: {checkpoint_bytes: 15}\n");
    sb.write(
        "s.yaml",
        r#"suite: rollback
environment: box
scorers:
  - check: "test \"$(cat keep.txt)\" = original && test ! -e new.txt"
tasks:
  - id: t
    input: go
    files: {keep.txt: original}
    mock:
      - tool_calls: [{name: checkpoint, id: c1, arguments: {name: start}}]
      - tool_calls: [{name: run_command, arguments: {command: "echo broken > keep.txt; echo more > new.txt"}}]
      - tool_calls: [{name: checkpoint, id: c2, arguments: {name: later}}]
      - tool_calls: [{name: restore, id: r1, arguments: {name: start}}]
      - tool_calls: [{name: restore, id: r2, arguments: {name: later}}]
      - text: done
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let obs = |id: &str| tool_observations(&events).into_iter().find(|o| o["call_id"] == id).cloned().unwrap();
    assert_eq!(obs("c1")["tool_result"]["bytes"], 8, "{}", obs("c1"));
    // 12 more bytes would make 8 + 12 > 15: refused, with the numbers.
    let refused = obs("c2")["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(refused.contains("it needs 12 bytes, and 7 of the checkpoint limit of 15 bytes are left"), "{refused}");
    let restored = &obs("r1")["tool_result"];
    assert_eq!((restored["restored"].as_u64(), restored["removed"].as_u64()), (Some(1), Some(1)), "{restored}");
    let unknown = obs("r2")["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert_eq!(unknown, "no checkpoint named `later`");
    let finished = &of_type(&events, "episode_finished")[0];
    assert_eq!(finished["outcome"]["passed"], true, "the final tree is not the checkpoint's: {finished}");
}
