//! What the flags name, opened and checked once before anything runs: suite files, models,
//! graders, the gates and their baseline run, the async runtime.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::flags::{EvalArgs, GateArgs, Switch};
use super::{CliError, Exit};
use crate::agent::AgentKind;
use crate::batch::select::Chosen;
use crate::batch::{self, Roster, RunOptions};
use crate::budget::RunCaps;
use crate::domain::MAX_EPISODE_S;
use crate::domain::selection::Selection;
use crate::log::event::LimitOverrides;
use crate::log::projection::Projection;
use crate::model::cache::CacheOptions;
use crate::model::config::ModelConfig;
use crate::model::replay::CassetteWriter;
use crate::model::{Backend, BackendOptions};
use crate::sandbox::SandboxMode;
use crate::scoring::{Check, Graders, grader_model};
use crate::suite::{self, Suite};

/// What `runner eval` runs, resolved from its flags.
pub struct Eval {
    pub suites: Vec<Arc<Suite>>,
    pub options: RunOptions,
    pub baseline: Option<Projection>,
}

/// Opens the models, checks the gates, loads the suites, opens the graders and plans a
/// resumption, in that order (a mistake in a flag is found before the suites are read):
/// each step below resolves one part.
pub fn eval(args: &EvalArgs) -> Result<Eval, CliError> {
    let limits = limit_overrides(args)?;
    let load = suite::LoadOptions {
        skip_unsupported: args.skip_unsupported,
        allow_outside_files: args.allow_outside_files,
        limits,
        check_only: false,
    };
    // Without --model, the models are what promptfoo configs' `providers:` name: read first.
    let early = match (args.models.is_empty(), args.agent) {
        (true, None) => Some(suites_with(&args.paths, load)?),
        _ => None,
    };
    let (models, config, options) = models(args, providers(early.as_deref())?.as_deref(), endpoints(early.as_deref()))?;
    let caps = run_caps(args, &config, &models)?;
    let baseline = baseline(&args.gates, &args.out)?;
    let (epochs, auto_epochs) = epochs(args)?;
    let suites = run_suites(args, early, load, &config.images)?;
    check_epochs_and_limits(&suites, epochs, &limits)?;
    // The graders are recorded and cached like the models under test, and replayed with them;
    // the models that play simulated users are opened beside them, the same way.
    let warnings = mock_graded(&suites, args.grader.as_deref(), &models).into_iter().collect();
    let graders = graders(&suites, args.grader.clone(), &config, options.clone(), &models)?;
    let roster =
        Roster::open(graders, &suites, args.user_model.clone(), &config, options, &models).map_err(CliError::usage)?;
    // The clients hold their keys now; the commands the worlds run must not find them.
    crate::log::secrets::withdraw_from_environment(config.key_vars());
    let (selection, chosen) = selection(args, &suites)?;
    let resume = resume(
        args,
        &suites,
        batch::resume::Given { models: &models, epochs, shard: args.shard, limits, selection: &selection },
    )?;
    let jobs = crate::sandbox::resources::fit_jobs(
        args.jobs.max(1),
        suites.iter().map(|s| s.environment.open_files_per_episode()),
    );
    let mut options = RunOptions {
        models,
        epochs,
        jobs,
        out_dir: args.out.clone(),
        run_id: args.run_id.clone(),
        command_line: std::env::args().collect(),
        roster: Arc::new(roster),
        shard: args.shard,
        resume,
        keep_worlds: args.keep_worlds,
        sandbox: match args.sandbox {
            Switch::Off => SandboxMode::Off("the command line"),
            Switch::On => SandboxMode::On,
        },
        limits,
        warnings,
        selection,
        chosen,
        caps,
        auto_epochs,
        since: None,
    };
    options.since = since(args, &suites, &options)?;
    refuse_sandboxes_not_enforced(&suites, options.sandbox)?;
    Ok(Eval { suites, options, baseline })
}

/// The models promptfoo configs' `providers:` name, each once, when the suites were read
/// first for them (no `--model`); none named is a mistake.
fn providers(early: Option<&[Arc<Suite>]>) -> Result<Option<Vec<String>>, CliError> {
    let Some(suites) = early else { return Ok(None) };
    let mut named: Vec<String> = Vec::new();
    for model in suites.iter().flat_map(|s| s.providers.iter()) {
        if !named.contains(model) {
            named.push(model.clone());
        }
    }
    if named.is_empty() {
        return Err(CliError::usage(
            "--model is needed (or --agent, or a promptfoo config whose `providers:` name models)",
        ));
    }
    Ok(Some(named))
}

