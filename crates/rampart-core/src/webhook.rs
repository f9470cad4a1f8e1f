//! The approvals webhook: each request held for approval, and each decision, is posted as
//! JSON to a URL of the operator's (`[approvals] webhook_url` in the config), so a person is
//! told without polling `GET /v1/approvals`.
//!
//! Deliveries are best effort and never hold anything up: they are queued per owner (the
//! sandbox's tenant, or the node), at most [`QUEUE_PER_OWNER`] each (more of that owner's
//! are dropped, counted and logged, never another owner's), and sent by one task that
//! takes the owners in turn (a tenant flooding holds cannot push another's notice back
//! more than one delivery), each tried up to three times (1 s, then 4 s apart) with a 10 s
//! timeout. With a secret, each carries
//! `X-Rampart-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`: the
//! receiver recomputes it and refuses a signature that does not match or a `t` too far from
//! its clock (a replay).

use hmac::{Hmac, Mac};
use rampart_types::{ApprovalInfo, Decision};
use serde::Serialize;
use sha2::Sha256;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Notices of one owner waiting at most.
pub const QUEUE_PER_OWNER: usize = 256;
const ATTEMPTS: u32 = 3;
const TIMEOUT: Duration = Duration::from_secs(10);

/// Where the approvals webhook posts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// `http://` or `https://` URL.
    pub url: String,
    /// The HMAC key of `X-Rampart-Signature` (none: unsigned).
    pub secret: Option<String>,
}

impl WebhookConfig {
    /// Checks the URL (an absolute `http`/`https` URL with a host).
    pub fn check(&self) -> Result<(), String> {
        let u = reqwest::Url::parse(&self.url)
            .map_err(|e| format!("webhook_url {:?} is not a URL: {e}", self.url))?;
        if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
            return Err(format!(
                "webhook_url {:?}: expected an http:// or https:// URL with a host",
                self.url
            ));
        }
        if self.secret.as_deref() == Some("") {
            return Err("webhook_secret is empty (leave it out to send unsigned)".into());
        }
        Ok(())
    }
}

/// What is posted.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type")]
pub enum Notice {
    /// A request is held (`approval.requested`).
    #[serde(rename = "approval.requested")]
    Requested {
        /// As `GET /v1/approvals` lists it.
        approval: ApprovalInfo,
    },
    /// A held request was decided (`approval.decided`).
    #[serde(rename = "approval.decided")]
    Decided {
        /// The sandbox it was for.
        sandbox_id: String,
        /// The decision.
        decision: Decision,
    },
}

impl Notice {
    fn name(&self) -> &'static str {
        match self {
            Notice::Requested { .. } => "approval.requested",
            Notice::Decided { .. } => "approval.decided",
        }
    }
}

/// The notices waiting, per owner, taken in turn.
#[derive(Debug, Default)]
struct Fair {
    queues: HashMap<String, VecDeque<Notice>>,
    /// Owners with notices waiting, in the order they are served.
    turn: VecDeque<String>,
    /// Notices dropped because their owner's queue was full, per owner.
    dropped: HashMap<String, u64>,
}

impl Fair {
    /// Queues `n` for `owner`; false (counted) when the owner's queue is full.
    fn push(&mut self, owner: &str, n: Notice) -> bool {
        let q = self.queues.entry(owner.to_owned()).or_default();
        if q.len() >= QUEUE_PER_OWNER {
            *self.dropped.entry(owner.to_owned()).or_default() += 1;
            return false;
        }
        if q.is_empty() {
            self.turn.push_back(owner.to_owned());
        }
        q.push_back(n);
        true
    }
    /// The next owner's oldest notice.
    fn pop(&mut self) -> Option<Notice> {
        let owner = self.turn.pop_front()?;
        let q = self.queues.get_mut(&owner)?;
        let n = q.pop_front();
        if q.is_empty() {
            self.queues.remove(&owner);
        } else {
            self.turn.push_back(owner);
        }
        n
    }
}

/// The sending side of the webhook's queues.
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    fair: Arc<Mutex<Fair>>,
    ready: Arc<tokio::sync::Notify>,
}

