//! `dataset: {path, format: locomo}`: the questions of LoCoMo (`locomo10.json`: a JSON list
//! of samples, each with a `sample_id`, a `conversation` between `speaker_a` and
//! `speaker_b` in dated sessions — `session_N` lists of `{speaker, dia_id, text}` beside
//! `session_N_date_time` — and `qa` items of `question`, `answer`, `evidence` (dia ids) and
//! `category` 1–5) as tasks for the memory agent, one per QA item, like LongMemEval's: the
//! sample's sessions become `metadata.sessions` — held once and shared by the sample's
//! questions (`Task::shared`), not copied into each — the evidence dia ids
//! `D<session>:<turn>` name the evidence sessions and turns (retrieval recall), the
//! category the question type and the judge's rubric. Category 5 questions are adversarial: the conversation never says, and a
//! reply that gives their `adversarial_answer` is wrong, so they are abstention questions.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::TaskFile;
use crate::config::decode::ConfigError;
use crate::config::yaml::Position;
use crate::domain::conversation::parse_date;
use crate::domain::text::Text;
use crate::domain::{MockTurn, SharedMetadata};

/// The question type of each category, 1 to 5, as LoCoMo's evaluation names them.
pub const QUESTION_TYPES: [&str; 5] = ["multi-hop", "temporal", "open-domain", "single-hop", "adversarial"];

/// What an adversarial question's expected answer is: the conversation never says.
const NOT_MENTIONED: &str = "Not mentioned in the conversation";

/// The QA items of every sample of the file `path`, whose text is `bytes`, as tasks, in
/// the file's order.
pub(crate) fn read(path: &Path, bytes: &[u8]) -> Result<Vec<TaskFile>, ConfigError> {
    let all: Value = serde_json::from_slice(bytes).map_err(|e| {
        ConfigError::at(path, Position { line: e.line(), column: e.column() }, format!("invalid JSON: {e}"))
    })?;
    let Value::Array(samples) = all else {
        return Err(ConfigError::whole(
            path,
            "a LoCoMo file is a JSON list of samples ({sample_id, conversation, qa})",
        ));
    };
    let mut tasks = Vec::new();
    for (i, sample) in samples.into_iter().enumerate() {
        sample_tasks(sample, i, &mut tasks).map_err(|(at, why)| ConfigError::whole(path, format!("{at}: {why}")))?;
    }
    Ok(tasks)
}

type Bad = (String, String);

fn sample_tasks(sample: Value, i: usize, tasks: &mut Vec<TaskFile>) -> Result<(), Bad> {
    let at = |field: &str| format!("[{i}].{field}");
    let Value::Object(sample) = sample else {
        return Err((format!("[{i}]"), "must be an object (a sample with `conversation` and `qa`)".into()));
    };
    let sample_id = match sample.get("sample_id") {
        None => format!("sample-{}", i + 1),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => return Err((at("sample_id"), "must be a string".into())),
    };
    let conversation =
        sample.get("conversation").ok_or((at("conversation"), "is missing".to_owned()))?.as_object().ok_or((
            at("conversation"),
            "must be an object (speaker_a, speaker_b, session_N, session_N_date_time)".to_owned(),
        ))?;
    let read = sessions_of(conversation, &|field| at(&format!("conversation.{field}")))?;
    let mut shared = Map::new();
    shared.insert("sessions".into(), Value::Array(read.sessions));
    let shared = Arc::new(SharedMetadata::new(shared));
    let sessions = match shared.fields.get("sessions") {
        Some(Value::Array(sessions)) => sessions.as_slice(),
        _ => &[],
    };
    let conversation = Conversation { sessions, shared: &shared, dia: &read.dia };
    let qa = sample.get("qa").ok_or((at("qa"), "is missing".to_owned()))?;
    let qa = qa.as_array().ok_or((at("qa"), "must be a list of questions".to_owned()))?;
    for (k, item) in qa.iter().enumerate() {
        let at = |field: &str| at(&format!("qa[{k}]{field}"));
        let item = item.as_object().ok_or((at(""), "must be an object (a question)".to_owned()))?;
        tasks.push(question_task(item, &format!("{sample_id}-q{}", k + 1), &conversation, &read.last_date, &at)?);
    }
    Ok(())
}

/// A sample's conversation as read: its sessions, and where each dia id is.
struct Read {
    sessions: Vec<Value>,
    /// The date of the last session (when the questions are asked).
    last_date: String,
    /// Each turn's dia id, and its session id and message number (from 1).
    dia: HashMap<String, (String, u32)>,
}

