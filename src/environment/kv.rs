//! `kv`: an in-process key-value store and a calculator. Its tools cost microseconds, so
//! tests and benchmarks measure the runner rather than the tools. The store starts with
//! the definition's and the task's `files:` as entries.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::definition::Definition;
use super::{ReadBack, ToolFailure, World, decode_arguments};
use crate::contract::{ErrorType, ToolAnnotations, ToolSpec};
use crate::suite::Task;

pub fn tool_specs() -> Vec<ToolSpec> {
    let spec = ToolSpec::new;
    let key = json!({"type": "string", "minLength": 1});
    vec![
        spec(
            "kv_get",
            "Read the value stored under a key.",
            json!({
            "type": "object", "properties": {"key": key}, "required": ["key"], "additionalProperties": false}),
        )
        .annotated(ToolAnnotations::READ_ONLY),
        spec(
            "kv_set",
            "Store a value under a key, replacing any old value.",
            json!({
            "type": "object", "properties": {"key": key, "value": {"type": "string"}},
            "required": ["key", "value"], "additionalProperties": false}),
        )
        .annotated(ToolAnnotations::DESTRUCTIVE),
        spec(
            "kv_delete",
            "Remove a key.",
            json!({
            "type": "object", "properties": {"key": key}, "required": ["key"], "additionalProperties": false}),
        )
        .annotated(ToolAnnotations::DESTRUCTIVE),
        spec(
            "kv_list",
            "List the keys, optionally only those starting with a prefix.",
            json!({
            "type": "object", "properties": {"prefix": {"type": "string", "default": ""}}, "additionalProperties": false}),
        )
        .annotated(ToolAnnotations::READ_ONLY),
        spec(
            "calc",
            "Evaluate an arithmetic expression: numbers, + - * /, parentheses.",
            json!({
            "type": "object", "properties": {"expression": {"type": "string"}},
            "required": ["expression"], "additionalProperties": false}),
        )
        .annotated(ToolAnnotations::READ_ONLY),
    ]
}

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

#[derive(Deserialize)]
struct Key {
    key: String,
}

#[derive(Deserialize)]
struct Set {
    key: String,
    value: String,
}

#[derive(Deserialize)]
struct List {
    #[serde(default)]
    prefix: String,
}

#[derive(Deserialize)]
struct Calc {
    expression: String,
}

#[async_trait]
impl World for KvWorld {
    async fn call(&self, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
        match name {
            "kv_get" => {
                let Key { key } = decode_arguments(arguments)?;
                match self.with_store(|s| s.get(&key).cloned()) {
                    Some(value) => Ok(json!({"key": key, "value": value})),
                    None => Err(ToolFailure::new(ErrorType::ExecutionError, format!("no key `{key}`"))
                        .suggest("call kv_list to see the keys")),
                }
            }
            "kv_set" => {
                let Set { key, value } = decode_arguments(arguments)?;
                let replaced = self.with_store(|s| s.insert(key.clone(), value).is_some());
                Ok(json!({"key": key, "replaced": replaced}))
            }
            "kv_delete" => {
                let Key { key } = decode_arguments(arguments)?;
                match self.with_store(|s| s.remove(&key)) {
                    Some(_) => Ok(json!({"key": key, "deleted": true})),
                    None => Err(ToolFailure::new(ErrorType::ExecutionError, format!("no key `{key}`"))
                        .suggest("call kv_list to see the keys")),
                }
            }
            "kv_list" => {
                let List { prefix } = decode_arguments(arguments)?;
                let keys: Vec<String> =
                    self.with_store(|s| s.keys().filter(|k| k.starts_with(&prefix)).cloned().collect());
                Ok(json!({"keys": keys}))
            }
            "calc" => {
                let Calc { expression } = decode_arguments(arguments)?;
                let value = calc::evaluate(&expression).map_err(|e| {
                    ToolFailure::new(ErrorType::ExecutionError, e).suggest("use numbers, + - * / and parentheses")
                })?;
                Ok(json!({"expression": expression, "value": value}))
            }
            other => Err(ToolFailure::new(ErrorType::ToolNotFound, format!("kv has no tool `{other}`"))),
        }
    }

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
