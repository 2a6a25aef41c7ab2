//! A run's caps and meter: caps on the cost, tokens and model calls of a whole run, per run
//! (the command line) and per provider (`budget:` in runner.yaml), checked each time an
//! episode is about to be scheduled.
//!
//! The [`RunMeter`] is a subscriber of the run's events: every `model_call` (the agent's,
//! subagents', a simulated user's, graders') adds to what the run and the call's provider
//! spent, and every `episode_finished` of an admitted episode tells how much one episode
//! can spend (the largest so far). An episode is admitted when, for the run and for its
//! model's provider, what was spent plus the largest episode's spend for it and for each
//! episode in flight stays within every cap; otherwise scheduling stops for that scope and
//! the episode is logged as not run (unscored, cause `budget`). Episodes in flight finish,
//! unless the budget is hard: then the first call that reaches a cap cancels them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::log::{Event, Subscriber, add_cost, usd};
use crate::model::config::Caps;

/// The caps of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunCaps {
    /// `--max-cost-usd`, `--max-run-tokens`, `--max-model-calls`.
    pub run: Caps,
    /// Each provider's `budget:` in runner.yaml.
    pub providers: BTreeMap<String, Caps>,
    /// `--budget-hard`: reaching a cap cancels the episodes in flight.
    pub hard: bool,
}

impl RunCaps {
    pub fn is_none(&self) -> bool {
        self.run.is_none() && self.providers.values().all(Caps::is_none)
    }
}

/// What was spent: dollars, tokens (input and output) and model calls.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spend {
    pub cost_usd: f64,
    pub tokens: u64,
    pub model_calls: u64,
}

impl Spend {
    fn add(&mut self, other: &Spend) {
        self.cost_usd = add_cost(self.cost_usd, other.cost_usd);
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.model_calls = self.model_calls.saturating_add(other.model_calls);
    }

    fn at_least(&mut self, other: &Spend) {
        self.cost_usd = self.cost_usd.max(other.cost_usd);
        self.tokens = self.tokens.max(other.tokens);
        self.model_calls = self.model_calls.max(other.model_calls);
    }
}

/// The provider of a model name: `openai` of `openai/gpt-4o-mini`; `mock` of `mock`.
pub fn provider_of(model: &str) -> &str {
    model.split_once('/').map_or(model, |(provider, _)| provider)
}

/// The run, or one provider: what it spent, the most one episode spent on it, the admitted
/// episodes not yet finished, and, once a cap stopped it, why.
#[derive(Debug, Default)]
struct Scope {
    spent: Spend,
    largest: Spend,
    /// Whether `largest` is known: an admitted episode of the scope finished (or a resumed
    /// run kept one).
    measured: bool,
    in_flight: u64,
    stopped: Option<String>,
}

impl Scope {
    /// Whether the next episode must wait: under a soft cap, while no episode of the scope
    /// has finished, nobody knows what one spends, so episodes start one at a time.
    fn must_wait(&self, caps: &Caps) -> bool {
        !caps.is_none() && !self.measured && self.in_flight > 0
    }

    /// The cap the next episode could cross: `(cap name, limit, spent)`.
    fn next_crosses(&self, caps: &Caps) -> Option<(&'static str, f64, f64)> {
        let next = (self.in_flight + 1) as f64;
        let check = |name, cap: Option<f64>, spent: f64, largest: f64| {
            cap.filter(|&cap| spent >= cap || spent + largest * next > cap).map(|cap| (name, cap, spent))
        };
        check("max_cost_usd", caps.max_cost_usd, self.spent.cost_usd, self.largest.cost_usd)
            .or_else(|| {
                let tokens = caps.max_tokens.map(|t| t as f64);
                check("max_tokens", tokens, self.spent.tokens as f64, self.largest.tokens as f64)
            })
            .or_else(|| {
                let calls = caps.max_model_calls.map(|c| c as f64);
                check("max_model_calls", calls, self.spent.model_calls as f64, self.largest.model_calls as f64)
            })
    }

    /// The cap already reached: `(cap name, limit, spent)`.
    fn reached(&self, caps: &Caps) -> Option<(&'static str, f64, f64)> {
        let reached =
            |name, cap: Option<f64>, spent: f64| cap.filter(|&cap| spent >= cap).map(|cap| (name, cap, spent));
        reached("max_cost_usd", caps.max_cost_usd, self.spent.cost_usd)
            .or_else(|| reached("max_tokens", caps.max_tokens.map(|t| t as f64), self.spent.tokens as f64))
            .or_else(|| {
                reached("max_model_calls", caps.max_model_calls.map(|c| c as f64), self.spent.model_calls as f64)
            })
    }
}

