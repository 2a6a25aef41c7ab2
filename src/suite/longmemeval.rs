//! `dataset: {path, format: longmemeval}`: the questions of LongMemEval (a JSON list of
//! `question_id`, `question_type`, `question`, `answer`, `question_date`,
//! `haystack_session_ids`, `haystack_dates`, `haystack_sessions`, `answer_session_ids`)
//! as tasks for the memory agent: the haystack becomes `metadata.sessions` (replayed in
//! date order), the question the input, the answer the target, and the question's type
//! picks the judge's rubric (`metadata.rubric`, for `llm_rubric: "{{ rubric }}"`). A turn's
//! `has_answer` is dropped from the messages here: only the report's recall by turn reads
//! which turns had it (`metadata.evidence_turns`: `[{session, turn}]`, never in a prompt).

use std::collections::HashSet;
use std::path::Path;

use serde_json::{Map, Value, json};

use super::TaskFile;
use crate::config::decode::ConfigError;
use crate::config::yaml::Position;
use crate::domain::MockTurn;
use crate::domain::conversation::{ROLES, parse_date};
use crate::domain::text::Text;

/// The question types of LongMemEval; another is read, and judged by the default rubric.
pub const QUESTION_TYPES: [&str; 6] = [
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "knowledge-update",
    "temporal-reasoning",
];

/// The questions of the file `path`, whose text is `bytes`, as tasks, in the file's order.
pub(crate) fn read(path: &Path, bytes: &[u8]) -> Result<Vec<TaskFile>, ConfigError> {
    let bad = |at: String, why: String| ConfigError::whole(path, format!("{at}: {why}"));
    let all: Value = serde_json::from_slice(bytes).map_err(|e| {
        ConfigError::at(path, Position { line: e.line(), column: e.column() }, format!("invalid JSON: {e}"))
    })?;
    let Value::Array(questions) = all else {
        return Err(ConfigError::whole(path, "a LongMemEval file is a JSON list of questions"));
    };
    let mut tasks = Vec::with_capacity(questions.len());
    for (i, question) in questions.into_iter().enumerate() {
        tasks.push(question_task(question, i).map_err(|(at, why)| bad(at, why))?);
    }
    Ok(tasks)
}

type Bad = (String, String);

/// The task of the `i`th question of the file.
fn question_task(question: Value, i: usize) -> Result<TaskFile, Bad> {
    let Value::Object(mut q) = question else {
        return Err((format!("[{i}]"), "must be an object (a question)".into()));
    };
    let fields = Question { q: &q, i };
    let id = fields.text("question_id")?;
    let question_type = fields.text("question_type")?;
    let input = fields.text("question")?;
    let answer = fields.text("answer")?;
    let question_date = parse_date(&fields.text("question_date")?).map_err(|e| (fields.at("question_date"), e))?;
    let Haystack { sessions, known, evidence_turns } = haystack(&fields)?;
    let evidence = answer_sessions(&fields, &known)?;
    let mock = match q.remove("mock") {
        None => None,
        Some(turns) => Some(
            serde_json::from_value::<Vec<MockTurn>>(turns)
                .map_err(|e| (format!("[{i}].mock"), format!("not a mock script: {e}")))?,
        ),
    };
    let abstention = id.ends_with("_abs");
    let mut metadata = Map::new();
    metadata.insert("rubric".into(), json!(rubric(&question_type, abstention, &answer)));
    metadata.insert("question_type".into(), json!(question_type));
    metadata.insert("question_date".into(), json!(question_date));
    metadata.insert("abstention".into(), json!(abstention));
    metadata.insert("answer_session_ids".into(), Value::Array(evidence));
    metadata.insert("evidence_turns".into(), Value::Array(evidence_turns));
    metadata.insert("sessions".into(), Value::Array(sessions));
    Ok(TaskFile {
        id: Text(id),
        input: Text(input),
        target: Some(Text(answer)),
        metadata,
        mock,
        tags: vec![question_type],
        ..TaskFile::default()
    })
}

/// One question's fields, read with errors that name the question and the field.
struct Question<'a> {
    q: &'a Map<String, Value>,
    i: usize,
}

