//! `COPY` and `ADD`: what they take (from the build context, or from another stage's or an
//! image's root) written into the root of the image being built, owned by `--chown`'s ids
//! (else the image's root), with the source's modes (or `--chmod`'s) and times. `ADD` of a
//! local tar archive (plain or gzip) unpacks it.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::context::{self, Context, EntryKind, Selected};
use super::tree::{ImageTree, Meta, mtime_of, set_meta};
use super::words::{self, Vars};

/// A `COPY` or `ADD` as written, its words expanded.
#[derive(Debug, Clone, Default)]
pub struct Copy {
    pub add: bool,
    pub sources: Vec<String>,
    pub dest: String,
    pub chown: Option<String>,
    pub chmod: Option<u32>,
    pub from: Option<String>,
}

impl Copy {
    /// Reads `COPY`'s (or `ADD`'s) arguments: flags, then sources and the destination, in the
    /// shell form or as a JSON array.
    pub fn parse(add: bool, args: &str, vars: &Vars, escape: char) -> Result<Copy, String> {
        let mut rest = args.trim_start();
        let mut copy = Copy { add, ..Copy::default() };
        while rest.starts_with("--") {
            let (raw, after) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            rest = after.trim_start();
            let flag = words::expand(raw, vars, escape)?;
            let (name, value) = flag.split_once('=').unwrap_or((&flag, ""));
            match name {
                "--chown" => copy.chown = Some(value.to_owned()),
                "--chmod" => {
                    let mode = u32::from_str_radix(value, 8)
                        .ok()
                        .filter(|m| *m <= 0o7777)
                        .ok_or_else(|| format!("--chmod takes an octal mode such as 0755, not `{value}`"))?;
                    copy.chmod = Some(mode);
                }
                "--from" if !add => copy.from = Some(value.to_owned()),
                "--link" => {}
                _ => return Err(format!("the flag `{name}` is not supported")),
            }
        }
        let mut words = match super::parse::exec_form(rest) {
            Some(json) => json.iter().map(|w| words::expand(w, vars, escape)).collect::<Result<_, _>>()?,
            None => words::split(rest, vars, escape)?,
        };
        if words.len() < 2 {
            return Err("needs at least one source and a destination".into());
        }
        copy.dest = words.pop().unwrap_or_default();
        copy.sources = words;
        if add && let Some(url) = copy.sources.iter().find(|s| s.contains("://") || s.starts_with("git@")) {
            return Err(format!("ADD of a URL (`{url}`) is not supported; download it in a RUN step"));
        }
        Ok(copy)
    }

    /// The destination as an image path, relative ones from `workdir`; and whether it is a
    /// folder to copy into (a trailing `/`).
    fn destination(&self, workdir: &Path) -> (PathBuf, bool) {
        let into = self.dest.ends_with('/') || self.dest == "." || self.dest.ends_with("/.");
        (workdir.join(&self.dest), into)
    }
}

/// One entry to write: where it is read, where it goes, what it is.
struct Item {
    from: PathBuf,
    dest: PathBuf,
    kind: EntryKind,
    meta: std::fs::Metadata,
}

