//! API keys of the native API (`/v1`, `/metrics`) over TCP.
//!
//! A key is `rampart_` and 40 lowercase hex digits (160 random bits), stored only as its
//! SHA-256 digest: the plain key is shown once, when it is made (or given once, when it is
//! imported). A key is checked by looking its digest up (never by comparing the plain key),
//! so the check does not leak how much of a guess was right.
//!
//! Each key acts for a `tenant` (none: the node's own, which sees every tenant) with
//! `scopes` ([`KNOWN_SCOPES`]; a tenant's key may not have `admin`), and may have an expiry.
//! Revoking keeps the row, so a revoked key answers "revoked" rather than "unknown" and is
//! never imported again. The table lives in the daemon's `state.db`;
//! [`NodeKeyStore`] creates it if it is missing, like the other side stores.

use crate::keys::{random_hex, sha256_hex};
use crate::{now_ms, side, StoreError};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// Prefix of every native API key.
pub const NODE_KEY_PREFIX: &str = "rampart_";
/// Hex digits after the prefix.
pub const NODE_KEY_HEX_LEN: usize = 40;
/// The scope of the node's administrator: everything.
pub const SCOPE_ADMIN: &str = "admin";
/// Every scope a key may be given: `sandboxes` (create, list, destroy, pause, snapshots,
/// fork, volumes, ports), `exec`, `files`, `network`, `secrets`, `templates`, `audit`,
/// `approve`, and `admin` (everything, every tenant, tenants and keys).
pub const KNOWN_SCOPES: &[&str] = &[
    "sandboxes",
    "exec",
    "files",
    "network",
    "secrets",
    "templates",
    "audit",
    "approve",
    SCOPE_ADMIN,
];

/// The scopes of a tenant's key when none are asked for: everything but `admin`.
pub fn default_tenant_scopes() -> Vec<String> {
    KNOWN_SCOPES
        .iter()
        .filter(|s| **s != SCOPE_ADMIN)
        .map(|s| (*s).to_owned())
        .collect()
}

/// The table of this module; idempotent.
const MIGRATION: &str = "CREATE TABLE IF NOT EXISTS node_keys (
        id TEXT PRIMARY KEY NOT NULL,
        hash TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        hint TEXT NOT NULL,
        tenant TEXT,
        scopes TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER,
        revoked_at INTEGER,
        last_used_at INTEGER
    );";

/// Why a string is not a native API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyShapeError {
    /// It does not start with `rampart_`.
    #[error("an API key starts with `{NODE_KEY_PREFIX}`")]
    Prefix,
    /// The part after the prefix is not 40 characters long.
    #[error("an API key has {NODE_KEY_HEX_LEN} hex digits after `{NODE_KEY_PREFIX}`")]
    Length,
    /// The part after the prefix is not lowercase hex.
    #[error("an API key has only lowercase hex digits (0-9, a-f) after `{NODE_KEY_PREFIX}`")]
    Charset,
}

/// Checks that `key` has the shape of a native API key.
pub fn check_shape(key: &str) -> Result<(), KeyShapeError> {
    let hex = key
        .strip_prefix(NODE_KEY_PREFIX)
        .ok_or(KeyShapeError::Prefix)?;
    if hex.len() != NODE_KEY_HEX_LEN {
        return Err(KeyShapeError::Length);
    }
    if !hex
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(KeyShapeError::Charset);
    }
    Ok(())
}

/// Whether `key` has the shape of a native API key.
pub fn is_node_key_shaped(key: &str) -> bool {
    check_shape(key).is_ok()
}

/// A native API key as listed (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeKey {
    /// Stable id (12 hex digits of the digest), used by `rampart keys rm`.
    pub id: String,
    /// Free-form name given at creation.
    pub name: String,
    /// The key's first characters, to tell keys apart (`rampart_1a2b3c…`).
    pub hint: String,
    /// The tenant the key acts for; none: the node's own.
    pub tenant: Option<String>,
    /// What the key may do (`admin`: everything).
    pub scopes: Vec<String>,
    /// Creation time, unix ms.
    pub created_at_ms: i64,
    /// When it stops working, unix ms; none: never.
    pub expires_at_ms: Option<i64>,
    /// When it was revoked, unix ms.
    pub revoked_at_ms: Option<i64>,
    /// Last successful use, unix ms (updated at most once a minute).
    pub last_used_at_ms: Option<i64>,
}

