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
    if let Some(rendered) = render_placeholders(text, context) {
        return Ok(rendered);
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

/// `text` rendered without the engine when it is plain text and `{{ name }}` or
/// `{{ name.field }}` placeholders whose values are strings or integers — what most scorers
/// and prompts are, rendered once per episode; `None` for anything else (a filter, a tag, a
/// comment, another kind of value, an undefined name, a trailing newline the engine would
/// drop), which the engine renders as it always has.
fn render_placeholders(text: &str, context: &Map<String, Value>) -> Option<String> {
    let plain = |part: &str| !part.contains("{%") && !part.contains("{#");
    if text.ends_with(['\n', '\r']) {
        return None;
    }
    let mut out = String::with_capacity(text.len() + 32);
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        let (before, after) = rest.split_at(open);
        let close = after.find("}}")?;
        let name = after[2..close].trim_matches(' ');
        if !plain(before) || !is_dotted_name(name) {
            return None;
        }
        out.push_str(before);
        let mut parts = name.split('.');
        let mut value = context.get(parts.next()?)?;
        for part in parts {
            value = value.as_object()?.get(part)?;
        }
        match value {
            Value::String(s) => out.push_str(s),
            Value::Number(n) if n.is_i64() || n.is_u64() => out.push_str(&n.to_string()),
            _ => return None,
        }
        rest = &after[close + 2..];
    }
    plain(rest).then(|| out + rest)
}

/// `name` or `name.field…`, each part an identifier.
fn is_dotted_name(text: &str) -> bool {
    text.split('.').all(|part| {
        let mut chars = part.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
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

    /// The placeholders rendered without the engine give what the engine gives, and
    /// anything else is left to it.
    #[test]
    fn simple_placeholders_render_as_the_engine_renders_them() {
        let c = ctx(json!({
            "target": "8.05 km", "n": 42, "neg": -3, "big": u64::MAX, "f": 2.5, "yes": true, "none": null,
            "list": [1, 2], "metadata": {"lang": "en", "deep": {"x": "y"}}, "_u": "under", "brace": "}} {{ x }}"
        }));
        let simple = [
            "{{ target }}",
            "{{target}}",
            "answer {{ target }} in {{ metadata.lang }}!",
            "{{ n }}/{{ neg }}/{{ big }}",
            "{{ metadata.deep.x }}{{ _u }}",
            "a }} b {{ brace }} c",
            "\t{{ target }} \t",
        ];
        for text in simple {
            let fast = render_placeholders(text, &c);
            let engine = engine().render_str(text, minijinja::Value::from(minijinja::value::Serde(&c))).unwrap();
            assert_eq!(fast.as_deref(), Some(engine.as_str()), "{text:?}");
        }
        let left_to_the_engine = [
            "{{ f }}",
            "{{ yes }}",
            "{{ none }}",
            "{{ list }}",
            "{{ metadata }}",
            "{{ target | upper }}",
            "{{ metadata['lang'] }}",
            "{{- target }}",
            "{% if n %}{{ target }}{% endif %}",
            "{{ target }}{# note #}",
            "{{ target }}\n",
            "{{ target }}\r",
            "{{ missing }}",
            "{{ metadata.missing }}",
            "{{ target.len }}",
            "{{ target",
        ];
        for text in left_to_the_engine {
            assert_eq!(render_placeholders(text, &c), None, "{text:?}");
        }
        // Through `render`, the engine still says what is undefined.
        assert!(render("{{ missing }}", &c).unwrap_err().contains("undefined variable `missing`"));
        assert_eq!(render("{{ target }}\n", &c).unwrap(), "8.05 km", "the engine drops one trailing newline");
    }

    #[test]
    fn renders_inside_nested_values() {
        let v = render_value(&json!({"a": ["{{ x }}", 1]}), &ctx(json!({"x": "y"}))).unwrap();
        assert_eq!(v, json!({"a": ["y", 1]}));
    }
}
