//! Network decisions in the audit record: every entry of the egress tier's network log (its
//! event hook, `rampart_egress::Egress::take_events`) becomes a `network` event of the
//! sandbox's chain (DNS answers, connection verdicts, connection ends with their byte
//! counts), and each secret substitution a `secret_used` event (name and host, never the
//! value); a secret value taken out of a response on its way back into the sandbox (a log
//! entry of kind `secret_used` whose rule is `scrub:<name>`) is a `network` event of kind
//! `secret_scrubbed` (secret name in its detail). Entries of a sandbox whose log has not started (its `created` not yet recorded)
//! or has ended are not recorded; entries the hook dropped because this task lagged are
//! lost (the egress tier counts them).
//!
//! A sandbox's entries are recorded within a budget ([`NetEventBudget`], a token bucket per
//! sandbox, `secret_used` in a bucket of its own): an entry beyond it is counted instead, and
//! the counts are recorded as one `network` event of kind `suppressed` when the bucket has a
//! token again (checked every second) or at destroy, so that a sandbox cannot fill the
//! host's disk with its DNS queries and the record says how many entries it lacks.

use crate::audit::{Audit, NetEventBudget};
use crate::util::lock;
use rampart_audit::EventBody;
use rampart_egress::NetEvent;
use rampart_types::audit::{Hash, Network, Package, SecretUsed};
use rampart_types::network::{NetEventKind, NetLogEntry, Verdict};
use rampart_types::SandboxId;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::warn;

/// Entries of one sandbox left out of the record since its last summary.
#[derive(Debug, Default, Clone, PartialEq)]
struct Dropped {
    /// Count per (kind, verdict) of `network` entries.
    network: BTreeMap<(&'static str, &'static str), u64>,
    /// Count per (secret name, host) of `secret_used` entries.
    secrets: BTreeMap<(String, String), u64>,
    /// Log time of the first and last entry left out.
    first: String,
    last: String,
    total: u64,
}

/// One sandbox's bucket.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    dropped: Dropped,
}

/// What to do with an entry.
#[derive(Debug, PartialEq)]
pub(crate) enum Admit {
    /// Record it (after the summary, when one is due).
    Record(Option<Box<EventBody>>),
    /// Counted, not recorded.
    Counted,
}

/// The per-sandbox buckets of the daemon.
#[derive(Debug)]
pub(crate) struct Budgets {
    cfg: NetEventBudget,
    /// Keyed by sandbox and class (`true`: `secret_used`, which has its own bucket so that
    /// a flood of DNS queries never leaves a secret use out).
    buckets: Mutex<HashMap<(String, bool), Bucket>>,
}

