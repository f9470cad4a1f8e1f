//! Access to a sandbox: the per-sandbox access token that opens its exposed ports, the ports
//! it made public (reachable without it), and for a sandbox made through the E2B API its E2B
//! facts (the envd access token, which opens its ports too, and the template name the client
//! asked for).
//!
//! All of it is written with the sandbox, in the transaction of
//! [`crate::SandboxStore::insert_creating`] (from [`crate::NewSandbox::access`]), and
//! forgotten in the transaction that moves the sandbox out of the alive states, whatever
//! ended it. The tables live in the daemon's `state.db`; the state store and [`AccessStore`]
//! create them if they are missing (an idempotent migration, independent of the sandbox
//! schema version). `e2b_sandboxes` was made by the key store before; its rows are read as
//! they are.

use crate::keys::random_hex;
use crate::{now_ms, side, StoreError};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// Random bytes in a token (64 hex digits).
pub const TOKEN_BYTES: usize = 32;

pub(crate) const MIGRATION: &str = "CREATE TABLE IF NOT EXISTS sandbox_tokens (
        id TEXT PRIMARY KEY NOT NULL,
        token TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS sandbox_public_ports (
        id TEXT NOT NULL,
        port INTEGER NOT NULL,
        PRIMARY KEY (id, port)
    );
    CREATE INDEX IF NOT EXISTS sandbox_tokens_token ON sandbox_tokens(token);
    CREATE TABLE IF NOT EXISTS e2b_sandboxes (
        id TEXT PRIMARY KEY NOT NULL,
        access_token TEXT NOT NULL,
        template TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS e2b_sandboxes_token ON e2b_sandboxes(access_token);
    CREATE TABLE IF NOT EXISTS e2b_options (
        id TEXT PRIMARY KEY NOT NULL,
        options TEXT NOT NULL
    );";

/// What the E2B API keeps about one sandbox it made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bSandbox {
    /// The `envdAccessToken` every envd request must carry (see [`new_token`]).
    pub access_token: String,
    /// The template id the client asked for (`base`, `code-interpreter-v1`, ...).
    pub template: String,
    /// The E2B options the sandbox was made with and that are E2B's alone (JSON: its
    /// `network` as given, `autoResume`, ...; empty for none). The server reads and
    /// changes them (`AccessStore::set_e2b_options`).
    pub options: String,
}

/// A new sandbox's access, recorded with it (see [`crate::NewSandbox::access`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAccess {
    /// Its token (see [`new_token`]).
    pub token: String,
    /// Ports reachable without the token.
    pub public_ports: Vec<u16>,
    /// Its E2B facts, when the E2B API makes it.
    pub e2b: Option<E2bSandbox>,
}

/// A fresh token: [`TOKEN_BYTES`] random bytes, hex.
pub fn new_token() -> String {
    random_hex(TOKEN_BYTES)
}

/// Records `a` for sandbox `id` in `tx`, replacing what it had.
pub(crate) fn insert(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    a: &NewAccess,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT OR REPLACE INTO sandbox_tokens (id, token, created_at) VALUES (?1, ?2, ?3)",
        params![id, a.token, now_ms()],
    )?;
    tx.execute(
        "DELETE FROM sandbox_public_ports WHERE id = ?1",
        params![id],
    )?;
    for p in &a.public_ports {
        tx.execute(
            "INSERT OR IGNORE INTO sandbox_public_ports (id, port) VALUES (?1, ?2)",
            params![id, p],
        )?;
    }
    tx.execute("DELETE FROM e2b_sandboxes WHERE id = ?1", params![id])?;
    if let Some(e) = &a.e2b {
        tx.execute(
            "INSERT INTO e2b_sandboxes (id, access_token, template, created_at)
             VALUES (?1, ?2, ?3, ?4)",
            params![id, e.access_token, e.template, now_ms()],
        )?;
    }
    tx.execute("DELETE FROM e2b_options WHERE id = ?1", params![id])?;
    if let Some(e) = a.e2b.as_ref().filter(|e| !e.options.is_empty()) {
        tx.execute(
            "INSERT INTO e2b_options (id, options) VALUES (?1, ?2)",
            params![id, e.options],
        )?;
    }
    Ok(())
}

/// Forgets sandbox `id`'s token, public ports and E2B facts in `tx`.
pub(crate) fn forget_in(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<(), StoreError> {
    tx.execute("DELETE FROM sandbox_tokens WHERE id = ?1", params![id])?;
    tx.execute(
        "DELETE FROM sandbox_public_ports WHERE id = ?1",
        params![id],
    )?;
    tx.execute("DELETE FROM e2b_sandboxes WHERE id = ?1", params![id])?;
    tx.execute("DELETE FROM e2b_options WHERE id = ?1", params![id])?;
    Ok(())
}

/// The port-access store (SQLite). Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct AccessStore {
    conn: Mutex<Connection>,
}

impl AccessStore {
    /// Opens the database at `path` (the daemon's `state.db`), creating the tables if needed.
    pub fn open(path: &Path) -> Result<AccessStore, StoreError> {
        Ok(AccessStore {
            conn: side::open(path, MIGRATION)?,
        })
    }

