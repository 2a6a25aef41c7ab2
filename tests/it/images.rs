//! Images from registries: pulls through a real registry (`scripts/test-registry.sh`, Debian's
//! `docker-registry` serving a minbase bookworm image), faults from a small hand-written HTTP
//! server, and hostile layers built here with the `tar` crate, unpacked for real.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use runner::config::images::RegistrySettings;
use runner::image::{ID_BASE, ImageStore, PullFault, PullPolicy, ReadyImage, unpack};
use sha2::{Digest, Sha256};

use super::Sandbox;

// ---------------------------------------------------------------------------------------
// The real registry.

struct Registry {
    address: String,
    _script: Child,
    _dir: tempfile::TempDir,
}

/// The registry the script serves for this test binary, started once; `None` (said why)
/// when this machine lacks the Debian packages it needs.
fn registry() -> Option<&'static Registry> {
    static REGISTRY: OnceLock<Option<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(start_registry).as_ref()
}

fn start_registry() -> Option<Registry> {
    let needed = ["/usr/bin/docker-registry", "/usr/bin/mmdebstrap", "/usr/bin/skopeo", "/usr/bin/umoci"];
    if let Some(missing) = needed.iter().find(|p| !Path::new(p).exists()) {
        eprintln!("skipped: {missing} is not installed (.ci/run installs it)");
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-registry.sh");
    let mut child = Command::new("bash")
        .arg(&script)
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start scripts/test-registry.sh");
    let address = dir.path().join("address");
    let started = Instant::now();
    while !address.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("scripts/test-registry.sh ended ({status}) before the registry was ready");
        }
        assert!(started.elapsed() < Duration::from_secs(900), "the test registry was not ready in 15 minutes");
        std::thread::sleep(Duration::from_millis(100));
    }
    let address = std::fs::read_to_string(&address).expect("read the address").trim().to_owned();
    Some(Registry { address, _script: child, _dir: dir })
}

fn insecure(address: &str) -> RegistrySettings {
    RegistrySettings { insecure: vec![address.to_owned()], ..Default::default() }
}

fn pull(
    reference: &str,
    store: &ImageStore,
    settings: &RegistrySettings,
) -> Result<ReadyImage, runner::image::PullError> {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(runner::image::pull(reference, store, settings, PullPolicy::Missing))
}

