//! The Kubernetes example, checked as far as a machine without a cluster allows: every
//! object of `examples/kubernetes/indexed-job.yaml` read by the Kubernetes API's own types
//! (`k8s-openapi`) with nothing left over, the Indexed Job's shape, and each index's command
//! run here with the environment the Job controller gives its pod, then the merge Job's,
//! merging to the verdict of an unsharded run. No cluster ran it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Container};
use serde_json::Value;

use crate::shards::differences;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The manifest's objects, each as JSON.
fn objects() -> Vec<Value> {
    let path = repo().join("examples/kubernetes/indexed-job.yaml");
    let text = std::fs::read_to_string(&path).expect("read the manifest");
    text.split("\n---\n")
        .map(|doc| runner::config::yaml::parse(doc).unwrap_or_else(|e| panic!("{}: {e:?}", path.display())).0)
        .collect()
}

/// Where `read` lost or changed a field of `written` (what the types do not know), as paths.
fn lost(written: &Value, read: &Value, at: &str, out: &mut Vec<String>) {
    match (written, read) {
        (Value::Object(w), Value::Object(r)) => {
            for (key, value) in w {
                let path = format!("{at}.{key}");
                match r.get(key) {
                    Some(back) => lost(value, back, &path, out),
                    None => out.push(path),
                }
            }
        }
        (Value::Array(w), Value::Array(r)) if w.len() == r.len() => {
            for (i, (a, b)) in w.iter().zip(r).enumerate() {
                lost(a, b, &format!("{at}[{i}]"), out);
            }
        }
        (w, r) if w != r => out.push(format!("{at}: {w} read as {r}")),
        _ => {}
    }
}

/// `value` read as `T` and written back, with nothing lost: a key the API does not know, a
/// misspelt one or a value of the wrong type fails.
fn strictly<T: serde::de::DeserializeOwned + serde::Serialize>(value: &Value) -> T {
    let typed: T = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{e}: {value:#}"));
    let mut missing = Vec::new();
    lost(value, &serde_json::to_value(&typed).expect("serialise"), "", &mut missing);
    assert!(missing.is_empty(), "not in the Kubernetes API's types: {missing:?}");
    typed
}

/// The pod's container as the controller runs it here: its command and arguments, with the
/// results volume's mount path and the working folder mapped to local folders.
fn run_container(container: &Container, env: &BTreeMap<String, String>, (results, bin): (&Path, &Path)) -> i32 {
    let mount = container.volume_mounts.as_ref().and_then(|m| m.first()).expect("a results volume");
    let local = |text: &str| text.replace(&mount.mount_path, &results.display().to_string());
    let mut argv: Vec<String> = container.command.clone().unwrap_or_default();
    argv.extend(container.args.clone().unwrap_or_default().iter().map(|a| local(a)));
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let status = Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(repo())
        .env_clear()
        .envs(env)
        .env("PATH", path)
        // The container's runtime sets HOME; the MCP servers of the example suites are found under it.
        .env("HOME", std::env::var("HOME").unwrap_or_default())
        .status()
        .expect("run the container's command");
    status.code().expect("an exit code")
}

#[test]
fn the_indexed_job_reads_as_the_api_types_and_its_indexes_merge_to_the_unsharded_verdict() {
    let objects = objects();
    let config: ConfigMap = strictly(&objects[0]);
    let shards: Job = strictly(&objects[1]);
    let merge: Job = strictly(&objects[2]);
    let data = config.data.clone().expect("the ConfigMap's data");
    let n: i32 = data["SHARDS"].parse().expect("SHARDS is a number");

    // An Indexed Job of one pod per shard, each retried on its own.
    let spec = shards.spec.as_ref().expect("the Job's spec");
    assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
    assert_eq!((spec.completions, spec.parallelism), (Some(n), Some(n)));
    assert!(spec.backoff_limit_per_index.is_some_and(|b| b > 0), "a shard's pod is retried on its own");
    let pod = spec.template.spec.as_ref().expect("the pod's spec");
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"), "backoffLimitPerIndex needs restartPolicy Never");
    let container = &pod.containers[0];
    let script = container.args.as_ref().map(|a| a.join("\n")).unwrap_or_default();
    assert!(script.contains("--shard \"auto/$SHARDS\""), "the shard comes from JOB_COMPLETION_INDEX: {script}");

    // Each index's command, with the environment its pod gets: the ConfigMap (`envFrom`,
    // its model made `mock`, as a user's own ConfigMap would say) and JOB_COMPLETION_INDEX.
    let tmp = tempfile::tempdir().expect("temp dir");
    let (results, bin) = (tmp.path().join("results"), tmp.path().join("bin"));
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_runner"), bin.join("runner")).unwrap();
    let mut env: BTreeMap<String, String> = data.into_iter().collect();
    env.insert("MODEL".into(), "mock".into());
    env.insert("RUN_NAME".into(), "k8s".into());
    for index in 0..n {
        let mut pod_env = env.clone();
        pod_env.insert("JOB_COMPLETION_INDEX".into(), index.to_string());
        assert_eq!(run_container(container, &pod_env, (&results, &bin)), 0, "index {index}");
    }
    let merge_pod = merge.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("the merge's pod");
    let merged_code = run_container(&merge_pod.containers[0], &env, (&results, &bin));

    // The same suites in one process, judged by the merge's gate.
    let whole = Command::new(env!("CARGO_BIN_EXE_runner"))
        .current_dir(repo())
        .args(["eval", "tasks/", "--model", "mock", "--max-unscored", "0.05", "-q", "--run-id", "whole", "--out"])
        .arg(&results)
        .output()
        .expect("run runner");
    assert_eq!(merged_code, whole.status.code().expect("an exit code"), "the merged verdict is the unsharded one");
    let merged: PathBuf = results.join("k8s/merged");
    assert_eq!(differences(&results.join("whole"), &merged), None);
    assert!(results.join("k8s/junit.xml").is_file(), "the merge Job's JUnit file");
}
