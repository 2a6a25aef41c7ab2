//! `runner view` in a real browser: Debian's chromium driven by playwright-core
//! (`scripts/install-test-servers.sh` installs it, `.ci/run` calls that) over runs made
//! here with known flips. The page's numbers are checked against `runner compare`'s and
//! `runner judge-check`'s, and against what the test computes itself. Screenshots of each
//! view are kept in `$CARGO_TARGET_TMPDIR/view-screenshots/`.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use crate::{Sandbox, of_type, read_jsonl};

/// The deterministic tasks: `mock` passes t01–t10, `echo` (which answers with the input)
/// passes t09–t12, so t01–t08 flip pass→fail and t11, t12 fail→pass.
const TASKS: u32 = 12;
const MOCK_PASSES: std::ops::RangeInclusive<u32> = 1..=10;
const ECHO_PASSES: std::ops::RangeInclusive<u32> = 9..=12;
/// Graded tasks: an informational `llm_rubric` judged by the `mock` grader (pass on g01–g06),
/// so `echo` runs leave them unscored: scored→unscored.
const GRADED: u32 = 10;
const JUDGE_PASSES: u32 = 6;

/// The suite; `alt` makes t01 take one more turn (a `get`) before answering.
fn suite(alt: bool) -> String {
    let mut s = String::from(
        "suite: cmp\nenvironment: kv\ngrader: {model: mock}\nepochs: 2\nscorers:\n  - includes: \"{{ target }}\"\ntasks:\n",
    );
    for i in 1..=TASKS {
        let target = format!("alpha{i:02}");
        let input = if ECHO_PASSES.contains(&i) { format!("Repeat {target}.") } else { "Say the word.".into() };
        s += &format!("  - id: t{i:02}\n    input: {input}\n    target: {target}\n    mock:\n");
        if MOCK_PASSES.contains(&i) {
            s += &format!("      - tool_calls: [{{name: kv_set, arguments: {{key: k, value: {target}}}}}]\n");
            if alt && i == 1 {
                s += "      - tool_calls: [{name: kv_get, arguments: {key: k}}]\n";
            }
            s += &format!("      - text: {target}\n");
        } else {
            s += "      - text: wrong\n";
        }
    }
    for j in 1..=GRADED {
        let verdict = u32::from(j <= JUDGE_PASSES);
        s += &format!(
            "  - id: g{j:02}\n    input: Say gamma{j:02}.\n    target: gamma{j:02}\n    scorers:\n      - llm_rubric: The answer names the word.\n        weight: 0\n        mock: [\"Reason {j}.\\n{{\\\"score\\\": {verdict}}}\"]\n    mock:\n      - text: gamma{j:02}\n"
        );
    }
    s
}

/// A suite that runs slowly enough to be watched: each model call waits.
const LIVE: &str = "suite: slow\nenvironment: kv\nscorers: [{equals: ok}]\ntasks:\n  - {id: a, input: x, mock: [{text: ok}]}\n  - {id: b, input: x, mock: [{text: ok}]}\n  - {id: c, input: x, mock: [{text: ok}]}\n  - {id: d, input: x, mock: [{text: no}]}\n  - {id: e, input: x, mock: [{text: ok}]}\n  - {id: f, input: x, mock: [{text: ok}]}\n";
const LIVE_EPISODES: u64 = 6;

