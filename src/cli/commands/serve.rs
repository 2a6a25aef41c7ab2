//! `runner serve`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::batch::{self, Roster, RunOptions};
use crate::cli::flags::ServeArgs;
use crate::cli::{CliError, Exit, outln, resolve};
use crate::model::BackendOptions;
use crate::model::replay::CassetteWriter;
use crate::serve::{Listen, ServeOptions, Service};

/// `runner serve`: opens the run (or goes on with the one `--run-id` names), serves until
/// Ctrl-C or SIGTERM, then cancels what runs and closes the run.
pub fn serve(args: ServeArgs) -> Result<Exit, CliError> {
    let listen = Listen::parse(&args.listen).map_err(|e| CliError::usage(format!("--listen: {e}")))?;
    let key = match &args.key_file {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CliError::usage(format!("--key-file {}: {e}", path.display())))?;
            let key = text.trim().to_owned();
            if key.len() < 16 {
                return Err(CliError::usage(format!(
                    "--key-file {}: the key must be at least 16 characters (it has {})",
                    path.display(),
                    key.len()
                )));
            }
            crate::log::secrets::register(&key);
            Some(key)
        }
    };
    if !(args.session_idle_s.is_finite() && args.session_idle_s > 0.0) {
        return Err(CliError::usage("--session-idle-s must be a number of seconds above 0"));
    }
    let options = options(&args, listen, key)?;
    let runtime = resolve::runtime()?;
    let served = runtime.block_on(async move {
        let (service, listen, interrupted) = Service::open(options).map_err(CliError::usage)?;
        if interrupted > 0 {
            eprintln!(
                "{interrupted} episode(s) admitted before the server last ended never ended: reported as interrupted (POST /v1/episodes/ID/retry runs one again)"
            );
        }
        let stop = CancellationToken::new();
        tokio::spawn(stop_on_signal(stop.clone()));
        let dir = service.run_dir().display().to_string();
        let serving = crate::serve::serve(service.clone(), &listen, stop, |address| {
            outln!("listening on {address}");
            outln!("run: {dir}");
        })
        .await;
        let closed = service.close(Duration::from_secs(30)).await;
        serving.map_err(CliError::usage)?;
        closed.map_err(CliError::results)
    })?;
    served.run.syncing.wait().map_err(|e| CliError::results(format!("failed to write the event log: {e}")))?;
    eprintln!(
        "stopped: {} episode(s) in flight were cancelled; the run is {}",
        served.interrupted,
        served.run.dir.display()
    );
    Ok(Exit::Passed)
}

/// The suites, graders and run folder, resolved as `runner eval` resolves them.
fn options(args: &ServeArgs, listen: Listen, key: Option<String>) -> Result<ServeOptions, CliError> {
    let load = crate::suite::LoadOptions::default();
    let suites = resolve::suites_with(&args.paths, load)?;
    let suites = resolve::discover(suites, args.sandbox)?;
    let config = crate::model::config::ModelConfig::load(args.config.as_deref()).map_err(CliError::usage)?;
    let record = match &args.record {
        Some(path) => Some(Arc::new(
            CassetteWriter::create(path)
                .map_err(|e| CliError::usage(format!("failed to open the cassette {}: {e}", path.display())))?,
        )),
        None => None,
    };
    let backend_options = BackendOptions { record, cache: None, mock_delay_ms: args.mock_delay_ms };
    let graders = resolve::graders(&suites, args.grader.clone(), &config, backend_options.clone(), &[])?;
    let roster =
        Roster::open(graders, &suites, None, &config, backend_options.clone(), &[]).map_err(CliError::usage)?;
    // The clients hold their keys now; the commands the worlds run must not find them.
    crate::log::secrets::withdraw_from_environment(config.key_vars());
    let sandbox = resolve::sandbox_mode(args.sandbox);
    let resume = match &args.run_id {
        Some(id) if args.out.join(id).join("events.jsonl").is_file() => {
            let dir = args.out.join(id);
            let selection = crate::domain::selection::Selection::default();
            let given = batch::resume::Given {
                models: &[],
                epochs: None,
                shard: None,
                limits: Default::default(),
                selection: &selection,
            };
            Some(batch::resume::plan(&dir, &suites, &given).map_err(CliError::usage)?)
        }
        _ => None,
    };
    let run = RunOptions {
        models: Vec::new(),
        epochs: None,
        jobs: args.jobs.max(1),
        out_dir: args.out.clone(),
        run_id: if resume.is_some() { None } else { args.run_id.clone() },
        command_line: std::env::args().collect(),
        roster: Arc::new(roster),
        shard: None,
        resume,
        keep_worlds: false,
        sandbox,
        limits: Default::default(),
        warnings: Vec::new(),
        selection: Default::default(),
        chosen: None,
        caps: Default::default(),
        auto_epochs: None,
        since: None,
    };
    Ok(ServeOptions {
        suites,
        run,
        listen,
        key,
        jobs: args.jobs.max(1),
        config,
        backend_options,
        session_idle: Duration::from_secs_f64(args.session_idle_s),
        endpoint_retries: args.endpoint_retries,
    })
}

/// The first Ctrl-C or SIGTERM stops the server: episodes in flight are cancelled and
/// logged, the run closed. A second one exits at once.
async fn stop_on_signal(stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        eprintln!("warning: failed to install the signal handlers; Ctrl-C ends the server at once");
        return;
    };
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("stopping: cancelling the episodes in flight (again to quit now)");
    stop.cancel();
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    std::process::exit(Exit::Interrupted as i32);
}
