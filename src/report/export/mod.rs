//! `runner export`: projections of a run's log into the formats other tools read — ATIF
//! trajectories (one file per agent of an episode) and ShareGPT or OpenAI-messages JSONL
//! (one line per episode) for fine-tuning sets. Each export says how complete it is: the
//! episodes written, and those skipped and why, printed and in `export.json`.

pub mod atif;
pub mod conversation;
pub mod openai;
pub mod sharegpt;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::contract::Actor;
use crate::log::projection::{EpisodeRow, Projection};
use crate::log::reader::for_each_event_of;
use crate::log::{Event, LoggedEvent, Termination, for_each_event};
use conversation::Conversation;

/// The formats an export writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Atif,
    Sharegpt,
    Openai,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Atif => "atif",
            Format::Sharegpt => "sharegpt",
            Format::Openai => "openai",
        }
    }
}

/// Which episodes to write, by the episodes table's `status`: `passed`, `failed`,
/// `unscored`, `cancelled`, or `scored` (passed or failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Status {
    Passed,
    Failed,
    Scored,
    Unscored,
    Cancelled,
}

impl Status {
    fn admits(self, status: &str) -> bool {
        match self {
            Status::Scored => status == "passed" || status == "failed",
            Status::Passed => status == "passed",
            Status::Failed => status == "failed",
            Status::Unscored => status == "unscored",
            Status::Cancelled => status == "cancelled",
        }
    }

    fn flag(self) -> String {
        format!("{self:?}").to_lowercase()
    }
}

/// What an export was asked.
#[derive(Debug, Clone)]
pub struct Request {
    pub format: Format,
    /// `--passed-only` is `Some(Status::Passed)`.
    pub status: Option<Status>,
    pub out: PathBuf,
}

/// What a trajectory says of its episode besides the conversation.
#[derive(Debug, Clone)]
pub struct EpisodeMeta {
    pub run_id: String,
    pub runner_version: String,
    pub episode_id: String,
    pub suite: String,
    pub task_id: String,
    pub model: String,
    pub epoch: u32,
    pub outcome: Value,
    pub termination: &'static str,
    pub cost_usd: Option<f64>,
}

/// How complete an export is.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub run_id: String,
    pub format: String,
    pub out: PathBuf,
    pub written: usize,
    pub files: Vec<String>,
    /// Why episodes were left out, and how many for each reason.
    pub skipped: BTreeMap<String, usize>,
    /// Episodes written with payloads the log had cut (past the episode's log budget).
    pub cut_payloads: usize,
    /// Episodes written without the system prompt and tools (the model calls' requests were
    /// not logged: only HTTP backends log them).
    pub without_system_prompt: usize,
    episodes: Vec<Value>,
}

impl Report {
    fn skip(&mut self, row_id: &str, status: &str, reason: String) {
        self.episodes.push(json!({"episode_id": row_id, "status": status, "skipped": reason}));
        *self.skipped.entry(reason).or_default() += 1;
    }

    pub fn to_json(&self) -> Value {
        json!({
            "run_id": self.run_id,
            "format": self.format,
            "written": self.written,
            "skipped": self.skipped,
            "cut_payloads": self.cut_payloads,
            "without_system_prompt": self.without_system_prompt,
            "files": self.files,
            "episodes": self.episodes,
        })
    }

    /// What the command prints.
    pub fn render(&self) -> String {
        let skipped: usize = self.skipped.values().sum();
        let mut text = format!(
            "exported {} episode(s) as {} to {}; skipped {skipped}\n",
            self.written,
            self.format,
            self.out.display()
        );
        for (reason, n) in &self.skipped {
            text += &format!("  skipped {n}: {reason}\n");
        }
        if self.cut_payloads > 0 {
            text += &format!("  {} written with payloads the log had cut (past its log budget)\n", self.cut_payloads);
        }
        if self.without_system_prompt > 0 {
            text += &format!(
                "  {} written without system prompt and tools (not logged: only HTTP backends log requests)\n",
                self.without_system_prompt
            );
        }
        text
    }
}

