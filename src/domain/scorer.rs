//! Scorers as written in a suite: one key names the scorer and holds its argument; the
//! other keys of the same mapping are its options.
//!
//! ```yaml
//! - includes: "{{ target }}"
//!   ignore_case: true
//!   weight: 2
//! ```

use std::collections::BTreeMap;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::contract::Actor;

/// One scorer: what it checks and how much it counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScorerSpec {
    /// The scorer's key as written: `includes`, `not_regex`, `tool_sequence`, …
    pub name: String,
    pub check: Check,
    pub weight: f64,
    /// `from: PATH`: a text of the final world (a file, a `kv` key, a writing room's
    /// `doc:ID` or export) that the check reads instead of the final answer.
    pub from: Option<String>,
    /// [`ScorerSpec::check_value`], made at its first score and shared by every score after.
    #[serde(skip)]
    pub recorded: Recorded,
}

/// What a scorer's scores record of its check, once made: a suite's scorer scores every
/// episode of every epoch alike.
#[derive(Debug, Clone, Default)]
pub struct Recorded(std::sync::OnceLock<std::sync::Arc<Value>>);

/// Made from the rest of the scorer, it never tells two scorers apart.
impl PartialEq for Recorded {
    fn eq(&self, _: &Recorded) -> bool {
        true
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TextOp {
    Includes,
    Equals,
    Regex,
}

/// How expected arguments match a call's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgMatch {
    /// The arguments are exactly these.
    Exact,
    /// Every expected key is present with an equal value (others may be there too).
    Subset,
    /// Like subset, but expected strings are regular expressions the value must match.
    Pattern,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Budget {
    Steps,
    ToolErrors,
    Tokens,
    CostUsd,
    LatencyS,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExpectedCall {
    pub name: String,
    pub arguments: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum JsonCheck {
    Valid,
    Schema(Value),
    PathEquals { path: String, value: Value },
}

/// Checks of the answer exactly as given, nothing trimmed: promptfoo's text assertions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Literal {
    /// `equals` with `exact: true`: the whole answer is this text.
    Equals { expected: String, negate: bool },
    /// `starts_with`, `not_starts_with`.
    StartsWith { expected: String, negate: bool },
    /// `contains_any`, `contains_all` and their `not_` forms, with `ignore_case`.
    Contains { values: Vec<String>, all: bool, negate: bool, ignore_case: bool },
    /// `levenshtein`: the edit distance to this text is at most `max_distance`.
    Levenshtein { expected: String, max_distance: f64 },
    /// `is_json` (the whole answer parses) or `contains_json` (some `{…}` in it does), with a
    /// schema it must match, and their `not_` forms.
    Json { schema: Option<Value>, anywhere: bool, negate: bool },
}

/// How a grader judges: the scorer's key says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GraderKind {
    /// `llm_rubric`: judge against criteria text.
    Rubric,
    /// `model_graded_qa`: judge the answer against the target.
    Qa,
    /// `model_graded_closedqa`: whether the answer meets a criterion, yes or no.
    ClosedQa,
    /// `factuality`: the answer's facts against a reference answer, one of five relations.
    Factuality,
}

impl GraderKind {
    /// The name templates see as `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            GraderKind::Rubric => "rubric",
            GraderKind::Qa => "qa",
            GraderKind::ClosedQa => "closedqa",
            GraderKind::Factuality => "factuality",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Check {
    /// The final answer against a text (a template).
    Text {
        op: TextOp,
        expected: String,
        negate: bool,
        ignore_case: bool,
    },
    /// The first number in the final answer against a number (a template), within a tolerance.
    Numeric {
        expected: String,
        tolerance: f64,
    },
    Json(JsonCheck),
    Literal(Literal),
    ToolCalled {
        name: String,
        negate: bool,
        /// Whose calls count (`actor:`); every agent's when not set.
        actor: Option<ActorFilter>,
    },
    ToolSequence {
        calls: Vec<ExpectedCall>,
        ordered: bool,
        arguments: ArgMatch,
        partial: bool,
        /// Whose calls make the sequence (`actor:`); every agent's when not set.
        actor: Option<ActorFilter>,
    },
    Budget {
        what: Budget,
        max: f64,
    },
    /// What the agent told the task's user (its conversation replies, the questions of
    /// `ask_user` and `clarify`, the plans of `exit_plan_mode`) contains a text (a template).
    Communicated {
        expected: String,
        ignore_case: bool,
    },
    /// A file (or, in `kv`, a key) exists in the final world.
    FileExists {
        path: String,
    },
    /// A file of the final world contains a text (a template) or matches a regex.
    FileContains {
        path: String,
        text: String,
        regex: bool,
    },
    /// A Markdown text of the final world has these sections and keeps these word counts.
    Document {
        path: String,
        sections: Vec<String>,
        min_words: Option<usize>,
        max_words: Option<usize>,
        max_section_words: Option<usize>,
    },
    /// A shell command, run in the episode's final working directory, exits 0.
    Command {
        command: String,
        timeout_s: f64,
    },
    /// A Harbor task's verifier: `tests/test.sh`, run in the final world with the task's
    /// paths mapped into the episode's folder; the reward it writes is the score.
    Verifier {
        /// The task's `tests/` folder, copied into the final world before it runs.
        tests: String,
        /// The Dockerfile's `WORKDIR`, which stands for the working directory.
        workdir: String,
        timeout_s: f64,
        /// `[verifier] env`: variables the script runs with.
        env: BTreeMap<String, String>,
    },
    /// A code scorer: a function in a file, or an inline expression, run in a long-lived
    /// worker process of its language (`scoring/workers/`).
    Code(CodeScorer),
    /// `similar`, `not_similar`: the cosine similarity of the embeddings of the answer and
    /// of a text (a template), from an embedding model, against a threshold.
    Similar {
        expected: String,
        threshold: f64,
        /// `provider/model`: an embedding model of an OpenAI-compatible provider.
        embedding: String,
        /// The embedding server's base URL, over the provider's.
        embedding_url: Option<String>,
        negate: bool,
    },
    /// An LLM grader.
    Grader {
        kind: GraderKind,
        criteria: Option<String>,
        model: Option<String>,
        template: Option<String>,
        samples: u32,
        threshold: f64,
        mock: Vec<String>,
    },
}

/// The languages code scorers are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    Python,
    Js,
}

impl Language {
    /// The scorer's key, and the language's name in messages.
    pub fn key(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Js => "js",
        }
    }

    /// Whether a scorer's argument names a file of this language (`file.py`, `x.mjs`).
    fn is_file(self, path: &str) -> bool {
        let extensions: &[&str] = match self {
            Language::Python => &[".py"],
            Language::Js => &[".js", ".mjs", ".cjs"],
        };
        !path.contains(char::is_whitespace) && extensions.iter().any(|e| path.ends_with(e))
    }
}

/// What a code scorer runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CodeSource {
    /// `file.py:function` (`score` when no function is named). The path is relative to the
    /// suite's folder as written; the suite's loader makes it absolute.
    File { path: String, function: String },
    /// An expression over `output`, `answer`, `task`, `vars`, `trajectory` and `files`; a
    /// text of several lines is a function's body, which `return`s the verdict.
    Inline(String),
}

