//! The episodes table written to disk: `episodes.csv` and `episodes.parquet`, one row per
//! episode of the log's projection ([`crate::log::projection`]), written in batches.

use std::io::Write as _;
use std::path::Path;

use crate::log::projection::{EpisodeRow, Index};

/// The columns of `episodes.csv` and `episodes.parquet`, in order.
pub const COLUMNS: [&str; 27] = [
    "episode_id",
    "suite",
    "task_id",
    "task_digest",
    "model",
    "epoch",
    "outcome",
    "unscored_cause",
    "passed",
    "score",
    "steps",
    "tool_calls",
    "tool_errors",
    "model_calls",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "tokens",
    "cost_usd",
    "latency_ms",
    "wall_ms",
    "termination",
    "started_at",
    "finished_at",
    "run_id",
    "toolset",
    "variant",
];

/// Rows per batch written: the table is never held whole as a data frame.
const BATCH: usize = 4096;

/// One batch of rows as a polars data frame with [`COLUMNS`].
pub fn frame(run_id: &str, rows: &[EpisodeRow]) -> polars::prelude::PolarsResult<polars::prelude::DataFrame> {
    use polars::prelude::{Column, DataFrame};
    let strs = |f: &dyn Fn(&EpisodeRow) -> &str| rows.iter().map(f).collect::<Vec<&str>>();
    let u32s = |f: &dyn Fn(&EpisodeRow) -> u32| rows.iter().map(f).collect::<Vec<u32>>();
    let u64s = |f: &dyn Fn(&EpisodeRow) -> u64| rows.iter().map(f).collect::<Vec<u64>>();
    let f64s = |f: &dyn Fn(&EpisodeRow) -> f64| rows.iter().map(f).collect::<Vec<f64>>();
    let columns = vec![
        Column::new(COLUMNS[0].into(), strs(&|r| &r.episode_id)),
        Column::new(COLUMNS[1].into(), strs(&|r| &r.suite)),
        Column::new(COLUMNS[2].into(), strs(&|r| &r.task_id)),
        Column::new(COLUMNS[3].into(), strs(&|r| &r.task_digest)),
        Column::new(COLUMNS[4].into(), strs(&|r| &r.model)),
        Column::new(COLUMNS[5].into(), u32s(&|r| r.epoch)),
        Column::new(COLUMNS[6].into(), strs(&|r| r.status())),
        Column::new(COLUMNS[7].into(), rows.iter().map(EpisodeRow::unscored_cause).collect::<Vec<_>>()),
        Column::new(COLUMNS[8].into(), rows.iter().map(EpisodeRow::passed).collect::<Vec<_>>()),
        Column::new(COLUMNS[9].into(), rows.iter().map(EpisodeRow::score).collect::<Vec<_>>()),
        Column::new(COLUMNS[10].into(), u32s(&|r| r.steps)),
        Column::new(COLUMNS[11].into(), u32s(&|r| r.tool_calls)),
        Column::new(COLUMNS[12].into(), u32s(&|r| r.tool_errors)),
        Column::new(COLUMNS[13].into(), u32s(&|r| r.model_calls)),
        Column::new(COLUMNS[14].into(), u64s(&|r| r.usage.input_tokens)),
        Column::new(COLUMNS[15].into(), u64s(&|r| r.usage.output_tokens)),
        Column::new(COLUMNS[16].into(), u64s(&|r| r.usage.cached_tokens)),
        Column::new(COLUMNS[17].into(), u64s(&|r| r.usage.total())),
        Column::new(COLUMNS[18].into(), rows.iter().map(|r| r.cost_usd).collect::<Vec<_>>()),
        Column::new(COLUMNS[19].into(), f64s(&|r| r.latency_ms)),
        Column::new(COLUMNS[20].into(), f64s(&|r| r.wall_ms)),
        Column::new(COLUMNS[21].into(), strs(&|r| r.termination.as_str())),
        Column::new(COLUMNS[22].into(), rows.iter().map(EpisodeRow::started_at).collect::<Vec<_>>()),
        Column::new(COLUMNS[23].into(), rows.iter().map(EpisodeRow::finished_at).collect::<Vec<_>>()),
        Column::new(COLUMNS[24].into(), vec![run_id; rows.len()]),
        Column::new(COLUMNS[25].into(), rows.iter().map(|r| r.toolset.as_deref()).collect::<Vec<_>>()),
        Column::new(COLUMNS[26].into(), rows.iter().map(|r| r.variant.as_deref()).collect::<Vec<_>>()),
    ];
    DataFrame::new(rows.len(), columns)
}

/// `episodes.csv`, written byte for byte as polars' CSV writer writes [`frame`] of the same
/// rows (a unit test holds the two equal): fields quoted only when they hold a comma, a
/// quote or a line break (an empty string as `""`, a missing value as nothing), integers
/// by `itoa`, floats by `zmij`. Written here, not by polars, because polars' CSV writer
/// starts its thread pool — two threads that spin waiting for work, more than the table
/// of a small run costs.
mod csv {
    use super::{COLUMNS, EpisodeRow};

