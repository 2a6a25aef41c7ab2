//! The `python` world with a real interpreter in the sandbox. Each test is skipped, saying
//! so, on a machine without a usable `python3`.

use serde_json::{Value, json};

use super::*;
use crate::environment::Definition;

fn task() -> Task {
    Task { files: [("data.txt".to_owned(), "1 2 3\n".to_owned())].into(), ..Task::new("t", "go") }
}

/// A world in a fresh folder, or `None` (with a message) when this machine has no Python.
async fn world() -> Option<(tempfile::TempDir, PythonWorld)> {
    if let Err(e) = interpreter::find(None).await {
        eprintln!("skipped: no usable python3 on this machine: {e}");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let definition = Definition::builtin(&Python);
    let world = PythonWorld::create(&definition, &task(), &SetupContext::new(dir.path(), "ep_test")).await.unwrap();
    Some((dir, world))
}

async fn call(world: &PythonWorld, tool: &str, arguments: Value) -> Result<Value, ToolFailure> {
    world.call(&Actor::Main, tool, arguments).await
}

async fn ok(world: &PythonWorld, tool: &str, arguments: Value) -> Value {
    match call(world, tool, arguments.clone()).await {
        Ok(result) => result,
        Err(f) => panic!("{tool}({arguments}) failed: {f:?}"),
    }
}

async fn failure(world: &PythonWorld, tool: &str, arguments: Value) -> ToolFailure {
    match call(world, tool, arguments.clone()).await {
        Ok(result) => panic!("{tool}({arguments}) succeeded: {result}"),
        Err(f) => f,
    }
}

#[tokio::test]
async fn a_defined_function_stays_defined_and_is_called_with_json_arguments() {
    let Some((_dir, w)) = world().await else { return };
    let source = "def add(a, b=10):\n    return a + b\n\nclass Box:\n    pass\n";
    let defined = ok(&w, "define_function", json!({"source": source})).await;
    assert_eq!(defined["defined"], json!(["add(a, b=10)", "Box()"]));
    let positional = ok(&w, "call_function", json!({"name": "add", "args": [2, 3]})).await;
    assert_eq!(positional, json!({"value": 5, "type": "int"}));
    let by_name = ok(&w, "call_function", json!({"name": "add", "args": ["a"], "kwargs": {"b": "z"}})).await;
    assert_eq!(by_name["value"], "az");
    let unknown = failure(&w, "call_function", json!({"name": "sub"})).await;
    assert_eq!(unknown.kind, ErrorType::ExecutionError);
    assert!(unknown.message.contains("no function `sub` in the session (defined: Box, add)"), "{}", unknown.message);
    let nothing = failure(&w, "define_function", json!({"source": "x = 1"})).await;
    assert!(nothing.message.contains("defined no function"), "{}", nothing.message);
}

#[tokio::test]
async fn a_variable_set_by_exec_is_read_back_by_eval_and_prints_come_back_apart() {
    let Some((_dir, w)) = world().await else { return };
    let ran =
        ok(&w, "exec", json!({"code": "x = 41\nprint('hi')\nimport sys; print('warn', file=sys.stderr)\nx + 1"})).await;
    assert_eq!(ran, json!({"value": 42, "type": "int", "stdout": "hi\n", "stderr": "warn\n"}));
    let quiet = ok(&w, "exec", json!({"code": "x = x * 2"})).await;
    assert_eq!(quiet, json!({}), "statements alone give no value");
    assert_eq!(ok(&w, "eval", json!({"code": "x"})).await["value"], 82);
    // The task's files are in the working directory.
    assert_eq!(
        ok(&w, "eval", json!({"code": "open('data.txt').read().split()"})).await["value"],
        json!(["1", "2", "3"])
    );
    // A subprocess's output is captured too, and input() reads nothing of the protocol.
    let sub = ok(&w, "exec", json!({"code": "import os\nos.system('echo from-child')"})).await;
    assert_eq!(sub["stdout"], "from-child\n", "{sub}");
    let read = failure(&w, "eval", json!({"code": "input()"})).await;
    assert!(read.message.starts_with("EOFError"), "{}", read.message);
}

#[tokio::test]
async fn a_value_json_cannot_hold_comes_back_as_its_repr() {
    let Some((_dir, w)) = world().await else { return };
    let made = ok(&w, "eval", json!({"code": "object()"})).await;
    assert_eq!(made["type"], "object");
    assert!(made["repr"].as_str().unwrap().starts_with("<object object at 0x"), "{made}");
    assert!(made.get("value").is_none(), "{made}");
    assert_eq!(ok(&w, "eval", json!({"code": "{1, 2}"})).await, json!({"repr": "{1, 2}", "type": "set"}));
    assert_eq!(ok(&w, "eval", json!({"code": "float('nan')"})).await, json!({"repr": "nan", "type": "float"}));
    let broken = ok(&w, "exec", json!({"code": "class B:\n    def __repr__(self): raise ValueError('no')\nB()"})).await;
    assert!(broken["repr"].as_str().unwrap().contains("repr failed: ValueError: no"), "{broken}");
    let big = ok(&w, "eval", json!({"code": "'x' * 100000"})).await;
    assert_eq!(big["truncated"], true, "{big}");
    assert!(big["repr"].as_str().unwrap().ends_with("[... cut: showing 32768 of 100002 characters ...]"), "{big}");
}

#[tokio::test]
async fn an_exception_is_an_execution_error_with_a_traceback_of_the_sessions_code_only() {
    let Some((_dir, w)) = world().await else { return };
    let source = "def ratio(a, b):\n    half = a - 2\n    return half / b\n";
    ok(&w, "define_function", json!({"source": source})).await;
    let err = failure(&w, "call_function", json!({"name": "ratio", "args": [4, 0]})).await;
    assert_eq!(err.kind, ErrorType::ExecutionError);
    let m = &err.message;
    assert!(m.starts_with("ZeroDivisionError: division by zero\nTraceback (most recent call last):"), "{m}");
    assert!(m.contains("File \"<define_function #1>\", line 3, in ratio\n    return half / b"), "{m}");
    assert!(!m.contains("<string>") && !m.contains("_driver"), "the driver's frames show: {m}");
    assert_eq!(err.partial, Some(json!({"exception": "ZeroDivisionError"})));
    // A deep traceback keeps only its last lines.
    let chain: String = (0..8).map(|i| format!("def f{i}():\n    return f{}()\n", i + 1)).collect();
    ok(&w, "define_function", json!({"source": format!("{chain}def f8():\n    raise ValueError('deep')\n")})).await;
    let deep = failure(&w, "call_function", json!({"name": "f0"})).await;
    assert!(deep.message.starts_with("ValueError: deep"), "{}", deep.message);
    assert!(deep.message.contains("lines cut ...]") && deep.message.lines().count() < 16, "{}", deep.message);
    assert!(deep.message.contains("line 18, in f8"), "{}", deep.message);
    // The session survives its exceptions, SystemExit included.
    failure(&w, "exec", json!({"code": "import sys; sys.exit(2)"})).await;
    assert_eq!(ok(&w, "call_function", json!({"name": "ratio", "args": [4, 1]})).await["value"], 2.0);
}

#[tokio::test]
async fn a_syntax_error_names_its_line() {
    let Some((_dir, w)) = world().await else { return };
    let err = failure(&w, "exec", json!({"code": "a = 1\nb = = 2\n"})).await;
    assert!(err.message.starts_with("SyntaxError: invalid syntax"), "{}", err.message);
    assert!(err.message.contains("File \"<exec #1>\", line 2\n    b = = 2"), "{}", err.message);
    assert!(err.suggested_action.is_some_and(|s| s.contains("`exec` statements")));
    // A statement given to eval is a syntax error too.
    let err = failure(&w, "eval", json!({"code": "c = 3"})).await;
    assert!(err.message.starts_with("SyntaxError"), "{}", err.message);
}

#[tokio::test]
async fn a_call_past_its_timeout_restarts_the_interpreter_and_says_the_state_was_lost() {
    let Some((_dir, w)) = world().await else { return };
    ok(&w, "exec", json!({"code": "kept = 1"})).await;
    let started = std::time::Instant::now();
    let err = failure(&w, "exec", json!({"code": "while True: pass", "timeout_s": 1})).await;
    assert!(started.elapsed().as_secs_f64() < 10.0, "took {:?}", started.elapsed());
    assert_eq!(err.kind, ErrorType::TimeoutError);
    assert!(err.message.contains("longer than 1s") && err.message.contains("state"), "{}", err.message);
    assert!(err.message.contains("was lost"), "{}", err.message);
    let gone = failure(&w, "eval", json!({"code": "kept"})).await;
    assert!(gone.message.starts_with("NameError"), "{}", gone.message);
    assert_eq!(ok(&w, "eval", json!({"code": "6 * 7"})).await["value"], 42);
}

#[tokio::test]
async fn an_interpreter_that_dies_is_restarted_and_says_how_it_died() {
    let Some((_dir, w)) = world().await else { return };
    ok(&w, "exec", json!({"code": "kept = 1"})).await;
    let err = failure(&w, "exec", json!({"code": "import os; os._exit(3)"})).await;
    assert_eq!(err.kind, ErrorType::ExecutionError);
    assert!(err.message.contains("died during this call (exit code 3)"), "{}", err.message);
    assert!(err.message.contains("was lost"), "{}", err.message);
    let err = failure(&w, "exec", json!({"code": "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"})).await;
    assert!(err.message.contains("killed by signal 11"), "{}", err.message);
    assert!(failure(&w, "eval", json!({"code": "kept"})).await.message.starts_with("NameError"));
    assert_eq!(ok(&w, "eval", json!({"code": "1 + 1"})).await["value"], 2);
}

#[tokio::test]
async fn an_interpreter_that_died_between_calls_is_said_to_have_died_since_the_last_call() {
    let Some((_dir, w)) = world().await else { return };
    ok(&w, "exec", json!({"code": "kept = 1"})).await;
    let pid = ok(&w, "eval", json!({"code": "__import__('os').getpid()"})).await["value"].as_i64().unwrap();
    // Killed between calls, from outside (the OOM killer, say).
    // SAFETY: kill of the interpreter this test's world started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let status = format!("/proc/{pid}/status");
    for _ in 0..3000 {
        match std::fs::read_to_string(&status) {
            Ok(text) if !text.contains("State:\tZ") => std::thread::sleep(Duration::from_millis(10)),
            _ => break,
        }
    }
    let err = failure(&w, "eval", json!({"code": "'kept' in globals()"})).await;
    assert_eq!(err.kind, ErrorType::ExecutionError);
    let said = "the interpreter died since the last call (killed by signal 9): this call did not run; a fresh \
                interpreter was started, and the session's state";
    assert!(err.message.starts_with(said), "{}", err.message);
    assert_eq!(ok(&w, "eval", json!({"code": "'kept' in globals()"})).await["value"], false);
}

#[tokio::test]
async fn the_session_runs_in_the_sandbox() {
    let Some((dir, w)) = world().await else { return };
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "outside").unwrap();
    let readable = if std::path::Path::new("/etc/hostname").exists() { "/etc/hostname" } else { "/etc/passwd" };
    ok(&w, "eval", json!({"code": format!("open('{readable}').read()")})).await;
    ok(&w, "exec", json!({"code": "open('mine.txt', 'w').write('inside')"})).await;
    assert_eq!(w.read_back("mine.txt", 100).await.unwrap().text, "inside");
    let escapes = [
        format!("open('{}').read()", secret.display()),
        "open('/tmp/runner-python-escape', 'w').write('x')".to_owned(),
        "__import__('socket').socket(__import__('socket').AF_INET)".to_owned(),
    ];
    for code in escapes {
        let err = failure(&w, "eval", json!({ "code": code })).await;
        assert!(err.message.starts_with("PermissionError"), "{code}: {}", err.message);
    }
    assert!(!std::path::Path::new("/tmp/runner-python-escape").exists());
    assert_eq!(w.describe()["sandbox"]["enabled"], true);
    assert_eq!(w.describe()["python"]["version"], json!(w.interpreter.version));
}

