//! `python`: one persistent CPython session per episode, in the sandbox, whose state
//! (variables, functions, imports) lasts from call to call. Tools define functions, call
//! them, evaluate expressions and run statements; values come back as JSON, or as their
//! `repr` when JSON cannot hold them.
//!
//! A session is one process, so its calls run one at a time. A call that runs too long,
//! or an interpreter that dies, costs the session: the interpreter (and everything it
//! started) is killed, a fresh one is started, and the observation says the state was lost.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{EnvironmentKind, KindKeys, KindSettings};
use crate::config::decode::ConfigError;
use crate::contract::{Actor, ErrorType, ToolAnnotations};
use crate::domain::Task;
use crate::environment::folder::EpisodeFolder;
use crate::environment::tool::{self, Tool, ToolDecl};
use crate::environment::{
    Definition, EnvLimits, FileWorld, ReadBack, SetupContext, SetupError, ToolFailure, World, decode_arguments,
};
use crate::sandbox::Confinement;

mod session;

use crate::environment::interpreter::{self, Interpreter};
use session::{Folders, NoAnswer, PythonSession};

/// The interpreter a world (or `execute_code`) runs: `configured`, else `python3` on `PATH`.
/// The interpreter `definition` names (`python:`), if it names one.
fn interpreter_of(definition: &Definition) -> Option<&std::path::Path> {
    match &definition.settings {
        KindSettings::Python { interpreter } => interpreter.as_deref(),
        _ => None,
    }
}

use crate::sandbox::process::SAFE_PATH;

const STATE_LOST: &str = "the session's state (variables, functions, imports) was lost";

/// The kind `python`.
pub struct Python;

#[async_trait]
impl EnvironmentKind for Python {
    fn name(&self) -> &'static str {
        "python"
    }

    fn tools(&self) -> Vec<ToolDecl> {
        tool::offer(TOOLS)
    }

    /// `python:`, the interpreter: a path, or a name on `PATH`.
    fn keys(&self) -> &'static [&'static str] {
        &["python"]
    }

    fn decode_settings(&self, keys: &KindKeys<'_>) -> Result<KindSettings, ConfigError> {
        let interpreter = match keys.get("python") {
            None => None,
            // A bare name is looked up on PATH; `./python3` or `bin/python3` is the file's.
            Some(value) => match keys.source.decode::<PathBuf>("python", value)? {
                p if p.is_relative() && p.components().count() > 1 => Some(keys.folder().join(p)),
                p => Some(p),
            },
        };
        Ok(KindSettings::Python { interpreter })
    }

    fn builtin_settings(&self) -> KindSettings {
        KindSettings::Python { interpreter: None }
    }

    fn refuse_key(&self, key: &str, other: &str) -> String {
        format!("only the `python` kind runs an interpreter; kind `{other}` takes no `{key}:`")
    }

    async fn setup(
        &self,
        definition: &Definition,
        task: &Task,
        context: &SetupContext<'_>,
    ) -> Result<Box<dyn World>, SetupError> {
        let world = PythonWorld::create(definition, task, context)
            .await
            .map_err(|message| SetupError { name: definition.name.clone(), message })?;
        Ok(Box::new(world))
    }

    fn sandboxed(&self) -> bool {
        true
    }
}

/// The tools of `python`, in the order models are shown them. Every one runs the session's
/// code, which can do anything the sandbox allows (an expression too: `os.remove(p)`), so
/// none is read-only and all are marked destructive: plan mode offers none of them.
pub const TOOLS: &[&dyn Tool<PythonWorld>] = &[&DefineFunction, &CallFunction, &Eval, &Exec];

fn timeout_schema() -> Value {
    json!({"type": "number", "exclusiveMinimum": 0, "description": "seconds; at most the environment's command_timeout_s"})
}

struct DefineFunction;

