//! The audit tables: per-sandbox event chains, content-addressed blobs, the node's Merkle
//! log of published chain heads and its signed tree heads.
//!
//! The store keeps these as plain data (hex strings and JSON text); hashing, signing and
//! checking are `rampart-audit`'s. Events are inserted in the same transaction as the state
//! change they record (see [`crate::SandboxStore::set_state_audited`] and friends), so an
//! event whose transaction committed survives a crash of the daemon.

use crate::StoreError;
use rampart_types::SandboxId;
use rusqlite::{params, Connection, OptionalExtension};

/// Schema of the audit tables (migration 2).
pub(crate) const MIGRATION: &str = "
    CREATE TABLE audit_events (
        sandbox TEXT NOT NULL,
        seq INTEGER NOT NULL,
        time TEXT NOT NULL,
        hash TEXT NOT NULL,
        prev TEXT NOT NULL,
        event TEXT NOT NULL,
        PRIMARY KEY (sandbox, seq)
    ) WITHOUT ROWID;
    CREATE TABLE audit_blobs (
        digest TEXT PRIMARY KEY NOT NULL,
        bytes BLOB NOT NULL
    );
    CREATE TABLE audit_leaves (
        idx INTEGER PRIMARY KEY NOT NULL,
        leaf_hash TEXT NOT NULL,
        sandbox TEXT NOT NULL,
        length INTEGER NOT NULL,
        head TEXT NOT NULL
    );
    CREATE INDEX audit_leaves_sandbox ON audit_leaves(sandbox, idx);
    CREATE TABLE audit_tree_heads (
        tree_size INTEGER PRIMARY KEY NOT NULL,
        root TEXT NOT NULL,
        timestamp TEXT NOT NULL,
        sth TEXT NOT NULL
    );";

/// Migration 4: events move to `audit_log`, a rowid table keyed by one integer,
/// `(chain number << 32) | seq`, where `audit_chains` gives each sandbox its chain number.
///
/// Why: the events of migration 2 lived in a `WITHOUT ROWID` table keyed `(sandbox, seq)`,
/// an index b-tree of ~1 KB rows (four to a page), whose every split rebalances three
/// siblings and their parent: 4 to 13 pages written to the WAL for one exec's `exit`. With
/// an integer key, the events of the newest chain are appended at the right edge of the
/// tree, where SQLite splits by starting a new page (one leaf page per commit, three when
/// it fills); the rows no longer repeat `time` and `prev`, which the event JSON holds.
/// Existing rows are moved, chain numbers given in order of each chain's first event.
pub(crate) const MIGRATION_4: &str = "
    CREATE TABLE audit_chains (
        num INTEGER PRIMARY KEY NOT NULL,
        sandbox TEXT NOT NULL UNIQUE
    );
    INSERT INTO audit_chains (sandbox)
        SELECT sandbox FROM audit_events GROUP BY sandbox ORDER BY MIN(time), sandbox;
    CREATE TABLE audit_log (
        key INTEGER PRIMARY KEY NOT NULL,
        hash TEXT NOT NULL,
        event TEXT NOT NULL
    );
    INSERT INTO audit_log (key, hash, event)
        SELECT (c.num << 32) | e.seq, e.hash, e.event
        FROM audit_events e JOIN audit_chains c ON c.sandbox = e.sandbox
        ORDER BY 1;
    DROP TABLE audit_events;";

/// Sequence numbers of one chain fit in the low 32 bits of an `audit_log` key.
const SEQ_BITS: u32 = 32;

/// An audit event to insert, with the blobs it refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// The sandbox whose log it extends.
    pub sandbox: SandboxId,
    /// Its position (must be the next one: the primary key refuses a duplicate; below 2^32).
    pub seq: u64,
    /// Its time (RFC 3339).
    pub time: String,
    /// Its hash (hex).
    pub hash: String,
    /// The previous event's hash (hex).
    pub prev: String,
    /// The whole event as canonical JSON.
    pub json: String,
    /// Blobs it refers to: `(digest hex, bytes)`; already stored ones are kept as they are.
    pub blobs: Vec<(String, Vec<u8>)>,
}

/// A stored audit event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Its position.
    pub seq: u64,
    /// Its hash (hex).
    pub hash: String,
    /// The whole event as JSON.
    pub json: String,
}

/// A leaf of the node's Merkle log: a published chain head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafRow {
    /// Its index in the log.
    pub index: u64,
    /// The leaf hash (hex).
    pub leaf_hash: String,
    /// The sandbox whose chain it publishes.
    pub sandbox: SandboxId,
    /// The chain's length then.
    pub length: u64,
    /// The chain's head then (hex).
    pub head: String,
}

