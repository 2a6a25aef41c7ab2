//! The writing room through `Environment::execute`: outlines after edits, exports, the
//! style's rules as error observations, and what scorers read back.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde_json::{Value, json};

use super::*;
use crate::contract::{Observation, ToolCall};
use crate::environment::Environment;

fn task(files: &[(&str, &str)]) -> Task {
    Task { files: files.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(), ..Task::new("t", "write") }
}

async fn room(style: Style, files: &[(&str, &str)]) -> Environment {
    let definition = Definition::builtin(&Writing);
    let settings = KindSettings::Writing { style, documents: Default::default() };
    let definition = Arc::new(Definition { settings, ..definition });
    let dir = std::env::temp_dir();
    Environment::setup(definition, &task(files), &SetupContext::new(&dir, "ep_w")).await.unwrap()
}

async fn call(env: &Environment, name: &str, arguments: Value) -> Observation {
    env.execute(&ToolCall::new("c", name, arguments), &AtomicBool::new(false)).await
}

fn headings(obs: &Observation) -> Vec<String> {
    let outline = obs.info["outline"].as_array().unwrap_or_else(|| panic!("no outline in {:?}", obs.info));
    outline.iter().map(|e| format!("{}:{}", e["level"], e["heading"].as_str().unwrap_or("?"))).collect()
}

#[tokio::test]
async fn sections_go_in_at_their_position_and_a_known_heading_is_replaced_in_place() {
    let env = room(Style::default(), &[]).await;
    let opened = call(&env, "open_doc", json!({"doc_id": "report"})).await;
    assert_eq!(opened.tool_result.as_ref().unwrap()["created"], true);
    assert_eq!(opened.info["cursor"], json!({"document": "report", "section": null}));
    call(&env, "write_section", json!({"doc_id": "report", "heading": "Summary", "text": "short", "level": 1})).await;
    call(&env, "write_section", json!({"doc_id": "report", "heading": "Results", "text": "a b c"})).await;
    let inserted =
        call(&env, "write_section", json!({"doc_id": "report", "heading": "Method", "text": "x y", "position": 1}))
            .await;
    assert_eq!(headings(&inserted), ["1:Summary", "2:Method", "2:Results"]);
    assert_eq!(inserted.tool_result.as_ref().unwrap()["action"], "inserted");
    assert_eq!(inserted.info["cursor"], json!({"document": "report", "section": "Method"}));

    // Same heading, other case: replaced where it stands, with its new level and text.
    let replaced =
        call(&env, "write_section", json!({"doc_id": "report", "heading": "summary", "text": "one two three four"}))
            .await;
    assert_eq!(replaced.tool_result.as_ref().unwrap()["action"], "replaced");
    assert_eq!(headings(&replaced), ["2:summary", "2:Method", "2:Results"]);
    assert_eq!(replaced.info["outline"][0]["words"], 4);
    // A position moves a replaced section.
    let moved =
        call(&env, "write_section", json!({"doc_id": "report", "heading": "Results", "text": "a", "position": 0}))
            .await;
    assert_eq!(headings(&moved), ["2:Results", "2:summary", "2:Method"]);

    let past =
        call(&env, "write_section", json!({"doc_id": "report", "heading": "X", "text": "", "position": 9})).await;
    let error = past.error.unwrap();
    assert!(error.message.contains("position 9 is past the end"), "{}", error.message);
    let missing = call(&env, "write_section", json!({"doc_id": "nope", "heading": "X", "text": ""})).await;
    assert!(missing.error.unwrap().message.contains("no document `nope` (documents: report)"));
}

#[tokio::test]
async fn exports_are_markdown_and_html_with_the_document_structure() {
    let env = room(Style::default(), &[("notes.md", "# Notes\n\nFirst <b> & more.\n\nSecond.\n")]).await;
    call(&env, "write_section", json!({"doc_id": "notes", "heading": "Next", "text": "Ship it."})).await;
    let md = call(&env, "export", json!({"doc_id": "notes", "format": "markdown"})).await;
    let md = md.tool_result.unwrap();
    assert_eq!(md["name"], "notes.md");
    assert_eq!(md["text"], "# Notes\n\nFirst <b> & more.\n\nSecond.\n\n## Next\n\nShip it.\n");
    let html = call(&env, "export", json!({"doc_id": "notes", "format": "html"})).await.tool_result.unwrap();
    assert_eq!(html["name"], "notes.html");
    let text = html["text"].as_str().unwrap();
    let body = "<body>\n<h1>Notes</h1>\n<p>First &lt;b&gt; &amp; more.</p>\n<p>Second.</p>\n<h2>Next</h2>\n<p>Ship it.</p>\n</body>";
    assert!(text.starts_with("<!DOCTYPE html>") && text.contains(body), "{text}");

    // Scorers read the current text as `doc:ID` and an export by its name.
    let world = env.world();
    assert!(world.read_back("doc:notes", 1 << 20).await.unwrap().text.ends_with("## Next\n\nShip it.\n"));
    assert!(world.read_back("notes.html", 1 << 20).await.unwrap().text.contains("<h2>Next</h2>"));
    let err = world.read_back("other.md", 100).await.unwrap_err();
    assert!(err.message.contains("`other.md` was not exported (exports: notes.html, notes.md"), "{}", err.message);
}

