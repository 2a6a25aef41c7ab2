//! A shell world's image: `image: REF` (pulled from a registry, or found in the store) or
//! `build: DIR` (a Dockerfile runner builds) in an environment file, or a Harbor task's
//! own. The image is prepared once for every episode that runs in it, the first time one
//! asks (the run asks before its first episode, so the work and its failure are said once);
//! a failure makes every such episode unscored (`environment_error`) with what failed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::OnceCell;

use super::provider::Prepared;
use crate::config::decode::ConfigError;
use crate::environment::kinds::KindKeys;
use crate::image::{BuildSpec, ImageSource, Images};

/// An image and, once prepared, what preparing it gave.
pub struct ShellImage {
    pub source: ImageSource,
    ready: OnceCell<Result<Arc<dyn Prepared>, String>>,
}

impl std::fmt::Debug for ShellImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShellImage").field("source", &self.source).field("ready", &self.ready.get()).finish()
    }
}

impl ShellImage {
    pub fn new(source: ImageSource) -> Self {
        ShellImage { source, ready: OnceCell::new() }
    }

    /// The image ready for episodes, by the provider `images` chooses: pulled or built by
    /// the first caller, while the others wait for it; the same failure for all when that
    /// failed (a pull's names the image, a build's the Dockerfile and its line).
    pub async fn ready(&self, images: &Images) -> Result<Arc<dyn Prepared>, String> {
        let provider = super::provider::chosen(images);
        let prepared = self
            .ready
            .get_or_init(|| async { provider.prepare(&self.source, images).await.map_err(|e| e.to_string()) });
        prepared.await.clone()
    }
}

/// `build:` as an environment file gives it: a folder (its `Dockerfile` inside), or a
/// mapping.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum BuildKey {
    Folder(PathBuf),
    Spec(BuildFile),
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BuildFile {
    context: PathBuf,
    #[serde(default)]
    dockerfile: Option<PathBuf>,
    #[serde(default)]
    args: BTreeMap<String, String>,
    #[serde(default)]
    timeout_s: Option<f64>,
}

/// The image an environment file names, if any: `image: REF`, `image: host` (none: the
/// host stands in), or `build:`; relative folders are the file's.
pub fn decode(keys: &KindKeys<'_>) -> Result<Option<ImageSource>, ConfigError> {
    let image: Option<String> = keys.decode("image")?;
    let build: Option<BuildKey> = keys.decode("build")?;
    match (image, build) {
        (Some(_), Some(_)) => Err(keys.error("build", "give `image:` or `build:`, not both")),
        (Some(reference), None) if reference.trim() == "host" => Ok(None),
        (Some(reference), None) if reference.trim().is_empty() || reference.contains(char::is_whitespace) => {
            Err(keys.error("image", format!("`{reference}` is not an image reference (`name:tag` or `name@sha256:…`)")))
        }
        (Some(reference), None) => Ok(Some(ImageSource::Pull(reference))),
        (None, Some(build)) => {
            let file = match build {
                BuildKey::Folder(context) => {
                    BuildFile { context, dockerfile: None, args: BTreeMap::new(), timeout_s: None }
                }
                BuildKey::Spec(file) => file,
            };
            if let Some(t) = file.timeout_s
                && !(t.is_finite() && t > 0.0)
            {
                return Err(keys.error("build", format!("`timeout_s` must be a positive number of seconds, got {t}")));
            }
            // `environments/../env` said as `env`, when it is there.
            let context = keys.folder().join(&file.context);
            let context = context.canonicalize().unwrap_or(context);
            let dockerfile = context.join(file.dockerfile.unwrap_or_else(|| PathBuf::from("Dockerfile")));
            if !dockerfile.is_file() {
                return Err(keys.error("build", format!("no Dockerfile at {}", dockerfile.display())));
            }
            Ok(Some(ImageSource::Build(BuildSpec { context, dockerfile, args: file.args, timeout_s: file.timeout_s })))
        }
        (None, None) => Ok(None),
    }
}