/// What [`RunMeter::admission`] says of the next episode.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    Start,
    /// Ask again when an episode has finished.
    Wait,
    /// Never: the cap it could cross, as a not-run episode's message says it.
    Refuse(String),
}

/// An admitted episode not yet finished: its model's provider, and what it spent per provider.
struct Open {
    provider: String,
    spent: HashMap<String, Spend>,
}

/// The run's meter: what it spent, the admission of its episodes, and the hard stop.
pub struct RunMeter {
    caps: RunCaps,
    run: Scope,
    providers: HashMap<String, Scope>,
    open: HashMap<String, Open>,
    /// Cancels the episodes in flight (a hard budget).
    episodes: CancellationToken,
    /// `budget_reached` events not yet logged.
    reached: Vec<Event>,
    /// Told when an admitted episode finishes: an episode that must wait is asked again then.
    finished: Arc<Notify>,
}

impl RunMeter {
    pub fn new(caps: RunCaps, episodes: CancellationToken) -> RunMeter {
        RunMeter {
            caps,
            run: Scope::default(),
            providers: HashMap::new(),
            open: HashMap::new(),
            episodes,
            reached: Vec::new(),
            finished: Arc::new(Notify::new()),
        }
    }

    /// What an episode that must wait waits on: an admitted episode's end.
    pub fn finished(&self) -> Arc<Notify> {
        self.finished.clone()
    }

    /// What an episode kept from an earlier part of the run spent: a resumed run's budget
    /// is the whole run's.
    pub fn kept(&mut self, model: &str, spend: Spend) {
        self.run.spent.add(&spend);
        self.run.largest.at_least(&spend);
        self.run.measured = true;
        let scope = self.providers.entry(provider_of(model).to_owned()).or_default();
        scope.spent.add(&spend);
        scope.largest.at_least(&spend);
        scope.measured = true;
    }

    /// Whether the episode may start now, must wait for one in flight to finish (a soft
    /// cap, before any episode of its scope finished), or never.
    pub fn admission(&mut self, episode_id: &str, model: &str) -> Admission {
        if !self.caps.hard {
            let provider = provider_of(model);
            let caps = self.caps.providers.get(provider).copied().unwrap_or_default();
            let waits_for_provider = self.providers.get(provider).is_some_and(|s| s.must_wait(&caps));
            if self.run.stopped.is_none() && (self.run.must_wait(&self.caps.run) || waits_for_provider) {
                return Admission::Wait;
            }
        }
        match self.admit(episode_id, model) {
            Ok(()) => Admission::Start,
            Err(why) => Admission::Refuse(why),
        }
    }

    /// Whether the episode may start; `Err` says which cap stops it. Once a cap stops its
    /// scope (the run, a provider), every later episode of that scope is refused too.
    pub fn admit(&mut self, episode_id: &str, model: &str) -> Result<(), String> {
        let provider = provider_of(model).to_owned();
        if let Some(why) = &self.run.stopped {
            return Err(why.clone());
        }
        if let Some((cap, limit, spent)) = self.run.next_crosses(&self.caps.run) {
            return Err(self.stop(None, cap, limit, spent));
        }
        let caps = self.caps.providers.get(&provider).copied().unwrap_or_default();
        let scope = self.providers.entry(provider.clone()).or_default();
        if let Some(why) = &scope.stopped {
            return Err(why.clone());
        }
        if let Some((cap, limit, spent)) = scope.next_crosses(&caps) {
            return Err(self.stop(Some(&provider), cap, limit, spent));
        }
        scope.in_flight += 1;
        self.run.in_flight += 1;
        self.open.insert(episode_id.to_owned(), Open { provider, spent: HashMap::new() });
        Ok(())
    }

    /// Stops a scope's scheduling; the reason, as a not-run episode's message says it.
    fn stop(&mut self, provider: Option<&str>, cap: &str, limit: f64, spent: f64) -> String {
        let (scope_name, flag) = match provider {
            None => ("run".to_owned(), run_flag(cap).to_owned()),
            Some(p) => (format!("provider {p}"), format!("providers.{p}.budget.{cap} in runner.yaml")),
        };
        let why = format!(
            "the {scope_name}'s budget {flag} = {} could be crossed by the next episode (spent {})",
            shown(cap, limit),
            shown(cap, spent)
        );
        let scope = match provider {
            None => &mut self.run,
            Some(p) => self.providers.entry(p.to_owned()).or_default(),
        };
        if scope.stopped.is_none() {
            scope.stopped = Some(why.clone());
            self.reached.push(Event::BudgetReached {
                scope: scope_name,
                cap: cap.to_owned(),
                limit,
                spent,
                hard: false,
            });
        }
        why
    }

