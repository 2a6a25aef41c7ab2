//! `runner images`: pull an image into the image store, list what the store holds, remove
//! an image, prune what is no longer used.

use std::time::{Duration, Instant};

use crate::cli::flags::{ImagesAction, ImagesArgs, PullFlag};
use crate::cli::{CliError, Exit, outln, resolve};
use crate::image::{ImageRecord, ImageStore, PullPolicy, Removed};
use crate::model::config::ModelConfig;

pub fn images(args: ImagesArgs) -> Result<Exit, CliError> {
    let root = match args.store {
        Some(root) => root,
        None => ImageStore::default_root().map_err(CliError::usage)?,
    };
    let store = ImageStore::open(&root).map_err(CliError::results)?;
    match args.action {
        ImagesAction::Pull { reference, pull, config } => {
            let settings = ModelConfig::load(config.as_deref()).map_err(CliError::usage)?.images;
            let policy = match pull {
                PullFlag::Never => PullPolicy::Never,
                PullFlag::Missing => PullPolicy::Missing,
                PullFlag::Always => PullPolicy::Always,
            };
            let started = Instant::now();
            let image = resolve::runtime()?
                .block_on(crate::image::pull(&reference, &store, &settings, policy))
                .map_err(CliError::usage)?;
            let bytes: u64 = image.layers.iter().filter_map(|l| crate::image::disk_usage(l).ok()).sum();
            outln!(
                "{}: {} layers, {} on disk, in {:.2}s",
                image.name,
                image.layers.len(),
                human_bytes(bytes),
                started.elapsed().as_secs_f64()
            );
        }
        ImagesAction::Ls => list(&store)?,
        ImagesAction::Rm { target } => {
            let removed = store.remove(&target).map_err(CliError::usage)?;
            report(&removed);
        }
        ImagesAction::Prune { older_than } => {
            let age = match older_than {
                Some(days) if !(days.is_finite() && days >= 0.0) => {
                    return Err(CliError::usage(format!(
                        "--older-than must be a number of days, 0 or more, not {days}"
                    )));
                }
                Some(days) => Some(Duration::from_secs_f64(days * 86_400.0)),
                None => None,
            };
            let removed = store.prune(age).map_err(CliError::results)?;
            report(&removed);
        }
    }
    Ok(Exit::Passed)
}

fn list(store: &ImageStore) -> Result<(), CliError> {
    let mut rows = vec![["REFERENCE".to_owned(), "DIGEST".into(), "SIZE".into(), "LAST USE".into()]];
    let records = store.images().map_err(CliError::results)?;
    for record in records.iter().rev() {
        let names: Vec<&str> = match record.references.is_empty() {
            true => vec!["<none>"],
            false => record.references.iter().map(String::as_str).collect(),
        };
        for name in names {
            rows.push([name.to_owned(), short_digest(record), human_bytes(store.bytes_of(record)), when(record)]);
        }
    }
    let widths: Vec<usize> = (0..4).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    for row in rows {
        outln!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
    }
    Ok(())
}

fn short_digest(record: &ImageRecord) -> String {
    let hex = record.digest.strip_prefix("sha256:").unwrap_or(&record.digest);
    hex.chars().take(12).collect()
}

fn when(record: &ImageRecord) -> String {
    chrono::DateTime::from_timestamp(record.last_used as i64, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|| record.last_used.to_string())
}

fn report(removed: &Removed) {
    for image in &removed.images {
        outln!("removed {image}");
    }
    outln!("{} layers removed, {} freed", removed.layers, human_bytes(removed.bytes));
}

/// Bytes in powers of 1000, as `du -h --si` shows them.
fn human_bytes(bytes: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ => format!("{value:.1} {}", units[unit]),
    }
}
