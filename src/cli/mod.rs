//! The command line: arguments, the commands, and exit codes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::batch::regrade::LoggedRun;
use crate::batch::{self, RunError, RunOptions};
use crate::log::projection::{Index, Projection};
use crate::model::cache::CacheOptions;
use crate::model::config::ModelConfig;
use crate::model::replay::CassetteWriter;
use crate::model::{Backend, BackendOptions};
use crate::report::{Progress, Summary};
use crate::scoring::{Check, Graders};
use crate::suite::{self, Suite};

/// Distinct exit codes, documented in the README.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every gate passed.
    Passed = 0,
    /// A suite's `pass_threshold` or `--fail-under` was not met.
    GateFailed = 1,
    /// Bad arguments or a bad suite, environment or dataset file.
    Usage = 2,
    /// More episodes went unscored than `--max-unscored` allows.
    TooManyUnscored = 3,
    /// Episodes ran, but their results could not be written or read back (disk full,
    /// permissions).
    ResultsFailed = 4,
    /// Stopped by Ctrl-C or SIGTERM.
    Interrupted = 130,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

#[derive(Parser)]
#[command(name = "runner", version, about = "Run LLM agents through task suites and tell how well they did.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the episodes of one or more suites and score them.
    Eval(Box<EvalArgs>),
    /// Score a finished run again from its log: changed scorers, another grader. No agent
    /// model is called; the new scores are appended under a new scoring id.
    Regrade(RegradeArgs),
    /// Rebuild a run's tables and summary from its log; write an HTML report, JUnit or Markdown.
    Report(ReportArgs),
    /// Put backends side by side: pass rates with intervals, cost, latency, the tasks that
    /// flipped, and paired tests on the episodes the runs share.
    Compare(CompareArgs),
    /// Combine the shards of a run (or runs of the same suites and models on disjoint
    /// episodes) into one run folder.
    Merge(MergeArgs),
    /// Check suites (and their environments and datasets) without running them.
    Validate {
        /// Suite files, or folders of them.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
}

#[derive(Args)]
struct RegradeArgs {
    /// The run folder (or its events.jsonl).
    run: PathBuf,
    /// The grader model for LLM-graded scorers, over the suites' and scorers' choice.
    #[arg(long)]
    grader: Option<String>,
    /// Suite files with the scorers to apply (default: the files the run was made from).
    #[arg(long = "suite")]
    suites: Vec<PathBuf>,
    /// The providers and prices file.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    gates: GateArgs,
}

/// How a finished run is judged and reported: shared by eval, regrade and merge.
#[derive(Args, Clone, Default)]
struct GateArgs {
    /// Fail when the pass rate over all scored episodes is below this fraction.
    #[arg(long)]
    fail_under: Option<f64>,
    /// The largest fraction of episodes that may go unscored before the command fails.
    #[arg(long, default_value_t = 0.0)]
    max_unscored: f64,
    /// Compare with this run (a folder, such as a baseline committed to the repository) and
    /// fail only on a significant regression (exact McNemar test on the shared episodes).
    #[arg(long, value_name = "RUN")]
    baseline: Option<PathBuf>,
    /// With --baseline: a drop in pass rate up to this fraction is tolerated.
    #[arg(long, default_value_t = 0.0)]
    tolerance: f64,
    /// With --baseline: the significance level of the paired test.
    #[arg(long, default_value_t = 0.05)]
    alpha: f64,
    /// Write a JUnit XML report here: one test case per episode.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Write the summary as Markdown here (also appended to $GITHUB_STEP_SUMMARY when set).
    #[arg(long)]
    markdown: Option<PathBuf>,
}

