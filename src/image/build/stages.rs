//! The build itself: the Dockerfile's stages, one instruction at a time. Instructions that
//! change the configuration change it at once; those that change files are steps, each
//! found in the cache by its key or run in a root of the layers so far.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::context::Context;
use super::copy::{self, Copy, CopySource};
use super::parse::{Dockerfile, Instruction, exec_form};
use super::tree::{ImageTree, Meta};
use super::words::{self, Vars};
use super::{BuildError, BuildFailure, BuildOptions, BuildProgress, BuildSource, Layers, StepState, run, user};
use crate::image::{ImageConfig, ReadyImage};
use crate::sandbox::root::{Bind, Root, RootSpec};

/// Docker's `PATH` for an image that sets none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where the extra CA certificates go in the image, and the bundle they join.
const CA_FOLDER: &str = "/usr/local/share/ca-certificates";
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// A stage under way or done: its name, layers, configuration, the key of its image so far
/// and its build arguments.
#[derive(Debug, Clone)]
struct Stage {
    name: Option<String>,
    layers: Vec<PathBuf>,
    config: ImageConfig,
    key: String,
    args: Vars,
}

/// What a step that changes files does.
enum Work {
    Run(Vec<String>),
    Copy(Copy),
    Workdir,
    Certificates,
}

pub struct Build<'a, L: Layers> {
    source: &'a BuildSource,
    options: &'a BuildOptions,
    layers: &'a L,
    file: Dockerfile,
    progress: &'a mut (dyn FnMut(&BuildProgress) + Send),
    deadline: Instant,
    context: Option<Context>,
    log: Box<dyn Write + Send>,
    /// `ARG`s before the first `FROM`.
    global: Vars,
    done: Vec<Stage>,
    step: usize,
}

