//! Rampart's state store.
//!
//! The daemon keeps every truth about its sandboxes here, so that a restarted daemon (or, later,
//! another process of a fleet) can find them again. [`SandboxStore`] is the interface the
//! manager codes against; [`SqliteStore`] implements it with SQLite in WAL mode.
//!
//! Invariants the store enforces itself:
//! - a uid slot is held by at most one *alive* sandbox (`creating`, `running`, `paused`,
//!   `stopping`): a partial unique index guards it, and [`SandboxStore::insert_creating`] picks
//!   the lowest free slot and inserts in one transaction;
//! - the count of alive sandboxes never exceeds the `max_alive` given at insert.

pub mod access;
mod audit;
pub mod events;
pub mod journal;
pub mod keys;
mod network;
pub mod node_keys;
pub mod persist;
pub mod secrets;
mod side;
pub mod tenants;
mod wal;

pub use audit::{LeafRow, NewEvent, StoredEvent, TreeHeadRow};
pub use network::StoredNetwork;

use rampart_types::{Limits, OnTimeout, SandboxId, SandboxState, Tier};
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] rusqlite::Error),
    /// A stored value could not be decoded.
    #[error("corrupt record {id}: {detail}")]
    Corrupt {
        /// The sandbox id.
        id: String,
        /// What was wrong.
        detail: String,
    },
    /// The database was written by a newer Rampart.
    #[error("database schema version {found} is newer than this Rampart supports ({supported})")]
    TooNew {
        /// Version found.
        found: i64,
        /// Latest version known here.
        supported: i64,
    },
    /// As many sandboxes are alive as allowed.
    #[error("{alive} sandboxes are alive, the most this daemon allows")]
    Full {
        /// Sandboxes alive.
        alive: u64,
    },
    /// Every uid slot is held by an alive sandbox.
    #[error("all {slots} uid ranges are in use")]
    NoFreeSlot {
        /// Slots configured.
        slots: u32,
    },
    /// A sandbox with this id already exists.
    #[error("sandbox {0} already exists")]
    Duplicate(String),
    /// No sandbox with this id.
    #[error("sandbox {0} not found")]
    NotFound(String),
    /// A tenant's quota would be passed.
    #[error("{0}")]
    Quota(rampart_types::tenant::QuotaRefusal),
    /// The tenant named does not exist (removed while its key was in use).
    #[error("tenant {0} does not exist")]
    NoTenant(String),
    /// A thread of the store could not be started.
    #[error("starting a store thread: {0}")]
    Thread(std::io::Error),
    /// The database file could not be created, or made readable by its owner only.
    #[error("cannot make {path} private to its owner (mode 0600): {source}")]
    Private {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The files SQLite keeps for the database at `path`: itself, its write-ahead log and its
/// shared-memory index.
fn db_files(path: &Path) -> [std::path::PathBuf; 3] {
    let with = |ext: &str| {
        let mut p = path.as_os_str().to_owned();
        p.push(ext);
        std::path::PathBuf::from(p)
    };
    [path.to_path_buf(), with("-wal"), with("-shm")]
}

/// Makes the database at `path` private to its owner before SQLite opens it: created here,
/// empty, with mode 0600 (`O_CREAT|O_EXCL`, never readable by others, whatever the umask)
/// when missing; an existing one (and its `-wal` and `-shm`) that group or others may read
/// is made 0600. SQLite creates the `-wal` and `-shm` files with the database's own mode, so
/// they are 0600 from their first byte too. `state.db` holds secret values, access tokens and
/// sandbox environments.
pub(crate) fn make_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let err = |p: &Path, source| StoreError::Private {
        path: p.display().to_string(),
        source,
    };
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(path, e)),
    }
    for p in db_files(path) {
        match std::fs::symlink_metadata(&p) {
            Ok(md) if md.permissions().mode() & 0o077 != 0 && md.file_type().is_file() => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| err(&p, e))?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(&p, e)),
        }
    }
    Ok(())
}

/// A sandbox as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRecord {
    /// Its id.
    pub id: SandboxId,
    /// Template name.
    pub template: String,
    /// Lifecycle state.
    pub state: SandboxState,
    /// Resolved limits.
    pub limits: Limits,
    /// Environment given at create (values are never returned by the API).
    pub env: BTreeMap<String, String>,
    /// Labels.
    pub metadata: BTreeMap<String, String>,
    /// The uid slot (range index) it holds while alive.
    pub uid_slot: u32,
    /// Host pid of its PID 1, once running.
    pub pid: Option<i32>,
    /// Start time of that pid (`/proc/<pid>/stat` field 22), to tell a reused pid.
    pub pid_start_time: Option<u64>,
    /// Host path of its agent's socket, once running.
    pub agent_socket: Option<String>,
    /// Creation time, unix ms.
    pub created_at_ms: i64,
    /// Deadline, unix ms.
    pub expires_at_ms: i64,
    /// End time, unix ms.
    pub ended_at_ms: Option<i64>,
    /// Why it failed or ended.
    pub reason: Option<String>,
    /// What the reaper does at the deadline.
    pub on_timeout: OnTimeout,
    /// The tenant it belongs to (none: the node's own).
    pub tenant: Option<String>,
    /// The isolation tier it runs on.
    pub isolation: Tier,
    /// Seconds without a request after which it sleeps (is paused) and wakes on the next
    /// request; None: it never sleeps.
    pub idle_pause_secs: Option<u64>,
}

/// What [`SandboxStore::insert_creating`] records.
#[derive(Debug, Clone)]
pub struct NewSandbox {
    /// Its id.
    pub id: SandboxId,
    /// Template name.
    pub template: String,
    /// Resolved limits.
    pub limits: Limits,
    /// Environment.
    pub env: BTreeMap<String, String>,
    /// Labels.
    pub metadata: BTreeMap<String, String>,
    /// Creation time, unix ms.
    pub created_at_ms: i64,
    /// Deadline, unix ms.
    pub expires_at_ms: i64,
    /// The token that opens its ports, the ports open without it and its E2B facts (when the
    /// E2B API makes it): recorded with the sandbox in one transaction, forgotten when it
    /// ends (see [`access`]).
    pub access: Option<access::NewAccess>,
    /// What its expiry does.
    pub on_timeout: OnTimeout,
    /// Its network policy and secrets, when it has a network.
    pub network: Option<StoredNetwork>,
    /// Its create request as kept for fork (see [`persist`]).
    pub request: Option<String>,
    /// The tenant it belongs to (none: the node's own); its quotas are checked in the
    /// insert's transaction.
    pub tenant: Option<String>,
    /// The isolation tier it runs on.
    pub isolation: Tier,
    /// Seconds without a request after which it sleeps (see [`SandboxRecord`]).
    pub idle_pause_secs: Option<u64>,
    /// Launched ahead of any create for a warm pool: nobody's, listed by
    /// [`SandboxStore::pooled`] only, counted against the host's capacity but no tenant's,
    /// and without a usage record until [`SandboxStore::claim_audited`].
    pub pooled: bool,
}

/// What a create applies to a pooled sandbox when it claims it
/// ([`SandboxStore::claim_audited`]).
#[derive(Debug, Clone)]
pub struct Claim {
    /// The pooled sandbox.
    pub id: SandboxId,
    /// Its owner from now on (its quotas are checked in the claim's transaction).
    pub tenant: Option<String>,
    /// Labels.
    pub metadata: BTreeMap<String, String>,
    /// The claim's time: the sandbox's creation as its owner sees it, unix ms.
    pub created_at_ms: i64,
    /// Deadline, unix ms.
    pub expires_at_ms: i64,
    /// What its expiry does.
    pub on_timeout: OnTimeout,
    /// Seconds without a request after which it sleeps (see [`SandboxRecord`]).
    pub idle_pause_secs: Option<u64>,
    /// Its access token, public ports and E2B facts.
    pub access: Option<access::NewAccess>,
    /// Its create request as kept for fork.
    pub request: Option<String>,
    /// Its network policy as the create words it (the same policy the pooled sandbox
    /// was wired with).
    pub network: Option<StoredNetwork>,
}

