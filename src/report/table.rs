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

/// Writes `episodes.csv` and `episodes.parquet` into `dir`, batch by batch, and gives each
/// row to `each` as it goes. Each file is written beside its final name and renamed into
/// place, so a reader never sees half a table.
pub fn write_tables(index: &Index, dir: &Path, mut each: impl FnMut(&EpisodeRow)) -> Result<(), String> {
    use polars::prelude::{CsvWriter, ParquetWriter, SerWriter};
    let fail = |what: &Path, e: &dyn std::fmt::Display| format!("failed to write {}: {e}", what.display());
    let run_id = &index.meta.run_id;
    let csv_path = dir.join("episodes.csv");
    let parquet_path = dir.join("episodes.parquet");
    // Temporary files of their own: a `runner report` of a live run writes the tables too.
    let csv_tmp = super::temporary_beside(&csv_path).map_err(|e| fail(&csv_path, &e))?;
    let parquet_tmp = super::temporary_beside(&parquet_path).map_err(|e| fail(&parquet_path, &e))?;
    let empty = frame(run_id, &[]).map_err(|e| fail(&csv_path, &e))?;
    let schema = empty.schema().as_ref().clone();
    let csv_file = csv_tmp.reopen().map_err(|e| fail(&csv_path, &e))?;
    let parquet_file = parquet_tmp.reopen().map_err(|e| fail(&parquet_path, &e))?;
    let mut csv = CsvWriter::new(csv_file).batched(&schema).map_err(|e| fail(&csv_path, &e))?;
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
        csv.write_batch(&empty).map_err(|e| fail(&csv_path, &e))?;
        parquet.write_batch(&empty).map_err(|e| fail(&parquet_path, &e))?;
    }
    let mut batch: Vec<EpisodeRow> = Vec::with_capacity(BATCH.min(index.len()));
    let mut failure = None;
    let mut flush = |batch: &mut Vec<EpisodeRow>| {
        if batch.is_empty() || failure.is_some() {
            return;
        }
        let written = frame(run_id, batch).and_then(|df| {
            csv.write_batch(&df)?;
            parquet.write_batch(&df)
        });
        if let Err(e) = written {
            failure = Some(fail(&csv_path, &e));
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
    csv.finish().map_err(|e| fail(&csv_path, &e))?;
    drop(csv);
    parquet.finish().map_err(|e| fail(&parquet_path, &e))?;
    drop(parquet);
    parquet_out.flush().map_err(|e| fail(&parquet_path, &e))?;
    csv_tmp.persist(&csv_path).map_err(|e| fail(&csv_path, &e.error))?;
    parquet_tmp.persist(&parquet_path).map_err(|e| fail(&parquet_path, &e.error))?;
    Ok(())
}
