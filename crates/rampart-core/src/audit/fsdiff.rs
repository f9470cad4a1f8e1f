//! The `fs_diff` record: what a sandbox's writable layer holds against its template.
//!
//! A sandbox's root is an overlay: read-only lower directories (the template; the host's
//! `/usr` for `/usr`) under an upper directory on the sandbox's own disk, which receives
//! every change. [`diff_layer`] walks an upper directory and classifies each entry:
//!
//! - a **whiteout** (a character device 0/0) is a path **removed** from the lower layers
//!   (listed with the lower file's size and digest when it was a regular file);
//! - an **opaque directory** (`trusted.overlay.opaque` = `y`) hides everything below it in
//!   the lower layers: the lower entries not present in the upper are **removed**;
//! - any other entry is **changed** if the path exists in a lower layer, else **added**
//!   (directories that exist in both and are not opaque are only walked: a directory that
//!   was merely copied up to hold a changed file is not itself a change);
//! - `trusted.overlay.*` attributes other than `opaque` (redirects, metacopy) are not
//!   interpreted: such an entry is listed as changed.
//!
//! Regular files are listed with their size and SHA-256; directories with size 0; other
//! kinds (symlinks, devices, sockets) with their size and no digest. The walk is bounded by
//! [`DiffLimits`]: beyond `max_entries` entries, or once `max_hash_bytes` bytes were hashed
//! (files past the budget are listed without a digest), the result says `truncated`. It never
//! follows a symbolic link of the layers (they belong to the sandbox).

use rampart_audit::ContentHasher;
use rampart_types::audit::{FsEntry, Hash};
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Bounds of one diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiffLimits {
    /// Most entries listed (added + changed + removed).
    pub max_entries: usize,
    /// Most bytes hashed over all files; files beyond get no digest.
    pub max_hash_bytes: u64,
}

impl Default for DiffLimits {
    /// 10,000 entries, 256 MiB hashed.
    fn default() -> Self {
        DiffLimits {
            max_entries: 10_000,
            max_hash_bytes: 256 << 20,
        }
    }
}

/// The result of [`diff_layer`] (or of several, merged with [`LayerDiff::extend`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerDiff {
    /// Paths that are new.
    pub added: Vec<FsEntry>,
    /// Paths whose content, kind or metadata changed.
    pub changed: Vec<FsEntry>,
    /// Paths of the lower layers that are gone.
    pub removed: Vec<FsEntry>,
    /// The limits cut the walk short, or a file's digest was left out: the lists are not
    /// the whole difference.
    pub truncated: bool,
    /// Bytes hashed.
    pub hashed_bytes: u64,
}

impl LayerDiff {
    fn len(&self) -> usize {
        self.added.len() + self.changed.len() + self.removed.len()
    }
}

/// One layered tree: its upper directory and its lower directories (topmost first),
/// mounted at `mount` inside the sandbox (`/` or `/usr`).
#[derive(Debug, Clone)]
pub struct Layers {
    /// The overlay's upper directory.
    pub upper: PathBuf,
    /// Its lower directories, topmost first.
    pub lowers: Vec<PathBuf>,
    /// Where the overlay is mounted in the sandbox.
    pub mount: String,
}

/// Whether `md` is an overlay whiteout (a character device 0/0).
fn is_whiteout(md: &Metadata) -> bool {
    md.file_type().is_char_device() && md.rdev() == 0
}

/// Whether the directory at `p` is marked opaque (`trusted.overlay.opaque` = `y`).
fn is_opaque(p: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    let mut buf = [0u8; 8];
    // SAFETY: `c` is a NUL-terminated path and `buf` a writable buffer of the length given;
    // lgetxattr does not follow a final symlink and writes at most `buf.len()` bytes.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    n == 1 && buf[0] == b'y'
}

/// `rel` under the lower directory `l` if every directory on the way there is a real
/// directory of that layer. A template's symlink (`/var/run -> /run`) is never followed:
/// overlayfs does not follow it either, and `l.join(rel)` would lead the walk onto the
/// host's own files (a sandbox that replaced `/var/run` by a directory of its own).
fn in_lower(l: &Path, rel: &Path) -> Option<PathBuf> {
    let mut p = l.to_path_buf();
    let mut comps = rel.components().peekable();
    while let Some(c) = comps.next() {
        p.push(c);
        if comps.peek().is_some() && !std::fs::symlink_metadata(&p).ok()?.is_dir() {
            return None;
        }
    }
    Some(p)
}

