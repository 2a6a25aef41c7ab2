//! The `oracle` agent: no model. It runs the task's reference solution (`solution:`, or a
//! Harbor task's `solution/solve.sh`) in the world, one `run_command` per turn, then gives
//! its final answer; the task is then scored as usual. A task set whose tasks do not all
//! pass under the oracle has a broken task (or verifier).

use async_trait::async_trait;
use serde_json::json;

use crate::agent::kinds::{AgentKind, AgentSettings};
use crate::agent::{Agent, AgentFault, AgentSetup, Lent, Proposal, Turn};
use crate::config::decode::ConfigError;
use crate::config::kind_keys::KindKeys;
use crate::contract::{FINAL_TOOL, ToolCall};
use crate::log::UnscoredCause;

/// `kind: oracle`: no keys of its own.
pub struct Oracle;

impl AgentKind for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }

    fn decode(&self, _keys: &KindKeys<'_>) -> Result<AgentSettings, ConfigError> {
        Ok(AgentSettings::Oracle)
    }

    fn build(&self, setup: AgentSetup<'_>, _lent: Lent) -> Box<dyn Agent> {
        Box::new(OracleAgent::new(&setup.task.id, setup.task.solution.clone()))
    }
}

/// The tool the solution's commands run through (the `shell` kind's).
const RUN_COMMAND: &str = "run_command";

pub struct OracleAgent {
    task_id: String,
    solution: Vec<String>,
    /// How many of the solution's commands have been proposed.
    next: usize,
}

impl OracleAgent {
    pub fn new(task_id: &str, solution: Vec<String>) -> Self {
        OracleAgent { task_id: task_id.to_owned(), solution, next: 0 }
    }
}

#[async_trait]
impl Agent for OracleAgent {
    async fn propose(&mut self, turn: Turn<'_>) -> Result<Proposal, AgentFault> {
        if self.solution.is_empty() {
            return Err(AgentFault {
                cause: UnscoredCause::Other("no_solution".into()),
                message: format!(
                    "task `{}` has no reference solution for the oracle (`solution:`, or solution/solve.sh)",
                    self.task_id
                ),
            });
        }
        let step = turn.allowance.step;
        let call = match self.solution.get(self.next) {
            Some(command) => ToolCall::new(format!("oracle_{step}"), RUN_COMMAND, json!({ "command": command })),
            None => {
                let answer = format!("ran the reference solution ({} command(s))", self.solution.len());
                ToolCall::new(format!("oracle_{step}"), FINAL_TOOL, json!({ "answer": answer }))
            }
        };
        self.next += 1;
        Ok(Proposal { calls: vec![call], ..Proposal::default() })
    }
}