fn new_store() -> (tempfile::TempDir, ImageStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = ImageStore::open(&dir.path().join("store")).expect("open the store");
    (dir, store)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(listed) => listed.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

#[test]
fn an_image_pulled_through_a_real_registry_is_unpacked_in_overlay_format() {
    let Some(registry) = registry() else { return };
    let (_dir, store) = new_store();
    let reference = format!("{}/runner-test/top:1", registry.address);
    let image = pull(&reference, &store, &insecure(&registry.address)).expect("pull by tag");
    assert_eq!(image.layers.len(), 2, "{image:?}");
    assert_eq!((image.config.workdir.as_str(), image.config.user.as_str()), ("/srv", "1000"));
    assert!(image.config.env.contains(&"FOO=bar".to_owned()), "{:?}", image.config.env);
    let (base, top) = (&image.layers[0], &image.layers[1]);
    let version = std::fs::read_to_string(base.join("etc/debian_version")).expect("/etc/debian_version");
    assert!(version.starts_with("12."), "bookworm is Debian 12: {version}");
    let meta = std::fs::symlink_metadata(base.join("etc/debian_version")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (ID_BASE, ID_BASE), "owners are shifted");
    let passwd = std::fs::symlink_metadata(base.join("usr/bin/passwd")).unwrap();
    assert_eq!(passwd.mode() & 0o7777, 0o4755, "setuid kept");
    // The second layer: a whiteout, an opaque folder, a setuid file of uid 1000.
    let issue = std::fs::symlink_metadata(top.join("etc/issue")).unwrap();
    assert!(issue.file_type().is_char_device() && issue.rdev() == 0, "a whiteout is a 0/0 device");
    let opaque = xattr(&top.join("usr/share/doc"), "trusted.overlay.opaque");
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
    assert_eq!(entries(&top.join("usr/share/doc")), ["only-this"]);
    let tool = std::fs::symlink_metadata(top.join("usr/local/bin/runner-test")).unwrap();
    assert_eq!((tool.uid(), tool.mode() & 0o7777), (ID_BASE + 1000, 0o4755));
    // The devices of /dev are skipped, and said so.
    let record = store.images().unwrap().pop().unwrap();
    assert!(record.skipped.iter().any(|s| s.contains("dev/null: device 1:3")), "{:?}", record.skipped);

    // By digest: the same layers, nothing downloaded again.
    let by_digest = format!("{}/runner-test/top@{}", registry.address, record.digest);
    let again = pull(&by_digest, &store, &insecure(&registry.address)).expect("pull by digest");
    assert_eq!(again.layers, image.layers);
    let records = store.images().unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(records[0].references.contains(&by_digest), "{records:?}");
    overlay_mounts(&image);
}

/// The kernel's overlayfs mounts the layers as lower layers and shows the image as built.
fn overlay_mounts(image: &ReadyImage) {
    let dir = tempfile::tempdir().unwrap();
    let lower: Vec<String> = image.layers.iter().rev().map(|l| l.display().to_string()).collect();
    let script = format!(
        "mkdir {d}/m && mount -t overlay overlay -o ro,lowerdir={lower} {d}/m && \
         cat {d}/m/etc/debian_version && ls {d}/m/usr/share/doc && test ! -e {d}/m/etc/issue && echo gone",
        d = dir.path().display(),
        lower = lower.join(":")
    );
    let Ok(out) = Command::new("unshare").args(["-m", "sh", "-c", &script]).output() else {
        eprintln!("skipped the mount: no unshare");
        return;
    };
    if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("permission denied") {
        eprintln!("skipped the mount: not allowed here: {}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() == 3 && lines[0].starts_with("12."), "{stdout}");
    assert_eq!(&lines[1..], ["only-this", "gone"], "the opaque folder and the whiteout hide the base's");
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let out = Command::new("python3")
        .args(["-c", "import os,sys; sys.stdout.buffer.write(os.getxattr(sys.argv[1], sys.argv[2]))"])
        .args([path.as_os_str(), name.as_ref()])
        .output()
        .ok()?;
    out.status.success().then_some(out.stdout)
}

#[test]
fn a_second_pull_is_served_from_the_store_only_when_allowed() {
    let Some(registry) = registry() else { return };
    let sb = Sandbox::new();
    sb.write("up.yaml", &format!("images:\n  insecure: [\"{}\"]\n", registry.address));
    // The same registry's images, through a mirror that is down.
    let down = closed_port();
    let mirror = format!("images:\n  mirrors: {{\"{}\": \"{down}\"}}\n  insecure: [\"{down}\"]\n", registry.address);
    sb.write("down.yaml", &mirror);
    let reference = format!("{}/runner-test/base:docker", registry.address);
    let images = |args: &[&str]| sb.run(&[&["images", "--store", "store"][..], args].concat());
    let cold = images(&["pull", &reference, "--config", "up.yaml"]);
    assert_eq!(cold.code, 0, "{cold:?}");
    let warm = images(&["pull", &reference, "--config", "down.yaml"]);
    assert_eq!(warm.code, 0, "missing (the default) uses the store: {warm:?}");
    let always = images(&["pull", &reference, "--config", "down.yaml", "--pull", "always"]);
    assert_ne!(always.code, 0, "{always:?}");
    assert!(always.stderr.contains(&format!("failed to pull {reference}")), "{always:?}");
    assert!(always.stderr.contains(&format!("registry {down} is unreachable")), "{always:?}");
    let other = format!("{}/runner-test/base:bookworm", registry.address);
    let never = images(&["pull", &other, "--pull", "never"]);
    assert!(never.stderr.contains("not in the image store"), "{never:?}");

    let listed = images(&["ls"]);
    let row = listed.stdout.lines().find(|l| l.starts_with(&reference)).unwrap_or_else(|| panic!("{listed:?}"));
    let store = ImageStore::open(&sb.path().join("store")).unwrap();
    let record = store.images().unwrap().pop().unwrap();
    let short = &record.digest["sha256:".len().."sha256:".len() + 12];
    assert!(row.contains(short), "the digest, short: {row}");
    let allocated: u64 = record.layers.iter().map(|k| du(&store.root().join("layers").join(k.replace(':', "-")))).sum();
    assert!(allocated > 50_000_000, "a minbase system takes tens of MB: {allocated}");
    assert!(row.contains(&format!("{:.1} MB", store.bytes_of(&record) as f64 / 1e6)), "{row}");

    let removed = images(&["rm", &reference]);
    assert!(removed.stdout.contains(&format!("removed {reference}")) && removed.stdout.contains("1 layers removed"));
    assert!(entries(&sb.path().join("store/layers")).is_empty() && entries(&sb.path().join("store/images")).is_empty());
}

/// Bytes allocated under `dir`, as `du` counts them.
fn du(dir: &Path) -> u64 {
    let out = Command::new("du").args(["-s", "-B1"]).arg(dir).output().expect("du");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0)
}

fn closed_port() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    address
}

#[test]
fn two_pulls_at_once_share_one_copy_of_each_layer() {
    let Some(registry) = registry() else { return };
    let sb = Sandbox::new();
    sb.write("up.yaml", &format!("images:\n  insecure: [\"{}\"]\n", registry.address));
    let reference = format!("{}/runner-test/base:bookworm", registry.address);
    let start = || {
        sb.command()
            .args(["images", "--store", "store", "pull", &reference, "--config", "up.yaml", "--pull", "always"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start runner")
    };
    let (a, b) = (start(), start());
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(entries(&sb.path().join("store/layers")).len(), 1);
    assert_eq!(entries(&sb.path().join("store/images")).len(), 1);
    assert!(entries(&sb.path().join("store/tmp")).is_empty(), "the loser's copy is removed");
}

#[test]
fn an_unknown_tag_is_the_registrys_404_naming_the_image() {
    let Some(registry) = registry() else { return };
    let (_dir, store) = new_store();
    let reference = format!("{}/runner-test/base:no-such-tag", registry.address);
    let e = pull(&reference, &store, &insecure(&registry.address)).unwrap_err();
    assert!(matches!(e.fault, PullFault::Status { status: 404, .. }), "{e}");
    let message = e.to_string();
    assert!(message.starts_with(&format!("failed to pull {reference}: registry {}", registry.address)), "{message}");
    assert!(message.contains("404") && message.contains("MANIFEST_UNKNOWN"), "the body is shown: {message}");
}

// ---------------------------------------------------------------------------------------
// A hand-written registry, for the faults a real one does not make.

/// What the fake registry answers: a path's status, headers and body.
type Routes = HashMap<String, (u16, Vec<(String, String)>, Vec<u8>)>;

struct Fake {
    address: String,
    routes: Arc<Mutex<Routes>>,
    /// Request lines and `Authorization` headers seen.
    seen: Arc<Mutex<Vec<String>>>,
}

impl Fake {
    fn start() -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let routes: Arc<Mutex<Routes>> = Arc::default();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let (r, s) = (routes.clone(), seen.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (r, s) = (r.clone(), s.clone());
                std::thread::spawn(move || serve(stream, &r, &s));
            }
        });
        Fake { address, routes, seen }
    }

    fn route(&self, path: &str, status: u16, headers: &[(&str, &str)], body: &[u8]) {
        let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.routes.lock().unwrap().insert(path.to_owned(), (status, headers, body.to_vec()));
    }

    /// Serves `repo:tag` as an OCI image of `layers` (media type, blob); returns the
    /// manifest's digest.
    fn image(&self, repo: &str, tag: &str, layers: &[(&str, Vec<u8>)]) -> String {
        let config = br#"{"architecture":"amd64","os":"linux","config":{"Env":["A=1"],"WorkingDir":"/w"}}"#;
        self.route(&format!("/v2/{repo}/blobs/{}", sha(config)), 200, &[], config);
        let mut descriptors = Vec::new();
        for (media_type, blob) in layers {
            self.route(&format!("/v2/{repo}/blobs/{}", sha(blob)), 200, &[], blob);
            descriptors.push(serde_json::json!({"mediaType": media_type, "digest": sha(blob), "size": blob.len()}));
        }
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(config), "size": config.len()},
            "layers": descriptors,
        });
        let bytes = serde_json::to_vec(&manifest).unwrap();
        self.route(&format!("/v2/{repo}/manifests/{tag}"), 200, &[], &bytes);
        self.route(&format!("/v2/{repo}/manifests/{}", sha(&bytes)), 200, &[], &bytes);
        sha(&bytes)
    }

    fn pull(&self, reference: &str, store: &ImageStore) -> Result<ReadyImage, runner::image::PullError> {
        pull(&format!("{}/{reference}", self.address), store, &insecure(&self.address))
    }
}