/// The `runner view` process, stopped when dropped.
struct Viewer {
    child: Child,
    url: String,
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_viewer(sb: &Sandbox) -> Viewer {
    let mut child = sb
        .command()
        .args(["view", "results", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start runner view");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped stdout");
    std::io::BufReader::new(stdout).read_line(&mut line).expect("read the viewer's address");
    let url = line.split_whitespace().nth(1).unwrap_or_else(|| panic!("no address in {line:?}")).to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{line}");
    Viewer { child, url }
}

fn playwright() -> PathBuf {
    let servers = match std::env::var_os("RUNNER_TEST_SERVERS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/runner-test-servers"),
    };
    let modules = servers.join("playwright/node_modules");
    assert!(
        modules.join("playwright-core/package.json").is_file(),
        "the viewer's test needs playwright-core: run scripts/install-test-servers.sh (no {})",
        modules.display()
    );
    modules
}

fn chromium() -> String {
    std::env::var("RUNNER_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

fn shots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("view-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshots folder");
    dir
}

/// One step of `drive.js` against the viewer; what the page showed.
fn drive(viewer: &Viewer, step: &str, args: Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/view/drive.js");
    let out = Command::new("node")
        .args([script, step, &args.to_string()])
        .env("NODE_PATH", playwright())
        .env("VIEW_URL", &viewer.url)
        .env("SHOTS", shots())
        .env("CHROMIUM", chromium())
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "drive.js {step} failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let shown: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("drive.js {step} printed no JSON ({e}): {stdout}"));
    assert_eq!(shown["errors"], json!([]), "the page threw in {step}");
    shown
}

fn eval(sb: &Sandbox, suite: &str, model: &str, run_id: &str) {
    let run = sb.run(&["eval", suite, "--model", model, "--run-id", run_id, "--out", "results"]);
    assert!(run.code == 0 || run.code == 1 || run.code == 3, "{run:?}");
}

/// The episodes of a run by id: (task id, epoch, outcome status, cause).
fn outcomes(sb: &Sandbox, run: &str) -> Vec<(String, String, String)> {
    let events = read_jsonl(&sb.path().join(format!("results/{run}/events.jsonl")));
    let tasks: std::collections::HashMap<String, String> = of_type(&events, "episode_started")
        .iter()
        .map(|e| (e["episode_id"].as_str().unwrap().to_owned(), e["task_id"].as_str().unwrap().to_owned()))
        .collect();
    of_type(&events, "episode_finished")
        .iter()
        .map(|e| {
            let id = e["episode_id"].as_str().unwrap().to_owned();
            let o = &e["outcome"];
            let status = match (o["status"].as_str(), o["passed"].as_bool()) {
                (Some("scored"), Some(true)) => "passed",
                (Some("scored"), Some(false)) => "failed",
                (Some(other), _) => other,
                _ => "?",
            };
            (id.clone(), format!("{}:{status}:{}", tasks[&id], o["cause"].as_str().unwrap_or("")), status.to_owned())
        })
        .collect()
}

fn ids_with(outcomes: &[(String, String, String)], keep: impl Fn(&str, &str) -> bool) -> Vec<String> {
    let mut ids: Vec<String> =
        outcomes.iter().filter(|(_, desc, status)| keep(desc, status)).map(|(id, _, _)| id.clone()).collect();
    ids.sort();
    ids
}

fn sorted(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v.as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_owned()).collect();
    out.sort();
    out
}

/// Cohen's kappa of two raters' pass/fail verdicts, computed here from its definition.
fn kappa(pairs: &[(bool, bool)]) -> f64 {
    let n = pairs.len() as f64;
    let agree = pairs.iter().filter(|(a, b)| a == b).count() as f64 / n;
    let a_pass = pairs.iter().filter(|(a, _)| *a).count() as f64 / n;
    let b_pass = pairs.iter().filter(|(_, b)| *b).count() as f64 / n;
    let chance = a_pass * b_pass + (1.0 - a_pass) * (1.0 - b_pass);
    (agree - chance) / (1.0 - chance)
}

#[test]
fn the_viewer_compares_runs_labels_episodes_and_follows_a_live_run_in_chromium() {
    let sb = Sandbox::new();
    sb.write("cmp.yaml", &suite(false));
    sb.write("alt/cmp.yaml", &suite(true));
    eval(&sb, "cmp.yaml", "mock", "base");
    eval(&sb, "cmp.yaml", "echo", "echo");
    eval(&sb, "alt/cmp.yaml", "mock", "alt");
    let viewer = start_viewer(&sb);

    // The runs, newest first.
    let runs = drive(&viewer, "runs", json!({}));
    let mut by_start: Vec<(String, String)> = ["base", "echo", "alt"]
        .iter()
        .map(|r| {
            let first = &read_jsonl(&sb.path().join(format!("results/{r}/events.jsonl")))[0];
            (first["ts"].as_str().unwrap().to_owned(), r.to_string())
        })
        .collect();
    by_start.sort_by(|a, b| b.cmp(a));
    let newest_first: Vec<&str> = by_start.iter().map(|(_, r)| r.as_str()).collect();
    assert_eq!(runs["keys"], json!(newest_first));
    assert!(runs["width"].as_u64().unwrap() <= 1280, "the runs page is wider than the screen: {runs}");

    // The echo run: the mock grader's warning on top, and the filters' rows.
    let echo_warning = of_type(&read_jsonl(&sb.path().join("results/echo/events.jsonl")), "run_started")[0]["warnings"]
        [0]
    .as_str()
    .expect("the echo run warns of its mock grader")
    .to_owned();
    assert!(echo_warning.contains("`mock` grader"), "{echo_warning}");
    let filters =
        json!([["status", "unscored"], ["status", "failed"], ["status", "passed"], ["cause", "grader_error"]]);
    let run = drive(&viewer, "run", json!({"key": "echo", "filters": filters}));
    assert_eq!(run["warnings"].as_array().unwrap().len(), 1, "{run}");
    assert!(run["warnings"][0].as_str().unwrap().contains(&echo_warning), "{run}");
    assert!(run["width"].as_u64().unwrap() <= 1280, "the run page is wider than the screen: {run}");
    // What the terminal prints under its summary is on the page too.
    let summary = sb.run(&["report", "results/echo"]);
    let said = summary
        .stdout
        .lines()
        .find(|l| l.starts_with("unscored episodes are not failures"))
        .expect("the summary says it");
    assert!(run["notes"].as_array().unwrap().iter().any(|n| n == said), "{said} not in {run}");
    let echo = outcomes(&sb, "echo");
    for status in ["unscored", "failed", "passed"] {
        assert_eq!(
            sorted(&run["filtered"][format!("status={status}")]),
            ids_with(&echo, |_, s| s == status),
            "{status}"
        );
    }
    let graded = ids_with(&echo, |desc, _| desc.contains(":grader_error"));
    assert_eq!(graded.len() as u32, GRADED * 2, "every graded episode of echo is unscored: {echo:?}");
    assert_eq!(sorted(&run["filtered"]["cause=grader_error"]), graded);

    check_compare(&sb, &viewer);

    // t01 of `alt` makes the same first call as `base`'s, then another: it diverges at turn 2.
    let align = drive(&viewer, "align", json!({"runs": ["base", "alt"], "suite": "cmp", "task": "t01"}));
    assert_eq!(align["first"], "2", "{align}");
    assert_eq!(align["marked"], json!(["first divergence"]));
    assert!(align["rows"][0].as_str().unwrap().contains("same"), "{align}");

    check_labels(&sb, &viewer);
    check_live(&sb, &viewer);
}

/// The comparison page against `runner compare --csv`, and the flips the runs were made to have.
fn check_compare(sb: &Sandbox, viewer: &Viewer) {
    let cli = sb.run(&["compare", "results/base", "results/echo", "--csv", "cmp.csv"]);
    assert_eq!(cli.code, 0, "{cli:?}");
    let mut pairs = csv::Reader::from_path(sb.path().join("cmp.pairs.csv")).expect("pairs.csv");
    let headers = pairs.headers().unwrap().clone();
    let row = pairs.records().next().expect("one pair").unwrap();
    let field = |name: &str| row[headers.iter().position(|h| h == name).unwrap()].to_owned();
    let page = drive(viewer, "compare", json!({"runs": ["base", "echo"]}));
    let shown = &page["pairs"][0];
    let same = |page: &Value, csv: String| {
        let (a, b): (f64, f64) = (page.as_str().unwrap().parse().unwrap(), csv.parse().unwrap());
        assert!((a - b).abs() < 1e-12, "page {a}, runner compare {b}");
    };
    same(&shown["mcnemar_p"], field("mcnemar_p"));
    same(&shown["low"], field("score_diff_low"));
    same(&shown["high"], field("score_diff_high"));
    same(&shown["bootstrap_p"], field("bootstrap_p"));
    // 8 pass→fail and 2 fail→pass: the exact two-sided McNemar p is 2·P(X ≤ 2 | n=10) = 112/1024.
    assert!((field("mcnemar_p").parse::<f64>().unwrap() - 112.0 / 1024.0).abs() < 1e-12);
    let names = |range: std::ops::RangeInclusive<u32>| range.map(|i| format!("cmp/t{i:02}")).collect::<Vec<_>>();
    assert_eq!(sorted(&page["flips"]["regressed"]), names(1..=8));
    assert_eq!(sorted(&page["flips"]["improved"]), names(11..=12));
    assert!(page["warnings"][0].as_str().unwrap().starts_with("Warning. echo: the answers of echo"), "{page}");
    let only = |filter: &str| -> Vec<(String, String)> {
        page["only"][filter]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r[0].as_str().unwrap().to_owned(), r[1].as_str().unwrap_or_default().to_owned()))
            .collect()
    };
    let mut flips: Vec<(String, String)> = names(1..=8).into_iter().map(|t| (t, "pass→fail".into())).collect();
    flips.extend(names(11..=12).into_iter().map(|t| (t, "fail→pass".into())));
    flips.extend((1..=GRADED).map(|j| (format!("cmp/g{j:02}"), "scored→unscored".into())));
    flips.sort();
    assert_eq!(only("flips"), flips);
    let unscored: Vec<String> = only("unscored").into_iter().map(|(t, _)| t).collect();
    assert_eq!(unscored, (1..=GRADED).map(|j| format!("cmp/g{j:02}")).collect::<Vec<_>>());
    // Failed somewhere: t01–t08 in echo, t11–t12 in base.
    let failures: Vec<String> = only("failures").into_iter().map(|(t, _)| t).collect();
    assert_eq!(failures, [names(1..=8), names(11..=12)].concat());
}

