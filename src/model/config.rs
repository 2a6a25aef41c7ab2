//! Providers and prices: built-in defaults that follow the SDKs' conventions
//! (`OPENAI_API_KEY`, `OPENAI_BASE_URL`, `ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`,
//! `OLLAMA_HOST`), extended or overridden by a `runner.yaml` config file; and that file's
//! `images:` settings (`config::images`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::config::decode::{ConfigError, Source, check_seconds};
use crate::config::images::RegistrySettings;

/// The wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// OpenAI Chat Completions, also spoken by vLLM, llama.cpp, Ollama, LiteLLM, OpenRouter.
    Openai,
    /// Anthropic Messages.
    Anthropic,
}

/// One provider: where it is, how to authenticate, how hard to push it.
#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    pub name: String,
    pub api: Api,
    /// As the SDKs take it: `https://api.openai.com/v1` (OpenAI, with the version),
    /// `https://api.anthropic.com` (Anthropic, without).
    pub base_url: Option<String>,
    /// An environment variable that, when set, overrides `base_url`.
    pub base_url_env: Option<String>,
    /// The environment variable holding the API key; the key itself is never stored.
    pub key_env: Option<String>,
    /// Requests in flight at once, per model (lowered for a while after a 429).
    pub max_concurrency: usize,
    /// Per request, including reading the body.
    pub timeout_s: f64,
    /// Retries after the first attempt, for 429, 5xx, timeouts and broken connections.
    pub max_retries: u32,
    /// The first retry waits up to this long; each retry doubles it (with jitter).
    pub retry_base_s: f64,
    /// The longest wait between attempts, `Retry-After` included.
    pub retry_max_s: f64,
    /// Merged into every request body: `temperature`, `max_tokens`, `seed`, …
    pub sampling: Map<String, Value>,
    /// OpenAI API only: the `parallel_tool_calls` sent with tools; not sent when unset.
    pub parallel_tool_calls: Option<bool>,
    /// What a run may spend on this provider's models (`budget:` in runner.yaml).
    pub budget: Caps,
}

/// Caps on what a run spends, over all its episodes: given per run on the command line,
/// per provider in runner.yaml. `None` is no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caps {
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<u64>,
    pub max_model_calls: Option<u64>,
}

impl Caps {
    pub fn is_none(&self) -> bool {
        *self == Caps::default()
    }
}

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Cached input tokens; the input price when absent.
    pub cached_input: Option<f64>,
}

impl Price {
    pub fn cost(&self, usage: &crate::log::Usage) -> f64 {
        let cached = usage.cached_tokens.min(usage.input_tokens) as f64;
        let fresh = usage.input_tokens as f64 - cached;
        let cost = (fresh * self.input
            + cached * self.cached_input.unwrap_or(self.input)
            + usage.output_tokens as f64 * self.output)
            / 1e6;
        // A price list's large prices times a provider's large counts must stay a number.
        cost.min(f64::MAX)
    }
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub providers: BTreeMap<String, Provider>,
    /// Keyed by the full model name: `openai/gpt-4o-mini`.
    pub prices: BTreeMap<String, Price>,
    /// HTTP endpoints as models (a promptfoo config's `http` providers), by model name.
    pub endpoints: BTreeMap<String, std::sync::Arc<super::endpoint::Endpoint>>,
    /// Where images are pulled from (`images:`).
    pub images: RegistrySettings,
    /// Where it was read from, if anywhere.
    pub file: Option<PathBuf>,
}

