//! A layer's tar stream written as an overlayfs lower folder (the contract of
//! [`super::ReadyImage`]): OCI whiteouts (`.wh.NAME`) become character devices 0/0 named
//! `NAME`, `.wh..wh..opq` the `trusted.overlay.opaque=y` attribute of its folder; owners
//! are shifted by [`super::ID_BASE`]; modes (setuid included), modification times, links,
//! hard links within the layer and `user.*` attributes are kept.
//!
//! Every entry is written beneath the folder's root: its parent is opened with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` and the entry made in it without
//! following a link, so no entry (nor a link an earlier one made) reaches outside. An
//! absolute path or `..` is refused, naming the entry; so is an owner outside the image id
//! range. Device files are skipped and said so in [`Unpacked::skipped`]. Runs of zeroes are
//! written as holes, so a sparse file of any size takes only the blocks it holds.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use tar::EntryType;

use super::tree::MAX_DEPTH;
use super::{ID_BASE, ID_RANGE, at};

/// What an unpack wrote, besides the tree.
#[derive(Debug, Default)]
pub struct Unpacked {
    /// Entries (and attributes) the layer holds that were not written, and why.
    pub skipped: Vec<String>,
}

/// Writes the tar archive read from `stream` into the empty folder `root`. `Err` names the
/// entry and what was wrong with it (or with the archive).
pub fn unpack(stream: impl Read, root: &Path) -> Result<Unpacked, String> {
    let root = at::open_dir(root).map_err(|e| format!("cannot open {}: {e}", root.display()))?;
    let mut writer = Writer { root, parent: None, dirs: Vec::new(), skipped: Vec::new(), dropped: BTreeMap::new() };
    let mut archive = tar::Archive::new(stream);
    let entries = archive.entries().map_err(|e| format!("not a tar archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("corrupt archive: {e}"))?;
        let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        writer.entry(&mut entry).map_err(|e| format!("entry `{path}`: {e}"))?;
    }
    writer.finish()
}

/// An entry's owner (host ids), mode, modification time and the attributes kept.
struct Meta {
    uid: u32,
    gid: u32,
    mode: u32,
    mtime: i64,
    xattrs: Vec<(CString, Vec<u8>)>,
}

struct Writer {
    root: OwnedFd,
    /// The last parent folder opened, by its path in the layer.
    parent: Option<(Vec<u8>, OwnedFd)>,
    /// Folders made, with their times, set once nothing more is written into them.
    dirs: Vec<(Vec<u8>, i64)>,
    skipped: Vec<String>,
    /// Attributes not kept, by name, and how many entries had them.
    dropped: BTreeMap<String, usize>,
}

/// The components of an entry's path: `.` and empty ones dropped; an absolute path, `..`,
/// or more than [`MAX_DEPTH`] levels refused.
fn components(path: &[u8]) -> Result<Vec<&[u8]>, String> {
    if path.first() == Some(&b'/') {
        return Err("an absolute path is refused".into());
    }
    let parts: Vec<&[u8]> = path.split(|b| *b == b'/').filter(|c| !c.is_empty() && *c != b".").collect();
    if parts.iter().any(|c| *c == b"..") {
        return Err("`..` in a path is refused".into());
    }
    if parts.len() > MAX_DEPTH {
        return Err(format!("deeper than {MAX_DEPTH} folders"));
    }
    Ok(parts)
}

fn host_id(id: u64, what: &str) -> Result<u32, String> {
    if id >= u64::from(ID_RANGE) {
        return Err(format!("{what} {id} is outside the image id range 0..{}", ID_RANGE - 1));
    }
    Ok(ID_BASE + id as u32)
}

fn explain(e: io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ELOOP) => "a folder on its path is a symbolic link, which is never followed".into(),
        Some(libc::EXDEV) => "its path leads out of the layer".into(),
        Some(libc::ENOTDIR) => "a part of its path is not a folder".into(),
        _ => e.to_string(),
    }
}

