//! One registry, spoken to with the OCI distribution API: manifests and blobs by digest,
//! anonymous Bearer tokens when it asks for them (a `WWW-Authenticate` challenge sends the
//! client to its token endpoint), every blob's sha256 checked as it streams in.

use std::io::Write;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::error::PullFault;
use super::manifest::Descriptor;
use super::reference::{DOCKER_HUB, Reference};
use crate::config::images::RegistrySettings;

/// The most of a manifest or configuration read into memory.
const MAX_DOCUMENT: u64 = 16 << 20;

pub struct Registry {
    client: reqwest::Client,
    /// `https://host[:port]`.
    base: String,
    /// The host, as messages name it.
    host: String,
    repository: String,
    token: Option<String>,
}

/// The host a registry's images are pulled from: its mirror if runner.yaml names one.
pub fn host_of(registry: &str, settings: &RegistrySettings) -> String {
    match settings.mirrors.get(registry) {
        Some(mirror) => mirror.clone(),
        None if registry == DOCKER_HUB => "registry-1.docker.io".into(),
        None => registry.to_owned(),
    }
}

fn client() -> Result<reqwest::Client, PullFault> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(120))
        .user_agent(concat!("runner/", env!("CARGO_PKG_VERSION")));
    // The system's certificates too (a proxy's own authority is installed there).
    let bundle = std::env::var_os("SSL_CERT_FILE").unwrap_or_else(|| "/etc/ssl/certs/ca-certificates.crt".into());
    if let Ok(pem) = std::fs::read(&bundle)
        && let Ok(certs) = reqwest::Certificate::from_pem_bundle(&pem)
    {
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| PullFault::Store(format!("cannot make an HTTP client: {e}")))
}

impl Registry {
    pub fn new(reference: &Reference, settings: &RegistrySettings) -> Result<Registry, PullFault> {
        let host = host_of(&reference.registry, settings);
        let scheme = if settings.insecure.contains(&host) { "http" } else { "https" };
        Ok(Registry {
            client: client()?,
            base: format!("{scheme}://{host}"),
            host,
            repository: reference.repository.clone(),
            token: None,
        })
    }

    fn unreachable(&self, e: reqwest::Error) -> PullFault {
        let mut why = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(inner) = source {
            why = format!("{why}: {inner}");
            source = inner.source();
        }
        PullFault::Unreachable { registry: self.host.clone(), why }
    }

