//! The build context: the files `COPY` and `ADD` may take, found once per build (what
//! `.dockerignore` leaves out is not there), and what a copy of some of them is made of —
//! each entry's name, kind, mode and content digest, for the step's cache key.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use globset::GlobBuilder;
use sha2::{Digest, Sha256};

use super::ignore::Ignore;

/// An entry of the context, seen without following it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Relative to the context, `/`-separated.
    pub name: String,
    pub kind: EntryKind,
    pub meta: std::fs::Metadata,
}

#[derive(Debug, Clone, PartialEq)]
pub enum EntryKind {
    Dir,
    File,
    /// A link and its target, which stays inside the context.
    Link(PathBuf),
}

/// The context's entries that a build may copy, by name.
#[derive(Debug)]
pub struct Context {
    pub dir: PathBuf,
    pub entries: BTreeMap<String, Entry>,
}

impl Context {
    /// Walks `dir`, leaving out what its `.dockerignore` names. A link that leads out of the
    /// context is kept as one: copying it is refused then, with the step's line.
    pub fn read(dir: &Path) -> Result<Context, String> {
        let ignore = match std::fs::read_to_string(dir.join(".dockerignore")) {
            Ok(text) => Ignore::parse(&text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ignore::default(),
            Err(e) => return Err(format!("failed to read {}: {e}", dir.join(".dockerignore").display())),
        };
        let mut entries = BTreeMap::new();
        let mut folders = vec![String::new()];
        while let Some(folder) = folders.pop() {
            let path = dir.join(&folder);
            let listing = std::fs::read_dir(&path).map_err(|e| format!("failed to read {}: {e}", path.display()))?;
            for item in listing {
                let item = item.map_err(|e| format!("failed to read {}: {e}", path.display()))?;
                let name = match item.file_name().to_str() {
                    Some(n) if folder.is_empty() => n.to_owned(),
                    Some(n) => format!("{folder}/{n}"),
                    None => return Err(format!("a file name in {} is not UTF-8", path.display())),
                };
                let meta = item.metadata().map_err(|e| format!("failed to read {}: {e}", item.path().display()))?;
                let kind = if meta.is_dir() {
                    EntryKind::Dir
                } else if meta.file_type().is_symlink() {
                    EntryKind::Link(
                        std::fs::read_link(item.path()).map_err(|e| format!("{}: {e}", item.path().display()))?,
                    )
                } else {
                    EntryKind::File
                };
                let excluded = ignore.excludes(&name);
                if kind == EntryKind::Dir && (!excluded || ignore.has_exceptions()) {
                    folders.push(name.clone());
                }
                if !excluded {
                    entries.insert(name.clone(), Entry { name, kind, meta });
                }
            }
        }
        Ok(Context { dir: dir.to_path_buf(), entries })
    }

    /// The entries a `COPY` source names: the context itself (`.`), a path, or a glob;
    /// each with the entries beneath it when it is a folder. An error says why none.
    pub fn select(&self, source: &str) -> Result<Vec<Selected>, String> {
        let cleaned = clean(source)?;
        let tops: Vec<&Entry> = if cleaned.is_empty() {
            return Ok(vec![Selected { top: None, below: self.entries.values().cloned().collect() }]);
        } else if cleaned.contains(['*', '?', '[']) {
            let glob = GlobBuilder::new(&cleaned)
                .literal_separator(true)
                .build()
                .map_err(|e| format!("the source `{source}`: {e}"))?
                .compile_matcher();
            self.entries.values().filter(|e| glob.is_match(&e.name)).collect()
        } else {
            self.entries.get(&cleaned).into_iter().collect()
        };
        if tops.is_empty() {
            return Err(format!("`{source}` is not in the build context (or .dockerignore leaves it out)"));
        }
        let mut selected = Vec::new();
        for top in tops {
            let below = match top.kind {
                EntryKind::Dir => {
                    let prefix = format!("{}/", top.name);
                    self.entries
                        .range(prefix.clone()..)
                        .take_while(|(k, _)| k.starts_with(&prefix))
                        .map(|(_, e)| e.clone())
                        .collect()
                }
                _ => Vec::new(),
            };
            selected.push(Selected { top: Some(top.clone()), below });
        }
        for entry in selected.iter().flat_map(|s| s.top.iter().chain(&s.below)) {
            self.check_link(entry)?;
        }
        Ok(selected)
    }

    /// Refuses a link whose target leads out of the context.
    fn check_link(&self, entry: &Entry) -> Result<(), String> {
        let EntryKind::Link(target) = &entry.kind else { return Ok(()) };
        let mut depth: i64 = entry.name.matches('/').count() as i64;
        let mut out = target.is_absolute();
        for part in target.components() {
            match part {
                Component::ParentDir => depth -= 1,
                Component::Normal(_) => depth += 1,
                _ => {}
            }
            out |= depth < 0;
        }
        if out {
            return Err(format!("`{}` is a link to `{}`, outside the build context", entry.name, target.display()));
        }
        Ok(())
    }

    /// The host path of an entry.
    pub fn path(&self, entry: &Entry) -> PathBuf {
        self.dir.join(&entry.name)
    }

    /// A digest of what copying `selected` takes: names, kinds, modes, link targets and
    /// contents. Files are opened without following links.
    pub fn digest(&self, selected: &[Selected]) -> Result<String, String> {
        let mut hash = Sha256::new();
        for entry in selected.iter().flat_map(|s| s.top.iter().chain(&s.below)) {
            hash.update(format!("{}\0{:o}\0", entry.name, entry.meta.mode()).as_bytes());
            match &entry.kind {
                EntryKind::Dir => hash.update(b"dir\0"),
                EntryKind::Link(target) => hash.update(format!("link\0{}\0", target.display()).as_bytes()),
                EntryKind::File => {
                    let path = self.path(entry);
                    let failed = |e: std::io::Error| format!("failed to read {}: {e}", path.display());
                    let mut file = open_no_follow(&path).map_err(failed)?;
                    let mut buffer = vec![0u8; 64 * 1024];
                    loop {
                        let n = file.read(&mut buffer).map_err(failed)?;
                        if n == 0 {
                            break;
                        }
                        hash.update(&buffer[..n]);
                    }
                    hash.update(format!("\0{}\0", entry.meta.len()).as_bytes());
                }
            }
        }
        Ok(hex::encode(hash.finalize()))
    }
}

/// A source's top entry (`None` for the whole context) and the entries beneath it.
#[derive(Debug, Clone)]
pub struct Selected {
    pub top: Option<Entry>,
    pub below: Vec<Entry>,
}

/// Opens a file for reading, refusing a link.
pub fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// A source as a path relative to the context: a leading `/` or `./` dropped, `..` refused.
fn clean(source: &str) -> Result<String, String> {
    let mut parts = Vec::new();
    for part in Path::new(source).components() {
        match part {
            Component::Normal(p) => parts.push(p.to_str().unwrap_or_default().to_owned()),
            Component::ParentDir => return Err(format!("the source `{source}` leads out of the build context")),
            _ => {}
        }
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> (tempfile::TempDir, Context) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("src/sub")).unwrap();
        std::fs::write(d.join("src/a.txt"), "a").unwrap();
        std::fs::write(d.join("src/sub/b.txt"), "b").unwrap();
        std::fs::write(d.join("notes.log"), "log").unwrap();
        std::fs::write(d.join("top.txt"), "top").unwrap();
        std::fs::write(d.join(".dockerignore"), "*.log\n").unwrap();
        std::os::unix::fs::symlink("../../etc/passwd", d.join("src/out")).unwrap();
        std::os::unix::fs::symlink("a.txt", d.join("src/in")).unwrap();
        let context = Context::read(d).unwrap();
        (dir, context)
    }