fn sha256(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

impl<'a, L: Layers> Build<'a, L> {
    pub fn new(
        source: &'a BuildSource,
        options: &'a BuildOptions,
        layers: &'a L,
        file: Dockerfile,
        progress: &'a mut (dyn FnMut(&BuildProgress) + Send),
    ) -> Result<Self, String> {
        let log: Box<dyn Write + Send> = match &options.log_file {
            Some(path) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| format!("failed to open the build log {}: {e}", path.display()))?,
            ),
            None => Box::new(std::io::sink()),
        };
        let deadline = Instant::now() + options.build_timeout;
        let (context, global, done) = (None, Vars::new(), Vec::new());
        Ok(Build { source, options, layers, file, progress, deadline, context, log, global, done, step: 0 })
    }

    /// Runs every instruction up to the end of the target stage; the target's image.
    pub async fn run(mut self) -> Result<ReadyImage, BuildError> {
        let instructions = std::mem::take(&mut self.file.instructions);
        let steps = instructions.len();
        let mut current: Option<Stage> = None;
        let dockerfile = self.source.dockerfile.clone();
        for instruction in &instructions {
            self.step += 1;
            let fail = |failure: BuildFailure| BuildError {
                dockerfile: dockerfile.clone(),
                line: instruction.line,
                instruction: instruction.text(),
                failure,
            };
            let started = Instant::now();
            let state = if instruction.keyword == "FROM" {
                if let Some(stage) = current.take() {
                    if self.is_target(&stage) {
                        current = Some(stage);
                        break;
                    }
                    self.done.push(stage);
                }
                current = Some(self.from(instruction, steps).await.map_err(fail)?);
                None
            } else if let Some(stage) = current.as_mut() {
                self.instruction(stage, instruction, steps).await.map_err(fail)?
            } else if instruction.keyword == "ARG" {
                let global = self.global.clone();
                declare(&mut self.global, &global, instruction, self.options, self.file.escape).map_err(fail)?;
                None
            } else {
                return Err(fail(BuildFailure::Invalid("comes before the first FROM".into())));
            };
            if let Some(state) = state {
                let took = started.elapsed();
                let state = if state == StepState::Done(Default::default()) { StepState::Done(took) } else { state };
                self.tell(steps, instruction.text(), state);
            }
        }
        let Some(last) = current else {
            return Err(BuildError {
                dockerfile: self.source.dockerfile.clone(),
                line: 0,
                instruction: String::new(),
                failure: BuildFailure::Invalid("the Dockerfile has no FROM".into()),
            });
        };
        if let Some(target) = &self.options.target
            && !self.is_target(&last)
        {
            return Err(BuildError {
                dockerfile: self.source.dockerfile.clone(),
                line: 0,
                instruction: String::new(),
                failure: BuildFailure::Invalid(format!("no stage is named `{target}`")),
            });
        }
        let layers = last.layers.into_iter().filter(|l| !is_empty(l)).collect();
        Ok(ReadyImage { name: self.source.dockerfile.display().to_string(), layers, config: last.config })
    }

    fn is_target(&self, stage: &Stage) -> bool {
        match (&self.options.target, &stage.name) {
            (Some(target), Some(name)) => target.eq_ignore_ascii_case(name),
            _ => false,
        }
    }

    fn tell(&mut self, steps: usize, instruction: String, state: StepState) {
        let progress = BuildProgress { step: self.step, steps, instruction, state };
        let _ = writeln!(self.log, "# {progress}");
        (self.progress)(&progress);
    }

    /// `FROM image [AS name]`: a new stage from an image, an earlier stage, or nothing.
    async fn from(&mut self, instruction: &Instruction, steps: usize) -> Result<Stage, BuildFailure> {
        let words = words::split(&instruction.args, &self.global, self.file.escape).map_err(BuildFailure::Invalid)?;
        let words: Vec<&String> = words.iter().filter(|w| !w.starts_with("--platform")).collect();
        let (reference, name) = match words.as_slice() {
            [image] => (image.as_str(), None),
            [image, as_, name] if as_.eq_ignore_ascii_case("as") => (image.as_str(), Some(name.to_string())),
            _ => return Err(BuildFailure::Invalid("takes an image and an optional `AS name`".into())),
        };
        let mut stage =
            match self.done.iter().rev().find(|s| s.name.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(reference)))
            {
                Some(earlier) => Stage { name: None, args: Vars::new(), ..earlier.clone() },
                None if reference.eq_ignore_ascii_case("scratch") => Stage {
                    name: None,
                    layers: Vec::new(),
                    config: ImageConfig::default(),
                    key: sha256("scratch"),
                    args: Vars::new(),
                },
                None => {
                    let image = self.layers.base(reference).map_err(BuildFailure::Failed)?;
                    let key = image_key(reference, &image);
                    Stage { name: None, layers: image.layers, config: image.config, key, args: Vars::new() }
                }
            };
        stage.name = name;
        if !self.options.extra_ca_certificates.is_empty() {
            let digest = self.certificates_digest()?;
            self.tell(steps, instruction.text(), StepState::Done(Default::default()));
            let started = Instant::now();
            let text = "(extra CA certificates)".to_owned();
            let state = self.layer_step(&mut stage, &text, &digest, Work::Certificates, steps).await?;
            let state = if state == StepState::Cached { state } else { StepState::Done(started.elapsed()) };
            self.tell(steps, text, state);
            return Ok(stage);
        }
        self.tell(steps, instruction.text(), StepState::Done(Default::default()));
        Ok(stage)
    }

    /// One instruction of a stage; what to tell of it (`None`: told already).
    async fn instruction(
        &mut self,
        stage: &mut Stage,
        instruction: &Instruction,
        steps: usize,
    ) -> Result<Option<StepState>, BuildFailure> {
        let escape = self.file.escape;
        let vars = vars(stage);
        let text = instruction.text();
        let args = instruction.args.as_str();
        let work = match instruction.keyword.as_str() {
            "RUN" => {
                if args.starts_with("--") {
                    let flag = args.split_whitespace().next().unwrap_or_default();
                    return Err(BuildFailure::Invalid(format!("RUN's flag `{flag}` is not supported")));
                }
                Work::Run(command(args, &stage.config.shell))
            }
            "COPY" | "ADD" => Work::Copy(
                Copy::parse(instruction.keyword == "ADD", args, &vars, escape).map_err(BuildFailure::Invalid)?,
            ),
            "WORKDIR" => {
                let dir = words::expand(args, &vars, escape).map_err(BuildFailure::Invalid)?;
                stage.config.workdir = normal(&workdir(&stage.config).join(dir.trim())).display().to_string();
                Work::Workdir
            }
            _ => return configure(stage, instruction, &vars, self.options, escape, &self.global).map(Some),
        };
        let extra = match &work {
            Work::Copy(copy) => self.copy_digest(copy).await?,
            _ => String::new(),
        };
        let state = self.layer_step(stage, &text, &extra, work, steps).await?;
        Ok(Some(state))
    }

    /// What a copy's key takes beyond its text: the digest of the context files it copies,
    /// or the key of the stage or image it copies from.
    async fn copy_digest(&mut self, copy: &Copy) -> Result<String, BuildFailure> {
        match &copy.from {
            Some(from) => match self.stage_named(from) {
                Some(stage) => Ok(format!("from stage {}", stage.key)),
                None => {
                    let image = self.layers.base(from).map_err(BuildFailure::Failed)?;
                    Ok(format!("from image {}", image_key(from, &image)))
                }
            },
            None => {
                let context = self.context()?;
                let mut selected = Vec::new();
                for source in &copy.sources {
                    selected.extend(context.select(source).map_err(BuildFailure::Invalid)?);
                }
                context.digest(&selected).map_err(BuildFailure::Failed)
            }
        }
    }

    fn stage_named(&self, name: &str) -> Option<&Stage> {
        match name.parse::<usize>() {
            Ok(i) => self.done.get(i),
            Err(_) => self.done.iter().rev().find(|s| s.name.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(name))),
        }
    }

    fn context(&mut self) -> Result<&Context, BuildFailure> {
        if self.context.is_none() {
            self.context = Some(Context::read(&self.source.context).map_err(BuildFailure::Failed)?);
        }
        self.context.as_ref().ok_or_else(|| BuildFailure::Failed("the build context was not read".into()))
    }

    fn certificates_digest(&self) -> Result<String, BuildFailure> {
        let mut all = String::new();
        for path in &self.options.extra_ca_certificates {
            let text = std::fs::read_to_string(path).map_err(|e| {
                BuildFailure::Failed(format!("failed to read the CA certificate {}: {e}", path.display()))
            })?;
            all.push_str(&format!("{}\n{text}\n", path.display()));
        }
        Ok(sha256(&all))
    }

    /// A step that changes files: its layer from the cache, or made now and kept.
    async fn layer_step(
        &mut self,
        stage: &mut Stage,
        text: &str,
        extra: &str,
        work: Work,
        steps: usize,
    ) -> Result<StepState, BuildFailure> {
        let key = sha256(&format!(
            "parent {}\nstep {text}\nconfig {}\nargs {}\nextra {extra}\n",
            stage.key,
            serde_json::to_string(&stage.config).unwrap_or_default(),
            serde_json::to_string(&stage.args).unwrap_or_default(),
        ));
        if let Some(hit) = self.layers.cached(&key) {
            stage.layers.push(hit.layer);
            stage.config = hit.config;
            stage.key = key;
            return Ok(StepState::Cached);
        }
        self.tell(steps, text.to_owned(), StepState::Running);
        let started = Instant::now();
        let scratch = self.layers.scratch().map_err(BuildFailure::Failed)?;
        let made = self.make_layer(stage, &work, &scratch).await;
        let kept = made.and_then(|upper| self.layers.keep(&key, upper, &stage.config).map_err(BuildFailure::Failed));
        let _ = std::fs::remove_dir_all(&scratch);
        stage.layers.push(kept?);
        stage.key = key;
        Ok(StepState::Done(started.elapsed()))
    }

    /// Starts a root of the stage's layers in `scratch`, does `work` in it, and stops it; the
    /// root's upper folder, which is now the step's layer.
    async fn make_layer(&mut self, stage: &Stage, work: &Work, scratch: &Path) -> Result<PathBuf, BuildFailure> {
        let resolv = Path::new("/etc/resolv.conf");
        let binds = match work {
            Work::Run(_) if resolv.exists() => {
                vec![Bind { from: resolv.to_path_buf(), to: resolv.to_path_buf(), writable: false }]
            }
            _ => Vec::new(),
        };
        let root = Arc::new(start_root(&stage.layers, scratch, "root", binds.clone())?);
        let tree = ImageTree::new(root.path());
        let done = match work {
            Work::Run(argv) => self.run_step(stage, argv, root.clone(), &tree).await,
            Work::Copy(copy) => self.copy_step(stage, copy, &tree, scratch),
            Work::Workdir => tree
                .make_dirs(&workdir(&stage.config), (0, 0))
                .map(|_| ())
                .map_err(|e| BuildFailure::Failed(e.to_string())),
            Work::Certificates => self.certificates_step(&tree),
        };
        root.stop();
        drop(root);
        let private = scratch.join("root");
        // A host file mounted in the root is not the image's: its mount point goes.
        for bind in &binds {
            let _ = std::fs::remove_file(private.join("upper").join(bind.to.strip_prefix("/").unwrap_or(&bind.to)));
        }
        done?;
        Ok(private.join("upper"))
    }

    async fn run_step(
        &mut self,
        stage: &Stage,
        argv: &[String],
        root: Arc<Root>,
        tree: &ImageTree,
    ) -> Result<(), BuildFailure> {
        let account = user::user(tree, &stage.config.user).map_err(|e| BuildFailure::Failed(format!("USER: {e}")))?;
        let dir = workdir(&stage.config);
        tree.make_dirs(&dir, (0, 0))
            .map_err(|e| BuildFailure::Failed(format!("failed to make {}: {e}", dir.display())))?;
        let mut env: std::collections::BTreeMap<String, String> = stage.args.clone().into_iter().collect();
        env.extend(
            stage.config.env.iter().filter_map(|e| e.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        env.entry("PATH".into()).or_insert_with(|| DEFAULT_PATH.into());
        env.entry("HOME".into()).or_insert(account.home);
        if !self.options.extra_ca_certificates.is_empty() {
            for name in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"] {
                env.entry(name.into()).or_insert_with(|| CA_BUNDLE.into());
            }
        }
        let command = run::RunCommand { argv: argv.to_vec(), env, workdir: dir, user: (account.uid, account.gid) };
        let ids = crate::image::id_map().map_err(BuildFailure::Failed)?;
        match run::run(root, ids, &command, self.deadline, &mut self.log).await {
            Ok(()) => Ok(()),
            Err(run::Ended::Failed { status, tail }) => Err(BuildFailure::Exited { status, tail }),
            Err(run::Ended::TimedOut { tail }) => {
                Err(BuildFailure::TimedOut { limit_s: self.options.build_timeout.as_secs(), tail })
            }
            Err(run::Ended::NotStarted(why)) => Err(BuildFailure::Failed(why)),
        }
    }

    fn copy_step(&mut self, stage: &Stage, copy: &Copy, tree: &ImageTree, scratch: &Path) -> Result<(), BuildFailure> {
        let owner = match &copy.chown {
            Some(spec) => user::chown(tree, spec).map_err(|e| BuildFailure::Invalid(format!("--chown: {e}")))?,
            None => (0, 0),
        };
        let dir = workdir(&stage.config);
        match &copy.from {
            None => {
                let context = self.context()?;
                copy::copy(copy, &CopySource::Context(context), tree, &dir, owner).map_err(BuildFailure::Failed)
            }
            Some(from) => {
                let layers = match self.stage_named(from) {
                    Some(stage) => stage.layers.clone(),
                    None => self.layers.base(from).map_err(BuildFailure::Failed)?.layers,
                };
                let source = start_root(&layers, scratch, "from", Vec::new())?;
                let done = copy::copy(copy, &CopySource::Root(&ImageTree::new(source.path())), tree, &dir, owner);
                source.stop();
                done.map_err(BuildFailure::Failed)
            }
        }
    }

    fn certificates_step(&self, tree: &ImageTree) -> Result<(), BuildFailure> {
        let failed = |e: std::io::Error| BuildFailure::Failed(format!("failed to add the CA certificates: {e}"));
        let resolved = tree.resolve(Path::new(CA_BUNDLE), true).map_err(failed)?;
        let mut bundle = std::fs::read(tree.host(&resolved)).unwrap_or_default();
        let meta = Meta { owner: (0, 0), mode: 0o644, mtime: None };
        for path in &self.options.extra_ca_certificates {
            let text = std::fs::read(path).map_err(failed)?;
            let stem = path.file_stem().unwrap_or_default().to_string_lossy();
            let dest = Path::new(CA_FOLDER).join(format!("{stem}.crt"));
            tree.write_file(&dest, &mut text.as_slice(), meta).map_err(failed)?;
            if !bundle.is_empty() && !bundle.ends_with(b"\n") {
                bundle.push(b'\n');
            }
            bundle.extend_from_slice(&text);
        }
        tree.write_file(Path::new(CA_BUNDLE), &mut bundle.as_slice(), meta).map_err(failed)
    }
}

