//! Named secrets held by the daemon (`/v1/secrets`) and their use at create.
//!
//! A stored secret has the shape of a create's `secrets` entry (name, value, hosts, how it
//! is injected, env var). A create's entry with an empty `value` refers to the stored secret
//! of that name: the value always comes from the store; hosts, injection and env var come
//! from the store unless the entry gives them (empty `hosts`, a `placeholder` injection and
//! no `env` count as not given). The resolved secret is bound to the sandbox like one given
//! inline (its value is kept with the sandbox's network settings, so deleting or changing the
//! stored secret later does not change a running sandbox). Values are never returned.

use crate::CoreError;
use rampart_store::secrets::{SecretStore, StoredSecret};
use rampart_types::network::StoredSecretInfo;
use rampart_types::{SecretInjection, SecretSpec};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn bad(message: impl Into<String>) -> CoreError {
    CoreError::BadRequest {
        field: "secrets".into(),
        message: message.into(),
    }
}

/// The secrets service: owns the secret store, opened (and `state.db` made mode 0600) the
/// first time a secret is set, listed, removed or referred to by a create, then kept.
#[derive(Debug)]
pub(crate) struct Secrets {
    state_db: PathBuf,
    store: OnceLock<SecretStore>,
}

impl Secrets {
    /// The store in `data_dir`'s `state.db`, not opened yet.
    pub(crate) fn new(data_dir: &Path) -> Secrets {
        Secrets {
            state_db: data_dir.join("state.db"),
            store: OnceLock::new(),
        }
    }

    fn store(&self) -> Result<&SecretStore, CoreError> {
        if let Some(s) = self.store.get() {
            return Ok(s);
        }
        let opened = SecretStore::open(&self.state_db).map_err(CoreError::from)?;
        // Two first callers may both open: one store is kept, the other dropped.
        Ok(self.store.get_or_init(|| opened))
    }
}

fn info_of(s: StoredSecret) -> StoredSecretInfo {
    StoredSecretInfo {
        name: s.spec.name,
        hosts: s.spec.hosts,
        inject: s.spec.inject,
        env: s.spec.env,
        created_at: crate::util::rfc3339(s.created_at_ms),
        updated_at: crate::util::rfc3339(s.updated_at_ms),
    }
}

/// Checks a secret to store: the egress proxy's rules (name, value without CR/LF/NUL, hosts
/// that are domains, a valid injection, env var).
fn check(spec: &SecretSpec) -> Result<(), CoreError> {
    if spec.value.is_empty() {
        return Err(bad("value: a stored secret needs a value"));
    }
    rampart_egress::validate_secrets(std::slice::from_ref(spec)).map_err(|e| bad(e.to_string()))
}

impl Secrets {
    /// The create's secrets with references to stored secrets (empty `value`) resolved
    /// against the store. Entries with a value are returned as given.
    pub(crate) fn resolve(&self, given: &[SecretSpec]) -> Result<Vec<SecretSpec>, CoreError> {
        if given.iter().all(|s| !s.value.is_empty()) {
            return Ok(given.to_vec());
        }
        let store = self.store()?;
        given
            .iter()
            .map(|s| {
                if !s.value.is_empty() {
                    return Ok(s.clone());
                }
                let stored = store
                    .get(&crate::principal::qualify(&s.name))
                    .map_err(CoreError::from)?
                    .ok_or_else(|| {
                        bad(format!(
                            "{:?} has no value and no stored secret has that name (see /v1/secrets)",
                            s.name
                        ))
                    })?
                    .spec;
                Ok(SecretSpec {
                    name: s.name.clone(),
                    value: stored.value,
                    hosts: if s.hosts.is_empty() {
                        stored.hosts
                    } else {
                        s.hosts.clone()
                    },
                    inject: if s.inject == SecretInjection::Placeholder {
                        stored.inject
                    } else {
                        s.inject.clone()
                    },
                    env: s.env.clone().or(stored.env),
                })
            })
            .collect()
    }

    /// Creates or replaces the stored secret `spec.name`.
    pub(crate) fn set(&self, spec: SecretSpec) -> Result<StoredSecretInfo, CoreError> {
        check(&spec)?;
        let plain = spec.name.clone();
        let spec = SecretSpec {
            name: crate::principal::qualify(&spec.name),
            ..spec
        };
        let mut stored = self.store()?.set(&spec).map_err(CoreError::from)?;
        tracing::info!(secret = %spec.name, "stored secret set");
        stored.spec.name = plain;
        Ok(info_of(stored))
    }

