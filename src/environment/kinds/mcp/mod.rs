//! `mcp`: MCP servers as an environment. An environment file lists servers — over stdio
//! (`command`, `args`, `env`, `cwd`), started inside the sandbox, or over streamable HTTP
//! (`url`, `headers`) — and the world's tools are the tools they offer.
//!
//! Tools are known only once a server runs, so they are *discovered*: once when the run
//! starts (`EnvironmentKind::discover`, which starts every server, lists its tools and
//! stops it), which fixes the definition's tools and the specs the agent is shown. Each
//! episode then starts its own servers (or shares a `scope: run` server) and checks that
//! the tools it was promised are still offered.
//!
//! With one server a tool keeps its name; with several it is `server__tool`. A call goes
//! to `tools/call`; its content blocks are the result, `isError` a failed call, a server
//! that dies a fault of the environment (the episode ends unscored).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{CallToolRequestParams, GetPromptRequestParams};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use super::{EnvironmentKind, KindKeys, KindSettings};
use crate::config::decode::{ConfigError, Source, check_seconds};
use crate::contract::{Actor, ErrorType, FINAL_TOOL, ToolAnnotations, ToolSpec};
use crate::domain::{MAX_EPISODE_S, Task};
use crate::environment::tool::{self, ToolDecl};
use crate::environment::{Definition, SetupContext, SetupError, ToolFailure, World};
use crate::sandbox::process::{self, SAFE_PATH, Supervised};
use crate::sandbox::{Confinement, SandboxMode};

/// The separator of a server's name and its tool's when there are several servers.
pub const SEPARATOR: &str = "__";

/// How much of a server's stderr is kept for messages.
const STDERR_TAIL: usize = 2000;

/// The kind `mcp`.
pub struct Mcp;

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
    shared: Vec<tokio::sync::OnceCell<Arc<Server>>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    pub name: String,
    /// stdio: the program (a path, `~/…`, or a name looked up on the sandbox's `PATH`).
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// The only variables the server gets, besides `PATH`; `${NAME}` takes the runner's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// More paths the server may read (its installation is readable already).
    #[serde(default)]
    pub read_paths: Vec<String>,
    /// Streamable HTTP: the endpoint.
    pub url: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `episode` (default): a server per episode; `run`: one for the run's episodes.
    #[serde(default)]
    pub scope: Scope,
    /// How long the server may take to start and answer `initialize`.
    #[serde(default = "default_start_timeout")]
    pub start_timeout_s: f64,
}

fn default_start_timeout() -> f64 {
    30.0
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    #[default]
    Episode,
    Run,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptRef {
    pub server: String,
    pub name: String,
    #[serde(default)]
    pub arguments: Map<String, Value>,
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
        if servers.is_empty() {
            return Err(source.error("servers", "list at least one server"));
        }
        for (i, server) in servers.iter().enumerate() {
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
            match (&server.command, &server.url) {
                (Some(_), Some(_)) => {
                    return Err(source.error(
                        &at("url"),
                        "a server is either `command:` (stdio) or `url:` (streamable HTTP), not both",
                    ));
                }
                (None, None) => {
                    return Err(source.error(
                        &format!("servers[{i}]"),
                        "give the server a `command:` (stdio) or a `url:` (streamable HTTP)",
                    ));
                }
                (Some(command), None) => {
                    if command.trim().is_empty() {
                        return Err(source.error(&at("command"), "must not be empty"));
                    }
                    if !server.headers.is_empty() {
                        return Err(source.error(&at("headers"), "only a `url:` server takes headers"));
                    }
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
                }
            }
            for name in server.env.keys() {
                if name.is_empty() || name.contains('=') || name.contains('\0') {
                    return Err(source.error(&at(&format!("env.{name}")), "not a valid variable name"));
                }
            }
            check_seconds(source, &at("start_timeout_s"), server.start_timeout_s, 0.001, MAX_EPISODE_S)?;
        }
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
        let base = source.file.parent().unwrap_or(Path::new(".")).to_path_buf();
        let shared = servers.iter().map(|_| tokio::sync::OnceCell::new()).collect();
        Ok(McpSpec { servers, prompts, optional: optional.unwrap_or(false), base, shared })
    }

    /// The name the agent calls `tool` of `server` by.
    pub fn exposed_name(&self, server: &str, tool: &str) -> String {
        if self.servers.len() == 1 { tool.to_owned() } else { format!("{server}{SEPARATOR}{tool}") }
    }

    /// The server (its index) and the tool's own name behind an exposed name.
    fn route(&self, exposed: &str) -> Option<(usize, String)> {
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
            let missing = s.args.iter().find(|a| is_path_argument(a) && !expand_path(a, &self.base).exists())?;
            Some((s.name.clone(), missing.clone()))
        })
    }
}

