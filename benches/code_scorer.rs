//! A code scorer's cost: the same one-turn `kv` episode scored by a `python:` scorer, by a
//! `js:` scorer (each a long-lived worker, started once) and by the built-in `equals:`,
//! 1,000 episodes each, through the real event log. The differences are what a code scorer
//! costs per scored episode: the runner's own process, and the runner with its worker (the
//! worker's CPU read from `/proc`), and in wall time. Medians of 5 rounds of 200.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

mod common;
use common::{cpu_time, descendants_cpu_time};
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
    let [python, js, builtin] = [&specs[0], &specs[1], &specs[2]];

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
    for spec in [python, js, builtin] {
        let report = episode(spec);
        assert!(matches!(report.outcome, Outcome::Scored { passed: true, .. }), "{}: {report:?}", spec.id);
    }

    c.bench_function("code_scorer/episode scored by a python worker", |b| b.iter(|| episode(python)));
    c.bench_function("code_scorer/episode scored by a js worker", |b| b.iter(|| episode(js)));

    let builtin_cost = per_episode(|| {
        episode(builtin);
    });
    let us = |d: f64| d * 1e6;
    println!(
        "code_scorer: episode scored by equals: {:.0} µs CPU, {:.0} µs wall",
        us(builtin_cost.runner),
        us(builtin_cost.wall)
    );
    for (name, spec) in [("python", python), ("js", js)] {
        let cost = per_episode(|| {
            episode(spec);
        });
        println!(
            "code_scorer: episode scored by {name}: {:.0} µs runner CPU, {:.0} µs with its worker, {:.0} µs wall",
            us(cost.runner),
            us(cost.runner + cost.workers),
            us(cost.wall)
        );
        println!(
            "code_scorer: per {name}-scored episode: runner CPU {:.0} µs, with its worker {:.0} µs, wall {:.0} µs \
             (medians of 5 rounds of 200, less equals')",
            us(cost.runner - builtin_cost.runner),
            us(cost.runner + cost.workers - builtin_cost.runner - builtin_cost.workers),
            us(cost.wall - builtin_cost.wall)
        );
    }
    drop(log);
    writer.close().expect("log closes");
}

/// What one run of an episode costs, in seconds.
struct Cost {
    /// CPU of the runner's own process.
    runner: f64,
    /// CPU of its workers (its living descendants).
    workers: f64,
    wall: f64,
}

/// The medians of 5 rounds of 200 (1,000 episodes), each figure's on its own.
fn per_episode(mut episode: impl FnMut()) -> Cost {
    const N: u32 = 200;
    let (mut runner, mut workers, mut wall) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let (before, before_workers, started) = (cpu_time(), descendants_cpu_time(), Instant::now());
        for _ in 0..N {
            episode();
        }
        runner.push((cpu_time() - before).as_secs_f64() / f64::from(N));
        workers.push((descendants_cpu_time().saturating_sub(before_workers)).as_secs_f64() / f64::from(N));
        wall.push(started.elapsed().as_secs_f64() / f64::from(N));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[2]
    };
    Cost { runner: median(runner), workers: median(workers), wall: median(wall) }
}

criterion_group!(benches, code_scorer);
criterion_main!(benches);
