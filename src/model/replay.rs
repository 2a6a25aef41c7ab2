//! Record and replay. `--record FILE` appends every model response to a cassette, keyed by
//! the digest of the canonical request and the episode that asked; `--model replay:FILE`
//! (or `replay:RUN`, a run's own log) serves them back: free, deterministic prompt
//! regression tests. Each episode gets the responses recorded for it, in the order it got
//! them, so that a replay reproduces every outcome whatever order episodes run in (identical
//! requests of several epochs get different answers from a sampling model). The grader's
//! calls are recorded and served the same way. A call that failed (an outage after retries,
//! say) is recorded too, and a replay fails it again with the recorded cause, so that an
//! episode whose recording ended unscored replays unscored for the same reason. A request
//! that was never recorded is a loud miss that names the nearest recorded request of the
//! same episode and the difference.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    AttemptWatch, FailedAttempt, LanguageModel, Message, ModelError, ModelRequest, ModelResponse, canonical_request,
    digest, request_digest,
};
use crate::contract::{Actor, ToolSpec};
use crate::log::reader::for_each_event_of;
use crate::log::{Event, LoggedEvent, UnscoredCause};

/// One line of a cassette.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub digest: String,
    /// The episode that asked. Absent in cassettes recorded before episodes were kept:
    /// their entries are served to any episode, by request alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episode_id: Option<String>,
    /// Set when a grader asked: the scorer it graded for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scorer: Option<String>,
    /// `user` when a simulated user asked; absent for the agent.
    #[serde(default, skip_serializing_if = "Actor::is_main")]
    pub actor: Actor,
    pub request: CanonicalRequest,
    /// What the model answered; absent when the call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ModelResponse>,
    /// Why the call failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

/// A recorded call that failed, or one of its attempts that failed and was retried: its
/// cause and message, served again on replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub cause: UnscoredCause,
    pub message: String,
    /// Which attempt of the call failed, when the call took more than one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// Set on an attempt that was retried: the call's next line goes on with it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retried: bool,
}

impl Failure {
    pub fn new(cause: UnscoredCause, message: String) -> Self {
        Failure { cause, message, attempt: None, retried: false }
    }
}

/// What a recorded call gave: a response, or a failure.
type Recorded = Result<ModelResponse, Failure>;

/// The request as its digest sees it: the same for every backend of one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanonicalRequest {
    pub model: String,
    #[serde(default)]
    pub sampling: Map<String, Value>,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directives: Option<crate::model::Directives>,
}

/// Appends entries to a cassette file as responses arrive.
pub struct CassetteWriter {
    file: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl CassetteWriter {
    pub fn create(path: &Path) -> std::io::Result<Self> {
        // A recording cut by a crash goes on after its last whole entry.
        crate::log::writer::drop_torn_tail(path)?;
        let file = std::fs::File::options().create(true).append(true).open(path)?;
        Ok(CassetteWriter { file: Mutex::new(std::io::BufWriter::new(file)) })
    }

    pub fn append(&self, entry: &Entry) -> std::io::Result<()> {
        let mut line = crate::log::secrets::scrub_bytes(&serde_json::to_vec(entry)?).into_owned();
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(&line)?;
        file.flush()
    }
}

/// A recorded call under way; see [`Recording::respond`]. Each attempt that fails before a
/// retry is written as it ends, and the call dropped before it lands as cancelled.
struct Pending<'a> {
    recording: &'a Recording,
    canonical: Mutex<Option<CanonicalRequest>>,
    /// The caller's own watch, told of each retried attempt after the cassette.
    outer: Option<&'a dyn AttemptWatch>,
    retried: std::sync::atomic::AtomicU32,
}

