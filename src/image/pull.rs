//! A pull: a reference resolved at its registry to one linux/amd64 manifest, its
//! configuration read, each layer downloaded (digest checked) and unpacked into the store
//! unless it is there, and the image recorded — or, as the policy allows, the image the
//! store already holds under that reference.

use std::io::{BufReader, Seek};
use std::path::PathBuf;

use super::error::{PullError, PullFault};
use super::manifest::{self, Compression, Descriptor, Manifest, Served};
use super::reference::{Reference, check_digest};
use super::registry::{Registry, digest_of};
use super::store::{ImageRecord, ImageStore, LayerStore, now};
use super::{ReadyImage, unpack};
use crate::config::images::RegistrySettings;

/// When a pull asks the registry (`--pull`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PullPolicy {
    /// Never: only the store's image, an error when it has none.
    Never,
    /// When the store holds no image under the reference.
    #[default]
    Missing,
    /// Always: a tag is resolved again (layers the store holds are not downloaded again).
    Always,
}

impl std::str::FromStr for PullPolicy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "never" => Ok(PullPolicy::Never),
            "missing" => Ok(PullPolicy::Missing),
            "always" => Ok(PullPolicy::Always),
            other => Err(format!("`{other}` is not a pull policy (never, missing, always)")),
        }
    }
}

/// Pulls the image `reference` names into `store` (see the module's doc), as `policy` says.
pub async fn pull(
    reference: &str,
    store: &ImageStore,
    settings: &RegistrySettings,
    policy: PullPolicy,
) -> Result<ReadyImage, PullError> {
    let parsed = Reference::parse(reference).map_err(|e| PullFault::Reference(e).of(reference))?;
    let name = parsed.to_string();
    let fail = |fault: PullFault| fault.of(&name);
    if policy != PullPolicy::Always {
        if let Some(record) = store.find(&name).map_err(|e| fail(PullFault::Store(e)))? {
            store.touch(&record.digest).map_err(|e| fail(PullFault::Store(e)))?;
            return ready(store, &name, &record).map_err(fail);
        }
        if policy == PullPolicy::Never {
            return Err(fail(PullFault::NotStored));
        }
    }
    let _working = store.working().map_err(|e| fail(PullFault::Store(e)))?;
    let mut registry = Registry::new(&parsed, settings).map_err(fail)?;
    let (digest, manifest) = resolve(&mut registry, &parsed).await.map_err(fail)?;
    let config_bytes = registry.small_blob(&manifest.config, "the image configuration").await.map_err(fail)?;
    let config = manifest::image_config(&config_bytes).map_err(fail)?;
    let mut layers = Vec::new();
    let mut skipped = Vec::new();
    for layer in &manifest.layers {
        fetch_layer(&mut registry, store, layer).await.map_err(fail)?;
        layers.push(layer.digest.clone());
        skipped.extend(store.skipped_in(&layer.digest).into_iter().map(|s| format!("layer {}: {s}", layer.digest)));
    }
    let record = ImageRecord { references: vec![name.clone()], digest, config, layers, skipped, last_used: now() };
    store.save(&name, record.clone()).map_err(|e| fail(PullFault::Store(e)))?;
    ready(store, &name, &record).map_err(fail)
}

fn ready(store: &ImageStore, name: &str, record: &ImageRecord) -> Result<ReadyImage, PullFault> {
    let layers = record
        .layers
        .iter()
        .map(|key| store.layer(key).ok_or_else(|| PullFault::Store(format!("layer {key} is gone from the store"))))
        .collect::<Result<Vec<PathBuf>, _>>()?;
    Ok(ReadyImage { name: name.to_owned(), layers, config: record.config.clone() })
}

/// The digest and manifest of the linux/amd64 image `reference` names (through an index
/// when the registry serves one); a digest in the reference is checked.
async fn resolve(registry: &mut Registry, reference: &Reference) -> Result<(String, Manifest), PullFault> {
    let (bytes, content_type) = registry.manifest(reference.target()).await?;
    let digest = digest_of(&bytes);
    if let Some(expected) = &reference.digest
        && *expected != digest
    {
        return Err(PullFault::DigestMismatch {
            what: "the manifest".into(),
            expected: expected.clone(),
            actual: digest,
        });
    }
    let index = match manifest::parse(content_type.as_deref(), &bytes)? {
        Served::Image(manifest) => return Ok((digest, manifest)),
        Served::Index(index) => index,
    };
    let chosen = manifest::linux_amd64(&index)?.clone();
    let (bytes, content_type) = registry.manifest(&chosen.digest).await?;
    let digest = digest_of(&bytes);
    if digest != chosen.digest {
        let what = "the linux/amd64 manifest".into();
        return Err(PullFault::DigestMismatch { what, expected: chosen.digest, actual: digest });
    }
    match manifest::parse(content_type.as_deref(), &bytes)? {
        Served::Image(manifest) => Ok((digest, manifest)),
        Served::Index(_) => Err(PullFault::Invalid("the index's linux/amd64 entry is an index again".into())),
    }
}

/// The layer `layer` describes, in the store: downloaded into `tmp/` (checked), then
/// unpacked (off the async threads) unless the store holds it already.
async fn fetch_layer(registry: &mut Registry, store: &ImageStore, layer: &Descriptor) -> Result<(), PullFault> {
    let digest = check_digest(&layer.digest).map_err(PullFault::Invalid)?;
    if store.layer(&digest).is_some() {
        return Ok(());
    }
    let compression = manifest::compression(&layer.media_type)?;
    let mut blob = store.temp_file().map_err(PullFault::Store)?;
    registry.blob(layer, &format!("layer {digest}"), blob.as_file_mut()).await?;
    let store = store.clone();
    let key = digest.clone();
    let unpacked = tokio::task::spawn_blocking(move || {
        let mut file = blob.reopen().map_err(|e| format!("cannot read the downloaded blob: {e}"))?;
        file.rewind().map_err(|e| e.to_string())?;
        store.add_layer(&key, &mut |tree| unpack_blob(&file, compression, tree))
    })
    .await
    .map_err(|e| PullFault::Layer { digest: digest.clone(), why: format!("the unpack stopped: {e}") })?;
    unpacked.map(drop).map_err(|why| PullFault::Layer { digest, why })
}

fn unpack_blob(file: &std::fs::File, compression: Compression, tree: &std::path::Path) -> Result<Vec<String>, String> {
    let reader = BufReader::with_capacity(1 << 20, file);
    let unpacked = match compression {
        Compression::Gzip => unpack::unpack(flate2::read::MultiGzDecoder::new(reader), tree),
        Compression::Zstd => {
            let decoder = zstd::Decoder::with_buffer(reader).map_err(|e| format!("corrupt zstd stream: {e}"))?;
            unpack::unpack(decoder, tree)
        }
        Compression::None => unpack::unpack(reader, tree),
    };
    unpacked.map(|u| u.skipped)
}
