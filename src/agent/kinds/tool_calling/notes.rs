//! Bounded memory (seed 004 §4): the `memory` tool's two stores, `memory` (the agent's
//! notes) and `user` (what it knows of the user), each a list of entries under a limit in
//! characters. Pure: the agent answers the tool from here, and its own code shows both
//! stores in the system prompt, each with a usage line (`[68% — 1,496/2,200 chars]`).
//! Nothing here reaches the environment.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::contract::{ErrorType, MEMORY_TOOL, ToolError, ToolSpec};

/// What separates entries when a store is shown (and counted).
pub const SEPARATOR: &str = "\n§\n";

/// The default limits, in characters.
pub const MEMORY_CHARS: usize = 2_200;
pub const USER_CHARS: usize = 1_375;

/// The largest limit a suite may set: the stores go into every system prompt.
pub const MAX_CHARS: usize = 1_000_000;

/// How long the stores last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotesScope {
    /// Each episode starts from the task's initial entries.
    #[default]
    Episode,
    /// The epochs of a task (per model) share the stores, kept in the run folder.
    Task,
}

/// A suite's `agent.memory:`: the bounded notes' limits, and how long they last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotesConfig {
    pub memory_chars: usize,
    pub user_chars: usize,
    pub scope: NotesScope,
}

impl Default for NotesConfig {
    fn default() -> Self {
        NotesConfig { memory_chars: MEMORY_CHARS, user_chars: USER_CHARS, scope: NotesScope::Episode }
    }
}

impl NotesConfig {
    /// Checks the limits; the error names the field under `agent.memory`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        for (field, chars) in [("memory_chars", self.memory_chars), ("user_chars", self.user_chars)] {
            if !(1..=MAX_CHARS).contains(&chars) {
                return Err((field, format!("must be from 1 to {MAX_CHARS} characters, got {chars}")));
            }
        }
        Ok(())
    }
}

/// The entries of both stores: a task's initial ones, or what an episode left.
pub use crate::domain::NoteEntries as Entries;

/// One of the two stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotesStore {
    Memory,
    User,
}

impl NotesStore {
    pub fn name(self) -> &'static str {
        match self {
            NotesStore::Memory => "memory",
            NotesStore::User => "user",
        }
    }
}

/// Both stores and their limits, as an episode's agent holds them.
#[derive(Debug, Clone, PartialEq)]
pub struct Stores {
    entries: Entries,
    limits: (usize, usize),
}

/// The stores shared between the agent and whoever keeps them after the episode.
pub type SharedStores = Arc<Mutex<Stores>>;

/// `1496` → `1,496`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn refused(message: String) -> ToolError {
    ToolError::new(ErrorType::ExecutionError, message)
}

/// The call's arguments, as the tool's schema has them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    action: String,
    target: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    old_text: Option<String>,
}

impl Stores {
    pub fn new(config: &NotesConfig, initial: Entries) -> Self {
        Stores { entries: initial, limits: (config.memory_chars, config.user_chars) }
    }

    /// Stores filled with `entries`, each added as the `memory` tool would add it: an entry
    /// the tool would refuse (a duplicate, one past the limit) is an error naming its store,
    /// its index and why.
    pub fn checked(config: &NotesConfig, entries: &Entries) -> Result<Self, (&'static str, usize, String)> {
        let mut stores = Stores::new(config, Entries::default());
        for (name, list) in [("memory", &entries.memory), ("user", &entries.user)] {
            for (i, entry) in list.iter().enumerate() {
                let call = serde_json::json!({"action": "add", "target": name, "content": entry});
                stores.act(&call).map_err(|e| (name, i, e.message))?;
            }
        }
        Ok(stores)
    }

    pub fn shared(self) -> SharedStores {
        Arc::new(Mutex::new(self))
    }

    pub fn entries(&self) -> &Entries {
        &self.entries
    }

    fn list(&self, store: NotesStore) -> &Vec<String> {
        match store {
            NotesStore::Memory => &self.entries.memory,
            NotesStore::User => &self.entries.user,
        }
    }

    fn list_mut(&mut self, store: NotesStore) -> &mut Vec<String> {
        match store {
            NotesStore::Memory => &mut self.entries.memory,
            NotesStore::User => &mut self.entries.user,
        }
    }

    pub fn limit(&self, store: NotesStore) -> usize {
        match store {
            NotesStore::Memory => self.limits.0,
            NotesStore::User => self.limits.1,
        }
    }

    /// Characters the store takes as shown: its entries and the separators between them.
    pub fn used(&self, store: NotesStore) -> usize {
        chars_of(self.list(store))
    }

