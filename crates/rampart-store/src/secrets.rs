//! Named secrets held by the daemon (`/v1/secrets`): a sandbox's create refers to one by name
//! and gets it bound like a secret given inline.
//!
//! The table lives in the daemon's `state.db` ([`SecretStore`] creates it if missing: its own
//! idempotent migration, like [`crate::access`]). Values are kept in clear, as the secrets
//! given at create are (`sandbox_network`, migration 6): the file is the daemon's own, never
//! visible in a sandbox, and [`SecretStore::open`] makes `state.db` and its WAL files mode
//! 0600. No method here returns a value except [`SecretStore::get`], which the manager uses to
//! bind a secret to a sandbox.

use crate::{now_ms, side, StoreError};
use rampart_types::SecretSpec;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

const MIGRATION: &str = "CREATE TABLE IF NOT EXISTS named_secrets (
        name TEXT PRIMARY KEY NOT NULL,
        spec TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS e2b_secrets (
        name TEXT PRIMARY KEY NOT NULL,
        id TEXT NOT NULL UNIQUE,
        version INTEGER NOT NULL,
        metadata TEXT NOT NULL
    ) WITHOUT ROWID;";

/// What the E2B face keeps of a stored secret besides its spec: its id, version (1 at
/// create, one more at each update) and metadata (a JSON object of strings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bSecretRow {
    /// The secret's E2B id.
    pub id: String,
    /// Its current version.
    pub version: i64,
    /// Its metadata (JSON).
    pub metadata: String,
}

/// A stored secret: its spec (with the value) and its times (unix ms).
#[derive(Clone, PartialEq, Eq)]
pub struct StoredSecret {
    /// The spec, value included.
    pub spec: SecretSpec,
    /// When it was first set.
    pub created_at_ms: i64,
    /// When it was last set.
    pub updated_at_ms: i64,
}

impl std::fmt::Debug for StoredSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SecretSpec's Debug redacts the value.
        f.debug_struct("StoredSecret")
            .field("spec", &self.spec)
            .field("created_at_ms", &self.created_at_ms)
            .field("updated_at_ms", &self.updated_at_ms)
            .finish()
    }
}

fn corrupt(name: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt {
        id: format!("secret {name}"),
        detail: e.to_string(),
    }
}

/// The named-secret store (SQLite).
#[derive(Debug)]
pub struct SecretStore {
    conn: Mutex<Connection>,
}

impl SecretStore {
    /// Opens the database at `path` (the daemon's `state.db`), creating the table if needed,
    /// and makes the file (and its WAL files) mode 0600 (as every open of `state.db` does).
    pub fn open(path: &Path) -> Result<SecretStore, StoreError> {
        Ok(SecretStore {
            conn: side::open(path, MIGRATION)?,
        })
    }

