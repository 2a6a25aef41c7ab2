//! Where a shell world in an image lives: one trait every provider implements, beside one
//! list of them, [`PROVIDERS`]. A provider prepares an image once for all episodes (pulls or
//! builds it), then starts each episode's [`Place`]: its own copy of the image, the task's
//! files in its working folder. A place runs the world's commands, names its root for what
//! must reach it (file tools, a verifier, a program agent), and stops. `rootfs` is runner's
//! own (a root per episode, each command a sandboxed process); `podman` runs containers. A
//! provider elsewhere (a cloud's) fits the same trait: what it cannot do it says in its
//! [`Capabilities`] and its typed failures.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;

use super::place::InImage;
use super::podman::{InContainer, PodmanImage};
use crate::domain::Task;
use crate::environment::beneath::Beneath;
use crate::environment::{Definition, ImageRoot, OwnRoot};
use crate::image::{ImageSource, Images, ReadyImage};
use crate::sandbox::Confinement;
use crate::sandbox::root::Bind;

/// Every provider there is. Adding one is adding it here.
pub const PROVIDERS: &[&dyn WorldProvider] = &[&Rootfs, &Podman];

/// The provider `images` asks for.
pub fn chosen(images: &Images) -> &'static dyn WorldProvider {
    match images.provider {
        crate::image::ProviderName::Rootfs => &Rootfs,
        crate::image::ProviderName::Podman => &Podman,
    }
}

/// What a provider's places can do besides running commands and holding files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Its commands run in runner's sandbox (Landlock, seccomp, limits, cgroup), and a
    /// program agent (`cli`) can be started inside it.
    pub runner_sandbox: bool,
}

/// Why a provider failed: the image could not be had, or an episode's place not started.
/// Either makes the episode unscored (`environment_error`) with the message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    #[error("{0}")]
    Prepare(String),
    #[error("{0}")]
    Start(String),
}

/// A provider of worlds in images.
#[async_trait]
pub trait WorldProvider: Send + Sync {
    /// The name `--provider` takes.
    fn name(&self) -> &'static str;
    fn capabilities(&self) -> Capabilities;
    /// Pulls or builds `source`, once for all the episodes that run in it.
    async fn prepare(&self, source: &ImageSource, images: &Images) -> Result<Arc<dyn Prepared>, ProviderError>;
}

/// An image a provider prepared.
#[async_trait]
pub trait Prepared: Send + Sync + std::fmt::Debug {
    /// Starts one episode's place in it.
    async fn start(&self, start: Start<'_>) -> Result<Box<dyn Place>, ProviderError>;
}

/// What an episode's place starts from: the world's definition (its sandbox), the task
/// (its files), the episode's own folder, and host folders to bind in.
pub struct Start<'a> {
    pub definition: &'a Definition,
    pub task: &'a Task,
    pub private: &'a Path,
    pub binds: &'a [Bind],
}

/// One episode's world in an image.
#[async_trait]
pub trait Place: Send + Sync {
    /// Its root as the runner and the programs it starts reach it.
    fn root(&self) -> ImageRoot;
    /// The working folder held open, the image's user owning what the runner makes there.
    fn files(&self) -> Result<Beneath, String>;
    /// `sh -c command` as the image's user in its working folder, ended after `timeout_s`.
    fn command(&self, command: &str, timeout_s: f64) -> tokio::process::Command;
    /// The confinement its commands are spawned with.
    fn sandbox(&self) -> Arc<Confinement>;
    /// Stops it: its processes, then its writable layer.
    async fn stop(&self);
}

/// runner's own: layers in the store, each episode a root of them under a private writable
/// layer, each command a sandboxed process in it.
pub struct Rootfs;

#[async_trait]
impl WorldProvider for Rootfs {
    fn name(&self) -> &'static str {
        "rootfs"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { runner_sandbox: true }
    }

    async fn prepare(&self, source: &ImageSource, images: &Images) -> Result<Arc<dyn Prepared>, ProviderError> {
        let ready = crate::image::prepare(source, images).await.map_err(ProviderError::Prepare)?;
        Ok(Arc::new(RootfsImage(ready)))
    }
}

