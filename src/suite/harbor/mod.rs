//! Harbor task directories as suites: `task.toml`, `instruction.md`, `environment/`,
//! `tests/test.sh`, `solution/solve.sh`. Each directory is a suite of one task, run in the
//! sandboxed `shell` world, scored by its verifier (`scoring/checks/verifier.rs`).
//!
//! A task runs in its own image, as Harbor runs it: `environment/Dockerfile` built by runner
//! (`[environment] docker_image` pulled instead when given), each episode on its own copy of
//! it, the task's paths its own. `image: host` in the task's `runner.yaml` runs it on the
//! host instead (`host.rs`). The task's timeouts, resources and network become the suite's
//! time limit and the `shell` world's sandbox.

mod host;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::task_folder::TaskFolder;
use super::{AgentConfig, Suite};
use crate::budget::{EpisodeLimits, Limits};
use crate::config::decode::{ConfigError, Source};
use crate::config::yaml::Position;
use crate::domain::harbor::map_paths;
use crate::domain::scorer::{Check, ScorerSpec};
use crate::domain::{FileCopy, MAX_EPISODE_S, MockTurn, Reducer, Task};
use crate::environment::Definition;
use crate::environment::beneath::{Beneath, Kind, Links};
use crate::environment::kinds::KindSettings;
use crate::environment::kinds::shell::image::ShellImage;
use crate::environment::permission::Permissions;
use crate::image::{BuildSpec, ImageSource};
use crate::log::event::LimitOverrides;
use crate::sandbox::{ProcessLimits, SandboxMode, SandboxSpec};

/// The file that makes a folder a Harbor task directory.
pub const TASK_FILE: &str = "task.toml";

/// The largest copied file kept as text in the task; a larger one is copied as it is.
const TEXT_FILE_CAP: u64 = 1 << 20;

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
    /// `host`: the host stands in for the task's image; or a reference to run it in instead
    /// of what `task.toml` and the Dockerfile say.
    #[serde(default)]
    image: Option<String>,
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
    let resources = Resources::of(&config, &toml_path, &toml_text)?;
    let instruction_path = dir.join("instruction.md");
    let instruction =
        required(folder.text(dir, "instruction.md")?, &instruction_path, "a Harbor task states its instruction here")?;
    let tests = folder.folder(dir, "tests")?;
    check_executable(&folder, dir, "tests/test.sh", "the verifier")?;
    let runner = runner_file(&folder, dir)?;
    let placed = match image_of(&folder, dir, &config, runner.image.as_deref())? {
        Some(source) => in_image(&folder, dir, &instruction, source)?,
        None => on_host(&folder, dir, &instruction, config.environment.docker_image.as_deref())?,
    };
    let tests = required(tests, &dir.join("tests"), "a Harbor task's verifier lives here")?;
    let scorer = ScorerSpec {
        name: "verifier".into(),
        check: Check::Verifier {
            tests: tests.to_string_lossy().into_owned(),
            workdir: placed.workdir.clone(),
            timeout_s: resources.verifier_s,
            env: config.verifier.env.clone(),
        },
        weight: 1.0,
        from: None,
        recorded: Default::default(),
    };
    let mut metadata = config.metadata.clone();
    let env = &config.environment;
    let mut harbor = json!({"workdir": placed.workdir, "agent_timeout_s": resources.agent_s,
        "verifier_timeout_s": resources.verifier_s, "cpus": env.cpus, "memory_mb": resources.memory_mb,
        "storage_mb": resources.storage_mb, "allow_internet": env.allow_internet.unwrap_or(true)});
    if let Some(image) = &placed.image {
        harbor["image"] = json!(image.name());
    }
    metadata.insert("harbor".into(), harbor);
    let digest = {
        let mut hasher = Sha256::new();
        hasher.update(json!({"input": placed.input, "files": placed.files, "metadata": metadata}).to_string());
        folder.hash(&mut hasher, "tests");
        folder.hash(&mut hasher, "environment");
        folder.hash(&mut hasher, "solution");
        hex::encode(hasher.finalize())
    };
    let task = Task {
        files: placed.files,
        copies: placed.copies,
        metadata,
        scorers: vec![scorer],
        mock: runner.mock.into(),
        digest: digest.clone(),
        solution: placed.solution,
        unavailable: placed.unavailable,
        ..Task::new(&name, &placed.input)
    };
    let mut environment = world(&resources, env.cpus, env.allow_internet);
    if let Some(source) = placed.image {
        environment.settings = KindSettings::Image(Arc::new(ShellImage::new(source)));
    }
    let limits = Limits { time_s: resources.agent_s, ..Limits::default() }.resolved(overrides);
    Ok(suite_of(&name, dir, digest, environment, limits, task))
}

/// The suite of one task.
fn suite_of(
    name: &str,
    dir: &Path,
    digest: String,
    environment: Definition,
    limits: EpisodeLimits,
    task: Task,
) -> Suite {
    Suite {
        name: format!("harbor/{name}"),
        share_epochs: false,
        version: 1,
        description: format!("Harbor task {name}"),
        path: dir.to_owned(),
        digest,
        environment: Arc::new(environment),
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
        tasks_checked: 0,
        ungraded: Vec::new(),
        toolsets: Vec::new(),
        variants: Vec::new(),
        providers: Vec::new(),
        endpoints: Default::default(),
        skipped: Vec::new(),
    }
}