#[derive(Args)]
struct ReportArgs {
    /// The run folder (or its events.jsonl).
    run: PathBuf,
    /// Write a self-contained HTML report: `--html` to RUN/report.html, `--html=FILE` elsewhere.
    #[arg(long, value_name = "FILE", num_args = 0..=1, require_equals = true)]
    html: Option<Option<PathBuf>>,
    /// The most episodes whose whole trajectory goes into the HTML report (failed and
    /// unscored ones first); the others are listed with their results only.
    #[arg(long, default_value_t = 2000)]
    max_trajectories: usize,
    /// Write a JUnit XML report here: one test case per episode.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Write the summary as Markdown here.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

#[derive(Args)]
struct CompareArgs {
    /// Run folders; one run made with several --model compares those models.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// Write the comparison as Markdown here (for a pull-request comment).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Write the per-model table as CSV here, and the paired tests beside it (`NAME.pairs.csv`).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Exit 1 when a later group is significantly worse than the first (by --alpha, beyond --tolerance).
    #[arg(long)]
    fail_on_regression: bool,
    /// A drop in pass rate up to this fraction is tolerated.
    #[arg(long, default_value_t = 0.0)]
    tolerance: f64,
    /// The significance level of the paired test.
    #[arg(long, default_value_t = 0.05)]
    alpha: f64,
}

#[derive(Args)]
struct MergeArgs {
    /// The run folders of the shards.
    #[arg(required = true, num_args = 2..)]
    runs: Vec<PathBuf>,
    /// The folder the merged run is written under.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Name the merged run's folder instead of using a timestamp.
    #[arg(long)]
    run_id: Option<String>,
    /// Merge even when a shard is missing or did not finish (the verdict is then partial).
    #[arg(long)]
    allow_partial: bool,
    #[command(flatten)]
    gates: GateArgs,
}

#[derive(Args)]
struct EvalArgs {
    /// Suite files, or folders of them.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// A model: `provider/model` (openai/gpt-4o-mini, anthropic/claude-…, ollama/qwen3,
    /// openai-compatible/NAME), `mock`, or `replay:PATH`. Repeat to compare several.
    #[arg(long = "model", short = 'm', required = true)]
    models: Vec<String>,
    /// The providers and prices file (default: $RUNNER_CONFIG, else ./runner.yaml if present).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Append every model response to this cassette, for `--model replay:FILE`.
    #[arg(long)]
    record: Option<PathBuf>,
    /// Serve repeated requests from a local response cache.
    #[arg(long)]
    cache: bool,
    /// The grader model for LLM-graded scorers, over the suites' and scorers' choice.
    #[arg(long)]
    grader: Option<String>,
    /// How long cached responses stay fresh, in seconds.
    #[arg(long, default_value_t = 7 * 24 * 3600)]
    cache_ttl_s: u64,
    /// Where the cache lives (default: ~/.cache/runner/responses).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Run each task this many times (overrides the suites' `epochs`).
    #[arg(long)]
    epochs: Option<u32>,
    /// How many episodes run at once.
    #[arg(long, short = 'j', default_value_t = 8)]
    jobs: usize,
    /// The folder runs are written under.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Name the run folder instead of using a timestamp.
    #[arg(long, conflicts_with = "resume")]
    run_id: Option<String>,
    /// Continue an interrupted or partly failed run (its folder, or its id under --out):
    /// scored episodes are kept, unscored and missing ones run again.
    #[arg(long, value_name = "RUN")]
    resume: Option<PathBuf>,
    #[command(flatten)]
    gates: GateArgs,
    /// `mock` only: each model call waits this many milliseconds (`20`, or `10-30` at
    /// random), to measure scheduling without a provider.
    #[arg(long, value_parser = crate::model::mock::parse_delay)]
    mock_delay_ms: Option<(u64, u64)>,
    /// Run only shard I of N (`--shard 2/4`): a stable hash of each episode's id picks it.
    #[arg(long, value_parser = batch::parse_shard)]
    shard: Option<(u64, u64)>,
    /// No progress bar or per-episode lines; only the summary.
    #[arg(long, short = 'q')]
    quiet: bool,
}

/// Parses the command line, runs the command, and returns its exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { paths } => validate(&paths).into(),
        Command::Eval(args) => eval(*args).unwrap_or_else(|exit| exit).into(),
        Command::Regrade(args) => regrade(args).unwrap_or_else(|exit| exit).into(),
        Command::Report(args) => report(args).unwrap_or_else(|exit| exit).into(),
        Command::Compare(args) => compare(args).unwrap_or_else(|exit| exit).into(),
        Command::Merge(args) => merge(args).unwrap_or_else(|exit| exit).into(),
    }
}

