//! Sandbox lifecycle events, and the webhooks they are posted to (`docs/events.md`).
//!
//! Every change of a sandbox's life is recorded here as it is made: `created`, `updated`
//! (its timeout or its network policy changed), `paused`, `resumed`, `checkpointed` (a
//! snapshot was taken) and `killed` (destroyed, however: a request, its timeout, its death).
//! The same change is in the sandbox's signed record; these events are what a program
//! polls (`GET /events/sandboxes`) or is told about (webhooks), in the shape E2B gives
//! them (`version: v2`, `type: sandbox.lifecycle.<kind>`).
//!
//! Webhooks are owned by a tenant and get its sandboxes' events (the node's own get every
//! event). One task follows the event table and posts each event to each enabled webhook
//! that wants its type, up to three times (1 s, then 4 s apart, 10 s timeout each),
//! without ever holding up the change itself. Each delivery is signed twice:
//! - `e2b-signature`: base64 (unpadded) of SHA-256 over the secret followed by the body,
//!   as E2B signs, so receivers written for E2B verify it unchanged. It has no time in it:
//!   a recorded delivery can be replayed.
//! - `x-rampart-signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`:
//!   the receiver recomputes it and refuses a `t` too far from its clock (a replay).
//!
//! A webhook is posted from the host, so its address is checked at every delivery (after
//! resolving its name, and the connection goes to the address checked): addresses that
//! are not globally reachable (loopback, private, link-local with the cloud metadata
//! service, ...) are refused unless the operator allows them (`[events]
//! webhook_allow_cidrs`). A tenant cannot make the daemon post into the host's networks.

use crate::CoreError;
use base64::Engine as _;
use rampart_store::events::{EventFilter, EventStore, StoredLifecycleEvent, WebhookRow};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// What the events and their webhooks are allowed.
#[derive(Debug, Clone)]
pub struct EventsConfig {
    /// How long events are kept (default 7 days).
    pub retention_secs: u64,
    /// Addresses that are not globally reachable but that webhooks may be posted to
    /// (default none).
    pub webhook_allow_cidrs: Vec<ipnet::IpNet>,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            retention_secs: 7 * 24 * 3600,
            webhook_allow_cidrs: Vec::new(),
        }
    }
}

/// Parses CIDRs (`10.0.0.0/8`, `127.0.0.1/32`, `fd00::/8`; a bare address is one host).
pub fn parse_cidrs(list: &[String]) -> Result<Vec<ipnet::IpNet>, String> {
    list.iter()
        .map(|c| {
            c.parse::<ipnet::IpNet>()
                .or_else(|_| c.parse::<IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| format!("{c:?} is not an address range (like 10.0.0.0/8)"))
        })
        .collect()
}

/// A change of a sandbox's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// It was made.
    Created,
    /// Its timeout or network policy changed.
    Updated,
    /// It was paused.
    Paused,
    /// It was resumed.
    Resumed,
    /// A snapshot of it was taken.
    Checkpointed,
    /// It ended.
    Killed,
}

/// Every kind, in the order of their life.
pub const KINDS: [Kind; 6] = [
    Kind::Created,
    Kind::Updated,
    Kind::Paused,
    Kind::Resumed,
    Kind::Checkpointed,
    Kind::Killed,
];

impl Kind {
    /// Its stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Created => "created",
            Kind::Updated => "updated",
            Kind::Paused => "paused",
            Kind::Resumed => "resumed",
            Kind::Checkpointed => "checkpointed",
            Kind::Killed => "killed",
        }
    }
    /// Its event type (`sandbox.lifecycle.created`, ...).
    pub fn event_type(self) -> String {
        format!("sandbox.lifecycle.{}", self.as_str())
    }
    /// The kind of an event type.
    pub fn from_type(t: &str) -> Option<Kind> {
        let k = t.strip_prefix("sandbox.lifecycle.")?;
        KINDS.into_iter().find(|x| x.as_str() == k)
    }
}

/// What an event says about its sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Subject<'a> {
    pub id: &'a str,
    pub tenant: Option<&'a str>,
    /// The template as its creator named it.
    pub template: &'a str,
    pub metadata: &'a BTreeMap<String, String>,
}

