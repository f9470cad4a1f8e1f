//! What tenants make the host keep besides their sandboxes' disks, snapshots and volumes:
//! their templates' layers, their `COPY` uploads and the artifacts of their ended sandboxes.
//! Every byte of it is the tenant's, counted in its `max_disk_bytes` (the state store's
//! `tenant_stored` table, read in the same admission as the rest of its disk) and collected:
//!
//! - **Uploads** are counted when one is stored ([`crate::template_builds`]), and bounded
//!   while received by what the tenant's quota and the host's disk have left. One no build
//!   used for [`crate::template_builds::BuildConfig::upload_ttl`] (from its upload or its
//!   last use) is removed by the scan.
//! - **Artifacts** are counted when kept (a sandbox's end); they go when their retention
//!   passes (`artifacts`).
//! - **Layers** of a tenant's templates (`<tenant>~<name>`) are counted when its build ends
//!   ready: every layer its templates use, once per tenant.
//! - **The scan** ([`run`]) removes expired uploads and re-measures all three kinds for every
//!   tenant every [`scan_every`] (`RAMPART_DISK_SCAN_SECS`, default 300 s), so what was
//!   removed (expired, deleted templates, pruned artifacts) stops counting.

use crate::sandbox::Sandboxes;
use crate::template_builds::TemplateBuilds;
use rampart_store::SandboxStore;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// A tenant's template layers.
pub const LAYERS: &str = "layers";
/// A tenant's `COPY` uploads.
pub const UPLOADS: &str = "uploads";
/// The artifacts of a tenant's ended sandboxes.
pub const ARTIFACTS: &str = "artifacts";

/// The environment variable setting [`scan_every`], seconds.
pub const SCAN_ENV: &str = "RAMPART_DISK_SCAN_SECS";
/// How often the scan runs by default.
pub const DEFAULT_SCAN_EVERY: Duration = Duration::from_secs(300);
/// A partial upload older than this is a leftover (of a daemon killed while receiving it).
const PART_MAX_AGE: Duration = crate::template_builds::UPLOAD_LINK_TTL;

static LOCK: Mutex<()> = Mutex::new(());

/// Held while measuring and recording, so a measure and an update in between never
/// overwrite each other.
pub(crate) fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// How often the scan runs: `RAMPART_DISK_SCAN_SECS` when a number above 0, else
/// [`DEFAULT_SCAN_EVERY`].
pub fn scan_every() -> Duration {
    match std::env::var(SCAN_ENV) {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Duration::from_secs(n),
            _ => {
                tracing::warn!("{SCAN_ENV}={v:?} is not a number above 0; using the default");
                DEFAULT_SCAN_EVERY
            }
        },
        Err(_) => DEFAULT_SCAN_EVERY,
    }
}

/// What `tenant` holds of disk and its `max_disk_bytes` (0 when unknown or unlimited).
pub(crate) fn disk_quota(store: &dyn SandboxStore, tenant: &str) -> (u64, u64) {
    match store.tenant_disk(tenant) {
        Ok((held, max)) => (held, max.unwrap_or(0)),
        Err(_) => (0, 0),
    }
}

fn age(m: &std::fs::Metadata) -> Duration {
    m.modified()
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .unwrap_or_default()
}

/// Bytes of the uploads kept in an uploads directory (those being received are counted
/// apart, in memory, by `TemplateBuilds::begin_upload`; a partial one left by a killed
/// daemon is removed by the scan).
pub(crate) fn uploads_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tar"))
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Removes the uploads of `dir` unused for `ttl` (and partial ones older than an upload
/// link lives); the count removed.
fn expire_uploads(dir: &Path, ttl: Duration) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if !m.is_file() {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let old = if name.ends_with(".part") {
            age(&m) > PART_MAX_AGE.max(ttl)
        } else {
            name.ends_with(".tar") && age(&m) > ttl
        };
        if old && std::fs::remove_file(e.path()).is_ok() {
            tracing::info!(file = %e.path().display(), "upload removed (unused past its TTL)");
            n += 1;
        }
    }
    n
}

/// Every tenant's template layers under the data directory `data`: each layer its
/// templates use, once per tenant.
fn layers(data: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(store) = rampart_image::Store::open_existing(data) else {
        return out;
    };
    let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for t in store.list() {
        if let Some((tenant, _)) = t.name.split_once('~') {
            keys.entry(tenant.to_owned())
                .or_default()
                .extend(t.layers.iter().cloned());
        }
    }
    for (tenant, ks) in keys {
        let bytes = ks
            .iter()
            .filter_map(|k| store.layer_info(k))
            .map(|i| i.size_bytes)
            .sum();
        out.insert(tenant, bytes);
    }
    out
}

