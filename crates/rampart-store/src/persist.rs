//! Snapshots, volumes and the create request of each sandbox (for fork), in `state.db`.
//!
//! The tables are made by migration 5 of the state store (and again, idempotently, when a
//! [`PersistStore`] opens: a database migrated past 5 before 5 existed lacks them);
//! [`PersistStore`] is a connection of its own to the same database.

use crate::{now_ms, side, StoreError};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// Migration 5.
pub(crate) const MIGRATION: &str = "CREATE TABLE IF NOT EXISTS snapshots (
        name TEXT PRIMARY KEY NOT NULL,
        source TEXT NOT NULL,
        template TEXT NOT NULL,
        uid_base INTEGER NOT NULL,
        limits TEXT NOT NULL,
        env TEXT NOT NULL,
        request TEXT NOT NULL,
        size_bytes INTEGER NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS volumes (
        name TEXT PRIMARY KEY NOT NULL,
        size_mib INTEGER NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS sandbox_requests (
        id TEXT PRIMARY KEY NOT NULL,
        request TEXT NOT NULL
    );";

/// A snapshot as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    /// Its name.
    pub name: String,
    /// The sandbox it was taken from.
    pub source: String,
    /// The template it sits on.
    pub template: String,
    /// First host uid of the range its files belong to.
    pub uid_base: u32,
    /// The source's limits (JSON of `Limits`).
    pub limits: String,
    /// The source's environment (JSON object).
    pub env: String,
    /// The source's create request (JSON of `CreateSandbox`).
    pub request: String,
    /// Allocated bytes of its image when taken.
    pub size_bytes: u64,
    /// Unix ms.
    pub created_at_ms: i64,
}

/// A volume as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    /// Its name.
    pub name: String,
    /// Size in MiB.
    pub size_mib: u64,
    /// Unix ms.
    pub created_at_ms: i64,
}

/// The persistence tables.
#[derive(Debug)]
pub struct PersistStore {
    conn: Mutex<Connection>,
}

fn snap_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SnapshotRow> {
    Ok(SnapshotRow {
        name: r.get(0)?,
        source: r.get(1)?,
        template: r.get(2)?,
        uid_base: r.get::<_, i64>(3)? as u32,
        limits: r.get(4)?,
        env: r.get(5)?,
        request: r.get(6)?,
        size_bytes: r.get::<_, i64>(7)? as u64,
        created_at_ms: r.get(8)?,
    })
}

const SNAP_COLS: &str =
    "name, source, template, uid_base, limits, env, request, size_bytes, created_at";

impl PersistStore {
    /// Opens the tables in the database at `path` (migrated by [`crate::SqliteStore::open`]).
    pub fn open(path: &Path) -> Result<PersistStore, StoreError> {
        // A database migrated past 5 before 5 existed lacks the tables.
        Ok(PersistStore {
            conn: side::open(path, MIGRATION)?,
        })
    }

