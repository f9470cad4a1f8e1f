//! API keys of the E2B-compatible API.
//!
//! Keys have E2B's shape, `e2b_` and 40 lowercase hex digits (every E2B SDK version accepts
//! it), and are stored only as their SHA-256 digest: the plain key is shown once, when it is
//! made. The table lives in the daemon's `state.db` next to the sandboxes; [`KeyStore`] creates
//! it if it is missing (its own migration, independent of the sandbox schema version). The
//! per-sandbox facts the E2B API adds (the envd access token, the template name asked for)
//! are the sandbox's, kept with its access ([`crate::access::E2bSandbox`]).

use crate::{now_ms, side, StoreError};
use rand::RngCore;
use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// Prefix of every API key.
pub const KEY_PREFIX: &str = "e2b_";
/// Hex digits after the prefix.
pub const KEY_HEX_LEN: usize = 40;

/// The table of this module; idempotent.
const MIGRATION: &str = "CREATE TABLE IF NOT EXISTS api_keys (
        id TEXT PRIMARY KEY NOT NULL,
        hash TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        hint TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        last_used_at INTEGER
    );";

/// An API key as listed (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyInfo {
    /// Stable id (12 hex digits), used by `rampart keys rm`.
    pub id: String,
    /// Free-form name given at creation.
    pub name: String,
    /// The key's first characters, to tell keys apart (`e2b_1a2b…`).
    pub hint: String,
    /// Creation time, unix ms.
    pub created_at_ms: i64,
    /// Last successful use, unix ms (updated at most once a minute).
    pub last_used_at_ms: Option<i64>,
    /// The tenant (E2B's team) it belongs to; none: the node's own, which sees everything.
    pub tenant: Option<String>,
}

