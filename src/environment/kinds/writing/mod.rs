//! `writing_room`: documents of headed sections in memory, written a section at a time
//! under the environment file's style rules (word limits, heading depth, title case), and
//! exported as Markdown or HTML. Every observation of its tools carries the outline of the
//! document under the cursor in `info`. Scorers read a document back as `doc:ID` (its
//! current Markdown) or an export by name (`ID.md`, `ID.html`).

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{EnvironmentKind, KindKeys, KindSettings};
use crate::config::decode::ConfigError;
use crate::contract::{Actor, ErrorType, ToolAnnotations};
use crate::domain::Task;
use crate::domain::document::{Document, Section, word_count};
use crate::environment::tool::{self, Tool, ToolDecl};
use crate::environment::{
    Definition, FileWorld, ReadBack, SetupContext, SetupError, ToolFailure, World, decode_arguments,
};

/// The kind `writing_room`.
pub struct Writing;

/// The prefix that names a document's current text to a scorer: `doc:report`.
pub const DOC_PREFIX: &str = "doc:";

#[async_trait]
impl EnvironmentKind for Writing {
    fn name(&self) -> &'static str {
        "writing_room"
    }

    fn tools(&self) -> Vec<ToolDecl> {
        tool::offer(TOOLS)
    }

    /// Its documents are kept in memory.
    fn makes_folders(&self) -> bool {
        false
    }

    /// `style:`, the style rules ([`Style`]), and `documents:`, the initial documents: id →
    /// a Markdown file, relative to the environment file.
    fn keys(&self) -> &'static [&'static str] {
        &["style", "documents"]
    }

    fn decode_settings(&self, keys: &KindKeys<'_>) -> Result<KindSettings, ConfigError> {
        let source = keys.source;
        let style = match keys.get("style") {
            None => Style::default(),
            Some(value) => {
                let style: Style = source.decode("style", value)?;
                style.check().map_err(|(at, e)| source.error(at, e))?;
                style
            }
        };
        let listed: BTreeMap<String, std::path::PathBuf> = match keys.get("documents") {
            None => BTreeMap::new(),
            Some(value) => source.decode("documents", value)?,
        };
        let mut documents = BTreeMap::new();
        for (id, doc_path) in &listed {
            let at = format!("documents.{id}");
            if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
                return Err(source.error(&at, "a document id is letters, digits, `_`, `-` and `.`"));
            }
            let full = keys.folder().join(doc_path);
            let text = std::fs::read_to_string(&full)
                .map_err(|e| source.error(&at, format!("failed to read {}: {e}", full.display())))?;
            documents.insert(format!("{id}.md"), text);
        }
        Ok(KindSettings::Writing { style, documents })
    }

    fn builtin_settings(&self) -> KindSettings {
        KindSettings::Writing { style: Style::default(), documents: BTreeMap::new() }
    }

    fn refuse_key(&self, key: &str, other: &str) -> String {
        format!("only the `writing_room` kind has `{key}:`; kind `{other}` takes none")
    }

    async fn setup(
        &self,
        definition: &Definition,
        task: &Task,
        _context: &SetupContext<'_>,
    ) -> Result<Box<dyn World>, SetupError> {
        Ok(Box::new(Room::create(definition, task)))
    }
}

/// The style rules of an environment file's `style:`; none is on unless set.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Style {
    /// The most words one section's text may hold.
    pub max_section_words: Option<usize>,
    /// The most words a whole document may hold (headings not counted).
    pub max_document_words: Option<usize>,
    /// The deepest heading level allowed (1 = `#` only).
    pub max_heading_depth: Option<u8>,
    /// Headings must be in Title Case.
    pub title_case: bool,
}

impl Style {
    /// Checks the rules a file can break by itself; `at` names the field.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if let Some(depth) = self.max_heading_depth
            && !(1..=6).contains(&depth)
        {
            return Err(("style.max_heading_depth", format!("must be from 1 to 6, got {depth}")));
        }
        for (field, limit) in
            [("style.max_section_words", self.max_section_words), ("style.max_document_words", self.max_document_words)]
        {
            if limit == Some(0) {
                return Err((field, "must be at least 1".into()));
            }
        }
        Ok(())
    }
}

