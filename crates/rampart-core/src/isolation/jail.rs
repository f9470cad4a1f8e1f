//! The namespace tier ([`rampart_jail::Jail`]) behind the trait: core's types converted to
//! the jail's, and the jail's disk layout (`<store>/snapshots/<name>/disk.img`,
//! `<store>/volumes/<name>.img`).

use super::{
    Capabilities, ColdStop, CounterFiles, CpuFormat, DiskSource, Disks, Freeze, Isolation,
    IsolationError, LaunchExtras, LaunchSpec, Launched, NewVolume, Usage, VolumeSpec, Volumes,
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

impl From<&LaunchSpec> for rampart_jail::LaunchSpec {
    fn from(s: &LaunchSpec) -> Self {
        rampart_jail::LaunchSpec {
            id: s.id.clone(),
            template_dir: s.template_dir.clone(),
            uid_base: s.uid_base,
            limits: s.limits.clone(),
            hostname: s.hostname.clone(),
            env: s.env.clone(),
            layers: s.layers.clone(),
            layers_on_base: s.layers_on_base,
            // Template builds drive the jail themselves (rampart-image); the manager's
            // sandboxes are never build sandboxes.
            build: None,
            agent_args: s.agent_args.clone(),
            files: s
                .files
                .iter()
                .map(|f| rampart_jail::InitFile {
                    path: f.path.clone(),
                    text: f.text.clone(),
                    mode: f.mode,
                })
                .collect(),
        }
    }
}

impl From<rampart_jail::Launched> for Launched {
    fn from(l: rampart_jail::Launched) -> Self {
        Launched {
            pid: l.pid,
            agent_socket: l.agent_socket,
            restored: false,
        }
    }
}

impl From<rampart_jail::Usage> for Usage {
    fn from(u: rampart_jail::Usage) -> Self {
        Usage {
            memory_bytes: u.memory_bytes,
            memory_peak_bytes: u.memory_peak_bytes,
            cpu_usec: u.cpu_usec,
            pids: u.pids,
        }
    }
}

impl From<&DiskSource> for rampart_jail::persist::DiskSource {
    fn from(d: &DiskSource) -> Self {
        rampart_jail::persist::DiskSource {
            image: d.image.clone(),
            uid_base: d.uid_base,
        }
    }
}

impl From<&VolumeSpec> for rampart_jail::persist::VolumeSpec {
    fn from(v: &VolumeSpec) -> Self {
        rampart_jail::persist::VolumeSpec {
            image: v.image.clone(),
            path: v.path.clone(),
            read_only: v.read_only,
        }
    }
}

impl From<&LaunchExtras> for rampart_jail::persist::LaunchExtras {
    fn from(x: &LaunchExtras) -> Self {
        rampart_jail::persist::LaunchExtras {
            disk: x.disk.as_ref().map(Into::into),
            volumes: x.volumes.iter().map(Into::into).collect(),
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
        Ok(Jail::launch(self, &spec.into())?.into())
    }
    fn destroy(&self, id: &SandboxId) -> Result<(), IsolationError> {
        Ok(Jail::destroy(self, id)?)
    }
    fn leftovers(&self) -> Result<Vec<SandboxId>, IsolationError> {
        Ok(Jail::leftovers(self)?)
    }
    fn usage(&self, id: &SandboxId) -> Result<Usage, IsolationError> {
        Ok(Jail::usage(self, id)?.into())
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
        Ok(Jail::launch_with(self, &spec.into(), &extras.into())?.into())
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
        Ok(Jail::relaunch(self, &spec.into(), &extras.into())?.into())
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
    fn launch_specs_convert_field_by_field() {
        let s = LaunchSpec {
            id: SandboxId::parse("abc").unwrap(),
            tier: rampart_types::Tier::Namespace,
            template_dir: "/t".into(),
            uid_base: 1 << 20,
            limits: rampart_types::Limits::default(),
            hostname: "h".into(),
            env: vec![("A".into(), "1".into())],
            layers: vec!["/l1".into(), "/l2".into()],
            layers_on_base: true,
            agent_args: vec!["--default-user".into(), "root".into()],
            files: vec![crate::isolation::InitFile {
                path: "/etc/resolv.conf".into(),
                text: "nameserver 10.0.0.1\n".into(),
                mode: 0o644,
            }],
        };
        let j: rampart_jail::LaunchSpec = (&s).into();
        assert_eq!(j.id, s.id);
        assert_eq!(j.template_dir, s.template_dir);
        assert_eq!(j.uid_base, s.uid_base);
        assert_eq!(j.hostname, s.hostname);
        assert_eq!(j.env, s.env);
        assert_eq!(j.layers, s.layers);
        assert_eq!(j.agent_args, s.agent_args);
        assert_eq!(j.files.len(), 1);
        assert_eq!(j.files[0].path, "/etc/resolv.conf");
        assert_eq!(j.files[0].text, s.files[0].text);
        assert_eq!(j.files[0].mode, 0o644);
        assert!(j.build.is_none());

        let x = LaunchExtras {
            disk: Some(DiskSource {
                image: "/s/disk.img".into(),
                uid_base: 7,
            }),
            volumes: vec![VolumeSpec {
                image: "/v.img".into(),
                path: "/data".into(),
                read_only: true,
            }],
        };
        let jx: rampart_jail::persist::LaunchExtras = (&x).into();
        let d = jx.disk.unwrap();
        assert_eq!((d.image, d.uid_base), (PathBuf::from("/s/disk.img"), 7));
        assert_eq!(jx.volumes.len(), 1);
        assert_eq!(jx.volumes[0].image, PathBuf::from("/v.img"));
        assert_eq!(jx.volumes[0].path, "/data");
        assert!(jx.volumes[0].read_only);
    }

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