/// A sample's conversation, as its questions see it.
struct Conversation<'a> {
    sessions: &'a [Value],
    shared: &'a Arc<SharedMetadata>,
    dia: &'a HashMap<String, (String, u32)>,
}

/// The sample's sessions in number order, as `metadata.sessions` wants them, and the date
/// of the last (when its questions are asked). A session's speakers become `user`
/// (`speaker_a`) and `assistant` (`speaker_b`), each message led by the speaker's name.
fn sessions_of(conversation: &Map<String, Value>, at: &dyn Fn(&str) -> String) -> Result<Read, Bad> {
    let speaker = |key: &str| -> Result<String, Bad> {
        conversation.get(key).and_then(Value::as_str).map(str::to_owned).ok_or((at(key), "must be a string".into()))
    };
    let (a, b) = (speaker("speaker_a")?, speaker("speaker_b")?);
    // `session_N` keys, by number; a date without its session (the published file has
    // some) is no session.
    let mut numbered = BTreeMap::new();
    for (key, turns) in conversation {
        if let Some(n) = key.strip_prefix("session_").and_then(|n| n.parse::<u32>().ok()) {
            numbered.insert(n, (key, turns));
        }
    }
    let mut sessions = Vec::with_capacity(numbered.len());
    let mut last_date = String::new();
    let mut dia = HashMap::new();
    for (n, (key, turns)) in numbered {
        let date_key = format!("{key}_date_time");
        let date = match conversation.get(&date_key) {
            Some(Value::String(text)) => parse_date(text).map_err(|e| (at(&date_key), e))?,
            Some(_) => return Err((at(&date_key), "must be a string".into())),
            None => return Err((at(&date_key), format!("is missing (the date of `{key}`)"))),
        };
        let turns = turns.as_array().ok_or((at(key), "must be a list of turns {speaker, dia_id, text}".to_owned()))?;
        let mut messages = Vec::with_capacity(turns.len());
        for (j, turn) in turns.iter().enumerate() {
            let field = |name: &str| at(&format!("{key}[{j}].{name}"));
            let get =
                |name: &str| turn.get(name).and_then(Value::as_str).ok_or((field(name), "must be a string".to_owned()));
            let who = get("speaker")?;
            let role = match who {
                w if w == a => "user",
                w if w == b => "assistant",
                _ => return Err((field("speaker"), format!("unknown speaker `{who}`, expected `{a}` or `{b}`"))),
            };
            let mut content = format!("{who}: {}", get("text")?);
            // A shared photo is known to the conversation by its caption.
            if let Some(caption) = turn.get("blip_caption").and_then(Value::as_str) {
                content.push_str(&format!(" [shares a photo: {caption}]"));
            }
            messages.push(json!({"role": role, "content": content}));
            if let Some(id) = turn.get("dia_id").and_then(Value::as_str) {
                dia.insert(id.to_owned(), (format!("session_{n}"), messages.len() as u32));
            }
        }
        sessions.push(json!({"id": format!("session_{n}"), "date": date, "messages": messages}));
        last_date = date;
    }
    if sessions.is_empty() {
        return Err((at("session_1"), "is missing: a conversation has at least one session".into()));
    }
    Ok(Read { sessions, last_date, dia })
}

fn question_task(
    item: &Map<String, Value>,
    id: &str,
    conversation: &Conversation<'_>,
    question_date: &str,
    at: &dyn Fn(&str) -> String,
) -> Result<TaskFile, Bad> {
    let text = |field: &str| -> Result<Option<String>, Bad> {
        match item.get(field) {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            None | Some(Value::Null) => Ok(None),
            Some(_) => Err((at(&format!(".{field}")), "must be a string".into())),
        }
    };
    let input = text("question")?.ok_or((at(".question"), "is missing".to_owned()))?;
    let category = item.get("category").ok_or((at(".category"), "is missing".to_owned()))?;
    let question_type = category
        .as_u64()
        .and_then(|c| usize::try_from(c).ok())
        .and_then(|c| c.checked_sub(1))
        .and_then(|c| QUESTION_TYPES.get(c))
        .ok_or((at(".category"), format!("must be a number from 1 to 5, got {category}")))?;
    let adversarial = *question_type == "adversarial";
    let (answer, trap) = if adversarial {
        (NOT_MENTIONED.to_owned(), text("adversarial_answer")?)
    } else {
        (text("answer")?.ok_or((at(".answer"), "is missing".to_owned()))?, None)
    };
    let (evidence, turns) = evidence_of(item, conversation, at)?;
    let mock = match item.get("mock") {
        None => None,
        Some(turns) => Some(
            serde_json::from_value::<Vec<MockTurn>>(turns.clone())
                .map_err(|e| (at(".mock"), format!("not a mock script: {e}")))?,
        ),
    };
    let mut metadata = Map::new();
    metadata.insert("rubric".into(), json!(rubric(question_type, &answer, trap.as_deref())));
    metadata.insert("question_type".into(), json!(question_type));
    metadata.insert("question_date".into(), json!(question_date));
    metadata.insert("abstention".into(), json!(adversarial));
    if let Some(trap) = trap {
        metadata.insert("adversarial_answer".into(), json!(trap));
    }
    metadata.insert("answer_session_ids".into(), Value::Array(evidence));
    metadata.insert("evidence_turns".into(), Value::Array(turns));
    Ok(TaskFile {
        id: Text(id.to_owned()),
        input: Text(input),
        target: Some(Text(answer)),
        metadata,
        shared: Some(conversation.shared.clone()),
        mock,
        tags: vec![(*question_type).to_owned()],
        ..TaskFile::default()
    })
}