    /// An in-memory store (tests).
    pub fn open_in_memory() -> Result<SecretStore, StoreError> {
        Ok(SecretStore {
            conn: side::open_in_memory(MIGRATION)?,
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        side::lock(&self.conn)
    }

    /// Creates or replaces the secret named `spec.name` (the caller validated it). Returns
    /// what is stored now.
    pub fn set(&self, spec: &SecretSpec) -> Result<StoredSecret, StoreError> {
        let json = serde_json::to_string(spec).map_err(|e| corrupt(&spec.name, e))?;
        let now = now_ms();
        let conn = self.conn();
        conn.execute(
            "INSERT INTO named_secrets (name, spec, created_at, updated_at) VALUES (?1, ?2, ?3, ?3)
             ON CONFLICT(name) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at",
            params![spec.name, json, now],
        )?;
        drop(conn);
        self.get(&spec.name)?.ok_or_else(|| StoreError::Corrupt {
            id: format!("secret {}", spec.name),
            detail: "missing right after it was written".into(),
        })
    }

    /// The secret named `name`, value included.
    pub fn get(&self, name: &str) -> Result<Option<StoredSecret>, StoreError> {
        let row: Option<(String, i64, i64)> = self
            .conn()
            .query_row(
                "SELECT spec, created_at, updated_at FROM named_secrets WHERE name = ?1",
                params![name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        row.map(|(s, c, u)| {
            Ok(StoredSecret {
                spec: serde_json::from_str(&s).map_err(|e| corrupt(name, e))?,
                created_at_ms: c,
                updated_at_ms: u,
            })
        })
        .transpose()
    }

    /// Every stored secret, by name.
    pub fn list(&self) -> Result<Vec<StoredSecret>, StoreError> {
        let rows: Vec<(String, String, i64, i64)> = {
            let conn = self.conn();
            let mut st = conn.prepare(
                "SELECT name, spec, created_at, updated_at FROM named_secrets ORDER BY name",
            )?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        rows.into_iter()
            .map(|(n, s, c, u)| {
                Ok(StoredSecret {
                    spec: serde_json::from_str(&s).map_err(|e| corrupt(&n, e))?,
                    created_at_ms: c,
                    updated_at_ms: u,
                })
            })
            .collect()
    }

    /// Stores `spec` with its E2B facts in one transaction. `create`: a new secret with id
    /// `id` and version 1 (`Duplicate` if the name is taken); else the existing secret
    /// `spec.name` (`Ok(None)` if there is none) gets the new value and the next version,
    /// and its metadata when `metadata` is given.
    pub fn set_e2b(
        &self,
        spec: &SecretSpec,
        create: Option<&str>,
        metadata: Option<&str>,
    ) -> Result<Option<(StoredSecret, E2bSecretRow)>, StoreError> {
        let json = serde_json::to_string(spec).map_err(|e| corrupt(&spec.name, e))?;
        let now = now_ms();
        {
            let mut conn = self.conn();
            let tx = conn.transaction()?;
            let exists: bool = tx
                .query_row(
                    "SELECT 1 FROM named_secrets WHERE name = ?1",
                    params![spec.name],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            match create {
                Some(id) => {
                    if exists {
                        return Err(StoreError::Duplicate(spec.name.clone()));
                    }
                    tx.execute(
                        "INSERT INTO named_secrets (name, spec, created_at, updated_at)
                         VALUES (?1, ?2, ?3, ?3)",
                        params![spec.name, json, now],
                    )?;
                    tx.execute(
                        "INSERT OR REPLACE INTO e2b_secrets (name, id, version, metadata)
                         VALUES (?1, ?2, 1, ?3)",
                        params![spec.name, id, metadata.unwrap_or("{}")],
                    )?;
                }
                None => {
                    if !exists {
                        return Ok(None);
                    }
                    tx.execute(
                        "UPDATE named_secrets SET spec = ?2, updated_at = ?3 WHERE name = ?1",
                        params![spec.name, json, now],
                    )?;
                    // A secret set natively has no E2B row yet: it gets one (version 2, as
                    // its first value was version 1).
                    tx.execute(
                        "INSERT INTO e2b_secrets (name, id, version, metadata)
                         VALUES (?1, ?4, 2, COALESCE(?3, '{}'))
                         ON CONFLICT(name) DO UPDATE SET version = version + 1,
                             metadata = COALESCE(?3, metadata)",
                        params![
                            spec.name,
                            now,
                            metadata,
                            format!("sec_{}", crate::keys::random_hex(12))
                        ],
                    )?;
                }
            }
            tx.commit()?;
        }
        let stored = self.get(&spec.name)?.ok_or_else(|| StoreError::Corrupt {
            id: format!("secret {}", spec.name),
            detail: "missing right after it was written".into(),
        })?;
        let row = self
            .e2b_row(&spec.name)?
            .ok_or_else(|| StoreError::Corrupt {
                id: format!("secret {}", spec.name),
                detail: "its E2B row is missing right after it was written".into(),
            })?;
        Ok(Some((stored, row)))
    }

    /// The E2B facts of the secret named `name`, if it has them.
    pub fn e2b_row(&self, name: &str) -> Result<Option<E2bSecretRow>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT id, version, metadata FROM e2b_secrets WHERE name = ?1",
                params![name],
                |r| {
                    Ok(E2bSecretRow {
                        id: r.get(0)?,
                        version: r.get(1)?,
                        metadata: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    /// The name of the secret whose E2B id is `id`.
    pub fn e2b_name_of(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT name FROM e2b_secrets WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Removes the secret named `name`; whether it existed. Sandboxes it was bound to keep
    /// their copy until they end.
    pub fn delete(&self, name: &str) -> Result<bool, StoreError> {
        let conn = self.conn();
        let n = conn.execute("DELETE FROM named_secrets WHERE name = ?1", params![name])?;
        conn.execute("DELETE FROM e2b_secrets WHERE name = ?1", params![name])?;
        Ok(n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_types::SecretInjection;

    fn spec(name: &str, value: &str) -> SecretSpec {
        SecretSpec {
            name: name.into(),
            value: value.into(),
            hosts: vec!["api.example.com".into()],
            inject: SecretInjection::Header {
                name: "Authorization".into(),
                template: "Bearer {value}".into(),
            },
            env: Some("TOK".into()),
        }
    }

    #[test]
    fn set_get_replace_list_delete() {
        let s = SecretStore::open_in_memory().unwrap();
        assert!(s.get("tok").unwrap().is_none());
        let a = s.set(&spec("tok", "v1")).unwrap();
        assert_eq!(a.spec.value, "v1");
        let b = s.set(&spec("tok", "v2")).unwrap();
        assert_eq!(b.spec.value, "v2");
        assert_eq!(b.created_at_ms, a.created_at_ms);
        s.set(&spec("another", "x")).unwrap();
        let names: Vec<String> = s.list().unwrap().into_iter().map(|x| x.spec.name).collect();
        assert_eq!(names, vec!["another".to_string(), "tok".to_string()]);
        assert!(!format!("{:?}", s.get("tok").unwrap()).contains("v2"));
        assert!(s.delete("tok").unwrap());
        assert!(!s.delete("tok").unwrap());
        assert!(s.get("tok").unwrap().is_none());
    }

    #[test]
    fn e2b_rows_follow_their_secret() {
        let s = SecretStore::open_in_memory().unwrap();
        let (a, r) = s
            .set_e2b(&spec("tok", "v1"), Some("sec_1"), Some(r#"{"a":"b"}"#))
            .unwrap()
            .unwrap();
        assert_eq!((a.spec.value.as_str(), r.version), ("v1", 1));
        assert!(matches!(
            s.set_e2b(&spec("tok", "v9"), Some("sec_2"), None),
            Err(StoreError::Duplicate(_))
        ));
        let (b, r2) = s.set_e2b(&spec("tok", "v2"), None, None).unwrap().unwrap();
        assert_eq!((b.spec.value.as_str(), r2.version), ("v2", 2));
        assert_eq!(
            (r2.id.as_str(), r2.metadata.as_str()),
            ("sec_1", r#"{"a":"b"}"#)
        );
        assert_eq!(s.e2b_name_of("sec_1").unwrap().as_deref(), Some("tok"));
        assert!(s.set_e2b(&spec("nope", "v"), None, None).unwrap().is_none());
        // A natively set secret gets its row at its first E2B update.
        s.set(&spec("native", "x")).unwrap();
        assert!(s.e2b_row("native").unwrap().is_none());
        let (_, r3) = s
            .set_e2b(&spec("native", "y"), None, None)
            .unwrap()
            .unwrap();
        assert_eq!(r3.version, 2);
        assert!(s.delete("tok").unwrap());
        assert!(s.e2b_row("tok").unwrap().is_none());
        assert!(s.e2b_name_of("sec_1").unwrap().is_none());
    }

    #[test]
    fn the_file_is_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.db");
        let s = SecretStore::open(&p).unwrap();
        s.set(&spec("tok", "v1")).unwrap();
        drop(s);
        let _again = SecretStore::open(&p).unwrap();
        for f in ["state.db", "state.db-wal"] {
            let m = std::fs::metadata(d.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(m & 0o777, 0o600, "{f}");
        }
    }
}
