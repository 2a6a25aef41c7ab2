//! An `mcp` environment file's own keys (`servers:`, `prompts:`, `optional:`), decoded and
//! checked, the names of tools across several servers, and the servers a run shares.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::server::{
    PromptRef, Server, ServerSpec, argument_path, expand_path, expand_vars, is_path_argument, resolve_command,
};
use crate::config::decode::{ConfigError, Source, check_seconds};
use crate::domain::MAX_EPISODE_S;

/// The separator of a server's name and its tool's when there are several servers.
pub const SEPARATOR: &str = "__";

/// An `mcp` environment file's own keys, decoded and checked.
#[derive(Debug)]
pub struct McpSpec {
    pub servers: Vec<ServerSpec>,
    /// The prompts added to the agent's system prompt, in order.
    pub prompts: Vec<PromptRef>,
    /// Whether a suite over it is skipped (not failed) when a server's command is missing.
    pub optional: bool,
    /// The folder of the environment file: relative paths are its.
    pub base: PathBuf,
    /// The `scope: run` servers, started by the first episode that needs them, by index.
    pub(super) shared: Vec<tokio::sync::OnceCell<Arc<Server>>>,
    /// Why the discovery at the run's start failed, when it did: the episodes then start no
    /// server (each would only fail again, after waiting its `start_timeout_s`).
    pub(super) discovery_failed: std::sync::OnceLock<String>,
}

impl McpSpec {
    /// Decodes `servers:`, `prompts:` and `optional:` of the file `source` (kind `mcp`).
    pub fn decode(
        source: &Source,
        servers: Option<&Value>,
        prompts: Option<&Value>,
        optional: Option<bool>,
    ) -> Result<Self, ConfigError> {
        let Some(servers_value) = servers else {
            return Err(source.error("kind", "an `mcp` environment needs `servers:`, a list of MCP servers"));
        };
        let servers: Vec<ServerSpec> = source.decode("servers", servers_value)?;
        // Absolute, so that it means the same whatever folder a server starts in.
        let folder = source.file.parent().unwrap_or(Path::new("."));
        let base = std::path::absolute(folder).unwrap_or_else(|_| folder.to_path_buf());
        if servers.is_empty() {
            return Err(source.error("servers", "list at least one server"));
        }
        for i in 0..servers.len() {
            check_server(source, &servers, i, &base, optional.unwrap_or(false))?;
        }
        let prompts = decode_prompts(source, prompts, &servers)?;
        let shared = servers.iter().map(|_| tokio::sync::OnceCell::new()).collect();
        Ok(McpSpec {
            servers,
            prompts,
            optional: optional.unwrap_or(false),
            base,
            shared,
            discovery_failed: std::sync::OnceLock::new(),
        })
    }

    /// The name the agent calls `tool` of `server` by.
    pub fn exposed_name(&self, server: &str, tool: &str) -> String {
        if self.servers.len() == 1 { tool.to_owned() } else { format!("{server}{SEPARATOR}{tool}") }
    }

    /// The server (its index) and the tool's own name behind an exposed name.
    pub(super) fn route(&self, exposed: &str) -> Option<(usize, String)> {
        if self.servers.len() == 1 {
            return Some((0, exposed.to_owned()));
        }
        self.servers
            .iter()
            .enumerate()
            .find_map(|(i, s)| exposed.strip_prefix(&format!("{}{SEPARATOR}", s.name)).map(|tool| (i, tool.to_owned())))
    }

    /// The first stdio server whose program (or a file its arguments name) is not
    /// installed, and what is missing.
    pub fn missing_command(&self) -> Option<(String, String)> {
        self.servers.iter().find_map(|s| {
            let command = s.command.as_ref()?;
            if resolve_command(command, &self.base).is_err() {
                return Some((s.name.clone(), command.clone()));
            }
            let missing = s.args.iter().find(|a| is_path_argument(a) && !argument_path(a, s, &self.base).exists())?;
            Some((s.name.clone(), missing.clone()))
        })
    }
}