/// What `task.toml` gives the episode: its timeouts and its resources, checked.
struct Resources {
    agent_s: f64,
    verifier_s: f64,
    memory_mb: u64,
    storage_mb: u64,
}

impl Resources {
    fn of(config: &TaskToml, toml_path: &Path, toml_text: &str) -> Result<Self, ConfigError> {
        let timeouts =
            [("agent.timeout_sec", config.agent.timeout_sec), ("verifier.timeout_sec", config.verifier.timeout_sec)];
        let build = [("environment.build_timeout_sec", config.environment.build_timeout_sec)];
        for (field, value) in timeouts.into_iter().chain(build) {
            if let Some(s) = value
                && !(s.is_finite() && s > 0.0 && s <= MAX_EPISODE_S)
            {
                return Err(toml_field(
                    toml_path,
                    toml_text,
                    field,
                    format!("must be a positive number of seconds, at most {MAX_EPISODE_S}, got {}", shown(s)),
                ));
            }
        }
        for name in config.verifier.env.keys() {
            if !is_variable_name(name) {
                let message = format!("`{name}` is not a variable name (letters, digits and `_`)");
                return Err(toml_field(toml_path, toml_text, "verifier.env", message));
            }
        }
        let env = &config.environment;
        let memory_mb = size_mb(toml_path, toml_text, "environment.memory", env.memory.as_deref(), env.memory_mb)?
            .unwrap_or(DEFAULT_MEMORY_MB);
        let storage_mb = size_mb(toml_path, toml_text, "environment.storage", env.storage.as_deref(), env.storage_mb)?
            .unwrap_or(DEFAULT_STORAGE_MB);
        if let Some(cpus) = env.cpus
            && !(cpus.is_finite() && cpus > 0.0)
        {
            return Err(toml_field(toml_path, toml_text, "environment.cpus", format!("must be positive, got {cpus}")));
        }
        Ok(Resources {
            agent_s: config.agent.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_S),
            verifier_s: config.verifier.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_S),
            memory_mb,
            storage_mb,
        })
    }
}

/// The task's `runner.yaml`, when it has one.
fn runner_file(folder: &TaskFolder, dir: &Path) -> Result<RunnerFile, ConfigError> {
    match folder.text(dir, "runner.yaml")? {
        Some(text) => {
            let source = Source::parse(&dir.join("runner.yaml"), &text)?;
            source.decode::<RunnerFile>("", &source.value)
        }
        None => Ok(RunnerFile { mock: Vec::new(), image: None }),
    }
}

/// The image the task runs in: `runner.yaml`'s `image:` (`host`: none), else task.toml's
/// `docker_image`, else its Dockerfile built; none when it has no Dockerfile.
fn image_of(
    folder: &TaskFolder,
    dir: &Path,
    config: &TaskToml,
    chosen: Option<&str>,
) -> Result<Option<ImageSource>, ConfigError> {
    match chosen.map(str::trim) {
        Some("host") => return Ok(None),
        Some(reference) if reference.is_empty() || reference.contains(char::is_whitespace) => {
            let why = format!("`image: {reference}` is not an image reference (`name:tag`, or `host`)");
            return Err(ConfigError::whole(&dir.join("runner.yaml"), why));
        }
        Some(reference) => return Ok(Some(ImageSource::Pull(reference.to_owned()))),
        None => {}
    }
    if let Some(reference) = &config.environment.docker_image {
        return Ok(Some(ImageSource::Pull(reference.clone())));
    }
    match folder.stat(dir, "environment/Dockerfile")? {
        Some(_) => Ok(Some(ImageSource::Build(BuildSpec {
            context: folder.path().join("environment"),
            dockerfile: folder.path().join("environment/Dockerfile"),
            args: BTreeMap::new(),
            timeout_s: config.environment.build_timeout_sec,
        }))),
        None => Ok(None),
    }
}

/// Where the task runs and what that makes of its texts.
struct Placed {
    input: String,
    /// The working folder as the task's paths name it (`/app`); empty in an image, whose
    /// working folder its build says.
    workdir: String,
    files: BTreeMap<String, String>,
    copies: Vec<FileCopy>,
    solution: Vec<String>,
    unavailable: Option<String>,
    image: Option<ImageSource>,
}