fn serve(stream: TcpStream, routes: &Mutex<Routes>, seen: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let mut authorization = String::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("authorization")
        {
            authorization = value.trim().to_owned();
        }
    }
    seen.lock().unwrap().push(format!("{target} {authorization}"));
    let path = target.split('?').next().unwrap_or("/");
    let key = if authorization.is_empty() { path.to_owned() } else { format!("{path} {authorization}") };
    let routes = routes.lock().unwrap();
    let (status, headers, body) = routes.get(&key).or_else(|| routes.get(path)).cloned().unwrap_or((
        404,
        vec![],
        br#"{"errors":[{"code":"NOT_FOUND"}]}"#.to_vec(),
    ));
    drop(routes);
    let mut out = stream;
    let mut head = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = out.write_all(head.as_bytes()).and_then(|()| out.write_all(&body));
}

fn sha(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// A tar archive of regular files (path, content).
fn tar_of(files: &[(&str, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_cksum();
        builder.append_data(&mut header, path, content.as_bytes()).unwrap();
    }
    builder.into_inner().unwrap()
}

#[test]
fn a_registry_that_asks_for_a_token_gets_one_from_its_realm() {
    let fake = Fake::start();
    let layer = gzip(&tar_of(&[("hello.txt", "hi\n")]));
    fake.image("r", "t", &[(GZIP, layer)]);
    // Without the token every path of the repository is refused with the challenge.
    let realm = format!("http://{}/token", fake.address);
    let challenge = format!(r#"Bearer realm="{realm}",service="fake",scope="repository:r:pull""#);
    let paths: Vec<String> = fake.routes.lock().unwrap().keys().cloned().collect();
    for path in paths {
        let (status, headers, body) = fake.routes.lock().unwrap()[&path].clone();
        let with_token = format!("{path} Bearer abc");
        fake.routes.lock().unwrap().insert(with_token, (status, headers, body));
        fake.route(&path, 401, &[("WWW-Authenticate", &challenge)], b"{\"errors\":[{\"code\":\"UNAUTHORIZED\"}]}");
    }
    fake.route("/token", 200, &[], br#"{"token":"abc"}"#);
    let (_dir, store) = new_store();
    let image = fake.pull("r:t", &store).expect("pulled with the token");
    assert_eq!(std::fs::read_to_string(image.layers[0].join("hello.txt")).unwrap(), "hi\n");
    assert_eq!(image.config.workdir, "/w");
    let seen = fake.seen.lock().unwrap().clone();
    assert!(seen.iter().any(|s| s.starts_with("/token?") && s.contains("scope=repository%3Ar%3Apull")), "{seen:?}");
}

#[test]
fn registry_faults_are_named_with_the_image_and_what_the_registry_said() {
    let fake = Fake::start();
    let (_dir, store) = new_store();
    let image = |tag: &str| format!("failed to pull {}/r:{tag}: ", fake.address);

    fake.route("/v2/r/manifests/busy", 429, &[("Retry-After", "30")], b"slow down, please");
    let e = fake.pull("r:busy", &store).unwrap_err().to_string();
    assert!(e.starts_with(&image("busy")) && e.contains("answered 429") && e.contains("slow down"), "{e}");

    fake.route("/v2/r/manifests/broken", 503, &[], b"<html>\n  upstream   down\n</html>");
    let e = fake.pull("r:broken", &store).unwrap_err().to_string();
    assert!(e.contains("answered 503") && e.contains("<html> upstream down </html>"), "{e}");

    fake.route("/v2/r/manifests/private", 401, &[("WWW-Authenticate", r#"Basic realm="x""#)], b"log in");
    let e = fake.pull("r:private", &store).unwrap_err().to_string();
    assert!(e.contains("answered 401") && e.contains("log in"), "{e}");

    // A blob whose bytes are not what its digest says.
    let layer = gzip(&tar_of(&[("a", "a")]));
    fake.image("r", "swapped", &[(GZIP, layer.clone())]);
    let mut other = layer.clone();
    other[layer.len() - 1] ^= 1;
    fake.route(&format!("/v2/r/blobs/{}", sha(&layer)), 200, &[], &other);
    let e = fake.pull("r:swapped", &store).unwrap_err();
    assert!(matches!(e.fault, PullFault::DigestMismatch { .. }), "{e}");
    assert!(e.to_string().contains(&format!("layer {} has digest {}", sha(&layer), sha(&other))), "{e}");

    // An index without linux/amd64.
    let index = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(b"x"), "size": 1,
                       "platform": {"os": "linux", "architecture": "arm64"}}]});
    fake.route("/v2/r/manifests/arm", 200, &[], &serde_json::to_vec(&index).unwrap());
    let e = fake.pull("r:arm", &store).unwrap_err().to_string();
    assert!(e.contains("no linux/amd64 image (it has: linux/arm64)"), "{e}");

    let e = pull(&format!("{}/r:t", closed_port()), &store, &RegistrySettings::default()).unwrap_err();
    assert!(matches!(e.fault, PullFault::Unreachable { .. }), "{e}");
    assert!(entries(&store.root().join("layers")).is_empty() && entries(&store.root().join("tmp")).is_empty());
}

#[test]
fn an_index_leads_to_its_linux_amd64_image() {
    let fake = Fake::start();
    let digest = fake.image("r", "plain", &[(GZIP, gzip(&tar_of(&[("amd64", "yes")])))]);
    let size = fake.routes.lock().unwrap()["/v2/r/manifests/plain"].2.len();
    let index = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(b"arm"), "size": 3,
             "platform": {"os": "linux", "architecture": "arm64"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": size,
             "platform": {"os": "linux", "architecture": "amd64"}}]});
    fake.route("/v2/r/manifests/multi", 200, &[], &serde_json::to_vec(&index).unwrap());
    let (_dir, store) = new_store();
    let image = fake.pull("r:multi", &store).expect("pulled through the index");
    assert_eq!(std::fs::read_to_string(image.layers[0].join("amd64")).unwrap(), "yes");
}