impl Pending<'_> {
    fn take(&self) -> Option<CanonicalRequest> {
        self.canonical.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl AttemptWatch for Pending<'_> {
    fn retried(&self, failed: &FailedAttempt) {
        let canonical = self.canonical.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(canonical) = canonical {
            let failure = Failure {
                attempt: Some(failed.attempt),
                retried: true,
                ..Failure::new(failed.cause.clone(), failed.message.clone())
            };
            // A failed write is said by the call's last line (or its absence): the log has it too.
            let _ = self.recording.cassette.append(&self.recording.entry(canonical, None, Some(failure)));
            self.retried.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(outer) = self.outer {
            outer.retried(failed);
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(canonical) = self.take() {
            let retried = *self.retried.get_mut();
            let failure = Failure {
                attempt: (retried > 0).then_some(retried + 1),
                ..Failure::new(
                    UnscoredCause::Other(crate::model::CANCELLED.to_owned()),
                    crate::model::CANCELLED_MESSAGE.to_owned(),
                )
            };
            // Nothing to report a failed write to from here: the log has the call too.
            let _ = self.recording.cassette.append(&self.recording.entry(canonical, None, Some(failure)));
        }
    }
}

impl Recording {
    fn entry(&self, request: CanonicalRequest, response: Option<ModelResponse>, failure: Option<Failure>) -> Entry {
        Entry {
            digest: digest(&request),
            episode_id: Some(self.episode_id.clone()),
            scorer: self.scorer.clone(),
            actor: self.actor.clone(),
            request,
            response,
            failure,
        }
    }
}

/// Wraps one episode's model (or its grader's) and records every answer it gives.
pub struct Recording {
    pub inner: Arc<dyn LanguageModel>,
    pub cassette: Arc<CassetteWriter>,
    pub episode_id: String,
    /// The scorer, when this is a grader.
    pub scorer: Option<String>,
    /// `user` when this is a simulated user's model.
    pub actor: Actor,
}

#[async_trait]
impl LanguageModel for Recording {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn endpoint(&self) -> Option<&str> {
        self.inner.endpoint()
    }

    fn sampling(&self) -> Map<String, Value> {
        self.inner.sampling()
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let canonical = canonical_request(self, request);
        // A call dropped before it lands is written as cancelled: the cassette keeps every
        // call the episode made, and a replay ends where the recording did.
        let pending = Pending {
            recording: self,
            canonical: Mutex::new(Some(canonical)),
            outer: request.watch,
            retried: std::sync::atomic::AtomicU32::new(0),
        };
        let answered = self.inner.respond(&ModelRequest { watch: Some(&pending), ..*request }).await;
        let canonical = pending.take().unwrap_or_else(|| canonical_request(self, request));
        let (response, failure) = match &answered {
            // The run's own values (a folder, the gateway's address) as placeholders, which
            // a replay fills with its own.
            Ok(response) => (Some(request.run_own.normalised(&response.recorded())), None),
            Err(e) => (None, Some(Failure::new(e.cause.clone(), e.message.clone()))),
        };
        let entry = self.entry(canonical, response, failure);
        self.cassette
            .append(&entry)
            .map_err(|e| ModelError::new(UnscoredCause::RecordError, format!("failed to write the cassette: {e}")))?;
        answered
    }
}

/// The episode of entries recorded without one.
const ANY_EPISODE: &str = "";

/// How many misses are printed on the console; the log has them all.
const MISSES_SHOWN: usize = 10;

/// The recorded calls of one model: the agent's, or one grader's.
#[derive(Default)]
struct Tape {
    sampling: Map<String, Value>,
    /// Each episode's own, when it differs from the first call's (variants may set their
    /// agents' sampling).
    sampling_of: HashMap<String, Map<String, Value>>,
    /// Responses (or failures) per (episode, digest), served in recorded order.
    queues: Mutex<HashMap<(String, String), VecDeque<Recorded>>>,
    /// How many responses each (episode, digest) had, to tell "used up" from "never recorded".
    recorded: HashMap<(String, String), usize>,
    /// How many calls each episode had.
    calls: HashMap<String, usize>,
    /// Recorded requests and their episode, for explaining a miss (cassettes only; logs
    /// keep digests).
    requests: Vec<(String, CanonicalRequest)>,
}

impl Tape {
    fn push(&mut self, call: Call) {
        let Call { episode, digest, request, response, sampling, .. } = call;
        let episode = episode.unwrap_or_else(|| ANY_EPISODE.to_owned());
        if sampling != self.sampling {
            self.sampling_of.entry(episode.clone()).or_insert(sampling);
        }
        *self.calls.entry(episode.clone()).or_default() += 1;
        *self.recorded.entry((episode.clone(), digest.clone())).or_default() += 1;
        self.queues
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .entry((episode.clone(), digest))
            .or_default()
            .push_back(response);
        if let Some(request) = request {
            self.requests.push((episode, request));
        }
    }

    /// The next response recorded for this episode and request; an episode that was not
    /// recorded at all takes those of recordings that kept no episodes.
    fn serve(&self, episode: &str, digest: &str) -> Option<Recorded> {
        let episode = if self.calls.contains_key(episode) { episode } else { ANY_EPISODE };
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.get_mut(&(episode.to_owned(), digest.to_owned())).and_then(VecDeque::pop_front)
    }
}

/// Serves recorded responses. Shared by every episode of a run; each episode talks to it
/// through [`Replay::episode`].
pub struct Replay {
    name: String,
    source: PathBuf,
    agent: Tape,
    /// The graders' and the simulated users' calls, by model.
    graders: HashMap<String, Tape>,
    misses: AtomicUsize,
}

/// One recorded call as read from a cassette or a log.
struct Call {
    model: String,
    sampling: Map<String, Value>,
    digest: String,
    episode: Option<String>,
    scorer: Option<String>,
    /// A simulated user's call, which is not the agent's.
    user: bool,
    request: Option<CanonicalRequest>,
    response: Recorded,
}

impl Call {
    /// The tape the call is served from: the agent's (`None`), or its model's.
    fn tape(&self) -> Option<&str> {
        (self.scorer.is_some() || self.user).then_some(self.model.as_str())
    }
}

/// Keeps a failure only where it ended its episode's calls on its tape. A failure ends the
/// episode unscored, so calls of the same episode after it belong to a later attempt (a
/// resumed run): its failure is no part of the outcome the recording shows. A retried
/// attempt's failure is kept with the call it was part of: when the line after it is.
fn drop_failures_run_again(calls: Vec<Call>) -> Vec<Call> {
    // Whether the next call of each tape and episode is kept; absent: none follows.
    let mut next_kept: HashMap<(Option<&str>, Option<&str>), bool> = HashMap::new();
    let mut keep = vec![false; calls.len()];
    for (i, call) in calls.iter().enumerate().rev() {
        let key = (call.tape(), call.episode.as_deref());
        let following = next_kept.get(&key).copied();
        keep[i] = match &call.response {
            Ok(_) => true,
            Err(failure) if failure.retried => following == Some(true),
            Err(_) => following.is_none(),
        };
        next_kept.insert(key, keep[i]);
    }
    calls.into_iter().zip(keep).filter_map(|(call, keep)| keep.then_some(call)).collect()
}

/// Every model call a run's log records, in order; a response this version cannot decode
/// is left out.
fn calls_of_log(events: &Path) -> Result<Vec<Call>, String> {
    let mut entries = Vec::new();
    // Not the log's fold (`log::projection`): a replay needs every model call's
    // response, not an episode's latest finish, and no other event.
    for_each_event_of(events, Some(&["model_call"]), |e: LoggedEvent| {
        let episode = e.episode_id.clone();
        let Some(Event::ModelCall {
            model,
            request_digest,
            sampling,
            response,
            error,
            cause,
            scorer,
            actor,
            attempt,
            retried,
            ..
        }) = e.event()
        else {
            return;
        };
        let response = match (error, cause) {
            (None, _) => match serde_json::from_value::<ModelResponse>(response) {
                Ok(response) => Ok(response),
                Err(_) => return,
            },
            (Some(message), cause) => Err(Failure {
                attempt,
                retried,
                ..Failure::new(cause.unwrap_or(UnscoredCause::ProviderError), message)
            }),
        };
        entries.push(Call {
            model,
            sampling,
            digest: request_digest,
            episode,
            scorer,
            user: actor == Actor::User,
            request: None,
            response,
        });
    })
    .map_err(|e| e.to_string())?;
    Ok(entries)
}

/// Every entry of a cassette, in order; a line that is not one is an error naming it.
fn calls_of_cassette(events: &Path) -> Result<Vec<Call>, String> {
    let mut entries = Vec::new();
    let file =
        std::fs::File::open(events).map_err(|e| format!("failed to open the cassette {}: {e}", events.display()))?;
    let mut lines = BufReader::new(file).split(b'\n').enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        let line = line.map_err(|e| format!("failed to read {}: {e}", events.display()))?;
        // A last line without its newline was torn by a crash mid-write, as in a log.
        let torn = lines.peek().is_none() && !ends_with_newline(events);
        let line = String::from_utf8_lossy(&line);
        if line.trim().is_empty() || torn {
            continue;
        }
        let entry: Entry = serde_json::from_str(&line)
            .map_err(|e| format!("{}:{}: not a cassette entry: {e}", events.display(), i + 1))?;
        let response = match (entry.response, entry.failure) {
            (Some(response), _) => Ok(response),
            (None, Some(failure)) => Err(failure),
            (None, None) => {
                return Err(format!(
                    "{}:{}: not a cassette entry: it has neither a response nor a failure",
                    events.display(),
                    i + 1
                ));
            }
        };
        entries.push(Call {
            model: entry.request.model.clone(),
            sampling: entry.request.sampling.clone(),
            digest: entry.digest,
            episode: entry.episode_id,
            scorer: entry.scorer,
            user: entry.actor == Actor::User,
            request: Some(entry.request),
            response,
        });
    }
    Ok(entries)
}

impl Replay {
    /// Opens a cassette file, or a run (its folder or its `events.jsonl`).
    pub fn open(path: &Path) -> Result<Self, String> {
        let events = if path.is_dir() { path.join("events.jsonl") } else { path.to_owned() };
        let entries = if is_event_log(&events)? { calls_of_log(&events)? } else { calls_of_cassette(&events)? };
        let entries = drop_failures_run_again(entries);
        let Some(first) = entries.iter().find(|e| e.scorer.is_none() && !e.user) else {
            return Err(format!("{} holds no recorded model responses", events.display()));
        };
        let (name, sampling) = (first.model.clone(), first.sampling.clone());
        if let Some(other) = entries.iter().find(|e| e.scorer.is_none() && !e.user && e.model != name) {
            return Err(format!(
                "{} holds responses of several models ({name}, {}); replay one model per file",
                events.display(),
                other.model
            ));
        }
        let mut agent = Tape { sampling, ..Tape::default() };
        let mut graders: HashMap<String, Tape> = HashMap::new();
        for e in entries {
            let tape = match (&e.scorer, e.user) {
                (None, false) => &mut agent,
                _ => graders
                    .entry(e.model.clone())
                    .or_insert_with(|| Tape { sampling: e.sampling.clone(), ..Tape::default() }),
            };
            tape.push(e);
        }
        Ok(Replay { name, source: events, agent, graders, misses: AtomicUsize::new(0) })
    }

    /// The model the recording's agent talked to.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the recording holds calls of the grader `model`.
    pub fn records_grader(&self, model: &str) -> bool {
        self.graders.contains_key(model)
    }

    /// What one episode's agent (`grader: None`) or grader talks to.
    pub fn episode(self: &Arc<Self>, grader: Option<&str>, episode_id: &str, task_id: &str) -> Arc<dyn LanguageModel> {
        Arc::new(EpisodeReplay {
            replay: self.clone(),
            grader: grader.map(String::from),
            episode: episode_id.to_owned(),
            task: task_id.to_owned(),
        })
    }

    fn tape(&self, grader: Option<&str>) -> Option<&Tape> {
        match grader {
            None => Some(&self.agent),
            Some(model) => self.graders.get(model),
        }
    }

    fn explain_miss(&self, tape: &Tape, episode: &str, wanted: &CanonicalRequest, digest: &str) -> String {
        let own = tape.calls.contains_key(episode);
        let legacy = !own && tape.calls.contains_key(ANY_EPISODE);
        let pool = if own { episode } else { ANY_EPISODE };
        if let Some(n) = tape.recorded.get(&(pool.to_owned(), digest.to_owned())) {
            let here = if own { " in this episode" } else { "" };
            return format!("this request was recorded {n} time(s){here} and every recorded response has been served");
        }
        if !own && !legacy {
            let elsewhere: usize = tape.recorded.iter().filter(|((_, d), _)| d == digest).map(|(_, n)| n).sum();
            let lead = "nothing was recorded for this episode (its suite, task content, model or epoch differ from the recording's)";
            if elsewhere > 0 {
                return format!("{lead}; the same request was recorded {elsewhere} time(s) in other episodes");
            }
            // Another episode's nearest request still shows what changed in the prompt.
            return match nearest(tape.requests.iter().map(|(_, r)| r), wanted) {
                Some(r) => format!("{lead}; the nearest recorded request {}", difference(r, wanted)),
                None => format!("{lead}; no recorded request has digest {digest}"),
            };
        }
        // The same episode's requests only: another task's are no guide to what changed.
        let candidates = tape.requests.iter().filter(|(e, _)| e == pool).map(|(_, r)| r);
        match nearest(candidates, wanted) {
            Some(r) if own => format!("this episode's nearest recorded request {}", difference(r, wanted)),
            Some(r) => format!("the nearest recorded request {}", difference(r, wanted)),
            None if own => format!(
                "none of this episode's {} recorded call(s) has this request, so its prompt, tools or sampling changed ({} keeps request digests only; a cassette from --record shows the difference)",
                tape.calls.get(episode).copied().unwrap_or(0),
                self.source.display()
            ),
            None => format!("no recorded request has digest {digest} ({} holds digests only)", self.source.display()),
        }
    }
}

/// The recorded request that shares the longest start with `wanted`, same tools first,
/// then the one nearest in length (the same step of the episode).
fn nearest<'a>(
    requests: impl Iterator<Item = &'a CanonicalRequest>,
    wanted: &CanonicalRequest,
) -> Option<&'a CanonicalRequest> {
    requests.max_by_key(|r| {
        (
            r.tools == wanted.tools,
            r.messages.iter().zip(&wanted.messages).take_while(|(a, b)| a == b).count(),
            std::cmp::Reverse(r.messages.len().abs_diff(wanted.messages.len())),
        )
    })
}