#[async_trait]
impl Tool<PythonWorld> for DefineFunction {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "define_function"
    }

    fn description(&self) -> &'static str {
        "Define functions (or classes) in the Python session from their source; they stay defined for later calls. \
         Says which were defined."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"source": {"type": "string", "minLength": 1}, "timeout_s": timeout_schema()},
            "required": ["source"], "additionalProperties": false})
    }

    async fn call(&self, world: &PythonWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let args: SourceArgs = decode_arguments(arguments)?;
        world.run(json!({"op": "define_function", "source": args.source}), args.timeout_s).await
    }
}

struct CallFunction;

#[async_trait]
impl Tool<PythonWorld> for CallFunction {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "call_function"
    }

    fn description(&self) -> &'static str {
        "Call a function of the Python session with JSON arguments: `args` positional, `kwargs` by name. \
         Returns its value as JSON, or its repr when JSON cannot hold it."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "description": "a function's name, or a dotted path (`obj.method`)"},
                "args": {"type": "array", "description": "positional arguments", "default": []},
                "kwargs": {"type": "object", "description": "keyword arguments", "default": {}},
                "timeout_s": timeout_schema()
            },
            "required": ["name"], "additionalProperties": false})
    }

    async fn call(&self, world: &PythonWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let args: CallArgs = decode_arguments(arguments)?;
        let request = json!({"op": "call_function", "name": args.name, "args": args.args, "kwargs": args.kwargs});
        world.run(request, args.timeout_s).await
    }
}

struct Eval;

#[async_trait]
impl Tool<PythonWorld> for Eval {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "eval"
    }

    fn description(&self) -> &'static str {
        "Evaluate one Python expression in the session and return its value (JSON, or its repr)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"code": {"type": "string", "minLength": 1}, "timeout_s": timeout_schema()},
            "required": ["code"], "additionalProperties": false})
    }

    async fn call(&self, world: &PythonWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let args: CodeArgs = decode_arguments(arguments)?;
        world.run(json!({"op": "eval", "code": args.code}), args.timeout_s).await
    }
}

struct Exec;

#[async_trait]
impl Tool<PythonWorld> for Exec {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "exec"
    }

    fn description(&self) -> &'static str {
        "Run Python statements in the session; returns what they printed and, when the last statement is an \
         expression, its value."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"code": {"type": "string", "minLength": 1}, "timeout_s": timeout_schema()},
            "required": ["code"], "additionalProperties": false})
    }

    async fn call(&self, world: &PythonWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let args: CodeArgs = decode_arguments(arguments)?;
        world.run(json!({"op": "exec", "code": args.code}), args.timeout_s).await
    }
}

#[derive(Deserialize)]
struct SourceArgs {
    source: String,
    timeout_s: Option<f64>,
}

#[derive(Deserialize)]
struct CodeArgs {
    code: String,
    timeout_s: Option<f64>,
}

#[derive(Deserialize)]
struct CallArgs {
    name: String,
    #[serde(default)]
    args: Vec<Value>,
    #[serde(default)]
    kwargs: Map<String, Value>,
    timeout_s: Option<f64>,
}

pub struct PythonWorld {
    /// The episode's folder: the session's working directory `work/` and its `tmp/`.
    dir: EpisodeFolder,
    root: PathBuf,
    tmp: PathBuf,
    limits: EnvLimits,
    sandbox: Arc<Confinement>,
    interpreter: Arc<Interpreter>,
    /// The session, `None` while a call has it or after a restart failed.
    state: tokio::sync::Mutex<State>,
}

struct State {
    session: Option<PythonSession>,
    /// Set while a call runs: still set at the next call means that call was cancelled
    /// (its session, killed when the call was dropped, is gone).
    running: bool,
}

impl PythonWorld {
    pub async fn create(definition: &Definition, task: &Task, context: &SetupContext<'_>) -> Result<Self, String> {
        let interpreter = interpreter::find(interpreter_of(definition)).await?;
        let dir = EpisodeFolder::create(&definition.files, task, context.work_root)?;
        dir.make_tmp()?;
        let (root, tmp) = (dir.work.clone(), dir.tmp.clone());
        let sandbox = definition.confinement(context.sandbox, &[&root, &tmp], &interpreter.readable)?;
        let folders = Folders { work: &root, tmp: &tmp };
        // Started now, so that an interpreter that cannot run in the sandbox fails the
        // setup (unscored) rather than the agent's first call.
        let session =
            PythonSession::start(&interpreter, &folders, &sandbox, definition.limits.output_cap_bytes).await?;
        let state = tokio::sync::Mutex::new(State { session: Some(session), running: false });
        Ok(PythonWorld { dir, root, tmp, limits: definition.limits.clone(), sandbox, interpreter, state })
    }