#[test]
fn a_corrupt_layer_leaves_nothing_in_the_store() {
    let fake = Fake::start();
    let good = gzip(&tar_of(&[("a", "a")]));
    // Letters that do not compress away, so the stream has a middle to break.
    let mut state = 1u32;
    let text: String = (0..100_000)
        .map(|_| {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            char::from(b'a' + (state >> 16) as u8 % 26)
        })
        .collect();
    let mut corrupt = gzip(&tar_of(&[("big", &text)]));
    let middle = corrupt.len() / 2;
    corrupt[middle..middle + 64].fill(0x55);
    let unknown = b"some bytes".to_vec();
    fake.image("r", "corrupt", &[(GZIP, good), (GZIP, corrupt.clone())]);
    fake.image("r", "odd", &[("application/vnd.example.layer+lz4", unknown)]);
    let (_dir, store) = new_store();
    let e = fake.pull("r:corrupt", &store).unwrap_err();
    let message = e.to_string();
    assert!(matches!(e.fault, PullFault::Layer { .. }), "{message}");
    assert!(message.contains(&format!("layer {}: ", sha(&corrupt))) && message.contains("corrupt"), "{message}");
    assert_eq!(entries(&store.root().join("layers")).len(), 1, "only the good layer");
    assert!(entries(&store.root().join("tmp")).is_empty() && entries(&store.root().join("images")).is_empty());
    let e = fake.pull("r:odd", &store).unwrap_err().to_string();
    assert!(e.contains("unsupported layer media type `application/vnd.example.layer+lz4`"), "{e}");
}

