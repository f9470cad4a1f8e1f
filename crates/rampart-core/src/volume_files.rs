//! The volume file API: reading and changing a volume's files without a sandbox (the E2B
//! face's `/volumecontent/...`; see `docs/persistence.md`, Volume files).
//!
//! [`crate::Manager::open_volume`] marks the volume busy (so it cannot be removed while a
//! call runs) and has the tier mount its file system **detached** for the daemon
//! ([`crate::Volumes::volume_root`]): in no mount namespace, over the volume's one loop
//! device, so a sandbox that has it mounted shares the same ext4 instance (one writer of the
//! image, never two) and sees every change at once.
//!
//! Every path is relative to the volume's root and walked **by descriptor**: `..` is refused
//! outright, and every open is `openat2` beneath the root with `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`, so a symlink inside the volume is followed only
//! while it stays inside (an absolute one, or one climbing out, is refused); the last
//! component of a stat, remove, metadata change or write is never followed (a symlink is
//! reported, removed or replaced as itself). Ids are the on-disk ones, which a sandbox sees
//! unchanged (its volume mounts are idmapped); new entries belong to 1000:1000 (the volume
//! root's owner, the sandbox user) unless the caller says otherwise.

use crate::persist::Busy;
use crate::CoreError;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

/// Owner of what the file API makes when the caller names none (the volume root's).
pub const DEFAULT_OWNER: u32 = 1000;
/// Most entries one listing returns.
pub const MAX_LISTED: usize = 100_000;

/// What a volume entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (never followed when reported).
    Symlink,
    /// Anything else (fifo, socket, device).
    Unknown,
}

/// One entry of a volume, as `lstat` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeEntry {
    /// Its last component (empty for the root).
    pub name: String,
    /// What it is.
    pub kind: EntryKind,
    /// Its path from the volume's root, starting with `/`.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (with set-id and sticky bits).
    pub mode: u32,
    /// Owner (on disk, as sandboxes see it).
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Access time, unix seconds and nanoseconds.
    pub atime: (i64, u32),
    /// Modification time.
    pub mtime: (i64, u32),
    /// Status change time.
    pub ctime: (i64, u32),
    /// A symlink's target, as written.
    pub target: Option<String>,
}

/// Owner and permissions to give an entry (`None`: the default, or unchanged).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntryMeta {
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Permission bits (at most `0o7777`).
    pub mode: Option<u32>,
}

impl EntryMeta {
    fn check(&self) -> Result<(), CoreError> {
        if self.uid == Some(u32::MAX) || self.gid == Some(u32::MAX) {
            return Err(bad("uid/gid", "4294967295 is not an id"));
        }
        if self.mode.is_some_and(|m| m > 0o7777) {
            return Err(bad("mode", "permission bits are at most 0o7777"));
        }
        Ok(())
    }
}

