//! `runner eval`.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

use super::*;
use crate::batch::{self, RunError};
use crate::cli::flags::EvalArgs;
use crate::cli::{CliError, Exit, out, outln, resolve};
use crate::log::Subscription;
use crate::report::Progress;

/// `runner eval`: runs the episodes, then writes the tables and judges the run.
pub fn eval(args: EvalArgs) -> Result<Exit, CliError> {
    let resolve::Eval { suites, options, baseline } = resolve::eval(&args)?;
    if suites.is_empty() {
        eprintln!("nothing to run: every suite was skipped");
        return Ok(Exit::Passed);
    }
    for warning in &options.warnings {
        eprintln!("warning: {warning}");
    }
    let runtime = resolve::runtime()?;
    let total = batch::episode_count(&suites, &options);
    if let Some(resume) = &options.resume {
        eprintln!("resuming {}: {} scored episodes kept, {total} to run", resume.dir.display(), resume.keep.len());
    }
    if let Some(since) = &options.since {
        print_plan(since);
        if args.dry_run {
            return Ok(Exit::Passed);
        }
    }
    let stop = CancellationToken::new();
    let progress = Arc::new(Mutex::new(Progress::new(total, args.quiet)));
    let subscriber = Subscription::new(progress.clone(), Progress::wants);
    // The run is driven from a worker of the runtime, not from this thread: an episode
    // that ends wakes the driver where it ended, instead of waking this thread each time.
    let (result, suites) = runtime.block_on(async {
        tokio::spawn(stop_on_signal(stop.clone()));
        let stop = stop.clone();
        let driven = tokio::spawn(async move {
            let result = batch::run(&suites, &options, stop, std::slice::from_ref(&subscriber)).await;
            (result, suites)
        });
        match driven.await {
            Ok(done) => done,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    });
    progress.lock().unwrap_or_else(PoisonError::into_inner).finish();
    let result = result.map_err(|e| match e {
        RunError::Exists(_) | RunError::Folder { .. } | RunError::Locked(_) => CliError::usage(e),
        _ => CliError::results(e),
    })?;
    // A blocking task still running (a stuck read) must not hold the finished run open.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    release_free_memory();
    let (summary, index) = summarize(&result.events_path, args.gates.alpha)?;
    out!("\n{}", summary.render());
    print_memory_table(&result.events_path)?;
    outln!("results: {}", result.dir.display());
    write_reports(&index, &summary, args.gates.junit.as_deref(), args.gates.markdown.as_deref())?;
    result.syncing.wait().map_err(|e| CliError::results(RunError::Log(e)))?;
    if let Some(reason) = &result.aborted {
        return Err(CliError::usage(format!("stopped early, the model is misconfigured: {reason}")));
    }
    if result.interrupted {
        eprintln!("interrupted: episodes in flight were cancelled");
        return Ok(Exit::Interrupted);
    }
    let oracle_failed = suites.iter().any(|s| s.agent.kind.name() == "oracle") && !oracle_verdict(&result.events_path)?;
    // Neither interrupted nor aborted: episodes cancelled now were cancelled by a hard
    // budget (`--budget-hard`), and a verdict without them is no pass.
    let cancelled = summary.total().cancelled;
    match judge(&index, &summary, &args.gates, baseline)? {
        Exit::Passed if oracle_failed => Ok(Exit::GateFailed),
        Exit::Passed if cancelled > 0 => {
            eprintln!("incomplete: {cancelled} episode(s) cancelled by --budget-hard");
            Ok(Exit::Incomplete)
        }
        exit => Ok(exit),
    }
}

/// Under the oracle, every task must pass: prints which did not and why; whether all did.
fn oracle_verdict(events: &Path) -> Result<bool, CliError> {
    let (not_passed, episodes) = crate::report::oracle::verdict(events).map_err(CliError::results)?;
    if not_passed.is_empty() {
        outln!("oracle: all {episodes} episode(s) passed with their reference solution");
        return Ok(true);
    }
    outln!("oracle: {} of {episodes} episode(s) did not pass with their reference solution:", not_passed.len());
    for task in &not_passed {
        outln!("  {}: {}", task.task, task.why);
    }
    Ok(false)
}

/// The plan of a `--since` run: the counts, then the first episodes of each kind with why,
/// then what the earlier run could not give.
fn print_plan(since: &batch::since::Since) {
    let plan = &since.summary;
    outln!(
        "since {}: {} reused, {} regraded, {} to run again (planned in {:.3} s)",
        since.dir.display(),
        plan.reuse,
        plan.regrade,
        plan.rerun,
        since.planned_s
    );
    let kinds = [
        ("reuse", plan.reuse, &plan.first_reused),
        ("regrade", plan.regrade, &plan.first_regraded),
        ("rerun", plan.rerun, &plan.first_rerun),
    ];
    for (kind, count, first) in kinds {
        for e in first {
            let variant = e.variant.as_deref().map(|v| format!(" [{v}]")).unwrap_or_default();
            outln!("  {kind:<7} {}/{}{variant} {} epoch {}: {}", e.suite, e.task_id, e.model, e.epoch, e.reason);
        }
        let more = count.saturating_sub(first.len() as u64);
        if more > 0 {
            outln!("  {kind:<7} … and {more} more");
        }
    }
    for note in &since.notes {
        eprintln!("note: {note}");
    }
}