/// Where `wanted` parts from `recorded`, as "differs at …".
fn difference(recorded: &CanonicalRequest, wanted: &CanonicalRequest) -> String {
    if recorded.tools != wanted.tools {
        let names = |t: &[ToolSpec]| t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ");
        if names(&recorded.tools) != names(&wanted.tools) {
            return format!("has other tools: recorded [{}], now [{}]", names(&recorded.tools), names(&wanted.tools));
        }
        return "differs in a tool's description or schema".into();
    }
    let same = recorded.messages.iter().zip(&wanted.messages).take_while(|(a, b)| a == b).count();
    match (recorded.messages.get(same), wanted.messages.get(same)) {
        (Some(was), Some(now)) => {
            let roles = if role(was) == role(now) {
                role(now).to_owned()
            } else {
                format!("recorded {}, now {}", role(was), role(now))
            };
            let (was, now) = (render(was), render(now));
            let at = was.chars().zip(now.chars()).take_while(|(a, b)| a == b).count();
            format!(
                "differs at message {} ({roles}): recorded {:?}, now {:?}",
                same + 1,
                excerpt(&was, at),
                excerpt(&now, at)
            )
        }
        _ if recorded.messages.len() == wanted.messages.len() => {
            "has the same messages and tools: the model's sampling settings differ".into()
        }
        _ => format!(
            "has {} messages and this one {}, the same up to there",
            recorded.messages.len(),
            wanted.messages.len()
        ),
    }
}

