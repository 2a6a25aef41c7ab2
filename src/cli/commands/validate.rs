//! `runner validate`.

use std::path::PathBuf;

use crate::cli::{CliError, Exit, outln, resolve};
use crate::suite;

/// `runner validate`: every file is checked; any bad one fails the command.
pub fn validate(paths: &[PathBuf], build: bool) -> Result<Exit, CliError> {
    let files = resolve::suite_files(paths)?;
    let mut ok = true;
    let mut names: Vec<(String, PathBuf)> = Vec::new();
    let mut loaded = Vec::new();
    // Each task is checked and let go: a suite of a million rows is checked in the memory of one.
    let options = suite::LoadOptions { check_only: true, ..Default::default() };
    for file in &files {
        match suite::load_with(file, options) {
            Ok(s) if !s.ungraded.is_empty() => {
                // `eval` refuses these unless --grader names a model; validate has no --grader.
                ok = false;
                for e in &s.ungraded {
                    eprintln!("error: {e}");
                }
            }
            Ok(s) => {
                if let Some((_, other)) = names.iter().find(|(name, _)| *name == s.name) {
                    ok = false;
                    eprintln!(
                        "error: {}: suite name `{}` is already used by {}",
                        file.display(),
                        s.name,
                        other.display()
                    );
                    continue;
                }
                outln!(
                    "ok  {}  suite `{}`: {} tasks, environment `{}`",
                    file.display(),
                    s.name,
                    s.tasks.len() + s.tasks_checked,
                    s.environment.name
                );
                for task in &s.tasks {
                    if let Some(why) = &task.unavailable {
                        outln!("    task `{}` cannot run here, its episodes will be unscored: {why}", task.id);
                    }
                }
                names.push((s.name.clone(), file.clone()));
                loaded.push(std::sync::Arc::new(s));
            }
            Err(e) => {
                ok = false;
                eprintln!("error: {e}");
            }
        }
    }
    let registries = || crate::model::config::ModelConfig::load(None).map(|c| c.images).map_err(CliError::usage);
    if build && !resolve::prepare_images(&loaded, &registries()?, crate::image::ProviderName::Rootfs)?.is_empty() {
        ok = false;
    }
    Ok(if ok { Exit::Passed } else { Exit::Usage })
}
