//! promptfoo configs read as they are: `runner eval promptfooconfig.yaml`. A config is told
//! from a suite by its keys (`prompts` or `providers`, and no `suite`), and translated into
//! the runner's own suite, which then loads like any other:
//!
//! - `prompts` (texts, `file://` text or chat JSON files, `{raw|id, label}`) → `variants:`,
//!   each prompt the variant's `prompt:` (a chat's system message its `agent.system`);
//! - `providers` (`echo`, `openai:…`, `anthropic:messages:…`, `ollama:…`) → the run's models;
//! - `tests` (inline, or `file://` CSV, JSONL, YAML or JSON) and `defaultTest` → tasks, whose
//!   `vars` are their fields, and scorers, one per assertion (`assert-set` flattened;
//!   `python`/`javascript` the `python:`/`js:` code scorers);
//! - `scenarios` → a task for each entry of a scenario's `config` with each of its tests;
//! - the same `threshold` on every test → `pass_score`.
//!
//! Anything else is an error naming its line, or, with `--skip-unsupported`, left out and
//! listed. Each translated part keeps the line of what it came from.
//!
//! A `file://` reference is read as the user running runner, so a config from elsewhere
//! could name any file that user can read (and put it in prompts and the log): one that
//! leads out of the config's folder (absolute, `..`, or through a link) is refused unless
//! `--allow-outside-files` says so. Inside, files are opened beneath the folder held open.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::LoadOptions;
use crate::config::decode::{ConfigError, Source};
use crate::config::yaml;
use crate::environment::beneath::{Beneath, Links};
use crate::model::endpoint::{Body, Endpoint, Transform};

/// The most a file a config names may hold.
const FILE_CAP: u64 = 1 << 30;

/// Whether a parsed file is a promptfoo config rather than a suite.
pub fn is_config(value: &Value) -> bool {
    value
        .as_object()
        .is_some_and(|o| !o.contains_key("suite") && (o.contains_key("prompts") || o.contains_key("providers")))
}

/// A config as the runner's suite, with the models its providers name and what was skipped.
pub(crate) struct Translated {
    pub source: Source,
    /// (path in the suite, path in the config it came from).
    pub aliases: Vec<(String, String)>,
    pub providers: Vec<String>,
    /// The `http` providers' endpoints, by the model name `providers` gives them.
    pub endpoints: Vec<(String, Endpoint)>,
    pub skipped: Vec<String>,
}

const TOP_KEYS: &[&str] = &["description", "prompts", "providers", "tests", "defaultTest", "scenarios"];
/// The keys of an entry of a scenario's `config` (promptfoo drops its `options`).
const SCENARIO_KEYS: &[&str] = &["vars", "assert", "description", "threshold", "metadata"];
const TEST_KEYS: &[&str] = &["vars", "assert", "description", "threshold", "options", "metadata"];
/// The assertion types a grader model answers (and that take a `provider`).
const GRADED: &[&str] = &["llm-rubric", "model-graded-closedqa", "factuality"];
const ASSERT_KEYS: &[&str] = &["type", "value", "threshold", "weight", "metric", "provider"];

/// Translates the promptfoo config `source` holds.
pub(crate) fn translate(source: &Source, options: &LoadOptions) -> Result<Translated, ConfigError> {
    let mut t = Translator {
        source,
        skip: options.skip_unsupported,
        outside: options.allow_outside_files,
        skipped: Vec::new(),
        aliases: Vec::new(),
        dir: source.file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_owned(),
        embedding: None,
    };
    let Some(config) = source.value.as_object() else {
        return Err(source.error("", "a promptfoo config is a mapping"));
    };
    for key in config.keys() {
        if !TOP_KEYS.contains(&key.as_str()) {
            t.unsupported(key, format!("the key `{key}`"))?;
        }
    }
    let variants = t.prompts(config.get("prompts"))?;
    let Providers { models: providers, endpoints, sampling } = t.providers(config.get("providers"))?;
    let default = config.get("defaultTest").cloned().unwrap_or(json!({}));
    let (defaults, suite_scorers) = t.default_test(&default)?;

    let mut tasks = Vec::new();
    let mut thresholds = Vec::new();
    if let Some(d) = defaults.threshold {
        thresholds.push(("defaultTest.threshold".to_owned(), d));
    }
    let mut tests: Vec<Placed> = match (config.get("tests"), config.contains_key("scenarios")) {
        (None, true) => Vec::new(),
        (tests, _) => t.tests(tests)?.into_iter().map(|(at, test)| (at, test, None)).collect(),
    };
    tests.extend(t.scenarios(config.get("scenarios"))?);
    for (at, test, scenario) in tests {
        let index = tasks.len();
        let lead = scenario.as_ref().map(|(at, entry)| (at.as_str(), entry));
        let has_default_asserts = !suite_scorers.is_empty();
        if let Some(task) = t.task(&at, &test, lead, index, &defaults, has_default_asserts, &mut thresholds)? {
            tasks.push(task);
        }
    }
    if tasks.is_empty() {
        return Err(source.error("tests", "the config has no tests to run"));
    }
    let n_tasks = tasks.len();
    let mut suite = json!({
        "suite": source.file.file_stem().map_or("promptfoo".into(), |s| s.to_string_lossy().into_owned()),
        "description": config.get("description").and_then(Value::as_str).unwrap_or_default(),
        // A plain prompt, answered in one turn: a world with no tools.
        "environment": "kv",
        "tools": [],
        "limits": {"max_steps": 1},
        "variants": variants,
        "scorers": suite_scorers,
        "tasks": tasks,
    });
    if let Some((_, first)) = thresholds.first() {
        // A test without a threshold passes only when every assertion passes: one threshold
        // for the run holds only when it covers every test.
        let covered = thresholds.iter().any(|(at, _)| at == "defaultTest.threshold") || thresholds.len() >= n_tasks;
        if let Some((at, other)) = thresholds.iter().find(|(_, x)| x != first) {
            t.unsupported(
                at,
                format!("a test's `threshold` of {other} beside another's of {first} (runner has one per run)"),
            )?;
        } else if !covered {
            let (at, _) = &thresholds[0];
            t.unsupported(
                at,
                format!("a `threshold` of {first} on some tests only (runner has one per run; put it in defaultTest)"),
            )?;
        } else {
            suite["pass_score"] = json!(first);
        }
    }
    if let Some(model) = defaults.grader {
        suite["grader"] = json!({"model": model});
    }
    if let Some((at, sampling)) = sampling {
        suite["agent"] = json!({"sampling": sampling});
        t.aliases.push(("agent.sampling".into(), at));
    }
    let mut locations = source.locations.clone();
    for (path, from) in &t.aliases {
        locations.alias(path, from);
    }
    let translated = Source { file: source.file.clone(), value: suite, locations };
    Ok(Translated { source: translated, aliases: t.aliases, providers, endpoints, skipped: t.skipped })
}