/// The servers `definition` lists, if it is an `mcp` definition that lists them.
pub fn spec_of(definition: &Definition) -> Option<Arc<McpSpec>> {
    match &definition.settings {
        KindSettings::Mcp(spec) => spec.clone(),
        _ => None,
    }
}

#[async_trait]
impl EnvironmentKind for Mcp {
    fn name(&self) -> &'static str {
        "mcp"
    }

    /// Only the final answer: the rest are discovered.
    fn tools(&self) -> Vec<ToolDecl> {
        vec![tool::final_answer()]
    }

    /// `servers:`, the prompts added to the system prompt (`prompts:`), and whether a suite
    /// over it is skipped when a server is not installed (`optional:`).
    fn keys(&self) -> &'static [&'static str] {
        &["servers", "prompts", "optional"]
    }

    fn decode_settings(&self, keys: &KindKeys<'_>) -> Result<KindSettings, ConfigError> {
        let optional = keys.get("optional").map(|v| keys.source.decode::<bool>("optional", v)).transpose()?;
        let spec = McpSpec::decode(keys.source, keys.get("servers"), keys.get("prompts"), optional)?;
        Ok(KindSettings::Mcp(Some(Arc::new(spec))))
    }

    fn builtin_settings(&self) -> KindSettings {
        KindSettings::Mcp(None)
    }

    fn needs_a_file(&self, name: &str) -> Option<String> {
        Some(format!(
            "the `mcp` kind needs its servers listed: write environments/{name}.yaml with `kind: mcp` and `servers:`"
        ))
    }

    fn refuse_key(&self, key: &str, other: &str) -> String {
        format!("only the `mcp` kind takes `{key}:`; kind `{other}` does not")
    }

    fn discovers_tools(&self) -> bool {
        true
    }

    async fn setup(
        &self,
        definition: &Definition,
        task: &Task,
        context: &SetupContext<'_>,
    ) -> Result<Box<dyn World>, SetupError> {
        let failed = |message: String| SetupError { name: definition.name.clone(), message };
        let Some(spec) = spec_of(definition) else {
            return Err(failed("an `mcp` environment needs `servers:`".into()));
        };
        let folder = tempfile::Builder::new()
            .prefix("runner-mcp-")
            .tempdir_in(context.work_root)
            .map_err(|e| failed(format!("failed to create the episode's folder: {e}")))?;
        let work = folder.path().canonicalize().map_err(|e| failed(format!("the episode's folder: {e}")))?;
        for (name, content) in definition.files.iter().chain(&task.files) {
            let path = work.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| failed(format!("{}: {e}", parent.display())))?;
            }
            std::fs::write(&path, content).map_err(|e| failed(format!("failed to write {name}: {e}")))?;
        }
        let mut servers = Vec::new();
        for (i, server) in spec.servers.iter().enumerate() {
            let started = match server.scope {
                Scope::Episode => {
                    Server::start(server, definition, &spec.base, &work, context.sandbox).await.map(Arc::new)
                }
                Scope::Run => {
                    let run_dir = context.work_root.join(format!("runner-mcp-run-{}", server.name));
                    spec.shared[i]
                        .get_or_try_init(|| async {
                            std::fs::create_dir_all(&run_dir)
                                .map_err(|e| format!("failed to create {}: {e}", run_dir.display()))?;
                            let dir = run_dir.canonicalize().map_err(|e| e.to_string())?;
                            Server::start(server, definition, &spec.base, &dir, context.sandbox).await.map(Arc::new)
                        })
                        .await
                        .cloned()
                }
            };
            let started = started.map_err(failed)?;
            servers.push(started);
        }
        if definition.undiscovered {
            // Discovery failed when the run started; the servers started now, too late for the agent.
            return Err(failed(
                "its servers' tools could not be discovered when the run started (see the run's notes)".into(),
            ));
        }
        // The tools the agent is shown were discovered when the run started: each must still be there.
        for (i, server) in servers.iter().enumerate() {
            let offered = server.tools().await.map_err(failed)?;
            let promised = definition
                .tools
                .iter()
                .filter(|t| t.spec.name != FINAL_TOOL)
                .filter_map(|t| spec.route(&t.spec.name))
                .filter(|(s, _)| *s == i);
            for (_, tool) in promised {
                if !offered.iter().any(|t| t["name"] == tool.as_str()) {
                    return Err(failed(format!(
                        "server `{}` no longer offers tool `{tool}`, which it offered when the run started",
                        server.name
                    )));
                }
            }
        }
        let cap = definition.limits.output_cap_bytes;
        Ok(Box::new(McpWorld { spec, servers, folder: Some(folder), work, cap }))
    }

    async fn discover(
        &self,
        definition: &Definition,
        sandbox: SandboxMode,
    ) -> Result<Option<(Vec<ToolDecl>, String)>, String> {
        let Some(spec) = spec_of(definition) else {
            return Err("an `mcp` environment needs `servers:`".into());
        };
        let folder = tempfile::Builder::new()
            .prefix("runner-mcp-discover-")
            .tempdir()
            .map_err(|e| format!("failed to create a folder to start the servers in: {e}"))?;
        let work = folder.path().canonicalize().map_err(|e| e.to_string())?;
        let mut decls = Vec::new();
        let mut prompt_text = String::new();
        let mut started = Vec::new();
        for server in &spec.servers {
            let running = Server::start(server, definition, &spec.base, &work, sandbox).await?;
            for tool in running.tools().await? {
                decls.push(decl_of(&spec, &server.name, &tool)?);
            }
            started.push(running);
        }
        for prompt in &spec.prompts {
            let Some(server) = started.iter().find(|s| s.name == prompt.server) else { continue };
            prompt_text.push_str(&server.prompt(prompt).await?);
        }
        for mut server in started {
            server.stop().await;
        }
        let exposed = match &definition.expose {
            None => decls,
            Some(names) => {
                let mut chosen = Vec::new();
                for name in names {
                    match decls.iter().find(|d| &d.spec.name == name) {
                        Some(d) => chosen.push(d.clone()),
                        None => {
                            let known: Vec<&str> = decls.iter().map(|d| d.spec.name.as_str()).collect();
                            return Err(format!(
                                "`tools:` lists `{name}`, which no server offers; they offer: {}",
                                known.join(", ")
                            ));
                        }
                    }
                }
                chosen
            }
        };
        let mut exposed = exposed;
        exposed.push(tool::final_answer());
        Ok(Some((exposed, prompt_text)))
    }

    fn sandboxed(&self) -> bool {
        true
    }
}