    async fn start(&self) -> Result<PythonSession, String> {
        let folders = Folders { work: &self.root, tmp: &self.tmp };
        PythonSession::start(&self.interpreter, &folders, &self.sandbox, self.limits.output_cap_bytes).await
    }

    /// Runs one request in the session, within `timeout_s` (capped by the environment's
    /// `command_timeout_s`), and turns the driver's answer into a result or a failure.
    async fn run(&self, request: Value, timeout_s: Option<f64>) -> Result<Value, ToolFailure> {
        // The bound was checked when the definition loaded; the schema keeps timeout_s > 0.
        let limit = self.limits.command_timeout_s;
        let timeout = Duration::from_secs_f64(timeout_s.unwrap_or(limit).min(limit).max(0.001));
        let mut state = self.state.lock().await;
        let note = std::mem::take(&mut state.running).then(|| {
            format!("the previous call was cancelled and its interpreter killed: a fresh one runs this call, and {STATE_LOST}")
        });
        let mut session = match state.session.take() {
            Some(session) => session,
            None => self.start().await.map_err(|e| ToolFailure::new(ErrorType::ExecutionError, e))?,
        };
        // Should this call be dropped mid-way, `session` is dropped with it, which kills
        // the interpreter; the flag tells the next call so.
        state.running = true;
        let asked = match session.gone() {
            // It died since the last call (killed from outside, or by its own thread): the
            // request is not sent.
            Some(_) => Ok(Err(NoAnswer::Gone(String::new()))),
            None => tokio::time::timeout(timeout, session.ask(request)).await,
        };
        state.running = false;
        let (kind, what) = match asked {
            Ok(Ok(answer)) => {
                state.session = Some(session);
                return outcome(answer, note);
            }
            Ok(Err(NoAnswer::Gone(unsent))) => {
                let how = session.ended().await.map_or(unsent, describe_exit);
                (
                    ErrorType::ExecutionError,
                    format!("the interpreter died since the last call ({how}): this call did not run"),
                )
            }
            Ok(Err(NoAnswer::Broke(broken))) => {
                let how = session.ended().await.map_or(broken, describe_exit);
                (ErrorType::ExecutionError, format!("the interpreter died during this call ({how})"))
            }
            Err(_) => {
                session.kill().await;
                let what = format!(
                    "the call ran longer than {}s: the interpreter and everything it started were killed",
                    timeout.as_secs_f64()
                );
                (ErrorType::TimeoutError, what)
            }
        };
        let restarted = match self.start().await {
            Ok(fresh) => {
                state.session = Some(fresh);
                format!("{what}; a fresh interpreter was started, and {STATE_LOST}")
            }
            Err(e) => format!(
                "{what}, and {STATE_LOST}; starting a fresh interpreter failed ({e}), the next call tries again"
            ),
        };
        let suggestion = match kind {
            ErrorType::TimeoutError => format!(
                "define what you need again; make the code faster, or pass a larger timeout_s (at most {limit}s)"
            ),
            _ => "define what you need again, and avoid what killed the interpreter".to_owned(),
        };
        Err(ToolFailure::new(kind, restarted).suggest(suggestion))
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

/// The driver's answer as a tool's result: the value and what was printed, or a failure
/// carrying the exception, its traceback, and what was printed before it.
fn outcome(mut answer: Value, note: Option<String>) -> Result<Value, ToolFailure> {
    let mut printed = Map::new();
    for stream in ["stdout", "stderr"] {
        match answer.get_mut(stream).map(Value::take) {
            Some(Value::String(text)) if !text.is_empty() => {
                printed.insert(stream.into(), Value::String(text));
            }
            _ => {}
        }
    }
    if answer["ok"] == true {
        let mut result = match answer.get_mut("result").map(Value::take) {
            Some(Value::Object(result)) => result,
            _ => Map::new(),
        };
        result.extend(printed);
        if let Some(note) = note {
            result.insert("note".into(), Value::String(note));
        }
        return Ok(Value::Object(result));
    }
    let noted = |message: String| match &note {
        Some(note) => format!("{message}\n({note})"),
        None => message,
    };
    let (message, suggestion) = if let Some(refused) = answer["refused"].as_str() {
        (refused.to_owned(), None)
    } else {
        let error = &answer["error"];
        let kind = error["type"].as_str().unwrap_or("Exception");
        printed.insert("exception".into(), Value::String(kind.to_owned()));
        let summary = match error["message"].as_str() {
            Some(m) if !m.is_empty() => format!("{kind}: {m}"),
            _ => kind.to_owned(),
        };
        let traceback = error["traceback"].as_str().unwrap_or_default();
        let suggestion = (kind == "SyntaxError" || kind == "IndentationError")
            .then_some("fix the code at the line shown; `eval` takes one expression, `exec` statements");
        (format!("{summary}\n{traceback}"), suggestion)
    };
    let mut failure = ToolFailure::new(ErrorType::ExecutionError, noted(message));
    failure.suggested_action = suggestion.map(str::to_owned);
    if !printed.is_empty() {
        failure.partial = Some(Value::Object(printed));
    }
    Err(failure)
}

#[async_trait]
impl World for PythonWorld {
    async fn call(&self, actor: &Actor, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
        tool::call(TOOLS, Python.name(), self, actor, name, arguments).await
    }

    fn files(&self) -> Option<&dyn FileWorld> {
        Some(self)
    }

    fn describe(&self) -> Map<String, Value> {
        let mut info = Map::new();
        info.insert("cwd".into(), Value::String(self.root.display().to_string()));
        let python = json!({"executable": self.interpreter.executable, "version": self.interpreter.version});
        info.insert("python".into(), python);
        info.insert("sandbox".into(), self.sandbox.enforced().clone());
        info
    }

    async fn teardown(&mut self) {
        if let Some(mut session) = self.state.get_mut().session.take() {
            session.kill().await;
        }
        self.sandbox.kill_all();
        self.dir.remove().await;
    }
}

#[async_trait]
impl FileWorld for PythonWorld {
    /// A file the session left in its working directory; plain paths only, no links.
    async fn read_back(&self, path: &str, cap: usize) -> Result<ReadBack, ToolFailure> {
        use crate::environment::beneath::Links;
        use tokio::io::AsyncReadExt;
        let relative = std::path::Path::new(path);
        if !crate::domain::is_relative_inside(path) {
            return Err(ToolFailure::new(
                ErrorType::PermissionError,
                format!("`{path}` is outside the working directory"),
            ));
        }
        // Opened beneath the working directory, through no link at all: the kernel refuses
        // one at the moment of the open.
        let file = crate::environment::beneath::Beneath::open(&self.root)
            .and_then(|root| root.file(relative, libc::O_RDONLY | libc::O_NONBLOCK, 0, Links::None))
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP | libc::EXDEV) => {
                    ToolFailure::new(ErrorType::PermissionError, format!("`{path}` goes through a symbolic link"))
                }
                _ => ToolFailure::io(&format!("`{path}`"), e),
            })?;
        let file = tokio::fs::File::from_std(file);
        let meta = file.metadata().await.map_err(|e| ToolFailure::io(&format!("`{path}`"), e))?;
        if !meta.is_file() {
            return Err(ToolFailure::new(ErrorType::PermissionError, format!("`{path}` is not a regular file")));
        }
        let mut kept = Vec::new();
        file.take(cap as u64).read_to_end(&mut kept).await.map_err(|e| ToolFailure::io(&format!("`{path}`"), e))?;
        let text = String::from_utf8_lossy(&kept).into_owned();
        Ok(ReadBack { text, size: meta.len() })
    }
}

#[cfg(test)]
mod tests;