impl Question<'_> {
    fn at(&self, field: &str) -> String {
        format!("[{}].{field}", self.i)
    }

    /// A field that is text (a number is read as its text).
    fn text(&self, field: &str) -> Result<String, Bad> {
        match self.q.get(field) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Number(n)) => Ok(n.to_string()),
            Some(_) => Err((self.at(field), "must be a string".into())),
            None => Err((self.at(field), "is missing".into())),
        }
    }

    fn list(&self, field: &str) -> Result<Vec<Value>, Bad> {
        match self.q.get(field) {
            Some(Value::Array(items)) => Ok(items.clone()),
            Some(_) => Err((self.at(field), "must be a list".into())),
            None => Err((self.at(field), "is missing".into())),
        }
    }
}

/// A question's haystack, read: its sessions as the memory agent replays them, their ids,
/// and the turns marked `has_answer` (for the report's recall by turn alone).
struct Haystack {
    sessions: Vec<Value>,
    known: HashSet<String>,
    evidence_turns: Vec<Value>,
}

/// Reads the three parallel lists of the haystack (ids, dates, sessions) into sessions.
fn haystack(fields: &Question) -> Result<Haystack, Bad> {
    let at = |field: &str| fields.at(field);
    let ids = fields.list("haystack_session_ids")?;
    let dates = fields.list("haystack_dates")?;
    let haystack = fields.list("haystack_sessions")?;
    if dates.len() != haystack.len() || ids.len() != haystack.len() {
        return Err((
            at("haystack_sessions"),
            format!(
                "has {} sessions, but haystack_dates has {} and haystack_session_ids {}",
                haystack.len(),
                dates.len(),
                ids.len()
            ),
        ));
    }
    let mut read =
        Haystack { sessions: Vec::with_capacity(haystack.len()), known: HashSet::new(), evidence_turns: Vec::new() };
    for (j, ((id, date), turns)) in ids.iter().zip(&dates).zip(&haystack).enumerate() {
        let id = id.as_str().ok_or((at(&format!("haystack_session_ids[{j}]")), "must be a string".to_owned()))?;
        read.known.insert(id.to_owned());
        let date = date.as_str().ok_or((at(&format!("haystack_dates[{j}]")), "must be a string".to_owned()))?;
        let date = parse_date(date).map_err(|e| (at(&format!("haystack_dates[{j}]")), e))?;
        let turns =
            turns.as_array().ok_or((at(&format!("haystack_sessions[{j}]")), "must be a list of turns".to_owned()))?;
        let messages = session_messages(fields, j, id, turns, &mut read.evidence_turns)?;
        read.sessions.push(json!({"id": id, "date": date, "messages": messages}));
    }
    Ok(read)
}

/// The `j`th session's turns as messages of a role and a content; the turns that had the
/// answer are added to `evidence_turns`.
fn session_messages(
    fields: &Question,
    j: usize,
    id: &str,
    turns: &[Value],
    evidence_turns: &mut Vec<Value>,
) -> Result<Vec<Value>, Bad> {
    let mut messages = Vec::with_capacity(turns.len());
    for (k, turn) in turns.iter().enumerate() {
        let field = |name: &str| fields.at(&format!("haystack_sessions[{j}][{k}].{name}"));
        let get =
            |name: &str| turn.get(name).and_then(Value::as_str).ok_or((field(name), "must be a string".to_owned()));
        let role = get("role")?;
        if !ROLES.contains(&role) {
            return Err((field("role"), format!("unknown role `{role}`, expected one of: {}", ROLES.join(", "))));
        }
        // Only the role and the content: `has_answer` stays out of every message.
        messages.push(json!({"role": role, "content": get("content")?}));
        if turn.get("has_answer").and_then(Value::as_bool) == Some(true) {
            evidence_turns.push(json!({"session": id, "turn": k + 1}));
        }
    }
    Ok(messages)
}

/// `answer_session_ids`, when given, each a session of the haystack.
fn answer_sessions(fields: &Question, known: &HashSet<String>) -> Result<Vec<Value>, Bad> {
    let evidence = match fields.q.get("answer_session_ids") {
        None => Vec::new(),
        Some(_) => fields.list("answer_session_ids")?,
    };
    for (j, id) in evidence.iter().enumerate() {
        let at = fields.at(&format!("answer_session_ids[{j}]"));
        let id = id.as_str().ok_or((at.clone(), "must be a string".to_owned()))?;
        if !known.contains(id) {
            return Err((at, format!("session `{id}` is not in the haystack")));
        }
    }
    Ok(evidence)
}

