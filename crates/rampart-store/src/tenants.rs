//! Tenants and their quotas, and the usage of every sandbox (`docs/tenants.md`).
//!
//! A tenant is a name and its [`Quotas`]. Each sandbox row names its tenant (none: the
//! node's own); a tenant's snapshots, volumes and stored secrets are stored under the name
//! `<tenant>:<name>` (`:` is in neither a tenant name nor an object name), so the tables
//! need no column for them and two tenants may use the same name.
//!
//! The quotas are checked by [`admit`] inside the transaction that inserts a sandbox
//! (`SqliteStore::insert_creating`), against the rows it reads in that same transaction:
//! two creates at the limit cannot both pass. A usage row per sandbox is written in that
//! transaction too, and finished when the sandbox ends ([`finish_usage`]).

use crate::{now_ms, side, StoreError};
use rampart_types::tenant::{
    check_tenant_name, Holdings, QuotaError, QuotaRefusal, Quotas, TenantNameError,
};
use rampart_types::{ApprovalPolicy, Limits};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::Mutex;

/// The tenants table (idempotent; also in the state store's migration 7).
pub(crate) const TENANTS_TABLE: &str = "CREATE TABLE IF NOT EXISTS tenants (
        name TEXT PRIMARY KEY NOT NULL,
        quotas TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS tenant_approvals (
        tenant TEXT PRIMARY KEY NOT NULL,
        policy TEXT NOT NULL
    );";

/// Migration 9: what tenants make the host keep besides sandboxes, snapshots and volumes
/// (template layers, `COPY` uploads, artifacts), bytes per tenant and kind, as the daemon
/// last measured it; counted in `max_disk_bytes` ([`holdings`]).
pub(crate) const MIGRATION_9: &str = "CREATE TABLE IF NOT EXISTS tenant_stored (
        tenant TEXT NOT NULL,
        kind TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        PRIMARY KEY (tenant, kind)
    );";

/// Migration 7: the sandbox's tenant, tenants, usage rows and the node's change log.
pub(crate) const MIGRATION_7: &str = "ALTER TABLE sandboxes ADD COLUMN tenant TEXT;
    CREATE INDEX sandboxes_tenant ON sandboxes(tenant, state);
    CREATE TABLE IF NOT EXISTS tenants (
        name TEXT PRIMARY KEY NOT NULL,
        quotas TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE usage_records (
        sandbox TEXT PRIMARY KEY NOT NULL,
        tenant TEXT,
        template TEXT NOT NULL,
        limits TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        ended_at INTEGER,
        paused_at INTEGER,
        paused_ms INTEGER NOT NULL DEFAULT 0,
        cpu_usec INTEGER NOT NULL DEFAULT 0,
        memory_peak_bytes INTEGER NOT NULL DEFAULT 0,
        egress_bytes INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX usage_records_time ON usage_records(tenant, started_at);
    CREATE TABLE change_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        principal TEXT NOT NULL,
        key_id TEXT,
        tenant TEXT,
        method TEXT NOT NULL,
        path TEXT NOT NULL,
        status INTEGER NOT NULL
    );";

/// A tenant as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantRow {
    /// Its name.
    pub name: String,
    /// Its quotas.
    pub quotas: Quotas,
    /// Creation time, unix ms.
    pub created_at_ms: i64,
}

/// Why a tenant could not be made, changed or removed.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    /// A name outside `[a-z0-9._-]{1,64}`.
    #[error(transparent)]
    Name(#[from] TenantNameError),
    /// A quota out of range.
    #[error("quotas.{0}")]
    Quota(#[from] QuotaError),
    /// A tenant of this name exists.
    #[error("tenant {0} already exists")]
    Exists(String),
    /// No tenant of this name.
    #[error("tenant {0} not found")]
    NotFound(String),
    /// It still has alive sandboxes.
    #[error("tenant {name} has {alive} alive sandbox(es); destroy them first")]
    Busy {
        /// The tenant.
        name: String,
        /// Its alive sandboxes.
        alive: u64,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<rusqlite::Error> for TenantError {
    fn from(e: rusqlite::Error) -> Self {
        TenantError::Store(e.into())
    }
}

/// The store of tenants (SQLite, in `state.db`). Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct TenantStore {
    conn: Mutex<Connection>,
}

fn quotas_of(id: &str, text: &str) -> Result<Quotas, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        id: format!("tenant {id}"),
        detail: e.to_string(),
    })
}