/// A `python:` or `js:` scorer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CodeScorer {
    pub language: Language,
    pub source: CodeSource,
    /// How long one call may take before the worker is stopped (and restarted).
    pub timeout_s: f64,
    /// A returned number passes when it reaches this; without it, when it is above 0.
    pub threshold: Option<f64>,
    /// The interpreter: a path or a name on `PATH` (`python3` or `node` when not set).
    pub interpreter: Option<String>,
    /// `not_python`, `not_js`: the verdict turned over (the score kept, as promptfoo's `not-`).
    pub negate: bool,
}

/// Which agents' calls a trajectory scorer looks at: `actor: main`, `actor: main.1` (one
/// agent), or `actor: subagents` (any agent but the main one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActorFilter {
    One(Actor),
    Subagents,
}

impl ActorFilter {
    pub fn parse(text: &str) -> Result<ActorFilter, String> {
        if text == "subagents" {
            return Ok(ActorFilter::Subagents);
        }
        Actor::parse(text)
            .map(ActorFilter::One)
            .map_err(|_| format!("`actor` is `main`, `main.1`, `main.1.2`, … or `subagents`, not `{text}`"))
    }

    pub fn matches(&self, actor: &Actor) -> bool {
        match self {
            ActorFilter::One(one) => one == actor,
            ActorFilter::Subagents => matches!(actor, Actor::Subagent(_)),
        }
    }
}

/// Written as in the suite: `main.1` or `subagents`.
impl Serialize for ActorFilter {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl std::fmt::Display for ActorFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActorFilter::One(actor) => actor.fmt(f),
            ActorFilter::Subagents => f.write_str("subagents"),
        }
    }
}

/// Every scorer key, for error messages.
pub const SCORERS: &[&str] = &[
    "includes",
    "not_includes",
    "equals",
    "not_equals",
    "regex",
    "not_regex",
    "numeric",
    "json",
    "tool_called",
    "tool_not_called",
    "tool_sequence",
    "max_steps",
    "max_tool_errors",
    "max_tokens",
    "max_cost",
    "max_latency",
    "communicated",
    "file_exists",
    "file_contains",
    "document",
    "check",
    "llm_rubric",
    "model_graded_qa",
    "model_graded_closedqa",
    "factuality",
    "python",
    "js",
    "not_python",
    "not_js",
    "starts_with",
    "not_starts_with",
    "contains_any",
    "not_contains_any",
    "contains_all",
    "not_contains_all",
    "levenshtein",
    "is_json",
    "not_is_json",
    "contains_json",
    "not_contains_json",
    "similar",
    "not_similar",
];

