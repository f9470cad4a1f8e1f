//! The node's tiers behind one [`Isolation`]: the namespace tier (always) and the gVisor
//! tier (when `runsc` is there). A launch goes to the tier its [`LaunchSpec::tier`] names;
//! every later call names a sandbox and goes to the tier that holds it (found on the host,
//! so it holds across a daemon restart). Core's verbs do not know there are two.
//!
//! A gVisor sandbox's snapshots and forks are copies of it saved to disk with its memory
//! ([`ColdStop::copy_saved`]), launched with [`Disks::launch_with`]. What a gVisor sandbox
//! cannot do (volumes, reading its disk from the host) is refused with
//! [`IsolationError::NotOnTier`], a 400 naming `isolation`.

use super::{
    Capabilities, ColdStop, CounterFiles, Disks, Freeze, Gvisor, Isolation, IsolationError,
    LaunchExtras, LaunchSpec, Launched, Usage,
};
use rampart_types::{SandboxId, Tier};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The node's tiers.
#[derive(Debug)]
pub struct Tiers {
    namespace: Arc<dyn Isolation>,
    /// The gVisor tier, or why this node has none.
    gvisor: Result<Gvisor, String>,
}

impl Tiers {
    /// `namespace` with, when it opened, the gVisor tier (else why not: what a gVisor create
    /// is answered with).
    pub fn new(namespace: Arc<dyn Isolation>, gvisor: Result<Gvisor, String>) -> Tiers {
        Tiers { namespace, gvisor }
    }

    /// The gVisor tier, if this node has one.
    pub fn gvisor(&self) -> Option<&Gvisor> {
        self.gvisor.as_ref().ok()
    }

    /// The tier that holds sandbox `id`.
    fn of(&self, id: &SandboxId) -> &dyn Isolation {
        match &self.gvisor {
            Ok(g) if g.holds(id) => g,
            _ => self.namespace.as_ref(),
        }
    }

    fn on_gvisor(&self, id: &SandboxId) -> bool {
        self.gvisor().is_some_and(|g| g.holds(id))
    }

    fn not_on_gvisor(what: &str) -> IsolationError {
        IsolationError::NotOnTier(format!(
            "a sandbox on the gvisor tier has no {what}; use the namespace tier for it"
        ))
    }
}

impl Isolation for Tiers {
    fn name(&self) -> &'static str {
        self.namespace.name()
    }
    fn offers(&self, tier: Tier) -> bool {
        match tier {
            Tier::Gvisor => self.gvisor.is_ok(),
            other => self.namespace.offers(other),
        }
    }
    fn missing(&self, tier: Tier) -> Option<String> {
        match (tier, &self.gvisor) {
            (Tier::Gvisor, Err(why)) => Some(why.clone()),
            (Tier::Gvisor, Ok(_)) => None,
            (other, _) => self.namespace.missing(other),
        }
    }
    fn prepare_template(&self, name: &str, dest: &Path) -> Result<(), IsolationError> {
        self.namespace.prepare_template(name, dest)
    }
    fn launch(&self, spec: &LaunchSpec) -> Result<Launched, IsolationError> {
        match (spec.tier, &self.gvisor) {
            (Tier::Gvisor, Ok(g)) => g.launch(spec),
            (Tier::Gvisor, Err(why)) => Err(IsolationError::NotOnTier(why.clone())),
            _ => self.namespace.launch(spec),
        }
    }
    fn destroy(&self, id: &SandboxId) -> Result<(), IsolationError> {
        self.of(id).destroy(id)
    }
    fn leftovers(&self) -> Result<Vec<SandboxId>, IsolationError> {
        let mut ids = self.namespace.leftovers()?;
        if let Ok(g) = &self.gvisor {
            ids.extend(g.leftovers()?);
        }
        Ok(ids)
    }
    fn usage(&self, id: &SandboxId) -> Result<Usage, IsolationError> {
        self.of(id).usage(id)
    }
    fn counter_files(&self, id: &SandboxId) -> Option<CounterFiles> {
        self.of(id).counter_files(id)
    }
    fn capabilities(&self) -> Capabilities<'_> {
        let ns = self.namespace.capabilities();
        Capabilities {
            freeze: ns.freeze.map(|_| self as &dyn Freeze),
            disks: ns.disks.map(|_| self as &dyn Disks),
            volumes: ns.volumes,
            cold: ns.cold.map(|_| self as &dyn ColdStop),
        }
    }
    fn shutdown(&self) {
        self.namespace.shutdown();
    }
}

