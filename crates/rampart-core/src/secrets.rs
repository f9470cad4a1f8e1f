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
