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