/// The `http` providers' endpoints of the suites read first, which open as models like the
/// others.
fn endpoints(
    early: Option<&[Arc<Suite>]>,
) -> std::collections::BTreeMap<String, Arc<crate::model::endpoint::Endpoint>> {
    early.into_iter().flatten().flat_map(|s| s.endpoints.iter()).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The suites the run runs: read (unless they were, for their providers), what was left
/// out of them noted, `--agent`'s kind and `--variant`'s variants applied, and the tools
/// of those that discover theirs discovered.
fn run_suites(
    args: &EvalArgs,
    early: Option<Vec<Arc<Suite>>>,
    load: suite::LoadOptions,
    registries: &crate::config::images::RegistrySettings,
) -> Result<Vec<Arc<Suite>>, CliError> {
    let loaded = match early {
        Some(suites) => suites,
        None => suites_with(&args.paths, load)?,
    };
    for skipped in loaded.iter().flat_map(|s| s.skipped.iter()) {
        eprintln!("note: {skipped}");
    }
    let suites = with_variants(with_agent(loaded, args.agent)?, &args.variants)?;
    let suites = discover(suites, args.sandbox)?;
    let provider = match args.provider {
        crate::cli::flags::ProviderFlag::Rootfs => crate::image::ProviderName::Rootfs,
        crate::cli::flags::ProviderFlag::Podman => crate::image::ProviderName::Podman,
    };
    prepare_images(&suites, registries, provider)?;
    Ok(suites)
}

/// Refuses an episode's time past what an episode may last, and a gate (a suite's `k_of_n`,
/// a task's `pass_k`) more than the run's epochs can meet.
fn check_epochs_and_limits(
    suites: &[Arc<Suite>],
    epochs: Option<u32>,
    limits: &LimitOverrides,
) -> Result<(), CliError> {
    for suite in suites {
        let time_s = suite.limits.time_s();
        if time_s > MAX_EPISODE_S {
            let message = format!(
                "{}: {} gives its episodes {time_s}s, more than the {MAX_EPISODE_S}s an episode may last",
                suite.path.display(),
                limits.as_flags()
            );
            return Err(CliError::usage(message));
        }
    }
    let fixed_epochs = epochs;
    for suite in suites {
        let epochs = epochs.unwrap_or(suite.epochs);
        if let Some(k) = suite.k_of_n.filter(|k| *k > epochs) {
            let message =
                format!("{}: k_of_n {k} is more than the {epochs} epoch(s) this run makes", suite.path.display());
            return Err(CliError::usage(message));
        }
        if let Some(task) = suite.tasks.iter().find(|t| t.pass_k.is_some_and(|p| fixed_epochs.is_some_and(|e| p.k > e)))
        {
            let k = task.pass_k.map_or(0, |p| p.k);
            let message = format!(
                "{}: task `{}` has pass_k k {k}, more than the {epochs} epoch(s) --epochs makes",
                suite.path.display(),
                task.id
            );
            return Err(CliError::usage(message));
        }
    }
    Ok(())
}

/// `--resume RUN`: the run's folder found and its log read for what it keeps, checked
/// against what this run asks.
fn resume(
    args: &EvalArgs,
    suites: &[Arc<Suite>],
    asked: batch::resume::Given<'_>,
) -> Result<Option<batch::Resume>, CliError> {
    let Some(run) = &args.resume else { return Ok(None) };
    let dir = batch::resume::find_run(run, &args.out).map_err(CliError::usage)?;
    batch::resume::plan(&dir, suites, &asked).map(Some).map_err(CliError::usage)
}

/// `--since RUN`: the run found and each episode of this one planned against it.
fn since(
    args: &EvalArgs,
    suites: &[Arc<Suite>],
    options: &RunOptions,
) -> Result<Option<Arc<batch::since::Since>>, CliError> {
    let Some(run) = &args.since else { return Ok(None) };
    if options.auto_epochs.is_some() {
        return Err(CliError::usage("--since plans a fixed set of episodes: give --epochs a number, not `auto`"));
    }
    let dir = batch::resume::find_run(run, &args.out).map_err(CliError::usage)?;
    let started = std::time::Instant::now();
    let mut since = batch::since::plan(&dir, suites, options).map_err(CliError::usage)?;
    since.planned_s = started.elapsed().as_secs_f64();
    Ok(Some(Arc::new(since)))
}

/// A sandbox this machine cannot enforce is refused before any episode starts, every
/// suite's named.
fn refuse_sandboxes_not_enforced(suites: &[Arc<Suite>], sandbox: SandboxMode) -> Result<(), CliError> {
    let mut refused = Vec::new();
    for suite in suites {
        let mode = batch::sandbox_mode(suite, sandbox);
        if let Err(e) = suite.environment.sandbox_check(mode) {
            refused.push(format!("{}: environment `{}`: {e}", suite.path.display(), suite.environment.name));
        }
    }
    if refused.is_empty() { Ok(()) } else { Err(CliError::usage(refused.join("\n"))) }
}

/// The tasks `--filter`, `--tag`, `--sample`, `--failing` and `--range` choose (the run
/// `--failing` names is read now); a choice that leaves no task is refused.
fn selection(args: &EvalArgs, suites: &[Arc<Suite>]) -> Result<(Selection, Option<Arc<Chosen>>), CliError> {
    let selection = Selection {
        filter: args.filters.clone(),
        tags: args.tags.clone(),
        sample: args.sample,
        sample_seed: args.sample_seed,
        failing: args.failing.as_ref().map(|run| run.display().to_string()),
        range: args.range,
    };
    if args.sample == Some(0) {
        return Err(CliError::usage("--sample must be at least 1"));
    }
    let failing = match &args.failing {
        Some(run) => {
            let dir = batch::resume::find_logged_run(run, &args.out).map_err(CliError::usage)?;
            Some(batch::select::failing_in(&dir.join("events.jsonl")).map_err(CliError::usage)?)
        }
        None => None,
    };
    let chosen = batch::select::choose(suites, &selection, failing.as_ref());
    if chosen.as_ref().is_some_and(|c| c.is_empty()) {
        let why = match &failing {
            Some(failed) if failed.is_empty() => "the run --failing names has no failed or unscored episode".to_owned(),
            _ => format!("{} leaves no task of the suites to run", selection.as_flags()),
        };
        return Err(CliError::usage(why));
    }
    Ok((selection, chosen.map(Arc::new)))
}

/// `--epochs N`, or `--epochs auto` with its stopping rule (see `report::power::StoppingRule`):
/// the epochs the plan holds (at most), and the rule.
fn epochs(args: &EvalArgs) -> Result<(Option<u32>, Option<batch::AutoEpochs>), CliError> {
    use super::flags::Epochs;
    let auto_only = |flag: &str| CliError::usage(format!("{flag} goes with --epochs auto"));
    match args.epochs {
        Some(Epochs::Auto) => {}
        Some(Epochs::Fixed(0)) => return Err(CliError::usage("--epochs must be at least 1")),
        epochs => {
            if args.ci_width.is_some() {
                return Err(auto_only("--ci-width"));
            }
            if args.max_epochs.is_some() {
                return Err(auto_only("--max-epochs"));
            }
            return Ok((epochs.map(|e| if let Epochs::Fixed(n) = e { n } else { 1 }), None));
        }
    }
    let Some(ci_width) = args.ci_width else {
        return Err(CliError::usage("--epochs auto needs --ci-width W: the widest the pass rate's interval may be"));
    };
    if !(ci_width > 0.0 && ci_width < 1.0) {
        return Err(CliError::usage("--ci-width is a fraction of pass rate, more than 0 and less than 1"));
    }
    let max_epochs = args.max_epochs.unwrap_or(10);
    if max_epochs == 0 {
        return Err(CliError::usage("--max-epochs must be at least 1"));
    }
    if args.resume.is_some() || args.shard.is_some() {
        return Err(CliError::usage(
            "--epochs auto decides from every episode of a suite and model, so it runs whole: not with --resume or --shard",
        ));
    }
    let rule = crate::report::power::StoppingRule { ci_width, max_epochs, alpha: args.gates.alpha };
    let decide = move |epoch: u32, passed: u64, scored: u64| {
        let look = rule.look(epoch, passed, scored);
        batch::EpochLook {
            low: look.low,
            high: look.high,
            level: look.level,
            decision: look.decision.as_str(),
            stop: look.decision != crate::report::power::Decision::Continue,
        }
    };
    Ok((Some(max_epochs), Some(batch::AutoEpochs { max_epochs, ci_width, decide: Arc::new(decide) })))
}

/// The run's caps: the command line's and each provider's in runner.yaml. A cost cap
/// needs a price for every model it counts: one without is refused, named, with how to
/// give it one.
fn run_caps(args: &EvalArgs, config: &ModelConfig, models: &[Arc<Backend>]) -> Result<RunCaps, CliError> {
    use crate::model::config::Caps;
    if args.max_cost_usd.is_some_and(|c| !c.is_finite() || c < 0.0) {
        return Err(CliError::usage("--max-cost-usd must be a number of dollars, 0 or more"));
    }
    let capped = args.max_cost_usd.is_some() || args.max_run_tokens.is_some() || args.max_model_calls.is_some();
    if capped && args.shard.is_some() {
        return Err(CliError::usage(
            "--max-cost-usd, --max-run-tokens and --max-model-calls cap one process: with --shard each shard would spend up to the cap; run the shards without them, or give each shard's runner.yaml a provider `budget:` of its share",
        ));
    }
    let caps = RunCaps {
        run: Caps {
            max_cost_usd: args.max_cost_usd,
            max_tokens: args.max_run_tokens,
            max_model_calls: args.max_model_calls,
        },
        providers: config
            .providers
            .iter()
            .filter(|(_, p)| !p.budget.is_none())
            .map(|(name, p)| (name.clone(), p.budget))
            .collect(),
        hard: args.budget_hard,
    };
    if args.budget_hard && caps.is_none() {
        return Err(CliError::usage(
            "--budget-hard needs a budget: --max-cost-usd, --max-run-tokens, --max-model-calls or a provider's `budget:` in runner.yaml",
        ));
    }
    for model in models {
        let provider = crate::budget::provider_of(model.name());
        let capped_by = match (args.max_cost_usd, caps.providers.get(provider).and_then(|b| b.max_cost_usd)) {
            (Some(_), _) => "--max-cost-usd".to_owned(),
            (None, Some(_)) => format!("providers.{provider}.budget.max_cost_usd"),
            (None, None) => continue,
        };
        if !model.priced() {
            let name = model.name();
            let how = if name.contains('/') {
                format!(
                    "give it one in runner.yaml (or the --config file): `prices: {{\"{name}\": {{input: 0.15, output: 0.6}}}}`, in USD per million tokens"
                )
            } else {
                "`mock` and replays have no price: cap them with --max-run-tokens or --max-model-calls".to_owned()
            };
            return Err(CliError::usage(format!(
                "{capped_by} needs a price for every model, and `{name}` has none: {how}"
            )));
        }
    }
    Ok(caps)
}

/// The sandbox `--sandbox` asks for.
pub fn sandbox_mode(switch: Switch) -> SandboxMode {
    match switch {
        Switch::Off => SandboxMode::Off("the command line"),
        Switch::On => SandboxMode::On,
    }
}

/// The suites with their environments' tools discovered: MCP servers are started once
/// (and stopped) to list their tools. Suites whose optional environment is not installed
/// are left out, each with a `note:` line.
pub fn discover(suites: Vec<Arc<Suite>>, sandbox: Switch) -> Result<Vec<Arc<Suite>>, CliError> {
    if suites.iter().all(|s| !s.environment.undiscovered) {
        return Ok(suites);
    }
    let command_line = sandbox_mode(sandbox);
    let found = runtime()?.block_on(suite::discover_tools(suites, |s| batch::sandbox_mode(s, command_line)));
    let (kept, notes) = found.map_err(|errors| CliError::each(Exit::Usage, errors))?;
    for note in notes {
        eprintln!("note: {note}");
    }
    Ok(kept)
}

/// Pulls or builds, once, the image of each suite that runs in one (the episodes then start
/// from it at once), saying what it does on stderr. A failure is said as a note and kept:
/// that suite's episodes will be unscored (`environment_error`) with it. The failures.
pub fn prepare_images(
    suites: &[Arc<Suite>],
    registries: &crate::config::images::RegistrySettings,
    provider: crate::image::ProviderName,
) -> Result<Vec<String>, CliError> {
    use crate::environment::kinds::KindSettings;
    let images: Vec<(&Suite, &crate::environment::kinds::shell::image::ShellImage)> = suites
        .iter()
        .filter_map(|s| match &s.environment.settings {
            KindSettings::Image(image) => Some((s.as_ref(), image.as_ref())),
            _ => None,
        })
        .collect();
    if images.is_empty() {
        return Ok(Vec::new());
    }
    let context = crate::image::Images { registries: registries.clone(), provider, ..crate::image::Images::default() };
    // Several threads: a build waits for its base image's pull on one.
    let runtime = runtime()?;
    let mut failures = Vec::new();
    for (suite, image) in images {
        let started = std::time::Instant::now();
        eprintln!("image: {} for suite `{}`…", image.source.name(), suite.name);
        match runtime.block_on(image.ready(&context)) {
            Ok(_) => eprintln!("image: ready in {:.1} s", started.elapsed().as_secs_f64()),
            Err(e) => {
                let note = format!("{}: its episodes will be unscored: {e}", suite.path.display());
                eprintln!("note: {note}");
                failures.push(note);
            }
        }
    }
    Ok(failures)
}

/// Expands folders into what they hold, in name order: a Harbor task directory is itself;
/// another folder gives its suite files and the task directories inside it.
pub fn suite_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CliError> {
    let mut files = Vec::new();
    for path in paths {
        if suite::harbor::is_task_dir(path) {
            files.push(path.clone());
        } else if path.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| CliError::usage(format!("{}: failed to read folder: {e}", path.display())))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml") || suite::harbor::is_task_dir(p))
                .collect();
            if inside.is_empty() {
                return Err(CliError::usage(format!(
                    "{}: holds no suite file (*.yaml) and no task directory (a folder with {})",
                    path.display(),
                    suite::harbor::TASK_FILE
                )));
            }
            inside.sort();
            files.extend(inside);
        } else if path.exists() {
            files.push(path.clone());
        } else {
            return Err(CliError::usage(format!("{}: no such file", path.display())));
        }
    }
    if files.is_empty() {
        return Err(CliError::usage("no suite files found"));
    }
    Ok(files)
}