/// One episode's view of a [`Replay`]: its agent's calls, or its grader's.
struct EpisodeReplay {
    replay: Arc<Replay>,
    /// The grader model, when this serves a grader.
    grader: Option<String>,
    episode: String,
    task: String,
}

#[async_trait]
impl LanguageModel for EpisodeReplay {
    fn name(&self) -> &str {
        self.grader.as_deref().unwrap_or(&self.replay.name)
    }

    fn sampling(&self) -> Map<String, Value> {
        let tape = self.replay.tape(self.grader.as_deref());
        tape.map(|t| t.sampling_of.get(&self.episode).unwrap_or(&t.sampling).clone()).unwrap_or_default()
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let tape = self.replay.tape(self.grader.as_deref());
        let sampling = self.sampling();
        let key = request_digest(self, &sampling, request);
        match self.serve_retried(tape, &key, request) {
            Some(Ok(response)) => {
                let mut response = request.run_own.restored(&response);
                response.cache_hit = true;
                response.attempts = 1;
                return Ok(response);
            }
            // The recording ended on this failure: the replay ends the same way, and says so.
            Some(Err(failure)) => {
                return Err(ModelError::new(failure.cause, format!("the recorded call failed: {}", failure.message)));
            }
            None => {}
        }
        let why = match tape {
            Some(tape) => self.replay.explain_miss(tape, &self.episode, &canonical_request(self, request), &key),
            None => format!("the recording holds no calls of the grader {}", self.name()),
        };
        let who = if self.grader.is_some() { "the grader's request" } else { "request" };
        let message = format!("no recorded response to {who}: {why}");
        // A miss ends the episode unscored; it is said on the console too, so that a
        // replay in CI shows why without opening the log.
        let n = self.replay.misses.fetch_add(1, Ordering::Relaxed);
        if n < MISSES_SHOWN {
            eprintln!("replay miss: task `{}` (episode {}): {message}", self.task, self.episode);
        } else if n == MISSES_SHOWN {
            eprintln!("replay miss: more misses; each episode's is in the log");
        }
        Err(ModelError::new(UnscoredCause::ReplayMiss, message))
    }
}

