//! The kinds table, tools as values, and a kind defined outside the table set up through
//! the same trait.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::*;
use crate::contract::{Actor, ErrorType, FINAL_TOOL, ToolCall};
use crate::environment::tool::{self, Tool};
use crate::environment::{Environment, RunStore, ToolFailure};

fn task() -> Task {
    Task { files: [("notes.txt".to_owned(), "hello".to_owned())].into(), ..Task::new("t", "do it") }
}

#[test]
fn the_table_lists_every_kind_in_order() {
    assert_eq!(names(), ["shell", "kv", "python", "web", "writing_room", "mcp", "memory_store"]);
    assert_eq!(find("kv").map(|k| k.name()), Some("kv"));
    assert!(find("docker").is_none());
}

/// A tool is found by `name()` and shown as `spec()`: the two must name the same tool.
fn check_table<W: ?Sized>(kind: &str, table: &[&dyn Tool<W>]) {
    for tool in table {
        assert_eq!(tool.spec().name, tool.name(), "{kind}: a tool's spec names another tool");
    }
    let offered = find(kind).map(|k| k.tools());
    assert_eq!(offered, Some(tool::offer(table)), "{kind} offers other tools than its table");
}

#[test]
fn each_kind_offers_its_tool_table_and_each_tool_is_named_as_its_spec() {
    check_table("shell", shell::TOOLS);
    check_table("kv", kv::TOOLS);
    check_table("python", python::TOOLS);
    check_table("web", web::TOOLS);
    check_table("memory_store", memory_store::TOOLS);
}

#[test]
fn tool_names_are_unique_and_only_final_answer_is_unsafe_for_scripts() {
    for kind in KINDS {
        let tools = kind.tools();
        let names: BTreeSet<&str> = tools.iter().map(|t| t.spec.name.as_str()).collect();
        assert_eq!(names.len(), tools.len(), "{} offers two tools of one name", kind.name());
        assert_eq!(tools.last().map(|t| t.spec.name.as_str()), Some(FINAL_TOOL));
        for t in &tools {
            assert_eq!(t.script_safe, t.spec.name != FINAL_TOOL, "{}::{}", kind.name(), t.spec.name);
        }
    }
}

/// Every tool a kind offers reaches code in its world: none is only a spec.
#[tokio::test]
async fn every_offered_tool_reaches_its_world() {
    let dir = tempfile::tempdir().unwrap();
    // `mcp` offers only the final answer until its servers, listed in a file, are discovered;
    // `web` needs a file that says what to browse (web_tests.rs calls each of its tools).
    for kind in KINDS.iter().filter(|k| !["mcp", "web"].contains(&k.name())) {
        let definition = Definition::builtin(*kind);
        let context = SetupContext::new(dir.path(), "ep_test");
        let mut world = kind.setup(&definition, &task(), &context).await.unwrap();
        for offered in kind.tools().iter().filter(|t| t.spec.name != FINAL_TOOL) {
            let kind_of = |r: Result<Value, ToolFailure>| r.err().map(|f| f.kind);
            let result = world.call(&Actor::Main, &offered.spec.name, json!({})).await;
            assert_ne!(kind_of(result), Some(ErrorType::ToolNotFound), "{}::{}", kind.name(), offered.spec.name);
        }
        let missing = world.call(&Actor::Main, "no_such_tool", json!({})).await.unwrap_err();
        assert_eq!(missing.kind, ErrorType::ToolNotFound);
        world.teardown().await;
    }
}

/// A folder a command ran in is removed; one that no command ran in is emptied and given to
/// the run's next episode (shell's `tests.rs`), and removed with the run's scratch folder.
#[tokio::test]
async fn a_shell_world_removes_its_folder_on_teardown() {
    let dir = tempfile::tempdir().unwrap();
    let shell = find("shell").unwrap();
    let definition = Definition::builtin(shell);
    let context = SetupContext::new(dir.path(), "ep_test");
    let mut world = shell.setup(&definition, &task(), &context).await.unwrap();
    let folders = || std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(folders(), 1, "the episode's folder is made in the work root");
    world.call(&Actor::Main, "run_command", json!({"command": "echo x > f"})).await.unwrap();
    world.teardown().await;
    assert_eq!(folders(), 0, "teardown left the episode's folder behind");
}

/// A kind outside the table: one tool that counts its calls across the episodes of a run,
/// in the run's store, and a teardown that leaves a mark there.
struct Tally;

