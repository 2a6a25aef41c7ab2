//! `runner plan`.

use std::path::Path;

use crate::batch;
use crate::cli::flags::PlanArgs;
use crate::cli::{CliError, Exit, out, outln, resolve};
use crate::log::projection::Index;

/// `runner plan`: from a run's observed variances, the epochs and tasks a paired comparison
/// needs to detect a difference of `--mde` points.
pub fn plan(args: PlanArgs) -> Result<Exit, CliError> {
    use crate::report::power;
    resolve::fraction("--alpha", Some(args.alpha))?;
    if !(args.mde > 0.0 && args.mde <= 100.0) {
        return Err(CliError::usage(
            "--mde is a difference in points of pass rate, more than 0 and at most 100 (5 is five points)",
        ));
    }
    let delta = args.mde / 100.0;
    let dir = batch::resume::find_logged_run(&args.run, Path::new("results")).map_err(CliError::usage)?;
    let index = Index::build(&dir.join("events.jsonl")).map_err(CliError::results)?;
    let mut cells = power::Cells::new();
    index
        .for_each_row(|row| {
            if let crate::log::Outcome::Scored { passed, .. } = row.outcome {
                let model = crate::report::summary::label(&row.model, row.variant.as_deref());
                power::count(&mut cells, power::cell_key(&row.suite, &model), &row.task_id, passed);
            }
        })
        .map_err(CliError::results)?;
    let decomposed = power::decompose(&cells);
    if decomposed.is_empty() {
        return Err(CliError::usage(format!("{}: no scored episode to plan from", dir.display())));
    }
    let header = [
        "suite",
        "model",
        "tasks",
        "epochs/task",
        "within-task var",
        "between-task var",
        "MDE now",
        "epochs needed",
        "or tasks needed",
        "tasks, independent",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.map(String::from).to_vec()];
    let mut bounded = false;
    for (key, d) in &decomposed {
        let plan = d.plan(delta, args.alpha);
        bounded |= !plan.exact;
        let bound = if plan.exact { "" } else { "≤ " };
        let var = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.4}"));
        lines.push(vec![
            key.suite.clone(),
            key.model.clone(),
            d.tasks.to_string(),
            format!("{:.1}", d.epochs_per_task()),
            var(d.within),
            var(d.between),
            d.detectable(args.alpha).map_or("none".into(), |(m, _)| format!("{bound}{:.1} pts", m * 100.0)),
            plan.epochs.map_or("more tasks".into(), |e| format!("{bound}{e}")),
            format!("{bound}{}", plan.tasks),
            plan.tasks_unpaired.map_or("-".into(), |t| t.to_string()),
        ]);
    }
    out!("{}", crate::report::summary::table(&lines));
    outln!(
        "to detect {} points at 80% power and alpha {} in a paired comparison: the epochs each of the run's tasks needs, or the tasks at the run's epochs per task",
        args.mde,
        args.alpha
    );
    outln!(
        "tasks, independent: the tasks needed when the two sides do not find the same tasks hard (different models, different tasks)"
    );
    if decomposed.iter().any(|(_, d)| d.plan(delta, args.alpha).epochs.is_none()) {
        outln!(
            "more tasks: the exact McNemar test on this few tasks cannot detect that difference, whatever the epochs"
        );
    }
    if bounded {
        outln!(
            "≤: one epoch per task cannot tell the epochs' noise from the tasks'; these are upper bounds (run 2 epochs or more to know)"
        );
    }
    Ok(Exit::Passed)
}
