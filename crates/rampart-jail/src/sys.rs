//! Thin wrappers over the raw system calls the jail needs, each returning a typed error.

use crate::JailError;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Turns a path into a C string, refusing interior NULs.
pub fn cpath(p: &Path) -> Result<CString, JailError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| JailError::Sys {
        step: format!("path {}", p.display()),
        source: std::io::Error::from_raw_os_error(libc::EINVAL),
    })
}

/// Builds a [`JailError::Sys`] from `errno`.
pub fn last(step: impl Into<String>) -> JailError {
    JailError::Sys {
        step: step.into(),
        source: std::io::Error::last_os_error(),
    }
}

/// Checks a libc return value (`-1` = error).
pub fn check(rc: libc::c_long, step: impl FnOnce() -> String) -> Result<libc::c_long, JailError> {
    if rc < 0 {
        Err(JailError::Sys {
            step: step(),
            source: std::io::Error::last_os_error(),
        })
    } else {
        Ok(rc)
    }
}

/// `mount(2)`.
pub fn mount(
    src: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), JailError> {
    let src_c = src.map(|s| CString::new(s).unwrap_or_default());
    let fs_c = fstype.map(|s| CString::new(s).unwrap_or_default());
    let data_c = data.map(|s| CString::new(s).unwrap_or_default());
    let t = cpath(target)?;
    // SAFETY: every pointer is either null or a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            src_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            t.as_ptr(),
            fs_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            flags,
            data_c
                .as_ref()
                .map_or(std::ptr::null(), |c| c.as_ptr().cast()),
        )
    };
    check(rc.into(), || {
        format!(
            "mount {} on {} ({})",
            src.unwrap_or("-"),
            target.display(),
            fstype.unwrap_or("bind")
        )
    })?;
    Ok(())
}

/// `umount2(2)`.
pub fn umount2(target: &Path, flags: libc::c_int) -> Result<(), JailError> {
    let t = cpath(target)?;
    // SAFETY: `t` is a valid NUL-terminated string.
    let rc = unsafe { libc::umount2(t.as_ptr(), flags) };
    check(rc.into(), || format!("umount {}", target.display()))?;
    Ok(())
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Makes a clone of the mount at `src` with the mount attributes `attr_set` (which may
/// include `MOUNT_ATTR_IDMAP`, through the user namespace `userns`) and attaches it on the
/// directory open as `dst` (no path lookup at the destination).
pub fn idmapped_bind_fd(
    src: &Path,
    dst: RawFd,
    userns: RawFd,
    attr_set: u64,
) -> Result<(), JailError> {
    let s = cpath(src)?;
    // SAFETY: `s` is a valid string; open_tree returns a new fd or -1.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            s.as_ptr(),
            (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint,
        )
    };
    let fd = check(rc, || format!("open_tree {}", src.display()))?;
    // SAFETY: `fd` is a fresh fd we own.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns as u64,
    };
    let empty = c"";
    // SAFETY: `attr` is a valid mount_attr and its size is passed; `empty` is a valid string.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(rc, || format!("mount_setattr {}", src.display()))?;
    // SAFETY: valid fds and an empty string; both ends are given as fds.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            dst,
            empty.as_ptr(),
            (libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH) as libc::c_uint,
        )
    };
    check(rc, || format!("move_mount {}", src.display()))?;
    Ok(())
}

/// Makes an idmapped, read-only clone of the tree at `src` (mapped through the user
/// namespace `userns`) and attaches it at `dst`.
pub fn idmapped_bind(src: &Path, dst: &Path, userns: RawFd) -> Result<(), JailError> {
    let s = cpath(src)?;
    // SAFETY: `s` is a valid string; open_tree returns a new fd or -1.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            s.as_ptr(),
            (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint,
        )
    };
    let fd = check(rc, || format!("open_tree {}", src.display()))?;
    // SAFETY: `fd` is a fresh fd we own.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let attr = MountAttr {
        attr_set: libc::MOUNT_ATTR_IDMAP | libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns as u64,
    };
    let empty = c"";
    // SAFETY: `attr` is a valid mount_attr and its size is passed; `empty` is a valid string.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(rc, || format!("mount_setattr idmap {}", src.display()))?;
    let d = cpath(dst)?;
    // SAFETY: valid fd and strings.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            d.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(rc, || {
        format!("move_mount {} -> {}", src.display(), dst.display())
    })?;
    Ok(())
}

