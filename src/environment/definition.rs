//! Environment definitions: a built-in kind, the subset of its tools to expose, its limits
//! and its fixture files. Loaded from `environments/NAME.yaml` or taken from the built-ins.
//! The file's common keys are decoded here; the rest are its kind's, handed to the kind
//! (`EnvironmentKind::decode_settings`) after one check that the kind takes them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::config::decode::{ConfigError, Source, check_seconds};
use crate::config::kind_keys;
use crate::contract::{FINAL_TOOL, ToolSpec};
use crate::domain::MAX_EPISODE_S;
use crate::domain::text::Text;

use super::kinds::{self, EnvironmentKind, KindKeys, KindSettings};
use super::permission::{self, Permissions};
use super::script::{self, ScriptSettings};
use super::tool::{self, ToolDecl};
use crate::sandbox::{Confinement, ConfinementPlan, SandboxMode, SandboxSpec};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvLimits {
    /// How many tool calls of one turn run at once.
    pub max_concurrency: usize,
    /// The longest any one tool call may take.
    pub tool_timeout_s: f64,
    /// The default and the ceiling for `run_command`'s own `timeout_s`.
    pub command_timeout_s: f64,
    /// The most bytes of output a tool returns; the rest is cut with a visible marker.
    pub output_cap_bytes: usize,
    /// The most bytes of file content an episode's checkpoints may hold, all together.
    pub checkpoint_bytes: u64,
}

impl Default for EnvLimits {
    fn default() -> Self {
        EnvLimits {
            max_concurrency: 4,
            tool_timeout_s: 120.0,
            command_timeout_s: 60.0,
            output_cap_bytes: 32 * 1024,
            checkpoint_bytes: 100 * 1024 * 1024,
        }
    }
}

/// The keys every environment file may give, whatever its kind.
const COMMON_KEYS: [&str; 9] =
    ["name", "kind", "description", "tools", "limits", "files", "sandbox", "execute_code", "permissions"];

/// An environment file's common keys ([`COMMON_KEYS`]); its kind's own are its kind's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefinitionFile {
    name: Option<String>,
    /// A name in [`kinds::KINDS`].
    kind: String,
    #[serde(default)]
    description: String,
    tools: Option<Vec<String>>,
    #[serde(default)]
    limits: EnvLimits,
    #[serde(default)]
    files: BTreeMap<String, Text>,
    /// `off`, or the sandbox's settings ([`SandboxSpec`]).
    sandbox: Option<Value>,
    /// `true`, or the settings of `execute_code` ([`ScriptSettings`]).
    execute_code: Option<Value>,
    /// Ordered rules, each `- TOOL[(ARGUMENT)]: allow | deny | ask` (`permission.rs`).
    #[serde(default)]
    permissions: Value,
}

/// A resolved environment definition, shared by every episode that uses it.
pub struct Definition {
    pub name: String,
    /// `None` for a world supplied in code (see [`Definition::for_world`]).
    pub kind: Option<&'static dyn EnvironmentKind>,
    pub description: String,
    /// Where it came from: a file, or `None` for a built-in.
    pub path: Option<PathBuf>,
    pub limits: EnvLimits,
    pub files: BTreeMap<String, String>,
    /// The exposed tools, each with its compiled argument validator.
    pub tools: Vec<ExposedTool>,
    /// The exposed specs alone, as the agent is shown them.
    pub specs: Vec<ToolSpec>,
    /// How the processes of its worlds are confined; `None` when the file says `sandbox: off`.
    pub sandbox: Option<SandboxSpec>,
    /// The settings of `execute_code`, when the definition offers it.
    pub scripts: Option<ScriptSettings>,
    /// Which calls run, are refused, or are asked about; a suite's own rules come first.
    pub permissions: Arc<Permissions>,
    /// What the file says under its kind's own keys.
    pub settings: KindSettings,
    /// The tools the file lists (`tools:`), for a kind whose tools are discovered.
    pub expose: Option<Vec<String>>,
    /// Set until the kind's tools are discovered (`Definition::discovered`): `tools` then
    /// holds only what is known without starting anything.
    pub undiscovered: bool,
    /// Text the discovery found for the agent's system prompt (MCP prompts), appended to it.
    pub system_addition: String,
}