const TALLY_TOOLS: &[&dyn Tool<TallyWorld>] = &[&Bump];

#[async_trait]
impl EnvironmentKind for Tally {
    fn name(&self) -> &'static str {
        "tally"
    }

    fn tools(&self) -> Vec<ToolDecl> {
        tool::offer(TALLY_TOOLS)
    }

    async fn setup(
        &self,
        definition: &Definition,
        _task: &Task,
        context: &SetupContext<'_>,
    ) -> Result<Box<dyn World>, SetupError> {
        let store = context
            .run_store
            .clone()
            .ok_or_else(|| SetupError { name: definition.name.clone(), message: "it needs a run store".into() })?;
        Ok(Box::new(TallyWorld { episode_id: context.episode_id.to_owned(), store }))
    }
}

struct TallyWorld {
    episode_id: String,
    store: Arc<RunStore>,
}

#[async_trait]
impl World for TallyWorld {
    async fn call(&self, actor: &Actor, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
        tool::call(TALLY_TOOLS, "tally", self, actor, name, arguments).await
    }

    async fn teardown(&mut self) {
        self.store.update("torn_down", |_| json!(self.episode_id));
    }
}

struct Bump;

#[async_trait]
impl Tool<TallyWorld> for Bump {
    fn annotations(&self) -> Option<crate::contract::ToolAnnotations> {
        None
    }

    fn name(&self) -> &'static str {
        "bump"
    }

    fn description(&self) -> &'static str {
        "Count one more."
    }

    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"by": {"type": "integer"}}, "additionalProperties": false})
    }

    async fn call(&self, world: &TallyWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let by = arguments["by"].as_u64().unwrap_or(1);
        let count = world.store.update("bumps", |old| json!(old.and_then(Value::as_u64).unwrap_or(0) + by));
        Ok(json!({"episode": world.episode_id, "bumps": count}))
    }
}

fn bump(call_id: &str, arguments: Value) -> ToolCall {
    ToolCall::new(call_id, "bump", arguments)
}

#[tokio::test]
async fn a_kind_defined_outside_the_table_is_set_up_with_its_context_and_its_tool_called() {
    let dir = tempfile::tempdir().unwrap();
    let definition = Arc::new(Definition::builtin(&Tally));
    assert_eq!(definition.specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["bump", FINAL_TOOL]);
    let store = Arc::new(RunStore::default());

    let mut context = SetupContext::new(dir.path(), "ep_1");
    context.run_store = Some(store.clone());
    let first = Environment::setup(definition.clone(), &task(), &context).await.unwrap();
    let obs = first.execute(&bump("c1", json!({"by": 2})), &AtomicBool::new(false)).await;
    assert_eq!(obs.error, None);
    assert_eq!(obs.tool_result, Some(json!({"episode": "ep_1", "bumps": 2})));
    // Arguments are checked against the tool's spec before its code runs.
    let bad = first.execute(&bump("c2", json!({"by": "two"})), &AtomicBool::new(false)).await;
    assert_eq!(bad.error.map(|e| e.kind), Some(ErrorType::ValidationError));
    first.teardown().await;
    assert_eq!(store.get("torn_down"), Some(json!("ep_1")));

    // Another episode of the same run sees what the first left in the run's store.
    context.episode_id = "ep_2";
    let second = Environment::setup(definition.clone(), &task(), &context).await.unwrap();
    let obs = second.execute(&bump("c1", json!({})), &AtomicBool::new(false)).await;
    assert_eq!(obs.tool_result, Some(json!({"episode": "ep_2", "bumps": 3})));

    // A setup that fails says which environment and why.
    let without_store = SetupContext::new(dir.path(), "ep_3");
    let error = Environment::setup(definition, &task(), &without_store).await.err().unwrap();
    assert_eq!(error.to_string(), "failed to set up environment `tally`: it needs a run store");
}

#[tokio::test]
async fn a_world_written_in_code_cannot_be_set_up_by_kind() {
    let dir = tempfile::tempdir().unwrap();
    let definition = Definition::for_world("coded", Vec::new(), Default::default()).unwrap();
    let context = SetupContext::new(dir.path(), "ep_test");
    let error = Environment::setup(Arc::new(definition), &task(), &context).await.err().unwrap();
    assert!(error.to_string().contains("Environment::with_world"), "{error}");
}