/// A signed tree head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeHeadRow {
    /// Number of leaves it covers.
    pub tree_size: u64,
    /// Its root (hex).
    pub root: String,
    /// When it was signed (RFC 3339).
    pub timestamp: String,
    /// The whole signed tree head as JSON.
    pub json: String,
}

fn corrupt(what: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        id: what.to_owned(),
        detail: detail.to_string(),
    }
}

fn u64_of(what: &str, v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|e| corrupt(what, e))
}

fn i64_of(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|e| corrupt("audit", e))
}

/// The chain number of a sandbox (None if it has no event yet).
fn chain_num(conn: &Connection, sandbox: &SandboxId) -> Result<Option<i64>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT num FROM audit_chains WHERE sandbox = ?1")?
        .query_row([sandbox.as_str()], |r| r.get::<_, i64>(0))
        .optional()?)
}

/// The range of `audit_log` keys of chain `num`: `[lo, hi]`.
fn key_range(num: i64) -> (i64, i64) {
    let lo = num << SEQ_BITS;
    (lo, lo | ((1i64 << SEQ_BITS) - 1))
}

/// How many `exec` events the store holds for `sandbox` (events still in the daemon's
/// journal are counted once flushed).
pub(crate) fn exec_count(conn: &Connection, sandbox: &str) -> Result<u64, StoreError> {
    let Some(num) = conn
        .prepare_cached("SELECT num FROM audit_chains WHERE sandbox = ?1")?
        .query_row([sandbox], |r| r.get::<_, i64>(0))
        .optional()?
    else {
        return Ok(0);
    };
    let (lo, hi) = key_range(num);
    let n: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM audit_log WHERE key BETWEEN ?1 AND ?2 \
             AND json_extract(event, '$.body.type') = 'exec'",
        )?
        .query_row(params![lo, hi], |r| r.get(0))?;
    Ok(n.max(0) as u64)
}

pub(crate) fn insert_event(conn: &Connection, e: &NewEvent) -> Result<(), StoreError> {
    insert(conn, e, false)
}

/// Inserts `e` unless an event of its sandbox with its seq is stored (then nothing is
/// changed): for events replayed from the daemon's audit journal.
pub(crate) fn insert_event_once(conn: &Connection, e: &NewEvent) -> Result<(), StoreError> {
    insert(conn, e, true)
}

fn insert(conn: &Connection, e: &NewEvent, once: bool) -> Result<(), StoreError> {
    for (digest, bytes) in &e.blobs {
        conn.prepare_cached("INSERT OR IGNORE INTO audit_blobs (digest, bytes) VALUES (?1, ?2)")?
            .execute(params![digest, bytes])?;
    }
    let seq = u32::try_from(e.seq).map_err(|_| {
        corrupt(
            e.sandbox.as_str(),
            format!("event seq {} is past the last one a chain can hold", e.seq),
        )
    })?;
    let num = match chain_num(conn, &e.sandbox)? {
        Some(n) => n,
        None => {
            conn.prepare_cached("INSERT INTO audit_chains (sandbox) VALUES (?1)")?
                .execute([e.sandbox.as_str()])?;
            conn.last_insert_rowid()
        }
    };
    // A key already taken (the same seq twice) is refused by the primary key, or ignored.
    let sql = if once {
        "INSERT OR IGNORE INTO audit_log (key, hash, event) VALUES (?1, ?2, ?3)"
    } else {
        "INSERT INTO audit_log (key, hash, event) VALUES (?1, ?2, ?3)"
    };
    conn.prepare_cached(sql)?.execute(params![
        key_range(num).0 | i64::from(seq),
        e.hash,
        e.json
    ])?;
    Ok(())
}

pub(crate) fn events(
    conn: &Connection,
    sandbox: &SandboxId,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<StoredEvent>, StoreError> {
    let Some(num) = chain_num(conn, sandbox)? else {
        return Ok(Vec::new());
    };
    let (lo, hi) = key_range(num);
    let from = match after {
        // Past the last possible seq: nothing.
        Some(a) if a >= (1u64 << SEQ_BITS) - 1 => return Ok(Vec::new()),
        Some(a) => lo + i64_of(a)? + 1,
        None => lo,
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(
        "SELECT key, hash, event FROM audit_log WHERE key >= ?1 AND key <= ?2 \
         ORDER BY key LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![from, hi, limit], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (key, hash, json) = row?;
        out.push(StoredEvent {
            seq: u64_of(sandbox.as_str(), key - lo)?,
            hash,
            json,
        });
    }
    Ok(out)
}

pub(crate) fn last_event(
    conn: &Connection,
    sandbox: &SandboxId,
) -> Result<Option<(u64, String)>, StoreError> {
    let Some(num) = chain_num(conn, sandbox)? else {
        return Ok(None);
    };
    let (lo, hi) = key_range(num);
    let row = conn
        .prepare_cached(
            "SELECT key, hash FROM audit_log WHERE key >= ?1 AND key <= ?2 \
             ORDER BY key DESC LIMIT 1",
        )?
        .query_row(params![lo, hi], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })
        .optional()?;
    row.map(|(k, h)| Ok((u64_of(sandbox.as_str(), k - lo)?, h)))
        .transpose()
}

pub(crate) fn blob(conn: &Connection, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT bytes FROM audit_blobs WHERE digest = ?1")?
        .query_row([digest], |r| r.get::<_, Vec<u8>>(0))
        .optional()?)
}