impl Freeze for Tiers {
    fn freeze(&self, id: &SandboxId) -> Result<(), IsolationError> {
        self.of(id).freezer()?.freeze(id)
    }
    fn thaw(&self, id: &SandboxId) -> Result<(), IsolationError> {
        self.of(id).freezer()?.thaw(id)
    }
    fn is_frozen(&self, id: &SandboxId) -> Result<bool, IsolationError> {
        self.of(id).freezer()?.is_frozen(id)
    }
}

impl Disks for Tiers {
    fn launch_with(
        &self,
        spec: &LaunchSpec,
        extras: &LaunchExtras,
    ) -> Result<Launched, IsolationError> {
        match (spec.tier, &self.gvisor) {
            (Tier::Gvisor, _) if !extras.volumes.is_empty() => Err(Self::not_on_gvisor("volumes")),
            (Tier::Gvisor, Ok(g)) => match &extras.disk {
                Some(disk) => g.launch_from(spec, disk),
                None => g.launch(spec),
            },
            (Tier::Gvisor, Err(why)) => Err(IsolationError::NotOnTier(why.clone())),
            _ => self.namespace.disks()?.launch_with(spec, extras),
        }
    }
    fn upper_root(&self, id: &SandboxId) -> Result<std::os::fd::OwnedFd, IsolationError> {
        if self.on_gvisor(id) {
            return Err(Self::not_on_gvisor("disk the host reads"));
        }
        self.namespace.disks()?.upper_root(id)
    }
    fn disk_root(&self, id: &SandboxId) -> Result<std::os::fd::OwnedFd, IsolationError> {
        if self.on_gvisor(id) {
            return Err(Self::not_on_gvisor("disk the host reads"));
        }
        self.namespace.disks()?.disk_root(id)
    }
    fn snapshot_disk(&self, id: &SandboxId, dest: &Path) -> Result<u64, IsolationError> {
        if self.on_gvisor(id) {
            // Its snapshots are copies of it saved to disk (`copy_saved`), which core asks for.
            return Err(IsolationError::Unsupported(format!(
                "sandbox {id} is on the gvisor tier: save it to disk and copy it (copy_saved)"
            )));
        }
        self.namespace.disks()?.snapshot_disk(id, dest)
    }
    fn store_root(&self) -> PathBuf {
        self.namespace
            .disks()
            .map(|d| d.store_root())
            .unwrap_or_default()
    }
    fn snapshot_image(&self, dir: &Path) -> Result<PathBuf, IsolationError> {
        self.namespace.disks()?.snapshot_image(dir)
    }
    fn trim_store(&self) {
        self.namespace.trim_store()
    }
}

impl ColdStop for Tiers {
    fn stop(&self, id: &SandboxId) -> Result<(), IsolationError> {
        self.of(id).cold()?.stop(id)
    }
    fn relaunch(
        &self,
        spec: &LaunchSpec,
        extras: &LaunchExtras,
    ) -> Result<Launched, IsolationError> {
        match (spec.tier, &self.gvisor) {
            (Tier::Gvisor, Ok(g)) => g.relaunch(spec, extras),
            (Tier::Gvisor, Err(why)) => Err(IsolationError::NotOnTier(why.clone())),
            _ => self.namespace.cold()?.relaunch(spec, extras),
        }
    }
    fn is_stopped(&self, id: &SandboxId) -> bool {
        self.of(id).is_stopped(id)
    }
    fn can_checkpoint(&self, id: &SandboxId) -> bool {
        self.of(id).cold().is_ok_and(|c| c.can_checkpoint(id))
    }
    fn checkpoint(&self, id: &SandboxId) -> Result<(), IsolationError> {
        self.of(id).cold()?.checkpoint(id)
    }
    fn copy_saved(&self, id: &SandboxId, dest: &Path, memory: bool) -> Result<u64, IsolationError> {
        self.of(id).cold()?.copy_saved(id, dest, memory)
    }
    fn discard_saved(&self, id: &SandboxId) -> Result<(), IsolationError> {
        self.of(id).cold()?.discard_saved(id)
    }
    fn room_to_checkpoint(&self, id: &SandboxId) -> Result<(), IsolationError> {
        self.of(id).cold()?.room_to_checkpoint(id)
    }
}