/// Exports the run whose log is `events` as `request` asks; the files and `export.json` are
/// written under `request.out`.
///
/// The log is read three times, holding only what is needed: the table's rows (which
/// episodes to write), where each episode's latest attempt starts (a resumed run runs an
/// unscored episode again under the same id), then the events of the episodes written,
/// each held from its latest start to its finish and written then. Lines and
/// `export.json` list the episodes in the table's order.
pub fn export(events: &Path, request: &Request) -> Result<Report, String> {
    let projection = Projection::from_log(events).map_err(|e| e.to_string())?;
    let mut latest_start: HashMap<String, u64> = HashMap::new();
    let mut started: Vec<String> = Vec::new();
    for_each_event_of(events, Some(&["episode_started"]), |event| {
        if let Some(id) = event.episode_id
            && latest_start.insert(id.clone(), event.seq).is_none()
        {
            started.push(id);
        }
    })
    .map_err(|e| e.to_string())?;

    std::fs::create_dir_all(&request.out).map_err(|e| format!("failed to create {}: {e}", request.out.display()))?;
    let mut report = Report {
        run_id: projection.run_id.clone(),
        format: request.format.as_str().into(),
        out: request.out.clone(),
        ..Report::default()
    };
    let finished: HashSet<&str> = projection.episodes.iter().map(|r| &*r.episode_id).collect();
    for id in started.iter().filter(|id| !finished.contains(id.as_str())) {
        report.skip(id, "unfinished", UNFINISHED.into());
    }
    // The rows to write, by episode id: their place in the table.
    let mut wanted: HashMap<&str, usize> = HashMap::new();
    let mut outcomes: Vec<Option<Written>> = vec![None; projection.episodes.len()];
    for (at, row) in projection.episodes.iter().enumerate() {
        let status = row.status();
        match request.status {
            Some(asked) if !asked.admits(status) => {
                outcomes[at] = Some(Written::Skipped(format!("{status} (only {} asked)", asked.flag())));
            }
            _ => {
                wanted.insert(&row.episode_id, at);
            }
        }
    }

    let mut open: HashMap<String, Vec<LoggedEvent>> = HashMap::new();
    let mut failure = None;
    for_each_event(events, |event| {
        let Some(id) = event.episode_id.as_deref() else { return };
        let Some(&at) = wanted.get(id) else { return };
        if outcomes[at].is_some() || latest_start.get(id).is_some_and(|&seq| event.seq < seq) {
            return;
        }
        let done = event.kind == "episode_finished";
        let id = id.to_owned();
        open.entry(id.clone()).or_default().push(event);
        if done {
            let events = open.remove(&id).unwrap_or_default();
            let row = &projection.episodes[at];
            outcomes[at] = Some(match write_episode(&projection, row, &events, request) {
                Ok(written) => written,
                Err(e) => {
                    failure.get_or_insert(e);
                    Written::Skipped(String::new())
                }
            });
        }
    })
    .map_err(|e| e.to_string())?;
    if let Some(e) = failure {
        return Err(e);
    }

    let mut lines = String::new();
    for (row, outcome) in projection.episodes.iter().zip(outcomes) {
        let status = row.status();
        match outcome.unwrap_or_else(|| Written::Skipped(UNFINISHED.into())) {
            Written::Skipped(reason) => report.skip(&row.episode_id, status, reason),
            Written::Episode { files, line, cut_payloads, without_system_prompt } => {
                lines += &line;
                report.written += 1;
                report.cut_payloads += usize::from(cut_payloads);
                report.without_system_prompt += usize::from(without_system_prompt);
                report.episodes.push(json!({"episode_id": row.episode_id, "status": status, "files": files}));
                report.files.extend(files);
            }
        }
    }
    if request.format != Format::Atif {
        let name = format!("{}.jsonl", request.format.as_str());
        let path = request.out.join(&name);
        std::fs::write(&path, lines).map_err(|e| format!("failed to write {}: {e}", path.display()))?;
        report.files.push(name);
    }
    let path = request.out.join("export.json");
    let json = serde_json::to_vec_pretty(&report.to_json()).unwrap_or_default();
    super::write_atomically(&path, &json).map_err(|e| format!("failed to write {}: {e}", path.display()))?;
    Ok(report)
}

const UNFINISHED: &str = "unfinished: the log ends before the episode does";

/// What became of an episode: skipped (and why), or written (an ATIF export's files, a
/// JSONL export's line).
#[derive(Debug, Clone)]
enum Written {
    Skipped(String),
    Episode { files: Vec<String>, line: String, cut_payloads: bool, without_system_prompt: bool },
}

/// Projects one episode's latest attempt, writing its ATIF files.
fn write_episode(
    projection: &Projection,
    row: &EpisodeRow,
    events: &[LoggedEvent],
    request: &Request,
) -> Result<Written, String> {
    let conversation = Conversation::fold(events);
    let Some(main) = conversation.main().filter(|m| m.turns().next().is_some()) else {
        return Ok(Written::Skipped(no_turns(row, events)));
    };
    let mut files = Vec::new();
    let mut line = String::new();
    match request.format {
        Format::Atif => {
            for (name, document) in atif::trajectories(&meta(projection, row), &conversation) {
                let path = request.out.join(&name);
                let bytes = serde_json::to_vec_pretty(&document).unwrap_or_default();
                std::fs::write(&path, bytes).map_err(|e| format!("failed to write {}: {e}", path.display()))?;
                files.push(name);
            }
        }
        Format::Sharegpt => line = format!("{}\n", sharegpt::line(&conversation, main)),
        Format::Openai => line = format!("{}\n", openai::line(&conversation, main)),
    }
    Ok(Written::Episode {
        files,
        line,
        cut_payloads: conversation.cut_payloads,
        without_system_prompt: main.system.is_none(),
    })
}

/// Why an episode has no model turn to export: its agent's model calls all failed, or the
/// episode ended while its first was running (a call cut so is logged as `cancelled`), or
/// its agent asks no model at all.
fn no_turns(row: &EpisodeRow, events: &[LoggedEvent]) -> String {
    let failed = events
        .iter()
        .filter_map(LoggedEvent::event)
        .filter(|e| {
            matches!(e, Event::ModelCall { error: Some(_), scorer: None, actor, status, .. }
                if *actor != Actor::User && status.as_deref() != Some(crate::model::CANCELLED))
        })
        .count();
    if failed > 0 {
        return format!("no model turns: its {failed} model call(s) failed (see their `error`)");
    }
    let cut_short = [Termination::TimeLimit, Termination::UserStop, Termination::Budget];
    if row.steps > 0 && cut_short.contains(&row.termination) {
        return format!(
            "no model turns: the episode ended ({}) while its first model call was running, and that call was cut",
            row.termination.as_str()
        );
    }
    "no model turns (an agent without a model)".into()
}

fn meta(projection: &Projection, row: &EpisodeRow) -> EpisodeMeta {
    EpisodeMeta {
        run_id: projection.run_id.clone(),
        runner_version: projection.header.runner_version.clone(),
        episode_id: row.episode_id.to_string(),
        suite: row.suite.to_string(),
        task_id: row.task_id.to_string(),
        model: row.model.to_string(),
        epoch: row.epoch,
        outcome: serde_json::to_value(&row.outcome).unwrap_or_default(),
        termination: row.termination.as_str(),
        cost_usd: row.cost_usd,
    }
}