impl<'de> Deserialize<'de> for ScorerSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = Map::<String, Value>::deserialize(deserializer)?;
        parse(map).map_err(de::Error::custom)
    }
}

/// Reads the options of one scorer, refusing any it does not know.
struct Options {
    scorer: String,
    map: Map<String, Value>,
    allowed: Vec<&'static str>,
}

impl Options {
    fn take<T: for<'a> Deserialize<'a>>(&mut self, key: &'static str) -> Result<Option<T>, String> {
        self.allowed.push(key);
        match self.map.remove(key) {
            None => Ok(None),
            Some(v) => serde_json::from_value(v).map(Some).map_err(|e| format!("`{key}` of `{}`: {e}", self.scorer)),
        }
    }

    /// A number option; an unquoted YAML number the suite kept as text (`1e-3`) counts.
    fn take_number(&mut self, key: &'static str) -> Result<Option<f64>, String> {
        self.allowed.push(key);
        match self.map.remove(key) {
            None => Ok(None),
            Some(v) => number_of(&v).map(Some).map_err(|e| format!("`{key}` of `{}`: {e}", self.scorer)),
        }
    }

    /// The scorer's argument as a text (a number or a boolean is written out).
    fn text(&self, v: Value) -> Result<String, String> {
        match v {
            Value::String(s) => Ok(s),
            Value::Number(n) => Ok(n.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            other => Err(format!("`{}` takes a text, not {other}", self.scorer)),
        }
    }

    /// The scorer's argument as a number of at least 0.
    fn at_least_zero(&self, v: &Value) -> Result<f64, String> {
        let name = &self.scorer;
        match number_of(v) {
            Ok(x) if x >= 0.0 => Ok(x),
            Ok(_) => Err(format!("`{name}` takes a number of at least 0, not {v}")),
            Err(e) => Err(format!("`{name}` takes a number of at least 0: {e}")),
        }
    }

    fn finish(self) -> Result<(), String> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(key) => {
                Err(format!("`{key}` is not an option of `{}` (its options: {})", self.scorer, self.allowed.join(", ")))
            }
        }
    }
}

/// The longest a `check` command may be given: thirty days, as for an episode.
const MAX_CHECK_S: f64 = 30.0 * 24.0 * 3600.0;

/// A finite number, from a JSON number or the text of a YAML one; says what is wrong.
fn number_of(v: &Value) -> Result<f64, String> {
    let x = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match yaml_rust2::Yaml::from_str(s) {
            yaml_rust2::Yaml::Integer(i) => Some(i as f64),
            real @ yaml_rust2::Yaml::Real(_) => real.as_f64(),
            _ => None,
        },
        _ => None,
    };
    match x {
        Some(x) if x.is_finite() => Ok(x),
        Some(_) => Err(format!("not a finite number: {}", v.as_str().map_or_else(|| v.to_string(), str::to_owned))),
        None => Err(format!("expected a number, found {v}")),
    }
}

fn parse(mut map: Map<String, Value>) -> Result<ScorerSpec, String> {
    let name = scorer_key(&map)?;
    let arg = map.remove(&name).unwrap_or(Value::Null);
    let mut o = Options { scorer: name.clone(), map, allowed: Vec::new() };
    let weight: f64 = o.take_number("weight")?.unwrap_or(1.0);
    // The checks of a text take it from the final answer, or from the world with `from:`.
    let from: Option<String> = if reads_text(&name) { o.take("from")? } else { None };
    if from.as_deref().is_some_and(|f| f.trim().is_empty()) {
        return Err(format!("`from` of `{name}` names a file or document, not an empty text"));
    }
    if !(weight.is_finite() && weight >= 0.0) {
        return Err(format!("the weight of `{name}` must be a number of at least 0"));
    }
    let check = match name.as_str() {
        "includes" | "not_includes" | "equals" | "not_equals" | "regex" | "not_regex" => text(arg, &mut o)?,
        "starts_with" | "not_starts_with" | "contains_any" | "not_contains_any" | "contains_all"
        | "not_contains_all" | "levenshtein" | "is_json" | "not_is_json" | "contains_json" | "not_contains_json" => {
            Check::Literal(literal(arg, &mut o)?)
        }
        "numeric" => numeric(arg, &mut o)?,
        "json" => json(arg)?,
        "tool_called" | "tool_not_called" => tool_called(arg, &mut o)?,
        "tool_sequence" => tool_sequence(arg, &mut o)?,
        "max_steps" | "max_tool_errors" | "max_tokens" | "max_cost" | "max_latency" => budget(arg, &o)?,
        "communicated" => communicated(arg, &mut o)?,
        "file_exists" => Check::FileExists { path: o.text(arg)? },
        "file_contains" => file_contains(arg, &o)?,
        "document" => document(arg, &mut o)?,
        "check" => command(arg, &mut o)?,
        "python" | "not_python" => code(Language::Python, arg, &mut o, name.starts_with("not_"))?,
        "js" | "not_js" => code(Language::Js, arg, &mut o, name.starts_with("not_"))?,
        "similar" | "not_similar" => similar(arg, &mut o)?,
        _ => grader(arg, &mut o)?,
    };
    o.finish()?;
    Ok(ScorerSpec { name, check, weight, from, recorded: Recorded::default() })
}

