//! Applying one layer tar into an empty directory, safely, in overlayfs format.
//!
//! Rules (see `docs/templates.md`):
//! - Entry paths are relative to the layer (a leading `/` or `./` is dropped); a `..`
//!   component is refused.
//! - Every directory on the way to an entry is opened with `O_NOFOLLOW` relative to its
//!   parent's fd (openat-style): an entry under a symlink (`link -> /etc`, then
//!   `link/passwd`) is refused, never written through.
//! - Hard link targets are resolved the same way inside the layer and may not contain `..`.
//! - Relative symlink targets that would climb above the root (`../../x` from `a/`) are
//!   refused; absolute targets are kept (they resolve inside the sandbox's root).
//! - `.wh.NAME` becomes an overlayfs whiteout (a 0/0 character device `NAME`);
//!   `.wh..wh..opq` marks its directory opaque (`trusted.overlay.opaque=y`).
//! - Owners and modes (setuid included) are kept as the archive says: root inside is host
//!   root in the layer; the jail's idmapped mounts map them into each sandbox.
//! - An entry that would leave its file system with less than a reserve free (1/20 of its
//!   blocks, at most 256 MiB, and of its inodes, at most 10,000) is refused: a small gzip
//!   layer cannot fill the host's disk.
//! - Device nodes are skipped; `trusted.*` xattrs from the archive are dropped
//!   (they could forge overlayfs metadata); `security.capability` and `user.*` are kept.

use crate::{io, ImageError};
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// Prefix of an OCI whiteout.
pub const WHITEOUT: &str = ".wh.";
/// Name of an OCI opaque-directory marker.
pub const OPAQUE: &str = ".wh..wh..opq";

/// What an extraction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtractStats {
    /// Entries written (files, directories, links).
    pub entries: u64,
    /// Whiteouts made.
    pub whiteouts: u64,
    /// Directories marked opaque.
    pub opaque_dirs: u64,
    /// Entries skipped (device nodes).
    pub skipped: u64,
}

fn refused(path: &str, reason: impl Into<String>) -> ImageError {
    ImageError::Refused {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

fn cstr(s: &[u8], path: &str) -> Result<CString, ImageError> {
    CString::new(s).map_err(|_| refused(path, "contains NUL"))
}

fn last(what: String) -> ImageError {
    ImageError::Io {
        what,
        source: std::io::Error::last_os_error(),
    }
}

/// Splits an archive path into its components, dropping `.`, a leading `/`, refusing `..`.
pub fn components(path: &str) -> Result<Vec<Vec<u8>>, ImageError> {
    let mut out = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err(refused(path, "contains '..'")),
            Component::Normal(n) => out.push(n.as_bytes().to_vec()),
            Component::Prefix(_) => return Err(refused(path, "bad path")),
        }
    }
    Ok(out)
}

/// Whether a relative symlink target at `dir_depth` (components above the link) climbs
/// above the root.
fn symlink_escapes(dir_depth: usize, target: &[u8]) -> bool {
    if target.starts_with(b"/") {
        return false;
    }
    let mut depth = dir_depth as i64;
    for c in target.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            _ => depth += 1,
        }
    }
    false
}

/// An open directory.
struct Dir(OwnedFd);

