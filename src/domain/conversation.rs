//! The conversation a memory agent is replayed: sessions of messages, each session with a
//! date, read from a task's `metadata.sessions` and put in date order. Only a message's
//! role and content are kept: whatever else a dataset marks on a turn (LongMemEval's
//! `has_answer`) never reaches a model.

use chrono::{NaiveDate, NaiveDateTime};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One message of a replayed conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// One session: its id, its date (RFC 3339, when it has one) and its messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub id: String,
    pub date: Option<String>,
    pub messages: Vec<ChatMessage>,
}

/// The roles a replayed message may have.
pub const ROLES: [&str; 3] = ["user", "assistant", "system"];

/// The sessions of a task's metadata (`sessions: [{id, date, messages: [{role, content}]}]`,
/// the field given), in date order (the given order when a session has no date). An error
/// names the field.
pub fn sessions_of(given: Option<&Value>) -> Result<Vec<Session>, (String, String)> {
    let Some(given) = given else {
        return Ok(Vec::new());
    };
    let list = given.as_array().ok_or(("sessions".to_owned(), "must be a list of sessions".to_owned()))?;
    let mut sessions = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let at = |field: &str| format!("sessions[{i}]{field}");
        let obj = s.as_object().ok_or((at(""), "must be a mapping with `messages:`".to_owned()))?;
        let id = match obj.get("id") {
            None => format!("session_{}", i + 1),
            Some(Value::String(id)) => id.clone(),
            Some(Value::Number(n)) => n.to_string(),
            Some(_) => return Err((at(".id"), "must be a string".into())),
        };
        let date = match obj.get("date") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(parse_date(text).map_err(|e| (at(".date"), e))?),
            Some(_) => return Err((at(".date"), "must be a string".into())),
        };
        let turns = obj
            .get("messages")
            .and_then(Value::as_array)
            .ok_or((at(".messages"), "must be a list of {role, content}".to_owned()))?;
        let mut messages = Vec::with_capacity(turns.len());
        for (j, turn) in turns.iter().enumerate() {
            let field = |name: &str| at(&format!(".messages[{j}].{name}"));
            let text =
                |name: &str| turn.get(name).and_then(Value::as_str).ok_or((field(name), "must be a string".to_owned()));
            let role = text("role")?;
            if !ROLES.contains(&role) {
                return Err((field("role"), format!("unknown role `{role}`, expected one of: {}", ROLES.join(", "))));
            }
            messages.push(ChatMessage { role: role.to_owned(), content: text("content")?.to_owned() });
        }
        sessions.push(Session { id, date, messages });
    }
    if sessions.iter().all(|s| s.date.is_some()) {
        // Stable: sessions of the same date keep their order.
        sessions.sort_by(|a, b| a.date.cmp(&b.date));
    }
    Ok(sessions)
}

/// The turns that hold a question's evidence, for the report only: `metadata.evidence_turns`
/// (`[{session, turn}]`, the turn numbered from 1 in its session), as the LongMemEval and
/// LoCoMo readers write it; what is not of that shape is passed over.
pub fn evidence_turns(metadata: &serde_json::Map<String, Value>) -> Vec<(String, u32)> {
    let Some(Value::Array(turns)) = metadata.get("evidence_turns") else { return Vec::new() };
    turns
        .iter()
        .filter_map(|t| {
            let session = t.get("session")?.as_str()?.to_owned();
            let turn = u32::try_from(t.get("turn")?.as_u64()?).ok()?;
            Some((session, turn))
        })
        .collect()
}

/// A date as the memory benchmarks write them, as RFC 3339 (UTC): `2023-05-20`,
/// `2023-05-20T02:21:00Z`, `2023-05-20 02:21`, LongMemEval's `2023/05/20 (Sat) 02:21`,
/// LoCoMo's `1:56 pm on 8 May, 2023`.
pub fn parse_date(text: &str) -> Result<String, String> {
    let text = text.trim();
    let format = |t: NaiveDateTime| t.format("%Y-%m-%dT%H:%M:%SZ").to_string();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(format(t.naive_utc()));
    }
    // LongMemEval's weekday in parentheses says nothing the date does not.
    let without_weekday: String = match (text.find('('), text.find(')')) {
        (Some(open), Some(close)) if open < close => format!("{}{}", &text[..open], &text[close + 1..]),
        _ => text.to_owned(),
    };
    let cleaned = without_weekday.split_whitespace().collect::<Vec<_>>().join(" ");
    for pattern in
        ["%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y/%m/%d %H:%M", "%Y/%m/%d %H:%M:%S", "%I:%M %p on %d %B, %Y"]
    {
        if let Ok(t) = NaiveDateTime::parse_from_str(&cleaned, pattern) {
            return Ok(format(t));
        }
    }
    for pattern in ["%Y-%m-%d", "%Y/%m/%d", "%d %B, %Y"] {
        if let Ok(d) = NaiveDate::parse_from_str(&cleaned, pattern) {
            return Ok(format(d.and_time(chrono::NaiveTime::MIN)));
        }
    }
    Err(format!(
        "`{text}` is not a date (expected 2023-05-20, 2023-05-20T02:21:00Z, 2023/05/20 (Sat) 02:21 or 1:56 pm on 8 May, 2023)"
    ))
}

/// The time of the `n`-th message (from 1) of a session of date `date`: the date plus `n`
/// seconds, so that entries sort in the order they were said.
pub fn message_time(date: &str, n: usize) -> String {
    match chrono::DateTime::parse_from_rfc3339(date) {
        Ok(t) => (t + chrono::Duration::seconds(n as i64)).naive_utc().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Err(_) => date.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_benchmarks_dates_parse() {
        assert_eq!(parse_date("2023/05/20 (Sat) 02:21").unwrap(), "2023-05-20T02:21:00Z");
        assert_eq!(parse_date("1:56 pm on 8 May, 2023").unwrap(), "2023-05-08T13:56:00Z");
        assert_eq!(parse_date("2023-05-20").unwrap(), "2023-05-20T00:00:00Z");
        assert_eq!(parse_date("2023-05-20T02:21:00+02:00").unwrap(), "2023-05-20T00:21:00Z");
        assert!(parse_date("next tuesday").unwrap_err().contains("`next tuesday` is not a date"));
    }

    #[test]
    fn sessions_are_replayed_in_date_order_without_has_answer() {
        let metadata = json!({"sessions": [
            {"id": "b", "date": "2023/05/21 (Sun) 10:00", "messages": [{"role": "user", "content": "later", "has_answer": true}]},
            {"id": "a", "date": "2023/05/20 (Sat) 10:00", "messages": [{"role": "assistant", "content": "earlier"}]},
        ]});
        let sessions = sessions_of(metadata.get("sessions")).unwrap();
        let ids: Vec<&str> = sessions.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        let stored = serde_json::to_string(&sessions[1].messages).unwrap();
        assert!(!stored.contains("has_answer"), "{stored}");
    }

    #[test]
    fn an_unknown_role_is_named_with_its_path() {
        let metadata =
            json!({"sessions": [{"messages": [{"role": "user", "content": "x"}, {"role": "bot", "content": "y"}]}]});
        let (field, why) = sessions_of(metadata.get("sessions")).unwrap_err();
        assert_eq!(field, "sessions[0].messages[1].role");
        assert!(why.contains("unknown role `bot`"), "{why}");
    }
}
