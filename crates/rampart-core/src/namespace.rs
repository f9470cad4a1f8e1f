//! The namespace tier (rampart-jail) as the daemon opens it: the copy-on-write store, the
//! sandboxes' directory, the host probe and the pool of warm jailers.

use crate::{CoreConfig, CoreError};

/// Environment variable setting how many jailers the namespace tier keeps warm (cgroup v1
/// hosts; 0 disables the pool). Default [`rampart_jail::DEFAULT_POOL_SIZE`].
pub const JAIL_POOL_ENV: &str = "RAMPART_JAIL_POOL";

fn jail_pool_size() -> usize {
    match std::env::var(JAIL_POOL_ENV) {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) => n.min(64),
            Err(_) => {
                tracing::warn!("{JAIL_POOL_ENV}={v:?} is not a number; using the default");
                rampart_jail::DEFAULT_POOL_SIZE
            }
        },
        Err(_) => rampart_jail::DEFAULT_POOL_SIZE,
    }
}

/// Name of the cgroup subtree holding the sandboxes' cgroups.
pub const DEFAULT_CGROUP_SUBTREE: &str = "rampart";

/// Opens the store under `cfg.data_dir`, probes the host and starts the warm pool; the
/// sandboxes' cgroups go under `subtree`.
pub(crate) async fn open(cfg: &CoreConfig, subtree: &str) -> Result<rampart_jail::Jail, CoreError> {
    // The copy-on-write store (snapshots, fork, volumes): `<data>` or a loop-mounted XFS
    // image at `<data>/store` (rampart_jail::store); sandbox directories live on it.
    let data = cfg.data_dir.clone();
    let store = tokio::task::spawn_blocking(move || rampart_jail::store::Store::open(&data))
        .await
        .map_err(CoreError::task("opening the store"))?
        .map_err(|e| CoreError::isolation("opening the store", e.into()))?;
    // The root of the store mounted at `<data>/store` has the mode its file system was
    // made with (0755): private to the daemon, like the rest of the data directory.
    if store.root() != cfg.data_dir.as_path() {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(store.root(), std::fs::Permissions::from_mode(0o700))
            .map_err(CoreError::io(format!("chmod {}", store.root().display())))?;
    }
    let jail_cfg = rampart_jail::JailConfig {
        state_dir: store.sandboxes_dir(),
        jailer_bin: cfg.jailer_bin.clone(),
        agent_bin: cfg.agent_bin.clone(),
        cgroup_subtree: subtree.to_owned(),
    };
    // Private to the daemon (0700), whatever the umask: the jailer reaches each sandbox's
    // directory as host root.
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&jail_cfg.state_dir)
        .map_err(CoreError::io(format!(
            "creating {}",
            jail_cfg.state_dir.display()
        )))?;
    let pool = jail_pool_size();
    // Warm jailers have disks of the default size ready.
    let disk = cfg.default_limits.disk_bytes;
    let jail = tokio::task::spawn_blocking(move || {
        rampart_jail::Jail::new(jail_cfg).and_then(|j| j.with_pool(pool, disk))
    })
    .await
    .map_err(CoreError::task("host probe"))?
    .map_err(|e| CoreError::isolation("host probe", e.into()))?;
    Ok(jail)
}
