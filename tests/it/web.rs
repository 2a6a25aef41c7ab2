//! The `web` environment through the binary: a corpus served offline, and live pages from
//! a real local HTTP server (wiremock) — redirects, errors, slow and huge and binary
//! bodies, the allow-list, and the run's page cache across epochs.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{Run, Sandbox, of_type};

/// Every tool observation of the run, with the task and epoch of its episode, in log order.
fn observations(events: &[Value]) -> Vec<(String, u64, Value)> {
    let episodes: HashMap<&str, (String, u64)> = of_type(events, "episode_started")
        .iter()
        .map(|e| {
            let id = e["episode_id"].as_str().unwrap_or_default();
            (id, (e["task_id"].as_str().unwrap_or_default().to_owned(), e["epoch"].as_u64().unwrap_or(0)))
        })
        .collect();
    of_type(events, "observation")
        .into_iter()
        .filter(|e| !e["observation"]["call_id"].is_null())
        .filter_map(|e| {
            let (task, epoch) = episodes.get(e["episode_id"].as_str()?)?.clone();
            Some((task, epoch, e["observation"].clone()))
        })
        .collect()
}

/// The observations of `task`'s calls other than the final answer.
fn of_task(all: &[(String, u64, Value)], task: &str) -> Vec<Value> {
    all.iter().filter(|(t, _, o)| t == task && o["done"] != true).map(|(_, _, o)| o.clone()).collect()
}

/// A task that makes `calls` (one per turn), then answers `done`.
fn task(id: &str, calls: &[Value]) -> String {
    let mut turns: Vec<Value> = calls.iter().map(|c| json!({"tool_calls": [c]})).collect();
    turns.push(json!({"tool_calls": [{"name": "final_answer", "arguments": {"answer": "done"}}]}));
    format!("  - {{id: {id}, input: go, mock: {}}}\n", Value::Array(turns))
}

fn fetch(url: &str) -> Value {
    json!({"name": "fetch", "arguments": {"url": url}})
}

fn suite(tasks: &[String]) -> String {
    format!(
        "suite: w\nenvironment: site\nlimits: {{max_steps: 6, time_s: 60}}\nscorers: [{{equals: done}}]\ntasks:\n{}",
        tasks.concat()
    )
}

async fn eval(sb: &Sandbox, extra: &[&str]) -> Run {
    let mut cmd = sb.command();
    cmd.args(["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results"]).args(extra);
    tokio::task::spawn_blocking(move || Run::from(cmd.output().unwrap())).await.unwrap()
}

fn error_type(obs: &Value) -> &str {
    obs["error"]["type"].as_str().unwrap_or("none")
}