/// A listing of events, as a client asks for it.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    /// Only this sandbox's.
    pub sandbox: Option<String>,
    /// Only these kinds (empty: all).
    pub kinds: Vec<Kind>,
    /// Skipped first.
    pub offset: u64,
    /// At most this many (1 to 100).
    pub limit: u64,
    /// Oldest first.
    pub ascending: bool,
}

/// A webhook as a client sees it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    /// Its id.
    pub id: String,
    /// Its owner (none: the node's).
    pub tenant: Option<String>,
    /// Its name.
    pub name: String,
    /// Where events are posted.
    pub url: String,
    /// The event types it gets.
    pub events: Vec<String>,
    /// Whether events are posted.
    pub enabled: bool,
    /// Made, unix ms.
    pub created_at_ms: i64,
}

/// A webhook to make, or the fields of one to change (unset: kept).
#[derive(Debug, Clone, Default)]
pub struct WebhookChange {
    /// Its name.
    pub name: Option<String>,
    /// Where events are posted.
    pub url: Option<String>,
    /// The event types it gets.
    pub events: Option<Vec<String>>,
    /// Whether events are posted.
    pub enabled: Option<bool>,
    /// Its signature secret.
    pub secret: Option<String>,
}

/// The lifecycle events of the node.
#[derive(Debug)]
pub struct Lifecycle {
    store: Arc<EventStore>,
    appended: watch::Sender<i64>,
    /// The newest event when the daemon started: delivery starts after it (events of the
    /// start itself, like the recovery's, are delivered).
    opened_at_seq: i64,
    cfg: EventsConfig,
    /// Each owner's (tenant's, or the node's: "") deliveries: a slow receiver of one
    /// tenant holds up only that tenant's own.
    lanes: Lanes,
}

/// Webhooks a tenant (or the node) may register.
pub const MAX_WEBHOOKS_PER_OWNER: usize = 16;
/// Deliveries of one owner in flight at once; more wait in the owner's lane.
const IN_FLIGHT_PER_OWNER: usize = 8;
/// Deliveries of one owner waiting or in flight; beyond it a delivery is dropped, counted
/// and logged (never another owner's).
const PENDING_PER_OWNER: usize = 1024;

/// The delivery lanes, one per owner.
#[derive(Debug, Default)]
struct Lanes {
    by_owner: std::sync::Mutex<std::collections::HashMap<String, Arc<Lane>>>,
}

/// One owner's deliveries.
#[derive(Debug)]
struct Lane {
    slots: Arc<Semaphore>,
    pending: std::sync::atomic::AtomicUsize,
    dropped: std::sync::atomic::AtomicU64,
}

impl Lanes {
    fn of(&self, owner: Option<&str>) -> Arc<Lane> {
        let mut m = self.by_owner.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(owner.unwrap_or_default().to_owned())
            .or_insert_with(|| {
                Arc::new(Lane {
                    slots: Arc::new(Semaphore::new(IN_FLIGHT_PER_OWNER)),
                    pending: Default::default(),
                    dropped: Default::default(),
                })
            })
            .clone()
    }
}

