//! The flags, as plain clap structs: they mirror the command line and only validate what
//! clap can. What they name (suites, models, runs) is opened in `resolve`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::batch;

#[derive(Parser)]
#[command(name = "runner", version, about = "Run LLM agents through task suites and tell how well they did.")]
pub struct CommandLine {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
    /// Write a run's episodes as ATIF trajectories, or as ShareGPT or OpenAI-messages JSONL
    /// for fine-tuning sets; says which episodes were written and which skipped, and why.
    Export(ExportArgs),
    /// From a run's observed variances: the epochs (and tasks) a paired comparison needs to
    /// detect a difference of `--mde` points at 80% power.
    Plan(PlanArgs),
    /// Combine the shards of a run (or runs of the same suites and models on disjoint
    /// episodes) into one run folder.
    Merge(MergeArgs),
    /// Print the tools an environment offers (a file in environments/, a path, or a
    /// built-in kind), as JSON tool specs; an MCP environment's servers are started once.
    Tools {
        /// The environment: a name in environments/, a path to its file, or a kind.
        environment: String,
        /// `off` starts the servers without the sandbox.
        #[arg(long, value_enum, default_value_t = Switch::On, value_name = "on|off")]
        sandbox: Switch,
    },
    /// Full-text search over runs: the messages, tool calls, observations, answers and
    /// score explanations of their episodes, best matches first.
    Search(SearchArgs),
    /// Check a run's LLM judge against people: a labels file of human verdicts gives, per
    /// graded scorer, accuracy, Cohen's kappa, Krippendorff's alpha, the confusion matrix,
    /// the judge's self-consistency and the episodes where they disagree.
    JudgeCheck(JudgeCheckArgs),
    /// Pull images from registries into the image store, list them, remove them.
    Images(ImagesArgs),
    /// Serve episodes and steps on demand over HTTP (trainers, other loops): episodes with
    /// the caller's endpoint as the policy, OpenEnv's reset/step/state with the caller as
    /// the policy, into one run folder, within a bound, with a queue that survives a kill.
    Serve(Box<ServeArgs>),
    /// A local web app over runs: the runs newest first, a run's episodes and trajectories,
    /// runs compared (flips, paired tests, aligned trajectories), a run being written
    /// followed live, and labels for `judge-check` set in the page.
    View(ViewArgs),
    /// Check suites (and their environments and datasets) without running them.
    Validate {
        /// Suite files, or folders of them.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Also pull or build the images the suites run in (a Harbor task's Dockerfile, an
        /// environment's `image:` or `build:`), and say which fail.
        #[arg(long)]
        build: bool,
    },
}

#[derive(Args)]
pub struct RegradeArgs {
    /// The run folder (or its events.jsonl).
    pub run: PathBuf,
    /// The grader model for LLM-graded scorers, over the suites' and scorers' choice.
    #[arg(long)]
    pub grader: Option<String>,
    /// Suite files with the scorers to apply (default: the files the run was made from).
    #[arg(long = "suite")]
    pub suites: Vec<PathBuf>,
    /// The providers and prices file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub gates: GateArgs,
}

/// How a finished run is judged and reported: shared by eval, regrade and merge.
#[derive(Args, Clone, Default)]
pub struct GateArgs {
    /// Fail when the pass rate over all scored episodes is below this fraction.
    #[arg(long)]
    pub fail_under: Option<f64>,
    /// The largest fraction of episodes that may go unscored before the command fails.
    #[arg(long, default_value_t = 0.0)]
    pub max_unscored: f64,
    /// Compare with this run (a folder, such as a baseline committed to the repository) and
    /// fail only on a significant regression (exact McNemar test on the shared episodes).
    #[arg(long, value_name = "RUN")]
    pub baseline: Option<PathBuf>,
    /// With --baseline: a drop in pass rate up to this fraction is tolerated.
    #[arg(long, default_value_t = 0.0)]
    pub tolerance: f64,
    /// With --baseline: the significance level of the paired test.
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
    /// Write a JUnit XML report here: one test case per episode.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Write the summary as Markdown here (also appended to $GITHUB_STEP_SUMMARY when set).
    #[arg(long)]
    pub markdown: Option<PathBuf>,
}

