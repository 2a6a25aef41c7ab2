//! A 1,000-test promptfoo config on `echo`: its translation and load, and the whole run
//! (episodes, scorers, the event log), with the runner's CPU time per test printed — what
//! `runner eval promptfooconfig.yaml` costs beside the model.

use std::sync::Arc;

mod common;
use common::cpu_time;
use criterion::{Criterion, criterion_group, criterion_main};
use tokio_util::sync::CancellationToken;

use runner::batch::{self, RunOptions};
use runner::model::config::ModelConfig;
use runner::model::{Backend, BackendOptions};

const TESTS: usize = 1000;

/// A config of `TESTS` tests, three assertions each, every one of them passing on `echo`.
fn config() -> String {
    let mut text = String::from("prompts: [\"Q: {{ question }} A: {{ answer }}\"]\nproviders: [echo]\ntests:\n");
    for i in 0..TESTS {
        let (question, answer) = (format!("What is {i} + {i}?"), 2 * i);
        text.push_str(&format!(
            "  - vars: {{question: \"{question}\", answer: \"{answer}\"}}\n    assert:\n      - {{type: contains, value: \"A: {answer}\"}}\n      - {{type: icontains-any, value: [what, nothing]}}\n      - {{type: levenshtein, value: \"Q: {question} A: {answer}\", threshold: 2}}\n"
        ));
    }
    text
}

fn promptfoo(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("promptfooconfig.yaml");
    std::fs::write(&path, config()).expect("the config");
    c.bench_function("promptfoo/load 1000 tests", |b| b.iter(|| runner::suite::load(&path).expect("it loads")));

    let suite = Arc::new(runner::suite::load(&path).expect("it loads"));
    let echo = Arc::new(Backend::open("echo", &ModelConfig::default(), BackendOptions::default()).expect("echo"));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let mut per_test = Vec::new();
    for round in 0..5 {
        let options = RunOptions {
            models: vec![echo.clone()],
            epochs: None,
            jobs: 8,
            out_dir: dir.path().join("results"),
            run_id: Some(format!("round-{round}")),
            command_line: Vec::new(),
            roster: Arc::new(batch::Roster::default()),
            shard: None,
            resume: None,
            keep_worlds: false,
            sandbox: runner::sandbox::SandboxMode::On,
            limits: Default::default(),
            warnings: Vec::new(),
            selection: Default::default(),
            chosen: None,
            caps: Default::default(),
            auto_epochs: None,
            since: None,
        };
        let before = cpu_time();
        let loaded = Arc::new(runner::suite::load(&path).expect("it loads"));
        let result = runtime.block_on(batch::run(&[loaded], &options, CancellationToken::new(), &[])).expect("a run");
        // The log's last sync counts too.
        result.syncing.wait().expect("the log synced");
        per_test.push((cpu_time() - before).as_secs_f64() * 1e6 / TESTS as f64);
        assert!(!result.interrupted && result.aborted.is_none());
    }
    drop(suite);
    per_test.sort_by(f64::total_cmp);
    println!(
        "promptfoo/1000 tests on echo: runner CPU per test {:.0} µs (median of 5 runs; load included)",
        per_test[2]
    );
}

criterion_group!(benches, promptfoo);
criterion_main!(benches);
