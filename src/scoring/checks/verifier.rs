//! `verifier`: a Harbor task's `tests/test.sh`, run in the final world once the agent is
//! done; the reward it writes (`/logs/verifier/reward.txt` or `reward.json`) is the score.
//! A verifier that crashes or writes no reward leaves the episode unscored
//! (`verifier_error`), never 0.
//!
//! Before it runs, the task's `tests/` is copied to `.harbor/tests` in the working
//! directory (the agent never saw it), anything the agent left under `.harbor` is removed,
//! and the container's paths in the copied text files are mapped into the episode's folder
//! (`domain::harbor`).
//!
//! A Harbor verifier often installs its own tools first (`apt-get install curl`, the `uv`
//! installer, then `uvx pytest`) and writes 0 whenever its test command fails, so a verifier
//! that could not find a program would turn a host's lack into a failure. Bash calls a
//! `command_not_found_handle` it finds in `BASH_ENV`: the verifier runs with one that notes
//! each missing program, and a verifier that missed one leaves the episode unscored
//! (`environment_error`, naming the programs) whatever reward it wrote.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{CheckResult, world_fault};
use crate::domain::harbor::{HARBOR_DIR, map_paths};
use crate::environment::beneath::{Beneath, Links};
use crate::environment::{World, read_regular, remove_tree};

mod in_image;
use crate::log::UnscoredCause;
use crate::scoring::ScoringFault;

/// How long past its own timeout a verifier may take to be stopped and report.
const GRACE: Duration = Duration::from_secs(2);

/// The largest reward file read: a number, or a small JSON object.
const REWARD_CAP: u64 = 64 * 1024;

/// A verifier as the task gives it.
pub(crate) struct Verifier<'a> {
    pub tests: &'a str,
    pub workdir: &'a str,
    pub timeout_s: f64,
    pub env: &'a BTreeMap<String, String>,
}

