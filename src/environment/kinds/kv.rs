//! `kv`: an in-process key-value store and a calculator. Its tools cost microseconds, so
//! tests and benchmarks measure the runner rather than the tools. The store starts with
//! the definition's and the task's `files:` as entries.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::EnvironmentKind;
use crate::contract::{Actor, ErrorType, ToolAnnotations};
use crate::domain::Task;
use crate::environment::tool::{self, Tool, ToolDecl};
use crate::environment::{
    Definition, FileWorld, ReadBack, SetupContext, SetupError, ToolFailure, World, decode_arguments,
};

/// The kind `kv`.
pub struct Kv;

#[async_trait]
impl EnvironmentKind for Kv {
    fn name(&self) -> &'static str {
        "kv"
    }

    fn tools(&self) -> Vec<ToolDecl> {
        tool::offer(TOOLS)
    }

    /// Its world is a map in memory.
    fn makes_folders(&self) -> bool {
        false
    }

    async fn setup(
        &self,
        definition: &Definition,
        task: &Task,
        _context: &SetupContext<'_>,
    ) -> Result<Box<dyn World>, SetupError> {
        Ok(Box::new(KvWorld::create(definition, task)))
    }
}

/// The tools of `kv`, in the order models are shown them.
pub const TOOLS: &[&dyn Tool<KvWorld>] = &[&KvGet, &KvSet, &KvDelete, &KvList, &Calc];

pub struct KvWorld {
    store: Mutex<BTreeMap<String, String>>,
}

impl KvWorld {
    pub fn create(definition: &Definition, task: &Task) -> Self {
        let mut store = definition.files.clone();
        store.extend(task.files.iter().map(|(k, v)| (k.clone(), v.clone())));
        KvWorld { store: Mutex::new(store) }
    }

    fn with_store<T>(&self, f: impl FnOnce(&mut BTreeMap<String, String>) -> T) -> T {
        // A poisoned lock only means another call panicked; the map itself is intact.
        let mut guard = self.store.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }
}

fn key_schema() -> Value {
    json!({"type": "string", "minLength": 1})
}

fn no_key(key: &str) -> ToolFailure {
    ToolFailure::new(ErrorType::ExecutionError, format!("no key `{key}`")).suggest("call kv_list to see the keys")
}

#[derive(Deserialize)]
struct Key {
    key: String,
}

struct KvGet;

#[async_trait]
impl Tool<KvWorld> for KvGet {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "kv_get"
    }

    fn description(&self) -> &'static str {
        "Read the value stored under a key."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object", "properties": {"key": key_schema()}, "required": ["key"], "additionalProperties": false})
    }

    async fn call(&self, world: &KvWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let Key { key } = decode_arguments(arguments)?;
        match world.with_store(|s| s.get(&key).cloned()) {
            Some(value) => Ok(json!({"key": key, "value": value})),
            None => Err(no_key(&key)),
        }
    }
}

struct KvSet;

#[derive(Deserialize)]
struct SetArgs {
    key: String,
    value: String,
}

#[async_trait]
impl Tool<KvWorld> for KvSet {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "kv_set"
    }

    fn description(&self) -> &'static str {
        "Store a value under a key, replacing any old value."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object", "properties": {"key": key_schema(), "value": {"type": "string"}},
            "required": ["key", "value"], "additionalProperties": false})
    }

    async fn call(&self, world: &KvWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let SetArgs { key, value } = decode_arguments(arguments)?;
        let replaced = world.with_store(|s| s.insert(key.clone(), value).is_some());
        Ok(json!({"key": key, "replaced": replaced}))
    }
}

struct KvDelete;

#[async_trait]
impl Tool<KvWorld> for KvDelete {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "kv_delete"
    }

    fn description(&self) -> &'static str {
        "Remove a key."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object", "properties": {"key": key_schema()}, "required": ["key"], "additionalProperties": false})
    }

    async fn call(&self, world: &KvWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let Key { key } = decode_arguments(arguments)?;
        match world.with_store(|s| s.remove(&key)) {
            Some(_) => Ok(json!({"key": key, "deleted": true})),
            None => Err(no_key(&key)),
        }
    }
}

struct KvList;

#[derive(Deserialize)]
struct ListArgs {
    #[serde(default)]
    prefix: String,
}

#[async_trait]
impl Tool<KvWorld> for KvList {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "kv_list"
    }

    fn description(&self) -> &'static str {
        "List the keys, optionally only those starting with a prefix."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object", "properties": {"prefix": {"type": "string", "default": ""}},
            "additionalProperties": false})
    }

    async fn call(&self, world: &KvWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let ListArgs { prefix } = decode_arguments(arguments)?;
        let keys: Vec<String> = world.with_store(|s| s.keys().filter(|k| k.starts_with(&prefix)).cloned().collect());
        Ok(json!({"keys": keys}))
    }
}