/// An error about the translated suite as one about the config: its path (`tasks[1].scorers[0]`)
/// becomes the part of the config that part came from (`tests[1].assert[0]`).
pub(crate) fn in_config_terms(mut error: ConfigError, aliases: &[(String, String)]) -> ConfigError {
    let from = aliases
        .iter()
        .filter(|(path, _)| {
            error.message.strip_prefix(path.as_str()).is_some_and(|rest| rest.starts_with([':', '.', '[']))
        })
        .max_by_key(|(path, _)| path.len());
    if let Some((path, original)) = from {
        error.message = format!("{original}{}", &error.message[path.len()..]);
    }
    error
}

/// What `providers:` gives the run.
#[derive(Default)]
struct Providers {
    models: Vec<String>,
    endpoints: Vec<(String, Endpoint)>,
    /// The providers' sampling settings and where the first were written.
    sampling: Option<(String, Map<String, Value>)>,
}

/// The keys of a provider's `config` that are sampling settings (promptfoo passes them to
/// the provider's API, as runner does).
const SAMPLING_KEYS: &[&str] = &[
    "temperature",
    "max_tokens",
    "max_completion_tokens",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "frequency_penalty",
    "presence_penalty",
];

/// A provider's id: the text itself, or its `id:`.
fn provider_id(value: &Value) -> Option<&str> {
    match value {
        Value::String(id) => Some(id),
        other => other.get("id").and_then(Value::as_str),
    }
}

/// Whether a provider id names an embedding model.
fn is_embedding(id: &str) -> bool {
    id.contains(":embedding:") || id.contains(":embeddings:")
}

/// promptfoo's HTTP provider: `http`, `https`, or the URL itself as the id.
fn is_http(id: &str) -> bool {
    matches!(id, "http" | "https") || id.starts_with("http://") || id.starts_with("https://")
}

/// A test and where it is, with the scenario `config` entry it runs under and where that is.
type Placed = (String, Value, Option<(String, Value)>);

struct Translator<'a> {
    source: &'a Source,
    skip: bool,
    /// Whether `file://` references may lead out of `dir`.
    outside: bool,
    skipped: Vec<String>,
    /// (path in the translated suite, path in the config it came from).
    aliases: Vec<(String, String)>,
    dir: PathBuf,
    /// The embedding model `similar` assertions use when they name none: the test's
    /// `options.provider`, else `defaultTest`'s.
    embedding: Option<Embedding>,
}

/// What `defaultTest` gives every test.
struct Defaults {
    vars: Map<String, Value>,
    threshold: Option<f64>,
    grader: Option<String>,
}

/// An embedding model for `similar`: runner's `provider/model`, and a base URL of its own.
#[derive(Clone)]
struct Embedding {
    model: String,
    url: Option<String>,
}