    /// An in-memory store with the tables (tests).
    pub fn open_in_memory() -> Result<PersistStore, StoreError> {
        Ok(PersistStore {
            conn: side::open_in_memory(MIGRATION)?,
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        side::lock(&self.conn)
    }

    /// Records a snapshot; `Duplicate` if the name is taken.
    pub fn insert_snapshot(&self, s: &SnapshotRow) -> Result<(), StoreError> {
        let r = self.conn().execute(
            &format!("INSERT INTO snapshots ({SNAP_COLS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9)"),
            params![
                s.name,
                s.source,
                s.template,
                i64::from(s.uid_base),
                s.limits,
                s.env,
                s.request,
                s.size_bytes as i64,
                s.created_at_ms
            ],
        );
        match r {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(StoreError::Duplicate(s.name.clone()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// One snapshot.
    pub fn snapshot(&self, name: &str) -> Result<Option<SnapshotRow>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {SNAP_COLS} FROM snapshots WHERE name = ?1"),
                params![name],
                snap_row,
            )
            .optional()?)
    }

    /// Every snapshot, oldest first.
    pub fn snapshots(&self) -> Result<Vec<SnapshotRow>, StoreError> {
        let c = self.conn();
        let mut st = c.prepare(&format!(
            "SELECT {SNAP_COLS} FROM snapshots ORDER BY created_at, name"
        ))?;
        let rows = st.query_map([], snap_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Forgets a snapshot; whether it existed.
    pub fn delete_snapshot(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .execute("DELETE FROM snapshots WHERE name = ?1", params![name])?
            > 0)
    }

    /// Records a volume; `Duplicate` if the name is taken.
    pub fn insert_volume(&self, name: &str, size_mib: u64) -> Result<VolumeRow, StoreError> {
        let row = VolumeRow {
            name: name.to_owned(),
            size_mib,
            created_at_ms: now_ms(),
        };
        let r = self.conn().execute(
            "INSERT INTO volumes (name, size_mib, created_at) VALUES (?1, ?2, ?3)",
            params![row.name, row.size_mib as i64, row.created_at_ms],
        );
        match r {
            Ok(_) => Ok(row),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(StoreError::Duplicate(name.to_owned()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// One volume.
    pub fn volume(&self, name: &str) -> Result<Option<VolumeRow>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT name, size_mib, created_at FROM volumes WHERE name = ?1",
                params![name],
                |r| {
                    Ok(VolumeRow {
                        name: r.get(0)?,
                        size_mib: r.get::<_, i64>(1)? as u64,
                        created_at_ms: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    /// Every volume, by name.
    pub fn volumes(&self) -> Result<Vec<VolumeRow>, StoreError> {
        let c = self.conn();
        let mut st = c.prepare("SELECT name, size_mib, created_at FROM volumes ORDER BY name")?;
        let rows = st.query_map([], |r| {
            Ok(VolumeRow {
                name: r.get(0)?,
                size_mib: r.get::<_, i64>(1)? as u64,
                created_at_ms: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Forgets a volume; whether it existed.
    pub fn delete_volume(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .execute("DELETE FROM volumes WHERE name = ?1", params![name])?
            > 0)
    }

    /// Keeps the create request of a sandbox (for fork).
    pub fn set_request(&self, id: &str, request: &str) -> Result<(), StoreError> {
        insert_request(&self.conn(), id, request)
    }

    /// The create request of a sandbox.
    pub fn request(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT request FROM sandbox_requests WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Forgets the requests of sandboxes recorded as ended (destroyed or failed). Unlike
    /// [`PersistStore::prune_requests`], safe while creates run: a create keeps its request
    /// before its sandbox is recorded.
    pub fn prune_ended_requests(&self) -> Result<usize, StoreError> {
        Ok(self.conn().execute(
            "DELETE FROM sandbox_requests WHERE id IN (SELECT id FROM sandboxes WHERE state IN ('destroyed','failed'))",
            [],
        )?)
    }

    /// Forgets the requests of sandboxes that are no longer alive (at start: no create runs).
    pub fn prune_requests(&self) -> Result<usize, StoreError> {
        Ok(self.conn().execute(
            "DELETE FROM sandbox_requests WHERE id NOT IN (SELECT id FROM sandboxes WHERE state IN ('creating','running','paused','stopping'))",
            [],
        )?)
    }
}

/// Keeps the create request of sandbox `id` (for fork), replacing any, on `conn` (a create's
/// transaction, see [`crate::NewSandbox::request`]).
pub(crate) fn insert_request(conn: &Connection, id: &str, request: &str) -> Result<(), StoreError> {
    conn.execute(
        "INSERT OR REPLACE INTO sandbox_requests (id, request) VALUES (?1, ?2)",
        params![id, request],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_requests_go_and_in_flight_ones_stay() {
        let s = PersistStore::open_in_memory().unwrap();
        s.conn()
            .execute_batch(
                "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, state TEXT);
                 INSERT INTO sandboxes VALUES ('gone', 'destroyed'), ('bad', 'failed'),
                                              ('live', 'running');",
            )
            .unwrap();
        for id in ["gone", "bad", "live", "staged"] {
            s.set_request(id, "{}").unwrap();
        }
        assert_eq!(s.prune_ended_requests().unwrap(), 2);
        assert!(s.request("gone").unwrap().is_none());
        assert!(s.request("live").unwrap().is_some());
        assert!(
            s.request("staged").unwrap().is_some(),
            "a create not yet recorded keeps its request"
        );
    }

    #[test]
    fn snapshots_and_volumes_round_trip() {
        let s = PersistStore::open_in_memory().unwrap();
        let row = SnapshotRow {
            name: "a".into(),
            source: "sb".into(),
            template: "base".into(),
            uid_base: 100_000,
            limits: "{}".into(),
            env: "{}".into(),
            request: "{}".into(),
            size_bytes: 4096,
            created_at_ms: 1,
        };
        s.insert_snapshot(&row).unwrap();
        assert!(matches!(
            s.insert_snapshot(&row),
            Err(StoreError::Duplicate(_))
        ));
        assert_eq!(s.snapshot("a").unwrap(), Some(row.clone()));
        assert_eq!(s.snapshots().unwrap(), vec![row]);
        assert!(s.delete_snapshot("a").unwrap());
        assert!(!s.delete_snapshot("a").unwrap());
        s.insert_volume("v", 64).unwrap();
        assert!(matches!(
            s.insert_volume("v", 1),
            Err(StoreError::Duplicate(_))
        ));
        assert_eq!(s.volumes().unwrap().len(), 1);
        assert_eq!(s.volume("v").unwrap().unwrap().size_mib, 64);
        assert!(s.delete_volume("v").unwrap());
        s.set_request("x", "{}").unwrap();
        assert_eq!(s.request("x").unwrap().as_deref(), Some("{}"));
    }
}