/// Expands folders into the suite files inside them, in name order.
fn suite_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| format!("{}: failed to read folder: {e}", path.display()))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            inside.sort();
            files.extend(inside);
        } else if path.exists() {
            files.push(path.clone());
        } else {
            return Err(format!("{}: no such file", path.display()));
        }
    }
    if files.is_empty() {
        return Err("no suite files found".into());
    }
    Ok(files)
}

fn load_suites(paths: &[PathBuf]) -> Result<Vec<Arc<Suite>>, Exit> {
    let files = suite_files(paths).map_err(|e| {
        eprintln!("error: {e}");
        Exit::Usage
    })?;
    suite::load_all(&files).map_err(|errors| {
        for e in errors {
            eprintln!("error: {e}");
        }
        Exit::Usage
    })
}

fn validate(paths: &[PathBuf]) -> Exit {
    let files = match suite_files(paths) {
        Ok(files) => files,
        Err(e) => {
            eprintln!("error: {e}");
            return Exit::Usage;
        }
    };
    let mut ok = true;
    let mut names: Vec<(String, PathBuf)> = Vec::new();
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
                println!(
                    "ok  {}  suite `{}`: {} tasks, environment `{}`",
                    file.display(),
                    s.name,
                    s.tasks.len(),
                    s.environment.name
                );
                names.push((s.name.clone(), file.clone()));
            }
            Err(e) => {
                ok = false;
                eprintln!("error: {e}");
            }
        }
    }
    if ok { Exit::Passed } else { Exit::Usage }
}

/// Prints an error and gives the exit code it means: `.map_err(fail(Exit::Usage))?`.
fn fail<E: std::fmt::Display>(exit: Exit) -> impl FnOnce(E) -> Exit {
    move |e| {
        eprintln!("error: {e}");
        exit
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Exit> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(Exit::Usage)(format!("failed to start the async runtime: {e}")))
}

