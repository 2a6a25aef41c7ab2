//! `runner tools`.

use std::path::Path;

use crate::cli::flags::Switch;
use crate::cli::{CliError, Exit, outln};

/// `runner tools ENV`: the tools an environment offers, as the agent is shown them (JSON).
/// An MCP environment's servers are started once to list theirs.
pub fn tools(environment: &str, sandbox: Switch) -> Result<Exit, CliError> {
    use crate::environment::definition::Definition;
    // Looked up as a suite in the current folder would: environments/NAME.yaml, a path, a kind.
    let definition = Definition::resolve(environment, Path::new("./tools")).map_err(CliError::usage)?;
    let mode = crate::cli::resolve::sandbox_mode(sandbox);
    let definition = crate::cli::resolve::runtime()?
        .block_on(definition.discovered(mode))
        .map_err(|e| CliError::usage(format!("environment `{environment}`: {e}")))?;
    let specs = serde_json::to_string_pretty(&definition.specs).map_err(CliError::usage)?;
    outln!("{specs}");
    if !definition.system_addition.trim().is_empty() {
        eprintln!("added to the system prompt:\n{}", definition.system_addition.trim_end());
    }
    Ok(Exit::Passed)
}
