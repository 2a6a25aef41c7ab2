//! `runner view`.

use std::path::{Path, PathBuf};

use crate::batch;
use crate::cli::flags::ViewArgs;
use crate::cli::{CliError, Exit, outln, resolve};

/// `runner view`: serves the viewer until Ctrl-C or SIGTERM.
pub fn view(args: ViewArgs) -> Result<Exit, CliError> {
    let roots = roots(&args.runs)?;
    resolve::runtime()?.block_on(async {
        let bound = crate::view::bind(args.listen, roots).await.map_err(CliError::usage)?;
        let runs = bound.viewer.catalog.runs().len();
        outln!("viewer: {} ({runs} run(s); Ctrl-C to stop)", bound.url);
        if bound.viewer.hosts.is_none() {
            eprintln!(
                "warning: {} is reachable from other machines: whoever reaches it reads the runs and writes labels",
                args.listen
            );
        }
        if args.open {
            open_browser(&bound.url);
        }
        tokio::select! {
            () = crate::view::server::serve(bound.listener, bound.viewer) => {}
            () = stopped() => {}
        }
        Ok(Exit::Passed)
    })
}

/// The folders to show: each as given when it is a folder, else a run id under results/;
/// results/ when none is given.
fn roots(given: &[PathBuf]) -> Result<Vec<PathBuf>, CliError> {
    if given.is_empty() {
        let results = PathBuf::from("results");
        if !results.is_dir() {
            return Err(CliError::usage("no results/ folder here: name the run folders or folders of runs to view"));
        }
        return Ok(vec![results]);
    }
    given
        .iter()
        .map(|g| {
            if g.is_dir() {
                Ok(g.clone())
            } else {
                batch::resume::find_run(g, Path::new("results")).map_err(CliError::usage)
            }
        })
        .collect()
}

/// Resolves on the first Ctrl-C or SIGTERM.
async fn stopped() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(mut interrupt), Ok(mut terminate)) => {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

/// Asks the desktop to open `url`; says so when it cannot.
fn open_browser(url: &str) {
    let opened = std::process::Command::new("xdg-open")
        .arg(url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Err(e) = opened {
        eprintln!("warning: failed to open a browser (xdg-open: {e}); open {url} yourself");
    }
}
