//! Resource limits of a sandbox.

use serde::{Deserialize, Serialize};

const MIB: u64 = 1024 * 1024;

/// The resource limits a sandbox runs with, fully resolved (defaults applied).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// CPU share in virtual CPUs (1.0 = one full core), enforced as a CFS quota.
    pub cpus: f64,
    /// Memory limit in bytes (cgroup memory limit; exceeding it OOM-kills inside the sandbox).
    pub memory_bytes: u64,
    /// Maximum number of processes and threads.
    pub pids: u64,
    /// Size of the writable layer in bytes; writing past it fails with ENOSPC inside.
    pub disk_bytes: u64,
    /// RLIMIT_NOFILE of every process in the sandbox.
    pub open_files: u64,
}

impl Default for Limits {
    /// The defaults: 1 vCPU, 512 MiB, 1024 pids, 2 GiB disk, 1024 open files.
    fn default() -> Self {
        Limits {
            cpus: 1.0,
            memory_bytes: 512 * MIB,
            pids: 1024,
            disk_bytes: 2048 * MIB,
            open_files: 1024,
        }
    }
}

/// Limits as requested by a caller: every field optional, defaults fill the rest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    /// CPU share in virtual CPUs (e.g. 0.5, 1, 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Memory in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Maximum processes/threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// Writable-layer size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// Open-file limit per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
}

/// Why a limit request was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    /// A value is below the minimum that can run a sandbox.
    #[error("limits.{field}: {value} is below the minimum {min}")]
    TooSmall {
        /// The field name.
        field: &'static str,
        /// The value given.
        value: String,
        /// The minimum.
        min: String,
    },
    /// A value is above the daemon's configured maximum.
    #[error("limits.{field}: {value} is above this daemon's maximum {max}")]
    AboveMaximum {
        /// The field name.
        field: &'static str,
        /// The value given.
        value: String,
        /// The maximum.
        max: String,
    },
}

impl LimitError {
    /// The name of the offending field.
    pub fn field(&self) -> &'static str {
        match self {
            LimitError::TooSmall { field, .. } | LimitError::AboveMaximum { field, .. } => field,
        }
    }
}

/// Minimums below which a sandbox cannot start its agent.
pub const MIN_MEMORY_BYTES: u64 = 16 * MIB;
/// Minimum disk.
pub const MIN_DISK_BYTES: u64 = 16 * MIB;

impl LimitsRequest {
    /// Applies `defaults` to the unset fields and checks the result against `max`.
    pub fn resolve(&self, defaults: &Limits, max: &Limits) -> Result<Limits, LimitError> {
        let l = Limits {
            cpus: self.cpus.unwrap_or(defaults.cpus),
            memory_bytes: self.memory_bytes.unwrap_or(defaults.memory_bytes),
            pids: self.pids.unwrap_or(defaults.pids),
            disk_bytes: self.disk_bytes.unwrap_or(defaults.disk_bytes),
            open_files: self.open_files.unwrap_or(defaults.open_files),
        };
        fn small<T: ToString>(field: &'static str, v: T, min: T) -> LimitError {
            LimitError::TooSmall {
                field,
                value: v.to_string(),
                min: min.to_string(),
            }
        }
        fn big<T: ToString>(field: &'static str, v: T, max: T) -> LimitError {
            LimitError::AboveMaximum {
                field,
                value: v.to_string(),
                max: max.to_string(),
            }
        }
        if !(l.cpus.is_finite() && l.cpus >= 0.01) {
            return Err(small("cpus", l.cpus, 0.01));
        }
        if l.cpus > max.cpus {
            return Err(big("cpus", l.cpus, max.cpus));
        }
        if l.memory_bytes < MIN_MEMORY_BYTES {
            return Err(small("memory_bytes", l.memory_bytes, MIN_MEMORY_BYTES));
        }
        if l.memory_bytes > max.memory_bytes {
            return Err(big("memory_bytes", l.memory_bytes, max.memory_bytes));
        }
        if l.pids < 8 {
            return Err(small("pids", l.pids, 8));
        }
        if l.pids > max.pids {
            return Err(big("pids", l.pids, max.pids));
        }
        if l.disk_bytes < MIN_DISK_BYTES {
            return Err(small("disk_bytes", l.disk_bytes, MIN_DISK_BYTES));
        }
        if l.disk_bytes > max.disk_bytes {
            return Err(big("disk_bytes", l.disk_bytes, max.disk_bytes));
        }
        if l.open_files < 64 {
            return Err(small("open_files", l.open_files, 64));
        }
        if l.open_files > max.open_files {
            return Err(big("open_files", l.open_files, max.open_files));
        }
        Ok(l)
    }
}

/// Parses a human size such as `512M`, `2G`, `1.5GiB`, `1048576`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    let v = n * mult as f64;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max() -> Limits {
        Limits {
            cpus: 2.0,
            memory_bytes: 4 << 30,
            pids: 4096,
            disk_bytes: 10 << 30,
            open_files: 65536,
        }
    }

    #[test]
    fn defaults_fill_unset_fields() {
        let l = LimitsRequest {
            pids: Some(100),
            ..Default::default()
        }
        .resolve(&Limits::default(), &max())
        .unwrap();
        assert_eq!(l.pids, 100);
        assert_eq!(l.memory_bytes, 512 << 20);
    }

    #[test]
    fn above_maximum_names_the_field() {
        let e = LimitsRequest {
            memory_bytes: Some(8 << 30),
            ..Default::default()
        }
        .resolve(&Limits::default(), &max())
        .unwrap_err();
        assert_eq!(e.field(), "memory_bytes");
        assert!(matches!(e, LimitError::AboveMaximum { .. }));
        let e = LimitsRequest {
            cpus: Some(f64::NAN),
            ..Default::default()
        }
        .resolve(&Limits::default(), &max())
        .unwrap_err();
        assert_eq!(e.field(), "cpus");
    }

    #[test]
    fn unknown_limit_keys_are_refused() {
        assert!(serde_json::from_str::<LimitsRequest>(r#"{"memory":1}"#).is_err());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("100"), Some(100));
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size("-1"), None);
    }
}
