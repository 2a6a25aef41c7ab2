//! Dockerfiles built for real: steps run in roots of a Debian base image made here with
//! `mmdebstrap` (kept in `~/.cache/runner-test-images/bookworm-minbase/`), layers kept in a
//! folder, the cache hit on a rebuild. Builds need root (image roots are mounted); the tests
//! that need the network (`apt-get`, `pip`) run with `RUNNER_NETWORK_TESTS=1`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use runner::image::build::{BuildFailure, BuildOptions, BuildProgress, BuildSource, DirLayers, StepState, build};
use runner::image::{ID_BASE, ImageConfig, ReadyImage};

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        assert!(std::env::var_os("CI").is_none(), "image builds need a root runner, and CI runs as root");
        eprintln!("skipped: image builds need root");
    }
    root
}

/// A Debian bookworm minbase root, its owners shifted to the images' ids: made once with
/// `mmdebstrap` and kept; `None` (with the reason printed) when it cannot be made here.
fn debian() -> Option<ReadyImage> {
    static MADE: Mutex<Option<Result<PathBuf, String>>> = Mutex::new(None);
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    let layer = made.get_or_insert_with(make_debian).clone();
    match layer {
        Ok(layer) => Some(ReadyImage { name: "debian".into(), layers: vec![layer], config: ImageConfig::default() }),
        Err(why) => {
            assert!(std::env::var_os("CI").is_none(), "no Debian base on CI: {why}");
            eprintln!("skipped: {why}");
            None
        }
    }
}

fn make_debian() -> Result<PathBuf, String> {
    let home = std::env::var_os("HOME").ok_or("HOME is not set")?;
    let cache = Path::new(&home).join(".cache/runner-test-images");
    let ready = cache.join("bookworm-minbase");
    if ready.join("etc/os-release").exists() {
        return Ok(ready);
    }
    std::fs::create_dir_all(&cache).map_err(|e| e.to_string())?;
    let partial = cache.join(format!("bookworm-minbase.partial-{}", std::process::id()));
    let out = std::process::Command::new("mmdebstrap")
        .args(["--variant=minbase", "--quiet", "bookworm"])
        .arg(&partial)
        .output()
        .map_err(|e| format!("mmdebstrap cannot run ({e}); `apt-get install mmdebstrap` makes the Debian base"))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(format!("mmdebstrap failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    shift_owners(&partial)?;
    if std::fs::rename(&partial, &ready).is_err() {
        let _ = std::fs::remove_dir_all(&partial);
    }
    Ok(ready)
}

/// Every entry's owner `i` becomes `ID_BASE + i`, its mode kept (a change of owner clears
/// set-id bits).
fn shift_owners(dir: &Path) -> Result<(), String> {
    let mut todo = vec![dir.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        std::os::unix::fs::lchown(&path, Some(ID_BASE + meta.uid()), Some(ID_BASE + meta.gid()))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if !meta.file_type().is_symlink() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
                .map_err(|e| e.to_string())?;
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).map_err(|e| e.to_string())? {
                todo.push(entry.map_err(|e| e.to_string())?.path());
            }
        }
    }
    Ok(())
}

/// A build folder: its context, its layer store, what its builds said.
struct Bench {
    dir: tempfile::TempDir,
    layers: DirLayers,
}

impl Bench {
    fn new(base: Option<ReadyImage>) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("context")).unwrap();
        let mut layers = DirLayers::new(&dir.path().join("store"));
        if let Some(base) = base {
            layers.bases.insert("debian".into(), base);
        }
        Bench { dir, layers }
    }

    fn context(&self) -> PathBuf {
        self.dir.path().join("context")
    }

    fn write(&self, name: &str, text: &str) {
        let path = self.context().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// Builds the context's Dockerfile; the image or error, and the progress told.
    async fn build(
        &self,
        options: &BuildOptions,
    ) -> (Result<ReadyImage, runner::image::build::BuildError>, Vec<BuildProgress>) {
        let mut told = Vec::new();
        let source = BuildSource::dir(&self.context());
        let built = build(&source, options, &self.layers, &mut |p: &BuildProgress| told.push(p.clone())).await;
        (built, told)
    }
}

/// The instructions that ran (were not found in the cache).
fn ran(told: &[BuildProgress]) -> Vec<String> {
    told.iter().filter(|p| p.state == StepState::Running).map(|p| p.instruction.clone()).collect()
}

/// The host path of `path` in the image: in its topmost layer that has it.
fn find(image: &ReadyImage, path: &str) -> Option<PathBuf> {
    let path = path.trim_start_matches('/');
    image.layers.iter().rev().map(|l| l.join(path)).find(|p| std::fs::symlink_metadata(p).is_ok())
}

