use std::path::Path;

use serde_json::{Value, json};

use super::*;
use crate::environment::Definition;

/// A web definition over a three-page folder corpus, with `budget` requests and `cap`.
fn world(budget: u32, cap: usize) -> (tempfile::TempDir, Box<dyn World>) {
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("pages");
    std::fs::create_dir(&pages).unwrap();
    std::fs::write(
        pages.join("tides.html"),
        "<html><head><title>Tides</title></head><body><h1>Tides</h1><p>The moon pulls the sea.</p>\
         <table><tr><td>Spring tide</td><td>large</td></tr><tr><td>Neap tide</td><td>small</td></tr></table>\
         </body></html>",
    )
    .unwrap();
    std::fs::write(pages.join("notes.md"), "# Notes\nMoon notes.").unwrap();
    std::fs::write(pages.join("long.txt"), "x".repeat(500)).unwrap();
    let file = format!(
        "kind: web\nlimits: {{output_cap_bytes: {cap}}}\nweb:\n  corpus: pages\n  base_url: https://sea.test\n  budget: {budget}\n"
    );
    std::fs::write(dir.path().join("web.yaml"), file).unwrap();
    let definition = Definition::load(&dir.path().join("web.yaml")).unwrap();
    let context = SetupContext::new(dir.path(), "ep");
    let world = futures::executor::block_on(Web.setup(&definition, &test_task(), &context)).unwrap();
    (dir, world)
}

fn test_task() -> Task {
    Task::new("t", "x")
}

async fn call(world: &dyn World, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
    world.call(&Actor::Main, name, arguments).await
}

#[tokio::test]
async fn search_then_fetch_then_extract_a_corpus_page() {
    let (_dir, world) = world(10, 4096);
    let found = call(world.as_ref(), "search", json!({"query": "spring tide"})).await.unwrap();
    assert_eq!(found["results"][0]["url"], "https://sea.test/tides.html", "{found}");
    assert_eq!(found["requests_left"], 9);
    let page = call(world.as_ref(), "fetch", json!({"url": "https://sea.test/tides.html"})).await.unwrap();
    assert_eq!(page["title"], "Tides");
    assert!(page["content"].as_str().unwrap().contains("The moon pulls the sea."), "{page}");
    assert!(page.get("truncated").is_none());
    let cells =
        call(world.as_ref(), "extract", json!({"url": "https://sea.test/tides.html", "selector": "tr td:first-child"}))
            .await
            .unwrap();
    assert_eq!(cells["matches"], json!(["Spring tide", "Neap tide"]), "{cells}");
    assert_eq!(cells["count"], 2);
    assert_eq!(cells["requests_left"], 7);
}

#[tokio::test]
async fn an_unknown_page_a_text_page_and_a_bad_selector_are_errors() {
    let (_dir, world) = world(10, 4096);
    let missing = call(world.as_ref(), "fetch", json!({"url": "https://sea.test/nope.html"})).await.unwrap_err();
    assert_eq!(missing.kind, ErrorType::ExecutionError);
    assert!(missing.message.contains("404"), "{missing:?}");
    let text = call(world.as_ref(), "extract", json!({"url": "https://sea.test/notes.md", "selector": "h1"}))
        .await
        .unwrap_err();
    assert!(text.message.contains("not an HTML page"), "{text:?}");
    let bad = call(world.as_ref(), "extract", json!({"url": "https://sea.test/tides.html", "selector": "td[["}))
        .await
        .unwrap_err();
    assert_eq!(bad.kind, ErrorType::ValidationError);
    // Two requests were made (the fetch and the first extract); the bad selector cost none.
    let page = call(world.as_ref(), "fetch", json!({"url": "https://sea.test/notes.md"})).await.unwrap();
    assert_eq!(page["requests_left"], 7);
}