impl EpisodeReplay {
    /// The next recorded line of this request past its retried attempts, which are told to
    /// the request's watch as they were to the recording's.
    fn serve_retried(&self, tape: Option<&Tape>, key: &str, request: &ModelRequest<'_>) -> Option<Recorded> {
        loop {
            match tape?.serve(&self.episode, key)? {
                Err(failure) if failure.retried => {
                    let Failure { cause, message, attempt, .. } = failure;
                    let attempt = attempt.unwrap_or(1);
                    if let Some(watch) = request.watch {
                        watch.retried(&FailedAttempt { attempt, cause, message, wall: std::time::Duration::ZERO });
                    }
                }
                served => return Some(served),
            }
        }
    }
}

fn is_event_log(path: &Path) -> Result<bool, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("failed to open {}: {e}", path.display()))?;
    let mut first = String::new();
    BufReader::new(file).read_line(&mut first).map_err(|e| format!("failed to read {}: {e}", path.display()))?;
    let head: Value = serde_json::from_str(first.trim()).unwrap_or(Value::Null);
    Ok(head.get("run_id").is_some() && head.get("seq").is_some())
}

fn role(m: &Message) -> &'static str {
    match m {
        Message::System { .. } => "system",
        Message::User { .. } => "user",
        Message::Assistant { .. } => "assistant",
        Message::Tool { .. } => "tool",
    }
}