pub(crate) fn leaf_hashes(conn: &Connection) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT idx, leaf_hash FROM audit_leaves ORDER BY idx")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (idx, h) = row?;
        if u64_of("audit_leaves", idx)? != out.len() as u64 {
            return Err(corrupt(
                "audit_leaves",
                format!("leaf index {idx} out of order"),
            ));
        }
        out.push(h);
    }
    Ok(out)
}

pub(crate) fn last_leaf(
    conn: &Connection,
    sandbox: &SandboxId,
) -> Result<Option<LeafRow>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT idx, leaf_hash, length, head FROM audit_leaves WHERE sandbox = ?1 \
             ORDER BY idx DESC LIMIT 1",
        )?
        .query_row([sandbox.as_str()], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
            ))
        })
        .optional()?;
    row.map(|(idx, leaf_hash, length, head)| {
        Ok(LeafRow {
            index: u64_of(sandbox.as_str(), idx)?,
            leaf_hash,
            sandbox: sandbox.clone(),
            length: u64_of(sandbox.as_str(), length)?,
            head,
        })
    })
    .transpose()
}

pub(crate) fn publish(
    conn: &Connection,
    leaves: &[LeafRow],
    th: &TreeHeadRow,
) -> Result<(), StoreError> {
    for l in leaves {
        conn.prepare_cached(
            "INSERT INTO audit_leaves (idx, leaf_hash, sandbox, length, head) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![
            i64_of(l.index)?,
            l.leaf_hash,
            l.sandbox.as_str(),
            i64_of(l.length)?,
            l.head
        ])?;
    }
    conn.prepare_cached(
        "INSERT OR REPLACE INTO audit_tree_heads (tree_size, root, timestamp, sth) \
         VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        i64_of(th.tree_size)?,
        th.root,
        th.timestamp,
        th.json
    ])?;
    Ok(())
}