    /// `[68% — 1,496/2,200 chars]`: the share is rounded down, so a full store alone says 100%.
    pub fn usage_line(&self, store: NotesStore) -> String {
        let (used, limit) = (self.used(store), self.limit(store));
        format!("[{}% — {}/{} chars]", used * 100 / limit, thousands(used), thousands(limit))
    }

    /// The block the agent's code adds to its system prompt: both stores, each with its
    /// usage line.
    pub fn prompt_block(&self) -> String {
        let store = |title: &str, store: NotesStore| {
            let list = self.list(store);
            let body = if list.is_empty() { "(empty)".to_owned() } else { list.join(SEPARATOR) };
            format!("{title} {}\n{body}", self.usage_line(store))
        };
        format!(
            "{}\n\n{}\n\nKeep them with the `memory` tool: add, replace or remove an entry, or read a store.",
            store("MEMORY (your notes)", NotesStore::Memory),
            store("USER PROFILE (what you know about the user)", NotesStore::User)
        )
    }

    /// Runs one call of the `memory` tool; a refusal is the error the model sees.
    pub fn act(&mut self, arguments: &Value) -> Result<Value, ToolError> {
        let call: Call = serde_json::from_value(arguments.clone())
            .map_err(|e| ToolError::new(ErrorType::ValidationError, format!("invalid arguments for `memory`: {e}")))?;
        let store = match call.target.as_str() {
            "memory" => NotesStore::Memory,
            "user" => NotesStore::User,
            other => {
                return Err(ToolError::new(
                    ErrorType::ValidationError,
                    format!("`target` is `memory` or `user`, not `{other}`"),
                ));
            }
        };
        // An entry is kept trimmed; the text that finds one is taken as given.
        let need = |field: &str, value: Option<String>| -> Result<String, ToolError> {
            let trim = field == "content";
            match value.map(|v| if trim { v.trim().to_owned() } else { v }) {
                Some(v) if !v.trim().is_empty() => Ok(v),
                _ => Err(ToolError::new(
                    ErrorType::ValidationError,
                    format!("`{}` needs a non-empty `{field}`", call.action),
                )),
            }
        };
        match call.action.as_str() {
            "read" => {}
            "add" => {
                let content = need("content", call.content)?;
                self.check_content(&content)?;
                if self.list(store).contains(&content) {
                    return Err(refused(format!("that entry is already in `{}`; nothing was added", store.name())));
                }
                let mut after = self.list(store).clone();
                after.push(content);
                self.fit(store, after, "adding it")?;
            }
            "replace" => {
                let old = need("old_text", call.old_text)?;
                let content = need("content", call.content)?;
                self.check_content(&content)?;
                let at = self.find(store, &old)?;
                let mut after = self.list(store).clone();
                after[at] = content;
                self.fit(store, after, "replacing it")?;
            }
            "remove" => {
                let old = need("old_text", call.old_text)?;
                let at = self.find(store, &old)?;
                self.list_mut(store).remove(at);
            }
            other => {
                return Err(ToolError::new(
                    ErrorType::ValidationError,
                    format!("`action` is add, replace, remove or read, not `{other}`"),
                ));
            }
        }
        Ok(json!({
            "target": store.name(),
            "action": call.action,
            "entries": self.list(store),
            "usage": self.usage_line(store),
        }))
    }

    fn check_content(&self, content: &str) -> Result<(), ToolError> {
        if content.contains('§') {
            return Err(ToolError::new(
                ErrorType::ValidationError,
                "an entry cannot hold `§`: it separates the entries".to_owned(),
            ));
        }
        Ok(())
    }

    /// Puts `after` in place of the store's entries when it fits the limit.
    fn fit(&mut self, store: NotesStore, after: Vec<String>, doing: &str) -> Result<(), ToolError> {
        let (now, would, limit) = (self.used(store), chars_of(&after), self.limit(store));
        if would > limit {
            return Err(refused(format!(
                "`{}` is too full: {doing} would make {}/{} chars; it holds {} now {}. Replace or remove entries first.",
                store.name(),
                thousands(would),
                thousands(limit),
                thousands(now),
                self.usage_line(store)
            ))
            .suggest("remove an entry you no longer need, or replace one with a shorter one"));
        }
        *self.list_mut(store) = after;
        Ok(())
    }

