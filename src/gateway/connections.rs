//! The gateway's connections and what they may hold. Anything on the host, and every
//! process of the episode, can open one without the key; none of them may keep a request
//! that carries the key waiting:
//!
//! - a connection gets [`Patience::headers`] to send a request's headers, and as long idle
//!   between requests; then it is closed;
//! - connections that have not shown the key yet are kept up to [`MAX_UNKEYED`]; a newer one
//!   pushes the oldest out, so that they can never fill the place of one that has the key;
//! - a connection counts among the [`MAX_KEYED`] served at once from its first request with
//!   the key;
//! - a body gets [`Patience::body`] to arrive whole, and never past the episode's end, and
//!   holds memory of the gateway's [`BODY_KIB`] as its bytes arrive, not before: bodies that
//!   trickle in hold next to nothing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::StatusCode;
use hyper::body::Incoming;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, SemaphorePermit};
use tokio::task::AbortHandle;

use super::shape::Refusal;
use super::{State, lock};

/// How long the gateway waits for what a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patience {
    /// For a request's headers, and between the requests of a kept-alive connection.
    pub headers: Duration,
    /// For a request's body, whole (the episode's end comes first when it is sooner).
    pub body: Duration,
}

impl Default for Patience {
    /// Ample for a client on the same host: an SDK sends its request at once.
    fn default() -> Self {
        Patience { headers: Duration::from_secs(10), body: Duration::from_secs(30) }
    }
}

/// The largest request body the gateway reads.
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// How many connections that showed the episode's key are served at once; a request on
/// another waits until one closes (an idle one closes at [`Patience::headers`]).
const MAX_KEYED: usize = 64;

/// How many connections that have not shown the key yet are kept open: past this, the
/// oldest is closed, so that the runner's descriptors are bounded too.
pub const MAX_UNKEYED: usize = 256;

/// The KiB of request bodies one episode's gateway holds at once, as much as four bodies
/// of the largest size: a program (or a model driving it) that sends hundreds at once
/// cannot exhaust the runner's memory. Past it, reading waits for room.
pub const BODY_KIB: usize = 4 * (MAX_BODY_BYTES >> 10);

/// The connections of one gateway: those not keyed yet, oldest first, and the places of
/// the keyed ones.
pub struct Connections {
    unkeyed: Mutex<VecDeque<(u64, AbortHandle)>>,
    keyed: Arc<Semaphore>,
}

impl Default for Connections {
    fn default() -> Self {
        Connections { unkeyed: Mutex::default(), keyed: Arc::new(Semaphore::new(MAX_KEYED)) }
    }
}

/// One connection as its requests see it.
pub struct Connection {
    id: u64,
    /// Its place among the keyed connections, from its first request with the key.
    keyed: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Connection {
    /// Counts the connection among the keyed ones, once it has shown the key: it then waits
    /// for a place, and no newer connection can push it out.
    pub async fn keyed(&self, state: &State) {
        if lock(&self.keyed).is_some() {
            return;
        }
        // The semaphore is never closed.
        let Ok(place) = state.connections.keyed.clone().acquire_owned().await else { return };
        *lock(&self.keyed) = Some(place);
        lock(&state.connections.unkeyed).retain(|(id, _)| *id != self.id);
    }
}

/// Accepts connections until the gateway stops, each served on a task of its own.
pub async fn serve(listener: TcpListener, state: Arc<State>) {
    // Owned here: when the handle aborts this task, every connection's task goes with it,
    // so none outlives its episode on a kept-alive connection.
    let mut tasks = tokio::task::JoinSet::new();
    for id in 0u64.. {
        while tasks.try_join_next().is_some() {}
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, say: wait rather than spin; the program's client retries.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let connection = Arc::new(Connection { id, keyed: Mutex::new(None) });
        // Held while the task starts: its end, which takes it from the list, comes after.
        let mut unkeyed = lock(&state.connections.unkeyed);
        let task = tasks.spawn(serve_one(stream, state.clone(), connection));
        unkeyed.push_back((id, task));
        if unkeyed.len() > MAX_UNKEYED
            && let Some((_, oldest)) = unkeyed.pop_front()
        {
            oldest.abort();
        }
    }
}

async fn serve_one(stream: TcpStream, state: Arc<State>, connection: Arc<Connection>) {
    let id = connection.id;
    let serving = state.clone();
    let service = hyper::service::service_fn(move |request| {
        let (state, connection) = (serving.clone(), connection.clone());
        async move { Ok::<_, std::convert::Infallible>(super::answer(&state, &connection, request).await) }
    });
    let io = hyper_util::rt::TokioIo::new(stream);
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(state.patience.headers)
        .serve_connection(io, service)
        .await;
    lock(&state.connections.unkeyed).retain(|(other, _)| *other != id);
}

/// A request's body, read whole, and the room it holds of [`BODY_KIB`] until it is dropped.
pub struct ReadBody<'a> {
    pub bytes: Vec<u8>,
    _room: Option<SemaphorePermit<'a>>,
}

/// Why a body was not read.
enum Unread {
    TooLarge,
    Failed(hyper::Error),
}

/// Reads a request's body within [`Patience::body`] and the episode's time. A body cut
/// short once the episode is over is refused as that (the program is gone), not as a body
/// too large or broken.
pub async fn read_body(state: &State, body: Incoming) -> Result<ReadBody<'_>, Refusal> {
    let deadline = (tokio::time::Instant::now() + state.patience.body).min(state.gateway.ledger.deadline().at());
    let read = tokio::time::timeout_at(deadline, read_frames(state, body)).await;
    let ended = || Refusal::new(StatusCode::REQUEST_TIMEOUT, "the episode ended while the body was being read");
    match read {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(Unread::TooLarge)) => Err(Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the gateway reads ({MAX_BODY_BYTES} bytes)"),
        )),
        Ok(Err(Unread::Failed(_))) | Err(_) if super::is_over(state) => Err(ended()),
        Ok(Err(Unread::Failed(e))) => {
            Err(Refusal::new(StatusCode::BAD_REQUEST, format!("the request body could not be read: {e}")))
        }
        Err(_) => Err(Refusal::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive whole within {}s", state.patience.body.as_secs_f64()),
        )),
    }
}

/// The body's bytes as they come, each KiB taking its room first.
async fn read_frames(state: &State, mut body: Incoming) -> Result<ReadBody<'_>, Unread> {
    let kib = |bytes: usize| bytes.div_ceil(1 << 10);
    let mut bytes = Vec::new();
    let mut room: Option<SemaphorePermit<'_>> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(Unread::Failed)?.into_data() else { continue };
        let total = bytes.len() + data.len();
        if total > MAX_BODY_BYTES {
            return Err(Unread::TooLarge);
        }
        let more = kib(total) - kib(bytes.len());
        if more > 0 {
            // The semaphore is never closed; its size fits the largest body.
            let Ok(taken) = state.bodies.acquire_many(more as u32).await else { return Err(Unread::TooLarge) };
            match &mut room {
                Some(room) => room.merge(taken),
                None => room = Some(taken),
            }
        }
        bytes.extend_from_slice(&data);
    }
    Ok(ReadBody { bytes, _room: room })
}