/// The sandbox state interface. Implementations are shared between threads.
pub trait SandboxStore: Send + Sync + std::fmt::Debug {
    /// Records a new sandbox in state `creating`, holding the lowest uid slot below `slots`
    /// that no alive sandbox holds, provided fewer than `max_alive` sandboxes are alive.
    /// Atomic. Returns the slot.
    fn insert_creating(
        &self,
        new: &NewSandbox,
        max_alive: usize,
        slots: u32,
    ) -> Result<u32, StoreError>;
    /// Marks a sandbox running with its PID 1 and agent socket.
    fn set_running(
        &self,
        id: &SandboxId,
        pid: i32,
        pid_start_time: u64,
        agent_socket: &str,
    ) -> Result<(), StoreError>;
    /// Sets the state; for an ended state (`destroyed`, `failed`) also the end time and reason.
    fn set_state(
        &self,
        id: &SandboxId,
        state: SandboxState,
        ended_at_ms: Option<i64>,
        reason: Option<&str>,
    ) -> Result<(), StoreError>;
    /// Sets the deadline.
    fn set_expiry(&self, id: &SandboxId, expires_at_ms: i64) -> Result<(), StoreError>;
    /// Sets what the reaper does at the deadline (`destroy` until set).
    fn set_on_timeout(&self, id: &SandboxId, on_timeout: OnTimeout) -> Result<(), StoreError>;
    /// One sandbox.
    fn get(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError>;
    /// Sandboxes in `state` (alive ones when None) carrying every pair of `metadata`,
    /// oldest first.
    fn list(
        &self,
        state: Option<SandboxState>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxRecord>, StoreError>;
    /// Alive sandboxes of warm pools, not yet claimed (never in [`SandboxStore::list`]).
    fn pooled(&self) -> Result<Vec<SandboxRecord>, StoreError>;
    /// Gives the pooled, running sandbox `claim.id` to its owner in one transaction: the
    /// owner's quotas, its labels, times, access, request and usage record, and the audit
    /// event `event`. [`StoreError::NotFound`] when it is not a running pooled sandbox.
    fn claim_audited(&self, claim: &Claim, event: Option<&NewEvent>) -> Result<(), StoreError>;
    /// Every alive sandbox (`creating`, `running`, `paused`, `stopping`).
    fn alive(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        self.list(None, &BTreeMap::new())
    }
    /// The disk quotas of the alive sandboxes, summed (disk admission, at every create).
    fn alive_disk_bytes(&self) -> Result<u64, StoreError> {
        Ok(self.alive()?.iter().map(|r| r.limits.disk_bytes).sum())
    }
    /// Number of sandboxes in each state (states with none are absent).
    fn counts(&self) -> Result<HashMap<SandboxState, u64>, StoreError>;
    /// Forgets ended sandboxes that ended before `before_ms`. Returns how many.
    /// (Their audit logs are kept.)
    fn prune_ended(&self, before_ms: i64) -> Result<usize, StoreError>;

    /// [`SandboxStore::set_running`] and, in the same transaction, the audit event `event`.
    fn set_running_audited(
        &self,
        id: &SandboxId,
        pid: i32,
        pid_start_time: u64,
        agent_socket: &str,
        event: Option<&NewEvent>,
    ) -> Result<(), StoreError>;
    /// [`SandboxStore::set_state`] and, in the same transaction, the audit event `event`.
    fn set_state_audited(
        &self,
        id: &SandboxId,
        state: SandboxState,
        ended_at_ms: Option<i64>,
        reason: Option<&str>,
        event: Option<&NewEvent>,
    ) -> Result<(), StoreError>;
    /// Marks a sandbox paused to its filesystem (no process: its pid and agent socket are
    /// cleared) and, in the same transaction, the audit event `event`. A paused sandbox
    /// without a pid is one whose disk waits for a boot.
    fn set_stopped_audited(
        &self,
        id: &SandboxId,
        event: Option<&NewEvent>,
    ) -> Result<(), StoreError>;
    /// [`SandboxStore::set_state_audited`] to an ended state, with the sandbox's final usage
    /// figures written in the same transaction.
    fn set_ended_audited(
        &self,
        id: &SandboxId,
        state: SandboxState,
        ended_at_ms: i64,
        reason: Option<&str>,
        usage: &tenants::FinalUsage,
        event: Option<&NewEvent>,
    ) -> Result<(), StoreError>;
    /// [`SandboxStore::set_expiry`] and, in the same transaction, the audit event `event`.
    fn set_expiry_audited(
        &self,
        id: &SandboxId,
        expires_at_ms: i64,
        event: Option<&NewEvent>,
    ) -> Result<(), StoreError>;
    /// Appends an audit event (and its blobs) in one transaction.
    fn append_event(&self, event: &NewEvent) -> Result<(), StoreError>;
    /// Appends audit events in one transaction, skipping any whose `(sandbox, seq)` is
    /// already stored (events replayed from a journal). The default appends one by one.
    fn append_events_once(&self, events: &[NewEvent]) -> Result<(), StoreError> {
        for e in events {
            if self
                .last_event(&e.sandbox)?
                .is_some_and(|(last, _)| last >= e.seq)
            {
                continue;
            }
            self.append_event(e)?;
        }
        Ok(())
    }
    /// A sandbox's audit events with `seq > after` (all when None), in order, at most `limit`.
    fn events(
        &self,
        sandbox: &SandboxId,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError>;
    /// The last audit event of a sandbox: `(seq, hash)`.
    fn last_event(&self, sandbox: &SandboxId) -> Result<Option<(u64, String)>, StoreError>;
    /// A blob by its content digest (hex).
    fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Every node-log leaf hash, in index order.
    fn leaf_hashes(&self) -> Result<Vec<String>, StoreError>;
    /// The last leaf published for a sandbox.
    fn last_leaf(&self, sandbox: &SandboxId) -> Result<Option<LeafRow>, StoreError>;
    /// Appends leaves (their indexes must follow the last stored one) and a signed tree head
    /// covering them, in one transaction.
    fn publish(&self, leaves: &[LeafRow], tree_head: &TreeHeadRow) -> Result<(), StoreError>;
    /// The latest signed tree head.
    fn latest_tree_head(&self) -> Result<Option<TreeHeadRow>, StoreError>;
    /// Records (replaces) a sandbox's network policy and secrets.
    fn set_network(&self, id: &SandboxId, net: &StoredNetwork) -> Result<(), StoreError>;
    /// Replaces a sandbox's network policy (keeping its secrets).
    fn set_network_policy(
        &self,
        id: &SandboxId,
        policy: &rampart_types::NetworkPolicy,
    ) -> Result<(), StoreError>;
    /// A sandbox's network policy and secrets, if it has a network.
    fn network(&self, id: &SandboxId) -> Result<Option<StoredNetwork>, StoreError>;

    /// Checks that moving sandbox `id` to `to` (paused, or running again) keeps its tenant
    /// within its quotas (`max_paused`, `max_sandboxes`, `max_vcpus`); a sandbox of no
    /// tenant always may.
    fn admit_transition(&self, id: &SandboxId, to: SandboxState) -> Result<(), StoreError>;
    /// Checks that `tenant` may take on `demand` beside what it holds (a volume, a
    /// snapshot).
    fn admit_demand(&self, tenant: &str, demand: &tenants::Demand) -> Result<(), StoreError>;
    /// `tenant`'s disk: what it holds as `max_disk_bytes` counts, and that quota (None:
    /// unlimited).
    fn tenant_disk(&self, tenant: &str) -> Result<(u64, Option<u64>), StoreError>;
    /// The disk `tenant` may still take on under its `max_disk_bytes` (None: unlimited).
    fn tenant_disk_room(&self, tenant: &str) -> Result<Option<u64>, StoreError> {
        let (held, max) = self.tenant_disk(tenant)?;
        Ok(max.map(|m| m.saturating_sub(held)))
    }
    /// Replaces what every tenant keeps on the host of `kind` (`layers`, `uploads`,
    /// `artifacts`), as measured; counted in `max_disk_bytes`.
    fn replace_stored(&self, kind: &str, per_tenant: &[(String, u64)]) -> Result<(), StoreError>;
    /// Sets what `tenant` keeps on the host of `kind`.
    fn set_stored(&self, tenant: &str, kind: &str, bytes: u64) -> Result<(), StoreError>;
    /// Adds `bytes` to what `tenant` keeps on the host of `kind`.
    fn add_stored(&self, tenant: &str, kind: &str, bytes: u64) -> Result<(), StoreError>;
    /// Usage rows of the sandboxes of `tenant` (every sandbox when None) alive at some time
    /// in `[from_ms, to_ms)`, oldest first, with each one's count of `exec` events.
    fn usage_between(
        &self,
        tenant: Option<&str>,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<(tenants::UsageRow, u64)>, StoreError>;
    /// Appends entries to the node's change log.
    fn append_changes(&self, changes: &[tenants::Change]) -> Result<(), StoreError>;
    /// Change log entries with `seq > after` (of `tenant` when given), at most `limit`.
    fn changes(
        &self,
        tenant: Option<&str>,
        after: i64,
        limit: usize,
    ) -> Result<Vec<tenants::Change>, StoreError>;
}

/// The current schema version.
pub const SCHEMA_VERSION: i64 = 11;

const ALIVE_SQL: &str = "('creating','running','paused','stopping')";

const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY NOT NULL,
        template TEXT NOT NULL,
        state TEXT NOT NULL,
        limits TEXT NOT NULL,
        env TEXT NOT NULL,
        metadata TEXT NOT NULL,
        uid_slot INTEGER NOT NULL,
        pid INTEGER,
        pid_start_time INTEGER,
        agent_socket TEXT,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        ended_at INTEGER,
        reason TEXT
    );
    CREATE UNIQUE INDEX sandboxes_alive_slot ON sandboxes(uid_slot)
        WHERE state IN ('creating','running','stopping');
    CREATE INDEX sandboxes_state ON sandboxes(state, created_at);",
    ),
    (2, audit::MIGRATION),
    (
        3,
        // Pause: a paused sandbox is alive and keeps its uid slot; what expiry does.
        "ALTER TABLE sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'destroy';
    DROP INDEX sandboxes_alive_slot;
    CREATE UNIQUE INDEX sandboxes_alive_slot ON sandboxes(uid_slot)
        WHERE state IN ('creating','running','paused','stopping');",
    ),
    (4, audit::MIGRATION_4),
    // Snapshots, volumes, create requests (`persist`; idempotent, also run at its open).
    (5, persist::MIGRATION),
    (6, network::MIGRATION_6),
    (7, tenants::MIGRATION_7),
    // The isolation tier a sandbox runs on.
    (
        8,
        "ALTER TABLE sandboxes ADD COLUMN isolation TEXT NOT NULL DEFAULT 'namespace';",
    ),
    // What tenants make the host keep: layers, uploads, artifacts (issue 33).
    (9, tenants::MIGRATION_9),
    // Warm pools: a sandbox launched ahead of any create, nobody's until claimed.
    (
        10,
        "ALTER TABLE sandboxes ADD COLUMN pooled INTEGER NOT NULL DEFAULT 0;",
    ),
    // Idle sleep: seconds without a request after which a sandbox is paused.
    (
        11,
        "ALTER TABLE sandboxes ADD COLUMN idle_pause_secs INTEGER;",
    ),
];

/// The SQLite implementation of [`SandboxStore`].
#[derive(Debug)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    /// Checkpoints the write-ahead log off the commit path (file databases).
    checkpointer: Option<wal::Checkpointer>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and migrates it to [`SCHEMA_VERSION`].
    /// The file (and its `-wal`, `-shm`) is private to its owner (mode 0600) from its first
    /// byte: see [`make_private`].
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        make_private(path)?;
        let conn = Connection::open(path)?;
        let mut store = Self::init(conn)?;
        // Without the thread, SQLite keeps checkpointing inside commits: slower, not wrong.
        store.checkpointer = wal::Checkpointer::start(path, store.conn.clone()).ok();
        Ok(store)
    }

    /// An in-memory database (tests).
    pub fn open_in_memory() -> Result<SqliteStore, StoreError> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<SqliteStore, StoreError> {
        conn.busy_timeout(Duration::from_secs(5))?;
        // WAL: readers never block the writer; NORMAL: a commit does not fsync (the WAL is
        // synced at checkpoints), which keeps a create cheap. A commit survives the daemon's
        // death (kill -9); a power loss may lose the last commits, which restart recovery
        // tolerates (it reconciles with the host). See `wal` for the details.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS migrations (
                version INTEGER PRIMARY KEY NOT NULL,
                applied_at INTEGER NOT NULL
            );",
        )?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let current: i64 = tx.query_row(
            "SELECT COALESCE(MAX(version), 0) FROM migrations",
            [],
            |r| r.get(0),
        )?;
        if current > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                found: current,
                supported: SCHEMA_VERSION,
            });
        }
        for (version, sql) in MIGRATIONS {
            if *version > current {
                tx.execute_batch(sql)?;
                tx.execute(
                    "INSERT INTO migrations (version, applied_at) VALUES (?1, ?2)",
                    params![version, now_ms()],
                )?;
            }
        }
        // The access tables (their own idempotent migration), written with the sandboxes.
        tx.execute_batch(access::MIGRATION)?;
        tx.commit()?;
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            checkpointer: None,
        })
    }

    /// The schema version of the open database.
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        Ok(self.lock().query_row(
            "SELECT COALESCE(MAX(version), 0) FROM migrations",
            [],
            |r| r.get(0),
        )?)
    }

    /// Counts a commit towards the next background checkpoint.
    fn committed(&self) {
        if let Some(c) = &self.checkpointer {
            c.committed();
        }
    }

    /// Sets the state (and for an ended state its end time, reason and final usage) and
    /// records `event`, in one transaction.
    fn set_state_with_usage(
        &self,
        id: &SandboxId,
        state: SandboxState,
        ended_at_ms: Option<i64>,
        reason: Option<&str>,
        usage: Option<&tenants::FinalUsage>,
        event: Option<&NewEvent>,
    ) -> Result<(), StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = tx
            .prepare_cached(
                "UPDATE sandboxes SET state = ?2, ended_at = COALESCE(?3, ended_at), \
                 reason = COALESCE(?4, reason) WHERE id = ?1",
            )?
            .execute(params![id.as_str(), state.as_str(), ended_at_ms, reason])?;
        changed(n, id)?;
        let now = ended_at_ms.unwrap_or_else(now_ms);
        match state {
            SandboxState::Paused => tenants::usage_paused(&tx, id.as_str(), true, now)?,
            SandboxState::Running => tenants::usage_paused(&tx, id.as_str(), false, now)?,
            _ => {}
        }
        if !state.is_alive() {
            // An ended sandbox's tokens (its own and its E2B one) open nothing any more, and
            // its E2B facts go, whatever ended it.
            access::forget_in(&tx, id.as_str())?;
            tenants::finish_usage(
                &tx,
                id.as_str(),
                now,
                usage.unwrap_or(&tenants::FinalUsage::default()),
            )?;
        }
        if let Some(e) = event {
            audit::insert_event(&tx, e)?;
        }
        tx.commit()?;
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves the connection usable (every write is a
        // transaction), so a poisoned lock is taken over.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The current time in unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The lowest slot in `0..slots` absent from `taken` (sorted ascending).
pub fn lowest_free_slot(taken: &[u32], slots: u32) -> Option<u32> {
    let mut want = 0u32;
    for &t in taken {
        if t > want {
            break;
        }
        if t == want {
            want = want.checked_add(1)?;
        }
    }
    (want < slots).then_some(want)
}

const COLUMNS: &str = "id, template, state, limits, env, metadata, uid_slot, pid, pid_start_time, \
                       agent_socket, created_at, expires_at, ended_at, reason, on_timeout, tenant, \
                       isolation, idle_pause_secs";

fn corrupt(id: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        id: id.to_owned(),
        detail: detail.to_string(),
    }
}

