//! Images: the worlds tasks were written for. An image is a stack of layers (overlayfs-format
//! folders, the bottom one first) and a configuration (its variables, working folder, user).
//! The shell kind starts an episode's root from a [`ReadyImage`]
//! (`environment/kinds/shell/place.rs`); this module names what images are, and no
//! environment kind.
//!
//! Images come from registries: [`pull`] resolves a reference to its linux/amd64 manifest,
//! downloads the blobs (each digest checked), unpacks each layer once per digest into the
//! [`ImageStore`] and records the image there; `runner images` lists, removes and prunes
//! what the store holds.

pub mod build;

use std::path::PathBuf;

mod at;
mod error;
pub mod manifest;
mod pull;
pub mod reference;
mod registry;
mod store;
mod tree;
pub mod unpack;
pub mod user;

pub use error::{PullError, PullFault};
pub use pull::{PullPolicy, pull};
pub use store::{ImageRecord, ImageStore, LayerStore, Removed};
pub use tree::disk_usage;

/// The host ids an image's ids are: image id `i` is host id `ID_BASE + i`, below `ID_RANGE`.
/// Layers are unpacked (and built) with their owners so, and an image root's processes run
/// in a user namespace that maps the range back.
pub const ID_BASE: u32 = 1_000_000_000;
pub const ID_RANGE: u32 = 65536;

/// The user namespace every image root's processes enter (an episode's, a build step's),
/// made once: image ids `0..ID_RANGE` are host ids from `ID_BASE`.
pub fn id_map() -> Result<std::sync::Arc<crate::sandbox::root::IdMap>, String> {
    use std::sync::{Arc, OnceLock};
    static MAP: OnceLock<Result<Arc<crate::sandbox::root::IdMap>, String>> = OnceLock::new();
    MAP.get_or_init(|| {
        crate::sandbox::root::IdMap::new(ID_BASE, ID_RANGE)
            .map(Arc::new)
            .map_err(|e| format!("failed to make the images' user namespace: {e}"))
    })
    .clone()
}

/// What an image's configuration says of the processes that run in it (the OCI image
/// configuration's `config` object, in the parts runner uses).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ImageConfig {
    /// `KEY=value` entries.
    #[serde(default)]
    pub env: Vec<String>,
    /// The working folder, absolute; empty when the image sets none (`/` then).
    #[serde(default)]
    pub workdir: String,
    /// `USER`: a name or id, and an optional `:group`; empty for root.
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
    /// `SHELL`, for the shell form of `RUN`, `CMD` and `ENTRYPOINT`; empty for `/bin/sh -c`.
    #[serde(default)]
    pub shell: Vec<String>,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub exposed_ports: Vec<String>,
}

/// An image ready for episodes: its layers, unpacked, and its configuration.
#[derive(Debug, Clone)]
pub struct ReadyImage {
    /// What names it (a reference, a Dockerfile's folder), for messages.
    pub name: String,
    /// Overlayfs-format folders, the bottom one first.
    pub layers: Vec<PathBuf>,
    pub config: ImageConfig,
}

impl ReadyImage {
    /// The working folder its processes start in.
    pub fn workdir(&self) -> PathBuf {
        match self.config.workdir.as_str() {
            "" => PathBuf::from("/"),
            dir => PathBuf::from(dir),
        }
    }

    /// Its user, `None` for root.
    pub fn user(&self) -> Option<&str> {
        Some(self.config.user.as_str()).filter(|u| !u.trim().is_empty())
    }
}

/// Where an episode's image comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageSource {
    /// A reference pulled from a registry, or found in the store (`debian:bookworm`,
    /// `host:port/name@sha256:…`).
    Pull(String),
    /// A Dockerfile built by runner.
    Build(BuildSpec),
}

/// A Dockerfile to build: its context folder, the file, `ARG` values given, and how long the
/// whole build may take.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildSpec {
    pub context: PathBuf,
    pub dockerfile: PathBuf,
    pub args: std::collections::BTreeMap<String, String>,
    pub timeout_s: Option<f64>,
}

