//! The external agent protocol's overhead per turn, with the Python reference client
//! (`examples/agents/echo_agent.py`) in one reused process: an episode of 2 turns and one of
//! 22 (each turn reads a small file in a `shell` world), whole episodes through the real
//! event log. The difference over 20 turns is what one more round trip costs: runner's CPU
//! (its own process; the client's is not counted) and wall time. Both are printed as medians.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

mod common;
use common::cpu_time;
use criterion::{Criterion, criterion_group, criterion_main};
use tokio_util::sync::CancellationToken;

use runner::batch::{self, EpisodeSpec, Grounds, run_episode};
use runner::log::{EventLog, Outcome};
use runner::model::config::ModelConfig;
use runner::model::{Backend, BackendOptions};
use runner::sandbox::SandboxMode;

const EXTRA_TURNS: f64 = 20.0;

fn protocol_round_trip(c: &mut Criterion) {
    let suite_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/suites/external-turns.yaml");
    let suite = Arc::new(runner::suite::load(&suite_path).expect("the bench suite loads"));
    let model = Arc::new(Backend::open("mock", &ModelConfig::default(), BackendOptions::default()).expect("mock"));
    let specs: Vec<EpisodeSpec> = batch::episodes(&[suite], &[model], Some(1)).collect();
    let (short, long) = (&specs[0], &specs[1]);

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
    let episode =
        |spec: &EpisodeSpec| runtime.block_on(run_episode(spec.clone(), None, &log, &roster, &grounds, &stop));
    for (spec, steps) in [(short, 2), (long, 22)] {
        let report = episode(spec);
        assert!(matches!(report.outcome, Outcome::Scored { passed: true, .. }), "{report:?}");
        assert_eq!(report.steps, steps);
    }

    c.bench_function("external/episode of 22 turns, python reference client", |b| b.iter(|| episode(long)));

    let (short_cpu, short_wall) = per_episode(|| {
        episode(short);
    });
    let (long_cpu, long_wall) = per_episode(|| {
        episode(long);
    });
    let us = |d: f64| d * 1e6;
    println!(
        "external: 2-turn episode {:.0} µs CPU, {:.0} µs wall; 22-turn episode {:.0} µs CPU, {:.0} µs wall",
        us(short_cpu),
        us(short_wall),
        us(long_cpu),
        us(long_wall)
    );
    println!(
        "external: per protocol round trip (turn): runner CPU {:.0} µs, wall {:.0} µs (medians of 5 rounds of 30)",
        us((long_cpu - short_cpu) / EXTRA_TURNS),
        us((long_wall - short_wall) / EXTRA_TURNS)
    );
    drop(log);
    writer.close().expect("log closes");
}

/// Runner's CPU and the wall time of one run of `episode`, in seconds: medians of 5 rounds of 30.
fn per_episode(mut episode: impl FnMut()) -> (f64, f64) {
    const N: u32 = 30;
    let mut cpu = Vec::new();
    let mut wall = Vec::new();
    for _ in 0..5 {
        let (before, started) = (cpu_time(), Instant::now());
        for _ in 0..N {
            episode();
        }
        cpu.push((cpu_time() - before).as_secs_f64() / f64::from(N));
        wall.push(started.elapsed().as_secs_f64() / f64::from(N));
    }
    cpu.sort_by(f64::total_cmp);
    wall.sort_by(f64::total_cmp);
    (cpu[2], wall[2])
}

criterion_group!(benches, protocol_round_trip);
criterion_main!(benches);