const TOOLS: &[&dyn Tool<Room>] = &[&OpenDoc, &WriteSection, &ReadDoc, &Format, &Export];

/// Where the agent last worked: a document, and a section of it.
#[derive(Debug, Clone, Default)]
struct Cursor {
    document: Option<String>,
    section: Option<String>,
}

struct State {
    documents: BTreeMap<String, Document>,
    /// Exports by name (`report.md`), as they were when exported.
    exports: BTreeMap<String, String>,
    cursor: Cursor,
}

pub struct Room {
    state: Mutex<State>,
    style: Style,
}

impl Room {
    /// The definition's files and documents (`documents:`), and then the task's files, each
    /// a document named after the file without its `.md`.
    pub fn create(definition: &Definition, task: &Task) -> Self {
        let (style, listed) = match &definition.settings {
            KindSettings::Writing { style, documents } => (style.clone(), Some(documents)),
            _ => (Style::default(), None),
        };
        let documents = definition
            .files
            .iter()
            .chain(listed.into_iter().flatten())
            .chain(&task.files)
            .map(|(name, text)| (doc_id_of(name).to_owned(), Document::parse_markdown(text)))
            .collect();
        let state = State { documents, exports: BTreeMap::new(), cursor: Cursor::default() };
        Room { state: Mutex::new(state), style }
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A poisoned lock only means another call panicked; the documents are intact.
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }
}

fn doc_id_of(file_name: &str) -> &str {
    file_name.strip_suffix(".md").unwrap_or(file_name)
}

fn no_document(doc_id: &str, state: &State) -> ToolFailure {
    let known: Vec<&str> = state.documents.keys().map(String::as_str).collect();
    let known = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
    ToolFailure::new(ErrorType::ExecutionError, format!("no document `{doc_id}` (documents: {known})"))
        .suggest("call open_doc to create it")
}

fn outline_json(doc: &Document) -> Value {
    json!(doc.outline())
}

/// Words that stay lower case inside a title.
const SMALL_WORDS: &[&str] =
    &["a", "an", "the", "and", "but", "or", "nor", "for", "so", "yet", "at", "by", "in", "of", "on", "to", "up", "as"];