fn quotas_text(q: &Quotas) -> String {
    // Plain data with no map keys: serializing cannot fail.
    serde_json::to_string(q).unwrap_or_else(|_| "{}".into())
}

/// Whether table `name` exists (the side stores may open a database the daemon never
/// migrated).
fn has_table(conn: &Connection, name: &str) -> Result<bool, rusqlite::Error> {
    conn.query_row(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [name],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// The prefix of a tenant's object names.
pub fn qualified(tenant: &str, name: &str) -> String {
    format!("{tenant}:{name}")
}

/// `(lo, hi)` such that a name `n` is `tenant:...` iff `lo <= n < hi` (`;` follows `:`).
fn name_range(tenant: &str) -> (String, String) {
    (format!("{tenant}:"), format!("{tenant};"))
}

impl TenantStore {
    /// Opens the database at `path` (the daemon's `state.db`), creating the table if needed.
    pub fn open(path: &Path) -> Result<TenantStore, StoreError> {
        Ok(TenantStore {
            conn: side::open(path, TENANTS_TABLE)?,
        })
    }

    /// An in-memory store (tests).
    pub fn open_in_memory() -> Result<TenantStore, StoreError> {
        Ok(TenantStore {
            conn: side::open_in_memory(TENANTS_TABLE)?,
        })
    }

    /// Makes a tenant.
    pub fn create(&self, name: &str, quotas: &Quotas) -> Result<TenantRow, TenantError> {
        check_tenant_name(name)?;
        quotas.check()?;
        let row = TenantRow {
            name: name.to_owned(),
            quotas: quotas.clone(),
            created_at_ms: now_ms(),
        };
        let conn = side::lock(&self.conn);
        let res = conn.execute(
            "INSERT INTO tenants (name, quotas, created_at) VALUES (?1, ?2, ?3)",
            params![row.name, quotas_text(quotas), row.created_at_ms],
        );
        match res {
            Ok(_) => Ok(row),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(TenantError::Exists(name.to_owned()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// One tenant.
    pub fn get(&self, name: &str) -> Result<Option<TenantRow>, StoreError> {
        get(&side::lock(&self.conn), name)
    }

    /// Every tenant, by name.
    pub fn list(&self) -> Result<Vec<TenantRow>, StoreError> {
        let conn = side::lock(&self.conn);
        let mut stmt =
            conn.prepare("SELECT name, quotas, created_at FROM tenants ORDER BY name")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (name, q, at) = r?;
            out.push(TenantRow {
                quotas: quotas_of(&name, &q)?,
                name,
                created_at_ms: at,
            });
        }
        Ok(out)
    }

    /// Makes tenant `name` with `quotas`, or brings an existing one's quotas to them (a copy
    /// of a tenant kept elsewhere, e.g. a fleet's); nothing is written when they are equal.
    pub fn ensure(&self, name: &str, quotas: &Quotas) -> Result<(), TenantError> {
        match self.get(name)? {
            Some(row) if &row.quotas == quotas => Ok(()),
            Some(_) => self.set_quotas(name, quotas).map(|_| ()),
            None => self.create(name, quotas).map(|_| ()),
        }
    }

    /// Replaces a tenant's quotas (creates already admitted stay).
    pub fn set_quotas(&self, name: &str, quotas: &Quotas) -> Result<TenantRow, TenantError> {
        quotas.check()?;
        let conn = side::lock(&self.conn);
        let n = conn.execute(
            "UPDATE tenants SET quotas = ?2 WHERE name = ?1",
            params![name, quotas_text(quotas)],
        )?;
        if n == 0 {
            return Err(TenantError::NotFound(name.to_owned()));
        }
        get(&conn, name)?.ok_or_else(|| TenantError::NotFound(name.to_owned()))
    }

    /// The approval policy every sandbox of `name` is held to (none: no default).
    pub fn approvals(&self, name: &str) -> Result<Option<ApprovalPolicy>, StoreError> {
        let conn = side::lock(&self.conn);
        let text: Option<String> = conn
            .query_row(
                "SELECT policy FROM tenant_approvals WHERE tenant = ?1",
                [name],
                |r| r.get(0),
            )
            .optional()?;
        text.map(|t| {
            serde_json::from_str(&t).map_err(|e| StoreError::Corrupt {
                id: name.to_owned(),
                detail: format!("tenant approval policy: {e}"),
            })
        })
        .transpose()
    }

    /// Sets (or, with None, removes) the approval policy of tenant `name` (checked by the
    /// caller: the store does not know the pattern syntax).
    pub fn set_approvals(
        &self,
        name: &str,
        policy: Option<&ApprovalPolicy>,
    ) -> Result<(), TenantError> {
        let conn = side::lock(&self.conn);
        if get(&conn, name)?.is_none() {
            return Err(TenantError::NotFound(name.to_owned()));
        }
        match policy {
            Some(p) => {
                let text = serde_json::to_string(p).expect("a policy encodes");
                conn.execute(
                    "INSERT INTO tenant_approvals (tenant, policy) VALUES (?1, ?2)
                     ON CONFLICT(tenant) DO UPDATE SET policy = excluded.policy",
                    params![name, text],
                )?;
            }
            None => {
                conn.execute("DELETE FROM tenant_approvals WHERE tenant = ?1", [name])?;
            }
        }
        Ok(())
    }

    /// Removes a tenant with no alive sandbox, and in the same transaction revokes its
    /// native keys and deletes its E2B keys. Its ended sandboxes' records and usage stay.
    pub fn delete(&self, name: &str) -> Result<(), TenantError> {
        let mut conn = side::lock(&self.conn);
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if get(&tx, name)?.is_none() {
            return Err(TenantError::NotFound(name.to_owned()));
        }
        let h = holdings(&tx, name)?;
        let alive = h.sandboxes + h.paused;
        if alive > 0 {
            return Err(TenantError::Busy {
                name: name.to_owned(),
                alive,
            });
        }
        if has_table(&tx, "node_keys")? {
            tx.execute(
                "UPDATE node_keys SET revoked_at = ?2 WHERE tenant = ?1 AND revoked_at IS NULL",
                params![name, now_ms()],
            )?;
        }
        if has_table(&tx, "api_keys")? {
            tx.execute("DELETE FROM api_keys WHERE tenant = ?1", [name])?;
        }
        tx.execute("DELETE FROM tenant_approvals WHERE tenant = ?1", [name])?;
        tx.execute("DELETE FROM tenants WHERE name = ?1", [name])?;
        tx.commit()?;
        Ok(())
    }

    /// What a tenant holds now.
    pub fn holdings(&self, name: &str) -> Result<Holdings, StoreError> {
        holdings(&side::lock(&self.conn), name)
    }
}

pub(crate) fn get(conn: &Connection, name: &str) -> Result<Option<TenantRow>, StoreError> {
    let row = conn
        .query_row(
            "SELECT quotas, created_at FROM tenants WHERE name = ?1",
            [name],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
        )
        .optional()?;
    row.map(|(q, at)| {
        Ok(TenantRow {
            name: name.to_owned(),
            quotas: quotas_of(name, &q)?,
            created_at_ms: at,
        })
    })
    .transpose()
}

/// What `tenant` holds, read on `conn` (inside the caller's transaction when it has one).
pub(crate) fn holdings(conn: &Connection, tenant: &str) -> Result<Holdings, StoreError> {
    let mut h = Holdings::default();
    if has_table(conn, "sandboxes")? {
        let mut stmt = conn.prepare_cached(
            "SELECT state, limits FROM sandboxes WHERE tenant = ?1 \
             AND state IN ('creating','running','paused','stopping')",
        )?;
        let rows = stmt.query_map([tenant], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?;
        for r in rows {
            let (state, limits) = r?;
            let l: Limits = serde_json::from_str(&limits).map_err(|e| StoreError::Corrupt {
                id: format!("a sandbox of tenant {tenant}"),
                detail: e.to_string(),
            })?;
            if state == "paused" {
                h.paused += 1;
            } else {
                h.sandboxes += 1;
                h.vcpus += l.cpus;
            }
            h.memory_bytes += l.memory_bytes;
            h.disk_bytes += l.disk_bytes;
        }
    }
    let (lo, hi) = name_range(tenant);
    if has_table(conn, "snapshots")? {
        let b: i64 = conn.query_row(
            "SELECT COALESCE(SUM(size_bytes), 0) FROM snapshots WHERE name >= ?1 AND name < ?2",
            params![lo, hi],
            |r| r.get(0),
        )?;
        h.disk_bytes += b.max(0) as u64;
    }
    if has_table(conn, "volumes")? {
        let mib: i64 = conn.query_row(
            "SELECT COALESCE(SUM(size_mib), 0) FROM volumes WHERE name >= ?1 AND name < ?2",
            params![lo, hi],
            |r| r.get(0),
        )?;
        h.disk_bytes += (mib.max(0) as u64) << 20;
    }
    if has_table(conn, "tenant_stored")? {
        let b: i64 = conn.query_row(
            "SELECT COALESCE(SUM(bytes), 0) FROM tenant_stored WHERE tenant = ?1",
            [tenant],
            |r| r.get(0),
        )?;
        h.stored_bytes = b.max(0) as u64;
        h.disk_bytes += h.stored_bytes;
    }
    Ok(h)
}

/// Replaces what every tenant holds of `kind` (`layers`, `uploads`, `artifacts`) with
/// `per_tenant` (a tenant not in it holds none), in one transaction.
pub(crate) fn replace_stored(
    conn: &mut Connection,
    kind: &str,
    per_tenant: &[(String, u64)],
) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute("DELETE FROM tenant_stored WHERE kind = ?1", [kind])?;
    for (t, b) in per_tenant {
        if *b > 0 {
            tx.execute(
                "INSERT INTO tenant_stored (tenant, kind, bytes) VALUES (?1, ?2, ?3)",
                params![t, kind, i64::try_from(*b).unwrap_or(i64::MAX)],
            )?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// Sets what `tenant` holds of `kind`.
pub(crate) fn set_stored(
    conn: &Connection,
    tenant: &str,
    kind: &str,
    bytes: u64,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO tenant_stored (tenant, kind, bytes) VALUES (?1, ?2, ?3) \
         ON CONFLICT (tenant, kind) DO UPDATE SET bytes = excluded.bytes",
        params![tenant, kind, i64::try_from(bytes).unwrap_or(i64::MAX)],
    )?;
    Ok(())
}

/// Adds `bytes` to what `tenant` holds of `kind`.
pub(crate) fn add_stored(
    conn: &Connection,
    tenant: &str,
    kind: &str,
    bytes: u64,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO tenant_stored (tenant, kind, bytes) VALUES (?1, ?2, ?3) \
         ON CONFLICT (tenant, kind) DO UPDATE SET bytes = bytes + excluded.bytes",
        params![tenant, kind, i64::try_from(bytes).unwrap_or(i64::MAX)],
    )?;
    Ok(())
}

/// `tenant`'s disk: what it holds (as `max_disk_bytes` counts) and that quota (None: none).
pub(crate) fn disk_of(conn: &Connection, tenant: &str) -> Result<(u64, Option<u64>), StoreError> {
    let Some(t) = get(conn, tenant)? else {
        return Err(StoreError::NoTenant(tenant.to_owned()));
    };
    Ok((holdings(conn, tenant)?.disk_bytes, t.quotas.max_disk_bytes))
}

fn refuse(limit: &str, used: f64, requested: f64, max: f64) -> StoreError {
    StoreError::Quota(QuotaRefusal {
        limit: limit.to_owned(),
        used,
        requested,
        max,
    })
}

/// What a sandbox adds to a tenant's holdings.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Demand {
    /// Sandboxes that are not paused.
    pub sandboxes: u64,
    /// Paused sandboxes.
    pub paused: u64,
    /// vCPUs (of sandboxes that are not paused).
    pub vcpus: f64,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// Disk, bytes.
    pub disk_bytes: u64,
}

impl Demand {
    /// What a new (running) sandbox with `limits` adds.
    pub fn sandbox(limits: &Limits) -> Demand {
        Demand {
            sandboxes: 1,
            paused: 0,
            vcpus: limits.cpus,
            memory_bytes: limits.memory_bytes,
            disk_bytes: limits.disk_bytes,
        }
    }
}

/// Checks, on `conn` (in the admitting transaction), that `tenant` may take on `d`. A
/// tenant that does not exist (removed since its key was checked) is refused.
pub(crate) fn admit(conn: &Connection, tenant: &str, d: &Demand) -> Result<(), StoreError> {
    let Some(t) = get(conn, tenant)? else {
        return Err(StoreError::NoTenant(tenant.to_owned()));
    };
    let q = &t.quotas;
    let h = holdings(conn, tenant)?;
    // (quota, most, held, asked for); u64 figures are exact in f64 below 2^53.
    let checks = [
        (
            "max_sandboxes",
            q.max_sandboxes.map(|m| m as f64),
            h.sandboxes as f64,
            d.sandboxes as f64,
        ),
        (
            "max_paused",
            q.max_paused.map(|m| m as f64),
            h.paused as f64,
            d.paused as f64,
        ),
        ("max_vcpus", q.max_vcpus, h.vcpus, d.vcpus),
        (
            "max_memory_bytes",
            q.max_memory_bytes.map(|m| m as f64),
            h.memory_bytes as f64,
            d.memory_bytes as f64,
        ),
        (
            "max_disk_bytes",
            q.max_disk_bytes.map(|m| m as f64),
            h.disk_bytes as f64,
            d.disk_bytes as f64,
        ),
    ];
    for (limit, max, used, asked) in checks {
        if let Some(max) = max {
            // Only what the request adds is limited: a tenant over a lowered quota may
            // still do what adds nothing (destroy, pause when only `max_sandboxes` is over).
            if asked > 0.0 && used + asked > max + 1e-9 {
                return Err(refuse(limit, used, asked, max));
            }
        }
    }
    Ok(())
}

/// A sandbox's usage row.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRow {
    /// The sandbox.
    pub sandbox: String,
    /// Its tenant.
    pub tenant: Option<String>,
    /// Its template.
    pub template: String,
    /// Its limits.
    pub limits: Limits,
    /// Created, unix ms.
    pub started_at_ms: i64,
    /// Ended, unix ms.
    pub ended_at_ms: Option<i64>,
    /// Paused since, unix ms (while paused).
    pub paused_at_ms: Option<i64>,
    /// Time paused before `paused_at_ms`, ms.
    pub paused_ms: i64,
    /// CPU used, µs (final once ended; the live figure is read from the tier).
    pub cpu_usec: u64,
    /// Peak memory, bytes.
    pub memory_peak_bytes: u64,
    /// Bytes sent out.
    pub egress_bytes: u64,
}

/// Writes a new sandbox's usage row (in its create transaction).
pub(crate) fn insert_usage(
    conn: &Connection,
    id: &str,
    tenant: Option<&str>,
    template: &str,
    limits: &str,
    at_ms: i64,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO usage_records (sandbox, tenant, template, limits, started_at) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![id, tenant, template, limits, at_ms])?;
    Ok(())
}

/// Marks a sandbox's usage row paused (`true`) or running again at `at_ms`.
pub(crate) fn usage_paused(
    conn: &Connection,
    id: &str,
    paused: bool,
    at_ms: i64,
) -> Result<(), StoreError> {
    if paused {
        conn.execute(
            "UPDATE usage_records SET paused_at = ?2 WHERE sandbox = ?1 AND paused_at IS NULL",
            params![id, at_ms],
        )?;
    } else {
        conn.execute(
            "UPDATE usage_records SET paused_ms = paused_ms + MAX(0, ?2 - paused_at), \
             paused_at = NULL WHERE sandbox = ?1 AND paused_at IS NOT NULL",
            params![id, at_ms],
        )?;
    }
    Ok(())
}

/// The final figures of a sandbox that ended at `at_ms`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FinalUsage {
    /// CPU used, µs.
    pub cpu_usec: u64,
    /// Peak memory, bytes.
    pub memory_peak_bytes: u64,
    /// Bytes sent out.
    pub egress_bytes: u64,
}

/// Finishes a sandbox's usage row: its end time (the first one given stays) and its final
/// figures (the highest given stay).
pub(crate) fn finish_usage(
    conn: &Connection,
    id: &str,
    at_ms: i64,
    f: &FinalUsage,
) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE usage_records SET ended_at = COALESCE(ended_at, ?2), \
         paused_ms = paused_ms + CASE WHEN paused_at IS NULL THEN 0 ELSE MAX(0, ?2 - paused_at) END, \
         paused_at = NULL, cpu_usec = MAX(cpu_usec, ?3), \
         memory_peak_bytes = MAX(memory_peak_bytes, ?4), egress_bytes = MAX(egress_bytes, ?5) \
         WHERE sandbox = ?1",
        params![
            id,
            at_ms,
            f.cpu_usec as i64,
            f.memory_peak_bytes as i64,
            f.egress_bytes as i64
        ],
    )?;
    Ok(())
}