/// The suites with `--agent`'s kind over their own, when it is given: a suite of that kind
/// keeps its settings; one of another takes the kind's with none of its keys given, or
/// is refused with why the kind needs them.
fn with_agent(suites: Vec<Arc<Suite>>, kind: Option<&'static dyn AgentKind>) -> Result<Vec<Arc<Suite>>, CliError> {
    let Some(kind) = kind else {
        return Ok(suites);
    };
    let refused =
        |path: &Path, why: String| CliError::usage(format!("--agent {}: {}: {why}", kind.name(), path.display()));
    suites
        .into_iter()
        .map(|mut suite| {
            let path = suite.path.clone();
            let Some(owned) = Arc::get_mut(&mut suite) else {
                return Err(CliError::usage(format!(
                    "{}: the suite is in use and cannot take --agent",
                    path.display()
                )));
            };
            owned.agent = owned.agent.as_kind(kind, &path).map_err(|why| refused(&path, why))?;
            for variant in &mut owned.variants {
                variant.agent = variant.agent.as_kind(kind, &path).map_err(|why| refused(&path, why))?;
            }
            Ok(suite)
        })
        .collect()
}

/// The suites with only the variants `--variant` picks, when it is given: a suite with
/// variants of which none is picked is left out; one without variants runs as it is. A
/// name that no suite has is a mistake.
fn with_variants(suites: Vec<Arc<Suite>>, picked: &[String]) -> Result<Vec<Arc<Suite>>, CliError> {
    if picked.is_empty() {
        return Ok(suites);
    }
    let unknown: Vec<&str> = picked
        .iter()
        .filter(|name| !suites.iter().any(|s| s.variants.iter().any(|v| &v.name == *name)))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        let mut known: Vec<&str> = suites.iter().flat_map(|s| s.variants.iter().map(|v| v.name.as_str())).collect();
        known.sort_unstable();
        known.dedup();
        let known = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
        return Err(CliError::usage(format!(
            "--variant {}: no suite has such a variant (the suites' variants: {known})",
            unknown.join(", ")
        )));
    }
    let mut kept = Vec::new();
    for mut suite in suites {
        if suite.variants.is_empty() {
            kept.push(suite);
            continue;
        }
        let Some(owned) = Arc::get_mut(&mut suite) else {
            let message = format!("{}: the suite is in use and cannot take --variant", suite.path.display());
            return Err(CliError::usage(message));
        };
        owned.variants.retain(|v| picked.contains(&v.name));
        if !owned.variants.is_empty() {
            kept.push(suite);
        }
    }
    Ok(kept)
}