impl Notifier {
    /// Starts the sender task (inside a tokio runtime).
    pub(crate) fn start(cfg: WebhookConfig) -> Result<Notifier, String> {
        cfg.check()?;
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("the approvals webhook's HTTP client: {e}"))?;
        let fair = Arc::new(Mutex::new(Fair::default()));
        let ready = Arc::new(tokio::sync::Notify::new());
        let (f, r) = (fair.clone(), ready.clone());
        tokio::spawn(async move {
            loop {
                let next = f.lock().unwrap_or_else(|e| e.into_inner()).pop();
                match next {
                    Some(n) => deliver(&client, &cfg, &n).await,
                    // A push since the pop left a permit: no notice is missed.
                    None => r.notified().await,
                }
            }
        });
        Ok(Notifier { fair, ready })
    }

    /// Queues `n` for `owner` (a tenant; None: the node). Dropped, counted and logged when
    /// that owner's queue is full.
    pub(crate) fn send(&self, owner: Option<&str>, n: Notice) {
        let owner = owner.unwrap_or_default();
        let mut f = self.fair.lock().unwrap_or_else(|e| e.into_inner());
        if f.push(owner, n) {
            drop(f);
            self.ready.notify_one();
        } else {
            let dropped = f.dropped.get(owner).copied().unwrap_or_default();
            tracing::warn!(
                owner = if owner.is_empty() { "node" } else { owner },
                dropped,
                "approvals webhook: a notice was dropped ({QUEUE_PER_OWNER} of this owner's \
                 are waiting)"
            );
        }
    }
}

/// `t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
pub fn signature(secret: &str, t: u64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any size");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    format!("t={t},v1={hex}")
}

async fn deliver(client: &reqwest::Client, cfg: &WebhookConfig, n: &Notice) {
    let body = match serde_json::to_vec(n) {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!("approvals webhook: encoding a notice: {e}");
            return;
        }
    };
    let delivery = rampart_store::access::new_token();
    for attempt in 1..=ATTEMPTS {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut req = client
            .post(&cfg.url)
            .header("content-type", "application/json")
            .header("x-rampart-event", n.name())
            .header("x-rampart-delivery", &delivery)
            .body(body.clone());
        if let Some(s) = &cfg.secret {
            req = req.header("x-rampart-signature", signature(s, t, &body));
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => return,
            Ok(r) => tracing::warn!(
                attempt,
                status = r.status().as_u16(),
                "approvals webhook: the receiver refused a notice"
            ),
            Err(e) => tracing::warn!(attempt, "approvals webhook: {e}"),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(Duration::from_secs(4u64.pow(attempt - 1))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_cover_the_time_and_the_body() {
        let a = signature("k", 1, b"{}");
        assert!(
            a.starts_with("t=1,v1=") && a.len() == "t=1,v1=".len() + 64,
            "{a}"
        );
        assert_ne!(a, signature("k", 2, b"{}"));
        assert_ne!(a, signature("k", 1, b"{ }"));
        assert_ne!(a, signature("j", 1, b"{}"));
        // The primitive itself: RFC 4231, test case 2.
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn owners_are_served_in_turn_and_only_the_flooding_one_loses_notices() {
        let notice = |s: &str| Notice::Decided {
            sandbox_id: s.into(),
            decision: Decision {
                id: "x".into(),
                decision: "approved".into(),
                by: "y".into(),
                reason: None,
            },
        };
        let id = |n: Notice| match n {
            Notice::Decided { sandbox_id, .. } => sandbox_id,
            Notice::Requested { .. } => unreachable!(),
        };
        let mut f = Fair::default();
        let mut taken = 0;
        for _ in 0..QUEUE_PER_OWNER + 44 {
            taken += usize::from(f.push("rival", notice("b")));
        }
        assert_eq!(taken, QUEUE_PER_OWNER);
        assert_eq!(f.dropped.get("rival"), Some(&44));
        assert!(
            f.push("acme", notice("a")),
            "another owner's queue is its own"
        );
        assert!(f.push("", notice("n")));
        // In turn: rival's first, then acme's, then the node's, then rival's again.
        let order: Vec<String> = (0..4).filter_map(|_| f.pop().map(id)).collect();
        assert_eq!(order, ["b", "a", "n", "b"]);
        let rest = std::iter::from_fn(|| f.pop()).count();
        assert_eq!(rest, QUEUE_PER_OWNER - 2);
        assert!(f.pop().is_none() && f.turn.is_empty() && f.queues.is_empty());
    }

    #[test]
    fn urls_are_checked() {
        let c = |u: &str| WebhookConfig {
            url: u.into(),
            secret: None,
        };
        assert!(c("http://127.0.0.1:9/hook").check().is_ok());
        assert!(c("https://hooks.example.com/x").check().is_ok());
        assert!(c("ftp://x/y").check().is_err());
        assert!(c("not a url").check().is_err());
    }
}
