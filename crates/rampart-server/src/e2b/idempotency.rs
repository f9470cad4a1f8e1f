//! `Idempotency-Key` on `POST /v2/sandboxes`: a create repeated with the same key (by the
//! same API key) answers what the first one answered, without making another sandbox, as
//! E2B's API does for the SDK's retries. The same key with another body is refused (422,
//! `idempotency_request_mismatch`); one whose first create is still running answers 409
//! (`idempotency_in_progress`). A failed create keeps nothing (it may be retried with the
//! key). Outcomes are kept in the daemon's memory for [`KEEP`].

use super::E2bError;
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an outcome is kept.
pub(crate) const KEEP: Duration = Duration::from_secs(24 * 3600);
/// Most keys kept (the oldest outcomes go first beyond it).
const MAX_KEYS: usize = 10_000;

#[derive(Debug)]
enum Slot {
    Running {
        digest: [u8; 32],
    },
    Done {
        digest: [u8; 32],
        answer: Value,
        at: Instant,
    },
}

/// The outcomes of creates by (API key id, idempotency key).
#[derive(Debug, Default)]
pub(crate) struct Idempotency {
    slots: Mutex<HashMap<(String, String), Slot>>,
}

/// The key of a request, checked as the SDK checks it (1-255 of `[a-z0-9-]`).
pub(crate) fn key_of(headers: &HeaderMap) -> Result<Option<String>, E2bError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let k = v
        .to_str()
        .map_err(|_| E2bError::bad_request("Idempotency-Key: not text"))?;
    if k.is_empty()
        || k.len() > 255
        || !k
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(E2bError::bad_request(
            "Idempotency-Key: 1-255 lowercase letters, digits or hyphens",
        ));
    }
    Ok(Some(k.to_owned()))
}

fn coded(status: StatusCode, code: &'static str, message: String) -> E2bError {
    E2bError::new(status, message).with_code(code)
}

impl Idempotency {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `create` once per (`caller`, `key`): later calls with the same body get its
    /// answer.
    pub(crate) async fn run<F, Fut>(
        &self,
        caller: &str,
        key: &str,
        body: &[u8],
        create: F,
    ) -> Result<Value, E2bError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Value, E2bError>>,
    {
        let digest: [u8; 32] = Sha256::digest(body).into();
        let id = (caller.to_owned(), key.to_owned());
        {
            let mut slots = self.lock();
            let now = Instant::now();
            slots.retain(
                |_, s| !matches!(s, Slot::Done { at, .. } if now.duration_since(*at) > KEEP),
            );
            match slots.get(&id) {
                Some(Slot::Done {
                    digest: d, answer, ..
                }) if *d == digest => return Ok(answer.clone()),
                Some(Slot::Running { digest: d }) if *d == digest => {
                    return Err(coded(
                        StatusCode::CONFLICT,
                        "idempotency_in_progress",
                        format!("a create with Idempotency-Key {key:?} is in progress"),
                    ));
                }
                Some(_) => {
                    return Err(coded(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "idempotency_request_mismatch",
                        format!("Idempotency-Key {key:?} was used for another request"),
                    ));
                }
                None => {}
            }
            if slots.len() >= MAX_KEYS {
                let oldest = slots
                    .iter()
                    .filter_map(|(k, s)| match s {
                        Slot::Done { at, .. } => Some((*at, k.clone())),
                        Slot::Running { .. } => None,
                    })
                    .min_by_key(|(at, _)| *at)
                    .map(|(_, k)| k);
                if let Some(k) = oldest {
                    slots.remove(&k);
                }
            }
            slots.insert(id.clone(), Slot::Running { digest });
        }
        // A create cancelled on its way (the client went away) keeps nothing either.
        struct Clear<'a>(&'a Idempotency, Option<(String, String)>);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                if let Some(id) = self.1.take() {
                    self.0.lock().remove(&id);
                }
            }
        }
        let mut guard = Clear(self, Some(id.clone()));
        let out = create().await;
        if let Ok(answer) = &out {
            guard.1 = None;
            self.lock().insert(
                id,
                Slot::Done {
                    digest,
                    answer: answer.clone(),
                    at: Instant::now(),
                },
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn one_create_per_key_and_body() {
        let i = Idempotency::default();
        let n = AtomicU32::new(0);
        let make = || async {
            let k = n.fetch_add(1, Ordering::SeqCst);
            Ok(serde_json::json!({"sandboxID": format!("sb{k}")}))
        };
        let a = i.run("key1", "k", b"{}", make).await.unwrap();
        let b = i.run("key1", "k", b"{}", make).await.unwrap();
        assert_eq!(a, b);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        // Another body: refused; another caller or key: a new create.
        let e = i.run("key1", "k", b"{\"x\":1}", make).await.unwrap_err();
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        i.run("key2", "k", b"{}", make).await.unwrap();
        i.run("key1", "k2", b"{}", make).await.unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 3);
        // A failure keeps nothing.
        let fail = || async { Err(E2bError::bad_request("no")) };
        assert!(i.run("key1", "f", b"{}", fail).await.is_err());
        i.run("key1", "f", b"{}", make).await.unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn keys_are_checked() {
        let mut h = HeaderMap::new();
        assert_eq!(key_of(&h).unwrap(), None);
        h.insert("idempotency-key", "abc-123".parse().unwrap());
        assert_eq!(key_of(&h).unwrap().as_deref(), Some("abc-123"));
        h.insert("idempotency-key", "ABC".parse().unwrap());
        assert!(key_of(&h).is_err());
    }
}
