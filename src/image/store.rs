//! The image store: layers unpacked once per digest, and a record per image. On disk, under
//! its root (`$RUNNER_IMAGE_STORE`, else `$XDG_CACHE_HOME/runner/images`, else
//! `~/.cache/runner/images`):
//!
//! ```text
//! layers/sha256-<hex>/tree/        a layer, overlayfs-format (ReadyImage's contract)
//! layers/sha256-<hex>/info.json    its size on disk, and what its unpack skipped
//! images/sha256-<hex>.json         an image by its manifest's digest: the references that
//!                                  name it, its configuration, its layers, its last use
//! tmp/                             layers being unpacked, blobs being downloaded
//! lock, records.lock               the locks below
//! ```
//!
//! A layer appears whole or not at all: it is written into `tmp/`, then renamed into place;
//! when two processes unpack the same one, the first rename wins and the other removes its
//! copy. Pulls hold `lock` shared for as long as they work; `rm` and `prune` hold it
//! exclusively, so nothing a pull is writing (or about to record) is removed under it.
//! Changes to records are made under `records.lock`, each record written whole by a rename.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{ImageConfig, at, tree};

/// What the store keeps of an image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The references that name it (canonical: `docker.io/library/debian:bookworm`), or the
    /// name a builder gave it. A reference names one image: a tag pulled again moves.
    pub references: Vec<String>,
    /// The digest of its manifest.
    pub digest: String,
    pub config: ImageConfig,
    /// Its layers' keys (`sha256:<hex>` of the compressed blobs), the bottom one first.
    pub layers: Vec<String>,
    /// What its layers hold that was not unpacked (device files, attributes), and why.
    #[serde(default)]
    pub skipped: Vec<String>,
    /// When it was last pulled or served, in seconds since the epoch.
    pub last_used: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LayerInfo {
    /// Bytes on disk (allocated blocks), as `du` counts them.
    bytes: u64,
    #[serde(default)]
    skipped: Vec<String>,
}

/// What `rm` or `prune` removed.
#[derive(Debug, Default)]
pub struct Removed {
    /// Images removed, and references taken off images that stay.
    pub images: Vec<String>,
    pub layers: usize,
    pub bytes: u64,
}

/// An image store, at its root.
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
}

/// A lock held on the store until it is dropped.
pub struct StoreLock(#[allow(dead_code)] std::fs::File);

/// What a builder needs of the store: layers by key, made once, and records of images.
pub trait LayerStore {
    /// The overlayfs-format folder of the layer `key` (`sha256:<hex>`), if the store holds it.
    fn layer(&self, key: &str) -> Option<PathBuf>;
    /// Makes the layer `key` unless it is there: `fill` writes it into an empty folder and
    /// returns what it skipped; on `Err` nothing is kept. Returns the layer's folder.
    fn add_layer(
        &self,
        key: &str,
        fill: &mut dyn FnMut(&Path) -> Result<Vec<String>, String>,
    ) -> Result<PathBuf, String>;
    /// Records that `reference` names the image `record` describes (kept under
    /// `record.digest`, a `sha256:<hex>`: a builder hashes what it built from). The
    /// reference is taken off any other image; `record.layers` must be in the store.
    fn save(&self, reference: &str, record: ImageRecord) -> Result<(), String>;
}

pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A key or digest as a name in the store's folders: `sha256:ab…` → `sha256-ab…`.
fn file_name(key: &str) -> Result<String, String> {
    let ok = !key.is_empty()
        && key.len() <= 200
        && key.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':')
        && key.bytes().filter(|b| *b == b':').count() == 1;
    if ok { Ok(key.replace(':', "-")) } else { Err(format!("`{key}` is not a layer key (`sha256:<hex>`)")) }
}

fn io_error(what: impl std::fmt::Display, e: std::io::Error) -> String {
    format!("{what}: {e}")
}