/// Raw row, decoded in a second step so that decode errors are typed.
struct RawRow {
    id: String,
    template: String,
    state: String,
    limits: String,
    env: String,
    metadata: String,
    uid_slot: i64,
    pid: Option<i64>,
    pid_start_time: Option<i64>,
    agent_socket: Option<String>,
    created_at: i64,
    expires_at: i64,
    ended_at: Option<i64>,
    reason: Option<String>,
    on_timeout: String,
    tenant: Option<String>,
    isolation: String,
    idle_pause_secs: Option<i64>,
}

fn raw_row(r: &Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(RawRow {
        id: r.get(0)?,
        template: r.get(1)?,
        state: r.get(2)?,
        limits: r.get(3)?,
        env: r.get(4)?,
        metadata: r.get(5)?,
        uid_slot: r.get(6)?,
        pid: r.get(7)?,
        pid_start_time: r.get(8)?,
        agent_socket: r.get(9)?,
        created_at: r.get(10)?,
        expires_at: r.get(11)?,
        ended_at: r.get(12)?,
        reason: r.get(13)?,
        on_timeout: r.get(14)?,
        tenant: r.get(15)?,
        isolation: r.get(16)?,
        idle_pause_secs: r.get(17)?,
    })
}

impl RawRow {
    fn decode(self) -> Result<SandboxRecord, StoreError> {
        let id = SandboxId::parse(&self.id).map_err(|e| corrupt(&self.id, e))?;
        let state = SandboxState::parse(&self.state)
            .ok_or_else(|| corrupt(&self.id, format!("unknown state {:?}", self.state)))?;
        let limits = serde_json::from_str(&self.limits).map_err(|e| corrupt(&self.id, e))?;
        let env = serde_json::from_str(&self.env).map_err(|e| corrupt(&self.id, e))?;
        let metadata = serde_json::from_str(&self.metadata).map_err(|e| corrupt(&self.id, e))?;
        let uid_slot = u32::try_from(self.uid_slot).map_err(|e| corrupt(&self.id, e))?;
        let pid = self
            .pid
            .map(i32::try_from)
            .transpose()
            .map_err(|e| corrupt(&self.id, e))?;
        Ok(SandboxRecord {
            id,
            template: self.template,
            state,
            limits,
            env,
            metadata,
            uid_slot,
            pid,
            pid_start_time: self.pid_start_time.map(|v| v as u64),
            agent_socket: self.agent_socket,
            created_at_ms: self.created_at,
            expires_at_ms: self.expires_at,
            ended_at_ms: self.ended_at,
            reason: self.reason,
            on_timeout: OnTimeout::parse(&self.on_timeout).ok_or_else(|| {
                corrupt(
                    &self.id,
                    format!("unknown on_timeout {:?}", self.on_timeout),
                )
            })?,
            tenant: self.tenant,
            isolation: self.isolation.parse().map_err(|e| corrupt(&self.id, e))?,
            idle_pause_secs: self
                .idle_pause_secs
                .map(u64::try_from)
                .transpose()
                .map_err(|e| corrupt(&self.id, e))?,
        })
    }
}