impl Budgets {
    pub(crate) fn new(cfg: NetEventBudget) -> Budgets {
        Budgets {
            cfg: NetEventBudget {
                burst: cfg.burst.max(1),
                per_sec: if cfg.per_sec.is_finite() && cfg.per_sec > 0.0 {
                    cfg.per_sec
                } else {
                    NetEventBudget::default().per_sec
                },
            },
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn refill(&self, b: &mut Bucket, now: Instant) {
        let secs = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + secs * self.cfg.per_sec).min(f64::from(self.cfg.burst));
        b.at = now;
    }

    /// Takes a token for `entry` of `sandbox` at `now`: record it (with the summary of what
    /// was left out before it, when there is one: the summary takes the token, the entry
    /// needs a second one), or count it.
    pub(crate) fn admit(&self, sandbox: &str, entry: &NetLogEntry, now: Instant) -> Admit {
        let mut all = lock(&self.buckets);
        // Secret uses and packages are rare and each matters: a bucket of their own.
        let class = matches!(entry.kind, NetEventKind::SecretUsed | NetEventKind::Package);
        let scrub = is_scrub(entry);
        let b = all
            .entry((sandbox.to_owned(), class))
            .or_insert_with(|| Bucket {
                tokens: f64::from(self.cfg.burst),
                at: now,
                dropped: Dropped::default(),
            });
        self.refill(b, now);
        let need = if b.dropped.total > 0 { 2.0 } else { 1.0 };
        if b.tokens >= need {
            b.tokens -= need;
            let summary = (b.dropped.total > 0)
                .then(|| Box::new(summary_of(&std::mem::take(&mut b.dropped))));
            return Admit::Record(summary);
        }
        let d = &mut b.dropped;
        if scrub {
            *d.network
                .entry(("secret_scrubbed", verdict_name(entry.verdict)))
                .or_default() += 1;
        } else if entry.kind == NetEventKind::SecretUsed {
            let host = host_of(entry);
            *d.secrets
                .entry((entry.secret.clone().unwrap_or_default(), host))
                .or_default() += 1;
        } else {
            *d.network
                .entry((kind_name(entry.kind), verdict_name(entry.verdict)))
                .or_default() += 1;
        }
        if d.total == 0 {
            d.first.clone_from(&entry.time);
        }
        d.last.clone_from(&entry.time);
        d.total += 1;
        Admit::Counted
    }

    /// Summaries due at `now` (sandboxes with entries left out and a token again), and
    /// forgets the buckets that are full and have nothing left out (an idle sandbox).
    pub(crate) fn due(&self, now: Instant) -> Vec<(String, EventBody)> {
        let mut out = Vec::new();
        let mut all = lock(&self.buckets);
        all.retain(|(id, _), b| {
            self.refill(b, now);
            if b.dropped.total > 0 && b.tokens >= 1.0 {
                b.tokens -= 1.0;
                out.push((id.clone(), summary_of(&std::mem::take(&mut b.dropped))));
            }
            b.dropped.total > 0 || b.tokens < f64::from(self.cfg.burst)
        });
        out
    }

    /// The summaries of what was left out of `sandbox`'s record, if anything (at destroy).
    /// Its buckets stay (entries still queued meet the same budget) until [`Budgets::due`]
    /// finds them full.
    pub(crate) fn take(&self, sandbox: &str) -> Vec<EventBody> {
        let mut all = lock(&self.buckets);
        let mut out = Vec::new();
        for class in [false, true] {
            if let Some(b) = all.get_mut(&(sandbox.to_owned(), class)) {
                if b.dropped.total > 0 {
                    out.push(summary_of(&std::mem::take(&mut b.dropped)));
                }
            }
        }
        out
    }
}

fn kind_name(k: NetEventKind) -> &'static str {
    match k {
        NetEventKind::Dns => "dns",
        NetEventKind::Connect => "connect",
        NetEventKind::Close => "close",
        NetEventKind::SecretUsed => "secret_used",
        NetEventKind::Package => "package",
    }
}

/// A `secret_used` entry that records a scrub (the value replaced by its placeholder in what
/// went back to the sandbox), not an injection.
fn is_scrub(e: &NetLogEntry) -> bool {
    e.kind == NetEventKind::SecretUsed && e.rule.starts_with("scrub:")
}

fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Allow => "allowed",
        Verdict::Deny => "denied",
    }
}

fn host_of(e: &NetLogEntry) -> String {
    e.name
        .clone()
        .or_else(|| e.addrs.first().cloned())
        .unwrap_or_default()
}

/// The `network` event of kind `suppressed`: how many entries were left out, by kind and
/// verdict (and secret uses by name and host), between which log times.
fn summary_of(d: &Dropped) -> EventBody {
    let mut counts = serde_json::Map::new();
    for ((kind, verdict), n) in &d.network {
        let k = counts
            .entry(*kind)
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if let serde_json::Value::Object(k) = k {
            k.insert((*verdict).into(), (*n).into());
        }
    }
    let secrets: Vec<serde_json::Value> = d
        .secrets
        .iter()
        .map(|((name, host), n)| serde_json::json!({"name": name, "host": host, "count": n}))
        .collect();
    let mut detail = serde_json::Map::new();
    detail.insert("total".into(), d.total.into());
    detail.insert("first".into(), d.first.clone().into());
    detail.insert("last".into(), d.last.clone().into());
    detail.insert("counts".into(), counts.into());
    if !secrets.is_empty() {
        detail.insert("secrets".into(), secrets.into());
    }
    EventBody::Network(Network {
        kind: "suppressed".into(),
        host: String::new(),
        port: None,
        verdict: "suppressed".into(),
        detail: serde_json::Value::Object(detail),
    })
}

