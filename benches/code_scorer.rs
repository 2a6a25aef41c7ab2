//! A Python code scorer's cost to the runner: the same one-turn `kv` episode scored by a
//! `python:` scorer (a long-lived worker, started once) and by the built-in `equals:`,
//! 1,000 episodes each, through the real event log. The difference is what the code scorer
//! costs the runner's own process per scored episode (the worker's CPU is not counted) and
//! in wall time. Medians of 5 rounds of 200.

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

fn code_scorer(c: &mut Criterion) {
    let suite_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/suites/code-scorer.yaml");
    let suite = Arc::new(runner::suite::load(&suite_path).expect("the bench suite loads"));
    let model = Arc::new(Backend::open("mock", &ModelConfig::default(), BackendOptions::default()).expect("mock"));
    let specs: Vec<EpisodeSpec> = batch::episodes(&[suite], &[model], Some(1)).collect();
    let (python, builtin) = (&specs[0], &specs[1]);

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
    for spec in [python, builtin] {
        let report = episode(spec);
        assert!(matches!(report.outcome, Outcome::Scored { passed: true, .. }), "{report:?}");
    }

    c.bench_function("code_scorer/episode scored by a python worker", |b| b.iter(|| episode(python)));

    let (python_cpu, python_wall) = per_episode(|| {
        episode(python);
    });
    let (builtin_cpu, builtin_wall) = per_episode(|| {
        episode(builtin);
    });
    let us = |d: f64| d * 1e6;
    println!(
        "code_scorer: episode scored by python: {:.0} µs CPU, {:.0} µs wall; by equals: {:.0} µs CPU, {:.0} µs wall",
        us(python_cpu),
        us(python_wall),
        us(builtin_cpu),
        us(builtin_wall)
    );
    println!(
        "code_scorer: per python-scored episode: runner CPU {:.0} µs, wall {:.0} µs (medians of 5 rounds of 200)",
        us(python_cpu - builtin_cpu),
        us(python_wall - builtin_wall)
    );
    drop(log);
    writer.close().expect("log closes");
}

/// Runner's CPU and the wall time of one run of `episode`, in seconds: medians of 5 rounds
/// of 200 (1,000 episodes).
fn per_episode(mut episode: impl FnMut()) -> (f64, f64) {
    const N: u32 = 200;
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

criterion_group!(benches, code_scorer);
criterion_main!(benches);