    /// An in-memory store (tests, daemons without a data directory).
    pub fn open_in_memory() -> Result<AccessStore, StoreError> {
        Ok(AccessStore {
            conn: side::open_in_memory(MIGRATION)?,
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        side::lock(&self.conn)
    }

    /// Makes a fresh token for sandbox `id`, replacing any old one, and records `public`
    /// as its public ports (in one transaction). Returns the token.
    pub fn issue(&self, id: &str, public: &[u16]) -> Result<String, StoreError> {
        let token = random_hex(TOKEN_BYTES);
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT OR REPLACE INTO sandbox_tokens (id, token, created_at) VALUES (?1, ?2, ?3)",
            params![id, token, now_ms()],
        )?;
        tx.execute(
            "DELETE FROM sandbox_public_ports WHERE id = ?1",
            params![id],
        )?;
        for p in public {
            tx.execute(
                "INSERT OR IGNORE INTO sandbox_public_ports (id, port) VALUES (?1, ?2)",
                params![id, p],
            )?;
        }
        tx.commit()?;
        Ok(token)
    }

    /// The token of sandbox `id`, if one was issued.
    pub fn token(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT token FROM sandbox_tokens WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Whether `candidate` is the token of some sandbox (the port proxy strips such values
    /// from what it forwards, whichever sandbox they open).
    pub fn is_token(&self, candidate: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM sandbox_tokens WHERE token = ?1",
                params![candidate],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// The E2B facts of sandbox `id`, if the E2B API made it (and it has not ended).
    pub fn e2b(&self, id: &str) -> Result<Option<E2bSandbox>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT s.access_token, s.template, o.options FROM e2b_sandboxes s
                 LEFT JOIN e2b_options o ON o.id = s.id WHERE s.id = ?1",
                params![id],
                |r| {
                    Ok(E2bSandbox {
                        access_token: r.get(0)?,
                        template: r.get(1)?,
                        options: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                    })
                },
            )
            .optional()?)
    }

    /// Replaces the E2B options of sandbox `id` (see [`E2bSandbox::options`]); nothing for a
    /// sandbox the E2B API did not make or that has ended.
    pub fn set_e2b_options(&self, id: &str, options: &str) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT OR REPLACE INTO e2b_options (id, options)
             SELECT id, ?2 FROM e2b_sandboxes WHERE id = ?1",
            params![id, options],
        )?;
        Ok(())
    }

    /// Whether `candidate` is the E2B access token of some sandbox (stripped by the proxies
    /// like [`AccessStore::is_token`]'s).
    pub fn is_e2b_token(&self, candidate: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM e2b_sandboxes WHERE access_token = ?1",
                params![candidate],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// Makes `port` of sandbox `id` public (`true`) or private again (`false`).
    pub fn set_public(&self, id: &str, port: u16, public: bool) -> Result<(), StoreError> {
        let conn = self.conn();
        if public {
            conn.execute(
                "INSERT OR IGNORE INTO sandbox_public_ports (id, port) VALUES (?1, ?2)",
                params![id, port],
            )?;
        } else {
            conn.execute(
                "DELETE FROM sandbox_public_ports WHERE id = ?1 AND port = ?2",
                params![id, port],
            )?;
        }
        Ok(())
    }

    /// Whether `port` of sandbox `id` is public.
    pub fn is_public(&self, id: &str, port: u16) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM sandbox_public_ports WHERE id = ?1 AND port = ?2",
                params![id, port],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// The public ports of sandbox `id`, ascending.
    pub fn public_ports(&self, id: &str) -> Result<Vec<u16>, StoreError> {
        let conn = self.conn();
        let mut st =
            conn.prepare("SELECT port FROM sandbox_public_ports WHERE id = ?1 ORDER BY port")?;
        let rows = st.query_map(params![id], |r| r.get::<_, u16>(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Forgets the token, public ports and E2B facts of sandbox `id` (it ended).
    pub fn forget(&self, id: &str) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        forget_in(&tx, id)?;
        tx.commit()?;
        Ok(())
    }

    /// Forgets every sandbox not in `keep` (ended ones); returns how many were forgotten.
    pub fn retain(&self, keep: &[&str]) -> Result<usize, StoreError> {
        let ids: Vec<String> = {
            let conn = self.conn();
            let mut st = conn.prepare(
                "SELECT id FROM sandbox_tokens UNION SELECT id FROM sandbox_public_ports \
                 UNION SELECT id FROM e2b_sandboxes",
            )?;
            let rows = st.query_map([], |r| r.get::<_, String>(0))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut n = 0;
        for id in ids.iter().filter(|i| !keep.contains(&i.as_str())) {
            self.forget(id)?;
            n += 1;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_public_ports() {
        let s = AccessStore::open_in_memory().unwrap();
        assert_eq!(s.token("a").unwrap(), None);
        let t = s.issue("a", &[8080, 3000, 8080]).unwrap();
        assert_eq!(t.len(), 2 * TOKEN_BYTES);
        assert_eq!(s.token("a").unwrap().as_deref(), Some(t.as_str()));
        assert_eq!(s.public_ports("a").unwrap(), vec![3000, 8080]);
        let t2 = s.issue("b", &[]).unwrap();
        assert_ne!(t, t2);
        assert!(s.is_token(&t).unwrap() && s.is_token(&t2).unwrap());
        assert!(!s.is_token(&t[1..]).unwrap() && !s.is_token("a").unwrap());
        assert!(s.is_public("a", 3000).unwrap());
        assert!(!s.is_public("b", 3000).unwrap());
        s.set_public("b", 3000, true).unwrap();
        s.set_public("b", 3000, true).unwrap();
        assert!(s.is_public("b", 3000).unwrap());
        s.set_public("a", 3000, false).unwrap();
        assert_eq!(s.public_ports("a").unwrap(), vec![8080]);
        assert_eq!(s.retain(&["b"]).unwrap(), 1);
        assert_eq!(s.token("a").unwrap(), None);
        assert!(s.public_ports("a").unwrap().is_empty());
        assert_eq!(s.token("b").unwrap().as_deref(), Some(t2.as_str()));
        s.forget("b").unwrap();
        assert_eq!(s.token("b").unwrap(), None);
        assert!(!s.is_public("b", 3000).unwrap());
    }
}