/// An image runner prepared: its layers in the store and its configuration.
#[derive(Debug)]
pub struct RootfsImage(pub ReadyImage);

#[async_trait]
impl Prepared for RootfsImage {
    async fn start(&self, start: Start<'_>) -> Result<Box<dyn Place>, ProviderError> {
        let spec = start.definition.sandbox.clone().unwrap_or_default();
        let mut binds = start.binds.to_vec();
        if spec.network {
            // As a container runtime gives one: the host's name resolution, read only.
            for file in ["/etc/resolv.conf", "/etc/hosts"].map(PathBuf::from).into_iter().filter(|f| f.is_file()) {
                binds.push(Bind { from: file.clone(), to: file, writable: false });
            }
        }
        let place = InImage::start(&self.0, start.private, &start.definition.files, start.task, &binds)
            .map_err(ProviderError::Start)?;
        let sandbox = Confinement::prepare_in_root(&spec, place.root.clone(), place.ids.clone(), place.user)
            .map_err(ProviderError::Start)?;
        Ok(Box::new(RootfsPlace { place, sandbox }))
    }
}

struct RootfsPlace {
    place: InImage,
    sandbox: Arc<Confinement>,
}

#[async_trait]
impl Place for RootfsPlace {
    fn root(&self) -> ImageRoot {
        let place = &self.place;
        ImageRoot {
            path: place.root.path().to_owned(),
            owner: place.owner(),
            workdir: place.workdir.clone(),
            env: place.env.clone(),
            own: Some(OwnRoot { root: place.root.clone(), ids: place.ids.clone(), user: place.user }),
        }
    }

    fn files(&self) -> Result<Beneath, String> {
        self.place.files()
    }

    fn command(&self, command: &str, _timeout_s: f64) -> tokio::process::Command {
        // The world's own timeout ends it: the sandbox's keeper kills its whole tree.
        let mut shell = tokio::process::Command::new("/bin/sh");
        shell.arg("-c").arg(command).current_dir(&self.place.workdir).env_clear().envs(&self.place.env);
        shell
    }

    fn sandbox(&self) -> Arc<Confinement> {
        self.sandbox.clone()
    }

    async fn stop(&self) {
        self.place.root.stop();
    }
}

/// podman's: the image built or pulled by podman, each episode a container of it
/// (`podman.rs`).
pub struct Podman;

#[async_trait]
impl WorldProvider for Podman {
    fn name(&self) -> &'static str {
        "podman"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { runner_sandbox: false }
    }

    async fn prepare(&self, source: &ImageSource, images: &Images) -> Result<Arc<dyn Prepared>, ProviderError> {
        let image =
            super::podman::prepare(source, &images.registries.insecure).await.map_err(ProviderError::Prepare)?;
        Ok(Arc::new(image))
    }
}

#[async_trait]
impl Prepared for PodmanImage {
    async fn start(&self, start: Start<'_>) -> Result<Box<dyn Place>, ProviderError> {
        let network = start.definition.sandbox.as_ref().is_some_and(|s| s.network);
        let inside = InContainer::start(self, network, &start.definition.files, start.task)
            .await
            .map_err(ProviderError::Start)?;
        Ok(Box::new(inside))
    }
}

#[async_trait]
impl Place for InContainer {
    fn root(&self) -> ImageRoot {
        ImageRoot {
            path: self.container.merged.clone(),
            owner: self.user,
            workdir: self.workdir.clone(),
            env: self.env.clone(),
            own: None,
        }
    }

    fn files(&self) -> Result<Beneath, String> {
        InContainer::files(self)
    }

    fn command(&self, command: &str, timeout_s: f64) -> tokio::process::Command {
        self.exec(command, timeout_s)
    }

    fn sandbox(&self) -> Arc<Confinement> {
        Confinement::off("the podman provider")
    }

    async fn stop(&self) {
        self.container.remove().await;
    }
}
