//! One whole episode: 4 model turns (mock), 3 in-process tool calls, all events written
//! through the real event log to a file. And one with a delegation: the main agent and two
//! concurrent subagents, 4 turns each; its CPU time per episode is printed as well.

use std::path::Path;
use std::sync::Arc;

mod common;
use common::cpu_time;
use criterion::{Criterion, criterion_group, criterion_main};
use tokio_util::sync::CancellationToken;

use runner::batch::{self, Grounds, run_episode};
use runner::log::{EventLog, Outcome};
use runner::model::config::ModelConfig;
use runner::model::{Backend, BackendOptions};
use runner::sandbox::SandboxMode;

fn whole_episode(c: &mut Criterion) {
    bench_episode(c, "kv-episode.yaml", "episode/kv 4 turns 3 tools", 4);
}

/// The main agent and two concurrent children, 4 turns each.
fn episode_with_subagents(c: &mut Criterion) {
    bench_episode(c, "kv-subagents.yaml", "episode/kv delegation main + 2 concurrent children, 4 turns each", 12);
}

/// Benches the one episode of `benches/suites/SUITE` (which must pass in `steps` steps, or
/// the bench would measure a shortcut) and prints its CPU time per episode.
fn bench_episode(c: &mut Criterion, suite: &str, name: &str, steps: u32) {
    let suite_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/suites").join(suite);
    let suite = Arc::new(runner::suite::load(&suite_path).expect("the bench suite loads"));
    let model = Arc::new(Backend::open("mock", &ModelConfig::default(), BackendOptions::default()).expect("mock"));
    let spec = batch::episodes(&[suite], &[model], Some(1)).next().expect("one episode");

    let dir = tempfile::tempdir().expect("temp dir");
    let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "bench").expect("event log");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let stop = CancellationToken::new();
    let roster = runner::batch::Roster::default();
    let grounds = Grounds {
        scratch: Arc::new(runner::batch::Scratch::at(dir.path()).expect("a scratch folder")),
        run_dir: dir.path().into(),
        sandbox: SandboxMode::On,
        keep_worlds: None,
        run_stop: stop.clone(),
    };
    let episode = || runtime.block_on(run_episode(spec.clone(), None, &log, &roster, &grounds, &stop));

    let report = episode();
    assert!(matches!(report.outcome, Outcome::Scored { passed: true, .. }), "{report:?}");
    assert_eq!(report.steps, steps);

    c.bench_function(name, |b| b.iter(episode));
    let per_episode = cpu_per_episode(|| {
        episode();
    });
    println!("{name}: CPU per episode {per_episode}");
    drop(log);
    writer.close().expect("log closes");
}

/// The CPU time (every thread of the process: the log's writer included) of one run of
/// `episode`, the median of 5 rounds of 100.
fn cpu_per_episode(mut episode: impl FnMut()) -> String {
    const N: u32 = 100;
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let before = cpu_time();
            for _ in 0..N {
                episode();
            }
            (cpu_time() - before).as_secs_f64() * 1e6 / f64::from(N)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    format!("{:.0} µs (median of 5 rounds of {N}; rounds {:.0?})", rounds[2], rounds)
}

criterion_group!(benches, whole_episode, episode_with_subagents);
criterion_main!(benches);
