//! Subagents (seed 001 `self.subagent(prompt)`, seed 004 `delegate_task`): a cognitive
//! action of the agent. `delegate_task(goal, context, tools)` starts a child agent with a
//! fresh transcript, the suite's subagent prompt, a subset of its parent's tools and its
//! own actor (`main.1`, `main.1.2`, …), so its own world model over the same world. The
//! children of one turn run at once; each runs its own loop (propose, the environment runs
//! its calls, observe) until its `final_answer`, which becomes the observation of its
//! parent's call. The whole tree shares the episode's limits ([`EpisodeTree`]).
//!
//! The agent still never executes a tool: a child's calls go to the environment through
//! [`WorldModelView::act`](super::WorldModelView::act), which checks the permission rules
//! and runs them as the episode's loop does.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::join_all;
use serde_json::{Value, json};

use super::{Agent, AgentFault, Budget, ToolCallingAgent, Turn};
use crate::contract::{Actor, ErrorType, FINAL_TOOL, Observation, ToolCall, ToolError, ToolSpec};
use crate::log::{Event, Termination, Usage};
use crate::model::LanguageModel;
use crate::model::limiter::Deadline;

/// The name of the cognitive action that starts a subagent.
pub const DELEGATE_TOOL: &str = "delegate_task";

/// The spec of `delegate_task`, as the model is offered it.
pub fn delegate_spec() -> ToolSpec {
    ToolSpec::new(
        DELEGATE_TOOL,
        "Delegate a self-contained piece of work to a subagent with a fresh context. It works in the same \
         world with the tools you give it and returns its final answer and the files it wrote. Several \
         delegate_task calls in one turn run at the same time.",
        json!({
            "type": "object",
            "properties": {
                "goal": {"type": "string", "description": "What the subagent must achieve and answer."},
                "context": {"type": "string", "description": "What it needs to know that the goal does not say."},
                "tools": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "The names of the tools it may use, a subset of yours; all of yours when omitted."
                }
            },
            "required": ["goal"]
        }),
    )
}

/// Which model a subagent talks to: the main agent's, or under `mock`, its own script.
pub type ModelFor = Arc<dyn Fn(&Actor) -> Arc<dyn LanguageModel> + Send + Sync>;

/// A suite's `agent.subagent` and its limits, with the way to a child's model.
pub struct Subagents {
    /// The system prompt of every subagent, rendered for the task.
    pub system: String,
    /// How many `delegate_task` calls of one turn run; the rest are refused.
    pub max_children: u32,
    /// The deepest a subagent may be: the main agent is at 0, `main.1` at 1.
    pub max_depth: u32,
    pub models: ModelFor,
    pub model_name: String,
    pub require_final_answer: bool,
}

/// What the whole tree of agents of one episode shares: the episode's limits and what has
/// been spent of them, and the calls the subagents made (for the episode's trajectory).
/// The episode's loop and every child count against the same numbers.
pub struct EpisodeTree {
    pub max_steps: u32,
    pub max_tokens: Option<u64>,
    pub max_cost_usd: Option<f64>,
    pub deadline: Deadline,
    steps: AtomicU32,
    spent: Mutex<Spent>,
    subagent_calls: Mutex<SubagentCalls>,
}

#[derive(Default)]
struct Spent {
    usage: Usage,
    /// Known only while every model call so far had a price.
    cost_usd: Option<f64>,
    any: bool,
}