/// Usage rows of sandboxes alive at some time in `[from_ms, to_ms)`, of `tenant` (every
/// sandbox when None), oldest first.
pub(crate) fn usage_between(
    conn: &Connection,
    tenant: Option<&str>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<UsageRow>, StoreError> {
    let sql = "SELECT sandbox, tenant, template, limits, started_at, ended_at, paused_at, \
               paused_ms, cpu_usec, memory_peak_bytes, egress_bytes FROM usage_records \
               WHERE started_at < ?2 AND (ended_at IS NULL OR ended_at > ?1) \
               AND (?3 IS NULL OR tenant = ?3) ORDER BY started_at, sandbox";
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params![from_ms, to_ms, tenant], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, Option<String>>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, i64>(4)?,
            r.get::<_, Option<i64>>(5)?,
            r.get::<_, Option<i64>>(6)?,
            r.get::<_, i64>(7)?,
            r.get::<_, i64>(8)?,
            r.get::<_, i64>(9)?,
            r.get::<_, i64>(10)?,
        ))
    })?;
    let mut out = Vec::new();
    for r in rows {
        let (
            sandbox,
            tenant,
            template,
            limits,
            started,
            ended,
            paused_at,
            paused_ms,
            cpu,
            peak,
            egress,
        ) = r?;
        let limits: Limits = serde_json::from_str(&limits).map_err(|e| StoreError::Corrupt {
            id: sandbox.clone(),
            detail: e.to_string(),
        })?;
        out.push(UsageRow {
            sandbox,
            tenant,
            template,
            limits,
            started_at_ms: started,
            ended_at_ms: ended,
            paused_at_ms: paused_at,
            paused_ms,
            cpu_usec: cpu.max(0) as u64,
            memory_peak_bytes: peak.max(0) as u64,
            egress_bytes: egress.max(0) as u64,
        });
    }
    Ok(out)
}

