//! Templates over a task's fields (`{{ input }}`, `{{ target }}`, dataset columns), rendered
//! with minijinja. Undefined variables are errors, so a typo is caught when a suite loads.

use std::sync::OnceLock;

use minijinja::{Environment, UndefinedBehavior};
use serde_json::{Map, Value};

fn engine() -> &'static Environment<'static> {
    static ENGINE: OnceLock<Environment<'static>> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // promptfoo's `load`: a JSON text as a value (`{{ (style | load).tone }}`).
        env.add_filter("load", |text: String| -> Result<minijinja::Value, minijinja::Error> {
            serde_json::from_str::<Value>(&text).map(|v| minijinja::Value::from(minijinja::value::Serde(v))).map_err(
                |e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("`load`: not JSON: {e}")),
            )
        });
        env
    })
}

/// Whether `text` has any template syntax at all; most strings don't, and skip rendering.
pub fn is_template(text: &str) -> bool {
    text.contains("{{") || text.contains("{%")
}

/// Renders `text` over `context`; plain text is returned as it is.
pub fn render(text: &str, context: &Map<String, Value>) -> Result<String, String> {
    if !is_template(text) {
        return Ok(text.to_owned());
    }
    engine().render_str(text, minijinja::Value::from(minijinja::value::Serde(context))).map_err(|e| {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        // minijinja says "undefined value" without the name; a reader needs the name.
        if e.kind() == minijinja::ErrorKind::UndefinedError {
            let missing = undefined_names(text, context);
            if !missing.is_empty() {
                let names: Vec<String> = missing.iter().map(|n| format!("`{n}`")).collect();
                let known: Vec<&str> = context.keys().map(String::as_str).collect();
                message =
                    format!("undefined variable {} (the task has: {}): {message}", names.join(", "), known.join(", "));
            }
        }
        message
    })
}

/// The variables (`target`, `metadata.lang`) a template uses that `context` lacks.
fn undefined_names(text: &str, context: &Map<String, Value>) -> Vec<String> {
    let Ok(template) = engine().template_from_str(text) else { return Vec::new() };
    let mut names: Vec<String> = template
        .undeclared_variables(true)
        .into_iter()
        .filter(|name| {
            let mut parts = name.split('.');
            let Some(first) = parts.next() else { return false };
            if engine().globals().any(|(global, _)| global == first) {
                return false;
            }
            let mut value = context.get(first);
            for part in parts {
                value = value.and_then(|v| v.get(part));
            }
            value.is_none()
        })
        .collect();
    names.sort();
    names
}

/// Renders every string inside a JSON value.
pub fn render_value(value: &Value, context: &Map<String, Value>) -> Result<Value, String> {
    Ok(match value {
        Value::String(s) => Value::String(render(s, context)?),
        Value::Array(items) => Value::Array(items.iter().map(|v| render_value(v, context)).collect::<Result<_, _>>()?),
        Value::Object(map) => Value::Object(
            map.iter().map(|(k, v)| Ok((k.clone(), render_value(v, context)?))).collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn load_reads_a_json_text_as_promptfoo_does() {
        let c = ctx(json!({"style": "{\"tone\": \"formal\"}"}));
        assert_eq!(render("{{ (style | load).tone }}", &c).unwrap(), "formal");
        assert!(render("{{ ('nope' | load).tone }}", &c).unwrap_err().contains("not JSON"));
    }

    #[test]
    fn renders_fields_and_leaves_plain_text() {
        let c = ctx(json!({"target": "3", "metadata": {"lang": "en"}}));
        assert_eq!(render("answer {{ target }} in {{ metadata.lang }}", &c).unwrap(), "answer 3 in en");
        assert_eq!(render("awk '{print $1}'", &c).unwrap(), "awk '{print $1}'");
    }

    #[test]
    fn undefined_variables_are_errors() {
        let err = render("{{ tagret }}", &ctx(json!({"target": "3"}))).unwrap_err();
        assert!(err.contains("undefined variable `tagret`"), "{err}");
        let err = render("{{ metadata.lnag }}", &ctx(json!({"metadata": {"lang": "en"}}))).unwrap_err();
        assert!(err.contains("undefined variable `metadata.lnag`"), "{err}");
    }

    #[test]
    fn renders_inside_nested_values() {
        let v = render_value(&json!({"a": ["{{ x }}", 1]}), &ctx(json!({"x": "y"}))).unwrap();
        assert_eq!(v, json!({"a": ["y", 1]}));
    }
}
