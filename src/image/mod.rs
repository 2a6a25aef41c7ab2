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

pub use error::{PullError, PullFault};
pub use pull::{PullPolicy, pull};
pub use store::{ImageRecord, ImageStore, LayerStore, Removed};
pub use tree::disk_usage;

/// The host ids an image's ids are: image id `i` is host id `ID_BASE + i`, below `ID_RANGE`.
/// Layers are unpacked (and built) with their owners so, and an image root's processes run
/// in a user namespace that maps the range back.
pub const ID_BASE: u32 = 1_000_000_000;
pub const ID_RANGE: u32 = 65536;

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