fn provider(
    name: &str,
    api: Api,
    base_url: Option<&str>,
    base_url_env: Option<&str>,
    key_env: Option<&str>,
) -> Provider {
    Provider {
        name: name.into(),
        api,
        base_url: base_url.map(String::from),
        base_url_env: base_url_env.map(String::from),
        key_env: key_env.map(String::from),
        max_concurrency: 16,
        timeout_s: 120.0,
        max_retries: 5,
        retry_base_s: 1.0,
        retry_max_s: 60.0,
        sampling: Map::new(),
        parallel_tool_calls: None,
        budget: Caps::default(),
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        let mut openai = provider(
            "openai",
            Api::Openai,
            Some("https://api.openai.com/v1"),
            Some("OPENAI_BASE_URL"),
            Some("OPENAI_API_KEY"),
        );
        openai.parallel_tool_calls = Some(true);
        let mut anthropic = provider(
            "anthropic",
            Api::Anthropic,
            Some("https://api.anthropic.com"),
            Some("ANTHROPIC_BASE_URL"),
            Some("ANTHROPIC_API_KEY"),
        );
        anthropic.sampling.insert("max_tokens".into(), json!(4096));
        let mut ollama = provider("ollama", Api::Openai, Some("http://localhost:11434/v1"), Some("OLLAMA_HOST"), None);
        ollama.max_concurrency = 4;
        let compatible = provider(
            "openai-compatible",
            Api::Openai,
            None,
            Some("OPENAI_COMPATIBLE_BASE_URL"),
            Some("OPENAI_COMPATIBLE_API_KEY"),
        );
        let providers = [openai, anthropic, ollama, compatible].into_iter().map(|p| (p.name.clone(), p)).collect();
        ModelConfig {
            providers,
            prices: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            images: RegistrySettings::default(),
            file: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    providers: BTreeMap<String, ProviderFile>,
    #[serde(default)]
    prices: BTreeMap<String, Price>,
    images: Option<RegistrySettings>,
}

/// A provider as written: every field optional, over the built-in of the same name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderFile {
    api: Option<Api>,
    base_url: Option<String>,
    base_url_env: Option<String>,
    key_env: Option<String>,
    max_concurrency: Option<usize>,
    timeout_s: Option<f64>,
    max_retries: Option<u32>,
    retry_base_s: Option<f64>,
    retry_max_s: Option<f64>,
    sampling: Option<Map<String, Value>>,
    parallel_tool_calls: Option<bool>,
    budget: Option<Caps>,
}

impl ModelConfig {
    /// The built-ins, then `path` if given, else `$RUNNER_CONFIG`, else `./runner.yaml` if it exists.
    /// The variables that hold the providers' API keys.
    pub fn key_vars(&self) -> impl Iterator<Item = &str> {
        self.providers.values().filter_map(|p| p.key_env.as_deref())
    }

    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let chosen = match path {
            Some(p) => Some(p.to_owned()),
            None => match std::env::var_os("RUNNER_CONFIG") {
                Some(p) => Some(PathBuf::from(p)),
                None => Some(PathBuf::from("runner.yaml")).filter(|p| p.is_file()),
            },
        };
        let mut config = ModelConfig::default();
        if let Some(path) = chosen {
            config.merge_file(&path)?;
        }
        Ok(config)
    }

    fn merge_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let (source, _) = Source::read(path)?;
        let file: ConfigFile = source.decode("", &source.value)?;
        for (name, f) in file.providers {
            let at = format!("providers.{name}");
            let mut p = match self.providers.get(&name) {
                Some(p) => p.clone(),
                None => {
                    let Some(api) = f.api else {
                        return Err(source.error(&at, "a new provider needs `api: openai` or `api: anthropic`"));
                    };
                    provider(&name, api, None, None, None)
                }
            };
            if let Some(v) = f.api {
                p.api = v;
            }
            if f.base_url.is_some() {
                p.base_url = f.base_url;
            }
            if f.base_url_env.is_some() {
                p.base_url_env = f.base_url_env;
            }
            if f.key_env.is_some() {
                p.key_env = f.key_env;
            }
            if let Some(v) = f.max_concurrency {
                if v == 0 {
                    return Err(source.error(&format!("{at}.max_concurrency"), "must be at least 1"));
                }
                p.max_concurrency = v;
            }
            for (field, value, slot) in [
                ("timeout_s", f.timeout_s, &mut p.timeout_s),
                ("retry_base_s", f.retry_base_s, &mut p.retry_base_s),
                ("retry_max_s", f.retry_max_s, &mut p.retry_max_s),
            ] {
                if let Some(v) = value {
                    let min = if field == "timeout_s" { 0.001 } else { 0.0 };
                    check_seconds(&source, &format!("{at}.{field}"), v, min, crate::domain::MAX_EPISODE_S)?;
                    *slot = v;
                }
            }
            if let Some(v) = f.max_retries {
                p.max_retries = v;
            }
            if let Some(v) = f.sampling {
                check_sampling(&v).map_err(|(key, e)| source.error(&format!("{at}.sampling.{key}"), e))?;
                p.sampling.extend(v);
            }
            if let Some(v) = f.parallel_tool_calls {
                p.parallel_tool_calls = Some(v);
            }
            if let Some(budget) = f.budget {
                if budget.max_cost_usd.is_some_and(|c| !c.is_finite() || c < 0.0) {
                    return Err(
                        source.error(&format!("{at}.budget.max_cost_usd"), "must be a number of dollars, 0 or more")
                    );
                }
                p.budget = budget;
            }
            self.providers.insert(name, p);
        }
        self.prices.extend(file.prices);
        if let Some(images) = file.images {
            self.images = images;
        }
        self.file = Some(path.to_owned());
        Ok(())
    }
}

