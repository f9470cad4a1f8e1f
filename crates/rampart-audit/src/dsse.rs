//! The record in a standard form: a DSSE envelope (`payloadType:
//! application/vnd.in-toto+json`) around an in-toto Statement v1 whose subject is a
//! sandbox's chain head and whose predicate summarises its session (template, commands,
//! files, hosts, approvals, and where the head sits in the node's signed tree), signed with
//! the node's Ed25519 key. Tools that read DSSE and in-toto (securesystemslib, sigstore,
//! in-toto-golang) verify it with the node's public key.
//!
//! The statement is made from a bundle that verified first ([`statement`]), so it says only
//! what the signed record says.

use crate::bundle::verify_bundle;
use crate::key::{NodeKey, PublicKey};
use crate::VerifyError;
use base64::Engine as _;
use rampart_types::audit::{Event, EventBody};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The envelope's payload type.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The statement's type.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The predicate's type.
pub const PREDICATE_TYPE: &str = "https://rampart.dev/attestation/sandbox-session/v1";

/// DSSE's pre-authentication encoding: what is signed.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

#[derive(serde::Deserialize)]
struct EventsOnly {
    events: Vec<Event>,
}

/// The in-toto Statement of the bundle `bytes`, which must verify against `key`.
pub fn statement(bytes: &[u8], key: &PublicKey) -> Result<Value, VerifyError> {
    let report = verify_bundle(bytes, Some(key))?;
    let b: EventsOnly =
        serde_json::from_slice(bytes).map_err(|e| VerifyError::Malformed(e.to_string()))?;
    let mut template = Value::Null;
    let mut commands: Vec<Value> = Vec::new();
    let mut open: BTreeMap<String, usize> = BTreeMap::new();
    let mut files = Vec::new();
    let mut hosts: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut approvals: Vec<Value> = Vec::new();
    let mut redactions: Vec<Value> = Vec::new();
    let mut policies: Vec<Value> = Vec::new();
    let mut packages: Vec<Value> = Vec::new();
    let mut ended = Value::Null;
    let mut artifacts = Value::Null;
    for e in &b.events {
        match &e.body {
            EventBody::Created(c) => {
                template = json!({"name": c.template, "digest": c.template_digest});
            }
            EventBody::Exec(x) => {
                open.insert(x.exec_id.clone(), commands.len());
                commands.push(json!({
                    "seq": e.seq,
                    "argv": x.argv,
                    "user": x.user,
                    "caller": x.caller,
                    "principal": e.auth.as_ref().map(|a| a.principal.clone()),
                    "approval": x.approval,
                    "exit_code": null,
                    "signal": null,
                    "timed_out": false,
                }));
            }
            EventBody::Exit(x) => {
                if let Some(c) = open.remove(&x.exec_id).and_then(|i| commands.get_mut(i)) {
                    c["exit_code"] = json!(x.exit_code);
                    c["signal"] = json!(x.signal);
                    c["timed_out"] = json!(x.timed_out);
                    c["stdout_sha256"] = json!(x.stdout.digest.to_hex());
                }
            }
            EventBody::File(f) => files.push(json!({
                "seq": e.seq,
                "op": serde_json::to_value(f.op).unwrap_or(Value::Null),
                "path": f.path,
                "to": f.to,
                "sha256": f.digest.map(|d| d.to_hex()),
            })),
            EventBody::Network(n) if n.kind != "suppressed" => {
                let h = hosts.entry(n.host.clone()).or_default();
                if n.verdict == "allowed" {
                    h.0 += 1;
                } else {
                    h.1 += 1;
                }
            }
            EventBody::Package(p) => packages.push(json!({
                "seq": e.seq,
                "ecosystem": p.ecosystem,
                "name": p.name,
                "version": p.version,
                "registry": p.registry,
                "sha256": p.sha256.map(|h| h.to_hex()),
                "verdict": p.verdict,
                "rule": p.rule,
            })),
            EventBody::ApprovalRequested(r) => approvals.push(json!({
                "id": r.approval_id,
                "kind": r.kind,
                "request": r.request,
                "request_sha256": r.digest,
                "rule": r.rule,
                "requested_by": r.caller,
                "decision": null,
            })),
            EventBody::ApprovalDecided(d) => {
                if let Some(a) = approvals.iter_mut().find(|a| a["id"] == d.approval_id) {
                    a["decision"] = json!(d.decision);
                    a["decided_by"] = json!(d.by);
                    a["reason"] = json!(d.reason);
                }
            }
            EventBody::Destroyed(d) => {
                ended = json!({"time": e.time, "reason": d.reason});
                if let Some(a) = &d.artifacts {
                    artifacts = json!({
                        "paths": a.paths,
                        "files": a.files.iter().map(|f| json!({
                            "path": f.path,
                            "size": f.size,
                            "sha256": f.digest.to_hex(),
                        })).collect::<Vec<_>>(),
                        "skipped": a.skipped,
                        "truncated": a.truncated,
                    });
                }
            }
            EventBody::Redacted(r) => redactions.push(json!({
                "seq": e.seq,
                "exec_id": r.exec_id,
                "field": r.field,
                "names": r.names,
                "count": r.count,
            })),
            _ => {}
        }
        // The policies in force, as the events name them (first seq of each).
        if let Some(a) = &e.auth {
            let d = a.policy.to_hex();
            if policies.last().and_then(|p| p["sha256"].as_str()) != Some(d.as_str()) {
                policies.push(json!({"sha256": d, "from_seq": e.seq}));
            }
        }
    }
    // The record first (its chain head), then every file the session left as an artifact:
    // what it produced, by digest, as in-toto subjects are.
    let mut subject = vec![json!({
        "name": format!("rampart-sandbox:{}", report.sandbox),
        "digest": {"sha256": report.chain_head.to_hex()},
    })];
    for f in artifacts["files"].as_array().into_iter().flatten() {
        subject.push(json!({
            "name": format!("rampart-artifact:{}:{}", report.sandbox, f["path"].as_str().unwrap_or("")),
            "digest": {"sha256": f["sha256"]},
        }));
    }
    let hosts: Vec<Value> = hosts
        .into_iter()
        .map(|(h, (a, d))| json!({"host": h, "allowed": a, "denied": d}))
        .collect();
    Ok(json!({
        "_type": STATEMENT_TYPE,
        "subject": subject,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "sandbox": report.sandbox.to_string(),
            "node_key_id": key.key_id().to_hex(),
            "template": template,
            "started_at": report.first_time,
            "ended": ended,
            "record": {
                "events": report.events,
                "chain_head": report.chain_head.to_hex(),
                "leaf_index": report.leaf_index,
                "tree_size": report.tree_size,
                "tree_root": report.tree_root.to_hex(),
                "tree_signed_at": report.signed_at,
            },
            "commands": commands,
            "files": files,
            "hosts": hosts,
            "approvals": approvals,
            "redactions": redactions,
            "policies": policies,
            "packages": packages,
            "artifacts": artifacts,
        },
    }))
}

