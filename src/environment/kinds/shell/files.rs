//! The file tools of `shell`: read (numbered lines, a window of them), write, edit by
//! exact replacement, glob and grep (ripgrep's own crates), and the world model they keep:
//! what each actor last saw of every file it read or wrote (`world_model.rs`).
//!
//! Every tool keeps the shell's safety rules: paths stay inside the working directory
//! (links included), only regular files are opened and never with a wait, and what comes
//! back is capped with a visible marker.

use std::io::{BufRead, BufReader};
use std::path::{Component, Path};

use async_trait::async_trait;
use globset::{GlobBuilder, GlobMatcher};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, SearcherBuilder, sinks};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncReadExt;

use super::world_model::{Digest, WorldModel, digest_of};
use super::{ShellWorld, io_failure};
use crate::contract::{Actor, ErrorType, ToolAnnotations};
use crate::environment::beneath::{Beneath, Kind, Links};
use crate::environment::tool::Tool;
use crate::environment::{ToolFailure, decode_arguments};

/// Files up to this size are hashed whole; a larger one is known by its size, modification
/// time and inode, and read only up to here.
const HASH_CAP: u64 = 64 << 20;
/// A file with a NUL byte in its first this many bytes is binary.
const BINARY_PROBE: usize = 8 << 10;
/// The lines `read_file` shows when not told.
const DEFAULT_LIMIT: usize = 2000;
/// Longer lines are cut with a marker (`read_file`, `grep`).
const MAX_LINE_BYTES: usize = 2000;
/// The largest file `edit_file` changes: it holds the file in memory twice.
const EDIT_CAP: u64 = 16 << 20;
/// How many files `glob` lists and `grep` searches at most.
const MAX_FILES: usize = 500;
/// How many matches `grep` shows at most.
const MAX_MATCHES: usize = 200;
/// Entries a walk visits at most, so that a vast tree cannot hold a tool for long.
const MAX_WALK: usize = 100_000;

pub(super) struct ReadFile;

#[async_trait]
impl Tool<ShellWorld> for ReadFile {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "read_file"
    }

    fn description(&self) -> &'static str {
        "Read a text file of the working directory: its lines, numbered, from `offset` (the first line is 1), at most `limit` of them (default 2000)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1},
                "offset": {"type": "integer", "minimum": 1, "default": 1},
                "limit": {"type": "integer", "minimum": 1, "default": DEFAULT_LIMIT}
            },
            "required": ["path"], "additionalProperties": false})
    }

    async fn call(&self, world: &ShellWorld, actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        world.read_lines(actor, decode_arguments(arguments)?).await
    }
}

pub(super) struct WriteFile;

#[async_trait]
impl Tool<ShellWorld> for WriteFile {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "write_file"
    }

    fn description(&self) -> &'static str {
        "Write a text file in the working directory, creating folders as needed. A file you read that changed since must be read again first."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"path": {"type": "string", "minLength": 1}, "content": {"type": "string"}},
            "required": ["path", "content"], "additionalProperties": false})
    }

    async fn call(&self, world: &ShellWorld, actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let WriteFileArgs { path, content } = decode_arguments(arguments)?;
        world.write_known(actor, &path, &content).await
    }
}

pub(super) struct EditFile;

#[async_trait]
impl Tool<ShellWorld> for EditFile {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "edit_file"
    }

    fn description(&self) -> &'static str {
        "Replace exact text in a file you have read: `old_string` must occur exactly once (include surrounding lines to make it unique), or pass `replace_all` to replace every occurrence."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1},
                "old_string": {"type": "string", "minLength": 1},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean", "default": false}
            },
            "required": ["path", "old_string", "new_string"], "additionalProperties": false})
    }

    async fn call(&self, world: &ShellWorld, actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        world.edit_file(actor, decode_arguments(arguments)?).await
    }
}

pub(super) struct Glob;

#[async_trait]
impl Tool<ShellWorld> for Glob {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "glob"
    }

    fn description(&self) -> &'static str {
        "List the files of the working directory whose path matches a glob pattern (`*.txt`, `**/*.rs`, `src/{a,b}/*`), sorted."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object", "properties": {"pattern": {"type": "string", "minLength": 1}},
            "required": ["pattern"], "additionalProperties": false})
    }

    async fn call(&self, world: &ShellWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        world.glob(&decode_arguments::<GlobArgs>(arguments)?.pattern).await
    }
}

pub(super) struct Grep;