/// A discovered tool (as the server listed it) as the agent is shown it.
fn decl_of(spec: &McpSpec, server: &str, tool: &Value) -> Result<ToolDecl, String> {
    let Some(name) = tool["name"].as_str() else {
        return Err(format!("server `{server}` listed a tool without a name: {tool}"));
    };
    let exposed = spec.exposed_name(server, name);
    if exposed == FINAL_TOOL {
        return Err(format!("server `{server}` offers a tool named `{FINAL_TOOL}`, which is the runner's own"));
    }
    let description = tool["description"].as_str().or(tool["title"].as_str()).unwrap_or(name).to_owned();
    let mut parameters = tool.get("inputSchema").cloned().unwrap_or_else(|| json!({"type": "object"}));
    // `$schema` pins a draft for validation only; models are shown the schema itself.
    if let Some(object) = parameters.as_object_mut() {
        object.remove("$schema");
    }
    let hints = &tool["annotations"];
    // MCP's defaults: a tool may change the world, and when it does, it may destroy.
    let read_only = hints["readOnlyHint"].as_bool().unwrap_or(false);
    let destructive = !read_only && hints["destructiveHint"].as_bool().unwrap_or(true);
    let spec = ToolSpec::new(&exposed, &description, parameters).annotated(ToolAnnotations { read_only, destructive });
    Ok(ToolDecl { spec, script_safe: true })
}

/// The program of a stdio server: `~/` is the home folder, a path with a `/` is the
/// environment file's when relative, a bare name is looked up on the sandbox's `PATH`.
fn resolve_command(command: &str, base: &Path) -> Result<PathBuf, String> {
    if command.contains('/') {
        let path = expand_path(command, base);
        return if path.is_file() { Ok(path) } else { Err(format!("`{}` does not exist", path.display())) };
    }
    SAFE_PATH
        .split(':')
        .map(|dir| Path::new(dir).join(command))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("`{command}` is not installed (looked on {SAFE_PATH})"))
}

