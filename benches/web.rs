//! The `web` environment's corpus index: the time to build a BM25 index of 10,000
//! generated pages, and the latency of one query on it. Before the timed runs it prints
//! the process's peak RSS right after one build (`VmHWM` of /proc/self/status), beside
//! the RSS before it. `cargo bench --bench web`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};

use runner::environment::kinds::web::corpus::Corpus;
use runner::environment::kinds::web::page::{Format, Page};

const PAGES: usize = 10_000;
const WORDS_PER_PAGE: usize = 300;
const VOCABULARY: usize = 20_000;

/// A made-up word for rank `i`: syllables, so the stemmer sees word-like text.
fn word(mut i: usize) -> String {
    const SYLLABLES: [&str; 16] =
        ["ka", "lo", "mi", "ren", "tu", "sha", "vor", "ne", "pil", "da", "gri", "os", "fe", "zun", "ba", "quel"];
    let mut w = String::new();
    loop {
        w.push_str(SYLLABLES[i % SYLLABLES.len()]);
        i /= SYLLABLES.len();
        if i == 0 {
            return w;
        }
    }
}

/// Pages whose words follow a Zipf-like law (rank ~ 1/u), as natural text does, from a
/// fixed seed: the same corpus on every run.
fn pages() -> Vec<Page> {
    let words: Vec<String> = (0..VOCABULARY).map(word).collect();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut pick = || {
        let u = rng.f64().max(1e-9);
        let rank = ((1.0 / u) as usize).saturating_sub(1) % VOCABULARY;
        words[rank].as_str()
    };
    (0..PAGES)
        .map(|i| {
            let title: Vec<&str> = (0..4).map(|_| pick()).collect();
            let text: Vec<&str> = (0..WORDS_PER_PAGE).map(|_| pick()).collect();
            Page::of(&format!("https://bench.test/{i}"), text.join(" "), Format::Text, Some(title.join(" ")))
        })
        .collect()
}

/// A field of /proc/self/status in kB (`VmHWM`, `VmRSS`).
fn status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn corpus_index(c: &mut Criterion) {
    let pages = pages();
    let text_bytes: usize = pages.iter().map(|p| p.text.len() + p.title.len()).sum();
    let before = status_kb("VmRSS:");
    let corpus = Corpus::build(pages.clone()).expect("the index builds");
    let peak = status_kb("VmHWM:");
    let after = status_kb("VmRSS:");
    println!(
        "web/rss: {PAGES} pages, {:.1} MB of text; RSS before the build {} kB, peak RSS after it (VmHWM) {} kB, \
         RSS after it {} kB",
        text_bytes as f64 / 1e6,
        before.map_or("?".into(), |k| k.to_string()),
        peak.map_or("?".into(), |k| k.to_string()),
        after.map_or("?".into(), |k| k.to_string()),
    );
    // A query must find pages, or the bench measures an empty result.
    let queries: Vec<String> = (0..8).map(|i| format!("{} {}", word(3 + i * 7), word(40 + i * 11))).collect();
    for q in &queries {
        assert!(!corpus.search(q, 10).expect("search").is_empty(), "`{q}` found nothing");
    }

    let mut group = c.benchmark_group("web");
    group.sample_size(10);
    group.bench_function("index build, 10k pages", |b| {
        b.iter_batched(|| pages.clone(), |p| Corpus::build(p).expect("builds"), criterion::BatchSize::LargeInput)
    });
    group.finish();
    let mut i = 0;
    c.bench_function("web/query top 10, 10k pages", |b| {
        b.iter(|| {
            i += 1;
            black_box(corpus.search(&queries[i % queries.len()], 10).expect("search"))
        })
    });
}

criterion_group!(benches, corpus_index);
criterion_main!(benches);