/// Whether `key` has the shape of an API key (`e2b_` + 40 lowercase hex digits).
pub fn is_key_shaped(key: &str) -> bool {
    key.strip_prefix(KEY_PREFIX).is_some_and(|h| {
        h.len() == KEY_HEX_LEN
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    let d = Sha256::digest(data);
    let mut s = String::with_capacity(64);
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// `n` random bytes as lowercase hex (from the OS-seeded CSPRNG).
pub fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut buf);
    let mut s = String::with_capacity(2 * n);
    for b in buf {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The key store (SQLite). Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct KeyStore {
    conn: Mutex<Connection>,
}

const KEY_COLUMNS: &str = "id, name, hint, created_at, last_used_at, tenant";

fn row_info(r: &rusqlite::Row<'_>) -> rusqlite::Result<KeyInfo> {
    Ok(KeyInfo {
        id: r.get(0)?,
        name: r.get(1)?,
        hint: r.get(2)?,
        created_at_ms: r.get(3)?,
        last_used_at_ms: r.get(4)?,
        tenant: r.get(5)?,
    })
}

/// Adds the `tenant` column to a table made before tenants existed.
fn add_tenant_column(conn: &Mutex<Connection>) -> Result<(), StoreError> {
    let c = side::lock(conn);
    let has: i64 = c.query_row(
        "SELECT COUNT(*) FROM pragma_table_info('api_keys') WHERE name = 'tenant'",
        [],
        |r| r.get(0),
    )?;
    if has == 0 {
        c.execute_batch("ALTER TABLE api_keys ADD COLUMN tenant TEXT")?;
    }
    Ok(())
}

impl KeyStore {
    /// Opens the database at `path` (the daemon's `state.db`), creating the tables if needed.
    pub fn open(path: &Path) -> Result<KeyStore, StoreError> {
        let conn = side::open(path, MIGRATION)?;
        add_tenant_column(&conn)?;
        Ok(KeyStore { conn })
    }

    /// An in-memory store (tests).
    pub fn open_in_memory() -> Result<KeyStore, StoreError> {
        let conn = side::open_in_memory(MIGRATION)?;
        add_tenant_column(&conn)?;
        Ok(KeyStore { conn })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        side::lock(&self.conn)
    }

    /// Makes a new key named `name` of the node; returns its listing and the key itself
    /// (shown only now).
    pub fn create_key(&self, name: &str) -> Result<(KeyInfo, String), StoreError> {
        self.create_tenant_key(name, None)
    }

    /// Makes a new key named `name` of `tenant` (the caller checked that it exists; none:
    /// the node's own).
    pub fn create_tenant_key(
        &self,
        name: &str,
        tenant: Option<&str>,
    ) -> Result<(KeyInfo, String), StoreError> {
        let key = format!("{KEY_PREFIX}{}", random_hex(KEY_HEX_LEN / 2));
        let hash = sha256_hex(key.as_bytes());
        let info = KeyInfo {
            id: hash[..12].to_owned(),
            name: name.to_owned(),
            hint: format!("{}…", &key[..KEY_PREFIX.len() + 6]),
            created_at_ms: now_ms(),
            last_used_at_ms: None,
            tenant: tenant.map(str::to_owned),
        };
        self.conn().execute(
            "INSERT INTO api_keys (id, hash, name, hint, created_at, tenant) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                info.id,
                hash,
                info.name,
                info.hint,
                info.created_at_ms,
                info.tenant
            ],
        )?;
        Ok((info, key))
    }

    /// Every key, oldest first.
    pub fn list_keys(&self) -> Result<Vec<KeyInfo>, StoreError> {
        let conn = self.conn();
        let mut st = conn.prepare(&format!(
            "SELECT {KEY_COLUMNS} FROM api_keys ORDER BY created_at, id"
        ))?;
        let rows = st.query_map([], row_info)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Removes the key with this id. Returns whether one was removed.
    pub fn remove_key(&self, id: &str) -> Result<bool, StoreError> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(false);
        }
        let conn = self.conn();
        let n = conn.execute("DELETE FROM api_keys WHERE id = ?1", params![id])?;
        Ok(n > 0)
    }

    /// The current key `key`, if it is one. Records the use (at most once a minute per key).
    pub fn lookup(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        if !is_key_shaped(key) {
            return Ok(None);
        }
        let hash = sha256_hex(key.as_bytes());
        let conn = self.conn();
        let info = conn
            .query_row(
                &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE hash = ?1"),
                params![hash],
                row_info,
            )
            .optional()?;
        let Some(info) = info else {
            return Ok(None);
        };
        let now = now_ms();
        if info.last_used_at_ms.is_none_or(|t| now - t > 60_000) {
            conn.execute(
                "UPDATE api_keys SET last_used_at = ?1 WHERE hash = ?2",
                params![now, hash],
            )?;
        }
        Ok(Some(info))
    }

    /// Number of keys.
    pub fn count_keys(&self) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn()
            .query_row("SELECT COUNT(*) FROM api_keys", [], |r| r.get(0))?;
        Ok(n as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_e2b_shaped_hashed_and_checked() {
        let s = KeyStore::open_in_memory().unwrap();
        let (info, key) = s.create_key("first").unwrap();
        assert!(is_key_shaped(&key), "{key}");
        assert!(key.starts_with(info.hint.trim_end_matches('…')));
        assert!(s.lookup(&key).unwrap().is_some());
        assert!(s
            .lookup("e2b_0000000000000000000000000000000000000000")
            .unwrap()
            .is_none());
        assert!(s.lookup("nonsense").unwrap().is_none());
        // Only the digest is stored.
        let stored: String = s
            .conn()
            .query_row("SELECT hash FROM api_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(stored, sha256_hex(key.as_bytes()));
        assert!(!stored.contains(&key[4..]));
        let listed = s.list_keys().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].id, info.id);
        assert!(listed[0].last_used_at_ms.is_some());
        assert!(!s.remove_key("zz'; DROP TABLE api_keys;--").unwrap());
        assert!(s.remove_key(&info.id).unwrap());
        assert!(s.lookup(&key).unwrap().is_none());
        assert_eq!(s.count_keys().unwrap(), 0);
    }

    #[test]
    fn key_shape() {
        assert!(is_key_shaped(
            "e2b_0123456789abcdef0123456789abcdef01234567"
        ));
        assert!(!is_key_shaped(
            "e2b_0123456789ABCDEF0123456789abcdef01234567"
        ));
        assert!(!is_key_shaped("e2b_0123"));
        assert!(!is_key_shaped(
            "xyz_0123456789abcdef0123456789abcdef01234567"
        ));
    }
}
