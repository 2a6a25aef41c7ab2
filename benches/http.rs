//! Requests per second the HTTP client sustains against a zero-latency local server that
//! speaks the OpenAI format, and the CPU per model call (encode, send, receive, decode).
//! Prints the median of five rounds per concurrency. `cargo bench --bench http`.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use runner::contract::ToolSpec;
use runner::model::config::ModelConfig;
use runner::model::http::HttpModel;
use runner::model::{LanguageModel, Message, ModelRequest};

const CALLS: usize = 20_000;

/// Answers every request on a connection with one canned chat completion, keep-alive.
async fn serve(listener: TcpListener) {
    let body = json!({"choices": [{"message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 30, "completion_tokens": 1}})
    .to_string();
    let reply = Arc::new(format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { return };
        let reply = reply.clone();
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(16 * 1024);
            let mut chunk = [0u8; 16 * 1024];
            loop {
                // Read one request: headers, then content-length bytes of body.
                let (head_end, length) = loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| {
                                l.strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        break (end + 4, length);
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                while buf.len() < head_end + length {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                buf.drain(..head_end + length);
                if stream.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
    }
}

fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct we pass; RUSAGE_SELF is always valid.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let addr = runtime.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener));
        addr
    });
    let messages = vec![
        Message::System { content: "You are a careful assistant. Use the tools, then answer.".into() },
        Message::User { content: "What is 17 + 25? Use the calculator.".into() },
    ];
    let tools = vec![ToolSpec::new(
        "calc",
        "Evaluate an arithmetic expression.",
        json!({"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}),
    )];
    println!("{CALLS} calls per round against a zero-latency local server (OpenAI format); median of 5 rounds");
    for concurrency in [1usize, 16, 64, 256] {
        let mut provider = ModelConfig::default().providers["openai-compatible"].clone();
        provider.base_url = Some(format!("http://{addr}/v1"));
        provider.base_url_env = None;
        provider.key_env = None;
        provider.max_concurrency = concurrency;
        let model = Arc::new(HttpModel::new("bench/m", "m", provider, None).expect("model"));
        let mut rounds = Vec::new();
        for _ in 0..5 {
            let (cpu0, t0) = (cpu_seconds(), Instant::now());
            runtime.block_on(async {
                let per_task = CALLS / concurrency;
                let tasks: Vec<_> = (0..concurrency)
                    .map(|_| {
                        let (model, messages, tools) = (model.clone(), messages.clone(), tools.clone());
                        tokio::spawn(async move {
                            for _ in 0..per_task {
                                let request = ModelRequest::new(&messages, &tools);
                                let response = model.respond(&request).await.expect("a response");
                                assert_eq!(response.text.as_deref(), Some("4"));
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("task");
                }
            });
            let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
            let done = (CALLS / concurrency * concurrency) as f64;
            rounds.push((done / wall, cpu / done * 1e6));
        }
        rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (rps, cpu_us) = rounds[2];
        println!(
            "concurrency {concurrency:>3}: {rps:>8.0} requests/s, {cpu_us:>6.1} µs CPU per call (client and server together)"
        );
    }
}