// ---------------------------------------------------------------------------------------
// Hostile layers, unpacked for real.

/// A tar header for `path`, written as given (the `tar` crate refuses `..` in `set_path`).
fn header(path: &str, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

fn append(builder: &mut tar::Builder<Vec<u8>>, mut header: tar::Header, data: &[u8]) {
    header.set_cksum();
    builder.append(&header, data).unwrap();
}

fn link(builder: &mut tar::Builder<Vec<u8>>, path: &str, kind: tar::EntryType, target: &str) {
    let mut h = header(path, kind, 0);
    h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
    append(builder, h, b"");
}

/// Unpacks `archive` into `top/layer`; `top/outside` is where an escape would land.
fn unpack_in(top: &Path, archive: Vec<u8>) -> Result<unpack::Unpacked, String> {
    std::fs::create_dir_all(top.join("layer")).unwrap();
    std::fs::create_dir_all(top.join("outside")).unwrap();
    unpack::unpack(&archive[..], &top.join("layer"))
}

/// Appends a case's entries to an archive.
type Build<'a> = dyn Fn(&mut tar::Builder<Vec<u8>>) + 'a;

#[test]
fn entries_that_lead_out_of_the_layer_are_refused_by_name() {
    let top = tempfile::tempdir().unwrap();
    let outside = top.path().join("outside");
    let cases: Vec<(&str, Box<Build<'_>>, &str)> = vec![
        (
            "an absolute link, then a file through it",
            Box::new(|b| {
                link(b, "evil", tar::EntryType::Symlink, outside.to_str().unwrap());
                append(b, header("evil/planted", tar::EntryType::Regular, 3), b"bad");
            }),
            "entry `evil/planted`: a folder on its path is a symbolic link",
        ),
        (
            "a relative link out, then a folder through it",
            Box::new(|b| {
                link(b, "up", tar::EntryType::Symlink, "../outside");
                append(b, header("up/dir/", tar::EntryType::Directory, 0), b"");
            }),
            "entry `up/dir/`: a folder on its path is a symbolic link",
        ),
        (
            "`..`",
            Box::new(|b| append(b, header("a/../../outside/planted", tar::EntryType::Regular, 3), b"bad")),
            "entry `a/../../outside/planted`: `..` in a path is refused",
        ),
        (
            "an absolute path",
            Box::new(|b| append(b, header("/tmp/planted", tar::EntryType::Regular, 3), b"bad")),
            "entry `/tmp/planted`: an absolute path is refused",
        ),
        (
            "a hard link out",
            Box::new(|b| link(b, "passwd", tar::EntryType::Link, "../outside/secret")),
            "entry `passwd`: hard link target: `..` in a path is refused",
        ),
        (
            "a hard link through a link",
            Box::new(|b| {
                link(b, "etc", tar::EntryType::Symlink, "/etc");
                link(b, "passwd", tar::EntryType::Link, "etc/passwd");
            }),
            "entry `passwd`: hard link target: a folder on its path is a symbolic link",
        ),
        (
            "an owner out of the image's range",
            Box::new(|b| {
                let mut h = header("f", tar::EntryType::Regular, 0);
                h.set_uid(70_000);
                append(b, h, b"");
            }),
            "entry `f`: owner uid 70000 is outside the image id range 0..65535",
        ),
    ];
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "secret").unwrap();
    for (i, (what, build, expected)) in cases.iter().enumerate() {
        let mut builder = tar::Builder::new(Vec::new());
        build(&mut builder);
        let case = top.path().join(format!("case{i}"));
        let e = unpack_in(&case, builder.into_inner().unwrap()).map(|_| ()).unwrap_err();
        assert!(e.contains(expected), "{what}: {e}");
        assert_eq!(entries(&outside), ["secret"], "{what}: nothing lands outside");
        assert!(entries(&case.join("outside")).is_empty(), "{what}: nothing lands beside the layer");
    }
    assert!(!Path::new("/tmp/planted").exists());
}