    pub fn header(out: &mut Vec<u8>) {
        out.extend_from_slice(COLUMNS.join(",").as_bytes());
        out.push(b'\n');
    }

    pub fn row(out: &mut Vec<u8>, run_id: &str, r: &EpisodeRow) {
        text(out, &r.episode_id);
        text(out, &r.suite);
        text(out, &r.task_id);
        text(out, &r.task_digest);
        text(out, &r.model);
        integer(out, r.epoch);
        text(out, r.status());
        optional(out, r.unscored_cause(), text);
        optional(out, r.passed(), |out, passed| field(out, if passed { "true" } else { "false" }));
        optional(out, r.score(), float);
        integer(out, r.steps);
        integer(out, r.tool_calls);
        integer(out, r.tool_errors);
        integer(out, r.model_calls);
        integer(out, r.usage.input_tokens);
        integer(out, r.usage.output_tokens);
        integer(out, r.usage.cached_tokens);
        integer(out, r.usage.total());
        optional(out, r.cost_usd, float);
        float(out, r.latency_ms);
        float(out, r.wall_ms);
        text(out, r.termination.as_str());
        text(out, &r.started_at());
        text(out, &r.finished_at());
        text(out, run_id);
        optional(out, r.toolset.as_deref(), text);
        optional(out, r.variant.as_deref(), text);
        // Each field ends in a comma; the last one's is the line's end.
        if let Some(last) = out.last_mut() {
            *last = b'\n';
        }
    }

    fn comma(out: &mut Vec<u8>) {
        out.push(b',');
    }

    /// A missing value is an empty field.
    fn optional<T>(out: &mut Vec<u8>, value: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
        match value {
            Some(value) => write(out, value),
            None => comma(out),
        }
    }

    fn field(out: &mut Vec<u8>, value: &str) {
        out.extend_from_slice(value.as_bytes());
        comma(out);
    }

    fn text(out: &mut Vec<u8>, value: &str) {
        if value.is_empty() {
            // Quoted, or it would read as a missing value.
            out.extend_from_slice(b"\"\"");
        } else if value.bytes().any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r')) {
            out.push(b'"');
            for part in value.split_inclusive('"') {
                out.extend_from_slice(part.as_bytes());
                if part.ends_with('"') {
                    out.push(b'"');
                }
            }
            out.push(b'"');
        } else {
            out.extend_from_slice(value.as_bytes());
        }
        comma(out);
    }

    fn integer(out: &mut Vec<u8>, value: impl itoa::Integer) {
        field(out, itoa::Buffer::new().format(value));
    }

    fn float(out: &mut Vec<u8>, value: f64) {
        field(out, zmij::Buffer::new().format(value));
    }
}

