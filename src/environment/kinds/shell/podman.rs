//! The `podman` provider: the same image, the same episode, in a podman container instead
//! of runner's own root, so that a user can check both give the same verdicts. The image is
//! built (`podman build`) or pulled (`podman pull`) by podman; each episode is a container
//! that sleeps while the world's commands run in it (`podman exec`, as the image's user, in
//! its working folder, with its variables); the runner reaches its files through `podman
//! mount` (the container's merged folder on the host), as it reaches its own roots'. The
//! container is removed at teardown. A container's processes are podman's to confine:
//! runner's sandbox does not wrap them, and a `cli` agent cannot run in one.
//!
//! podman runs with `runc` and explicit `--ulimit`s: on machines with hybrid cgroups (and
//! limits a container may not raise) its default runtime refuses to start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::image::{ImageConfig, ImageSource};

/// podman's global flags, and the limits every container and build step gets.
const GLOBAL: &[&str] = &["--log-level=error", "--runtime", "runc"];
const ULIMITS: &[&str] = &["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"];

/// An image podman holds: its name there and its configuration.
#[derive(Debug, Clone)]
pub struct PodmanImage {
    pub tag: String,
    pub config: ImageConfig,
}

/// Runs podman with `args`; its standard output, or what it said when it failed.
pub async fn podman(args: &[&str]) -> Result<String, String> {
    let out = tokio::process::Command::new("podman")
        .args(GLOBAL)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("failed to run podman: {e}"))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let tail: String = said.chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect();
        return Err(format!("podman {} failed ({}): {}", args.first().unwrap_or(&""), out.status, tail.trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Builds or pulls `source` with podman; hosts in `insecure` are spoken to over plain HTTP.
pub async fn prepare(source: &ImageSource, insecure: &[String]) -> Result<PodmanImage, String> {
    let plain = |reference: &str| insecure.iter().any(|host| reference.starts_with(&format!("{host}/")));
    let tag = match source {
        ImageSource::Pull(reference) => {
            let tls = format!("--tls-verify={}", !plain(reference));
            podman(&["pull", "-q", &tls, reference]).await?;
            reference.clone()
        }
        ImageSource::Build(spec) => {
            use sha2::Digest;
            let key = hex::encode(sha2::Sha256::digest(spec.dockerfile.to_string_lossy().as_bytes()));
            let tag = format!("localhost/runner-build/{}", &key[..16]);
            let dockerfile = std::fs::read_to_string(&spec.dockerfile).unwrap_or_default();
            let from_plain =
                dockerfile.lines().any(|l| l.trim_start().starts_with("FROM ") && plain(l.trim()[5..].trim()));
            let tls = format!("--tls-verify={}", !from_plain);
            let (file, context) = (spec.dockerfile.to_string_lossy(), spec.context.to_string_lossy());
            let mut args = vec!["build", "-q", "--network", "host", &tls, "-t", &tag, "-f", &file];
            args.extend(ULIMITS);
            let build_args: Vec<String> = spec.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
            for arg in &build_args {
                args.extend(["--build-arg", arg.as_str()]);
            }
            args.push(&context);
            podman(&args).await?;
            tag
        }
    };
    let inspected = podman(&["image", "inspect", "--format", "{{json .Config}}", &tag]).await?;
    let config: serde_json::Value =
        serde_json::from_str(&inspected).map_err(|e| format!("podman described {tag} in a way not understood: {e}"))?;
    let strings = |key: &str| -> Vec<String> {
        config[key]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let text = |key: &str| config[key].as_str().unwrap_or_default().to_owned();
    let config =
        ImageConfig { env: strings("Env"), workdir: text("WorkingDir"), user: text("User"), ..Default::default() };
    Ok(PodmanImage { tag, config })
}

/// A running container of an episode, and its files on the host.
pub struct Container {
    pub id: String,
    /// Its root as the runner reaches it (`podman mount`).
    pub merged: PathBuf,
}

impl Container {
    /// Starts a container of `image` that sleeps until it is removed, with the network or
    /// none.
    pub async fn start(image: &PodmanImage, network: bool) -> Result<Container, String> {
        let net = if network { "host" } else { "none" };
        let mut args = vec!["run", "-d", "--network", net, "--entrypoint", "sleep"];
        args.extend(ULIMITS);
        args.extend([image.tag.as_str(), "infinity"]);
        let id = podman(&args).await?;
        match podman(&["mount", &id]).await {
            Ok(merged) => Ok(Container { merged: PathBuf::from(merged), id }),
            Err(e) => {
                let _ = podman(&["rm", "-f", &id]).await;
                Err(e)
            }
        }
    }

    /// `podman exec` of `sh -c command` as `user`, in `workdir`, with `env`, ended by the
    /// container itself after `timeout_s` (so nothing of it outlives its time).
    pub fn exec(
        &self,
        command: &str,
        user: (u32, u32),
        workdir: &Path,
        env: &BTreeMap<String, String>,
        timeout_s: f64,
    ) -> tokio::process::Command {
        let mut exec = tokio::process::Command::new("podman");
        exec.args(GLOBAL).args(["exec", "-u", &format!("{}:{}", user.0, user.1), "-w"]).arg(workdir);
        for (key, value) in env {
            exec.arg("-e").arg(format!("{key}={value}"));
        }
        let limit = format!("{}s", timeout_s.ceil().max(1.0));
        exec.args([&self.id, "timeout", "-s", "KILL", &limit, "/bin/sh", "-c", command]);
        exec.env_clear().env("PATH", crate::sandbox::process::SAFE_PATH);
        exec
    }

    /// Removes the container (and its writable layer).
    pub async fn remove(&self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.id]).await;
    }
}

/// An episode's place in a container: the container, the image's user (its ids are the
/// host's: podman runs it without a user namespace), its working folder and variables.
pub struct InContainer {
    pub container: Container,
    pub user: (u32, u32),
    pub workdir: PathBuf,
    pub env: BTreeMap<String, String>,
}

impl InContainer {
    /// Starts the container, resolves the image's user in its own account files, makes its
    /// working folder and writes the task's files there, as that user's.
    pub async fn start(
        image: &PodmanImage,
        network: bool,
        files: &BTreeMap<String, String>,
        task: &crate::domain::Task,
    ) -> Result<InContainer, String> {
        let container = Container::start(image, network).await?;
        let placed = Self::place(container, image, files, task);
        if let Err((container, _)) = &placed {
            container.remove().await;
        }
        placed.map_err(|(_, e)| e)
    }

    fn place(
        container: Container,
        image: &PodmanImage,
        files: &BTreeMap<String, String>,
        task: &crate::domain::Task,
    ) -> Result<InContainer, (Container, String)> {
        let ready =
            crate::image::ReadyImage { name: image.tag.clone(), layers: Vec::new(), config: image.config.clone() };
        let account = match super::place::resolve_user(&container.merged, ready.user()) {
            Ok(account) => account,
            Err(e) => return Err((container, format!("the image {}: USER: {e}", image.tag))),
        };
        let env = super::place::image_env(&image.config.env, &account.home);
        let inside = InContainer { user: (account.uid, account.gid), workdir: ready.workdir(), env, container };
        let seeded = inside
            .files()
            .and_then(|workdir| super::place::seed(&workdir, files, task))
            .and_then(|()| super::place::harbor_folders(&inside.container.merged, inside.user, task));
        match seeded {
            Ok(()) => Ok(inside),
            Err(e) => Err((inside.container, e)),
        }
    }

    /// The working folder as the runner reaches it.
    pub fn workdir_on_host(&self) -> PathBuf {
        super::place::in_root(&self.container.merged, &self.workdir)
    }

    /// The working folder held open, made when the image lacks it, the image's user owning
    /// what the runner makes there.
    pub fn files(&self) -> Result<crate::environment::beneath::Beneath, String> {
        super::place::open_workdir(&self.container.merged, &self.workdir, self.user)
    }

    /// A command of the world, run in the container.
    pub fn exec(&self, command: &str, timeout_s: f64) -> tokio::process::Command {
        self.container.exec(command, self.user, &self.workdir, &self.env, timeout_s)
    }
}