impl ImageSource {
    /// How messages name it: the reference, or the Dockerfile's path.
    pub fn name(&self) -> String {
        match self {
            ImageSource::Pull(reference) => reference.clone(),
            ImageSource::Build(spec) => spec.dockerfile.display().to_string(),
        }
    }
}

/// What preparing an image needs: the store, where registries are, when to ask them.
#[derive(Debug, Clone, Default)]
pub struct Images {
    /// The store's folder; the default one (`ImageStore::default_root`) when `None`.
    pub store: Option<PathBuf>,
    pub registries: crate::config::images::RegistrySettings,
    pub policy: PullPolicy,
    /// Who runs the episodes of an image (`--provider`).
    pub provider: ProviderName,
}

/// Where an episode's world in an image lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProviderName {
    /// runner's own root per episode: the image's layers under a private writable one.
    #[default]
    Rootfs,
    /// A podman container per episode, the image built or pulled by podman.
    Podman,
}

impl Images {
    fn store(&self) -> Result<ImageStore, String> {
        let root = match &self.store {
            Some(root) => root.clone(),
            None => ImageStore::default_root()?,
        };
        ImageStore::open(&root)
    }
}

/// The image `source` names, ready for episodes: pulled (or found in the store), or built.
/// A build says each step on stderr as it goes.
pub async fn prepare(source: &ImageSource, images: &Images) -> Result<ReadyImage, String> {
    let store = images.store()?;
    match source {
        ImageSource::Pull(reference) => {
            pull(reference, &store, &images.registries, images.policy).await.map_err(|e| e.to_string())
        }
        ImageSource::Build(spec) => {
            let layers =
                StoreLayers { steps: build::DirLayers::new(&store.root().join("build")), store: &store, images };
            let options = build::BuildOptions {
                build_args: spec.args.clone(),
                build_timeout: spec
                    .timeout_s
                    .map_or(build::BuildOptions::default().build_timeout, std::time::Duration::from_secs_f64),
                ..build::BuildOptions::default()
            };
            let source = build::BuildSource { context: spec.context.clone(), dockerfile: spec.dockerfile.clone() };
            let mut progress = |p: &build::BuildProgress| eprintln!("image: {p}");
            build::build(&source, &options, &layers, &mut progress).await.map_err(|e| e.to_string())
        }
    }
}

/// The store as a build's [`build::Layers`]: base images pulled into it, each step's layer
/// kept under `build/` in it.
struct StoreLayers<'a> {
    steps: build::DirLayers,
    store: &'a ImageStore,
    images: &'a Images,
}

impl build::Layers for StoreLayers<'_> {
    fn base(&self, reference: &str) -> Result<ReadyImage, String> {
        // A build runs on a runtime of several threads (the run's, or `prepare_images`'s):
        // this one waits for the pull while the others go on.
        let handle = tokio::runtime::Handle::try_current().map_err(|e| format!("no runtime to pull on: {e}"))?;
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return Err("pulling a base image needs a runtime of several threads".into());
        }
        tokio::task::block_in_place(|| {
            handle.block_on(pull(reference, self.store, &self.images.registries, self.images.policy))
        })
        .map_err(|e| e.to_string())
    }

    fn cached(&self, key: &str) -> Option<build::CachedStep> {
        let found = self.steps.cached(key)?;
        // Used now: `runner images prune --older-than` keeps it.
        let config = found.layer.parent().map(|step| step.join("config.json"));
        if let Some(file) = config.and_then(|c| std::fs::File::options().append(true).open(c).ok()) {
            let _ = file.set_modified(std::time::SystemTime::now());
        }
        Some(found)
    }

    fn keep(&self, key: &str, dir: PathBuf, config: &ImageConfig) -> Result<PathBuf, String> {
        self.steps.keep(key, dir, config)
    }

    fn scratch(&self) -> Result<PathBuf, String> {
        self.steps.scratch()
    }
}
