//! `runner merge`.

use super::*;
use crate::batch;
use crate::cli::flags::MergeArgs;
use crate::cli::{CliError, Exit, out, outln, resolve};

/// `runner merge`: the shards into one run, judged as one.
pub fn merge(args: MergeArgs) -> Result<Exit, CliError> {
    let baseline = resolve::baseline(&args.gates, &args.out)?;
    let mut dirs = Vec::new();
    for run in &args.runs {
        dirs.push(batch::resume::find_run(run, &args.out).map_err(CliError::usage)?);
    }
    let run_id = args.run_id.clone().unwrap_or_else(batch::new_run_id);
    let merged = batch::merge::merge(&dirs, &args.out, run_id, std::env::args().collect(), args.allow_partial)
        .map_err(CliError::usage)?;
    if !merged.missing_shards.is_empty() {
        eprintln!("warning: shard(s) {} missing from the merge", merged.missing_shards.join(", "));
    }
    let (summary, index) = summarize(&merged.events_path, args.gates.alpha)?;
    out!("{}", summary.render());
    outln!("merged {} runs, {} episodes: {}", dirs.len(), merged.episodes, merged.dir.display());
    write_reports(&index, &summary, args.gates.junit.as_deref(), args.gates.markdown.as_deref())?;
    judge(&index, &summary, &args.gates, baseline)
}
