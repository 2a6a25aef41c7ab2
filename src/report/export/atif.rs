//! ATIF, Harbor's Agent Trajectory Interchange Format (`ATIF-v1.6`): one trajectory file
//! per agent of an episode. The main agent's file is named after the episode; each subagent
//! has its own file and session, referenced from the observation of the `delegate_task` call
//! that started it (`subagent_trajectory_ref`), as ATIF expresses delegation.

use serde_json::{Map, Value, json};

use super::EpisodeMeta;
use super::conversation::{Conversation, ConversationTurn, Entry, Thread};
use crate::contract::Actor;

pub const SCHEMA_VERSION: &str = "ATIF-v1.6";

/// The episode's trajectories, as (file name, document), the main agent's first.
pub fn trajectories(meta: &EpisodeMeta, conversation: &Conversation) -> Vec<(String, Value)> {
    conversation
        .threads
        .iter()
        .filter(|t| t.actor.is_main() || t.turns().next().is_some())
        .map(|thread| (file_name(&meta.episode_id, &thread.actor), trajectory(meta, conversation, thread)))
        .collect()
}

fn file_name(episode_id: &str, actor: &Actor) -> String {
    if actor.is_main() { format!("{episode_id}.json") } else { format!("{episode_id}.{actor}.json") }
}

fn session_id(episode_id: &str, actor: &Actor) -> String {
    if actor.is_main() { episode_id.to_owned() } else { format!("{episode_id}/{actor}") }
}

fn trajectory(meta: &EpisodeMeta, conversation: &Conversation, thread: &Thread) -> Value {
    let mut steps: Vec<Value> = Vec::new();
    let mut push = |mut step: Map<String, Value>| {
        step.insert("step_id".into(), json!(steps.len() + 1));
        steps.push(Value::Object(step));
    };
    if let Some(system) = &thread.system {
        push(plain("system", system, None));
    }
    if let Some(goal) = &thread.goal {
        push(plain("user", goal, None));
    }
    for entry in &thread.entries {
        match entry {
            Entry::User { ts, text } => push(plain("user", text, Some(ts))),
            Entry::Assistant(turn) => push(agent_step(meta, conversation, turn)),
        }
    }
    let usage = thread.usage();
    // The main agent's cost is the episode's, its subagents' included, as ATIF asks.
    let cost = if thread.actor.is_main() { meta.cost_usd } else { thread.cost_usd() };
    let mut agent = json!({
        "name": "runner",
        "version": meta.runner_version,
        "model_name": meta.model,
        "extra": {"actor": thread.actor.to_string()},
    });
    if let Some(tools) = &thread.tools {
        agent["tool_definitions"] = json!(tools);
    }
    let mut final_metrics = json!({
        "total_prompt_tokens": usage.input_tokens,
        "total_completion_tokens": usage.output_tokens,
        "total_cached_tokens": usage.cached_tokens,
        "total_steps": steps.len(),
    });
    if let Some(cost) = cost {
        final_metrics["total_cost_usd"] = json!(cost);
    }
    let mut extra = json!({
        "run_id": meta.run_id,
        "episode_id": meta.episode_id,
        "suite": meta.suite,
        "task_id": meta.task_id,
        "epoch": meta.epoch,
        "outcome": meta.outcome,
        "termination": meta.termination,
    });
    if let Some(parent) = parent(&thread.actor) {
        extra["parent_session_id"] = json!(session_id(&meta.episode_id, &parent));
    }
    json!({
        "schema_version": SCHEMA_VERSION,
        "session_id": session_id(&meta.episode_id, &thread.actor),
        "agent": agent,
        "steps": steps,
        "final_metrics": final_metrics,
        "extra": extra,
    })
}

fn parent(actor: &Actor) -> Option<Actor> {
    match actor {
        Actor::Subagent(path) if path.len() > 1 => Some(Actor::Subagent(path[..path.len() - 1].to_vec())),
        Actor::Subagent(_) => Some(Actor::Main),
        Actor::Main | Actor::User => None,
    }
}

fn plain(source: &str, message: &str, ts: Option<&String>) -> Map<String, Value> {
    let mut step = Map::new();
    step.insert("source".into(), json!(source));
    step.insert("message".into(), json!(message));
    if let Some(ts) = ts {
        step.insert("timestamp".into(), json!(ts));
    }
    step
}

fn agent_step(meta: &EpisodeMeta, conversation: &Conversation, turn: &ConversationTurn) -> Map<String, Value> {
    let mut step = plain("agent", turn.text.as_deref().unwrap_or_default(), Some(&turn.ts));
    step.insert("model_name".into(), json!(turn.model));
    let mut metrics = json!({
        "prompt_tokens": turn.usage.input_tokens,
        "completion_tokens": turn.usage.output_tokens,
        "cached_tokens": turn.usage.cached_tokens,
    });
    if let Some(cost) = turn.cost_usd {
        metrics["cost_usd"] = json!(cost);
    }
    step.insert("metrics".into(), metrics);
    if turn.calls.is_empty() {
        return step;
    }
    let calls: Vec<Value> = turn
        .calls
        .iter()
        .map(|c| {
            // ATIF's arguments are an object; a model's non-object arguments are kept under `value`.
            let arguments = if c.arguments.is_object() { c.arguments.clone() } else { json!({"value": c.arguments}) };
            json!({"tool_call_id": c.id, "function_name": c.name, "arguments": arguments})
        })
        .collect();
    step.insert("tool_calls".into(), json!(calls));
    let results: Vec<Value> = turn
        .calls
        .iter()
        .filter_map(|c| {
            let result = conversation.results.get(&c.id)?;
            let mut value = json!({"source_call_id": c.id, "content": result.content});
            if let Some(child) = &result.child
                && conversation.thread(child).is_some()
            {
                value["subagent_trajectory_ref"] = json!([{
                    "session_id": session_id(&meta.episode_id, child),
                    "trajectory_path": file_name(&meta.episode_id, child),
                }]);
            }
            Some(value)
        })
        .collect();
    if !results.is_empty() {
        step.insert("observation".into(), json!({"results": results}));
    }
    step
}