/// Where a copy reads: the build context, or the root of a stage or image.
pub enum CopySource<'a> {
    Context(&'a Context),
    Root(&'a ImageTree),
}

/// Copies `copy`'s sources into `tree` (the image being built, working folder `workdir`),
/// owned by `owner`.
pub fn copy(
    copy: &Copy,
    source: &CopySource<'_>,
    tree: &ImageTree,
    workdir: &Path,
    owner: (u32, u32),
) -> Result<(), String> {
    let (dest, into) = copy.destination(workdir);
    let mut items = Vec::new();
    let many = copy.sources.len() > 1 || copy.sources.iter().any(|s| s.contains(['*', '?', '[']));
    if many && !into {
        return Err(format!("with several sources, the destination `{}` must end with `/`", copy.dest));
    }
    let dest_is_dir = into || tree.resolve(&dest, true).map(|p| tree.host(&p).is_dir()).unwrap_or(false);
    let mut archives = Vec::new();
    for name in &copy.sources {
        let selected = match source {
            CopySource::Context(ctx) => ctx.select(name)?,
            CopySource::Root(from) => vec![in_root(from, name)?],
        };
        for s in selected {
            let base = |top: &str| top.rsplit('/').next().unwrap_or(top).to_owned();
            let host = |name: &str| match source {
                CopySource::Context(ctx) => ctx.dir.join(name),
                CopySource::Root(from) => from.host(Path::new(name)),
            };
            match &s.top {
                Some(top) if top.kind != EntryKind::Dir => {
                    let to = if dest_is_dir { dest.join(base(&top.name)) } else { dest.clone() };
                    if copy.add && top.kind == EntryKind::File && is_archive(&host(&top.name))? {
                        archives.push((host(&top.name), if dest_is_dir { dest.clone() } else { to }));
                        continue;
                    }
                    items.push(Item {
                        from: host(&top.name),
                        dest: to,
                        kind: top.kind.clone(),
                        meta: top.meta.clone(),
                    });
                }
                top => {
                    let prefix = top.as_ref().map(|t| format!("{}/", t.name)).unwrap_or_default();
                    for entry in &s.below {
                        let rel = entry.name.strip_prefix(&prefix).unwrap_or(&entry.name);
                        items.push(Item {
                            from: host(&entry.name),
                            dest: dest.join(rel),
                            kind: entry.kind.clone(),
                            meta: entry.meta.clone(),
                        });
                    }
                    tree.make_dirs(&dest, owner).map_err(|e| format!("failed to make {}: {e}", dest.display()))?;
                }
            }
        }
    }
    write(&items, tree, owner, copy.chmod)?;
    for (archive, into) in archives {
        unpack(&archive, tree, &into, copy.chown.as_ref().map(|_| owner), copy.chmod)?;
    }
    Ok(())
}

/// Writes the items in order (a folder before what is in it), then gives the folders their
/// times (writing into them changed those).
fn write(items: &[Item], tree: &ImageTree, owner: (u32, u32), chmod: Option<u32>) -> Result<(), String> {
    let mut folders = Vec::new();
    for item in items {
        let meta = Meta { owner, mode: chmod.unwrap_or(item.meta.mode()), mtime: mtime_of(&item.meta) };
        let failed = |e: std::io::Error| format!("failed to write {}: {e}", item.dest.display());
        match &item.kind {
            EntryKind::Dir => {
                tree.write_dir(&item.dest, meta).map_err(failed)?;
                folders.push((item.dest.clone(), meta));
            }
            EntryKind::File => {
                let mut from = context::open_no_follow(&item.from)
                    .map_err(|e| format!("failed to read {}: {e}", item.from.display()))?;
                tree.write_file(&item.dest, &mut from, meta).map_err(failed)?;
            }
            EntryKind::Link(target) => tree.write_link(&item.dest, target, meta).map_err(failed)?,
        }
    }
    for (dir, meta) in folders.iter().rev() {
        let resolved = tree.resolve(dir, false).map_err(|e| format!("{}: {e}", dir.display()))?;
        set_meta(&tree.host(&resolved), *meta).map_err(|e| format!("failed to set {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// A `--from` source: a path in another root (its links followed there), with what is
/// beneath it when it is a folder. Names are the root's paths, absolute.
fn in_root(from: &ImageTree, name: &str) -> Result<Selected, String> {
    let path = from.resolve(&Path::new("/").join(name), true).map_err(|e| format!("`{name}`: {e}"))?;
    let entry = |path: &Path| -> Result<context::Entry, String> {
        let host = from.host(path);
        let meta = std::fs::symlink_metadata(&host).map_err(|e| format!("`{}` in the source: {e}", path.display()))?;
        let kind = if meta.is_dir() {
            EntryKind::Dir
        } else if meta.file_type().is_symlink() {
            EntryKind::Link(std::fs::read_link(&host).map_err(|e| format!("{}: {e}", path.display()))?)
        } else if meta.is_file() {
            EntryKind::File
        } else {
            return Err(format!("`{}` in the source is neither a file, a folder nor a link", path.display()));
        };
        Ok(context::Entry { name: path.to_string_lossy().into_owned(), kind, meta })
    };
    let top = entry(&path)?;
    let mut below = Vec::new();
    if top.kind == EntryKind::Dir {
        let mut folders = vec![path.clone()];
        while let Some(folder) = folders.pop() {
            let listing = std::fs::read_dir(from.host(&folder))
                .map_err(|e| format!("`{}` in the source: {e}", folder.display()))?;
            let mut names: Vec<_> = listing.filter_map(|e| e.ok()).map(|e| folder.join(e.file_name())).collect();
            names.sort();
            for name in names {
                let found = entry(&name)?;
                if found.kind == EntryKind::Dir {
                    folders.push(name);
                }
                below.push(found);
            }
        }
        below.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Ok(Selected { top: Some(top), below })
}

/// Whether the file at `path` is a tar archive, plain or gzip; other compressions are
/// refused by name.
fn is_archive(path: &Path) -> Result<bool, String> {
    let mut head = [0u8; 512];
    let mut file = context::open_no_follow(path).map_err(|e| format!("failed to read {}: {e}", path.display()))?;
    let mut n = 0;
    while n < head.len() {
        match file.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(format!("failed to read {}: {e}", path.display())),
        }
    }
    if head.starts_with(b"BZh") || head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        return Err(format!("{}: only plain and gzip tar archives are unpacked by ADD", path.display()));
    }
    Ok(head.starts_with(&[0x1f, 0x8b]) || (n >= 262 && &head[257..262] == b"ustar"))
}

/// Unpacks the tar archive at `path` into the folder `into`: owners from the archive (or
/// `owner`), entries that would land outside `into` refused.
fn unpack(
    path: &Path,
    tree: &ImageTree,
    into: &Path,
    owner: Option<(u32, u32)>,
    chmod: Option<u32>,
) -> Result<(), String> {
    let failed = |e: std::io::Error| format!("failed to unpack {}: {e}", path.display());
    let file = context::open_no_follow(path).map_err(failed)?;
    let mut head = [0u8; 2];
    let gzip = context::open_no_follow(path).and_then(|mut f| f.read_exact(&mut head)).is_ok() && head == [0x1f, 0x8b];
    let reader: Box<dyn Read> = if gzip { Box::new(flate2::read::GzDecoder::new(file)) } else { Box::new(file) };
    let mut archive = tar::Archive::new(reader);
    tree.make_dirs(into, owner.unwrap_or((0, 0))).map_err(failed)?;
    let mut folders = Vec::new();
    for entry in archive.entries().map_err(failed)? {
        let mut entry = entry.map_err(failed)?;
        let name = entry.path().map_err(failed)?.into_owned();
        if name.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
            return Err(format!("{}: the entry `{}` leads out of the destination", path.display(), name.display()));
        }
        let dest = into.join(name.strip_prefix("/").unwrap_or(&name));
        let header = entry.header();
        let ids = (header.uid().unwrap_or(0) as u32, header.gid().unwrap_or(0) as u32);
        let mode = chmod.unwrap_or(header.mode().unwrap_or(0o644));
        let meta = Meta { owner: owner.unwrap_or(ids), mode, mtime: header.mtime().ok().map(|t| (t as i64, 0)) };
        let kind = header.entry_type();
        let wrote = match kind {
            tar::EntryType::Directory => {
                folders.push((dest.clone(), meta));
                tree.write_dir(&dest, meta)
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => tree.write_file(&dest, &mut entry, meta),
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry.link_name().map_err(failed)?.unwrap_or_default().into_owned();
                if kind == tar::EntryType::Symlink {
                    tree.write_link(&dest, &target, meta)
                } else if target.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
                    return Err(format!(
                        "{}: the link `{}` leads out of the destination",
                        path.display(),
                        name.display()
                    ));
                } else {
                    tree.write_hard_link(&dest, &into.join(target.strip_prefix("/").unwrap_or(&target)))
                }
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => Ok(()),
            other => {
                return Err(format!(
                    "{}: the entry `{}` is a {other:?}, which ADD does not make",
                    path.display(),
                    name.display()
                ));
            }
        };
        wrote.map_err(|e| format!("failed to unpack `{}` from {}: {e}", name.display(), path.display()))?;
    }
    for (dir, meta) in folders.iter().rev() {
        let resolved = tree.resolve(dir, false).map_err(failed)?;
        set_meta(&tree.host(&resolved), *meta).map_err(failed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &str) -> Result<Copy, String> {
        let vars: Vars = [("V".to_owned(), "1.2".to_owned())].into();
        Copy::parse(false, args, &vars, '\\')
    }

    #[test]
    fn copy_arguments_take_flags_sources_and_a_destination() {
        let c = parse("--chown=app:app --chmod=0755 a-$V.txt b/ /dst/").unwrap();
        assert_eq!((c.chown.as_deref(), c.chmod), (Some("app:app"), Some(0o755)));
        assert_eq!(c.sources, vec!["a-1.2.txt", "b/"]);
        assert_eq!(c.dest, "/dst/");
        let c = parse(r#"--from=build ["/out dir", "/app"]"#).unwrap();
        assert_eq!(
            (c.from.as_deref(), c.sources, c.dest.as_str()),
            (Some("build"), vec!["/out dir".to_owned()], "/app")
        );
        assert!(parse("--chmod=9 a b").unwrap_err().contains("octal"));
        assert!(parse("--parents a b").unwrap_err().contains("--parents"));
        assert!(parse("onlyone").is_err());
        let add = Copy::parse(true, "https://example.com/x.tgz /x", &Vars::new(), '\\').unwrap_err();
        assert!(add.contains("URL"), "{add}");
    }
}