/// `results and next steps` → `Results and Next Steps`.
pub fn title_case(heading: &str) -> String {
    let words: Vec<&str> = heading.split_whitespace().collect();
    let last = words.len().saturating_sub(1);
    words
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let lower = w.to_lowercase();
            if i != 0 && i != last && SMALL_WORDS.contains(&lower.as_str()) { lower } else { capitalise(w) }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `Results And Next Steps` → `Results and next steps`; words in capitals (`API`) stay.
pub fn sentence_case(heading: &str) -> String {
    heading
        .split_whitespace()
        .enumerate()
        .map(|(i, w)| {
            let shouting = w.chars().filter(|c| c.is_alphabetic()).count() > 1 && !w.chars().any(char::is_lowercase);
            if i == 0 {
                capitalise(w)
            } else if shouting {
                w.to_owned()
            } else {
                w.to_lowercase()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn capitalise(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn style_error(message: String, suggestion: &str) -> ToolFailure {
    ToolFailure::new(ErrorType::ExecutionError, message).suggest(suggestion)
}

impl Style {
    /// Whether a heading of `level` may be written.
    fn check_heading(&self, heading: &str, level: u8) -> Result<(), ToolFailure> {
        if let Some(max) = self.max_heading_depth
            && level > max
        {
            return Err(style_error(
                format!("heading level {level} is deeper than the style allows (style.max_heading_depth: {max})"),
                &format!("use a level from 1 to {max}"),
            ));
        }
        if self.title_case {
            let wanted = title_case(heading);
            if wanted != heading.trim() {
                return Err(style_error(
                    format!("heading `{heading}` is not in title case (style.title_case)"),
                    &format!("write it as `{wanted}`"),
                ));
            }
        }
        Ok(())
    }

    /// Whether `doc`, as it would be, keeps the word limits; `section` is the one written.
    fn check_words(&self, doc: &Document, section: &Section) -> Result<(), ToolFailure> {
        let words = word_count(&section.text);
        if let Some(max) = self.max_section_words
            && words > max
        {
            return Err(style_error(
                format!(
                    "section `{}` would have {words} words, over the limit of {max} words per section \
                     (style.max_section_words)",
                    section.heading
                ),
                "shorten the text",
            ));
        }
        let total = doc.words();
        if let Some(max) = self.max_document_words
            && total > max
        {
            return Err(style_error(
                format!(
                    "the document would have {total} words, over the limit of {max} words per document \
                     (style.max_document_words)"
                ),
                "shorten this section or others",
            ));
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct DocArgs {
    doc_id: String,
}

fn doc_id_schema() -> Value {
    json!({"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9_.-]+$",
           "description": "The document's id: letters, digits, `_`, `-`, `.`."})
}

struct OpenDoc;

#[async_trait]
impl Tool<Room> for OpenDoc {
    fn annotations(&self) -> Option<ToolAnnotations> {
        // It creates a document that is missing, but destroys nothing.
        Some(ToolAnnotations { read_only: false, destructive: false })
    }

    fn name(&self) -> &'static str {
        "open_doc"
    }

    fn description(&self) -> &'static str {
        "Open a document (created empty if it does not exist) and put the cursor on it; returns its outline."
    }

    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"doc_id": doc_id_schema()}, "required": ["doc_id"],
               "additionalProperties": false})
    }

    async fn call(&self, room: &Room, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let DocArgs { doc_id } = decode_arguments(arguments)?;
        Ok(room.with_state(|state| {
            let created = !state.documents.contains_key(&doc_id);
            let doc = state.documents.entry(doc_id.clone()).or_default();
            let result =
                json!({"doc_id": doc_id, "created": created, "outline": outline_json(doc), "words": doc.words()});
            state.cursor = Cursor { document: Some(doc_id), section: None };
            result
        }))
    }
}

struct WriteSection;

#[derive(Deserialize)]
struct WriteArgs {
    doc_id: String,
    heading: String,
    text: String,
    position: Option<usize>,
    level: Option<u8>,
}

#[async_trait]
impl Tool<Room> for WriteSection {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "write_section"
    }

    fn description(&self) -> &'static str {
        "Write a section of a document. A section with the same heading is replaced (moved when a position is \
         given); otherwise the section is inserted at `position` (0 = first; default: the end). The style's \
         word limits and heading rules are checked first."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "doc_id": doc_id_schema(),
                "heading": {"type": "string", "minLength": 1},
                "text": {"type": "string"},
                "position": {"type": "integer", "minimum": 0, "description": "Index among the sections, from 0."},
                "level": {"type": "integer", "minimum": 1, "maximum": 6, "default": 2}
            },
            "required": ["doc_id", "heading", "text"],
            "additionalProperties": false
        })
    }

    async fn call(&self, room: &Room, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let WriteArgs { doc_id, heading, text, position, level } = decode_arguments(arguments)?;
        let heading = heading.trim().to_owned();
        if heading.is_empty() || heading.contains('\n') {
            return Err(ToolFailure::new(ErrorType::ValidationError, "a heading is one non-empty line"));
        }
        let level = level.unwrap_or(2);
        room.style.check_heading(&heading, level)?;
        room.with_state(|state| {
            let Some(doc) = state.documents.get(&doc_id) else { return Err(no_document(&doc_id, state)) };
            let mut changed = doc.clone();
            let section = Section { level, heading: heading.clone(), text: text.trim().to_owned() };
            let existing = changed.find(&heading);
            if let Some(at) = existing {
                changed.sections.remove(at);
            }
            let len = changed.sections.len();
            let at = match (position, existing) {
                (Some(p), _) if p > len => {
                    return Err(ToolFailure::new(
                        ErrorType::ExecutionError,
                        format!("position {p} is past the end: `{doc_id}` has {len} other sections (0 to {len})"),
                    ));
                }
                (Some(p), _) => p,
                (None, Some(at)) => at,
                (None, None) => len,
            };
            changed.sections.insert(at, section.clone());
            room.style.check_words(&changed, &section)?;
            let result = json!({
                "doc_id": doc_id, "heading": heading, "action": if existing.is_some() { "replaced" } else { "inserted" },
                "position": at, "words": word_count(&section.text), "outline": outline_json(&changed),
            });
            state.documents.insert(doc_id.clone(), changed);
            state.cursor = Cursor { document: Some(doc_id), section: Some(heading) };
            Ok(result)
        })
    }
}