#[derive(Args)]
pub struct ReportArgs {
    /// The run folder (or its events.jsonl).
    pub run: PathBuf,
    /// Write a self-contained HTML report: `--html` to RUN/report.html, `--html=FILE` elsewhere.
    #[arg(long, value_name = "FILE", num_args = 0..=1, require_equals = true)]
    pub html: Option<Option<PathBuf>>,
    /// The most episodes whose whole trajectory goes into the HTML report (failed and
    /// unscored ones first); the others are listed with their results only.
    #[arg(long, default_value_t = 2000)]
    pub max_trajectories: usize,
    /// Write a JUnit XML report here: one test case per episode.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Write the summary as Markdown here.
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// The significance level of the minimum detectable difference in the noise table.
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
}

#[derive(Args)]
pub struct ExportArgs {
    /// The run: its id (a folder in results/), its folder, or its events.jsonl.
    pub run: PathBuf,
    /// `atif`: one trajectory file per agent of an episode; `sharegpt`, `openai`: one JSONL line per episode.
    #[arg(long, value_enum)]
    pub format: crate::report::export::Format,
    /// Only the episodes that passed (the same as `--outcome passed`).
    #[arg(long, conflicts_with = "outcome")]
    pub passed_only: bool,
    /// Only the episodes of this status in the episodes table (`scored` is passed or failed).
    #[arg(long, value_enum, value_name = "O")]
    pub outcome: Option<crate::report::export::Status>,
    /// Where to write; by default `RUN/export/FORMAT/`.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Args)]
pub struct CompareArgs {
    /// Run folders; one run made with several --model compares those models.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Write the comparison as Markdown here (for a pull-request comment).
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Write the per-model table as CSV here, and the paired tests beside it (`NAME.pairs.csv`).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Exit 1 when a later group is significantly worse than the first (by --alpha, beyond --tolerance).
    #[arg(long)]
    pub fail_on_regression: bool,
    /// A drop in pass rate up to this fraction is tolerated.
    #[arg(long, default_value_t = 0.0)]
    pub tolerance: f64,
    /// The significance level of the paired test.
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
}

#[derive(Args)]
pub struct SearchArgs {
    /// Run folders (or ids under results/), then the query: words, "a phrase", pre*, AND,
    /// OR, NOT and parentheses (SQLite FTS5).
    #[arg(required = true, num_args = 2.., value_name = "RUN... QUERY")]
    pub runs_and_query: Vec<String>,
    /// Only episodes of this suite.
    #[arg(long, value_name = "S")]
    pub suite: Option<String>,
    /// Only episodes of this task.
    #[arg(long, value_name = "T")]
    pub task: Option<String>,
    /// Only episodes of this model.
    #[arg(long, value_name = "M")]
    pub model: Option<String>,
    /// Only episodes of this outcome: passed, failed, scored, unscored, cancelled, unfinished.
    #[arg(long, value_name = "O", value_parser = crate::log::search::parse_outcome)]
    pub outcome: Option<String>,
    /// Only what this actor said or did: main, main.1, user, or scorer.
    #[arg(long, value_name = "A")]
    pub actor: Option<String>,
    /// Only this type of text: message, tool_call, observation, answer, score, error.
    #[arg(long = "type", value_name = "T", value_parser = crate::log::search::DocKind::parse)]
    pub kind: Option<crate::log::search::DocKind>,
    /// The most hits shown.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub limit: usize,
    /// Print the hits as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct JudgeCheckArgs {
    /// The run folder (or its id under results/).
    pub run: PathBuf,
    /// The human verdicts: CSV (a header row) or JSONL, with `episode_id` or `task_id`,
    /// `scorer`, `verdict` (pass or fail), and optionally `suite`, `rater`, `explanation`.
    /// Default: the run's `labels.jsonl`, where `runner view` saves the labels set in the page.
    #[arg(long, value_name = "FILE")]
    pub labels: Option<PathBuf>,
    /// Exit 1 when a labelled scorer's Cohen's kappa with people is below X.
    #[arg(long, value_name = "X")]
    pub min_kappa: Option<f64>,
    /// Check the verdicts of this scoring (`initial`, or a regrade's id) instead of each
    /// episode's latest.
    #[arg(long, value_name = "ID")]
    pub scoring: Option<String>,
    /// Print the check as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ViewArgs {
    /// Run folders (or ids under results/), or folders of runs such as results/ (the
    /// default); runs started later in a folder of runs appear as they start.
    pub runs: Vec<PathBuf>,
    /// The address to serve on (a port of 0 takes a free one).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8765")]
    pub listen: std::net::SocketAddr,
    /// Open the viewer in the desktop's browser (xdg-open).
    #[arg(long)]
    pub open: bool,
}

#[derive(Args)]
pub struct PlanArgs {
    /// The run: its id (a folder in results/), its folder, or its events.jsonl.
    pub run: PathBuf,
    /// The difference to detect, in points of pass rate (5 is five points).
    #[arg(long, value_name = "POINTS")]
    pub mde: f64,
    /// The significance level of the comparison.
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
}

#[derive(Args)]
pub struct MergeArgs {
    /// The run folders of the shards.
    #[arg(required = true, num_args = 2..)]
    pub runs: Vec<PathBuf>,
    /// The folder the merged run is written under.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Name the merged run's folder instead of using a timestamp.
    #[arg(long, value_parser = batch::parse_run_id)]
    pub run_id: Option<String>,
    /// Merge even when a shard is missing or did not finish (the verdict is then partial).
    #[arg(long)]
    pub allow_partial: bool,
    #[command(flatten)]
    pub gates: GateArgs,
}

#[derive(Args)]
pub struct EvalArgs {
    /// Suite files, or folders of them.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// A model: `provider/model` (openai/gpt-4o-mini, anthropic/claude-…, ollama/qwen3,
    /// openai-compatible/NAME), `mock`, `echo`, or `replay:PATH`. Repeat to compare several.
    /// Needed unless `--agent oracle`, which calls no model, or the suites are promptfoo
    /// configs whose `providers:` name the models.
    #[arg(long = "model", short = 'm')]
    pub models: Vec<String>,
    /// The agent kind of every suite, over their `agent.kind`: `oracle` runs each task's
    /// reference solution and says which tasks do not pass with it.
    #[arg(long, value_name = "KIND", value_parser = crate::agent::kinds::find)]
    pub agent: Option<&'static dyn crate::agent::AgentKind>,
    /// Run only this variant of the suites that name `variants:` (repeat for several);
    /// suites without variants run as they are.
    #[arg(long = "variant", value_name = "NAME")]
    pub variants: Vec<String>,
    /// In a promptfoo config, leave out (and list) the keys, assertion types and providers
    /// runner does not support, instead of refusing the config.
    #[arg(long)]
    pub skip_unsupported: bool,
    /// In a promptfoo config, read `file://` references outside the config's folder too
    /// (they are read as the user running runner).
    #[arg(long)]
    pub allow_outside_files: bool,
    /// The providers and prices file (default: $RUNNER_CONFIG, else ./runner.yaml if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Append every model response to this cassette, for `--model replay:FILE`.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Serve repeated requests from a local response cache.
    #[arg(long)]
    pub cache: bool,
    /// The grader model for LLM-graded scorers, over the suites' and scorers' choice.
    #[arg(long)]
    pub grader: Option<String>,
    /// The model that plays every task's simulated user, over the suites' `user.simulated.model`
    /// (`mock` plays the tasks' `mock_user:` turns). Under `--model mock` the user is `mock` anyway.
    #[arg(long, value_name = "MODEL")]
    pub user_model: Option<String>,
    /// Every episode's time limit in seconds, over each suite's `limits.time_s`.
    #[arg(long, value_name = "S")]
    pub time_s: Option<f64>,
    /// Every episode's most turns, over each suite's `limits.max_steps`.
    #[arg(long, value_name = "N")]
    pub max_steps: Option<u32>,
    /// Every episode's most model tokens, over each suite's `limits.max_tokens`.
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u64>,
    /// The most the whole run may spend, in USD: no episode is started that could cross it
    /// (every model needs a price in runner.yaml).
    #[arg(long, value_name = "USD")]
    pub max_cost_usd: Option<f64>,
    /// The most model tokens (input and output) the whole run may use.
    #[arg(long, value_name = "N")]
    pub max_run_tokens: Option<u64>,
    /// The most model calls the whole run may make.
    #[arg(long, value_name = "N")]
    pub max_model_calls: Option<u64>,
    /// With a budget: reaching a cap also cancels the episodes in flight.
    #[arg(long)]
    pub budget_hard: bool,
    /// Multiplies every episode's time limit (the suite's `time_s`, or --time-s): `3` gives a
    /// slow local model three times as long.
    #[arg(long, value_name = "X")]
    pub time_factor: Option<f64>,
    /// How long cached responses stay fresh, in seconds.
    #[arg(long, default_value_t = 7 * 24 * 3600)]
    pub cache_ttl_s: u64,
    /// Where the cache lives (default: ~/.cache/runner/responses).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Run each task this many times (overrides the suites' `epochs`); `auto` adds epochs
    /// until the pass rate's interval is --ci-width wide, at most --max-epochs.
    #[arg(long, value_name = "N|auto", value_parser = parse_epochs)]
    pub epochs: Option<Epochs>,
    /// With `--epochs auto`: the widest the pass rate's interval may be (a fraction, 0.05
    /// is five points from its low end to its high end).
    #[arg(long, value_name = "W")]
    pub ci_width: Option<f64>,
    /// With `--epochs auto`: the most epochs of each task (default 10).
    #[arg(long, value_name = "N")]
    pub max_epochs: Option<u32>,
    /// How many episodes run at once.
    #[arg(long, short = 'j', default_value_t = 8)]
    pub jobs: usize,
    /// `off` runs every world's processes without the sandbox (files, network, limits):
    /// only for trusted commands, or where the kernel cannot enforce it.
    #[arg(long, value_enum, default_value_t = Switch::On, value_name = "on|off")]
    pub sandbox: Switch,
    /// Where an episode in an image lives: `rootfs`, runner's own root per episode, or
    /// `podman`, a podman container per episode (the image built or pulled by podman), to
    /// check that both give the same verdicts.
    #[arg(long, value_enum, default_value_t = ProviderFlag::Rootfs)]
    pub provider: ProviderFlag,
    /// Keep each episode's world instead of removing it, for debugging: a shell world's
    /// folder (in an image, its private writable layer) is moved to
    /// `$TMPDIR/runner-kept-RUN/EPISODE` when the episode ends, and the run says where.
    #[arg(long)]
    pub keep_worlds: bool,
    /// The folder runs are written under.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Name the run folder instead of using a timestamp.
    #[arg(long, conflicts_with = "resume", value_parser = batch::parse_run_id)]
    pub run_id: Option<String>,
    /// Continue an interrupted or partly failed run (its folder, or its id under --out):
    /// scored episodes are kept, unscored and missing ones run again.
    #[arg(long, value_name = "RUN")]
    pub resume: Option<PathBuf>,
    /// A new run that does only what changed since RUN (its folder, or its id under
    /// --out): each episode is reused (nothing changed), regraded (only its scorers or
    /// grader changed: scored again from its logged trajectory) or run again.
    #[arg(long, value_name = "RUN", conflicts_with = "resume")]
    pub since: Option<PathBuf>,
    /// With --since: print the plan (how many episodes are reused, regraded and run
    /// again, and why) and stop.
    #[arg(long, requires = "since")]
    pub dry_run: bool,
    #[command(flatten)]
    pub gates: GateArgs,
    /// `mock` only: each model call waits this many milliseconds (`20`, or `10-30` at
    /// random), to measure scheduling without a provider.
    #[arg(long, value_parser = crate::model::mock::parse_delay)]
    pub mock_delay_ms: Option<(u64, u64)>,
    /// Run only shard I of N (`--shard 2/4`): a stable hash of each episode's task and model
    /// picks it, so a task's epochs stay together.
    /// `auto/N` takes I from a Kubernetes Indexed Job or a Slurm job array.
    #[arg(long, value_parser = batch::parse_shard)]
    pub shard: Option<(u64, u64)>,
    /// Only the tasks whose `suite/task` id, task id or suite name matches this glob (`*`
    /// any text, `?` one character). Repeat for any of several.
    #[arg(long = "filter", value_name = "GLOB")]
    pub filters: Vec<String>,
    /// Only the tasks with this tag in their `tags:`. Repeat for any of several.
    #[arg(long = "tag", value_name = "TAG")]
    pub tags: Vec<String>,
    /// Only N of the tasks (after the other selections), drawn by a stable hash of their ids:
    /// the same N in every run, shard and resumption.
    #[arg(long, value_name = "N")]
    pub sample: Option<u64>,
    /// The seed of --sample's draw: another seed draws other tasks.
    #[arg(long, value_name = "S", default_value_t = 0, requires = "sample")]
    pub sample_seed: u64,
    /// Only the tasks that failed or were unscored in this run (its folder, or its id under
    /// --out; a merged run of shards too).
    #[arg(long, value_name = "RUN")]
    pub failing: Option<PathBuf>,
    /// Only the tasks at these positions of the run's task list (suite by suite, from 0):
    /// `A..B` (B left out), `A..`, `..B`.
    #[arg(long, value_name = "A..B", value_parser = crate::domain::selection::TaskRange::parse)]
    pub range: Option<crate::domain::selection::TaskRange>,
    /// No progress bar or per-episode lines; only the summary.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// `--epochs N`, or `--epochs auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epochs {
    Fixed(u32),
    Auto,
}

fn parse_epochs(text: &str) -> Result<Epochs, String> {
    if text == "auto" {
        return Ok(Epochs::Auto);
    }
    text.parse().map(Epochs::Fixed).map_err(|_| format!("`{text}` is neither a number of epochs nor `auto`"))
}

#[derive(Args)]
pub struct ImagesArgs {
    #[command(subcommand)]
    pub action: ImagesAction,
    /// The image store [default: $RUNNER_IMAGE_STORE, else $XDG_CACHE_HOME/runner/images,
    /// else ~/.cache/runner/images].
    #[arg(long, global = true)]
    pub store: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum ImagesAction {
    /// Pull an image into the store: `name:tag`, `name@sha256:…`, `host:port/name:tag`
    /// (`debian:bookworm` is `docker.io/library/debian:bookworm`).
    Pull {
        reference: String,
        /// When to ask the registry: `missing` uses the store's image when it has one.
        #[arg(long, value_enum, default_value_t = PullFlag::Missing)]
        pull: PullFlag,
        /// The runner.yaml with the `images:` settings (mirrors, insecure registries).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// List the images: reference, digest, size on disk and last use.
    Ls,
    /// Remove an image by reference or digest (12 or more hex digits), and the layers no
    /// other image needs.
    Rm { target: String },
    /// Remove the images not used for DAYS (none without --older-than), the layers no
    /// image needs and what interrupted pulls left behind.
    Prune {
        #[arg(long, value_name = "DAYS")]
        older_than: Option<f64>,
    },
}

/// Where an episode in an image lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderFlag {
    Rootfs,
    Podman,
}

/// When a pull asks the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PullFlag {
    Never,
    Missing,
    Always,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Suite files, or folders of them.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Where to listen: `HOST:PORT` (port 0 takes a free one, said on stdout) or `unix:PATH`.
    #[arg(long, default_value = "127.0.0.1:8100", value_name = "HOST:PORT|unix:PATH")]
    pub listen: String,
    /// A file holding the key every request must carry (`Authorization: Bearer KEY`);
    /// without it, anyone who reaches the address may run episodes.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// How many episodes and step sessions run at once; past it, requests get 429 with
    /// `Retry-After`.
    #[arg(long, short = 'j', default_value_t = 8)]
    pub jobs: usize,
    /// The providers and prices file (default: $RUNNER_CONFIG, else ./runner.yaml if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Append every model response (the callers' endpoints', and stepped callers' actions)
    /// to this cassette, for `runner eval --model replay:FILE`.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// The grader model for LLM-graded scorers, over the suites' and scorers' choice.
    #[arg(long)]
    pub grader: Option<String>,
    /// The folder the run is written under.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Name the run folder; a server started again with the same id goes on with its run
    /// and its queue (episodes a kill interrupted are reported `interrupted`).
    #[arg(long, value_parser = batch::parse_run_id)]
    pub run_id: Option<String>,
    /// `off` runs every world's processes without the sandbox.
    #[arg(long, value_enum, default_value_t = Switch::On, value_name = "on|off")]
    pub sandbox: Switch,
    /// How long a step session waits for the caller's next action before its episode is
    /// cancelled, in seconds.
    #[arg(long, default_value_t = 300.0, value_name = "S")]
    pub session_idle_s: f64,
    /// Retries of a call to a caller's endpoint (429, 5xx, broken connections) before the
    /// episode is unscored `provider_error`.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub endpoint_retries: u32,
    /// `mock` only: each model call waits this many milliseconds (`20`, or `10-30`).
    #[arg(long, value_parser = crate::model::mock::parse_delay)]
    pub mock_delay_ms: Option<(u64, u64)>,
}

/// A setting that is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
}
