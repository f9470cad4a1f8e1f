//! Persistence in the namespace tier: consistent copies of a sandbox's disk (snapshots,
//! fork), launches from such a copy, the host's access to a running sandbox's writable
//! layer, and volumes.
//!
//! - **Upper-layer access.** The jailer opens the root directory of the sandbox's ext4 disk
//!   (which holds `upper/` and `usr-upper/`, the writable layers of `/` and `/usr`, and their
//!   overlay work directories) before it clones PID 1; PID 1 keeps that descriptor across
//!   `pivot_root` and the exec of the agent (`RAMPART_DISK_FD`; the agent marks it
//!   close-on-exec at once and never uses it; it is non-dumpable, so nothing in the sandbox
//!   can reach it through `/proc/1/fd`). [`Jail::upper_root`] reopens it from the host as
//!   `/proc/<pid1>/fd/<n>`: a descriptor of the disk's root, which also pins the filesystem
//!   while it is open.
//! - **Consistent point.** [`Jail::snapshot_disk`] freezes the sandbox's cgroup (unless it is
//!   paused already), `syncfs`es its disk through that descriptor (every dirty page of the
//!   ext4 reaches the image file), clones the image (`FICLONE` on the store, else a sparse
//!   copy) and thaws.
//! - **Ids.** Files on a sandbox's disk carry host ids of the sandbox's own uid range. A
//!   launch from another sandbox's disk gives the jailer `shift_uids_from`: before anything
//!   runs it moves every owner in the old range to the same offset of the new one (keeping
//!   set-id bits and file capabilities, whose v3 root id is moved too). Cost: one `lchown` per
//!   file of the writable layers. POSIX ACL entries naming uids are not moved.
//! - **Volumes.** A volume is an ext4 image `<store>/volumes/<name>.img` (its size is the
//!   quota: a full volume gives ENOSPC) with its root owned by 1000:1000. It is attached to at
//!   most one loop device at a time, shared by every sandbox that mounts it (mounting one
//!   block device again shares its superblock; two loop devices over one image would be two
//!   writers of one filesystem). The jailer mounts it in its private mount namespace and
//!   attaches an idmapped clone (through the sandbox's user namespace, so on-disk 1000 is
//!   uid 1000 inside whatever the sandbox's host range) at the requested path, read-only when
//!   asked; the path is resolved component by component without following symlinks.

use crate::{store, sys, Jail, JailError, JailerSpec};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Environment variable telling the agent which inherited fd is its disk's root (which it
/// keeps, close-on-exec, and never uses).
pub const DISK_FD_ENV: &str = "RAMPART_DISK_FD";

fn io(step: String) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Sys { step, source }
}

/// An open loop device attached to the file `image` whose (device, inode) is `ident`, if
/// one is. Candidates are the devices whose `/sys/block/loop*/loop/backing_file` ends like
/// `image` (its last two components: the jailer attaches it from its own mount namespace,
/// where the path is spelled otherwise); each is opened and its backing inode checked on the
/// open device (a device held open cannot be detached and reused meanwhile).
fn attached_loop(image: &Path, ident: (u64, u64)) -> Option<OwnedFd> {
    let mut tail = image.components().rev().take(2).collect::<Vec<_>>();
    tail.reverse();
    let want = format!("/{}", tail.iter().collect::<PathBuf>().display()).into_bytes();
    for e in std::fs::read_dir("/sys/block").ok()?.flatten() {
        let name = e.file_name();
        let Some(n) = name.to_str().filter(|n| n.starts_with("loop")) else {
            continue;
        };
        let Ok(b) = std::fs::read(e.path().join("loop/backing_file")) else {
            continue;
        };
        if !b.strip_suffix(b"\n").unwrap_or(&b).ends_with(&want) {
            continue;
        }
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(format!("/dev/{n}"))
        else {
            continue;
        };
        if sys::loop_backing_inode_fd(&f) == Some(ident) {
            return Some(OwnedFd::from(f));
        }
    }
    None
}