/// The audit body of a network log entry.
pub(crate) fn body_of(e: &NetLogEntry) -> EventBody {
    let host = host_of(e);
    if is_scrub(e) {
        let mut detail = serde_json::Map::new();
        detail.insert("rule".into(), e.rule.clone().into());
        detail.insert("secret".into(), e.secret.clone().unwrap_or_default().into());
        return EventBody::Network(Network {
            kind: "secret_scrubbed".into(),
            host,
            port: e.port,
            verdict: verdict_name(e.verdict).into(),
            detail: serde_json::Value::Object(detail),
        });
    }
    if let (NetEventKind::Package, Some(p)) = (e.kind, &e.package) {
        return EventBody::Package(Package {
            ecosystem: p.ecosystem.clone(),
            name: p.name.clone(),
            version: p.version.clone(),
            registry: p.registry.clone(),
            path: p.path.clone(),
            verdict: verdict_name(e.verdict).into(),
            rule: e.rule.clone(),
            sha256: p.sha256.as_deref().and_then(|h| Hash::parse(h).ok()),
            size: p.size,
        });
    }
    if e.kind == NetEventKind::SecretUsed {
        return EventBody::SecretUsed(SecretUsed {
            name: e.secret.clone().unwrap_or_default(),
            host,
        });
    }
    let kind = kind_name(e.kind);
    let mut detail = serde_json::Map::new();
    detail.insert("rule".into(), e.rule.clone().into());
    if !e.addrs.is_empty() {
        detail.insert("addrs".into(), e.addrs.clone().into());
    }
    if let Some(q) = &e.qtype {
        detail.insert("qtype".into(), q.clone().into());
    }
    if let Some(b) = e.bytes_out {
        detail.insert("bytes_out".into(), b.into());
    }
    if let Some(b) = e.bytes_in {
        detail.insert("bytes_in".into(), b.into());
    }
    EventBody::Network(Network {
        kind: kind.into(),
        host,
        port: e.port,
        verdict: verdict_name(e.verdict).into(),
        detail: serde_json::Value::Object(detail),
    })
}

/// Appends `bodies` to `sandbox`'s chain (if its log has started and not ended).
/// The network side of the record: the budgets, and the record they write to.
#[derive(Debug)]
pub(crate) struct NetAudit {
    audit: Arc<Audit>,
    budgets: Budgets,
    /// Bytes each sandbox sent out, over the connections that ended (for its usage; every
    /// entry counts, whether the budget records it or not).
    egress: Mutex<HashMap<String, u64>>,
}

impl NetAudit {
    pub(crate) fn new(audit: Arc<Audit>) -> NetAudit {
        let budgets = Budgets::new(audit.config().network_events);
        NetAudit {
            audit,
            budgets,
            egress: Mutex::new(HashMap::new()),
        }
    }

    /// Counts an entry's bytes out towards its sandbox's usage.
    fn count(&self, sandbox: &str, e: &NetLogEntry) {
        if let Some(b) = e.bytes_out.filter(|b| *b > 0) {
            *lock(&self.egress).entry(sandbox.to_owned()).or_default() += b;
        }
    }

    /// Bytes `id` sent out so far.
    pub(crate) fn egress_bytes(&self, id: &SandboxId) -> u64 {
        lock(&self.egress).get(id.as_str()).copied().unwrap_or(0)
    }

    /// Bytes `id` sent out, forgotten (at its end).
    pub(crate) fn take_egress_bytes(&self, id: &SandboxId) -> u64 {
        lock(&self.egress).remove(id.as_str()).unwrap_or(0)
    }

    /// Records what the budget left out of a sandbox's record (at destroy, before its
    /// `destroyed`).
    pub(crate) fn record_suppressed(&self, id: &SandboxId) {
        for body in self.budgets.take(id.as_str()) {
            if let Err(e) = self.audit.append_if_started(id, body) {
                warn!(id = %id, "recording the suppressed network events: {e}");
            }
        }
    }
}

