//! Plan mode (seed 001): a state of the agent in which it only looks. `enter_plan_mode` is a
//! cognitive action (the agent alone changes state); `exit_plan_mode(plan)` is hybrid: the
//! world hands the plan to the task's user, and the agent's own code reads the answer and
//! leaves plan mode when the user approved. While it is on, the agent offers its model only
//! the world's read-only tools, and refuses any other call itself: it never reaches the world.

use serde_json::{Value, json};

use crate::contract::{ENTER_PLAN_MODE, EXIT_PLAN_MODE, ErrorType, FINAL_TOOL, Observation, ToolError, ToolSpec};

/// What the model is told when plan mode begins, once.
pub const PLAN_MODE_REMINDER: &str = "Plan mode is on: you may only use tools that read (the others are refused). \
     Find out what you need, then call `exit_plan_mode` with your plan; the user approves it or tells you what to change.";

pub fn enter_spec() -> ToolSpec {
    ToolSpec::new(
        ENTER_PLAN_MODE,
        "Enter plan mode: from now on only read-only tools may be used, until the user approves your plan \
         (`exit_plan_mode`).",
        json!({"type": "object", "properties": {}, "additionalProperties": false}),
    )
}

/// The spec of `exit_plan_mode`, which the environment answers (it asks the user).
pub fn exit_spec() -> ToolSpec {
    ToolSpec::new(
        EXIT_PLAN_MODE,
        "Present your plan to the user. If the user approves, plan mode ends and you may carry it out; if not, \
         you get the user's feedback and stay in plan mode.",
        json!({
            "type": "object",
            "properties": {"plan": {"type": "string", "description": "The plan, step by step."}},
            "required": ["plan"],
            "additionalProperties": false
        }),
    )
}

/// Whether plan mode lets the agent call `spec`'s tool: the world's tools that only read
/// (annotated read-only and not destructive), the final answer, and `exit_plan_mode`.
pub fn allowed(spec: &ToolSpec) -> bool {
    spec.name == FINAL_TOOL
        || spec.name == EXIT_PLAN_MODE
        || spec.annotations.is_some_and(|a| a.read_only && !a.destructive)
}

/// The agent's plan-mode state.
#[derive(Debug, Default)]
pub struct PlanMode {
    on: bool,
    /// The reminder is due on the next turn (plan mode just began).
    reminder_due: bool,
    /// The `exit_plan_mode` calls (id, plan) sent to the world whose answer has not come
    /// back yet.
    pending_exits: Vec<(String, Value)>,
}

impl PlanMode {
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// The tools to offer: in plan mode, only those `allowed`, then `exit_plan_mode`;
    /// otherwise all of the world's, then `enter_plan_mode`.
    pub fn offer(&self, world: &[ToolSpec]) -> Vec<ToolSpec> {
        if self.on {
            world.iter().filter(|t| allowed(t) && t.name != EXIT_PLAN_MODE).cloned().chain([exit_spec()]).collect()
        } else {
            world.iter().cloned().chain([enter_spec()]).collect()
        }
    }

    /// `enter_plan_mode`: the result the model gets.
    pub fn enter(&mut self) -> Value {
        if self.on {
            return Value::String("Plan mode is already on.".into());
        }
        self.on = true;
        self.reminder_due = true;
        Value::String("Plan mode is on.".into())
    }

    /// Why plan mode refuses a call of `name` (a tool of `world`, or none), if it does.
    pub fn refusal(&self, name: &str, world: &[ToolSpec]) -> Option<ToolError> {
        if !self.on || name == FINAL_TOOL {
            return None;
        }
        match world.iter().find(|t| t.name == name) {
            Some(spec) if allowed(spec) => None,
            _ => Some(
                ToolError::new(
                    ErrorType::PermissionError,
                    format!("`{name}` was not run: plan mode allows only tools that read"),
                )
                .suggest("finish your plan and present it with `exit_plan_mode`; once the user approves it, act"),
            ),
        }
    }

    /// Why `exit_plan_mode` is refused outside plan mode, if it is.
    pub fn exit_refusal(&self) -> Option<ToolError> {
        (!self.on).then(|| {
            ToolError::new(ErrorType::ExecutionError, "plan mode is not on: there is no plan to present")
                .suggest("carry on, or call `enter_plan_mode` first")
        })
    }

