//! Network decisions in the audit record: every entry of the egress tier's network log (its
//! event hook, `rampart_egress::Egress::take_events`) becomes a `network` event of the
//! sandbox's chain (DNS answers, connection verdicts, connection ends with their byte
//! counts), and each secret substitution a `secret_used` event (name and host, never the
//! value). Entries of a sandbox whose log has not started (its `created` not yet recorded)
//! or has ended are not recorded; entries the hook dropped because this task lagged are
//! lost (the egress tier counts them).

use crate::audit::Audit;
use rampart_audit::EventBody;
use rampart_egress::NetEvent;
use rampart_types::audit::{Network, SecretUsed};
use rampart_types::network::{NetEventKind, NetLogEntry, Verdict};
use rampart_types::SandboxId;
use std::sync::Arc;
use tracing::warn;

/// The audit body of a network log entry.
pub(crate) fn body_of(e: &NetLogEntry) -> EventBody {
    let host = e
        .name
        .clone()
        .or_else(|| e.addrs.first().cloned())
        .unwrap_or_default();
    if e.kind == NetEventKind::SecretUsed {
        return EventBody::SecretUsed(SecretUsed {
            name: e.secret.clone().unwrap_or_default(),
            host,
        });
    }
    let kind = match e.kind {
        NetEventKind::Dns => "dns",
        NetEventKind::Connect => "connect",
        NetEventKind::Close => "close",
        NetEventKind::SecretUsed => "secret_used",
    };
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
        verdict: match e.verdict {
            Verdict::Allow => "allowed",
            Verdict::Deny => "denied",
        }
        .into(),
        detail: serde_json::Value::Object(detail),
    })
}

/// Records the hook's entries until it closes.
pub(crate) async fn run(audit: Arc<Audit>, mut rx: tokio::sync::mpsc::Receiver<NetEvent>) {
    while let Some(ev) = rx.recv().await {
        let Ok(id) = SandboxId::parse(&ev.sandbox) else {
            continue;
        };
        let body = body_of(&ev.entry);
        let a = audit.clone();
        // A journal append (a store write only when a flush is due).
        let r = tokio::task::spawn_blocking(move || a.append_if_started(&id, body)).await;
        if let Ok(Err(e)) = r {
            warn!(sandbox = %ev.sandbox, "recording a network event: {e}");
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
    }
}
