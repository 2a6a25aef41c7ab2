use serde_json::json;

use super::*;
use crate::contract::{Observation, ToolCall};
use crate::log::writer::write_line;
use crate::log::{Outcome, Termination, Usage};

/// A log under construction, one event at a time.
#[derive(Default)]
struct Log {
    out: Vec<u8>,
    seq: u64,
}

impl Log {
    fn push(&mut self, episode_id: Option<&str>, event: Event) -> &mut Self {
        self.seq += 1;
        let body = serde_json::to_vec(&event).unwrap();
        write_line(&mut self.out, "\"run-1\"", self.seq, "2026-01-01T00:00:00Z", episode_id, &body).unwrap();
        self
    }

    fn started(&mut self, id: &str, suite: &str, task: &str, model: &str) -> &mut Self {
        let event = Event::EpisodeStarted {
            suite: suite.into(),
            task_id: task.into(),
            task_digest: "d".into(),
            model: model.into(),
            epoch: 1,
            environment: "shell".into(),
            toolset: None,
            variant: None,
            sampling: Default::default(),
            digests: None,
            tags: Vec::new(),
            metadata: Default::default(),
        };
        self.push(Some(id), event)
    }

    fn call(&mut self, id: &str, step: u32, call: ToolCall, result: Value) -> &mut Self {
        let observation = Observation::of_result(&call.call_id, result);
        self.push(Some(id), Event::ActionDispatched { step, call });
        self.push(Some(id), Event::Observation { step, observation })
    }

    fn answer(&mut self, id: &str, step: u32, answer: &str) -> &mut Self {
        self.push(Some(id), Event::Final { step, call_id: "f".into(), answer: answer.into() })
    }

    fn finished(&mut self, id: &str, passed: bool) -> &mut Self {
        let event = Event::EpisodeFinished {
            outcome: Outcome::Scored { score: if passed { 1.0 } else { 0.0 }, passed },
            termination: Termination::FinalAnswer,
            steps: 2,
            tool_calls: 1,
            tool_errors: 0,
            usage: Usage::default(),
            cost_usd: None,
            wall_ms: 1.0,
            loop_ms: None,
            user_usage: None,
            user_cost_usd: None,
            agent_program: None,
        };
        self.push(Some(id), event)
    }

    fn write(&self, dir: &Path) {
        std::fs::write(dir.join("events.jsonl"), &self.out).unwrap();
    }
}

fn score(scorer: &str, explanation: &str) -> Event {
    Event::Score {
        scoring_id: "initial".into(),
        scorer: scorer.into(),
        value: 1.0,
        passed: true,
        weight: 1.0,
        explanation: explanation.into(),
        grader: None,
        check: Default::default(),
    }
}

/// Three episodes of two suites and two models: `e1` passed after listing the deploy
/// scripts, `e2` failed with a subagent reading a config, `e3` said "deploy" once.
fn three_episodes() -> Log {
    let mut log = Log::default();
    log.started("e1", "ops", "deploy-app", "mock")
        .call(
            "e1",
            1,
            ToolCall::new("c1", "run_command", json!({"command": "ls deploy/"})),
            json!({"stdout": "deploy.sh deploy-staging.sh rollback.sh"}),
        )
        .answer("e1", 2, "The deploy scripts are deploy.sh and deploy-staging.sh")
        .push(Some("e1"), score("includes", "the answer names deploy.sh"))
        .finished("e1", true);
    let sub =
        ToolCall { actor: Actor::Subagent(vec![1]), ..ToolCall::new("c2", "read_file", json!({"path": "app.toml"})) };
    log.started("e2", "ops", "read-config", "openai/gpt-4o-mini")
        .call("e2", 1, sub, json!({"content": "port = 8080\nname = kettle"}))
        .answer("e2", 2, "The port is 9090")
        .push(Some("e2"), score("llm_rubric", "The answer gives the wrong port; the file says 8080"))
        .finished("e2", false);
    log.started("e3", "docs", "summarise", "mock")
        .push(
            Some("e3"),
            Event::Said {
                step: 1,
                actor: Actor::User,
                text: "Summarise the notes about the release and deploy plan, please, in a few words".into(),
            },
        )
        .answer("e3", 2, "The release is on Friday")
        .finished("e3", true);
    log
}

fn indexed(log: &Log) -> (tempfile::TempDir, SearchIndex) {
    let dir = tempfile::tempdir().unwrap();
    log.write(dir.path());
    let index = SearchIndex::open(dir.path()).unwrap();
    (dir, index)
}

fn found(index: &SearchIndex, query: &str, filters: &Filters) -> Vec<(String, String)> {
    index.search(query, filters, 20).unwrap().into_iter().map(|h| (h.episode_id, h.kind)).collect()
}

