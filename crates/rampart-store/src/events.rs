//! Sandbox lifecycle events and the webhooks they are posted to (`docs/events.md`).
//!
//! Each change of a sandbox's life (created, updated, paused, resumed, checkpointed, killed)
//! is a row of `lifecycle_events`, numbered in the order it was recorded (`seq`), with its
//! tenant so that a tenant reads only its own. The same change is in the sandbox's signed
//! record too; these rows are the index that answers "the last ten events of my sandboxes"
//! without reading every record. Rows older than the retention are pruned.
//!
//! `lifecycle_webhooks` holds the webhooks, each owned by a tenant (none: the node's), with
//! the events it wants, whether it is on, and its signature secret (the store is private
//! to the daemon's user; a secret is never answered back).

use crate::{now_ms, side, StoreError};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::Mutex;

const MIGRATION: &str = "CREATE TABLE IF NOT EXISTS lifecycle_events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        uid TEXT NOT NULL UNIQUE,
        sandbox TEXT NOT NULL,
        tenant TEXT,
        kind TEXT NOT NULL,
        at INTEGER NOT NULL,
        event TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS lifecycle_events_sandbox ON lifecycle_events(sandbox, seq);
    CREATE INDEX IF NOT EXISTS lifecycle_events_tenant ON lifecycle_events(tenant, seq);
    CREATE INDEX IF NOT EXISTS lifecycle_events_at ON lifecycle_events(at);
    CREATE TABLE IF NOT EXISTS lifecycle_webhooks (
        id TEXT PRIMARY KEY NOT NULL,
        tenant TEXT,
        name TEXT NOT NULL,
        url TEXT NOT NULL,
        events TEXT NOT NULL,
        enabled INTEGER NOT NULL,
        secret TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS lifecycle_webhooks_tenant ON lifecycle_webhooks(tenant);";

/// A lifecycle event as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLifecycleEvent {
    /// Its place in the node's order of events.
    pub seq: i64,
    /// Its unique id (what clients see).
    pub uid: String,
    /// The sandbox it is about.
    pub sandbox: String,
    /// The sandbox's tenant (none: the node's).
    pub tenant: Option<String>,
    /// Its kind (`created`, `killed`, ...).
    pub kind: String,
    /// When, unix ms.
    pub at_ms: i64,
    /// The event as JSON (its shape is the caller's).
    pub event: String,
}

/// Which events a listing wants.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only this tenant's (`Some(None)`: the node's own only); `None`: every tenant's.
    pub tenant: Option<Option<String>>,
    /// Only this sandbox's.
    pub sandbox: Option<String>,
    /// Only these kinds (empty: all).
    pub kinds: Vec<String>,
    /// Events skipped, in the listing's order.
    pub offset: u64,
    /// At most this many.
    pub limit: u64,
    /// Oldest first (else newest first).
    pub ascending: bool,
}

/// A webhook as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookRow {
    /// Its id.
    pub id: String,
    /// Its owner (none: the node's).
    pub tenant: Option<String>,
    /// Its name.
    pub name: String,
    /// Where events are posted.
    pub url: String,
    /// The event types it wants (JSON list of strings).
    pub events: Vec<String>,
    /// Whether events are posted.
    pub enabled: bool,
    /// Its signature secret.
    pub secret: Option<String>,
    /// Made, unix ms.
    pub created_at_ms: i64,
    /// Last changed, unix ms.
    pub updated_at_ms: i64,
}

/// The lifecycle event and webhook store (SQLite). Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct EventStore {
    conn: Mutex<Connection>,
}

