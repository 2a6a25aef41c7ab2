//! `execute_code`: scripts that call the environment's tools as functions, over a socket,
//! through the same checks as the agent's own calls; every way a script can go wrong ends
//! in a clear result.

use serde_json::{Value, json};

use crate::{Sandbox, of_type, tool_observations};

/// One episode of `kv` with `execute_code` (settings `settings`), the agent sending each
/// of `scripts` in its own turn; returns the scripts' results in order, and the events.
fn run_scripts(settings: &str, extra_env: &str, scripts: &[&str]) -> (Vec<Value>, Vec<Value>) {
    let sb = Sandbox::new();
    sb.write("environments/kvs.yaml", &format!("kind: kv\nexecute_code: {settings}\n{extra_env}"));
    let mut mock = String::new();
    for code in scripts {
        mock.push_str(&format!(
            "      - tool_calls: [{{name: execute_code, arguments: {}}}]\n",
            json!({ "code": code })
        ));
    }
    mock.push_str("      - text: ok\n");
    sb.write(
        "s.yaml",
        &format!("suite: scripts\nenvironment: kvs\nscorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n    mock:\n{mock}"),
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let results = tool_observations(&events)
        .into_iter()
        .filter(|o| !o["done"].as_bool().unwrap_or(false))
        .map(|o| if o["error"].is_null() { o["tool_result"].clone() } else { o["error"].clone() })
        .collect();
    (results, events)
}

fn inner_calls<'a>(events: &'a [Value], parent: &str) -> Vec<&'a Value> {
    of_type(events, "inner_call").into_iter().filter(|e| e["parent"] == parent).collect()
}

