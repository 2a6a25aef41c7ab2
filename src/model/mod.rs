//! Language models: messages and tool specs in, a response out. Backends are named
//! `provider/model`; this build has `mock`, which plays each task's scripted turns.

pub mod mock;

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::contract::ToolSpec;
use crate::log::Usage;
use crate::suite::Task;

/// One message of a transcript, in a provider-neutral shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<crate::contract::ToolCall>,
    },
    Tool {
        call_id: String,
        name: String,
        content: String,
    },
}

/// What a backend is asked.
#[derive(Debug, Serialize)]
pub struct ModelRequest<'a> {
    pub messages: &'a [Message],
    pub tools: &'a [ToolSpec],
}

impl ModelRequest<'_> {
    /// A digest of the canonical request: the key for replay and caching.
    pub fn digest(&self) -> String {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(&bytes))
    }
}

/// A tool call as the model wrote it; the agent gives it a call id when it has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProposedCall {
    pub id: Option<String>,
    pub name: String,
    pub arguments: Value,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    pub text: Option<String>,
    pub tool_calls: Vec<ProposedCall>,
    pub usage: Usage,
    pub finish_reason: Option<String>,
}

/// A model call that produced no answer. `cause` becomes the unscored cause.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ModelError {
    pub cause: String,
    pub message: String,
}

#[async_trait]
pub trait LanguageModel: Send + Sync {
    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError>;
}

/// A backend named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    Mock,
}

impl ModelSpec {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "mock" => Ok(ModelSpec::Mock),
            other => {
                Err(format!("unknown model `{other}`: this build runs `mock` (each task's scripted `mock:` turns)"))
            }
        }
    }

    pub fn name(&self) -> &str {
        match self {
            ModelSpec::Mock => "mock",
        }
    }

    /// The model one episode of `task` talks to.
    pub fn for_episode(&self, task: &Task) -> Arc<dyn LanguageModel> {
        match self {
            ModelSpec::Mock => Arc::new(mock::MockModel::new(task.mock.clone())),
        }
    }
}