fn bad(field: &str, message: impl Into<String>) -> CoreError {
    CoreError::BadRequest {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// The components of `path` (relative to the volume's root; a leading `/` and `.` are
/// ignored). `..`, NUL and over-long names are refused.
pub(crate) fn components(path: &str) -> Result<Vec<&str>, CoreError> {
    if path.as_bytes().contains(&0) {
        return Err(bad("path", "a path cannot contain NUL"));
    }
    if path.len() > 4096 {
        return Err(bad("path", "a path is at most 4096 bytes"));
    }
    let mut out = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(bad(
                    "path",
                    format!("{path:?}: \"..\" is not allowed (paths stay inside the volume)"),
                ))
            }
            c if c.len() > 255 => {
                return Err(bad(
                    "path",
                    format!("{path:?}: a name is at most 255 bytes"),
                ))
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV
}

/// A file system error on `path`, as the API reports it.
fn fs_err(path: &str, what: &str, e: Errno) -> CoreError {
    match e {
        Errno::NOENT => CoreError::NotFound(format!("path {path:?} in the volume")),
        Errno::XDEV | Errno::LOOP => CoreError::Forbidden(format!(
            "{path:?}: a symlink on the way leads out of the volume"
        )),
        Errno::NOTDIR => bad("path", format!("{path:?}: a component is not a directory")),
        Errno::ISDIR => bad("path", format!("{path:?} is a directory")),
        Errno::EXIST => CoreError::Conflict(format!("{path:?} exists")),
        Errno::NOTEMPTY => CoreError::Conflict(format!("{path:?} is not empty")),
        Errno::NOSPC | Errno::DQUOT => {
            CoreError::TooLarge(format!("{what} {path:?}: the volume is full"))
        }
        Errno::NAMETOOLONG => bad("path", format!("{path:?}: a name is too long")),
        e => CoreError::Internal(format!("{what} {path:?} in the volume: {e}")),
    }
}

fn shown(comps: &[&str]) -> String {
    format!("/{}", comps.join("/"))
}

fn kind_of(mode: u32) -> EntryKind {
    match FileType::from_raw_mode(mode as _) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Directory,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Unknown,
    }
}

/// A volume opened for the file API: its detached mount's root and the mark that keeps it
/// from being removed. Every method blocks (call it on a blocking thread).
#[derive(Debug)]
pub struct VolumeRoot {
    root: OwnedFd,
    _busy: Busy,
}

/// A file being written: a hidden temporary file in the target's directory, renamed over
/// the target by [`Upload::commit`]; dropped uncommitted, it is removed.
#[derive(Debug)]
pub struct Upload {
    file: Option<std::fs::File>,
    dir: OwnedFd,
    tmp: String,
    name: String,
    path: Vec<String>,
    committed: bool,
    vol: std::sync::Arc<VolumeRoot>,
}

impl VolumeRoot {
    pub(crate) fn new(root: OwnedFd, busy: Busy) -> VolumeRoot {
        VolumeRoot { root, _busy: busy }
    }

    /// Opens the directory `comps` (following symlinks that stay inside).
    fn open_dir(&self, comps: &[&str]) -> Result<OwnedFd, Errno> {
        let rel = if comps.is_empty() {
            ".".to_owned()
        } else {
            comps.join("/")
        };
        rustix::fs::openat2(
            &self.root,
            rel.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            beneath(),
        )
    }

    /// The parent directory of `comps` and its last component; the root has neither.
    fn parent<'a>(&self, path: &str, comps: &[&'a str]) -> Result<(OwnedFd, &'a str), CoreError> {
        let (last, dirs) = comps
            .split_last()
            .ok_or_else(|| bad("path", "the volume's root itself cannot be used here"))?;
        let dir = self
            .open_dir(dirs)
            .map_err(|e| fs_err(path, "open the directory of", e))?;
        Ok((dir, last))
    }

    fn entry(&self, dir: BorrowedFd<'_>, name: &str, comps: &[&str]) -> Result<VolumeEntry, Errno> {
        let at = if name.is_empty() { "." } else { name };
        let st = rustix::fs::statat(dir, at, AtFlags::SYMLINK_NOFOLLOW)?;
        let kind = kind_of(st.st_mode);
        let target = if kind == EntryKind::Symlink {
            let t = rustix::fs::readlinkat(dir, at, Vec::new())?;
            Some(String::from_utf8_lossy(t.as_bytes()).into_owned())
        } else {
            None
        };
        Ok(VolumeEntry {
            name: name.to_owned(),
            kind,
            path: shown(comps),
            size: st.st_size as u64,
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            atime: (st.st_atime as i64, st.st_atime_nsec as u32),
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as u32),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as u32),
            target,
        })
    }

    /// The entry at `path` (a symlink as itself).
    pub fn stat(&self, path: &str) -> Result<VolumeEntry, CoreError> {
        let comps = components(path)?;
        if comps.is_empty() {
            return self
                .entry(self.root.as_fd(), "", &comps)
                .map_err(|e| fs_err(path, "stat", e));
        }
        let (dir, last) = self.parent(path, &comps)?;
        self.entry(dir.as_fd(), last, &comps)
            .map_err(|e| fs_err(path, "stat", e))
    }

    /// The entries under the directory `path`, `depth` levels deep (1: its own entries),
    /// sorted by path.
    pub fn list(&self, path: &str, depth: u32) -> Result<Vec<VolumeEntry>, CoreError> {
        let comps = components(path)?;
        let dir = self.open_dir(&comps).map_err(|e| fs_err(path, "list", e))?;
        let mut out = Vec::new();
        let owned: Vec<String> = comps.iter().map(|s| (*s).to_owned()).collect();
        self.walk(&dir, &owned, depth.max(1), &mut out)
            .map_err(|e| match e {
                Walk::Fs(e) => fs_err(path, "list", e),
                Walk::TooMany => CoreError::TooLarge(format!(
                    "{path:?} holds more than {MAX_LISTED} entries at that depth: list less deep"
                )),
            })?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn walk(
        &self,
        dir: &OwnedFd,
        at: &[String],
        depth: u32,
        out: &mut Vec<VolumeEntry>,
    ) -> Result<(), Walk> {
        let mut names = Vec::new();
        for e in rustix::fs::Dir::read_from(dir).map_err(Walk::Fs)? {
            let e = e.map_err(Walk::Fs)?;
            let n = e.file_name().to_bytes();
            if n == b"." || n == b".." {
                continue;
            }
            names.push(String::from_utf8_lossy(n).into_owned());
        }
        for n in names {
            if out.len() >= MAX_LISTED {
                return Err(Walk::TooMany);
            }
            let mut p: Vec<&str> = at.iter().map(String::as_str).collect();
            p.push(&n);
            let entry = match self.entry(dir.as_fd(), &n, &p) {
                Ok(e) => e,
                // Removed while listing.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(Walk::Fs(e)),
            };
            let is_dir = entry.kind == EntryKind::Directory;
            out.push(entry);
            if is_dir && depth > 1 {
                let sub = match rustix::fs::openat2(
                    dir,
                    n.as_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                    Mode::empty(),
                    beneath() | ResolveFlags::NO_SYMLINKS,
                ) {
                    Ok(d) => d,
                    Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => continue,
                    Err(e) => return Err(Walk::Fs(e)),
                };
                let mut child: Vec<String> = at.to_vec();
                child.push(n.clone());
                self.walk(&sub, &child, depth - 1, out)?;
            }
        }
        Ok(())
    }

    /// Makes the directory `path` (with `parents`, every missing one on the way, and an
    /// existing directory is no error). Returns it.
    pub fn make_dir(
        &self,
        path: &str,
        meta: EntryMeta,
        parents: bool,
    ) -> Result<VolumeEntry, CoreError> {
        meta.check()?;
        let comps = components(path)?;
        if comps.is_empty() {
            return Err(bad("path", "the volume's root exists"));
        }
        if parents {
            self.make_parents(path, &comps, meta)?;
            return self.stat(path);
        }
        let (dir, last) = self.parent(path, &comps)?;
        self.mkdir_one(dir.as_fd(), last, meta)
            .map_err(|e| fs_err(path, "make directory", e))?;
        self.entry(dir.as_fd(), last, &comps)
            .map_err(|e| fs_err(path, "stat", e))
    }

    /// Makes `name` in `dir` with its owner and mode set.
    fn mkdir_one(&self, dir: BorrowedFd<'_>, name: &str, meta: EntryMeta) -> Result<(), Errno> {
        rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))?;
        let made = rustix::fs::openat2(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            beneath() | ResolveFlags::NO_SYMLINKS,
        )?;
        set_owner_mode(&made, meta, 0o755)
    }

    /// Makes every missing directory of `comps` (all of them).
    fn make_parents(&self, path: &str, comps: &[&str], meta: EntryMeta) -> Result<(), CoreError> {
        let mut dir = self
            .open_dir(&[])
            .map_err(|e| fs_err(path, "open the root of", e))?;
        for c in comps {
            let open = |d: &OwnedFd| {
                rustix::fs::openat2(
                    d,
                    *c,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                    beneath(),
                )
            };
            let next = match open(&dir) {
                Ok(d) => d,
                Err(Errno::NOENT) => {
                    match self.mkdir_one(dir.as_fd(), c, meta) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(fs_err(path, "make directory", e)),
                    }
                    open(&dir).map_err(|e| fs_err(path, "open", e))?
                }
                Err(e) => return Err(fs_err(path, "open", e)),
            };
            dir = next;
        }
        Ok(())
    }

    /// Opens `path` for reading: a regular file (a symlink is followed while it stays
    /// inside).
    pub fn open_file(&self, path: &str) -> Result<(std::fs::File, u64), CoreError> {
        let comps = components(path)?;
        if comps.is_empty() {
            return Err(bad("path", "the volume's root is a directory"));
        }
        let fd = rustix::fs::openat2(
            &self.root,
            comps.join("/").as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
            beneath(),
        )
        .map_err(|e| fs_err(path, "open", e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| fs_err(path, "stat", e))?;
        match kind_of(st.st_mode) {
            EntryKind::File => {}
            EntryKind::Directory => return Err(bad("path", format!("{path:?} is a directory"))),
            _ => return Err(bad("path", format!("{path:?} is not a regular file"))),
        }
        // Back to blocking reads (O_NONBLOCK only kept a fifo from hanging the open).
        let fl = rustix::fs::fcntl_getfl(&fd).map_err(|e| fs_err(path, "open", e))?;
        rustix::fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK).map_err(|e| fs_err(path, "open", e))?;
        Ok((std::fs::File::from(fd), st.st_size as u64))
    }

    /// Starts writing `path` (created, or replaced whole when [`Upload::commit`] runs; with
    /// `parents`, missing directories are made first). An existing file keeps its owner and
    /// mode unless `meta` gives them.
    pub fn start_write(
        self: &std::sync::Arc<Self>,
        path: &str,
        meta: EntryMeta,
        parents: bool,
    ) -> Result<Upload, CoreError> {
        meta.check()?;
        let comps = components(path)?;
        if comps.is_empty() {
            return Err(bad("path", "the volume's root is a directory"));
        }
        if parents {
            self.make_parents(path, &comps[..comps.len() - 1], EntryMeta::default())?;
        }
        let (dir, last) = self.parent(path, &comps)?;
        let mut meta = meta;
        match rustix::fs::statat(&dir, last, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => match kind_of(st.st_mode) {
                EntryKind::Directory => {
                    return Err(bad("path", format!("{path:?} is a directory")))
                }
                EntryKind::File => {
                    meta.uid = meta.uid.or(Some(st.st_uid));
                    meta.gid = meta.gid.or(Some(st.st_gid));
                    meta.mode = meta.mode.or(Some(st.st_mode & 0o7777));
                }
                // A symlink or other entry is replaced by the file, never written through.
                _ => {}
            },
            Err(Errno::NOENT) => {}
            Err(e) => return Err(fs_err(path, "stat", e)),
        }
        let tmp = format!(".rampart-upload-{}", rampart_store::keys::random_hex(8));
        let fd = rustix::fs::openat2(
            &dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
            beneath() | ResolveFlags::NO_SYMLINKS,
        )
        .map_err(|e| fs_err(path, "create", e))?;
        let mut up = Upload {
            file: None,
            dir,
            tmp,
            name: last.to_owned(),
            path: comps.iter().map(|s| (*s).to_owned()).collect(),
            committed: false,
            vol: self.clone(),
        };
        set_owner_mode(&fd, meta, 0o644).map_err(|e| fs_err(path, "set the owner of", e))?;
        up.file = Some(std::fs::File::from(fd));
        Ok(up)
    }

    /// Removes `path` (a directory with everything in it; a symlink as itself).
    pub fn remove(&self, path: &str) -> Result<(), CoreError> {
        let comps = components(path)?;
        if comps.is_empty() {
            return Err(bad("path", "the volume's root cannot be removed"));
        }
        let (dir, last) = self.parent(path, &comps)?;
        remove_at(dir.as_fd(), last).map_err(|e| fs_err(path, "remove", e))
    }

    /// Changes the owner and mode of `path` (a symlink's own owner; it has no mode).
    pub fn set_meta(&self, path: &str, meta: EntryMeta) -> Result<VolumeEntry, CoreError> {
        meta.check()?;
        let comps = components(path)?;
        let (dir, last) = if comps.is_empty() {
            (
                self.open_dir(&[]).map_err(|e| fs_err(path, "open", e))?,
                ".",
            )
        } else {
            self.parent(path, &comps)?
        };
        let st = rustix::fs::statat(&dir, last, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| fs_err(path, "stat", e))?;
        if kind_of(st.st_mode) == EntryKind::Symlink {
            if meta.mode.is_some() {
                return Err(bad(
                    "mode",
                    format!("{path:?} is a symlink, which has no mode"),
                ));
            }
            rustix::fs::chownat(
                &dir,
                last,
                meta.uid.map(rustix::fs::Uid::from_raw_unchecked),
                meta.gid.map(rustix::fs::Gid::from_raw_unchecked),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| fs_err(path, "change the owner of", e))?;
        } else {
            // The entry itself, by an O_PATH descriptor (never through a symlink).
            let fd = rustix::fs::openat2(
                &dir,
                last,
                OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
                beneath() | ResolveFlags::NO_SYMLINKS,
            )
            .map_err(|e| fs_err(path, "open", e))?;
            if meta.uid.is_some() || meta.gid.is_some() {
                rustix::fs::chownat(
                    &fd,
                    "",
                    meta.uid.map(rustix::fs::Uid::from_raw_unchecked),
                    meta.gid.map(rustix::fs::Gid::from_raw_unchecked),
                    AtFlags::EMPTY_PATH,
                )
                .map_err(|e| fs_err(path, "change the owner of", e))?;
            }
            if let Some(m) = meta.mode {
                // chmod through the descriptor's own magic link: exactly this inode.
                let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
                rustix::fs::chmodat(
                    rustix::fs::CWD,
                    link.as_str(),
                    Mode::from_raw_mode(m as _),
                    AtFlags::empty(),
                )
                .map_err(|e| fs_err(path, "change the mode of", e))?;
            }
        }
        let at = if comps.is_empty() { "" } else { last };
        self.entry(dir.as_fd(), at, &comps)
            .map_err(|e| fs_err(path, "stat", e))
    }
}

