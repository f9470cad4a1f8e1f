//! The network side of a sandbox: its policy and its secrets (migration 6).
//!
//! Only sandboxes created with a network (or given one later) have a row. Secret values are
//! kept here so that a restarted daemon can give them back to the egress proxy; the store is
//! the daemon's own file (never visible in a sandbox) and no API returns them.

use crate::StoreError;
use rampart_types::{NetworkPolicy, SandboxId, SecretSpec};
use rusqlite::{params, Connection, OptionalExtension};

/// Schema of the network table (migration 6).
pub(crate) const MIGRATION_6: &str = "
    CREATE TABLE sandbox_network (
        id TEXT PRIMARY KEY NOT NULL,
        policy TEXT NOT NULL,
        secrets TEXT NOT NULL DEFAULT '[]'
    ) WITHOUT ROWID;";

/// A sandbox's stored network settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredNetwork {
    /// The policy in force.
    pub policy: NetworkPolicy,
    /// The secrets given at create.
    pub secrets: Vec<SecretSpec>,
}

fn corrupt(id: &SandboxId, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt {
        id: id.to_string(),
        detail: format!("network settings: {e}"),
    }
}

/// Records (replaces) a sandbox's network settings.
pub(crate) fn set(
    conn: &Connection,
    id: &SandboxId,
    net: &StoredNetwork,
) -> Result<(), StoreError> {
    let policy = serde_json::to_string(&net.policy).map_err(|e| corrupt(id, e))?;
    let secrets = serde_json::to_string(&net.secrets).map_err(|e| corrupt(id, e))?;
    conn.execute(
        "INSERT INTO sandbox_network (id, policy, secrets) VALUES (?1, ?2, ?3)
         ON CONFLICT(id) DO UPDATE SET policy = excluded.policy, secrets = excluded.secrets",
        params![id.as_str(), policy, secrets],
    )?;
    Ok(())
}

/// Replaces only the policy of a sandbox that has network settings (inserting them with no
/// secrets otherwise).
pub(crate) fn set_policy(
    conn: &Connection,
    id: &SandboxId,
    policy: &NetworkPolicy,
) -> Result<(), StoreError> {
    let policy = serde_json::to_string(policy).map_err(|e| corrupt(id, e))?;
    conn.execute(
        "INSERT INTO sandbox_network (id, policy) VALUES (?1, ?2)
         ON CONFLICT(id) DO UPDATE SET policy = excluded.policy",
        params![id.as_str(), policy],
    )?;
    Ok(())
}

/// A sandbox's network settings, if it has any.
pub(crate) fn get(conn: &Connection, id: &SandboxId) -> Result<Option<StoredNetwork>, StoreError> {
    let row: Option<(String, String)> = conn
        .query_row(
            "SELECT policy, secrets FROM sandbox_network WHERE id = ?1",
            params![id.as_str()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    match row {
        None => Ok(None),
        Some((p, s)) => Ok(Some(StoredNetwork {
            policy: serde_json::from_str(&p).map_err(|e| corrupt(id, e))?,
            secrets: serde_json::from_str(&s).map_err(|e| corrupt(id, e))?,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SandboxStore, SqliteStore};
    use rampart_types::{NetworkMode, SecretInjection};

    #[test]
    fn network_settings_round_trip_and_policy_updates_keep_secrets() {
        let store = SqliteStore::open_in_memory().unwrap();
        let id = SandboxId::parse("sbx_network_test").unwrap_or_else(|_| SandboxId::generate());
        assert_eq!(store.network(&id).unwrap(), None);
        let net = StoredNetwork {
            policy: NetworkPolicy {
                mode: NetworkMode::Allowlist,
                allow: vec!["pypi.org".into()],
                ..NetworkPolicy::default()
            },
            secrets: vec![SecretSpec {
                name: "tok".into(),
                value: "s3cret".into(),
                hosts: vec!["api.example.com".into()],
                inject: SecretInjection::Placeholder,
                env: Some("TOK".into()),
            }],
        };
        store.set_network(&id, &net).unwrap();
        assert_eq!(store.network(&id).unwrap(), Some(net.clone()));
        let open = NetworkPolicy {
            mode: NetworkMode::Open,
            ..NetworkPolicy::default()
        };
        store.set_network_policy(&id, &open).unwrap();
        let got = store.network(&id).unwrap().unwrap();
        assert_eq!(got.policy, open);
        assert_eq!(got.secrets, net.secrets);
    }
}
