//! `runner report`.

use std::path::Path;

use super::*;
use crate::batch;
use crate::cli::flags::ReportArgs;
use crate::cli::{CliError, Exit, out, outln};

/// `runner report`: the tables and summary again, and the reports asked for.
pub fn report(args: ReportArgs) -> Result<Exit, CliError> {
    let dir = batch::resume::find_logged_run(&args.run, Path::new("results")).map_err(CliError::usage)?;
    let (summary, index) = summarize(&dir.join("events.jsonl"), args.alpha)?;
    out!("{}", summary.render());
    print_memory_table(&dir.join("events.jsonl"))?;
    outln!("tables: {}, {}", dir.join("episodes.csv").display(), dir.join("episodes.parquet").display());
    write_reports(&index, &summary, args.junit.as_deref(), args.markdown.as_deref())?;
    if let Some(html) = &args.html {
        let path = html.clone().unwrap_or_else(|| dir.join("report.html"));
        let failed = |e: String| CliError::results(format!("failed to write {}: {e}", path.display()));
        let tmp = crate::report::temporary_beside(&path).map_err(|e| failed(e.to_string()))?;
        let file = tmp.reopen().map_err(|e| failed(e.to_string()))?;
        let mut out = std::io::BufWriter::with_capacity(256 * 1024, file);
        crate::report::html::render(&index, args.max_trajectories, &mut out).map_err(failed)?;
        drop(out);
        tmp.persist(&path).map_err(|e| failed(e.error.to_string()))?;
        outln!("report: {}", path.display());
    }
    Ok(Exit::Passed)
}