struct ReadDoc;

#[async_trait]
impl Tool<Room> for ReadDoc {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "read_doc"
    }

    fn description(&self) -> &'static str {
        "Read a whole document as Markdown, with its outline and word count."
    }

    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"doc_id": doc_id_schema()}, "required": ["doc_id"],
               "additionalProperties": false})
    }

    async fn call(&self, room: &Room, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let DocArgs { doc_id } = decode_arguments(arguments)?;
        room.with_state(|state| {
            let Some(doc) = state.documents.get(&doc_id) else { return Err(no_document(&doc_id, state)) };
            let result = json!({"doc_id": doc_id, "markdown": doc.to_markdown(), "outline": outline_json(doc),
                                "words": doc.words()});
            if state.cursor.document.as_deref() != Some(doc_id.as_str()) {
                state.cursor = Cursor { document: Some(doc_id), section: None };
            }
            Ok(result)
        })
    }
}

struct Format;

#[derive(Deserialize)]
struct FormatArgs {
    doc_id: String,
    style: String,
}

#[async_trait]
impl Tool<Room> for Format {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations { read_only: false, destructive: false })
    }

    fn name(&self) -> &'static str {
        "format"
    }

    fn description(&self) -> &'static str {
        "Format a document: `title_case` or `sentence_case` rewrites every heading; `tidy` trims trailing spaces \
         and keeps at most one blank line between paragraphs."
    }

    fn parameters(&self) -> Value {
        json!({"type": "object",
               "properties": {"doc_id": doc_id_schema(),
                              "style": {"type": "string", "enum": ["title_case", "sentence_case", "tidy"]}},
               "required": ["doc_id", "style"], "additionalProperties": false})
    }

    async fn call(&self, room: &Room, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let FormatArgs { doc_id, style } = decode_arguments(arguments)?;
        if style == "sentence_case" && room.style.title_case {
            return Err(style_error(
                "sentence case would break the style's rule that headings are in title case (style.title_case)".into(),
                "format with `title_case`, or leave the headings as they are",
            ));
        }
        room.with_state(|state| {
            let Some(doc) = state.documents.get_mut(&doc_id) else { return Err(no_document(&doc_id, state)) };
            let mut changed = 0;
            for section in &mut doc.sections {
                let (heading, text) = match style.as_str() {
                    "title_case" => (title_case(&section.heading), section.text.clone()),
                    "sentence_case" => (sentence_case(&section.heading), section.text.clone()),
                    _ => (section.heading.clone(), tidy(&section.text)),
                };
                if heading != section.heading || text != section.text {
                    changed += 1;
                    (section.heading, section.text) = (heading, text);
                }
            }
            if style == "tidy" {
                doc.preamble = tidy(&doc.preamble);
            }
            let result = json!({"doc_id": doc_id, "style": style, "sections_changed": changed,
                                "outline": outline_json(doc)});
            state.cursor = Cursor { document: Some(doc_id), section: None };
            Ok(result)
        })
    }
}

/// Trailing spaces cut, at most one blank line between paragraphs.
fn tidy(text: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for line in text.lines().map(str::trim_end) {
        if line.is_empty() && out.last().is_none_or(|l| l.is_empty()) {
            continue;
        }
        out.push(line);
    }
    while out.last().is_some_and(|l| l.is_empty()) {
        out.pop();
    }
    out.join("\n")
}

struct Export;

#[derive(Deserialize)]
struct ExportArgs {
    doc_id: String,
    format: String,
}