/// The first lower entry at `rel` (not following any symlink), if any.
fn lower_md(lowers: &[PathBuf], rel: &Path) -> Option<(PathBuf, Metadata)> {
    lowers.iter().find_map(|l| {
        let p = in_lower(l, rel)?;
        std::fs::symlink_metadata(&p).ok().map(|m| (p, m))
    })
}

/// The sandbox path of `rel` under `mount`.
fn sandbox_path(mount: &str, rel: &Path) -> String {
    let rel = rel.to_string_lossy();
    if mount.ends_with('/') {
        format!("{mount}{rel}")
    } else {
        format!("{mount}/{rel}")
    }
}

struct Walk<'a> {
    limits: DiffLimits,
    out: &'a mut LayerDiff,
}

impl Walk<'_> {
    /// Room for one more entry; marks the result truncated when there is none.
    fn room(&mut self) -> bool {
        if self.out.len() >= self.limits.max_entries {
            self.out.truncated = true;
            return false;
        }
        true
    }

    /// The entry of a file at `p` with metadata `md`, hashing a regular file within budget.
    fn entry(&mut self, path: String, p: &Path, md: &Metadata) -> FsEntry {
        if md.is_dir() {
            return FsEntry {
                path,
                size: 0,
                digest: None,
            };
        }
        let digest = if md.file_type().is_file() {
            self.digest(p, md.len())
        } else {
            None
        };
        FsEntry {
            path,
            size: md.len(),
            digest,
        }
    }

    /// SHA-256 of the regular file at `p` (not following a symlink), if the budget allows.
    fn digest(&mut self, p: &Path, len: u64) -> Option<Hash> {
        if self.out.hashed_bytes.saturating_add(len) > self.limits.max_hash_bytes {
            self.out.truncated = true;
            return None;
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(p);
        let Ok(mut f) = f else {
            self.out.truncated = true;
            return None;
        };
        let h = hash_file(&mut f, len);
        match h {
            Some((hash, n)) => {
                self.out.hashed_bytes += n;
                Some(hash)
            }
            None => {
                self.out.truncated = true;
                None
            }
        }
    }

    /// Lists everything under the lower directory `rel` not present in the upper directory
    /// `upper_dir` (an opaque directory hides it) as removed.
    fn hidden(&mut self, mount: &str, lowers: &[PathBuf], rel: &Path, upper_dir: &Path) {
        let mut seen = std::collections::BTreeSet::new();
        let mut stack = vec![rel.to_path_buf()];
        while let Some(d) = stack.pop() {
            for l in lowers {
                let Some(ld) = in_lower(l, &d) else {
                    continue;
                };
                if !std::fs::symlink_metadata(&ld).is_ok_and(|m| m.is_dir()) {
                    continue; // a symlink (or file) in this layer: nothing below it
                }
                let Ok(rd) = std::fs::read_dir(&ld) else {
                    continue;
                };
                let mut names: Vec<_> = rd.flatten().map(|e| e.file_name()).collect();
                names.sort();
                for name in names {
                    let r = d.join(&name);
                    if !seen.insert(r.clone()) {
                        continue;
                    }
                    let rel_to_opaque = r.strip_prefix(rel).unwrap_or(&r);
                    if std::fs::symlink_metadata(upper_dir.join(rel_to_opaque)).is_ok() {
                        continue;
                    }
                    let p = ld.join(&name);
                    let Ok(md) = std::fs::symlink_metadata(&p) else {
                        continue;
                    };
                    if !self.room() {
                        return;
                    }
                    let e = self.entry(sandbox_path(mount, &r), &p, &md);
                    self.out.removed.push(e);
                    if md.is_dir() {
                        stack.push(r);
                    }
                }
            }
        }
    }

    fn walk(&mut self, layers: &Layers) {
        let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
        if is_opaque(&layers.upper) {
            self.hidden(&layers.mount, &layers.lowers, Path::new(""), &layers.upper);
        }
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(layers.upper.join(&d)) else {
                self.out.truncated = true;
                continue;
            };
            let mut names: Vec<std::ffi::OsString> = rd.flatten().map(|e| e.file_name()).collect();
            names.sort();
            // Walk in order: push subdirectories in reverse so they pop in order.
            let mut subdirs = Vec::new();
            for name in names {
                if self.out.truncated && self.out.len() >= self.limits.max_entries {
                    return;
                }
                let rel = d.join(&name);
                let p = layers.upper.join(&rel);
                let Ok(md) = std::fs::symlink_metadata(&p) else {
                    continue;
                };
                let path = sandbox_path(&layers.mount, &rel);
                let lower = lower_md(&layers.lowers, &rel);
                if is_whiteout(&md) {
                    if let Some((lp, lmd)) = lower {
                        if !self.room() {
                            return;
                        }
                        let e = self.entry(path, &lp, &lmd);
                        self.out.removed.push(e);
                        if lmd.is_dir() {
                            self.hidden(&layers.mount, &layers.lowers, &rel, &p);
                        }
                    }
                    continue;
                }
                if md.is_dir() {
                    let opaque = is_opaque(&p);
                    match &lower {
                        Some((_, lmd)) if lmd.is_dir() && !opaque => {}
                        Some((_, lmd)) if lmd.is_dir() => {
                            // Opaque: the directory stays, its lower content is gone.
                            if !self.room() {
                                return;
                            }
                            let e = self.entry(path, &p, &md);
                            self.out.changed.push(e);
                            self.hidden(&layers.mount, &layers.lowers, &rel, &p);
                        }
                        Some(_) => {
                            if !self.room() {
                                return;
                            }
                            let e = self.entry(path, &p, &md);
                            self.out.changed.push(e);
                        }
                        None => {
                            if !self.room() {
                                return;
                            }
                            let e = self.entry(path, &p, &md);
                            self.out.added.push(e);
                        }
                    }
                    subdirs.push(rel);
                    continue;
                }
                if !self.room() {
                    return;
                }
                let e = self.entry(path, &p, &md);
                if lower.is_some() {
                    self.out.changed.push(e);
                } else {
                    self.out.added.push(e);
                }
            }
            stack.extend(subdirs.into_iter().rev());
        }
    }
}