pub struct ExposedTool {
    pub spec: ToolSpec,
    /// Whether a script the agent writes may call it.
    pub script_safe: bool,
    pub validator: jsonschema::Validator,
}

impl std::fmt::Debug for Definition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Definition")
            .field("name", &self.name)
            .field("kind", &self.kind.map(|k| k.name()))
            .finish_non_exhaustive()
    }
}

impl Definition {
    /// A kind's own definition: all its tools, the default limits, no files.
    pub fn builtin(kind: &'static dyn EnvironmentKind) -> Self {
        let tools = kind.tools();
        let definition = Self::new(
            kind.name().to_owned(),
            Some(kind),
            String::new(),
            None,
            EnvLimits::default(),
            BTreeMap::new(),
            tools,
        )
        .unwrap_or_else(|e| panic!("built-in tool schema is invalid: {e}"));
        Definition { settings: kind.builtin_settings(), ..definition }
    }

    /// A definition for a world written in code: its tools (with `final_answer` added) and limits.
    pub fn for_world(name: &str, mut specs: Vec<ToolSpec>, limits: EnvLimits) -> Result<Self, String> {
        if !specs.iter().any(|t| t.name == FINAL_TOOL) {
            specs.push(tool::final_answer_spec());
        }
        let tools = specs.into_iter().map(ToolDecl::of_spec).collect();
        Self::new(name.to_owned(), None, String::new(), None, limits, BTreeMap::new(), tools)
    }