impl ImageStore {
    /// Where the store is unless told: `$RUNNER_IMAGE_STORE`, else
    /// `$XDG_CACHE_HOME/runner/images`, else `~/.cache/runner/images`.
    pub fn default_root() -> Result<PathBuf, String> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        if let Some(root) = var("RUNNER_IMAGE_STORE") {
            return Ok(root);
        }
        if let Some(cache) = var("XDG_CACHE_HOME") {
            return Ok(cache.join("runner/images"));
        }
        match var("HOME") {
            Some(home) => Ok(home.join(".cache/runner/images")),
            None => Err("no image store: set RUNNER_IMAGE_STORE, XDG_CACHE_HOME or HOME".into()),
        }
    }

    /// The store at `root`, made if it is not there.
    pub fn open(root: &Path) -> Result<ImageStore, String> {
        for sub in ["layers", "images", "tmp"] {
            let dir = root.join(sub);
            std::fs::create_dir_all(&dir).map_err(|e| io_error(format!("cannot make {}", dir.display()), e))?;
        }
        Ok(ImageStore { root: root.to_owned() })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn lock(&self, file: &str, how: libc::c_int) -> Result<StoreLock, String> {
        let path = self.root.join(file);
        let opened = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path);
        let file = opened.map_err(|e| io_error(format!("cannot open {}", path.display()), e))?;
        at::lock(&file, how).map_err(|e| io_error(format!("cannot lock {}", path.display()), e))?;
        Ok(StoreLock(file))
    }

    /// Held by a pull while it works: `rm` and `prune` wait for it.
    pub fn working(&self) -> Result<StoreLock, String> {
        self.lock("lock", libc::LOCK_SH)
    }

    fn exclusive(&self) -> Result<StoreLock, String> {
        self.lock("lock", libc::LOCK_EX)
    }

    /// A new file in the store's `tmp/`, removed when dropped.
    pub fn temp_file(&self) -> Result<tempfile::NamedTempFile, String> {
        tempfile::NamedTempFile::new_in(self.root.join("tmp")).map_err(|e| io_error("cannot make a temporary file", e))
    }

    fn layer_dir(&self, key: &str) -> Result<PathBuf, String> {
        Ok(self.root.join("layers").join(file_name(key)?))
    }

    fn layer_info(&self, key: &str) -> LayerInfo {
        let Ok(dir) = self.layer_dir(key) else { return LayerInfo::default() };
        std::fs::read(dir.join("info.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// The bytes on disk of the image `record` describes (its layers, each counted whole).
    pub fn bytes_of(&self, record: &ImageRecord) -> u64 {
        record.layers.iter().map(|key| self.layer_info(key).bytes).sum()
    }

    /// What the unpack of `key` skipped.
    pub fn skipped_in(&self, key: &str) -> Vec<String> {
        self.layer_info(key).skipped
    }
}

impl LayerStore for ImageStore {
    fn layer(&self, key: &str) -> Option<PathBuf> {
        let tree = self.layer_dir(key).ok()?.join("tree");
        tree.is_dir().then_some(tree)
    }

    fn add_layer(
        &self,
        key: &str,
        fill: &mut dyn FnMut(&Path) -> Result<Vec<String>, String>,
    ) -> Result<PathBuf, String> {
        let dir = self.layer_dir(key)?;
        if let Some(tree) = self.layer(key) {
            return Ok(tree);
        }
        let staged = tempfile::Builder::new()
            .prefix(&format!("{}.", file_name(key)?))
            .tempdir_in(self.root.join("tmp"))
            .map_err(|e| io_error("cannot make a temporary folder", e))?
            .keep();
        let made = stage_layer(&staged, fill);
        let outcome = made.and_then(|()| match std::fs::rename(&staged, &dir) {
            Ok(()) => Ok(()),
            // Another process put the same layer in place first: theirs is kept.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {
                tree::remove(&staged).map_err(|e| io_error(format!("cannot remove {}", staged.display()), e))
            }
            Err(e) => Err(io_error(format!("cannot move the layer into {}", dir.display()), e)),
        });
        if outcome.is_err() {
            let _ = tree::remove(&staged);
        }
        outcome.map(|()| dir.join("tree"))
    }

    fn save(&self, reference: &str, mut record: ImageRecord) -> Result<(), String> {
        let _records = self.lock("records.lock", libc::LOCK_EX)?;
        for mut other in self.images()? {
            if other.digest != record.digest && other.references.iter().any(|r| r == reference) {
                other.references.retain(|r| r != reference);
                self.write_record(&other)?;
            }
        }
        if let Some(old) = self.images()?.into_iter().find(|r| r.digest == record.digest) {
            for name in old.references {
                if !record.references.contains(&name) {
                    record.references.push(name);
                }
            }
        }
        if !record.references.iter().any(|r| r == reference) {
            record.references.push(reference.to_owned());
        }
        self.write_record(&record)
    }
}

/// Writes a layer into the staged folder `staged`: `tree/` by `fill`, then `info.json`.
fn stage_layer(staged: &Path, fill: &mut dyn FnMut(&Path) -> Result<Vec<String>, String>) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let tree_dir = staged.join("tree");
    let made = std::fs::create_dir(&tree_dir)
        .and_then(|()| std::fs::set_permissions(staged, std::fs::Permissions::from_mode(0o755)))
        .and_then(|()| std::os::unix::fs::chown(&tree_dir, Some(super::ID_BASE), Some(super::ID_BASE)));
    made.map_err(|e| io_error(format!("cannot make {}", tree_dir.display()), e))?;
    let skipped = fill(&tree_dir)?;
    let bytes = tree::disk_usage(&tree_dir).map_err(|e| io_error("cannot measure the layer", e))?;
    let info = serde_json::to_vec_pretty(&LayerInfo { bytes, skipped }).map_err(|e| e.to_string())?;
    std::fs::write(staged.join("info.json"), info).map_err(|e| io_error("cannot write the layer's info", e))
}