fn render(m: &Message) -> String {
    match m {
        Message::System { content } | Message::User { content } | Message::Tool { content, .. } => content.clone(),
        Message::Assistant { .. } => serde_json::to_string(m).unwrap_or_default(),
    }
}

/// Forty characters around where two texts part ways.
fn excerpt(text: &str, at: usize) -> String {
    let start = at.saturating_sub(20);
    let piece: String = text.chars().skip(start).take(40).collect();
    let lead = if start > 0 { "…" } else { "" };
    let tail = if text.chars().count() > start + 40 { "…" } else { "" };
    format!("{lead}{piece}{tail}")
}

/// Whether the file ends with a newline (or is empty).
fn ends_with_newline(path: &Path) -> bool {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else { return true };
    let mut last = [0u8; 1];
    match file.seek(SeekFrom::End(-1)) {
        Ok(_) => file.read_exact(&mut last).is_ok() && last[0] == b'\n',
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(messages: Vec<Message>) -> CanonicalRequest {
        CanonicalRequest { model: "m".into(), sampling: Map::new(), messages, tools: Vec::new(), directives: None }
    }

    fn user(text: &str) -> Message {
        Message::User { content: text.into() }
    }

    fn call(episode: &str, digest: &str, failed: bool) -> Call {
        let failure = Failure::new(UnscoredCause::ProviderError, "503".into());
        Call {
            model: "m".into(),
            sampling: Map::new(),
            digest: digest.into(),
            episode: Some(episode.into()),
            scorer: None,
            user: false,
            request: None,
            response: if failed { Err(failure) } else { Ok(ModelResponse::default()) },
        }
    }

    #[test]
    fn a_failure_is_kept_only_where_it_ended_its_episodes_recording() {
        // Episode a failed, then was run again by a resume that got answers; b ended on its failure.
        let calls = vec![call("a", "d1", false), call("a", "d2", true), call("b", "d1", true), call("a", "d2", false)];
        let kept: Vec<(String, bool)> = drop_failures_run_again(calls)
            .iter()
            .map(|c| (format!("{}:{}", c.episode.as_deref().unwrap_or(""), c.digest), c.response.is_ok()))
            .collect();
        let expected = [("a:d1", true), ("b:d1", false), ("a:d2", true)];
        assert_eq!(kept, expected.map(|(k, ok)| (k.to_owned(), ok)));
    }

    /// A retried attempt's line stays with its call: kept before its answer (or the
    /// failure that ended the recording), dropped with a failure a resume ran again.
    #[test]
    fn a_retried_attempt_is_kept_with_its_call() {
        let retried = |episode: &str| {
            let mut c = call(episode, "d1", true);
            if let Err(failure) = &mut c.response {
                failure.retried = true;
                failure.attempt = Some(1);
            }
            c
        };
        // a: a retry answered; b: retried, then failed, then a resume answered; c: retried and ended failed.
        let calls = vec![
            retried("a"),
            call("a", "d1", false),
            retried("b"),
            call("b", "d1", true),
            call("b", "d1", false),
            retried("c"),
            call("c", "d1", true),
        ];
        let kept: Vec<(String, bool, bool)> = drop_failures_run_again(calls)
            .iter()
            .map(|c| {
                let retried = c.response.as_ref().err().is_some_and(|f| f.retried);
                (c.episode.clone().unwrap_or_default(), c.response.is_ok(), retried)
            })
            .collect();
        let expected =
            [("a", false, true), ("a", true, false), ("b", true, false), ("c", false, true), ("c", false, false)];
        assert_eq!(kept, expected.map(|(e, ok, r)| (e.to_owned(), ok, r)));
    }

    #[test]
    fn a_difference_names_the_role_of_each_side_when_they_differ() {
        let system = Message::System { content: "Be exact.".into() };
        let recorded = request(vec![
            system.clone(),
            user("Add 2 and 2."),
            Message::Assistant { content: Some("4".into()), tool_calls: Vec::new() },
        ]);
        let wanted = request(vec![system.clone(), user("Add 2 and 2."), user("Go on.")]);
        let why = difference(&recorded, &wanted);
        assert!(why.starts_with("differs at message 3 (recorded assistant, now user)"), "{why}");
        let same_role = request(vec![system, user("Add 3 and 3.")]);
        assert!(
            difference(&recorded, &same_role).starts_with("differs at message 2 (user)"),
            "{}",
            difference(&recorded, &same_role)
        );
    }

    #[test]
    fn the_nearest_request_is_the_same_step_among_equal_prefixes() {
        let system = Message::System { content: "Be quick.".into() };
        let first = request(vec![Message::System { content: "Be exact.".into() }, user("q")]);
        let later = request(vec![
            Message::System { content: "Be exact.".into() },
            user("q"),
            Message::Assistant { content: Some("a".into()), tool_calls: Vec::new() },
            user("more"),
        ]);
        let wanted = request(vec![system, user("q")]);
        let recorded = [first.clone(), later];
        assert_eq!(nearest(recorded.iter(), &wanted), Some(&first));
    }
}