/// 20 verdicts and one episode label clicked in the page land in labels.jsonl, and
/// `judge-check RUN` (no --labels) gives the kappa computed here.
fn check_labels(sb: &Sandbox, viewer: &Viewer) {
    let events = read_jsonl(&sb.path().join("results/base/events.jsonl"));
    let mut judged: Vec<(String, String, bool)> = of_type(&events, "score")
        .iter()
        .filter(|s| !s["grader"].is_null())
        .map(|s| {
            (
                s["episode_id"].as_str().unwrap().to_owned(),
                s["scorer"].as_str().unwrap().to_owned(),
                s["passed"].as_bool().unwrap(),
            )
        })
        .collect();
    judged.sort();
    assert_eq!(judged.len() as u32, GRADED * 2, "{judged:?}");
    assert_eq!(judged.iter().filter(|j| j.2).count() as u32, JUDGE_PASSES * 2);
    // People agree with the judge but on four episodes.
    let disagree = [0, 3, 7, 12];
    let mut clicks = Vec::new();
    let mut pairs = Vec::new();
    for (k, (id, scorer, judge)) in judged.iter().enumerate() {
        let person = if disagree.contains(&k) { !judge } else { *judge };
        pairs.push((person, *judge));
        let mut click = json!({"episode_id": id, "scorer": scorer, "verdict": if person { "pass" } else { "fail" }});
        if k == 0 {
            click["score"] = json!(0.7);
            click["comment"] = json!("too terse");
        }
        clicks.push(click);
    }
    clicks.push(json!({"episode_id": judged[1].0, "verdict": "pass"}));
    let shown = drive(viewer, "labels", json!({"key": "base", "rater": "ana", "clicks": clicks}));
    assert_eq!(shown["saved"], 21);
    let labels = read_jsonl(&sb.path().join("results/base/labels.jsonl"));
    assert_eq!(labels.len(), 21);
    assert_eq!(labels[0]["score"], 0.7);
    assert_eq!(labels[0]["explanation"], "too terse");
    assert!(labels.iter().all(|l| l["rater"] == "ana" && l["ts"].is_string()), "{labels:?}");
    assert_eq!(labels[20]["scorer"], "episode");
    let check = sb.run(&["judge-check", "results/base", "--json"]);
    assert_eq!(check.code, 0, "{check:?}");
    let check: Value = serde_json::from_str(&check.stdout).unwrap();
    assert_eq!(check["episode_labels"], 1);
    let scorer = &check["scorers"][0];
    assert_eq!(
        scorer["confusion"]["both_pass"].as_u64().unwrap() + scorer["confusion"]["both_fail"].as_u64().unwrap(),
        16
    );
    let expected = kappa(&pairs);
    assert!((scorer["kappa"].as_f64().unwrap() - expected).abs() < 1e-12, "kappa {} != {expected}", scorer["kappa"]);
}

