//! Harbor task directories as suites: `task.toml`, `instruction.md`, `environment/`,
//! `tests/test.sh`, `solution/solve.sh`. Each directory is a suite of one task, run in the
//! sandboxed `shell` world, scored by its verifier (`scoring/checks/verifier.rs`).
//!
//! Nothing of Docker runs. The Dockerfile is read for what it puts in the working
//! directory (`COPY` from `environment/` under `WORKDIR`) and what it needs of the host
//! (its base image, the programs it installs); a task that needs what is not here is loaded
//! with the reason (`Task::unavailable`), and its episodes are unscored
//! (`environment_error`), never failed. The task's timeouts, resources and network become
//! the suite's time limit and the `shell` world's sandbox.

use std::collections::BTreeMap;
use std::path::{Component, Path};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::task_folder::{ContextFile, CopyError, TaskFolder, files_under};
use super::{AgentConfig, Suite};
use crate::budget::Limits;
use crate::config::decode::{ConfigError, Source};
use crate::config::yaml::Position;
use crate::domain::harbor::map_paths;
use crate::domain::scorer::{Check, ScorerSpec};
use crate::domain::{FileCopy, MAX_EPISODE_S, MockTurn, Reducer, Task};
use crate::environment::Definition;
use crate::environment::beneath::{Beneath, Kind, Links};
use crate::environment::permission::Permissions;
use crate::log::event::LimitOverrides;
use crate::sandbox::process::find_program;
use crate::sandbox::{ProcessLimits, SandboxMode, SandboxSpec};

/// The file that makes a folder a Harbor task directory.
pub const TASK_FILE: &str = "task.toml";

/// The largest copied file kept as text in the task; a larger one is copied as it is.
const TEXT_FILE_CAP: u64 = 1 << 20;

/// Where the agent starts when the Dockerfile names no `WORKDIR` (Harbor's tasks use it).
const DEFAULT_WORKDIR: &str = "/app";

/// Harbor's defaults for what `task.toml` leaves out.
const DEFAULT_TIMEOUT_S: f64 = 600.0;
const DEFAULT_MEMORY_MB: u64 = 2048;
const DEFAULT_STORAGE_MB: u64 = 10240;

/// The system prompt of the built-in agent on a Harbor task.
const SYSTEM: &str = "You work in a Linux shell. The task's files are in the working directory. \
Use the tools to do the task, then call final_answer with a short summary.";

