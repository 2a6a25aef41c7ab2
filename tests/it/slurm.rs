//! Shards on a real Slurm cluster: `examples/slurm/` submitted to a one-node cluster on this
//! machine (`scripts/slurm-cluster.sh`: munged, slurmctld and slurmd on localhost), merged by
//! the dependent job, and compared with an unsharded run. Opt-in with `RUNNER_SLURM_TEST=1`
//! (`.ci/run` sets it): it starts daemons as root and needs Debian's slurm-wlm and munge.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::shards::differences;
use crate::{of_type, read_jsonl};

const OPT_IN: &str = "RUNNER_SLURM_TEST";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A one-node cluster under `dir`, stopped when dropped — also when a test fails.
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
}

impl Cluster {
    fn start(dir: PathBuf) -> Cluster {
        let port = free_port_pair();
        let out = Command::new("bash")
            .arg(repo().join("scripts/slurm-cluster.sh"))
            .arg("start")
            .arg(&dir)
            .env("SLURM_CLUSTER_PORT", port.to_string())
            .output()
            .expect("run scripts/slurm-cluster.sh");
        assert!(
            out.status.success(),
            "the cluster did not start ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Cluster { conf: dir.join("slurm.conf"), dir }
    }

    /// A Slurm client command against this cluster.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", &self.conf).current_dir(repo());
        cmd
    }

