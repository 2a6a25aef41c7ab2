//! `check:`: a shell command, run in the final world's working directory, exits 0.

use std::time::Duration;

use super::{CheckResult, Scene, verdict, world_fault};
use crate::scoring::ScoringFault;

/// How long past its own timeout a `check:` may take to be stopped and report.
const CHECK_GRACE: Duration = Duration::from_secs(2);

/// `command` exits 0 within `timeout_s` (and within the episode's time limit).
pub(crate) async fn check(scene: &Scene<'_>, command: &str, timeout_s: f64) -> Result<CheckResult, ScoringFault> {
    // run_check stops the command at its timeout and says so; the outer bound, a little
    // later, is for a world whose check would not start or end at all.
    let limit = timeout_s.min(scene.episode.world_limit.as_secs_f64());
    let bound = Duration::from_secs_f64(limit) + CHECK_GRACE;
    let ran = tokio::time::timeout(bound, scene.world.run_check(command, limit)).await;
    Ok(match ran {
        Ok(Ok((0, _))) => verdict(true, format!("`{command}` exited 0")),
        Ok(Ok((code, output))) => {
            let tail: String = output.chars().rev().take(300).collect::<Vec<_>>().into_iter().rev().collect();
            verdict(false, format!("`{command}` exited {code}: {}", tail.trim()))
        }
        Ok(Err(failure)) => {
            world_fault(&failure)?;
            verdict(false, format!("`{command}` could not run: {}", failure.message))
        }
        Err(_) => verdict(false, format!("`{command}` did not end within {}s", limit)),
    })
}