/// The calls subagents made, in the order they were dispatched, and those that failed.
#[derive(Debug, Default)]
pub struct SubagentCalls {
    pub calls: Vec<ToolCall>,
    pub errors: Vec<(String, ToolError)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is a single push or sum: a panic cannot leave one half-done.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl EpisodeTree {
    pub fn new(max_steps: u32, max_tokens: Option<u64>, max_cost_usd: Option<f64>, deadline: Deadline) -> Self {
        EpisodeTree {
            max_steps,
            max_tokens,
            max_cost_usd,
            deadline,
            steps: AtomicU32::new(0),
            spent: Mutex::default(),
            subagent_calls: Mutex::default(),
        }
    }

    /// Takes the next step of the episode for one agent's turn: its number, or `None` when
    /// the episode has used all its steps.
    pub fn take_step(&self) -> Option<u32> {
        let taken =
            self.steps.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < self.max_steps).then_some(n + 1));
        taken.ok().map(|n| n + 1)
    }

    /// The steps taken so far, by every agent.
    pub fn steps(&self) -> u32 {
        self.steps.load(Ordering::SeqCst)
    }

    /// What is left when the turn numbered `step` starts.
    pub fn budget(&self, step: u32) -> Budget {
        Budget {
            step,
            steps_left: self.max_steps.saturating_sub(self.steps()) + 1,
            deadline: self.deadline.clone(),
            tokens_left: self.max_tokens.map(|max| max.saturating_sub(self.usage().total())),
        }
    }

    /// Counts one turn's model calls.
    pub fn spend(&self, usage: Usage, cost_usd: Option<f64>) {
        let mut spent = lock(&self.spent);
        spent.usage.add(usage);
        spent.cost_usd = if spent.any { spent.cost_usd.zip(cost_usd).map(|(a, b)| a + b) } else { cost_usd };
        spent.any = true;
    }

    pub fn usage(&self) -> Usage {
        lock(&self.spent).usage
    }

    pub fn cost_usd(&self) -> Option<f64> {
        lock(&self.spent).cost_usd
    }

    /// The limit the tree has gone past (tokens, then cost), if any.
    pub fn over_budget(&self) -> Option<Termination> {
        let spent = lock(&self.spent);
        if self.max_tokens.is_some_and(|max| spent.usage.total() > max) {
            Some(Termination::TokenLimit)
        } else if self.max_cost_usd.zip(spent.cost_usd).is_some_and(|(max, cost)| cost > max) {
            Some(Termination::CostLimit)
        } else {
            None
        }
    }

    fn dispatched(&self, call: &ToolCall) {
        lock(&self.subagent_calls).calls.push(call.clone());
    }

    fn failed(&self, call_id: &str, error: &ToolError) {
        lock(&self.subagent_calls).errors.push((call_id.to_owned(), error.clone()));
    }

    /// The subagents' calls since the last time they were taken.
    pub fn take_subagent_calls(&self) -> SubagentCalls {
        std::mem::take(&mut *lock(&self.subagent_calls))
    }
}

/// How a child ended short of an answer.
enum ChildEnd {
    Answered(String),
    /// The shared limits ran out under it, or time did.
    Stopped(String),
}

/// A child about to run: its agent, the tools it was given, its task.
struct Child {
    agent: ToolCallingAgent,
    tools: Vec<ToolSpec>,
    goal: String,
    /// The files it changed: the `path` of each call that succeeded of a tool not marked
    /// read-only.
    written: Vec<String>,
}

