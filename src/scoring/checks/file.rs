//! `file_exists` and `file_contains`: a file of the final world (a `kv` key, a writing
//! room's document or export), read through the world's files.

use super::{CheckResult, FILE_SCAN_CAP, Scene, text, verdict};
use crate::domain::scorer::TextOp;
use crate::scoring::ScoringFault;

/// `path` exists in the final world.
pub(crate) async fn exists(scene: &Scene<'_>, path: &str) -> Result<CheckResult, ScoringFault> {
    Ok(match scene.read_back(path, 0).await? {
        Ok(_) => verdict(true, format!("`{path}` exists")),
        Err(why) => verdict(false, why),
    })
}

/// `path` contains `expected` (a template), or matches it as a regex; only the start of a
/// large file is searched, and the explanation says so.
pub(crate) async fn contains(
    scene: &Scene<'_>,
    path: &str,
    expected: &str,
    regex: bool,
) -> Result<CheckResult, ScoringFault> {
    let file = match scene.read_back(path, FILE_SCAN_CAP).await? {
        Ok(file) => file,
        Err(why) => return Ok(verdict(false, why)),
    };
    let expected = match scene.render(expected) {
        Ok(e) => e,
        Err(failed) => return Ok(failed),
    };
    let op = if regex { TextOp::Regex } else { TextOp::Includes };
    let searched = if file.is_cut() {
        format!(" (`{path}` has {} bytes; only the first {} were searched)", file.size, file.text.len())
    } else {
        String::new()
    };
    Ok(match text::matches(op, &file.text, &expected, false) {
        Ok(true) => verdict(true, format!("`{path}` contains {expected:?}{searched}")),
        Ok(false) => verdict(false, format!("`{path}` does not contain {expected:?}{searched}")),
        Err(e) => verdict(false, e),
    })
}
