//! One module per command: each resolves its flags, does its work through the library,
//! prints what people read, and returns its exit code or a [`CliError`].

mod compare;
mod eval;
mod export;
mod images;
mod judge_check;
mod merge;
mod plan;
mod regrade;
mod report;
mod search;
mod serve;
mod tools;
mod validate;
mod view;

pub use compare::compare;
pub use eval::eval;
pub use export::export;
pub use images::images;
pub use judge_check::judge_check;
pub use merge::merge;
pub use plan::plan;
pub use regrade::regrade;
pub use report::report;
pub use search::search;
pub use serve::serve;
pub use tools::tools;
pub use validate::validate;
pub use view::view;

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::flags::GateArgs;
use super::{CliError, Exit, out};
use crate::log::projection::{Index, Projection};
use crate::report::Summary;
use crate::report::gate::{self, Gate};

/// Hands the memory the run's threads freed back to the system before the tables are
/// built, so that the run's peak and the tables' do not add up.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The summary of a run's log, and the log's index for the reports and gates that follow;
/// `summary.json`, `episodes.csv` and `episodes.parquet` are
/// (re)written beside it. A log that cannot be read back, or a table that cannot be
/// written, means the results failed.
fn summarize(events: &Path, alpha: f64) -> Result<(Summary, Index), CliError> {
    let index = Index::build(events).map_err(CliError::results)?;
    let mut summary = Summary::begin(&index.meta);
    summary.alpha = Some(alpha);
    let dir = events.parent().unwrap_or(Path::new("."));
    summary.run_dir = Some(dir.display().to_string());
    crate::report::table::write_tables(&index, dir, |row| summary.add(row)).map_err(CliError::results)?;
    let path = dir.join("summary.json");
    let json = serde_json::to_vec_pretty(&summary.to_json()).unwrap_or_default();
    crate::report::write_atomically(&path, &json)
        .map_err(|e| CliError::results(format!("failed to write {}: {e}", path.display())))?;
    Ok((summary, index))
}

/// The memory table under the summary, for a run where the memory agent answered.
fn print_memory_table(events: &Path) -> Result<(), CliError> {
    let groups = crate::report::memory::read(events).map_err(CliError::results)?;
    let named = groups.len() > 1;
    for (group, memory) in &groups {
        if named {
            out!("\nmemory of {group}:");
        }
        out!("{}", memory.render());
    }
    Ok(())
}

/// `--junit`, `--markdown` and the GitHub step summary.
fn write_reports(
    index: &Index,
    summary: &Summary,
    junit: Option<&Path>,
    markdown: Option<&Path>,
) -> Result<(), CliError> {
    let failed = |what: &Path, e: std::io::Error| CliError::results(format!("failed to write {}: {e}", what.display()));
    if let Some(path) = junit {
        crate::report::junit::write(index, summary, path).map_err(|e| failed(path, e))?;
    }
    let text = crate::report::junit::markdown(summary);
    if let Some(path) = markdown {
        std::fs::write(path, &text).map_err(|e| failed(path, e))?;
    }
    if let Some(step) = std::env::var_os("GITHUB_STEP_SUMMARY").map(PathBuf::from) {
        use std::io::Write as _;
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&step)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        appended.map_err(|e| failed(&step, e))?;
    }
    Ok(())
}

/// The exit code of a finished run: the unscored share, thresholds and `--fail-under`, then
/// the comparison with the baseline.
fn judge(index: &Index, summary: &Summary, gates: &GateArgs, baseline: Option<Projection>) -> Result<Exit, CliError> {
    let verdict = gate::gate(summary, gates.fail_under, gates.max_unscored);
    for reason in verdict.reasons() {
        eprintln!("{reason}");
    }
    let mut exit = match verdict {
        Gate::Passed => Exit::Passed,
        Gate::Failed(_) => Exit::GateFailed,
        Gate::TooManyUnscored(_) => Exit::TooManyUnscored,
    };
    // A verdict on part of the plan is no pass: the run is incomplete.
    let total = summary.total();
    if total.not_run > 0 {
        eprintln!(
            "incomplete: {} of {} planned episodes not run, a budget stopped scheduling (coverage {})",
            total.not_run,
            total.episodes,
            total.coverage()
        );
        if exit == Exit::Passed {
            exit = Exit::Incomplete;
        }
    }
    let Some(baseline) = baseline else { return Ok(exit) };
    let current = Projection::from_index(index).map_err(CliError::results)?;
    let against = gate::against(&baseline, &current, gates.tolerance, gates.alpha);
    for line in &against.lines {
        eprintln!("{line}");
    }
    if let Some(unjudged) = against.unjudged {
        return Err(CliError::new(if exit != Exit::Passed { exit } else { Exit::Usage }, unjudged));
    }
    Ok(if exit != Exit::Passed {
        exit
    } else if against.regressed {
        Exit::GateFailed
    } else {
        Exit::Passed
    })
}

/// The first Ctrl-C or SIGTERM (what Kubernetes, Docker, systemd and CI cancellation
/// send) stops the run gracefully: episodes in flight are cancelled and logged, the tables
/// written. A second signal of either kind exits at once.
async fn stop_on_signal(stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        eprintln!("warning: failed to install the signal handlers; Ctrl-C ends the run at once");
        return;
    };
    let name = tokio::select! {
        _ = interrupt.recv() => "Ctrl-C",
        _ = terminate.recv() => "SIGTERM",
    };
    eprintln!(
        "\nstopping on {name}: cancelling the episodes in flight (Ctrl-C again to quit now, or a second SIGTERM)"
    );
    stop.cancel();
    // `timeout`, and managers that signal a process and then its group, deliver one SIGTERM
    // twice: a SIGTERM within a second of the first is that same request, not a second one.
    let first = tokio::time::Instant::now();
    loop {
        let again = tokio::select! {
            _ = interrupt.recv() => "Ctrl-C",
            _ = terminate.recv() => "SIGTERM",
        };
        if again == "Ctrl-C" || name == "Ctrl-C" || first.elapsed() >= Duration::from_secs(1) {
            break;
        }
    }
    std::process::exit(Exit::Interrupted as i32);
}
