//! Usage reports (`GET /v1/usage`): each sandbox's usage row (`rampart_store::tenants`)
//! within a time range, with the live figures of the sandboxes still alive, sealed by the
//! node key (`rampart_audit::usage`).
//!
//! What a record counts within `[from, to)`:
//! - time-based figures (running and paused seconds, memory and disk GiB-seconds: the
//!   limit times the time alive) are those of the part of its life inside the range;
//! - counters (vCPU-seconds from its cgroup, egress bytes, commands) are attributed to the
//!   range in proportion to the part of its life inside it, so that the reports of adjacent
//!   ranges add up to its whole (exact when the range holds its whole life);
//! - the memory peak is its whole life's.
//!
//! The paused time of a sandbox whose life crosses the range's edges is likewise
//! proportioned.

use super::Sandboxes;
use crate::util::rfc3339;
use crate::CoreError;
use rampart_audit::usage::milli;
use rampart_types::tenant::{SandboxUsage, UsageReport};
use rampart_types::SandboxId;

const GIB: f64 = (1u64 << 30) as f64;

impl Sandboxes {
    /// The usage of `tenant`'s sandboxes (every sandbox when None) in `[from_ms, to_ms)`,
    /// sealed by the node key.
    pub(crate) async fn usage_report(
        &self,
        tenant: Option<String>,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<UsageReport, CoreError> {
        let rows = self
            .store
            .usage_between(tenant.as_deref(), from_ms, to_ms)
            .map_err(CoreError::from)?;
        let now = rampart_store::now_ms();
        let mut records = Vec::with_capacity(rows.len());
        for (row, execs) in rows {
            let mut cpu_usec = row.cpu_usec;
            let mut peak = row.memory_peak_bytes;
            let mut egress = row.egress_bytes;
            let end = row.ended_at_ms.unwrap_or(now);
            if row.ended_at_ms.is_none() {
                if let Ok(id) = SandboxId::parse(&row.sandbox) {
                    if self.registry.is_up(&id) {
                        let iso = self.iso.clone();
                        let id2 = id.clone();
                        let live = tokio::task::spawn_blocking(move || iso.usage(&id2))
                            .await
                            .ok()
                            .and_then(Result::ok);
                        if let Some(u) = live {
                            cpu_usec = cpu_usec.max(u.cpu_usec);
                            peak = peak.max(u.memory_peak_bytes);
                        }
                    }
                    egress = egress.max(self.netaudit.egress_bytes(&id));
                }
            }
            let life_ms = (end - row.started_at_ms).max(0);
            let paused_ms = row.paused_ms
                + row
                    .paused_at_ms
                    .map_or(0, |p| (end - p).max(0))
                    .min(life_ms);
            let lo = row.started_at_ms.max(from_ms);
            let hi = end.min(to_ms);
            let inside_ms = (hi - lo).max(0);
            let share = if life_ms == 0 {
                1.0
            } else {
                inside_ms as f64 / life_ms as f64
            };
            let inside_s = inside_ms as f64 / 1000.0;
            let paused_s = paused_ms as f64 / 1000.0 * share;
            records.push(SandboxUsage {
                id: row.sandbox,
                tenant: row.tenant,
                template: row.template,
                started_at: rfc3339(row.started_at_ms),
                ended_at: row.ended_at_ms.map(rfc3339),
                vcpu_seconds: milli(cpu_usec as f64 / 1e6 * share),
                memory_gib_seconds: milli(row.limits.memory_bytes as f64 / GIB * inside_s),
                memory_peak_bytes: peak,
                disk_gib_seconds: milli(row.limits.disk_bytes as f64 / GIB * inside_s),
                egress_bytes: (egress as f64 * share).round() as u64,
                exec_count: (execs as f64 * share).round() as u64,
                running_seconds: milli((inside_s - paused_s).max(0.0)),
                paused_seconds: milli(paused_s),
                prev: String::new(),
                hash: String::new(),
            });
        }
        self.audit
            .seal_usage(tenant, rfc3339(from_ms), rfc3339(to_ms), records)
    }
}