#[async_trait]
impl Tool<ShellWorld> for Grep {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "grep"
    }

    fn description(&self) -> &'static str {
        "Search file contents for a regular expression (Rust regex syntax) under `path` (a folder or a file); `glob` keeps only files whose name (or path, if it has a `/`) matches. Gives `path:line:text` lines; binary files are skipped."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "minLength": 1},
                "path": {"type": "string", "default": "."},
                "glob": {"type": "string", "minLength": 1},
                "ignore_case": {"type": "boolean", "default": false}
            },
            "required": ["pattern"], "additionalProperties": false})
    }

    async fn call(&self, world: &ShellWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        world.grep(decode_arguments(arguments)?).await
    }
}

#[derive(Deserialize)]
struct ReadArgs {
    path: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[derive(Deserialize)]
struct WriteFileArgs {
    path: String,
    content: String,
}

#[derive(Deserialize)]
struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

#[derive(Deserialize)]
struct GlobArgs {
    pattern: String,
}

#[derive(Deserialize)]
struct GrepArgs {
    pattern: String,
    #[serde(default = "super::dot")]
    path: String,
    glob: Option<String>,
    #[serde(default)]
    ignore_case: bool,
}

impl ShellWorld {
    /// The name a resolved path is known by: relative to the working directory, with `.`
    /// parts dropped, so that `./a.txt` and `a.txt` are one file.
    fn key(&self, relative: &Path) -> String {
        let parts: Vec<String> = relative
            .components()
            .filter_map(|c| match c {
                Component::Normal(part) => Some(part.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        if parts.is_empty() { ".".into() } else { parts.join("/") }
    }

    /// The digest of a file as it is now; `None` when it is gone or cannot be read as a
    /// regular file inside the directory.
    async fn digest_on_disk(&self, key: &str) -> Option<Digest> {
        let relative = self.resolve(key).ok()?;
        let files = self.files.clone();
        tokio::task::spawn_blocking(move || digest_file(&files, &relative)).await.ok().flatten()
    }

    /// The known files of `actor` that changed since it saw them, each named once per change.
    /// Asked before every model call: the files are hashed in one blocking task, not one
    /// thread hop per read.
    pub(super) async fn changed_for(&self, actor: &Actor) -> Vec<String> {
        let Some(model) = self.models.get(actor) else { return Vec::new() };
        let resolved: Vec<(String, Option<std::path::PathBuf>)> = model
            .paths()
            .into_iter()
            .map(|key| {
                let relative = self.resolve(&key).ok();
                (key, relative)
            })
            .collect();
        let files = self.files.clone();
        let hashed = tokio::task::spawn_blocking(move || {
            resolved.into_iter().map(|(key, rel)| (key, rel.and_then(|r| digest_file(&files, &r)))).collect::<Vec<_>>()
        });
        match hashed.await {
            Ok(now) => model.take_changes(&now),
            // The hashing panicked: nothing can be said about the files this turn.
            Err(_) => Vec::new(),
        }
    }

    async fn read_lines(&self, actor: &Actor, args: ReadArgs) -> Result<Value, ToolFailure> {
        let path = args.path;
        let relative = self.resolve(&path)?;
        let (file, size) = self.open_regular(&path, libc::O_RDONLY, 0).await?;
        let meta = file.metadata().await.map_err(io_failure)?;
        let file = file.into_std().await;
        let window = Window {
            offset: args.offset.unwrap_or(1).max(1),
            limit: args.limit.unwrap_or(DEFAULT_LIMIT).max(1),
            cap: self.limits.output_cap_bytes,
            hash: size <= HASH_CAP,
        };
        let scanned = tokio::task::spawn_blocking(move || scan(file, window))
            .await
            .map_err(|e| ToolFailure::new(ErrorType::ExecutionError, format!("the read failed: {e}")))?;
        let read = match scanned {
            Ok(read) => read,
            Err(Unread::Binary) => {
                return Err(ToolFailure::new(
                    ErrorType::ExecutionError,
                    format!("`{path}` ({size} bytes) is a binary file (a NUL byte in its first 8 KB): read_file shows text only"),
                )
                .suggest("inspect it with run_command (file, xxd, od), or grep it"));
            }
            Err(Unread::PastScanned(scanned)) => {
                return Err(ToolFailure::new(
                    ErrorType::ExecutionError,
                    format!(
                        "`{path}` ({size} bytes) has fewer than {} lines in its first {scanned} bytes, as far as read_file reads a large file",
                        window.offset
                    ),
                )
                .suggest("read further into it with run_command (tail, sed -n)"));
            }
            Err(Unread::Io(e)) => return Err(io_failure(e)),
        };
        if let Some(total) = read.total_lines
            && window.offset > total.max(1)
        {
            return Err(ToolFailure::new(
                ErrorType::ExecutionError,
                format!("`{path}` has {total} lines: offset {} is past its end", window.offset),
            )
            .suggest(format!("read from an offset between 1 and {}", total.max(1))));
        }
        let digest = read.digest.unwrap_or_else(|| fingerprint(&meta));
        self.models.of(actor).note(&self.key(&relative), digest);

        let next = window.offset + read.shown;
        let more = match read.total_lines {
            Some(total) => next <= total,
            None => true,
        };
        let mut content = read.text;
        if read.full {
            content.push_str(&format!("[... output cut at {} bytes: read on with offset={next} ...]\n", window.cap));
        } else if more {
            let left = match read.total_lines {
                Some(total) => format!("{} more lines", total + 1 - next),
                None => "more lines".into(),
            };
            content.push_str(&format!("[... {left}: read on with offset={next} ...]\n"));
        }
        Ok(json!({
            "path": path,
            "content": content,
            "start_line": window.offset,
            "lines_shown": read.shown,
            "total_lines": read.total_lines,
            "next_offset": more.then_some(next),
        }))
    }

    /// Refuses to change `path` if `actor` knows it and it changed since.
    async fn refuse_if_stale(&self, model: &WorldModel, path: &str, key: &str, to: &str) -> Result<(), ToolFailure> {
        let now = self.digest_on_disk(key).await;
        if model.is_stale(key, now) {
            return Err(ToolFailure::new(
                ErrorType::ExecutionError,
                format!("`{path}` changed since you last read it; read it again before {to} it"),
            )
            .suggest(format!("call read_file on `{path}`, then {to} it")));
        }
        Ok(())
    }

    async fn write_known(&self, actor: &Actor, path: &str, content: &str) -> Result<Value, ToolFailure> {
        let key = self.key(&self.resolve(path)?);
        let model = self.models.of(actor);
        self.refuse_if_stale(&model, path, &key, "writing").await?;
        let written = self.write_file(path, content).await?;
        self.note_on_disk(&model, &key).await;
        Ok(written)
    }

    /// Records what is now on disk as seen by the actor that just wrote it.
    async fn note_on_disk(&self, model: &WorldModel, key: &str) {
        if let Some(digest) = self.digest_on_disk(key).await {
            model.note(key, digest);
        }
    }

    async fn edit_file(&self, actor: &Actor, args: EditArgs) -> Result<Value, ToolFailure> {
        let EditArgs { path, old_string, new_string, replace_all } = args;
        let key = self.key(&self.resolve(&path)?);
        let model = self.models.of(actor);
        if model.seen(&key).is_none() {
            return Err(ToolFailure::new(
                ErrorType::ExecutionError,
                format!("`{path}` has not been read: read it first, so that the edit is made on what you saw"),
            )
            .suggest(format!("call read_file on `{path}`, then edit it")));
        }
        if old_string == new_string {
            return Err(ToolFailure::new(ErrorType::ValidationError, "old_string and new_string are the same")
                .suggest("give the text to replace and a different replacement"));
        }
        let (file, size) = self.open_regular(&path, libc::O_RDONLY, 0).await?;
        if size > EDIT_CAP {
            return Err(ToolFailure::new(
                ErrorType::ExecutionError,
                format!("`{path}` has {size} bytes, more than edit_file changes ({EDIT_CAP})"),
            )
            .suggest("change it with run_command (sed, a script)"));
        }
        let mut bytes = Vec::new();
        file.take(EDIT_CAP + 1).read_to_end(&mut bytes).await.map_err(io_failure)?;
        if model.is_stale(&key, Some(digest_of(&bytes))) {
            return Err(ToolFailure::new(
                ErrorType::ExecutionError,
                format!("`{path}` changed since you last read it; read it again before editing it"),
            )
            .suggest(format!("call read_file on `{path}`, then edit it")));
        }
        let text = String::from_utf8(bytes).map_err(|_| {
            ToolFailure::new(ErrorType::ExecutionError, format!("`{path}` is not UTF-8 text: edit_file changes text"))
        })?;
        let found = text.matches(old_string.as_str()).count();
        if found == 0 {
            return Err(ToolFailure::new(ErrorType::ExecutionError, format!("old_string was not found in `{path}`"))
                .suggest(
                    "copy the text exactly as read_file shows it (without the line numbers), spaces and tabs included",
                ));
        }
        if found > 1 && !replace_all {
            return Err(ToolFailure::new(
                ErrorType::ExecutionError,
                format!("old_string occurs {found} times in `{path}`; it must occur once"),
            )
            .suggest("include more of the surrounding lines to make it unique, or pass replace_all: true"));
        }
        let (first, _) = text.match_indices(old_string.as_str()).next().unwrap_or((0, ""));
        let edited = if replace_all {
            text.replace(&old_string, &new_string)
        } else {
            text.replacen(&old_string, &new_string, 1)
        };
        self.write_file(&path, &edited).await?;
        self.note_on_disk(&model, &key).await;
        let line = text[..first].matches('\n').count() + 1;
        let span = new_string.matches('\n').count() + 1;
        Ok(json!({
            "path": path,
            "replacements": if replace_all { found } else { 1 },
            "snippet": snippet(&edited, line, span),
        }))
    }

    async fn glob(&self, pattern: &str) -> Result<Value, ToolFailure> {
        let given = Path::new(pattern);
        if given.is_absolute() || given.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(ToolFailure::new(
                ErrorType::PermissionError,
                format!("`{pattern}` reaches outside the working directory"),
            )
            .suggest("use a pattern relative to the working directory, e.g. `**/*.txt`"));
        }
        let matcher = glob_matcher(pattern)?;
        let files = self.files.clone();
        let walked = tokio::task::spawn_blocking(move || {
            let mut found = Vec::new();
            let walk = walk_files(&files, Path::new(""), |relative| {
                if matcher.is_match(relative) {
                    found.push(relative.to_string_lossy().into_owned());
                }
                true
            });
            (found, walk)
        });
        let (mut found, walk) =
            walked.await.map_err(|e| ToolFailure::new(ErrorType::ExecutionError, format!("the walk failed: {e}")))?;
        found.sort();
        let count = found.len();
        found.truncate(MAX_FILES);
        let mut result = json!({"pattern": pattern, "count": count, "files": found});
        let mut notes = Vec::new();
        if count > MAX_FILES {
            notes.push(format!("[... {} more files not shown: narrow the pattern ...]", count - MAX_FILES));
        }
        if walk.cut {
            notes.push(format!("[... the walk stopped after {MAX_WALK} entries: files past them are not listed ...]"));
        }
        if !notes.is_empty() {
            result["truncated"] = Value::String(notes.join(" "));
        }
        Ok(result)
    }

    async fn grep(&self, args: GrepArgs) -> Result<Value, ToolFailure> {
        let GrepArgs { pattern, path, glob, ignore_case } = args;
        let matcher = RegexMatcherBuilder::new()
            .case_insensitive(ignore_case)
            .line_terminator(Some(b'\n'))
            .build(&pattern)
            .map_err(|e| {
                ToolFailure::new(ErrorType::ValidationError, format!("invalid regular expression: {e}"))
                    .suggest("escape special characters with \\, or use a simpler pattern")
            })?;
        let filter = glob.as_deref().map(|g| glob_matcher(g).map(|m| (m, g.contains('/')))).transpose()?;
        // A link inside on the way is followed here, once: the walk then follows none.
        let start = self.files.real(&self.resolve(&path)?).map_err(|e| super::not_found_or(e, &path))?;
        let (files, cap) = (self.files.clone(), self.limits.output_cap_bytes);
        let searched = tokio::task::spawn_blocking(move || {
            let mut found = Found::default();
            let mut searcher = SearcherBuilder::new()
                .binary_detection(BinaryDetection::quit(0))
                .line_number(true)
                .heap_limit(Some(HASH_CAP as usize))
                .build();
            let walk = walk_files(&files, &start, |relative| {
                if let Some((m, whole)) = &filter {
                    let name = if *whole { Some(relative.as_os_str()) } else { relative.file_name() };
                    if !name.is_some_and(|n| m.is_match(n)) {
                        return true;
                    }
                }
                found.files += 1;
                let Some(file) = open_for_search(&files, relative) else {
                    found.skipped += 1;
                    return true;
                };
                let shown = relative.to_string_lossy().into_owned();
                let sink = sinks::Lossy(|line_number, line| {
                    let entry = format!("{shown}:{line_number}:{}\n", cut_line(line.trim_end_matches(['\n', '\r'])));
                    if found.lines < MAX_MATCHES && found.text.len() + entry.len() <= cap {
                        found.text.push_str(&entry);
                        found.lines += 1;
                    } else {
                        found.cut = true;
                    }
                    // Counting on past the cap costs a whole file: stop at the first extra one.
                    Ok(!found.cut)
                });
                if searcher.search_file(&matcher, &file, sink).is_err() {
                    found.skipped += 1;
                }
                !found.cut && found.files < MAX_FILES
            });
            (found, walk)
        });
        let (mut found, walk) = searched
            .await
            .map_err(|e| ToolFailure::new(ErrorType::ExecutionError, format!("the search failed: {e}")))?;
        if found.cut {
            found.text.push_str(&format!(
                "[... more matches not shown (over {MAX_MATCHES} matches or {cap} bytes): narrow the pattern, the path or the glob ...]\n"
            ));
        }
        if walk.cut || found.files >= MAX_FILES {
            found
                .text
                .push_str("[... the search stopped before every file was searched: narrow the path or the glob ...]\n");
        }
        Ok(json!({
            "pattern": pattern,
            "matches": found.text,
            "count": found.lines,
            "files_searched": found.files,
            "files_skipped": found.skipped,
        }))
    }
}

/// A stand-in digest for a file too large to hash: it changes when the file is written.
/// The digest of a regular file's content as it is now (of its size, modification time and
/// inode when it is larger than `HASH_CAP`, or grows past it while it is read); `None` when
/// it is gone or is not a regular file. Blocking.
fn digest_file(files: &Beneath, relative: &Path) -> Option<Digest> {
    use std::io::Read;
    // Non-blocking, so that a named pipe put in a file's place cannot hold the open.
    let mut file = files.file(relative, libc::O_RDONLY | libc::O_NONBLOCK, 0, Links::Inside).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.file_type().is_file() {
        return None;
    }
    if meta.len() > HASH_CAP {
        return Some(fingerprint(&meta));
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; (meta.len() as usize + 1).clamp(1, 64 * 1024)];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf).ok()?;
        if n == 0 {
            return Some(hasher.finalize().into());
        }
        total += n as u64;
        // A file that grows while it is hashed is read no further than a large one.
        if total > HASH_CAP {
            return Some(fingerprint(&file.metadata().ok()?));
        }
        hasher.update(&buf[..n]);
    }
}

fn fingerprint(meta: &std::fs::Metadata) -> Digest {
    use std::os::unix::fs::MetadataExt;
    digest_of(
        format!("size {} mtime {}.{} inode {}", meta.len(), meta.mtime(), meta.mtime_nsec(), meta.ino()).as_bytes(),
    )
}

fn glob_matcher(pattern: &str) -> Result<GlobMatcher, ToolFailure> {
    let glob = GlobBuilder::new(pattern).literal_separator(true).build().map_err(|e| {
        ToolFailure::new(ErrorType::ValidationError, format!("invalid glob pattern: {e}"))
            .suggest("use *, ?, [abc], {a,b} and ** (any folders)")
    })?;
    Ok(glob.compile_matcher())
}

#[derive(Default)]
struct Found {
    text: String,
    /// Matches shown.
    lines: usize,
    files: usize,
    skipped: usize,
    cut: bool,
}

struct Walk {
    /// The walk met more entries than it visits.
    cut: bool,
}

/// Visits the regular files under `start` (a folder or one file) in order of their names,
/// one folder at a time from the working directory's descriptor, never following a link,
/// and hands each to `visit` by its path relative to the working directory, until `visit`
/// says stop.
fn walk_files(files: &Beneath, start: &Path, mut visit: impl FnMut(&Path) -> bool) -> Walk {
    let walked = files.walk(start, MAX_WALK, usize::MAX, |relative, entry| entry.kind != Kind::File || visit(relative));
    Walk { cut: walked.unwrap_or(false) }
}

/// Opens a file for a search without waiting and without following a link swapped in
/// since the walk saw it; `None` unless it is a regular file.
fn open_for_search(files: &Beneath, relative: &Path) -> Option<std::fs::File> {
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW;
    let file = files.file(relative, flags, 0, Links::None).ok()?;
    let meta = file.metadata().ok()?;
    (meta.is_file() && meta.len() <= HASH_CAP).then_some(file)
}

/// A line cut to `MAX_LINE_BYTES`, with a marker when it was longer.
fn cut_line(line: &str) -> String {
    if line.len() <= MAX_LINE_BYTES {
        return line.to_owned();
    }
    let mut end = MAX_LINE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} [... line cut: {} bytes ...]", &line[..end], line.len())
}

