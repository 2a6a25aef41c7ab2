//! Tools as values: each tool of a world declares its name, its spec and its code in one
//! place, so that what the model is shown and what runs cannot disagree. A world's tools
//! are one table (`&[&dyn Tool<W>]`), and a call finds its tool there by name.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::ToolFailure;
use crate::contract::{Actor, ErrorType, FINAL_TOOL, ToolAnnotations, ToolSpec};

/// One tool of the world `W`: passive, it runs when told to and reports.
#[async_trait]
pub trait Tool<W: ?Sized>: Send + Sync {
    /// The name the model calls it by.
    fn name(&self) -> &'static str;

    fn description(&self) -> &'static str;

    /// The JSON Schema of its arguments.
    fn parameters(&self) -> Value;

    /// Whether a script the agent writes may call it. A tool that ends the episode or
    /// talks to a user is not: its effect must be one visible step of the agent.
    fn script_safe(&self) -> bool {
        true
    }

    /// What it does to the world, as MCP's hints say it: only looks (`read_only`), or may
    /// destroy (`destructive`). Plan mode offers only tools that only look.
    fn annotations(&self) -> Option<ToolAnnotations>;

    /// Runs the tool for `actor` with arguments already checked against `parameters()`.
    async fn call(&self, world: &W, actor: &Actor, arguments: Value) -> Result<Value, ToolFailure>;

    /// The spec the model is shown, built from the parts above.
    fn spec(&self) -> ToolSpec {
        let spec = ToolSpec::new(self.name(), self.description(), self.parameters());
        match self.annotations() {
            Some(annotations) => spec.annotated(annotations),
            None => spec,
        }
    }
}

/// A tool as a kind of environment offers it, before any world exists.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDecl {
    pub spec: ToolSpec,
    pub script_safe: bool,
}

impl ToolDecl {
    /// A tool written in code elsewhere: safe for scripts, unless it is the final answer.
    pub fn of_spec(spec: ToolSpec) -> Self {
        let script_safe = spec.name != FINAL_TOOL;
        ToolDecl { spec, script_safe }
    }
}

/// What a kind offers: every tool of `tools`, in order, then `final_answer`.
pub fn offer<W: ?Sized>(tools: &[&dyn Tool<W>]) -> Vec<ToolDecl> {
    let mut offered: Vec<ToolDecl> =
        tools.iter().map(|t| ToolDecl { spec: t.spec(), script_safe: t.script_safe() }).collect();
    offered.push(final_answer());
    offered
}

/// Runs the tool of `tools` named `name` on `world` for `actor`. `kind` names the world in
/// the error.
pub async fn call<W: ?Sized>(
    tools: &[&dyn Tool<W>],
    kind: &str,
    world: &W,
    actor: &Actor,
    name: &str,
    arguments: Value,
) -> Result<Value, ToolFailure> {
    match tools.iter().find(|t| t.name() == name) {
        Some(tool) => tool.call(world, actor, arguments).await,
        None => Err(ToolFailure::new(ErrorType::ToolNotFound, format!("{kind} has no tool `{name}`"))),
    }
}

/// The final tool, offered by every kind. The environment answers it itself (it ends the
/// episode), so no world runs it, and no script may call it.
pub fn final_answer() -> ToolDecl {
    ToolDecl { spec: final_answer_spec(), script_safe: false }
}

pub fn final_answer_spec() -> ToolSpec {
    ToolSpec {
        name: FINAL_TOOL.into(),
        description: "Give your final answer and end the task.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The answer, as asked for."}},
            "required": ["answer"],
            "additionalProperties": false
        }),
        annotations: None,
    }
}