/// Records what `tenant`'s templates' layers hold now.
pub(crate) fn measure_layers_of(data: &Path, store: &dyn SandboxStore, tenant: &str) {
    let _g = lock();
    let bytes = layers(data).get(tenant).copied().unwrap_or(0);
    if let Err(e) = store.set_stored(tenant, LAYERS, bytes) {
        tracing::warn!(tenant, "recording the tenant's template layers: {e}");
    }
}

/// Every tenant's artifacts under `dir` (`<data>/artifacts`), by its sandboxes' records.
fn artifacts(dir: &Path, store: &dyn SandboxStore) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(id) = rampart_types::SandboxId::parse(&name) else {
            continue;
        };
        let Ok(Some(rec)) = store.get(&id) else {
            continue;
        };
        if let Some(t) = rec.tenant {
            *out.entry(t).or_default() += rampart_image::store::tree_size(&e.path());
        }
    }
    out
}

/// Adds a sandbox's kept artifacts (`dir`) to what `tenant` holds.
pub(crate) fn add_artifacts(store: &dyn SandboxStore, tenant: &str, dir: &Path) {
    let _g = lock();
    let bytes = rampart_image::store::tree_size(dir);
    if let Err(e) = store.add_stored(tenant, ARTIFACTS, bytes) {
        tracing::warn!(tenant, "recording the tenant's artifacts: {e}");
    }
}

/// One scan: removes expired uploads, then records what every tenant holds of each kind.
pub(crate) fn scan(inner: &Sandboxes, builds: &TemplateBuilds) {
    let ttl = builds.config().upload_ttl;
    let data = inner.data_dir().to_path_buf();
    let store = &*inner.store;
    let record = |kind: &str, m: BTreeMap<String, u64>| {
        let v: Vec<(String, u64)> = m.into_iter().collect();
        if let Err(e) = store.replace_stored(kind, &v) {
            tracing::warn!("recording what tenants keep ({kind}): {e}");
        }
    };
    {
        let _g = lock();
        let mut up = BTreeMap::new();
        for (owner, dir) in builds.upload_dirs() {
            expire_uploads(&dir, ttl);
            if let Some(t) = owner {
                up.insert(t, uploads_bytes(&dir));
            }
        }
        record(UPLOADS, up);
    }
    {
        let _g = lock();
        record(ARTIFACTS, artifacts(&data.join("artifacts"), store));
    }
    {
        let _g = lock();
        record(LAYERS, layers(&data));
    }
}

/// Runs [`scan`] at start and every [`scan_every`] until the daemon stops.
pub(crate) async fn run(inner: Arc<Sandboxes>, builds: Arc<TemplateBuilds>) {
    let mut tick = tokio::time::interval(scan_every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if inner.is_stopped() {
            return;
        }
        let (i, b) = (inner.clone(), builds.clone());
        if let Err(e) = tokio::task::spawn_blocking(move || scan(&i, &b)).await {
            tracing::warn!("the disk scan failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn age_by(p: &Path, d: Duration) {
        std::fs::File::options()
            .append(true)
            .open(p)
            .unwrap()
            .set_modified(SystemTime::now() - d)
            .unwrap();
    }

    #[test]
    fn unused_uploads_expire_and_partial_ones_only_when_left_behind() {
        let t = tempfile::tempdir().unwrap();
        let tar = t.path().join(format!("{}.tar", "a".repeat(64)));
        let part = t.path().join(".x.part");
        std::fs::write(&tar, vec![0u8; 1000]).unwrap();
        std::fs::write(&part, vec![0u8; 10]).unwrap();
        assert_eq!(uploads_bytes(t.path()), 1000);
        let ttl = Duration::from_secs(60);
        assert_eq!(expire_uploads(t.path(), ttl), 0);
        // Unused past its TTL: removed; a partial one younger than an upload link: kept.
        age_by(&tar, Duration::from_secs(120));
        age_by(&part, Duration::from_secs(120));
        assert_eq!(expire_uploads(t.path(), ttl), 1);
        assert!(!tar.exists() && part.exists());
        age_by(&part, PART_MAX_AGE + Duration::from_secs(60));
        assert_eq!(expire_uploads(t.path(), ttl), 1);
        assert_eq!(uploads_bytes(t.path()), 0);
    }
}