fn row_event(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredLifecycleEvent> {
    Ok(StoredLifecycleEvent {
        seq: r.get(0)?,
        uid: r.get(1)?,
        sandbox: r.get(2)?,
        tenant: r.get(3)?,
        kind: r.get(4)?,
        at_ms: r.get(5)?,
        event: r.get(6)?,
    })
}

const EVENT_COLUMNS: &str = "seq, uid, sandbox, tenant, kind, at, event";
const WEBHOOK_COLUMNS: &str =
    "id, tenant, name, url, events, enabled, secret, created_at, updated_at";

fn row_webhook(r: &rusqlite::Row<'_>) -> rusqlite::Result<WebhookRow> {
    let events: String = r.get(4)?;
    Ok(WebhookRow {
        id: r.get(0)?,
        tenant: r.get(1)?,
        name: r.get(2)?,
        url: r.get(3)?,
        events: serde_json::from_str(&events).unwrap_or_default(),
        enabled: r.get::<_, i64>(5)? != 0,
        secret: r.get(6)?,
        created_at_ms: r.get(7)?,
        updated_at_ms: r.get(8)?,
    })
}

impl EventStore {
    /// Opens the database at `path` (the daemon's `state.db`), creating the tables if needed.
    pub fn open(path: &Path) -> Result<EventStore, StoreError> {
        Ok(EventStore {
            conn: side::open(path, MIGRATION)?,
        })
    }

    /// An in-memory store (tests).
    pub fn open_in_memory() -> Result<EventStore, StoreError> {
        Ok(EventStore {
            conn: side::open_in_memory(MIGRATION)?,
        })
    }

    /// Records an event; returns its `seq`.
    pub fn append(
        &self,
        uid: &str,
        sandbox: &str,
        tenant: Option<&str>,
        kind: &str,
        at_ms: i64,
        event: &str,
    ) -> Result<i64, StoreError> {
        let conn = side::lock(&self.conn);
        conn.prepare_cached(
            "INSERT INTO lifecycle_events (uid, sandbox, tenant, kind, at, event)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![uid, sandbox, tenant, kind, at_ms, event])?;
        Ok(conn.last_insert_rowid())
    }

    /// The newest event's `seq` (0: none yet).
    pub fn last_seq(&self) -> Result<i64, StoreError> {
        Ok(side::lock(&self.conn).query_row(
            "SELECT COALESCE(MAX(seq), 0) FROM lifecycle_events",
            [],
            |r| r.get(0),
        )?)
    }

    /// Events after `seq`, oldest first, at most `limit`.
    pub fn after(&self, seq: i64, limit: u64) -> Result<Vec<StoredLifecycleEvent>, StoreError> {
        let conn = side::lock(&self.conn);
        let mut st = conn.prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM lifecycle_events WHERE seq > ?1 ORDER BY seq LIMIT ?2"
        ))?;
        let rows = st.query_map(params![seq, limit as i64], row_event)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The events `f` asks for.
    pub fn list(&self, f: &EventFilter) -> Result<Vec<StoredLifecycleEvent>, StoreError> {
        let mut sql = format!("SELECT {EVENT_COLUMNS} FROM lifecycle_events WHERE 1 = 1");
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        match &f.tenant {
            None => {}
            Some(None) => sql.push_str(" AND tenant IS NULL"),
            Some(Some(t)) => {
                args.push(t.clone().into());
                sql.push_str(&format!(" AND tenant = ?{}", args.len()));
            }
        }
        if let Some(s) = &f.sandbox {
            args.push(s.clone().into());
            sql.push_str(&format!(" AND sandbox = ?{}", args.len()));
        }
        if !f.kinds.is_empty() {
            let mut marks = Vec::new();
            for k in &f.kinds {
                args.push(k.clone().into());
                marks.push(format!("?{}", args.len()));
            }
            sql.push_str(&format!(" AND kind IN ({})", marks.join(", ")));
        }
        sql.push_str(if f.ascending {
            " ORDER BY seq ASC"
        } else {
            " ORDER BY seq DESC"
        });
        args.push((f.limit.min(i64::MAX as u64) as i64).into());
        sql.push_str(&format!(" LIMIT ?{}", args.len()));
        args.push((f.offset.min(i64::MAX as u64) as i64).into());
        sql.push_str(&format!(" OFFSET ?{}", args.len()));
        let conn = side::lock(&self.conn);
        let mut st = conn.prepare(&sql)?;
        let rows = st.query_map(rusqlite::params_from_iter(args), row_event)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Removes events recorded before `before_ms`; returns how many.
    pub fn prune(&self, before_ms: i64) -> Result<usize, StoreError> {
        Ok(side::lock(&self.conn).execute(
            "DELETE FROM lifecycle_events WHERE at < ?1",
            params![before_ms],
        )?)
    }

    /// Records a new webhook.
    pub fn insert_webhook(&self, w: &WebhookRow) -> Result<(), StoreError> {
        side::lock(&self.conn).execute(
            &format!("INSERT INTO lifecycle_webhooks ({WEBHOOK_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"),
            params![
                w.id,
                w.tenant,
                w.name,
                w.url,
                serde_json::to_string(&w.events).unwrap_or_else(|_| "[]".into()),
                w.enabled as i64,
                w.secret,
                w.created_at_ms,
                w.updated_at_ms,
            ],
        )?;
        Ok(())
    }

    /// Replaces a webhook's fields with `w`'s (its id, owner and creation time stay); false
    /// if there is no such webhook.
    pub fn update_webhook(&self, w: &WebhookRow) -> Result<bool, StoreError> {
        let n = side::lock(&self.conn).execute(
            "UPDATE lifecycle_webhooks SET name = ?2, url = ?3, events = ?4, enabled = ?5,
             secret = ?6, updated_at = ?7 WHERE id = ?1",
            params![
                w.id,
                w.name,
                w.url,
                serde_json::to_string(&w.events).unwrap_or_else(|_| "[]".into()),
                w.enabled as i64,
                w.secret,
                now_ms(),
            ],
        )?;
        Ok(n == 1)
    }

    /// One webhook.
    pub fn webhook(&self, id: &str) -> Result<Option<WebhookRow>, StoreError> {
        Ok(side::lock(&self.conn)
            .query_row(
                &format!("SELECT {WEBHOOK_COLUMNS} FROM lifecycle_webhooks WHERE id = ?1"),
                params![id],
                row_webhook,
            )
            .optional()?)
    }

    /// Every webhook, oldest first.
    pub fn webhooks(&self) -> Result<Vec<WebhookRow>, StoreError> {
        let conn = side::lock(&self.conn);
        let mut st = conn.prepare_cached(&format!(
            "SELECT {WEBHOOK_COLUMNS} FROM lifecycle_webhooks ORDER BY created_at, id"
        ))?;
        let rows = st.query_map([], row_webhook)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Removes a webhook; false if there was none.
    pub fn delete_webhook(&self, id: &str) -> Result<bool, StoreError> {
        Ok(side::lock(&self.conn)
            .execute("DELETE FROM lifecycle_webhooks WHERE id = ?1", params![id])?
            == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_listed_by_tenant_sandbox_and_kind_in_either_order() {
        let s = EventStore::open_in_memory().unwrap();
        let a = s
            .append("u1", "sb1", Some("acme"), "created", 1, "{}")
            .unwrap();
        s.append("u2", "sb1", Some("acme"), "killed", 2, "{}")
            .unwrap();
        s.append("u3", "sb2", None, "created", 3, "{}").unwrap();
        assert_eq!(s.last_seq().unwrap(), a + 2);
        let mut f = EventFilter {
            tenant: Some(Some("acme".into())),
            limit: 10,
            ..Default::default()
        };
        let uids = |v: Vec<StoredLifecycleEvent>| v.into_iter().map(|e| e.uid).collect::<Vec<_>>();
        assert_eq!(uids(s.list(&f).unwrap()), ["u2", "u1"]);
        f.ascending = true;
        assert_eq!(uids(s.list(&f).unwrap()), ["u1", "u2"]);
        f.kinds = vec!["killed".into()];
        assert_eq!(uids(s.list(&f).unwrap()), ["u2"]);
        let node = EventFilter {
            tenant: Some(None),
            limit: 10,
            ..Default::default()
        };
        assert_eq!(uids(s.list(&node).unwrap()), ["u3"]);
        let page = EventFilter {
            limit: 1,
            offset: 1,
            ..Default::default()
        };
        assert_eq!(uids(s.list(&page).unwrap()), ["u2"]);
        assert_eq!(uids(s.after(a, 10).unwrap()), ["u2", "u3"]);
        assert_eq!(s.prune(3).unwrap(), 2);
        assert_eq!(uids(s.after(0, 10).unwrap()), ["u3"]);
    }

    #[test]
    fn webhooks_are_stored_changed_and_removed() {
        let s = EventStore::open_in_memory().unwrap();
        let mut w = WebhookRow {
            id: "w1".into(),
            tenant: Some("acme".into()),
            name: "hook".into(),
            url: "http://127.0.0.1:9/x".into(),
            events: vec!["sandbox.lifecycle.created".into()],
            enabled: true,
            secret: Some("s".into()),
            created_at_ms: 1,
            updated_at_ms: 1,
        };
        s.insert_webhook(&w).unwrap();
        assert_eq!(s.webhook("w1").unwrap().unwrap(), w);
        w.enabled = false;
        w.url = "http://127.0.0.1:9/y".into();
        assert!(s.update_webhook(&w).unwrap());
        let got = s.webhook("w1").unwrap().unwrap();
        assert!(!got.enabled && got.url.ends_with("/y"));
        assert_eq!(s.webhooks().unwrap().len(), 1);
        assert!(s.delete_webhook("w1").unwrap());
        assert!(!s.delete_webhook("w1").unwrap());
        assert!(s.webhook("w1").unwrap().is_none());
    }
}