/// Whether `path` is a Harbor task directory.
pub fn is_task_dir(path: &Path) -> bool {
    path.join(TASK_FILE).is_file()
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TaskToml {
    #[allow(dead_code)]
    version: Option<String>,
    metadata: Map<String, Value>,
    verifier: VerifierToml,
    agent: AgentToml,
    environment: EnvironmentToml,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct VerifierToml {
    timeout_sec: Option<f64>,
    env: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AgentToml {
    timeout_sec: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct EnvironmentToml {
    #[allow(dead_code)]
    build_timeout_sec: Option<f64>,
    docker_image: Option<String>,
    cpus: Option<f64>,
    memory: Option<String>,
    memory_mb: Option<u64>,
    storage: Option<String>,
    storage_mb: Option<u64>,
    allow_internet: Option<bool>,
}

/// `runner.yaml` beside a task: what runner adds to it (the scripted turns of `--model mock`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunnerFile {
    #[serde(default)]
    mock: Vec<MockTurn>,
}

/// Loads one task directory as a suite named `harbor/<directory>`. Every file of it is
/// read from inside it (`task_folder.rs`): one that leads out is refused.
pub fn load(dir: &Path, overrides: &LimitOverrides) -> Result<Suite, ConfigError> {
    let folder = TaskFolder::open(dir)?;
    let name = folder
        .path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| ConfigError::whole(dir, "a task directory needs a name"))?;
    let toml_path = dir.join(TASK_FILE);
    let toml_text = required(folder.text(dir, TASK_FILE)?, &toml_path, "a Harbor task directory needs it")?;
    let config: TaskToml = toml::from_str(&toml_text).map_err(|e| toml_error(&toml_path, &toml_text, &e))?;
    let instruction_path = dir.join("instruction.md");
    let instruction =
        required(folder.text(dir, "instruction.md")?, &instruction_path, "a Harbor task states its instruction here")?;
    let tests = folder.folder(dir, "tests")?;
    check_executable(&folder, dir, "tests/test.sh", "the verifier")?;
    let solution = folder.text(dir, "solution/solve.sh")?;

    let timeouts =
        [("agent.timeout_sec", config.agent.timeout_sec), ("verifier.timeout_sec", config.verifier.timeout_sec)];
    for (field, value) in timeouts {
        if let Some(s) = value
            && !(s.is_finite() && s > 0.0 && s <= MAX_EPISODE_S)
        {
            return Err(toml_field(
                &toml_path,
                &toml_text,
                field,
                format!("must be a positive number of seconds, at most {MAX_EPISODE_S}, got {}", shown(s)),
            ));
        }
    }
    for name in config.verifier.env.keys() {
        if !is_variable_name(name) {
            let message = format!("`{name}` is not a variable name (letters, digits and `_`)");
            return Err(toml_field(&toml_path, &toml_text, "verifier.env", message));
        }
    }
    let env = &config.environment;
    let memory_mb = size_mb(&toml_path, &toml_text, "environment.memory", env.memory.as_deref(), env.memory_mb)?
        .unwrap_or(DEFAULT_MEMORY_MB);
    let storage_mb = size_mb(&toml_path, &toml_text, "environment.storage", env.storage.as_deref(), env.storage_mb)?
        .unwrap_or(DEFAULT_STORAGE_MB);
    if let Some(cpus) = env.cpus
        && !(cpus.is_finite() && cpus > 0.0)
    {
        return Err(toml_field(&toml_path, &toml_text, "environment.cpus", format!("must be positive, got {cpus}")));
    }
    let agent_s = config.agent.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_S);
    let verifier_s = config.verifier.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_S);

    let image = read_image(&folder, dir, env.docker_image.as_deref())?;
    let workdir = image.workdir.clone();
    let mappings = [(workdir.as_str(), ".")];
    let input = map_paths(&instruction, &mappings);
    let script_mappings = [(workdir.as_str(), "$HOME")];
    let solution: Vec<String> = solution
        .map(|text| vec![format!("bash -c {}", shell_quote(&map_paths(&text, &script_mappings)))])
        .unwrap_or_default();

    let runner_yaml = dir.join("runner.yaml");
    let mock = match folder.text(dir, "runner.yaml")? {
        Some(text) => {
            let source = Source::parse(&runner_yaml, &text)?;
            source.decode::<RunnerFile>("", &source.value)?.mock
        }
        None => Vec::new(),
    };
    let tests = required(tests, &dir.join("tests"), "a Harbor task's verifier lives here")?;
    let scorer = ScorerSpec {
        name: "verifier".into(),
        check: Check::Verifier {
            tests: tests.to_string_lossy().into_owned(),
            workdir: workdir.clone(),
            timeout_s: verifier_s,
            env: config.verifier.env.clone(),
        },
        weight: 1.0,
        from: None,
        recorded: Default::default(),
    };
    let mut metadata = config.metadata.clone();
    metadata.insert(
        "harbor".into(),
        json!({"workdir": workdir, "agent_timeout_s": agent_s, "verifier_timeout_s": verifier_s,
               "cpus": env.cpus, "memory_mb": memory_mb, "storage_mb": storage_mb,
               "allow_internet": env.allow_internet.unwrap_or(true)}),
    );
    let digest = {
        let mut hasher = Sha256::new();
        hasher.update(json!({"input": input, "files": image.files, "metadata": metadata}).to_string());
        folder.hash(&mut hasher, "tests");
        folder.hash(&mut hasher, "environment");
        hex::encode(hasher.finalize())
    };
    let task = Task {
        files: image.files,
        copies: image.copies,
        metadata,
        scorers: vec![scorer],
        mock: mock.into(),
        digest: digest.clone(),
        solution,
        unavailable: image.unavailable,
        ..Task::new(&name, &input)
    };
    let limits = Limits { time_s: agent_s, ..Limits::default() }.resolved(overrides);
    Ok(Suite {
        name: format!("harbor/{name}"),
        share_epochs: false,
        version: 1,
        description: format!("Harbor task {name}"),
        path: dir.to_owned(),
        digest,
        environment: Arc::new(world(agent_s.max(verifier_s), env.cpus, memory_mb, storage_mb, env.allow_internet)),
        sandbox: SandboxMode::On,
        permissions: Arc::new(Permissions::default()),
        agent: AgentConfig { system: Some(SYSTEM.into()), ..AgentConfig::default() },
        limits,
        epochs: 1,
        reducer: Reducer::default(),
        k_of_n: None,
        pass_threshold: None,
        pass_score: None,
        grader: None,
        scorers: Vec::new(),
        tasks: vec![task],
        ungraded: Vec::new(),
        toolsets: Vec::new(),
        variants: Vec::new(),
        providers: Vec::new(),
        endpoints: Default::default(),
        skipped: Vec::new(),
    })
}

