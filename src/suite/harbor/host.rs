//! The host standing in for a Harbor task's image (`image: host` in the task's
//! `runner.yaml`): nothing of Docker runs. The Dockerfile is read for what it puts in the
//! working directory (`COPY` from `environment/` under `WORKDIR`) and what it needs of the
//! host (its base image, the programs it installs); a task that needs what is not here is
//! loaded with the reason (`Task::unavailable`), and its episodes are unscored
//! (`environment_error`), never failed. The container's paths in the task's texts are
//! mapped into the episode's folder.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use super::super::task_folder::{ContextFile, CopyError, TaskFolder, files_under};
use super::TEXT_FILE_CAP;
use crate::config::decode::ConfigError;
use crate::config::yaml::Position;
use crate::domain::FileCopy;
use crate::environment::beneath::{Beneath, Links};
use crate::sandbox::process::find_program;

/// Where the agent starts when the Dockerfile names no `WORKDIR` (Harbor's tasks use it).
const DEFAULT_WORKDIR: &str = "/app";

/// What the Dockerfile gives the working directory, and why the task cannot run here.
pub(super) struct Image {
    pub workdir: String,
    pub files: BTreeMap<String, String>,
    /// The files copied as they are: not text, or executable.
    pub copies: Vec<FileCopy>,
    pub unavailable: Option<String>,
}

/// Reads `environment/Dockerfile` for its `WORKDIR`, the files it copies there, and what
/// it needs that this host lacks (the first such thing is the reason). A copy that would
/// reach out of `environment/` is refused at its line.
pub(super) fn read_image(folder: &TaskFolder, dir: &Path, docker_image: Option<&str>) -> Result<Image, ConfigError> {
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
}
