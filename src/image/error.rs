//! Why a pull failed: one error naming the image, and a closed list of faults a caller can
//! tell apart (an episode turns any of them into an unscored `environment_error`).

/// A failed pull of `image` (the reference as given).
#[derive(Debug, thiserror::Error)]
#[error("failed to pull {image}: {fault}")]
pub struct PullError {
    pub image: String,
    pub fault: PullFault,
}

#[derive(Debug, thiserror::Error)]
pub enum PullFault {
    #[error("bad reference: {0}")]
    Reference(String),
    #[error("it is not in the image store, and the pull policy is `never`")]
    NotStored,
    #[error("registry {registry} is unreachable: {why}")]
    Unreachable { registry: String, why: String },
    /// The registry answered with an error status: 401 (needs credentials), 404 (no such
    /// repository, tag or blob), 429 (too many requests), 5xx.
    #[error("registry {registry} answered {status} for {what}{}", shown_body(body))]
    Status { registry: String, what: String, status: u16, body: String },
    #[error("{what} has digest {actual}, not the {expected} asked for")]
    DigestMismatch { what: String, expected: String, actual: String },
    #[error("its index has no linux/amd64 image (it has: {found})")]
    NoPlatform { found: String },
    #[error("unsupported {what} media type `{media_type}`")]
    Unsupported { what: String, media_type: String },
    /// A manifest, index or configuration runner cannot read, or a blob of the wrong size.
    #[error("{0}")]
    Invalid(String),
    /// A layer that cannot be unpacked: corrupt, or an entry that is refused.
    #[error("layer {digest}: {why}")]
    Layer { digest: String, why: String },
    #[error("image store: {0}")]
    Store(String),
}

fn shown_body(body: &str) -> String {
    if body.is_empty() { String::new() } else { format!(": {body}") }
}

impl PullFault {
    pub fn of(self, image: &str) -> PullError {
        PullError { image: image.to_owned(), fault: self }
    }
}