impl Meta {
    fn of<R: Read>(entry: &mut tar::Entry<R>, dropped: &mut BTreeMap<String, usize>) -> Result<Meta, String> {
        let header = entry.header();
        let uid = host_id(header.uid().map_err(|e| e.to_string())?, "owner uid")?;
        let gid = host_id(header.gid().map_err(|e| e.to_string())?, "group gid")?;
        let mode = header.mode().map_err(|e| e.to_string())? & 0o7777;
        let mut mtime = header.mtime().map_err(|e| e.to_string())? as i64;
        let mut xattrs = Vec::new();
        if let Some(pax) = entry.pax_extensions().map_err(|e| e.to_string())? {
            for record in pax {
                let record = record.map_err(|e| format!("bad PAX record: {e}"))?;
                let key = record.key_bytes();
                if key == b"mtime" {
                    let text = String::from_utf8_lossy(record.value_bytes());
                    let whole = text.split('.').next().unwrap_or_default();
                    mtime = whole.parse().map_err(|_| format!("bad PAX mtime `{text}`"))?;
                } else if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                    if name.starts_with(b"user.") {
                        xattrs.push((at::c_bytes(name).map_err(|e| e.to_string())?, record.value_bytes().to_vec()));
                    } else {
                        *dropped.entry(String::from_utf8_lossy(name).into_owned()).or_default() += 1;
                    }
                }
            }
        }
        Ok(Meta { uid, gid, mode, mtime, xattrs })
    }

    /// Owner, mode (after the owner: a chown clears setuid) and attributes, by descriptor.
    fn apply_fd(&self, fd: RawFd) -> io::Result<()> {
        at::chown_fd(fd, self.uid, self.gid)?;
        at::chmod_fd(fd, self.mode)?;
        for (name, value) in &self.xattrs {
            at::set_xattr_fd(fd, name, value)?;
        }
        Ok(())
    }
}

/// Reads until `buf` is full or the stream ends.
fn read_full(from: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match from.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

const CHUNK: usize = 64 * 1024;
static ZEROES: [u8; CHUNK] = [0; CHUNK];

/// Copies `from` into the new file `to`, each chunk of zeroes as a hole; the length read.
fn write_sparse(from: &mut impl Read, to: &mut std::fs::File) -> io::Result<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = read_full(from, &mut buf)?;
        if n == 0 {
            break;
        }
        // Slices compare by `memcmp`: fast enough for gigabytes of zeroes.
        if buf[..n] == ZEROES[..n] {
            at::skip(to.as_raw_fd(), n as u64)?;
        } else {
            to.write_all(&buf[..n])?;
        }
        total += n as u64;
    }
    // A hole at the end is a length the file has without a block written.
    at::truncate_fd(to.as_raw_fd(), total)?;
    Ok(total)
}

