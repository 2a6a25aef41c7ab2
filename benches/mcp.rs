//! MCP over stdio against the reference server (`@modelcontextprotocol/server-everything`,
//! installed by `scripts/install-test-servers.sh`), in the sandbox: one `echo` call's round
//! trip through `Environment::execute` (schema check, `tools/call`, the result mapped);
//! 8 episodes calling at once, each with its own server (calls per second = 8 × 64 / the
//! time of one iteration); and a server's start + `initialize` + `tools/list` (+ its teardown).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;

use runner::contract::{Actor, ToolCall};
use runner::domain::Task;
use runner::environment::definition::Definition;
use runner::environment::{Environment, SetupContext};
use runner::sandbox::SandboxMode;

fn task() -> Task {
    Task::new("bench", "go")
}

fn everything_js() -> PathBuf {
    let dir = match std::env::var_os("RUNNER_TEST_SERVERS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/runner-test-servers"),
    };
    let js = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(js.is_file(), "{} is missing: run scripts/install-test-servers.sh", js.display());
    js
}

fn echo(i: usize) -> ToolCall {
    ToolCall {
        call_id: format!("c{i}"),
        name: "echo".into(),
        arguments: json!({"message": "hello"}),
        actor: Actor::Main,
    }
}

fn mcp(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("everything.yaml");
    let text = format!(
        "kind: mcp\nlimits: {{max_concurrency: 64}}\nservers:\n  - {{name: everything, command: node, args: [\"{}\", stdio]}}\n",
        everything_js().display()
    );
    std::fs::write(&file, text).expect("write the environment");
    let loaded = Arc::new(Definition::load(&file).expect("the environment loads"));
    let definition = runtime.block_on(loaded.discovered(SandboxMode::On)).expect("the server's tools");
    let task = task();
    let context = SetupContext::new(dir.path(), "bench");
    let started = AtomicBool::new(false);

    let env = runtime.block_on(Environment::setup(definition.clone(), &task, &context)).expect("an MCP world");
    let obs = runtime.block_on(env.execute(&echo(0), &started));
    // The call must really reach the server, or the bench measures a failure.
    assert_eq!(
        obs.tool_result.as_ref().map(|r| r["content"][0]["text"].clone()),
        Some(json!("Echo: hello")),
        "{obs:?}"
    );
    c.bench_function("mcp echo round trip (stdio, sandboxed)", |b| {
        b.iter(|| runtime.block_on(env.execute(&echo(1), &started)))
    });
    runtime.block_on(env.teardown());

    let envs: Vec<Environment> = (0..8)
        .map(|_| runtime.block_on(Environment::setup(definition.clone(), &task, &context)).expect("an MCP world"))
        .collect();
    let mut group = c.benchmark_group("mcp 8 episodes x 64 echo calls");
    group.throughput(Throughput::Elements(8 * 64));
    group.sample_size(20);
    group.bench_function("concurrent", |b| {
        b.iter(|| {
            runtime.block_on(futures::future::join_all(envs.iter().map(|env| async {
                for i in 0..64 {
                    let obs = env.execute(&echo(i), &started).await;
                    assert!(obs.error.is_none(), "{obs:?}");
                }
            })))
        })
    });
    group.finish();
    for env in envs {
        runtime.block_on(env.teardown());
    }

    let mut group = c.benchmark_group("mcp server");
    group.sample_size(10);
    group.bench_function("start + initialize + tools/list + teardown (stdio, sandboxed)", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let env = Environment::setup(definition.clone(), &task, &context).await.expect("an MCP world");
                env.teardown().await;
            })
        })
    });
    group.finish();
}

criterion_group!(benches, mcp);
criterion_main!(benches);
