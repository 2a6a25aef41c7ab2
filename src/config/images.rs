//! The `images:` settings of runner.yaml: where images are pulled from. Decoded in
//! `model/config.rs` with the rest of the file; the image puller reads them.

use std::collections::BTreeMap;

use serde::Deserialize;

/// ```yaml
/// images:
///   mirrors: {docker.io: "127.0.0.1:5000"}   # where to pull a registry's images from
///   insecure: ["127.0.0.1:5000"]              # plain HTTP allowed for these
/// ```
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    /// A registry's host (as references name it: `docker.io`, `ghcr.io`) → the host to
    /// pull its images from instead.
    #[serde(default)]
    pub mirrors: BTreeMap<String, String>,
    /// Hosts spoken to over plain HTTP; every other one over HTTPS.
    #[serde(default)]
    pub insecure: Vec<String>,
}
