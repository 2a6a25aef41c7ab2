//! Embeddings in the OpenAI wire format (`POST {base}/embeddings` with `{model, input: [...]}`,
//! answered with `{data: [{index, embedding}]}`), which OpenAI, vLLM, llama.cpp, Ollama,
//! LiteLLM and text-embeddings-inference serve: what the `similar` scorer compares.

use std::time::Duration;

use serde_json::{Value, json};

use super::config::{Api, ModelConfig};

/// One embedding model at one endpoint.
pub struct Embedder {
    /// `provider/model`, as the scorer names it.
    pub name: String,
    model: String,
    url: String,
    /// Secret: sent in a header, never logged.
    key: Option<String>,
    client: reqwest::Client,
}

impl Embedder {
    /// Opens `spec` (`provider/model`, the provider from the built-ins or runner.yaml, which
    /// must speak the OpenAI API) at `base_url` when given, else at the provider's.
    pub fn open(spec: &str, base_url: Option<&str>, config: &ModelConfig) -> Result<Self, String> {
        let Some((provider, model)) = spec.split_once('/').filter(|(p, m)| !p.is_empty() && !m.is_empty()) else {
            return Err(format!(
                "the embedding model `{spec}` is not `provider/model` (e.g. openai/text-embedding-3-small)"
            ));
        };
        let Some(p) = config.providers.get(provider) else {
            return Err(format!("unknown provider `{provider}` in the embedding model `{spec}`"));
        };
        if p.api != Api::Openai {
            return Err(format!("the embedding model `{spec}`: provider `{provider}` does not speak the OpenAI API"));
        }
        let (base, key) = match base_url {
            // A server of its own often needs no key: the provider's is sent when it is set.
            Some(url) => (url.trim().trim_end_matches('/').to_owned(), p.resolve_key().ok().flatten()),
            None => (p.resolve_base_url()?, p.resolve_key()?),
        };
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs_f64(p.timeout_s))
            .build()
            .map_err(|e| format!("failed to build an HTTP client: {e}"))?;
        Ok(Embedder { name: spec.to_owned(), model: model.to_owned(), url: format!("{base}/embeddings"), key, client })
    }

    /// The embeddings of `texts`, in their order.
    pub async fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f64>>, String> {
        let mut request = self.client.post(&self.url).json(&json!({"model": self.model, "input": texts}));
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        let failed = |what: String| format!("the embedding model {} at {}: {what}", self.name, self.url);
        let response = request.send().await.map_err(|e| failed(format!("the request failed: {e}")))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| failed(format!("the response broke off: {e}")))?;
        if !status.is_success() {
            let head: String = body.chars().take(300).collect();
            return Err(failed(format!("answered {status}: {head}")));
        }
        let parsed: Value =
            serde_json::from_str(&body).map_err(|e| failed(format!("the response is not JSON: {e}")))?;
        read_embeddings(&parsed, texts.len()).map_err(failed)
    }
}

/// The vectors of an embeddings response, put in the order of their `index`.
fn read_embeddings(body: &Value, expected: usize) -> Result<Vec<Vec<f64>>, String> {
    let data = body.get("data").and_then(Value::as_array).ok_or("the response has no `data` list")?;
    let mut vectors: Vec<Option<Vec<f64>>> = vec![None; expected];
    for (position, item) in data.iter().enumerate() {
        let index = item.get("index").and_then(Value::as_u64).map_or(position, |i| i as usize);
        let numbers =
            item.get("embedding").and_then(Value::as_array).ok_or("an item of `data` has no `embedding` list")?;
        let vector: Option<Vec<f64>> = numbers.iter().map(Value::as_f64).collect();
        let vector = vector.ok_or("an `embedding` holds something other than numbers")?;
        let slot =
            vectors.get_mut(index).ok_or(format!("an embedding has the index {index}, beyond the {expected} asked"))?;
        *slot = Some(vector);
    }
    vectors.into_iter().enumerate().map(|(i, v)| v.ok_or(format!("no embedding came back for input {i}"))).collect()
}

/// The cosine similarity of two vectors; `None` when their lengths differ or one is zero.
pub fn cosine(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() != b.len() || a.is_empty() {
        return None;
    }
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let (na, nb) = (norm(a), norm(b));
    (na > 0.0 && nb > 0.0).then(|| dot / (na * nb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_is_the_hand_computed_one() {
        // (1,0)·(0.6,0.8) = 0.6, both of length 1.
        assert!((cosine(&[1.0, 0.0], &[0.6, 0.8]).unwrap() - 0.6).abs() < 1e-12);
        // (1,2,2)·(2,1,2) = 8, lengths 3 and 3: 8/9.
        assert!((cosine(&[1.0, 2.0, 2.0], &[2.0, 1.0, 2.0]).unwrap() - 8.0 / 9.0).abs() < 1e-12);
        assert_eq!(cosine(&[1.0], &[1.0, 2.0]), None);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 2.0]), None);
    }

    #[test]
    fn embeddings_are_put_in_the_order_of_their_index() {
        let body = json!({"data": [{"index": 1, "embedding": [0.0, 1.0]}, {"index": 0, "embedding": [1.0, 0.0]}]});
        assert_eq!(read_embeddings(&body, 2).unwrap(), vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
        assert!(
            read_embeddings(&json!({"data": [{"index": 0, "embedding": [1.0]}]}), 2).unwrap_err().contains("input 1")
        );
        assert!(read_embeddings(&json!({"object": "list"}), 1).unwrap_err().contains("no `data`"));
    }
}