#[tokio::test]
async fn the_budget_runs_out_and_says_so() {
    let (_dir, world) = world(2, 4096);
    assert!(call(world.as_ref(), "search", json!({"query": "moon"})).await.is_ok());
    assert!(call(world.as_ref(), "fetch", json!({"url": "https://sea.test/notes.md"})).await.is_ok());
    let spent = call(world.as_ref(), "search", json!({"query": "moon"})).await.unwrap_err();
    assert_eq!(spent.kind, ErrorType::PermissionError);
    assert!(spent.message.contains("budget of 2 is spent"), "{spent:?}");
    assert_eq!(world.describe()["requests_left"], 0);
}

#[tokio::test]
async fn a_long_page_is_cut_at_the_output_cap_with_a_marker() {
    let (_dir, world) = world(5, 100);
    let page = call(world.as_ref(), "fetch", json!({"url": "https://sea.test/long.txt"})).await.unwrap();
    assert_eq!(page["truncated"], true);
    let content = page["content"].as_str().unwrap();
    assert!(content.starts_with(&"x".repeat(100)), "{content}");
    assert!(content.ends_with("[... content truncated: showing 100 of 500 bytes ...]"), "{content}");
}

fn load(text: &str) -> Result<Definition, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("c.jsonl"), "{\"url\": \"u\", \"title\": \"T\", \"text\": \"x\"}\n").unwrap();
    let path = dir.path().join("web.yaml");
    std::fs::write(&path, text).unwrap();
    Definition::load(Path::new(&path))
}

#[test]
fn web_settings_are_checked_at_their_line() {
    let cases = [
        ("kind: web\nweb:\n  corpus: c.jsonl\n  budget: 0\n", 4, "web.budget: must be at least 1"),
        ("kind: web\nweb:\n  corpus: missing\n", 3, "web.corpus: no file or folder"),
        ("kind: web\nweb:\n  corpus: c.jsonl\n  live: {allow: [a.test]}\n", 2, "web: give exactly one of"),
        (
            "kind: web\nweb:\n  live:\n    allow: [\"https://a.test\"]\n",
            4,
            "web.live.allow[0]: `https://a.test` is not a host",
        ),
        ("kind: web\nweb:\n  live:\n    allow: [a.test]\n    timeout_s: 0\n", 5, "web.live.timeout_s"),
        ("kind: web\nweb:\n  corpus: c.jsonl\n  pages: 3\n", 4, "web.pages: unknown field `pages`"),
        ("kind: kv\nweb:\n  corpus: c.jsonl\n", 2, "kind `kv` takes no `web:`"),
    ];
    for (text, line, message) in cases {
        let err = load(text).unwrap_err();
        assert_eq!(err.position.map(|p| p.line), Some(line), "{text}: {err}");
        assert!(err.message.contains(message), "{text}: {err}");
    }
    let def = load("kind: web\nweb:\n  corpus: c.jsonl\n").unwrap();
    assert!(matches!(def.settings, KindSettings::Web(Some(_))));
}

#[tokio::test]
async fn a_web_kind_without_settings_does_not_set_up() {
    let definition = Definition::builtin(&Web);
    let dir = tempfile::tempdir().unwrap();
    let setup = Web.setup(&definition, &test_task(), &SetupContext::new(dir.path(), "ep")).await;
    let err = setup.err().unwrap();
    assert!(err.message.contains("`web: {corpus: …}`"), "{err}");
}

#[tokio::test]
async fn every_web_tool_reaches_its_world() {
    let (_dir, world) = world(10, 4096);
    for tool in TOOLS {
        let result = call(world.as_ref(), tool.name(), json!({})).await;
        assert_ne!(result.err().map(|f| f.kind), Some(ErrorType::ToolNotFound), "{}", tool.name());
    }
}

#[test]
fn content_types_say_what_is_a_page() {
    assert_eq!(format_of_type("text/html; charset=utf-8"), Some(Format::Html));
    assert_eq!(format_of_type("text/plain"), Some(Format::Text));
    assert_eq!(format_of_type("image/png"), None);
    assert_eq!(format_of_type("application/octet-stream"), None);
}