/// The lines around an edit, numbered as `read_file` numbers them.
fn snippet(text: &str, line: usize, span: usize) -> String {
    let first = line.saturating_sub(3).max(1);
    let last = line + span.min(20) + 2;
    let mut out = String::new();
    for (i, l) in text.lines().enumerate().map(|(i, l)| (i + 1, l)).skip(first - 1) {
        if i > last {
            break;
        }
        out.push_str(&format!("{i:>6}\t{}\n", cut_line(l)));
    }
    out
}

#[derive(Clone, Copy)]
struct Window {
    /// The first line to show, from 1.
    offset: usize,
    limit: usize,
    /// The bytes of numbered text shown at most.
    cap: usize,
    /// Hash the whole file (it is small enough), rather than stop after the window.
    hash: bool,
}

struct Lines {
    text: String,
    shown: usize,
    /// Lines shown no further: the cap was reached.
    full: bool,
    total_lines: Option<usize>,
    digest: Option<Digest>,
}

enum Unread {
    Binary,
    /// A large file, read only so far, has not as many lines as the offset asks.
    PastScanned(u64),
    Io(std::io::Error),
}

/// Reads a window of numbered lines out of `file`, with the file's digest when it is small
/// enough to hash. No line is held whole: a line of a gigabyte costs its first
/// `MAX_LINE_BYTES`.
fn scan(file: std::fs::File, window: Window) -> Result<Lines, Unread> {
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let mut hasher = window.hash.then(Sha256::new);
    let end = window.offset.saturating_add(window.limit);
    let mut out = Lines { text: String::new(), shown: 0, full: false, total_lines: None, digest: None };
    // The line being read: its number, its first bytes (when shown), its length.
    let (mut number, mut kept, mut length) = (1usize, Vec::new(), 0usize);
    let mut scanned = 0u64;
    let finish = |number: usize, kept: &mut Vec<u8>, length: usize, out: &mut Lines| {
        if number >= window.offset && number < end && !out.full {
            let mut text = String::from_utf8_lossy(kept).into_owned();
            if text.ends_with('\r') {
                text.pop();
            }
            if length > MAX_LINE_BYTES {
                text.push_str(&format!(" [... line cut: {length} bytes ...]"));
            }
            let entry = format!("{number:>6}\t{text}\n");
            if out.text.len() + entry.len() > window.cap {
                out.full = true;
            } else {
                out.text.push_str(&entry);
                out.shown += 1;
            }
        }
        kept.clear();
    };
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Unread::Io(e)),
        };
        if buf.is_empty() {
            if length > 0 {
                finish(number, &mut kept, length, &mut out);
                number += 1;
            }
            out.total_lines = Some(number - 1);
            out.digest = hasher.map(|h| h.finalize().into());
            return Ok(out);
        }
        let n = buf.len();
        if (scanned as usize) < BINARY_PROBE {
            let probe = &buf[..n.min(BINARY_PROBE - scanned as usize)];
            if memchr::memchr(0, probe).is_some() {
                return Err(Unread::Binary);
            }
        }
        if let Some(h) = &mut hasher {
            h.update(buf);
        }
        let mut rest = buf;
        while !rest.is_empty() {
            let (part, ends) = match memchr::memchr(b'\n', rest) {
                Some(i) => (&rest[..i], Some(i + 1)),
                None => (rest, None),
            };
            let shown = number >= window.offset && number < end && !out.full;
            if shown && kept.len() < MAX_LINE_BYTES {
                kept.extend_from_slice(&part[..part.len().min(MAX_LINE_BYTES - kept.len())]);
            }
            length += part.len();
            match ends {
                Some(i) => {
                    finish(number, &mut kept, length, &mut out);
                    number += 1;
                    length = 0;
                    rest = &rest[i..];
                }
                None => rest = &[],
            }
        }
        reader.consume(n);
        scanned += n as u64;
        if !window.hash {
            // A large file is read only until the window is shown, and never past the cap.
            if number >= end || out.full {
                return Ok(out);
            }
            if scanned >= HASH_CAP {
                if number <= window.offset {
                    return Err(Unread::PastScanned(scanned));
                }
                return Ok(out);
            }
        }
    }
}