/// Starts a root of `layers` (or of an empty folder, for a stage from `scratch`) with its
/// private folder at `scratch/name`.
fn start_root(layers: &[PathBuf], scratch: &Path, name: &str, binds: Vec<Bind>) -> Result<Root, BuildFailure> {
    let failed = |e: std::io::Error| BuildFailure::Failed(format!("failed to start a root of the image: {e}"));
    let mut layers = layers.to_vec();
    if layers.is_empty() {
        let empty = scratch.join(format!("{name}-empty"));
        std::fs::create_dir_all(&empty).map_err(failed)?;
        super::tree::set_meta(&empty, Meta { owner: (0, 0), mode: 0o755, mtime: None }).map_err(failed)?;
        layers.push(empty);
    }
    Root::start(&RootSpec { layers, private: scratch.join(name), binds }).map_err(failed)
}

/// The key of a base image: its reference, layers and configuration.
fn image_key(reference: &str, image: &ReadyImage) -> String {
    let config = serde_json::to_string(&image.config).unwrap_or_default();
    sha256(&format!("image {reference}\n{:?}\n{config}\n", image.layers))
}

/// Whether a layer folder holds nothing.
fn is_empty(layer: &Path) -> bool {
    std::fs::read_dir(layer).map(|mut d| d.next().is_none()).unwrap_or(false)
}