    fn new(
        name: String,
        kind: Option<&'static dyn EnvironmentKind>,
        description: String,
        path: Option<PathBuf>,
        limits: EnvLimits,
        files: BTreeMap<String, String>,
        offered: Vec<ToolDecl>,
    ) -> Result<Self, String> {
        let tools = offered
            .into_iter()
            .map(|ToolDecl { spec, script_safe }| {
                let validator = jsonschema::validator_for(&spec.parameters)
                    .map_err(|e| format!("tool `{}` has an invalid schema: {e}", spec.name))?;
                Ok(ExposedTool { spec, script_safe, validator })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let specs = tools.iter().map(|t| t.spec.clone()).collect();
        let sandbox = Some(SandboxSpec::default());
        let permissions = Arc::new(Permissions::default());
        Ok(Definition {
            name,
            kind,
            description,
            path,
            limits,
            files,
            tools,
            specs,
            sandbox,
            permissions,
            scripts: None,
            settings: KindSettings::Plain,
            expose: None,
            undiscovered: false,
            system_addition: String::new(),
        })
    }

    /// Loads `environments/NAME.yaml`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let (source, _) = Source::read(path)?;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned());
        Self::from_source(&source, path, name)
    }

    /// A suite's inline `environment: {kind: …}`: read as an environment file would be,
    /// its relative paths the suite's; named `name` unless it says its own.
    pub fn inline(suite: &Source, name: &str) -> Result<Self, ConfigError> {
        Self::from_source(&suite.part("environment"), &suite.file, Some(name.to_owned()))
    }

    /// An environment from its file's text, `path` the file (its relative paths are its
    /// folder's), `name` what it is called unless it says.
    fn from_source(source: &Source, path: &Path, name: Option<String>) -> Result<Self, ConfigError> {
        let no_keys = Map::new();
        let keys = source.value.as_object().unwrap_or(&no_keys);
        let file: DefinitionFile = match &source.value {
            Value::Object(_) => {
                let common = keys.iter().filter(|(k, _)| COMMON_KEYS.contains(&k.as_str()));
                source.decode("", &Value::Object(common.map(|(k, v)| (k.clone(), v.clone())).collect()))?
            }
            other => source.decode("", other)?,
        };
        let Some(kind) = kinds::find(&file.kind) else {
            let message =
                format!("unknown environment kind `{}`, expected one of: {}", file.kind, kinds::names().join(", "));
            return Err(source.error("kind", message));
        };
        let settings = kind.decode_settings(&kind_keys(source, path, keys, kind)?)?;
        let discovers = kind.discovers_tools();
        if discovers && file.execute_code.is_some() {
            let message = format!("the `{}` kind does not offer `execute_code`", kind.name());
            return Err(source.error("execute_code", message));
        }
        // Discovered tools are checked when they are discovered, at the run's start.
        let expose = if discovers { file.tools.clone() } else { None };
        let mut offered = chosen_tools(source, kind, file.tools.as_deref(), discovers)?;
        let scripts = decode_scripts(source, file.execute_code.as_ref())?;
        if scripts.is_some() {
            // Offered before the final answer, which stays last.
            let at = offered.iter().position(|t| t.spec.name == FINAL_TOOL).unwrap_or(offered.len());
            offered.insert(at, script::tool_decl(&offered));
        }
        check_limits(source, &file.limits)?;
        for name in file.files.keys() {
            if !crate::domain::is_relative_inside(name) {
                let at = format!("files.{name}");
                return Err(source.error(&at, "file names must be relative paths inside the working directory"));
            }
        }
        let name = file.name.or(name).unwrap_or_else(|| kind.name().to_owned());
        let sandbox = decode_sandbox(source, file.sandbox.as_ref())?;
        let mut names: Vec<&str> = offered.iter().map(|t| t.spec.name.as_str()).collect();
        names.extend(expose.iter().flatten().map(String::as_str));
        let permissions = permission::parse_rules(&file.permissions, &format!("environment `{name}`"), &names)
            .map_err(|(at, e)| source.error(&at, e))?;
        let files: BTreeMap<String, String> = file.files.into_iter().map(|(k, v)| (k, v.0)).collect();
        let definition =
            Self::new(name, Some(kind), file.description, Some(path.to_owned()), file.limits, files, offered)
                .map_err(|e| ConfigError::whole(path, e))?;
        Ok(Definition {
            permissions: Arc::new(permissions),
            sandbox,
            scripts,
            settings,
            expose,
            undiscovered: discovers,
            ..definition
        })
    }

    /// This definition with the tools its kind discovers (starting what it must, once),
    /// or itself when its kind's tools are known without that.
    pub async fn discovered(self: &Arc<Self>, sandbox: SandboxMode) -> Result<Arc<Self>, String> {
        let Some(kind) = self.kind.filter(|_| self.undiscovered) else { return Ok(self.clone()) };
        let Some((offered, system_addition)) = kind.discover(self, self.sandbox_mode(sandbox)).await? else {
            return Ok(self.clone());
        };
        Ok(Arc::new(Definition {
            undiscovered: false,
            system_addition,
            ..self.with_tools(offered, self.expose.clone())?
        }))
    }

    /// This definition offering only `names` of its tools (and the final answer): a suite's
    /// `tools:`. A name it does not offer is an error that lists those it does; for tools
    /// not yet discovered, the names are what discovery will keep.
    pub fn narrowed(self: &Arc<Self>, names: &[String]) -> Result<Arc<Self>, String> {
        let offers = |name: &str| match (&self.expose, self.undiscovered) {
            (Some(listed), true) => listed.iter().any(|t| t == name),
            (None, true) => true,
            (_, false) => self.tool(name).is_some(),
        };
        if let Some(unknown) = names.iter().find(|n| !offers(n)) {
            let known: Vec<&str> = match (&self.expose, self.undiscovered) {
                (Some(listed), true) => listed.iter().map(String::as_str).collect(),
                _ => self.specs.iter().map(|s| s.name.as_str()).filter(|n| *n != FINAL_TOOL).collect(),
            };
            return Err(format!(
                "environment `{}` offers no tool `{unknown}`; it offers: {}",
                self.name,
                known.join(", ")
            ));
        }
        let keep = |name: &str| name == FINAL_TOOL || names.iter().any(|n| n == name);
        let offered = self
            .tools
            .iter()
            .filter(|t| keep(&t.spec.name))
            .map(|t| ToolDecl { spec: t.spec.clone(), script_safe: t.script_safe })
            .collect();
        let expose = if self.undiscovered { Some(names.to_vec()) } else { self.expose.clone() };
        Ok(Arc::new(Definition {
            undiscovered: self.undiscovered,
            system_addition: self.system_addition.clone(),
            ..self.with_tools(offered, expose)?
        }))
    }

    /// A copy of this definition (settings, rules, sandbox) with `offered` as its tools.
    fn with_tools(&self, offered: Vec<ToolDecl>, expose: Option<Vec<String>>) -> Result<Self, String> {
        let fresh = Self::new(
            self.name.clone(),
            self.kind,
            self.description.clone(),
            self.path.clone(),
            self.limits.clone(),
            self.files.clone(),
            offered,
        )?;
        Ok(Definition {
            sandbox: self.sandbox.clone(),
            scripts: self.scripts.clone(),
            permissions: self.permissions.clone(),
            settings: self.settings.clone(),
            expose,
            ..fresh
        })
    }

    /// Open files one episode of this definition may hold at once: its running tool calls'.
    pub fn open_files_per_episode(&self) -> u64 {
        self.limits.max_concurrency as u64 * self.kind.map_or(0, |k| k.open_files_per_call())
    }

    /// Whether the worlds' processes run sandboxed, and who turned the sandbox off: the
    /// suite or the command line (`mode`), or this definition's file.
    pub fn sandbox_mode(&self, mode: SandboxMode) -> SandboxMode {
        match (mode, &self.sandbox) {
            (SandboxMode::Off(by), _) => SandboxMode::Off(by),
            (SandboxMode::On, None) => SandboxMode::Off("the environment file"),
            (SandboxMode::On, Some(_)) => SandboxMode::On,
        }
    }

    /// What the sandbox will enforce on this definition's worlds, on this machine; `None`
    /// when they start no process (a kind without commands, and no `execute_code`). Errs, naming what is missing, when the kernel
    /// cannot enforce it.
    pub fn sandbox_check(&self, mode: SandboxMode) -> Result<Option<Value>, String> {
        if !self.kind.is_some_and(|k| k.sandboxed()) && self.scripts.is_none() {
            return Ok(None);
        }
        let spec = self.sandbox.clone().unwrap_or_default();
        crate::sandbox::check(&spec, self.sandbox_mode(mode)).map(Some)
    }

    /// Whether a world of this definition makes folders in the run's scratch folder: its
    /// kind's do, or its `execute_code` scripts run in one.
    pub fn makes_folders(&self) -> bool {
        self.scripts.is_some() || self.kind.is_none_or(|kind| kind.makes_folders())
    }

    /// The sandbox of one world of this definition, over its own folders (`writable`) and
    /// what else it must read.
    pub fn confinement(
        &self,
        mode: SandboxMode,
        writable: &[&Path],
        readable: &[PathBuf],
    ) -> Result<std::sync::Arc<Confinement>, String> {
        let spec = self.sandbox.clone().unwrap_or_default();
        Confinement::prepare(&spec, self.sandbox_mode(mode), writable, readable)
    }

    /// What the sandboxes of this definition's worlds share, worked out once per run: each
    /// world makes its own from it (`ConfinementPlan::confine`) when it starts its first process.
    pub fn sandbox_plan(&self, mode: SandboxMode) -> Result<std::sync::Arc<ConfinementPlan>, String> {
        let default = SandboxSpec::default();
        ConfinementPlan::shared(self.sandbox.as_ref().unwrap_or(&default), self.sandbox_mode(mode), &[])
    }

    /// The sandbox of a program agent in one world of this definition: the world's, with
    /// TCP connections to `gateway_port` alone (`Confinement::prepare_for_gateway`).
    pub fn confinement_for_gateway(
        &self,
        mode: SandboxMode,
        writable: &[&Path],
        gateway_port: u16,
    ) -> Result<std::sync::Arc<Confinement>, String> {
        let spec = self.sandbox.clone().unwrap_or_default();
        Confinement::prepare_for_gateway(&spec, self.sandbox_mode(mode), writable, &[], gateway_port)
    }

    /// Finds the environment a suite names: a file in an `environments/` folder beside or
    /// above the suite (`candidate_dirs`), a path to a YAML file, or a built-in kind.
    pub fn resolve(name: &str, suite_file: &Path) -> Result<Arc<Self>, String> {
        let suite_dir = suite_file.parent().unwrap_or(Path::new("."));
        if name.ends_with(".yaml") || name.ends_with(".yml") {
            let path = suite_dir.join(name);
            return Self::load(&path).map(Arc::new).map_err(|e| e.to_string());
        }
        for dir in candidate_dirs(suite_dir) {
            let path = dir.join(format!("{name}.yaml"));
            if path.is_file() {
                return Self::load(&path).map(Arc::new).map_err(|e| e.to_string());
            }
        }
        match kinds::find(name) {
            Some(kind) => match kind.needs_a_file(name) {
                Some(why) => Err(why),
                None => Ok(Arc::new(Self::builtin(kind))),
            },
            None => Err(format!(
                "unknown environment `{name}`: no environments/{name}.yaml in the suite's folder or one above it \
                 (up to the repository's root) or in the current directory, and not a built-in ({})",
                kinds::names().join(", ")
            )),
        }
    }

    pub fn tool(&self, name: &str) -> Option<&ExposedTool> {
        self.tools.iter().find(|t| t.spec.name == name)
    }
}

/// The kind's tools a file's `tools:` chooses, the final answer always among them; all of
/// them when it names none, or when the kind discovers its tools (the names are checked
/// once they are discovered).
fn chosen_tools(
    source: &Source,
    kind: &'static dyn EnvironmentKind,
    tools: Option<&[String]>,
    discovers: bool,
) -> Result<Vec<ToolDecl>, ConfigError> {
    let all = kind.tools();
    let names = match tools {
        None => return Ok(all),
        Some(_) if discovers => return Ok(all),
        Some(names) => names,
    };
    let mut chosen = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match all.iter().find(|t| &t.spec.name == name) {
            Some(tool) => chosen.push(tool.clone()),
            None => {
                let known: Vec<&str> = all.iter().map(|t| t.spec.name.as_str()).collect();
                return Err(source.error(
                    &format!("tools[{i}]"),
                    format!("unknown tool `{name}` for kind `{}`, expected one of: {}", kind.name(), known.join(", ")),
                ));
            }
        }
    }
    // The final tool is how an episode ends; it is always offered.
    if !chosen.iter().any(|t| t.spec.name == FINAL_TOOL) {
        chosen.push(tool::final_answer());
    }
    Ok(chosen)
}