pub(crate) async fn check(world: &dyn World, verifier: &Verifier<'_>) -> Result<CheckResult, ScoringFault> {
    if let Some(image) = world.files().and_then(|files| files.image_root()) {
        return in_image::check(world, &image, verifier).await;
    }
    let root = working_directory(world)?;
    let harbor = root.join(HARBOR_DIR);
    let prepared = prepare(&harbor, &root, verifier)
        .map_err(|e| fault(format!("failed to copy the task's tests into the final world: {e}")))?;
    let script = prepared.join("test.sh");
    let missing_list = harbor.join(MISSING_LIST);
    let bash_env = harbor.join("bash_env.sh");
    std::fs::write(&bash_env, not_found_handler(&missing_list))
        .map_err(|e| fault(format!("failed to prepare the verifier's shell: {e}")))?;
    let mut command = format!("export BASH_ENV={}; ", shell_quote(&bash_env.to_string_lossy()));
    for (name, value) in verifier.env {
        command.push_str(&format!("export {name}={}; ", shell_quote(value)));
    }
    command.push_str(&shell_quote(&script.to_string_lossy()));
    let how = run_test(world, &command, verifier.timeout_s).await?;
    let missing = missing_programs(&root, &Path::new(HARBOR_DIR).join(MISSING_LIST));
    if !missing.is_empty() {
        return Err(ScoringFault::new(
            UnscoredCause::EnvironmentError,
            format!(
                "the task cannot be verified here: tests/test.sh ran {}, which this host lacks ({how})",
                missing.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let folder = Beneath::open(&root).map_err(|e| fault(format!("failed to open the final world: {e}")))?;
    verdict(read_reward(&folder, &Path::new(HARBOR_DIR).join("logs/verifier")), &how)
}

/// The verdict from the reward read (`how` the verifier ended, for the explanation).
fn verdict(read: Result<Option<(f64, &'static str)>, String>, how: &str) -> Result<CheckResult, ScoringFault> {
    match read {
        Ok(Some((reward, file))) if (0.0..=1.0).contains(&reward) => {
            let passed = reward >= 1.0;
            Ok(CheckResult::valued(passed, reward, format!("tests/test.sh wrote reward {reward} to {file} ({how})")))
        }
        Ok(Some((reward, file))) => {
            Err(fault(format!("tests/test.sh wrote reward {reward} to {file}, outside 0 to 1 ({how})")))
        }
        Ok(None) => {
            Err(fault(format!("tests/test.sh wrote no reward (/logs/verifier/reward.txt or reward.json): {how}")))
        }
        Err(why) => Err(fault(format!("tests/test.sh's reward could not be read: {why} ({how})"))),
    }
}

/// Runs the verifier's `command` in the final world within `timeout_s`; how it ended, for
/// the explanation. A fault of the world itself is the check's fault.
async fn run_test(world: &dyn World, command: &str, timeout_s: f64) -> Result<String, ScoringFault> {
    let bound = Duration::from_secs_f64(timeout_s) + GRACE;
    let ran = tokio::time::timeout(bound, world.run_check(command, timeout_s)).await;
    Ok(match &ran {
        Ok(Ok((code, output))) => format!("it exited {code}{}", tail(output)),
        Ok(Err(failure)) => {
            world_fault(failure)?;
            format!("it could not run: {}", failure.message)
        }
        Err(_) => format!("it did not end within {timeout_s}s"),
    })
}

/// Where the verifier's shell notes the programs it could not find, under `.harbor`.
const MISSING_LIST: &str = "logs/missing-programs";

/// The `BASH_ENV` script of the verifier's shell: a program bash cannot find is noted in
/// `list`, then reported as bash would (exit 127).
fn not_found_handler(list: &Path) -> String {
    format!(
        "command_not_found_handle() {{\n  printf '%s\\n' \"$1\" >> {}\n  printf 'bash: %s: command not found\\n' \"$1\" >&2\n  return 127\n}}\n",
        shell_quote(&list.to_string_lossy())
    )
}

/// The distinct programs the verifier's shell could not find, in the order it tried them.
/// Read beneath the working directory `root` through no link (the verifier's own code, or
/// the agent's that it ran, may have put one there).
fn missing_programs(root: &Path, list: &Path) -> Vec<String> {
    let Ok(Some(bytes)) = read_regular(root, list, REWARD_CAP) else { return Vec::new() };
    let text = String::from_utf8_lossy(&bytes);
    let mut seen: Vec<String> = Vec::new();
    for name in text.lines().map(str::trim).filter(|n| !n.is_empty()) {
        if !seen.iter().any(|s| s == name) {
            seen.push(cut(name));
        }
    }
    seen
}

fn fault(message: String) -> ScoringFault {
    ScoringFault::new(UnscoredCause::VerifierError, message)
}

/// The final world's working directory on the host.
fn working_directory(world: &dyn World) -> Result<PathBuf, ScoringFault> {
    match world.files().and_then(|files| files.working_directory()) {
        Some(root) => Ok(root.to_owned()),
        None => Err(fault("the verifier needs a world whose files are a folder (the `shell` kind)".into())),
    }
}

/// Makes `.harbor` anew (`logs/verifier`, `logs/agent`, `tests`) and copies the task's
/// tests into it, their container paths mapped; the copied `tests` folder.
fn prepare(harbor: &Path, root: &Path, verifier: &Verifier<'_>) -> std::io::Result<PathBuf> {
    remove_tree(harbor)?;
    std::fs::create_dir_all(harbor.join("logs/verifier"))?;
    std::fs::create_dir_all(harbor.join("logs/agent"))?;
    let (logs, tests, root_text) = (
        harbor.join("logs").to_string_lossy().into_owned(),
        harbor.join("tests").to_string_lossy().into_owned(),
        root.to_string_lossy().into_owned(),
    );
    let mappings = [("/logs", logs.as_str()), ("/tests", tests.as_str()), (verifier.workdir, root_text.as_str())];
    copy_mapped(Path::new(verifier.tests), &harbor.join("tests"), &mappings)?;
    Ok(harbor.join("tests"))
}

/// Copies a folder, each UTF-8 file's text with its paths mapped, other files as they are,
/// keeping each file's permissions. Links are not followed.
fn copy_mapped(from: &Path, to: &Path, mappings: &[(&str, &str)]) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        if kind.is_dir() {
            copy_mapped(&source, &target, mappings)?;
        } else if kind.is_file() {
            let bytes = std::fs::read(&source)?;
            match String::from_utf8(bytes) {
                Ok(text) => std::fs::write(&target, map_paths(&text, mappings))?,
                Err(raw) => std::fs::write(&target, raw.into_bytes())?,
            }
            std::fs::set_permissions(&target, entry.metadata()?.permissions())?;
        }
    }
    Ok(())
}

/// The reward in `reward.txt` (a number) or `reward.json` (`{"reward": x}`, or an object
/// with one number), with the file's name; `None` when neither exists.
/// Read beneath `root` (the working directory, or an image's root), through no link, each
/// file at most [`REWARD_CAP`] bytes.
fn read_reward(root: &Beneath, dir: &Path) -> Result<Option<(f64, &'static str)>, String> {
    for name in ["reward.txt", "reward.json"] {
        let bytes = match root.read(&dir.join(name), Links::None, REWARD_CAP) {
            Ok(Some((bytes, _))) => bytes,
            Ok(None) => continue,
            Err(e) => return Err(format!("{name}: {e}")),
        };
        let text = String::from_utf8(bytes).map_err(|_| format!("{name} is not text"))?;
        let reward = if name == "reward.txt" {
            text.trim().parse::<f64>().map_err(|_| format!("{name} holds {:?}, not a number", cut(text.trim())))?
        } else {
            json_reward(&text).map_err(|why| format!("{name}: {why}"))?
        };
        if !reward.is_finite() {
            return Err(format!("{name} holds {reward}, not a finite number"));
        }
        return Ok(Some((reward, name)));
    }
    Ok(None)
}

fn json_reward(text: &str) -> Result<f64, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
    if let Some(reward) = value.get("reward") {
        return reward.as_f64().ok_or_else(|| format!("`reward` is {reward}, not a number"));
    }
    match value.as_object().map(|o| o.values().filter_map(|v| v.as_f64()).collect::<Vec<_>>()) {
        Some(numbers) if numbers.len() == 1 => Ok(numbers[0]),
        _ => Err("expected {\"reward\": NUMBER} or an object with one number".into()),
    }
}

fn cut(text: &str) -> String {
    text.chars().take(80).collect()
}

/// The last few hundred characters of a command's output, for an explanation.
fn tail(output: &str) -> String {
    let kept: String = output.chars().rev().take(300).collect::<Vec<_>>().into_iter().rev().collect();
    match kept.trim() {
        "" => String::new(),
        text => format!(": {text}"),
    }
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reward_in(name: &str, text: &str) -> Result<Option<(f64, &'static str)>, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::write(dir.path().join(name), text).map_err(|e| e.to_string())?;
        read_reward(&Beneath::open(dir.path()).map_err(|e| e.to_string())?, Path::new("."))
    }

    #[test]
    fn a_reward_is_a_number_or_one_number_in_json_and_nothing_else() {
        assert_eq!(reward_in("reward.txt", " 0.5\n"), Ok(Some((0.5, "reward.txt"))));
        assert_eq!(reward_in("reward.json", r#"{"reward": 1}"#), Ok(Some((1.0, "reward.json"))));
        assert_eq!(reward_in("reward.json", r#"{"accuracy": 0.25}"#), Ok(Some((0.25, "reward.json"))));
        assert!(reward_in("reward.txt", "passed").unwrap_err().contains("not a number"));
        assert!(reward_in("reward.json", r#"{"a": 1, "b": 0}"#).unwrap_err().contains("one number"));
        assert!(reward_in("reward.txt", "NaN").unwrap_err().contains("not a finite number"));
        assert_eq!(reward_in("other.txt", "1"), Ok(None));
    }
}