#[tokio::test]
async fn an_export_keeps_the_text_of_its_time() {
    let env = room(Style::default(), &[("a.md", "# A\n\nold\n")]).await;
    call(&env, "export", json!({"doc_id": "a", "format": "markdown"})).await;
    call(&env, "write_section", json!({"doc_id": "a", "heading": "A", "text": "new", "level": 1})).await;
    assert_eq!(env.world().read_back("a.md", 100).await.unwrap().text, "# A\n\nold\n");
    assert_eq!(env.world().read_back("doc:a", 100).await.unwrap().text, "# A\n\nnew\n");
}

#[tokio::test]
async fn the_style_refuses_writes_over_its_word_limits_and_names_the_limit() {
    let style = Style { max_section_words: Some(5), max_document_words: Some(8), ..Style::default() };
    let env = room(style, &[("d.md", "")]).await;
    call(&env, "open_doc", json!({"doc_id": "d"})).await;
    let over = call(&env, "write_section", json!({"doc_id": "d", "heading": "A", "text": "1 2 3 4 5 6"})).await;
    let error = over.error.unwrap();
    assert_eq!(error.kind, ErrorType::ExecutionError);
    assert!(error.message.contains("6 words, over the limit of 5 words per section (style.max_section_words)"));
    // The refused write changed nothing.
    assert_eq!(over.info["outline"], json!([]));
    call(&env, "write_section", json!({"doc_id": "d", "heading": "A", "text": "1 2 3 4 5"})).await;
    let total = call(&env, "write_section", json!({"doc_id": "d", "heading": "B", "text": "1 2 3 4"})).await;
    let message = total.error.clone().unwrap().message;
    assert!(
        message.contains("9 words, over the limit of 8 words per document (style.max_document_words)"),
        "{message}"
    );
    assert_eq!(headings(&total), ["2:A"]);
}

#[tokio::test]
async fn the_style_holds_headings_to_its_depth_and_title_case() {
    let style = Style { max_heading_depth: Some(2), title_case: true, ..Style::default() };
    let env = room(style, &[("d.md", "")]).await;
    let deep = call(&env, "write_section", json!({"doc_id": "d", "heading": "Deep", "text": "", "level": 3})).await;
    assert!(
        deep.error.unwrap().message.contains("level 3 is deeper than the style allows (style.max_heading_depth: 2)")
    );
    let lower = call(&env, "write_section", json!({"doc_id": "d", "heading": "results of the test", "text": ""})).await;
    let error = lower.error.unwrap();
    assert!(error.message.contains("not in title case (style.title_case)"), "{}", error.message);
    assert_eq!(error.suggested_action.as_deref(), Some("write it as `Results of the Test`"));
    let ok = call(&env, "write_section", json!({"doc_id": "d", "heading": "Results of the Test", "text": ""})).await;
    assert!(ok.error.is_none(), "{:?}", ok.error);
    let refused = call(&env, "format", json!({"doc_id": "d", "style": "sentence_case"})).await;
    assert!(refused.error.unwrap().message.contains("style.title_case"));
}

#[tokio::test]
async fn format_rewrites_headings_and_tidies_text() {
    let env = room(Style::default(), &[("d.md", "## the plan for API work\n\nline   \n\n\n\nnext\n")]).await;
    let titled = call(&env, "format", json!({"doc_id": "d", "style": "title_case"})).await;
    assert_eq!(headings(&titled), ["2:The Plan for API Work"]);
    let sentence = call(&env, "format", json!({"doc_id": "d", "style": "sentence_case"})).await;
    assert_eq!(headings(&sentence), ["2:The plan for API work"]);
    call(&env, "format", json!({"doc_id": "d", "style": "tidy"})).await;
    let read = call(&env, "read_doc", json!({"doc_id": "d"})).await.tool_result.unwrap();
    assert_eq!(read["markdown"], "## The plan for API work\n\nline\n\nnext\n");
    assert_eq!(read["words"], 2);
}

#[test]
fn title_and_sentence_case() {
    assert_eq!(title_case("results and next steps"), "Results and Next Steps");
    assert_eq!(title_case("what it is for"), "What It Is For");
    assert_eq!(sentence_case("Results And Next Steps"), "Results and next steps");
}

#[test]
fn a_style_with_impossible_limits_is_refused_naming_the_field() {
    let style = Style { max_heading_depth: Some(7), ..Style::default() };
    assert_eq!(style.check().unwrap_err().0, "style.max_heading_depth");
    let style = Style { max_section_words: Some(0), ..Style::default() };
    assert_eq!(style.check().unwrap_err().0, "style.max_section_words");
}
