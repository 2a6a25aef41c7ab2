//! Environment definitions: a built-in kind, the subset of its tools to expose, its limits
//! and its fixture files. Loaded from `environments/NAME.yaml` or taken from the built-ins.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::contract::{FINAL_TOOL, ToolSpec};
use crate::suite::MAX_EPISODE_S;
use crate::suite::decode::{ConfigError, Source, check_seconds};
use crate::suite::text::Text;

use super::{kv, shell};

/// The built-in kinds of environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A fresh temporary working directory and a shell.
    Shell,
    /// An in-process key-value store and calculator: cheap tools for tests and benchmarks.
    Kv,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::Shell, Kind::Kv];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Shell => "shell",
            Kind::Kv => "kv",
        }
    }

    /// Every tool the kind can offer, `final_answer` included.
    pub fn tools(self) -> Vec<ToolSpec> {
        let mut tools = match self {
            Kind::Shell => shell::tool_specs(),
            Kind::Kv => kv::tool_specs(),
        };
        tools.push(final_answer_spec());
        tools
    }
}

pub fn final_answer_spec() -> ToolSpec {
    ToolSpec {
        name: FINAL_TOOL.into(),
        description: "Give your final answer and end the task.".into(),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The answer, as asked for."}},
            "required": ["answer"],
            "additionalProperties": false
        }),
        annotations: None,
    }
}

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
}

impl Default for EnvLimits {
    fn default() -> Self {
        EnvLimits { max_concurrency: 4, tool_timeout_s: 120.0, command_timeout_s: 60.0, output_cap_bytes: 32 * 1024 }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefinitionFile {
    name: Option<String>,
    kind: Kind,
    #[serde(default)]
    description: String,
    tools: Option<Vec<String>>,
    #[serde(default)]
    limits: EnvLimits,
    #[serde(default)]
    files: BTreeMap<String, Text>,
}

/// A resolved environment definition, shared by every episode that uses it.
pub struct Definition {
    pub name: String,
    /// `None` for a world supplied in code (see [`Definition::for_world`]).
    pub kind: Option<Kind>,
    pub description: String,
    /// Where it came from: a file, or `None` for a built-in.
    pub path: Option<PathBuf>,
    pub limits: EnvLimits,
    pub files: BTreeMap<String, String>,
    /// The exposed tools, each with its compiled argument validator.
    pub tools: Vec<ExposedTool>,
    /// The exposed specs alone, as the agent is shown them.
    pub specs: Vec<ToolSpec>,
}

pub struct ExposedTool {
    pub spec: ToolSpec,
    pub validator: jsonschema::Validator,
}

impl std::fmt::Debug for Definition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Definition").field("name", &self.name).field("kind", &self.kind).finish_non_exhaustive()
    }
}

impl Definition {
    pub fn builtin(kind: Kind) -> Self {
        let specs = kind.tools();
        Self::new(kind.name().to_owned(), Some(kind), String::new(), None, EnvLimits::default(), BTreeMap::new(), specs)
            .unwrap_or_else(|e| panic!("built-in tool schema is invalid: {e}"))
    }

    /// A definition for a world written in code: its tools (with `final_answer` added) and limits.
    pub fn for_world(name: &str, mut specs: Vec<ToolSpec>, limits: EnvLimits) -> Result<Self, String> {
        if !specs.iter().any(|t| t.name == FINAL_TOOL) {
            specs.push(final_answer_spec());
        }
        Self::new(name.to_owned(), None, String::new(), None, limits, BTreeMap::new(), specs)
    }