impl ImageStore {
    fn record_path(&self, digest: &str) -> Result<PathBuf, String> {
        Ok(self.root.join("images").join(format!("{}.json", file_name(digest)?)))
    }

    fn write_record(&self, record: &ImageRecord) -> Result<(), String> {
        let path = self.record_path(&record.digest)?;
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| e.to_string())?;
        let mut staged = self.temp_file()?;
        std::io::Write::write_all(&mut staged, &bytes).map_err(|e| io_error("cannot write a record", e))?;
        staged.persist(&path).map_err(|e| io_error(format!("cannot write {}", path.display()), e.error))?;
        Ok(())
    }

    /// Every image the store holds, oldest use first.
    pub fn images(&self) -> Result<Vec<ImageRecord>, String> {
        let dir = self.root.join("images");
        let listed = std::fs::read_dir(&dir).map_err(|e| io_error(format!("cannot list {}", dir.display()), e))?;
        let mut records = Vec::new();
        for entry in listed.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let bytes = std::fs::read(&path).map_err(|e| io_error(format!("cannot read {}", path.display()), e))?;
            let record: ImageRecord =
                serde_json::from_slice(&bytes).map_err(|e| format!("{}: not an image record: {e}", path.display()))?;
            records.push(record);
        }
        records.sort_by(|a, b| (a.last_used, &a.digest).cmp(&(b.last_used, &b.digest)));
        Ok(records)
    }

    /// The image `reference` (canonical) names, if the store holds it and all its layers.
    pub fn find(&self, reference: &str) -> Result<Option<ImageRecord>, String> {
        let found = self.images()?.into_iter().find(|r| r.references.iter().any(|n| n == reference));
        Ok(found.filter(|r| r.layers.iter().all(|key| self.layer(key).is_some())))
    }

    /// Marks the image `digest` used now.
    pub fn touch(&self, digest: &str) -> Result<(), String> {
        let _records = self.lock("records.lock", libc::LOCK_EX)?;
        let Some(mut record) = self.images()?.into_iter().find(|r| r.digest == digest) else { return Ok(()) };
        record.last_used = now();
        self.write_record(&record)
    }
}

impl ImageStore {
    /// Removes what `target` names: a reference (taken off its image; the image goes with
    /// its last one) or a digest (`sha256:<hex>`, or 12 or more of its hex digits), then the
    /// layers no image needs.
    pub fn remove(&self, target: &str) -> Result<Removed, String> {
        let _lock = self.exclusive()?;
        let _records = self.lock("records.lock", libc::LOCK_EX)?;
        let hex = target.strip_prefix("sha256:").unwrap_or(target);
        let by_digest = hex.len() >= 12 && hex.bytes().all(|b| b.is_ascii_hexdigit());
        let mut removed = Removed::default();
        for mut record in self.images()? {
            let digest_hex = record.digest.strip_prefix("sha256:").unwrap_or(&record.digest);
            if by_digest && digest_hex.starts_with(hex) {
                removed.images.push(describe(&record));
                self.remove_record(&record)?;
            } else if record.references.iter().any(|r| r == target) {
                record.references.retain(|r| r != target);
                removed.images.push(target.to_owned());
                match record.references.is_empty() {
                    true => self.remove_record(&record)?,
                    false => self.write_record(&record)?,
                }
            }
        }
        if removed.images.is_empty() {
            return Err(format!("the image store holds no image `{target}` (`runner images ls` lists them)"));
        }
        self.remove_unused_layers(&mut removed)?;
        Ok(removed)
    }