/// The one key of a scorer's mapping that names it.
fn scorer_key(map: &Map<String, Value>) -> Result<String, String> {
    let named: Vec<&String> = map.keys().filter(|k| SCORERS.contains(&k.as_str())).collect();
    match named.as_slice() {
        [one] => Ok((*one).clone()),
        [] => {
            let found: Vec<&str> = map.keys().map(String::as_str).collect();
            Err(format!("a scorer needs one of: {} (found {})", SCORERS.join(", "), found.join(", ")))
        }
        [a, b, ..] => Err(format!("one scorer per item: `{a}` and `{b}` are two")),
    }
}

/// Whether a scorer checks a text (the final answer, or `from:` a text of the world).
fn reads_text(name: &str) -> bool {
    matches!(
        name,
        "includes"
            | "not_includes"
            | "equals"
            | "not_equals"
            | "regex"
            | "not_regex"
            | "numeric"
            | "json"
            | "llm_rubric"
            | "model_graded_qa"
            | "model_graded_closedqa"
            | "factuality"
            | "starts_with"
            | "not_starts_with"
            | "contains_any"
            | "not_contains_any"
            | "contains_all"
            | "not_contains_all"
            | "levenshtein"
            | "is_json"
            | "not_is_json"
            | "contains_json"
            | "not_contains_json"
            | "similar"
            | "not_similar"
    )
}

/// `similar: TEXT` with `embedding: provider/model` (and `embedding_url:` for a server of
/// its own), `threshold` (0.75, promptfoo's default) and the `not_` form.
fn similar(arg: Value, o: &mut Options) -> Result<Check, String> {
    let expected = o.text(arg)?;
    let threshold = o.take_number("threshold")?.unwrap_or(0.75);
    if !(-1.0..=1.0).contains(&threshold) {
        return Err(format!("`threshold` of `{}` is a cosine similarity, from -1 to 1, not {threshold}", o.scorer));
    }
    let Some(embedding) = o.take::<String>("embedding")? else {
        return Err(format!(
            "`{}` needs `embedding: provider/model`, an embedding model (e.g. openai/text-embedding-3-small)",
            o.scorer
        ));
    };
    let embedding_url = o.take("embedding_url")?;
    Ok(Check::Similar { expected, threshold, embedding, embedding_url, negate: o.scorer.starts_with("not_") })
}

/// `includes`, `equals`, `regex` and their `not_` forms, with `ignore_case`.
fn text(arg: Value, o: &mut Options) -> Result<Check, String> {
    let op = match o.scorer.trim_start_matches("not_") {
        "includes" => TextOp::Includes,
        "equals" => TextOp::Equals,
        _ => TextOp::Regex,
    };
    let ignore_case = o.take("ignore_case")?.unwrap_or(false);
    let negate = o.scorer.starts_with("not_");
    if op == TextOp::Equals && o.take("exact")?.unwrap_or(false) {
        if ignore_case {
            return Err(format!("`{}` with `exact: true` compares the text as it is: no `ignore_case`", o.scorer));
        }
        return Ok(Check::Literal(Literal::Equals { expected: o.text(arg)?, negate }));
    }
    Ok(Check::Text { op, expected: o.text(arg)?, negate, ignore_case })
}