/// The DSSE envelope of `statement`, signed with `key` (its key id names the signature).
pub fn envelope(key: &NodeKey, statement: &Value) -> Value {
    let payload = serde_json::to_vec(statement).unwrap_or_default();
    let sig = key.sign_bytes(&pae(PAYLOAD_TYPE, &payload));
    let b64 = base64::engine::general_purpose::STANDARD;
    json!({
        "payloadType": PAYLOAD_TYPE,
        "payload": b64.encode(&payload),
        "signatures": [{"keyid": key.key_id().to_hex(), "sig": b64.encode(sig)}],
    })
}

/// Verifies an envelope against `key`: its statement.
pub fn verify_envelope(bytes: &[u8], key: &PublicKey) -> Result<Value, VerifyError> {
    let bad = |m: &str| VerifyError::Malformed(format!("DSSE envelope: {m}"));
    let env: Value = serde_json::from_slice(bytes).map_err(|e| bad(&e.to_string()))?;
    let ty = env["payloadType"]
        .as_str()
        .ok_or_else(|| bad("no payloadType"))?;
    if ty != PAYLOAD_TYPE {
        return Err(bad(&format!("payloadType {ty:?} is not {PAYLOAD_TYPE}")));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let payload = b64
        .decode(env["payload"].as_str().ok_or_else(|| bad("no payload"))?)
        .map_err(|e| bad(&format!("payload: {e}")))?;
    let msg = pae(ty, &payload);
    let sigs = env["signatures"]
        .as_array()
        .ok_or_else(|| bad("no signatures"))?;
    let ok = sigs.iter().any(|s| {
        s["sig"]
            .as_str()
            .and_then(|t| b64.decode(t).ok())
            .is_some_and(|sig| crate::key::verify_bytes(key, &msg, &sig))
    });
    if !ok {
        return Err(bad(
            "no signature verifies with the given key over the payload (changed, or signed by another key)",
        ));
    }
    let st: Value =
        serde_json::from_slice(&payload).map_err(|e| bad(&format!("statement: {e}")))?;
    if st["_type"] != STATEMENT_TYPE {
        return Err(bad("the payload is not an in-toto Statement v1"));
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_the_dsse_encoding() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
    }
}