impl ToolCallingAgent {
    /// Runs this turn's `delegate_task` calls: each either refused or a child, the children
    /// at once; each call is then answered in order (an `agent_action` event). A child's
    /// fault that is nobody's answer is the parent's too.
    pub(super) async fn delegate(&mut self, turn: &Turn<'_>, calls: Vec<ToolCall>) -> Result<(), AgentFault> {
        let mut answers: Vec<Option<Result<Value, ToolError>>> = vec![None; calls.len()];
        let mut children = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            match self.start_child(turn, call, children.len()) {
                Ok(child) => children.push((i, child)),
                Err(refusal) => answers[i] = Some(Err(refusal)),
            }
        }
        let runs = children.iter_mut().map(|(i, child)| async move { (*i, run_child(child, turn).await) });
        let mut fault = None;
        for ((i, result), (_, child)) in join_all(runs).await.into_iter().zip(&children) {
            let actor = child.agent.actor.clone();
            answers[i] = Some(match result {
                Ok(ChildEnd::Answered(answer)) => {
                    // What it wrote, then what its own subagents wrote.
                    let mut written = child.written.clone();
                    for path in &child.agent.written_below {
                        if !written.contains(path) {
                            written.push(path.clone());
                        }
                    }
                    for path in &written {
                        if !self.written_below.contains(path) {
                            self.written_below.push(path.clone());
                        }
                    }
                    Ok(json!({"actor": actor, "answer": answer, "files_written": written}))
                }
                Ok(ChildEnd::Stopped(why)) => Err(ToolError::new(
                    ErrorType::Cancelled,
                    format!("subagent {actor} stopped without an answer: {why}"),
                )),
                Err(child_fault) => {
                    let message = format!("subagent {actor}: {}", child_fault.message);
                    let error = ToolError::new(ErrorType::ExecutionError, message.clone());
                    fault.get_or_insert(AgentFault { cause: child_fault.cause, message });
                    Err(error)
                }
            });
        }
        for (call, answer) in calls.iter().zip(answers) {
            let answer = answer.unwrap_or_else(|| Err(ToolError::new(ErrorType::Cancelled, "not run")));
            self.answer_own(turn, call, crate::log::ActionClass::Cognitive, answer);
        }
        fault.map_or(Ok(()), Err)
    }

    /// A child for `call`, or why there is none. `running` children of this turn have
    /// started before it.
    fn start_child(&mut self, turn: &Turn<'_>, call: &ToolCall, running: usize) -> Result<Child, ToolError> {
        let offered = self.own_tools.iter().any(|t| t.name == DELEGATE_TOOL);
        let Some(config) = self.subagents.clone().filter(|_| offered) else {
            let why = match &self.subagents {
                None => "this suite has no subagents (`agent.subagent` is not set)".to_owned(),
                Some(_) => format!("`{DELEGATE_TOOL}` was not given to {}", self.actor),
            };
            return Err(ToolError::new(ErrorType::ToolNotFound, format!("`{DELEGATE_TOOL}` is not available: {why}")));
        };
        if let Some(limit) = turn.tree.over_budget() {
            let message = format!("not started: the episode reached its {}", limit.as_str().replace('_', " "));
            return Err(ToolError::new(ErrorType::Cancelled, message));
        }
        if running >= config.max_children as usize {
            return Err(ToolError::new(
                ErrorType::ExecutionError,
                format!("at most {} subagents run at once: this one was not started", config.max_children),
            )
            .suggest("delegate it again in a later turn"));
        }
        let invalid = |message: String| ToolError::new(ErrorType::ValidationError, message);
        let goal = match call.arguments.get("goal") {
            Some(Value::String(goal)) if !goal.trim().is_empty() => goal.clone(),
            _ => return Err(invalid(format!("`{DELEGATE_TOOL}` needs a `goal`, a non-empty text"))),
        };
        let context = match call.arguments.get("context") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(c.clone()),
            Some(other) => return Err(invalid(format!("`context` is a text, not {other}"))),
        };
        let mine: Vec<&str> = turn.tools.iter().map(|t| t.name.as_str()).collect();
        let (given, may_delegate) = match call.arguments.get("tools") {
            None | Some(Value::Null) => (mine.iter().map(|n| n.to_string()).collect::<Vec<_>>(), true),
            Some(Value::Array(items)) => {
                let mut names = Vec::with_capacity(items.len());
                let mut delegate = false;
                for item in items {
                    let Some(name) = item.as_str() else {
                        return Err(invalid(format!("`tools` is a list of tool names, not {item}")));
                    };
                    if name == DELEGATE_TOOL {
                        delegate = true;
                    } else if mine.contains(&name) {
                        names.push(name.to_owned());
                    } else {
                        let message = format!("`{name}` is not one of your tools ({})", mine.join(", "));
                        return Err(invalid(message));
                    }
                }
                (names, delegate)
            }
            Some(other) => return Err(invalid(format!("`tools` is a list of tool names, not {other}"))),
        };
        let tools: Vec<ToolSpec> =
            turn.tools.iter().filter(|t| t.name == FINAL_TOOL || given.contains(&t.name)).cloned().collect();

        self.children += 1;
        let actor = self.actor.child(self.children);
        let model = (config.models)(&actor);
        let mut agent =
            ToolCallingAgent::new(model, &config.model_name, Some(config.system.clone()), config.require_final_answer);
        agent.actor = actor;
        if may_delegate {
            agent = agent.with_subagents(config.clone());
        }
        let goal = match context {
            Some(context) if !context.trim().is_empty() => format!("{goal}\n\nContext:\n{context}"),
            _ => goal,
        };
        Ok(Child { agent, tools, goal, written: Vec::new() })
    }
}