/// The task in its image: its texts as they are; the oracle copies `solution/` to
/// `/solution` (made for it, the image's user's) and runs `solve.sh` there, as Harbor's.
fn in_image(folder: &TaskFolder, dir: &Path, instruction: &str, source: ImageSource) -> Result<Placed, ConfigError> {
    let mut unavailable = None;
    for compose in ["docker-compose.yaml", "docker-compose.yml"] {
        if folder.stat(dir, &format!("environment/{compose}"))?.is_some() {
            unavailable.get_or_insert(format!("the task needs the services of environment/{compose}"));
        }
    }
    let solution = match folder.beneath(dir, "solution")? {
        Some(solution) if folder.stat(dir, "solution/solve.sh")?.is_some() => {
            let mut commands =
                copy_solution(&solution).map_err(|why| ConfigError::whole(&dir.join("solution"), why))?;
            commands.push("bash /solution/solve.sh".into());
            commands
        }
        _ => Vec::new(),
    };
    Ok(Placed {
        input: instruction.to_owned(),
        workdir: String::new(),
        files: BTreeMap::new(),
        copies: Vec::new(),
        solution,
        unavailable,
        image: Some(source),
    })
}

/// The task on the host, which stands in for its image (`host.rs`): the container's
/// working folder in its texts mapped to the episode's.
fn on_host(
    folder: &TaskFolder,
    dir: &Path,
    instruction: &str,
    docker_image: Option<&str>,
) -> Result<Placed, ConfigError> {
    let image = host::read_image(folder, dir, docker_image)?;
    let workdir = image.workdir.clone();
    let input = map_paths(instruction, &[(workdir.as_str(), ".")]);
    let solution = folder
        .text(dir, "solution/solve.sh")?
        .map(|text| vec![format!("bash -c {}", shell_quote(&map_paths(&text, &[(workdir.as_str(), "$HOME")])))])
        .unwrap_or_default();
    Ok(Placed {
        input,
        workdir,
        files: image.files,
        copies: image.copies,
        solution,
        unavailable: image.unavailable,
        image: None,
    })
}

/// Commands that write the solution's files under `/solution` with their modes, each
/// file's bytes given to `printf` (octal escapes where needed, so any byte survives the
/// shell and no program beyond `sh` is needed), each command below the kernel's bound on
/// one argument. A link or a device in `solution/` is refused.
fn copy_solution(solution: &Beneath) -> Result<Vec<String>, String> {
    let mut files = Vec::new();
    let mut refused = None;
    solution
        .walk(Path::new(""), 10_000, 64, |path, entry| match entry.kind {
            Kind::File => {
                files.push(path.to_owned());
                true
            }
            Kind::Dir => true,
            Kind::Link | Kind::Other => {
                refused = Some(format!("solution/{} is not a file or a folder", path.display()));
                false
            }
        })
        .map_err(|e| format!("failed to read solution/: {e}"))?;
    if let Some(why) = refused {
        return Err(why);
    }
    let mut commands = vec![String::from("mkdir -p /solution")];
    let mut total = 0u64;
    for path in files {
        let Some((bytes, mode)) =
            solution.read(&path, Links::None, SOLUTION_CAP).map_err(|e| format!("solution/{}: {e}", path.display()))?
        else {
            continue;
        };
        total += bytes.len() as u64;
        if total > SOLUTION_CAP {
            return Err(format!("the solution's files hold more than {SOLUTION_CAP} bytes"));
        }
        let target = shell_quote(&Path::new("/solution").join(&path).to_string_lossy());
        let parent =
            shell_quote(&Path::new("/solution").join(&path).parent().unwrap_or(Path::new("/")).to_string_lossy());
        commands.push(format!("set -e; mkdir -p {parent}; : > {target}; chmod {mode:o} {target}"));
        for chunk in bytes.chunks(SOLUTION_CHUNK) {
            commands.push(format!("set -e; printf '{}' >> {target}", printf_escaped(chunk)));
        }
    }
    Ok(commands)
}

/// Bytes as a `printf` format that prints them: letters and digits as they are, every
/// other byte as an octal escape.
fn printf_escaped(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b" .,_-/:=+".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\{b:03o}"));
        }
    }
    out
}

/// The bytes of a solution file one command writes: escaped, at most four times as many
/// characters, well below the kernel's 128 KiB bound on one argument.
const SOLUTION_CHUNK: usize = 16 * 1024;

/// The most the solution's files may hold together.
const SOLUTION_CAP: u64 = 16 << 20;

/// The `shell` world the task runs in: its commands may take as long as the task's
/// longest timeout, each process gets that many CPU seconds per CPU, the task's memory as
/// its address space, its storage as its largest file, and the network as it allows.
fn world(resources: &Resources, cpus: Option<f64>, internet: Option<bool>) -> Definition {
    let longest_s = resources.agent_s.max(resources.verifier_s);
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
            memory_mb: Some(resources.memory_mb.max(64)),
            file_size_mb: Some(resources.storage_mb.max(1)),
            ..defaults
        },
        ..SandboxSpec::default()
    });
    definition
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
    fn sizes_read_as_mib() {
        let p = Path::new("task.toml");
        assert_eq!(size_mb(p, "", "environment.memory", Some("4G"), None).unwrap(), Some(4096));
        assert_eq!(size_mb(p, "", "environment.memory", Some("512M"), None).unwrap(), Some(512));
        assert_eq!(size_mb(p, "", "environment.memory", None, Some(100)).unwrap(), Some(100));
        assert!(size_mb(p, "", "environment.memory", Some("lots"), None).is_err());
    }
}
