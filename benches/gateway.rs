//! The model gateway's overhead per model call against `mock`: the CPU time of the thread
//! that serves it (decode the request, ask the model, log the `model_call`, encode the JSON
//! or the event stream) and the wall time a client waits, per wire, streaming and not. The
//! gateway runs alone on one thread; the client (reqwest) on others, uncounted. The log's
//! writer thread is counted apart. Prints the median of five rounds.
//! `cargo bench --bench gateway`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use runner::contract::ToolCall;
use runner::domain::{MockCall, MockTurn, text::Text};
use runner::gateway::{Gateway, GatewayHandle, Ledger};
use runner::log::{EventLog, Termination, Usage};
use runner::model::limiter::Deadline;
use runner::model::mock::MockModel;

const CALLS: usize = 500;
const ROUNDS: usize = 5;

/// No limits: the bench measures the gateway, not the budget.
struct Unlimited(AtomicU32, Deadline);

impl Ledger for Unlimited {
    fn admit(&self) -> Result<u32, Termination> {
        Ok(self.0.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn spend(&self, _: Usage, _: Option<f64>) {}
    fn deadline(&self) -> &Deadline {
        &self.1
    }
    fn dispatched(&self, _: &ToolCall) {}
}

/// CPU nanoseconds a thread of this process has run, from `/proc`.
fn thread_cpu_ns(tid: i64) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap_or_default();
    text.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0)
}

fn writer_tid() -> Option<i64> {
    std::fs::read_dir("/proc/self/task").ok()?.flatten().find_map(|task| {
        let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
        (comm.trim() == "event-log").then(|| task.file_name().to_string_lossy().parse().ok()).flatten()
    })
}

/// Turns that alternate a tool call and a text answer, enough for every call of a round.
fn turns() -> Vec<MockTurn> {
    (0..CALLS)
        .map(|i| {
            if i % 2 == 0 {
                let arguments = json!({"path": "notes/a.txt", "content": "a line of text\n".repeat(8)});
                MockTurn { text: None, tool_calls: vec![MockCall { name: "write_file".into(), arguments, id: None }] }
            } else {
                MockTurn { text: Some(Text("The file is written; it holds eight lines.".into())), tool_calls: vec![] }
            }
        })
        .collect()
}

/// A gateway on a thread of its own; its thread id, for its CPU time.
fn start(log: &EventLog) -> (GatewayHandle, i64, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let gateway = Gateway {
        run_own: Default::default(),
        model: Arc::new(MockModel::new(turns().into())),
        model_name: "mock".into(),
        ledger: Arc::new(Unlimited(AtomicU32::new(0), Deadline::after(Duration::from_secs(3600)))),
        recorder: log.recorder("bench"),
        derive_trajectory: true,
    };
    let handle = runtime.block_on(gateway.start()).unwrap();
    // SAFETY: gettid has no preconditions.
    let tid = runtime.block_on(async { tokio::spawn(async { (unsafe { libc::gettid() }) as i64 }).await.unwrap() });
    (handle, tid, runtime)
}

/// A request of a short transcript with two tools, in each wire's shape.
fn request(wire: &str, stream: bool) -> (String, Value) {
    let schema = json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}});
    let body = match wire {
        "chat" => json!({"model": "m", "stream": stream, "messages": [
            {"role": "system", "content": "You write files."},
            {"role": "user", "content": "Write the notes, then say what you did."},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function",
                "function": {"name": "read_file", "arguments": "{\"path\": \"notes/a.txt\"}"}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "no such file"}],
            "tools": [{"type": "function", "function": {"name": "write_file", "parameters": schema}},
                      {"type": "function", "function": {"name": "read_file", "parameters": schema}}]}),
        "responses" => json!({"model": "m", "stream": stream, "instructions": "You write files.", "input": [
            {"role": "user", "content": "Write the notes, then say what you did."},
            {"type": "function_call", "call_id": "call_0", "name": "read_file", "arguments": "{\"path\": \"notes/a.txt\"}"},
            {"type": "function_call_output", "call_id": "call_0", "output": "no such file"}],
            "tools": [{"type": "function", "name": "write_file", "parameters": schema},
                      {"type": "function", "name": "read_file", "parameters": schema}]}),
        _ => json!({"model": "m", "stream": stream, "max_tokens": 1024, "system": "You write files.", "messages": [
            {"role": "user", "content": "Write the notes, then say what you did."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_0", "name": "read_file",
                "input": {"path": "notes/a.txt"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "no such file"}]}],
            "tools": [{"name": "write_file", "input_schema": schema}, {"name": "read_file", "input_schema": schema}]}),
    };
    let path = match wire {
        "chat" => "/v1/chat/completions",
        "responses" => "/v1/responses",
        _ => "/v1/messages",
    };
    (path.to_owned(), body)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let client_runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let client = reqwest::Client::new();
    println!("gateway overhead per model call against `mock`, {CALLS} calls a round, median of {ROUNDS} rounds");
    println!("{:<10} {:<7} {:>16} {:>16} {:>14}", "wire", "stream", "gateway CPU µs", "log writer µs", "wall µs");
    for wire in ["chat", "responses", "messages"] {
        for stream in [false, true] {
            let (mut cpu, mut writer, mut wall) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                let (log, log_writer) =
                    EventLog::create(&dir.path().join(format!("{wire}-{stream}-{round}.jsonl")), "bench").unwrap();
                let (handle, tid, runtime) = start(&log);
                let writer_tid = writer_tid();
                let (path, body) = request(wire, stream);
                let url = format!("{}{path}", handle.url());
                let key = handle.key().to_owned();
                let call = || async {
                    let response = client.post(&url).bearer_auth(&key).json(&body).send().await.unwrap();
                    assert!(response.status().is_success());
                    response.bytes().await.unwrap();
                };
                client_runtime.block_on(call()); // a connection, warm
                let (cpu0, writer0, started) =
                    (thread_cpu_ns(tid), writer_tid.map_or(0, thread_cpu_ns), Instant::now());
                client_runtime.block_on(async {
                    for _ in 1..CALLS {
                        call().await;
                    }
                });
                let n = (CALLS - 1) as f64;
                wall.push(started.elapsed().as_secs_f64() * 1e6 / n);
                cpu.push((thread_cpu_ns(tid) - cpu0) as f64 / 1e3 / n);
                writer.push((writer_tid.map_or(0, thread_cpu_ns) - writer0) as f64 / 1e3 / n);
                drop(handle);
                drop(runtime);
                drop(log);
                log_writer.close().unwrap();
            }
            println!(
                "{wire:<10} {:<7} {:>16.1} {:>16.1} {:>14.1}",
                if stream { "yes" } else { "no" },
                median(cpu),
                median(writer),
                median(wall)
            );
        }
    }
}