/// The sessions the evidence dia ids (`D<session>:<turn>`) point into, each once, in the
/// order named, and the turns they name (`{session, turn}`, the turn where the dia id is in
/// its session, else its number). The published file writes a few as `"D8:6; D9:17"`; a
/// fragment that names no session (a bare `"D"`) points nowhere and is passed over.
fn evidence_of(
    item: &Map<String, Value>,
    conversation: &Conversation<'_>,
    at: &dyn Fn(&str) -> String,
) -> Result<(Vec<Value>, Vec<Value>), Bad> {
    let sessions = conversation.sessions;
    let Some(given) = item.get("evidence") else {
        return Ok((Vec::new(), Vec::new()));
    };
    let mut turns: Vec<Value> = Vec::new();
    let given = given.as_array().ok_or((at(".evidence"), "must be a list of dia ids (`D1:3`)".to_owned()))?;
    let mut found: Vec<Value> = Vec::new();
    for (j, dia) in given.iter().enumerate() {
        let dia = dia.as_str().ok_or((at(&format!(".evidence[{j}]")), "must be a string (`D1:3`)".to_owned()))?;
        for piece in dia.split(|c: char| c == ';' || c == ',' || c.is_whitespace()) {
            let Some(number) = piece.strip_prefix('D').and_then(|rest| rest.split(':').next()) else { continue };
            let Ok(number) = number.parse::<u32>() else { continue };
            let session = format!("session_{number}");
            if !sessions.iter().any(|s| s["id"] == session.as_str()) {
                return Err((
                    at(&format!(".evidence[{j}]")),
                    format!("`{dia}` points into `{session}`, which the conversation does not have"),
                ));
            }
            let turn = match conversation.dia.get(piece) {
                Some((session, n)) => Some((session.clone(), *n)),
                None => piece.split(':').nth(1).and_then(|t| t.parse::<u32>().ok()).map(|n| (session.clone(), n)),
            };
            if let Some((session, turn)) = turn {
                let turn = json!({"session": session, "turn": turn});
                if !turns.contains(&turn) {
                    turns.push(turn);
                }
            }
            if !found.iter().any(|f| f == session.as_str()) {
                found.push(json!(session));
            }
        }
    }
    Ok((found, turns))
}