#[test]
fn devices_are_skipped_and_setuid_owners_and_hard_links_kept() {
    let top = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut dev = header("dev/sda", tar::EntryType::Block, 0);
    dev.set_device_major(8).unwrap();
    dev.set_device_minor(0).unwrap();
    append(&mut b, dev, b"");
    let mut tool = header("bin/tool", tar::EntryType::Regular, 5);
    tool.set_mode(0o4755);
    tool.set_uid(1000);
    tool.set_gid(1000);
    tool.set_mtime(1_000_000_000);
    append(&mut b, tool, b"tool\n");
    link(&mut b, "bin/same", tar::EntryType::Link, "bin/tool");
    link(&mut b, "bin/sh", tar::EntryType::Symlink, "/bin/busybox");
    append(&mut b, header("etc/.wh.gone", tar::EntryType::Regular, 0), b"");
    append(&mut b, header("var/.wh..wh..opq", tar::EntryType::Regular, 0), b"");
    let unpacked = unpack_in(top.path(), b.into_inner().unwrap()).expect("unpacked");
    let layer = top.path().join("layer");
    assert_eq!(unpacked.skipped, ["dev/sda: device 8:0 not made"]);
    assert!(!layer.join("dev/sda").exists());
    let tool = std::fs::symlink_metadata(layer.join("bin/tool")).unwrap();
    assert_eq!((tool.mode() & 0o7777, tool.uid(), tool.gid()), (0o4755, ID_BASE + 1000, ID_BASE + 1000));
    assert_eq!(tool.mtime(), 1_000_000_000);
    assert_eq!(std::fs::symlink_metadata(layer.join("bin/same")).unwrap().ino(), tool.ino(), "a hard link");
    assert_eq!(std::fs::read_link(layer.join("bin/sh")).unwrap(), PathBuf::from("/bin/busybox"), "kept as it is");
    let gone = std::fs::symlink_metadata(layer.join("etc/gone")).unwrap();
    assert!(gone.file_type().is_char_device() && gone.rdev() == 0);
    assert_eq!(xattr(&layer.join("var"), "trusted.overlay.opaque").as_deref(), Some(&b"y"[..]));
}

