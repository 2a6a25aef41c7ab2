//! The wire APIs the gateway speaks, and the dispatch from each to its decoder, encoder and
//! error shape.

use hyper::StatusCode;
use serde_json::{Value, json};

use super::shape::{Asked, Refusal};
use super::{chat, messages, responses};
use crate::model::ModelResponse;

/// The wire API a request came in by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// OpenAI Chat Completions.
    Chat,
    /// OpenAI Responses.
    Responses,
    /// Anthropic Messages.
    Messages,
}

impl Wire {
    pub fn decode(self, body: &Value) -> Result<Asked, Refusal> {
        let Some(body) = body.as_object() else {
            return Err(Refusal::bad_request(None, "the request body must be a JSON object"));
        };
        match self {
            Wire::Chat => chat::decode(body),
            Wire::Responses => responses::decode(body),
            Wire::Messages => messages::decode(body),
        }
    }

    /// The response body: JSON, or the whole event stream when `asked.stream`.
    pub fn encode(self, asked: &Asked, response: &ModelResponse, step: u32) -> String {
        match self {
            Wire::Chat => chat::encode(asked, response, step),
            Wire::Responses => responses::encode(asked, response, step),
            Wire::Messages => messages::encode(asked, response, step),
        }
    }

    /// The id of a tool call the model gave none, as the provider would spell it; the same
    /// in every run of the episode, so that a replay finds the requests that carry it.
    pub fn call_id(self, step: u32, index: usize) -> String {
        match self {
            Wire::Messages => format!("toolu_{step:02}_{index}"),
            Wire::Chat | Wire::Responses => format!("call_{step:02}_{index}"),
        }
    }

    pub fn error_body(self, refusal: &Refusal) -> Value {
        match self {
            Wire::Messages => {
                let kind = match refusal.status {
                    StatusCode::UNAUTHORIZED => "authentication_error",
                    StatusCode::FORBIDDEN => "permission_error",
                    StatusCode::NOT_FOUND => "not_found_error",
                    StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
                    s if s.is_server_error() => "api_error",
                    _ => "invalid_request_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": refusal.message}})
            }
            Wire::Chat | Wire::Responses => {
                let (kind, code) = match refusal.status {
                    StatusCode::UNAUTHORIZED => ("invalid_request_error", Some("invalid_api_key")),
                    StatusCode::FORBIDDEN => ("insufficient_quota", Some("limit_reached")),
                    s if s.is_server_error() => ("server_error", None),
                    _ => ("invalid_request_error", None),
                };
                json!({"error": {"message": refusal.message, "type": kind, "param": refusal.field, "code": code}})
            }
        }
    }
}