fn expand_path(text: &str, base: &Path) -> PathBuf {
    if let Some(rest) = text.strip_prefix("~/")
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(rest);
    }
    let path = PathBuf::from(text);
    if path.is_absolute() { path } else { base.join(path) }
}

/// Whether an argument names a file (and so is resolved, and made readable).
fn is_path_argument(arg: &str) -> bool {
    arg.starts_with('/') || arg.starts_with("./") || arg.starts_with("../") || arg.starts_with("~/")
}

/// What a server must read of its own: the installation `path` belongs to — the folder
/// holding its outermost `node_modules`, a virtualenv, the prefix of a `bin/` folder — or
/// the file alone. Never a folder that holds the home folder.
fn installation(path: &Path) -> Result<PathBuf, String> {
    let home = std::env::var_os("HOME").map(PathBuf::from).and_then(|h| h.canonicalize().ok());
    let mut found = None;
    for ancestor in path.ancestors().skip(1) {
        if ancestor.file_name().is_some_and(|n| n == "node_modules") {
            found = ancestor.parent().map(Path::to_path_buf);
        }
        if found.is_none() && ancestor.join("pyvenv.cfg").is_file() {
            found = Some(ancestor.to_path_buf());
        }
    }
    let found = found.unwrap_or_else(|| match path.parent() {
        Some(bin) if bin.file_name().is_some_and(|n| n == "bin") => bin.parent().unwrap_or(bin).to_path_buf(),
        _ => path.to_path_buf(),
    });
    let found = found.canonicalize().unwrap_or(found);
    if found.parent().is_none() || home.as_ref().is_some_and(|h| h.starts_with(&found)) {
        return Err(format!(
            "`{}` is installed in `{}`, which holds the home folder or is the whole file system: the sandbox \
             would have to open it all; install the server elsewhere",
            path.display(),
            found.display()
        ));
    }
    Ok(found)
}