#[tokio::test]
async fn the_interpreter_found_is_a_real_binary_not_a_shim() {
    let Ok(found) = interpreter::find(None).await else {
        eprintln!("skipped: no usable python3 on this machine");
        return;
    };
    let start = std::fs::read(&found.executable).map(|b| b[..4].to_vec()).unwrap_or_default();
    assert_eq!(start, b"\x7fELF", "{} is not an executable binary", found.executable.display());
}

#[tokio::test]
async fn a_missing_interpreter_fails_the_setup_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut definition = Definition::builtin(&Python);
    definition.settings = KindSettings::Python { interpreter: Some("/nonexistent/python3".into()) };
    let setup = Python.setup(&definition, &task(), &SetupContext::new(dir.path(), "ep_test")).await;
    let Err(err) = setup else { panic!("a missing interpreter set up a world") };
    assert!(err.message.contains("`/nonexistent/python3` (the environment file's `python:`) does not exist"), "{err}");
}

#[tokio::test]
async fn a_call_dropped_mid_way_kills_its_interpreter_and_the_next_call_says_so() {
    let Some((_dir, w)) = world().await else { return };
    ok(&w, "exec", json!({"code": "kept = 1"})).await;
    // The environment drops a call that outlives its tool_timeout_s, so.
    let dropped =
        tokio::time::timeout(Duration::from_millis(300), call(&w, "exec", json!({"code": "while True: pass"})));
    assert!(dropped.await.is_err(), "the endless loop ended");
    let next = ok(&w, "eval", json!({"code": "'kept' in globals()"})).await;
    assert_eq!(next["value"], false, "{next}");
    assert!(next["note"].as_str().unwrap().contains("previous call was cancelled"), "{next}");
    assert!(ok(&w, "eval", json!({"code": "1"})).await.get("note").is_none(), "the note is given once");
}

fn load_text(text: &str) -> Result<Definition, crate::config::decode::ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("box.yaml");
    std::fs::write(&path, text).unwrap();
    Definition::load(&path)
}

#[test]
fn an_interpreter_is_taken_by_the_python_kind_only_and_a_relative_one_is_the_files() {
    let err = load_text("kind: shell\npython: /usr/bin/python3\n").unwrap_err();
    assert_eq!(err.position.map(|p| p.line), Some(2), "{err}");
    assert!(err.message.contains("kind `shell` takes no `python:`"), "{err}");
    let def = load_text("kind: python\npython: venv/bin/python3\n").unwrap();
    let python = interpreter_of(&def).unwrap();
    assert!(python.is_absolute() && python.ends_with("venv/bin/python3"), "{}", python.display());
    let def = load_text("kind: python\npython: python3.11\n").unwrap();
    assert_eq!(interpreter_of(&def).unwrap(), std::path::Path::new("python3.11"), "a bare name is looked up on PATH");
}
