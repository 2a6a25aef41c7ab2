//! The stale-file check the agent makes before each model call (`changed_files`), for an
//! actor that knows 100 files: through a real `shell` world (each known file's digest taken
//! again from disk), and the in-memory comparison alone (`WorldModel::take_changes`).

use std::collections::BTreeMap;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

use runner::agent::WorldView;
use runner::contract::{Actor, ToolCall};
use runner::domain::Task;
use runner::environment::definition::Definition;
use runner::environment::kinds::shell::world_model::{WorldModel, digest_of};
use runner::environment::{Environment, SetupContext, kinds};
use runner::log::EventLog;

const FILES: usize = 100;

fn task() -> Task {
    let files: BTreeMap<String, String> =
        (0..FILES).map(|i| (format!("src/f{i:03}.txt"), format!("line one of {i}\nline two\n").repeat(20))).collect();
    Task { files, ..Task::new("bench", "go") }
}

fn changed_files(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let definition = Arc::new(Definition::builtin(kinds::find("shell").expect("the shell kind")));
    let dir = tempfile::tempdir().expect("temp dir");
    let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "bench").expect("event log");
    let recorder = log.recorder("ep_bench");
    let env = runtime.block_on(Environment::setup(definition, &task(), &SetupContext::new(dir.path(), "bench")));
    let env = env.expect("a shell world");
    // main reads every file, main.1 writes one of them: main knows 100 files, one changed.
    for i in 0..FILES {
        let call = ToolCall::new(format!("c{i}"), "read_file", json!({"path": format!("src/f{i:03}.txt")}));
        let obs = runtime.block_on(env.act(&call, 1, &recorder));
        assert!(obs.error.is_none(), "{obs:?}");
    }
    let write = ToolCall {
        actor: Actor::Subagent(vec![1]),
        ..ToolCall::new("w", "write_file", json!({"path": "src/f000.txt", "content": "new\n"}))
    };
    assert!(runtime.block_on(env.act(&write, 2, &recorder)).error.is_none());
    let first = runtime.block_on(WorldView::changed_files(&env, &Actor::Main));
    assert_eq!(first, ["src/f000.txt"], "the change is named once");

    c.bench_function("changed_files/shell, an actor knowing 100 files", |b| {
        b.iter(|| {
            let changed = runtime.block_on(WorldView::changed_files(&env, &Actor::Main));
            assert!(changed.is_empty());
        })
    });
    runtime.block_on(env.teardown());
    drop((recorder, log));
    writer.close().expect("log closes");

    let model = WorldModel::default();
    let now: Vec<(String, Option<_>)> = (0..FILES)
        .map(|i| {
            let (path, digest) = (format!("src/f{i:03}.txt"), digest_of(format!("{i}").as_bytes()));
            model.note(&path, digest);
            (path, Some(digest))
        })
        .collect();
    c.bench_function("changed_files/take_changes alone, 100 known files", |b| {
        b.iter(|| assert!(model.take_changes(&now).is_empty()))
    });
}

criterion_group!(benches, changed_files);
criterion_main!(benches);