/// The `shell` world the task runs in: its commands may take as long as the task's
/// longest timeout, each process gets that many CPU seconds per CPU, the task's memory as
/// its address space, its storage as its largest file, and the network as it allows.
fn world(longest_s: f64, cpus: Option<f64>, memory_mb: u64, storage_mb: u64, internet: Option<bool>) -> Definition {
    let kind = crate::environment::kinds::find("shell");
    let mut definition = match kind {
        Some(kind) => Definition::builtin(kind),
        None => unreachable!("the shell kind is in KINDS"),
    };
    definition.limits.command_timeout_s = longest_s;
    definition.limits.tool_timeout_s = longest_s + 10.0;
    let defaults = ProcessLimits::default();
    definition.sandbox = Some(SandboxSpec {
        network: internet.unwrap_or(true),
        limits: ProcessLimits {
            cpu_s: Some((longest_s * cpus.unwrap_or(1.0)).ceil().max(1.0) as u64),
            memory_mb: Some(memory_mb.max(64)),
            file_size_mb: Some(storage_mb.max(1)),
            ..defaults
        },
        ..SandboxSpec::default()
    });
    definition
}

/// What the Dockerfile gives the working directory, and why the task cannot run here.
struct Image {
    workdir: String,
    files: BTreeMap<String, String>,
    /// The files copied as they are: not text, or executable.
    copies: Vec<FileCopy>,
    unavailable: Option<String>,
}

/// Reads `environment/Dockerfile` for its `WORKDIR`, the files it copies there, and what
/// it needs that this host lacks (the first such thing is the reason). A copy that would
/// reach out of `environment/` is refused at its line.
fn read_image(folder: &TaskFolder, dir: &Path, docker_image: Option<&str>) -> Result<Image, ConfigError> {
    let mut image =
        Image { workdir: DEFAULT_WORKDIR.into(), files: BTreeMap::new(), copies: Vec::new(), unavailable: None };
    let needs = |why: String, image: &mut Image| {
        image.unavailable.get_or_insert(why);
    };
    if let Some(name) = docker_image {
        needs(format!("the task runs in its prebuilt image `{name}` (task.toml `docker_image`)"), &mut image);
    }
    let context = folder.beneath(dir, "environment")?;
    for compose in ["docker-compose.yaml", "docker-compose.yml"] {
        if folder.stat(dir, &format!("environment/{compose}"))?.is_some() {
            needs(format!("the task needs the services of environment/{compose}"), &mut image);
        }
    }
    let dockerfile = dir.join("environment/Dockerfile");
    let Some(text) = folder.text(dir, "environment/Dockerfile")? else {
        return Ok(image);
    };
    let instructions = instructions(&text);
    // Files land relative to the last `WORKDIR`, where the agent starts.
    if let Some(dir) = instructions.iter().rev().find(|(_, op, _)| op == "WORKDIR").map(|(_, _, arg)| arg.trim()) {
        image.workdir = dir.trim_end_matches('/').to_owned();
    }
    if image.workdir.is_empty() || !image.workdir.starts_with('/') {
        let why = format!("the Dockerfile's WORKDIR `{}` is not an absolute folder below /", image.workdir);
        needs(why, &mut image);
        return Ok(image);
    }
    let mut current = DEFAULT_WORKDIR.to_owned();
    for (line, op, arg) in &instructions {
        let result = match op.as_str() {
            "FROM" => base_image(arg).map_err(CopyError::Needs),
            "WORKDIR" => {
                current = absolute(&current, arg.trim());
                Ok(())
            }
            "COPY" | "ADD" => {
                copy(context.as_ref(), (&current, &image.workdir), op, arg, (&mut image.files, &mut image.copies))
            }
            "RUN" => run(arg).map_err(CopyError::Needs),
            // What a container's start and metadata say: nothing for the working directory.
            "ENV" | "ARG" | "LABEL" | "EXPOSE" | "CMD" | "ENTRYPOINT" | "USER" | "SHELL" | "HEALTHCHECK"
            | "STOPSIGNAL" | "VOLUME" | "MAINTAINER" | "ONBUILD" => Ok(()),
            other => Err(CopyError::Needs(format!("the Dockerfile's `{other}` is not understood"))),
        };
        match result {
            Ok(()) => {}
            Err(CopyError::Needs(why)) => needs(why, &mut image),
            Err(CopyError::Refused(why)) => {
                return Err(ConfigError::at(&dockerfile, Position { line: *line, column: 1 }, why));
            }
        }
    }
    Ok(image)
}