enum Walk {
    Fs(Errno),
    TooMany,
}

fn set_owner_mode(fd: &OwnedFd, meta: EntryMeta, default_mode: u32) -> Result<(), Errno> {
    rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw_unchecked(
            meta.uid.unwrap_or(DEFAULT_OWNER),
        )),
        Some(rustix::fs::Gid::from_raw_unchecked(
            meta.gid.unwrap_or(DEFAULT_OWNER),
        )),
    )?;
    // After chown (which clears set-id bits).
    rustix::fs::fchmod(
        fd,
        Mode::from_raw_mode(meta.mode.unwrap_or(default_mode) as _),
    )
}

/// Removes `name` in `dir`: a directory depth first, anything else unlinked.
fn remove_at(dir: BorrowedFd<'_>, name: &str) -> Result<(), Errno> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if kind_of(st.st_mode) != EntryKind::Directory {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty());
    }
    let sub = rustix::fs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        beneath() | ResolveFlags::NO_SYMLINKS,
    )?;
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(&sub)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(OsStr::from_bytes(n).to_owned());
        }
    }
    for n in names {
        match remove_at(sub.as_fd(), &n.to_string_lossy()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e),
        }
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
}

impl Upload {
    /// The temporary file to write the content to.
    pub fn file(&mut self) -> &mut std::fs::File {
        self.file
            .as_mut()
            .expect("the upload's file is kept until commit")
    }