impl NodeKey {
    /// Whether it has scope `s` (`admin` has every scope).
    pub fn has_scope(&self, s: &str) -> bool {
        self.scopes.iter().any(|x| x == s || x == SCOPE_ADMIN)
    }

    /// Whether it works at `now_ms`: not revoked, not expired.
    pub fn is_active(&self, now_ms: i64) -> bool {
        self.revoked_at_ms.is_none() && self.expires_at_ms.is_none_or(|e| e > now_ms)
    }
}

/// The listing of a new key `key` as `new` describes it, checked: at least one known scope,
/// no `admin` for a tenant's key, an expiry in the future. Where it is stored is the
/// caller's (this store, or a fleet's etcd).
pub fn describe(new: &NewKey, key: &str) -> Result<NodeKey, NewKeyError> {
    check_shape(key)?;
    if new.scopes.is_empty() {
        return Err(NewKeyError::NoScope);
    }
    if let Some(s) = new
        .scopes
        .iter()
        .find(|s| !KNOWN_SCOPES.contains(&s.as_str()))
    {
        return Err(NewKeyError::UnknownScope(s.clone()));
    }
    if new.tenant.is_some() && new.scopes.iter().any(|s| s == SCOPE_ADMIN) {
        return Err(NewKeyError::TenantAdmin);
    }
    let now = now_ms();
    if new.expires_at_ms.is_some_and(|e| e <= now) {
        return Err(NewKeyError::Expired);
    }
    let hash = sha256_hex(key.as_bytes());
    let mut scopes = new.scopes.clone();
    scopes.sort();
    scopes.dedup();
    Ok(NodeKey {
        id: hash[..12].to_owned(),
        name: new.name.clone(),
        hint: format!("{}…", &key[..NODE_KEY_PREFIX.len() + 6]),
        tenant: new.tenant.clone(),
        scopes,
        created_at_ms: now,
        expires_at_ms: new.expires_at_ms,
        revoked_at_ms: None,
        last_used_at_ms: None,
    })
}

/// A new key's text: `rampart_` and 40 random hex digits.
pub fn generate() -> String {
    format!("{NODE_KEY_PREFIX}{}", random_hex(NODE_KEY_HEX_LEN / 2))
}

/// The header in which a fleet's gateway tells a node who a request authenticated as (the
/// node believes it only from a caller holding the fleet's token).
pub const GATEWAY_PRINCIPAL_HEADER: &str = "x-rampart-gateway-principal";

/// Who a request through a fleet's gateway authenticated as.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GatewayPrincipal {
    /// The gateway that checked it (its name).
    pub gateway: String,
    /// The caller's address as the gateway saw it.
    pub peer: Option<String>,
    /// The key it presented, as the fleet lists it.
    pub key: NodeKey,
    /// The quotas of the key's tenant, as the fleet has them: the node keeps its copy of the
    /// tenant up to date with them before it serves the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<rampart_types::tenant::Quotas>,
    /// Whether it is an E2B API key (`e2b_...`, for the E2B API only) rather than a native
    /// one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub e2b: bool,
}

/// Why a [`GATEWAY_PRINCIPAL_HEADER`] could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GatewayPrincipalError {
    /// Not base64url.
    #[error("not base64url: {0}")]
    Base64(#[from] base64::DecodeError),
    /// Not the JSON of a principal.
    #[error("not a principal: {0}")]
    Json(#[from] serde_json::Error),
}

impl GatewayPrincipal {
    /// The header's value: base64url (no padding) of its JSON.
    pub fn encode(&self) -> String {
        use base64::Engine as _;
        let json = serde_json::to_vec(self).expect("a principal serializes");
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    /// Reads a header's value.
    pub fn decode(text: &str) -> Result<GatewayPrincipal, GatewayPrincipalError> {
        use base64::Engine as _;
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text.trim())?;
        Ok(serde_json::from_slice(&json)?)
    }
}

/// What a key is, once looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyCheck {
    /// A current key.
    Valid(NodeKey),
    /// Well formed, but no such key.
    Unknown,
    /// The key expired.
    Expired(NodeKey),
    /// The key was revoked.
    Revoked(NodeKey),
}