/// The Dockerfile's instructions, each with the line it starts on, continuation lines
/// joined, comments dropped.
fn instructions(text: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    let mut first = 0;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        if pending.is_empty() {
            first = index + 1;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                pending.push_str(part);
                pending.push(' ');
            }
            None => {
                pending.push_str(trimmed);
                let whole = std::mem::take(&mut pending);
                let (op, arg) = whole.split_once(char::is_whitespace).unwrap_or((&whole, ""));
                out.push((first, op.to_uppercase(), arg.trim().to_owned()));
            }
        }
    }
    out
}

/// Bases whose contents this host stands in for, each with the program it must have.
const BASES: &[(&str, &str)] = &[
    ("ubuntu", "sh"),
    ("debian", "sh"),
    ("alpine", "sh"),
    ("busybox", "sh"),
    ("buildpack-deps", "sh"),
    ("bash", "bash"),
    ("python", "python3"),
    ("node", "node"),
    ("golang", "go"),
    ("rust", "cargo"),
    ("ruby", "ruby"),
];

fn base_image(arg: &str) -> Result<(), String> {
    let words: Vec<&str> = arg.split_whitespace().filter(|w| !w.starts_with("--")).collect();
    let image = words.first().copied().unwrap_or_default();
    let repository = image.split([':', '@']).next().unwrap_or_default();
    let name = repository.strip_prefix("docker.io/").unwrap_or(repository);
    let name = name.strip_prefix("library/").unwrap_or(name);
    match BASES.iter().find(|(base, _)| *base == name) {
        Some((_, program)) if on_path(program) => Ok(()),
        Some((_, program)) => {
            Err(format!("the base image `{image}` stands for `{program}`, which is not installed here"))
        }
        None => Err(format!("the task needs its image: the Dockerfile starts FROM `{image}`")),
    }
}