    /// Removes the images not used for `older_than` (none when `None`), then the layers no
    /// image needs and whatever an interrupted pull left in `tmp/`.
    pub fn prune(&self, older_than: Option<Duration>) -> Result<Removed, String> {
        let _lock = self.exclusive()?;
        let _records = self.lock("records.lock", libc::LOCK_EX)?;
        let mut removed = Removed::default();
        if let Some(age) = older_than {
            let cutoff = now().saturating_sub(age.as_secs());
            for record in self.images()?.into_iter().filter(|r| r.last_used < cutoff) {
                removed.images.push(describe(&record));
                self.remove_record(&record)?;
            }
        }
        self.remove_unused_layers(&mut removed)?;
        let tmp = self.root.join("tmp");
        let listed = std::fs::read_dir(&tmp).map_err(|e| io_error(format!("cannot list {}", tmp.display()), e))?;
        for entry in listed.flatten() {
            tree::remove(&entry.path())
                .map_err(|e| io_error(format!("cannot remove {}", entry.path().display()), e))?;
        }
        self.prune_builds(older_than, &mut removed)?;
        Ok(removed)
    }

    /// The build cache (`build/`, where `image::prepare` keeps each Dockerfile step's layer):
    /// work left in `scratch/`, and, given an age, the steps no build used since (a build
    /// that finds a step touches its `config.json`).
    fn prune_builds(&self, older_than: Option<Duration>, removed: &mut Removed) -> Result<(), String> {
        let build = self.root.join("build");
        let scratch = std::fs::read_dir(build.join("scratch")).into_iter().flatten().flatten();
        let cutoff = older_than.map(|age| SystemTime::now() - age);
        let steps = std::fs::read_dir(build.join("steps")).into_iter().flatten().flatten().filter(|step| {
            let used = std::fs::metadata(step.path().join("config.json")).and_then(|m| m.modified());
            cutoff.is_some_and(|cutoff| used.map_or(true, |used| used < cutoff))
        });
        for entry in scratch.chain(steps) {
            removed.bytes += tree::disk_usage(&entry.path()).unwrap_or(0);
            removed.layers += 1;
            tree::remove(&entry.path())
                .map_err(|e| io_error(format!("cannot remove {}", entry.path().display()), e))?;
        }
        Ok(())
    }

    fn remove_record(&self, record: &ImageRecord) -> Result<(), String> {
        let path = self.record_path(&record.digest)?;
        std::fs::remove_file(&path).map_err(|e| io_error(format!("cannot remove {}", path.display()), e))
    }

    fn remove_unused_layers(&self, removed: &mut Removed) -> Result<(), String> {
        let needed: std::collections::HashSet<String> =
            self.images()?.iter().flat_map(|r| r.layers.iter().map(|k| file_name(k).unwrap_or_default())).collect();
        let dir = self.root.join("layers");
        let listed = std::fs::read_dir(&dir).map_err(|e| io_error(format!("cannot list {}", dir.display()), e))?;
        for entry in listed.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if needed.contains(&name) {
                continue;
            }
            let info: LayerInfo = std::fs::read(entry.path().join("info.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            // Out of `layers/` first (a rename), so no pull finds half of it.
            let doomed = self.root.join("tmp").join(format!("{name}.removed"));
            std::fs::rename(entry.path(), &doomed).map_err(|e| io_error(format!("cannot remove layer {name}"), e))?;
            tree::remove(&doomed).map_err(|e| io_error(format!("cannot remove {}", doomed.display()), e))?;
            removed.layers += 1;
            removed.bytes += info.bytes;
        }
        Ok(())
    }
}

/// An image as `rm` and `prune` name it: its references, else its digest.
fn describe(record: &ImageRecord) -> String {
    match record.references.is_empty() {
        true => record.digest.clone(),
        false => record.references.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `prune` clears the build cache's scratch work, and with an age the steps no build
    /// used since, keeping those used within it.
    #[test]
    fn prune_takes_old_build_steps_and_leftover_work_and_keeps_recent_steps() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let step = |name: &str, age_days: u64| {
            let step = dir.path().join("build/steps").join(name);
            std::fs::create_dir_all(step.join("layer")).unwrap();
            std::fs::write(step.join("layer/file"), "x").unwrap();
            let config = std::fs::File::create(step.join("config.json")).unwrap();
            config.set_modified(SystemTime::now() - Duration::from_secs(age_days * 86_400)).unwrap();
        };
        step("old", 40);
        step("recent", 1);
        std::fs::create_dir_all(dir.path().join("build/scratch/left")).unwrap();
        store.prune(None).unwrap();
        assert!(!dir.path().join("build/scratch/left").exists());
        assert!(dir.path().join("build/steps/old").exists(), "without an age no step goes");
        let removed = store.prune(Some(Duration::from_secs(30 * 86_400))).unwrap();
        assert!(!dir.path().join("build/steps/old").exists());
        assert!(dir.path().join("build/steps/recent/layer/file").exists());
        assert_eq!(removed.layers, 1);
    }
}
