//! Artifacts: the files a sandbox was asked (at create, `artifacts`) to leave behind, kept
//! when it ends for any reason and served after it is gone.
//!
//! - **Capture** ([`capture`]). The daemon holds a descriptor of the root of the sandbox's
//!   disk (`Disks::disk_root`: the live sandbox's, or its image mounted detached and
//!   read-only when its init is already gone) and, once nothing of the sandbox runs any more,
//!   walks each path **by descriptor**: every open is `openat2` beneath the layer's directory
//!   with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`,
//!   and `O_NOFOLLOW`, so no symbolic link (at the path, on the way to it, or inside a
//!   directory), `..` or mount leads the daemon out of the sandbox's disk. Only regular
//!   files are kept; symbolic links (never followed), fifos, sockets and devices are counted
//!   as `skipped`. A hard link is an inode of the sandbox's own disk (a link cannot cross
//!   file systems), so it is kept like any file. What is captured is the sandbox's writable
//!   layer (what it wrote or changed under the path): files of the template left unchanged
//!   are the template's (named by `created.template_digest`), and whiteouts (deleted files)
//!   are nothing.
//! - **Bounds** ([`ArtifactLimits`]): most files and most bytes per sandbox; beyond, the
//!   record says `truncated`.
//! - **Store** ([`ArtifactStore`]): `<data>/artifacts/<id>/` (0700) holds `index.json` (what
//!   was kept, when, until when) and `blobs/<sha256>` (0600), content-addressed. A capture
//!   is written under `<id>.partial/` and renamed into place whole. [`ArtifactStore::prune`]
//!   removes what passed its retention.

use crate::CoreError;
use rampart_audit::ContentHasher;
use rampart_types::audit::{ArtifactFile, Artifacts, Hash};
use rampart_types::SandboxId;
use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bounds of one sandbox's artifacts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactLimits {
    /// Most files kept.
    pub max_files: usize,
    /// Most bytes kept (sum of the files' sizes).
    pub max_bytes: u64,
}

impl Default for ArtifactLimits {
    /// 10,000 files, 1 GiB.
    fn default() -> Self {
        ArtifactLimits {
            max_files: 10_000,
            max_bytes: 1 << 30,
        }
    }
}

/// The artifacts configuration (`[artifacts]` of the config file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactConfig {
    /// How long artifacts are kept after their sandbox ended (7 days by default).
    pub retention: Duration,
    /// Bounds per sandbox.
    pub limits: ArtifactLimits,
}

impl Default for ArtifactConfig {
    fn default() -> Self {
        ArtifactConfig {
            retention: Duration::from_secs(7 * 24 * 3600),
            limits: ArtifactLimits::default(),
        }
    }
}

/// Resolution of every open under the sandbox's disk: beneath the directory, no symlink of
/// any kind, no mount crossing.
fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV
}

/// Opens `path` (relative) beneath `dir` with `flags` (plus `O_NOFOLLOW | O_CLOEXEC`).
pub(crate) fn open_beneath(
    dir: BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(
        dir,
        path,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        beneath(),
    )
}

/// Where a kept file's bytes go: written while hashed, named by their digest.
pub(crate) trait BlobSink {
    /// Copies `src` (at most `len` bytes) into a blob; its digest and size.
    fn put(&mut self, src: &mut dyn Read, len: u64) -> std::io::Result<(Hash, u64)>;
}

/// A capture in progress.
struct Capture<'a> {
    limits: ArtifactLimits,
    sink: &'a mut dyn BlobSink,
    out: Artifacts,
    bytes: u64,
    /// Entries looked at (files, directories, others): bounded too, so that a tree of
    /// empty directories cannot make the walk endless.
    visited: usize,
}