/// The variables an instruction of `stage` sees: its build arguments, then its `ENV`s.
fn vars(stage: &Stage) -> Vars {
    let mut vars = stage.args.clone();
    vars.extend(stage.config.env.iter().filter_map(|e| e.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())));
    vars
}

fn workdir(config: &ImageConfig) -> PathBuf {
    match config.workdir.as_str() {
        "" => PathBuf::from("/"),
        dir => PathBuf::from(dir),
    }
}

/// `path` without `.` and `..` parts (`..` stops at `/`).
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in path.components() {
        match part {
            std::path::Component::Normal(p) => out.push(p),
            std::path::Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// A `RUN`'s (or `CMD`'s, `ENTRYPOINT`'s) command: the JSON form as written, else the
/// shell form through `SHELL` (`/bin/sh -c` when unset).
fn command(args: &str, shell: &[String]) -> Vec<String> {
    match exec_form(args) {
        Some(argv) => argv,
        None => {
            let mut argv = if shell.is_empty() { vec!["/bin/sh".into(), "-c".into()] } else { shell.to_vec() };
            argv.push(args.to_owned());
            argv
        }
    }
}

/// `ARG name[=default]...`: each declared in `into`, its value the build's `--build-arg`,
/// else its default, else the value of the same `ARG` before the first `FROM`.
fn declare(
    into: &mut Vars,
    global: &Vars,
    instruction: &Instruction,
    options: &BuildOptions,
    escape: char,
) -> Result<(), BuildFailure> {
    let mut visible = global.clone();
    visible.extend(into.clone());
    for word in words::split(&instruction.args, &visible, escape).map_err(BuildFailure::Invalid)? {
        let (name, default) = match word.split_once('=') {
            Some((n, d)) => (n.to_owned(), Some(d.to_owned())),
            None => (word.clone(), None),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(BuildFailure::Invalid(format!("`{name}` is not a name for an ARG")));
        }
        let value = options.build_args.get(&name).cloned().or(default).or_else(|| global.get(&name).cloned());
        if let Some(value) = value {
            into.insert(name, value);
        }
    }
    Ok(())
}

/// The instructions that change the configuration alone.
fn configure(
    stage: &mut Stage,
    instruction: &Instruction,
    vars: &Vars,
    options: &BuildOptions,
    escape: char,
    global: &Vars,
) -> Result<StepState, BuildFailure> {
    let args = instruction.args.as_str();
    let invalid = BuildFailure::Invalid;
    let config = &mut stage.config;
    match instruction.keyword.as_str() {
        "ARG" => declare(&mut stage.args, global, instruction, options, escape)?,
        "ENV" => {
            for (key, value) in pairs(args, vars, escape).map_err(invalid)? {
                config.env.retain(|e| e.split_once('=').map(|(k, _)| k) != Some(key.as_str()));
                config.env.push(format!("{key}={value}"));
            }
        }
        "LABEL" => config.labels.extend(pairs(args, vars, escape).map_err(invalid)?),
        "EXPOSE" => {
            for port in words::split(args, vars, escape).map_err(invalid)? {
                let port = if port.contains('/') { port } else { format!("{port}/tcp") };
                if !config.exposed_ports.contains(&port) {
                    config.exposed_ports.push(port);
                }
            }
        }
        "USER" => config.user = words::expand(args, vars, escape).map_err(invalid)?.trim().to_owned(),
        "SHELL" => {
            config.shell = exec_form(args).filter(|s| !s.is_empty()).ok_or_else(|| {
                BuildFailure::Invalid("SHELL takes a JSON array, such as [\"/bin/bash\", \"-c\"]".into())
            })?;
        }
        "CMD" => config.cmd = command(args, &config.shell),
        "ENTRYPOINT" => {
            config.entrypoint = command(args, &config.shell);
            // As Docker does: an ENTRYPOINT drops the CMD the image had.
            config.cmd.clear();
        }
        "VOLUME" | "HEALTHCHECK" | "STOPSIGNAL" | "ONBUILD" | "MAINTAINER" => {
            return Ok(StepState::Note("accepted; runner does not use it".into()));
        }
        other => return Err(BuildFailure::Invalid(format!("`{other}` is not an instruction this builder knows"))),
    }
    Ok(StepState::Done(Default::default()))
}

/// `ENV`'s and `LABEL`'s `key=value` words, or the old `key value` form.
fn pairs(args: &str, vars: &Vars, escape: char) -> Result<Vec<(String, String)>, String> {
    let first = args.split_whitespace().next().unwrap_or_default();
    if !first.contains('=') {
        let (key, rest) = args.trim().split_once(char::is_whitespace).ok_or("takes `key=value` pairs")?;
        return Ok(vec![(key.to_owned(), words::expand(rest.trim(), vars, escape)?)]);
    }
    words::split(args, vars, escape)?
        .into_iter()
        .map(|w| match w.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(format!("`{w}` is not a `key=value` pair")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_and_label_take_pairs_or_the_old_form() {
        let vars: Vars = [("A".to_owned(), "x".to_owned())].into();
        assert_eq!(
            pairs(r#"K1=$A K2="a b" K3=${A}y"#, &vars, '\\').unwrap(),
            vec![("K1".into(), "x".into()), ("K2".into(), "a b".into()), ("K3".into(), "xy".into())]
        );
        assert_eq!(pairs("KEY some $A words", &vars, '\\').unwrap(), vec![("KEY".into(), "some x words".into())]);
        assert!(pairs("=x", &vars, '\\').is_err());
    }

    #[test]
    fn commands_use_the_shell_unless_written_as_json() {
        assert_eq!(command("echo hi", &[]), vec!["/bin/sh", "-c", "echo hi"]);
        assert_eq!(command("echo hi", &["/bin/bash".into(), "-lc".into()]), vec!["/bin/bash", "-lc", "echo hi"]);
        assert_eq!(command(r#"["ls", "-l"]"#, &[]), vec!["ls", "-l"]);
    }

    #[test]
    fn a_working_folder_is_normal_and_relative_to_the_last() {
        assert_eq!(normal(Path::new("/app/./src/../lib")), Path::new("/app/lib"));
        assert_eq!(normal(Path::new("/../x")), Path::new("/x"));
    }
}