#[test]
fn a_corpus_is_searched_and_served_and_the_budget_runs_out() {
    let sb = Sandbox::new();
    let pages = [
        json!({"url": "https://c.test/kites", "title": "Kites", "text": "A kite flies on a string in the wind."}),
        json!({"url": "https://c.test/gliders", "title": "Gliders", "text": "A glider rides rising air, no engine."}),
        json!({"url": "https://c.test/tables", "html": "<h1>Winds</h1><p id=\"b\">Beaufort 12 is a hurricane.</p>"}),
    ];
    let jsonl: String = pages.iter().map(|p| format!("{p}\n")).collect();
    sb.write("pages.jsonl", &jsonl);
    sb.write("environments/site.yaml", "kind: web\nweb:\n  corpus: ../pages.jsonl\n  budget: 3\n");
    let search = json!({"name": "search", "arguments": {"query": "string kite"}});
    let extract = json!({"name": "extract", "arguments": {"url": "https://c.test/tables", "selector": "#b"}});
    sb.write(
        "s.yaml",
        &suite(&[task("t", &[search, extract, fetch("https://c.test/kites"), fetch("https://c.test/kites")])]),
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let all = observations(&sb.events());
    let obs = of_task(&all, "t");
    assert_eq!(obs.len(), 4, "{obs:?}");
    // Only the kites page has "string" or "kite".
    assert_eq!(obs[0]["tool_result"]["results"][0]["url"], "https://c.test/kites", "{}", obs[0]);
    assert_eq!(obs[0]["tool_result"]["results"].as_array().map(Vec::len), Some(1), "{}", obs[0]);
    assert_eq!(obs[1]["tool_result"]["matches"], json!(["Beaufort 12 is a hurricane."]), "{}", obs[1]);
    assert_eq!(obs[1]["tool_result"]["title"], Value::Null, "extract gives matches, not the page");
    assert!(obs[2]["tool_result"]["content"].as_str().unwrap_or_default().contains("flies on a string"), "{}", obs[2]);
    assert_eq!(obs[2]["tool_result"]["requests_left"], 0);
    // The budget of three is spent: the fourth request is refused, and the episode goes on.
    assert_eq!(error_type(&obs[3]), "PermissionError", "{}", obs[3]);
    let finished = of_type(&sb.events(), "episode_finished")[0].clone();
    assert_eq!(finished["outcome"]["passed"], true, "{finished}");
}

/// A web environment over the local server, with a one-second timeout and a 100 kB cap.
fn live_environment(server: &MockServer) -> String {
    format!(
        "kind: web\nweb:\n  live:\n    allow: [127.0.0.1]\n    timeout_s: 1\n    max_bytes: 100000\n    \
         max_redirects: 3\n    search_endpoint: \"{}/search\"\n",
        server.uri()
    )
}

async fn serve(server: &MockServer, at: &str, response: ResponseTemplate) {
    Mock::given(method("GET")).and(path(at)).respond_with(response).mount(server).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn live_fetches_fail_as_observations_never_as_crashes() {
    let server = MockServer::start().await;
    let uri = server.uri();
    let html = |body: &str| ResponseTemplate::new(200).set_body_raw(body.as_bytes().to_vec(), "text/html");
    serve(&server, "/ok", html("<title>Fine</title><p>All is well.</p>")).await;
    serve(&server, "/loop-a", ResponseTemplate::new(302).insert_header("location", format!("{uri}/loop-b"))).await;
    serve(&server, "/loop-b", ResponseTemplate::new(302).insert_header("location", format!("{uri}/loop-a"))).await;
    serve(&server, "/away", ResponseTemplate::new(302).insert_header("location", "http://elsewhere.test/x")).await;
    serve(&server, "/slow", html("late").set_delay(Duration::from_secs(3))).await;
    serve(&server, "/huge", html(&"<p>big</p>".repeat(30_000))).await;
    let png = ResponseTemplate::new(200).set_body_raw(vec![137u8, 80, 78, 71], "image/png");
    serve(&server, "/image", png).await;
    let nul = ResponseTemplate::new(200).set_body_raw(b"ab\0cd".to_vec(), "text/plain");
    serve(&server, "/binary", nul).await;
    let results = json!({"results": [{"url": format!("{uri}/ok"), "title": "Fine", "snippet": "All is well"}]});
    Mock::given(method("GET"))
        .and(path("/search"))
        .and(wiremock::matchers::query_param("q", "is all well"))
        .and(wiremock::matchers::query_param("limit", "2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(results))
        .mount(&server)
        .await;
    // No route: wiremock answers 404.
    let sb = Sandbox::new();
    sb.write("environments/site.yaml", &live_environment(&server));
    let search = json!({"name": "search", "arguments": {"query": "is all well", "limit": 2}});
    let tasks = [
        task("ok", &[fetch(&format!("{uri}/ok"))]),
        task("search", &[search]),
        task("loop", &[fetch(&format!("{uri}/loop-a"))]),
        task("away", &[fetch(&format!("{uri}/away"))]),
        task("missing", &[fetch(&format!("{uri}/missing"))]),
        task("slow", &[fetch(&format!("{uri}/slow"))]),
        task("huge", &[fetch(&format!("{uri}/huge"))]),
        task("image", &[fetch(&format!("{uri}/image"))]),
        task("binary", &[fetch(&format!("{uri}/binary"))]),
        task("refused", &[fetch("http://example.org/")]),
    ];
    sb.write("s.yaml", &suite(&tasks));
    let run = eval(&sb, &["-j", "4"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let all = observations(&sb.events());
    let only = |task: &str| {
        let obs = of_task(&all, task);
        assert_eq!(obs.len(), 1, "{task}: {obs:?}");
        obs[0].clone()
    };
    let ok = only("ok");
    assert_eq!(ok["tool_result"]["title"], "Fine", "{ok}");
    assert_eq!(ok["tool_result"]["content"], "All is well.", "{ok}");
    let found = only("search");
    assert_eq!(found["tool_result"]["results"][0]["url"], format!("{uri}/ok"), "{found}");
    let expect = |task: &str, kind: &str, words: &str| {
        let obs = only(task);
        assert_eq!(error_type(&obs), kind, "{task}: {obs}");
        let message = obs["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{task}: `{message}` should say `{words}`");
    };
    expect("loop", "ExecutionError", "redirect loop");
    expect("away", "PermissionError", "`elsewhere.test` is not on the allow-list");
    expect("missing", "ExecutionError", "HTTP 404");
    expect("slow", "TimeoutError", "did not answer within 1s");
    expect("huge", "ExecutionError", "larger than the cap of 100000 bytes");
    expect("image", "ExecutionError", "content type is `image/png`");
    expect("binary", "ExecutionError", "binary");
    expect("refused", "PermissionError", "`example.org` is not on the allow-list");
    // Every episode ended with its answer: no failure crashed one.
    for f in of_type(&sb.events(), "episode_finished") {
        assert_eq!(f["outcome"]["passed"], true, "{f}");
    }
    // The refused host was never asked: the server saw no request for it either way, and
    // the refused redirect was not followed.
    let asked: Vec<String> =
        server.received_requests().await.unwrap_or_default().iter().map(|r| r.url.path().to_owned()).collect();
    assert!(!asked.iter().any(|p| p == "/x"), "{asked:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_changed_between_epochs_is_served_from_the_run_cache() {
    let server = MockServer::start().await;
    let uri = server.uri();
    let version =
        |n: &str| ResponseTemplate::new(200).set_body_raw(format!("<p>version {n}</p>").into_bytes(), "text/html");
    // The first request gets version one; every later one gets version two.
    Mock::given(method("GET"))
        .and(path("/page"))
        .respond_with(version("one"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET")).and(path("/page")).respond_with(version("two")).with_priority(2).mount(&server).await;
    let sb = Sandbox::new();
    sb.write("environments/site.yaml", &live_environment(&server));
    // Two fetches in one episode, and two epochs: four reads of one page.
    sb.write("s.yaml", &suite(&[task("t", &[fetch(&format!("{uri}/page")), fetch(&format!("{uri}/page"))])]));
    let run = eval(&sb, &["--epochs", "2", "-j", "1"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let all = observations(&sb.events());
    let contents: Vec<(u64, String)> = all
        .iter()
        .filter(|(_, _, o)| o["done"] != true)
        .map(|(_, epoch, o)| (*epoch, o["tool_result"]["content"].as_str().unwrap_or("(none)").to_owned()))
        .collect();
    assert_eq!(contents.len(), 4, "{all:?}");
    assert!(contents.iter().all(|(_, c)| c == "version one"), "{contents:?}");
    let epochs: std::collections::BTreeSet<u64> = contents.iter().map(|(e, _)| *e).collect();
    assert_eq!(epochs.len(), 2, "both epochs read the page: {contents:?}");
    // The server did change: it was asked once by the run, and answers version two now.
    let asked = server.received_requests().await.unwrap_or_default();
    assert_eq!(asked.iter().filter(|r| r.url.path() == "/page").count(), 1, "the run asked the server again");
    let now = reqwest::get(format!("{uri}/page")).await.unwrap().text().await.unwrap();
    assert_eq!(now, "<p>version two</p>");
    // The cache is a folder of the run.
    let cached = std::fs::read_dir(sb.path().join("results/test/web-cache")).unwrap().count();
    assert_eq!(cached, 1, "one page, one cache file");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_run_reads_the_pages_its_first_part_cached() {
    let server = MockServer::start().await;
    let uri = server.uri();
    let version =
        |n: &str| ResponseTemplate::new(200).set_body_raw(format!("<p>version {n}</p>").into_bytes(), "text/plain");
    Mock::given(method("GET"))
        .and(path("/page"))
        .respond_with(version("one"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET")).and(path("/page")).respond_with(version("two")).with_priority(2).mount(&server).await;
    let sb = Sandbox::new();
    sb.write("environments/site.yaml", &live_environment(&server));
    // The script ends after the fetch: the episode is unscored, so a resume runs it again.
    let turns = json!([{"tool_calls": [fetch(&format!("{uri}/page"))]}]);
    sb.write("s.yaml", &suite(&[format!("  - {{id: t, input: go, mock: {turns}}}\n")]));
    let first = eval(&sb, &[]).await;
    assert_eq!(first.code, 3, "an unscored episode: {first:?}");
    let mut cmd = sb.command();
    cmd.args(["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results"]);
    let resumed = tokio::task::spawn_blocking(move || Run::from(cmd.output().unwrap())).await.unwrap();
    assert_eq!(resumed.code, 3, "{resumed:?}");
    let events = sb.events();
    let runs = of_type(&events, "episode_started").len();
    assert_eq!(runs, 2, "the episode ran in the first part and again after the resume");
    let contents: Vec<String> = observations(&events)
        .iter()
        .map(|(_, _, o)| o["tool_result"]["content"].as_str().unwrap_or("(none)").to_owned())
        .collect();
    assert_eq!(contents, ["<p>version one</p>", "<p>version one</p>"], "text/plain is shown as it is");
    let asked = server.received_requests().await.unwrap_or_default();
    assert_eq!(asked.iter().filter(|r| r.url.path() == "/page").count(), 1, "the resume asked the server again");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_nested_a_hundred_thousand_deep_is_cut_and_the_run_finishes() {
    let server = MockServer::start().await;
    let uri = server.uri();
    let deep =
        format!("<title>Deep</title><p>Top text.</p>{}bottom{}", "<div>".repeat(100_000), "</div>".repeat(100_000));
    // 1.1 MB: under a cap raised for it, so that the page is read, not refused.
    let environment = live_environment(&server).replace("max_bytes: 100000", "max_bytes: 2000000");
    serve(&server, "/deep", ResponseTemplate::new(200).set_body_raw(deep.into_bytes(), "text/html")).await;
    let sb = Sandbox::new();
    sb.write("environments/site.yaml", &environment);
    let extract = json!({"name": "extract", "arguments": {"url": format!("{uri}/deep"), "selector": "div"}});
    sb.write("s.yaml", &suite(&[task("deep", &[fetch(&format!("{uri}/deep")), extract])]));
    let started = std::time::Instant::now();
    let run = eval(&sb, &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(started.elapsed() < Duration::from_secs(30), "the run took {:?}", started.elapsed());
    let all = observations(&sb.events());
    let obs = of_task(&all, "deep");
    assert_eq!(obs.len(), 2, "{obs:?}");
    let content = obs[0]["tool_result"]["content"].as_str().unwrap_or_default();
    assert!(content.contains("Top text."), "{}", obs[0]);
    assert!(content.contains("nested deeper than"), "the cut is marked: {}", obs[0]);
    assert_eq!(error_type(&obs[1]), "none", "{}", obs[1]);
    assert!(obs[1]["tool_result"]["count"].as_u64().unwrap_or(0) > 0, "{}", obs[1]);
    // The run cached the page it read, and only that.
    let cached = std::fs::read_dir(sb.path().join("results/test/web-cache")).unwrap().count();
    assert_eq!(cached, 1, "one page, one cache file");
}

/// Regression: a redirect the client could not follow (no `Location`, a `300`) came back as
/// an empty page, as if the fetch had worked.
#[tokio::test(flavor = "multi_thread")]
async fn a_redirect_that_is_not_followed_is_an_error_not_an_empty_page() {
    let server = MockServer::start().await;
    let uri = server.uri();
    serve(&server, "/moved", ResponseTemplate::new(302)).await;
    serve(&server, "/choices", ResponseTemplate::new(300).set_body_raw(b"<p>a or b</p>".to_vec(), "text/html")).await;
    let sb = Sandbox::new();
    sb.write("environments/site.yaml", &live_environment(&server));
    let tasks =
        [task("moved", &[fetch(&format!("{uri}/moved"))]), task("choices", &[fetch(&format!("{uri}/choices"))])];
    sb.write("s.yaml", &suite(&tasks));
    let run = eval(&sb, &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let all = observations(&sb.events());
    for (task, status) in [("moved", "302"), ("choices", "300")] {
        let obs = of_task(&all, task);
        assert_eq!(error_type(&obs[0]), "ExecutionError", "{task}: {:?}", obs);
        let message = obs[0]["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(&format!("HTTP {status}")) && message.contains("not followed"), "{task}: {message}");
    }
}