impl Translator<'_> {
    /// Something runner does not do: an error at its line, or, with `--skip-unsupported`,
    /// a line of the list of what was left out.
    fn unsupported(&mut self, at: &str, what: String) -> Result<(), ConfigError> {
        let error = self.source.error(at, format!("{what} is not supported (--skip-unsupported leaves it out)"));
        if !self.skip {
            return Err(error);
        }
        let position = error.position.map_or(String::new(), |p| format!(":{}:{}", p.line, p.column));
        self.skipped.push(format!("{}{position}: skipped {what}", self.source.file.display()));
        Ok(())
    }

    fn read(&self, at: &str, reference: &str) -> Result<(PathBuf, String), ConfigError> {
        let relative = reference.trim_start_matches("file://");
        if relative.contains(['*', '?']) {
            return Err(self.source.error(at, format!("`{reference}`: globs are not supported; name each file")));
        }
        let path = self.dir.join(relative);
        let failed = |e: std::io::Error| self.source.error(at, format!("failed to read {}: {e}", path.display()));
        let bytes = if self.outside {
            std::fs::read(&path).map_err(failed)?
        } else {
            match self.beneath(at, reference)?.read(Path::new(relative), Links::Inside, FILE_CAP) {
                Ok(Some((bytes, _))) => bytes,
                Ok(None) => return Err(failed(std::io::ErrorKind::NotFound.into())),
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => return Err(self.outside_error(at, reference)),
                Err(e) => return Err(failed(e)),
            }
        };
        let text = String::from_utf8(bytes)
            .map_err(|_| self.source.error(at, format!("{} is not UTF-8 text", path.display())))?;
        Ok((path, text))
    }

    /// The config's folder held open, to open what a reference names beneath it.
    fn beneath(&self, at: &str, reference: &str) -> Result<Beneath, ConfigError> {
        self.dir
            .canonicalize()
            .and_then(|dir| Beneath::open(&dir))
            .map_err(|e| self.source.error(at, format!("`{reference}`: failed to open the config's folder: {e}")))
    }

    /// Refuses a reference that leads out of the config's folder (see the module's doc).
    fn outside_error(&self, at: &str, reference: &str) -> ConfigError {
        let message = format!(
            "`{reference}` leads out of the config's folder {} (files are read as the user running runner; \
             --allow-outside-files reads it)",
            self.dir.display()
        );
        self.source.error(at, message)
    }

    /// Refuses a code file that leads out of the config's folder, unless allowed; a file
    /// that is not there is left to the code scorers' own check.
    fn check_inside(&self, at: &str, reference: &str, file: &str) -> Result<(), ConfigError> {
        if self.outside {
            return Ok(());
        }
        match self.beneath(at, reference)?.open_at(Path::new(file), libc::O_PATH, 0, Links::Inside) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => Err(self.outside_error(at, reference)),
            _ => Ok(()),
        }
    }

    /// `prompts:` as variants, named by their labels or `prompt-N`.
    fn prompts(&mut self, value: Option<&Value>) -> Result<Map<String, Value>, ConfigError> {
        let items: Vec<(String, &Value)> = match value {
            None => return Err(self.source.error("", "a promptfoo config needs `prompts`")),
            Some(Value::Array(items)) => items.iter().enumerate().map(|(i, v)| (yaml::item("prompts", i), v)).collect(),
            Some(one) => vec![("prompts".to_owned(), one)],
        };
        let mut variants = Map::new();
        for (at, item) in items {
            let (text, label) = match item {
                Value::String(s) => (s.clone(), None),
                Value::Object(o) => {
                    for key in o.keys().filter(|k| !["raw", "id", "label", "config"].contains(&k.as_str())) {
                        self.unsupported(&yaml::child(&at, key), format!("the prompt key `{key}`"))?;
                    }
                    let text = o.get("raw").or_else(|| o.get("id")).and_then(Value::as_str).unwrap_or_default();
                    (text.to_owned(), o.get("label").and_then(Value::as_str).map(str::to_owned))
                }
                other => {
                    return Err(self.source.error(&at, format!("a prompt is a text or {{raw, label}}, not {other}")));
                }
            };
            let prompts = if text.starts_with("file://") {
                let (path, content) = self.read(&at, &text)?;
                match path.extension().and_then(|e| e.to_str()) {
                    Some("json") => vec![content],
                    Some("txt" | "md" | "j2" | "nunjucks") | None => {
                        content.split("\n---\n").map(|p| p.trim().to_owned()).filter(|p| !p.is_empty()).collect()
                    }
                    Some(other) => {
                        self.unsupported(&at, format!("a prompt file of type `.{other}`"))?;
                        continue;
                    }
                }
            } else {
                vec![text]
            };
            // A prompt's `config` is promptfoo's provider config for this prompt: its sampling.
            let config_at = yaml::child(&at, "config");
            let sampling = match item.get("config") {
                Some(config) => self.sampling(&config_at, config)?,
                None => Map::new(),
            };
            for prompt in prompts {
                let Some(mut variant) = self.prompt_variant(&at, &prompt)? else { continue };
                if !sampling.is_empty() {
                    variant["agent"]["sampling"] = Value::Object(sampling.clone());
                }
                let name = match &label {
                    Some(label) if variants.is_empty() || !variants.contains_key(&slug(label)) => slug(label),
                    _ => format!("prompt-{}", variants.len() + 1),
                };
                self.aliases.push((yaml::child("variants", &name), at.clone()));
                if !sampling.is_empty() {
                    let sampled = yaml::child(&yaml::child(&yaml::child("variants", &name), "agent"), "sampling");
                    self.aliases.push((sampled, config_at.clone()));
                }
                variants.insert(name, variant);
            }
        }
        if variants.is_empty() {
            return Err(self.source.error("prompts", "the config has no prompt runner can use"));
        }
        Ok(variants)
    }

    /// One prompt: a text, or a chat (a JSON list of messages: system messages, then one
    /// user message).
    fn prompt_variant(&mut self, at: &str, prompt: &str) -> Result<Option<Value>, ConfigError> {
        if prompt.trim().is_empty() {
            return Err(self.source.error(at, "a prompt cannot be empty"));
        }
        let chat = prompt.trim_start().starts_with('[').then(|| serde_json::from_str::<Vec<Value>>(prompt).ok());
        let Some(Some(messages)) = chat else { return Ok(Some(json!({"prompt": prompt}))) };
        let mut system = Vec::new();
        let mut user = None;
        for m in &messages {
            match (m.get("role").and_then(Value::as_str), m.get("content").and_then(Value::as_str)) {
                (Some("system"), Some(content)) if user.is_none() => system.push(content),
                (Some("user"), Some(content)) if user.is_none() => user = Some(content),
                _ => {
                    self.unsupported(at, "a chat prompt other than system messages then one user message".into())?;
                    return Ok(None);
                }
            }
        }
        let Some(user) = user else {
            self.unsupported(at, "a chat prompt without a user message".into())?;
            return Ok(None);
        };
        let mut variant = json!({"prompt": user});
        if !system.is_empty() {
            variant["agent"] = json!({"system": system.join("\n\n")});
        }
        Ok(Some(variant))
    }

    /// `providers:` as model names, the `http` ones' endpoints, and the sampling settings
    /// their `config:` gives (one set for the run: runner's sampling is the suite's, or a
    /// prompt's).
    fn providers(&mut self, value: Option<&Value>) -> Result<Providers, ConfigError> {
        let items: Vec<(String, &Value)> = match value {
            None => return Ok(Providers::default()),
            Some(Value::Array(items)) => {
                items.iter().enumerate().map(|(i, v)| (yaml::item("providers", i), v)).collect()
            }
            Some(one) => vec![("providers".to_owned(), one)],
        };
        let mut out = Providers::default();
        for (at, item) in items {
            let (id, label, config) = match item {
                Value::String(s) => (s.as_str(), None, None),
                Value::Object(o) => {
                    for key in o.keys().filter(|k| !["id", "label", "config"].contains(&k.as_str())) {
                        self.unsupported(&yaml::child(&at, key), format!("the provider key `{key}`"))?;
                    }
                    let label = o.get("label").and_then(Value::as_str);
                    (o.get("id").and_then(Value::as_str).unwrap_or_default(), label, o.get("config"))
                }
                other => return Err(self.source.error(&at, format!("a provider is an id or {{id, …}}, not {other}"))),
            };
            let config_at = yaml::child(&at, "config");
            if is_http(id) {
                let Some(endpoint) = self.endpoint(&at, id, config)? else { continue };
                let host = reqwest::Url::parse(&endpoint.url).ok().and_then(|u| {
                    let host = u.host_str()?.to_owned();
                    Some(u.port().map_or(host.clone(), |p| format!("{host}-{p}")))
                });
                let base = format!("http/{}", slug(label.or(host.as_deref()).unwrap_or("endpoint")));
                let mut name = base.clone();
                let mut n = 1;
                while out.models.contains(&name) {
                    n += 1;
                    name = format!("{base}-{n}");
                }
                out.models.push(name.clone());
                out.endpoints.push((name, endpoint));
                continue;
            }
            match model_of(id) {
                Some(model) if !out.models.contains(&model) => out.models.push(model),
                Some(_) => {}
                None => {
                    self.unsupported(&at, format!("the provider `{id}`"))?;
                    continue;
                }
            }
            let sampling = match config {
                Some(config) => self.sampling(&config_at, config)?,
                None => Map::new(),
            };
            match &out.sampling {
                _ if sampling.is_empty() => {}
                None => out.sampling = Some((config_at, sampling)),
                Some((_, first)) if *first == sampling => {}
                Some((first_at, _)) => {
                    let what = format!(
                        "sampling settings other than those of {first_at} (runner's sampling is one per run, or per prompt: put them in each prompt's `config`)"
                    );
                    self.unsupported(&config_at, what)?;
                }
            }
        }
        Ok(out)
    }

    /// A provider's or a prompt's `config:` as sampling settings; any other key is not
    /// supported.
    fn sampling(&mut self, at: &str, config: &Value) -> Result<Map<String, Value>, ConfigError> {
        let Some(o) = config.as_object() else {
            return Err(self.source.error(at, format!("`config` is a mapping, not {config}")));
        };
        let mut sampling = Map::new();
        for (key, value) in o {
            if SAMPLING_KEYS.contains(&key.as_str()) {
                sampling.insert(key.clone(), value.clone());
            } else {
                self.unsupported(&yaml::child(at, key), format!("the provider config key `{key}`"))?;
            }
        }
        Ok(sampling)
    }

    /// An `http` provider's endpoint: `config: {url, method, headers, body, transformResponse}`
    /// (the id itself may be the URL). `None` when it was skipped.
    fn endpoint(&mut self, at: &str, id: &str, config: Option<&Value>) -> Result<Option<Endpoint>, ConfigError> {
        let config_at = yaml::child(at, "config");
        let empty = Map::new();
        let config = match config {
            None => &empty,
            Some(Value::Object(o)) => o,
            Some(other) => return Err(self.source.error(&config_at, format!("`config` is a mapping, not {other}"))),
        };
        const KEYS: &[&str] = &["url", "method", "headers", "body", "transformResponse"];
        for key in config.keys().filter(|k| !KEYS.contains(&k.as_str())) {
            self.unsupported(&yaml::child(&config_at, key), format!("the http provider key `{key}`"))?;
        }
        let here = |key: &str| yaml::child(&config_at, key);
        let url = match (config.get("url"), id) {
            (Some(Value::String(url)), _) => url.as_str(),
            (Some(other), _) => return Err(self.source.error(&here("url"), format!("`url` is a text, not {other}"))),
            (None, "http" | "https") => {
                return Err(self.source.error(at, "an `http` provider needs `config.url`"));
            }
            (None, url) => url,
        };
        let method = match config.get("method") {
            None => None,
            Some(Value::String(m)) => Some(m.as_str()),
            Some(other) => {
                return Err(self.source.error(&here("method"), format!("`method` is a text, not {other}")));
            }
        };
        let url_at = if config.contains_key("url") { here("url") } else { yaml::child(at, "id") };
        let mut endpoint = Endpoint::new(url, method).map_err(|e| {
            let at = if e.contains("method") { here("method") } else { url_at.clone() };
            self.source.error(&at, e)
        })?;
        match config.get("headers") {
            None => {}
            Some(Value::Object(headers)) => {
                for (name, value) in headers {
                    let value = match value {
                        Value::String(s) => s.clone(),
                        Value::Number(_) | Value::Bool(_) => value.to_string(),
                        other => {
                            let message = format!("a header's value is a text, not {other}");
                            return Err(self.source.error(&yaml::child(&here("headers"), name), message));
                        }
                    };
                    endpoint.headers.push((name.clone(), value));
                }
            }
            Some(other) => {
                return Err(self.source.error(&here("headers"), format!("`headers` is a mapping, not {other}")));
            }
        }
        endpoint.body = match config.get("body") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(Body::Text(text.clone())),
            Some(value) => Some(Body::Json(value.clone())),
        };
        match config.get("transformResponse") {
            None => {}
            Some(Value::String(written)) => match Transform::parse(written) {
                Ok(transform) => endpoint.transform = transform,
                Err(_) if self.skip => {
                    self.unsupported(&here("transformResponse"), format!("the transformResponse `{written}`"))?;
                    return Ok(None);
                }
                Err(e) => {
                    let message = format!("{e} (--skip-unsupported leaves this provider out)");
                    return Err(self.source.error(&here("transformResponse"), message));
                }
            },
            Some(other) => {
                let message = format!("`transformResponse` is a text, not {other}");
                return Err(self.source.error(&here("transformResponse"), message));
            }
        }
        Ok(Some(endpoint))
    }

    /// `defaultTest:` — vars every test starts from, a threshold, the grader, and the
    /// assertions every test makes (the suite's scorers).
    fn default_test(&mut self, value: &Value) -> Result<(Defaults, Vec<Value>), ConfigError> {
        let at = "defaultTest";
        let Some(o) = value.as_object() else {
            return Err(self.source.error(at, "`defaultTest` is a mapping of `vars`, `assert`, …"));
        };
        for key in o.keys().filter(|k| !TEST_KEYS.contains(&k.as_str())) {
            self.unsupported(&yaml::child(at, key), format!("the key `{key}` of `defaultTest`"))?;
        }
        let vars = self.vars(&yaml::child(at, "vars"), o.get("vars"))?;
        let threshold = self.threshold(&yaml::child(at, "threshold"), o.get("threshold"))?;
        let (grader, embedding) = self.options(&yaml::child(at, "options"), o.get("options"))?;
        self.embedding = embedding;
        let mut scorers = Vec::new();
        self.assertions(&yaml::child(at, "assert"), o.get("assert"), "scorers", &mut scorers)?;
        Ok((Defaults { vars, threshold, grader }, scorers))
    }

    /// A test's or `defaultTest`'s `options:`: only `provider`, the grader, or the
    /// embedding model (`openai:embedding:…`, or `{embedding: …, text: …}`, both).
    fn options(&mut self, at: &str, value: Option<&Value>) -> Result<(Option<String>, Option<Embedding>), ConfigError> {
        let Some(value) = value else { return Ok((None, None)) };
        let Some(o) = value.as_object() else { return Err(self.source.error(at, "`options` is a mapping")) };
        for key in o.keys().filter(|k| *k != "provider") {
            self.unsupported(&yaml::child(at, key), format!("the option `{key}`"))?;
        }
        let at = yaml::child(at, "provider");
        let provider = o.get("provider");
        if let Some(Value::Object(kinds)) = provider
            && !kinds.contains_key("id")
        {
            for key in kinds.keys().filter(|k| !["text", "embedding"].contains(&k.as_str())) {
                self.unsupported(&yaml::child(&at, key), format!("the provider kind `{key}`"))?;
            }
            let grader = self.grader(&yaml::child(&at, "text"), kinds.get("text"))?;
            let embedding = self.embedding_of(&yaml::child(&at, "embedding"), kinds.get("embedding"))?;
            return Ok((grader, embedding));
        }
        if provider.and_then(provider_id).is_some_and(is_embedding) {
            return Ok((None, self.embedding_of(&at, provider)?));
        }
        Ok((self.grader(&at, provider)?, None))
    }

    /// An embedding provider: `openai:embedding:MODEL` (or `ollama:embeddings:…`), with
    /// `config.apiBaseUrl` for a server of its own.
    fn embedding_of(&mut self, at: &str, value: Option<&Value>) -> Result<Option<Embedding>, ConfigError> {
        let Some(value) = value else { return Ok(None) };
        let id = provider_id(value).unwrap_or_default();
        let model = id.split_once(':').and_then(|(provider, rest)| {
            let model = rest.strip_prefix("embeddings:").or_else(|| rest.strip_prefix("embedding:"))?;
            (["openai", "ollama"].contains(&provider) && !model.is_empty()).then(|| format!("{provider}/{model}"))
        });
        let Some(model) = model else {
            self.unsupported(
                at,
                format!(
                    "the embedding provider `{id}` (runner's are `openai:embedding:MODEL`, `ollama:embedding:MODEL`)"
                ),
            )?;
            return Ok(None);
        };
        let mut url = None;
        if let Some(o) = value.as_object() {
            for key in o.keys().filter(|k| !["id", "config"].contains(&k.as_str())) {
                self.unsupported(&yaml::child(at, key), format!("the provider key `{key}`"))?;
            }
            if let Some(config) = o.get("config") {
                let config_at = yaml::child(at, "config");
                let Some(config) = config.as_object() else {
                    return Err(self.source.error(&config_at, "`config` is a mapping"));
                };
                for (key, v) in config {
                    match (key.as_str(), v) {
                        ("apiBaseUrl", Value::String(base)) => url = Some(base.clone()),
                        _ => self
                            .unsupported(&yaml::child(&config_at, key), format!("the embedding config key `{key}`"))?,
                    }
                }
            }
        }
        Ok(Some(Embedding { model, url }))
    }

    fn grader(&mut self, at: &str, value: Option<&Value>) -> Result<Option<String>, ConfigError> {
        let id = match value {
            None => return Ok(None),
            Some(Value::String(id)) => id.as_str(),
            Some(Value::Object(o)) if o.len() == 1 && o.contains_key("id") => {
                o.get("id").and_then(Value::as_str).unwrap_or_default()
            }
            Some(_) => {
                self.unsupported(at, "a grading provider other than an id".into())?;
                return Ok(None);
            }
        };
        match model_of(id) {
            Some(model) => Ok(Some(model)),
            None => {
                self.unsupported(at, format!("the grading provider `{id}`"))?;
                Ok(None)
            }
        }
    }

    fn threshold(&self, at: &str, value: Option<&Value>) -> Result<Option<f64>, ConfigError> {
        match value {
            None => Ok(None),
            Some(v) => match v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok())) {
                Some(x) if (0.0..=1.0).contains(&x) => Ok(Some(x)),
                _ => Err(self.source.error(at, format!("a threshold is a number from 0 to 1, not {v}"))),
            },
        }
    }

    fn vars(&mut self, at: &str, value: Option<&Value>) -> Result<Map<String, Value>, ConfigError> {
        let vars = match value {
            None => return Ok(Map::new()),
            Some(Value::Object(o)) => o.clone(),
            Some(Value::String(s)) if s.starts_with("file://") => {
                self.unsupported(at, "vars from a file".into())?;
                return Ok(Map::new());
            }
            Some(other) => return Err(self.source.error(at, format!("`vars` is a mapping, not {other}"))),
        };
        let mut kept = Map::new();
        for (name, value) in vars {
            let here = yaml::child(at, &name);
            if ["id", "metadata"].contains(&name.as_str()) {
                self.unsupported(&here, format!("a var named `{name}` (runner's task field)"))?;
            } else if value.is_array() {
                self.unsupported(&here, format!("the list var `{name}` (one test per value)"))?;
            } else if value.as_str().is_some_and(|s| s.starts_with("file://")) {
                self.unsupported(&here, format!("the var `{name}` from a file"))?;
            } else {
                kept.insert(name, value);
            }
        }
        Ok(kept)
    }

    /// Every test, with where it is: inline, or the rows of `file://` files.
    fn tests(&mut self, value: Option<&Value>) -> Result<Vec<(String, Value)>, ConfigError> {
        let items: Vec<(String, &Value)> = match value {
            None => return Err(self.source.error("", "a promptfoo config needs `tests` or `scenarios`")),
            Some(Value::Array(items)) => items.iter().enumerate().map(|(i, v)| (yaml::item("tests", i), v)).collect(),
            Some(one) => vec![("tests".to_owned(), one)],
        };
        let mut tests = Vec::new();
        for (at, item) in items {
            match item {
                Value::String(reference) if reference.starts_with("file://") => {
                    tests.extend(self.test_file(&at, reference)?.into_iter().map(|t| (at.clone(), t)));
                }
                Value::Object(_) => tests.push((at, item.clone())),
                other => return Err(self.source.error(&at, format!("a test is a mapping or `file://…`, not {other}"))),
            }
        }
        Ok(tests)
    }

    /// The tests of a CSV (a column per var; `__expected…`, `__description`, `__threshold`),
    /// JSONL, YAML or JSON file.
    fn test_file(&mut self, at: &str, reference: &str) -> Result<Vec<Value>, ConfigError> {
        let (path, text) = self.read(at, reference)?;
        let in_file = |e: String| ConfigError::whole(&path, e);
        match path.extension().and_then(|e| e.to_str()) {
            Some("csv") => {
                let mut tests = Vec::new();
                super::dataset::read_csv(&path, text.as_bytes(), &mut |_, row| {
                    tests.push(csv_test(row).map_err(&in_file)?);
                    Ok(())
                })?;
                Ok(tests)
            }
            Some("jsonl") => {
                let mut tests = Vec::new();
                super::dataset::read_jsonl(&path, text.as_bytes(), &mut |_, row| {
                    tests.push(Value::Object(row));
                    Ok(())
                })?;
                Ok(tests)
            }
            Some("yaml" | "yml" | "json") => {
                let (value, _) = yaml::parse(&text)
                    .map_err(|e| ConfigError::at(&path, e.position, format!("invalid YAML: {}", e.message)))?;
                match value {
                    Value::Array(items) => Ok(items),
                    _ => Err(in_file("a tests file holds a list of tests".into())),
                }
            }
            _ => {
                self.unsupported(at, format!("the tests file `{reference}` (CSV, JSONL, YAML or JSON are)"))?;
                Ok(Vec::new())
            }
        }
    }

    /// `scenarios:`: each entry of a scenario's `config` with each of its `tests`, as
    /// promptfoo runs them: (the test's path, the test, the entry's path
    /// and the entry).
    fn scenarios(&mut self, value: Option<&Value>) -> Result<Vec<Placed>, ConfigError> {
        let items = match value {
            None => return Ok(Vec::new()),
            Some(Value::Array(items)) => items,
            Some(other) => return Err(self.source.error("scenarios", format!("`scenarios` is a list, not {other}"))),
        };
        let mut tests = Vec::new();
        for (i, scenario) in items.iter().enumerate() {
            let at = yaml::item("scenarios", i);
            let Some(o) = scenario.as_object() else {
                return Err(self.source.error(&at, "a scenario is a mapping of `config` and `tests`"));
            };
            for key in o.keys().filter(|k| !["config", "tests", "description"].contains(&k.as_str())) {
                self.unsupported(&yaml::child(&at, key), format!("the scenario key `{key}`"))?;
            }
            let config_at = yaml::child(&at, "config");
            let Some(Value::Array(entries)) = o.get("config") else {
                return Err(self.source.error(&config_at, "a scenario needs `config`, a list of `{vars, assert}`"));
            };
            let scenario_tests: Vec<(String, Value)> = match o.get("tests") {
                // promptfoo's schema requires them, and without them it runs nothing.
                None => return Err(self.source.error(&at, "a scenario needs `tests`, a list of `{vars, assert}`")),
                Some(Value::Array(list)) => list
                    .iter()
                    .enumerate()
                    .map(|(j, t)| (yaml::item(&yaml::child(&at, "tests"), j), t.clone()))
                    .collect(),
                Some(other) => {
                    return Err(self
                        .source
                        .error(&yaml::child(&at, "tests"), format!("a scenario's `tests` is a list, not {other}")));
                }
            };
            for (k, entry) in entries.iter().enumerate() {
                let entry_at = yaml::item(&config_at, k);
                let Some(fields) = entry.as_object() else {
                    return Err(self
                        .source
                        .error(&entry_at, "an entry of a scenario's `config` is a mapping of `vars`, …"));
                };
                for key in fields.keys().filter(|k| !SCENARIO_KEYS.contains(&k.as_str())) {
                    self.unsupported(&yaml::child(&entry_at, key), format!("the scenario config key `{key}`"))?;
                }
                for (test_at, test) in &scenario_tests {
                    tests.push((test_at.clone(), test.clone(), Some((entry_at.clone(), entry.clone()))));
                }
            }
        }
        Ok(tests)
    }

    /// One test as a task: its vars its fields, each assertion a scorer. A scenario's
    /// config entry (`lead`) gives vars under the test's and assertions before its own.
    #[allow(clippy::too_many_arguments)]
    fn task(
        &mut self,
        at: &str,
        test: &Value,
        lead: Option<(&str, &Value)>,
        index: usize,
        defaults: &Defaults,
        has_default_asserts: bool,
        thresholds: &mut Vec<(String, f64)>,
    ) -> Result<Option<Value>, ConfigError> {
        let Some(o) = test.as_object() else { return Err(self.source.error(at, "a test is a mapping")) };
        for key in o.keys().filter(|k| !TEST_KEYS.contains(&k.as_str())) {
            self.unsupported(&yaml::child(at, key), format!("the test key `{key}`"))?;
        }
        let (grader, embedding) = self.options(&yaml::child(at, "options"), o.get("options"))?;
        let outer = self.embedding.clone();
        if embedding.is_some() {
            self.embedding = embedding;
        }
        let mut vars = defaults.vars.clone();
        let task_at = yaml::item("tasks", index);
        let scorers_at = yaml::child(&task_at, "scorers");
        let mut scorers = Vec::new();
        let mut threshold_at = None;
        let mut description = None;
        if let Some((lead_at, entry)) = lead {
            vars.extend(self.vars(&yaml::child(lead_at, "vars"), entry.get("vars"))?);
            if let Some(x) = self.threshold(&yaml::child(lead_at, "threshold"), entry.get("threshold"))? {
                threshold_at = Some((yaml::child(lead_at, "threshold"), x));
            }
            description = entry.get("description").and_then(Value::as_str);
            self.assertions(&yaml::child(lead_at, "assert"), entry.get("assert"), &scorers_at, &mut scorers)?;
        }
        vars.extend(self.vars(&yaml::child(at, "vars"), o.get("vars"))?);
        resolve_vars(&mut vars);
        if let Some(x) = self.threshold(&yaml::child(at, "threshold"), o.get("threshold"))? {
            threshold_at = Some((yaml::child(at, "threshold"), x));
        }
        thresholds.extend(threshold_at);
        self.assertions(&yaml::child(at, "assert"), o.get("assert"), &scorers_at, &mut scorers)?;
        self.embedding = outer;
        if let Some(model) = grader {
            for s in &mut scorers {
                if ["llm_rubric", "model_graded_closedqa", "factuality"].iter().any(|k| s.get(k).is_some())
                    && s.get("model").is_none()
                {
                    s["model"] = json!(model);
                }
            }
        }
        if scorers.is_empty() && !has_default_asserts {
            self.unsupported(at, "a test without assertions (runner scores every task)".into())?;
            return Ok(None);
        }
        self.aliases.push((task_at, at.to_owned()));
        let text = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let input = vars.get("input").map_or_else(|| Value::Object(vars.clone()).to_string(), text);
        let mut task =
            json!({"id": format!("test-{}", index + 1), "input": input, "metadata": vars, "scorers": scorers});
        if let Some(target) = vars.get("target") {
            task["target"] = json!(text(target));
        }
        if let Some(description) = o.get("description").and_then(Value::as_str).or(description) {
            task["metadata"]["description"] = json!(description);
        }
        Ok(Some(task))
    }

    /// A list of assertions as scorers, appended to `out` (whose place in the suite is `to`).
    fn assertions(
        &mut self,
        at: &str,
        value: Option<&Value>,
        to: &str,
        out: &mut Vec<Value>,
    ) -> Result<(), ConfigError> {
        let items = match value {
            None => return Ok(()),
            Some(Value::Array(items)) => items,
            Some(other) => return Err(self.source.error(at, format!("`assert` is a list, not {other}"))),
        };
        for (i, item) in items.iter().enumerate() {
            let here = yaml::item(at, i);
            if item.get("type").and_then(Value::as_str) == Some("assert-set") {
                self.assert_set(&here, item, to, out)?;
                continue;
            }
            if let Some(scorer) = self.assertion(&here, item)? {
                self.aliases.push((yaml::item(to, out.len()), here));
                out.push(scorer);
            }
        }
        Ok(())
    }

    /// `assert-set` (without a threshold or metric of its own): its assertions, since a test
    /// passes only when every assertion does anyway. promptfoo scores the set as one
    /// assertion, the weighted mean of its own, counted with the set's `weight`: each of them
    /// weighs its share of that.
    fn assert_set(&mut self, at: &str, item: &Value, to: &str, out: &mut Vec<Value>) -> Result<(), ConfigError> {
        let own = ["threshold", "metric"].into_iter().find(|k| item.get(*k).is_some());
        if let Some(key) = own {
            return self.unsupported(&yaml::child(at, key), format!("`{key}` on an `assert-set`"));
        }
        let set_weight = match item.get("weight") {
            None => 1.0,
            Some(w) => match w.as_f64() {
                Some(w) if w.is_finite() && w >= 0.0 => w,
                _ => return Err(self.source.error(&yaml::child(at, "weight"), "a weight is a number of at least 0")),
            },
        };
        let first = out.len();
        self.assertions(&yaml::child(at, "assert"), item.get("assert"), to, out)?;
        let weight_of = |s: &Value| s.get("weight").and_then(Value::as_f64).unwrap_or(1.0);
        let total: f64 = out[first..].iter().map(weight_of).sum();
        if total > 0.0 && (total != 1.0 || set_weight != 1.0) {
            for scorer in &mut out[first..] {
                scorer["weight"] = json!(weight_of(scorer) / total * set_weight);
            }
        }
        Ok(())
    }

    /// One assertion as a runner scorer; `None` when it was skipped.
    fn assertion(&mut self, at: &str, item: &Value) -> Result<Option<Value>, ConfigError> {
        let Some(o) = item.as_object() else {
            return Err(self.source.error(at, "an assertion is a mapping with `type`"));
        };
        if o.contains_key("$ref") {
            self.unsupported(at, "an assertion by `$ref`".into())?;
            return Ok(None);
        }
        for key in o.keys().filter(|k| !ASSERT_KEYS.contains(&k.as_str())) {
            self.unsupported(&yaml::child(at, key), format!("the assertion key `{key}`"))?;
        }
        let Some(kind) = o.get("type").and_then(Value::as_str) else {
            return Err(self.source.error(at, "an assertion needs a `type`"));
        };
        let (negate, base) = match kind.strip_prefix("not-") {
            Some(base) => (true, base),
            None => (false, kind),
        };
        let head = Assertion {
            at,
            o,
            kind,
            base,
            negate,
            value: o.get("value").cloned().unwrap_or(Value::Null),
            threshold: o.get("threshold").and_then(Value::as_f64),
        };
        let mapped = match self.on_the_answer(&head)? {
            Mapped::Other => self.graded_or_code(&head)?,
            mapped => mapped,
        };
        let mut scorer = match mapped {
            Mapped::Scorer(scorer) => scorer,
            Mapped::Skipped => return Ok(None),
            Mapped::Other => {
                self.unsupported(&yaml::child(at, "type"), format!("the assertion type `{kind}`"))?;
                return Ok(None);
            }
        };
        if !GRADED.contains(&base) && base != "similar" && o.contains_key("provider") {
            self.unsupported(&yaml::child(at, "provider"), format!("`provider` on `{kind}`"))?;
        }
        if let Some(weight) = o.get("weight") {
            scorer["weight"] = weight.clone();
        }
        Ok(Some(scorer))
    }

    /// An assertion on the answer itself (its text, its JSON, its latency and cost);
    /// `Other` for the rest.
    fn on_the_answer(&mut self, head: &Assertion) -> Result<Mapped, ConfigError> {
        let Assertion { at, kind, base, negate, ref value, threshold, .. } = *head;
        let not = if negate { "not_" } else { "" };
        let text = |s: &Self| s.text_value(head);
        let scorer = match base {
            "equals" if value.is_object() || value.is_array() => {
                // A structured value equals the answer parsed as JSON, deeply.
                json!({format!("{not}is_json"): {"const": value}})
            }
            "equals" => json!({format!("{not}equals"): text(self)?, "exact": true}),
            "contains" | "icontains" => {
                let mut s = json!({format!("{not}includes"): text(self)?});
                if base == "icontains" {
                    s["ignore_case"] = json!(true);
                }
                s
            }
            "contains-any" | "contains-all" | "icontains-any" | "icontains-all" => {
                let key = if base.ends_with("all") { "contains_all" } else { "contains_any" };
                let mut s = json!({format!("{not}{key}"): value});
                if base.starts_with('i') {
                    s["ignore_case"] = json!(true);
                }
                s
            }
            "starts-with" => json!({format!("{not}starts_with"): text(self)?}),
            "regex" => json!({format!("{not}regex"): text(self)?}),
            "is-json" | "contains-json" => {
                let key = if base == "is-json" { "is_json" } else { "contains_json" };
                let schema = match &value {
                    Value::Null => json!(true),
                    Value::Object(_) => value.clone(),
                    // A schema written as YAML or JSON text.
                    Value::String(s) if !s.starts_with("file://") => match yaml::parse(s) {
                        Ok((schema @ Value::Object(_), _)) => schema,
                        _ => return Err(self.source.error(&yaml::child(at, "value"), "not a JSON Schema")),
                    },
                    _ => {
                        self.unsupported(&yaml::child(at, "value"), format!("this `value` of `{kind}`"))?;
                        return Ok(Mapped::Skipped);
                    }
                };
                json!({format!("{not}{key}"): schema})
            }
            "levenshtein" if !negate => {
                let expected = text(self)?;
                json!({"levenshtein": expected, "max_distance": threshold.unwrap_or(5.0)})
            }
            "latency" if !negate => match threshold {
                Some(ms) => json!({"max_latency": ms / 1e3}),
                None => return Err(self.source.error(at, "`latency` needs a `threshold` in milliseconds")),
            },
            "cost" if !negate => match threshold {
                Some(usd) => json!({"max_cost": usd}),
                None => return Err(self.source.error(at, "`cost` needs a `threshold` in USD")),
            },
            _ => return Ok(Mapped::Other),
        };
        Ok(Mapped::Scorer(scorer))
    }

    /// An assertion a model grades, code checks, or an embedding compares; `Other` for the rest.
    fn graded_or_code(&mut self, head: &Assertion) -> Result<Mapped, ConfigError> {
        let Assertion { at, o, kind, base, negate, ref value, threshold, .. } = *head;
        let not = if negate { "not_" } else { "" };
        let text = |s: &Self| s.text_value(head);
        let scorer = match base {
            "llm-rubric" | "model-graded-closedqa" | "factuality" if !negate => {
                let key = match base {
                    "llm-rubric" => "llm_rubric",
                    "model-graded-closedqa" => "model_graded_closedqa",
                    _ => "factuality",
                };
                let mut s = json!({key: text(self)?});
                if let Some(t) = threshold {
                    s["threshold"] = json!(t);
                }
                if let Some(model) = self.grader(&yaml::child(at, "provider"), o.get("provider"))? {
                    s["model"] = json!(model);
                }
                s
            }
            "python" | "javascript" => {
                let Some(code) = self.code(at, base, value)? else { return Ok(Mapped::Skipped) };
                let key = if base == "python" { "python" } else { "js" };
                let mut s = json!({format!("{not}{key}"): code});
                if let Some(t) = threshold {
                    s["threshold"] = json!(t);
                }
                s
            }
            "similar" => {
                let own = self.embedding_of(&yaml::child(at, "provider"), o.get("provider"))?;
                let Some(embedding) = own.or_else(|| self.embedding.clone()) else {
                    let why = "without an embedding model (name one: `provider: openai:embedding:MODEL` on it, or in `defaultTest.options.provider`)";
                    self.unsupported(&yaml::child(at, "type"), format!("the assertion type `{kind}` {why}"))?;
                    return Ok(Mapped::Skipped);
                };
                let mut s = json!({format!("{not}similar"): text(self)?});
                s["threshold"] = json!(threshold.unwrap_or(0.75));
                s["embedding"] = json!(embedding.model);
                if let Some(url) = embedding.url {
                    s["embedding_url"] = json!(url);
                }
                s
            }
            _ => return Ok(Mapped::Other),
        };
        Ok(Mapped::Scorer(scorer))
    }

    /// The assertion's `value` as a text (a number written as one), or the error that says
    /// its type takes one.
    fn text_value(&self, head: &Assertion) -> Result<Value, ConfigError> {
        match &head.value {
            Value::String(s) => Ok(Value::String(s.clone())),
            Value::Number(n) => Ok(Value::String(n.to_string())),
            _ => {
                Err(self.source.error(&yaml::child(head.at, "value"), format!("`{}` takes a text `value`", head.kind)))
            }
        }
    }

    /// A `python` or `javascript` assertion's value as a code scorer's: an inline
    /// expression (or, over several lines, a body that `return`s), or `file://path:function`
    /// (a Python file alone names its function `get_assert`, as promptfoo's default).
    fn code(&mut self, at: &str, kind: &str, value: &Value) -> Result<Option<String>, ConfigError> {
        let Value::String(text) = value else {
            return Err(self
                .source
                .error(&yaml::child(at, "value"), format!("`{kind}` takes code or `file://…` as its `value`")));
        };
        let Some(file) = text.trim().strip_prefix("file://") else { return Ok(Some(text.clone())) };
        let path = file.rsplit_once(':').filter(|(_, f)| !f.contains('/')).map_or(file, |(path, _)| path);
        self.check_inside(&yaml::child(at, "value"), text.trim(), path)?;
        let has_function = file
            .rsplit_once(':')
            .is_some_and(|(path, _)| [".py", ".js", ".mjs", ".cjs"].iter().any(|e| path.ends_with(e)));
        if has_function {
            return Ok(Some(file.to_owned()));
        }
        if kind == "python" && file.ends_with(".py") {
            return Ok(Some(format!("{file}:get_assert")));
        }
        self.unsupported(
            &yaml::child(at, "value"),
            format!("`{kind}: {text}` without a function's name (write `file://{file}:function`)"),
        )?;
        Ok(None)
    }
}