pub use rampart_types::launch::{DiskSource, LaunchExtras, VolumeSpec};

/// A volume in a [`JailerSpec`]: an attached loop device to mount at `path`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailerVolume {
    /// `/dev/loopN`, attached to the volume's image.
    pub device: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// Serializes volume attachment (find-or-attach of a loop device must not race).
static ATTACH: Mutex<()> = Mutex::new(());

/// Opens the loop device attached to `image`, attaching one (autoclear) if none is. The
/// returned fd keeps the device attached until the jailer has mounted it.
fn attach_volume(image: &Path) -> Result<(String, OwnedFd), JailError> {
    let _g = ATTACH.lock().unwrap_or_else(|p| p.into_inner());
    for dev in store::loops_of(image) {
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dev)
        else {
            continue;
        };
        // Still bound to the image now that we hold it open (it cannot be cleared while open)?
        if store::loops_of(image).contains(&dev) {
            return Ok((dev.to_string_lossy().into_owned(), OwnedFd::from(f)));
        }
    }
    sys::loop_attach(image)
}

/// Whether a volume's image is attached (mounted by some sandbox, or just released).
pub fn volume_in_use(image: &Path) -> bool {
    !store::loops_of(image).is_empty()
}

/// A descriptor (`O_RDONLY | O_DIRECTORY`, close-on-exec) of the root of the volume whose
/// image is `image`, for the daemon's own use (the E2B volume file API): its file system is
/// mounted **detached** (`fsopen`/`fsmount`: in no mount namespace, seen by no process,
/// unmounted when the last descriptor of it closes), read-write, `nosuid,nodev,noexec`. The
/// volume's one loop device is found or attached exactly as for a sandbox's mount (under the
/// same lock), so while any sandbox has the volume mounted this mount shares its superblock:
/// one ext4 instance over the image, never two writers. Blocking.
pub fn volume_root(image: &Path) -> Result<OwnedFd, JailError> {
    let (device, dev) = attach_volume(image)?;
    let mount = || -> std::io::Result<OwnedFd> {
        use rustix::mount::{
            fsconfig_create, fsconfig_set_string, fsmount, fsopen, FsMountFlags, FsOpenFlags,
            MountAttrFlags,
        };
        let fs = fsopen("ext4", FsOpenFlags::FSOPEN_CLOEXEC)?;
        fsconfig_set_string(&fs, "source", format!("/proc/self/fd/{}", dev.as_raw_fd()))?;
        fsconfig_set_string(&fs, "errors", "remount-ro")?;
        fsconfig_create(&fs)?;
        let mnt = fsmount(
            &fs,
            FsMountFlags::FSMOUNT_CLOEXEC,
            MountAttrFlags::MOUNT_ATTR_NOSUID
                | MountAttrFlags::MOUNT_ATTR_NODEV
                | MountAttrFlags::MOUNT_ATTR_NOEXEC
                | MountAttrFlags::MOUNT_ATTR_NOATIME,
        )?;
        // A real descriptor of the mount's root (`fsmount` gives an O_PATH one); it holds
        // the detached mount once `mnt` is closed.
        Ok(rustix::fs::openat(
            &mnt,
            ".",
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?)
    };
    let root = mount().map_err(io(format!(
        "mount volume {} ({device}) detached",
        image.display()
    )))?;
    // The mount holds the device now; the loop fd can go (autoclear once the mount goes).
    drop(dev);
    Ok(root)
}

/// Makes a volume image of `size_mib` MiB at `image` (which must not exist), formatted ext4
/// with its root owned by 1000:1000. Nothing is left on error.
pub fn create_volume(image: &Path, size_mib: u64) -> Result<(), JailError> {
    let dir = image.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(format!("mkdir {}", dir.display())))?;
    // One temporary file per call (two makes of one name at once must not format one file).
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".tmp-{}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        image.file_name().unwrap_or_default().to_string_lossy()
    ));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io(format!("create {}", tmp.display())))?;
    let r = (|| {
        f.set_len(size_mib << 20)
            .map_err(io(format!("size {}", tmp.display())))?;
        drop(f);
        let out = std::process::Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "root_owner=1000:1000,lazy_itable_init=1,lazy_journal_init=1,nodiscard",
            ])
            .arg(&tmp)
            .output()
            .map_err(io("run mkfs.ext4".into()))?;
        if !out.status.success() {
            return Err(JailError::Init(format!(
                "mkfs.ext4: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        sys::rename_noreplace(&tmp, image)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Bytes allocated to a file on the host.
pub fn allocated_bytes(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0)
}

impl Jail {
    /// The store's root (the parent of the state directory).
    pub fn store_root(&self) -> PathBuf {
        self.config()
            .state_dir
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| self.config().state_dir.clone())
    }

    /// A sandbox's disk image.
    pub fn disk_image(&self, id: &rampart_types::SandboxId) -> PathBuf {
        self.sandbox_dir(id).join("disk.img")
    }

    /// A descriptor (`O_RDONLY | O_DIRECTORY`, close-on-exec) of the root of a running (or
    /// paused) sandbox's disk: `upper/` is the writable layer of `/`, `usr-upper/` that of
    /// `/usr` (overlayfs upper directories: a deleted lower file is a 0/0 character device, an
    /// opaque directory has the `trusted.overlay.opaque` xattr `y`). Owners are host ids of
    /// the sandbox's range. Holding it pins the filesystem. Blocking (cheap).
    pub fn upper_root(&self, id: &rampart_types::SandboxId) -> Result<OwnedFd, JailError> {
        let pid1 = self.pid1(id)?;
        // The disk image's identity: the root wanted is that of the loop device backed by it
        // (a volume's root, also an ext4 root on a loop device, that the agent happens to
        // hold open is not it). Each candidate's loop device is asked for its backing file,
        // rather than every loop device of the host (a host keeps its loop devices after
        // they detach: scanning a thousand of them cost ~10 ms at every destroy).
        let image = std::fs::metadata(self.disk_image(id))
            .ok()
            .map(|m| (m.dev(), m.ino()));
        let backed_by_image = |dev: u64| -> bool {
            let Some(image) = image else {
                return true;
            };
            let sys = format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev));
            std::fs::read_link(&sys)
                .ok()
                .and_then(|l| l.file_name().map(|n| PathBuf::from("/dev").join(n)))
                .and_then(|d| sys::loop_backing_inode(&d))
                == Some(image)
        };
        let fds = format!("/proc/{pid1}/fd");
        let rd = std::fs::read_dir(&fds).map_err(io(format!("read {fds}")))?;
        for e in rd.flatten() {
            let p = e.path();
            let Ok(m) = std::fs::metadata(&p) else {
                continue;
            };
            // The ext4 root (inode 2) of a loop device (major 7).
            if m.is_dir() && m.ino() == 2 && libc::major(m.dev()) == 7 && backed_by_image(m.dev()) {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
                    .open(&p)
                    .map_err(io(format!("open {}", p.display())))?;
                return Ok(OwnedFd::from(f));
            }
        }
        Err(JailError::Init(format!(
            "sandbox {id} does not hold its disk's root (started by an older Rampart?)"
        )))
    }

    /// A descriptor of the root of a sandbox's disk (as [`Jail::upper_root`] gives), also
    /// when its init is gone (it died, or was killed, or the daemon found it dead at start)
    /// but its disk image is still there (until [`Jail::destroy`]): then the image's file
    /// system is mounted **detached** (`fsopen`/`fsmount`: in no mount namespace, seen by no
    /// process, unmounted when the descriptor closes), read-only, `nosuid,nodev,noexec`. The
    /// loop device still attached to the image (the sandbox's last mount going away) is
    /// reused, held open while its backing file is checked to be this image, so the mount
    /// shares a file system still being released rather than making a second one over the
    /// same bytes; else a new read-only loop device is attached (autoclear). Blocking.
    pub fn disk_root(&self, id: &rampart_types::SandboxId) -> Result<OwnedFd, JailError> {
        if let Ok(fd) = self.upper_root(id) {
            return Ok(fd);
        }
        let image = self.disk_image(id);
        let img = std::fs::metadata(&image).map_err(io(format!("stat {}", image.display())))?;
        let ident = (img.dev(), img.ino());
        let (dev, fresh) = match attached_loop(&image, ident) {
            Some(f) => (f, false),
            None => (sys::loop_attach_with(&image, true)?.1, true),
        };
        let mount = |ro_superblock: bool| -> std::io::Result<OwnedFd> {
            use rustix::mount::{
                fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen,
                FsMountFlags, FsOpenFlags, MountAttrFlags,
            };
            let fs = fsopen("ext4", FsOpenFlags::FSOPEN_CLOEXEC)?;
            fsconfig_set_string(&fs, "source", format!("/proc/self/fd/{}", dev.as_raw_fd()))?;
            if ro_superblock {
                fsconfig_set_flag(&fs, "ro")?;
            }
            fsconfig_create(&fs)?;
            let mnt = fsmount(
                &fs,
                FsMountFlags::FSMOUNT_CLOEXEC,
                MountAttrFlags::MOUNT_ATTR_RDONLY
                    | MountAttrFlags::MOUNT_ATTR_NOSUID
                    | MountAttrFlags::MOUNT_ATTR_NODEV
                    | MountAttrFlags::MOUNT_ATTR_NOEXEC,
            )?;
            // A real descriptor of the mount's root (`fsmount` gives an O_PATH one); it holds
            // the detached mount once `mnt` is closed.
            Ok(rustix::fs::openat(
                &mnt,
                ".",
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )?)
        };
        // A file system still mounted read-write (being released) cannot be shared
        // read-only at the superblock (EBUSY): then only the mount is read-only.
        let root = match mount(true) {
            Err(e) if !fresh && e.raw_os_error() == Some(libc::EBUSY) => mount(false),
            r => r,
        }
        .map_err(io(format!(
            "mount the disk of sandbox {id} (its init is gone)"
        )))?;
        tracing::info!(
            id = %id,
            loop_device = if fresh { "new, read-only" } else { "the sandbox's" },
            "the disk of a sandbox whose init is gone, mounted detached"
        );
        Ok(root)
    }

    /// Host pid of a sandbox's PID 1 (the task of its cgroup that is pid 1 of its namespace).
    fn pid1(&self, id: &rampart_types::SandboxId) -> Result<i32, JailError> {
        let dirs = self.cgroup_dirs(id);
        let mut pids = Vec::new();
        for d in &dirs {
            if let Ok(s) = std::fs::read_to_string(d.join("cgroup.procs")) {
                pids.extend(s.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        pids.sort_unstable();
        pids.dedup();
        for p in pids {
            let Ok(st) = std::fs::read_to_string(format!("/proc/{p}/status")) else {
                continue;
            };
            let ns = st.lines().find_map(|l| l.strip_prefix("NSpid:"));
            if let Some(ns) = ns {
                let f: Vec<&str> = ns.split_whitespace().collect();
                if f.len() >= 2 && f.last() == Some(&"1") {
                    return Ok(p);
                }
            }
        }
        Err(JailError::Init(format!("sandbox {id} has no running init")))
    }

    /// Whether a sandbox is stopped ([`Jail::stop`]): its disk is there, its cgroup is not.
    /// A relaunch cut short (the daemon killed between moving the disk aside and the new
    /// launch) is rolled back first, so the disk is found where it belongs; one in progress
    /// in this process is left alone. Blocking (cheap).
    pub fn is_stopped(&self, id: &rampart_types::SandboxId) -> bool {
        let dir = self.sandbox_dir(id);
        let aside = self.relaunch_dir(id);
        let booting = self
            .relaunching
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(id);
        if booting {
            return false;
        }
        if !dir.exists() && aside.join("disk.img").exists() {
            if let Err(e) = std::fs::rename(&aside, &dir) {
                tracing::warn!(id = %id, "restoring a stopped sandbox's disk: {e}");
            }
        }
        self.disk_image(id).exists() && self.cgroups.dirs(id.as_str()).iter().all(|d| !d.exists())
    }

    fn relaunch_dir(&self, id: &rampart_types::SandboxId) -> PathBuf {
        self.config().state_dir.join(format!(".relaunch-{id}"))
    }

    /// Ends every process of a sandbox and removes its cgroup, keeping its directory and its
    /// disk: a filesystem-only pause. The disk is flushed first (the sandbox frozen, its file
    /// system `syncfs`ed), then every process is killed, and this returns once the disk's
    /// loop device is released (its last mount gone with the sandbox's mount namespace), so
    /// the image is at rest. Afterwards [`Jail::disk_root`] reads the disk,
    /// [`Jail::snapshot_disk`] copies it, [`Jail::relaunch`] boots it again and
    /// [`Jail::destroy`] removes it. A stopped sandbox stops again as a no-op. Blocking.
    pub fn stop(&self, id: &rampart_types::SandboxId) -> Result<(), JailError> {
        if self.is_stopped(id) {
            return Ok(());
        }
        if !self.is_frozen(id)? {
            self.freeze(id)?;
        }
        let root = self.upper_root(id)?;
        // SAFETY: syncfs on a descriptor we own.
        let rc = unsafe { libc::syncfs(root.as_raw_fd()) };
        sys::check(rc.into(), || format!("syncfs of sandbox {id}'s disk"))?;
        drop(root);
        self.cgroups.destroy(id.as_str())?;
        let image = self.disk_image(id);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut nap = std::time::Duration::from_micros(200);
        while !store::loops_of(&image).is_empty() {
            if std::time::Instant::now() > deadline {
                return Err(JailError::Sys {
                    step: format!("release the disk of stopped sandbox {id}"),
                    source: std::io::Error::from_raw_os_error(libc::EBUSY),
                });
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(std::time::Duration::from_millis(20));
        }
        Ok(())
    }

    /// Boots a stopped sandbox ([`Jail::stop`]) again on its own disk: what it wrote is
    /// there, nothing of its processes is (a cold boot). `spec` is its launch spec (the same
    /// id and uid range); `extras` its volumes (`extras.disk` is ignored: the disk is the
    /// sandbox's own). The disk is moved aside, the sandbox launched on a clone of it (a
    /// reflink on the store), and the old copy removed; on error the sandbox is stopped as
    /// before, its disk back in place. Blocking.
    pub fn relaunch(
        &self,
        spec: &crate::LaunchSpec,
        extras: &LaunchExtras,
    ) -> Result<crate::Launched, JailError> {
        let id = &spec.id;
        if !self.is_stopped(id) {
            return Err(JailError::Init(format!("sandbox {id} is not stopped")));
        }
        let dir = self.sandbox_dir(id);
        let aside = self.relaunch_dir(id);
        // Marked before the disk moves: a concurrent `is_stopped` must not put it back.
        let _booting = Booting::new(&self.relaunching, id);
        sys::rename_noreplace(&dir, &aside)?;
        let mut x = extras.clone();
        x.disk = Some(DiskSource {
            image: aside.join("disk.img"),
            uid_base: spec.uid_base,
        });
        match self.launch_with(spec, &x) {
            Ok(l) => {
                if let Err(e) = std::fs::remove_dir_all(&aside) {
                    tracing::warn!(id = %id, "removing a relaunched sandbox's old disk: {e}");
                }
                Ok(l)
            }
            Err(e) => {
                // launch_with removed what it made; the disk goes back.
                if let Err(re) = std::fs::rename(&aside, &dir) {
                    tracing::error!(id = %id, "putting a stopped sandbox's disk back: {re}");
                }
                Err(e)
            }
        }
    }

    /// Takes a consistent copy of a sandbox's disk at `dest` (which must not exist): freezes
    /// the sandbox (unless it is frozen already), flushes its filesystem, clones the image,
    /// thaws. Returns the bytes the copy shares or holds (allocated). On error `dest` does not
    /// exist and the sandbox is as it was. Blocking.
    pub fn snapshot_disk(
        &self,
        id: &rampart_types::SandboxId,
        dest: &Path,
    ) -> Result<u64, JailError> {
        if self.is_stopped(id) {
            // Nothing runs on it: the image is at rest.
            store::clone_file(&self.disk_image(id), dest)?;
            return Ok(allocated_bytes(dest));
        }
        let was_frozen = self.is_frozen(id)?;
        if !was_frozen {
            self.freeze(id)?;
        }
        let r = (|| {
            let root = self.upper_root(id)?;
            // SAFETY: syncfs on a descriptor we own.
            let rc = unsafe { libc::syncfs(root.as_raw_fd()) };
            sys::check(rc.into(), || format!("syncfs of sandbox {id}'s disk"))?;
            store::clone_file(&self.disk_image(id), dest)
        })();
        if !was_frozen {
            if let Err(e) = self.thaw(id) {
                let _ = std::fs::remove_file(dest);
                return Err(e);
            }
        }
        r.map(|()| allocated_bytes(dest))
    }

    /// Attaches (or finds attached) each volume's loop device for a launch: the devices to
    /// mount and the descriptors that keep them attached until the jailer has mounted them.
    pub(crate) fn attach_volumes(
        &self,
        extras: &LaunchExtras,
    ) -> Result<(Vec<JailerVolume>, Vec<OwnedFd>), JailError> {
        let mut vols = Vec::new();
        let mut holds = Vec::new();
        for v in &extras.volumes {
            let (device, hold) = attach_volume(&v.image)?;
            holds.push(hold);
            vols.push(JailerVolume {
                device,
                path: v.path.clone(),
                read_only: v.read_only,
            });
        }
        Ok((vols, holds))
    }
}

/// Marks a sandbox as being relaunched while it lives.
struct Booting<'a> {
    set: &'a std::sync::Mutex<std::collections::HashSet<rampart_types::SandboxId>>,
    id: rampart_types::SandboxId,
}

impl<'a> Booting<'a> {
    fn new(
        set: &'a std::sync::Mutex<std::collections::HashSet<rampart_types::SandboxId>>,
        id: &rampart_types::SandboxId,
    ) -> Self {
        set.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone());
        Booting {
            set,
            id: id.clone(),
        }
    }
}

impl Drop for Booting<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// In the jailer: moves every owner (uid and gid) in `[from, from + 65536)` under the
/// writable layers of the disk mounted at `disk_mnt` to the same offset from `to`.
pub fn shift_uids(disk_mnt: &Path, from: u32, to: u32) -> Result<(), JailError> {
    if from == to {
        return Ok(());
    }
    for root in ["upper", "usr-upper"].map(|n| disk_mnt.join(n)) {
        if root.is_dir() {
            shift_tree(&root, from, to, &mut |_| {})?;
        }
    }
    Ok(())
}

/// Moves every owner (uid and gid) in `[from, from + 65536)` of `root` and everything under
/// it (symlinks not followed) to the same offset from `to`, keeping file capabilities (their
/// root id moved too) and set-id bits; calls `each` on every path it visits. Also used by
/// `rampart-image` to turn a build sandbox's upper directory into a layer.
pub fn shift_tree(
    root: &Path,
    from: u32,
    to: u32,
    each: &mut dyn FnMut(&Path),
) -> Result<(), JailError> {
    let map = |id: u32| -> u32 {
        if id >= from && id - from < 65536 {
            to + (id - from)
        } else {
            id
        }
    };
    // No recursion: depth is unbounded.
    each(root);
    let mut stack = Vec::new();
    if shift_one(root, &map)? {
        stack.push(root.to_path_buf());
    }
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).map_err(io(format!("read {}", d.display())))?;
        for e in rd {
            let e = e.map_err(io(format!("read {}", d.display())))?;
            let p = e.path();
            each(&p);
            if shift_one(&p, &map)? {
                stack.push(p);
            }
        }
    }
    Ok(())
}

