//! The connection shared by the side stores ([`crate::access::AccessStore`],
//! [`crate::keys::KeyStore`], [`crate::persist::PersistStore`], [`crate::events::EventStore`],
//! [`crate::secrets::SecretStore`]): each keeps its own connection to `state.db` and makes
//! its tables with an idempotent schema (`CREATE TABLE IF NOT EXISTS`) when it opens.

use crate::StoreError;
use rusqlite::Connection;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Opens the database at `path` as the state store does (write-ahead log, a commit written
/// to the log but not synced) and runs `schema` on it. The file is private to its owner
/// (mode 0600, see [`crate::make_private`]).
pub(crate) fn open(path: &Path, schema: &str) -> Result<Mutex<Connection>, StoreError> {
    crate::make_private(path)?;
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    init(conn, schema)
}

/// An in-memory database with `schema` (tests, daemons without a data directory).
pub(crate) fn open_in_memory(schema: &str) -> Result<Mutex<Connection>, StoreError> {
    init(Connection::open_in_memory()?, schema)
}

fn init(conn: Connection, schema: &str) -> Result<Mutex<Connection>, StoreError> {
    conn.execute_batch(schema)?;
    Ok(Mutex::new(conn))
}

/// Locks the connection. A panic while holding it leaves it usable (every write is one
/// statement or a transaction), so a poisoned lock is taken over.
pub(crate) fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    conn.lock().unwrap_or_else(|p| p.into_inner())
}