impl Writer {
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<R>) -> Result<(), String> {
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            EntryType::XGlobalHeader | EntryType::XHeader | EntryType::GNULongName | EntryType::GNULongLink
        ) {
            return Ok(());
        }
        let path = entry.path_bytes().into_owned();
        let parts = components(&path)?;
        let meta = Meta::of(entry, &mut self.dropped)?;
        let Some((name, parents)) = parts.split_last() else {
            // The layer's root itself: its owner and mode are the image's `/`.
            if kind == EntryType::Directory {
                meta.apply_fd(self.root.as_raw_fd()).map_err(explain)?;
                self.dirs.push((Vec::new(), meta.mtime));
            }
            return Ok(());
        };
        let parent = parents.join(&b'/');
        if let Some(hidden) = name.strip_prefix(b".wh.") {
            return self.whiteout(&parent, hidden, &meta).map_err(explain);
        }
        let dir = self.parent(&parent).map_err(explain)?;
        let c_name = at::c_bytes(name).map_err(|e| e.to_string())?;
        match kind {
            EntryType::Directory => {
                self.directory(dir, &c_name, &meta).map_err(explain)?;
                self.dirs.push((path_of(&parent, name), meta.mtime));
                Ok(())
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.file(dir, &c_name, &meta, entry).map_err(explain)
            }
            EntryType::Symlink => {
                let target = entry.link_name_bytes().ok_or("a symbolic link without a target")?;
                let target = at::c_bytes(&target).map_err(|e| e.to_string())?;
                replace(dir, &c_name, |dir, name| at::symlink_at(&target, dir, name)).map_err(explain)?;
                at::chown_at(dir, &c_name, meta.uid, meta.gid).map_err(explain)?;
                at::set_mtime_at(dir, &c_name, meta.mtime).map_err(explain)
            }
            EntryType::Link => {
                let target = entry.link_name_bytes().ok_or("a hard link without a target")?.into_owned();
                self.hard_link(&target, dir, &c_name)
            }
            EntryType::Fifo => replace(dir, &c_name, |dir, name| at::mknod_at(dir, name, libc::S_IFIFO | 0o600, 0, 0))
                .and_then(|()| self.apply_at(dir, &c_name, &meta))
                .map_err(explain),
            EntryType::Char | EntryType::Block => {
                let major = entry.header().device_major().ok().flatten().unwrap_or(0);
                let minor = entry.header().device_minor().ok().flatten().unwrap_or(0);
                let shown = String::from_utf8_lossy(&path);
                self.skipped.push(format!("{shown}: device {major}:{minor} not made"));
                Ok(())
            }
            other => {
                self.skipped.push(format!("{}: entry type {other:?} not made", String::from_utf8_lossy(&path)));
                Ok(())
            }
        }
    }

    /// The folder `parent` of the layer, open; folders an archive leaves out are made
    /// (owned by the image's root, as other tools make them).
    fn parent(&mut self, parent: &[u8]) -> io::Result<RawFd> {
        if self.parent.as_ref().is_none_or(|(path, _)| path != parent) {
            let fd = match at::open_dir_beneath(self.root.as_raw_fd(), parent) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => self.make_parents(parent)?,
                other => other?,
            };
            self.parent = Some((parent.to_vec(), fd));
        }
        Ok(self.parent.as_ref().map(|(_, fd)| fd.as_raw_fd()).unwrap_or(-1))
    }

    fn make_parents(&mut self, parent: &[u8]) -> io::Result<OwnedFd> {
        let mut dir = at::open_dir_beneath(self.root.as_raw_fd(), b"")?;
        let mut end = 0;
        for part in parent.split(|b| *b == b'/') {
            let name = at::c_bytes(part)?;
            match at::mkdir_at(dir.as_raw_fd(), &name, 0o755) {
                Ok(()) => at::chown_at(dir.as_raw_fd(), &name, ID_BASE, ID_BASE)?,
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(e),
            }
            // Each step opened beneath the root again: the kernel, not only `components`,
            // keeps the walk inside.
            end += part.len() + usize::from(end > 0);
            dir = at::open_dir_beneath(self.root.as_raw_fd(), &parent[..end])?;
        }
        Ok(dir)
    }

    fn directory(&mut self, dir: RawFd, name: &CString, meta: &Meta) -> io::Result<()> {
        match at::mkdir_at(dir, name, 0o700) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                // Named again (the archive's own or made as a parent): keep it if it is a folder.
                let stat = at::stat_at(dir, name)?;
                if stat.st_mode & libc::S_IFMT != libc::S_IFDIR {
                    at::unlink_at(dir, name, 0)?;
                    at::mkdir_at(dir, name, 0o700)?;
                }
            }
            other => other?,
        }
        let opened = at::open_at(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        meta.apply_fd(opened.as_raw_fd())
    }

    fn file<R: Read>(&mut self, dir: RawFd, name: &CString, meta: &Meta, entry: &mut tar::Entry<R>) -> io::Result<()> {
        let expected = entry.size();
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        let mut made = None;
        replace(dir, name, |dir, name| {
            made = Some(at::open_at(dir, name, flags, 0o600)?);
            Ok(())
        })?;
        let Some(fd) = made else { return Err(io::Error::other("the file was not made")) };
        let mut file = std::fs::File::from(fd);
        let written = write_sparse(entry, &mut file)?;
        if written != expected {
            return Err(io::Error::other(format!("the archive ends inside it ({written} of {expected} bytes)")));
        }
        meta.apply_fd(file.as_raw_fd())?;
        at::set_mtime_fd(file.as_raw_fd(), meta.mtime)
    }

    /// Owner, mode and time of an entry that has no descriptor of its own (a pipe, a whiteout).
    fn apply_at(&self, dir: RawFd, name: &CString, meta: &Meta) -> io::Result<()> {
        at::chown_at(dir, name, meta.uid, meta.gid)?;
        at::chmod_at(dir, name, meta.mode)?;
        at::set_mtime_at(dir, name, meta.mtime)
    }

    fn hard_link(&mut self, target: &[u8], dir: RawFd, name: &CString) -> Result<(), String> {
        let parts = components(target).map_err(|e| format!("hard link target: {e}"))?;
        let Some((target_name, target_parents)) = parts.split_last() else {
            return Err("a hard link to the layer's root".into());
        };
        let from_dir = at::open_dir_beneath(self.root.as_raw_fd(), &target_parents.join(&b'/'))
            .map_err(|e| format!("hard link target: {}", explain(e)))?;
        let from = at::c_bytes(target_name).map_err(|e| e.to_string())?;
        let shown = String::from_utf8_lossy(target);
        replace(dir, name, |dir, name| at::link_at(from_dir.as_raw_fd(), &from, dir, name)).map_err(|e| {
            match e.raw_os_error() {
                Some(libc::ENOENT) => format!("a hard link to `{shown}`, which this layer does not hold"),
                _ => format!("hard link to `{shown}`: {}", explain(e)),
            }
        })
    }

    fn whiteout(&mut self, parent: &[u8], hidden: &[u8], meta: &Meta) -> io::Result<()> {
        let dir = self.parent(parent)?;
        if hidden == b".wh..opq" {
            let opened = at::open_dir_beneath(self.root.as_raw_fd(), parent)?;
            return at::set_xattr_fd(opened.as_raw_fd(), c"trusted.overlay.opaque", b"y");
        }
        if hidden.starts_with(b".wh.") || hidden.is_empty() {
            // Other `.wh..wh.` names are aufs' bookkeeping, nothing of the image's.
            return Ok(());
        }
        let name = at::c_bytes(hidden)?;
        replace(dir, &name, |dir, name| at::mknod_at(dir, name, libc::S_IFCHR, 0, 0))?;
        at::chown_at(dir, &name, meta.uid, meta.gid)?;
        at::set_mtime_at(dir, &name, meta.mtime)
    }

    /// Sets the folders' times, now that nothing more is written into them.
    fn finish(mut self) -> Result<Unpacked, String> {
        self.parent = None;
        for (path, mtime) in &self.dirs {
            let shown = String::from_utf8_lossy(path);
            let done = match path.iter().rposition(|b| *b == b'/') {
                None if path.is_empty() => at::set_mtime_fd(self.root.as_raw_fd(), *mtime),
                split => {
                    let (parent, name) = match split {
                        Some(i) => (&path[..i], &path[i + 1..]),
                        None => (&b""[..], &path[..]),
                    };
                    let dir = at::open_dir_beneath(self.root.as_raw_fd(), parent);
                    dir.and_then(|dir| at::set_mtime_at(dir.as_raw_fd(), &at::c_bytes(name)?, *mtime))
                }
            };
            done.map_err(|e| format!("entry `{shown}`: {}", explain(e)))?;
        }
        for (name, count) in &self.dropped {
            self.skipped.push(format!("attribute {name} not kept ({count} entries)"));
        }
        Ok(Unpacked { skipped: self.skipped })
    }
}

fn path_of(parent: &[u8], name: &[u8]) -> Vec<u8> {
    if parent.is_empty() { name.to_vec() } else { [parent, b"/", name].concat() }
}

/// Makes `name` in `dir` with `make`; what an earlier entry made there is replaced (a
/// later entry of an archive wins), an empty folder too.
fn replace(dir: RawFd, name: &CString, mut make: impl FnMut(RawFd, &CString) -> io::Result<()>) -> io::Result<()> {
    match make(dir, name) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            let stat = at::stat_at(dir, name)?;
            let flags = if stat.st_mode & libc::S_IFMT == libc::S_IFDIR { libc::AT_REMOVEDIR } else { 0 };
            at::unlink_at(dir, name, flags)?;
            make(dir, name)
        }
        other => other,
    }
}
