//! `session_search`: episodic memory, a cognitive action. The agent searches the earlier
//! episodes of the runs its suite names (`agent: {session_search: {runs: [...]}}`) through
//! each run's full-text index (`log::search`), built or built again on first use. The
//! world never sees the call; the agent answers it itself.

use std::path::PathBuf;
use std::sync::Mutex;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::contract::{ErrorType, SESSION_SEARCH_TOOL, ToolAnnotations, ToolError, ToolSpec};
use crate::log::search::{Filters, SearchError, SearchIndex, check_query};

/// The most hits one call returns.
pub const MAX_HITS: usize = 20;

/// A suite's `agent.session_search`, as written.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSearchConfig {
    /// Run folders, relative to the suite file.
    pub runs: Vec<PathBuf>,
    /// Hits per call when the model does not say (default [`DEFAULT_HITS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// Whether the episodes of the agent's own task are searched too (default: not, so an
    /// earlier attempt at the same task cannot hand over its answer).
    #[serde(default)]
    pub same_task: bool,
}

/// Hits per call when neither the suite nor the model says.
pub const DEFAULT_HITS: usize = 5;

/// The runs an agent may search, their indexes opened once for the whole run.
pub struct SessionSearch {
    /// The run folders, as the suite resolved them.
    pub runs: Vec<PathBuf>,
    /// Hits per call when the model does not say.
    pub limit: usize,
    /// Whether the episodes of the agent's own task are searched too.
    pub same_task: bool,
    /// Opened on the first call: one index per run, or why they could not be had.
    indexes: Mutex<Option<Result<Vec<SearchIndex>, String>>>,
}

/// A call's arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    query: String,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    outcome: Option<String>,
}

impl std::fmt::Debug for SessionSearch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionSearch").field("runs", &self.runs).field("limit", &self.limit).finish_non_exhaustive()
    }
}

impl SessionSearch {
    pub fn new(runs: Vec<PathBuf>, limit: usize, same_task: bool) -> Self {
        SessionSearch { runs, limit: limit.clamp(1, MAX_HITS), same_task, indexes: Mutex::new(None) }
    }

    /// Answers a call of an agent working on `task_id`: the best hits, or a tool error (a
    /// query FTS5 cannot parse, or longer than a query may be, is the model's to fix:
    /// `ValidationError`). Each index's search is given up once `over` (the episode's
    /// deadline and the run's stop) says so: the loop cannot interrupt it from outside.
    pub fn search(
        &self,
        arguments: &Value,
        task_id: &str,
        over: impl FnMut() -> bool + Clone + Send + 'static,
    ) -> Result<Value, ToolError> {
        let call: Call = serde_json::from_value(arguments.clone()).map_err(|e| {
            ToolError::new(ErrorType::ValidationError, format!("invalid arguments for `{SESSION_SEARCH_TOOL}`: {e}"))
        })?;
        check_query(&call.query).map_err(|e| {
            ToolError::new(ErrorType::ValidationError, e).suggest("search for a few distinctive words or a phrase")
        })?;
        if let Some(outcome) = &call.outcome {
            crate::log::search::parse_outcome(outcome).map_err(|e| ToolError::new(ErrorType::ValidationError, e))?;
        }
        let limit = call.limit.unwrap_or(self.limit).clamp(1, MAX_HITS);
        let filters = Filters {
            outcome: call.outcome,
            not_task: (!self.same_task).then(|| task_id.to_owned()),
            ..Filters::default()
        };
        let mut held = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
        let indexes = held.get_or_insert_with(|| {
            self.runs.iter().map(|dir| SearchIndex::open(dir).map_err(|e| e.to_string())).collect()
        });
        let indexes = indexes.as_mut().map_err(|e| ToolError::new(ErrorType::ExecutionError, e.clone()))?;
        let mut hits = Vec::new();
        for index in indexes {
            hits.extend(index.search_until(&call.query, &filters, limit, over.clone()).map_err(|e| match e {
                SearchError::Query { .. } => ToolError::new(ErrorType::ValidationError, e.to_string()),
                SearchError::Stopped => ToolError::new(ErrorType::TimeoutError, e.to_string()),
                _ => ToolError::new(ErrorType::ExecutionError, e.to_string()),
            })?);
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        hits.truncate(limit);
        let hits: Vec<Value> = hits
            .into_iter()
            .map(|h| {
                json!({
                    "run": h.run_id, "episode_id": h.episode_id, "task_id": h.task_id, "outcome": h.outcome,
                    "step": h.step, "actor": h.actor, "type": h.kind, "name": h.name, "snippet": h.snippet,
                })
            })
            .collect();
        Ok(json!({"count": hits.len(), "hits": hits}))
    }
}

/// The spec the model is shown.
pub fn tool_spec() -> ToolSpec {
    ToolSpec::new(
        SESSION_SEARCH_TOOL,
        "Search the earlier episodes you can remember (other attempts at other tasks): what was said, the tool \
         calls and their results, the final answers and how they were scored. Best matches first, each with its \
         episode, task, outcome, step and a snippet with the matched words in [brackets]. The query: words, \
         \"a phrase\", prefix*, AND, OR, NOT, parentheses.",
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to find."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_HITS, "description": "The most hits."},
                "outcome": {"type": "string", "enum": ["passed", "failed", "scored", "unscored", "cancelled"],
                            "description": "Only episodes that ended so."}
            },
            "required": ["query"],
            "additionalProperties": false
        }),
    )
    .annotated(ToolAnnotations::READ_ONLY)
}
