//! What a registry serves for an image, in the parts runner reads: manifests and indexes
//! (OCI and Docker v2 schema 2), and the image configuration.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::ImageConfig;
use super::error::PullFault;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// The `Accept` header of a manifest request: every kind runner reads.
pub const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json";

/// How a layer's tar archive is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ImageIndex {
    pub manifests: Vec<Descriptor>,
}

/// A manifest as served: one image, or an index of images by platform.
pub enum Served {
    Image(Manifest),
    Index(ImageIndex),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Kind {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<serde_json::Value>,
}

/// Reads a manifest; `content_type` is the registry's `Content-Type`, used when the
/// document names no media type of its own.
pub fn parse(content_type: Option<&str>, bytes: &[u8]) -> Result<Served, PullFault> {
    let invalid = |e: serde_json::Error| PullFault::Invalid(format!("unreadable manifest: {e}"));
    let kind: Kind = serde_json::from_slice(bytes).map_err(invalid)?;
    let media_type = kind.media_type.or(content_type.map(|c| c.split(';').next().unwrap_or(c).trim().to_owned()));
    match media_type.as_deref() {
        Some(OCI_INDEX | DOCKER_LIST) => Ok(Served::Index(serde_json::from_slice(bytes).map_err(invalid)?)),
        Some(OCI_MANIFEST | DOCKER_MANIFEST) => Ok(Served::Image(serde_json::from_slice(bytes).map_err(invalid)?)),
        // An OCI document may leave its media type out; its shape says which it is.
        None | Some("application/json" | "") if kind.manifests.is_some() => {
            Ok(Served::Index(serde_json::from_slice(bytes).map_err(invalid)?))
        }
        None | Some("application/json" | "") => Ok(Served::Image(serde_json::from_slice(bytes).map_err(invalid)?)),
        Some(other) => Err(PullFault::Unsupported { what: "manifest".into(), media_type: other.into() }),
    }
}

/// The linux/amd64 image of an index.
pub fn linux_amd64(index: &ImageIndex) -> Result<&Descriptor, PullFault> {
    let is = |d: &&Descriptor| d.platform.as_ref().is_some_and(|p| p.os == "linux" && p.architecture == "amd64");
    index.manifests.iter().find(is).ok_or_else(|| {
        let found: Vec<String> = index
            .manifests
            .iter()
            .map(|d| match &d.platform {
                Some(p) => format!("{}/{}", p.os, p.architecture),
                None => "no platform".to_owned(),
            })
            .collect();
        PullFault::NoPlatform { found: if found.is_empty() { "nothing".into() } else { found.join(", ") } }
    })
}

/// How a layer of `media_type` is compressed.
pub fn compression(media_type: &str) -> Result<Compression, PullFault> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Ok(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Ok(Compression::Zstd),
        "application/vnd.oci.image.layer.v1.tar" | "application/vnd.oci.image.layer.nondistributable.v1.tar" => {
            Ok(Compression::None)
        }
        other => Err(PullFault::Unsupported { what: "layer".into(), media_type: other.into() }),
    }
}

#[derive(Deserialize)]
struct ConfigBlob {
    #[serde(default)]
    config: Option<RawConfig>,
}

/// The `config` object of an image configuration (its fields may be absent or null).
#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RawConfig {
    env: Option<Vec<String>>,
    working_dir: Option<String>,
    user: Option<String>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    shell: Option<Vec<String>>,
    labels: Option<BTreeMap<String, String>>,
    exposed_ports: Option<BTreeMap<String, serde_json::Value>>,
}

/// The parts of an image configuration runner uses.
pub fn image_config(bytes: &[u8]) -> Result<ImageConfig, PullFault> {
    let blob: ConfigBlob = serde_json::from_slice(bytes)
        .map_err(|e| PullFault::Invalid(format!("unreadable image configuration: {e}")))?;
    let raw = blob.config.unwrap_or_default();
    Ok(ImageConfig {
        env: raw.env.unwrap_or_default(),
        workdir: raw.working_dir.unwrap_or_default(),
        user: raw.user.unwrap_or_default(),
        entrypoint: raw.entrypoint.unwrap_or_default(),
        cmd: raw.cmd.unwrap_or_default(),
        shell: raw.shell.unwrap_or_default(),
        labels: raw.labels.unwrap_or_default(),
        exposed_ports: raw.exposed_ports.unwrap_or_default().into_keys().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_is_read_by_its_media_type_else_its_shape() {
        let manifest = br#"{"config":{"digest":"sha256:a","size":1},"layers":[]}"#;
        let index =
            br#"{"manifests":[{"digest":"sha256:b","size":2,"platform":{"os":"linux","architecture":"amd64"}}]}"#;
        assert!(matches!(parse(Some(DOCKER_MANIFEST), manifest), Ok(Served::Image(_))));
        assert!(matches!(parse(None, manifest), Ok(Served::Image(_))));
        assert!(matches!(parse(Some("application/json"), index), Ok(Served::Index(_))));
        let Ok(Served::Index(read)) = parse(Some(OCI_INDEX), index) else { panic!("an index") };
        assert_eq!(linux_amd64(&read).map(|d| d.digest.as_str()).ok(), Some("sha256:b"));
        let v1 = "application/vnd.docker.distribution.manifest.v1+prettyjws";
        let e = parse(Some(v1), manifest).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(e, format!("unsupported manifest media type `{v1}`"));
    }

    #[test]
    fn layers_are_gzip_zstd_or_plain() {
        assert_eq!(compression("application/vnd.docker.image.rootfs.diff.tar.gzip").ok(), Some(Compression::Gzip));
        assert_eq!(compression("application/vnd.oci.image.layer.v1.tar+zstd").ok(), Some(Compression::Zstd));
        assert_eq!(compression("application/vnd.oci.image.layer.v1.tar").ok(), Some(Compression::None));
        assert!(compression("application/vnd.oci.image.layer.v1.tar+lz4").is_err());
    }

    #[test]
    fn null_fields_of_a_configuration_are_empty() {
        let config = image_config(br#"{"config":{"Env":null,"Cmd":["sh"],"ExposedPorts":{"80/tcp":{}}}}"#).unwrap();
        assert_eq!((config.env.len(), config.cmd, config.exposed_ports), (0, vec!["sh".into()], vec!["80/tcp".into()]));
    }
}