/// `COPY`/`ADD` from the build context (`environment/`, held open as `context`; `None`
/// when there is none) into the working directory. A source is a path inside the context:
/// an absolute one, a `..` or a link that leads out is refused.
fn copy(
    context: Option<&Beneath>,
    (current, workdir): (&str, &str),
    op: &str,
    arg: &str,
    (files, copies): (&mut BTreeMap<String, String>, &mut Vec<FileCopy>),
) -> Result<(), CopyError> {
    let words: Vec<String> = match serde_json::from_str::<Vec<String>>(arg) {
        Ok(list) => list,
        Err(_) => arg.split_whitespace().map(str::to_owned).collect(),
    };
    if let Some(flag) = words.iter().find(|w| w.starts_with("--from")) {
        return Err(CopyError::Needs(format!(
            "`{op} {flag}` copies from another build stage, which is not built here"
        )));
    }
    let words: Vec<&String> = words.iter().filter(|w| !w.starts_with("--")).collect();
    let Some((dest, sources)) = words.split_last() else {
        return Err(CopyError::Needs(format!("`{op} {arg}` names nothing to copy")));
    };
    let dest_abs = absolute(current, dest);
    let into_folder = dest.ends_with('/') || sources.len() > 1;
    for source in sources {
        if source.contains("://") || source.contains(['*', '?', '[']) {
            return Err(CopyError::Needs(format!("`{op} {source}`: only files of environment/ are copied, by name")));
        }
        if source.starts_with('/') || Path::new(source.as_str()).components().any(|c| c == Component::ParentDir) {
            return Err(CopyError::Refused(format!(
                "`{op} {source}`: a source is a path inside environment/ (an absolute path or `..` is refused)"
            )));
        }
        let Some(context) = context else {
            return Err(CopyError::Needs(format!("`{op} {source}`: environment/{source} does not exist")));
        };
        let found = files_under(context, source).map_err(|e| match e {
            CopyError::Refused(why) => CopyError::Refused(format!("`{op} {source}`: {why}")),
            CopyError::Needs(why) => CopyError::Needs(format!("`{op} {source}`: {why}")),
        })?;
        let leaf = Path::new(source.as_str()).file_name().map(|n| n.to_string_lossy().into_owned());
        let single = found.len() == 1 && found[0].below.as_os_str().is_empty();
        let base = match (single, into_folder, leaf) {
            (true, true, Some(leaf)) => format!("{dest_abs}/{leaf}"),
            _ => dest_abs.clone(),
        };
        for file in found {
            let below = &file.below;
            let target =
                if below.as_os_str().is_empty() { base.clone() } else { format!("{base}/{}", below.display()) };
            let Some(inside) = inside(workdir, &target) else {
                let why = format!("`{op} {source}` puts files at `{target}`, outside WORKDIR `{workdir}`");
                return Err(CopyError::Needs(why));
            };
            place(context, file, inside, (files, copies))
                .map_err(|e| CopyError::Needs(format!("`{op} {source}`: failed to read it: {e}")))?;
        }
    }
    Ok(())
}

/// Puts one copied file in the task: a small text that is not executable among its
/// `files`, anything else as a copy made with each episode's folder (bytes and permissions
/// as they are; the digest covers environment/ whole).
fn place(
    context: &Beneath,
    file: ContextFile,
    inside: String,
    (files, copies): (&mut BTreeMap<String, String>, &mut Vec<FileCopy>),
) -> std::io::Result<()> {
    copies.retain(|c| c.to != inside);
    files.remove(&inside);
    if file.mode & 0o111 == 0 && file.size <= TEXT_FILE_CAP {
        let read = context.read(&file.real, Links::None, TEXT_FILE_CAP)?;
        if let Some(text) = read.and_then(|(bytes, _)| String::from_utf8(bytes).ok()) {
            files.insert(inside, text);
            return Ok(());
        }
    }
    copies.push(FileCopy { root: context.path().to_owned(), from: file.real, to: inside });
    Ok(())
}

/// `path` made absolute against the folder `current`, `.` and `..` resolved.
fn absolute(current: &str, path: &str) -> String {
    let joined = if path.starts_with('/') { path.to_owned() } else { format!("{current}/{path}") };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

/// `target` relative to `workdir`, when it is below it.
fn inside(workdir: &str, target: &str) -> Option<String> {
    let rest = target.strip_prefix(workdir)?.strip_prefix('/')?;
    (!rest.is_empty()).then(|| rest.to_owned())
}

/// A `RUN`: package installs are checked against this host; making folders is left to
/// the agent; anything else would change the image in ways runner cannot know, and is
/// refused with the command.
fn run(arg: &str) -> Result<(), String> {
    for command in arg.split("&&").flat_map(|c| c.split(';')).map(str::trim).filter(|c| !c.is_empty()) {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["apt-get" | "apt", "install", rest @ ..] => {
                for package in rest.iter().filter(|w| !w.starts_with('-')) {
                    apt_package(package)?;
                }
            }
            ["apt-get" | "apt", "update" | "clean" | "autoremove" | "upgrade", ..] => {}
            ["rm", "-rf", "/var/lib/apt/lists/*"] => {}
            ["pip" | "pip3", "install", rest @ ..]
            | ["python" | "python3", "-m", "pip", "install", rest @ ..]
            | ["uv", "pip", "install", rest @ ..] => pip_packages(rest)?,
            ["mkdir", ..] | ["true"] => {}
            _ => return Err(format!("the Dockerfile runs `{command}`, which runner does not run")),
        }
    }
    Ok(())
}

