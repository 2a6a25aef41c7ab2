//! Where a build finds base images and keeps the layers of its steps: the [`Layers`]
//! trait, and [`DirLayers`], its plain-folder implementation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::image::{ImageConfig, ReadyImage};

/// A step found in the cache: its layer (an overlayfs-format folder, maybe empty) and the
/// image's configuration after it.
#[derive(Debug, Clone)]
pub struct CachedStep {
    pub layer: PathBuf,
    pub config: ImageConfig,
}

/// What a build needs from an image store. To wire a store in: `base` pulls or finds an
/// image by reference; `cached`, `keep` and `scratch` are a map from a step's key (64 hex
/// characters) to a kept folder, a config beside it, and a place for work in progress on
/// the same filesystem as the kept folders (so that keeping is a rename).
pub trait Layers {
    /// The image a `FROM` (or a `COPY --from`) names; `scratch` never reaches here.
    fn base(&self, reference: &str) -> Result<ReadyImage, String>;
    /// The layer kept under `key`, if any.
    fn cached(&self, key: &str) -> Option<CachedStep>;
    /// Keeps `dir` (an overlayfs-format folder the build made) as the layer of `key`,
    /// atomically (a rename), with the configuration after the step; where it now is. When
    /// another build kept `key` first, that one is kept and `dir` removed.
    fn keep(&self, key: &str, dir: PathBuf, config: &ImageConfig) -> Result<PathBuf, String>;
    /// A fresh empty folder on the same filesystem as the kept layers, for a step's work;
    /// the build removes it when done.
    fn scratch(&self) -> Result<PathBuf, String>;
}

/// Layers kept in a plain folder: `steps/<key>/layer` with `steps/<key>/config.json`,
/// work in `scratch/`; base images given by name.
#[derive(Debug, Clone)]
pub struct DirLayers {
    pub root: PathBuf,
    pub bases: HashMap<String, ReadyImage>,
}

impl DirLayers {
    pub fn new(root: &Path) -> DirLayers {
        DirLayers { root: root.to_path_buf(), bases: HashMap::new() }
    }

    fn step(&self, key: &str) -> PathBuf {
        self.root.join("steps").join(key)
    }
}

impl Layers for DirLayers {
    fn base(&self, reference: &str) -> Result<ReadyImage, String> {
        self.bases.get(reference).cloned().ok_or_else(|| format!("no image `{reference}` is known here"))
    }

    fn cached(&self, key: &str) -> Option<CachedStep> {
        let dir = self.step(key);
        let config = std::fs::read(dir.join("config.json")).ok()?;
        let config = serde_json::from_slice(&config).ok()?;
        Some(CachedStep { layer: dir.join("layer"), config })
    }

    fn keep(&self, key: &str, dir: PathBuf, config: &ImageConfig) -> Result<PathBuf, String> {
        let failed = |e: std::io::Error| format!("failed to keep the layer of step {key}: {e}");
        let steps = self.root.join("steps");
        std::fs::create_dir_all(&steps).map_err(failed)?;
        let staging = self.scratch()?;
        std::fs::rename(&dir, staging.join("layer")).map_err(failed)?;
        let config = serde_json::to_vec(config).map_err(|e| format!("failed to keep step {key}'s config: {e}"))?;
        std::fs::write(staging.join("config.json"), config).map_err(failed)?;
        let kept = self.step(key);
        if let Err(e) = std::fs::rename(&staging, &kept) {
            // Kept by another build meanwhile: theirs stays.
            let _ = std::fs::remove_dir_all(&staging);
            if !kept.join("config.json").exists() {
                return Err(failed(e));
            }
        }
        Ok(kept.join("layer"))
    }

    fn scratch(&self) -> Result<PathBuf, String> {
        let scratch = self.root.join("scratch");
        std::fs::create_dir_all(&scratch).map_err(|e| format!("failed to make {}: {e}", scratch.display()))?;
        tempfile::Builder::new()
            .prefix("step-")
            .tempdir_in(&scratch)
            .map(|d| d.keep())
            .map_err(|e| format!("failed to make a folder in {}: {e}", scratch.display()))
    }
}