const XATTR_CAPS: &std::ffi::CStr = c"security.capability";

/// Shifts one file's owner; returns whether it is a directory (not a symlink to one).
fn shift_one(p: &Path, map: &impl Fn(u32) -> u32) -> Result<bool, JailError> {
    let m = std::fs::symlink_metadata(p).map_err(io(format!("stat {}", p.display())))?;
    let (u, g) = (map(m.uid()), map(m.gid()));
    let ft = m.file_type();
    if u == m.uid() && g == m.gid() {
        return Ok(ft.is_dir());
    }
    let c = sys::cpath(p)?;
    // File capabilities and set-id bits are cleared by chown: keep them.
    let mut caps = [0u8; 24];
    let caps_len = if ft.is_file() {
        // SAFETY: valid path and buffer of the given size.
        unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                XATTR_CAPS.as_ptr(),
                caps.as_mut_ptr().cast(),
                caps.len(),
            )
        }
    } else {
        -1
    };
    // SAFETY: valid path.
    let rc = unsafe { libc::lchown(c.as_ptr(), u, g) };
    sys::check(rc.into(), || format!("chown {}", p.display()))?;
    if ft.is_file() && m.mode() & 0o6000 != 0 {
        // SAFETY: valid path.
        let rc = unsafe { libc::chmod(c.as_ptr(), m.mode() & 0o7777) };
        sys::check(rc.into(), || format!("chmod {}", p.display()))?;
    }
    if caps_len > 0 {
        let n = caps_len as usize;
        // v3 (24 bytes, magic 0x03000000 in the top byte): the root id follows the sets.
        if n == 24 && caps[3] == 0x03 {
            let root = u32::from_le_bytes([caps[20], caps[21], caps[22], caps[23]]);
            caps[20..24].copy_from_slice(&map(root).to_le_bytes());
        }
        // SAFETY: valid path and buffer.
        let rc =
            unsafe { libc::lsetxattr(c.as_ptr(), XATTR_CAPS.as_ptr(), caps.as_ptr().cast(), n, 0) };
        sys::check(rc.into(), || {
            format!("restore capabilities of {}", p.display())
        })?;
    }
    Ok(ft.is_dir())
}

