//! The copy-on-write store: where sandbox disks, snapshots and volumes live, so that a
//! snapshot or a fork is a reflink (`FICLONE`: shared extents, no data copied) instead of a
//! copy.
//!
//! At start [`Store::open`] decides, in this order:
//! 1. `RAMPART_STORE=off`: no store; everything stays under `<data>` and clones are sparse
//!    copies ([`StoreKind::Copy`]).
//! 2. `<data>` itself supports `FICLONE` (XFS with reflink, btrfs, ...): the store is `<data>`
//!    ([`StoreKind::Native`]).
//! 3. Otherwise a sparse XFS image `<data>/store.img` (made once with `mkfs.xfs -m
//!    reflink=1`, [`DEFAULT_STORE_GIB`] GiB virtual, `RAMPART_STORE_GIB` to change it; only
//!    written blocks take host space) is loop-mounted at `<data>/store` in the host's mount
//!    table ([`StoreKind::Image`]). Idempotent: a store already mounted there is reused; a loop
//!    device still attached to the image (sandboxes of a previous run keep it mounted in their
//!    own mount namespaces) is mounted again rather than a second loop device attached, since
//!    two loop devices over one XFS image would be two writers of one filesystem.
//! 4. `mkfs.xfs` missing or the mount refused: like 1, with a warning.
//!
//! Layout under the store's root: `sandboxes/<id>/` (each sandbox's directory with its
//! `disk.img`), `cache/` (pre-formatted empty disk images), `snapshots/<name>/disk.img`,
//! `volumes/<name>.img`.

use crate::{sys, JailError};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Default virtual size of `<data>/store.img`, GiB (sparse: only written blocks use space).
pub const DEFAULT_STORE_GIB: u64 = 256;
/// Environment variable overriding [`DEFAULT_STORE_GIB`].
pub const STORE_GIB_ENV: &str = "RAMPART_STORE_GIB";
/// Environment variable: `off` disables the store (clones become sparse copies).
pub const STORE_ENV: &str = "RAMPART_STORE";

/// `FICLONE` = `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

/// What kind of store the daemon runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// `<data>` supports reflinks itself.
    Native,
    /// A loop-mounted XFS image at `<data>/store`.
    Image,
    /// No reflinks: clones are sparse copies.
    Copy,
}

impl StoreKind {
    /// Short name for logs and docs.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Native => "native-reflink",
            StoreKind::Image => "xfs-image",
            StoreKind::Copy => "copy",
        }
    }
}

/// The store.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    kind: StoreKind,
}

fn io(step: String) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Sys { step, source }
}

impl Store {
    /// Opens (making or mounting it if needed) the store of the data directory `data`.
    /// Never fails for want of reflinks: it falls back to [`StoreKind::Copy`].
    pub fn open(data: &Path) -> Result<Store, JailError> {
        std::fs::create_dir_all(data).map_err(io(format!("mkdir {}", data.display())))?;
        let off = std::env::var(STORE_ENV).is_ok_and(|v| v.trim() == "off");
        let store = if off {
            Store::copy(data)
        } else if reflink_works(data) {
            Store {
                root: data.to_path_buf(),
                kind: StoreKind::Native,
            }
        } else {
            match mount_image(data) {
                Ok(root) => Store {
                    root,
                    kind: StoreKind::Image,
                },
                Err(e) => {
                    tracing::warn!(
                        "no copy-on-write store ({e}); snapshots and forks will copy disk images"
                    );
                    Store::copy(data)
                }
            }
        };
        for d in ["sandboxes", "cache", "snapshots", "volumes"] {
            let p = store.root.join(d);
            std::fs::create_dir_all(&p).map_err(io(format!("mkdir {}", p.display())))?;
        }
        if store.kind == StoreKind::Image {
            // What sandboxes destroyed since the last run freed, then every TRIM_EVERY (the
            // disks of destroyed sandboxes are freed a moment after their last process).
            trim(&store.root);
            let root = store.root.clone();
            let spawned = std::thread::Builder::new()
                .name("rampart-store-trim".into())
                .spawn(move || loop {
                    std::thread::sleep(TRIM_EVERY);
                    trim(&root);
                });
            if let Err(e) = spawned {
                tracing::warn!("cannot start the store's trim thread: {e}");
            }
        }
        tracing::info!(kind = store.kind.as_str(), root = %store.root.display(), "store");
        Ok(store)
    }

