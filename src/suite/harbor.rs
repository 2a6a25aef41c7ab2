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
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::{AgentConfig, Suite};
use crate::budget::Limits;
use crate::config::decode::{ConfigError, Source};
use crate::config::yaml::Position;
use crate::domain::harbor::map_paths;
use crate::domain::scorer::{Check, ScorerSpec};
use crate::domain::{FileCopy, MAX_EPISODE_S, MockTurn, Reducer, Task};
use crate::environment::Definition;
use crate::environment::permission::Permissions;
use crate::log::event::LimitOverrides;
use crate::sandbox::process::find_program;
use crate::sandbox::{ProcessLimits, SandboxMode, SandboxSpec};

/// The file that makes a folder a Harbor task directory.
pub const TASK_FILE: &str = "task.toml";

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

/// Loads one task directory as a suite named `harbor/<directory>`.
pub fn load(dir: &Path, overrides: &LimitOverrides) -> Result<Suite, ConfigError> {
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .ok_or_else(|| ConfigError::whole(dir, "a task directory needs a name"))?;
    let toml_path = dir.join(TASK_FILE);
    let toml_text = read_text(&toml_path)?;
    let config: TaskToml = toml::from_str(&toml_text).map_err(|e| toml_error(&toml_path, &toml_text, &e))?;
    let instruction_path = dir.join("instruction.md");
    if !instruction_path.is_file() {
        return Err(ConfigError::whole(&instruction_path, "missing: a Harbor task states its instruction here"));
    }
    let instruction = read_text(&instruction_path)?;
    let tests = dir.join("tests");
    let test_sh = tests.join("test.sh");
    check_executable(&test_sh, "the verifier")?;
    let solve_sh = dir.join("solution/solve.sh");
    let solution = if solve_sh.exists() { Some(read_text(&solve_sh)?) } else { None };

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
                format!("must be a positive number of seconds, got {s}"),
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

    let image = read_image(&dir.join("environment"), env.docker_image.as_deref());
    let workdir = image.workdir.clone();
    let mappings = [(workdir.as_str(), ".")];
    let input = map_paths(&instruction, &mappings);
    let script_mappings = [(workdir.as_str(), "$HOME")];
    let solution: Vec<String> = solution
        .map(|text| vec![format!("bash -c {}", shell_quote(&map_paths(&text, &script_mappings)))])
        .unwrap_or_default();

    let mock = match dir.join("runner.yaml") {
        path if path.is_file() => {
            let (source, _) = Source::read(&path)?;
            source.decode::<RunnerFile>("", &source.value)?.mock
        }
        _ => Vec::new(),
    };
    let tests_text = tests.canonicalize().map_err(|e| ConfigError::whole(&tests, format!("failed to resolve: {e}")))?;
    let scorer = ScorerSpec {
        name: "verifier".into(),
        check: Check::Verifier {
            tests: tests_text.to_string_lossy().into_owned(),
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
        hash_folder(&mut hasher, &tests);
        hash_folder(&mut hasher, &dir.join("environment"));
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
/// it needs that this host lacks (the first such thing is the reason).
fn read_image(environment: &Path, docker_image: Option<&str>) -> Image {
    let mut image =
        Image { workdir: DEFAULT_WORKDIR.into(), files: BTreeMap::new(), copies: Vec::new(), unavailable: None };
    let needs = |why: String, image: &mut Image| {
        image.unavailable.get_or_insert(why);
    };
    if let Some(name) = docker_image {
        needs(format!("the task runs in its prebuilt image `{name}` (task.toml `docker_image`)"), &mut image);
    }
    for compose in ["docker-compose.yaml", "docker-compose.yml"] {
        if environment.join(compose).exists() {
            needs(format!("the task needs the services of environment/{compose}"), &mut image);
        }
    }
    let dockerfile = environment.join("Dockerfile");
    let Ok(text) = std::fs::read_to_string(&dockerfile) else {
        return image;
    };
    let instructions = instructions(&text);
    // Files land relative to the last `WORKDIR`, where the agent starts.
    if let Some(dir) = instructions.iter().rev().find(|(op, _)| op == "WORKDIR").map(|(_, arg)| arg.trim()) {
        image.workdir = dir.trim_end_matches('/').to_owned();
    }
    if image.workdir.is_empty() || !image.workdir.starts_with('/') {
        let why = format!("the Dockerfile's WORKDIR `{}` is not an absolute folder below /", image.workdir);
        needs(why, &mut image);
        return image;
    }
    let mut current = DEFAULT_WORKDIR.to_owned();
    for (op, arg) in &instructions {
        let result = match op.as_str() {
            "FROM" => base_image(arg),
            "WORKDIR" => {
                current = absolute(&current, arg.trim());
                Ok(())
            }
            "COPY" | "ADD" => {
                copy(environment, (&current, &image.workdir), op, arg, (&mut image.files, &mut image.copies))
            }
            "RUN" => run(arg),
            // What a container's start and metadata say: nothing for the working directory.
            "ENV" | "ARG" | "LABEL" | "EXPOSE" | "CMD" | "ENTRYPOINT" | "USER" | "SHELL" | "HEALTHCHECK"
            | "STOPSIGNAL" | "VOLUME" | "MAINTAINER" | "ONBUILD" => Ok(()),
            other => Err(format!("the Dockerfile's `{other}` is not understood")),
        };
        if let Err(why) = result {
            needs(why, &mut image);
        }
    }
    image
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
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
                out.push((op.to_uppercase(), arg.trim().to_owned()));
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

/// `COPY`/`ADD` from the build context (`environment/`) into the working directory.
fn copy(
    environment: &Path,
    (current, workdir): (&str, &str),
    op: &str,
    arg: &str,
    (files, copies): (&mut BTreeMap<String, String>, &mut Vec<FileCopy>),
) -> Result<(), String> {
    let words: Vec<String> = match serde_json::from_str::<Vec<String>>(arg) {
        Ok(list) => list,
        Err(_) => arg.split_whitespace().map(str::to_owned).collect(),
    };
    if let Some(flag) = words.iter().find(|w| w.starts_with("--from")) {
        return Err(format!("`{op} {flag}` copies from another build stage, which is not built here"));
    }
    let words: Vec<&String> = words.iter().filter(|w| !w.starts_with("--")).collect();
    let Some((dest, sources)) = words.split_last() else {
        return Err(format!("`{op} {arg}` names nothing to copy"));
    };
    let dest_abs = absolute(current, dest);
    let into_folder = dest.ends_with('/') || sources.len() > 1;
    for source in sources {
        if source.contains("://") || source.contains(['*', '?', '[']) {
            return Err(format!("`{op} {source}`: only files of environment/ are copied, by name"));
        }
        let from = environment.join(source);
        if !from.exists() {
            return Err(format!("`{op} {source}`: environment/{source} does not exist"));
        }
        let leaf = Path::new(source.as_str()).file_name().map(|n| n.to_string_lossy().into_owned());
        let base = match (from.is_dir(), into_folder, leaf) {
            (false, true, Some(leaf)) => format!("{dest_abs}/{leaf}"),
            _ => dest_abs.clone(),
        };
        let mut found = Vec::new();
        walk(&from, PathBuf::new(), &mut found).map_err(|e| format!("failed to read environment/{source}: {e}"))?;
        for (relative, path) in found {
            let target =
                if relative.as_os_str().is_empty() { base.clone() } else { format!("{base}/{}", relative.display()) };
            let Some(inside) = inside(workdir, &target) else {
                return Err(format!("`{op} {source}` puts files at `{target}`, outside WORKDIR `{workdir}`"));
            };
            let bytes = std::fs::read(&path).map_err(|e| format!("failed to read {}: {e}", path.display()))?;
            let executable = std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
            match String::from_utf8(bytes) {
                Ok(text) if !executable => {
                    copies.retain(|c| c.to != inside);
                    files.insert(inside, text);
                }
                // Bytes and permissions as they are; the digest covers environment/ whole.
                _ => {
                    files.remove(&inside);
                    copies.retain(|c| c.to != inside);
                    copies.push(FileCopy { from: path.clone(), to: inside });
                }
            }
        }
    }
    Ok(())
}

/// The files under `path` (itself, when it is a file), each with its path below `path`.
fn walk(path: &Path, relative: PathBuf, out: &mut Vec<(PathBuf, PathBuf)>) -> std::io::Result<()> {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            walk(&entry.path(), relative.join(entry.file_name()), out)?;
        }
    } else {
        out.push((relative, path.to_owned()));
    }
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

fn read_text(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ConfigError::whole(path, "missing: a Harbor task directory needs it"),
        _ => ConfigError::whole(path, format!("failed to read: {e}")),
    })
}

fn check_executable(path: &Path, what: &str) -> Result<(), ConfigError> {
    let meta = std::fs::metadata(path)
        .map_err(|_| ConfigError::whole(path, format!("missing: {what} of a Harbor task (tests/test.sh)")))?;
    if !meta.is_file() {
        return Err(ConfigError::whole(path, format!("{what} must be a file")));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(ConfigError::whole(path, format!("{what} is not executable (chmod +x it)")));
    }
    Ok(())
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

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Adds every file below `dir` (names and contents, in name order) to the digest.
fn hash_folder(hasher: &mut Sha256, dir: &Path) {
    let mut found = Vec::new();
    if walk(dir, PathBuf::new(), &mut found).is_ok() {
        for (relative, path) in found {
            hasher.update(relative.to_string_lossy().as_bytes());
            hasher.update(std::fs::read(&path).unwrap_or_default());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerfile_instructions_join_continued_lines() {
        let text =
            "FROM ubuntu:24.04\n# a comment\nRUN apt-get update && \\\n    apt-get install -y git\nWORKDIR /app\n";
        let got = instructions(text);
        assert_eq!(got[1].0, "RUN");
        assert!(got[1].1.contains("apt-get install -y git"), "{got:?}");
        assert_eq!(got[2], ("WORKDIR".into(), "/app".into()));
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