    /// Takes the file out (to write it on another thread); give it back with
    /// [`Upload::put_back`] before committing.
    pub fn take_file(&mut self) -> Option<std::fs::File> {
        self.file.take()
    }

    /// Returns the file taken by [`Upload::take_file`].
    pub fn put_back(&mut self, f: std::fs::File) {
        self.file = Some(f);
    }

    /// Flushes the content and renames it over the target. Blocking.
    pub fn commit(mut self) -> Result<VolumeEntry, CoreError> {
        let shown_path = format!("/{}", self.path.join("/"));
        let f = self
            .file
            .take()
            .ok_or_else(|| CoreError::Internal("upload committed without its file".into()))?;
        f.sync_data()
            .map_err(CoreError::failed(format!("flush {shown_path:?}")))?;
        drop(f);
        rustix::fs::renameat(&self.dir, self.tmp.as_str(), &self.dir, self.name.as_str())
            .map_err(|e| fs_err(&shown_path, "write", e))?;
        self.committed = true;
        let comps: Vec<&str> = self.path.iter().map(String::as_str).collect();
        self.vol
            .entry(self.dir.as_fd(), &self.name, &comps)
            .map_err(|e| fs_err(&shown_path, "stat", e))
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.committed {
            let _ = rustix::fs::unlinkat(&self.dir, self.tmp.as_str(), AtFlags::empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside() {
        assert_eq!(components("/a/./b//c").unwrap(), vec!["a", "b", "c"]);
        assert!(components("/").unwrap().is_empty());
        assert!(components("").unwrap().is_empty());
        for p in ["..", "/a/../b", "a/..", "../../etc/passwd", "a\0b"] {
            assert!(components(p).is_err(), "{p:?}");
        }
        assert!(components(&"x".repeat(256)).is_err());
    }

    /// This process's ids (the owner of files it makes).
    fn own_ids() -> (u32, u32) {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata("/proc/self").unwrap();
        (m.uid(), m.gid())
    }

    fn root() -> (tempfile::TempDir, std::sync::Arc<VolumeRoot>) {
        let d = tempfile::tempdir().unwrap();
        let fd = rustix::fs::open(
            d.path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        (d, std::sync::Arc::new(VolumeRoot::new(fd, Busy::default())))
    }

    #[test]
    fn files_round_trip_and_symlinks_out_are_refused() {
        use std::io::{Read, Write};
        let (d, v) = root();
        let uid = own_ids().0;
        let me = EntryMeta {
            uid: Some(uid),
            gid: Some(own_ids().1),
            mode: None,
        };
        let mut up = v.start_write("/a/b/f.txt", me, true).unwrap();
        up.file().write_all(b"hello").unwrap();
        let e = up.commit().unwrap();
        assert_eq!(
            (e.path.as_str(), e.size, e.kind),
            ("/a/b/f.txt", 5, EntryKind::File)
        );
        assert_eq!(e.mode, 0o644);
        let (mut f, n) = v.open_file("a/b/f.txt").unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!((s.as_str(), n), ("hello", 5));
        // An uncommitted upload leaves nothing.
        drop(v.start_write("/a/b/g.txt", me, false).unwrap());
        let names: Vec<String> = v
            .list("/", 3)
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(names, vec!["/a", "/a/b", "/a/b/f.txt"]);
        // A symlink out of the volume is not followed; one inside is.
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(outside.path(), "host").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("abs")).unwrap();
        std::os::unix::fs::symlink("../../..", d.path().join("a/up")).unwrap();
        std::os::unix::fs::symlink("b/f.txt", d.path().join("a/in")).unwrap();
        assert!(matches!(v.open_file("/abs"), Err(CoreError::Forbidden(_))));
        assert!(matches!(v.list("/a/up", 1), Err(CoreError::Forbidden(_))));
        assert!(v.open_file("/a/in").is_ok());
        let s = v.stat("/abs").unwrap();
        assert_eq!(s.kind, EntryKind::Symlink);
        // Writing over a symlink replaces the link, never its target.
        let mut up = v.start_write("/abs", me, false).unwrap();
        up.file().write_all(b"new").unwrap();
        up.commit().unwrap();
        assert_eq!(std::fs::read_to_string(outside.path()).unwrap(), "host");
        assert!(matches!(
            v.set_meta(
                "/a/up",
                EntryMeta {
                    mode: Some(0o600),
                    ..me
                }
            ),
            Err(CoreError::BadRequest { .. })
        ));
        v.remove("/a").unwrap();
        assert!(matches!(v.stat("/a"), Err(CoreError::NotFound(_))));
        assert!(v.remove("/").is_err());
        assert!(matches!(v.make_dir("/x", me, false).map(|_| ()), Ok(())));
        assert!(matches!(
            v.make_dir("/x", me, false),
            Err(CoreError::Conflict(_))
        ));
        assert!(v.make_dir("/x", me, true).is_ok());
        assert!(matches!(
            v.make_dir("/y/z", me, false),
            Err(CoreError::NotFound(_))
        ));
    }
}