/// SHA-256 of at most `len` bytes of `f` (a file does not grow while it is hashed: the
/// sandbox is stopped or frozen), and the bytes read.
fn hash_file(f: &mut File, len: u64) -> Option<(Hash, u64)> {
    let mut h = ContentHasher::new(0);
    let mut buf = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    loop {
        let r = f.read(&mut buf).ok()?;
        if r == 0 {
            break;
        }
        h.update(&buf[..r]);
        n += r as u64;
        if n > len {
            return None;
        }
    }
    Some((h.finish().0.digest, n))
}

/// The difference of one overlay's upper directory against its lower directories, added to
/// `out` (entries sorted by path within each directory, directories depth first), within
/// `limits` counted over everything `out` already holds.
pub fn diff_layer(layers: &Layers, limits: DiffLimits, out: &mut LayerDiff) {
    let mut w = Walk { limits, out };
    w.walk(layers);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn sha(b: &[u8]) -> Option<Hash> {
        Some(rampart_audit::content_digest(b))
    }

    fn whiteout(p: &Path) -> bool {
        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path; mknod creates a device node there.
        unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, 0) == 0 }
    }

    fn set_opaque(p: &Path) -> bool {
        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path and the value a 1-byte buffer.
        unsafe {
            libc::lsetxattr(
                c.as_ptr(),
                c"trusted.overlay.opaque".as_ptr(),
                b"y".as_ptr().cast(),
                1,
                0,
            ) == 0
        }
    }

    fn names(v: &[FsEntry]) -> Vec<&str> {
        v.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn added_changed_removed_whiteouts_and_opaque_dirs() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper) = (t.path().join("lower"), t.path().join("upper"));
        for d in ["etc", "home/user", "opt/old/deep", "var"] {
            std::fs::create_dir_all(lower.join(d)).unwrap();
        }
        std::fs::write(lower.join("etc/hosts"), "old hosts").unwrap();
        std::fs::write(lower.join("etc/gone"), "bye").unwrap();
        std::fs::write(lower.join("opt/old/a"), "a").unwrap();
        std::fs::write(lower.join("opt/old/deep/b"), "bb").unwrap();
        std::fs::write(lower.join("var/keep"), "k").unwrap();

        for d in ["etc", "home/user/new", "opt/old", "var"] {
            std::fs::create_dir_all(upper.join(d)).unwrap();
        }
        std::fs::write(upper.join("etc/hosts"), "new hosts").unwrap();
        std::fs::write(upper.join("home/user/new/f.txt"), "hello").unwrap();
        symlink("/etc/shadow", upper.join("home/user/link")).unwrap();
        std::fs::write(upper.join("opt/old/c"), "c").unwrap();
        let privileged = whiteout(&upper.join("etc/gone")) && set_opaque(&upper.join("opt/old"));
        if !privileged {
            eprintln!("skipped: making whiteouts and trusted.* attributes needs root");
            return;
        }
        let layers = Layers {
            upper: upper.clone(),
            lowers: vec![lower.clone()],
            mount: "/".into(),
        };
        let mut d = LayerDiff::default();
        diff_layer(&layers, DiffLimits::default(), &mut d);
        assert!(!d.truncated);
        assert_eq!(
            names(&d.added),
            vec![
                "/home/user/link",
                "/home/user/new",
                "/home/user/new/f.txt",
                "/opt/old/c",
            ]
        );
        assert_eq!(names(&d.changed), vec!["/etc/hosts", "/opt/old"]);
        let mut removed = names(&d.removed);
        removed.sort();
        assert_eq!(
            removed,
            vec![
                "/etc/gone",
                "/opt/old/a",
                "/opt/old/deep",
                "/opt/old/deep/b"
            ]
        );
        let f = d
            .added
            .iter()
            .find(|e| e.path == "/home/user/new/f.txt")
            .unwrap();
        assert_eq!((f.size, f.digest), (5, sha(b"hello")));
        let l = d
            .added
            .iter()
            .find(|e| e.path == "/home/user/link")
            .unwrap();
        assert_eq!(l.digest, None, "a symlink is listed, never followed");
        let h = d.changed.iter().find(|e| e.path == "/etc/hosts").unwrap();
        assert_eq!(h.digest, sha(b"new hosts"));
        let g = d.removed.iter().find(|e| e.path == "/etc/gone").unwrap();
        assert_eq!((g.size, g.digest), (3, sha(b"bye")), "the template's file");
        assert_eq!(d.hashed_bytes, 5 + 9 + 1 + 3 + 1 + 2);
    }

    #[test]
    fn a_template_symlink_never_leads_onto_the_host() {
        // The template has `var/run -> <host>/run` (absolute); the sandbox replaced it by a
        // directory of its own holding a file and a whiteout named like the host's files.
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, host) = (
            t.path().join("lower"),
            t.path().join("upper"),
            t.path().join("host"),
        );
        std::fs::create_dir_all(lower.join("var")).unwrap();
        std::fs::create_dir_all(host.join("run/secretdir")).unwrap();
        std::fs::write(host.join("run/secret"), "host secret").unwrap();
        std::fs::write(host.join("run/secretdir/key"), "host key").unwrap();
        symlink(host.join("run"), lower.join("var/run")).unwrap();
        std::fs::create_dir_all(upper.join("var/run")).unwrap();
        std::fs::write(upper.join("var/run/secret"), "mine").unwrap();
        if !whiteout(&upper.join("var/run/secretdir")) {
            eprintln!("skipped: making whiteouts needs root");
            return;
        }
        let mut d = LayerDiff::default();
        diff_layer(
            &Layers {
                upper,
                lowers: vec![lower],
                mount: "/".into(),
            },
            DiffLimits::default(),
            &mut d,
        );
        assert_eq!(names(&d.changed), vec!["/var/run"], "{d:?}");
        assert_eq!(names(&d.added), vec!["/var/run/secret"], "{d:?}");
        assert!(d.removed.is_empty(), "nothing of the host listed: {d:?}");
        assert_eq!(d.hashed_bytes, 4, "no host file hashed");
    }

    #[test]
    fn limits_mark_the_result_truncated() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper) = (t.path().join("lower"), t.path().join("upper"));
        std::fs::create_dir_all(&lower).unwrap();
        std::fs::create_dir_all(upper.join("d")).unwrap();
        for i in 0..10 {
            std::fs::write(upper.join(format!("d/f{i}")), vec![b'x'; 100]).unwrap();
        }
        let layers = Layers {
            upper,
            lowers: vec![lower],
            mount: "/usr".into(),
        };
        let mut d = LayerDiff::default();
        diff_layer(
            &layers,
            DiffLimits {
                max_entries: 4,
                max_hash_bytes: u64::MAX,
            },
            &mut d,
        );
        assert!(d.truncated);
        assert_eq!(d.added.len(), 4);
        assert_eq!(d.added[0].path, "/usr/d");

        let mut d = LayerDiff::default();
        diff_layer(
            &layers,
            DiffLimits {
                max_entries: 100,
                max_hash_bytes: 250,
            },
            &mut d,
        );
        assert!(d.truncated);
        assert_eq!(d.added.len(), 11, "every entry, some without a digest");
        assert_eq!(d.added.iter().filter(|e| e.digest.is_some()).count(), 2);
        assert_eq!(d.hashed_bytes, 200);
    }

    #[test]
    fn an_untouched_layer_is_empty() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper) = (t.path().join("lower"), t.path().join("upper"));
        std::fs::create_dir_all(lower.join("etc")).unwrap();
        std::fs::create_dir_all(&upper).unwrap();
        let mut d = LayerDiff::default();
        diff_layer(
            &Layers {
                upper,
                lowers: vec![lower],
                mount: "/".into(),
            },
            DiffLimits::default(),
            &mut d,
        );
        assert_eq!(d, LayerDiff::default());
    }
}
