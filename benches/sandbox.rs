//! The sandbox's cost: `run_command("true")` in a `shell` world with the sandbox on and
//! off, and the setup of a world (the sandbox is prepared once per world).

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

use runner::contract::{Actor, ToolCall};
use runner::domain::Task;
use runner::environment::definition::Definition;
use runner::environment::{Environment, SetupContext, kinds};
use runner::log::EventLog;
use runner::sandbox::SandboxMode;

fn task() -> Task {
    Task::new("bench", "go")
}

fn sandbox(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let shell = kinds::find("shell").expect("the shell kind");
    let definition = Arc::new(Definition::builtin(shell));
    let task = task();
    let dir = tempfile::tempdir().expect("temp dir");
    for (label, mode) in [("sandboxed", SandboxMode::On), ("unsandboxed", SandboxMode::Off("the bench"))] {
        let context = SetupContext { sandbox: mode, ..SetupContext::new(dir.path(), "bench") };
        let env = runtime.block_on(Environment::setup(definition.clone(), &task, &context)).expect("a shell world");
        // The command must really run, in the sandbox asked for, or the bench measures a failure.
        let call = || env.world().call(&Actor::Main, "run_command", json!({"command": "true"}));
        let out = runtime.block_on(call()).expect("`true` runs");
        assert_eq!(out["exit_code"], 0, "{out}");
        let probe = runtime
            .block_on(env.world().call(
                &Actor::Main,
                "run_command",
                json!({"command": "grep -c . /etc/hostname; echo x > /tmp/x"}),
            ))
            .expect("the probe runs");
        let confined = probe["stderr"].as_str().is_some_and(|e| e.contains("Permission denied"));
        assert_eq!(confined, mode == SandboxMode::On, "{probe}");

        c.bench_function(&format!("run_command true/{label}"), |b| b.iter(|| runtime.block_on(call())));
        c.bench_function(&format!("shell world setup and teardown/{label}"), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let env = Environment::setup(definition.clone(), &task, &context).await.expect("a shell world");
                    env.teardown().await;
                })
            })
        });
        runtime.block_on(env.teardown());
    }
}

/// `execute_code` on `kv`: a script of 20 inner calls against one of none; the difference
/// over 20 is what each inner call costs (socket, JSON, the environment's checks, the world).
fn scripts(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/suites/environments/kv-scripts.yaml");
    let definition = Arc::new(Definition::load(&path).expect("the bench environment loads"));
    let dir = tempfile::tempdir().expect("temp dir");
    let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "bench").expect("event log");
    let recorder = log.recorder("ep_bench");
    let context = SetupContext::new(dir.path(), "bench");
    let env = runtime.block_on(Environment::setup(definition, &task(), &context)).expect("a kv world with scripts");
    let calls = |n: u32| {
        format!("for i in range({}):\n    kv_set(f'k{{i}}', 'v')\n    kv_get(f'k{{i}}')\nprint('done')", n / 2)
    };
    let (twenty, thousand) = (calls(20), calls(1000));
    for (label, code, calls) in
        [("0 inner calls", "print('done')", 0), ("20 inner calls", &twenty, 20), ("1000 inner calls", &thousand, 1000)]
    {
        let call = ToolCall::new("c_1", "execute_code", json!({"code": code}));
        let run = || env.act(&call, 1, &recorder);
        let out = runtime.block_on(run());
        let result = out.tool_result.expect("the script ran");
        assert_eq!((result["status"].as_str(), result["tool_calls_made"].as_u64()), (Some("success"), Some(calls)));
        assert_eq!(result["output"], "done\n", "{result}");
        c.bench_function(&format!("execute_code/{label}"), |b| b.iter(|| runtime.block_on(run())));
    }
    runtime.block_on(env.teardown());
    // The writer closes once every handle on the log is gone.
    drop(recorder);
    drop(log);
    writer.close().expect("log closes");
}

criterion_group!(benches, sandbox, scripts);
criterion_main!(benches);