/// `${NAME}` in `value` replaced by the runner's variable `NAME`.
fn expand_vars(value: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            return Err(format!("`{value}`: `${{` without a closing `}}`"));
        };
        let name = &rest[start + 2..start + end];
        match std::env::var(name) {
            Ok(v) => out.push_str(&v),
            Err(_) => return Err(format!("`{value}` takes `${{{name}}}`, which is not set")),
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The end of what a server wrote to stderr.
#[derive(Debug, Default)]
struct Tail(VecDeque<u8>);

impl Tail {
    fn text(tail: &Mutex<Tail>) -> String {
        let guard = tail.lock().unwrap_or_else(|p| p.into_inner());
        let bytes: Vec<u8> = guard.0.iter().copied().collect();
        String::from_utf8_lossy(&bytes).trim().to_owned()
    }
}

/// One running, initialised MCP server and the client speaking to it.
pub struct Server {
    pub name: String,
    client: RunningService<RoleClient, ()>,
    /// A stdio server's process tree (killed when dropped).
    process: Option<tokio::sync::Mutex<Process>>,
    stderr: Arc<Mutex<Tail>>,
    /// Turns true when its stderr has been read to its end (the server and whatever else held
    /// the pipe are gone); a server over HTTP has none.
    stderr_read: Option<tokio::sync::watch::Receiver<bool>>,
    /// The sandbox it runs in, kept for the cgroup's final kill.
    sandbox: Option<Arc<Confinement>>,
}

/// A stdio server's process, and how it ended once known.
struct Process {
    supervised: Supervised,
    status: Option<std::process::ExitStatus>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Server {
    /// Starts `spec` (in `dir`, its working folder unless it names one) and initialises it.
    pub async fn start(
        spec: &ServerSpec,
        definition: &Definition,
        base: &Path,
        dir: &Path,
        mode: SandboxMode,
    ) -> Result<Server, String> {
        let timeout = Duration::from_secs_f64(spec.start_timeout_s);
        let name = spec.name.clone();
        if let Some(url) = &spec.url {
            let mut headers = std::collections::HashMap::new();
            for (k, v) in &spec.headers {
                let value = expand_vars(v).map_err(|e| format!("server `{name}`: header `{k}`: {e}"))?;
                let (Ok(k), Ok(v)) = (http::HeaderName::try_from(k.as_str()), http::HeaderValue::try_from(value))
                else {
                    return Err(format!("server `{name}`: header `{k}` is not valid"));
                };
                headers.insert(k, v);
            }
            // rmcp's client brings no TLS provider of its own: the process's default is ring's
            // (an error only says one is installed already).
            let _ = rustls::crypto::ring::default_provider().install_default();
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
            let transport = StreamableHttpClientTransport::from_config(config);
            let client = match tokio::time::timeout(timeout, ().serve(transport)).await {
                Ok(Ok(client)) => client,
                Ok(Err(e)) => return Err(format!("server `{name}` at {url} did not initialise: {e}")),
                Err(_) => {
                    return Err(format!(
                        "server `{name}` at {url} did not initialise within {}s",
                        timeout.as_secs_f64()
                    ));
                }
            };
            return Ok(Server {
                name,
                client,
                process: None,
                stderr: Default::default(),
                stderr_read: None,
                sandbox: None,
            });
        }
        let Some(command) = &spec.command else { return Err(format!("server `{name}` has no command")) };
        let program = resolve_command(command, base).map_err(|e| format!("server `{name}`: {e}"))?;
        let mut readable = vec![installation(&program).map_err(|e| format!("server `{name}`: {e}"))?];
        if let Ok(real) = program.canonicalize() {
            readable.push(installation(&real).map_err(|e| format!("server `{name}`: {e}"))?);
        }
        let mut args = Vec::new();
        for arg in &spec.args {
            if is_path_argument(arg) {
                let path = expand_path(arg, base);
                if path.exists() {
                    let real = path.canonicalize().unwrap_or(path.clone());
                    readable.push(installation(&real).map_err(|e| format!("server `{name}`: {e}"))?);
                }
                args.push(path.into_os_string());
            } else {
                args.push(arg.into());
            }
        }
        for extra in &spec.read_paths {
            readable.push(expand_path(extra, base));
        }
        let cwd = match &spec.cwd {
            Some(cwd) => {
                let path = expand_path(cwd, base);
                readable.push(path.clone());
                path
            }
            None => dir.to_path_buf(),
        };
        let sandbox = definition.confinement(mode, &[dir], &readable).map_err(|e| format!("server `{name}`: {e}"))?;
        let mut command = Command::new(&program);
        command
            .args(&args)
            .current_dir(&cwd)
            .env_clear()
            .env("PATH", SAFE_PATH)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        for (k, v) in &spec.env {
            command.env(k, expand_vars(v).map_err(|e| format!("server `{name}`: env `{k}`: {e}"))?);
        }
        let mut supervised = process::spawn(&mut command, &sandbox)
            .map_err(|e| format!("server `{name}`: failed to start `{}`: {e}", program.display()))?;
        let (Some(stdin), Some(stdout), Some(mut stderr)) =
            (supervised.keeper.stdin.take(), supervised.keeper.stdout.take(), supervised.keeper.stderr.take())
        else {
            return Err(format!("server `{name}`: its pipes were not set up"));
        };
        let tail = Arc::new(Mutex::new(Tail::default()));
        let keep = tail.clone();
        let (read_to_end, stderr_read) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut tail = keep.lock().unwrap_or_else(|p| p.into_inner());
                tail.0.extend(&buf[..n]);
                let over = tail.0.len().saturating_sub(STDERR_TAIL);
                tail.0.drain(..over);
            }
            let _ = read_to_end.send(true);
        });
        let serving = tokio::time::timeout(timeout, ().serve((stdout, stdin))).await;
        let why = match serving {
            Ok(Ok(client)) => {
                return Ok(Server {
                    name,
                    client,
                    process: Some(tokio::sync::Mutex::new(Process { supervised, status: None })),
                    stderr: tail,
                    stderr_read: Some(stderr_read),
                    sandbox: Some(sandbox),
                });
            }
            Ok(Err(e)) => format!("it did not initialise ({e})"),
            Err(_) => format!("it did not initialise within {}s", timeout.as_secs_f64()),
        };
        let status = tokio::time::timeout(Duration::from_millis(500), supervised.shell_status()).await.ok().flatten();
        supervised.tree.kill();
        sandbox.kill_all();
        // Whatever it said before it stopped.
        last_words(Some(stderr_read)).await;
        let exited = status.map(|s| format!(", {}", describe_exit(s))).unwrap_or_default();
        let said = Tail::text(&tail);
        let said = if said.is_empty() { "nothing on stderr".to_owned() } else { format!("its stderr ended: {said}") };
        Err(format!("server `{name}` (`{}`): {why}{exited}; {said}", program.display()))
    }

    /// Every tool the server lists, as it lists it.
    async fn tools(&self) -> Result<Vec<Value>, String> {
        let tools = self.client.list_all_tools().await.map_err(|e| self.failure("tools/list", &e.to_string()))?;
        tools.iter().map(|t| serde_json::to_value(t).map_err(|e| e.to_string())).collect()
    }

    /// The text of a prompt's messages, for the system prompt.
    async fn prompt(&self, prompt: &PromptRef) -> Result<String, String> {
        let mut params = GetPromptRequestParams::new(prompt.name.clone());
        if !prompt.arguments.is_empty() {
            params.arguments = Some(prompt.arguments.clone());
        }
        let got = self.client.get_prompt(params).await.map_err(|e| self.failure("prompts/get", &e.to_string()))?;
        let value = serde_json::to_value(&got).map_err(|e| e.to_string())?;
        let mut text = String::new();
        for message in value["messages"].as_array().into_iter().flatten() {
            if let Some(t) = message["content"]["text"].as_str() {
                text.push_str(t);
                text.push('\n');
            }
        }
        Ok(text)
    }

    fn failure(&self, what: &str, error: &str) -> String {
        let said = Tail::text(&self.stderr);
        let said = if said.is_empty() { String::new() } else { format!("; its stderr ended: {said}") };
        format!("server `{}`: {what} failed: {error}{said}", self.name)
    }

    /// Forwards one call to `tools/call`.
    async fn call(&self, tool: &str, arguments: Value) -> Result<Value, ToolFailure> {
        let mut params = CallToolRequestParams::new(tool.to_owned());
        if let Value::Object(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        match self.client.call_tool(params).await {
            Ok(result) => {
                let result = serde_json::to_value(&result)
                    .map_err(|e| ToolFailure::new(ErrorType::ExecutionError, format!("an unreadable result: {e}")))?;
                outcome(result)
            }
            Err(error) => {
                // A protocol error of a live server is the call's; a dead server is the environment's.
                let wait = if self.client.is_closed() { 500 } else { 200 };
                let status = self.exit_status(Duration::from_millis(wait)).await;
                if !self.client.is_closed() && status.is_none() {
                    return Err(ToolFailure::new(ErrorType::ExecutionError, format!("`{tool}` failed: {error}")));
                }
                let exit = status.map(|s| format!(" ({})", describe_exit(s))).unwrap_or_default();
                last_words(self.stderr_read.clone()).await;
                let said = Tail::text(&self.stderr);
                let said = if said.is_empty() { String::new() } else { format!("; its stderr ended: {said}") };
                let message = format!("server `{}` stopped during `{tool}`{exit}: {error}{said}", self.name);
                let mut failure = ToolFailure::new(ErrorType::ExecutionError, message);
                failure.fault = Some(crate::contract::CallFault::EnvironmentFailed);
                Err(failure)
            }
        }
    }

    /// How a stdio server's process ended, waiting at most `wait`; `None` while it runs
    /// (or for a server over HTTP).
    async fn exit_status(&self, wait: Duration) -> Option<std::process::ExitStatus> {
        let process = self.process.as_ref()?;
        let mut process = process.lock().await;
        if process.status.is_none()
            && let Ok(Some(status)) = tokio::time::timeout(wait, process.supervised.shell_status()).await
        {
            process.status = Some(status);
        }
        process.status
    }

    /// Stops the server and everything it started.
    pub async fn stop(&mut self) {
        self.client.cancellation_token().cancel();
        if let Some(process) = &self.process {
            process.lock().await.supervised.tree.kill();
        }
        if let Some(sandbox) = &self.sandbox {
            sandbox.kill_all();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.client.cancellation_token().cancel();
        if let Some(process) = &mut self.process {
            process.get_mut().supervised.tree.kill();
        }
    }
}

/// Waits, a little at most, until a stopped server's stderr has been read to its end, so that
/// its tail holds what it said last (a pipe kept open by a process it left behind is not
/// waited for long).
async fn last_words(stderr_read: Option<tokio::sync::watch::Receiver<bool>>) {
    if let Some(mut read) = stderr_read {
        let _ = tokio::time::timeout(Duration::from_millis(500), read.wait_for(|done| *done)).await;
    }
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

/// A `tools/call` result as the observation's `tool_result`: its content blocks (text,
/// image, audio, resource, resource link) as MCP wrote them, and its structured content;
/// `isError: true` is a failed call carrying the same.
fn outcome(mut result: Value) -> Result<Value, ToolFailure> {
    let is_error = result["isError"] == true;
    let mut kept = Map::new();
    kept.insert("content".into(), result.get_mut("content").map(Value::take).unwrap_or(json!([])));
    if let Some(structured) = result.get_mut("structuredContent").map(Value::take) {
        kept.insert("structuredContent".into(), structured);
    }
    if !is_error {
        return Ok(Value::Object(kept));
    }
    let text: Vec<&str> =
        kept["content"].as_array().into_iter().flatten().filter_map(|block| block["text"].as_str()).collect();
    let message = if text.is_empty() { "the tool reported an error".to_owned() } else { text.join("\n") };
    let mut failure = ToolFailure::new(ErrorType::ExecutionError, message);
    failure.partial = Some(Value::Object(kept));
    Err(failure)
}

/// Cuts the text blocks of a result so that together they hold at most `cap` bytes, each
/// cut block ending with a visible marker; images and other blocks pass as they are.
fn cap_text(result: &mut Value, cap: usize) {
    let mut left = cap;
    let blocks = result.get_mut("content").and_then(Value::as_array_mut).into_iter().flatten();
    for text in blocks.filter_map(|block| block.get_mut("text")) {
        if let Value::String(s) = text {
            let (kept, cut) = super::web::page::cut(s, left);
            left = left.saturating_sub(if cut { left } else { s.len() });
            *s = kept;
        }
    }
}

/// One episode's servers.
pub struct McpWorld {
    spec: Arc<McpSpec>,
    /// By the spec's index; a `scope: run` server is shared with other episodes.
    servers: Vec<Arc<Server>>,
    folder: Option<tempfile::TempDir>,
    work: PathBuf,
    /// The most bytes of text a result's blocks may hold, all together (`output_cap_bytes`).
    cap: usize,
}

#[async_trait]
impl World for McpWorld {
    async fn call(&self, _actor: &Actor, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
        let Some((index, tool)) = self.spec.route(name) else {
            return Err(ToolFailure::new(ErrorType::ToolNotFound, format!("no server offers `{name}`")));
        };
        let Some(server) = self.servers.get(index) else {
            return Err(ToolFailure::new(ErrorType::ToolNotFound, format!("no server offers `{name}`")));
        };
        let mut result = server.call(&tool, arguments).await;
        match &mut result {
            Ok(value) => cap_text(value, self.cap),
            Err(failure) => {
                if let Some(partial) = failure.partial.as_mut() {
                    cap_text(partial, self.cap);
                }
            }
        }
        result
    }

    fn describe(&self) -> Map<String, Value> {
        let mut info = Map::new();
        let servers: Vec<&str> = self.servers.iter().map(|s| s.name.as_str()).collect();
        info.insert("mcp_servers".into(), json!(servers));
        info.insert("cwd".into(), Value::String(self.work.display().to_string()));
        info
    }

    async fn teardown(&mut self) {
        for (server, spec) in self.servers.drain(..).zip(&self.spec.servers) {
            if spec.scope == Scope::Episode
                && let Ok(mut server) = Arc::try_unwrap(server)
            {
                server.stop().await;
            }
        }
        if let Some(folder) = self.folder.take() {
            let _ = tokio::task::spawn_blocking(move || drop(folder)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_blocks_are_the_result_and_is_error_a_failure() {
        let ok = outcome(json!({"content": [{"type": "text", "text": "hi"}], "isError": false})).unwrap();
        let mut long = json!({"content": [
            {"type": "text", "text": "abcdef"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "text", "text": "ghij"}
        ]});
        cap_text(&mut long, 8);
        // 6 bytes of the first block fit; the second text block gets the 2 left, and a marker.
        assert_eq!(long["content"][0]["text"], "abcdef");
        assert_eq!(long["content"][1]["data"], "AAAA");
        assert_eq!(long["content"][2]["text"], "gh\n[... content truncated: showing 2 of 4 bytes ...]");
        assert_eq!(ok, json!({"content": [{"type": "text", "text": "hi"}]}));
        let failed = outcome(json!({"content": [{"type": "text", "text": "bad input"}], "isError": true})).unwrap_err();
        assert_eq!(failed.kind, ErrorType::ExecutionError);
        assert_eq!(failed.message, "bad input");
        assert!(failed.fault.is_none(), "a tool's own error is the agent's to handle");
    }

    #[test]
    fn hints_map_to_annotations_with_mcps_defaults() {
        let spec = McpSpec {
            servers: Vec::new(),
            prompts: Vec::new(),
            optional: false,
            base: PathBuf::new(),
            shared: Vec::new(),
        };
        let schema = json!({"type": "object"});
        let look =
            decl_of(&spec, "s", &json!({"name": "a", "inputSchema": schema, "annotations": {"readOnlyHint": true}}))
                .unwrap();
        assert_eq!(look.spec.annotations, Some(ToolAnnotations::READ_ONLY));
        let unmarked = decl_of(&spec, "s", &json!({"name": "b", "inputSchema": schema})).unwrap();
        assert_eq!(unmarked.spec.annotations, Some(ToolAnnotations::DESTRUCTIVE));
        let gentle = decl_of(
            &spec,
            "s",
            &json!({"name": "c", "inputSchema": schema, "annotations": {"destructiveHint": false}}),
        )
        .unwrap();
        assert_eq!(gentle.spec.annotations, Some(ToolAnnotations { read_only: false, destructive: false }));
    }

    #[test]
    fn variables_expand_and_a_missing_one_is_named() {
        let path = std::env::var("PATH").unwrap();
        assert_eq!(expand_vars("a${PATH}b").unwrap(), format!("a{path}b"));
        let err = expand_vars("${RUNNER_MCP_TEST_UNSET}").unwrap_err();
        assert!(err.contains("RUNNER_MCP_TEST_UNSET"), "{err}");
    }

    fn load(text: &str) -> Result<Definition, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tools.yaml");
        std::fs::write(&path, text).unwrap();
        Definition::load(&path)
    }

    #[test]
    fn only_the_mcp_kind_takes_servers_and_its_file_needs_them() {
        let err = load("kind: shell\nservers: []\n").unwrap_err();
        assert_eq!(err.position.map(|p| p.line), Some(2), "{err}");
        assert!(err.message.contains("only the `mcp` kind takes `servers:`"), "{err}");
        let err = load("kind: mcp\n").unwrap_err();
        assert!(err.message.contains("needs `servers:`"), "{err}");
        let err = load("kind: mcp\nservers:\n  - {name: a__b, command: node}\n").unwrap_err();
        assert_eq!(err.position.map(|p| p.line), Some(3), "{err}");
        assert!(err.message.starts_with("servers[0].name"), "{err}");
        let err = load("kind: mcp\nservers:\n  - {name: a, url: ftp://x}\n").unwrap_err();
        assert!(err.message.contains("expected an http:// or https:// URL"), "{err}");
        let err =
            load("kind: mcp\nservers:\n  - {name: a, command: node}\nprompts: [{server: b, name: p}]\n").unwrap_err();
        assert!(err.message.starts_with("prompts[0].server: no server `b`"), "{err}");
    }

    #[test]
    fn an_mcp_file_is_loaded_undiscovered_with_its_listed_tools_open_to_rules() {
        let def = load("kind: mcp\ntools: [echo]\npermissions: [{echo: deny}]\nservers: [{name: a, command: node}]\n")
            .unwrap();
        assert!(def.undiscovered);
        assert_eq!(def.specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), [FINAL_TOOL]);
        assert_eq!(def.expose, Some(vec!["echo".to_owned()]));
        let spec = spec_of(&def).unwrap();
        assert_eq!(spec.servers[0].scope, Scope::Episode);
        assert_eq!(spec.route("echo"), Some((0, "echo".to_owned())), "one server: names are kept");
    }

    #[test]
    fn with_several_servers_names_are_prefixed_and_routed_back() {
        let def = load("kind: mcp\nservers: [{name: a, command: node}, {name: b-2, url: \"http://h/mcp\"}]\n").unwrap();
        let spec = spec_of(&def).unwrap();
        assert_eq!(spec.exposed_name("b-2", "get__x"), "b-2__get__x");
        assert_eq!(spec.route("b-2__get__x"), Some((1, "get__x".to_owned())));
        assert_eq!(spec.route("c__x"), None);
    }

    #[test]
    fn an_installation_is_its_node_modules_folder_or_virtualenv() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let script = root.join("srv/node_modules/@scope/pkg/node_modules/dep/index.js");
        std::fs::create_dir_all(script.parent().unwrap()).unwrap();
        std::fs::write(&script, "").unwrap();
        assert_eq!(installation(&script).unwrap(), root.join("srv"), "the outermost node_modules' folder");
        let venv = root.join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(venv.join("pyvenv.cfg"), "").unwrap();
        std::fs::write(venv.join("bin/tool"), "").unwrap();
        assert_eq!(installation(&venv.join("bin/tool")).unwrap(), venv);
    }
}