    /// The `budget_reached` events to log now.
    pub fn take_reached(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.reached)
    }

    /// Which events the meter reads.
    pub fn wants(event: &Event) -> bool {
        matches!(event, Event::ModelCall { .. } | Event::EpisodeFinished { .. })
    }

    /// A hard budget: a cap reached cancels the episodes in flight and stops scheduling.
    fn check_hard(&mut self, provider: &str) {
        if !self.caps.hard || self.episodes.is_cancelled() {
            return;
        }
        let caps = self.caps.providers.get(provider).copied().unwrap_or_default();
        let reached = match self.run.reached(&self.caps.run) {
            Some(r) => Some(("run".to_owned(), run_flag(r.0).to_owned(), r)),
            None => self.providers.get(provider).and_then(|s| s.reached(&caps)).map(|r| {
                (format!("provider {provider}"), format!("providers.{provider}.budget.{} in runner.yaml", r.0), r)
            }),
        };
        let Some((scope_name, flag, (cap, limit, spent))) = reached else { return };
        let why = format!(
            "the {scope_name}'s budget {flag} = {} was reached (spent {}); --budget-hard cancelled the episodes in flight",
            shown(cap, limit),
            shown(cap, spent)
        );
        self.run.stopped.get_or_insert(why);
        self.reached.push(Event::BudgetReached { scope: scope_name, cap: cap.to_owned(), limit, spent, hard: true });
        self.episodes.cancel();
    }
}

impl Subscriber for RunMeter {
    fn event(&mut self, episode_id: Option<&str>, event: &Event) {
        match event {
            Event::ModelCall { model, usage, cost_usd, .. } => {
                let spend = Spend { cost_usd: cost_usd.unwrap_or(0.0), tokens: usage.total(), model_calls: 1 };
                let provider = provider_of(model).to_owned();
                self.run.spent.add(&spend);
                self.providers.entry(provider.clone()).or_default().spent.add(&spend);
                if let Some(open) = episode_id.and_then(|id| self.open.get_mut(id)) {
                    open.spent.entry(provider.clone()).or_default().add(&spend);
                }
                self.check_hard(&provider);
            }
            Event::EpisodeFinished { .. } => {
                let Some(open) = episode_id.and_then(|id| self.open.remove(id)) else { return };
                let mut total = Spend::default();
                for (provider, spend) in &open.spent {
                    total.add(spend);
                    let scope = self.providers.entry(provider.clone()).or_default();
                    scope.largest.at_least(spend);
                    scope.measured = true;
                }
                self.providers.entry(open.provider.clone()).or_default().measured = true;
                self.run.largest.at_least(&total);
                self.run.measured = true;
                self.run.in_flight = self.run.in_flight.saturating_sub(1);
                if let Some(scope) = self.providers.get_mut(&open.provider) {
                    scope.in_flight = scope.in_flight.saturating_sub(1);
                }
                self.finished.notify_waiters();
            }
            _ => {}
        }
    }
}

/// The command-line flag of a run-wide cap.
fn run_flag(cap: &str) -> &'static str {
    match cap {
        "max_cost_usd" => "--max-cost-usd",
        "max_tokens" => "--max-run-tokens",
        _ => "--max-model-calls",
    }
}