/// `CLONE_INTO_CGROUP` (clone3 only): the child starts in the cgroup `CloneArgs::cgroup`.
pub const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` of `clone3(2)` (version 2, with `cgroup`).
#[repr(C)]
#[derive(Debug, Default)]
pub struct CloneArgs {
    /// Flags (`CLONE_*`).
    pub flags: u64,
    /// Where to store a pidfd (`CLONE_PIDFD`).
    pub pidfd: u64,
    /// Where to store the child's tid in the child.
    pub child_tid: u64,
    /// Where to store the child's tid in the parent.
    pub parent_tid: u64,
    /// Signal sent to the parent when the child exits.
    pub exit_signal: u64,
    /// Stack (0: fork-like, shares the parent's stack copy-on-write).
    pub stack: u64,
    /// Stack size.
    pub stack_size: u64,
    /// TLS.
    pub tls: u64,
    /// Pids to use (`set_tid`).
    pub set_tid: u64,
    /// Number of them.
    pub set_tid_size: u64,
    /// Fd of the cgroup directory (`CLONE_INTO_CGROUP`).
    pub cgroup: u64,
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_READ_ONLY: u32 = 1;

const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;

/// The (device, inode) of the file a loop device is attached to, if it is attached.
pub fn loop_backing_inode(dev: &Path) -> Option<(u64, u64)> {
    let f = std::fs::File::open(dev).ok()?;
    loop_backing_inode_fd(&f)
}

/// [`loop_backing_inode`] of an open loop device.
pub fn loop_backing_inode_fd(f: &impl AsRawFd) -> Option<(u64, u64)> {
    // SAFETY: an all-zero LoopInfo64 is valid (plain integers and arrays).
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: LOOP_GET_STATUS64 fills a loop_info64 we own.
    let rc = unsafe {
        libc::ioctl(
            f.as_raw_fd(),
            LOOP_GET_STATUS64 as _,
            &mut info as *mut LoopInfo64,
        )
    };
    (rc == 0).then_some((info.lo_device, info.lo_inode))
}

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// Attaches `image` to a free loop device with autoclear (the device detaches itself when the
/// last user closes it). Returns the device path and an open fd on it.
pub fn loop_attach(image: &Path) -> Result<(String, OwnedFd), JailError> {
    loop_attach_with(image, false)
}

/// [`loop_attach`], the device read-only when `read_only` (the image is opened read-only and
/// nothing can write it through the device).
pub fn loop_attach_with(image: &Path, read_only: bool) -> Result<(String, OwnedFd), JailError> {
    let img = std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(image)
        .map_err(|e| JailError::Sys {
            step: format!("open {}", image.display()),
            source: e,
        })?;
    let ctl = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(|e| JailError::Sys {
            step: "open /dev/loop-control".into(),
            source: e,
        })?;
    // A free device can be taken by someone else between GET_FREE and CONFIGURE (EBUSY): retry.
    for _ in 0..64 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        check(n.into(), || "LOOP_CTL_GET_FREE".into())?;
        let dev = format!("/dev/loop{n}");
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(&dev)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(JailError::Sys {
                    step: format!("open {dev}"),
                    source: e,
                })
            }
        };
        // SAFETY: an all-zero LoopConfig is valid (plain integers and arrays).
        let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
        cfg.fd = img.as_raw_fd() as u32;
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | if read_only { LO_FLAGS_READ_ONLY } else { 0 };
        let name = image.as_os_str().as_bytes();
        let k = name.len().min(63);
        cfg.info.lo_file_name[..k].copy_from_slice(&name[..k]);
        // SAFETY: `cfg` is a valid loop_config for the duration of the call.
        let rc = unsafe {
            libc::ioctl(
                f.as_raw_fd(),
                LOOP_CONFIGURE as _,
                &cfg as *const LoopConfig,
            )
        };
        if rc == 0 {
            return Ok((dev, OwnedFd::from(f)));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EBUSY) {
            return Err(JailError::Sys {
                step: format!("LOOP_CONFIGURE {dev}"),
                source: err,
            });
        }
    }
    Err(JailError::Sys {
        step: "find a free loop device".into(),
        source: std::io::Error::from_raw_os_error(libc::EBUSY),
    })
}

/// Moves the calling thread into the cgroups whose `cgroup.procs` files are given, by writing
/// `0` ("me") into the `tasks` file next to each (cgroup v1). For a single-threaded process
/// that moves the whole process, and unlike a pid written to `cgroup.procs` it does not take
/// the kernel's global threadgroup lock, whose write side waits for an RCU grace period
/// (about 10 ms, holding the cgroup mutex meanwhile). Falls back to `cgroup.procs` where
/// there is no `tasks` file. Only for single-threaded processes.
pub fn join_cgroup_self(procs_files: &[std::path::PathBuf]) -> Result<(), JailError> {
    for f in procs_files {
        let tasks = f.with_file_name("tasks");
        if tasks.exists() {
            write_file(&tasks, "0")?;
        } else {
            // SAFETY: getpid has no preconditions.
            write_file(f, &unsafe { libc::getpid() }.to_string())?;
        }
    }
    Ok(())
}

/// `renameat2(from, to, RENAME_NOREPLACE)`: fails with EEXIST instead of replacing `to`.
pub fn rename_noreplace(from: &Path, to: &Path) -> Result<(), JailError> {
    let (f, t) = (cpath(from)?, cpath(to)?);
    // SAFETY: valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    check(rc.into(), || {
        format!("rename {} to {}", from.display(), to.display())
    })?;
    Ok(())
}

/// Closes every descriptor of this process above 2 but those in `keep`, with `close_range`.
/// Only for a single-threaded process about to exec (or a fresh one): the descriptors Rust
/// objects own are closed behind their backs.
pub fn close_fds_except(keep: &[RawFd]) -> Result<(), JailError> {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter_map(|&f| u32::try_from(f).ok())
        .filter(|&f| f > 2)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from = 3u32;
    for f in keep {
        if f > from {
            close_range(from, f - 1)?;
        }
        from = f + 1;
    }
    close_range(from, u32::MAX)
}

fn close_range(first: u32, last: u32) -> Result<(), JailError> {
    // SAFETY: close_range(2) only closes descriptors of this process; callers guarantee that
    // nothing still uses them (see `close_fds_except`).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
    check(rc, || format!("close descriptors {first}..={last}"))?;
    Ok(())
}

/// Writes `data` to an existing file (for /proc and cgroup files).
pub fn write_file(path: &Path, data: &str) -> Result<(), JailError> {
    std::fs::write(path, data).map_err(|e| JailError::Sys {
        step: format!("write {:?} to {}", data.trim(), path.display()),
        source: e,
    })
}

/// `fexecve`: never returns on success.
pub fn fexecve(fd: RawFd, argv: &[CString], env: &[CString]) -> JailError {
    let mut a: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
    a.push(std::ptr::null());
    let mut e: Vec<*const libc::c_char> = env.iter().map(|c| c.as_ptr()).collect();
    e.push(std::ptr::null());
    let empty: &CStr = c"";
    // SAFETY: argv and envp are NULL-terminated arrays of valid strings that outlive the call.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd,
            empty.as_ptr(),
            a.as_ptr(),
            e.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    last("execveat agent")
}

/// Whether the directory `p` is an overlayfs opaque directory (`trusted.overlay.opaque` is
/// `y`): in a lower layer it hides the layers below it.
pub fn is_opaque(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    let mut v = [0u8; 4];
    // SAFETY: valid C strings and a buffer of the given length.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            v.as_mut_ptr().cast(),
            v.len(),
        )
    };
    n == 1 && v[0] == b'y'
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clone3 + CLONE_INTO_CGROUP plumbing used on cgroup v2 hosts, on whatever v2
    /// hierarchy is mounted (controllers are not needed for the placement itself).
    #[test]
    fn clone_into_cgroup_places_the_child() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let root = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(std::path::PathBuf::from)
            .find(|p| p.join("cgroup.controllers").exists());
        let Some(root) = root else {
            eprintln!("skipped: no cgroup v2 hierarchy mounted");
            return;
        };
        let name = format!("rampart-clone3-test-{}", std::process::id());
        let dir = root.join(&name);
        if let Err(e) = std::fs::create_dir(&dir) {
            eprintln!("skipped: cannot make a v2 cgroup: {e}");
            return;
        }
        let cg = std::fs::File::open(&dir).unwrap();
        let mut fds = [0; 2];
        // SAFETY: valid 2-element array.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let args = CloneArgs {
            flags: CLONE_INTO_CGROUP,
            exit_signal: libc::SIGCHLD as u64,
            cgroup: cg.as_raw_fd() as u64,
            ..Default::default()
        };
        // SAFETY: fork-like clone3; the child only calls read(2) and _exit(2), which are
        // async-signal-safe.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if pid == 0 {
            let mut b = [0u8; 1];
            // SAFETY: see above. The child closes its copy of the write end, so that the
            // parent's close ends the read.
            unsafe {
                libc::close(fds[1]);
                libc::read(fds[0], b.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        assert!(pid > 0, "clone3: {}", std::io::Error::last_os_error());
        let seen = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        // SAFETY: closing our pipe ends the child; then reap it.
        unsafe {
            libc::close(fds[1]);
            libc::close(fds[0]);
            libc::waitpid(pid as i32, std::ptr::null_mut(), 0);
        }
        let _ = std::fs::remove_dir(&dir);
        assert!(
            seen.lines().any(|l| l == format!("0::/{name}")),
            "child not in {name}: {seen}"
        );
    }
}