struct Calc;

#[derive(Deserialize)]
struct CalcArgs {
    expression: String,
}

#[async_trait]
impl Tool<KvWorld> for Calc {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "calc"
    }

    fn description(&self) -> &'static str {
        "Evaluate an arithmetic expression: numbers, + - * /, parentheses."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object", "properties": {"expression": {"type": "string"}},
            "required": ["expression"], "additionalProperties": false})
    }

    async fn call(&self, _world: &KvWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let CalcArgs { expression } = decode_arguments(arguments)?;
        let value = calc::evaluate(&expression).map_err(|e| {
            ToolFailure::new(ErrorType::ExecutionError, e).suggest("use numbers, + - * / and parentheses")
        })?;
        Ok(json!({"expression": expression, "value": value}))
    }
}

#[async_trait]
impl World for KvWorld {
    async fn call(&self, actor: &Actor, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
        tool::call(TOOLS, Kv.name(), self, actor, name, arguments).await
    }

    fn files(&self) -> Option<&dyn FileWorld> {
        Some(self)
    }
}

#[async_trait]
impl FileWorld for KvWorld {
    async fn read_back(&self, key: &str, cap: usize) -> Result<ReadBack, ToolFailure> {
        let value = self.with_store(|s| s.get(key).cloned());
        let value =
            value.ok_or_else(|| ToolFailure::new(ErrorType::ExecutionError, format!("`{key}` does not exist")))?;
        let size = value.len() as u64;
        let mut end = cap.min(value.len());
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        Ok(ReadBack { text: value[..end].to_owned(), size })
    }
}

/// A small recursive-descent calculator.
mod calc {
    pub fn evaluate(text: &str) -> Result<f64, String> {
        let mut p = Parser { chars: text.chars().filter(|c| !c.is_whitespace()).collect(), at: 0 };
        let value = p.sum()?;
        if p.at != p.chars.len() {
            return Err(format!("unexpected `{}` at position {}", p.chars[p.at], p.at + 1));
        }
        if !value.is_finite() {
            return Err("the result is not a finite number (division by zero?)".into());
        }
        Ok(value)
    }

    struct Parser {
        chars: Vec<char>,
        at: usize,
    }

    impl Parser {
        fn peek(&self) -> Option<char> {
            self.chars.get(self.at).copied()
        }

        fn sum(&mut self) -> Result<f64, String> {
            let mut value = self.product()?;
            while let Some(op @ ('+' | '-')) = self.peek() {
                self.at += 1;
                let rhs = self.product()?;
                value = if op == '+' { value + rhs } else { value - rhs };
            }
            Ok(value)
        }

        fn product(&mut self) -> Result<f64, String> {
            let mut value = self.unary()?;
            while let Some(op @ ('*' | '/')) = self.peek() {
                self.at += 1;
                let rhs = self.unary()?;
                value = if op == '*' { value * rhs } else { value / rhs };
            }
            Ok(value)
        }

        fn unary(&mut self) -> Result<f64, String> {
            match self.peek() {
                Some('-') => {
                    self.at += 1;
                    Ok(-self.unary()?)
                }
                Some('(') => {
                    self.at += 1;
                    let value = self.sum()?;
                    if self.peek() != Some(')') {
                        return Err("missing `)`".into());
                    }
                    self.at += 1;
                    Ok(value)
                }
                Some(c) if c.is_ascii_digit() || c == '.' => {
                    let start = self.at;
                    while self.peek().is_some_and(|c| c.is_ascii_digit() || c == '.') {
                        self.at += 1;
                    }
                    let number: String = self.chars[start..self.at].iter().collect();
                    number.parse().map_err(|_| format!("`{number}` is not a number"))
                }
                Some(c) => Err(format!("unexpected `{c}` at position {}", self.at + 1)),
                None => Err("the expression ends too early".into()),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::evaluate;

        #[test]
        fn follows_precedence_and_parentheses() {
            assert_eq!(evaluate("2 + 3 * 4").unwrap(), 14.0);
            assert_eq!(evaluate("(2 + 3) * 4").unwrap(), 20.0);
            assert_eq!(evaluate("-3 - -2").unwrap(), -1.0);
            assert_eq!(evaluate("7 / 2").unwrap(), 3.5);
        }

        #[test]
        fn rejects_bad_expressions() {
            assert!(evaluate("2 +").is_err());
            assert!(evaluate("2 $ 3").unwrap_err().contains('$'));
            assert!(evaluate("1 / 0").is_err());
            assert!(evaluate("(1 + 2").is_err());
        }
    }
}