/// The checks of the answer as given: `starts_with`, `contains_any`/`_all` (a list, or a
/// comma-separated text), `levenshtein` with `max_distance` (default 5), `is_json` and
/// `contains_json` (`true`, or a JSON Schema), and their `not_` forms.
fn literal(arg: Value, o: &mut Options) -> Result<Literal, String> {
    let negate = o.scorer.starts_with("not_");
    let base = o.scorer.trim_start_matches("not_").to_owned();
    Ok(match base.as_str() {
        "starts_with" => Literal::StartsWith { expected: o.text(arg)?, negate },
        "contains_any" | "contains_all" => {
            let values = match arg {
                Value::Array(items) => items.into_iter().map(|v| o.text(v)).collect::<Result<Vec<_>, _>>()?,
                other => comma_separated(&o.text(other)?),
            };
            if values.is_empty() || values.iter().any(String::is_empty) {
                return Err(format!("`{}` takes a list of non-empty texts", o.scorer));
            }
            let ignore_case = o.take("ignore_case")?.unwrap_or(false);
            Literal::Contains { values, all: base == "contains_all", negate, ignore_case }
        }
        "levenshtein" => {
            let max_distance = o.take_number("max_distance")?.unwrap_or(5.0);
            if max_distance < 0.0 {
                return Err(format!("`max_distance` of `levenshtein` must be at least 0, not {max_distance}"));
            }
            Literal::Levenshtein { expected: o.text(arg)?, max_distance }
        }
        _ => {
            let schema = match arg {
                Value::Bool(true) | Value::Null => None,
                schema @ Value::Object(_) => Some(schema),
                other => return Err(format!("`{}` takes `true` or a JSON Schema, not {other}", o.scorer)),
            };
            Literal::Json { schema, anywhere: base == "contains_json", negate }
        }
    })
}

/// `a, b,"c, d"`: the values of a comma-separated text, trimmed; a quoted value keeps its
/// commas (promptfoo's reading of a `contains-any` text).
pub fn comma_separated(text: &str) -> Vec<String> {
    let mut values = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => values.push(std::mem::take(&mut current).trim().to_owned()),
            c => current.push(c),
        }
    }
    values.push(current.trim().to_owned());
    values
}

/// `numeric`, with a `tolerance` of at least 0.
fn numeric(arg: Value, o: &mut Options) -> Result<Check, String> {
    let tolerance: f64 = o.take_number("tolerance")?.unwrap_or(0.0);
    if !(tolerance.is_finite() && tolerance >= 0.0) {
        return Err(format!("the tolerance of `numeric` must be a number of at least 0, not {tolerance}"));
    }
    Ok(Check::Numeric { expected: o.text(arg)?, tolerance })
}

/// `json: valid`, `json: {schema: …}` or `json: {path: …, equals: …}`.
fn json(arg: Value) -> Result<Check, String> {
    const TAKES: &str = "`json` takes `valid`, `{schema: …}` or `{path: /a/b, equals: …}`";
    Ok(Check::Json(match arg {
        Value::String(s) if s == "valid" => JsonCheck::Valid,
        Value::Object(mut m) => match (m.remove("schema"), m.remove("path"), m.remove("equals")) {
            (Some(schema), None, None) if m.is_empty() => JsonCheck::Schema(schema),
            (None, Some(Value::String(path)), Some(value)) if m.is_empty() => JsonCheck::PathEquals { path, value },
            _ => return Err(TAKES.into()),
        },
        _ => return Err(TAKES.into()),
    }))
}

/// `tool_called` and `tool_not_called`, with `actor`.
fn tool_called(arg: Value, o: &mut Options) -> Result<Check, String> {
    let actor = o.take::<String>("actor")?.map(|a| ActorFilter::parse(&a)).transpose()?;
    Ok(Check::ToolCalled { name: o.text(arg)?, negate: o.scorer == "tool_not_called", actor })
}

/// `tool_sequence`: a list of calls (names, or `{name, arguments}`), with `order`,
/// `arguments` (patterns are checked here), `partial` and `actor`.
fn tool_sequence(arg: Value, o: &mut Options) -> Result<Check, String> {
    let Value::Array(items) = arg else {
        return Err("`tool_sequence` takes a list of calls: [{name: …, arguments: {…}}]".into());
    };
    let calls = items.into_iter().map(expected_call).collect::<Result<Vec<_>, _>>()?;
    if calls.is_empty() {
        return Err("`tool_sequence` needs at least one call".into());
    }
    let ordered = match o.take::<String>("order")?.as_deref() {
        None | Some("ordered") => true,
        Some("unordered") => false,
        Some(other) => return Err(format!("`order` is `ordered` or `unordered`, not `{other}`")),
    };
    let arguments = o.take("arguments")?.unwrap_or(ArgMatch::Subset);
    if arguments == ArgMatch::Pattern {
        for call in &calls {
            for pattern in
                call.arguments.iter().flat_map(|a| a.as_object()).flat_map(|m| m.values()).filter_map(Value::as_str)
            {
                regex::Regex::new(pattern)
                    .map_err(|e| format!("`{pattern}` in `tool_sequence` is not a valid regex: {e}"))?;
            }
        }
    }
    let partial = o.take("partial")?.unwrap_or(false);
    let actor = o.take::<String>("actor")?.map(|a| ActorFilter::parse(&a)).transpose()?;
    Ok(Check::ToolSequence { calls, ordered, arguments, partial, actor })
}

