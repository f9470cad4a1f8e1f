//! The per-sandbox disk: a sparse ext4 image holding the writable layers, so writing past
//! the sandbox's disk size fails with ENOSPC inside while the host's disk is untouched
//! (only blocks actually written take space on the host).

use crate::JailError;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

fn io(step: String) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Sys { step, source }
}

/// Returns the cached, pre-formatted empty image of `bytes` bytes, making it once.
pub fn cached_image(cache_dir: &Path, bytes: u64) -> Result<PathBuf, JailError> {
    // "v2": without the resize inode (its reserved blocks were 85% of the image's data, which
    // every launch copies).
    let path = cache_dir.join(format!("ext4v2-{bytes}.img"));
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(cache_dir).map_err(io(format!("mkdir {}", cache_dir.display())))?;
    let tmp = cache_dir.join(format!(
        ".ext4-{bytes}.{}.{:?}.tmp",
        std::process::id(),
        std::thread::current().id()
    ));
    let result = (|| {
        let f = File::create(&tmp).map_err(io(format!("create {}", tmp.display())))?;
        f.set_len(bytes)
            .map_err(io(format!("size {}", tmp.display())))?;
        drop(f);
        let out = Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-O",
                "^has_journal,^resize_inode",
                "-E",
                "lazy_itable_init=1,nodiscard",
                "-m",
                "0",
                "-I",
                "256",
            ])
            .arg(&tmp)
            .output()
            .map_err(io("run mkfs.ext4 (install e2fsprogs)".into()))?;
        if !out.status.success() {
            return Err(JailError::Sys {
                step: format!("mkfs.ext4: {}", String::from_utf8_lossy(&out.stderr).trim()),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        std::fs::rename(&tmp, &path).map_err(io(format!("rename {}", path.display())))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| path)
}

/// Copies bytes `from..to` of `s` to the same offsets of `d` through a buffer.
fn copy_range(s: &File, d: &File, from: u64, to: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = from;
    while off < to {
        let want = usize::try_from(to - off)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = s.read_at(&mut buf[..want], off)?;
        if n == 0 {
            break;
        }
        d.write_all_at(&buf[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

/// Copies `s` (read from the start) into `d` (a new empty file open for writing), keeping
/// holes (only data extents are copied); `src` and `dst` name them in errors. The fallback
/// of [`crate::store::clone_file`] where no reflink can be made.
pub(crate) fn sparse_copy_fd(s: &File, d: &File, src: &Path, dst: &Path) -> Result<(), JailError> {
    let len = s
        .metadata()
        .map_err(io(format!("stat {}", src.display())))?
        .len();
    d.set_len(len)
        .map_err(io(format!("size {}", dst.display())))?;
    let mut pos: i64 = 0;
    let end = len as i64;
    while pos < end {
        // SAFETY: lseek on an fd we own.
        let data = unsafe { libc::lseek(s.as_raw_fd(), pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole remains
            }
            return Err(io(format!("SEEK_DATA {}", src.display()))(e));
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(s.as_raw_fd(), data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(crate::sys::last(format!("SEEK_HOLE {}", src.display())));
        }
        let mut off_in = data;
        let mut off_out = data;
        while off_in < hole {
            let n = (hole - off_in) as usize;
            // SAFETY: valid fds and offsets owned by this frame.
            let c = unsafe {
                libc::copy_file_range(
                    s.as_raw_fd(),
                    &mut off_in,
                    d.as_raw_fd(),
                    &mut off_out,
                    n,
                    0,
                )
            };
            if c < 0 {
                let e = std::io::Error::last_os_error();
                // Across file systems of different kinds: through a buffer instead.
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV | libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL)
                ) {
                    copy_range(s, d, off_in as u64, hole as u64)
                        .map_err(io(format!("copy into {}", dst.display())))?;
                    break;
                }
                return Err(io(format!("copy_file_range {}", dst.display()))(e));
            }
            if c == 0 {
                break;
            }
        }
        pos = hole;
    }
    Ok(())
}