    /// The one entry that holds `text`; none or several is an error that says which.
    fn find(&self, store: NotesStore, text: &str) -> Result<usize, ToolError> {
        let matches: Vec<usize> =
            self.list(store).iter().enumerate().filter(|(_, e)| e.contains(text)).map(|(i, _)| i).collect();
        match matches.as_slice() {
            [one] => Ok(*one),
            [] => Err(refused(format!("no entry of `{}` contains {text:?}", store.name()))
                .suggest("read the store to see its entries")),
            several => {
                let listed: Vec<String> = several.iter().map(|&i| format!("- {}", self.list(store)[i])).collect();
                Err(refused(format!(
                    "{} entries of `{}` contain {text:?}; give text that only one holds:\n{}",
                    several.len(),
                    store.name(),
                    listed.join("\n")
                )))
            }
        }
    }
}

fn chars_of(entries: &[String]) -> usize {
    let text: usize = entries.iter().map(|e| e.chars().count()).sum();
    text + SEPARATOR.chars().count() * entries.len().saturating_sub(1)
}

/// The spec the model is shown.
pub fn tool_spec() -> ToolSpec {
    ToolSpec::new(
        MEMORY_TOOL,
        "Your bounded memory, shown in your system prompt. `target`: `memory` (your notes) or `user` (what you \
         know about the user). `add` an entry (`content`); `replace` the entry holding `old_text` with `content`; \
         `remove` the entry holding `old_text`; `read` a store. Entries must fit the store's limit in characters.",
        json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["add", "replace", "remove", "read"]},
                "target": {"type": "string", "enum": ["memory", "user"]},
                "content": {"type": "string", "description": "The new entry (add, replace)."},
                "old_text": {"type": "string", "description": "Text that only the entry to change holds (replace, remove)."}
            },
            "required": ["action", "target"],
            "additionalProperties": false
        }),
    )
}

