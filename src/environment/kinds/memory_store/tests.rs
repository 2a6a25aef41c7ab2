use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};

use super::*;

fn world() -> (tempfile::TempDir, MemoryWorld) {
    let dir = tempfile::tempdir().unwrap();
    let world = MemoryWorld::open(&dir.path().join("m.sqlite")).unwrap();
    (dir, world)
}

async fn call(world: &MemoryWorld, name: &str, arguments: Value) -> Value {
    world.call(&Actor::Main, name, arguments).await.unwrap_or_else(|e| panic!("{name}: {}", e.message))
}

fn summaries(result: &Value) -> Vec<&str> {
    result["entries"].as_array().unwrap().iter().map(|e| e["summary"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn entries_are_listed_newest_first_and_limited() {
    let (_dir, world) = world();
    for (i, time) in ["2023-05-01T10:00:00Z", "2023-05-03T10:00:00Z", "2023-05-02T10:00:00Z"].iter().enumerate() {
        let args = json!({"summary": format!("s{i}"), "raw_entry": "r", "tags": {"role": "user"}, "time": time});
        assert_eq!(call(&world, "add_entry", args).await["stored"], true);
    }
    assert_eq!(summaries(&call(&world, "list_entries", json!({"limit": 2})).await), ["s1", "s2"]);
    assert_eq!(call(&world, "await_consistency", json!({})).await["entries"], 3);
}

#[tokio::test]
async fn an_entry_with_a_known_key_is_not_stored_twice() {
    let (_dir, world) = world();
    let args = json!({"summary": "s", "raw_entry": "r", "key": "t/0/1"});
    let first = call(&world, "add_entry", args.clone()).await;
    let again = call(&world, "add_entry", args).await;
    assert_eq!((first["stored"].clone(), again["stored"].clone()), (json!(true), json!(false)));
    assert_eq!(first["entry_id"], again["entry_id"]);
    assert_eq!(call(&world, "await_consistency", json!({})).await["entries"], 1);
}

#[tokio::test]
async fn search_ranks_by_fts5_and_keeps_memories_apart() {
    let (_dir, world) = world();
    let add = |summary: &str, memory: &str| json!({"summary": summary, "raw_entry": "", "memory_id": memory});
    call(&world, "add_entry", add("The user adopted a dog named Rex", "a")).await;
    call(&world, "add_entry", add("The user's dog Rex likes the dog park; dog treats", "a")).await;
    call(&world, "add_entry", add("The user moved to Lisbon", "a")).await;
    call(&world, "add_entry", add("A dog in another memory", "b")).await;
    let found = call(&world, "search_entries", json!({"query": "What is my dog's name?", "memory_id": "a"})).await;
    assert_eq!(
        summaries(&found),
        ["The user's dog Rex likes the dog park; dog treats", "The user adopted a dog named Rex"]
    );
    let phrase = json!({"query": "\"dog named\" OR Lisb*", "syntax": "fts5", "memory_id": "a"});
    let found = call(&world, "search_entries", phrase).await;
    assert_eq!(found["entries"].as_array().unwrap().len(), 2, "{found}");
    let bad = world.call(&Actor::Main, "search_entries", json!({"query": "\"open", "syntax": "fts5"})).await;
    assert!(bad.unwrap_err().message.contains("the query `\"open` failed"));
}

#[tokio::test]
async fn the_context_is_replaced_and_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.sqlite");
    {
        let world = MemoryWorld::open(&path).unwrap();
        assert_eq!(call(&world, "get_context", json!({})).await["context"], "");
        call(&world, "put_context", json!({"content": "first"})).await;
        call(&world, "put_context", json!({"content": "second", "vault_id": "v"})).await;
        call(&world, "put_context", json!({"content": "third"})).await;
    }
    let world = MemoryWorld::open(&path).unwrap();
    assert_eq!(call(&world, "get_context", json!({})).await["context"], "third");
    assert_eq!(call(&world, "get_context", json!({"vault_id": "v"})).await["context"], "second");
}

#[tokio::test]
async fn a_query_past_the_caps_is_refused_not_run() {
    // FTS5's time grows with the square of a query's matching terms: 8,000 took 28 s.
    let (_dir, world) = world();
    call(&world, "add_entry", json!({"summary": "dog", "raw_entry": ""})).await;
    let many: Vec<String> = (0..257).map(|i| format!("w{i}")).collect();
    let long = "dog ".repeat(1100);
    for (syntax, query) in [("words", many.join(" ")), ("fts5", many.join(" OR ")), ("words", long)] {
        let args = json!({"query": query, "syntax": syntax});
        let refused = world.call(&Actor::Main, "search_entries", args).await.unwrap_err();
        assert_eq!(refused.kind, ErrorType::ValidationError, "{syntax}: {}", refused.message);
        assert!(refused.message.contains("at most"), "{}", refused.message);
    }
    // Within the caps, a word asked many times is searched once.
    let found = call(&world, "search_entries", json!({"query": "dog ".repeat(256)})).await;
    assert_eq!(summaries(&found), ["dog"]);
    assert_eq!(words_query("Dog dog? DOG cat"), "\"dog\" OR \"cat\"");
}

#[test]
fn a_statement_is_interrupted_once_the_call_is_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("m.sqlite")).unwrap();
    let at = MemoryRef { vault: "v", memory: "m" };
    for i in 0..2000 {
        let summary = format!("dog number {i}");
        let entry = NewEntry { summary: &summary, raw_entry: "", tags: &Value::Null, time: "t", key: None };
        store.add_entry(at, &entry).unwrap();
    }
    let kept = store.until(|| false, |s| s.search(at, "\"dog\"", 5)).unwrap();
    assert_eq!(kept.len(), 5);
    let given_up = store.until(|| true, |s| s.search(at, "\"dog\"", 5)).unwrap_err();
    assert_eq!(given_up.sqlite_error_code(), Some(rusqlite::ErrorCode::OperationInterrupted), "{given_up}");
    // The handler goes with the work: the store answers again.
    assert_eq!(store.search(at, "\"dog\"", 5).unwrap().len(), 5);
}

#[tokio::test]
async fn a_call_past_the_episodes_end_is_stopped_inside_sqlite() {
    let (_dir, world) = world();
    for i in 0..2000 {
        call(&world, "add_entry", json!({"summary": format!("dog number {i}"), "raw_entry": ""})).await;
    }
    let over = Arc::new(AtomicBool::new(false));
    let seen = over.clone();
    world.begin(Arc::new(move || seen.load(Ordering::Relaxed)));
    assert_eq!(summaries(&call(&world, "search_entries", json!({"query": "dog", "limit": 1})).await).len(), 1);
    // The deadline passes (or the run is stopped): the statement is interrupted, not run out.
    over.store(true, Ordering::Relaxed);
    let stopped = world.call(&Actor::Main, "search_entries", json!({"query": "dog"})).await.unwrap_err();
    assert_eq!(stopped.kind, ErrorType::TimeoutError, "{}", stopped.message);
    assert!(stopped.message.contains("the episode's time is up"), "{}", stopped.message);
}
