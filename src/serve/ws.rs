//! The step API over a WebSocket, as OpenEnv's client speaks it at `/ws`: one session per
//! connection; messages `{"type": "reset"|"step"|"state"|"close", "data": {…}}` in, and
//! `{"type": "observation"|"state"|"error", "data": {…}}` out. A connection that closes
//! with its episode under way cancels the episode (logged, its world torn down).

use std::sync::Arc;

use futures::{SinkExt as _, StreamExt as _};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

use super::Service;
use super::http::ApiError;
use super::steps::StepSession;

/// Serves one WebSocket session until the client closes it.
pub async fn session(service: Arc<Service>, mut socket: WebSocketStream<TokioIo<Upgraded>>) {
    let mut current: Option<Arc<StepSession>> = None;
    loop {
        let next = tokio::select! {
            _ = service.closing.cancelled() => break,
            next = socket.next() => next,
        };
        let Some(Ok(message)) = next else { break };
        let text = match message {
            Message::Text(text) => text.as_str().to_owned(),
            Message::Binary(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Message::Close(_) => break,
            _ => continue,
        };
        let answer = match serde_json::from_str::<Value>(&text) {
            Err(e) => error("INVALID_JSON", &ApiError::field("body", format!("the message is not JSON: {e}"))),
            Ok(message) => match message["type"].as_str().unwrap_or_default() {
                "close" => break,
                kind => handle(&service, &mut current, kind, &message["data"]).await,
            },
        };
        if socket.send(Message::text(answer.to_string())).await.is_err() {
            break;
        }
    }
    if let Some(session) = current {
        session.cancel();
    }
    let _ = socket.close(None).await;
}

async fn handle(service: &Arc<Service>, current: &mut Option<Arc<StepSession>>, kind: &str, data: &Value) -> Value {
    match kind {
        "reset" => {
            // A new episode: the one under way, if any, is left and cancelled.
            if let Some(old) = current.take() {
                old.cancel();
            }
            let empty = json!({});
            match service.reset(if data.is_object() { data } else { &empty }).await {
                Ok((session, first)) => {
                    *current = Some(session);
                    json!({"type": "observation", "data": first})
                }
                Err(e) => error("EXECUTION_ERROR", &e),
            }
        }
        "step" => match current {
            None => error("EXECUTION_ERROR", &ApiError::conflict("type", "`step` before `reset`: reset first")),
            Some(session) => match service.step(session, Some(data)).await {
                Ok(next) => json!({"type": "observation", "data": next}),
                Err(e) => error("VALIDATION_ERROR", &e),
            },
        },
        "state" => match current {
            None => json!({"type": "state", "data": {"episode_id": null, "step_count": 0}}),
            Some(session) => json!({"type": "state", "data": service.state(session)}),
        },
        other => error(
            "UNKNOWN_TYPE",
            &ApiError::field("type", format!("unknown message type `{other}`: reset, step, state or close")),
        ),
    }
}

fn error(code: &str, e: &ApiError) -> Value {
    json!({"type": "error", "data": {"message": e.message, "code": code, "field": e.field, "status": e.status.as_u16()}})
}
