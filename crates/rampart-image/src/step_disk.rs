//! A build step's disk: what a `run` step (and `apt`, `pip`, `npm`) writes goes to a
//! sparse ext4 image of the build's disk size, loop-mounted for the step, as a sandbox's
//! writable layers do; writing past it fails inside with ENOSPC and the host's disk is
//! untouched. After the step the layer is copied out of it into the store and the image is
//! removed (unmounted, its loop device detached: autoclear).

use crate::ImageError;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The smallest step disk (ext4 needs some room for itself).
pub const MIN_STEP_DISK_BYTES: u64 = 16 << 20;

/// A mounted step disk (see the module). Dropping it unmounts it and removes its image.
#[derive(Debug)]
pub struct StepDisk {
    image: PathBuf,
    mnt: PathBuf,
    mounted: bool,
    bytes: u64,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ImageError {
    let what = what.into();
    move |source| ImageError::Io { what, source }
}

fn jail(what: &str) -> impl FnOnce(rampart_jail::JailError) -> ImageError + '_ {
    move |e| ImageError::Io {
        what: format!("the step's disk: {what}"),
        source: std::io::Error::other(e.to_string()),
    }
}

impl StepDisk {
    /// Makes a disk of `bytes` (at least [`MIN_STEP_DISK_BYTES`]) in `dir` (a directory of
    /// the step's own): `dir/disk.img`, mounted at `dir/disk`. On error nothing is left
    /// mounted or attached (the image file goes with `dir`).
    pub fn make(dir: &Path, bytes: u64) -> Result<StepDisk, ImageError> {
        let bytes = bytes.max(MIN_STEP_DISK_BYTES);
        let mut d = StepDisk {
            image: dir.join("disk.img"),
            mnt: dir.join("disk"),
            mounted: false,
            bytes,
        };
        let f = std::fs::File::create(&d.image).map_err(io("create the step's disk image"))?;
        f.set_len(bytes).map_err(io("size the step's disk image"))?;
        drop(f);
        let out = Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-O",
                "^has_journal,^resize_inode",
                "-E",
                "lazy_itable_init=1,nodiscard,root_owner=0:0",
                "-m",
                "0",
                "-I",
                "256",
            ])
            .arg(&d.image)
            .output()
            .map_err(io("run mkfs.ext4 for the step's disk (install e2fsprogs)"))?;
        if !out.status.success() {
            return Err(ImageError::Io {
                what: format!(
                    "mkfs.ext4 of the step's disk: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        std::fs::create_dir(&d.mnt).map_err(io("mkdir the step's disk mount point"))?;
        let (dev, loopfd) = rampart_jail::sys::loop_attach(&d.image).map_err(jail("attach"))?;
        // The loop device detaches itself once unmounted (autoclear) or, on error, once
        // `loopfd` is closed.
        rampart_jail::sys::mount(
            Some(&dev),
            &d.mnt,
            Some("ext4"),
            libc::MS_NOATIME,
            Some("noinit_itable,errors=remount-ro"),
        )
        .map_err(jail("mount"))?;
        drop(loopfd);
        d.mounted = true;
        Ok(d)
    }

    /// Where it is mounted.
    pub fn root(&self) -> &Path {
        &self.mnt
    }

    /// Its size, bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether it is (nearly) full: less than 1 MiB or 1% left.
    pub fn full(&self) -> bool {
        let Ok(s) = nix::sys::statvfs::statvfs(&self.mnt) else {
            return false;
        };
        let free = s.blocks_available() * s.fragment_size();
        let total = s.blocks() * s.fragment_size();
        free < (1 << 20) || free < total / 100
    }

    /// Copies the tree `src` (on this disk) to `dst` (which must not exist, off this disk),
    /// keeping owners, modes, times, extended attributes, hard links and special files
    /// (overlay whiteouts). On error `dst` is removed.
    pub fn copy_out(src: &Path, dst: &Path) -> Result<(), ImageError> {
        let out = Command::new("cp")
            .args(["-a", "--no-target-directory", "--"])
            .arg(src)
            .arg(dst)
            .output()
            .map_err(io("run cp to move the step's layer out of its disk"))?;
        if !out.status.success() {
            let _ = crate::store::remove_tree(dst);
            return Err(ImageError::Io {
                what: format!(
                    "copying the step's layer out of its disk: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        Ok(())
    }
}

/// Unmounts every mount under `dir` (the store's `tmp/`: step disks a killed build left),
/// deepest first.
pub fn unmount_under(dir: &Path) {
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return;
    };
    let prefix = format!("{}/", dir.display());
    let Ok(mi) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = mi
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        match rampart_jail::sys::umount2(Path::new(p), libc::MNT_DETACH) {
            Ok(()) => tracing::info!(mount = p, "unmounted a build step's disk left behind"),
            Err(e) => tracing::warn!(mount = p, "unmounting a build step's disk left behind: {e}"),
        }
    }
}

impl Drop for StepDisk {
    fn drop(&mut self) {
        if self.mounted {
            if let Err(e) = rampart_jail::sys::umount2(&self.mnt, libc::MNT_DETACH) {
                tracing::warn!("unmounting the build step's disk: {e}");
            }
        }
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_dir(&self.mnt);
    }
}