#[test]
fn hits_are_ranked_by_bm25_the_densest_first() {
    let (_dir, index) = indexed(&three_episodes());
    let hits = index.search("deploy", &Filters::default(), 20).unwrap();
    let order: Vec<(&str, &str)> = hits.iter().map(|h| (h.episode_id.as_str(), h.kind.as_str())).collect();
    // The answer names "deploy" three times, the observation twice in fewer words, the
    // call's arguments and the score once; the user's long message once in many.
    assert_eq!(order.last(), Some(&("e3", "message")), "{order:?}");
    assert_eq!(order.len(), 5, "{order:?}");
    assert!(hits.windows(2).all(|w| w[0].score >= w[1].score), "best first: {hits:?}");
    assert_eq!(&order[..2], [("e1", "answer"), ("e1", "observation")], "{hits:?}");
    let observation = &hits[1];
    assert_eq!(observation.name.as_deref(), Some("run_command"), "an observation names its call's tool");
    assert_eq!((observation.step, observation.actor.as_str(), observation.run_id.as_str()), (Some(1), "main", "run-1"));
    assert_eq!(observation.snippet, "stdout [deploy].sh [deploy]-staging.sh rollback.sh");
}

#[test]
fn phrases_prefixes_and_boolean_operators_are_fts5s() {
    let (_dir, index) = indexed(&three_episodes());
    let any = Filters::default();
    assert_eq!(found(&index, "\"wrong port\"", &any), [("e2".to_string(), "score".to_string())]);
    assert_eq!(found(&index, "\"port wrong\"", &any), []);
    let prefixed: Vec<String> = found(&index, "kett*", &any).into_iter().map(|(e, _)| e).collect();
    assert_eq!(prefixed, ["e2"]);
    let both = found(&index, "release AND deploy", &any);
    assert_eq!(both, [("e3".to_string(), "message".to_string())]);
    let not = found(&index, "release NOT deploy", &any);
    assert_eq!(not, [("e3".to_string(), "answer".to_string())]);
    assert_eq!(found(&index, "8080 OR friday", &any).len(), 3);
}

#[test]
fn each_filter_narrows_the_hits() {
    let (_dir, index) = indexed(&three_episodes());
    let episodes = |filters: Filters| {
        let mut ids: Vec<String> =
            found(&index, "deploy OR port OR release", &filters).into_iter().map(|h| h.0).collect();
        ids.dedup();
        ids.sort();
        ids.dedup();
        ids
    };
    assert_eq!(episodes(Filters::default()), ["e1", "e2", "e3"]);
    assert_eq!(episodes(Filters { suite: Some("ops".into()), ..Filters::default() }), ["e1", "e2"]);
    assert_eq!(episodes(Filters { task: Some("summarise".into()), ..Filters::default() }), ["e3"]);
    assert_eq!(episodes(Filters { model: Some("openai/gpt-4o-mini".into()), ..Filters::default() }), ["e2"]);
    assert_eq!(episodes(Filters { outcome: Some("failed".into()), ..Filters::default() }), ["e2"]);
    assert_eq!(episodes(Filters { outcome: Some("scored".into()), ..Filters::default() }), ["e1", "e2", "e3"]);
    assert_eq!(episodes(Filters { outcome: Some("unscored".into()), ..Filters::default() }), Vec::<String>::new());
    assert_eq!(episodes(Filters { actor: Some("user".into()), ..Filters::default() }), ["e3"]);
    assert_eq!(episodes(Filters { actor: Some("main.1".into()), ..Filters::default() }), ["e2"]);
    assert_eq!(episodes(Filters { kind: Some(DocKind::Score), ..Filters::default() }), ["e1", "e2"]);
    assert_eq!(episodes(Filters { kind: Some(DocKind::ToolCall), ..Filters::default() }), ["e1"]);
    assert_eq!(episodes(Filters { not_task: Some("deploy-app".into()), ..Filters::default() }), ["e2", "e3"]);
    let limited = index.search("deploy", &Filters::default(), 2).unwrap();
    assert_eq!(limited.len(), 2, "--limit");
}

#[test]
fn an_index_that_no_longer_matches_its_log_is_built_again() {
    let mut log = three_episodes();
    let dir = tempfile::tempdir().unwrap();
    log.write(dir.path());
    let first = SearchIndex::open(dir.path()).unwrap();
    assert_eq!(first.freshness, Freshness::Built);
    assert!(dir.path().join(INDEX_FILE).is_file());
    assert!(first.search("zeppelin", &Filters::default(), 5).unwrap().is_empty());
    drop(first);
    assert_eq!(
        SearchIndex::open(dir.path()).unwrap().freshness,
        Freshness::Current,
        "reused while the log is the same"
    );
    // A resume appends an episode: the index is stale.
    log.started("e4", "ops", "airship", "mock").answer("e4", 1, "The zeppelin is ready").finished("e4", true);
    log.write(dir.path());
    let again = SearchIndex::open(dir.path()).unwrap();
    assert_eq!(again.freshness, Freshness::Rebuilt);
    assert_eq!(found(&again, "zeppelin", &Filters::default()), [("e4".to_string(), "answer".to_string())]);
    assert_eq!(again.counts().unwrap().0, 4);
    // An index that is not one (a file left half-written by hand) is built again too.
    drop(again);
    std::fs::write(dir.path().join(INDEX_FILE), b"not sqlite").unwrap();
    assert_eq!(SearchIndex::open(dir.path()).unwrap().freshness, Freshness::Rebuilt);
}