fn shown(cap: &str, value: f64) -> String {
    if cap == "max_cost_usd" { usd(value) } else { format!("{value}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Outcome, Termination, Usage};

    fn call(model: &str, tokens: u64, cost: Option<f64>) -> Event {
        Event::ModelCall {
            model: model.into(),
            step: 1,
            request_digest: String::new(),
            sampling: Default::default(),
            response: serde_json::Value::Null,
            usage: Usage { input_tokens: tokens, output_tokens: 0, cached_tokens: 0 },
            latency_ms: 1.0,
            attempts: 1,
            cache_hit: false,
            cost_usd: cost,
            error: None,
            cause: None,
            url: None,
            request: None,
            raw_response: None,
            scorer: None,
            actor: Default::default(),
            status: None,
            attempt: None,
            retried: false,
        }
    }

    fn finished() -> Event {
        Event::EpisodeFinished {
            outcome: Outcome::Cancelled,
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
        }
    }

    /// Runs episode `id` of `model` through the meter: admitted, `tokens` spent, finished.
    fn episode(meter: &mut RunMeter, id: &str, model: &str, tokens: u64) -> Result<(), String> {
        meter.admit(id, model)?;
        meter.event(Some(id), &call(model, tokens, Some(tokens as f64 / 100.0)));
        meter.event(Some(id), &finished());
        Ok(())
    }

    #[test]
    fn scheduling_stops_before_the_next_episode_could_cross_the_cap() {
        // 100 tokens an episode, a cap of 350: three episodes (300), then 300 + 100 > 350.
        let caps = RunCaps { run: Caps { max_tokens: Some(350), ..Caps::default() }, ..RunCaps::default() };
        let mut meter = RunMeter::new(caps, CancellationToken::new());
        for id in ["a", "b", "c"] {
            assert_eq!(episode(&mut meter, id, "mock", 100), Ok(()));
        }
        let refused = episode(&mut meter, "d", "mock", 100).unwrap_err();
        assert!(refused.contains("--max-run-tokens = 350") && refused.contains("spent 300"), "{refused}");
        assert_eq!(meter.take_reached().len(), 1, "one budget_reached event");
        assert!(meter.admit("e", "mock").is_err(), "the run stays stopped");
        assert!(meter.take_reached().is_empty());
    }

    #[test]
    fn episodes_in_flight_count_at_the_largest_episode_so_far() {
        let caps = RunCaps { run: Caps { max_model_calls: Some(3), ..Caps::default() }, ..RunCaps::default() };
        let mut meter = RunMeter::new(caps, CancellationToken::new());
        episode(&mut meter, "a", "mock", 1).unwrap();
        // One call spent, one episode in flight at one call: 1 + 1·2 = 3 ≤ 3 admits "c"; then
        // 1 + 1·3 = 4 > 3 refuses "d".
        meter.admit("b", "mock").unwrap();
        meter.admit("c", "mock").unwrap();
        assert!(meter.admit("d", "mock").is_err());
    }

    #[test]
    fn a_provider_cap_stops_only_that_providers_episodes() {
        let local = Caps { max_cost_usd: Some(1.5), ..Caps::default() };
        let caps = RunCaps { providers: [("local".to_owned(), local)].into(), ..RunCaps::default() };
        let mut meter = RunMeter::new(caps, CancellationToken::new());
        episode(&mut meter, "a", "local/m", 100).unwrap();
        let refused = episode(&mut meter, "b", "local/m", 100).unwrap_err();
        assert!(refused.contains("providers.local.budget.max_cost_usd"), "{refused}");
        assert_eq!(episode(&mut meter, "c", "other/m", 100), Ok(()), "another provider goes on");
    }

    #[test]
    fn a_hard_budget_cancels_the_episodes_in_flight() {
        let stop = CancellationToken::new();
        let caps = RunCaps { run: Caps { max_tokens: Some(150), ..Caps::default() }, hard: true, ..RunCaps::default() };
        let mut meter = RunMeter::new(caps, stop.clone());
        meter.admit("a", "mock").unwrap();
        meter.event(Some("a"), &call("mock", 100, None));
        assert!(!stop.is_cancelled());
        meter.event(Some("a"), &call("mock", 100, None));
        assert!(stop.is_cancelled(), "200 tokens reached the cap of 150");
        assert!(matches!(meter.take_reached().as_slice(), [Event::BudgetReached { hard: true, .. }]));
        assert!(meter.admit("b", "mock").is_err());
    }

    #[test]
    fn a_resumed_run_counts_what_its_kept_episodes_spent() {
        let caps = RunCaps { run: Caps { max_tokens: Some(250), ..Caps::default() }, ..RunCaps::default() };
        let mut meter = RunMeter::new(caps, CancellationToken::new());
        meter.kept("mock", Spend { tokens: 100, ..Spend::default() });
        meter.kept("mock", Spend { tokens: 100, ..Spend::default() });
        assert!(meter.admit("c", "mock").is_err(), "200 kept + 100 > 250");
    }

    #[test]
    fn costs_that_add_past_the_largest_number_stop_at_it_and_say_so() {
        let caps = RunCaps { run: Caps { max_cost_usd: Some(1.0), ..Caps::default() }, ..RunCaps::default() };
        let mut meter = RunMeter::new(caps, CancellationToken::new());
        meter.admit("a", "mock").unwrap();
        meter.event(Some("a"), &call("mock", 1, Some(1.7e308)));
        meter.event(Some("a"), &call("mock", 1, Some(1.7e308)));
        meter.event(Some("a"), &finished());
        let refused = meter.admit("b", "mock").unwrap_err();
        assert!(refused.contains("(spent $1.798e308)"), "{refused}");
        let [Event::BudgetReached { spent, .. }] = meter.take_reached()[..] else { panic!("one budget_reached") };
        assert_eq!(spent, f64::MAX, "a number the log can write, not infinity (written as null)");
    }
}
