//! The `python` environment through the binary: a session whose state lasts from call to
//! call, and an interpreter that cannot be found, which is nobody's answer.

use crate::{Sandbox, have_python, of_type, tool_observations};

#[test]
fn a_python_episode_defines_a_function_calls_it_and_its_answer_passes() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        r#"suite: py
environment: python
scorers: [{includes: "12.5"}]
tasks:
  - id: t
    input: Give the mean of 10 and 15.
    mock:
      - tool_calls: [{name: define_function, arguments: {source: "def mean(xs):\n    return sum(xs) / len(xs)\n"}}]
      - tool_calls: [{name: call_function, arguments: {name: mean, args: [[10, 15]]}}]
      - tool_calls: [{name: eval, arguments: {code: "mean"}}]
      - text: The mean is 12.5.
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let obs = tool_observations(&events);
    assert_eq!(obs[0]["tool_result"]["defined"], serde_json::json!(["mean(xs)"]), "{}", obs[0]);
    assert_eq!(obs[1]["tool_result"]["value"], 12.5, "{}", obs[1]);
    // A function is not JSON: its repr comes back instead.
    assert!(obs[2]["tool_result"]["repr"].as_str().unwrap().starts_with("<function mean"), "{}", obs[2]);
    let info = &of_type(&events, "observation")[0]["observation"]["info"];
    assert!(info["python"]["version"].as_str().is_some_and(|v| v.starts_with('3')), "{info}");
    assert_eq!(info["sandbox"]["enabled"], true, "{info}");
    let finished = of_type(&events, "episode_finished")[0];
    assert_eq!(finished["outcome"]["status"], "scored", "{finished}");
    assert_eq!(finished["outcome"]["passed"], true, "{finished}");
}

#[test]
fn a_missing_interpreter_makes_the_episode_unscored_as_an_environment_error() {
    let sb = Sandbox::new();
    sb.write("environments/py.yaml", "kind: python\npython: /nonexistent/python3\n");
    sb.write(
        "s.yaml",
        "suite: py\nenvironment: py\nscorers: [{includes: x}]\ntasks:\n  - id: t\n    input: go\n    mock:\n      - text: x\n",
    );
    let run = sb.eval(&["s.yaml"]);
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 1, "{run:?}");
    assert_eq!(finished[0]["outcome"]["status"], "unscored", "{}", finished[0]);
    assert_eq!(finished[0]["outcome"]["cause"], "environment_error", "{}", finished[0]);
    let said = format!("{}{}", serde_json::to_string(&events).unwrap(), run.stderr);
    assert!(said.contains("/nonexistent/python3") && said.contains("python:"), "{run:?}");
}