/// Checks the `i`th of `servers` (its name among the others', its transport, its `env`
/// names, its timeout and, unless the environment is optional, that it is installed), so
/// that a mistake is named at its line before any episode starts it.
fn check_server(
    source: &Source,
    servers: &[ServerSpec],
    i: usize,
    base: &Path,
    optional: bool,
) -> Result<(), ConfigError> {
    let server = &servers[i];
    let at = |field: &str| format!("servers[{i}].{field}");
    let valid_name = !server.name.is_empty()
        && !server.name.contains(SEPARATOR)
        && server.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid_name {
        return Err(source.error(
            &at("name"),
            format!("`{}`: a server's name is letters, digits, `-` and `_`, without `__`", server.name),
        ));
    }
    if servers[..i].iter().any(|s| s.name == server.name) {
        return Err(source.error(&at("name"), format!("`{}` names two servers", server.name)));
    }
    check_transport(source, server, i)?;
    for name in server.env.keys() {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(source.error(&at(&format!("env.{name}")), "not a valid variable name"));
        }
    }
    check_seconds(source, &at("start_timeout_s"), server.start_timeout_s, 0.001, MAX_EPISODE_S)?;
    // An optional environment's missing server skips its suites when they run.
    if !optional {
        check_installed(server, base).map_err(|(field, e)| source.error(&at(&field), e))?;
    }
    if servers.len() > 1 && server.name.ends_with('_') {
        let message = format!(
            "`{}`: with several servers, tools are named `SERVER{SEPARATOR}TOOL`, and a name that ends with \
             `_` would read as another server's (`s_`'s tool `x` and `s`'s tool `_x` are both `s___x`)",
            server.name
        );
        return Err(source.error(&at("name"), message));
    }
    Ok(())
}

/// Checks that the `i`th server is either stdio or streamable HTTP, and takes only that
/// transport's keys.
fn check_transport(source: &Source, server: &ServerSpec, i: usize) -> Result<(), ConfigError> {
    let at = |field: &str| format!("servers[{i}].{field}");
    match (&server.command, &server.url) {
        (Some(_), Some(_)) => {
            Err(source.error(&at("url"), "a server is either `command:` (stdio) or `url:` (streamable HTTP), not both"))
        }
        (None, None) => Err(source
            .error(&format!("servers[{i}]"), "give the server a `command:` (stdio) or a `url:` (streamable HTTP)")),
        (Some(command), None) => {
            if command.trim().is_empty() {
                return Err(source.error(&at("command"), "must not be empty"));
            }
            if !server.headers.is_empty() {
                return Err(source.error(&at("headers"), "only a `url:` server takes headers"));
            }
            Ok(())
        }
        (None, Some(url)) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(source.error(&at("url"), format!("`{url}`: expected an http:// or https:// URL")));
            }
            for field in ["args", "env", "cwd", "read_paths"] {
                let given = match field {
                    "args" => !server.args.is_empty(),
                    "env" => !server.env.is_empty(),
                    "cwd" => server.cwd.is_some(),
                    _ => !server.read_paths.is_empty(),
                };
                if given {
                    return Err(source.error(&at(field), "only a stdio (`command:`) server takes this"));
                }
            }
            for (name, value) in &server.headers {
                if http::HeaderName::try_from(name.as_str()).is_err()
                    || http::HeaderValue::try_from(value.as_str()).is_err()
                {
                    return Err(source.error(&at(&format!("headers.{name}")), "not a valid HTTP header"));
                }
            }
            Ok(())
        }
    }
}

/// Decodes `prompts:`, each naming one of `servers`.
fn decode_prompts(
    source: &Source,
    prompts: Option<&Value>,
    servers: &[ServerSpec],
) -> Result<Vec<PromptRef>, ConfigError> {
    let prompts: Vec<PromptRef> = match prompts {
        None => Vec::new(),
        Some(value) => source.decode("prompts", value)?,
    };
    for (i, prompt) in prompts.iter().enumerate() {
        if !servers.iter().any(|s| s.name == prompt.server) {
            let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
            return Err(source.error(
                &format!("prompts[{i}].server"),
                format!("no server `{}`, expected one of: {}", prompt.server, names.join(", ")),
            ));
        }
    }
    Ok(prompts)
}

/// What `validate` can check of a server without starting it: a stdio server's program, the
/// files its arguments name, its `cwd`, and the variables its `env`, arguments and (for
/// HTTP) `headers` take. The error is the field's (under `servers[i].`) and what is wrong.
fn check_installed(server: &ServerSpec, base: &Path) -> Result<(), (String, String)> {
    for (name, value) in &server.headers {
        expand_vars(value).map_err(|e| (format!("headers.{name}"), e))?;
    }
    let Some(command) = &server.command else { return Ok(()) };
    resolve_command(command, base).map_err(|e| ("command".into(), e))?;
    for (i, arg) in server.args.iter().enumerate() {
        let arg = expand_vars(arg).map_err(|e| (format!("args[{i}]"), e))?;
        if is_path_argument(&arg) {
            let path = argument_path(&arg, server, base);
            if !path.exists() {
                return Err((format!("args[{i}]"), format!("`{}` does not exist", path.display())));
            }
        }
    }
    if let Some(cwd) = &server.cwd {
        let path = expand_path(cwd, base);
        if !path.is_dir() {
            return Err(("cwd".into(), format!("`{}` is not a folder", path.display())));
        }
    }
    for (name, value) in &server.env {
        expand_vars(value).map_err(|e| (format!("env.{name}"), e))?;
    }
    Ok(())
}
