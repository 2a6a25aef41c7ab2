//! `runner compare`.

use std::path::Path;

use crate::batch;
use crate::cli::flags::CompareArgs;
use crate::cli::{CliError, Exit, out, outln, resolve};
use crate::log::projection::Projection;
use crate::report::gate;

/// `runner compare`: the runs side by side, gated with `--fail-on-regression`.
pub fn compare(args: CompareArgs) -> Result<Exit, CliError> {
    resolve::fraction("--tolerance", Some(args.tolerance))?;
    resolve::fraction("--alpha", Some(args.alpha))?;
    let mut runs = Vec::new();
    let mut dirs = Vec::new();
    for run in &args.runs {
        let dir = batch::resume::find_logged_run(run, Path::new("results")).map_err(CliError::usage)?;
        runs.push(Projection::from_log(&dir.join("events.jsonl")).map_err(CliError::usage)?);
        dirs.push(dir);
    }
    let mut comparison = crate::report::compare::Comparison::of(&runs);
    comparison.alpha = args.alpha;
    if comparison.groups.len() < 2 {
        return Err(CliError::usage(
            "nothing to compare: the runs hold fewer than two models with episodes (give two runs, or a run made with several --model or of a suite with variants)",
        ));
    }
    out!("{}", comparison.render());
    compare_memory(&runs, &dirs)?;
    compare_judges(&runs, &dirs)?;
    let write = |path: &Path, bytes: &[u8]| {
        std::fs::write(path, bytes).map_err(|e| CliError::results(format!("failed to write {}: {e}", path.display())))
    };
    if let Some(path) = &args.markdown {
        write(path, comparison.markdown().as_bytes())?;
    }
    if let Some(path) = &args.csv {
        write(path, &comparison.groups_csv().map_err(CliError::results)?)?;
        write(&path.with_extension("pairs.csv"), &comparison.pairs_csv().map_err(CliError::results)?)?;
    }
    let verdicts = gate::compared(&runs, comparison, args.fail_on_regression).map_err(CliError::usage)?;
    for line in verdicts.iter().filter_map(|t| t.power_line(args.tolerance, args.alpha)) {
        outln!("{line}");
    }
    // Last, so that a CI log ends with why the command passed or failed.
    for t in &verdicts {
        outln!("{}", t.verdict(args.tolerance, args.alpha));
    }
    let regressed = verdicts.iter().any(|t| t.regressed(args.tolerance, args.alpha));
    Ok(if args.fail_on_regression && regressed { Exit::GateFailed } else { Exit::Passed })
}

/// Whether the first run's judges and each other run's are comparable (the same judge
/// digest for each scorer both graded with a model); a warning naming what differs when not.
fn compare_judges(runs: &[Projection], dirs: &[std::path::PathBuf]) -> Result<(), CliError> {
    use crate::report::judges;
    let mut all = Vec::with_capacity(dirs.len());
    for dir in dirs {
        all.push(judges::read(&dir.join("events.jsonl")).map_err(CliError::results)?);
    }
    let Some((first, others)) = all.split_first() else { return Ok(()) };
    for (other, run) in others.iter().zip(&runs[1..]) {
        let shared = judges::shared(first, other);
        if shared.is_empty() {
            continue;
        }
        let (a, b) = (&runs[0].run_id, &run.run_id);
        let differences = judges::differences(first, other);
        if differences.is_empty() {
            outln!("judges: {a} and {b} are comparable: {}", shared.join(", "));
        } else {
            outln!("judges: {a} and {b} are NOT comparable: {}", differences.join("; "));
            eprintln!("warning: the judges of {a} and {b} differ: {}", differences.join("; "));
        }
    }
    Ok(())
}

/// Under `compare`'s groups, when the first run and another are memory-agent runs: their
/// memory tables side by side, questions paired (`report/memory_compare.rs`).
fn compare_memory(runs: &[Projection], dirs: &[std::path::PathBuf]) -> Result<(), CliError> {
    let mut memories = Vec::with_capacity(dirs.len());
    for (run, dir) in runs.iter().zip(dirs) {
        let groups = crate::report::memory::read(&dir.join("events.jsonl")).map_err(CliError::results)?;
        memories.push((run.run_id.as_str(), groups));
    }
    let Some(((first, a_groups), others)) = memories.split_first() else { return Ok(()) };
    for (other, b_groups) in others {
        // Two runs of one configuration each pair whatever their names; otherwise the
        // groups of the same suite, model and variant pair.
        if let ([(_, a)], [(_, b)]) = (a_groups.as_slice(), b_groups.as_slice()) {
            out!("{}", crate::report::memory_compare::render((first, a), (other, b)));
            continue;
        }
        for (group, a) in a_groups {
            if let Some((_, b)) = b_groups.iter().find(|(g, _)| g == group) {
                let (a_name, b_name) = (format!("{first} {group}"), format!("{other} {group}"));
                out!("{}", crate::report::memory_compare::render((&a_name, a), (&b_name, b)));
            }
        }
    }
    Ok(())
}