/// One call of a `tool_sequence`: a name, or `{name, arguments}`.
fn expected_call(item: Value) -> Result<ExpectedCall, String> {
    match item {
        Value::String(name) => Ok(ExpectedCall { name, arguments: None }),
        Value::Object(mut m) => {
            let call_name = match m.remove("name") {
                Some(Value::String(n)) => n,
                _ => return Err("each call of `tool_sequence` needs a `name`".to_string()),
            };
            let arguments = m.remove("arguments");
            match m.keys().next() {
                Some(k) => Err(format!("`{k}` is not a field of a `tool_sequence` call (name, arguments)")),
                None => Ok(ExpectedCall { name: call_name, arguments }),
            }
        }
        other => Err(format!("a `tool_sequence` call is a name or {{name, arguments}}, not {other}")),
    }
}

/// `max_steps`, `max_tool_errors`, `max_tokens`, `max_cost`, `max_latency`: a number of at
/// least 0.
fn budget(arg: Value, o: &Options) -> Result<Check, String> {
    let what = match o.scorer.as_str() {
        "max_steps" => Budget::Steps,
        "max_tool_errors" => Budget::ToolErrors,
        "max_tokens" => Budget::Tokens,
        "max_cost" => Budget::CostUsd,
        _ => Budget::LatencyS,
    };
    Ok(Check::Budget { what, max: o.at_least_zero(&arg)? })
}

/// `communicated`, with `ignore_case`.
fn communicated(arg: Value, o: &mut Options) -> Result<Check, String> {
    let ignore_case = o.take("ignore_case")?.unwrap_or(false);
    Ok(Check::Communicated { expected: o.text(arg)?, ignore_case })
}

/// `file_contains: {path: …, text: …}` or `{path: …, regex: …}`.
fn file_contains(arg: Value, o: &Options) -> Result<Check, String> {
    let Value::Object(mut m) = arg else {
        return Err("`file_contains` takes {path: …, text: …} or {path: …, regex: …}".into());
    };
    let path = match m.remove("path") {
        Some(Value::String(p)) => p,
        _ => return Err("`file_contains` needs a `path`".into()),
    };
    let (expected, regex) = match (m.remove("text"), m.remove("regex")) {
        (Some(t), None) => (o.text(t)?, false),
        (None, Some(r)) => (o.text(r)?, true),
        _ => return Err("`file_contains` needs one of `text` or `regex`".into()),
    };
    if let Some(k) = m.keys().next() {
        return Err(format!("`{k}` is not a field of `file_contains` (path, text, regex)"));
    }
    Ok(Check::FileContains { path, text: expected, regex })
}

/// `document`, with at least one of `sections`, `min_words`, `max_words`,
/// `max_section_words`.
fn document(arg: Value, o: &mut Options) -> Result<Check, String> {
    let path = o.text(arg)?;
    let sections: Vec<String> = o.take("sections")?.unwrap_or_default();
    let min_words = o.take("min_words")?;
    let max_words = o.take("max_words")?;
    let max_section_words = o.take("max_section_words")?;
    if sections.is_empty() && min_words.is_none() && max_words.is_none() && max_section_words.is_none() {
        return Err(
            "`document` needs something to check: `sections`, `min_words`, `max_words` or `max_section_words`".into()
        );
    }
    if let (Some(min), Some(max)) = (min_words, max_words)
        && min > max
    {
        return Err(format!("`document`: min_words ({min}) is more than max_words ({max}): no text could pass"));
    }
    Ok(Check::Document { path, sections, min_words, max_words, max_section_words })
}

/// `check`: a command, with a `timeout_s` of at most thirty days.
fn command(arg: Value, o: &mut Options) -> Result<Check, String> {
    let timeout_s = o.take_number("timeout_s")?.unwrap_or(30.0);
    if !(0.001..=MAX_CHECK_S).contains(&timeout_s) {
        return Err(format!(
            "the `timeout_s` of `check` must be a number of seconds from 0.001 to {MAX_CHECK_S}, not {timeout_s}"
        ));
    }
    Ok(Check::Command { command: o.text(arg)?, timeout_s })
}

/// The longest one call of a code scorer may take by default.
const CODE_TIMEOUT_S: f64 = 10.0;