    fn copy(data: &Path) -> Store {
        Store {
            root: data.to_path_buf(),
            kind: StoreKind::Copy,
        }
    }

    /// Its root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// Its kind.
    pub fn kind(&self) -> StoreKind {
        self.kind
    }
    /// Whether clones are reflinks.
    pub fn reflinks(&self) -> bool {
        self.kind != StoreKind::Copy
    }
    /// `sandboxes/`: the jail's state directory.
    pub fn sandboxes_dir(&self) -> PathBuf {
        self.root.join("sandboxes")
    }
    /// `snapshots/`.
    pub fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }
    /// `volumes/`.
    pub fn volumes_dir(&self) -> PathBuf {
        self.root.join("volumes")
    }
}

/// Makes `dst` (which must not exist) a copy of `src`: a reflink when the filesystem can,
/// else a sparse copy. On error `dst` does not exist.
pub fn clone_file(src: &Path, dst: &Path) -> Result<(), JailError> {
    let s = File::open(src).map_err(io(format!("open {}", src.display())))?;
    let d = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(io(format!("create {}", dst.display())))?;
    // SAFETY: FICLONE takes the source fd as its argument; both fds are open.
    let rc = unsafe { libc::ioctl(d.as_raw_fd(), FICLONE as _, s.as_raw_fd()) };
    if rc == 0 {
        return Ok(());
    }
    // No reflink here: a sparse copy into the file just made.
    crate::disk::sparse_copy_fd(&s, &d, src, dst).inspect_err(|_| {
        let _ = std::fs::remove_file(dst);
    })
}

/// How often the XFS image store gives freed space back to the host.
pub const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

/// `FITRIM` = `_IOWR('X', 121, struct fstrim_range)`.
const FITRIM: libc::c_ulong = 0xC018_5879;

/// Gives the free space of the filesystem holding `dir` back to what is under it (for the
/// XFS image store: holes in `store.img` again). Online discard covers plain deletions; blocks
/// freed when the last of several reflinks goes are not always discarded at once, so the
/// daemon trims after removing snapshots and volumes and at start. Errors are ignored
/// (a filesystem without discard support has nothing to give back).
pub fn trim(dir: &Path) {
    let Ok(f) = File::open(dir) else {
        return;
    };
    let mut range = [0u64, u64::MAX, 0u64];
    // SAFETY: FITRIM reads and updates a struct fstrim_range (three u64) we own.
    let _ = unsafe { libc::ioctl(f.as_raw_fd(), FITRIM as _, range.as_mut_ptr()) };
}

/// Whether `FICLONE` works in directory `dir`.
pub fn reflink_works(dir: &Path) -> bool {
    let a = dir.join(format!(".reflink-probe-{}-a", std::process::id()));
    let b = dir.join(format!(".reflink-probe-{}-b", std::process::id()));
    let ok = (|| -> std::io::Result<bool> {
        // FICLONE needs its source open for reading.
        let mut fa = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&a)?;
        std::io::Write::write_all(&mut fa, &[0u8; 4096])?;
        fa.sync_all()?;
        let fb = File::create(&b)?;
        // SAFETY: FICLONE with two open fds.
        Ok(unsafe { libc::ioctl(fb.as_raw_fd(), FICLONE as _, fa.as_raw_fd()) } == 0)
    })()
    .unwrap_or(false);
    let _ = std::fs::remove_file(&a);
    let _ = std::fs::remove_file(&b);
    ok
}