/// Packages whose program has another name.
const APT_PROGRAMS: &[(&str, &str)] = &[
    ("build-essential", "gcc"),
    ("python3-pip", "pip3"),
    ("procps", "ps"),
    ("coreutils", "ls"),
    ("findutils", "find"),
    ("nodejs", "node"),
    ("golang", "go"),
    ("default-jdk", "java"),
    ("openjdk-17-jdk", "java"),
    ("ripgrep", "rg"),
    ("sqlite3", "sqlite3"),
];

fn apt_package(package: &str) -> Result<(), String> {
    let name = package.split('=').next().unwrap_or(package);
    if name == "ca-certificates" {
        return Ok(());
    }
    let program = APT_PROGRAMS.iter().find(|(p, _)| *p == name).map_or(name, |(_, program)| program);
    if let Some(module) = name.strip_prefix("python3-").filter(|m| !["pip", "venv", "dev"].contains(m)) {
        return python_module(module, package);
    }
    if on_path(program) {
        Ok(())
    } else {
        Err(format!("the Dockerfile installs `{name}` (apt-get), and `{program}` is not installed here"))
    }
}

fn pip_packages(words: &[&str]) -> Result<(), String> {
    for word in words {
        match *word {
            "-r" | "--requirement" | "-e" | "--editable" => {
                return Err(format!("the Dockerfile runs `pip install {word} …`, which runner does not run"));
            }
            flag if flag.starts_with('-') => {}
            spec => {
                let name = spec.split(['=', '<', '>', '~', '!', '[', ';', ' ']).next().unwrap_or(spec);
                python_module(&module_of(name), spec)?;
            }
        }
    }
    Ok(())
}

/// The module a Python distribution is imported as.
fn module_of(distribution: &str) -> String {
    let lower = distribution.to_lowercase();
    let known = [
        ("pyyaml", "yaml"),
        ("scikit-learn", "sklearn"),
        ("pillow", "PIL"),
        ("beautifulsoup4", "bs4"),
        ("python-dateutil", "dateutil"),
        ("opencv-python", "cv2"),
    ];
    match known.iter().find(|(d, _)| *d == lower) {
        Some((_, module)) => (*module).to_owned(),
        None => lower.replace('-', "_"),
    }
}

fn python_module(module: &str, package: &str) -> Result<(), String> {
    let found = std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        Ok(())
    } else {
        Err(format!("the Dockerfile installs `{package}`, and python3 here cannot import `{module}`"))
    }
}

/// Whether a program of this name is on runner's `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var("PATH").is_ok_and(|path| find_program(program, &path).is_some())
}

/// The file a task needs, or an error that says it is missing and why it is needed.
fn required<T>(found: Option<T>, path: &Path, why: &str) -> Result<T, ConfigError> {
    found.ok_or_else(|| ConfigError::whole(path, format!("missing: {why}")))
}

fn check_executable(folder: &TaskFolder, dir: &Path, rel: &str, what: &str) -> Result<(), ConfigError> {
    let path = dir.join(rel);
    match folder.stat(dir, rel)? {
        None => Err(ConfigError::whole(&path, format!("missing: {what} of a Harbor task (tests/test.sh)"))),
        Some((kind, _)) if kind != Kind::File => Err(ConfigError::whole(&path, format!("{what} must be a file"))),
        Some((_, mode)) if mode & 0o111 == 0 => {
            Err(ConfigError::whole(&path, format!("{what} is not executable (chmod +x it)")))
        }
        Some(_) => Ok(()),
    }
}