/// Loads every suite the paths name as `options` say; every error of every file is reported.
pub fn suites_with(paths: &[PathBuf], options: suite::LoadOptions) -> Result<Vec<Arc<Suite>>, CliError> {
    suite::load_all_with(&suite_files(paths)?, options).map_err(|errors| CliError::each(Exit::Usage, errors))
}

/// Every `--model`, opened with recording and caching as asked; the config and the options
/// too, for the graders.
/// `providers` stands for `--model` when it was not given (a promptfoo config's).
pub fn models(
    args: &EvalArgs,
    providers: Option<&[String]>,
    endpoints: std::collections::BTreeMap<String, Arc<crate::model::endpoint::Endpoint>>,
) -> Result<(Vec<Arc<Backend>>, ModelConfig, BackendOptions), CliError> {
    let mut config = ModelConfig::load(args.config.as_deref()).map_err(CliError::usage)?;
    config.endpoints.extend(endpoints);
    let record = match &args.record {
        Some(path) => Some(Arc::new(
            CassetteWriter::create(path)
                .map_err(|e| CliError::usage(format!("failed to open the cassette {}: {e}", path.display())))?,
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
    // The oracle calls no model; its episodes are named after `mock`, which it never asks.
    let mock = [String::from("mock")];
    let specs = match providers {
        Some(named) => named,
        None if args.models.is_empty() && args.agent.is_some() => &mock[..],
        None => &args.models[..],
    };
    for spec in specs {
        let backend = Backend::open(spec, &config, options.clone()).map_err(CliError::usage)?;
        if models.iter().any(|m| m.name() == backend.name()) {
            return Err(CliError::usage(format!("--model {} is given more than once (as `{spec}`)", backend.name())));
        }
        models.push(Arc::new(backend));
    }
    Ok((models, config, options))
}

/// Opens the grader models the suites need, each chosen by [`grader_model`] (the rule the
/// scorers follow); a grader scorer without one is an error now, not a silent fallback to
/// the model under test.
pub fn graders(
    suites: &[Arc<Suite>],
    forced: Option<String>,
    config: &ModelConfig,
    options: BackendOptions,
    under_test: &[Arc<Backend>],
) -> Result<Graders, CliError> {
    let mut names = Vec::new();
    for suite in suites {
        let suite_grader = suite.grader.as_ref().map(|g| g.model.as_str());
        for spec in suite.scorers.iter().chain(suite.tasks.iter().flat_map(|t| &t.scorers)) {
            let Check::Grader { model, .. } = &spec.check else { continue };
            let Some(name) = grader_model(forced.as_deref(), model.as_deref(), suite_grader) else {
                return Err(CliError::usage(suite.ungraded.first().map(|e| e.to_string()).unwrap_or_else(|| {
                    format!(
                        "{}: `{}` needs a grader model: set `grader: {{model: …}}` in the suite, `model:` on the scorer, or pass --grader",
                        suite.path.display(),
                        spec.name
                    )
                })));
            };
            names.push(name);
        }
    }
    Graders::open(names, forced, config, options, under_test).map_err(CliError::usage)
}

/// The limit flags, checked: they override every suite's `limits:`.
pub fn limit_overrides(args: &EvalArgs) -> Result<LimitOverrides, CliError> {
    if let Some(s) = args.time_s
        && !(s.is_finite() && s > 0.0 && s <= MAX_EPISODE_S)
    {
        return Err(CliError::usage(format!(
            "--time-s must be a number of seconds above 0, up to {MAX_EPISODE_S}; got {s}"
        )));
    }
    if let Some(x) = args.time_factor
        && !(x.is_finite() && x > 0.0)
    {
        return Err(CliError::usage(format!(
            "--time-factor must be a number above 0 (3 gives three times as long); got {x}"
        )));
    }
    if args.max_steps == Some(0) {
        return Err(CliError::usage("--max-steps must be at least 1"));
    }
    if args.max_tokens == Some(0) {
        return Err(CliError::usage("--max-tokens must be at least 1"));
    }
    Ok(LimitOverrides {
        time_s: args.time_s,
        max_steps: args.max_steps,
        max_tokens: args.max_tokens,
        time_factor: args.time_factor,
    })
}

/// A warning when a `mock` grader would judge a real model's answers: its verdicts are the
/// suite's scripted ones whatever the model answered, so the episodes are unscored unless
/// `--grader mock` asks for them. A replay of a `mock` run is `mock`.
pub fn mock_graded(suites: &[Arc<Suite>], forced: Option<&str>, under_test: &[Arc<Backend>]) -> Option<String> {
    let real: Vec<&str> = under_test.iter().map(|m| m.name()).filter(|name| *name != "mock").collect();
    if real.is_empty() {
        return None;
    }
    let mut graded: Vec<String> = Vec::new();
    for suite in suites {
        let suite_grader = suite.grader.as_ref().map(|g| g.model.as_str());
        let mut scorers: Vec<&str> = Vec::new();
        for spec in suite.scorers.iter().chain(suite.tasks.iter().flat_map(|t| &t.scorers)) {
            let Check::Grader { model, .. } = &spec.check else { continue };
            if grader_model(forced, model.as_deref(), suite_grader).as_deref() == Some("mock")
                && !scorers.contains(&spec.name.as_str())
            {
                scorers.push(&spec.name);
            }
        }
        if !scorers.is_empty() {
            graded.push(format!("{} ({})", suite.path.display(), scorers.join(", ")));
        }
    }
    if graded.is_empty() {
        return None;
    }
    let consequence = if forced == Some("mock") {
        "--grader mock takes them as they are"
    } else {
        "those episodes are unscored (grader_error); pass --grader MODEL to have them judged"
    };
    Some(format!(
        "the answers of {} are judged by the `mock` grader in {}: its verdicts are the scorers' scripted `mock:` ones, whatever the model answers; {consequence}",
        real.join(", "),
        graded.join("; ")
    ))
}

/// Checks the gate flags before anything runs, and reads the baseline run (a bad baseline
/// is found now, not after an hour of episodes).
pub fn baseline(gates: &GateArgs, out_dir: &Path) -> Result<Option<Projection>, CliError> {
    let fractions = [
        ("--fail-under", gates.fail_under),
        ("--max-unscored", Some(gates.max_unscored)),
        ("--tolerance", Some(gates.tolerance)),
        ("--alpha", Some(gates.alpha)),
    ];
    for (flag, value) in fractions {
        fraction(flag, value)?;
    }
    let Some(run) = &gates.baseline else { return Ok(None) };
    let dir = batch::resume::find_logged_run(run, out_dir).map_err(CliError::usage)?;
    let baseline = Projection::from_log(&dir.join("events.jsonl")).map_err(CliError::usage)?;
    if baseline.header.suites.is_empty() || baseline.episodes.is_empty() {
        return Err(CliError::usage(format!("--baseline {}: the run has no episodes", dir.display())));
    }
    Ok(Some(baseline))
}

/// A flag that must be a fraction, when given.
pub fn fraction(flag: &str, value: Option<f64>) -> Result<(), CliError> {
    match value {
        Some(v) if !(0.0..=1.0).contains(&v) => {
            Err(CliError::usage(format!("{flag} must be a fraction between 0 and 1, got {v}")))
        }
        _ => Ok(()),
    }
}

/// A runtime of several threads, for what a command does before (or instead of) a run.
/// A worker about to park wakes the log's writer for what it emitted (see
/// [`crate::log::on_worker_park`]).
pub fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(crate::log::on_worker_park)
        .build()
        .map_err(|e| CliError::usage(format!("failed to start the async runtime: {e}")))
}