    /// The stored secrets (never their values), by name: a tenant's own.
    pub(crate) fn list(&self) -> Result<Vec<StoredSecretInfo>, CoreError> {
        Ok(self
            .store()?
            .list()
            .map_err(CoreError::from)?
            .into_iter()
            .filter_map(|mut s| {
                crate::principal::unqualify(&s.spec.name).map(|n| {
                    s.spec.name = n;
                    info_of(s)
                })
            })
            .collect())
    }

    /// Removes the stored secret `name` (`NotFound` if there is none).
    pub(crate) fn delete(&self, name: &str) -> Result<(), CoreError> {
        let stored = crate::principal::qualify(name);
        if self.store()?.delete(&stored).map_err(CoreError::from)? {
            tracing::info!(secret = %name, "stored secret removed");
            Ok(())
        } else {
            Err(CoreError::NotFound(format!("secret {name}")))
        }
    }
}

/// A stored secret as the E2B face shows it (never its value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bSecretInfo {
    /// Its E2B id (`sec_...`; a secret set natively and never touched by the E2B face has
    /// its name as id).
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its current version (1 at create).
    pub version: i64,
    /// Its metadata.
    pub metadata: std::collections::BTreeMap<String, String>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 time of the last change.
    pub updated_at: String,
}

/// Checks an E2B secret before storing: a name the egress proxy can bind (1 to 64 letters,
/// digits, `_`, `-`) and a value it can inject (not empty, no CR, LF or NUL).
fn check_e2b(name: &str, value: &str) -> Result<(), CoreError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok {
        return Err(CoreError::BadRequest {
            field: "name".into(),
            message: format!("{name:?}: a secret name is 1 to 64 letters, digits, '_' or '-'"),
        });
    }
    if value.is_empty() {
        return Err(CoreError::BadRequest {
            field: "value".into(),
            message: "a secret needs a value".into(),
        });
    }
    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(CoreError::BadRequest {
            field: "value".into(),
            message: "a secret value cannot contain CR, LF or NUL (it is sent in headers)".into(),
        });
    }
    Ok(())
}

fn metadata_of(json: &str) -> std::collections::BTreeMap<String, String> {
    serde_json::from_str(json).unwrap_or_default()
}

impl Secrets {
    fn e2b_info(
        &self,
        plain: String,
        s: &StoredSecret,
        row: Option<rampart_store::secrets::E2bSecretRow>,
    ) -> E2bSecretInfo {
        let (id, version, metadata) = match row {
            Some(r) => (r.id, r.version, metadata_of(&r.metadata)),
            None => (plain.clone(), 1, Default::default()),
        };
        E2bSecretInfo {
            id,
            name: plain,
            version,
            metadata,
            created_at: crate::util::rfc3339(s.created_at_ms),
            updated_at: crate::util::rfc3339(s.updated_at_ms),
        }
    }

    /// The stored name of the caller's secret `id_or_name` (an E2B id, else a name).
    fn stored_name_of(&self, id_or_name: &str) -> Result<Option<(String, String)>, CoreError> {
        let store = self.store()?;
        if let Some(stored) = store.e2b_name_of(id_or_name).map_err(CoreError::from)? {
            if let Some(plain) = crate::principal::unqualify(&stored) {
                return Ok(Some((stored, plain)));
            }
        }
        let stored = crate::principal::qualify(id_or_name);
        Ok(store
            .get(&stored)
            .map_err(CoreError::from)?
            .map(|_| (stored, id_or_name.to_owned())))
    }

