//! runner beside promptfoo itself: the same configs, run on `echo` by both, give the same
//! verdict on every test, and on every assertion the same pass or fail and the same score.
//!
//! promptfoo's verdicts are recorded in `tests/fixtures/promptfoo-recorded/` (from
//! promptfoo's own `--output` JSON, by `RUNNER_PROMPTFOO_RECORD=1`), so the comparison runs
//! where promptfoo is not installed. With `RUNNER_PROMPTFOO_TEST=1` (and promptfoo from
//! `scripts/install-promptfoo.sh`) promptfoo runs again and must give what was recorded.
//!
//! `differences.yaml` holds what runner does differently on purpose (docs/src/promptfoo.md):
//! there each test's var `runner` says what runner gives where promptfoo fails the test.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::promptfoo::sandbox;
use crate::{Sandbox, of_type, read_jsonl};

const RECORDED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/promptfoo-recorded");

/// The configs both tools run the same way.
const SAME: &[&str] = &["side_by_side", "every_type", "code_types", "scenarios", "two_prompts"];

/// One test under one prompt: its verdict (`pass`, `fail`, `unscored`), its score, and
/// each assertion's pass and score, in the config's order (`defaultTest`'s first; an
/// `assert-set` as its assertions).
#[derive(Debug, Clone, PartialEq)]
struct Verdict {
    test: usize,
    prompt: usize,
    verdict: String,
    score: Option<f64>,
    assertions: Vec<(bool, f64)>,
}

impl Verdict {
    fn to_json(&self) -> Value {
        let assertions: Vec<Value> = self.assertions.iter().map(|(p, s)| json!({"pass": p, "score": s})).collect();
        json!({"test": self.test, "prompt": self.prompt, "verdict": self.verdict, "score": self.score,
               "assertions": assertions})
    }

    fn from_json(v: &Value) -> Verdict {
        let n = |v: &Value| v.as_u64().expect("a count") as usize;
        Verdict {
            test: n(&v["test"]),
            prompt: n(&v["prompt"]),
            verdict: v["verdict"].as_str().expect("a verdict").to_owned(),
            score: v["score"].as_f64(),
            assertions: v["assertions"]
                .as_array()
                .expect("assertions")
                .iter()
                .map(|a| (a["pass"].as_bool().expect("pass"), a["score"].as_f64().expect("score")))
                .collect(),
        }
    }
}

/// runner's verdicts on `config`, from its event log.
fn runner_verdicts(sb: &Sandbox, config: &str) -> Vec<Verdict> {
    let run = sb.run(&["eval", &format!("{config}.yaml"), "--run-id", config, "--out", "results", "-q"]);
    // 1: some test failed; 3: some was unscored (`differences.yaml`).
    assert!([0, 1, 3].contains(&run.code), "{run:?}");
    let events = read_jsonl(&sb.path().join(format!("results/{config}/events.jsonl")));
    let mut verdicts = Vec::new();
    for started in of_type(&events, "episode_started") {
        let id = &started["episode_id"];
        let test = started["task_id"].as_str().and_then(|t| t.strip_prefix("test-")).and_then(|n| n.parse().ok());
        let prompt = match started["variant"].as_str() {
            None => Some(1),
            Some(v) => v.strip_prefix("prompt-").and_then(|n| n.parse::<usize>().ok()),
        };
        let (Some(test), Some(prompt)) = (test, prompt) else { panic!("an episode of a promptfoo test: {started}") };
        let of_episode = |kind| of_type(&events, kind).into_iter().filter(move |e| &e["episode_id"] == id);
        let outcome = &of_episode("episode_finished").next().expect("it finished")["outcome"];
        let verdict = match (outcome["status"].as_str(), outcome["passed"].as_bool()) {
            (Some("scored"), Some(true)) => "pass",
            (Some("scored"), Some(false)) => "fail",
            _ => "unscored",
        };
        // promptfoo reports an assertion of weight 0 passed whatever it found (it does not count).
        let assertions = of_episode("score")
            .map(|s| (s["passed"] == true || s["weight"] == 0.0, s["value"].as_f64().expect("a score")))
            .collect();
        verdicts.push(Verdict {
            test,
            prompt: prompt - 1,
            verdict: verdict.into(),
            score: outcome["score"].as_f64(),
            assertions,
        });
    }
    verdicts.sort_by_key(|v| (v.test, v.prompt));
    verdicts
}

/// promptfoo's verdicts, from the JSON its `--output` writes.
fn promptfoo_verdicts(output: &Value) -> Vec<Verdict> {
    let results = output["results"]["results"].as_array().expect("promptfoo's results");
    let mut verdicts: Vec<Verdict> = results
        .iter()
        .map(|r| {
            let components = r["gradingResult"]["componentResults"].as_array().cloned().unwrap_or_default();
            let assertions = components
                .iter()
                // A set's own result (with its assertions' inside) is followed by theirs.
                .filter(|c| c["assertion"]["type"] != "assert-set" && !c["componentResults"].is_array())
                .map(|c| (c["pass"].as_bool().unwrap_or(false), c["score"].as_f64().unwrap_or(0.0)))
                .collect();
            Verdict {
                test: r["testIdx"].as_u64().expect("testIdx") as usize + 1,
                prompt: r["promptIdx"].as_u64().expect("promptIdx") as usize,
                verdict: if r["success"] == true { "pass" } else { "fail" }.into(),
                score: r["score"].as_f64(),
                assertions,
            }
        })
        .collect();
    verdicts.sort_by_key(|v| (v.test, v.prompt));
    verdicts
}