    /// The states of a job's tasks (one for a plain job), as `scontrol` has them.
    fn states(&self, job: &str) -> Vec<String> {
        let out = self.command("scontrol").args(["show", "job", job, "-o"]).output().expect("run scontrol");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("JobState=")).map(String::from))
            .collect()
    }

    /// Waits until every task of `job` has ended; returns their states.
    fn wait(&self, job: &str, limit: Duration) -> Vec<String> {
        let started = Instant::now();
        loop {
            let states = self.states(job);
            let running = ["PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"];
            if !states.is_empty() && states.iter().all(|s| !running.contains(&s.as_str())) {
                return states;
            }
            assert!(started.elapsed() < limit, "job {job} still {states:?} after {limit:?}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The end of the daemons' logs, for a failure's message.
    fn logs(&self) -> String {
        ["slurmctld", "slurmd"]
            .iter()
            .map(|d| {
                let text = std::fs::read_to_string(self.dir.join(format!("log/{d}.log"))).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                format!("--- {d}.log\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let stopped =
            Command::new("bash").arg(repo().join("scripts/slurm-cluster.sh")).arg("stop").arg(&self.dir).status();
        if !matches!(stopped, Ok(s) if s.success()) {
            eprintln!("the cluster under {} did not stop: {stopped:?}", self.dir.display());
        }
    }
}

/// A port for slurmctld whose next one (slurmd's) is free too.
fn free_port_pair() -> u16 {
    for _ in 0..50 {
        let Ok(first) = std::net::TcpListener::bind("0.0.0.0:0") else { continue };
        let Ok(port) = first.local_addr().map(|a| a.port()) else { continue };
        if port < u16::MAX && std::net::TcpListener::bind(("0.0.0.0", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two free ports in a row for slurmctld and slurmd");
}

/// The jobs' own output, for a failure's message.
fn job_outputs(dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else { return format!("(no {})", dir.display()) };
    entries
        .flatten()
        .map(|e| format!("--- {}\n{}", e.path().display(), std::fs::read_to_string(e.path()).unwrap_or_default()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// When a run's log says it started and finished.
fn span(run: &Path) -> (DateTime<Utc>, DateTime<Utc>) {
    let events = read_jsonl(&run.join("events.jsonl"));
    let at = |e: &serde_json::Value| {
        let ts = e["ts"].as_str().unwrap_or_default();
        DateTime::parse_from_rfc3339(ts).map(|t| t.with_timezone(&Utc)).unwrap_or_else(|e| panic!("ts {ts}: {e}"))
    };
    (at(&events[0]), at(&events[events.len() - 1]))
}

/// The time covered by at least one of `spans`.
fn covered(mut spans: Vec<(DateTime<Utc>, DateTime<Utc>)>) -> Duration {
    spans.sort();
    let mut total = chrono::Duration::zero();
    let mut current: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
    for (from, to) in spans {
        current = match current {
            Some((a, b)) if from <= b => Some((a, b.max(to))),
            Some((a, b)) => {
                total += b - a;
                Some((from, to))
            }
            None => Some((from, to)),
        };
    }
    if let Some((a, b)) = current {
        total += b - a;
    }
    total.to_std().unwrap_or_default()
}

/// The example suites, as the shell's `tasks/*.yaml` names them.
fn example_suites() -> Vec<String> {
    let mut suites: Vec<String> = std::fs::read_dir(repo().join("tasks"))
        .expect("tasks/")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.ends_with(".yaml"))
        .map(|name| format!("tasks/{name}"))
        .collect();
    suites.sort();
    suites
}

#[test]
fn an_array_of_shards_merges_into_the_unsharded_run() {
    if std::env::var_os(OPT_IN).is_none() {
        eprintln!(
            "skipped: set {OPT_IN}=1 to start a one-node Slurm cluster (as root, with slurm-wlm and munge) and run examples/slurm/ on it"
        );
        return;
    }
    let runner = env!("CARGO_BIN_EXE_runner");
    let tmp = tempfile::tempdir().expect("temp dir");
    let results = tmp.path().join("results");

    // The same suites in one process, to compare with.
    let started = Instant::now();
    let whole = Command::new(runner)
        .current_dir(repo())
        .arg("eval")
        .args(example_suites())
        .args(["--model", "mock", "--run-id", "whole", "-q", "--out"])
        .arg(&results)
        .output()
        .expect("run runner");
    let whole_s = started.elapsed();
    assert!(
        whole.status.success(),
        "the unsharded run: {}\n{}",
        String::from_utf8_lossy(&whole.stderr),
        String::from_utf8_lossy(&whole.stdout)
    );

    let cluster = Cluster::start(tmp.path().join("cluster"));
    let submitted = Instant::now();
    let submitted_at = Utc::now();
    let submit = cluster
        .command("bash")
        .arg(repo().join("examples/slurm/submit.sh"))
        .env("RUN_NAME", "nightly")
        .env("SHARDS", "4")
        .env("OUT", &results)
        .env("SUITES", "tasks/*.yaml")
        .env("RUNNER", runner)
        .output()
        .expect("run examples/slurm/submit.sh");
    let said = String::from_utf8_lossy(&submit.stdout).into_owned();
    assert!(submit.status.success(), "submit.sh: {said}\n{}", String::from_utf8_lossy(&submit.stderr));
    let job = |name: &str| {
        said.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .map(String::from)
            .unwrap_or_else(|| panic!("{said}"))
    };
    let (array, merge) = (job("array"), job("merge"));
    let merge_state = cluster.wait(&merge, Duration::from_secs(300));
    let round_trip = submitted.elapsed();
    let merged_at = Utc::now();
    let nightly = results.join("nightly");
    let outputs = || job_outputs(&nightly.join("slurm"));
    assert_eq!(merge_state, ["COMPLETED"], "the merge job\n{}\n{}", outputs(), cluster.logs());
    assert_eq!(cluster.states(&array), ["COMPLETED"; 4], "the array's four tasks\n{}", outputs());

    // The merged run is the unsharded one, timings apart.
    let merged = nightly.join("merged");
    let whole = results.join("whole");
    assert_eq!(differences(&whole, &merged), None, "the unsharded run, then the merged one");
    for file in ["junit.xml", "summary.md", "merged/report.html"] {
        assert!(nightly.join(file).is_file(), "the merge job wrote no {file}\n{}", outputs());
    }

    // The overhead: the round trip less the time some shard was running its episodes
    // (from its log's first event to its last), in three parts: until the first shard
    // started, the gaps between shards, and from the last shard's end to the merged run.
    let shards: Vec<PathBuf> = (0..4).map(|i| nightly.join(format!("shard-{i}"))).collect();
    let spans: Vec<_> = shards.iter().map(|s| span(s)).collect();
    let busy = covered(spans.clone());
    let first = spans.iter().map(|s| s.0).min().unwrap_or(submitted_at);
    let last = spans.iter().map(|s| s.1).max().unwrap_or(merged_at);
    let seconds = |d: chrono::Duration| d.to_std().unwrap_or_default().as_secs_f64();
    eprintln!(
        "slurm round trip: {:.2} s from sbatch to the merged run; shards running {:.2} s; overhead {:.2} s \
         ({:.2} s until the first shard ran, {:.2} s between shards, {:.2} s from the last to the merged run); \
         the unsharded run: {:.2} s",
        round_trip.as_secs_f64(),
        busy.as_secs_f64(),
        round_trip.saturating_sub(busy).as_secs_f64(),
        seconds(first - submitted_at),
        seconds(last - first) - busy.as_secs_f64(),
        seconds(merged_at - last),
        whole_s.as_secs_f64()
    );

    // A shard that lost its node half-way: its log ends mid-run, its folder (the memory a
    // task's epochs keep) stays on the shared disk. Merged with what there is, then resumed
    // on the cluster, only the episodes that are not scored run again.
    let holed = results.join("holed");
    for (i, shard) in shards.iter().enumerate() {
        let to = holed.join(format!("shard-{i}"));
        crate::bad_input::copy_tree(shard, &to).expect("copy a shard folder");
        let log = std::fs::read_to_string(shard.join("events.jsonl")).expect("a shard's log");
        let lines: Vec<&str> = log.lines().collect();
        let kept = if i == 2 { &lines[..lines.len() / 2] } else { &lines[..] };
        std::fs::write(to.join("events.jsonl"), format!("{}\n", kept.join("\n"))).expect("write a shard's log");
    }
    let cut = read_jsonl(&holed.join("shard-2/events.jsonl"));
    let scored: std::collections::BTreeSet<String> =
        of_type(&cut, "episode_finished").iter().filter_map(|e| e["episode_id"].as_str().map(String::from)).collect();
    let lost: std::collections::BTreeSet<String> =
        of_type(&read_jsonl(&shards[2].join("events.jsonl")), "episode_finished")
            .iter()
            .filter_map(|e| e["episode_id"].as_str().map(String::from))
            .filter(|id| !scored.contains(id))
            .collect();
    assert!(!lost.is_empty(), "half of shard 3's log holds every episode");
    let partial = Command::new(runner)
        .arg("merge")
        .args((0..4).map(|i| holed.join(format!("shard-{i}"))))
        .args(["--allow-partial", "--run-id", "merged", "--out"])
        .arg(&holed)
        .output()
        .expect("run runner merge");
    assert!(partial.status.success(), "merge --allow-partial: {}", String::from_utf8_lossy(&partial.stderr));
    let resume_log = tmp.path().join("resume.out");
    let resume = cluster
        .command("sbatch")
        .arg("--wait")
        .arg(format!("--output={}", resume_log.display()))
        .arg(format!("--wrap={runner} eval tasks/*.yaml --model mock --resume {} -q", holed.join("merged").display()))
        .output()
        .expect("run sbatch");
    let said = std::fs::read_to_string(&resume_log).unwrap_or_default();
    assert!(resume.status.success(), "the resume job: {said}\n{}", String::from_utf8_lossy(&resume.stderr));
    assert!(said.contains(&format!("{} to run", lost.len())), "{said}");
    let log = read_jsonl(&holed.join("merged/events.jsonl"));
    let rerun: std::collections::BTreeSet<String> = log
        .iter()
        .skip_while(|e| e["type"] != "run_resumed")
        .filter(|e| e["type"] == "episode_started")
        .filter_map(|e| e["episode_id"].as_str().map(String::from))
        .collect();
    assert_eq!(rerun, lost, "only what shard 3 had not scored ran again");
    assert_eq!(differences(&whole, &holed.join("merged")), None, "the unsharded run, then the resumed one");
}