/// A file's `execute_code:` (`true`, `false` or its settings), checked.
fn decode_scripts(source: &Source, execute_code: Option<&Value>) -> Result<Option<ScriptSettings>, ConfigError> {
    let scripts = match execute_code {
        None | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(ScriptSettings::default()),
        Some(settings @ Value::Object(_)) => Some(source.decode::<ScriptSettings>("execute_code", settings)?),
        Some(_) => {
            return Err(source.error("execute_code", "expected `true`, `false` or a mapping of its settings"));
        }
    };
    if let Some(settings) = &scripts {
        check_seconds(source, "execute_code.timeout_s", settings.timeout_s, 0.001, MAX_EPISODE_S)?;
        if settings.max_calls == 0 {
            return Err(source.error("execute_code.max_calls", "must be at least 1"));
        }
        // A script's printed output is its whole result.
        if settings.stdout_bytes == 0 {
            return Err(source.error("execute_code.stdout_bytes", "must be at least 1"));
        }
    }
    Ok(scripts)
}

/// Refuses limits under which no episode could work.
fn check_limits(source: &Source, limits: &EnvLimits) -> Result<(), ConfigError> {
    if limits.max_concurrency == 0 {
        return Err(source.error("limits.max_concurrency", "must be at least 1"));
    }
    // No output at all would hide every result from the agent.
    if limits.output_cap_bytes == 0 {
        return Err(source.error("limits.output_cap_bytes", "must be at least 1"));
    }
    // No room for checkpoints would fail every `checkpoint` call.
    if limits.checkpoint_bytes == 0 {
        return Err(source.error("limits.checkpoint_bytes", "must be at least 1"));
    }
    for (field, value) in [("tool_timeout_s", limits.tool_timeout_s), ("command_timeout_s", limits.command_timeout_s)] {
        check_seconds(source, &format!("limits.{field}"), value, 0.001, MAX_EPISODE_S)?;
    }
    Ok(())
}