/// What a new key is made with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewKey {
    /// A name to tell it apart.
    pub name: String,
    /// Its scopes (at least one; each of [`KNOWN_SCOPES`]).
    pub scopes: Vec<String>,
    /// The tenant it acts for (the caller checked that it exists); none: the node's own.
    pub tenant: Option<String>,
    /// When it stops working, unix ms.
    pub expires_at_ms: Option<i64>,
}

/// Why a key could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NewKeyError {
    /// A scope that does not exist.
    #[error("unknown scope {0:?}: expected one of {known}", known = KNOWN_SCOPES.join(", "))]
    UnknownScope(String),
    /// No scope at all.
    #[error("a key needs at least one scope")]
    NoScope,
    /// A tenant's key with the node's `admin` scope.
    #[error("a tenant's key cannot have the `admin` scope (it is the node administrator's)")]
    TenantAdmin,
    /// An expiry in the past.
    #[error("the expiry is in the past")]
    Expired,
    /// An imported key of the wrong shape.
    #[error("not an API key: {0}")]
    Shape(#[from] KeyShapeError),
    /// An imported key that is already in the store (current or revoked).
    #[error("this key is already in the store (id {0})")]
    Exists(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The store of native API keys (SQLite). Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct NodeKeyStore {
    conn: Mutex<Connection>,
}

fn scopes_text(scopes: &[String]) -> String {
    scopes.join(" ")
}

fn row_key(r: &rusqlite::Row<'_>) -> rusqlite::Result<NodeKey> {
    let scopes: String = r.get(4)?;
    Ok(NodeKey {
        id: r.get(0)?,
        name: r.get(1)?,
        hint: r.get(2)?,
        tenant: r.get(3)?,
        scopes: scopes.split_whitespace().map(str::to_owned).collect(),
        created_at_ms: r.get(5)?,
        expires_at_ms: r.get(6)?,
        revoked_at_ms: r.get(7)?,
        last_used_at_ms: r.get(8)?,
    })
}

const COLUMNS: &str =
    "id, name, hint, tenant, scopes, created_at, expires_at, revoked_at, last_used_at";

impl NodeKeyStore {
    /// Opens the database at `path` (the daemon's `state.db`), creating the table if needed.
    pub fn open(path: &Path) -> Result<NodeKeyStore, StoreError> {
        Ok(NodeKeyStore {
            conn: side::open(path, MIGRATION)?,
        })
    }

    /// An in-memory store (tests).
    pub fn open_in_memory() -> Result<NodeKeyStore, StoreError> {
        Ok(NodeKeyStore {
            conn: side::open_in_memory(MIGRATION)?,
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        side::lock(&self.conn)
    }

    /// Makes a new key; returns its listing and the key itself (shown only now).
    pub fn create(&self, new: &NewKey) -> Result<(NodeKey, String), NewKeyError> {
        let key = generate();
        let info = self.insert(new, &key)?;
        Ok((info, key))
    }

    /// Registers a key made elsewhere (e.g. provisioned to many nodes from one secret).
    pub fn import(&self, new: &NewKey, key: &str) -> Result<NodeKey, NewKeyError> {
        check_shape(key)?;
        let hash = sha256_hex(key.as_bytes());
        let known: Option<String> = self
            .conn()
            .query_row(
                "SELECT id FROM node_keys WHERE hash = ?1",
                params![hash],
                |r| r.get(0),
            )
            .optional()
            .map_err(StoreError::from)?;
        if let Some(id) = known {
            return Err(NewKeyError::Exists(id));
        }
        self.insert(new, key)
    }

    fn insert(&self, new: &NewKey, key: &str) -> Result<NodeKey, NewKeyError> {
        let info = describe(new, key)?;
        let hash = sha256_hex(key.as_bytes());
        self.conn()
            .execute(
                "INSERT INTO node_keys (id, hash, name, hint, tenant, scopes, created_at, \
                 expires_at) VALUES (?1, ?2, ?3, ?4, ?8, ?5, ?6, ?7)",
                params![
                    info.id,
                    hash,
                    info.name,
                    info.hint,
                    scopes_text(&info.scopes),
                    info.created_at_ms,
                    info.expires_at_ms,
                    info.tenant
                ],
            )
            .map_err(StoreError::from)?;
        Ok(info)
    }

    /// Every key (revoked ones too), oldest first.
    pub fn list(&self) -> Result<Vec<NodeKey>, StoreError> {
        let conn = self.conn();
        let mut st = conn.prepare(&format!(
            "SELECT {COLUMNS} FROM node_keys ORDER BY created_at, id"
        ))?;
        let rows = st.query_map([], row_key)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Revokes the key with this id, at once: the next request with it is refused. Returns
    /// whether a key that was not yet revoked has this id.
    pub fn revoke(&self, id: &str) -> Result<bool, StoreError> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(false);
        }
        let n = self.conn().execute(
            "UPDATE node_keys SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL",
            params![now_ms(), id.to_ascii_lowercase()],
        )?;
        Ok(n > 0)
    }

    /// Looks `key` up by its digest. A valid key's use is recorded (at most once a minute).
    /// A key of the wrong shape is [`KeyCheck::Unknown`] (the caller checks the shape first
    /// to say why).
    pub fn check(&self, key: &str) -> Result<KeyCheck, StoreError> {
        let checked = self.lookup(key)?;
        if let KeyCheck::Valid(k) = &checked {
            if Self::use_due(k) {
                self.record_use(key)?;
            }
        }
        Ok(checked)
    }

    /// Whether a valid key's last recorded use is more than a minute old.
    pub fn use_due(k: &NodeKey) -> bool {
        k.last_used_at_ms.is_none_or(|t| now_ms() - t > 60_000)
    }

    /// Records that `key` was used now (a write: callers on an async runtime do it off it).
    pub fn record_use(&self, key: &str) -> Result<(), StoreError> {
        self.conn().execute(
            "UPDATE node_keys SET last_used_at = ?1 WHERE hash = ?2",
            params![now_ms(), sha256_hex(key.as_bytes())],
        )?;
        Ok(())
    }

    /// [`NodeKeyStore::check`] without recording the use: one read by primary key (under
    /// WAL it never waits for a writer), cheap enough for a request's own task.
    pub fn lookup(&self, key: &str) -> Result<KeyCheck, StoreError> {
        if !is_node_key_shaped(key) {
            return Ok(KeyCheck::Unknown);
        }
        let hash = sha256_hex(key.as_bytes());
        let conn = self.conn();
        let found = conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM node_keys WHERE hash = ?1"),
                params![hash],
                row_key,
            )
            .optional()?;
        let Some(k) = found else {
            return Ok(KeyCheck::Unknown);
        };
        let now = now_ms();
        if k.revoked_at_ms.is_some() {
            return Ok(KeyCheck::Revoked(k));
        }
        if k.expires_at_ms.is_some_and(|e| e <= now) {
            return Ok(KeyCheck::Expired(k));
        }
        Ok(KeyCheck::Valid(k))
    }

    /// Whether some current key has scope `admin`.
    pub fn has_active_admin(&self) -> Result<bool, StoreError> {
        let now = now_ms();
        Ok(self
            .list()?
            .iter()
            .any(|k| k.is_active(now) && k.scopes.iter().any(|s| s == SCOPE_ADMIN)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin() -> NewKey {
        NewKey {
            name: "a".into(),
            scopes: vec![SCOPE_ADMIN.into()],
            expires_at_ms: None,
            tenant: None,
        }
    }

    #[test]
    fn tenant_keys_have_tenant_scopes_only() {
        let s = NodeKeyStore::open_in_memory().unwrap();
        let mut k = admin();
        k.tenant = Some("acme".into());
        assert!(matches!(s.create(&k), Err(NewKeyError::TenantAdmin)));
        k.scopes = default_tenant_scopes();
        let (info, key) = s.create(&k).unwrap();
        assert_eq!(info.tenant.as_deref(), Some("acme"));
        assert!(!info.scopes.iter().any(|s| s == SCOPE_ADMIN));
        assert!(info.has_scope("exec") && !info.has_scope(SCOPE_ADMIN));
        match s.check(&key).unwrap() {
            KeyCheck::Valid(v) => assert_eq!(v.tenant.as_deref(), Some("acme")),
            other => panic!("{other:?}"),
        }
        k.scopes = vec!["root".into()];
        assert!(matches!(s.create(&k), Err(NewKeyError::UnknownScope(_))));
        assert!(!s.has_active_admin().unwrap());
    }

    #[test]
    fn keys_are_hashed_checked_and_revoked() {
        let s = NodeKeyStore::open_in_memory().unwrap();
        assert!(!s.has_active_admin().unwrap());
        let (info, key) = s.create(&admin()).unwrap();
        assert!(is_node_key_shaped(&key), "{key}");
        assert!(key.starts_with(info.hint.trim_end_matches('…')));
        assert!(s.has_active_admin().unwrap());
        assert!(matches!(s.check(&key).unwrap(), KeyCheck::Valid(k) if k.id == info.id));
        let unknown = format!("{NODE_KEY_PREFIX}{}", "0".repeat(40));
        assert_eq!(s.check(&unknown).unwrap(), KeyCheck::Unknown);
        let stored: String = s
            .conn()
            .query_row("SELECT hash FROM node_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(stored, sha256_hex(key.as_bytes()));
        assert!(!s.revoke("zz'; DROP TABLE node_keys;--").unwrap());
        assert!(s.revoke(&info.id).unwrap());
        assert!(!s.revoke(&info.id).unwrap());
        assert!(matches!(s.check(&key).unwrap(), KeyCheck::Revoked(_)));
        assert!(!s.has_active_admin().unwrap());
        // A revoked key is not imported again.
        assert!(matches!(
            s.import(&admin(), &key),
            Err(NewKeyError::Exists(id)) if id == info.id
        ));
    }

    #[test]
    fn expired_keys_and_bad_input_are_refused() {
        let s = NodeKeyStore::open_in_memory().unwrap();
        let key = format!("{NODE_KEY_PREFIX}{}", "ab".repeat(20));
        let k = s.import(&admin(), &key).unwrap();
        assert!(matches!(s.check(&key).unwrap(), KeyCheck::Valid(_)));
        s.conn()
            .execute(
                "UPDATE node_keys SET expires_at = 1 WHERE id = ?1",
                params![k.id],
            )
            .unwrap();
        assert!(matches!(s.check(&key).unwrap(), KeyCheck::Expired(_)));
        let mut bad = admin();
        bad.scopes = vec!["root".into()];
        assert!(matches!(s.create(&bad), Err(NewKeyError::UnknownScope(_))));
        bad.scopes.clear();
        assert!(matches!(s.create(&bad), Err(NewKeyError::NoScope)));
        let mut past = admin();
        past.expires_at_ms = Some(1);
        assert!(matches!(s.create(&past), Err(NewKeyError::Expired)));
    }

    #[test]
    fn shapes() {
        assert_eq!(check_shape(&format!("rampart_{}", "a1".repeat(20))), Ok(()));
        assert_eq!(
            check_shape(&format!("e2b_{}", "a1".repeat(20))),
            Err(KeyShapeError::Prefix)
        );
        assert_eq!(check_shape("rampart_abc"), Err(KeyShapeError::Length));
        assert_eq!(
            check_shape(&format!("rampart_{}", "A1".repeat(20))),
            Err(KeyShapeError::Charset)
        );
    }
}
