//! `runner export`.

use std::path::Path;

use crate::batch;
use crate::cli::flags::ExportArgs;
use crate::cli::{CliError, Exit, out, outln};

/// `runner export`: the run's episodes in another format, and how complete that is.
pub fn export(args: ExportArgs) -> Result<Exit, CliError> {
    use crate::report::export::{Request, Status};
    let dir = batch::resume::find_logged_run(&args.run, Path::new("results")).map_err(CliError::usage)?;
    let status = if args.passed_only { Some(Status::Passed) } else { args.outcome };
    let out = args.out.unwrap_or_else(|| dir.join("export").join(args.format.as_str()));
    let request = Request { format: args.format, status, out };
    let report = crate::report::export::export(&dir.join("events.jsonl"), &request).map_err(CliError::results)?;
    out!("{}", report.render());
    outln!("export: {}", request.out.join("export.json").display());
    Ok(Exit::Passed)
}