pub(crate) fn latest_tree_head(conn: &Connection) -> Result<Option<TreeHeadRow>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT tree_size, root, timestamp, sth FROM audit_tree_heads \
             ORDER BY tree_size DESC LIMIT 1",
        )?
        .query_row([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
            ))
        })
        .optional()?;
    row.map(|(size, root, timestamp, json)| {
        Ok(TreeHeadRow {
            tree_size: u64_of("audit_tree_heads", size)?,
            root,
            timestamp,
            json,
        })
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NewSandbox, SandboxStore, SqliteStore};
    use rampart_types::{Limits, SandboxState};

    fn ev(id: &SandboxId, seq: u64) -> NewEvent {
        NewEvent {
            sandbox: id.clone(),
            seq,
            time: "2026-01-01T00:00:00.000Z".into(),
            hash: format!("h{seq}"),
            prev: format!("h{}", seq.wrapping_sub(1)),
            json: format!("{{\"seq\":{seq}}}"),
            blobs: vec![("d1".into(), b"bytes".to_vec())],
        }
    }

    #[test]
    fn events_commit_with_state_changes_and_page() {
        let s = SqliteStore::open_in_memory().unwrap();
        let id = SandboxId::parse("a1").unwrap();
        s.insert_creating(
            &NewSandbox {
                id: id.clone(),
                template: "base".into(),
                limits: Limits::default(),
                env: Default::default(),
                metadata: Default::default(),
                created_at_ms: 0,
                expires_at_ms: 1,
                access: None,
                on_timeout: Default::default(),
                network: None,
                request: None,
                tenant: None,
                isolation: Default::default(),
                idle_pause_secs: None,
                pooled: false,
            },
            10,
            10,
        )
        .unwrap();
        s.set_running_audited(&id, 1, 2, "/s", Some(&ev(&id, 0)))
            .unwrap();
        s.append_event(&ev(&id, 1)).unwrap();
        // A duplicate seq is refused and the state change with it is rolled back.
        assert!(s
            .set_state_audited(
                &id,
                SandboxState::Destroyed,
                Some(5),
                Some("x"),
                Some(&ev(&id, 1))
            )
            .is_err());
        assert_eq!(s.get(&id).unwrap().unwrap().state, SandboxState::Running);
        s.set_expiry_audited(&id, 9, Some(&ev(&id, 2))).unwrap();
        assert_eq!(s.last_event(&id).unwrap(), Some((2, "h2".into())));
        let page = s.events(&id, Some(0), 1).unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].seq, 1);
        assert_eq!(s.events(&id, None, 100).unwrap().len(), 3);
        assert_eq!(s.blob("d1").unwrap().as_deref(), Some(&b"bytes"[..]));
        assert_eq!(s.blob("d2").unwrap(), None);
    }

    #[test]
    fn migration_4_moves_events_of_older_databases() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let (a, b) = (
            SandboxId::parse("a1").unwrap(),
            SandboxId::parse("b2").unwrap(),
        );
        {
            // A database as schema 3 left it, with two interleaved chains.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE migrations (version INTEGER PRIMARY KEY NOT NULL, \
                 applied_at INTEGER NOT NULL);",
            )
            .unwrap();
            for (v, sql) in crate::MIGRATIONS.iter().filter(|(v, _)| *v <= 3) {
                conn.execute_batch(sql).unwrap();
                conn.execute("INSERT INTO migrations VALUES (?1, 0)", [v])
                    .unwrap();
            }
            for (id, seq, time) in [(&b, 0, "t1"), (&a, 0, "t2"), (&b, 1, "t3"), (&a, 1, "t4")] {
                conn.execute(
                    "INSERT INTO audit_events (sandbox, seq, time, hash, prev, event) \
                     VALUES (?1, ?2, ?3, ?4, 'p', ?5)",
                    params![
                        id.as_str(),
                        seq,
                        time,
                        format!("h{id}{seq}"),
                        format!("{{\"seq\":{seq}}}")
                    ],
                )
                .unwrap();
            }
        }
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(s.schema_version().unwrap(), crate::SCHEMA_VERSION);
        for id in [&a, &b] {
            let evs = s.events(id, None, 100).unwrap();
            assert_eq!(evs.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![0, 1]);
            assert_eq!(evs[1].hash, format!("h{id}1"));
            assert_eq!(evs[1].json, "{\"seq\":1}");
            assert_eq!(s.last_event(id).unwrap(), Some((1, format!("h{id}1"))));
        }
        // The chains go on where they were, and a new sandbox gets a chain of its own.
        s.append_event(&ev(&a, 2)).unwrap();
        assert!(s.append_event(&ev(&b, 1)).is_err());
        let c = SandboxId::parse("c3").unwrap();
        s.append_event(&ev(&c, 0)).unwrap();
        assert_eq!(s.last_event(&a).unwrap(), Some((2, "h2".into())));
        assert_eq!(s.events(&a, Some(1), 10).unwrap().len(), 1);
        assert_eq!(s.events(&b, Some(1), 10).unwrap().len(), 0);
        assert_eq!(s.events(&c, None, 10).unwrap().len(), 1);
        assert_eq!(s.events(&c, Some(u64::MAX), 10).unwrap().len(), 0);
        assert_eq!(
            s.last_event(&SandboxId::parse("d4").unwrap()).unwrap(),
            None
        );
    }

    #[test]
    fn leaves_and_tree_heads() {
        let s = SqliteStore::open_in_memory().unwrap();
        let id = SandboxId::parse("b2").unwrap();
        assert!(s.latest_tree_head().unwrap().is_none());
        let leaf = |i: u64| LeafRow {
            index: i,
            leaf_hash: format!("l{i}"),
            sandbox: id.clone(),
            length: i + 1,
            head: format!("h{i}"),
        };
        let th = |n: u64| TreeHeadRow {
            tree_size: n,
            root: format!("r{n}"),
            timestamp: "t".into(),
            json: "{}".into(),
        };
        s.publish(&[leaf(0), leaf(1)], &th(2)).unwrap();
        s.publish(&[leaf(2)], &th(3)).unwrap();
        assert_eq!(s.leaf_hashes().unwrap(), vec!["l0", "l1", "l2"]);
        assert_eq!(s.last_leaf(&id).unwrap().unwrap().index, 2);
        assert_eq!(s.latest_tree_head().unwrap().unwrap().tree_size, 3);
        // An index already taken is refused, with its tree head.
        assert!(s.publish(&[leaf(2)], &th(4)).is_err());
        assert_eq!(s.latest_tree_head().unwrap().unwrap().tree_size, 3);
    }
}