    #[test]
    fn sources_select_paths_globs_and_folders_but_nothing_ignored_or_outside() {
        let (_dir, ctx) = context();
        let names = |s: &str| -> Vec<String> {
            ctx.select(s).unwrap().iter().flat_map(|s| s.top.iter().chain(&s.below)).map(|e| e.name.clone()).collect()
        };
        assert_eq!(names("top.txt"), vec!["top.txt"]);
        assert_eq!(names("/src/*.txt"), vec!["src/a.txt"]);
        assert_eq!(names("src/in"), vec!["src/in"], "a link inside is fine");
        assert!(ctx.select("notes.log").unwrap_err().contains(".dockerignore"));
        assert!(ctx.select("../x").unwrap_err().contains("out of the build context"));
        let err = ctx.select("src").unwrap_err();
        assert!(err.contains("src/out") && err.contains("outside the build context"), "{err}");
    }

    #[test]
    fn a_digest_changes_with_a_files_content_and_mode() {
        let (dir, ctx) = context();
        let first = ctx.digest(&ctx.select("top.txt").unwrap()).unwrap();
        assert_eq!(first, ctx.digest(&ctx.select("top.txt").unwrap()).unwrap());
        std::fs::write(dir.path().join("top.txt"), "changed").unwrap();
        let ctx = Context::read(dir.path()).unwrap();
        assert_ne!(first, ctx.digest(&ctx.select("top.txt").unwrap()).unwrap());
    }
}
