//! The `fs_diff` of a sandbox at destroy: its disk's root is pinned (an open descriptor)
//! while its processes still run, the manifest is computed once they are gone (nothing
//! writes any more; the descriptor keeps the file system), and recorded before `destroyed`.
//! At a snapshot, the same walk with the sandbox frozen, then the `snapshot` event.

use super::fsdiff::{diff_layer, LayerDiff, Layers};
use super::Audit;
use crate::isolation::Isolation;
use rampart_audit::EventBody;
use rampart_store::SandboxStore;
use rampart_types::audit::FsDiff;
use rampart_types::SandboxId;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use tracing::{debug, warn};

/// A pinned writable layer, and the lower layers of its sandbox's template.
pub(crate) struct Pinned {
    root: OwnedFd,
    lowers: Vec<PathBuf>,
}

/// What the manifests need: the record, the tier (the writable layer), the store and the
/// data directory (the template layers).
pub(crate) struct Manifests<'a> {
    pub(crate) audit: &'a Arc<Audit>,
    pub(crate) iso: &'a Arc<dyn Isolation>,
    pub(crate) store: &'a Arc<dyn SandboxStore>,
    pub(crate) data_dir: &'a Path,
}

impl Manifests<'_> {
    /// Pins the writable layer of `id` (None when not recorded: audit or `fs_diff` off,
    /// a tier without access, no chain).
    pub(crate) async fn pin_upper(&self, id: &SandboxId, template: &str) -> Option<Pinned> {
        let cfg = self.audit.config();
        if !cfg.enabled || !cfg.fs_diff {
            return None;
        }
        let iso = self.iso.clone();
        let id2 = id.clone();
        // The disk's root, also of a sandbox whose processes are gone (paused to its
        // filesystem, or dead) while its disk is there.
        let root = match tokio::task::spawn_blocking(move || iso.disks()?.disk_root(&id2)).await {
            Ok(Ok(fd)) => fd,
            Ok(Err(e)) => {
                debug!(id = %id, "fs_diff: no access to the writable layer: {e}");
                return None;
            }
            Err(_) => return None,
        };
        // The template's lower layers, topmost first: those pinned at the sandbox's
        // create (its template's name may point at a rebuild since), else the name's.
        let pinned = rampart_image::Store::open_existing(self.data_dir)
            .and_then(|s| s.pinned_layers(id.as_str()));
        let resolved = || match crate::templates::resolve(self.data_dir, template) {
            Ok(Some(r)) => Some(r.layers),
            _ => None,
        };
        let lowers = match pinned.or_else(resolved) {
            Some(l) => l.into_iter().rev().collect(),
            None => vec![self
                .data_dir
                .join("templates")
                .join(template)
                .join("rootfs")],
        };
        Some(Pinned { root, lowers })
    }

    /// Records what a snapshot holds: the `fs_diff` of the sandbox's writable layer
    /// (`reason: "snapshot"`; on a tier whose disk the host reads), walked with the
    /// sandbox frozen (a running one is frozen for the walk and thawed after; a paused one
    /// stays as it is), then the `snapshot` event. The walk follows the snapshot point, it
    /// is not the same instant: the sandbox runs in between.
    pub(crate) async fn record_snapshot(
        &self,
        id: &SandboxId,
        template: &str,
        paused: bool,
        snapshot: rampart_types::audit::Snapshot,
    ) {
        if let Some(pinned) = self.pin_upper(id, template).await {
            let iso = self.iso.clone();
            let id2 = id.clone();
            let frozen = if paused {
                false
            } else {
                matches!(
                    tokio::task::spawn_blocking(move || iso.freezer()?.freeze(&id2)).await,
                    Ok(Ok(()))
                )
            };
            if paused || frozen {
                self.record_fs_diff(id, pinned, "snapshot").await;
            } else {
                // A running sandbox could swap a directory for a symlink under the
                // walk (which resolves paths on the host): no fs_diff rather than that.
                warn!(id = %id, "snapshot: the sandbox could not be frozen; no fs_diff");
            }
            if frozen {
                let iso = self.iso.clone();
                let id2 = id.clone();
                match tokio::task::spawn_blocking(move || iso.freezer()?.thaw(&id2)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!(id = %id, "thawing after the snapshot's fs_diff: {e}"),
                    Err(e) => warn!(id = %id, "thawing after the snapshot's fs_diff: {e}"),
                }
            }
        }
        let body = EventBody::Snapshot(snapshot);
        if let Err(e) = self.audit.append_if_started(id, body) {
            warn!(id = %id, "recording a snapshot: {e}");
        }
    }

    /// Computes and records the `fs_diff` of a pinned layer (`reason`: `destroy` or
    /// `snapshot`).
    pub(crate) async fn record_fs_diff(&self, id: &SandboxId, pinned: Pinned, reason: &str) {
        let limits = self.audit.config().fs_diff_limits;
        let diff = tokio::task::spawn_blocking(move || {
            let base = PathBuf::from(format!("/proc/self/fd/{}", pinned.root.as_raw_fd()));
            let mut d = LayerDiff::default();
            diff_layer(
                &Layers {
                    upper: base.join("upper"),
                    lowers: pinned.lowers,
                    mount: "/".into(),
                },
                limits,
                &mut d,
            );
            // The host's /usr under the sandbox's own /usr (templates without layers).
            if base.join("usr-upper").is_dir() {
                diff_layer(
                    &Layers {
                        upper: base.join("usr-upper"),
                        lowers: vec![PathBuf::from("/usr")],
                        mount: "/usr".into(),
                    },
                    limits,
                    &mut d,
                );
            }
            drop(pinned.root);
            d
        })
        .await;
        let Ok(d) = diff else {
            warn!(id = %id, "fs_diff: the walk failed");
            return;
        };
        let body = FsDiff {
            reason: reason.to_owned(),
            added: d.added,
            changed: d.changed,
            removed: d.removed,
            truncated: d.truncated,
        };
        let store = self.store.clone();
        // Only for a sandbox whose log was started (its `created` was recorded).
        let recorded = self.audit.record(
            id,
            true,
            |_| EventBody::FsDiff(body),
            Vec::new(),
            |e| match e {
                Some(e) => store.append_event(e).map(|()| Some(e.hash.clone())),
                None => Ok(None),
            },
        );
        match recorded {
            // `destroyed.manifest_digest` names this record.
            Ok(Some(hash)) if reason == "destroy" => {
                if let Ok(h) = rampart_audit::Hash::parse(&hash) {
                    self.audit.set_manifest(id, h);
                }
            }
            Ok(_) => {}
            Err(e) => warn!(id = %id, "recording fs_diff: {e}"),
        }
    }
}