/// The judge's rubric for a question of `question_type` whose expected answer is `answer`.
pub fn rubric(question_type: &str, abstention: bool, answer: &str) -> String {
    if abstention {
        return format!(
            "The question cannot be answered from the conversation ({answer}). The answer is correct only if it \
             says that it does not know or that the information was never given; an answer that offers a value is wrong."
        );
    }
    match question_type {
        "temporal-reasoning" => format!(
            "The expected answer is: {answer}. The answer is correct if it gives the same time, date or duration. \
             A count of days, weeks or months that is off by one from the expected count is still correct."
        ),
        "knowledge-update" => format!(
            "The expected answer is the latest value: {answer}. The answer is correct if it gives that value as the \
             current one; mentioning an earlier value as well is fine, giving only an earlier value is wrong."
        ),
        "single-session-preference" => format!(
            "The expected answer is a rubric for a personalised reply: {answer}. The answer is correct if it \
             satisfies the rubric (it draws on the user's stated preferences); it need not match word for word."
        ),
        _ => format!(
            "The expected answer is: {answer}. The answer is correct if it contains that answer or one equivalent \
             to it; an answer that gives only part of it, or another value, is wrong."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(extra: Value) -> Value {
        let mut q = json!({
            "question_id": "q1", "question_type": "multi-session", "question": "How many pets?", "answer": 2,
            "question_date": "2023/06/01 (Thu) 09:00",
            "haystack_session_ids": ["b", "a"], "haystack_dates": ["2023/05/21 (Sun) 10:00", "2023/05/20 (Sat) 10:00"],
            "haystack_sessions": [[{"role": "user", "content": "I got a cat.", "has_answer": true}], [{"role": "user", "content": "I got a dog."}]],
            "answer_session_ids": ["b"]
        });
        if let (Some(q), Value::Object(extra)) = (q.as_object_mut(), extra) {
            q.extend(extra);
        }
        q
    }

    fn read_one(q: Value) -> Result<TaskFile, String> {
        let bytes = serde_json::to_vec(&json!([q])).unwrap();
        read(Path::new("lme.json"), &bytes).map(|mut tasks| tasks.remove(0)).map_err(|e| e.to_string())
    }

    #[test]
    fn a_question_becomes_a_task_without_has_answer() {
        let task = read_one(question(json!({}))).unwrap();
        assert_eq!((task.id.0.as_str(), task.target.as_ref().map(|t| t.0.as_str())), ("q1", Some("2")));
        let metadata = Value::Object(task.metadata.clone()).to_string();
        assert!(!metadata.contains("has_answer"), "{metadata}");
        assert_eq!(task.metadata["question_date"], "2023-06-01T09:00:00Z");
        assert_eq!(task.metadata["sessions"][0]["date"], "2023-05-21T10:00:00Z");
        // Session `b`'s first turn has the answer: the report knows it, no message says it.
        assert_eq!(task.metadata["evidence_turns"], json!([{"session": "b", "turn": 1}]));
        let messages = task.metadata["sessions"].to_string();
        assert!(!messages.contains("has_answer") && !messages.contains("evidence"), "{messages}");
    }

    #[test]
    fn bad_fields_are_named_by_their_json_path() {
        let cases = [
            (
                json!({"haystack_dates": ["soon", "2023/05/20 (Sat) 10:00"]}),
                "lme.json: [0].haystack_dates[0]: `soon` is not a date",
            ),
            (json!({"answer_session_ids": ["zz"]}), "[0].answer_session_ids[0]: session `zz` is not in the haystack"),
            (
                json!({"haystack_sessions": [[{"role": "bot", "content": "x"}], []]}),
                "[0].haystack_sessions[0][0].role: unknown role `bot`",
            ),
            (json!({"question": null}), "[0].question: must be a string"),
        ];
        for (extra, expected) in cases {
            let err = read_one(question(extra)).map(|_| ()).unwrap_err();
            assert!(err.contains(expected), "{err}\nwants: {expected}");
        }
    }

    #[test]
    fn each_type_has_its_rubric() {
        assert!(rubric("temporal-reasoning", false, "7 days").contains("off by one"));
        assert!(rubric("knowledge-update", false, "Lisbon").contains("latest value: Lisbon"));
        assert!(rubric("single-session-preference", false, "suggest tea").contains("rubric for a personalised reply"));
        assert!(rubric("multi-session", true, "never said").contains("does not know"));
        assert!(rubric("single-session-user", false, "Rex").contains("contains that answer"));
    }
}
