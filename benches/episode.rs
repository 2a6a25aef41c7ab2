//! One whole episode: 4 model turns (mock), 3 in-process tool calls, all events written
//! through the real event log to a file.

use std::path::Path;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use tokio_util::sync::CancellationToken;

use runner::batch::{self, run_episode};
use runner::environment::sandbox::SandboxMode;
use runner::log::{EventLog, Outcome};
use runner::model::config::ModelConfig;
use runner::model::{Backend, BackendOptions};

fn whole_episode(c: &mut Criterion) {
    let suite_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/suites/kv-episode.yaml");
    let suite = Arc::new(runner::suite::load(&suite_path).expect("the bench suite loads"));
    let model = Arc::new(Backend::open("mock", &ModelConfig::default(), BackendOptions::default()).expect("mock"));
    let spec = batch::episodes(&[suite], &[model], Some(1)).next().expect("one episode");

    let dir = tempfile::tempdir().expect("temp dir");
    let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "bench").expect("event log");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let stop = CancellationToken::new();
    let graders = runner::scoring::Graders::default();

    // The episode must really pass, or the bench measures a shortcut.
    let report =
        runtime.block_on(run_episode(spec.clone(), &log, &graders, dir.path(), dir.path(), SandboxMode::On, &stop));
    assert!(matches!(report.outcome, Outcome::Scored { passed: true, .. }), "{report:?}");
    assert_eq!(report.steps, 4);

    c.bench_function("episode/kv 4 turns 3 tools", |b| {
        b.iter(|| {
            runtime.block_on(run_episode(spec.clone(), &log, &graders, dir.path(), dir.path(), SandboxMode::On, &stop))
        });
    });
    drop(log);
    writer.close().expect("log closes");
}

criterion_group!(benches, whole_episode);
criterion_main!(benches);