#[async_trait]
impl Tool<Room> for Export {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations { read_only: false, destructive: false })
    }

    fn name(&self) -> &'static str {
        "export"
    }

    fn description(&self) -> &'static str {
        "Export a document as Markdown (`ID.md`) or HTML (`ID.html`); returns the exported text. A later export \
         of the same format replaces the earlier one."
    }

    fn parameters(&self) -> Value {
        json!({"type": "object",
               "properties": {"doc_id": doc_id_schema(), "format": {"type": "string", "enum": ["markdown", "html"]}},
               "required": ["doc_id", "format"], "additionalProperties": false})
    }

    async fn call(&self, room: &Room, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let ExportArgs { doc_id, format } = decode_arguments(arguments)?;
        room.with_state(|state| {
            let Some(doc) = state.documents.get(&doc_id) else { return Err(no_document(&doc_id, state)) };
            let (name, text) = match format.as_str() {
                "html" => (format!("{doc_id}.html"), to_html(&doc_id, doc)),
                _ => (format!("{doc_id}.md"), doc.to_markdown()),
            };
            state.exports.insert(name.clone(), text.clone());
            Ok(json!({"doc_id": doc_id, "format": format, "name": name, "bytes": text.len(), "text": text}))
        })
    }
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// A standalone HTML page: each heading an `<hN>`, each paragraph (text between blank
/// lines) a `<p>`.
pub fn to_html(doc_id: &str, doc: &Document) -> String {
    let mut body = String::new();
    let paragraphs = |text: &str, body: &mut String| {
        for p in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
            body.push_str(&format!("<p>{}</p>\n", escape(p)));
        }
    };
    paragraphs(&doc.preamble, &mut body);
    for s in &doc.sections {
        let level = s.level.clamp(1, 6);
        body.push_str(&format!("<h{level}>{}</h{level}>\n", escape(&s.heading)));
        paragraphs(&s.text, &mut body);
    }
    format!(
        "<!DOCTYPE html>\n<html>\n<head><meta charset=\"utf-8\"><title>{}</title></head>\n<body>\n{body}</body>\n</html>\n",
        escape(doc_id)
    )
}

#[async_trait]
impl World for Room {
    async fn call(&self, actor: &Actor, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
        tool::call(TOOLS, Writing.name(), self, actor, name, arguments).await
    }

    fn files(&self) -> Option<&dyn FileWorld> {
        Some(self)
    }

    fn describe(&self) -> Map<String, Value> {
        let mut info = self.observe();
        let documents: Vec<String> = self.with_state(|s| s.documents.keys().cloned().collect());
        info.insert("documents".into(), json!(documents));
        info
    }

    /// The outline of the document under the cursor, and the cursor.
    fn observe(&self) -> Map<String, Value> {
        self.with_state(|state| {
            let mut info = Map::new();
            let Cursor { document, section } = &state.cursor;
            info.insert("cursor".into(), json!({"document": document, "section": section}));
            if let Some(doc) = document.as_ref().and_then(|d| state.documents.get(d)) {
                info.insert("outline".into(), outline_json(doc));
            }
            info
        })
    }
}

#[async_trait]
impl FileWorld for Room {
    /// `doc:ID`: the document's current Markdown; `ID.md` or `ID.html`: its latest export.
    async fn read_back(&self, path: &str, cap: usize) -> Result<ReadBack, ToolFailure> {
        let text = self.with_state(|state| {
            if let Some(id) = path.strip_prefix(DOC_PREFIX) {
                return state.documents.get(id).map(Document::to_markdown).ok_or_else(|| no_document(id, state));
            }
            state.exports.get(path).cloned().ok_or_else(|| {
                let made: Vec<&str> = state.exports.keys().map(String::as_str).collect();
                let made = if made.is_empty() { "none".to_owned() } else { made.join(", ") };
                ToolFailure::new(
                    ErrorType::ExecutionError,
                    format!("`{path}` was not exported (exports: {made}; a document's current text is `doc:ID`)"),
                )
            })
        })?;
        let size = text.len() as u64;
        let mut end = cap.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        Ok(ReadBack { text: text[..end].to_owned(), size })
    }
}

#[cfg(test)]
mod tests;