/// `python:` and `js:`: `file:function`, `file` (function `score`) or an inline expression,
/// with `timeout_s`, `threshold` and `interpreter`.
fn code(language: Language, arg: Value, o: &mut Options, negate: bool) -> Result<Check, String> {
    let key = language.key();
    let text = match arg {
        Value::String(s) if !s.trim().is_empty() => s,
        other => return Err(format!("`{key}` takes `file:function` or an expression, not {other}")),
    };
    let named = text.trim().strip_prefix("file://").unwrap_or(text.trim());
    let (path, function) = match named.rsplit_once(':') {
        Some((path, function)) if language.is_file(path) => (path, function),
        _ if language.is_file(named) => (named, "score"),
        _ => ("", ""),
    };
    let source = if path.is_empty() {
        CodeSource::Inline(text)
    } else if is_identifier(function) {
        CodeSource::File { path: path.to_owned(), function: function.to_owned() }
    } else {
        return Err(format!("`{key}: {named}`: `{function}` is not a function's name"));
    };
    let timeout_s = o.take_number("timeout_s")?.unwrap_or(CODE_TIMEOUT_S);
    if !(0.001..=MAX_CHECK_S).contains(&timeout_s) {
        return Err(format!(
            "the `timeout_s` of `{key}` must be a number of seconds from 0.001 to {MAX_CHECK_S}, not {timeout_s}"
        ));
    }
    let threshold = o.take_number("threshold")?;
    let interpreter: Option<String> = o.take("interpreter")?;
    if interpreter.as_deref().is_some_and(|i| i.trim().is_empty()) {
        return Err(format!("the `interpreter` of `{key}` names a program, not an empty text"));
    }
    Ok(Check::Code(CodeScorer { language, source, timeout_s, threshold, interpreter, negate }))
}

/// A name a function can have in Python and JavaScript.
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

/// `llm_rubric` (criteria), `model_graded_closedqa` (a criterion), `factuality` (the
/// reference answer) and `model_graded_qa` (no argument), with `samples`, `threshold`,
/// `model`, `template` and `mock`.
fn grader(arg: Value, o: &mut Options) -> Result<Check, String> {
    let kind = match o.scorer.as_str() {
        "llm_rubric" => GraderKind::Rubric,
        "model_graded_closedqa" => GraderKind::ClosedQa,
        "factuality" => GraderKind::Factuality,
        _ => GraderKind::Qa,
    };
    let criteria = match (kind, arg) {
        (GraderKind::Rubric | GraderKind::ClosedQa | GraderKind::Factuality, v) => Some(o.text(v)?),
        (GraderKind::Qa, Value::Null | Value::Bool(true)) => None,
        (GraderKind::Qa, Value::Object(m)) if m.is_empty() => None,
        (GraderKind::Qa, other) => {
            return Err(format!("`model_graded_qa` takes no argument (write `model_graded_qa: true`), not {other}"));
        }
    };
    let samples = o.take_number("samples")?.unwrap_or(1.0);
    if !(samples >= 1.0 && samples <= f64::from(u32::MAX) && samples.fract() == 0.0) {
        return Err(format!("`samples` must be a whole number of at least 1, not {samples}"));
    }
    let samples = samples as u32;
    let threshold: f64 = o.take_number("threshold")?.unwrap_or(0.5);
    if !(0.0..=1.0).contains(&threshold) {
        return Err("`threshold` must be between 0 and 1".into());
    }
    Ok(Check::Grader {
        kind,
        criteria,
        model: o.take("model")?,
        template: o.take("template")?,
        samples,
        threshold,
        mock: o.take("mock")?.unwrap_or_default(),
    })
}

impl ScorerSpec {
    /// What the scorer checks, as a score records it (to recognise it in a regrade): the
    /// check, and where its text comes from when that is not the final answer.
    pub fn check_value(&self) -> std::sync::Arc<Value> {
        self.recorded
            .0
            .get_or_init(|| {
                let check = serde_json::to_value(&self.check).unwrap_or_default();
                std::sync::Arc::new(match &self.from {
                    None => check,
                    Some(from) => serde_json::json!({"from": from, "check": check}),
                })
            })
            .clone()
    }

    /// Whether it looks at the episode's final world, which a regrade no longer has.
    pub fn reads_world(&self) -> bool {
        self.from.is_some()
            || matches!(
                self.check,
                Check::FileExists { .. }
                    | Check::FileContains { .. }
                    | Check::Document { .. }
                    | Check::Command { .. }
                    | Check::Verifier { .. }
                    | Check::Code(_)
            )
    }

    /// The tools this scorer refers to, to check against the environment.
    pub fn tools(&self) -> Vec<&str> {
        match &self.check {
            Check::ToolCalled { name, .. } => vec![name.as_str()],
            Check::ToolSequence { calls, .. } => calls.iter().map(|c| c.name.as_str()).collect(),
            _ => Vec::new(),
        }
    }