/// The judge's rubric for a question of `question_type` whose expected answer is `answer`;
/// `trap` is an adversarial question's wrong answer.
pub fn rubric(question_type: &str, answer: &str, trap: Option<&str>) -> String {
    match (question_type, trap) {
        ("adversarial", Some(trap)) => format!(
            "{} A reply that gives `{trap}` (or any other value) as the answer is wrong.",
            super::longmemeval::rubric(question_type, true, "it was never mentioned")
        ),
        ("adversarial", None) => super::longmemeval::rubric(question_type, true, "it was never mentioned"),
        ("temporal", _) => super::longmemeval::rubric("temporal-reasoning", false, answer),
        _ => super::longmemeval::rubric(question_type, false, answer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(qa: Value) -> Value {
        json!({
            "sample_id": "conv-1",
            "conversation": {
                "speaker_a": "Ana", "speaker_b": "Bo",
                "session_2_date_time": "9:00 am on 3 May, 2023",
                "session_2": [{"speaker": "Bo", "dia_id": "D2:1", "text": "I moved to Porto.", "blip_caption": "a photo of a bridge"}],
                "session_1_date_time": "1:56 pm on 1 May, 2023",
                "session_1": [{"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a cat."}],
                "session_3_date_time": "10:00 am on 9 May, 2023"
            },
            "qa": qa
        })
    }

    fn read_all(samples: Value) -> Result<Vec<TaskFile>, String> {
        let bytes = serde_json::to_vec(&samples).unwrap();
        read(Path::new("locomo.json"), &bytes).map_err(|e| e.to_string())
    }

    #[test]
    fn each_qa_item_becomes_a_task_with_its_sessions_and_evidence() {
        let tasks = read_all(json!([sample(json!([
            {"question": "Where did Bo move?", "answer": "Porto", "evidence": ["D2:1"], "category": 4},
            {"question": "What did Ana adopt in 2022?", "evidence": ["D1:1; D2:1", "D"], "category": 5, "adversarial_answer": "a dog"}
        ]))]))
        .unwrap();
        assert_eq!(tasks.len(), 2);
        let (first, second) = (&tasks[0], &tasks[1]);
        assert_eq!(first.id.0, "conv-1-q1");
        assert_eq!(first.target.as_ref().map(|t| t.0.as_str()), Some("Porto"));
        assert_eq!(first.metadata["question_type"], "single-hop");
        assert_eq!(first.metadata["answer_session_ids"], json!(["session_2"]));
        assert_eq!(first.metadata["question_date"], "2023-05-03T09:00:00Z");
        // The sessions are the sample's, held once for both questions, not in their own metadata.
        assert!(first.metadata.get("sessions").is_none());
        let shared = first.shared.as_ref().unwrap();
        assert!(Arc::ptr_eq(shared, second.shared.as_ref().unwrap()));
        let sessions = &shared.fields["sessions"];
        assert_eq!(sessions[0]["id"], "session_1");
        assert_eq!(sessions[0]["date"], "2023-05-01T13:56:00Z");
        assert_eq!(sessions[0]["messages"][0], json!({"role": "user", "content": "Ana: I adopted a cat."}));
        assert_eq!(sessions[1]["messages"][0]["role"], "assistant");
        assert!(
            sessions[1]["messages"][0]["content"].as_str().unwrap().ends_with("[shares a photo: a photo of a bridge]")
        );
        assert_eq!(second.metadata["abstention"], true);
        assert_eq!(second.metadata["answer_session_ids"], json!(["session_1", "session_2"]));
        assert_eq!(first.metadata["evidence_turns"], json!([{"session": "session_2", "turn": 1}]));
        assert_eq!(
            second.metadata["evidence_turns"],
            json!([{"session": "session_1", "turn": 1}, {"session": "session_2", "turn": 1}])
        );
        assert!(second.metadata["rubric"].as_str().unwrap().contains("`a dog`"));
    }

    #[test]
    fn bad_fields_are_named_by_their_json_path() {
        let good_qa = json!([{"question": "q", "answer": "a", "evidence": [], "category": 1}]);
        let mut bad_speaker = sample(good_qa.clone());
        bad_speaker["conversation"]["session_1"][0]["speaker"] = json!("Cy");
        let mut bad_date = sample(good_qa.clone());
        bad_date["conversation"]["session_2_date_time"] = json!("someday");
        let cases = [
            (json!({"qa": []}), "locomo.json: [0].conversation: is missing"),
            (bad_speaker, "[0].conversation.session_1[0].speaker: unknown speaker `Cy`"),
            (bad_date, "[0].conversation.session_2_date_time: `someday` is not a date"),
            (
                sample(json!([{"question": "q", "answer": "a", "category": 7}])),
                "[0].qa[0].category: must be a number from 1 to 5",
            ),
            (sample(json!([{"question": "q", "category": 2}])), "[0].qa[0].answer: is missing"),
            (
                sample(json!([{"question": "q", "answer": "a", "evidence": ["D9:1"], "category": 1}])),
                "[0].qa[0].evidence[0]: `D9:1` points into `session_9`",
            ),
        ];
        for (samples, expected) in cases {
            let err = read_all(json!([samples])).map(|_| ()).unwrap_err();
            assert!(err.contains(expected), "{err}\nwants: {expected}");
        }
        let err = read_all(json!({"qa": []})).map(|_| ()).unwrap_err();
        assert!(err.contains("a LoCoMo file is a JSON list of samples"), "{err}");
    }

    #[test]
    fn temporal_questions_tolerate_off_by_one_and_others_want_the_answer() {
        assert!(rubric("temporal", "7 May 2023", None).contains("off by one"));
        assert!(rubric("multi-hop", "Porto", None).contains("contains that answer"));
        assert!(rubric("adversarial", NOT_MENTIONED, None).contains("does not know"));
    }
}
