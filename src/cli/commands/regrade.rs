//! `runner regrade`.

use std::path::{Path, PathBuf};

use super::*;
use crate::batch;
use crate::batch::regrade::LoggedRun;
use crate::cli::flags::RegradeArgs;
use crate::cli::{CliError, Exit, out, outln, resolve};
use crate::model::BackendOptions;
use crate::model::config::ModelConfig;

/// `runner regrade`: scores the run again from its log and judges it.
pub fn regrade(args: RegradeArgs) -> Result<Exit, CliError> {
    let baseline = resolve::baseline(&args.gates, Path::new("results"))?;
    let run = LoggedRun::read(&args.run).map_err(CliError::usage)?;
    let paths: Vec<PathBuf> = if args.suites.is_empty() {
        run.suites.iter().map(|s| PathBuf::from(&s.path)).collect()
    } else {
        args.suites.clone()
    };
    // Scored under the limits the run ran under (the world's time of a `check:`).
    let load = crate::suite::LoadOptions { limits: run.limits, ..Default::default() };
    let suites = resolve::suites_with(&paths, load).map_err(|e| match args.suites.is_empty() {
        true => e.with_note("these are the suite files the run was made from; name them with --suite"),
        false => e,
    })?;
    let config = ModelConfig::load(args.config.as_deref()).map_err(CliError::usage)?;
    let graders = resolve::graders(&suites, args.grader.clone(), &config, BackendOptions::default(), &[])?;
    crate::log::secrets::withdraw_from_environment(config.key_vars());
    let run_dir = run.events_path.parent().unwrap_or(Path::new("."));
    let _lock = batch::lock(run_dir).map_err(CliError::usage)?;
    let regraded =
        resolve::runtime()?.block_on(batch::regrade::regrade(&run, &suites, &graders, std::env::args().collect()));
    let (scoring_id, counts) =
        regraded.map_err(|e| CliError::results(format!("failed to append to {}: {e}", run.events_path.display())))?;
    let (summary, index) = summarize(&run.events_path, args.gates.alpha)?;
    out!("{}", summary.render());
    let changed = if counts.changed_tasks > 0 {
        format!("; {} on tasks whose content changed since the run", counts.changed_tasks)
    } else {
        String::new()
    };
    outln!(
        "scoring `{scoring_id}`: {} episodes re-scored ({} passed, {} unscored), {} skipped{changed}",
        counts.episodes,
        counts.passed,
        counts.unscored,
        counts.skipped
    );
    write_reports(&index, &summary, args.gates.junit.as_deref(), args.gates.markdown.as_deref())?;
    judge(&index, &summary, &args.gates, baseline)
}
