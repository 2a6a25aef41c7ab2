//! Image references as people write them (`debian:bookworm`, `ghcr.io/o/r@sha256:…`,
//! `127.0.0.1:5000/name:tag`), read the way Docker reads them: a first part with a `.` or a
//! `:` (or `localhost`) names the registry, else it is Docker Hub's (`docker.io`), where a
//! one-part name is in `library/`; no tag and no digest is `latest`.

use std::fmt;

/// Docker Hub, as references name it.
pub const DOCKER_HUB: &str = "docker.io";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The registry's host (and port): `docker.io`, `127.0.0.1:5000`.
    pub registry: String,
    /// The repository in it: `library/debian`.
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<64 hex>`.
    pub digest: Option<String>,
}

impl Reference {
    pub fn parse(text: &str) -> Result<Reference, String> {
        let text = text.trim();
        let (name, digest) = match text.split_once('@') {
            Some((name, digest)) => (name, Some(check_digest(digest)?)),
            None => (text, None),
        };
        let (registry, rest) = match name.split_once('/') {
            Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => (first.to_owned(), rest),
            _ => (DOCKER_HUB.to_owned(), name),
        };
        let (repository, tag) = match rest.rsplit_once(':') {
            Some((repository, tag)) if !tag.contains('/') => (repository, Some(tag.to_owned())),
            _ => (rest, None),
        };
        if repository.is_empty() {
            return Err("names no repository".into());
        }
        let repository_ok = repository.split('/').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && part.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        });
        if !repository_ok {
            return Err(format!("`{repository}` is not a repository name (lowercase letters, digits, `._-`, `/`)"));
        }
        if let Some(tag) = &tag {
            let tag_ok = tag.len() <= 128
                && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                && !tag.starts_with(['.', '-']);
            if !tag_ok {
                return Err(format!("`{tag}` is not a tag"));
            }
        }
        let repository = match (registry.as_str(), repository.contains('/')) {
            (DOCKER_HUB, false) => format!("library/{repository}"),
            _ => repository.to_owned(),
        };
        let tag = if tag.is_none() && digest.is_none() { Some("latest".to_owned()) } else { tag };
        Ok(Reference { registry, repository, tag, digest })
    }

    /// What the registry is asked for: the digest when there is one, else the tag.
    pub fn target(&self) -> &str {
        self.digest.as_deref().or(self.tag.as_deref()).unwrap_or("latest")
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// A `sha256:` digest, checked; the only algorithm runner verifies.
pub fn check_digest(digest: &str) -> Result<String, String> {
    match digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => {
            Ok(digest.to_owned())
        }
        _ => Err(format!("`{digest}` is not a sha256 digest (`sha256:` and 64 lowercase hex digits)")),
    }
}

#[cfg(test)]
mod tests {
    use super::Reference;

    fn parsed(text: &str) -> String {
        Reference::parse(text).map(|r| r.to_string()).unwrap_or_else(|e| format!("error: {e}"))
    }

    #[test]
    fn references_are_read_as_docker_reads_them() {
        let digest = format!("sha256:{}", "a".repeat(64));
        for (text, expected) in [
            ("debian:bookworm", "docker.io/library/debian:bookworm".to_owned()),
            ("debian", "docker.io/library/debian:latest".to_owned()),
            ("user/app:1.0", "docker.io/user/app:1.0".to_owned()),
            ("127.0.0.1:5000/a/b:t", "127.0.0.1:5000/a/b:t".to_owned()),
            ("localhost/x", "localhost/x:latest".to_owned()),
            ("ghcr.io/o/r", "ghcr.io/o/r:latest".to_owned()),
            (&format!("ghcr.io/o/r@{digest}"), format!("ghcr.io/o/r@{digest}")),
            (&format!("r:t@{digest}"), format!("docker.io/library/r:t@{digest}")),
        ] {
            assert_eq!(parsed(text), expected, "{text}");
        }
    }

    #[test]
    fn bad_references_say_what_is_wrong() {
        assert!(parsed("Debian:x").contains("not a repository name"));
        assert!(parsed("r@sha256:abc").contains("not a sha256 digest"));
        assert!(parsed("r:bad tag").contains("not a tag"));
        assert!(parsed("").contains("names no repository"));
    }
}