/// The keys of a request body that runner builds itself: sampling settings cannot set them.
const BUILT_KEYS: &[&str] = &["model", "messages", "tools", "stream", "system", "parallel_tool_calls"];

/// The sampling key that says how the model must use the tools (`auto`, the default,
/// `required`, `none`, or the provider's own object naming one tool): a weak model may need
/// `required`. It is sent only with tools, which the provider's API demands.
pub const TOOL_CHOICE: &str = "tool_choice";

/// Checks sampling settings (a provider's, a suite's or a variant's `sampling:`) before they
/// are merged into request bodies. Providers take keys runner does not know (`reasoning_effort`,
/// `response_format`, …), so any key passes through, but the keys every provider documents
/// must have their type, and the keys runner builds the body from are refused. `Err` names
/// the key and what is wrong with it.
pub fn check_sampling(sampling: &Map<String, Value>) -> Result<(), (String, String)> {
    for (key, value) in sampling {
        let wrong = |what: &str| Err((key.clone(), format!("must be {what}, not {value}")));
        if BUILT_KEYS.contains(&key.as_str()) {
            let why = if key == "parallel_tool_calls" {
                "is a provider's setting (`providers.NAME.parallel_tool_calls` in runner.yaml), not a sampling one"
            } else {
                "is part of the request runner builds; sampling settings cannot set it"
            };
            return Err((key.clone(), why.into()));
        }
        let texts = value.as_array().is_some_and(|items| items.iter().all(Value::is_string));
        match key.as_str() {
            "temperature" | "top_p" | "min_p" | "frequency_penalty" | "presence_penalty" | "repetition_penalty"
                if !value.as_f64().is_some_and(f64::is_finite) =>
            {
                return wrong("a number");
            }
            "max_tokens" | "max_completion_tokens" | "top_k" | "n" if value.as_u64().is_none_or(|n| n < 1) => {
                return wrong("a whole number, 1 or more");
            }
            "seed" if value.as_i64().is_none() && value.as_u64().is_none() => return wrong("a whole number"),
            "stop" | "stop_sequences" if !value.is_string() && !texts => return wrong("a text or a list of texts"),
            TOOL_CHOICE
                if !value.is_object() && !value.as_str().is_some_and(|c| ["auto", "required", "none"].contains(&c)) =>
            {
                return wrong("`auto`, `required`, `none`, or the provider's object naming a tool");
            }
            _ if value.is_null() => return wrong("a value"),
            _ => {}
        }
    }
    Ok(())
}

impl Provider {
    /// The base URL in force: the environment variable's, else the configured one.
    pub fn resolve_base_url(&self) -> Result<String, String> {
        let from_env =
            self.base_url_env.as_ref().and_then(|var| std::env::var(var).ok()).filter(|v| !v.trim().is_empty());
        let (url, from) = match (from_env, &self.base_url) {
            (Some(url), _) => {
                let var = self.base_url_env.as_deref().unwrap_or_default();
                if self.name == "ollama" { (ollama_url(&url), var) } else { (url, var) }
            }
            (None, Some(url)) => (url.clone(), "runner.yaml"),
            (None, None) => {
                let var = self.base_url_env.as_deref().unwrap_or("a base_url");
                return Err(format!(
                    "provider `{}` has no endpoint: set {var}, or `providers.{}.base_url` in runner.yaml",
                    self.name, self.name
                ));
            }
        };
        let url = url.trim().trim_end_matches('/').to_owned();
        // Caught here, before a run spends every episode's retries on an address no client takes.
        match reqwest::Url::parse(&url) {
            Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => Ok(url),
            _ => Err(format!(
                "provider `{}`: the base URL `{url}` (from {from}) is not an http(s) URL; write it whole, e.g. `http://127.0.0.1:8080/v1`",
                self.name
            )),
        }
    }

    /// The API key, when the provider uses one. `Err` when its variable is unset.
    pub fn resolve_key(&self) -> Result<Option<String>, String> {
        let Some(var) = &self.key_env else { return Ok(None) };
        match std::env::var(var) {
            Ok(key) if !key.trim().is_empty() => {
                crate::log::secrets::register(&key);
                Ok(Some(key.trim().to_owned()))
            }
            // Compatible servers often need no key.
            _ if self.name == "openai-compatible" => Ok(None),
            _ => Err(format!("provider `{}` needs an API key: set {var}", self.name)),
        }
    }
}

