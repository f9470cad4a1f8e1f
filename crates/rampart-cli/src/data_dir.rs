//! Where the data directory is by default: shared by the daemon (`rampart serve`), the
//! commands that open its stores directly (`keys`, `template`) and the client, which looks
//! for the daemon's socket there.

use anyhow::{anyhow, Result};
use std::path::PathBuf;

/// The default data directory: /var/lib/rampart for root, else under $XDG_DATA_HOME.
pub(crate) fn default_data_dir() -> Result<PathBuf> {
    if nix::unistd::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/rampart"));
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(x).join("rampart"));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .ok_or_else(|| anyhow!("neither XDG_DATA_HOME nor HOME is set: pass --data-dir"))?;
    Ok(PathBuf::from(home).join(".local/share/rampart"))
}