async fn append(audit: &Arc<Audit>, sandbox: &str, bodies: Vec<EventBody>) {
    let Ok(id) = SandboxId::parse(sandbox) else {
        return;
    };
    let a = audit.clone();
    // A journal append (a store write only when a flush is due).
    let r = tokio::task::spawn_blocking(move || {
        bodies
            .into_iter()
            .try_for_each(|b| a.append_if_started(&id, b))
    })
    .await;
    if let Ok(Err(e)) = r {
        warn!(sandbox = %sandbox, "recording a network event: {e}");
    }
}

/// Records the hook's entries until it closes, within the budget; records due summaries
/// every second.
pub(crate) async fn run(net: Arc<NetAudit>, mut rx: tokio::sync::mpsc::Receiver<NetEvent>) {
    let audit = &net.audit;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else { return };
                if SandboxId::parse(&ev.sandbox).is_err() {
                    continue;
                }
                net.count(&ev.sandbox, &ev.entry);
                match net.budgets.admit(&ev.sandbox, &ev.entry, Instant::now()) {
                    Admit::Counted => {}
                    Admit::Record(summary) => {
                        let mut bodies: Vec<EventBody> = summary.into_iter().map(|b| *b).collect();
                        bodies.push(body_of(&ev.entry));
                        append(audit, &ev.sandbox, bodies).await;
                    }
                }
            }
            _ = tick.tick() => {
                for (sandbox, body) in net.budgets.due(Instant::now()) {
                    append(audit, &sandbox, vec![body]).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: NetEventKind) -> NetLogEntry {
        NetLogEntry {
            seq: 1,
            time: "t".into(),
            kind,
            name: Some("pypi.org".into()),
            qtype: Some("A".into()),
            addrs: vec!["151.101.0.223".into()],
            port: Some(443),
            verdict: Verdict::Deny,
            rule: "default".into(),
            bytes_out: None,
            bytes_in: None,
            secret: Some("PYPI_TOKEN".into()),
            package: None,
        }
    }

    #[test]
    fn package_entries_become_package_bodies() {
        let mut e = entry(NetEventKind::Package);
        e.verdict = Verdict::Allow;
        e.rule = "package".into();
        e.package = Some(rampart_types::network::PackageFetch {
            ecosystem: "pypi".into(),
            name: "six".into(),
            version: "1.16.0".into(),
            registry: "files.pythonhosted.org".into(),
            path: "/packages/x/six-1.16.0-py2.py3-none-any.whl".into(),
            sha256: Some("ab".repeat(32)),
            size: Some(11053),
        });
        match body_of(&e) {
            EventBody::Package(p) => {
                assert_eq!((p.name.as_str(), p.version.as_str()), ("six", "1.16.0"));
                assert_eq!(
                    (p.verdict.as_str(), p.rule.as_str()),
                    ("allowed", "package")
                );
                assert_eq!(p.sha256.map(|h| h.to_hex()), Some("ab".repeat(32)));
                assert_eq!(p.size, Some(11053));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn entries_become_network_and_secret_used_bodies() {
        match body_of(&entry(NetEventKind::Connect)) {
            EventBody::Network(n) => {
                assert_eq!((n.kind.as_str(), n.host.as_str()), ("connect", "pypi.org"));
                assert_eq!((n.port, n.verdict.as_str()), (Some(443), "denied"));
                assert_eq!(n.detail["rule"], "default");
                assert_eq!(n.detail["addrs"][0], "151.101.0.223");
            }
            other => panic!("{other:?}"),
        }
        match body_of(&entry(NetEventKind::SecretUsed)) {
            EventBody::SecretUsed(s) => {
                assert_eq!(
                    (s.name.as_str(), s.host.as_str()),
                    ("PYPI_TOKEN", "pypi.org")
                );
            }
            other => panic!("{other:?}"),
        }
        let mut scrub = entry(NetEventKind::SecretUsed);
        scrub.rule = "scrub:PYPI_TOKEN".into();
        match body_of(&scrub) {
            EventBody::Network(n) => {
                assert_eq!(
                    (n.kind.as_str(), n.host.as_str(), n.verdict.as_str()),
                    ("secret_scrubbed", "pypi.org", "denied")
                );
                assert_eq!(n.detail["secret"], "PYPI_TOKEN");
                assert_eq!(n.detail["rule"], "scrub:PYPI_TOKEN");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_budget_counts_what_it_leaves_out_and_summarizes_it_once_refilled() {
        let b = Budgets::new(NetEventBudget {
            burst: 3,
            per_sec: 1.0,
        });
        let t0 = Instant::now();
        let mut dns = entry(NetEventKind::Dns);
        let mut recorded = 0;
        for i in 0..2000 {
            dns.time = format!("t{i}");
            match b.admit("sb", &dns, t0) {
                Admit::Record(None) => recorded += 1,
                Admit::Record(Some(s)) => panic!("{s:?}"),
                Admit::Counted => {}
            }
        }
        assert_eq!(recorded, 3);
        // A secret use has its own bucket: the DNS flood does not leave it out.
        assert_eq!(
            b.admit("sb", &entry(NetEventKind::SecretUsed), t0),
            Admit::Record(None)
        );
        // So has a package download.
        assert_eq!(
            b.admit("sb", &entry(NetEventKind::Package), t0),
            Admit::Record(None)
        );
        // Another sandbox has its own budget.
        assert_eq!(b.admit("other", &dns, t0), Admit::Record(None));
        // Nothing is due before a token is back.
        assert!(b.due(t0 + Duration::from_millis(500)).is_empty());
        let due = b.due(t0 + Duration::from_secs(1));
        assert_eq!(due.len(), 1);
        let (sb, EventBody::Network(n)) = &due[0] else {
            panic!("{due:?}")
        };
        assert_eq!(sb, "sb");
        assert_eq!(
            (n.kind.as_str(), n.verdict.as_str()),
            ("suppressed", "suppressed")
        );
        assert_eq!(n.detail["total"], 1997);
        assert_eq!(n.detail["counts"]["dns"]["denied"], 1997);
        assert_eq!(
            (n.detail["first"].as_str(), n.detail["last"].as_str()),
            (Some("t3"), Some("t1999"))
        );
        // Said once.
        assert!(b.due(t0 + Duration::from_secs(10)).is_empty());
        // Left out again, then the next entry with two tokens back brings the summary first.
        let t1 = t0 + Duration::from_secs(10);
        let mut connect = entry(NetEventKind::Connect);
        connect.verdict = Verdict::Allow;
        let mut counted = 0;
        for _ in 0..10 {
            if b.admit("sb", &connect, t1) == Admit::Counted {
                counted += 1;
            }
        }
        assert_eq!(counted, 7);
        match b.admit("sb", &connect, t1 + Duration::from_secs(2)) {
            Admit::Record(Some(body)) => {
                let EventBody::Network(n) = *body else {
                    panic!("{body:?}")
                };
                assert_eq!(n.detail["counts"]["connect"]["allowed"], 7);
                assert_eq!(n.detail["total"], 7);
            }
            other => panic!("{other:?}"),
        }
        // At destroy: what is left out is taken (once).
        for _ in 0..5 {
            b.admit("sb", &dns, t1 + Duration::from_secs(2));
        }
        let mut secret = entry(NetEventKind::SecretUsed);
        secret.time = "s".into();
        for _ in 0..4 {
            b.admit("sb", &secret, t1 + Duration::from_secs(2));
        }
        let taken = b.take("sb");
        assert_eq!(taken.len(), 2, "{taken:?}");
        let totals: Vec<_> = taken
            .iter()
            .map(|t| match t {
                EventBody::Network(n) => n.detail.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(totals[0]["counts"]["dns"]["denied"], 5);
        assert_eq!(totals[1]["secrets"][0]["name"], "PYPI_TOKEN");
        assert_eq!(totals[1]["secrets"][0]["host"], "pypi.org");
        assert_eq!(totals[1]["secrets"][0]["count"], 1);
        assert!(b.take("sb").is_empty());
        // An idle sandbox's full bucket is forgotten.
        b.due(t1 + Duration::from_secs(100));
        assert!(lock(&b.buckets).is_empty());
    }
}