/// The mount at exactly `path` in this process's mount table: (fstype, source).
fn mounted_at(path: &Path) -> Option<(String, String)> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.to_string_lossy();
    mi.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-")?;
        if f.get(4)? != &want {
            return None;
        }
        Some((f.get(sep + 1)?.to_string(), f.get(sep + 2)?.to_string()))
    })
}

/// The loop devices attached to `image`: by its device and inode (`LOOP_GET_STATUS64`),
/// which still match when the path the loop device shows no longer does (a store that was
/// unmounted and mounted again shows its files under the old, detached mount).
pub fn loops_of(image: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(image) else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        // Attached devices only (an unattached one has no backing_file).
        .filter(|e| e.path().join("loop/backing_file").exists())
        .map(|e| PathBuf::from("/dev").join(e.file_name()))
        .filter(|d| sys::loop_backing_inode(d) == Some((m.dev(), m.ino())))
        .collect()
}

fn store_gib() -> u64 {
    std::env::var(STORE_GIB_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|g| (1..=1 << 20).contains(g))
        .unwrap_or(DEFAULT_STORE_GIB)
}

/// Makes (once) and mounts `<data>/store.img` at `<data>/store`; returns the mount point.
fn mount_image(data: &Path) -> Result<PathBuf, JailError> {
    let mnt = data.join("store");
    let image = data.join("store.img");
    std::fs::create_dir_all(&mnt).map_err(io(format!("mkdir {}", mnt.display())))?;
    if let Some((fstype, _)) = mounted_at(&mnt) {
        if fstype == "xfs" && reflink_works(&mnt) {
            return Ok(mnt);
        }
        return Err(JailError::Init(format!(
            "{} is mounted ({fstype}) but is not a reflink store",
            mnt.display()
        )));
    }
    if !image.exists() {
        make_image(&image)?;
    }
    // Reuse the loop device a previous run attached (sandboxes may still have it mounted):
    // mounting the same block device again shares its one superblock.
    let existing = loops_of(&image).into_iter().next();
    let (dev, hold) = match existing {
        Some(d) => (d.to_string_lossy().into_owned(), None),
        None => {
            let (d, fd) = sys::loop_attach(&image)?;
            (d, Some(fd))
        }
    };
    let r = sys::mount(
        Some(&dev),
        &mnt,
        Some("xfs"),
        libc::MS_NOATIME | libc::MS_NODEV | libc::MS_NOSUID,
        // Freed blocks (a removed snapshot, sandbox or volume) become holes in store.img
        // again instead of host space kept for ever.
        Some("discard"),
    );
    drop(hold); // autoclear: the loop device now lives as long as the mount
    r?;
    if !reflink_works(&mnt) {
        let _ = sys::umount2(&mnt, libc::MNT_DETACH);
        return Err(JailError::Init(format!(
            "{} has no reflink support",
            image.display()
        )));
    }
    Ok(mnt)
}

fn make_image(image: &Path) -> Result<(), JailError> {
    let tmp = image.with_extension(format!("img.{}.tmp", std::process::id()));
    let r = (|| {
        let f = File::create(&tmp).map_err(io(format!("create {}", tmp.display())))?;
        f.set_len(store_gib() << 30)
            .map_err(io(format!("size {}", tmp.display())))?;
        drop(f);
        let out = Command::new("mkfs.xfs")
            // The smallest log mkfs.xfs allows (64 MiB): the part of a sparse store written at once.
            .args(["-q", "-m", "reflink=1", "-l", "size=64m", "-K"])
            .arg(&tmp)
            .output()
            .map_err(io("run mkfs.xfs (install xfsprogs)".into()))?;
        if !out.status.success() {
            return Err(JailError::Init(format!(
                "mkfs.xfs: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        std::fs::rename(&tmp, image).map_err(io(format!("rename {}", image.display())))
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}
