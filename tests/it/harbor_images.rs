//! Harbor tasks in their own images, as Terminal-Bench tasks are written: the Dockerfile
//! `apt-get install`s packages, makes a virtual environment under `/opt` with `pip`, copies
//! fixtures outside `WORKDIR`, installs a helper into `/usr/local/bin` and switches `USER`;
//! the tests name absolute paths. The base image is served by a real local registry
//! (`scripts/test-registry.sh`: Debian's docker-registry, a minbase bookworm made by
//! mmdebstrap); the builds download from Debian's and PyPI's mirrors. Skipped, saying why,
//! where those tools are missing (`.ci/run` installs them).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;

use serde_json::Value;

use crate::{Run, Sandbox, of_type};

/// A local registry serving the test images, stopped when dropped.
struct Registry {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The registry every test here shares, with the image store they share (the second
/// build of a task is then served from the cache), or why they cannot run.
fn shared() -> Result<&'static (Registry, tempfile::TempDir), String> {
    static SHARED: OnceLock<Result<(Registry, tempfile::TempDir), String>> = OnceLock::new();
    SHARED.get_or_init(start).as_ref().map_err(Clone::clone)
}

fn start() -> Result<(Registry, tempfile::TempDir), String> {
    for tool in ["docker-registry", "mmdebstrap", "umoci", "skopeo"] {
        if which(tool).is_none() {
            return Err(format!("`{tool}` is not installed (bash .ci/run installs it)"));
        }
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/test-registry.sh");
    let child = Command::new("bash").arg(script).arg(dir.path()).spawn().map_err(|e| e.to_string())?;
    let address_file = dir.path().join("address");
    let started = std::time::Instant::now();
    while !address_file.exists() {
        if started.elapsed().as_secs() > 900 {
            return Err("the test registry did not start within 15 minutes".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let address = std::fs::read_to_string(&address_file).map_err(|e| e.to_string())?.trim().to_owned();
    let store = tempfile::tempdir().map_err(|e| e.to_string())?;
    Ok((Registry { child, address, _dir: dir }, store))
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file())
}

/// Writes `NAME/FILE` for each file, making scripts executable.
fn write_task(sb: &Sandbox, name: &str, files: &[(&str, &str)]) -> PathBuf {
    for (file, text) in files {
        let path = sb.write(&format!("tasks/{name}/{file}"), text);
        if file.ends_with(".sh") || file.starts_with("environment/bin/") {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
    }
    sb.path().join("tasks").join(name)
}

/// A Terminal-Bench-style task on the registry's base image: packages from apt, a venv
/// under /opt with a package from PyPI, fixtures under /opt, a helper in /usr/local/bin, a
/// user of its own. The egress's certificate authority is copied in for pip, as a
/// corporate proxy's would be.
fn tb_task(sb: &Sandbox, registry: &str) -> PathBuf {
    let dockerfile = format!(
        "FROM {registry}/runner-test/base:bookworm\n\
         COPY ca-certificates.crt /opt/egress-ca.pem\n\
         ENV PIP_CERT=/opt/egress-ca.pem\n\
         RUN apt-get update && apt-get install -y --no-install-recommends jq python3 python3-venv \\\n    \
         && rm -rf /var/lib/apt/lists/*\n\
         RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir six==1.16.0\n\
         COPY fixtures/ /opt/fixtures/\n\
         COPY bin/count-items /usr/local/bin/count-items\n\
         RUN useradd -m -u 1000 app && mkdir -p /app && chown app:app /app\n\
         USER app\n\
         WORKDIR /app\n"
    );
    let ca = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    write_task(
        sb,
        "tb-style",
        &[
            (
                "task.toml",
                "version = \"1.0\"\n[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 120.0\n[environment]\nbuild_timeout_sec = 900.0\n",
            ),
            ("instruction.md", "Write the number of items in /opt/fixtures/items.json to /app/count.txt.\n"),
            ("environment/Dockerfile", &dockerfile),
            ("environment/ca-certificates.crt", &ca),
            ("environment/fixtures/items.json", "[\"a\", \"b\", \"c\"]\n"),
            (
                "environment/bin/count-items",
                "#!/bin/sh\n# Needs the venv's package and jq.\n/opt/venv/bin/python -c 'import six' || exit 3\njq length \"$1\"\n",
            ),
            (
                "solution/solve.sh",
                "#!/bin/bash\nset -e\ncount-items /opt/fixtures/items.json > /app/count.txt\necho ran >> /app/trace\n",
            ),
            (
                "tests/test.sh",
                "#!/bin/bash\nok=1\n[ \"$(cat /app/count.txt)\" = 3 ] || ok=0\n[ \"$(id -un)\" = app ] || ok=0\n\
                 [ \"$(wc -l < /app/trace)\" = 1 ] || ok=0\n[ -f /tests/test.sh ] || ok=0\n\
                 echo \"count=$(cat /app/count.txt) user=$(id -un) trace=$(wc -l < /app/trace)\"\n\
                 echo $ok > /logs/verifier/reward.txt\n",
            ),
            // The scripted agent counts wrong: a failure, not an unscored episode.
            (
                "runner.yaml",
                "mock:\n  - tool_calls: [{name: run_command, arguments: {command: \"echo 4 > /app/count.txt; echo ran >> /app/trace\"}}]\n  - tool_calls: [{name: final_answer, arguments: {answer: done}}]\n",
            ),
        ],
    )
}

/// `runner` with the shared store and the registry allowed over plain HTTP.
fn run(sb: &Sandbox, args: &[&str]) -> Run {
    let (registry, store) = shared().expect("checked by the caller");
    sb.write("runner.yaml", &format!("images:\n  insecure: [\"{}\"]\n", registry.address));
    let output = sb.command().args(args).env("RUNNER_IMAGE_STORE", store.path()).output().expect("run runner");
    Run::from(output)
}

fn outcomes(events: &[Value]) -> Vec<Value> {
    of_type(events, "episode_finished").iter().map(|e| e["outcome"].clone()).collect()
}

fn skip() -> bool {
    match shared() {
        Ok(_) => false,
        Err(why) => {
            eprintln!("skipped: {why}");
            true
        }
    }
}

#[test]
fn a_terminal_bench_style_task_passes_its_oracle_in_its_own_image_and_not_on_the_host() {
    if skip() {
        return;
    }
    let registry = &shared().expect("checked").0.address;
    let sb = Sandbox::new();
    let task = tb_task(&sb, registry);
    assert!(!Path::new("/usr/local/bin/count-items").exists(), "the host has no count-items before");
    let task = task.to_string_lossy().into_owned();
    let oracle = run(
        &sb,
        &["eval", &task, "--agent", "oracle", "--epochs", "2", "-j", "2", "--run-id", "oracle", "--out", "results"],
    );
    assert_eq!(oracle.code, 0, "{oracle:?}");
    let events = crate::read_jsonl(&sb.path().join("results/oracle/events.jsonl"));
    let found = outcomes(&events);
    assert_eq!(found.len(), 2, "{found:?}");
    // Both epochs ran at once, each wrote /app/trace once: neither saw the other's.
    for outcome in &found {
        assert_eq!(outcome["passed"], true, "{outcome} {oracle:?}");
    }
    let explained: Vec<&str> = of_type(&events, "score").iter().filter_map(|s| s["explanation"].as_str()).collect();
    assert!(explained.iter().all(|e| e.contains("count=3 user=app trace=1")), "{explained:?}");
    // Nothing of the image reached the host.
    assert!(!Path::new("/usr/local/bin/count-items").exists(), "the image's helper landed on the host");
    assert!(!Path::new("/opt/venv").exists() && !Path::new("/opt/fixtures").exists());

    // The scripted agent's wrong count fails: a verdict, not an unscored episode.
    let mock = run(&sb, &["eval", &task, "--model", "mock", "--run-id", "mock", "--out", "results", "--keep-worlds"]);
    // Kept: the episode's private layer holds what it changed in the image, and only that.
    let said = mock.stderr.lines().find_map(|l| l.strip_prefix("worlds kept in ")).expect("the run says where");
    let kept: Vec<PathBuf> = std::fs::read_dir(said).expect("kept").map(|e| e.expect("entry").path()).collect();
    let upper = kept[0].join("work/upper");
    assert_eq!(std::fs::read_to_string(upper.join("app/count.txt")).unwrap_or_default(), "4\n", "{kept:?}");
    assert!(!upper.join("opt/venv").exists(), "the image's own files are not in the episode's layer");
    let _ = std::fs::remove_dir_all(said);
    let events = crate::read_jsonl(&sb.path().join("results/mock/events.jsonl"));
    let found = outcomes(&events);
    assert_eq!(found.len(), 1, "{mock:?}");
    assert_eq!((&found[0]["status"], &found[0]["passed"]), (&"scored".into(), &false.into()), "{mock:?}");
    // The second run of the unchanged task built nothing: every step came from the cache.
    assert!(mock.stderr.contains("image: ready"), "{mock:?}");
    let runs: Vec<&str> = mock.stderr.lines().filter(|l| l.contains(" RUN ")).collect();
    assert_eq!(runs.len(), 3, "{mock:?}");
    assert!(runs.iter().all(|l| l.ends_with(": cached")), "{runs:?}");
}

#[test]
fn a_failing_build_leaves_the_task_unscored_with_its_step_and_output() {
    if skip() {
        return;
    }
    let registry = &shared().expect("checked").0.address;
    let sb = Sandbox::new();
    let dockerfile =
        format!("FROM {registry}/runner-test/base:bookworm\nRUN echo about to fail && exit 7\nWORKDIR /app\n");
    let task = write_task(
        &sb,
        "broken",
        &[
            ("task.toml", "version = \"1.0\"\n"),
            ("instruction.md", "Anything.\n"),
            ("environment/Dockerfile", &dockerfile),
            ("tests/test.sh", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"),
            ("solution/solve.sh", "#!/bin/bash\ntrue\n"),
        ],
    );
    let task = task.to_string_lossy().into_owned();
    let ran = run(&sb, &["eval", &task, "--agent", "oracle", "--run-id", "test", "--out", "results"]);
    assert_eq!(ran.code, 3, "all unscored: {ran:?}");
    let found = outcomes(&sb.events());
    assert_eq!(found.len(), 1, "{ran:?}");
    assert_eq!(found[0]["status"], "unscored", "{}", found[0]);
    assert_eq!(found[0]["cause"], "environment_error", "{}", found[0]);
    let message = found[0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("line 2") && message.contains("about to fail") && message.contains('7'), "{message}");
    // validate --build says the same, and fails.
    let validated = run(&sb, &["validate", "--build", &task]);
    assert_ne!(validated.code, 0, "{validated:?}");
    assert!(validated.stderr.contains("about to fail"), "{validated:?}");
}

/// A `cli` agent in an image: its program comes from the host (`install:`, bound read only
/// at /opt/runner-agent), runs with the image's python as the image's user in its working
/// folder, and reaches the model gateway and nothing else.
#[test]
fn a_cli_agent_runs_inside_the_image_with_its_program_from_the_host() {
    if skip() {
        return;
    }
    let registry = &shared().expect("checked").0.address;
    let sb = Sandbox::new();
    tb_task(&sb, registry);
    sb.write("agent/agent.py", include_str!("../../examples/agents/urllib_cli_agent.py"));
    sb.write("environments/tb.yaml", "kind: shell\nbuild: ../tasks/tb-style/environment\n");
    sb.write(
        "s.yaml",
        "suite: cli-in-image\nenvironment: tb\n\
         agent: {kind: cli, install: agent, command: [python3, /opt/runner-agent/agent.py]}\n\
         limits: {max_steps: 10, time_s: 120}\n\
         tasks:\n  - id: two-step\n    input: Write hello into a.txt, then say done.\n    scorers:\n      - equals: done\n\
         \x20     - file_contains: {path: a.txt, text: hello}\n\
         \x20     - check: 'test \"$(stat -c %U /app/a.txt)\" = app && test -x /opt/venv/bin/python && test ! -w /opt/runner-agent'\n\
         \x20   mock:\n      - tool_calls: [{name: write_file, arguments: {path: a.txt, content: hello}}]\n      - text: done\n",
    );
    let ran = run(&sb, &["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["passed"], true, "{finished:?} {ran:?}");
    assert_eq!(of_type(&events, "model_call").len(), 2, "both calls went through the gateway");
    assert!(!sb.path().join("a.txt").exists() && !sb.path().join("agent/a.txt").exists());
}

/// An environment's image keys are checked when it loads: the file, line and key named.
#[test]
fn image_keys_that_cannot_work_are_refused_at_load_with_their_line() {
    // Inline in a suite, the suite's file and the key's own line are named.
    let sb = Sandbox::new();
    sb.write(
        "inline.yaml",
        "suite: inline\nenvironment:\n  kind: shell\n  image: debian:bookworm\n  build: ./env\ntasks: [{id: a, input: hi, scorers: [{equals: x}]}]\n",
    );
    let run = sb.run(&["validate", "inline.yaml"]);
    assert!(run.code != 0 && run.stderr.contains("inline.yaml:5") && run.stderr.contains("not both"), "{run:?}");
    sb.write(
        "inline.yaml",
        "suite: inline\nenvironment: [shell]\ntasks: [{id: a, input: hi, scorers: [{equals: x}]}]\n",
    );
    let run = sb.run(&["validate", "inline.yaml"]);
    assert!(
        run.code != 0 && run.stderr.contains("inline.yaml:2") && run.stderr.contains("a mapping with `kind:`"),
        "{run:?}"
    );
    sb.write(
        "inline.yaml",
        "suite: inline\nenvironment: {kind: shell, files: {a.txt: hi}}\ntasks: [{id: a, input: hi, scorers: [{file_contains: {path: a.txt, text: hi}}], mock: [{text: x}]}]\n",
    );
    let run = sb.eval(&["inline.yaml"]);
    assert_eq!(run.code, 0, "an inline environment without an image runs on the host: {run:?}");

    let sb = Sandbox::new();
    let suite = "suite: s\nenvironment: img\ntasks: [{id: a, input: hi, scorers: [{equals: x}]}]\n";
    sb.write("s.yaml", suite);
    let cases = [
        ("kind: shell\nimage: debian:bookworm\nbuild: ./env\n", "img.yaml:3", "not both"),
        ("kind: shell\nbuild: ./no-such-folder\n", "img.yaml:2", "no Dockerfile"),
        ("kind: shell\nimage: \"two words\"\n", "img.yaml:2", "not an image reference"),
        ("kind: kv\nimage: debian:bookworm\n", "img.yaml:2", "only the `shell` kind takes `image:`"),
    ];
    for (file, place, why) in cases {
        sb.write("environments/img.yaml", file);
        let run = sb.run(&["validate", "s.yaml"]);
        assert_ne!(run.code, 0, "{file}: {run:?}");
        assert!(run.stderr.contains(place) && run.stderr.contains(why), "{file}: {run:?}");
    }
    // A Harbor task's runner.yaml says where it runs; a reference with a space is refused.
    write_task(
        &sb,
        "t",
        &[
            ("task.toml", "version = \"1.0\"\n"),
            ("instruction.md", "hi\n"),
            ("tests/test.sh", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"),
            ("runner.yaml", "image: \"not a reference\"\n"),
        ],
    );
    let run = sb.run(&["validate", "tasks/t"]);
    assert_ne!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("runner.yaml") && run.stderr.contains("not an image reference"), "{run:?}");
}

/// A world in an image with the network resolves names as the host does (its resolv.conf
/// and hosts bound in, as a container runtime gives them); one without has neither.
#[test]
fn a_world_with_the_network_resolves_names_in_its_image() {
    if skip() {
        return;
    }
    let registry = &shared().expect("checked").0.address;
    let sb = Sandbox::new();
    for (name, network) in [("net", true), ("offline", false)] {
        // The one inline in the suite, as an environment file would say it.
        let inline = format!(
            "{{kind: shell, image: \"{registry}/runner-test/base:bookworm\", sandbox: {{network: {network}}}}}"
        );
        sb.write(
            &format!("{name}.yaml"),
            &format!(
                "suite: {name}\nenvironment: {inline}\ntasks:\n  - id: t\n    input: look\n    scorers:\n      - check: 'getent hosts localhost && cmp /etc/resolv.conf /etc/resolv.conf'\n    mock: [{{text: done}}]\n"
            ),
        );
        let id = format!("r-{name}");
        let ran = run(&sb, &["eval", &format!("{name}.yaml"), "--model", "mock", "--run-id", &id, "--out", "results"]);
        let events = crate::read_jsonl(&sb.path().join(format!("results/{id}/events.jsonl")));
        let found = outcomes(&events);
        assert_eq!(found.len(), 1, "{ran:?}");
        assert_eq!(found[0]["passed"], network, "{name}: {} {ran:?}", found[0]);
    }
}

/// The same task under the `podman` provider (a container per episode, the image built by
/// podman) gives the same verdicts as under runner's own roots: the oracle passes, the
/// wrong scripted agent fails. Skipped, saying why, where podman cannot run a container.
#[test]
fn the_podman_provider_gives_the_same_verdicts_as_runners_own_roots() {
    if skip() {
        return;
    }
    let podman_runs = Command::new("podman")
        .args(["--log-level=error", "--runtime", "runc", "info"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !podman_runs {
        eprintln!("skipped: podman (with runc) is not installed or cannot run here");
        return;
    }
    let registry = &shared().expect("checked").0.address;
    let sb = Sandbox::new();
    let task = tb_task(&sb, registry).to_string_lossy().into_owned();
    let mut verdicts = Vec::new();
    for provider in ["rootfs", "podman"] {
        let mut seen = Vec::new();
        for (agent, id) in [(["--agent", "oracle"], "oracle"), (["--model", "mock"], "mock")] {
            let run_id = format!("{provider}-{id}");
            let args =
                ["eval", &task, agent[0], agent[1], "--provider", provider, "--run-id", &run_id, "--out", "results"];
            let ran = run(&sb, &args);
            let events = crate::read_jsonl(&sb.path().join(format!("results/{run_id}/events.jsonl")));
            let found = outcomes(&events);
            assert_eq!(found.len(), 1, "{provider} {id}: {ran:?}");
            let explained: Vec<String> =
                of_type(&events, "score").iter().filter_map(|s| s["explanation"].as_str().map(str::to_owned)).collect();
            seen.push((found[0]["status"].clone(), found[0]["passed"].clone(), explained));
        }
        verdicts.push(seen);
    }
    assert_eq!(verdicts[0][0].1, true, "the oracle passes: {:?}", verdicts[0]);
    assert_eq!(verdicts[0][1].1, false, "the wrong agent fails: {:?}", verdicts[0]);
    assert_eq!(verdicts[0], verdicts[1], "rootfs and podman disagree");
}