impl Lane {
    /// Takes a place for one more delivery, or None when the lane is full (the delivery
    /// is then dropped and counted).
    fn admit(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        if self.pending.fetch_add(1, SeqCst) >= PENDING_PER_OWNER {
            self.pending.fetch_sub(1, SeqCst);
            self.dropped.fetch_add(1, SeqCst);
            return false;
        }
        true
    }
    fn done(&self) {
        self.pending
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn store_err(e: rampart_store::StoreError) -> CoreError {
    CoreError::from(e)
}

fn bad(field: &str, msg: impl Into<String>) -> CoreError {
    CoreError::BadRequest {
        field: field.into(),
        message: msg.into(),
    }
}

fn rfc3339_ms(ms: i64) -> String {
    rampart_audit::format_time(
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
    )
}

impl Lifecycle {
    /// Opens the event store in `state.db`.
    pub(crate) fn open(data_dir: &std::path::Path, cfg: EventsConfig) -> Result<Self, CoreError> {
        let store = Arc::new(EventStore::open(&data_dir.join("state.db")).map_err(store_err)?);
        let last = store.last_seq().map_err(store_err)?;
        let (appended, _) = watch::channel(last);
        Ok(Lifecycle {
            store,
            appended,
            opened_at_seq: last,
            cfg,
            lanes: Lanes::default(),
        })
    }

    /// Records that `kind` happened to `s`, with `data` (an object, or null) as its
    /// `eventData` beside the sandbox's metadata. Never fails the change it reports: a
    /// failure to record is logged.
    pub(crate) fn emit(&self, kind: Kind, s: &Subject<'_>, data: Value) {
        let uid = uuid_v4();
        let at = rampart_store::now_ms();
        let mut event_data = match data {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        event_data.insert("sandbox_metadata".into(), json!(s.metadata));
        let event = json!({
            "version": "v2",
            "id": uid,
            "type": kind.event_type(),
            "eventData": event_data,
            "sandboxBuildId": s.template,
            "sandboxExecutionId": s.id,
            "sandboxId": s.id,
            "sandboxTeamId": s.tenant.unwrap_or(""),
            "sandboxTemplateId": s.template,
            "timestamp": rfc3339_ms(at),
        });
        match self
            .store
            .append(&uid, s.id, s.tenant, kind.as_str(), at, &event.to_string())
        {
            Ok(seq) => {
                self.appended.send_replace(seq);
            }
            Err(e) => tracing::error!(
                sandbox = s.id,
                kind = kind.as_str(),
                "recording a lifecycle event: {e}"
            ),
        }
    }

    /// Events the current principal may see (a tenant its own sandboxes'), as JSON.
    pub(crate) fn list(&self, q: &EventQuery) -> Result<Vec<Value>, CoreError> {
        if !(1..=100).contains(&q.limit) {
            return Err(bad("limit", format!("must be 1 to 100, got {}", q.limit)));
        }
        let f = EventFilter {
            tenant: crate::principal::current_tenant().map(Some),
            sandbox: q.sandbox.clone(),
            kinds: q.kinds.iter().map(|k| k.as_str().to_owned()).collect(),
            offset: q.offset,
            limit: q.limit,
            ascending: q.ascending,
        };
        let rows = self.store.list(&f).map_err(store_err)?;
        Ok(rows.into_iter().filter_map(|r| parse(&r)).collect())
    }

    /// Removes events older than the retention.
    pub(crate) fn prune(&self) {
        let before = rampart_store::now_ms()
            .saturating_sub((self.cfg.retention_secs as i64).saturating_mul(1000));
        match self.store.prune(before) {
            Ok(0) => {}
            Ok(n) => tracing::debug!(n, "lifecycle events past their retention removed"),
            Err(e) => tracing::warn!("removing old lifecycle events: {e}"),
        }
    }

    // ---- webhooks -------------------------------------------------------------------

    fn check_fields(&self, w: &WebhookRow) -> Result<(), CoreError> {
        if w.name.trim().is_empty() || w.name.len() > 256 {
            return Err(bad("name", "must be 1 to 256 characters"));
        }
        let u = reqwest::Url::parse(&w.url)
            .map_err(|e| bad("url", format!("{:?} is not a URL: {e}", w.url)))?;
        if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
            return Err(bad(
                "url",
                format!(
                    "{:?}: expected an http:// or https:// URL with a host",
                    w.url
                ),
            ));
        }
        if !u.username().is_empty() || u.password().is_some() {
            return Err(bad("url", "credentials in the URL are not accepted"));
        }
        let host = u.host_str().unwrap_or_default();
        if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse() {
            self.allowed(ip).map_err(|e| bad("url", e))?;
        }
        if w.events.is_empty() {
            return Err(bad("events", "name at least one event type"));
        }
        for e in &w.events {
            if Kind::from_type(e).is_none() {
                return Err(bad(
                    "events",
                    format!(
                        "unknown event type {e:?} (known: {})",
                        KINDS.map(Kind::event_type).join(", ")
                    ),
                ));
            }
        }
        match w.secret.as_deref() {
            None | Some("") => Err(bad(
                "signatureSecret",
                "is required: every delivery is signed with it",
            )),
            Some(s) if s.len() > 1024 => Err(bad("signatureSecret", "at most 1024 bytes")),
            Some(_) => Ok(()),
        }
    }

    /// Whether a webhook may be posted to `ip`.
    fn allowed(&self, ip: IpAddr) -> Result<(), String> {
        let Some(why) = rampart_egress::refused_on_behalf(ip, &self.cfg.webhook_allow_cidrs) else {
            return Ok(());
        };
        let ip = rampart_egress::policy::canonical(ip);
        Err(format!(
            "{ip} is not a public address ({why}); webhooks are posted only to public \
             addresses other than this host's, unless the operator allows the range \
             ([events] webhook_allow_cidrs)"
        ))
    }

    fn mine(w: &WebhookRow) -> bool {
        crate::principal::may_see(w.tenant.as_deref())
    }

    fn shown(w: WebhookRow) -> Webhook {
        Webhook {
            id: w.id,
            tenant: w.tenant,
            name: w.name,
            url: w.url,
            events: w.events,
            enabled: w.enabled,
            created_at_ms: w.created_at_ms,
        }
    }

    /// Registers a webhook of the current principal's tenant.
    pub(crate) fn create_webhook(&self, c: WebhookChange) -> Result<Webhook, CoreError> {
        let now = rampart_store::now_ms();
        let w = WebhookRow {
            id: uuid_v4(),
            tenant: crate::principal::current_tenant(),
            name: c.name.unwrap_or_default(),
            url: c.url.ok_or_else(|| bad("url", "is required"))?,
            events: c.events.unwrap_or_default(),
            enabled: c.enabled.unwrap_or(true),
            secret: c.secret,
            created_at_ms: now,
            updated_at_ms: now,
        };
        self.check_fields(&w)?;
        let owned = self
            .store
            .webhooks()
            .map_err(store_err)?
            .iter()
            .filter(|o| o.tenant == w.tenant)
            .count();
        if owned >= MAX_WEBHOOKS_PER_OWNER {
            return Err(CoreError::Conflict(format!(
                "{} has {owned} webhooks, the most it may ({MAX_WEBHOOKS_PER_OWNER}); remove one \
                 first",
                match &w.tenant {
                    Some(t) => format!("tenant {t}"),
                    None => "the node".to_owned(),
                }
            )));
        }
        self.store.insert_webhook(&w).map_err(store_err)?;
        Ok(Self::shown(w))
    }

    fn own(&self, id: &str) -> Result<WebhookRow, CoreError> {
        match self.store.webhook(id).map_err(store_err)? {
            Some(w) if Self::mine(&w) => Ok(w),
            _ => Err(CoreError::NoWebhook(id.to_owned())),
        }
    }

    /// The current principal's webhooks.
    pub(crate) fn webhooks(&self) -> Result<Vec<Webhook>, CoreError> {
        Ok(self
            .store
            .webhooks()
            .map_err(store_err)?
            .into_iter()
            .filter(Self::mine)
            .map(Self::shown)
            .collect())
    }

    /// One of the current principal's webhooks.
    pub(crate) fn webhook(&self, id: &str) -> Result<Webhook, CoreError> {
        self.own(id).map(Self::shown)
    }

    /// Changes the fields `c` sets.
    pub(crate) fn update_webhook(&self, id: &str, c: WebhookChange) -> Result<Webhook, CoreError> {
        let mut w = self.own(id)?;
        if let Some(n) = c.name {
            w.name = n;
        }
        if let Some(u) = c.url {
            w.url = u;
        }
        if let Some(e) = c.events {
            w.events = e;
        }
        if let Some(e) = c.enabled {
            w.enabled = e;
        }
        if let Some(s) = c.secret {
            w.secret = Some(s);
        }
        self.check_fields(&w)?;
        if !self.store.update_webhook(&w).map_err(store_err)? {
            return Err(CoreError::NoWebhook(id.to_owned()));
        }
        self.webhook(id)
    }

    /// Removes one of the current principal's webhooks.
    pub(crate) fn delete_webhook(&self, id: &str) -> Result<(), CoreError> {
        self.own(id)?;
        self.store.delete_webhook(id).map_err(store_err)?;
        Ok(())
    }

    // ---- delivery -------------------------------------------------------------------

    /// Starts the task that posts new events to their webhooks (inside a tokio runtime).
    pub(crate) fn start_delivery(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        let mut rx = self.appended.subscribe();
        tokio::spawn(async move {
            rx.borrow_and_update();
            let mut cursor = me.opened_at_seq;
            loop {
                loop {
                    let batch = {
                        let store = me.store.clone();
                        match tokio::task::spawn_blocking(move || store.after(cursor, 100)).await {
                            Ok(Ok(b)) => b,
                            Ok(Err(e)) => {
                                tracing::warn!("webhooks: reading lifecycle events: {e}");
                                break;
                            }
                            Err(_) => break,
                        }
                    };
                    if batch.is_empty() {
                        break;
                    }
                    let hooks = match me.store.webhooks() {
                        Ok(h) => h,
                        Err(e) => {
                            tracing::warn!("webhooks: reading webhooks: {e}");
                            Vec::new()
                        }
                    };
                    for ev in batch {
                        cursor = ev.seq;
                        let ty = format!("sandbox.lifecycle.{}", ev.kind);
                        for h in hooks.iter().filter(|h| {
                            h.enabled
                                && h.events.contains(&ty)
                                && (h.tenant.is_none() || h.tenant == ev.tenant)
                        }) {
                            // Queued in the owner's lane, never waited for here: one
                            // tenant's slow receivers hold up nobody else's deliveries.
                            let lane = me.lanes.of(h.tenant.as_deref());
                            if !lane.admit() {
                                tracing::warn!(
                                    webhook = %h.id,
                                    tenant = h.tenant.as_deref().unwrap_or("-"),
                                    dropped = lane.dropped.load(std::sync::atomic::Ordering::SeqCst),
                                    "webhook delivery dropped: {PENDING_PER_OWNER} of this \
                                     owner's deliveries are waiting"
                                );
                                continue;
                            }
                            let (me, h, body) = (me.clone(), h.clone(), ev.event.clone());
                            tokio::spawn(async move {
                                if let Ok(_slot) = lane.slots.clone().acquire_owned().await {
                                    me.deliver(&h, body.into_bytes()).await;
                                }
                                lane.done();
                            });
                        }
                    }
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
    }

    /// The address to post `url` to: its host resolved, every address checked.
    async fn target(&self, url: &reqwest::Url) -> Result<Option<(String, SocketAddr)>, String> {
        let host = url.host_str().ok_or("no host")?.to_owned();
        let port = url.port_or_known_default().ok_or("no port")?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            self.allowed(ip)?;
            return Ok(None);
        }
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("resolving {host}: {e}"))?
            .collect();
        let first = *addrs.first().ok_or(format!("{host} has no address"))?;
        for a in &addrs {
            self.allowed(a.ip())?;
        }
        Ok(Some((host, first)))
    }

    async fn deliver(&self, h: &WebhookRow, body: Vec<u8>) {
        let Ok(url) = reqwest::Url::parse(&h.url) else {
            return;
        };
        for attempt in 1..=ATTEMPTS {
            match self.post(h, &url, &body).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(webhook = %h.id, attempt, "webhook delivery: {e}");
                }
            }
            if attempt < ATTEMPTS {
                tokio::time::sleep(Duration::from_secs(4u64.pow(attempt - 1))).await;
            }
        }
    }

    async fn post(&self, h: &WebhookRow, url: &reqwest::Url, body: &[u8]) -> Result<(), String> {
        // Checked at each attempt: a name may resolve elsewhere by now. The connection goes
        // to the address checked, never to one resolved again.
        let mut client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .redirect(reqwest::redirect::Policy::none());
        if let Some((host, addr)) = self.target(url).await? {
            client = client.resolve(&host, addr);
        }
        let client = client.build().map_err(|e| format!("HTTP client: {e}"))?;
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut req = client
            .post(url.clone())
            .header("content-type", "application/json")
            .header("user-agent", "rampart-webhooks")
            .header("e2b-webhook-id", &h.id)
            .header("e2b-delivery-id", uuid_v4())
            .header("e2b-signature-version", "v1")
            .body(body.to_vec());
        if let Some(s) = &h.secret {
            req = req
                .header("e2b-signature", e2b_signature(s, body))
                .header("x-rampart-signature", crate::webhook::signature(s, t, body));
        }
        let r = req.send().await.map_err(|e| e.to_string())?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(format!("the receiver answered {}", r.status()))
        }
    }
}

const ATTEMPTS: u32 = 3;
const TIMEOUT: Duration = Duration::from_secs(10);

fn parse(r: &StoredLifecycleEvent) -> Option<Value> {
    serde_json::from_str(&r.event).ok()
}

/// E2B's signature: base64 of SHA-256(secret ‖ body), without padding.
pub fn e2b_signature(secret: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(secret.as_bytes());
    h.update(body);
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(h.finalize())
}

/// A random (version 4) UUID.
fn uuid_v4() -> String {
    let mut h = rampart_store::keys::random_hex(16).into_bytes();
    // Version 4, variant 10xx.
    h[12] = b'4';
    h[16] = b"89ab"[usize::from(h[16] % 4)];
    let h = String::from_utf8(h).unwrap_or_default();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lc(allow: &[&str]) -> Lifecycle {
        let store = Arc::new(EventStore::open_in_memory().unwrap());
        Lifecycle {
            store,
            appended: watch::channel(0).0,
            opened_at_seq: 0,
            cfg: EventsConfig {
                webhook_allow_cidrs: allow.iter().map(|c| c.parse().unwrap()).collect(),
                ..Default::default()
            },
            lanes: Lanes::default(),
        }
    }

    #[test]
    fn the_e2b_signature_is_unpadded_base64_of_sha256_of_secret_then_body() {
        // sha256("k{}") computed independently: printf 'k{}' | sha256sum | xxd -r -p | base64
        let want = {
            let d = Sha256::digest(b"k{}");
            base64::engine::general_purpose::STANDARD
                .encode(d)
                .trim_end_matches('=')
                .to_owned()
        };
        assert_eq!(e2b_signature("k", b"{}"), want);
        assert!(!want.contains('='));
        assert_ne!(e2b_signature("k", b"{ }"), want);
    }

    #[test]
    fn webhooks_go_only_to_public_addresses_unless_allowed() {
        let l = lc(&["127.0.0.1/32"]);
        assert!(l.allowed("8.8.8.8".parse().unwrap()).is_ok());
        assert!(l.allowed("127.0.0.1".parse().unwrap()).is_ok());
        for ip in [
            "127.0.0.2",
            "169.254.169.254",
            "10.0.0.1",
            "::1",
            "::ffff:169.254.169.254",
            "0.0.0.0",
        ] {
            assert!(l.allowed(ip.parse().unwrap()).is_err(), "{ip}");
        }
    }

    #[test]
    fn webhook_fields_are_checked() {
        let l = lc(&[]);
        let ok = WebhookRow {
            id: "w".into(),
            tenant: None,
            name: "n".into(),
            url: "https://hooks.example.com/x".into(),
            events: vec!["sandbox.lifecycle.created".into()],
            enabled: true,
            secret: Some("s".into()),
            created_at_ms: 0,
            updated_at_ms: 0,
        };
        assert!(l.check_fields(&ok).is_ok());
        let bad = |f: &dyn Fn(&mut WebhookRow)| {
            let mut w = ok.clone();
            f(&mut w);
            l.check_fields(&w).is_err()
        };
        assert!(bad(&|w| w.url = "ftp://x/y".into()));
        assert!(bad(&|w| w.url = "http://169.254.169.254/latest".into()));
        assert!(bad(&|w| w.url = "http://[::1]:80/".into()));
        assert!(bad(&|w| w.url = "http://u:p@hooks.example.com/".into()));
        assert!(bad(
            &|w| w.events = vec!["sandbox.lifecycle.exploded".into()]
        ));
        assert!(bad(&|w| w.events.clear()));
        assert!(bad(&|w| w.secret = None));
        assert!(bad(&|w| w.name = " ".into()));
    }

    #[test]
    fn kinds_round_trip_through_their_types() {
        for k in KINDS {
            assert_eq!(Kind::from_type(&k.event_type()), Some(k));
        }
        assert_eq!(Kind::from_type("created"), None);
        let u = uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