#[test]
fn a_layer_of_a_hundred_thousand_files_unpacks() {
    let top = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    for i in 0..100_000 {
        append(&mut b, header(&format!("d{}/f{i}", i % 100), tar::EntryType::Regular, 1), b"x");
    }
    let archive = gzip(&b.into_inner().unwrap());
    let started = Instant::now();
    std::fs::create_dir_all(top.path().join("layer")).unwrap();
    let decoder = flate2::read::GzDecoder::new(&archive[..]);
    unpack::unpack(decoder, &top.path().join("layer")).expect("unpacked");
    let count: usize = (0..100).map(|d| entries(&top.path().join(format!("layer/d{d}"))).len()).sum();
    assert_eq!(count, 100_000);
    eprintln!("100,000 files unpacked in {:.1}s", started.elapsed().as_secs_f64());
}

#[test]
fn a_ten_gigabyte_sparse_file_takes_only_its_blocks() {
    let top = tempfile::tempdir().unwrap();
    let size: u64 = 10 << 30;
    let data = [7u8; 4096];
    // A GNU sparse entry: 4 KiB of data at the end of 10 GiB of hole.
    let mut h = tar::Header::new_gnu();
    h.set_path("huge").unwrap();
    h.set_entry_type(tar::EntryType::GNUSparse);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    {
        let gnu = h.as_gnu_mut().unwrap();
        // Octal, NUL-terminated when the field has room for it (as the `tar` crate writes).
        let put = |field: &mut [u8], value: u64| {
            let mut text = format!("{value:0width$o}", width = field.len() - 1).into_bytes();
            if text.len() < field.len() {
                text.push(0);
            }
            field.copy_from_slice(&text);
        };
        put(&mut gnu.sparse[0].offset, size - data.len() as u64);
        put(&mut gnu.sparse[0].numbytes, data.len() as u64);
        put(&mut gnu.realsize, size);
    }
    let mut b = tar::Builder::new(Vec::new());
    append(&mut b, h, &data);
    // And a plain file of zeroes: written as a hole too.
    append(&mut b, header("zeroes", tar::EntryType::Regular, 1 << 20), &vec![0u8; 1 << 20]);
    let started = Instant::now();
    unpack_in(top.path(), b.into_inner().unwrap()).expect("unpacked");
    let huge = std::fs::metadata(top.path().join("layer/huge")).unwrap();
    assert_eq!(huge.len(), size);
    assert!(huge.blocks() * 512 <= 64 * 1024, "{} bytes allocated", huge.blocks() * 512);
    let mut tail = [0u8; 4096];
    let mut file = std::fs::File::open(top.path().join("layer/huge")).unwrap();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(size - 4096)).unwrap();
    file.read_exact(&mut tail).unwrap();
    assert_eq!(tail, data);
    let zeroes = std::fs::metadata(top.path().join("layer/zeroes")).unwrap();
    assert_eq!((zeroes.len(), zeroes.blocks()), (1 << 20, 0));
    assert!(runner::image::disk_usage(&top.path().join("layer")).unwrap() < 1 << 20);
    eprintln!("10 GiB sparse file unpacked in {:.1}s", started.elapsed().as_secs_f64());
}