/// The system prompt with the stores: the suite's prompt (when it has one), then the block.
pub fn system_prompt(base: Option<&str>, stores: &Stores) -> String {
    match base.map(str::trim_end).filter(|b| !b.trim().is_empty()) {
        Some(base) => format!("{base}\n\n{}", stores.prompt_block()),
        None => stores.prompt_block(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stores(memory: &[&str], user: &[&str]) -> Stores {
        let entries = Entries {
            memory: memory.iter().map(|s| (*s).to_owned()).collect(),
            user: user.iter().map(|s| (*s).to_owned()).collect(),
        };
        Stores::new(&NotesConfig::default(), entries)
    }

    fn act(s: &mut Stores, arguments: Value) -> Result<Value, ToolError> {
        s.act(&arguments)
    }

    #[test]
    fn the_usage_line_has_the_share_rounded_down_and_thousands_separators() {
        // 1,496 chars: two entries of 744 and 749 chars and one separator of 3.
        let s = stores(&[&"a".repeat(744), &"b".repeat(749)], &[]);
        assert_eq!(s.used(NotesStore::Memory), 1_496);
        assert_eq!(s.usage_line(NotesStore::Memory), "[68% — 1,496/2,200 chars]");
        assert_eq!(s.usage_line(NotesStore::User), "[0% — 0/1,375 chars]");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
        // 2,199 of 2,200 is not yet 100%.
        assert_eq!(stores(&[&"x".repeat(2_199)], &[]).usage_line(NotesStore::Memory), "[99% — 2,199/2,200 chars]");
    }

    #[test]
    fn the_prompt_shows_both_stores_with_their_usage() {
        let s = stores(&["likes tea", "works nights"], &[]);
        let prompt = system_prompt(Some("Be brief."), &s);
        let expected = "Be brief.\n\nMEMORY (your notes) [1% — 24/2,200 chars]\nlikes tea\n§\nworks nights\n\n\
                        USER PROFILE (what you know about the user) [0% — 0/1,375 chars]\n(empty)\n\n\
                        Keep them with the `memory` tool: add, replace or remove an entry, or read a store.";
        assert_eq!(prompt, expected);
        assert!(system_prompt(None, &s).starts_with("MEMORY (your notes)"));
    }

    #[test]
    fn add_appends_and_refuses_an_exact_duplicate() {
        let mut s = stores(&[], &[]);
        let added = act(&mut s, json!({"action": "add", "target": "user", "content": "  prefers metric  "})).unwrap();
        assert_eq!(added["entries"], json!(["prefers metric"]));
        assert_eq!(added["usage"], "[1% — 14/1,375 chars]");
        let again = act(&mut s, json!({"action": "add", "target": "user", "content": "prefers metric"})).unwrap_err();
        assert!(again.message.contains("already in `user`"), "{}", again.message);
        // Not a duplicate: only an exact one is refused.
        act(&mut s, json!({"action": "add", "target": "user", "content": "prefers metric units"})).unwrap();
        assert_eq!(s.entries().user.len(), 2);
        assert!(s.entries().memory.is_empty());
    }

    #[test]
    fn add_past_the_limit_is_refused_with_the_current_usage() {
        let config = NotesConfig { memory_chars: 20, ..NotesConfig::default() };
        let mut s = Stores::new(&config, Entries { memory: vec!["0123456789".into()], user: Vec::new() });
        // 10 + 3 + 8 = 21 > 20.
        let full = act(&mut s, json!({"action": "add", "target": "memory", "content": "abcdefgh"})).unwrap_err();
        assert_eq!(full.kind, ErrorType::ExecutionError);
        assert_eq!(
            full.message,
            "`memory` is too full: adding it would make 21/20 chars; it holds 10 now [50% — 10/20 chars]. \
             Replace or remove entries first."
        );
        assert_eq!(s.entries().memory, ["0123456789"], "nothing changed");
        // 10 + 3 + 7 = 20 fits exactly.
        act(&mut s, json!({"action": "add", "target": "memory", "content": "abcdefg"})).unwrap();
        assert_eq!(s.usage_line(NotesStore::Memory), "[100% — 20/20 chars]");
    }

    #[test]
    fn replace_and_remove_find_one_entry_by_a_unique_substring() {
        let mut s = stores(&["cat is Tom", "dog is Rex", "fish is Bob"], &[]);
        act(&mut s, json!({"action": "replace", "target": "memory", "old_text": "Rex", "content": "dog is Max"}))
            .unwrap();
        assert_eq!(s.entries().memory, ["cat is Tom", "dog is Max", "fish is Bob"]);
        act(&mut s, json!({"action": "remove", "target": "memory", "old_text": "fish"})).unwrap();
        assert_eq!(s.entries().memory, ["cat is Tom", "dog is Max"]);

        let several = act(&mut s, json!({"action": "remove", "target": "memory", "old_text": " is "})).unwrap_err();
        assert_eq!(
            several.message,
            "2 entries of `memory` contain \" is \"; give text that only one holds:\n- cat is Tom\n- dog is Max"
        );
        let none = act(&mut s, json!({"action": "replace", "target": "memory", "old_text": "bird", "content": "x"}))
            .unwrap_err();
        assert_eq!(none.message, "no entry of `memory` contains \"bird\"");
        assert_eq!(s.entries().memory, ["cat is Tom", "dog is Max"], "refusals change nothing");
    }

    #[test]
    fn a_replacement_must_fit_the_limit_too() {
        let config = NotesConfig { user_chars: 10, ..NotesConfig::default() };
        let mut s = Stores::new(&config, Entries { memory: Vec::new(), user: vec!["short".into()] });
        let long =
            act(&mut s, json!({"action": "replace", "target": "user", "old_text": "short", "content": "much longer"}))
                .unwrap_err();
        assert!(
            long.message.starts_with("`user` is too full: replacing it would make 11/10 chars"),
            "{}",
            long.message
        );
    }

    #[test]
    fn read_gives_the_entries_and_usage() {
        let mut s = stores(&["a"], &["b", "c"]);
        let read = act(&mut s, json!({"action": "read", "target": "user"})).unwrap();
        assert_eq!(
            read,
            json!({"target": "user", "action": "read", "entries": ["b", "c"], "usage": "[0% — 5/1,375 chars]"})
        );
    }

    #[test]
    fn bad_calls_are_validation_errors() {
        let mut s = stores(&[], &[]);
        let cases = [
            (json!({"action": "forget", "target": "memory"}), "`action` is add, replace, remove or read"),
            (json!({"action": "read", "target": "notes"}), "`target` is `memory` or `user`"),
            (json!({"action": "add", "target": "memory"}), "`add` needs a non-empty `content`"),
            (json!({"action": "add", "target": "memory", "content": "  "}), "`add` needs a non-empty `content`"),
            (json!({"action": "remove", "target": "memory"}), "`remove` needs a non-empty `old_text`"),
            (json!({"action": "add", "target": "memory", "content": "a § b"}), "cannot hold `§`"),
            (json!({"action": "read"}), "missing field `target`"),
        ];
        for (arguments, expected) in cases {
            let error = s.act(&arguments).unwrap_err();
            assert_eq!(error.kind, ErrorType::ValidationError, "{arguments}");
            assert!(error.message.contains(expected), "{arguments}: {}", error.message);
        }
    }

    #[test]
    fn limits_outside_the_range_are_refused_naming_the_field() {
        let zero = NotesConfig { user_chars: 0, ..NotesConfig::default() };
        assert_eq!(zero.check().unwrap_err().0, "user_chars");
        assert!(NotesConfig::default().check().is_ok());
    }
}