/// One assertion as it was written: where, its type (with and without `not-`), its value
/// and threshold.
struct Assertion<'a> {
    at: &'a str,
    o: &'a Map<String, Value>,
    kind: &'a str,
    base: &'a str,
    negate: bool,
    value: Value,
    threshold: Option<f64>,
}

/// What an assertion became: a scorer, skipped (a refusal that `--allow-unsupported` let
/// through), or not of the kinds asked.
enum Mapped {
    Scorer(Value),
    Skipped,
    Other,
}

/// A test's vars as promptfoo reads them before it renders a prompt: a text loses one
/// trailing newline; the first `{{ name }}` in a text, when `name` is another var, is
/// replaced by that var's value (five rounds at most, as promptfoo's `resolveVariables`);
/// then a text that is still a template is rendered over the vars (and left as it is when
/// it names a var there is not).
fn resolve_vars(vars: &mut Map<String, Value>) {
    static PLACEHOLDER: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let placeholder = PLACEHOLDER.get_or_init(|| regex::Regex::new(r"\{\{\s*(\w+)\s*\}\}").expect("a valid regex"));
    for value in vars.values_mut() {
        if let Value::String(text) = value
            && text.ends_with('\n')
        {
            text.pop();
        }
    }
    let names: Vec<String> = vars.keys().cloned().collect();
    for _ in 0..5 {
        let mut resolved = true;
        for name in &names {
            let Some(Value::String(text)) = vars.get(name) else { continue };
            let Some(found) = placeholder.captures(text) else { continue };
            let Some(other) = vars.get(&found[1]) else { continue };
            let value = match other {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let replaced = text.replacen(&found[0], &value, 1);
            vars.insert(name.clone(), Value::String(replaced));
            resolved = false;
        }
        if resolved {
            break;
        }
    }
    let context = vars.clone();
    for value in vars.values_mut() {
        if let Value::String(text) = value
            && crate::config::template::is_template(text)
            && let Ok(rendered) = crate::config::template::render(text, &context)
        {
            *text = rendered;
        }
    }
}

/// A test from a CSV row: each column a var, `__expected` (and `__expected1`, …) an
/// assertion written `type: value` (or a value `equals`), `__description` its description,
/// `__threshold` its threshold.
fn csv_test(row: Map<String, Value>) -> Result<Value, String> {
    let mut vars = Map::new();
    let mut asserts = Vec::new();
    let mut test = Map::new();
    for (column, value) in row {
        let text = match &value {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        if column.starts_with("__expected") {
            if !text.is_empty() {
                asserts.push(expected(&text));
            }
        } else if column == "__description" {
            test.insert("description".into(), json!(text));
        } else if column == "__threshold" {
            test.insert("threshold".into(), json!(text));
        } else if let Some(other) = column.strip_prefix("__") {
            return Err(format!("the column `__{other}` is not supported"));
        } else {
            vars.insert(column, value);
        }
    }
    test.insert("vars".into(), Value::Object(vars));
    test.insert("assert".into(), Value::Array(asserts));
    Ok(Value::Object(test))
}

/// `__expected`'s shorthand: `contains: x`, `regex: …`, `is-json`, `grade: …` (a rubric), or
/// a plain value that the answer must equal.
fn expected(text: &str) -> Value {
    if let Some(rubric) = text.strip_prefix("grade:") {
        return json!({"type": "llm-rubric", "value": rubric.trim()});
    }
    if let Some((kind, value)) = text.split_once(':')
        && !kind.contains(' ')
        && !kind.is_empty()
    {
        return json!({"type": kind.trim(), "value": value.trim_start()});
    }
    if matches!(text, "is-json" | "contains-json") {
        return json!({"type": text});
    }
    json!({"type": "equals", "value": text})
}

/// A provider id as runner's model: `echo`, `openai:chat:gpt-4o-mini` → `openai/gpt-4o-mini`,
/// `anthropic:messages:…` → `anthropic/…`, `ollama:chat:qwen3` → `ollama/qwen3`.
fn model_of(id: &str) -> Option<String> {
    if id == "echo" {
        return Some("echo".into());
    }
    let routes = [
        ("openai:chat:", "openai"),
        ("openai:", "openai"),
        ("anthropic:messages:", "anthropic"),
        ("ollama:chat:", "ollama"),
        ("ollama:completion:", "ollama"),
        ("ollama:", "ollama"),
    ];
    routes.iter().find_map(|(prefix, provider)| {
        let model = id.strip_prefix(prefix)?;
        (!model.is_empty() && !model.contains(':')).then(|| format!("{provider}/{model}"))
    })
}

/// A label as a variant name: letters, digits, `.`, `_` and `-`.
fn slug(label: &str) -> String {
    let cut: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' })
        .collect();
    let trimmed = cut.trim_matches('-');
    if trimmed.is_empty() { "prompt".into() } else { trimmed.chars().take(60).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_map_to_models() {
        assert_eq!(model_of("echo").as_deref(), Some("echo"));
        assert_eq!(model_of("openai:gpt-4o-mini").as_deref(), Some("openai/gpt-4o-mini"));
        assert_eq!(model_of("openai:chat:gpt-4o").as_deref(), Some("openai/gpt-4o"));
        assert_eq!(model_of("anthropic:messages:claude-3-5-haiku").as_deref(), Some("anthropic/claude-3-5-haiku"));
        assert_eq!(model_of("ollama:chat:qwen3").as_deref(), Some("ollama/qwen3"));
        assert_eq!(model_of("openai:embedding:text-embedding-3"), None);
        assert_eq!(model_of("bedrock:x"), None);
    }

    #[test]
    fn csv_expectations_read_as_promptfoo_writes_them() {
        assert_eq!(expected("contains: Paris"), json!({"type": "contains", "value": "Paris"}));
        assert_eq!(expected("Paris"), json!({"type": "equals", "value": "Paris"}));
        assert_eq!(expected("grade: is polite"), json!({"type": "llm-rubric", "value": "is polite"}));
        assert_eq!(expected("is-json"), json!({"type": "is-json"}));
    }
}
