//! Disk admission: the disk quotas of live sandboxes, the snapshots and the volumes are
//! counted against the space the store can really hold, so that sandboxes filling their
//! disks can never make the store, `state.db` or the audit journal run out of space.
//!
//! What the store can hold is the free space of the file system under the data directory,
//! plus what the counted objects already occupy there (their blocks are part of the space
//! they were promised), less a reserve for the daemon's own state; on an image-backed store
//! (`store.img`, see rampart-jail's `store`) never more than the image's own size. That,
//! times the configured overcommit ratio (1.0 by default: no overcommit), is the budget.
//! Admission (the check and the insert that makes the sandbox count) happens under one lock,
//! so concurrent creates cannot overshoot.

use crate::CoreError;
use std::path::{Path, PathBuf};

/// Space kept free for `state.db`, its WAL, the journal and the templates.
pub const RESERVE_BYTES: u64 = 1 << 30;

const GIB: f64 = (1u64 << 30) as f64;

/// The disk space the store can hold right now.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Bytes that quotas, snapshots and volumes may add up to (after the ratio).
    pub holdable: u64,
    /// Bytes free on the file system that backs the store.
    pub free: u64,
    /// That file system's path (the data directory).
    pub path: PathBuf,
}

/// (available, total) bytes of the file system holding `p`.
pub(crate) fn statvfs(p: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: an all-zero statvfs is a valid value to be overwritten.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a valid statvfs for the call to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((s.f_bavail * s.f_frsize, s.f_blocks * s.f_frsize))
}

fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

/// Allocated bytes of the disk images under a store root (sandboxes, snapshots, volumes).
fn images_allocated(root: &Path) -> u64 {
    let mut sum = 0;
    for (dir, nested) in [("sandboxes", true), ("snapshots", true), ("volumes", false)] {
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in rd.flatten() {
            sum += if nested {
                allocated(&e.path().join("disk.img"))
            } else {
                allocated(&e.path())
            };
        }
    }
    sum
}

/// Measures the budget (pure arithmetic in [`holdable`]).
pub fn measure(data_dir: &Path, store_root: Option<&Path>, ratio: f64) -> std::io::Result<Budget> {
    let (free, _) = statvfs(data_dir)?;
    let image = data_dir.join("store.img");
    let (occupied, cap) = match store_root {
        Some(root) if image.is_file() => (allocated(&image), Some(statvfs(root)?.1)),
        Some(root) => (images_allocated(root), None),
        None => (images_allocated(data_dir), None),
    };
    Ok(Budget {
        holdable: holdable(free, occupied, cap, ratio),
        free,
        path: data_dir.to_path_buf(),
    })
}

/// `(free + occupied - reserve)`, at most `cap`, times `ratio`.
pub fn holdable(free: u64, occupied: u64, cap: Option<u64>, ratio: f64) -> u64 {
    let real = (free + occupied).saturating_sub(RESERVE_BYTES);
    let real = cap.map_or(real, |c| real.min(c));
    (real as f64 * ratio.max(0.0)) as u64
}

/// Checks that `asked` more bytes fit beside `committed`; the 503 `capacity` error says how
/// much is free and what to change.
pub fn check(what: &str, asked: u64, committed: u64, b: &Budget) -> Result<(), CoreError> {
    if committed.saturating_add(asked) <= b.holdable {
        return Ok(());
    }
    Err(CoreError::Capacity(format!(
        "disk: {what} asks for {:.1} GiB, but {:.1} GiB of the {:.1} GiB the store can hold is \
         already promised to sandboxes, snapshots and volumes ({:.1} GiB free on {}); destroy \
         sandboxes or snapshots, ask for a smaller disk, or raise disk_overcommit",
        asked as f64 / GIB,
        committed as f64 / GIB,
        b.holdable as f64 / GIB,
        b.free as f64 / GIB,
        b.path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn budget_is_free_plus_occupied_less_the_reserve_times_ratio() {
        assert_eq!(holdable(80 * G, 0, None, 1.0), 79 * G);
        assert_eq!(holdable(70 * G, 10 * G, None, 1.0), 79 * G);
        assert_eq!(holdable(80 * G, 0, Some(40 * G), 1.0), 40 * G);
        assert_eq!(holdable(80 * G, 0, None, 2.0), 158 * G);
        assert_eq!(holdable(0, 0, None, 1.0), 0);
        assert_eq!(holdable(80 * G, 0, None, -1.0), 0);
    }

    #[test]
    fn ten_50_gib_disks_do_not_fit_in_80_gb() {
        let b = Budget {
            holdable: holdable(80_000_000_000, 0, None, 1.0),
            free: 80_000_000_000,
            path: PathBuf::from("/var/lib/rampart"),
        };
        let mut committed = 0;
        let mut admitted = 0;
        for _ in 0..10 {
            if check("a sandbox", 50 * G, committed, &b).is_ok() {
                committed += 50 * G;
                admitted += 1;
            }
        }
        assert_eq!(admitted, 1);
        let e = check("a sandbox", 50 * G, committed, &b)
            .unwrap_err()
            .to_string();
        assert!(e.contains("GiB free on /var/lib/rampart"), "{e}");
    }
}