/// One entry of the node's change log.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Change {
    /// Its number (increasing).
    pub seq: i64,
    /// When, unix ms.
    pub at_ms: i64,
    /// Who (as the audit record names callers).
    pub principal: String,
    /// The key used, if any.
    pub key_id: Option<String>,
    /// The caller's tenant, if any.
    pub tenant: Option<String>,
    /// HTTP method.
    pub method: String,
    /// Request path (never the query, which may carry tokens).
    pub path: String,
    /// The answer's status.
    pub status: u16,
}

/// Appends changes to the log, in one transaction.
pub(crate) fn append_changes(conn: &mut Connection, changes: &[Change]) -> Result<(), StoreError> {
    let tx = conn.transaction()?;
    {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO change_log (at, principal, key_id, tenant, method, path, status) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        for c in changes {
            stmt.execute(params![
                c.at_ms,
                c.principal,
                c.key_id,
                c.tenant,
                c.method,
                c.path,
                c.status
            ])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// Changes with `seq > after`, of `tenant` when given, at most `limit`.
pub(crate) fn changes(
    conn: &Connection,
    tenant: Option<&str>,
    after: i64,
    limit: usize,
) -> Result<Vec<Change>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, at, principal, key_id, tenant, method, path, status FROM change_log \
         WHERE seq > ?1 AND (?2 IS NULL OR tenant = ?2) ORDER BY seq LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![after, tenant, limit as i64], |r| {
        Ok(Change {
            seq: r.get(0)?,
            at_ms: r.get(1)?,
            principal: r.get(2)?,
            key_id: r.get(3)?,
            tenant: r.get(4)?,
            method: r.get(5)?,
            path: r.get(6)?,
            status: r.get::<_, i64>(7)? as u16,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_quotas_are_checked_and_nothing_is_half_made() {
        let s = TenantStore::open_in_memory().unwrap();
        for bad in ["", "Acme", "a b", "a:b", &"x".repeat(65)] {
            assert!(matches!(
                s.create(bad, &Quotas::default()),
                Err(TenantError::Name(_))
            ));
        }
        let absurd = Quotas {
            max_vcpus: Some(-1.0),
            ..Quotas::default()
        };
        assert!(matches!(
            s.create("acme", &absurd),
            Err(TenantError::Quota(_))
        ));
        assert!(s.list().unwrap().is_empty());
        let q = Quotas {
            max_sandboxes: Some(2),
            ..Quotas::default()
        };
        s.create("acme", &q).unwrap();
        assert!(matches!(s.create("acme", &q), Err(TenantError::Exists(_))));
        let t = s
            .set_quotas(
                "acme",
                &Quotas {
                    max_paused: Some(1),
                    ..Quotas::default()
                },
            )
            .unwrap();
        assert_eq!(t.quotas.max_paused, Some(1));
        assert_eq!(t.quotas.max_sandboxes, None);
        assert!(matches!(
            s.set_quotas("nobody", &q),
            Err(TenantError::NotFound(_))
        ));
        s.delete("acme").unwrap();
        assert!(s.get("acme").unwrap().is_none());
    }
}