    /// The templates this scorer renders per task.
    pub fn templates(&self) -> Vec<&str> {
        match &self.check {
            Check::Text { expected, .. } | Check::Numeric { expected, .. } | Check::Communicated { expected, .. } => {
                vec![expected.as_str()]
            }
            Check::FileContains { text, .. } => vec![text.as_str()],
            Check::Literal(Literal::Equals { expected, .. })
            | Check::Literal(Literal::StartsWith { expected, .. })
            | Check::Literal(Literal::Levenshtein { expected, .. })
            | Check::Similar { expected, .. } => vec![expected.as_str()],
            Check::Literal(Literal::Contains { values, .. }) => values.iter().map(String::as_str).collect(),
            Check::Grader { criteria: Some(c), .. } => vec![c.as_str()],
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> Result<ScorerSpec, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_communicated_with_its_option() {
        let s = spec(json!({"communicated": "the blue one", "ignore_case": true})).unwrap();
        assert_eq!(s.check, Check::Communicated { expected: "the blue one".into(), ignore_case: true });
        let e = spec(json!({"communicated": "x", "tolerance": 1})).unwrap_err();
        assert!(e.contains("`tolerance` is not an option of `communicated`"), "{e}");
    }

    #[test]
    fn reads_a_scorer_with_its_options() {
        let s = spec(json!({"not_includes": "error", "ignore_case": true, "weight": 2})).unwrap();
        assert_eq!(s.weight, 2.0);
        assert_eq!(
            s.check,
            Check::Text { op: TextOp::Includes, expected: "error".into(), negate: true, ignore_case: true }
        );
    }

    #[test]
    fn an_option_of_another_scorer_is_refused_with_the_valid_ones() {
        let e = spec(json!({"equals": "x", "tolerance": 1})).unwrap_err();
        assert!(e.contains("`tolerance` is not an option of `equals`") && e.contains("ignore_case"), "{e}");
    }

    #[test]
    fn exactly_one_scorer_per_item() {
        assert!(spec(json!({"equals": "x", "regex": "y"})).unwrap_err().contains("one scorer per item"));
        assert!(spec(json!({"contains": "x"})).unwrap_err().contains("a scorer needs one of"));
    }

    #[test]
    fn reads_tool_sequences_and_budgets_and_graders() {
        let s = spec(json!({"tool_sequence": ["ls", {"name": "read_file", "arguments": {"path": "a"}}], "order": "unordered", "arguments": "exact", "partial": true})).unwrap();
        let Check::ToolSequence { calls, ordered, arguments, partial, .. } = s.check else { panic!() };
        assert_eq!((calls.len(), ordered, arguments, partial), (2, false, ArgMatch::Exact, true));
        assert_eq!(spec(json!({"max_steps": 5})).unwrap().check, Check::Budget { what: Budget::Steps, max: 5.0 });
        let g = spec(json!({"llm_rubric": "says three", "samples": 3, "model": "openai/x"})).unwrap();
        assert!(matches!(g.check, Check::Grader { kind: GraderKind::Rubric, samples: 3, .. }));
        assert!(spec(json!({"model_graded_qa": true})).is_ok());
        assert!(spec(json!({"json": {"path": "/a", "equals": 1}})).is_ok());
        assert!(spec(json!({"json": "maybe"})).is_err());
    }

    #[test]
    fn a_code_scorer_names_a_file_and_function_or_is_an_expression() {
        let code = |v: Value| match spec(v).map(|s| s.check) {
            Ok(Check::Code(c)) => Ok(c),
            Ok(other) => Err(format!("not a code scorer: {other:?}")),
            Err(e) => Err(e),
        };
        let file = code(json!({"python": "scorers/check.py:grade", "timeout_s": 2})).unwrap();
        assert_eq!(file.source, CodeSource::File { path: "scorers/check.py".into(), function: "grade".into() });
        assert_eq!((file.language, file.timeout_s), (Language::Python, 2.0));
        let default = code(json!({"js": "file://check.mjs"})).unwrap();
        assert_eq!(default.source, CodeSource::File { path: "check.mjs".into(), function: "score".into() });
        let inline = code(json!({"python": "output.strip() == 'yes'"})).unwrap();
        assert_eq!(inline.source, CodeSource::Inline("output.strip() == 'yes'".into()));
        let ternary = code(json!({"js": "output.length > 3 ? 1 : 0"})).unwrap();
        assert!(matches!(ternary.source, CodeSource::Inline(_)), "a `:` in an expression is no file");
        assert!(code(json!({"python": "a.py:not-a-name"})).unwrap_err().contains("not a function's name"));
        assert!(code(json!({"python": ""})).unwrap_err().contains("takes `file:function`"));
        assert!(code(json!({"js": "x", "timeout_s": 0})).unwrap_err().contains("timeout_s"));
        assert!(code(json!({"js": "x", "samples": 2})).unwrap_err().contains("not an option of `js`"));
    }
}