/// In the jailer: gives the sandbox a machine id of its own (`/etc/machine-id`, 32 hex
/// digits, mode 0444, owned by root inside), written into the writable layer before the
/// overlay is mounted. Skipped when the layer's `etc` is not a plain directory.
pub fn write_machine_id(disk_mnt: &Path, uid_base: u32) -> Result<(), JailError> {
    // `etc` made (owned by root inside) if missing, never through a symlink.
    let etcfd = match mountpoint(&disk_mnt.join("upper"), "etc", uid_base) {
        Ok(fd) => fd,
        // a whiteout, a symlink, a file: leave the sandbox's choice alone
        Err(JailError::Init(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut raw = [0u8; 16];
    // SAFETY: a valid buffer of the given length (up to 256 bytes come whole, uninterrupted).
    let n = unsafe { libc::getrandom(raw.as_mut_ptr().cast(), raw.len(), 0) };
    if n != raw.len() as isize {
        return Err(sys::last("getrandom for etc/machine-id"));
    }
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let name = c"machine-id";
    // SAFETY: valid dirfd and name; a missing file is fine.
    unsafe { libc::unlinkat(etcfd.as_raw_fd(), name.as_ptr(), 0) };
    // SAFETY: valid dirfd and name; O_EXCL|O_NOFOLLOW never follows a planted link.
    let fd = unsafe {
        libc::openat(
            etcfd.as_raw_fd(),
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o444,
        )
    };
    let fd = sys::check(fd.into(), || "create etc/machine-id".into())? as RawFd;
    // SAFETY: a new fd we own.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    std::io::Write::write_all(&mut &f, format!("{hex}\n").as_bytes())
        .map_err(io("write etc/machine-id".into()))?;
    // SAFETY: fchown on our fd.
    let rc = unsafe { libc::fchown(f.as_raw_fd(), uid_base, uid_base) };
    sys::check(rc.into(), || "chown etc/machine-id".into())?;
    Ok(())
}

fn open_dir(p: &Path) -> Result<OwnedFd, JailError> {
    let c = sys::cpath(p)?;
    // SAFETY: valid path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    let fd = sys::check(fd.into(), || format!("open {}", p.display()))? as RawFd;
    // SAFETY: a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_dir_at(dir: &OwnedFd, name: &std::ffi::CStr) -> Result<OwnedFd, JailError> {
    // SAFETY: valid dirfd and name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    let fd = sys::check(fd.into(), || format!("open {name:?}"))? as RawFd;
    // SAFETY: a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// In the jailer, once the sandbox's root overlay is mounted at `root`: mounts each volume
/// (its device first at `<sandbox_dir>/vol<i>`, then an idmapped clone through the user
/// namespace `userns` at its path under `root`, made component by component as directories
/// owned by root inside, never following a symlink).
pub fn mount_volumes(spec: &JailerSpec, root: &Path, userns: RawFd) -> Result<(), JailError> {
    for (i, v) in spec.volumes.iter().enumerate() {
        let raw = spec.sandbox_dir.join(format!("vol{i}"));
        match std::fs::create_dir(&raw) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(format!("mkdir {}", raw.display()))(e)),
        }
        sys::mount(
            Some(&v.device),
            &raw,
            Some("ext4"),
            libc::MS_NOATIME | libc::MS_NODEV | libc::MS_NOSUID,
            Some("errors=remount-ro"),
        )?;
        let target = mountpoint(root, &v.path, spec.uid_base)?;
        let mut set = libc::MOUNT_ATTR_IDMAP | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOSUID;
        if v.read_only {
            set |= libc::MOUNT_ATTR_RDONLY;
        }
        sys::idmapped_bind_fd(&raw, target.as_raw_fd(), userns, set)
            .map_err(|e| JailError::Init(format!("volume at {}: {e}", v.path)))?;
    }
    Ok(())
}

/// Opens (making what is missing, owned by root inside) the directory `path` under `root`
/// without following any symlink: every component must be a directory, else
/// [`JailError::Init`].
fn mountpoint(root: &Path, path: &str, uid_base: u32) -> Result<OwnedFd, JailError> {
    let mut cur = open_dir(root)?;
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        if comp == "." || comp == ".." {
            return Err(JailError::Init(format!(
                "volume path {path:?} is not normal"
            )));
        }
        let name = CString::new(comp.as_bytes())
            .map_err(|_| JailError::Init(format!("volume path {path:?} has a NUL")))?;
        // SAFETY: valid dirfd and name.
        let rc = unsafe { libc::mkdirat(cur.as_raw_fd(), name.as_ptr(), 0o755) };
        if rc == 0 {
            // SAFETY: valid dirfd and name.
            let rc = unsafe {
                libc::fchownat(
                    cur.as_raw_fd(),
                    name.as_ptr(),
                    uid_base,
                    uid_base,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            sys::check(rc.into(), || format!("chown mount point {comp}"))?;
        }
        cur = open_dir_at(&cur, &name).map_err(|_| {
            JailError::Init(format!(
                "volume path {path:?}: {comp:?} is not a directory (symlinks are not followed)"
            ))
        })?;
    }
    Ok(cur)
}