#[test]
fn three_inner_calls_run_in_the_world_and_each_is_logged_under_its_script() {
    let script = "for i in range(2):\n    kv_set(f'k{i}', str(i + 40))\nprint(kv_get('k1')['value'])";
    let (results, events) = run_scripts("true", "", &[script, "print(kv_list()['keys'])"]);
    assert_eq!(results[0]["status"], "success", "{}", results[0]);
    assert_eq!(results[0]["output"], "41\n");
    assert_eq!(results[0]["tool_calls_made"], 3);
    assert!(results[0]["duration_s"].as_f64().is_some_and(|d| d > 0.0));
    let inner = inner_calls(&events, "c_1");
    let names: Vec<&str> = inner.iter().map(|e| e["call"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["kv_set", "kv_set", "kv_get"]);
    assert_eq!(inner[2]["observation"]["tool_result"]["value"], "41");
    assert_eq!(inner[0]["call"]["call_id"], "c_1.1");
    // The world keeps what the first script did.
    assert!(results[1]["output"].as_str().unwrap().contains("'k0', 'k1'"), "{}", results[1]);
    // The scripts' sandbox is recorded, though kv itself starts no process.
    let info = &of_type(&events, "observation")[0]["observation"]["info"];
    assert_eq!(info["sandbox"]["enabled"], true, "{info}");
    // Inner calls are not the agent's own: only the two scripts were dispatched.
    assert_eq!(of_type(&events, "action_dispatched").len(), 3, "two scripts and the answer");
}

#[test]
fn the_call_past_the_limit_gets_an_error_and_does_not_run() {
    let script = "for i in range(51):\n    try:\n        kv_set('n', str(i))\n    except ToolError as e:\n        print(i, e.type, e.message)\nprint(kv_get('n')['value'])";
    let (results, events) = run_scripts("true", "", &[script]);
    assert_eq!(results[0]["output"], "50 ExecutionError this script has made its 50 tool calls; no more are run\n");
    // The 52nd request (the kv_get) is refused too, and its error ends the script.
    assert_eq!(results[0]["status"], "error", "{}", results[0]);
    let errors = results[0]["errors"].as_str().unwrap();
    assert!(errors.contains("ToolError: ExecutionError: this script has made its 50 tool calls"), "{errors}");
    assert_eq!(results[0]["tool_calls_made"], 50);
    assert_eq!(inner_calls(&events, "c_1").len(), 50);
}

#[test]
fn tools_a_script_may_not_call_are_refused_and_rules_apply_inside() {
    let excluded = "for name in ['final_answer', 'execute_code']:\n    try:\n        runner_tools._call(name, {'answer': 'x', 'code': '1'})\n    except ToolError as e:\n        print(e.type)\nprint(hasattr(runner_tools, 'final_answer'), hasattr(runner_tools, 'execute_code'))";
    let denied = "try:\n    kv_set('k', 'v')\nexcept ToolError as e:\n    print(e.type, e.message)";
    let (results, events) = run_scripts("true", "permissions:\n  - kv_set: deny\n", &[excluded, denied]);
    assert_eq!(results[0]["output"], "ToolNotFound\nToolNotFound\nFalse False\n", "{}", results[0]);
    let output = results[1]["output"].as_str().unwrap();
    assert!(output.starts_with("PermissionError") && output.contains("kv_set: deny"), "{output}");
    let permission = of_type(&events, "permission");
    assert!(permission.iter().any(|p| p["call_id"] == "c_2.1" && p["decision"] == "deny"), "{permission:?}");
}

#[test]
fn a_syntax_error_a_hang_and_a_crash_each_end_in_a_clear_result() {
    let hang = "import time\nprint('started', flush=True)\ntime.sleep(60)";
    let crash = "import os\nkv_set('before', 'crash')\nos.kill(os.getpid(), 9)";
    let exception = "kv_get('no such key')";
    let (results, _) = run_scripts("{timeout_s: 1}", "", &["def f(:\n    pass", hang, crash, exception]);
    assert_eq!(results[0]["status"], "error");
    assert!(results[0]["errors"].as_str().unwrap().contains("SyntaxError"), "{}", results[0]);
    assert_eq!(results[1]["status"], "timeout", "{}", results[1]);
    assert_eq!(results[1]["output"], "started\n");
    assert!(results[1]["duration_s"].as_f64().unwrap() < 10.0, "{}", results[1]);
    assert_eq!(results[2]["status"], "interrupted", "{}", results[2]);
    assert_eq!(results[2]["tool_calls_made"], 1);
    assert!(results[2]["errors"].as_str().unwrap().contains("signal 9"), "{}", results[2]);
    assert_eq!(results[3]["status"], "error");
    assert!(results[3]["errors"].as_str().unwrap().contains("ToolError"), "{}", results[3]);
}

#[test]
fn a_script_runs_in_the_sandbox_with_capped_output() {
    let escape = "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), 1)\nexcept OSError as e:\n    print('socket', type(e).__name__)\ntry:\n    open('/tmp/runner-script-escape', 'w')\nexcept OSError as e:\n    print('write', type(e).__name__)";
    let flood = "print('x' * 200000)";
    let endless = "runner_tools._sock.sendall(b'x' * (17 << 20))\nprint(runner_tools._reader.readline().decode())";
    let (results, _) = run_scripts("{stdout_bytes: 1000}", "", &[escape, flood, endless]);
    // The runner reads no more than one request's worth, answers, and hangs up.
    let (output, errors) = (results[2]["output"].as_str().unwrap(), results[2]["errors"].as_str().unwrap());
    assert!(
        output.contains("longer than 16777216 bytes; the connection is closed") || errors.contains("BrokenPipeError"),
        "{}",
        results[2]
    );
    assert_eq!(results[0]["output"], "socket PermissionError\nwrite PermissionError\n", "{}", results[0]);
    assert!(!std::path::Path::new("/tmp/runner-script-escape").exists());
    let output = results[1]["output"].as_str().unwrap();
    assert!(output.len() < 1200 && output.contains("output truncated: showing 1000 of 200001 bytes"), "{output}");
}

/// Regression: the tool functions shared one socket with no lock, so threads that called
/// them at once interleaved their requests and answers and the script hung to its timeout.
#[test]
fn tool_functions_called_from_many_threads_at_once_each_get_their_own_answer() {
    let script = "import threading\nresults = {}\ndef work(i):\n    kv_set(f'k{i}', str(i))\n    results[i] = kv_get(f'k{i}')['value']\nthreads = [threading.Thread(target=work, args=(i,)) for i in range(20)]\nfor t in threads: t.start()\nfor t in threads: t.join()\nprint(all(results[i] == str(i) for i in range(20)), len(results))";
    let (results, _) = run_scripts("{max_calls: 100, timeout_s: 30}", "", &[script]);
    assert_eq!(results[0]["status"], "success", "{}", results[0]);
    assert_eq!(results[0]["output"], "True 20\n", "{}", results[0]);
    assert_eq!(results[0]["tool_calls_made"], 40);
}

#[test]
fn ten_thousand_inner_calls_with_big_results_keep_the_log_small() {
    let sb = Sandbox::new();
    sb.write("environments/kvs.yaml", "kind: kv\nexecute_code: {max_calls: 10000, timeout_s: 600}\n");
    let code = "for i in range(10000):\n    runner_tools.kv_get(key='big')\nprint('done')";
    let call = json!({"name": "execute_code", "arguments": {"code": code}});
    sb.write(
        "s.yaml",
        &format!(
            "suite: scripts\nenvironment: kvs\nlimits: {{max_steps: 5, time_s: 600}}\nscorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n    files: {{big: {}}}\n    mock:\n      - tool_calls: [{call}]\n      - text: ok\n",
            "x".repeat(8000)
        ),
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    assert_eq!(of_type(&events, "inner_call").len(), 10_000);
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["passed"], true, "{}", finished[0]);
    // Whole, the inner calls' results alone would be 80 MB.
    let size = std::fs::metadata(sb.path().join("results/test/events.jsonl")).map(|m| m.len()).unwrap_or(0);
    assert!(size < 12 << 20, "the log is {size} bytes");
    let first = &of_type(&events, "inner_call")[0];
    assert!(first["observation"]["tool_result"].to_string().contains("[... cut: showing"), "{first}");
}
