//! A run being written, followed: its `events.jsonl` tailed from where the page's copy of
//! it ended, each new line of interest sent as a server-sent event — an episode started, a
//! step of it, an episode finished, the run finished. The stream ends with the run.

use std::path::PathBuf;
use std::time::Duration;

use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};

/// How often the log is looked at for new lines.
const POLL: Duration = Duration::from_millis(200);
/// A comment line this often keeps proxies and the browser from closing a quiet stream.
const KEEPALIVE_POLLS: u32 = 50;

/// Where the tail is.
struct Tail {
    path: PathBuf,
    offset: u64,
    /// A line begun but not yet ended.
    partial: Vec<u8>,
    polls: u32,
    done: bool,
}

/// The server-sent events of the log at `path` from byte `offset` on.
pub fn events(
    path: PathBuf,
    offset: u64,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, std::convert::Infallible>> + Send {
    let tail = Tail { path, offset, partial: Vec::new(), polls: 0, done: false };
    futures::stream::unfold(tail, |mut tail| async move {
        if tail.done {
            return None;
        }
        loop {
            let text = tail.read_new();
            if !text.is_empty() {
                return Some((Ok(Frame::data(Bytes::from(text))), tail));
            }
            if tail.done {
                return None;
            }
            tail.polls += 1;
            if tail.polls.is_multiple_of(KEEPALIVE_POLLS) {
                return Some((Ok(Frame::data(Bytes::from_static(b": keepalive\n\n"))), tail));
            }
            tokio::time::sleep(POLL).await;
        }
    })
}

impl Tail {
    /// The events of the lines written since the last look, as the stream's text.
    fn read_new(&mut self) -> String {
        use std::io::{Read as _, Seek as _};
        let mut out = String::new();
        let Ok(mut file) = std::fs::File::open(&self.path) else { return out };
        if file.seek(std::io::SeekFrom::Start(self.offset)).is_err() {
            return out;
        }
        let mut bytes = Vec::new();
        if file.take(4 << 20).read_to_end(&mut bytes).is_err() || bytes.is_empty() {
            return out;
        }
        self.offset += bytes.len() as u64;
        self.partial.extend_from_slice(&bytes);
        let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else { return out };
        let complete: Vec<u8> = self.partial.drain(..=end).collect();
        for line in complete.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            if let Some((name, data)) = event_of(line) {
                out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
                if name == "run_finished" {
                    self.done = true;
                }
            }
        }
        out
    }
}

/// The event a log line becomes, if any: its name and a small JSON object.
fn event_of(line: &[u8]) -> Option<(&'static str, Value)> {
    let v: Value = serde_json::from_slice(line).ok()?;
    let id = &v["episode_id"];
    match v["type"].as_str()? {
        "episode_started" => Some((
            "started",
            json!({"episode_id": id, "suite": v["suite"], "task_id": v["task_id"], "model": v["model"], "epoch": v["epoch"]}),
        )),
        "action_dispatched" => Some(("step", json!({"episode_id": id, "step": v["step"], "tool": v["call"]["name"]}))),
        "episode_finished" => Some((
            "finished",
            json!({"episode_id": id, "outcome": v["outcome"]["status"], "passed": v["outcome"]["passed"], "cause": v["outcome"]["cause"]}),
        )),
        "run_finished" => Some(("run_finished", json!({}))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn only_whole_lines_become_events_and_the_run_s_end_ends_the_stream() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut f = std::fs::File::create(&path).unwrap();
        let mut tail = Tail { path: path.clone(), offset: 0, partial: Vec::new(), polls: 0, done: false };
        write!(f, "{{\"type\":\"episode_started\",\"episode_id\":\"e1\",\"suite\":\"s\"}}\n{{\"type\":\"episode_fin")
            .unwrap();
        let first = tail.read_new();
        assert!(first.starts_with("event: started\ndata: {"), "{first}");
        assert!(!first.contains("finished"), "a torn line waits for its end: {first}");
        writeln!(f, "ished\",\"episode_id\":\"e1\",\"outcome\":{{\"status\":\"scored\",\"passed\":true}}}}").unwrap();
        writeln!(f, "{{\"type\":\"run_finished\"}}").unwrap();
        let next = tail.read_new();
        assert!(next.starts_with("event: finished\n"), "{next}");
        assert!(next.contains("\"passed\":true"));
        assert!(next.contains("event: run_finished"));
        assert!(tail.done);
    }
}