impl Capture<'_> {
    fn max_visits(&self) -> usize {
        self.limits.max_files.saturating_mul(4).max(100_000)
    }

    /// Keeps the regular file `name` of the directory `dir` (sandbox path `path`).
    fn file(&mut self, dir: BorrowedFd<'_>, name: &str, path: String) {
        if self.out.files.len() >= self.limits.max_files {
            self.out.truncated = true;
            return;
        }
        let fd = match open_beneath(
            dir,
            name,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
        ) {
            Ok(fd) => fd,
            Err(_) => {
                self.out.skipped += 1;
                return;
            }
        };
        // Checked on the descriptor itself: a regular file, whatever the name was.
        let Ok(st) = rustix::fs::fstat(&fd) else {
            self.out.skipped += 1;
            return;
        };
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            self.out.skipped += 1;
            return;
        }
        let len = st.st_size.max(0) as u64;
        if self.bytes.saturating_add(len) > self.limits.max_bytes {
            self.out.truncated = true;
            return;
        }
        let mut f = File::from(fd);
        match self.sink.put(&mut f, len) {
            Ok((digest, size)) => {
                self.bytes += size;
                self.out.files.push(ArtifactFile {
                    path,
                    size,
                    digest,
                    mode: st.st_mode & 0o7777,
                });
            }
            Err(e) => {
                tracing::warn!("artifact {path}: {e}");
                self.out.skipped += 1;
            }
        }
    }

    /// Walks the directory `fd` (sandbox path `path`), depth first, names in order.
    fn dir(&mut self, fd: OwnedFd, path: &str) {
        let mut stack = vec![(fd, path.to_owned())];
        while let Some((fd, path)) = stack.pop() {
            let Ok(rd) = rustix::fs::Dir::read_from(&fd) else {
                self.out.skipped += 1;
                continue;
            };
            let mut names: Vec<String> = Vec::new();
            for e in rd {
                let Ok(e) = e else {
                    self.out.truncated = true;
                    break;
                };
                let n = e.file_name().to_bytes();
                if n == b"." || n == b".." {
                    continue;
                }
                match std::str::from_utf8(n) {
                    Ok(n) => names.push(n.to_owned()),
                    // A name the record cannot spell (paths are JSON strings).
                    Err(_) => self.out.skipped += 1,
                }
            }
            names.sort();
            let mut subdirs = Vec::new();
            for name in names {
                self.visited += 1;
                if self.visited > self.max_visits() || self.out.files.len() >= self.limits.max_files
                {
                    self.out.truncated = true;
                    return;
                }
                let child = format!("{path}/{name}");
                let Ok(st) =
                    rustix::fs::statat(&fd, name.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                else {
                    self.out.skipped += 1;
                    continue;
                };
                use rustix::fs::FileType as T;
                match T::from_raw_mode(st.st_mode) {
                    T::RegularFile => self.file(fd.as_fd(), &name, child),
                    T::Directory => {
                        match open_beneath(fd.as_fd(), &name, OFlags::RDONLY | OFlags::DIRECTORY) {
                            Ok(d) => subdirs.push((d, child)),
                            Err(_) => self.out.skipped += 1,
                        }
                    }
                    // A whiteout: a file the sandbox deleted, nothing to keep.
                    T::CharacterDevice if st.st_rdev == 0 => {}
                    _ => self.out.skipped += 1,
                }
            }
            stack.extend(subdirs.into_iter().rev());
        }
    }

    /// Captures the sandbox path `p` found at `rel` under the layer directory `layer`.
    fn path(&mut self, layer: BorrowedFd<'_>, rel: &str, p: &str) {
        // O_PATH first: what is there, without opening it (a fifo or a device is not opened).
        let fd = match open_beneath(layer, rel, OFlags::PATH) {
            Ok(fd) => fd,
            // Not in the writable layer: nothing the sandbox wrote there.
            Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::NOTDIR) => return,
            Err(e) => {
                // ELOOP: a symbolic link on the way; EXDEV: a mount; never followed.
                tracing::info!("artifact {p}: not kept ({e})");
                self.out.skipped += 1;
                return;
            }
        };
        let Ok(st) = rustix::fs::fstat(&fd) else {
            self.out.skipped += 1;
            return;
        };
        use rustix::fs::FileType as T;
        match T::from_raw_mode(st.st_mode) {
            T::Directory => match open_beneath(layer, rel, OFlags::RDONLY | OFlags::DIRECTORY) {
                Ok(d) => self.dir(d, p),
                Err(_) => self.out.skipped += 1,
            },
            T::RegularFile => {
                let (parent, name) = match rel.rsplit_once('/') {
                    Some((d, n)) => (Some(d), n),
                    None => (None, rel),
                };
                match parent {
                    None => self.file(layer, name, p.to_owned()),
                    Some(d) => match open_beneath(layer, d, OFlags::PATH | OFlags::DIRECTORY) {
                        Ok(dfd) => self.file(dfd.as_fd(), name, p.to_owned()),
                        Err(_) => self.out.skipped += 1,
                    },
                }
            }
            T::CharacterDevice if st.st_rdev == 0 => {}
            _ => self.out.skipped += 1,
        }
    }
}