fn recorded(config: &str) -> Vec<Verdict> {
    let path = Path::new(RECORDED).join(format!("{config}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let value: Value = serde_json::from_str(&text).expect("recorded verdicts");
    value["results"].as_array().expect("results").iter().map(Verdict::from_json).collect()
}

/// `ours` and `theirs` agree: the same tests, verdicts and assertions, scores within 1e-9.
fn assert_same(config: &str, ours: &[Verdict], theirs: &[Verdict]) {
    let key = |v: &Verdict| (v.test, v.prompt);
    assert_eq!(ours.iter().map(key).collect::<Vec<_>>(), theirs.iter().map(key).collect::<Vec<_>>(), "{config}");
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    for (o, t) in ours.iter().zip(theirs) {
        let same = o.verdict == t.verdict
            && o.score.zip(t.score).is_some_and(|(a, b)| close(a, b))
            && o.assertions.len() == t.assertions.len()
            && o.assertions.iter().zip(&t.assertions).all(|(a, b)| a.0 == b.0 && close(a.1, b.1));
        assert!(same, "{config}: test {} prompt {}:\n runner    {o:?}\n promptfoo {t:?}", o.test, o.prompt);
    }
}

#[test]
fn runner_gives_promptfoos_recorded_verdicts() {
    if !crate::have_python() {
        return;
    }
    let sb = sandbox();
    for config in SAME {
        assert_same(config, &runner_verdicts(&sb, config), &recorded(config));
    }
}

#[test]
fn where_runner_differs_on_purpose_it_does_as_documented() {
    if !crate::have_python() {
        return;
    }
    let sb = sandbox();
    let text = std::fs::read_to_string(sb.path().join("differences.yaml")).expect("differences.yaml");
    // Each test's `promptfoo: VERDICT, runner: VERDICT`.
    let documented: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| {
            let theirs = l.split("promptfoo: ").nth(1)?.split(',').next()?;
            let ours = l.split("runner: ").nth(1)?.split('}').next()?;
            Some((theirs, ours))
        })
        .collect();
    let ours = runner_verdicts(&sb, "differences");
    let theirs = recorded("differences");
    assert_eq!(ours.len(), documented.len());
    assert_eq!(theirs.len(), documented.len());
    for ((o, t), (promptfoo, runner)) in ours.iter().zip(&theirs).zip(&documented) {
        assert_eq!(t.verdict, *promptfoo, "promptfoo's verdict on test {}", t.test);
        assert_eq!(o.verdict, *runner, "runner's verdict on test {}", o.test);
        assert_ne!(o.verdict, t.verdict, "test {} is no difference", o.test);
    }
}

/// promptfoo from `scripts/install-promptfoo.sh`, when the environment asks for it.
fn promptfoo() -> Option<PathBuf> {
    if std::env::var_os("RUNNER_PROMPTFOO_TEST").is_none() && std::env::var_os("RUNNER_PROMPTFOO_RECORD").is_none() {
        eprintln!("skipped: set RUNNER_PROMPTFOO_TEST=1 to run promptfoo itself");
        return None;
    }
    let dir = std::env::var_os("RUNNER_PROMPTFOO")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/runner-promptfoo")))?;
    let bin = dir.join("bin/promptfoo");
    assert!(
        bin.is_file(),
        "RUNNER_PROMPTFOO_TEST is set but {} is missing: run scripts/install-promptfoo.sh",
        bin.display()
    );
    Some(bin)
}

fn run_promptfoo(bin: &Path, sb: &Sandbox, config: &str) -> Value {
    let out = sb.path().join(format!("{config}.promptfoo.json"));
    let run = std::process::Command::new(bin)
        .current_dir(sb.path())
        .args(["eval", "-c", &format!("{config}.yaml"), "--no-cache", "--no-table", "--no-write", "--output"])
        .arg(&out)
        .env("PROMPTFOO_CONFIG_DIR", sb.path().join(".promptfoo"))
        .output()
        .expect("run promptfoo");
    let run = crate::Run::from(run);
    // 100: some test failed, as several do on purpose.
    assert!(run.code == 0 || run.code == 100, "promptfoo on {config}: {run:?}");
    serde_json::from_str(&std::fs::read_to_string(&out).expect("promptfoo's output")).expect("promptfoo's JSON")
}

#[test]
fn promptfoo_itself_still_gives_the_recorded_verdicts() {
    let Some(bin) = promptfoo() else { return };
    let sb = sandbox();
    let record = std::env::var_os("RUNNER_PROMPTFOO_RECORD").is_some();
    for config in SAME.iter().chain(&["differences"]) {
        let theirs = promptfoo_verdicts(&run_promptfoo(&bin, &sb, config));
        if record {
            let results: Vec<Value> = theirs.iter().map(Verdict::to_json).collect();
            let version = std::process::Command::new(&bin).arg("--version").output().expect("promptfoo --version");
            let file = json!({
                "promptfoo": String::from_utf8_lossy(&version.stdout).trim(),
                "config": format!("tests/fixtures/promptfoo/{config}.yaml"),
                "results": results,
            });
            let text = serde_json::to_string_pretty(&file).expect("JSON") + "\n";
            std::fs::write(Path::new(RECORDED).join(format!("{config}.json")), text).expect("write the record");
        }
        let recorded = recorded(config);
        assert_eq!(theirs, recorded, "{config}: promptfoo now gives other verdicts than the recorded ones");
    }
}