/// A file's `sandbox:` (`off`, `on` or its settings), its paths checked; `None` when off.
fn decode_sandbox(source: &Source, sandbox: Option<&Value>) -> Result<Option<SandboxSpec>, ConfigError> {
    let sandbox = match sandbox {
        None => Some(SandboxSpec::default()),
        Some(Value::String(s)) if s == "off" => None,
        Some(Value::Bool(false)) => None,
        Some(Value::String(s)) if s == "on" => Some(SandboxSpec::default()),
        Some(Value::Bool(true)) => Some(SandboxSpec::default()),
        Some(spec @ Value::Object(_)) => Some(source.decode::<SandboxSpec>("sandbox", spec)?),
        Some(_) => return Err(source.error("sandbox", "expected `off`, `on` or a mapping of sandbox settings")),
    };
    if let Some(spec) = &sandbox {
        let paths = [("read_paths", &spec.read_paths), ("write_paths", &spec.write_paths)];
        for (field, list) in paths.into_iter().chain(spec.hide.as_ref().map(|h| ("hide", h))) {
            for (i, p) in list.iter().enumerate() {
                if !p.is_absolute() {
                    return Err(source.error(&format!("sandbox.{field}[{i}]"), "must be an absolute path"));
                }
            }
        }
        if let Some((field, message)) = spec.problem() {
            return Err(source.error(&format!("sandbox.{field}"), message));
        }
    }
    Ok(sandbox)
}