    /// An `exit_plan_mode` call went to the world.
    pub fn exit_sent(&mut self, call_id: &str, arguments: &Value) {
        self.pending_exits.push((call_id.to_owned(), arguments.clone()));
    }

    /// The hybrid's second half: when `obs` answers a pending `exit_plan_mode`, plan mode
    /// ends if the user approved it. Returns the call's arguments and what the agent did,
    /// for its `agent_action`.
    pub fn exit_answered(&mut self, obs: &Observation) -> Option<(Value, Value)> {
        let call_id = obs.call_id.as_deref()?;
        let at = self.pending_exits.iter().position(|(id, _)| id == call_id)?;
        let (_, arguments) = self.pending_exits.remove(at);
        let approved = obs.error.is_none()
            && obs.tool_result.as_ref().and_then(|r| r.get("approved")).and_then(Value::as_bool) == Some(true);
        if approved {
            self.on = false;
            self.reminder_due = false;
        }
        Some((arguments, json!({"approved": approved, "plan_mode": self.on})))
    }

    /// The reminder to add before the next model call, once per entry into plan mode.
    pub fn take_reminder(&mut self) -> Option<&'static str> {
        std::mem::take(&mut self.reminder_due).then_some(PLAN_MODE_REMINDER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ToolAnnotations;

    fn world() -> Vec<ToolSpec> {
        let schema = json!({"type": "object"});
        vec![
            ToolSpec::new("read_file", "r", schema.clone()).annotated(ToolAnnotations::READ_ONLY),
            ToolSpec::new("write_file", "w", schema.clone()).annotated(ToolAnnotations::DESTRUCTIVE),
            ToolSpec::new("run_command", "x", schema.clone()),
            ToolSpec::new(FINAL_TOOL, "f", schema),
        ]
    }

    fn names(specs: &[ToolSpec]) -> Vec<&str> {
        specs.iter().map(|t| t.name.as_str()).collect()
    }

    #[test]
    fn plan_mode_offers_only_tools_that_read_then_exit() {
        let mut plan = PlanMode::default();
        assert_eq!(
            names(&plan.offer(&world())),
            ["read_file", "write_file", "run_command", FINAL_TOOL, ENTER_PLAN_MODE]
        );
        plan.enter();
        assert_eq!(names(&plan.offer(&world())), ["read_file", FINAL_TOOL, EXIT_PLAN_MODE]);
    }

    #[test]
    fn in_plan_mode_writes_and_unannotated_tools_are_refused() {
        let mut plan = PlanMode::default();
        assert!(plan.refusal("write_file", &world()).is_none(), "off: nothing is refused");
        plan.enter();
        for name in ["write_file", "run_command", "no_such_tool"] {
            let error = plan.refusal(name, &world()).unwrap();
            assert_eq!(error.kind, ErrorType::PermissionError, "{name}");
        }
        for name in ["read_file", FINAL_TOOL] {
            assert!(plan.refusal(name, &world()).is_none(), "{name}");
        }
    }

    #[test]
    fn approval_leaves_plan_mode_and_rejection_keeps_it() {
        let mut plan = PlanMode::default();
        assert!(plan.exit_refusal().is_some());
        plan.enter();
        assert_eq!(plan.take_reminder(), Some(PLAN_MODE_REMINDER));
        assert_eq!(plan.take_reminder(), None, "once per entry");
        plan.exit_sent("c1", &json!({"plan": "a"}));
        let rejected = Observation::of_result("c1", json!({"approved": false, "feedback": "add tests"}));
        let answered = plan.exit_answered(&rejected);
        assert_eq!(answered, Some((json!({"plan": "a"}), json!({"approved": false, "plan_mode": true}))));
        assert!(plan.is_on());
        // An answer to a call that was not an exit changes nothing.
        assert_eq!(plan.exit_answered(&Observation::of_result("c9", json!({"approved": true}))), None);
        plan.exit_sent("c2", &json!({"plan": "b"}));
        let approved = Observation::of_result("c2", json!({"approved": true, "feedback": "approve"}));
        let answered = plan.exit_answered(&approved).map(|(_, result)| result);
        assert_eq!(answered, Some(json!({"approved": true, "plan_mode": false})));
        assert!(!plan.is_on());
    }
}
