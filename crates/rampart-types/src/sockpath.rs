//! Unix socket paths of any length.
//!
//! `bind(2)` and `connect(2)` take a path of at most 107 bytes (`sun_path`). A data directory
//! deep in a file system (a CI checkout, a home directory on a network mount) puts the
//! agent's and the daemon's sockets past that. [`SocketPath`] keeps such a path usable: it
//! opens the socket's directory and names the socket through `/proc/self/fd/N/NAME`, which
//! the kernel resolves like the long path, for as long as the value lives.

use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::io::AsRawFd as _;
use std::path::{Path, PathBuf};

/// `sun_path`'s size on Linux, its terminating NUL included.
const SUN_PATH: usize = 108;

/// A path to hand to `bind`/`connect` for a socket at a path of any length. Keep it alive
/// until the call returns: it holds the directory open.
#[derive(Debug)]
pub struct SocketPath {
    _dir: Option<File>,
    path: PathBuf,
}

impl SocketPath {
    /// The path itself when it fits; otherwise the socket's name under its open directory.
    /// Fails when the directory cannot be opened or the file name alone does not fit.
    pub fn new(path: &Path) -> io::Result<Self> {
        if path.as_os_str().len() < SUN_PATH {
            return Ok(Self {
                _dir: None,
                path: path.to_path_buf(),
            });
        }
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a socket file path", path.display()),
            ));
        };
        let dir = File::open(parent)?;
        let mut short = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        short.push(name);
        if short.as_os_str().as_bytes().len() >= SUN_PATH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: the socket's file name is longer than a socket path may be",
                    path.display()
                ),
            ));
        }
        Ok(Self {
            _dir: Some(dir),
            path: short,
        })
    }

    /// The path to pass to `bind` or `connect`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_deeper_than_sun_path_binds_and_connects() {
        let base = std::env::temp_dir().join(format!("rampart-sockpath-{}", std::process::id()));
        let deep = base.join("d".repeat(60)).join("e".repeat(60));
        std::fs::create_dir_all(&deep).unwrap();
        let sock = deep.join("agent.sock");
        assert!(sock.as_os_str().len() >= SUN_PATH);
        assert!(std::os::unix::net::UnixListener::bind(&sock).is_err());

        let at = SocketPath::new(&sock).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(at.path()).unwrap();
        drop(at);
        assert!(sock.exists(), "the socket is made at the long path itself");
        let at = SocketPath::new(&sock).unwrap();
        let _client = std::os::unix::net::UnixStream::connect(at.path()).unwrap();
        listener.accept().unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_short_path_is_kept() {
        let at = SocketPath::new(Path::new("/run/rampart.sock")).unwrap();
        assert_eq!(at.path(), Path::new("/run/rampart.sock"));
    }
}