/// Where the sandbox path `p` (absolute, checked by `validate::check_artifacts`) lies on a
/// disk root: the layer directory (`upper` for `/`, `usr-upper` for `/usr` when the disk
/// has one) and the path relative to it (empty: the layer's root).
fn layer_of(p: &str, has_usr_upper: bool) -> (&'static str, &str) {
    if has_usr_upper {
        if p == "/usr" {
            return ("usr-upper", "");
        }
        if let Some(rel) = p.strip_prefix("/usr/") {
            return ("usr-upper", rel);
        }
    }
    ("upper", p.trim_start_matches('/'))
}

/// Captures `paths` from the disk root `root` (holding `upper/`, maybe `usr-upper/`) into
/// `sink`, within `limits`. Call it once nothing of the sandbox runs. Blocking.
pub(crate) fn capture(
    root: BorrowedFd<'_>,
    paths: &[String],
    limits: ArtifactLimits,
    sink: &mut dyn BlobSink,
) -> Artifacts {
    let mut c = Capture {
        limits,
        sink,
        out: Artifacts {
            paths: paths.to_vec(),
            files: Vec::new(),
            skipped: 0,
            truncated: false,
        },
        bytes: 0,
        visited: 0,
    };
    let usr = open_beneath(root, "usr-upper", OFlags::PATH | OFlags::DIRECTORY).ok();
    let upper = open_beneath(root, "upper", OFlags::PATH | OFlags::DIRECTORY).ok();
    for p in paths {
        let (layer, rel) = layer_of(p, usr.is_some());
        let dir = if layer == "usr-upper" { &usr } else { &upper };
        let Some(dir) = dir else {
            c.out.truncated = true;
            continue;
        };
        if rel.is_empty() {
            match open_beneath(dir.as_fd(), ".", OFlags::RDONLY | OFlags::DIRECTORY) {
                Ok(d) => c.dir(d, p),
                Err(_) => c.out.skipped += 1,
            }
        } else {
            c.path(dir.as_fd(), rel, p);
        }
    }
    // Paths may nest (`/out` and `/out/a`): one file is listed once.
    c.out.files.sort_by(|a, b| a.path.cmp(&b.path));
    c.out.files.dedup_by(|a, b| a.path == b.path);
    c.out
}

/// How old an unfinished capture (`<id>.partial/`) must be for [`ArtifactStore::prune`] to
/// remove it.
const PARTIAL_MAX_AGE: Duration = Duration::from_secs(3600);

/// What `index.json` of a sandbox's artifacts holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Index {
    /// When they were kept, unix ms.
    pub(crate) kept_at_ms: i64,
    /// When they are removed, unix ms.
    pub(crate) expires_at_ms: i64,
    /// What was kept.
    pub(crate) artifacts: Artifacts,
}

/// The node's kept artifacts: `<data>/artifacts/`.
#[derive(Debug, Clone)]
pub(crate) struct ArtifactStore {
    dir: PathBuf,
    cfg: ArtifactConfig,
}

fn mkdir_private(p: &Path) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(p) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    }
}

/// Writes blobs into `<dir>/blobs/`, each through a temporary file renamed to its digest.
struct DirSink {
    blobs: PathBuf,
    n: u64,
}

impl BlobSink for DirSink {
    fn put(&mut self, src: &mut dyn Read, len: u64) -> std::io::Result<(Hash, u64)> {
        self.n += 1;
        let tmp = self.blobs.join(format!(".tmp{}", self.n));
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)?;
        let mut h = ContentHasher::new(0);
        let mut buf = vec![0u8; 1 << 16];
        let mut src = src.take(len);
        loop {
            let n = match src.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
            };
            h.update(&buf[..n]);
            if let Err(e) = out.write_all(&buf[..n]) {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        }
        let (rec, _) = h.finish();
        std::fs::rename(&tmp, self.blobs.join(rec.digest.to_hex()))?;
        Ok((rec.digest, rec.size))
    }
}

impl ArtifactStore {
    /// The store under the data directory `data_dir`.
    pub(crate) fn new(data_dir: &Path, cfg: ArtifactConfig) -> Self {
        ArtifactStore {
            dir: data_dir.join("artifacts"),
            cfg,
        }
    }

    /// The configuration.
    pub(crate) fn config(&self) -> ArtifactConfig {
        self.cfg
    }

    fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.dir.join(id.as_str())
    }

    /// The directory of sandbox `id`'s kept artifacts.
    pub(crate) fn dir_of(&self, id: &SandboxId) -> PathBuf {
        self.sandbox_dir(id)
    }

    /// Captures `paths` of sandbox `id` from its disk root `root` and keeps them (ended at
    /// `ended_ms`), replacing what an interrupted capture left. Blocking.
    pub(crate) fn keep(
        &self,
        id: &SandboxId,
        root: BorrowedFd<'_>,
        paths: &[String],
        ended_ms: i64,
    ) -> Result<Artifacts, CoreError> {
        let io = |what: &str| {
            let what = format!("{what} (artifacts of sandbox {id})");
            move |e: std::io::Error| CoreError::Io { what, source: e }
        };
        mkdir_private(&self.dir).map_err(io("mkdir artifacts"))?;
        let partial = self.dir.join(format!("{id}.partial"));
        let _ = std::fs::remove_dir_all(&partial);
        mkdir_private(&partial).map_err(io("mkdir"))?;
        let blobs = partial.join("blobs");
        mkdir_private(&blobs).map_err(io("mkdir blobs"))?;
        let mut sink = DirSink { blobs, n: 0 };
        let artifacts = capture(root, paths, self.cfg.limits, &mut sink);
        let index = Index {
            kept_at_ms: ended_ms,
            expires_at_ms: ended_ms
                .saturating_add(i64::try_from(self.cfg.retention.as_millis()).unwrap_or(i64::MAX)),
            artifacts: artifacts.clone(),
        };
        let text = serde_json::to_vec(&index).map_err(CoreError::failed("encoding"))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(partial.join("index.json"))
            .map_err(io("write index"))?;
        f.write_all(&text).map_err(io("write index"))?;
        f.sync_all().map_err(io("sync index"))?;
        let dest = self.sandbox_dir(id);
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::rename(&partial, &dest).map_err(io("rename"))?;
        Ok(artifacts)
    }

    /// The index of sandbox `id`'s artifacts, if kept and not expired.
    pub(crate) fn index(&self, id: &SandboxId) -> Result<Option<Index>, CoreError> {
        let p = self.sandbox_dir(id).join("index.json");
        let text = match std::fs::read(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(CoreError::Io {
                    what: format!("read {}", p.display()),
                    source: e,
                })
            }
        };
        let i: Index =
            serde_json::from_slice(&text).map_err(CoreError::failed(p.display().to_string()))?;
        Ok((i.expires_at_ms > rampart_store::now_ms()).then_some(i))
    }

    /// The blob `digest` of sandbox `id`'s artifacts, opened.
    pub(crate) fn open_blob(&self, id: &SandboxId, digest: &Hash) -> Option<File> {
        File::open(self.sandbox_dir(id).join("blobs").join(digest.to_hex())).ok()
    }

    /// The bytes of blob `digest` of sandbox `id`'s artifacts.
    pub(crate) fn blob(&self, id: &SandboxId, digest: &Hash) -> Option<Vec<u8>> {
        let mut v = Vec::new();
        self.open_blob(id, digest)?.read_to_end(&mut v).ok()?;
        Some(v)
    }

    /// Removes the artifacts whose retention passed (and captures a crash left unfinished
    /// for sandboxes whose artifacts are kept whole). Returns how many sandboxes' went.
    pub(crate) fn prune(&self) -> usize {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let now = rampart_store::now_ms();
        let mut n = 0;
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            // A capture a killed daemon left unfinished: removed once it is surely not
            // running any more (an hour old).
            if let Some(id) = name.strip_suffix(".partial") {
                let stale = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age >= PARTIAL_MAX_AGE);
                if stale && SandboxId::parse(id).is_ok() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
                continue;
            }
            let Ok(id) = SandboxId::parse(name) else {
                continue;
            };
            let expired = match std::fs::read(e.path().join("index.json"))
                .ok()
                .and_then(|t| serde_json::from_slice::<Index>(&t).ok())
            {
                Some(i) => i.expires_at_ms <= now,
                // Unreadable: kept at most the retention past its directory's last change.
                None => e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age >= self.cfg.retention),
            };
            if expired {
                match std::fs::remove_dir_all(e.path()) {
                    Ok(()) => {
                        n += 1;
                        tracing::info!(id = %id, "artifacts removed (retention passed)");
                    }
                    Err(err) => tracing::warn!(id = %id, "removing expired artifacts: {err}"),
                }
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    struct Mem(Vec<(Hash, Vec<u8>)>);
    impl BlobSink for Mem {
        fn put(&mut self, src: &mut dyn Read, len: u64) -> std::io::Result<(Hash, u64)> {
            let mut v = Vec::new();
            src.take(len).read_to_end(&mut v)?;
            let d = rampart_audit::content_digest(&v);
            let n = v.len() as u64;
            self.0.push((d, v));
            Ok((d, n))
        }
    }

    /// A disk root: `upper/` with the sandbox's files.
    fn disk() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let up = t.path().join("upper");
        std::fs::create_dir_all(up.join("home/user/out/sub")).unwrap();
        std::fs::write(up.join("home/user/out/a.txt"), b"alpha").unwrap();
        std::fs::write(up.join("home/user/out/sub/b.bin"), b"beta!").unwrap();
        (t, up)
    }

    fn run(t: &tempfile::TempDir, paths: &[&str], limits: ArtifactLimits) -> (Artifacts, Mem) {
        let root = File::open(t.path()).unwrap();
        let mut m = Mem(Vec::new());
        let paths: Vec<String> = paths.iter().map(|s| s.to_string()).collect();
        let a = capture(root.as_fd(), &paths, limits, &mut m);
        (a, m)
    }

    fn names(a: &Artifacts) -> Vec<&str> {
        a.files.iter().map(|f| f.path.as_str()).collect()
    }

    #[test]
    fn a_directory_is_its_files_with_digests_and_modes() {
        let (t, up) = disk();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            up.join("home/user/out/a.txt"),
            std::fs::Permissions::from_mode(0o751),
        )
        .unwrap();
        let (a, m) = run(&t, &["/home/user/out"], ArtifactLimits::default());
        assert_eq!(
            names(&a),
            ["/home/user/out/a.txt", "/home/user/out/sub/b.bin"]
        );
        assert_eq!(a.files[0].size, 5);
        assert_eq!(a.files[0].digest, rampart_audit::content_digest(b"alpha"));
        assert_eq!(a.files[0].mode, 0o751);
        assert!(!a.truncated);
        assert_eq!(a.skipped, 0);
        assert_eq!(m.0.len(), 2);
        // One file as a path of its own; a path the sandbox never wrote is no file.
        let (a, _) = run(
            &t,
            &["/home/user/out/sub/b.bin", "/nothing/here"],
            ArtifactLimits::default(),
        );
        assert_eq!(names(&a), ["/home/user/out/sub/b.bin"]);
    }

    #[test]
    fn symlinks_never_lead_out_of_the_disk() {
        let (t, up) = disk();
        // The host's secrets, outside the sandbox's disk.
        let host = tempfile::tempdir().unwrap();
        let shadow = host.path().join("shadow");
        std::fs::write(&shadow, b"root:HOSTSECRET").unwrap();
        // A symlink inside the directory, at the artifact path itself, on the way to it,
        // to an absolute and to a relative target, and to /etc/shadow of the host.
        symlink(&shadow, up.join("home/user/out/leak")).unwrap();
        symlink("/etc/shadow", up.join("home/user/out/shadow")).unwrap();
        symlink("../../../../..", up.join("home/user/out/up")).unwrap();
        symlink(&shadow, up.join("home/user/report")).unwrap();
        symlink(host.path(), up.join("home/hostdir")).unwrap();
        let (a, m) = run(
            &t,
            &[
                "/home/user/out",
                "/home/user/report",
                "/home/hostdir/shadow",
                "/home/hostdir",
            ],
            ArtifactLimits::default(),
        );
        assert_eq!(
            names(&a),
            ["/home/user/out/a.txt", "/home/user/out/sub/b.bin"]
        );
        assert_eq!(a.skipped, 6, "{a:?}");
        for (_, bytes) in &m.0 {
            assert!(!bytes.windows(10).any(|w| w == b"HOSTSECRET"));
            assert!(!bytes.starts_with(b"root:"));
        }
    }

    #[test]
    fn hard_links_inside_are_kept_fifos_and_devices_are_skipped() {
        let (t, up) = disk();
        let out = up.join("home/user/out");
        std::fs::hard_link(out.join("a.txt"), out.join("hard")).unwrap();
        let fifo = std::ffi::CString::new(out.join("fifo").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        // A whiteout (0/0 character device) is a deleted file: not kept, not skipped. Making
        // device nodes needs CAP_MKNOD (root), as the tests run.
        let wh = std::ffi::CString::new(out.join("gone").as_os_str().as_encoded_bytes()).unwrap();
        let null = std::ffi::CString::new(out.join("null").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid NUL-terminated paths.
        let dev = unsafe {
            libc::mknod(wh.as_ptr(), libc::S_IFCHR | 0o600, 0) == 0
                && libc::mknod(null.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) == 0
        };
        let (a, _) = run(&t, &["/home/user/out"], ArtifactLimits::default());
        assert_eq!(
            names(&a),
            [
                "/home/user/out/a.txt",
                "/home/user/out/hard",
                "/home/user/out/sub/b.bin"
            ]
        );
        assert_eq!(a.files[1].digest, rampart_audit::content_digest(b"alpha"));
        if dev {
            assert_eq!(a.skipped, 2, "the fifo and /dev/null's twin: {a:?}");
        } else {
            eprintln!("skipping the device-node part: mknod needs CAP_MKNOD");
            assert_eq!(a.skipped, 1, "the fifo: {a:?}");
        }
        // A fifo named as the artifact itself is not opened (that would block).
        let (a, _) = run(&t, &["/home/user/out/fifo"], ArtifactLimits::default());
        assert!(a.files.is_empty());
        assert_eq!(a.skipped, 1);
    }

    #[test]
    fn bounds_cut_the_capture_and_say_so() {
        let (t, _) = disk();
        let (a, m) = run(
            &t,
            &["/home/user/out"],
            ArtifactLimits {
                max_files: 1,
                max_bytes: 1 << 20,
            },
        );
        assert_eq!(names(&a), ["/home/user/out/a.txt"]);
        assert!(a.truncated);
        assert_eq!(m.0.len(), 1);
        let (a, _) = run(
            &t,
            &["/home/user/out"],
            ArtifactLimits {
                max_files: 10,
                max_bytes: 7,
            },
        );
        assert_eq!(a.files.len(), 1);
        assert!(a.truncated);
    }

    #[test]
    fn usr_paths_come_from_usr_upper_when_there_is_one() {
        let (t, _) = disk();
        std::fs::create_dir_all(t.path().join("usr-upper/local")).unwrap();
        std::fs::write(t.path().join("usr-upper/local/x"), b"x").unwrap();
        let (a, _) = run(&t, &["/usr/local", "/usrx"], ArtifactLimits::default());
        assert_eq!(names(&a), ["/usr/local/x"]);
        assert_eq!(layer_of("/usr", true), ("usr-upper", ""));
        assert_eq!(layer_of("/usr/a", false), ("upper", "usr/a"));
        assert_eq!(layer_of("/usrx", true), ("upper", "usrx"));
    }

    #[test]
    fn the_store_keeps_blobs_by_digest_and_prunes_after_retention() {
        let (t, _) = disk();
        let data = tempfile::tempdir().unwrap();
        let mut cfg = ArtifactConfig::default();
        let store = ArtifactStore::new(data.path(), cfg);
        let id = SandboxId::parse("abc123").unwrap();
        let root = File::open(t.path()).unwrap();
        let now = rampart_store::now_ms();
        let a = store
            .keep(&id, root.as_fd(), &["/home/user/out".into()], now)
            .unwrap();
        assert_eq!(a.files.len(), 2);
        let i = store.index(&id).unwrap().unwrap();
        assert_eq!(i.artifacts, a);
        assert_eq!(
            store.blob(&id, &a.files[0].digest).as_deref(),
            Some(&b"alpha"[..])
        );
        use std::os::unix::fs::PermissionsExt;
        let dir = data.path().join("artifacts").join("abc123");
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let blob = dir.join("blobs").join(a.files[0].digest.to_hex());
        assert_eq!(
            std::fs::metadata(blob).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(store.prune(), 0);
        // Kept long ago: expired, not served, then removed.
        cfg.retention = Duration::from_millis(1);
        let store = ArtifactStore::new(data.path(), cfg);
        store
            .keep(&id, root.as_fd(), &["/home/user/out".into()], now - 1000)
            .unwrap();
        assert!(store.index(&id).unwrap().is_none());
        assert_eq!(store.prune(), 1);
        assert!(!dir.exists());
        // An unfinished capture stays while it may still be running, goes when stale.
        let partial = data.path().join("artifacts").join("abc123.partial");
        std::fs::create_dir_all(&partial).unwrap();
        store.prune();
        assert!(partial.exists());
        let old = std::time::SystemTime::now() - PARTIAL_MAX_AGE - Duration::from_secs(1);
        File::open(&partial).unwrap().set_modified(old).unwrap();
        store.prune();
        assert!(!partial.exists());
    }
}
