//! A stdio server's messages, read with a bound. The MCP client drops a line longer than it
//! reads and keeps waiting for the answer it never saw, so a server's 50 MB answer became
//! "took longer than 5s". Here a message up to [`MAX_MESSAGE_BYTES`] is passed on whole (the
//! output cap then cuts the result, with a marker), and a longer one is replaced by an error
//! answer to the same request that says how large it was.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// The largest message read from a server: far above any output cap, low enough to hold.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Of a message too large, the start kept to find the request's `id` in.
const HEAD_BYTES: usize = 64 << 10;

/// Reads a server's stdout line by line, replacing each line longer than `limit` by an error
/// answer; everything else passes unchanged.
pub struct Bounded<R> {
    inner: R,
    limit: usize,
    /// Bytes of the current line so far.
    line: usize,
    /// The current line, held back until it ends or passes `limit`; once it does, the line
    /// is dropped and only its first [`HEAD_BYTES`] are kept, to find its `id` in.
    head: Vec<u8>,
    /// Whether the current line is past `limit` and being dropped.
    dropping: bool,
    /// What is ready to be handed on.
    out: Vec<u8>,
    taken: usize,
}

impl<R> Bounded<R> {
    pub fn new(inner: R, limit: usize) -> Self {
        Bounded { inner, limit, line: 0, head: Vec::new(), dropping: false, out: Vec::new(), taken: 0 }
    }

    /// Takes in bytes read from the server.
    fn take_in(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let end = bytes.iter().position(|b| *b == b'\n');
            let part = &bytes[..end.map_or(bytes.len(), |i| i + 1)];
            bytes = &bytes[part.len()..];
            self.line += part.len();
            if !self.dropping && self.line > self.limit {
                self.dropping = true;
                self.head.truncate(HEAD_BYTES);
            }
            if self.dropping {
                let room = HEAD_BYTES.saturating_sub(self.head.len());
                self.head.extend_from_slice(&part[..room.min(part.len())]);
            } else {
                self.head.extend_from_slice(part);
            }
            if end.is_some() {
                if self.dropping {
                    let answer = too_large(&self.head, self.line - 1, self.limit);
                    self.out.extend_from_slice(answer.as_bytes());
                    self.head.clear();
                } else {
                    self.out.append(&mut self.head);
                }
                (self.line, self.dropping) = (0, false);
            }
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Bounded<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.taken < this.out.len() {
                let n = (this.out.len() - this.taken).min(buf.remaining());
                buf.put_slice(&this.out[this.taken..this.taken + n]);
                this.taken += n;
                if this.taken == this.out.len() {
                    this.out.clear();
                    this.taken = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 64 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // The end: a last line without a newline goes on as it is.
                    if !this.dropping && !this.head.is_empty() {
                        this.out.append(&mut this.head);
                        continue;
                    }
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Ok(())) => this.take_in(read.filled()),
                other => return other,
            }
        }
    }
}

/// The error answer that replaces a message of `size` bytes: to the request whose `id` the
/// message's `head` names, if it names one (a notification too large is dropped).
fn too_large(head: &[u8], size: usize, limit: usize) -> String {
    let Some(id) = top_level_id(head) else { return String::new() };
    let message = format!(
        "the server's answer was {size} bytes, more than the {} MiB the runner reads of one message; it was dropped",
        limit >> 20
    );
    let answer = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": message}});
    format!("{answer}\n")
}

/// The value of the top-level `"id"` key of the JSON object that `head` begins, when it lies
/// within `head`: a number or a string.
fn top_level_id(head: &[u8]) -> Option<serde_json::Value> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut i = 0;
    while i < head.len() {
        let b = head[i];
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        match b {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' if depth == 1 && head[i..].starts_with(b"\"id\"") && key_value(&head[i + 4..]).is_some() => {
                let value = key_value(&head[i + 4..])?;
                let mut values = serde_json::Deserializer::from_slice(value).into_iter::<serde_json::Value>();
                return values.next()?.ok().filter(|v| v.is_number() || v.is_string());
            }
            b'"' => in_string = true,
            _ => {}
        }
        i += 1;
    }
    None
}

/// What follows a key's `:`, when `rest` (what follows a string) is one.
fn key_value(rest: &[u8]) -> Option<&[u8]> {
    let rest = &rest[rest.iter().position(|c| !c.is_ascii_whitespace())?..];
    rest.strip_prefix(b":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn read_all(input: &[u8], limit: usize) -> String {
        let mut out = String::new();
        Bounded::new(input, limit).read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn lines_within_the_limit_pass_unchanged_and_a_longer_one_becomes_an_error_to_its_request() {
        let small = "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n";
        assert_eq!(read_all(small.as_bytes(), 100).await, small);
        let long = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"id\",\"result\":{{\"id\":9,\"text\":\"{}\"}},\"id\":\"r7\"}}\n",
            "x".repeat(500)
        );
        let input = format!("{long}{small}");
        let out = read_all(input.as_bytes(), 100).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        let error: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(error["id"], "r7", "the top-level id, not the nested one: {error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("{} bytes", long.len() - 1)), "{message}");
        assert_eq!(lines[1], small.trim_end());
        // A long line within a larger limit passes whole.
        let big = format!("{{\"id\":2,\"text\":\"{}\"}}\n", "y".repeat(3 * HEAD_BYTES));
        assert_eq!(read_all(big.as_bytes(), MAX_MESSAGE_BYTES).await, big);
        // A last line without a newline is passed on too.
        assert_eq!(read_all(b"{\"id\":3}", 100).await, "{\"id\":3}");
    }
}