/// `OLLAMA_HOST` is a host (`localhost:11434`, `http://box:11434`); the API is under `/v1`.
fn ollama_url(host: &str) -> String {
    let host = host.trim().trim_end_matches('/');
    let with_scheme = if host.contains("://") { host.to_owned() } else { format!("http://{host}") };
    if with_scheme.ends_with("/v1") { with_scheme } else { format!("{with_scheme}/v1") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_without_a_scheme_is_refused_with_where_it_came_from() {
        let mut provider = provider("local", Api::Openai, None, None, None);
        for bad in ["localhost:8080/v1", "127.0.0.1:8080", "ftp://box/v1", "http://"] {
            provider.base_url = Some(bad.into());
            let error = provider.resolve_base_url().unwrap_err();
            assert!(error.contains("is not an http(s) URL") && error.contains("runner.yaml"), "{bad}: {error}");
        }
        provider.base_url = Some("http://127.0.0.1:8080/v1/".into());
        assert_eq!(provider.resolve_base_url().unwrap(), "http://127.0.0.1:8080/v1");
    }

    #[test]
    fn ollama_host_becomes_an_api_url() {
        assert_eq!(ollama_url("localhost:11434"), "http://localhost:11434/v1");
        assert_eq!(ollama_url("http://box:1/"), "http://box:1/v1");
        assert_eq!(ollama_url("https://box/v1"), "https://box/v1");
    }

    #[test]
    fn a_config_file_overrides_and_adds_providers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runner.yaml");
        std::fs::write(
            &path,
            "providers:\n  openai: {max_concurrency: 3, sampling: {temperature: 0}}\n  local: {api: openai, base_url: http://x/v1}\nprices:\n  openai/m: {input: 1, output: 2}\n",
        )
        .unwrap();
        let c = ModelConfig::load(Some(&path)).unwrap();
        assert_eq!(c.providers["openai"].max_concurrency, 3);
        assert_eq!(c.providers["openai"].key_env.as_deref(), Some("OPENAI_API_KEY"));
        assert_eq!(c.providers["openai"].sampling["temperature"], 0);
        assert_eq!(c.providers["local"].resolve_base_url().unwrap(), "http://x/v1");
        assert_eq!(c.prices["openai/m"].output, 2.0);
    }

    #[test]
    fn a_new_provider_without_an_api_is_an_error_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runner.yaml");
        std::fs::write(&path, "providers:\n  local:\n    base_url: http://x\n").unwrap();
        let e = ModelConfig::load(Some(&path)).unwrap_err().to_string();
        assert!(e.contains("runner.yaml:2:3:") && e.contains("api: openai"), "{e}");
    }

    #[test]
    fn sampling_passes_unknown_keys_and_refuses_wrong_types_and_built_keys() {
        let check = |text: &str| check_sampling(&serde_json::from_str(text).unwrap()).map_err(|(key, _)| key);
        assert_eq!(
            check(r#"{"temperature": 1.0, "max_tokens": 200, "seed": 7, "stop": ["\n"], "reasoning_effort": "low"}"#),
            Ok(())
        );
        assert_eq!(check(r#"{"response_format": {"type": "json_object"}, "seed": -3}"#), Ok(()));
        assert_eq!(check(r#"{"temperature": "hot"}"#), Err("temperature".into()));
        assert_eq!(check(r#"{"max_tokens": 0}"#), Err("max_tokens".into()));
        assert_eq!(check(r#"{"max_tokens": 1.5}"#), Err("max_tokens".into()));
        assert_eq!(check(r#"{"stop": [1]}"#), Err("stop".into()));
        assert_eq!(check(r#"{"messages": []}"#), Err("messages".into()));
        assert_eq!(check(r#"{"logprobs": null}"#), Err("logprobs".into()));
    }

    #[test]
    fn tool_choice_is_a_sampling_setting_of_a_known_shape() {
        let check = |text: &str| check_sampling(&serde_json::from_str(text).unwrap()).map_err(|(key, _)| key);
        for choice in [r#""required""#, r#""auto""#, r#""none""#, r#"{"type": "function", "function": {"name": "f"}}"#]
        {
            assert_eq!(check(&format!(r#"{{"tool_choice": {choice}}}"#)), Ok(()), "{choice}");
        }
        assert_eq!(check(r#"{"tool_choice": "always"}"#), Err("tool_choice".into()));
        assert_eq!(check(r#"{"tool_choice": true}"#), Err("tool_choice".into()));
    }

    #[test]
    fn price_counts_cached_tokens_at_their_own_rate() {
        let p = Price { input: 2.0, output: 10.0, cached_input: Some(1.0) };
        let u = crate::log::Usage { input_tokens: 1_000_000, output_tokens: 100_000, cached_tokens: 500_000 };
        assert!((p.cost(&u) - (1.0 + 0.5 + 1.0)).abs() < 1e-9);
    }
}