/// A run being written: its episodes appear in the open page while it runs.
fn check_live(sb: &Sandbox, viewer: &Viewer) {
    sb.write("slow.yaml", LIVE);
    let mut run = sb
        .command()
        .args(["eval", "slow.yaml", "--model", "mock", "--mock-delay-ms", "1500", "-j", "1", "--run-id", "live"])
        .args(["--out", "results", "-q"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the live run");
    let log = sb.path().join("results/live/events.jsonl");
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains("run_started")) {
        assert!(started.elapsed().as_secs() < 30, "the live run did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let shown = drive(viewer, "live", json!({"key": "live", "total": LIVE_EPISODES}));
    run.wait().expect("the live run ends");
    let samples = shown["samples"].as_array().unwrap();
    let first = samples[0]["matched"].as_u64().unwrap_or(0);
    let last = samples.last().unwrap();
    assert_eq!(last["finished"], true, "{shown}");
    assert_eq!(last["matched"], LIVE_EPISODES);
    assert!(first < LIVE_EPISODES, "the page opened after the run ended: {shown}");
    let grew_while_running = samples
        .iter()
        .any(|s| s["finished"] == false && s["matched"].as_u64().is_some_and(|m| m > first && m < LIVE_EPISODES));
    assert!(grew_while_running, "no episode appeared while the run ran: {shown}");
}

/// Tasks with tags and metadata: `a` and `b` are tagged `math`, `a` also `easy`; `a` and `c`
/// have `level: 1`; `a` has a long note and a list, which the log keeps cut and leaves out.
const TAGGED: &str = r#"suite: tagged
environment: kv
epochs: 2
scorers: [{equals: ok}]
tasks:
  - {id: a, input: x, tags: [math, easy], metadata: {level: 1, lang: en, note: "NOTE", items: [1, 2]}, mock: [{text: ok}]}
  - {id: b, input: x, tags: [math], metadata: {level: 2, hard: true}, mock: [{text: ok}]}
  - {id: c, input: x, metadata: {level: 1, lang: fr}, mock: [{text: no}]}
  - {id: d, input: x, mock: [{text: ok}]}
"#;

fn get(url: &str) -> (u16, String) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let resp = reqwest::get(url).await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap())
    })
}

