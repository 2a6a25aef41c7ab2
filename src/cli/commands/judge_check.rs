//! `runner judge-check`.

use std::path::Path;

use crate::batch;
use crate::cli::flags::JudgeCheckArgs;
use crate::cli::{CliError, Exit, out, outln};

/// `runner judge-check`: the run's LLM judge against people's labels, gated with
/// `--min-kappa`.
pub fn judge_check(args: JudgeCheckArgs) -> Result<Exit, CliError> {
    use crate::report::judge_check;
    if let Some(min) = args.min_kappa
        && !(-1.0..=1.0).contains(&min)
    {
        return Err(CliError::usage(format!("--min-kappa must be between -1 and 1, not {min}")));
    }
    let dir = batch::resume::find_logged_run(&args.run, Path::new("results")).map_err(CliError::usage)?;
    let path = match &args.labels {
        Some(path) => path.clone(),
        None => {
            let saved = dir.join(judge_check::LABELS_FILE);
            if !saved.exists() {
                return Err(CliError::usage(format!(
                    "no labels: {} does not exist; set labels in `runner view {}`, or give a file with --labels",
                    saved.display(),
                    dir.display()
                )));
            }
            saved
        }
    };
    let labels = judge_check::read_labels(&path).map_err(CliError::usage)?;
    let checked =
        judge_check::check(&dir.join("events.jsonl"), &labels, args.scoring.as_deref()).map_err(CliError::usage)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&checked).map_err(CliError::results)?);
    } else {
        out!("{}", checked.render());
    }
    let Some(min) = args.min_kappa else { return Ok(Exit::Passed) };
    let reasons = checked.gate(min);
    // Last, so that a CI log ends with why the command passed or failed.
    for reason in &reasons {
        eprintln!("{reason}");
    }
    Ok(if reasons.is_empty() { Exit::Passed } else { Exit::GateFailed })
}