#[test]
fn runner_yaml_refuses_an_unknown_images_key_by_name() {
    let sb = Sandbox::new();
    sb.write("runner.yaml", "images:\n  insecure: []\n  mirror: {}\n");
    let run = sb.run(&["images", "--store", "store", "pull", "x:1", "--config", "runner.yaml"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("runner.yaml:3:3: images.mirror: unknown field `mirror`"), "{run:?}");
}

// ---------------------------------------------------------------------------------------
// End to end: a pulled image as an episode's root.

#[test]
fn a_pulled_image_is_the_root_a_shell_world_runs_commands_in() {
    use runner::environment::kind::SetupContext;
    use runner::environment::kinds::shell::{Shell, ShellWorld};
    use runner::environment::{Definition, World};
    let Some(registry) = registry() else { return };
    let (dir, store) = new_store();
    let image =
        pull(&format!("{}/runner-test/top:1", registry.address), &store, &insecure(&registry.address)).expect("pull");
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let definition = Definition::builtin(&Shell);
    let task = runner::domain::Task::new("t", "go");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let context = SetupContext::new(&scratch, "ep");
        let image = runner::environment::kinds::shell::provider::RootfsImage(image);
        let mut world =
            ShellWorld::create_in_image(&definition, &task, &context, &image).await.expect("a world in the image");
        let command = "cat /etc/debian_version; id -u; pwd; ls /usr/share/doc; test -e /etc/issue || echo no-issue; \
                       echo $FOO";
        let arguments = serde_json::json!({ "command": command });
        let ran = world.call(&runner::contract::Actor::Main, "run_command", arguments).await.expect("ran");
        world.teardown().await;
        assert_eq!(ran["exit_code"], 0, "{ran}");
        let out = ran["stdout"].as_str().unwrap_or_default();
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines.first().is_some_and(|l| l.starts_with("12.")), "{ran}");
        assert_eq!(&lines[1..], ["1000", "/srv", "only-this", "no-issue", "bar"], "{ran}");
    });
}

#[test]
fn a_full_disk_leaves_no_half_written_layer() {
    let Some(registry) = registry() else { return };
    let sb = Sandbox::new();
    sb.write("up.yaml", &format!("images:\n  insecure: [\"{}\"]\n", registry.address));
    std::fs::create_dir(sb.path().join("disk")).unwrap();
    // 100 MB: room for the 63 MB blob, not for the 180 MB it unpacks to.
    let script = r#"mount -t tmpfs -o size=100m tmpfs disk || exit 99
        "$0" images --store disk/store pull "$1" --config up.yaml; echo "exit=$?"
        ls -A disk/store/layers disk/store/tmp disk/store/images"#;
    let runner = env!("CARGO_BIN_EXE_runner");
    let reference = format!("{}/runner-test/base:bookworm", registry.address);
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", script, runner, &reference])
        .current_dir(sb.path())
        .output()
        .expect("unshare");
    if out.status.code() == Some(99) {
        eprintln!("skipped: cannot mount a tmpfs here: {}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("exit=2\n"), "{stdout}\n{stderr}");
    assert!(stderr.contains(&format!("failed to pull {reference}: layer sha256:")), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>()[1..],
        ["disk/store/images:", "disk/store/layers:", "disk/store/tmp:"]
    );
}