/// The keys of an environment file beyond the common ones, for its kind to decode: a key
/// of another kind, or of none, is refused here, alike for every kind.
fn kind_keys<'a>(
    source: &'a Source,
    path: &'a Path,
    keys: &'a Map<String, Value>,
    kind: &dyn EnvironmentKind,
) -> Result<KindKeys<'a>, ConfigError> {
    let refusal = |key: &str| kinds::owner_of(key).map(|owner| owner.refuse_key(key, kind.name()));
    kind_keys::split((source, path, ""), keys, (&COMMON_KEYS, kind.keys()), refusal)
}

/// The `environments/` folders a suite's environment is looked for in, nearest first: in
/// the suite's folder and each folder above it up to the repository's root (the folder
/// that holds `.git`), so that a suite finds its repository's environments from whatever
/// folder runner runs in; outside a repository, in the suite's folder and the one above.
/// Then in the current folder.
fn candidate_dirs(suite_dir: &Path) -> Vec<PathBuf> {
    let here = if suite_dir.as_os_str().is_empty() { Path::new(".") } else { suite_dir };
    let start = here.canonicalize().unwrap_or_else(|_| here.to_owned());
    let ancestors: Vec<&Path> = start.ancestors().collect();
    let upto = match ancestors.iter().position(|dir| dir.join(".git").exists()) {
        Some(root) => root + 1,
        None => ancestors.len().min(2),
    };
    let mut dirs: Vec<PathBuf> = ancestors[..upto].iter().map(|dir| dir.join("environments")).collect();
    dirs.push(PathBuf::from("environments"));
    dirs
}