impl Dir {
    fn open(p: &Path) -> Result<Dir, ImageError> {
        let c = cstr(p.as_os_str().as_bytes(), &p.display().to_string())?;
        // SAFETY: valid C string; the fd returned is owned by the new Dir.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(last(format!("open {}", p.display())));
        }
        // SAFETY: `fd` was just returned by open and is owned by nobody else.
        Ok(Dir(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Opens child directory `name`, never following a symlink. `Ok(None)` if missing.
    fn child(&self, name: &CString) -> std::io::Result<Option<Dir>> {
        // SAFETY: valid dirfd and C string; the fd returned is owned by the new Dir.
        let fd = unsafe {
            libc::openat(
                self.0.as_raw_fd(),
                name.as_ptr(),
                libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::ENOENT) {
                Ok(None)
            } else {
                Err(e)
            };
        }
        // SAFETY: `fd` was just returned by openat and is owned by nobody else.
        Ok(Some(Dir(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    fn fd(&self) -> libc::c_int {
        self.0.as_raw_fd()
    }
}

/// Walks to the parent directory of `comps` (creating missing directories 0755 root, the mode
/// set explicitly rather than left to the umask),
/// refusing any component that is not a real directory.
fn walk(root: &Dir, comps: &[Vec<u8>], path: &str) -> Result<Dir, ImageError> {
    let mut cur = Dir(root.0.try_clone().map_err(io("dup layer directory fd"))?);
    for c in comps {
        let name = cstr(c, path)?;
        match cur.child(&name) {
            Ok(Some(d)) => cur = d,
            Ok(None) => {
                // SAFETY: valid dirfd and C string.
                let rc = unsafe { libc::mkdirat(cur.fd(), name.as_ptr(), 0o755) };
                if rc != 0 {
                    return Err(last(format!("mkdir parent of {path}")));
                }
                // 0755 whatever the umask (the daemon's is 0077): sandboxes walk it as any
                // user. Not a symlink: mkdirat just made it.
                // SAFETY: valid dirfd and C string.
                let rc = unsafe { libc::fchmodat(cur.fd(), name.as_ptr(), 0o755, 0) };
                if rc != 0 {
                    return Err(last(format!("chmod parent of {path}")));
                }
                cur = cur
                    .child(&name)
                    .map_err(io(format!("open parent of {path}")))?
                    .ok_or_else(|| refused(path, "parent vanished"))?;
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                return Err(refused(
                    path,
                    "a parent is a symlink or not a directory (would write through it)",
                ));
            }
            Err(e) => return Err(io(format!("open parent of {path}"))(e)),
        }
    }
    Ok(cur)
}

/// Removes whatever is at `name` in `dir` (a non-directory, or an empty directory).
fn remove_existing(dir: &Dir, name: &CString, keep_dir: bool) {
    // SAFETY: valid dirfd and C string; fstatat into a zeroed stat.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstatat(dir.fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) != 0 {
            return;
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            if !keep_dir {
                libc::unlinkat(dir.fd(), name.as_ptr(), libc::AT_REMOVEDIR);
            }
        } else {
            libc::unlinkat(dir.fd(), name.as_ptr(), 0);
        }
    }
}

fn set_owner_mode(
    dir: &Dir,
    name: &CString,
    uid: u64,
    gid: u64,
    mode: Option<u32>,
    path: &str,
) -> Result<(), ImageError> {
    let (uid, gid) = (
        u32::try_from(uid).map_err(|_| refused(path, "uid out of range"))?,
        u32::try_from(gid).map_err(|_| refused(path, "gid out of range"))?,
    );
    // SAFETY: valid dirfd and C string.
    let rc =
        unsafe { libc::fchownat(dir.fd(), name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) };
    if rc != 0 {
        return Err(last(format!("chown {path}")));
    }
    if let Some(m) = mode {
        // SAFETY: valid dirfd and C string; not a symlink (callers pass None for those).
        let rc = unsafe { libc::fchmodat(dir.fd(), name.as_ptr(), m & 0o7777, 0) };
        if rc != 0 {
            return Err(last(format!("chmod {path}")));
        }
    }
    Ok(())
}

fn set_mtime(dir: &Dir, name: &CString, mtime: u64) {
    let ts = libc::timespec {
        tv_sec: mtime.min(i64::MAX as u64) as libc::time_t,
        tv_nsec: 0,
    };
    let times = [ts, ts];
    // SAFETY: valid dirfd, C string and a 2-element timespec array.
    unsafe {
        libc::utimensat(
            dir.fd(),
            name.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        );
    }
}

/// Sets an xattr on `name` in `dir` without following symlinks.
fn set_xattr(
    dir: &Dir,
    name: &CString,
    key: &str,
    value: &[u8],
    path: &str,
) -> Result<(), ImageError> {
    let p = format!("/proc/self/fd/{}", dir.fd());
    let mut full = p.into_bytes();
    full.push(b'/');
    full.extend_from_slice(name.as_bytes());
    let full = cstr(&full, path)?;
    let k = cstr(key.as_bytes(), path)?;
    // SAFETY: valid C strings and a buffer of the given length.
    let rc = unsafe {
        libc::lsetxattr(
            full.as_ptr(),
            k.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc != 0 {
        return Err(last(format!("set {key} on {path}")));
    }
    Ok(())
}

/// Whether the file system of `dir` keeps room for `bytes` more and one more inode beyond
/// a reserve (1/20 of its size, at most 256 MiB; 1/20 of its inodes, at most 10,000):
/// a layer (a small gzip can expand a thousandfold) never fills the host's disk.
fn has_room(dir: &Dir, bytes: u64) -> bool {
    fd_has_room(dir.fd(), bytes)
}

/// [`has_room`] of the file system of the open file `fd`.
pub(crate) fn fd_has_room(fd: libc::c_int, bytes: u64) -> bool {
    // SAFETY: fstatvfs fills the zeroed struct for a valid fd.
    let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open (the caller holds it) and the pointer is to a statvfs we own.
    if unsafe { libc::fstatvfs(fd, &mut v) } != 0 {
        return true; // no answer: the write itself will fail on a full disk
    }
    let unit = v.f_frsize as u64;
    let avail = (v.f_bavail as u64).saturating_mul(unit);
    let reserve = ((v.f_blocks as u64).saturating_mul(unit) / 20).min(256 << 20);
    let inode_reserve = (v.f_files as u64 / 20).min(10_000);
    avail >= bytes.saturating_add(reserve) && (v.f_files == 0 || v.f_favail as u64 > inode_reserve)
}

/// Reads a stream that may be gzip-compressed (detected from its first bytes).
pub fn decompressed<'a, R: Read + 'a>(mut r: R) -> Result<Box<dyn Read + 'a>, ImageError> {
    let mut head = [0u8; 4];
    let mut n = 0;
    while n < 4 {
        let k = r.read(&mut head[n..]).map_err(io("read layer"))?;
        if k == 0 {
            break;
        }
        n += k;
    }
    let chained = std::io::Cursor::new(head[..n].to_vec()).chain(r);
    if n >= 2 && head[..2] == [0x1f, 0x8b] {
        Ok(Box::new(flate2::read::GzDecoder::new(chained)))
    } else if n == 4 && head == [0x28, 0xb5, 0x2f, 0xfd] {
        Err(ImageError::Oci(
            "zstd-compressed layers are not supported (gzip or uncompressed only)".into(),
        ))
    } else {
        Ok(Box::new(chained))
    }
}

/// Applies the layer tar `r` (gzip or plain) into `dest` (an existing, empty directory).
/// On error `dest` may hold part of the layer: callers extract into a temporary directory.
pub fn apply_layer<R: Read>(r: R, dest: &Path) -> Result<ExtractStats, ImageError> {
    let root = Dir::open(dest)?;
    let mut ar = tar::Archive::new(decompressed(r)?);
    let mut st = ExtractStats::default();
    let entries = ar.entries().map_err(io("read layer tar"))?;
    for e in entries {
        let mut e = e.map_err(io("read layer tar entry"))?;
        let raw = e.path_bytes().into_owned();
        let path = String::from_utf8_lossy(&raw).into_owned();
        let comps = components(&path)?;
        let Some((last_c, parents)) = comps.split_last() else {
            continue; // the root itself ("./")
        };
        let hdr = e.header().clone();
        let kind = hdr.entry_type();
        let base = last_c.clone();
        if !has_room(&root, e.size()) {
            return Err(refused(
                &path,
                format!(
                    "not enough space left for its {} bytes (a reserve is kept free)",
                    e.size()
                ),
            ));
        }
        let dir = walk(&root, parents, &path)?;
        // Whiteouts.
        if base == OPAQUE.as_bytes() {
            set_xattr_dir(&dir, &path)?;
            st.opaque_dirs += 1;
            continue;
        }
        if let Some(hidden) = base.strip_prefix(WHITEOUT.as_bytes()) {
            if hidden.is_empty() || hidden == b"." || hidden == b".." {
                return Err(refused(&path, "bad whiteout name"));
            }
            let name = cstr(hidden, &path)?;
            remove_existing(&dir, &name, false);
            // SAFETY: valid dirfd and C string; makedev(0, 0) is overlayfs's whiteout.
            let rc = unsafe { libc::mknodat(dir.fd(), name.as_ptr(), libc::S_IFCHR, 0) };
            if rc != 0 {
                return Err(last(format!("whiteout {path}")));
            }
            st.whiteouts += 1;
            continue;
        }
        let name = cstr(&base, &path)?;
        let mode = hdr.mode().map_err(io(format!("mode of {path}")))?;
        let uid = hdr.uid().map_err(io(format!("uid of {path}")))?;
        let gid = hdr.gid().map_err(io(format!("gid of {path}")))?;
        let mtime = hdr.mtime().unwrap_or(0);
        let mut xattrs: Vec<(String, Vec<u8>)> = Vec::new();
        if let Ok(Some(px)) = e.pax_extensions() {
            for x in px.flatten() {
                if let (Ok(k), v) = (x.key(), x.value_bytes()) {
                    if let Some(attr) = k.strip_prefix("SCHILY.xattr.") {
                        if attr == "security.capability" || attr.starts_with("user.") {
                            xattrs.push((attr.to_owned(), v.to_vec()));
                        }
                    }
                }
            }
        }
        use tar::EntryType as T;
        match kind {
            T::Directory => {
                remove_existing(&dir, &name, true);
                // SAFETY: valid dirfd and C string.
                let rc = unsafe { libc::mkdirat(dir.fd(), name.as_ptr(), 0o700) };
                if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                    return Err(last(format!("mkdir {path}")));
                }
                // It must be a real directory now (not a symlink someone planted).
                dir.child(&name)
                    .map_err(|_| refused(&path, "exists and is not a directory"))?
                    .ok_or_else(|| refused(&path, "directory vanished"))?;
                set_owner_mode(&dir, &name, uid, gid, Some(mode), &path)?;
            }
            T::Regular | T::Continuous | T::GNUSparse => {
                remove_existing(&dir, &name, false);
                // SAFETY: valid dirfd and C string; O_EXCL|O_NOFOLLOW never opens an
                // existing file or follows a link.
                let fd = unsafe {
                    libc::openat(
                        dir.fd(),
                        name.as_ptr(),
                        libc::O_CREAT
                            | libc::O_EXCL
                            | libc::O_WRONLY
                            | libc::O_NOFOLLOW
                            | libc::O_CLOEXEC,
                        0o600,
                    )
                };
                if fd < 0 {
                    return Err(last(format!("create {path}")));
                }
                // SAFETY: `fd` was just returned by openat and is owned by nobody else.
                let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                std::io::copy(&mut e, &mut f).map_err(io(format!("write {path}")))?;
                drop(f);
                set_owner_mode(&dir, &name, uid, gid, Some(mode), &path)?;
                for (k, v) in &xattrs {
                    set_xattr(&dir, &name, k, v, &path)?;
                }
                set_mtime(&dir, &name, mtime);
            }
            T::Symlink => {
                let target = e
                    .link_name_bytes()
                    .ok_or_else(|| refused(&path, "symlink without a target"))?
                    .into_owned();
                if target.is_empty() {
                    return Err(refused(&path, "symlink with an empty target"));
                }
                if symlink_escapes(parents.len(), &target) {
                    return Err(refused(
                        &path,
                        format!(
                            "symlink target {:?} climbs above the root",
                            String::from_utf8_lossy(&target)
                        ),
                    ));
                }
                let t = cstr(&target, &path)?;
                remove_existing(&dir, &name, false);
                // SAFETY: valid C strings and dirfd.
                let rc = unsafe { libc::symlinkat(t.as_ptr(), dir.fd(), name.as_ptr()) };
                if rc != 0 {
                    return Err(last(format!("symlink {path}")));
                }
                set_owner_mode(&dir, &name, uid, gid, None, &path)?;
                set_mtime(&dir, &name, mtime);
            }
            T::Link => {
                let target = e
                    .link_name_bytes()
                    .ok_or_else(|| refused(&path, "hard link without a target"))?
                    .into_owned();
                let tpath = String::from_utf8_lossy(&target).into_owned();
                let tcomps = components(&tpath)
                    .map_err(|_| refused(&path, format!("hard link target {tpath:?} escapes")))?;
                let Some((tlast, tparents)) = tcomps.split_last() else {
                    return Err(refused(&path, "hard link to the root"));
                };
                let tdir = walk(&root, tparents, &path)?;
                let tname = cstr(tlast, &path)?;
                remove_existing(&dir, &name, false);
                // SAFETY: valid dirfds and C strings; flags 0 = never follow a symlink.
                let rc =
                    unsafe { libc::linkat(tdir.fd(), tname.as_ptr(), dir.fd(), name.as_ptr(), 0) };
                if rc != 0 {
                    return Err(last(format!("hard link {path} -> {tpath}")));
                }
            }
            T::Fifo => {
                remove_existing(&dir, &name, false);
                // SAFETY: valid dirfd and C string.
                let rc =
                    unsafe { libc::mknodat(dir.fd(), name.as_ptr(), libc::S_IFIFO | 0o600, 0) };
                if rc != 0 {
                    return Err(last(format!("mkfifo {path}")));
                }
                set_owner_mode(&dir, &name, uid, gid, Some(mode), &path)?;
            }
            T::Char | T::Block => {
                st.skipped += 1;
                continue;
            }
            // pax/GNU headers are consumed by the tar reader; anything else is skipped.
            _ => {
                st.skipped += 1;
                continue;
            }
        }
        st.entries += 1;
    }
    Ok(st)
}

fn set_xattr_dir(dir: &Dir, path: &str) -> Result<(), ImageError> {
    let k = cstr(b"trusted.overlay.opaque", path)?;
    // SAFETY: valid fd, C string and a 1-byte buffer.
    let rc = unsafe { libc::fsetxattr(dir.fd(), k.as_ptr(), b"y".as_ptr().cast(), 1, 0) };
    if rc != 0 {
        return Err(last(format!("mark {path} opaque")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_symlinks_are_detected() {
        assert!(symlink_escapes(0, b"../x"));
        assert!(symlink_escapes(1, b"../../x"));
        assert!(!symlink_escapes(1, b"../x"));
        assert!(!symlink_escapes(0, b"/etc/passwd"));
        assert!(!symlink_escapes(2, b"a/../../b"));
    }

    #[test]
    fn components_refuse_dotdot() {
        assert_eq!(
            components("./a/b").unwrap(),
            vec![b"a".to_vec(), b"b".to_vec()]
        );
        assert_eq!(components("/a").unwrap(), vec![b"a".to_vec()]);
        assert!(components("a/../../b").is_err());
    }
}
