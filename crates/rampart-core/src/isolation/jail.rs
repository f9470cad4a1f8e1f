//! The namespace tier ([`rampart_jail::Jail`]) behind the trait (the seam's types are the
//! same on both sides, `rampart_types::launch`), and the jail's disk layout (`<store>/snapshots/<name>/disk.img`,
//! `<store>/volumes/<name>.img`).

use super::{
    Capabilities, ColdStop, CounterFiles, CpuFormat, Disks, Freeze, Isolation, IsolationError,
    LaunchExtras, LaunchSpec, Launched, NewVolume, Usage, Volumes,
};
use rampart_jail::{CgroupVersion, Jail, JailError};
use rampart_types::SandboxId;
use std::path::{Path, PathBuf};

/// The file holding a snapshot's disk, in its directory.
const SNAPSHOT_IMAGE: &str = "disk.img";

impl From<JailError> for IsolationError {
    fn from(e: JailError) -> Self {
        match e {
            JailError::MissingFeature { .. } => IsolationError::Unsupported(e.to_string()),
            other => IsolationError::Jail(other),
        }
    }
}

impl Isolation for Jail {
    fn name(&self) -> &'static str {
        "namespace"
    }
    fn prepare_template(&self, name: &str, dest: &Path) -> Result<(), IsolationError> {
        match name {
            // The code interpreter's server is added by core (`interpreter::install`).
            "base" | crate::interpreter::TEMPLATE => Ok(rampart_jail::template::build_base(dest)?),
            other => Err(IsolationError::UnknownTemplate(other.to_owned())),
        }
    }
    fn launch(&self, spec: &LaunchSpec) -> Result<Launched, IsolationError> {
        Ok(Jail::launch(self, spec)?)
    }
    fn destroy(&self, id: &SandboxId) -> Result<(), IsolationError> {
        Ok(Jail::destroy(self, id)?)
    }
    fn leftovers(&self) -> Result<Vec<SandboxId>, IsolationError> {
        Ok(Jail::leftovers(self)?)
    }
    fn usage(&self, id: &SandboxId) -> Result<Usage, IsolationError> {
        Ok(Jail::usage(self, id)?)
    }
    fn counter_files(&self, id: &SandboxId) -> Option<CounterFiles> {
        let dirs = self.cgroup_dirs(id);
        match self.features().cgroup {
            CgroupVersion::V2 => {
                let d = dirs.first()?;
                let peak = d.join("memory.peak");
                Some(CounterFiles {
                    cpu: d.join("cpu.stat"),
                    cpu_format: CpuFormat::StatUsageUsec,
                    peak_memory: peak.exists().then_some(peak),
                })
            }
            CgroupVersion::V1 => Some(CounterFiles {
                cpu: dirs
                    .iter()
                    .map(|d| d.join("cpuacct.usage"))
                    .find(|p| p.exists())?,
                cpu_format: CpuFormat::Nanoseconds,
                peak_memory: dirs
                    .iter()
                    .map(|d| d.join("memory.max_usage_in_bytes"))
                    .find(|p| p.exists()),
            }),
        }
    }
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities {
            freeze: Some(self),
            disks: Some(self),
            volumes: Some(self),
            cold: Some(self),
        }
    }
    fn shutdown(&self) {
        self.close_pool();
        self.settle();
    }
}

impl Freeze for Jail {
    fn freeze(&self, id: &SandboxId) -> Result<(), IsolationError> {
        Ok(Jail::freeze(self, id)?)
    }
    fn thaw(&self, id: &SandboxId) -> Result<(), IsolationError> {
        Ok(Jail::thaw(self, id)?)
    }
    fn is_frozen(&self, id: &SandboxId) -> Result<bool, IsolationError> {
        Ok(Jail::is_frozen(self, id)?)
    }
}

impl Disks for Jail {
    fn launch_with(
        &self,
        spec: &LaunchSpec,
        extras: &LaunchExtras,
    ) -> Result<Launched, IsolationError> {
        Ok(Jail::launch_with(self, spec, extras)?)
    }
    fn upper_root(&self, id: &SandboxId) -> Result<std::os::fd::OwnedFd, IsolationError> {
        Ok(Jail::upper_root(self, id)?)
    }
    fn disk_root(&self, id: &SandboxId) -> Result<std::os::fd::OwnedFd, IsolationError> {
        Ok(Jail::disk_root(self, id)?)
    }
    fn snapshot_disk(&self, id: &SandboxId, dest: &Path) -> Result<u64, IsolationError> {
        Ok(Jail::snapshot_disk(self, id, dest)?)
    }
    fn store_root(&self) -> PathBuf {
        Jail::store_root(self)
    }
    fn snapshot_image(&self, dir: &Path) -> Result<PathBuf, IsolationError> {
        Ok(dir.join(SNAPSHOT_IMAGE))
    }
    fn trim_store(&self) {
        rampart_jail::store::trim(&Jail::store_root(self));
    }
}

impl ColdStop for Jail {
    fn stop(&self, id: &SandboxId) -> Result<(), IsolationError> {
        Ok(Jail::stop(self, id)?)
    }
    fn relaunch(
        &self,
        spec: &LaunchSpec,
        extras: &LaunchExtras,
    ) -> Result<Launched, IsolationError> {
        Ok(Jail::relaunch(self, spec, extras)?)
    }
    fn is_stopped(&self, id: &SandboxId) -> bool {
        Jail::is_stopped(self, id)
    }
}

impl Volumes for Jail {
    fn volume_image(&self, name: &str) -> Result<PathBuf, IsolationError> {
        Ok(Jail::store_root(self)
            .join("volumes")
            .join(format!("{name}.img")))
    }
    fn create_volume(&self, image: &Path, size_mib: u64) -> Result<NewVolume, IsolationError> {
        match rampart_jail::persist::create_volume(image, size_mib) {
            Ok(()) => Ok(NewVolume::Created),
            Err(JailError::Sys { ref source, .. })
                if source.raw_os_error() == Some(libc::EEXIST) =>
            {
                Ok(NewVolume::Exists)
            }
            Err(e) => Err(e.into()),
        }
    }
    fn volume_in_use(&self, image: &Path) -> bool {
        rampart_jail::persist::volume_in_use(image)
    }
    fn volume_root(&self, image: &Path) -> Result<std::os::fd::OwnedFd, IsolationError> {
        Ok(rampart_jail::persist::volume_root(image)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_feature_is_unsupported() {
        let e: IsolationError = JailError::MissingFeature {
            feature: "root",
            detail: "x".into(),
        }
        .into();
        assert!(matches!(e, IsolationError::Unsupported(_)));
        let e: IsolationError = JailError::Init("boom".into()).into();
        assert!(matches!(&e, IsolationError::Jail(JailError::Init(m)) if m == "boom"));
        assert!(e.to_string().contains("boom"), "{e}");
    }
}
