//! The HTML report, opened in a real headless Chromium (Debian's `chromium`; `.ci/run`
//! installs it). The page is read back as the browser built it, after its script ran.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Sandbox, of_type};

/// The browser: `$RUNNER_CHROMIUM`, else `chromium` or `chromium-browser` on the PATH.
fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("RUNNER_CHROMIUM") {
        return PathBuf::from(path);
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("sh").args(["-c", &format!("command -v {name}")]).output()
            && out.status.success()
        {
            return PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        }
    }
    panic!("the HTML report test needs Chromium: `apt-get install chromium` (or set RUNNER_CHROMIUM)");
}

/// The DOM of `page` (with `fragment` after `#`) once its script has run.
fn dom(page: &Path, fragment: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let url = format!("file://{}{fragment}", page.display());
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .expect("start chromium");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const SUITE: &str = r#"suite: rep
environment: kv
grader: {model: mock}
scorers: [{equals: ok}]
tasks:
  - id: good
    input: Store then answer.
    mock:
      - tool_calls: [{name: set, arguments: {key: a, value: "1"}}]
      - text: ok
  - id: bad
    input: Answer ok.
    mock:
      - tool_calls: [{name: nope, arguments: {}}]
      - text: "<script>document.title='pwned'</script> not ok"
  - id: graded
    input: Name a colour.
    scorers:
      - llm_rubric: The answer names a colour.
        mock: ["The answer says ok, a colour? No.\n{\"score\": 0}"]
    mock:
      - text: ok
  - id: silent
    input: Say nothing.
    mock: []
"#;

#[test]
fn the_html_report_renders_every_episode_and_its_trajectory_in_chromium() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 3, "one episode is unscored: {run:?}");
    let report = sb.run(&["report", "results/test", "--html"]);
    assert_eq!(report.code, 0, "{report:?}");
    let page = sb.path().join("results/test/report.html");
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: no address in the page but the SVG namespace, nothing loaded from anywhere.
    let addresses = html.matches("http://").count() + html.matches("https://").count();
    assert_eq!(addresses, html.matches("http://www.w3.org/2000/svg").count(), "the page refers to the network");
    assert!(!html.contains(" src=") && !html.contains("@import") && !html.contains("url("));

    let events = sb.events();
    let ids: Vec<String> =
        of_type(&events, "episode_started").iter().map(|e| e["episode_id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids.len(), 4);
    let listed = dom(&page, "");
    assert_eq!(listed.matches("class=\"episode-row").count(), 4, "{listed}");
    for id in &ids {
        assert!(listed.contains(&format!("data-episode-id=\"{id}\"")), "{id} is not listed");
    }
    assert!(listed.contains("data-outcome=\"unscored\"") && listed.contains("data-outcome=\"failed\""));
    assert!(listed.contains("id=\"pass-rate-chart\""), "the chart is drawn");
    // The lines the terminal prints under its summary.
    assert!(listed.contains("unscored episodes are not failures; causes:"), "{listed}");

    // The failed episode's trajectory: the unknown tool's error, the answer shown as text,
    // the failed score with its explanation.
    let bad = task_episode(&events, "bad");
    let shown = dom(&page, &format!("#episode={bad}"));
    let trajectory = &shown[shown.find("id=\"trajectory\"").expect("the trajectory opens")..];
    assert!(
        trajectory.contains(&format!("data-episode-id=\"{bad}\""))
            || shown.contains(&format!("id=\"trajectory\" data-episode-id=\"{bad}\""))
    );
    assert!(trajectory.contains("data-tool-name=\"nope\""), "the tool call is shown");
    assert!(trajectory.contains("ToolNotFound"), "the tool error is shown");
    assert!(trajectory.contains("&lt;script&gt;document.title='pwned'&lt;/script&gt; not ok"), "the answer is text");
    assert!(!shown.contains("<title>pwned</title>"), "the model's script never ran");
    assert!(trajectory.contains("data-scorer=\"equals\"") && trajectory.contains("data-passed=\"false\""));

    // The good episode's model calls and their input tokens, as its terminal line says them.
    let good = task_episode(&events, "good");
    let calls: Vec<u64> = of_type(&events, "model_call")
        .iter()
        .filter(|c| c["episode_id"] == good.as_str() && c.get("scorer").is_none())
        .map(|c| c["usage"]["input_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(calls.len(), 2, "two turns of the mock");
    let (all, largest) = (calls.iter().sum::<u64>(), calls.iter().copied().max().unwrap_or(0));
    assert!(largest > 0 && largest < all, "{calls:?}");
    let row = listed.split("class=\"episode-row").find(|r| r.contains(&format!("data-episode-id=\"{good}\""))).unwrap();
    assert!(row.contains(&format!("{} (largest {})", thousands(all), thousands(largest))), "{row}");
    let shown = dom(&page, &format!("#episode={good}"));
    let said = format!("2 model calls, {} input tokens (largest call {})", thousands(all), thousands(largest));
    assert!(shown.contains(&said), "{said} is not on the episode's page");

    // The graded episode shows the grader's reasoning.
    let graded = task_episode(&events, "graded");
    let shown = dom(&page, &format!("#episode={graded}"));
    assert!(shown.contains("The answer says ok, a colour? No."), "the grader's reasoning is shown");
}

fn task_episode(events: &[serde_json::Value], task: &str) -> String {
    of_type(events, "episode_started")
        .iter()
        .find(|e| e["task_id"] == task)
        .map(|e| e["episode_id"].as_str().unwrap().to_owned())
        .unwrap()
}

#[test]
fn a_large_run_keeps_the_trajectories_of_failures_first() {
    let sb = Sandbox::new();
    let tasks: String = (0..30)
        .map(|i| {
            format!("  - {{id: t{i:02}, input: q, mock: [{{text: {}}}]}}\n", if i % 10 == 3 { "no" } else { "ok" })
        })
        .collect();
    sb.write("s.yaml", &format!("suite: big\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}"));
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    let report = sb.run(&["report", "results/test", "--html=small.html", "--max-trajectories", "5"]);
    assert_eq!(report.code, 0, "{report:?}");
    let html = std::fs::read_to_string(sb.path().join("small.html")).unwrap();
    let start = html.find("const RUN = ").unwrap() + "const RUN = ".len();
    let end = start + html[start..].find(";</script>").unwrap();
    let data: serde_json::Value = serde_json::from_str(&html[start..end]).unwrap();
    assert_eq!(data["episodes"].as_array().unwrap().len(), 30);
    let kept = data["trajectories"].as_object().unwrap();
    assert_eq!(kept.len(), 5);
    assert_eq!(data["omitted_trajectories"], 25);
    let failed: Vec<&str> = data["episodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["outcome"] == "failed")
        .map(|e| e["episode_id"].as_str().unwrap())
        .collect();
    assert_eq!(failed.len(), 3);
    assert!(failed.iter().all(|id| kept.contains_key(*id)), "the failures' trajectories are kept first");
}

#[test]
fn the_html_report_shows_the_tree_of_agents_of_an_episode_with_subagents() {
    let sb = Sandbox::new();
    let suite = "suite: tree\nenvironment: kv\nagent: {subagent: help}\nscorers: [{equals: ok}]\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls: [{name: delegate_task, arguments: {goal: store a}}, {name: delegate_task, arguments: {goal: think}}]\n      - text: ok\n    mock_subagents:\n      main.1:\n        - tool_calls: [{name: delegate_task, arguments: {goal: store it deeper}}]\n        - tool_calls: [{name: final_answer, arguments: {answer: stored}}]\n      main.1.1:\n        - tool_calls: [{name: kv_set, arguments: {key: a, value: \"1\"}}]\n        - tool_calls: [{name: final_answer, arguments: {answer: deep}}]\n      main.2:\n        - tool_calls: [{name: final_answer, arguments: {answer: thought}}]\n";
    sb.write("s.yaml", suite);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let report = sb.run(&["report", "results/test", "--html"]);
    assert_eq!(report.code, 0, "{report:?}");
    let page = sb.path().join("results/test/report.html");
    let id = task_episode(&sb.events(), "t");
    let shown = dom(&page, &format!("#episode={id}"));
    let tree_at = shown.find("id=\"agent-tree\"").expect("the tree of agents is shown");
    let tree = &shown[tree_at..shown[tree_at..].find("Episode started").map_or(shown.len(), |i| tree_at + i)];
    // main holds main.1 (which holds main.1.1) and main.2, in that order, nested.
    let at = |actor: &str| tree.find(&format!("data-actor=\"{actor}\"")).unwrap_or_else(|| panic!("{actor}: {tree}"));
    assert!(at("main") < at("main.1") && at("main.1") < at("main.1.1") && at("main.1.1") < at("main.2"), "{tree}");
    let deep = &tree[at("main.1.1")..at("main.2")];
    assert!(deep.contains(" · 2 model calls · kv_set, final_answer"), "{deep}");
    assert!(deep.contains("goal: store it deeper"), "{deep}");
    assert!(deep.contains("answered: deep"), "{deep}");
    // main.1.1 sits in main.1's list: its item closes after main.1.1's.
    let main1 = &tree[at("main.1")..at("main.2")];
    assert!(main1.contains("<ul>") && main1.contains("goal: store a"), "{main1}");
    // Calls in the trajectory carry their actor.
    assert!(
        shown.contains("data-tool-name=\"kv_set\" data-call-id=\"main_1_1_c_1\" data-actor=\"main.1.1\""),
        "{shown}"
    );
}

#[test]
fn the_html_report_has_the_epochs_table_the_terminal_prints() {
    let sb = Sandbox::new();
    // Two epochs of one task, both passing.
    sb.write(
        "s.yaml",
        "suite: twice\nenvironment: kv\nepochs: 2\nscorers: [{equals: ok}]\ntasks:\n  - id: t\n    input: Say ok.\n    mock: [{text: ok}]\n",
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("pass^k"), "the terminal prints the epochs table: {run:?}");
    let report = sb.run(&["report", "results/test", "--html"]);
    assert_eq!(report.code, 0, "{report:?}");
    let shown = dom(&sb.path().join("results/test/report.html"), "");
    let table = &shown[shown.find("id=\"epochs-table\"").expect("the epochs table is shown")..];
    let row = &table[table.find("data-suite=\"twice\"").expect("a row for the suite")..];
    let row = &row[..row.find("</tr>").unwrap()];
    // tasks 1, passed 1, pass@1 1.000, pass@k 1.000, pass^k 1.000, k 2, task score 1.000
    let cells: Vec<&str> =
        row.split("<td").skip(1).map(|c| &c[c.find('>').unwrap() + 1..c.find("</td>").unwrap()]).collect();
    assert_eq!(cells, ["twice", "mock", "1", "1", "1.000", "1.000", "1.000", "2", "1.000"], "{row}");
}

#[test]
fn the_html_report_shows_every_run_warning() {
    let sb = Sandbox::new();
    let graded = concat!(env!("CARGO_MANIFEST_DIR"), "/tasks/graded.yaml");
    let run = sb.run(&["eval", graded, "--model", "echo", "--run-id", "test", "--out", "results"]);
    let warnings = of_type(&sb.events(), "run_started")[0]["warnings"].clone();
    let warning = warnings[0].as_str().unwrap_or_else(|| panic!("the run has a warning: {run:?}")).to_owned();
    let report = sb.run(&["report", "results/test", "--html"]);
    assert_eq!(report.code, 0, "{report:?}");
    let shown = dom(&sb.path().join("results/test/report.html"), "");
    let banner = shown.find("class=\"banner run-warning\"").unwrap_or_else(|| panic!("no warning banner: {shown}"));
    // The page holds the text as the browser escaped it.
    let escaped = warning.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    assert!(shown[banner..].contains(&escaped), "{warning} not in {}", &shown[banner..]);
}

/// A quick tool error logged before the result of a slower call made earlier in the same
/// turn is still shown after it: observations in the order of their calls.
#[test]
fn the_html_report_shows_a_turn_s_observations_in_the_order_of_its_calls() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: order\nenvironment: shell\nscorers: [{equals: done}]\ntasks:\n  - id: two\n    input: Run both.\n    mock:\n      - tool_calls: [{name: run_command, arguments: {command: \"sleep 1; echo slow\"}}, {name: nope, arguments: {}}]\n      - text: done\n",
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    // The first turn's two calls (the answer is a call of its own, in the next turn).
    let called: Vec<&str> = of_type(&events, "action_dispatched")
        .iter()
        .filter(|e| e["call"]["name"] == "run_command" || e["call"]["name"] == "nope")
        .map(|e| e["call"]["call_id"].as_str().unwrap())
        .collect();
    let logged: Vec<&str> = crate::tool_observations(&events)
        .iter()
        .map(|o| o["call_id"].as_str().unwrap())
        .filter(|id| called.contains(id))
        .collect();
    assert_eq!(called.len(), 2);
    assert_eq!(logged, [called[1], called[0]], "the error is logged first, or this test shows nothing");
    let report = sb.run(&["report", "results/test", "--html"]);
    assert_eq!(report.code, 0, "{report:?}");
    let shown = dom(&sb.path().join("results/test/report.html"), &format!("#episode={}", task_episode(&events, "two")));
    let trajectory = &shown[shown.find("id=\"trajectory\"").expect("the trajectory opens")..];
    let observed: Vec<&str> = trajectory
        .split("ev ev-observation")
        .skip(1)
        .filter_map(|rest| rest.split("data-call-id=\"").nth(1)?.split('"').next())
        .filter(|id| called.contains(id))
        .collect();
    assert_eq!(observed, called, "{trajectory}");
}

/// `n` as the page writes it: `12,345`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
