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

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use super::{EnvironmentKind, KindKeys, KindSettings};
use crate::config::decode::ConfigError;
use crate::contract::{
    ASK_USER, Actor, CLARIFY, DELEGATE_TOOL, ENTER_PLAN_MODE, EXIT_PLAN_MODE, ErrorType, FINAL_TOOL, MEMORY_TOOL,
    ToolAnnotations, ToolSpec,
};
use crate::domain::Task;
use crate::environment::tool::{self, ToolDecl};
use crate::environment::{Definition, SetupContext, SetupError, ToolFailure, World};
use crate::sandbox::SandboxMode;

mod bounded;
mod server;
mod spec;

use server::Server;
pub use server::{PromptRef, Scope, ServerSpec};
pub use spec::{McpSpec, SEPARATOR};

/// The kind `mcp`.
pub struct Mcp;

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
        if let Some(why) = spec.discovery_failed.get() {
            return Err(failed(format!(
                "its tools could not be discovered when the run started, so its servers are not started again: {why}"
            )));
        }
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
        let discovered = discover_tools(&spec, definition, sandbox).await;
        if let Err(why) = &discovered {
            // Kept for the run's episodes, which then start nothing (see `setup`).
            let _ = spec.discovery_failed.set(why.clone());
        }
        discovered.map(Some)
    }

    fn sandboxed(&self) -> bool {
        true
    }
}

/// Starts each server once, lists its tools (and reads the prompts the file names), stops
/// them: the tools to expose, checked, with the final answer, and the prompts' text.
async fn discover_tools(
    spec: &McpSpec,
    definition: &Definition,
    sandbox: SandboxMode,
) -> Result<(Vec<ToolDecl>, String), String> {
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
            decls.push((server.name.clone(), decl_of(spec, &server.name, &tool)?));
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
                match decls.iter().find(|(_, d)| &d.spec.name == name) {
                    Some(d) => chosen.push(d.clone()),
                    None => {
                        let known: Vec<&str> = decls.iter().map(|(_, d)| d.spec.name.as_str()).collect();
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
    // What the agent is shown must be names a provider takes and that do not shadow
    // the agent's own; a tool left out by `tools:` is never shown.
    for (server, decl) in &exposed {
        let own = spec.route(&decl.spec.name).map_or_else(|| decl.spec.name.clone(), |(_, tool)| tool);
        check_tool_name(server, &own, &decl.spec.name)?;
    }
    if let Some(message) = duplicate(&exposed) {
        return Err(message);
    }
    let mut exposed: Vec<ToolDecl> = exposed.into_iter().map(|(_, d)| d).collect();
    exposed.push(tool::final_answer());
    Ok((exposed, prompt_text))
}

/// The agent's own actions: a server's tool by one of these names would shadow it.
const AGENT_ACTIONS: [&str; 7] =
    [FINAL_TOOL, MEMORY_TOOL, DELEGATE_TOOL, ASK_USER, CLARIFY, ENTER_PLAN_MODE, EXIT_PLAN_MODE];

/// The longest tool name providers take: OpenAI's and Anthropic's rule is
/// `^[a-zA-Z0-9_-]{1,64}$`.
const MAX_TOOL_NAME: usize = 64;

/// Refuses a discovered tool whose name (`exposed`, as the agent would see it) a provider
/// would refuse, or that would shadow one of the agent's own actions.
fn check_tool_name(server: &str, name: &str, exposed: &str) -> Result<(), String> {
    if AGENT_ACTIONS.contains(&exposed) {
        return Err(format!(
            "server `{server}` offers a tool named `{exposed}`, which is one of the agent's own actions ({}): \
             list the tools to keep in `tools:` to leave it out",
            AGENT_ACTIONS.join(", ")
        ));
    }
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if exposed.is_empty() || exposed.len() > MAX_TOOL_NAME || !exposed.chars().all(valid) {
        let shown: String = name.chars().take(80).collect();
        let more = if name.chars().count() > 80 { "…" } else { "" };
        return Err(format!(
            "server `{server}` offers a tool named `{shown}{more}`, which providers refuse: a tool's name (here \
             `{server}{SEPARATOR}` included when there are several servers) is 1 to {MAX_TOOL_NAME} letters, digits, \
             `_` or `-`"
        ));
    }
    Ok(())
}

/// The first name that two discovered tools share, and the servers that offer it.
fn duplicate(decls: &[(String, ToolDecl)]) -> Option<String> {
    decls.iter().enumerate().find_map(|(i, (server, d))| {
        let (other, _) = decls[..i].iter().find(|(_, e)| e.spec.name == d.spec.name)?;
        Some(if other == server {
            format!("server `{server}` offers two tools named `{}`, which providers refuse", d.spec.name)
        } else {
            format!("servers `{other}` and `{server}` both offer a tool named `{}`", d.spec.name)
        })
    })
}

/// A discovered tool (as the server listed it) as the agent is shown it.
fn decl_of(spec: &McpSpec, server: &str, tool: &Value) -> Result<ToolDecl, String> {
    let Some(name) = tool["name"].as_str() else {
        return Err(format!("server `{server}` listed a tool without a name: {tool}"));
    };
    let exposed = spec.exposed_name(server, name);
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
    use super::server::{expand_vars, installation};
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
            discovery_failed: std::sync::OnceLock::new(),
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