/// Checks a tool call's arguments against the tool's schema.
pub fn validate_arguments(tool: &ExposedTool, arguments: &Value) -> Result<(), String> {
    let errors: Vec<String> = tool
        .validator
        .iter_errors(arguments)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() { e.to_string() } else { format!("{at}: {e}") }
        })
        .collect();
    if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every built-in tool spec is a valid JSON Schema and survives a JSON round trip.
    #[test]
    fn builtin_tool_specs_are_valid_json_schema() {
        for kind in kinds::KINDS {
            for ToolDecl { spec, .. } in kind.tools() {
                if let Err(e) = jsonschema::meta::validate(&spec.parameters) {
                    panic!("{}::{} has an invalid schema: {e}", kind.name(), spec.name);
                }
                assert_eq!(spec.parameters["type"], "object", "{}: parameters must be an object schema", spec.name);
                assert!(!spec.description.is_empty(), "{} has no description", spec.name);
                let text = serde_json::to_string(&spec).unwrap();
                let back: ToolSpec = serde_json::from_str(&text).unwrap();
                assert_eq!(back, spec);
            }
        }
    }

    #[test]
    fn the_tools_that_only_look_are_marked_read_only() {
        let read_only: Vec<String> = kinds::KINDS
            .iter()
            .flat_map(|k| k.tools())
            .map(|t| t.spec)
            .filter(|t| t.annotations.is_some_and(|a| a.read_only && !a.destructive))
            .map(|t| t.name)
            .collect();
        assert_eq!(
            read_only,
            [
                "read_file",
                "glob",
                "grep",
                "list_dir",
                "kv_get",
                "kv_list",
                "calc",
                "search",
                "fetch",
                "extract",
                "read_doc",
                "list_entries",
                "search_entries",
                "get_context",
                "await_consistency"
            ]
        );
        let unmarked: Vec<String> = kinds::KINDS
            .iter()
            .flat_map(|k| k.tools())
            .map(|t| t.spec)
            .filter(|t| t.annotations.is_none())
            .map(|t| t.name)
            .collect();
        assert!(unmarked.iter().all(|name| name == FINAL_TOOL), "the final answer is the agent's, not the world's");
    }

    #[test]
    fn every_kind_offers_final_answer() {
        for kind in kinds::KINDS {
            assert!(kind.tools().iter().any(|t| t.spec.name == FINAL_TOOL), "{} lacks final_answer", kind.name());
        }
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let def = Definition::builtin(kinds::find("shell").unwrap());
        let tool = def.tool("run_command").unwrap();
        assert!(validate_arguments(tool, &serde_json::json!({"command": "ls"})).is_ok());
        let err = validate_arguments(tool, &serde_json::json!({"command": 3})).unwrap_err();
        assert!(err.contains("/command"), "{err}");
        assert!(validate_arguments(tool, &serde_json::json!({})).is_err());
        assert!(validate_arguments(tool, &serde_json::json!("ls")).is_err());
    }

    fn load_text(text: &str) -> Result<Definition, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("box.yaml");
        std::fs::write(&path, text).unwrap();
        Definition::load(&path)
    }

    #[test]
    fn an_unknown_kind_is_refused_at_its_line_with_the_known_kinds() {
        let err = load_text("description: a box\nkind: docker\n").unwrap_err();
        assert_eq!(err.position.map(|p| p.line), Some(2), "{err}");
        assert!(
            err.message.contains("unknown environment kind `docker`, expected one of: shell, kv, python, web"),
            "{err}"
        );
    }

    #[test]
    fn an_environment_file_keeps_its_permission_rules_in_order() {
        let def = load_text("kind: shell\npermissions:\n  - run_command(rm *): deny\n  - \"*\": allow\n").unwrap();
        let rules: Vec<(String, String)> =
            def.permissions.rules().iter().map(|r| (r.text(), r.origin.clone())).collect();
        assert_eq!(
            rules,
            [
                ("run_command(rm *): deny".to_string(), "environment `box` permissions[0]".to_string()),
                ("*: allow".to_string(), "environment `box` permissions[1]".to_string())
            ]
        );
    }

    #[test]
    fn a_bad_permission_rule_is_refused_at_its_line_and_item() {
        let err = load_text("kind: shell\npermissions:\n  - \"*\": allow\n  - write_file: maybe\n").unwrap_err();
        assert_eq!(err.position.map(|p| p.line), Some(4), "{err}");
        assert!(err.message.starts_with("permissions[1]: `write_file`: expected allow, deny or ask"), "{err}");
        // A tool the file does not offer cannot be ruled on.
        let err = load_text("kind: shell\ntools: [read_file]\npermissions: [{run_command: deny}]\n").unwrap_err();
        assert!(err.message.contains("permissions[0]: `run_command` matches no tool here"), "{err}");
    }

    #[test]
    fn a_file_resolves_its_kind_through_the_table_and_keeps_script_safety() {
        let def = load_text("kind: kv\ntools: [kv_get]\n").unwrap();
        assert_eq!(def.kind.map(|k| k.name()), Some("kv"));
        assert_eq!(def.specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["kv_get", FINAL_TOOL]);
        assert!(def.tool("kv_get").unwrap().script_safe);
        assert!(!def.tool(FINAL_TOOL).unwrap().script_safe, "a script must not end the episode");
    }
}
