//! One function per command: each resolves its flags, does its work through the library,
//! prints what people read, and returns its exit code or a [`CliError`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::flags::{
    CompareArgs, EvalArgs, ExportArgs, GateArgs, JudgeCheckArgs, MergeArgs, PlanArgs, RegradeArgs, ReportArgs,
    SearchArgs, Switch,
};
use super::{CliError, Exit, out, outln, resolve};
use crate::batch::regrade::LoggedRun;
use crate::batch::{self, RunError};
use crate::log::Subscription;
use crate::log::projection::{Index, Projection};
use crate::model::BackendOptions;
use crate::model::config::ModelConfig;
use crate::report::gate::{self, Gate};
use crate::report::{Progress, Summary};
use crate::suite;

/// `runner validate`: every file is checked; any bad one fails the command.
pub fn validate(paths: &[PathBuf], build: bool) -> Result<Exit, CliError> {
    let files = resolve::suite_files(paths)?;
    let mut ok = true;
    let mut names: Vec<(String, PathBuf)> = Vec::new();
    let mut loaded = Vec::new();
    for file in &files {
        match suite::load(file) {
            Ok(s) if !s.ungraded.is_empty() => {
                // `eval` refuses these unless --grader names a model; validate has no --grader.
                ok = false;
                for e in &s.ungraded {
                    eprintln!("error: {e}");
                }
            }
            Ok(s) => {
                if let Some((_, other)) = names.iter().find(|(name, _)| *name == s.name) {
                    ok = false;
                    eprintln!(
                        "error: {}: suite name `{}` is already used by {}",
                        file.display(),
                        s.name,
                        other.display()
                    );
                    continue;
                }
                outln!(
                    "ok  {}  suite `{}`: {} tasks, environment `{}`",
                    file.display(),
                    s.name,
                    s.tasks.len(),
                    s.environment.name
                );
                for task in &s.tasks {
                    if let Some(why) = &task.unavailable {
                        outln!("    task `{}` cannot run here, its episodes will be unscored: {why}", task.id);
                    }
                }
                names.push((s.name.clone(), file.clone()));
                loaded.push(std::sync::Arc::new(s));
            }
            Err(e) => {
                ok = false;
                eprintln!("error: {e}");
            }
        }
    }
    let registries = || crate::model::config::ModelConfig::load(None).map(|c| c.images).map_err(CliError::usage);
    if build && !resolve::prepare_images(&loaded, &registries()?)?.is_empty() {
        ok = false;
    }
    Ok(if ok { Exit::Passed } else { Exit::Usage })
}

/// `runner tools ENV`: the tools an environment offers, as the agent is shown them (JSON).
/// An MCP environment's servers are started once to list theirs.
pub fn tools(environment: &str, sandbox: Switch) -> Result<Exit, CliError> {
    use crate::environment::definition::Definition;
    use crate::sandbox::SandboxMode;
    // Looked up as a suite in the current folder would: environments/NAME.yaml, a path, a kind.
    let definition = Definition::resolve(environment, Path::new("./tools")).map_err(CliError::usage)?;
    let mode = match sandbox {
        Switch::Off => SandboxMode::Off("the command line"),
        Switch::On => SandboxMode::On,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::usage(format!("failed to start the async runtime: {e}")))?;
    let definition = runtime
        .block_on(definition.discovered(mode))
        .map_err(|e| CliError::usage(format!("environment `{environment}`: {e}")))?;
    let specs = serde_json::to_string_pretty(&definition.specs).map_err(CliError::usage)?;
    outln!("{specs}");
    if !definition.system_addition.trim().is_empty() {
        eprintln!("added to the system prompt:\n{}", definition.system_addition.trim_end());
    }
    Ok(Exit::Passed)
}

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

/// `runner search`: the best matches of a query over runs, through each run's index (built
/// or built again first when the log changed).
pub fn search(args: SearchArgs) -> Result<Exit, CliError> {
    use crate::log::search::{Filters, SearchError};
    let mut words = args.runs_and_query;
    let query = words.pop().unwrap_or_default();
    if query.trim().is_empty() {
        return Err(CliError::usage("the query is empty: give RUN... then the words to find"));
    }
    if args.limit == 0 {
        return Err(CliError::usage("--limit must be at least 1"));
    }
    let mut dirs = Vec::new();
    for run in &words {
        dirs.push(batch::resume::find_logged_run(Path::new(run), Path::new("results")).map_err(CliError::usage)?);
    }
    let filters = Filters {
        suite: args.suite,
        task: args.task,
        model: args.model,
        outcome: args.outcome,
        actor: args.actor,
        kind: args.kind,
        not_task: None,
    };
    let found = crate::report::search::search(&dirs, &query, &filters, args.limit).map_err(|e| match e {
        SearchError::Query { .. } => CliError::usage(e),
        SearchError::Log(_) | SearchError::Index { .. } | SearchError::Stopped => CliError::results(e),
    })?;
    for note in &found.notes {
        eprintln!("{note}");
    }
    if args.json {
        outln!("{}", crate::report::search::to_json(&query, &found.hits));
    } else {
        out!("{}", crate::report::search::render(&found.hits, dirs.len() > 1));
    }
    Ok(Exit::Passed)
}

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
    let labels = judge_check::read_labels(&args.labels).map_err(CliError::usage)?;
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