/// One child's loop, as the episode's loop runs the main agent's: a step from the shared
/// budget, the child proposes, the environment runs its calls at once (each logged, and a
/// tool the child was not given is refused without reaching the world), the observations
/// go back to it; until its `final_answer`, the episode's limits, or a fault.
async fn run_child(child: &mut Child, parent: &Turn<'_>) -> Result<ChildEnd, AgentFault> {
    let tree = parent.tree;
    let first = Observation {
        call_id: None,
        done: false,
        error: None,
        tool_result: None,
        messages: vec![child.goal.clone()],
        info: Default::default(),
    };
    let mut observations = vec![first];
    loop {
        if tokio::time::Instant::now() >= tree.deadline.at() {
            return Ok(ChildEnd::Stopped("the episode reached its time limit".into()));
        }
        let Some(step) = tree.take_step() else {
            return Ok(ChildEnd::Stopped("the episode reached its max steps".into()));
        };
        let turn = Turn {
            observations: &observations,
            tools: &child.tools,
            budget: tree.budget(step),
            recorder: parent.recorder,
            world: parent.world,
            tree,
        };
        let proposal = child.agent.propose(turn).await?;
        tree.spend(proposal.usage, proposal.cost_usd);
        if let Some(limit) = tree.over_budget() {
            let why = format!("the episode reached its {}", limit.as_str().replace('_', " "));
            for call in &proposal.calls {
                parent.recorder.emit(&Event::ActionDispatched { step, call: call.clone() });
                tree.dispatched(call);
                let obs = Observation::of_error(
                    &call.call_id,
                    ToolError::new(ErrorType::Cancelled, format!("not run: {why}")),
                );
                parent.recorder.emit(&Event::Observation { step, observation: obs });
            }
            return Ok(ChildEnd::Stopped(why));
        }
        for call in &proposal.calls {
            parent.recorder.emit(&Event::ActionDispatched { step, call: call.clone() });
            tree.dispatched(call);
        }
        let given = &child.tools;
        let runs = proposal.calls.iter().map(|call| async move {
            let obs = if given.iter().any(|t| t.name == call.name) {
                parent.world.act(call, step, parent.recorder).await
            } else {
                let names: Vec<&str> = given.iter().map(|t| t.name.as_str()).collect();
                let error = ToolError::new(ErrorType::ToolNotFound, format!("`{}` was not given to you", call.name))
                    .suggest(format!("call one of: {}", names.join(", ")));
                Observation::of_error(&call.call_id, error)
            };
            parent.recorder.emit(&Event::Observation { step, observation: obs.clone() });
            obs
        });
        let observed = join_all(runs).await;
        let mut answer = None;
        for (call, obs) in proposal.calls.iter().zip(&observed) {
            if let Some(error) = &obs.error {
                tree.failed(&call.call_id, error);
                if let Some(fault) = AgentFault::of_call(call, obs) {
                    return Err(fault);
                }
                continue;
            }
            let writes = child.tools.iter().any(|t| t.name == call.name && t.annotations.is_some_and(|a| !a.read_only));
            if let Some(path) = call.arguments.get("path").and_then(Value::as_str).filter(|_| writes)
                && !child.written.iter().any(|w| w == path)
            {
                child.written.push(path.to_owned());
            }
            if obs.done && call.name == FINAL_TOOL && answer.is_none() {
                answer = Some(obs.answer_text());
            }
        }
        if let Some(answer) = answer {
            return Ok(ChildEnd::Answered(answer));
        }
        observations = observed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tree(max_steps: u32, max_tokens: Option<u64>, max_cost_usd: Option<f64>) -> EpisodeTree {
        EpisodeTree::new(max_steps, max_tokens, max_cost_usd, Deadline::after(Duration::from_secs(60)))
    }

    fn tokens(n: u64) -> Usage {
        Usage { input_tokens: n, ..Usage::default() }
    }

    #[test]
    fn steps_are_numbered_across_the_tree_and_run_out_for_everyone() {
        let tree = tree(3, None, None);
        assert_eq!([tree.take_step(), tree.take_step(), tree.take_step()], [Some(1), Some(2), Some(3)]);
        assert_eq!(tree.take_step(), None);
        assert_eq!(tree.steps(), 3, "a refused step is not taken");
    }

    #[test]
    fn steps_taken_at_once_are_each_taken_once() {
        let tree = Arc::new(tree(1000, None, None));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let tree = tree.clone();
                std::thread::spawn(move || (0..300).filter_map(|_| tree.take_step()).collect::<Vec<_>>())
            })
            .collect();
        let mut all: Vec<u32> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        all.sort();
        assert_eq!(all, (1..=1000).collect::<Vec<_>>());
    }

    #[test]
    fn spending_counts_every_agent_and_the_cost_is_known_only_while_every_call_had_a_price() {
        let tree = tree(10, Some(100), Some(1.0));
        tree.spend(tokens(60), Some(0.25));
        assert_eq!(tree.budget(2).tokens_left, Some(40));
        assert_eq!(tree.over_budget(), None);
        tree.spend(tokens(41), Some(0.25));
        assert_eq!((tree.usage().total(), tree.cost_usd()), (101, Some(0.5)));
        assert_eq!(tree.over_budget(), Some(Termination::TokenLimit));

        let tree = self::tree(10, None, Some(1.0));
        tree.spend(tokens(1), Some(0.75));
        tree.spend(tokens(1), Some(0.5));
        assert_eq!(tree.over_budget(), Some(Termination::CostLimit));
        tree.spend(tokens(1), None);
        assert_eq!(tree.cost_usd(), None, "one call without a price: the cost is unknown");
        tree.spend(tokens(1), Some(0.1));
        assert_eq!(tree.cost_usd(), None, "and stays unknown");
    }

    #[test]
    fn a_budget_says_what_is_left_when_a_turn_starts() {
        let tree = tree(5, None, None);
        let step = tree.take_step().unwrap();
        let budget = tree.budget(step);
        assert_eq!((budget.step, budget.steps_left, budget.tokens_left), (1, 5, None));
        tree.take_step();
        let step = tree.take_step().unwrap();
        assert_eq!(tree.budget(step).steps_left, 3, "steps 3, 4 and 5 are left when step 3 starts");
    }

    #[test]
    fn a_childs_actor_extends_its_parents() {
        assert_eq!(Actor::Main.child(2), Actor::Subagent(vec![2]));
        assert_eq!(Actor::Subagent(vec![2]).child(1), Actor::Subagent(vec![2, 1]));
        assert_eq!((Actor::Main.depth(), Actor::Subagent(vec![2, 1]).depth()), (0, 2));
    }
}