fn json<T: serde::Serialize>(id: &SandboxId, v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| corrupt(id.as_str(), e))
}

/// Seconds as SQLite keeps them (an i64; more than that is never a sane duration).
fn secs_sql(s: u64) -> i64 {
    i64::try_from(s).unwrap_or(i64::MAX)
}

fn changed(n: usize, id: &SandboxId) -> Result<(), StoreError> {
    if n == 0 {
        return Err(StoreError::NotFound(id.to_string()));
    }
    Ok(())
}

impl SandboxStore for SqliteStore {
    fn insert_creating(
        &self,
        new: &NewSandbox,
        max_alive: usize,
        slots: u32,
    ) -> Result<u32, StoreError> {
        let limits = json(&new.id, &new.limits)?;
        let env = json(&new.id, &new.env)?;
        let metadata = json(&new.id, &new.metadata)?;
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let taken: Vec<u32> = {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT uid_slot FROM sandboxes WHERE state IN {ALIVE_SQL} ORDER BY uid_slot"
            ))?;
            let rows = stmt.query_map([], |r| r.get::<_, i64>(0))?;
            let mut v = Vec::new();
            for r in rows {
                // Slots are written by this code as u32; anything else cannot hold a slot.
                if let Ok(s) = u32::try_from(r?) {
                    v.push(s);
                }
            }
            v
        };
        if taken.len() >= max_alive {
            return Err(StoreError::Full {
                alive: taken.len() as u64,
            });
        }
        let slot = lowest_free_slot(&taken, slots).ok_or(StoreError::NoFreeSlot { slots })?;
        if let Some(t) = &new.tenant {
            tenants::admit(&tx, t, &tenants::Demand::sandbox(&new.limits))?;
        }
        let res = tx
            .prepare_cached(
                "INSERT INTO sandboxes (id, template, state, limits, env, metadata, uid_slot, \
                 created_at, expires_at, on_timeout, tenant, isolation, pooled, idle_pause_secs) \
                 VALUES (?1, ?2, 'creating', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )?
            .execute(params![
                new.id.as_str(),
                new.template,
                limits,
                env,
                metadata,
                slot,
                new.created_at_ms,
                new.expires_at_ms,
                new.on_timeout.as_str(),
                new.tenant,
                new.isolation.as_str(),
                new.pooled,
                new.idle_pause_secs.map(secs_sql)
            ]);
        match res {
            Ok(_) => {}
            Err(rusqlite::Error::SqliteFailure(e, Some(msg)))
                if e.code == rusqlite::ErrorCode::ConstraintViolation
                    && msg.contains("sandboxes.id") =>
            {
                return Err(StoreError::Duplicate(new.id.to_string()));
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(a) = &new.access {
            access::insert(&tx, new.id.as_str(), a)?;
        }
        if let Some(n) = &new.network {
            network::set(&tx, &new.id, n)?;
        }
        if let Some(r) = &new.request {
            persist::insert_request(&tx, new.id.as_str(), r)?;
        }
        // A pooled sandbox is used by nobody until its claim, which starts its record.
        if !new.pooled {
            tenants::insert_usage(
                &tx,
                new.id.as_str(),
                new.tenant.as_deref(),
                &new.template,
                &limits,
                new.created_at_ms,
            )?;
        }
        tx.commit()?;
        Ok(slot)
    }

    fn set_running(
        &self,
        id: &SandboxId,
        pid: i32,
        pid_start_time: u64,
        agent_socket: &str,
    ) -> Result<(), StoreError> {
        self.set_running_audited(id, pid, pid_start_time, agent_socket, None)
    }

    fn set_state(
        &self,
        id: &SandboxId,
        state: SandboxState,
        ended_at_ms: Option<i64>,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        self.set_state_audited(id, state, ended_at_ms, reason, None)
    }

    fn set_expiry(&self, id: &SandboxId, expires_at_ms: i64) -> Result<(), StoreError> {
        self.set_expiry_audited(id, expires_at_ms, None)
    }

    fn set_on_timeout(&self, id: &SandboxId, on_timeout: OnTimeout) -> Result<(), StoreError> {
        let n = self.lock().execute(
            "UPDATE sandboxes SET on_timeout = ?2 WHERE id = ?1",
            params![id.as_str(), on_timeout.as_str()],
        )?;
        changed(n, id)
    }

    fn set_running_audited(
        &self,
        id: &SandboxId,
        pid: i32,
        pid_start_time: u64,
        agent_socket: &str,
        event: Option<&NewEvent>,
    ) -> Result<(), StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = tx
            .prepare_cached(
                "UPDATE sandboxes SET state = 'running', pid = ?2, pid_start_time = ?3, \
                 agent_socket = ?4 WHERE id = ?1",
            )?
            .execute(params![
                id.as_str(),
                pid,
                pid_start_time as i64,
                agent_socket
            ])?;
        changed(n, id)?;
        // A sandbox booted again after a pause to its filesystem: its paused time ends.
        tenants::usage_paused(&tx, id.as_str(), false, now_ms())?;
        if let Some(e) = event {
            audit::insert_event(&tx, e)?;
        }
        tx.commit()?;
        Ok(())
    }

    fn set_state_audited(
        &self,
        id: &SandboxId,
        state: SandboxState,
        ended_at_ms: Option<i64>,
        reason: Option<&str>,
        event: Option<&NewEvent>,
    ) -> Result<(), StoreError> {
        self.set_state_with_usage(id, state, ended_at_ms, reason, None, event)
    }

    fn set_stopped_audited(
        &self,
        id: &SandboxId,
        event: Option<&NewEvent>,
    ) -> Result<(), StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = tx
            .prepare_cached(
                "UPDATE sandboxes SET state = 'paused', pid = NULL, pid_start_time = NULL, \
                 agent_socket = NULL WHERE id = ?1",
            )?
            .execute(params![id.as_str()])?;
        changed(n, id)?;
        tenants::usage_paused(&tx, id.as_str(), true, now_ms())?;
        if let Some(e) = event {
            audit::insert_event(&tx, e)?;
        }
        tx.commit()?;
        Ok(())
    }

    fn set_ended_audited(
        &self,
        id: &SandboxId,
        state: SandboxState,
        ended_at_ms: i64,
        reason: Option<&str>,
        usage: &tenants::FinalUsage,
        event: Option<&NewEvent>,
    ) -> Result<(), StoreError> {
        self.set_state_with_usage(id, state, Some(ended_at_ms), reason, Some(usage), event)
    }

    fn set_expiry_audited(
        &self,
        id: &SandboxId,
        expires_at_ms: i64,
        event: Option<&NewEvent>,
    ) -> Result<(), StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = tx
            .prepare_cached("UPDATE sandboxes SET expires_at = ?2 WHERE id = ?1")?
            .execute(params![id.as_str(), expires_at_ms])?;
        changed(n, id)?;
        if let Some(e) = event {
            audit::insert_event(&tx, e)?;
        }
        tx.commit()?;
        Ok(())
    }

    fn append_event(&self, event: &NewEvent) -> Result<(), StoreError> {
        let conn = self.lock();
        wal::write_txn(&conn, |c| audit::insert_event(c, event))?;
        drop(conn);
        self.committed();
        Ok(())
    }

    fn append_events_once(&self, events: &[NewEvent]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let conn = self.lock();
        wal::write_txn(&conn, |c| {
            events
                .iter()
                .try_for_each(|e| audit::insert_event_once(c, e))
        })?;
        drop(conn);
        self.committed();
        Ok(())
    }

    fn events(
        &self,
        sandbox: &SandboxId,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        audit::events(&self.lock(), sandbox, after, limit)
    }

    fn last_event(&self, sandbox: &SandboxId) -> Result<Option<(u64, String)>, StoreError> {
        audit::last_event(&self.lock(), sandbox)
    }

    fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        audit::blob(&self.lock(), digest)
    }

    fn leaf_hashes(&self) -> Result<Vec<String>, StoreError> {
        audit::leaf_hashes(&self.lock())
    }

    fn last_leaf(&self, sandbox: &SandboxId) -> Result<Option<LeafRow>, StoreError> {
        audit::last_leaf(&self.lock(), sandbox)
    }

    fn publish(&self, leaves: &[LeafRow], tree_head: &TreeHeadRow) -> Result<(), StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        audit::publish(&tx, leaves, tree_head)?;
        tx.commit()?;
        Ok(())
    }

    fn latest_tree_head(&self) -> Result<Option<TreeHeadRow>, StoreError> {
        audit::latest_tree_head(&self.lock())
    }

    fn set_network(&self, id: &SandboxId, net: &StoredNetwork) -> Result<(), StoreError> {
        network::set(&self.lock(), id, net)?;
        self.committed();
        Ok(())
    }

    fn set_network_policy(
        &self,
        id: &SandboxId,
        policy: &rampart_types::NetworkPolicy,
    ) -> Result<(), StoreError> {
        network::set_policy(&self.lock(), id, policy)?;
        self.committed();
        Ok(())
    }

    fn network(&self, id: &SandboxId) -> Result<Option<StoredNetwork>, StoreError> {
        network::get(&self.lock(), id)
    }

    fn admit_transition(&self, id: &SandboxId, to: SandboxState) -> Result<(), StoreError> {
        let Some(rec) = self.get(id)? else {
            return Err(StoreError::NotFound(id.to_string()));
        };
        let Some(t) = &rec.tenant else {
            return Ok(());
        };
        let demand = match (rec.state, to) {
            (SandboxState::Running, SandboxState::Paused) => tenants::Demand {
                paused: 1,
                ..tenants::Demand::default()
            },
            (SandboxState::Paused, SandboxState::Running) => tenants::Demand {
                sandboxes: 1,
                vcpus: rec.limits.cpus,
                ..tenants::Demand::default()
            },
            _ => return Ok(()),
        };
        tenants::admit(&self.lock(), t, &demand)
    }

    fn admit_demand(&self, tenant: &str, demand: &tenants::Demand) -> Result<(), StoreError> {
        tenants::admit(&self.lock(), tenant, demand)
    }

    fn tenant_disk(&self, tenant: &str) -> Result<(u64, Option<u64>), StoreError> {
        tenants::disk_of(&self.lock(), tenant)
    }

    fn add_stored(&self, tenant: &str, kind: &str, bytes: u64) -> Result<(), StoreError> {
        tenants::add_stored(&self.lock(), tenant, kind, bytes)?;
        self.committed();
        Ok(())
    }

    fn replace_stored(&self, kind: &str, per_tenant: &[(String, u64)]) -> Result<(), StoreError> {
        tenants::replace_stored(&mut self.lock(), kind, per_tenant)?;
        self.committed();
        Ok(())
    }

    fn set_stored(&self, tenant: &str, kind: &str, bytes: u64) -> Result<(), StoreError> {
        tenants::set_stored(&self.lock(), tenant, kind, bytes)?;
        self.committed();
        Ok(())
    }

    fn usage_between(
        &self,
        tenant: Option<&str>,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<(tenants::UsageRow, u64)>, StoreError> {
        let conn = self.lock();
        let rows = tenants::usage_between(&conn, tenant, from_ms, to_ms)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let n = audit::exec_count(&conn, &r.sandbox)?;
            out.push((r, n));
        }
        Ok(out)
    }

    fn append_changes(&self, changes: &[tenants::Change]) -> Result<(), StoreError> {
        let r = tenants::append_changes(&mut self.lock(), changes);
        self.committed();
        r
    }

    fn changes(
        &self,
        tenant: Option<&str>,
        after: i64,
        limit: usize,
    ) -> Result<Vec<tenants::Change>, StoreError> {
        tenants::changes(&self.lock(), tenant, after, limit)
    }

    fn get(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError> {
        let conn = self.lock();
        let raw = conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM sandboxes WHERE id = ?1"))?
            .query_row([id.as_str()], raw_row)
            .optional()?;
        drop(conn);
        raw.map(RawRow::decode).transpose()
    }

    fn list(
        &self,
        state: Option<SandboxState>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxRecord>, StoreError> {
        let conn = self.lock();
        let raws: Vec<RawRow> = match state {
            Some(s) => conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM sandboxes WHERE state = ?1 AND pooled = 0 \
                     ORDER BY created_at, id"
                ))?
                .query_map([s.as_str()], raw_row)?
                .collect::<Result<_, _>>()?,
            None => conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM sandboxes WHERE state IN {ALIVE_SQL} \
                     AND pooled = 0 ORDER BY created_at, id"
                ))?
                .query_map([], raw_row)?
                .collect::<Result<_, _>>()?,
        };
        drop(conn);
        let mut out = Vec::with_capacity(raws.len());
        for raw in raws {
            let rec = raw.decode()?;
            if metadata.iter().all(|(k, v)| rec.metadata.get(k) == Some(v)) {
                out.push(rec);
            }
        }
        Ok(out)
    }

    fn counts(&self) -> Result<HashMap<SandboxState, u64>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(
            "SELECT state, COUNT(*) FROM sandboxes WHERE pooled = 0 GROUP BY state",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        let mut out = HashMap::new();
        for row in rows {
            let (state, n) = row?;
            let s = SandboxState::parse(&state)
                .ok_or_else(|| corrupt("?", format!("unknown state {state:?}")))?;
            out.insert(s, n as u64);
        }
        Ok(out)
    }

    fn pooled(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        let conn = self.lock();
        let raws: Vec<RawRow> = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM sandboxes WHERE state IN {ALIVE_SQL} AND pooled = 1 \
                 ORDER BY created_at, id"
            ))?
            .query_map([], raw_row)?
            .collect::<Result<_, _>>()?;
        drop(conn);
        raws.into_iter().map(RawRow::decode).collect()
    }

    fn claim_audited(&self, claim: &Claim, event: Option<&NewEvent>) -> Result<(), StoreError> {
        let id = &claim.id;
        let metadata = json(id, &claim.metadata)?;
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let row: Option<(String, String)> = tx
            .prepare_cached(
                "SELECT template, limits FROM sandboxes \
                 WHERE id = ?1 AND pooled = 1 AND state = 'running'",
            )?
            .query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((template, limits)) = row else {
            return Err(StoreError::NotFound(id.to_string()));
        };
        if let Some(t) = &claim.tenant {
            let l: Limits = serde_json::from_str(&limits)
                .map_err(|e| corrupt(id.as_str(), format!("limits: {e}")))?;
            tenants::admit(&tx, t, &tenants::Demand::sandbox(&l))?;
        }
        tx.prepare_cached(
            "UPDATE sandboxes SET pooled = 0, tenant = ?2, metadata = ?3, created_at = ?4, \
             expires_at = ?5, on_timeout = ?6, idle_pause_secs = ?7 WHERE id = ?1",
        )?
        .execute(params![
            id.as_str(),
            claim.tenant,
            metadata,
            claim.created_at_ms,
            claim.expires_at_ms,
            claim.on_timeout.as_str(),
            claim.idle_pause_secs.map(secs_sql)
        ])?;
        if let Some(a) = &claim.access {
            access::insert(&tx, id.as_str(), a)?;
        }
        if let Some(r) = &claim.request {
            persist::insert_request(&tx, id.as_str(), r)?;
        }
        if let Some(n) = &claim.network {
            network::set(&tx, id, n)?;
        }
        tenants::insert_usage(
            &tx,
            id.as_str(),
            claim.tenant.as_deref(),
            &template,
            &limits,
            claim.created_at_ms,
        )?;
        if let Some(e) = event {
            audit::insert_event(&tx, e)?;
        }
        tx.commit()?;
        Ok(())
    }

    fn alive_disk_bytes(&self) -> Result<u64, StoreError> {
        // One aggregate in SQLite instead of every alive record parsed: a create with a
        // thousand alive pays microseconds, not milliseconds.
        let sum: i64 = self
            .lock()
            .prepare_cached(&format!(
                "SELECT COALESCE(SUM(json_extract(limits, '$.disk_bytes')), 0) FROM sandboxes \
             WHERE state IN {ALIVE_SQL}"
            ))?
            .query_row([], |r| r.get(0))?;
        Ok(u64::try_from(sum).unwrap_or(0))
    }

    fn prune_ended(&self, before_ms: i64) -> Result<usize, StoreError> {
        let conn = self.lock();
        let n = conn
            .prepare_cached(
                "DELETE FROM sandboxes WHERE state IN ('destroyed','failed') AND ended_at < ?1",
            )?
            .execute([before_ms])?;
        conn.prepare_cached(
            "DELETE FROM sandbox_network WHERE id NOT IN (SELECT id FROM sandboxes)",
        )?
        .execute([])?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(id: &str, meta: &[(&str, &str)]) -> NewSandbox {
        NewSandbox {
            id: SandboxId::parse(id).unwrap(),
            template: "base".into(),
            limits: Limits::default(),
            env: [("A".to_string(), "secret".to_string())].into(),
            metadata: meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created_at_ms: now_ms(),
            expires_at_ms: now_ms() + 300_000,
            access: None,
            on_timeout: OnTimeout::Destroy,
            network: None,
            request: None,
            tenant: None,
            isolation: Default::default(),
            idle_pause_secs: None,
            pooled: false,
        }
    }

    /// A pooled sandbox is nobody's: not listed, not counted, no usage record; its claim
    /// makes it its owner's in one transaction, checked against the owner's quotas, once.
    #[test]
    fn a_pooled_sandbox_is_nobodys_until_claimed_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let store = SqliteStore::open(&db).unwrap();
        let tenants = tenants::TenantStore::open(&db).unwrap();
        let one = rampart_types::tenant::Quotas {
            max_sandboxes: Some(1),
            ..Default::default()
        };
        tenants.create("acme", &one).unwrap();
        let pool = |store: &SqliteStore| {
            let mut n = new("n1", &[]);
            n.id = SandboxId::generate();
            n.env.clear();
            n.pooled = true;
            store.insert_creating(&n, 100, 100).unwrap();
            store.set_running(&n.id, 1, 1, "/s").unwrap();
            n.id
        };
        let (a, b) = (pool(&store), pool(&store));
        assert!(store.alive().unwrap().is_empty());
        assert!(store.counts().unwrap().is_empty());
        assert_eq!(store.pooled().unwrap().len(), 2);
        // Their disks are the host's all the same.
        assert_eq!(
            store.alive_disk_bytes().unwrap(),
            2 * Limits::default().disk_bytes
        );
        let claim = |id: &SandboxId| Claim {
            id: id.clone(),
            tenant: Some("acme".into()),
            metadata: [("k".to_string(), "v".to_string())].into(),
            created_at_ms: 42,
            expires_at_ms: 4242,
            on_timeout: OnTimeout::Pause,
            idle_pause_secs: Some(30),
            access: None,
            request: Some("{}".into()),
            network: None,
        };
        store.claim_audited(&claim(&a), None).unwrap();
        let rec = store.get(&a).unwrap().unwrap();
        assert_eq!(rec.tenant.as_deref(), Some("acme"));
        assert_eq!(rec.idle_pause_secs, Some(30));
        assert_eq!((rec.created_at_ms, rec.expires_at_ms), (42, 4242));
        assert_eq!(rec.metadata.get("k").map(String::as_str), Some("v"));
        assert_eq!(store.alive().unwrap().len(), 1);
        assert_eq!(store.pooled().unwrap().len(), 1);
        // Claimed once only.
        assert!(matches!(
            store.claim_audited(&claim(&a), None),
            Err(StoreError::NotFound(_))
        ));
        // Over the owner's quota: refused, and the sandbox stays in the pool.
        assert!(matches!(
            store.claim_audited(&claim(&b), None),
            Err(StoreError::Quota(_))
        ));
        assert_eq!(store.pooled().unwrap().len(), 1);
        assert!(store.get(&b).unwrap().unwrap().tenant.is_none());
    }

    /// A tenant's quotas are checked in the insert's transaction: from several threads on
    /// one database file, exactly as many creates as the quota allows pass, and each refusal
    /// names the limit, the use and the most.
    #[test]
    fn tenant_quotas_hold_under_concurrent_creates() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let store = Arc::new(SqliteStore::open(&db).unwrap());
        let tenants = tenants::TenantStore::open(&db).unwrap();
        tenants
            .create(
                "acme",
                &rampart_types::tenant::Quotas {
                    max_sandboxes: Some(3),
                    max_paused: Some(1),
                    ..Default::default()
                },
            )
            .unwrap();
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let mut n = new("n1", &[]);
                    n.id = SandboxId::generate();
                    n.tenant = Some("acme".into());
                    store.insert_creating(&n, 100, 100)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 3);
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            match r {
                StoreError::Quota(q) => {
                    assert_eq!(q.limit, "max_sandboxes");
                    assert_eq!((q.used, q.max), (3.0, 3.0));
                }
                other => panic!("{other}"),
            }
        }
        // Refused creates wrote nothing; another tenant (and the node) are not limited.
        assert_eq!(store.alive().unwrap().len(), 3);
        let mut other = new("n1", &[]);
        other.id = SandboxId::generate();
        other.tenant = None;
        store.insert_creating(&other, 100, 100).unwrap();
        let mut gone = new("n1", &[]);
        gone.id = SandboxId::generate();
        gone.tenant = Some("nosuch".into());
        assert!(matches!(
            store.insert_creating(&gone, 100, 100),
            Err(StoreError::NoTenant(_))
        ));
        // Paused ones are counted apart: one may be paused, which frees a running place.
        let ids: Vec<SandboxId> = store
            .alive()
            .unwrap()
            .into_iter()
            .filter(|r| r.tenant.as_deref() == Some("acme"))
            .map(|r| r.id)
            .collect();
        for id in &ids {
            store
                .set_state(id, SandboxState::Running, None, None)
                .unwrap();
        }
        store
            .admit_transition(&ids[0], SandboxState::Paused)
            .unwrap();
        store
            .set_state(&ids[0], SandboxState::Paused, None, None)
            .unwrap();
        assert!(matches!(
            store.admit_transition(&ids[1], SandboxState::Paused),
            Err(StoreError::Quota(q)) if q.limit == "max_paused"
        ));
        let mut fourth = new("n1", &[]);
        fourth.id = SandboxId::generate();
        fourth.tenant = Some("acme".into());
        store.insert_creating(&fourth, 100, 100).unwrap();
        assert!(matches!(
            store.admit_transition(&ids[0], SandboxState::Running),
            Err(StoreError::Quota(q)) if q.limit == "max_sandboxes"
        ));
        assert_eq!(tenants.holdings("acme").unwrap().sandboxes, 3);
        assert_eq!(tenants.holdings("acme").unwrap().paused, 1);
        // Usage rows: one per create that passed, ended with the sandbox.
        store
            .set_ended_audited(
                &ids[1],
                SandboxState::Destroyed,
                now_ms(),
                None,
                &tenants::FinalUsage {
                    cpu_usec: 3_000_000,
                    memory_peak_bytes: 1 << 20,
                    egress_bytes: 10,
                },
                None,
            )
            .unwrap();
        let rows = store.usage_between(Some("acme"), 0, i64::MAX).unwrap();
        assert_eq!(rows.len(), 4);
        let ended = rows
            .iter()
            .find(|(r, _)| r.sandbox == ids[1].as_str())
            .unwrap();
        assert_eq!(ended.0.cpu_usec, 3_000_000);
        assert!(ended.0.ended_at_ms.is_some());
        let paused = rows
            .iter()
            .find(|(r, _)| r.sandbox == ids[0].as_str())
            .unwrap();
        assert!(paused.0.paused_at_ms.is_some());
        assert_eq!(
            store
                .usage_between(Some("other"), 0, i64::MAX)
                .unwrap()
                .len(),
            0
        );
    }

    /// A create is one insert: its network, expiry action and kept request go in the same
    /// transaction as its row, and a refused create leaves none of them.
    #[test]
    fn a_create_writes_network_expiry_and_request_in_its_one_transaction() {
        let s = SqliteStore::open_in_memory().unwrap();
        let mut n = new("n1", &[]);
        n.on_timeout = OnTimeout::Pause;
        n.network = Some(StoredNetwork {
            policy: rampart_types::NetworkPolicy::default(),
            secrets: Vec::new(),
        });
        n.request = Some("{\"template\":\"base\"}".into());
        s.insert_creating(&n, 1, 10).unwrap();
        let rec = s.get(&n.id).unwrap().unwrap();
        assert_eq!(rec.on_timeout, OnTimeout::Pause);
        assert!(s.network(&n.id).unwrap().is_some());
        let requests = |id: &str| -> i64 {
            s.lock()
                .query_row(
                    "SELECT COUNT(*) FROM sandbox_requests WHERE id = ?1",
                    [id],
                    |r| r.get(0),
                )
                .unwrap()
        };
        assert_eq!(requests("n1"), 1);
        // Full: nothing of the second one is written.
        let mut m = new("n2", &[]);
        m.network = n.network.clone();
        m.request = n.request.clone();
        assert!(matches!(
            s.insert_creating(&m, 1, 10),
            Err(StoreError::Full { .. })
        ));
        assert!(s.get(&m.id).unwrap().is_none());
        assert!(s.network(&m.id).unwrap().is_none());
        assert_eq!(requests("n2"), 0);
    }

    fn id(s: &str) -> SandboxId {
        SandboxId::parse(s).unwrap()
    }

    fn e2b(token: &str) -> access::E2bSandbox {
        access::E2bSandbox {
            access_token: token.into(),
            template: "code-interpreter-v1".into(),
            options: String::new(),
        }
    }

    #[test]
    fn access_is_written_with_the_sandbox_and_forgotten_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let s = SqliteStore::open(&db).unwrap();
        let access = access::AccessStore::open(&db).unwrap();
        let mut n = new("acc1", &[]);
        let token = access::new_token();
        let envd = access::new_token();
        n.access = Some(access::NewAccess {
            token: token.clone(),
            public_ports: vec![8080],
            e2b: Some(e2b(&envd)),
        });
        s.insert_creating(&n, 10, 10).unwrap();
        assert_eq!(
            access.token("acc1").unwrap().as_deref(),
            Some(token.as_str())
        );
        assert!(access.is_public("acc1", 8080).unwrap());
        assert_eq!(access.e2b("acc1").unwrap(), Some(e2b(&envd)));
        assert!(access.is_e2b_token(&envd).unwrap());
        assert!(!access.is_e2b_token(&token).unwrap() && !access.is_token(&envd).unwrap());
        // A create the store refuses (full) leaves no token and no E2B facts behind.
        let mut m = new("acc2", &[]);
        let envd2 = access::new_token();
        m.access = Some(access::NewAccess {
            token: access::new_token(),
            public_ports: vec![],
            e2b: Some(e2b(&envd2)),
        });
        assert!(matches!(
            s.insert_creating(&m, 1, 10),
            Err(StoreError::Full { .. })
        ));
        assert_eq!(access.token("acc2").unwrap(), None);
        assert_eq!(access.e2b("acc2").unwrap(), None);
        assert!(!access.is_e2b_token(&envd2).unwrap());
        // Stopping keeps it; the end (destroyed or failed) forgets it.
        s.set_state(&n.id, SandboxState::Stopping, None, None)
            .unwrap();
        assert!(access.token("acc1").unwrap().is_some());
        assert!(access.e2b("acc1").unwrap().is_some());
        s.set_state(&n.id, SandboxState::Destroyed, Some(now_ms()), Some("x"))
            .unwrap();
        assert_eq!(access.token("acc1").unwrap(), None);
        assert!(!access.is_public("acc1", 8080).unwrap());
        assert_eq!(access.e2b("acc1").unwrap(), None);
        assert!(!access.is_e2b_token(&envd).unwrap());
    }

    #[test]
    fn e2b_facts_go_at_every_end() {
        let s = SqliteStore::open_in_memory().unwrap();
        let facts = |id: &str| -> Option<String> {
            s.lock()
                .query_row(
                    "SELECT access_token FROM e2b_sandboxes WHERE id = ?1",
                    [id],
                    |r| r.get(0),
                )
                .optional()
                .unwrap()
        };
        let make = |name: &str| {
            let mut n = new(name, &[]);
            n.access = Some(access::NewAccess {
                token: access::new_token(),
                public_ports: vec![],
                e2b: Some(e2b(&access::new_token())),
            });
            s.insert_creating(&n, 10, 10).unwrap();
            assert!(facts(name).is_some());
            n.id
        };
        let ended = |id: &SandboxId| {
            let r = s.get(id).unwrap().unwrap();
            assert!(!r.state.is_alive(), "{r:?}");
            assert_eq!(facts(id.as_str()), None, "{id}: {r:?}");
        };
        let event = |id: &SandboxId, reason: &str| NewEvent {
            sandbox: id.clone(),
            seq: 0,
            time: "2025-01-01T00:00:00Z".into(),
            hash: format!("{reason:0>64}"),
            prev: "0".repeat(64),
            json: format!("{{\"reason\":\"{reason}\"}}"),
            blobs: Vec::new(),
        };
        // Killed (a destroy by request) and expired (the reaper): stopping, then destroyed
        // with its record in the same transaction.
        for reason in ["api", "timeout"] {
            let id = make(&format!("e2b{reason}"));
            s.set_running(&id, 1, 2, "/s").unwrap();
            s.set_state(&id, SandboxState::Stopping, None, None)
                .unwrap();
            assert!(facts(id.as_str()).is_some(), "stopping keeps them");
            s.set_state_audited(
                &id,
                SandboxState::Destroyed,
                Some(now_ms()),
                Some(reason),
                Some(&event(&id, reason)),
            )
            .unwrap();
            ended(&id);
        }
        // A paused one destroyed by its expiry.
        let id = make("e2bpaused");
        s.set_running(&id, 1, 2, "/s").unwrap();
        s.set_state(&id, SandboxState::Paused, None, None).unwrap();
        assert!(facts(id.as_str()).is_some(), "paused keeps them");
        s.set_state(&id, SandboxState::Destroyed, Some(now_ms()), None)
            .unwrap();
        ended(&id);
        // A create that failed, and one that recovery found dead.
        let id = make("e2bfailed");
        s.set_state(&id, SandboxState::Failed, Some(now_ms()), Some("launch"))
            .unwrap();
        ended(&id);
        let id = make("e2bdead");
        s.set_running(&id, 1, 2, "/s").unwrap();
        s.set_state(&id, SandboxState::Failed, Some(now_ms()), Some("gone"))
            .unwrap();
        ended(&id);
    }

    #[test]
    fn e2b_facts_of_an_old_database_are_read_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        drop(SqliteStore::open(&db).unwrap());
        // The table as the key store made it, before it moved here, with rows.
        {
            let c = Connection::open(&db).unwrap();
            c.execute_batch(
                "DROP TABLE e2b_sandboxes;
                CREATE TABLE IF NOT EXISTS e2b_sandboxes (
                    id TEXT PRIMARY KEY NOT NULL,
                    access_token TEXT NOT NULL,
                    template TEXT NOT NULL,
                    created_at INTEGER NOT NULL
                );
                CREATE INDEX IF NOT EXISTS e2b_sandboxes_token
                    ON e2b_sandboxes(access_token);
                INSERT INTO e2b_sandboxes VALUES ('old1', 'tok1', 'base', 1);
                INSERT INTO e2b_sandboxes VALUES ('old2', 'tok2', 'base', 1);",
            )
            .unwrap();
        }
        let s = SqliteStore::open(&db).unwrap();
        let access = access::AccessStore::open(&db).unwrap();
        let old1 = access::E2bSandbox {
            access_token: "tok1".into(),
            template: "base".into(),
            options: String::new(),
        };
        assert_eq!(access.e2b("old1").unwrap(), Some(old1));
        assert!(access.is_e2b_token("tok2").unwrap());
        // The key store, opened on it as before, still works.
        let keys = keys::KeyStore::open(&db).unwrap();
        assert_eq!(keys.count_keys().unwrap(), 0);
        // Its sandbox ends: its facts go with it; one that ended under no daemon goes at
        // the next start's sweep of the ended.
        let mut n = new("old1", &[]);
        n.access = None;
        s.insert_creating(&n, 10, 10).unwrap();
        assert!(access.e2b("old1").unwrap().is_some());
        s.set_state(&n.id, SandboxState::Destroyed, Some(now_ms()), None)
            .unwrap();
        assert_eq!(access.e2b("old1").unwrap(), None);
        assert_eq!(access.retain(&[]).unwrap(), 1);
        assert!(!access.is_e2b_token("tok2").unwrap());
    }

    #[test]
    fn alive_disk_bytes_sums_the_alive_only() {
        let s = SqliteStore::open_in_memory().unwrap();
        assert_eq!(s.alive_disk_bytes().unwrap(), 0);
        let mut a = new("d1", &[]);
        a.limits.disk_bytes = 3 << 30;
        let mut b = new("d2", &[]);
        b.limits.disk_bytes = 1 << 30;
        s.insert_creating(&a, 10, 10).unwrap();
        s.insert_creating(&b, 10, 10).unwrap();
        assert_eq!(s.alive_disk_bytes().unwrap(), 4 << 30);
        let slow: u64 = s.alive().unwrap().iter().map(|r| r.limits.disk_bytes).sum();
        assert_eq!(s.alive_disk_bytes().unwrap(), slow);
        s.set_state(&a.id, SandboxState::Destroyed, Some(now_ms()), None)
            .unwrap();
        assert_eq!(s.alive_disk_bytes().unwrap(), 1 << 30);
    }

    #[test]
    fn lowest_free_slot_fills_gaps() {
        assert_eq!(lowest_free_slot(&[], 4), Some(0));
        assert_eq!(lowest_free_slot(&[0, 1, 3], 4), Some(2));
        assert_eq!(lowest_free_slot(&[1, 2], 4), Some(0));
        assert_eq!(lowest_free_slot(&[0, 1, 2, 3], 4), None);
        assert_eq!(lowest_free_slot(&[0, 1], 2), None);
        assert_eq!(lowest_free_slot(&[], 0), None);
    }

    #[test]
    fn the_database_is_private_from_its_first_byte() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        // The test process's umask (022 as a rule) would leave a plain create 0644.
        let s = SqliteStore::open(&path).unwrap();
        for p in db_files(&path) {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
        drop(s);
        // A database left readable by an older daemon is made private at its next open.
        for p in db_files(&path) {
            if p.exists() {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
            }
        }
        let _s = SqliteStore::open(&path).unwrap();
        let _a = access::AccessStore::open(&path).unwrap();
        for p in db_files(&path) {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
    }

    #[test]
    fn schema_is_migrated_once_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let s = SqliteStore::open(&path).unwrap();
            assert_eq!(s.schema_version().unwrap(), SCHEMA_VERSION);
            s.insert_creating(&new("a1", &[]), 10, 10).unwrap();
        }
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(s.schema_version().unwrap(), SCHEMA_VERSION);
        let rec = s.get(&id("a1")).unwrap().unwrap();
        assert_eq!(rec.state, SandboxState::Creating);
        assert_eq!(rec.env.get("A").map(String::as_str), Some("secret"));
        assert_eq!(rec.limits, Limits::default());
        let mode: String = s
            .lock()
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(SqliteStore::open(&path).unwrap());
        let c = Connection::open(&path).unwrap();
        c.execute("INSERT INTO migrations VALUES (99, 0)", [])
            .unwrap();
        drop(c);
        assert!(matches!(
            SqliteStore::open(&path),
            Err(StoreError::TooNew { found: 99, .. })
        ));
    }

    #[test]
    fn slots_are_unique_among_alive_and_reused_after_end() {
        let s = SqliteStore::open_in_memory().unwrap();
        assert_eq!(s.insert_creating(&new("a", &[]), 10, 3).unwrap(), 0);
        assert_eq!(s.insert_creating(&new("b", &[]), 10, 3).unwrap(), 1);
        assert_eq!(s.insert_creating(&new("c", &[]), 10, 3).unwrap(), 2);
        assert!(matches!(
            s.insert_creating(&new("d", &[]), 10, 3),
            Err(StoreError::NoFreeSlot { slots: 3 })
        ));
        s.set_state(
            &id("b"),
            SandboxState::Destroyed,
            Some(now_ms()),
            Some("gone"),
        )
        .unwrap();
        assert_eq!(s.insert_creating(&new("d", &[]), 10, 3).unwrap(), 1);
        // The index refuses a second alive holder of a slot even if the code were wrong.
        let conn = s.lock();
        let err = conn.execute("UPDATE sandboxes SET state = 'running' WHERE id = 'b'", []);
        assert!(err.is_err());
    }

    #[test]
    fn capacity_and_duplicates_are_refused() {
        let s = SqliteStore::open_in_memory().unwrap();
        s.insert_creating(&new("a", &[]), 2, 10).unwrap();
        assert!(matches!(
            s.insert_creating(&new("a", &[]), 2, 10),
            Err(StoreError::Duplicate(_))
        ));
        s.insert_creating(&new("b", &[]), 2, 10).unwrap();
        assert!(matches!(
            s.insert_creating(&new("c", &[]), 2, 10),
            Err(StoreError::Full { alive: 2 })
        ));
    }

    #[test]
    fn paused_is_alive_keeps_its_slot_and_on_timeout_is_kept() {
        let s = SqliteStore::open_in_memory().unwrap();
        s.insert_creating(&new("a", &[]), 10, 10).unwrap();
        assert_eq!(
            s.get(&id("a")).unwrap().unwrap().on_timeout,
            OnTimeout::Destroy
        );
        s.set_on_timeout(&id("a"), OnTimeout::Pause).unwrap();
        s.set_running(&id("a"), 1, 2, "/s").unwrap();
        s.set_state(&id("a"), SandboxState::Paused, None, None)
            .unwrap();
        let a = s.get(&id("a")).unwrap().unwrap();
        assert_eq!(
            (a.state, a.on_timeout),
            (SandboxState::Paused, OnTimeout::Pause)
        );
        assert_eq!(a.ended_at_ms, None);
        assert_eq!(s.alive().unwrap().len(), 1);
        // Its slot stays taken.
        assert_eq!(s.insert_creating(&new("b", &[]), 10, 10).unwrap(), 1);
        assert_eq!(
            s.list(Some(SandboxState::Paused), &BTreeMap::new())
                .unwrap()
                .len(),
            1
        );
        assert!(matches!(
            s.set_on_timeout(&id("zz"), OnTimeout::Pause),
            Err(StoreError::NotFound(_))
        ));
    }

    #[test]
    fn a_stopped_sandbox_is_paused_without_a_pid_and_keeps_its_slot() {
        let s = SqliteStore::open_in_memory().unwrap();
        s.insert_creating(&new("a", &[]), 10, 10).unwrap();
        s.set_on_timeout(&id("a"), OnTimeout::PauseFilesystem)
            .unwrap();
        s.set_running(&id("a"), 1, 2, "/s").unwrap();
        s.set_stopped_audited(&id("a"), None).unwrap();
        let a = s.get(&id("a")).unwrap().unwrap();
        assert_eq!(a.state, SandboxState::Paused);
        assert_eq!(
            (a.pid, a.pid_start_time, a.agent_socket),
            (None, None, None)
        );
        assert_eq!(a.on_timeout, OnTimeout::PauseFilesystem);
        assert_eq!(s.alive().unwrap().len(), 1);
        assert_eq!(s.insert_creating(&new("b", &[]), 10, 10).unwrap(), 1);
        // Booted again: running with its new init.
        s.set_running(&id("a"), 7, 8, "/t").unwrap();
        let a = s.get(&id("a")).unwrap().unwrap();
        assert_eq!((a.state, a.pid), (SandboxState::Running, Some(7)));
        assert!(matches!(
            s.set_stopped_audited(&id("zz"), None),
            Err(StoreError::NotFound(_))
        ));
    }

    #[test]
    fn lifecycle_updates_and_filters() {
        let s = SqliteStore::open_in_memory().unwrap();
        s.insert_creating(&new("a", &[("team", "x")]), 10, 10)
            .unwrap();
        s.insert_creating(&new("b", &[("team", "y")]), 10, 10)
            .unwrap();
        s.set_running(&id("a"), 1234, 987654, "/run/a.sock")
            .unwrap();
        s.set_expiry(&id("a"), 42).unwrap();
        let a = s.get(&id("a")).unwrap().unwrap();
        assert_eq!(a.state, SandboxState::Running);
        assert_eq!(a.pid, Some(1234));
        assert_eq!(a.pid_start_time, Some(987654));
        assert_eq!(a.agent_socket.as_deref(), Some("/run/a.sock"));
        assert_eq!(a.expires_at_ms, 42);

        let team_x: BTreeMap<_, _> = [("team".to_string(), "x".to_string())].into();
        let listed = s.list(None, &team_x).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].id, id("a"));
        assert_eq!(
            s.list(Some(SandboxState::Creating), &BTreeMap::new())
                .unwrap()
                .len(),
            1
        );
        assert_eq!(s.alive().unwrap().len(), 2);

        s.set_state(
            &id("a"),
            SandboxState::Destroyed,
            Some(100),
            Some("expired"),
        )
        .unwrap();
        let a = s.get(&id("a")).unwrap().unwrap();
        assert_eq!(a.ended_at_ms, Some(100));
        assert_eq!(a.reason.as_deref(), Some("expired"));
        assert_eq!(s.alive().unwrap().len(), 1);
        assert_eq!(
            s.list(Some(SandboxState::Destroyed), &team_x)
                .unwrap()
                .len(),
            1
        );

        let counts = s.counts().unwrap();
        assert_eq!(counts.get(&SandboxState::Destroyed), Some(&1));
        assert_eq!(counts.get(&SandboxState::Creating), Some(&1));
        assert_eq!(counts.get(&SandboxState::Running), None);

        assert_eq!(s.prune_ended(101).unwrap(), 1);
        assert!(s.get(&id("a")).unwrap().is_none());
        assert!(matches!(
            s.set_expiry(&id("a"), 1),
            Err(StoreError::NotFound(_))
        ));
    }

    #[test]
    fn concurrent_inserts_get_distinct_slots() {
        let dir = tempfile::tempdir().unwrap();
        let s = std::sync::Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap());
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let s = s.clone();
                std::thread::spawn(move || {
                    s.insert_creating(&new(&format!("t{i}"), &[]), 100, 100)
                        .unwrap()
                })
            })
            .collect();
        let mut slots: Vec<u32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        slots.sort();
        assert_eq!(slots, (0..8).collect::<Vec<_>>());
    }
}
