//! Dockerfiles built without a daemon. A build reads the Dockerfile ([`parse`]), then runs
//! its instructions in order: each one that changes files (`RUN`, `COPY`, `ADD`,
//! `WORKDIR`) is a step with a cache key — the key of the image before it, the
//! instruction's text, the configuration and build arguments it sees, and for a copy the
//! digest of what it copies — and its layer is kept under that key by a [`Layers`] store;
//! the others change the image's configuration. A step whose key is kept is not run again.
//! `RUN` runs in a root of the layers so far (`crates/sandbox/src/root.rs`), and the root's
//! private upper folder is the step's layer.

mod context;
mod copy;
mod ignore;
mod layers;
mod parse;
mod run;
mod stages;
mod tree;
mod user;
mod words;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use layers::{CachedStep, DirLayers, Layers};
pub use parse::{Dockerfile, Instruction, ParseError, parse};

use super::ReadyImage;

/// How to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Values for the Dockerfile's `ARG`s (`--build-arg`), by name.
    pub build_args: BTreeMap<String, String>,
    /// The stage that is the result (`--target`); the last one when `None`.
    pub target: Option<String>,
    /// Host CA certificates (PEM files) the build's `RUN` steps trust: copied into
    /// `/usr/local/share/ca-certificates/` and appended to
    /// `/etc/ssl/certs/ca-certificates.crt` of each stage, as a step of its own right after
    /// its `FROM`; `RUN` steps then also get `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`,
    /// `PIP_CERT`, `CURL_CA_BUNDLE` and `NODE_EXTRA_CA_CERTS` naming that bundle.
    pub extra_ca_certificates: Vec<PathBuf>,
    /// The whole build's deadline: a step still running then is killed.
    pub build_timeout: Duration,
    /// Where every step's output is written, when set.
    pub log_file: Option<PathBuf>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            build_args: BTreeMap::new(),
            target: None,
            extra_ca_certificates: Vec::new(),
            build_timeout: Duration::from_secs(1800),
            log_file: None,
        }
    }
}

/// What a build reads: its context folder and its Dockerfile.
#[derive(Debug, Clone)]
pub struct BuildSource {
    pub context: PathBuf,
    pub dockerfile: PathBuf,
}

impl BuildSource {
    /// A folder with a `Dockerfile` in it, which is also the context.
    pub fn dir(dir: &Path) -> BuildSource {
        BuildSource { context: dir.to_path_buf(), dockerfile: dir.join("Dockerfile") }
    }
}

/// A build's failure: the Dockerfile's line and instruction (line 0 and no instruction
/// for what is no one step's), and what went wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}{failure}", where_(.dockerfile, *.line, .instruction))]
pub struct BuildError {
    pub dockerfile: PathBuf,
    pub line: usize,
    pub instruction: String,
    pub failure: BuildFailure,
}

fn where_(dockerfile: &Path, line: usize, instruction: &str) -> String {
    match line {
        0 => format!("{}: ", dockerfile.display()),
        _ => format!("{} line {line}: `{instruction}`: ", dockerfile.display()),
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BuildFailure {
    /// The Dockerfile (or an argument) is not what this builder takes.
    #[error("{0}")]
    Invalid(String),
    /// The step could not be done (a file unreadable, a root that would not start).
    #[error("{0}")]
    Failed(String),
    /// A `RUN` ended with a failure; the last lines of its output.
    #[error("the command failed with {status}; its last lines:\n{tail}")]
    Exited { status: String, tail: String },
    /// The build's deadline passed during the step.
    #[error("the build's time limit ({limit_s} s) ran out during this step; its last lines:\n{tail}")]
    TimedOut { limit_s: u64, tail: String },
}

/// What a build says of each step as it goes.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildProgress {
    /// 1-based, of `steps`: every instruction is one.
    pub step: usize,
    pub steps: usize,
    pub instruction: String,
    pub state: StepState,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StepState {
    /// A step that changes files is starting.
    Running,
    /// Its layer was kept by an earlier build: not run.
    Cached,
    /// Done, in this long (a configuration change: at once).
    Done(Duration),
    /// Accepted and not acted on (`VOLUME`, `HEALTHCHECK`, ...): why.
    Note(String),
}

impl std::fmt::Display for BuildProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text: String = self.instruction.chars().take(60).collect();
        if text.len() < self.instruction.len() {
            text.push('…');
        }
        write!(f, "step {}/{} {text}: ", self.step, self.steps)?;
        match &self.state {
            StepState::Running => write!(f, "running"),
            StepState::Cached => write!(f, "cached"),
            StepState::Done(took) => write!(f, "done in {:.1} s", took.as_secs_f64()),
            StepState::Note(why) => write!(f, "{why}"),
        }
    }
}

/// Builds the Dockerfile of `source`, taking base images from and keeping layers in
/// `layers`, telling `progress` of each step. The image is the target stage's (or the
/// last stage's) layers, bottom first, and configuration.
pub async fn build(
    source: &BuildSource,
    options: &BuildOptions,
    layers: &impl Layers,
    progress: &mut (dyn FnMut(&BuildProgress) + Send),
) -> Result<ReadyImage, BuildError> {
    let whole = |failure: BuildFailure| BuildError {
        dockerfile: source.dockerfile.clone(),
        line: 0,
        instruction: String::new(),
        failure,
    };
    let text = std::fs::read_to_string(&source.dockerfile)
        .map_err(|e| whole(BuildFailure::Failed(format!("failed to read the Dockerfile: {e}"))))?;
    let dockerfile = parse(&text).map_err(|e| BuildError {
        dockerfile: source.dockerfile.clone(),
        line: e.line,
        instruction: text.lines().nth(e.line.saturating_sub(1)).unwrap_or_default().trim().to_owned(),
        failure: BuildFailure::Invalid(e.message),
    })?;
    stages::Build::new(source, options, layers, dockerfile, progress)
        .map_err(|e| whole(BuildFailure::Failed(e)))?
        .run()
        .await
}