/// A TOML syntax or type error, at its line and column.
fn toml_error(path: &Path, text: &str, error: &toml::de::Error) -> ConfigError {
    let message = format!("invalid task.toml: {}", error.message());
    match error.span() {
        Some(span) => ConfigError::at(path, position(text, span.start), message),
        None => ConfigError::whole(path, message),
    }
}

/// An error about a field (`table.key`), at the line that sets it when it can be found.
fn toml_field(path: &Path, text: &str, field: &str, message: String) -> ConfigError {
    let (table, key) = field.split_once('.').unwrap_or(("", field));
    let mut in_table = table.is_empty();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            in_table = trimmed.trim_matches(['[', ']']).trim() == table;
        } else if in_table && trimmed.split(['=', ' ']).next() == Some(key) {
            return ConfigError::at(path, position(text, offset), format!("`{field}` {message}"));
        }
        offset += line.len();
    }
    ConfigError::whole(path, format!("`{field}` {message}"))
}

fn position(text: &str, offset: usize) -> Position {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Position { line, column }
}

/// `memory = "4G"` or `memory_mb = 4096`, in MiB.
fn size_mb(
    path: &Path,
    text: &str,
    field: &str,
    written: Option<&str>,
    mb: Option<u64>,
) -> Result<Option<u64>, ConfigError> {
    let Some(written) = written else {
        return Ok(mb);
    };
    let lower = written.trim().to_lowercase();
    let digits = lower.trim_end_matches(|c: char| c.is_alphabetic());
    let unit = &lower[digits.len()..];
    let factor = match unit.trim_end_matches('b').trim_end_matches('i') {
        "k" => 1.0 / 1024.0,
        "" | "m" => 1.0,
        "g" => 1024.0,
        "t" => 1024.0 * 1024.0,
        _ => -1.0,
    };
    match digits.trim().parse::<f64>() {
        Ok(n) if n > 0.0 && factor > 0.0 => Ok(Some((n * factor).ceil() as u64)),
        _ => Err(toml_field(path, text, field, format!("is `{written}`, expected a size such as \"2G\" or \"512M\""))),
    }
}

/// A number as a person reads it: `1e308`, not its three hundred digits.
fn shown(x: f64) -> String {
    if x.is_finite() && x.abs() < 1e15 { x.to_string() } else { format!("{x:e}") }
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerfile_instructions_join_continued_lines() {
        let text =
            "FROM ubuntu:24.04\n# a comment\nRUN apt-get update && \\\n    apt-get install -y git\nWORKDIR /app\n";
        let got = instructions(text);
        assert_eq!(got[1].1, "RUN");
        assert!(got[1].2.contains("apt-get install -y git"), "{got:?}");
        assert_eq!(got[2], (5, "WORKDIR".into(), "/app".into()));
        // Each instruction with the line it starts on, for errors that name it.
        assert_eq!((got[0].0, got[1].0), (1, 3));
    }

    #[test]
    fn paths_resolve_against_the_working_directory() {
        assert_eq!(absolute("/app", "data/"), "/app/data");
        assert_eq!(absolute("/app", "/srv/../app/x"), "/app/x");
        assert_eq!(inside("/app", "/app/data/x.txt").as_deref(), Some("data/x.txt"));
        assert_eq!(inside("/app", "/application/x"), None);
    }

    #[test]
    fn an_unknown_image_or_command_is_a_reason() {
        assert!(base_image("ghcr.io/someone/task-image:1").unwrap_err().contains("needs its image"));
        assert!(run("curl -LsSf https://astral.sh/uv/install.sh | sh").unwrap_err().contains("does not run"));
        assert!(run("mkdir -p /app/out && apt-get update").is_ok());
    }

    #[test]
    fn sizes_read_as_mib() {
        let p = Path::new("task.toml");
        assert_eq!(size_mb(p, "", "environment.memory", Some("4G"), None).unwrap(), Some(4096));
        assert_eq!(size_mb(p, "", "environment.memory", Some("512M"), None).unwrap(), Some(512));
        assert_eq!(size_mb(p, "", "environment.memory", None, Some(100)).unwrap(), Some(100));
        assert!(size_mb(p, "", "environment.memory", Some("lots"), None).is_err());
    }
}
