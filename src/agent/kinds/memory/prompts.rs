//! The memory agent's prompts: the seed's shape (agent prefix, operation, ids, previous
//! context, the current message, the rules), with the rules from default files that a
//! suite may replace (`agent: {kind: memory, prompts: {entry_capture: …}}`).

use serde::{Deserialize, Serialize};

use crate::domain::conversation::ChatMessage;

/// A suite's own prompts; each one not given is the default file's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryPrompts {
    pub agent_prefix: Option<String>,
    pub entry_capture: Option<String>,
    pub summary: Option<String>,
    pub context: Option<String>,
    pub answer: Option<String>,
    /// The rules of a tool-calling answer (`answering: {with: tools}`).
    pub answer_tools: Option<String>,
}

impl MemoryPrompts {
    /// These prompts, each one not given taken from `base`.
    pub fn over(self, base: MemoryPrompts) -> MemoryPrompts {
        MemoryPrompts {
            agent_prefix: self.agent_prefix.or(base.agent_prefix),
            entry_capture: self.entry_capture.or(base.entry_capture),
            summary: self.summary.or(base.summary),
            context: self.context.or(base.context),
            answer: self.answer.or(base.answer),
            answer_tools: self.answer_tools.or(base.answer_tools),
        }
    }
}

pub struct Prompts {
    agent_prefix: String,
    entry_capture: String,
    summary: String,
    context: String,
    answer: String,
    answer_tools: String,
}

impl Prompts {
    pub fn resolve(own: MemoryPrompts) -> Prompts {
        let pick = |own: Option<String>, default: &str| own.unwrap_or_else(|| default.trim().to_owned());
        Prompts {
            agent_prefix: pick(own.agent_prefix, include_str!("prompts/agent_prefix.md")),
            entry_capture: pick(own.entry_capture, include_str!("prompts/entry_capture.md")),
            summary: pick(own.summary, include_str!("prompts/summary.md")),
            context: pick(own.context, include_str!("prompts/context.md")),
            answer: pick(own.answer, include_str!("prompts/answer.md")),
            answer_tools: pick(own.answer_tools, include_str!("prompts/answer_tools.md")),
        }
    }

    /// The digest of the prompts the replay uses (all but the answer's): part of an
    /// ingestion's key.
    pub fn ingest_digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let texts = [&self.agent_prefix, &self.entry_capture, &self.summary, &self.context];
        let mut hasher = Sha256::new();
        for text in texts {
            hasher.update((text.len() as u64).to_le_bytes());
            hasher.update(text.as_bytes());
        }
        hex::encode(hasher.finalize())
    }

    pub fn add_entry(&self, header: &str, previous: &str, message: Option<&ChatMessage>) -> String {
        let (role, content) = message.map_or(("", ""), |m| (m.role.as_str(), m.content.as_str()));
        format!(
            "{prefix}\n\nCurrent Operation: PROCESS_MESSAGE\n{header}\n\n\
             Previous conversation context (including retrieved context from previous sessions):\n{previous}\n\n\
             Current message to process:\nRole: {role}\nContent: {content}\n\n\
             INSTRUCTION: Call the add_entry tool for this single message following the rules below.\n\n\
             ---\nENTRY CAPTURE RULES:\n{capture}\n\n---\nSUMMARY GENERATION RULES:\n{summary}\n",
            prefix = self.agent_prefix,
            capture = self.entry_capture,
            summary = self.summary,
        )
    }

    pub fn put_context(&self, header: &str, conversation: &str) -> String {
        format!(
            "{prefix}\n\nCurrent Operation: CONTEXT_SYNTHESIS\n{header}\n\n\
             Full conversation to synthesize into context:\n{conversation}\n\n\
             INSTRUCTION: Call the put_context tool to save a synthesized context document following the rules below.\n\n\
             ---\nCONTEXT MAINTENANCE RULES:\n{context}\n",
            prefix = self.agent_prefix,
            context = self.context,
        )
    }

    pub fn answer(&self, memory: &str, question: &str, date: Option<&str>) -> String {
        let date = date.map(|d| format!("\nThe question is asked on: {d}")).unwrap_or_default();
        format!(
            "{prefix}\n\n{rules}\n\nMEMORY:\n{memory}\n\nQUESTION: {question}{date}\n",
            prefix = self.agent_prefix,
            rules = self.answer
        )
    }

    /// The system prompt of a tool-calling answer; the question is its first message.
    pub fn answer_with_tools(&self, date: Option<&str>) -> String {
        let date = date.map(|d| format!("\n\nThe question is asked on: {d}")).unwrap_or_default();
        format!("{prefix}\n\n{rules}{date}\n", prefix = self.agent_prefix, rules = self.answer_tools)
    }
}
