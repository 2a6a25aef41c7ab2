//! Finding a real `python3` (not a shim that only works outside the sandbox), for the
//! `python` kind and for `execute_code`'s scripts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::Deserialize;
use tokio::process::Command;

/// What the probe prints: the real interpreter behind whatever was found, and its version.
const PROBE: &str = "import json, sys; print(json.dumps({'executable': sys.executable, \
    'version': sys.version.split()[0], 'release': list(sys.version_info[:2]), \
    'prefix': sys.prefix, 'base_prefix': sys.base_prefix}))";

/// The oldest Python the driver runs on.
const OLDEST: (u32, u32) = (3, 8);

/// How long an interpreter may take to answer the probe.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A Python interpreter that answered the probe.
#[derive(Debug)]
pub struct Interpreter {
    /// The interpreter itself (`sys.executable`), not a shim or wrapper that found it.
    pub executable: PathBuf,
    pub version: String,
    /// Its installation, which the sandbox must let it read.
    pub readable: Vec<PathBuf>,
}

#[derive(Deserialize)]
struct Probed {
    executable: PathBuf,
    version: String,
    release: (u32, u32),
    prefix: PathBuf,
    base_prefix: PathBuf,
}

/// Finds the interpreter: `configured` (an environment file's `python:`; a bare name is
/// looked up on `PATH`), else the first `python3` on `PATH` that answers. Each candidate
/// is run once, outside the sandbox, to learn where the real interpreter is (a pyenv shim
/// is a script that needs `$HOME`, which the sandbox hides); what was found is kept for
/// the rest of the process.
pub async fn find(configured: Option<&Path>) -> Result<Arc<Interpreter>, String> {
    static FOUND: OnceLock<Mutex<BTreeMap<Option<PathBuf>, Arc<Interpreter>>>> = OnceLock::new();
    let found = FOUND.get_or_init(Default::default);
    let key = configured.map(Path::to_path_buf);
    let known = found.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
    if let Some(interpreter) = known {
        return Ok(interpreter);
    }
    let hint = "install Python 3, or set `python: /path/to/python3` in the environment file";
    let (candidates, looked_for) = match configured {
        Some(path) if path.components().count() > 1 => {
            if !path.exists() {
                return Err(format!(
                    "the Python interpreter `{}` (the environment file's `python:`) does not exist",
                    path.display()
                ));
            }
            (vec![path.to_path_buf()], format!("`{}` (the environment file's `python:`)", path.display()))
        }
        Some(name) => (on_path(name), format!("`{}` (the environment file's `python:`) on PATH", name.display())),
        None => (on_path(Path::new("python3")), "`python3` on PATH".to_owned()),
    };
    if candidates.is_empty() {
        return Err(format!("found no {looked_for}: {hint}"));
    }
    let mut failures = Vec::new();
    for candidate in candidates {
        match probe(&candidate).await {
            Ok(interpreter) => {
                let interpreter = Arc::new(interpreter);
                found.lock().unwrap_or_else(|p| p.into_inner()).insert(key, interpreter.clone());
                return Ok(interpreter);
            }
            Err(e) => failures.push(format!("`{}` {e}", candidate.display())),
        }
    }
    Err(format!("no usable {looked_for}: {}; {hint}", failures.join("; ")))
}

/// Every executable file called `name` in the folders of `PATH`, in order.
fn on_path(name: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
        .collect()
}

async fn probe(candidate: &Path) -> Result<Interpreter, String> {
    let mut command = Command::new(candidate);
    command
        .args(["-E", "-s", "-c", PROBE])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(START_TIMEOUT, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => return Err(format!("could not be run: {e}")),
        Err(_) => return Err(format!("did not answer within {}s", START_TIMEOUT.as_secs())),
    };
    if !output.status.success() {
        let said: String = String::from_utf8_lossy(&output.stderr).trim().chars().take(500).collect();
        return Err(format!("failed ({}): {said}", output.status));
    }
    let probed: Probed =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("is not a Python the runner understands ({e})"))?;
    if probed.release < OLDEST || probed.executable.as_os_str().is_empty() {
        return Err(format!("is Python {}; {}.{} or later is needed", probed.version, OLDEST.0, OLDEST.1));
    }
    let mut readable = Vec::new();
    let real = probed.executable.canonicalize().ok();
    let folder = real.as_deref().and_then(Path::parent).map(Path::to_path_buf);
    let home = std::env::var_os("HOME").map(PathBuf::from).and_then(|h| h.canonicalize().ok());
    for path in [Some(probed.prefix), Some(probed.base_prefix), folder].into_iter().flatten() {
        // The whole file system is never opened up for an interpreter installed at `/`,
        // nor a home folder (keys, tokens) for one installed right in it.
        if home.as_ref().is_some_and(|h| h.starts_with(&path)) {
            return Err(format!(
                "is installed in `{}`, which holds the home folder: the sandbox would have to open it all; \
                 install it elsewhere or set `python:` to another interpreter",
                path.display()
            ));
        }
        if path.parent().is_some() && !readable.contains(&path) {
            readable.push(path);
        }
    }
    Ok(Interpreter { executable: probed.executable, version: probed.version, readable })
}