fn owner(path: &Path) -> (u32, u32) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.uid(), meta.gid())
}

const APP: &str = "\
ARG GREETING=hello
FROM debian
ARG GREETING
ENV GREETING=${GREETING} APP_HOME=/app
RUN useradd -m -u 1000 app
WORKDIR $APP_HOME
COPY --chown=app:app src/ ./src/
COPY notes.txt /etc/notes.txt
WORKDIR src
USER app
RUN echo \"$GREETING from $(id -un) in $(pwd)\" > made.txt && ls -ln hello.txt >> made.txt
CMD [\"cat\", \"made.txt\"]
LABEL purpose=test
EXPOSE 8080
";

/// A Dockerfile with ARG, ENV, WORKDIR, COPY --chown, USER and RUN builds: the image's
/// files are there with their owners and modes, its configuration is what the Dockerfile
/// says; a rebuild runs nothing; a changed file runs its COPY and what follows alone.
#[tokio::test]
async fn a_dockerfile_builds_its_files_owners_and_config_and_rebuilds_from_the_cache() {
    let Some(base) = is_root().then(debian).flatten() else { return };
    let bench = Bench::new(Some(base));
    bench.write("Dockerfile", APP);
    bench.write("src/hello.txt", "hello\n");
    bench.write("notes.txt", "notes\n");
    std::fs::set_permissions(bench.context().join("notes.txt"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let options = BuildOptions { build_args: [("GREETING".into(), "hi".into())].into(), ..BuildOptions::default() };
    let (built, told) = bench.build(&options).await;
    let image = built.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(told.iter().filter(|p| p.state == StepState::Running).count(), 6, "{told:#?}");

    let made = find(&image, "/app/src/made.txt").expect("the RUN's file");
    let text = std::fs::read_to_string(&made).unwrap();
    assert!(text.starts_with("hi from app in /app/src\n"), "{text}");
    assert!(text.contains(" 1000 1000 "), "hello.txt is app's inside the image: {text}");
    assert_eq!(owner(&made), (ID_BASE + 1000, ID_BASE + 1000));
    assert_eq!(owner(&find(&image, "/app/src/hello.txt").unwrap()), (ID_BASE + 1000, ID_BASE + 1000));
    let notes = find(&image, "/etc/notes.txt").unwrap();
    assert_eq!(owner(&notes), (ID_BASE, ID_BASE), "COPY without --chown: the image's root");
    assert_eq!(std::fs::metadata(&notes).unwrap().mode() & 0o7777, 0o640, "the source's mode");
    assert!(find(&image, "/home/app").is_some(), "useradd's home");

    let config = &image.config;
    assert!(config.env.contains(&"GREETING=hi".to_owned()), "{config:?}");
    assert_eq!((config.workdir.as_str(), config.user.as_str()), ("/app/src", "app"));
    assert_eq!(config.cmd, vec!["cat", "made.txt"]);
    assert_eq!(config.labels.get("purpose").map(String::as_str), Some("test"));
    assert_eq!(config.exposed_ports, vec!["8080/tcp"]);

    let started = Instant::now();
    let (again, told) = bench.build(&options).await;
    let took = started.elapsed();
    let again = again.unwrap();
    assert_eq!(ran(&told), Vec::<String>::new(), "a rebuild runs nothing");
    assert_eq!(again.layers, image.layers);
    assert!(took < Duration::from_secs(1), "a cached rebuild took {took:?}");

    bench.write("src/hello.txt", "changed\n");
    let (changed, told) = bench.build(&options).await;
    changed.unwrap();
    let ran = ran(&told);
    assert_eq!(ran.len(), 4, "{ran:?}");
    assert!(ran[0].starts_with("COPY --chown=app:app src/"), "{ran:?}");
    assert!(ran[3].starts_with("RUN echo"), "{ran:?}");
}

/// A failing RUN names its line and shows its status and the end of its output.
#[tokio::test]
async fn a_failing_run_names_its_line_its_status_and_its_last_output() {
    let Some(base) = is_root().then(debian).flatten() else { return };
    let bench = Bench::new(Some(base));
    bench.write(
        "Dockerfile",
        "FROM debian\nENV X=1\nRUN for i in $(seq 1 50); do echo line $i; done; sleep 0.3; echo oops >&2; exit 3\n",
    );
    let (built, _) = bench.build(&BuildOptions::default()).await;
    let err = built.unwrap_err();
    assert_eq!(err.line, 3, "{err}");
    let BuildFailure::Exited { status, tail } = &err.failure else { panic!("{err}") };
    assert_eq!(status, "exit status 3");
    // Output and errors come on two pipes: their lines' order between them is not kept.
    assert!(tail.contains("line 50") && tail.contains("oops"), "{tail}");
    assert_eq!(tail.lines().count(), 30, "{tail}");
    assert!(!tail.contains("line 20\n"), "only the last lines: {tail}");
    assert!(err.to_string().contains("line 3: `RUN for i"), "{err}");
}

/// A RUN that never ends is killed at the build's time limit, and the error says so.
#[tokio::test]
async fn a_run_that_never_ends_is_stopped_by_the_build_timeout() {
    let Some(base) = is_root().then(debian).flatten() else { return };
    let bench = Bench::new(Some(base));
    bench.write("Dockerfile", "FROM debian\nRUN echo waiting; sleep 1000\n");
    let options = BuildOptions { build_timeout: Duration::from_secs(2), ..BuildOptions::default() };
    let started = Instant::now();
    let (built, _) = bench.build(&options).await;
    let err = built.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    assert_eq!(err.line, 2);
    assert!(matches!(&err.failure, BuildFailure::TimedOut { limit_s: 2, tail } if tail == "waiting"), "{err}");
}

/// `COPY --from` takes a file an earlier stage made; the result is the last stage alone.
#[tokio::test]
async fn a_later_stage_copies_what_an_earlier_stage_built() {
    let Some(base) = is_root().then(debian).flatten() else { return };
    let bench = Bench::new(Some(base));
    bench.write(
        "Dockerfile",
        "FROM debian AS build\nRUN mkdir /out && echo built > /out/result.txt\n\
         FROM debian\nCOPY --from=build /out /app\nRUN cat /app/result.txt > /app/seen.txt\n",
    );
    let (built, _) = bench.build(&BuildOptions::default()).await;
    let image = built.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(std::fs::read_to_string(find(&image, "/app/result.txt").unwrap()).unwrap(), "built\n");
    assert_eq!(std::fs::read_to_string(find(&image, "/app/seen.txt").unwrap()).unwrap(), "built\n");
    assert!(find(&image, "/out").is_none(), "the build stage's files are not the result's");
    let options = BuildOptions { target: Some("build".into()), ..BuildOptions::default() };
    let target = bench.build(&options).await.0.unwrap();
    assert!(find(&target, "/out/result.txt").is_some() && find(&target, "/app").is_none());
}

/// `.dockerignore` leaves files out of `COPY .`; with `FROM scratch` no base is needed.
#[tokio::test]
async fn dockerignore_leaves_files_out_of_the_context() {
    if !is_root() {
        return;
    }
    let bench = Bench::new(None);
    bench.write("Dockerfile", "FROM scratch\nCOPY . /ctx/\n");
    bench.write(".dockerignore", "*.env\nlogs/\n!logs/keep.log\n");
    bench.write("keep.txt", "kept\n");
    bench.write("secret.env", "TOKEN=1\n");
    bench.write("logs/a.log", "a\n");
    bench.write("logs/keep.log", "k\n");
    let (built, _) = bench.build(&BuildOptions::default()).await;
    let image = built.unwrap_or_else(|e| panic!("{e}"));
    assert!(find(&image, "/ctx/keep.txt").is_some());
    assert!(find(&image, "/ctx/logs/keep.log").is_some(), "an exception is copied");
    assert!(find(&image, "/ctx/secret.env").is_none(), "ignored");
    assert!(find(&image, "/ctx/logs/a.log").is_none(), "ignored");
}

/// A source outside the context, by `..` or through a link, is refused on its line; so is
/// an instruction this builder does not know.
#[tokio::test]
async fn sources_outside_the_context_and_unknown_instructions_are_refused_on_their_line() {
    if !is_root() {
        return;
    }
    let bench = Bench::new(None);
    std::fs::write(bench.dir.path().join("outside.txt"), "secret\n").unwrap();
    bench.write("inside.txt", "in\n");
    std::os::unix::fs::symlink("../outside.txt", bench.context().join("link")).unwrap();
    let cases = [
        ("FROM scratch\nCOPY inside.txt /\nCOPY ../outside.txt /x\n", 3, "leads out of the build context"),
        ("FROM scratch\n\nCOPY link /x\n", 3, "outside the build context"),
        ("FROM scratch\nCOPY inside.txt /\nFROBNICATE now\n", 3, "`FROBNICATE` is not an instruction"),
        ("FROM scratch\nADD https://example.com/a.tgz /\n", 2, "URL"),
        ("FROM scratch\nRUN <<EOF\necho\nEOF\n", 2, "heredoc"),
    ];
    for (dockerfile, line, message) in cases {
        bench.write("Dockerfile", dockerfile);
        let err = bench.build(&BuildOptions::default()).await.0.unwrap_err();
        assert_eq!(err.line, line, "{dockerfile}: {err}");
        assert!(err.to_string().contains(message), "{dockerfile}: {err}");
    }
}

/// `ADD` of a local tar archive unpacks it, owners from the archive.
#[tokio::test]
async fn add_unpacks_a_local_archive() {
    if !is_root() {
        return;
    }
    let bench = Bench::new(None);
    let mut archive = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(3);
    header.set_mode(0o750);
    header.set_uid(7);
    header.set_gid(8);
    archive.append_data(&mut header, "pkg/bin/tool", &b"hi\n"[..]).unwrap();
    std::fs::write(bench.context().join("pkg.tar"), archive.into_inner().unwrap()).unwrap();
    bench.write("Dockerfile", "FROM scratch\nADD pkg.tar /opt/\n");
    let image = bench.build(&BuildOptions::default()).await.0.unwrap_or_else(|e| panic!("{e}"));
    let tool = find(&image, "/opt/pkg/bin/tool").expect("unpacked");
    assert_eq!(owner(&tool), (ID_BASE + 7, ID_BASE + 8));
    assert_eq!(std::fs::metadata(&tool).unwrap().mode() & 0o7777, 0o750);
}

/// With the network: packages from Debian with apt-get and from PyPI with pip, trusting the
/// host's CA certificates (this machine's egress re-signs TLS). `RUNNER_NETWORK_TESTS=1`.
#[tokio::test]
async fn apt_get_and_pip_install_packages_with_the_hosts_certificates() {
    if std::env::var_os("RUNNER_NETWORK_TESTS").is_none() {
        eprintln!("skipped: set RUNNER_NETWORK_TESTS=1 to build with the network");
        return;
    }
    let Some(base) = is_root().then(debian).flatten() else { return };
    let bench = Bench::new(Some(base));
    bench.write(
        "Dockerfile",
        "FROM debian\n\
         RUN apt-get update && apt-get install -y --no-install-recommends jq python3-venv\n\
         RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install six\n\
         RUN jq --version > /versions && /opt/venv/bin/python -c 'import six; print(six.__version__)' >> /versions\n",
    );
    let certificates: Vec<PathBuf> = std::fs::read_dir("/usr/local/share/ca-certificates")
        .map(|d| {
            d.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "crt")).collect()
        })
        .unwrap_or_default();
    let log = bench.dir.path().join("build.log");
    let options =
        BuildOptions { extra_ca_certificates: certificates, log_file: Some(log.clone()), ..BuildOptions::default() };
    let (built, told) = bench.build(&options).await;
    for line in &told {
        eprintln!("{line}");
    }
    let image = built.unwrap_or_else(|e| panic!("{e}"));
    let versions = std::fs::read_to_string(find(&image, "/versions").unwrap()).unwrap();
    assert!(versions.starts_with("jq-1."), "{versions}");
    assert_eq!(versions.lines().count(), 2, "{versions}");
    let log = std::fs::read_to_string(log).unwrap();
    assert!(log.contains("Successfully installed six"), "the whole output is in the log");
}

/// The figures in docs/src/image-build.md: medians of 5 cold builds (each with an empty
/// store) and of 5 cached rebuilds of a Dockerfile of 6 steps.
#[tokio::test]
#[ignore = "a measurement: cargo test --test it image_build::measure -- --ignored --nocapture"]
async fn measure_cold_and_cached_builds() {
    let Some(base) = is_root().then(debian).flatten() else { return };
    let dockerfile = "FROM debian\nENV APP=/app\nWORKDIR /app\nCOPY a.txt ./\nRUN echo one > one.txt\n\
                      COPY b.txt ./\nRUN cat a.txt b.txt one.txt > all.txt\nRUN mkdir -p /data\n";
    let median = |mut times: Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let mut cold = Vec::new();
    let mut cached = Vec::new();
    for round in 0..5 {
        let bench = Bench::new(Some(base.clone()));
        bench.write("Dockerfile", dockerfile);
        bench.write("a.txt", "a\n");
        bench.write("b.txt", "b\n");
        let started = Instant::now();
        let (built, told) = bench.build(&BuildOptions::default()).await;
        cold.push(started.elapsed());
        built.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ran(&told).len(), 6, "{told:#?}");
        if round == 0 {
            for _ in 0..5 {
                let started = Instant::now();
                let (built, told) = bench.build(&BuildOptions::default()).await;
                cached.push(started.elapsed());
                built.unwrap();
                assert!(ran(&told).is_empty());
            }
        }
    }
    println!("cold build: median {:?} of {cold:?}", median(cold.clone()));
    println!("cached rebuild: median {:?} of {cached:?}", median(cached.clone()));
}