#[test]
fn a_query_fts5_cannot_parse_is_a_clear_error() {
    let (_dir, index) = indexed(&three_episodes());
    for bad in ["deploy AND", "\"unclosed", "(port", "NOT", "a.b:c"] {
        match index.search(bad, &Filters::default(), 5) {
            Err(e @ SearchError::Query { .. }) => {
                let text = e.to_string();
                assert!(text.starts_with(&format!("bad query {bad:?}: ")), "{text}");
                assert!(text.contains("\"a phrase\""), "says how to write one: {text}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn only_the_latest_attempt_of_an_episode_and_its_latest_scoring_count() {
    let mut log = Log::default();
    let gone = Outcome::Unscored { cause: crate::log::UnscoredCause::ProviderError, message: "503".into() };
    log.started("e1", "s", "t", "mock").answer("e1", 1, "first attempt walrus");
    let finished = |outcome| Event::EpisodeFinished {
        outcome,
        termination: Termination::FinalAnswer,
        steps: 1,
        tool_calls: 0,
        tool_errors: 0,
        usage: Usage::default(),
        cost_usd: None,
        wall_ms: 1.0,
        loop_ms: None,
        user_usage: None,
        user_cost_usd: None,
        agent_program: None,
    };
    log.push(Some("e1"), finished(gone));
    log.started("e1", "s", "t", "mock").answer("e1", 1, "second attempt walrus").finished("e1", true);
    let (_dir, index) = indexed(&log);
    let hits = index.search("walrus", &Filters::default(), 5).unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(hits[0].snippet.starts_with("second"), "{hits:?}");
    assert_eq!(hits[0].outcome, "passed");
    // A regrade appends its verdict: the outcome follows it.
    log.push(
        Some("e1"),
        Event::EpisodeScored { scoring_id: "r1".into(), outcome: Outcome::Scored { score: 0.0, passed: false } },
    );
    let (_dir, index) = indexed(&log);
    let hits = index.search("walrus", &Filters { outcome: Some("failed".into()), ..Filters::default() }, 5).unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
}

#[test]
fn grader_replies_are_left_to_their_scores() {
    let mut log = Log::default();
    log.started("e1", "s", "t", "mock");
    let call = |scorer: Option<&str>, text: &str| Event::ModelCall {
        model: "mock".into(),
        step: 1,
        request_digest: "d".into(),
        sampling: Default::default(),
        response: json!({"text": text}),
        usage: Usage::default(),
        latency_ms: 1.0,
        attempts: 1,
        cache_hit: false,
        cost_usd: None,
        error: None,
        cause: None,
        url: None,
        request: None,
        raw_response: None,
        scorer: scorer.map(str::to_owned),
        actor: Actor::Main,
        status: None,
        attempt: None,
        retried: false,
    };
    log.push(Some("e1"), call(None, "I will look for the marmot"));
    log.push(Some("e1"), call(Some("llm_rubric"), "The marmot was found {\"score\": 1}"));
    log.finished("e1", true);
    let (_dir, index) = indexed(&log);
    assert_eq!(found(&index, "marmot", &Filters::default()), [("e1".to_string(), "message".to_string())]);
}

#[test]
fn a_search_given_up_stops_and_a_model_query_past_the_caps_is_refused() {
    let (_dir, mut index) = indexed(&three_episodes());
    assert!(!index.search_until("deploy", &Filters::default(), 5, || false).unwrap().is_empty());
    match index.search_until("deploy OR port OR e1", &Filters::default(), 5, || true) {
        Err(SearchError::Stopped) => {}
        other => panic!("{other:?}"),
    }
    assert!(check_query(&"word ".repeat(MAX_QUERY_TERMS)).is_ok());
    // Operators are not terms.
    assert!(check_query(&"word OR ".repeat(MAX_QUERY_TERMS - 1)).is_ok());
    let many = check_query(&"word ".repeat(MAX_QUERY_TERMS + 1)).unwrap_err();
    assert!(many.contains("257 terms; at most 256"), "{many}");
    let long = check_query(&"x".repeat(MAX_QUERY_BYTES + 1)).unwrap_err();
    assert!(long.contains("4097 bytes; at most 4096"), "{long}");
}