    /// GET `path` of the repository; a Bearer challenge is answered once, anonymously.
    async fn get(&mut self, path: &str, accept: &str, what: &str) -> Result<reqwest::Response, PullFault> {
        let url = format!("{}/v2/{}/{path}", self.base, self.repository);
        for attempt in 0..2 {
            let mut request = self.client.get(&url).header("Accept", accept);
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.map_err(|e| self.unreachable(e))?;
            let status = response.status();
            if status.is_success() {
                return Ok(response);
            }
            let challenge = response.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).map(String::from);
            match challenge {
                Some(challenge) if status == 401 && attempt == 0 && challenge.starts_with("Bearer ") => {
                    self.token = Some(self.token_for(&challenge).await?);
                }
                _ => return Err(self.status_fault(response, what).await),
            }
        }
        Err(PullFault::Status { registry: self.host.clone(), what: what.into(), status: 401, body: String::new() })
    }

    async fn status_fault(&self, response: reqwest::Response, what: &str) -> PullFault {
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        let mut body: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
        if body.len() > 300 {
            let cut = (0..=300).rev().find(|i| body.is_char_boundary(*i)).unwrap_or(0);
            body.truncate(cut);
            body.push('…');
        }
        PullFault::Status { registry: self.host.clone(), what: what.into(), status, body }
    }

    /// An anonymous token from the endpoint a `Bearer realm=…,service=…,scope=…` challenge names.
    async fn token_for(&self, challenge: &str) -> Result<String, PullFault> {
        let params = challenge_params(challenge.trim_start_matches("Bearer "));
        let get = |key: &str| params.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let Some(realm) = get("realm") else {
            return Err(PullFault::Invalid(format!("registry {} sent a challenge without a realm", self.host)));
        };
        let scope = get("scope").unwrap_or_else(|| format!("repository:{}:pull", self.repository));
        let mut query = vec![("scope", scope)];
        if let Some(service) = get("service") {
            query.push(("service", service));
        }
        let response = self.client.get(&realm).query(&query).send().await.map_err(|e| self.unreachable(e))?;
        if !response.status().is_success() {
            return Err(self.status_fault(response, &format!("a token ({realm})")).await);
        }
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token =
            response.json().await.map_err(|e| PullFault::Invalid(format!("unreadable token from {realm}: {e}")))?;
        token.token.or(token.access_token).ok_or_else(|| PullFault::Invalid(format!("no token in {realm}'s answer")))
    }

    /// The manifest (or index) `target` names (a tag or a digest), its bytes and
    /// `Content-Type`.
    pub async fn manifest(&mut self, target: &str) -> Result<(Vec<u8>, Option<String>), PullFault> {
        let what = format!("manifest {}:{target}", self.repository);
        let mut response = self.get(&format!("manifests/{target}"), super::manifest::ACCEPT, &what).await?;
        let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).map(String::from);
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.unreachable(e))? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() as u64 > MAX_DOCUMENT {
                return Err(PullFault::Invalid(format!("{what} is larger than {MAX_DOCUMENT} bytes")));
            }
        }
        Ok((bytes, content_type))
    }

    /// The blob `blob` describes, written to `to` as it streams in; its size and digest are
    /// checked against the descriptor's, and nothing past its size is read.
    pub async fn blob(&mut self, blob: &Descriptor, what: &str, to: &mut impl Write) -> Result<(), PullFault> {
        let mut response = self.get(&format!("blobs/{}", blob.digest), "*/*", what).await?;
        let mut hasher = Sha256::new();
        let mut read = 0u64;
        while let Some(chunk) = response.chunk().await.map_err(|e| self.unreachable(e))? {
            read += chunk.len() as u64;
            if read > blob.size {
                return Err(PullFault::Invalid(format!(
                    "{what} is larger than the {} bytes its manifest says",
                    blob.size
                )));
            }
            hasher.update(&chunk);
            to.write_all(&chunk).map_err(|e| PullFault::Store(format!("cannot write {what}: {e}")))?;
        }
        if read != blob.size {
            return Err(PullFault::Invalid(format!(
                "{what} has {read} bytes, not the {} its manifest says",
                blob.size
            )));
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != blob.digest {
            return Err(PullFault::DigestMismatch { what: what.into(), expected: blob.digest.clone(), actual });
        }
        Ok(())
    }

    /// A small blob (an image configuration), checked as [`Registry::blob`] checks.
    pub async fn small_blob(&mut self, blob: &Descriptor, what: &str) -> Result<Vec<u8>, PullFault> {
        if blob.size > MAX_DOCUMENT {
            return Err(PullFault::Invalid(format!("{what} is larger than {MAX_DOCUMENT} bytes")));
        }
        let mut bytes = Vec::new();
        self.blob(blob, what, &mut bytes).await?;
        Ok(bytes)
    }
}

/// The `key="value"` pairs of a challenge (values may hold commas inside their quotes).
fn challenge_params(text: &str) -> Vec<(String, String)> {
    let mut params = Vec::new();
    let mut rest = text.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_owned();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => match quoted.split_once('"') {
                Some((value, next)) => (value.to_owned(), next),
                None => (quoted.to_owned(), ""),
            },
            None => match after.split_once(',') {
                Some((value, next)) => (value.trim().to_owned(), next),
                None => (after.trim().to_owned(), ""),
            },
        };
        params.push((key, value));
        rest = next.trim_start_matches(',').trim();
    }
    params
}

/// The sha256 digest of `bytes`, as manifests write digests.
pub fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_challenge_is_read_with_commas_inside_quotes() {
        let params = super::challenge_params(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        let expected = [
            ("realm", "https://auth.example/token"),
            ("service", "registry.example"),
            ("scope", "repository:a/b:pull,push"),
        ];
        assert_eq!(params, expected.map(|(k, v)| (k.to_owned(), v.to_owned())));
    }
}