    /// Makes the secret `name` (`Conflict` if the caller has one by that name). It is kept
    /// unbound (no hosts, no injection): a sandbox binds it to a host and a header through a
    /// `network.rules` placeholder.
    pub(crate) fn create_e2b(
        &self,
        name: &str,
        value: &str,
        metadata: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Result<E2bSecretInfo, CoreError> {
        check_e2b(name, value)?;
        let spec = SecretSpec {
            name: crate::principal::qualify(name),
            value: value.to_owned(),
            hosts: Vec::new(),
            inject: SecretInjection::Placeholder,
            env: None,
        };
        let id = format!("sec_{}", rampart_store::keys::random_hex(12));
        let meta = serde_json::to_string(&metadata.cloned().unwrap_or_default())
            .map_err(CoreError::failed("secret metadata"))?;
        let (stored, row) = match self.store()?.set_e2b(&spec, Some(&id), Some(&meta)) {
            Ok(Some(x)) => x,
            Ok(None) => return Err(CoreError::Internal("secret not stored".into())),
            Err(rampart_store::StoreError::Duplicate(_)) => {
                return Err(CoreError::Conflict(format!(
                    "a secret named {name:?} exists"
                )))
            }
            Err(e) => return Err(e.into()),
        };
        tracing::info!(secret = %spec.name, "stored secret made (E2B)");
        Ok(self.e2b_info(name.to_owned(), &stored, Some(row)))
    }

    /// Gives the secret `id_or_name` a new value (its next version), and `metadata` when
    /// given. Its binding (hosts, injection) stays.
    pub(crate) fn update_e2b(
        &self,
        id_or_name: &str,
        value: &str,
        metadata: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Result<E2bSecretInfo, CoreError> {
        let not_found = || CoreError::NotFound(format!("secret {id_or_name}"));
        let (stored, plain) = self.stored_name_of(id_or_name)?.ok_or_else(not_found)?;
        check_e2b(&plain, value)?;
        let store = self.store()?;
        let old = store
            .get(&stored)
            .map_err(CoreError::from)?
            .ok_or_else(not_found)?;
        let spec = SecretSpec {
            value: value.to_owned(),
            ..old.spec
        };
        let meta = metadata
            .map(serde_json::to_string)
            .transpose()
            .map_err(CoreError::failed("secret metadata"))?;
        let (s, row) = store
            .set_e2b(&spec, None, meta.as_deref())
            .map_err(CoreError::from)?
            .ok_or_else(not_found)?;
        tracing::info!(secret = %stored, "stored secret updated (E2B)");
        Ok(self.e2b_info(plain, &s, Some(row)))
    }

    /// The secret `id_or_name` (never its value).
    pub(crate) fn get_e2b(&self, id_or_name: &str) -> Result<E2bSecretInfo, CoreError> {
        let not_found = || CoreError::NotFound(format!("secret {id_or_name}"));
        let (stored, plain) = self.stored_name_of(id_or_name)?.ok_or_else(not_found)?;
        let store = self.store()?;
        let s = store
            .get(&stored)
            .map_err(CoreError::from)?
            .ok_or_else(not_found)?;
        let row = store.e2b_row(&stored).map_err(CoreError::from)?;
        Ok(self.e2b_info(plain, &s, row))
    }

    /// The caller's secrets (never their values), by name.
    pub(crate) fn list_e2b(&self) -> Result<Vec<E2bSecretInfo>, CoreError> {
        let store = self.store()?;
        let mut out = Vec::new();
        for s in store.list().map_err(CoreError::from)? {
            let Some(plain) = crate::principal::unqualify(&s.spec.name) else {
                continue;
            };
            let row = store.e2b_row(&s.spec.name).map_err(CoreError::from)?;
            out.push(self.e2b_info(plain, &s, row));
        }
        Ok(out)
    }

    /// Removes the secret `id_or_name` (`NotFound` if there is none).
    pub(crate) fn delete_e2b(&self, id_or_name: &str) -> Result<(), CoreError> {
        let (_, plain) = self
            .stored_name_of(id_or_name)?
            .ok_or_else(|| CoreError::NotFound(format!("secret {id_or_name}")))?;
        self.delete(&plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn references_take_the_stored_value_and_binding() {
        let d = tempfile::tempdir().unwrap();
        let secrets = Secrets::new(d.path());
        let store = secrets.store().unwrap();
        store.set(&spec("tok", "v1")).unwrap();
        let inline = spec("other", "x");
        let reference = SecretSpec {
            name: "tok".into(),
            value: String::new(),
            hosts: Vec::new(),
            inject: SecretInjection::Placeholder,
            env: None,
        };
        let got = secrets
            .resolve(&[inline.clone(), reference.clone()])
            .unwrap();
        assert_eq!(got[0], inline);
        assert_eq!(got[1], spec("tok", "v1"));
        // Given fields win.
        let narrowed = SecretSpec {
            hosts: vec!["b.example.com".into()],
            env: Some("OTHER".into()),
            ..reference.clone()
        };
        let got = secrets.resolve(&[narrowed]).unwrap();
        assert_eq!(got[0].hosts, vec!["b.example.com".to_string()]);
        assert_eq!(got[0].env.as_deref(), Some("OTHER"));
        assert_eq!(got[0].value, "v1");
        // An unknown reference is a bad request that names it, never a value.
        let unknown = SecretSpec {
            name: "nope".into(),
            ..reference
        };
        let e = secrets.resolve(&[unknown]).unwrap_err();
        assert!(matches!(e, CoreError::BadRequest { .. }), "{e}");
        assert!(e.to_string().contains("nope"));
    }

    #[test]
    fn bad_secrets_are_refused_before_storing() {
        assert!(check(&spec("tok", "")).is_err());
        assert!(check(&spec("tok", "a\r\nb")).is_err());
        assert!(check(&SecretSpec {
            hosts: vec!["10.0.0.0/8".into()],
            ..spec("tok", "v")
        })
        .is_err());
        assert!(check(&spec("tok", "v")).is_ok());
    }
}