    fn new(
        name: String,
        kind: Option<Kind>,
        description: String,
        path: Option<PathBuf>,
        limits: EnvLimits,
        files: BTreeMap<String, String>,
        specs: Vec<ToolSpec>,
    ) -> Result<Self, String> {
        let tools = specs
            .iter()
            .map(|spec| {
                let validator = jsonschema::validator_for(&spec.parameters)
                    .map_err(|e| format!("tool `{}` has an invalid schema: {e}", spec.name))?;
                Ok(ExposedTool { spec: spec.clone(), validator })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Definition { name, kind, description, path, limits, files, tools, specs })
    }

    /// Loads `environments/NAME.yaml`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let (source, _) = Source::read(path)?;
        let file: DefinitionFile = source.decode("", &source.value)?;
        let all = file.kind.tools();
        let specs = match &file.tools {
            None => all,
            Some(names) => {
                let mut chosen = Vec::new();
                for (i, name) in names.iter().enumerate() {
                    match all.iter().find(|t| &t.name == name) {
                        Some(spec) => chosen.push(spec.clone()),
                        None => {
                            let known: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
                            return Err(source.error(
                                &format!("tools[{i}]"),
                                format!(
                                    "unknown tool `{name}` for kind `{}`, expected one of: {}",
                                    file.kind.name(),
                                    known.join(", ")
                                ),
                            ));
                        }
                    }
                }
                // The final tool is how an episode ends; it is always offered.
                if !chosen.iter().any(|t| t.name == FINAL_TOOL) {
                    chosen.push(final_answer_spec());
                }
                chosen
            }
        };
        if file.limits.max_concurrency == 0 {
            return Err(source.error("limits.max_concurrency", "must be at least 1"));
        }
        // No output at all would hide every result from the agent.
        if file.limits.output_cap_bytes == 0 {
            return Err(source.error("limits.output_cap_bytes", "must be at least 1"));
        }
        for (field, value) in
            [("tool_timeout_s", file.limits.tool_timeout_s), ("command_timeout_s", file.limits.command_timeout_s)]
        {
            check_seconds(&source, &format!("limits.{field}"), value, 0.001, MAX_EPISODE_S)?;
        }
        for name in file.files.keys() {
            if !crate::suite::is_relative_inside(name) {
                let at = format!("files.{name}");
                return Err(source.error(&at, "file names must be relative paths inside the working directory"));
            }
        }
        let name = file
            .name
            .or_else(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| file.kind.name().to_owned());
        let files = file.files.into_iter().map(|(k, v)| (k, v.0)).collect();
        Self::new(name, Some(file.kind), file.description, Some(path.to_owned()), file.limits, files, specs)
            .map_err(|e| ConfigError::whole(path, e))
    }

    /// Finds the environment a suite names: a file in an `environments/` folder beside or
    /// above the suite, a path to a YAML file, or a built-in kind.
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
        match Kind::ALL.iter().find(|k| k.name() == name) {
            Some(kind) => Ok(Arc::new(Self::builtin(*kind))),
            None => {
                let builtins: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                Err(format!(
                    "unknown environment `{name}`: no environments/{name}.yaml beside the suite or in the current \
                     directory, and not a built-in ({})",
                    builtins.join(", ")
                ))
            }
        }
    }

    pub fn tool(&self, name: &str) -> Option<&ExposedTool> {
        self.tools.iter().find(|t| t.spec.name == name)
    }
}

fn candidate_dirs(suite_dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![suite_dir.join("environments")];
    if let Some(parent) = suite_dir.parent() {
        dirs.push(parent.join("environments"));
    }
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
        for kind in Kind::ALL {
            for spec in kind.tools() {
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
        let read_only: Vec<String> = Kind::ALL
            .iter()
            .flat_map(|k| k.tools())
            .filter(|t| t.annotations.is_some_and(|a| a.read_only && !a.destructive))
            .map(|t| t.name)
            .collect();
        assert_eq!(read_only, ["read_file", "list_dir", "kv_get", "kv_list", "calc"]);
        let unmarked: Vec<String> =
            Kind::ALL.iter().flat_map(|k| k.tools()).filter(|t| t.annotations.is_none()).map(|t| t.name).collect();
        assert_eq!(unmarked, [FINAL_TOOL, FINAL_TOOL], "the final answer is the agent's, not the world's");
    }

    #[test]
    fn every_kind_offers_final_answer() {
        for kind in Kind::ALL {
            assert!(kind.tools().iter().any(|t| t.name == FINAL_TOOL), "{} lacks final_answer", kind.name());
        }
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let def = Definition::builtin(Kind::Shell);
        let tool = def.tool("run_command").unwrap();
        assert!(validate_arguments(tool, &serde_json::json!({"command": "ls"})).is_ok());
        let err = validate_arguments(tool, &serde_json::json!({"command": 3})).unwrap_err();
        assert!(err.contains("/command"), "{err}");
        assert!(validate_arguments(tool, &serde_json::json!({})).is_err());
        assert!(validate_arguments(tool, &serde_json::json!("ls")).is_err());
    }
}