fn eval(args: EvalArgs) -> Result<Exit, Exit> {
    let (models, config, options) = open_models(&args).map_err(fail(Exit::Usage))?;
    let baseline = check_gates(&args.gates, &args.out)?;
    if args.epochs == Some(0) {
        return Err(fail(Exit::Usage)("--epochs must be at least 1"));
    }
    let suites = load_suites(&args.paths)?;
    for suite in &suites {
        let epochs = args.epochs.unwrap_or(suite.epochs);
        if let Some(k) = suite.k_of_n.filter(|k| *k > epochs) {
            let message =
                format!("{}: k_of_n {k} is more than the {epochs} epoch(s) this run makes", suite.path.display());
            return Err(fail(Exit::Usage)(message));
        }
    }
    // The graders are recorded and cached like the models under test, and replayed with them.
    let graders =
        Arc::new(open_graders(&suites, args.grader.clone(), &config, options, &models).map_err(fail(Exit::Usage))?);
    // The clients hold their keys now; the commands the worlds run must not find them.
    crate::log::secrets::withdraw_from_environment(config.key_vars());
    let resume = match &args.resume {
        Some(run) => {
            let dir = batch::resume::find_run(run, &args.out).map_err(fail(Exit::Usage))?;
            Some(batch::resume::plan(&dir, &suites, &models, args.epochs, args.shard).map_err(fail(Exit::Usage))?)
        }
        None => None,
    };
    let jobs = crate::environment::resources::fit_jobs(args.jobs.max(1), suites.iter().map(|s| &*s.environment));
    let runtime = runtime()?;
    let options = RunOptions {
        models,
        epochs: args.epochs,
        jobs,
        out_dir: args.out.clone(),
        run_id: args.run_id.clone(),
        command_line: std::env::args().collect(),
        graders,
        shard: args.shard,
        resume,
    };
    let total = batch::episode_count(&suites, &options);
    if let Some(resume) = &options.resume {
        eprintln!("resuming {}: {} scored episodes kept, {total} to run", resume.dir.display(), resume.keep.len());
    }
    let stop = CancellationToken::new();
    let result = runtime.block_on(async {
        tokio::spawn(stop_on_signal(stop.clone()));
        let mut progress = Progress::new(total, args.quiet);
        let result = batch::run(&suites, &options, stop.clone(), |r| progress.finished(r)).await;
        progress.finish();
        result
    });
    let result = result.map_err(|e| match e {
        RunError::Exists(_) | RunError::Folder { .. } | RunError::Locked(_) => fail(Exit::Usage)(e),
        _ => fail(Exit::ResultsFailed)(e),
    })?;
    drop(runtime);
    release_free_memory();
    let (summary, index) = summarize(&result.events_path)?;
    print!("\n{}", summary.render());
    println!("results: {}", result.dir.display());
    write_reports(&index, &summary, args.gates.junit.as_deref(), args.gates.markdown.as_deref())?;
    if let Some(reason) = &result.aborted {
        return Err(fail(Exit::Usage)(format!("stopped early, the model is misconfigured: {reason}")));
    }
    if result.interrupted {
        eprintln!("interrupted: episodes in flight were cancelled");
        return Ok(Exit::Interrupted);
    }
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
fn summarize(events: &std::path::Path) -> Result<(Summary, Index), Exit> {
    let index = Index::build(events).map_err(fail(Exit::ResultsFailed))?;
    let mut summary = Summary::begin(&index.meta);
    let dir = events.parent().unwrap_or(std::path::Path::new("."));
    summary.run_dir = Some(dir.display().to_string());
    crate::report::table::write_tables(&index, dir, |row| summary.add(row)).map_err(fail(Exit::ResultsFailed))?;
    let path = dir.join("summary.json");
    let json = serde_json::to_vec_pretty(&summary.to_json()).unwrap_or_default();
    crate::report::write_atomically(&path, &json)
        .map_err(|e| fail(Exit::ResultsFailed)(format!("failed to write {}: {e}", path.display())))?;
    Ok((summary, index))
}

/// `--junit`, `--markdown` and the GitHub step summary.
fn write_reports(
    index: &Index,
    summary: &Summary,
    junit: Option<&std::path::Path>,
    markdown: Option<&std::path::Path>,
) -> Result<(), Exit> {
    let failed = |what: &std::path::Path, e: std::io::Error| {
        eprintln!("error: failed to write {}: {e}", what.display());
        Exit::ResultsFailed
    };
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

/// Checks the gate flags before anything runs, and reads the baseline run (a bad baseline
/// is found now, not after an hour of episodes).
fn check_gates(gates: &GateArgs, out_dir: &std::path::Path) -> Result<Option<Projection>, Exit> {
    let fractions = [
        ("--fail-under", gates.fail_under),
        ("--max-unscored", Some(gates.max_unscored)),
        ("--tolerance", Some(gates.tolerance)),
        ("--alpha", Some(gates.alpha)),
    ];
    for (flag, value) in fractions {
        if let Some(v) = value
            && !(0.0..=1.0).contains(&v)
        {
            return Err(fail(Exit::Usage)(format!("{flag} must be a fraction between 0 and 1, got {v}")));
        }
    }
    match &gates.baseline {
        Some(run) => {
            let dir = batch::resume::find_logged_run(run, out_dir).map_err(fail(Exit::Usage))?;
            let baseline = Projection::from_log(&dir.join("events.jsonl")).map_err(fail(Exit::Usage))?;
            if baseline.header.suites.is_empty() || baseline.episodes.is_empty() {
                return Err(fail(Exit::Usage)(format!("--baseline {}: the run has no episodes", dir.display())));
            }
            Ok(Some(baseline))
        }
        None => Ok(None),
    }
}

/// The exit code of a finished run: the unscored share, thresholds and `--fail-under`, then
/// the comparison with the baseline.
fn judge(index: &Index, summary: &Summary, gates: &GateArgs, baseline: Option<Projection>) -> Result<Exit, Exit> {
    let exit = gate(summary, gates.fail_under, gates.max_unscored);
    let Some(baseline) = baseline else { return Ok(exit) };
    let current = Projection::from_index(index).map_err(fail(Exit::ResultsFailed))?;
    let (verdicts, unmatched) = crate::report::compare::against_baseline(&baseline, &current);
    let mut regressed = false;
    for t in &verdicts {
        let effect = t.effect.map_or("-".into(), |e| format!("{:+.1} pts", e * 100.0));
        let significant = t.regressed(gates.tolerance, gates.alpha);
        eprintln!(
            "baseline: {} vs {}: {} shared tasks ({} episodes), {} regressed, {} improved, effect {effect}, McNemar p = {:.4}: {}",
            t.b,
            t.a,
            t.shared,
            t.shared_episodes,
            t.only_a,
            t.only_b,
            t.p_value,
            if significant { "significant regression" } else { "no significant regression" }
        );
        regressed |= significant;
    }
    if !unmatched.is_empty() {
        eprintln!(
            "error: --baseline {} cannot judge {}: give a baseline of the same models and tasks",
            baseline.run_id,
            unmatched.join("; ")
        );
        return Ok(if exit != Exit::Passed { exit } else { Exit::Usage });
    }
    Ok(if exit != Exit::Passed {
        exit
    } else if regressed {
        Exit::GateFailed
    } else {
        Exit::Passed
    })
}

fn regrade(args: RegradeArgs) -> Result<Exit, Exit> {
    let baseline = check_gates(&args.gates, std::path::Path::new("results"))?;
    let run = LoggedRun::read(&args.run).map_err(fail(Exit::Usage))?;
    let paths: Vec<PathBuf> = if args.suites.is_empty() {
        run.suites.iter().map(|s| PathBuf::from(&s.path)).collect()
    } else {
        args.suites.clone()
    };
    let suites = load_suites(&paths).inspect_err(|_| {
        if args.suites.is_empty() {
            eprintln!("note: these are the suite files the run was made from; name them with --suite");
        }
    })?;
    let config = ModelConfig::load(args.config.as_deref()).map_err(fail(Exit::Usage))?;
    let graders = open_graders(&suites, args.grader.clone(), &config, BackendOptions::default(), &[])
        .map_err(fail(Exit::Usage))?;
    crate::log::secrets::withdraw_from_environment(config.key_vars());
    let run_dir = run.events_path.parent().unwrap_or(std::path::Path::new("."));
    let _lock = batch::lock(run_dir).map_err(fail(Exit::Usage))?;
    let regraded =
        runtime()?.block_on(crate::batch::regrade::regrade(&run, &suites, &graders, std::env::args().collect()));
    let (scoring_id, counts) = regraded
        .map_err(|e| fail(Exit::ResultsFailed)(format!("failed to append to {}: {e}", run.events_path.display())))?;
    let (summary, index) = summarize(&run.events_path)?;
    print!("{}", summary.render());
    let changed = if counts.changed_tasks > 0 {
        format!("; {} on tasks whose content changed since the run", counts.changed_tasks)
    } else {
        String::new()
    };
    println!(
        "scoring `{scoring_id}`: {} episodes re-scored ({} passed, {} unscored), {} skipped{changed}",
        counts.episodes, counts.passed, counts.unscored, counts.skipped
    );
    write_reports(&index, &summary, args.gates.junit.as_deref(), args.gates.markdown.as_deref())?;
    judge(&index, &summary, &args.gates, baseline)
}

fn report(args: ReportArgs) -> Result<Exit, Exit> {
    let dir = batch::resume::find_logged_run(&args.run, std::path::Path::new("results")).map_err(fail(Exit::Usage))?;
    let events = dir.join("events.jsonl");
    let (summary, index) = summarize(&events)?;
    print!("{}", summary.render());
    println!("tables: {}, {}", dir.join("episodes.csv").display(), dir.join("episodes.parquet").display());
    write_reports(&index, &summary, args.junit.as_deref(), args.markdown.as_deref())?;
    if let Some(html) = &args.html {
        let path = html.clone().unwrap_or_else(|| dir.join("report.html"));
        let failed = |e: String| fail(Exit::ResultsFailed)(format!("failed to write {}: {e}", path.display()));
        let tmp = crate::report::temporary_beside(&path).map_err(|e| failed(e.to_string()))?;
        let file = tmp.reopen().map_err(|e| failed(e.to_string()))?;
        let mut out = std::io::BufWriter::with_capacity(256 * 1024, file);
        crate::report::html::render(&index, args.max_trajectories, &mut out).map_err(failed)?;
        drop(out);
        tmp.persist(&path).map_err(|e| failed(e.error.to_string()))?;
        println!("report: {}", path.display());
    }
    Ok(Exit::Passed)
}

fn compare(args: CompareArgs) -> Result<Exit, Exit> {
    for (flag, v) in [("--tolerance", args.tolerance), ("--alpha", args.alpha)] {
        if !(0.0..=1.0).contains(&v) {
            return Err(fail(Exit::Usage)(format!("{flag} must be a fraction between 0 and 1, got {v}")));
        }
    }
    let mut runs = Vec::new();
    for run in &args.runs {
        let dir = batch::resume::find_logged_run(run, std::path::Path::new("results")).map_err(fail(Exit::Usage))?;
        runs.push(Projection::from_log(&dir.join("events.jsonl")).map_err(fail(Exit::Usage))?);
    }
    let comparison = crate::report::compare::Comparison::of(&runs);
    if comparison.groups.len() < 2 {
        return Err(fail(Exit::Usage)(
            "nothing to compare: the runs hold fewer than two models with episodes (give two runs, or a run made with several --model)",
        ));
    }
    print!("{}", comparison.render());
    let write = |path: &std::path::Path, bytes: &[u8]| {
        std::fs::write(path, bytes)
            .map_err(|e| fail(Exit::ResultsFailed)(format!("failed to write {}: {e}", path.display())))
    };
    if let Some(path) = &args.markdown {
        write(path, comparison.markdown().as_bytes())?;
    }
    if let Some(path) = &args.csv {
        write(path, &comparison.groups_csv().map_err(fail(Exit::ResultsFailed))?)?;
        write(&path.with_extension("pairs.csv"), &comparison.pairs_csv().map_err(fail(Exit::ResultsFailed))?)?;
    }
    // Gated: each later run against the first, model by model; in one run of several
    // models, each against the first model.
    let verdicts: Vec<crate::report::compare::PairTest> = if runs.len() > 1 {
        let mut verdicts = Vec::new();
        for run in &runs[1..] {
            let (tests, unmatched) = crate::report::compare::against_baseline(&runs[0], run);
            if args.fail_on_regression && !unmatched.is_empty() {
                return Err(fail(Exit::Usage)(format!(
                    "--fail-on-regression cannot judge {} of {} against {}: {}",
                    if unmatched.len() == 1 { "a model" } else { "models" },
                    run.run_id,
                    runs[0].run_id,
                    unmatched.join("; ")
                )));
            }
            verdicts.extend(tests);
        }
        verdicts
    } else {
        let first = comparison.groups[0].label.clone();
        let (gated, _): (Vec<_>, Vec<_>) = comparison.pairs.into_iter().partition(|p| p.a == first);
        if let Some(blind) = gated.iter().find(|p| p.shared == 0).filter(|_| args.fail_on_regression) {
            return Err(fail(Exit::Usage)(format!(
                "--fail-on-regression cannot judge {} against {}: no task scored in both",
                blind.b, blind.a
            )));
        }
        gated
    };
    // Last, so that a CI log ends with why the command passed or failed.
    for t in &verdicts {
        println!("{}", t.verdict(args.tolerance, args.alpha));
    }
    let regressed = verdicts.iter().any(|t| t.regressed(args.tolerance, args.alpha));
    Ok(if args.fail_on_regression && regressed { Exit::GateFailed } else { Exit::Passed })
}

fn merge(args: MergeArgs) -> Result<Exit, Exit> {
    let baseline = check_gates(&args.gates, &args.out)?;
    let mut dirs = Vec::new();
    for run in &args.runs {
        dirs.push(batch::resume::find_run(run, &args.out).map_err(fail(Exit::Usage))?);
    }
    let run_id = args.run_id.clone().unwrap_or_else(batch::new_run_id);
    let merged = batch::merge::merge(&dirs, &args.out, run_id, std::env::args().collect(), args.allow_partial)
        .map_err(fail(Exit::Usage))?;
    if !merged.missing_shards.is_empty() {
        eprintln!("warning: shard(s) {} missing from the merge", merged.missing_shards.join(", "));
    }
    let (summary, index) = summarize(&merged.events_path)?;
    print!("{}", summary.render());
    println!("merged {} runs, {} episodes: {}", dirs.len(), merged.episodes, merged.dir.display());
    write_reports(&index, &summary, args.gates.junit.as_deref(), args.gates.markdown.as_deref())?;
    judge(&index, &summary, &args.gates, baseline)
}

/// Opens the grader models the suites need; a grader scorer without one is an error now,
/// not a silent fallback to the model under test.
fn open_graders(
    suites: &[Arc<Suite>],
    forced: Option<String>,
    config: &ModelConfig,
    options: BackendOptions,
    under_test: &[Arc<Backend>],
) -> Result<Graders, String> {
    let mut names = Vec::new();
    for suite in suites {
        for spec in suite.scorers.iter().chain(suite.tasks.iter().flat_map(|t| &t.scorers)) {
            if let Check::Grader { model, .. } = &spec.check {
                let chosen =
                    forced.clone().or_else(|| model.clone()).or_else(|| suite.grader.as_ref().map(|g| g.model.clone()));
                match chosen {
                    Some(name) => names.push(name),
                    None => {
                        return Err(suite.ungraded.first().map(|e| e.to_string()).unwrap_or_else(|| {
                            format!(
                                "{}: `{}` needs a grader model: set `grader: {{model: …}}` in the suite, `model:` on the scorer, or pass --grader",
                                suite.path.display(),
                                spec.name
                            )
                        }));
                    }
                }
            }
        }
    }
    Graders::open(names, forced, config, options, under_test)
}

/// Opens every `--model`, with recording and caching as asked (the options, for the graders).
fn open_models(args: &EvalArgs) -> Result<(Vec<Arc<Backend>>, ModelConfig, BackendOptions), String> {
    let config = ModelConfig::load(args.config.as_deref()).map_err(|e| e.to_string())?;
    let record = match &args.record {
        Some(path) => Some(Arc::new(
            CassetteWriter::create(path).map_err(|e| format!("failed to open the cassette {}: {e}", path.display()))?,
        )),
        None => None,
    };
    let cache = args.cache.then(|| {
        Arc::new(CacheOptions {
            dir: args.cache_dir.clone().unwrap_or_else(CacheOptions::default_dir),
            ttl: std::time::Duration::from_secs(args.cache_ttl_s),
        })
    });
    let options = BackendOptions { record, cache, mock_delay_ms: args.mock_delay_ms };
    let mut models: Vec<Arc<Backend>> = Vec::new();
    for spec in &args.models {
        let backend = Backend::open(spec, &config, options.clone())?;
        if models.iter().any(|m| m.name() == backend.name()) {
            return Err(format!("--model {} is given more than once (as `{spec}`)", backend.name()));
        }
        models.push(Arc::new(backend));
    }
    Ok((models, config, options))
}

/// Decides the exit code of a finished run. Unscored episodes come first: a verdict
/// built on too few scored episodes cannot be trusted either way.
fn gate(summary: &Summary, fail_under: Option<f64>, max_unscored: f64) -> Exit {
    let total = summary.total();
    if total.episodes > 0 && total.unscored as f64 / total.episodes as f64 > max_unscored {
        eprintln!(
            "gate: {} of {} episodes unscored, more than --max-unscored {max_unscored} allows",
            total.unscored, total.episodes
        );
        return Exit::TooManyUnscored;
    }
    let mut failed = false;
    for row in &summary.rows {
        let threshold = summary.thresholds.get(&row.suite).copied().flatten();
        if let (Some(threshold), Some(rate)) = (threshold, row.pass_rate())
            && rate < threshold
        {
            eprintln!(
                "gate: suite `{}` on {} passed {:.1}%, below its pass_threshold {:.1}%",
                row.suite,
                row.model,
                rate * 100.0,
                threshold * 100.0
            );
            failed = true;
        }
    }
    for row in summary.epoch_rows() {
        if !row.below_k_of_n.is_empty() {
            let shown: Vec<&str> = row.below_k_of_n.iter().take(5).map(String::as_str).collect();
            let more = row.below_k_of_n.len().saturating_sub(5);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            eprintln!(
                "gate: suite `{}` on {}: {} task(s) passed fewer epochs than k_of_n: {}{more}",
                row.suite,
                row.model,
                row.below_k_of_n.len(),
                shown.join(", ")
            );
            failed = true;
        }
    }
    if let (Some(min), Some(rate)) = (fail_under, total.pass_rate())
        && rate < min
    {
        eprintln!("gate: {:.1}% of scored episodes passed, below --fail-under {:.1}%", rate * 100.0, min * 100.0);
        failed = true;
    }
    if failed { Exit::GateFailed } else { Exit::Passed }
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
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    std::process::exit(Exit::Interrupted as i32);
}