fn get_json(url: &str) -> Value {
    let (status, body) = get(url);
    assert_eq!(status, 200, "GET {url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: {e}: {body}"))
}

/// The episodes and compare endpoints filter by the tags and metadata the log carries.
#[test]
fn the_viewer_filters_episodes_and_compared_tasks_by_tag_and_metadata() {
    let sb = Sandbox::new();
    let note = "n".repeat(100);
    sb.write("tagged.yaml", &TAGGED.replace("NOTE", &note));
    eval(&sb, "tagged.yaml", "mock", "m");
    eval(&sb, "tagged.yaml", "echo", "e");

    // The log: tags and scalar metadata of each task, strings cut, lists left out.
    let events = read_jsonl(&sb.path().join("results/m/events.jsonl"));
    let mut episodes_of: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for started in of_type(&events, "episode_started") {
        let task = started["task_id"].as_str().unwrap().to_owned();
        let (tags, metadata) = (&started["tags"], &started["metadata"]);
        match task.as_str() {
            "a" => {
                assert_eq!(*tags, json!(["math", "easy"]));
                assert_eq!(*metadata, json!({"level": 1, "lang": "en", "note": "n".repeat(80)}));
            }
            "b" => assert_eq!((tags, metadata), (&json!(["math"]), &json!({"level": 2, "hard": true}))),
            "c" => assert_eq!((tags, metadata), (&Value::Null, &json!({"level": 1, "lang": "fr"}))),
            _ => assert_eq!((tags, metadata), (&Value::Null, &Value::Null), "{started}"),
        }
        episodes_of.entry(task).or_default().push(started["episode_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(episodes_of.values().map(Vec::len).sum::<usize>(), 8, "{episodes_of:?}");
    let of = |tasks: &[&str]| -> Vec<String> {
        let mut ids: Vec<String> = tasks.iter().flat_map(|t| episodes_of[*t].clone()).collect();
        ids.sort();
        ids
    };

    let viewer = start_viewer(&sb);
    let head = get_json(&format!("{}api/runs/m", viewer.url));
    assert_eq!(head["facets"]["tag"], json!({"easy": 2, "math": 4}), "{}", head["facets"]);
    let filtered = |query: &str| {
        let page = get_json(&format!("{}api/runs/m/episodes?{query}&limit=1000", viewer.url));
        let ids: Vec<String> = sorted(&json!(
            page["rows"].as_array().unwrap().iter().map(|r| r["episode_id"].clone()).collect::<Vec<_>>()
        ));
        assert_eq!(page["matched"], json!(ids.len()), "{query}");
        ids
    };
    assert_eq!(filtered("tag=math"), of(&["a", "b"]));
    assert_eq!(filtered("tag=easy"), of(&["a"]));
    assert_eq!(filtered("meta=level%3D1"), of(&["a", "c"]));
    assert_eq!(filtered("meta=hard%3Dtrue"), of(&["b"]));
    assert_eq!(filtered("tag=math&meta=lang%3Den"), of(&["a"]));
    assert_eq!(filtered(&format!("meta=note%3D{}", "n".repeat(80))), of(&["a"]));
    assert!(filtered("meta=items%3D1").is_empty());
    let (status, body) = get(&format!("{}api/runs/m/episodes?meta=level", viewer.url));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("KEY=VALUE"), "{body}");

    let compared = |query: &str| {
        let data = get_json(&format!("{}api/compare?runs=m,e&{query}", viewer.url));
        assert_eq!(data["tags"], json!(["easy", "math"]));
        data["rows"].as_array().unwrap().iter().map(|r| r["task_id"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(compared("tag=math"), ["a", "b"]);
    assert_eq!(compared("meta=lang%3Dfr"), ["c"]);
    assert_eq!(compared("tag=easy&meta=level%3D1"), ["a"]);
    assert_eq!(compared("only=flips&tag=math"), ["a", "b"]);

    // The same filters chosen in the pages.
    let args = json!({"key": "m", "runs": ["m", "e"], "tag": "math", "meta": "level=1"});
    let shown = drive(&viewer, "tagged", args);
    assert_eq!(shown["tags"], json!(["easy", "math"]), "{shown}");
    assert_eq!(sorted(&shown["episodes"]), of(&["a"]), "{shown}");
    assert_eq!(shown["byTag"], json!(["tagged/a", "tagged/b"]), "{shown}");
    assert_eq!(shown["byBoth"], json!(["tagged/a"]), "{shown}");
    assert_eq!(shown["labelled"], json!([true, true]), "{shown}");
}