/// Writes `episodes.csv` and `episodes.parquet` into `dir`, batch by batch, and gives each
/// row to `each` as it goes. Each file is written beside its final name and renamed into
/// place, so a reader never sees half a table.
pub fn write_tables(index: &Index, dir: &Path, mut each: impl FnMut(&EpisodeRow)) -> Result<(), String> {
    use polars::prelude::ParquetWriter;
    let fail = |what: &Path, e: &dyn std::fmt::Display| format!("failed to write {}: {e}", what.display());
    let run_id = &index.meta.run_id;
    let csv_path = dir.join("episodes.csv");
    let parquet_path = dir.join("episodes.parquet");
    // Temporary files of their own: a `runner report` of a live run writes the tables too.
    let csv_tmp = super::temporary_beside(&csv_path).map_err(|e| fail(&csv_path, &e))?;
    let parquet_tmp = super::temporary_beside(&parquet_path).map_err(|e| fail(&parquet_path, &e))?;
    let empty = frame(run_id, &[]).map_err(|e| fail(&csv_path, &e))?;
    let schema = empty.schema().as_ref().clone();
    let mut csv_file = csv_tmp.reopen().map_err(|e| fail(&csv_path, &e))?;
    let parquet_file = parquet_tmp.reopen().map_err(|e| fail(&parquet_path, &e))?;
    let mut csv_lines = Vec::with_capacity(64 * 1024);
    csv::header(&mut csv_lines);
    // Buffered: the parquet writer writes its headers and footer a few bytes at a time.
    let mut parquet_out = std::io::BufWriter::with_capacity(64 * 1024, parquet_file);
    // Snappy, as most writers of parquet use: a zstd context is made for every column of
    // every batch, which is most of what a small run's table costs.
    let mut parquet = ParquetWriter::new(&mut parquet_out)
        .with_compression(polars::prelude::ParquetCompression::Snappy)
        .set_parallel(false)
        .batched(&schema)
        .map_err(|e| fail(&parquet_path, &e))?;
    if index.is_empty() {
        // No episodes: the files still have the header and schema.
        parquet.write_batch(&empty).map_err(|e| fail(&parquet_path, &e))?;
    }
    let mut batch: Vec<EpisodeRow> = Vec::with_capacity(BATCH.min(index.len()));
    let mut failure = None;
    let mut flush = |batch: &mut Vec<EpisodeRow>| {
        if batch.is_empty() || failure.is_some() {
            return;
        }
        for row in batch.iter() {
            csv::row(&mut csv_lines, run_id, row);
        }
        if let Err(e) = csv_file.write_all(&csv_lines) {
            failure = Some(fail(&csv_path, &e));
        }
        csv_lines.clear();
        if let Err(e) = frame(run_id, batch).and_then(|df| parquet.write_batch(&df)) {
            failure.get_or_insert_with(|| fail(&parquet_path, &e));
        }
        batch.clear();
    };
    index
        .for_each_row(|row| {
            each(&row);
            batch.push(row);
            if batch.len() == BATCH {
                flush(&mut batch);
            }
        })
        .map_err(|e| e.to_string())?;
    flush(&mut batch);
    if let Some(e) = failure {
        return Err(e);
    }
    csv_file.write_all(&csv_lines).map_err(|e| fail(&csv_path, &e))?;
    parquet.finish().map_err(|e| fail(&parquet_path, &e))?;
    drop(parquet);
    parquet_out.flush().map_err(|e| fail(&parquet_path, &e))?;
    csv_tmp.persist(&csv_path).map_err(|e| fail(&csv_path, &e.error))?;
    parquet_tmp.persist(&parquet_path).map_err(|e| fail(&parquet_path, &e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::log::{Outcome, Termination, UnscoredCause, Usage};

    /// Texts that a field may hold, awkward ones included.
    const TEXTS: &[&str] =
        &["", "plain", "a,b", "say \"hi\"", "\"", "two\nlines", "cr\r", "ünï ✓", " spaced ", ",\"\n", "x\"\"y"];

    fn text(rng: &mut fastrand::Rng) -> Arc<str> {
        Arc::from(TEXTS[rng.usize(..TEXTS.len())])
    }

    fn float(rng: &mut fastrand::Rng) -> f64 {
        match rng.u8(..8) {
            0 => 0.0,
            1 => rng.u32(..1000) as f64,
            2 => rng.f64() * 1e-9,
            3 => rng.f64() * 1e21,
            4 => -rng.f64(),
            5 => f64::NAN,
            6 => f64::INFINITY,
            _ => rng.f64() * 1000.0,
        }
    }

    fn row(rng: &mut fastrand::Rng) -> EpisodeRow {
        let outcome = match rng.u8(..4) {
            0 => Outcome::Scored { score: float(rng), passed: rng.bool() },
            1 => Outcome::Unscored { cause: UnscoredCause::Other(text(rng).to_string()), message: String::new() },
            2 => Outcome::Unscored { cause: UnscoredCause::ProviderError, message: String::new() },
            _ => Outcome::Cancelled,
        };
        EpisodeRow {
            episode_id: text(rng).as_ref().into(),
            suite: text(rng),
            task_id: text(rng),
            task_digest: text(rng),
            model: text(rng),
            epoch: rng.u32(..),
            outcome,
            termination: [Termination::FinalAnswer, Termination::MaxSteps, Termination::TimeLimit][rng.usize(..3)],
            steps: rng.u32(..),
            tool_calls: rng.u32(..100),
            tool_errors: rng.u32(..3),
            usage: Usage { input_tokens: rng.u64(..), output_tokens: rng.u64(..1 << 40), cached_tokens: rng.u64(..10) },
            cost_usd: rng.bool().then(|| float(rng)),
            model_calls: rng.u32(..10),
            largest_input: rng.u64(..1000),
            latency_ms: float(rng),
            wall_ms: float(rng),
            started_us: rng.i64(0..4_000_000_000_000_000),
            finished_us: rng.i64(0..4_000_000_000_000_000),
            toolset: rng.bool().then(|| text(rng)),
            variant: rng.bool().then(|| text(rng)),
            tags: Box::default(),
            metadata: Box::default(),
        }
    }

    #[test]
    fn the_csv_is_what_polars_writes_for_the_same_rows() {
        use polars::prelude::{CsvWriter, SerWriter};
        let mut rng = fastrand::Rng::with_seed(7);
        for size in [0, 1, 2, 50, 1500] {
            let rows: Vec<EpisodeRow> = (0..size).map(|_| row(&mut rng)).collect();
            let run_id = TEXTS[size % TEXTS.len()];
            let mut ours = Vec::new();
            csv::header(&mut ours);
            for row in &rows {
                csv::row(&mut ours, run_id, row);
            }
            let mut theirs = Vec::new();
            let mut df = frame(run_id, &rows).expect("a frame");
            CsvWriter::new(&mut theirs).finish(&mut df).expect("polars writes");
            assert_eq!(String::from_utf8_lossy(&ours), String::from_utf8_lossy(&theirs), "{size} rows");
        }
    }
}
