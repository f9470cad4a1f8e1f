//! `GET /sandboxes/{id}/metrics?start=&end=`: the samples of a sandbox's resource use over
//! its life, as E2B keeps them. A sampler takes one sample of every live E2B sandbox every
//! [`INTERVAL`] (CPU % over the interval, memory, disk), keeps the last [`KEEP`] of each
//! (12 hours) in the daemon's memory and forgets a sandbox once it has ended. A request
//! also takes a sample now (so a sandbox younger than one interval has one) and answers the
//! samples whose time is in `[start, end]` (Unix seconds; each side optional), oldest first.

use super::E2b;
use rampart_types::{SandboxId, SandboxInfo, SandboxState};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Time between two samples of a sandbox.
pub(crate) const INTERVAL: Duration = Duration::from_secs(5);
/// Samples kept per sandbox.
pub(crate) const KEEP: usize = 8640;

#[derive(Debug, Clone)]
struct Sample {
    at: OffsetDateTime,
    cpu_usec: u64,
    cpu_count: u64,
    cpu_pct: f64,
    mem_used: u64,
    mem_total: u64,
    disk_used: u64,
    disk_total: u64,
}

impl Sample {
    fn json(&self) -> Value {
        json!({
            "timestamp": self.at.format(&Rfc3339).unwrap_or_default(),
            "timestampUnix": self.at.unix_timestamp(),
            "cpuCount": self.cpu_count,
            "cpuUsedPct": (self.cpu_pct * 100.0).round() / 100.0,
            "memUsed": self.mem_used,
            "memTotal": self.mem_total,
            "memCache": 0,
            "diskUsed": self.disk_used,
            "diskTotal": self.disk_total,
        })
    }
}

/// Every live E2B sandbox's samples.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: Mutex<HashMap<SandboxId, VecDeque<Sample>>>,
}

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, VecDeque<Sample>>> {
        self.samples.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a sample of `info` now and keeps it.
    async fn take(&self, st: &E2b, info: &SandboxInfo) -> Option<Sample> {
        // The sampler is the node's own work.
        let node = rampart_core::Principal::node("e2b-metrics");
        let usage = st
            .manager
            .sandbox(&node, &info.id)
            .ok()?
            .usage()
            .await
            .ok()?;
        let now = OffsetDateTime::now_utc();
        let started = OffsetDateTime::parse(&info.created_at, &Rfc3339).unwrap_or(now);
        let last = self.lock().get(&info.id).and_then(|q| q.back()).cloned();
        // At most one sample a second, so no two share a second of `start`/`end`.
        if let Some(l) = last
            .as_ref()
            .filter(|l| now - l.at < time::Duration::seconds(1))
        {
            return Some(l.clone());
        }
        let (prev_at, prev_cpu) = last.map(|s| (s.at, s.cpu_usec)).unwrap_or((started, 0));
        let elapsed_us = ((now - prev_at).whole_microseconds().max(1)) as f64;
        let cpus = info.limits.cpus.max(0.01);
        let used = usage.cpu_usec.saturating_sub(prev_cpu) as f64;
        let disk_used = std::fs::metadata(
            st.manager
                .data_dir()
                .join("sandboxes")
                .join(info.id.as_str())
                .join("disk.img"),
        )
        .map(|m| {
            use std::os::unix::fs::MetadataExt as _;
            m.blocks() * 512
        })
        .unwrap_or(0);
        let s = Sample {
            at: now,
            cpu_usec: usage.cpu_usec,
            cpu_count: info.limits.cpus.ceil().max(1.0) as u64,
            cpu_pct: (used / elapsed_us / cpus * 100.0).clamp(0.0, 100.0),
            mem_used: usage.memory_bytes,
            mem_total: info.limits.memory_bytes,
            disk_used: disk_used.min(info.limits.disk_bytes),
            disk_total: info.limits.disk_bytes,
        };
        let mut all = self.lock();
        let q = all.entry(info.id.clone()).or_default();
        q.push_back(s.clone());
        while q.len() > KEEP {
            q.pop_front();
        }
        Some(s)
    }

    /// The samples of `id` in `[start, end]` (Unix seconds), oldest first.
    fn range(&self, id: &SandboxId, start: Option<i64>, end: Option<i64>) -> Vec<Value> {
        self.lock()
            .get(id)
            .map(|q| {
                q.iter()
                    .filter(|s| {
                        let t = s.at.unix_timestamp();
                        start.is_none_or(|a| t >= a) && end.is_none_or(|b| t <= b)
                    })
                    .map(Sample::json)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// One round of the sampler: a sample of every live E2B sandbox; ended ones forgotten.
    async fn round(&self, st: &E2b) {
        let node = rampart_core::Principal::node("e2b-metrics");
        let Ok(all) = st.manager.list(&node, None, &Default::default()) else {
            return;
        };
        let mut live = Vec::new();
        for info in all {
            if !matches!(info.state, SandboxState::Running | SandboxState::Paused) {
                continue;
            }
            if !matches!(st.facts(&info.id).await, Ok(Some(_))) {
                continue;
            }
            live.push(info.id.clone());
            self.take(st, &info).await;
        }
        self.lock().retain(|id, _| live.contains(id));
    }
}

/// Starts the sampler (for as long as the daemon runs).
pub(crate) fn start(st: E2b) {
    let history = st.metrics.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            history.round(&st).await;
        }
    });
}

/// The `start`/`end` of a metrics query (Unix seconds).
pub(crate) fn range_of(raw: Option<&str>) -> Result<(Option<i64>, Option<i64>), super::E2bError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw.unwrap_or_default())
        .map_err(|e| super::E2bError::bad_request(format!("query: {e}")))?;
    let (mut start, mut end) = (None, None);
    for (k, v) in pairs {
        let slot = match k.as_str() {
            "start" => &mut start,
            "end" => &mut end,
            _ => continue,
        };
        *slot = Some(v.trim().parse::<i64>().map_err(|_| {
            super::E2bError::bad_request(format!("{k}: {v:?} is not a Unix time in seconds"))
        })?);
    }
    if let (Some(a), Some(b)) = (start, end) {
        if a > b {
            return Err(super::E2bError::bad_request("start is after end"));
        }
    }
    Ok((start, end))
}

/// The answer of a metrics request for a live sandbox: a sample taken now, then the range.
pub(crate) async fn answer(
    st: &E2b,
    info: &SandboxInfo,
    start: Option<i64>,
    end: Option<i64>,
) -> Vec<Value> {
    st.metrics.take(st, info).await;
    st.metrics.range(&info.id, start, end)
}

/// Shared by the handlers and the sampler.
pub(crate) type Shared = Arc<History>;
