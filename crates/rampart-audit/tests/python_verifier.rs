//! The format is re-implementable: an independent Python verifier written from
//! docs/proof.md (`tools/verify_bundle.py`) accepts our bundles and refuses tampered ones.

mod common;

use common::{session, Node};
use std::process::Command;

fn python(bundle: &[u8], key: Option<&str>) -> Option<(bool, String)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bundle.json");
    std::fs::write(&path, bundle).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/verify_bundle.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(&path);
    if let Some(k) = key {
        cmd.arg(k);
    }
    let out = cmd.output().ok()?;
    Some((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    ))
}

#[test]
fn python_verifier_agrees() {
    let mut node = Node::new(3);
    let s = session(&mut node, "pyth0n", 6);
    let bundle = node.export(&s.chain, s.events, s.blobs);
    let bytes = bundle.to_bytes();
    let key = node.key.public_key().to_string();
    let Some((ok, out)) = python(&bytes, Some(&key)) else {
        println!("SKIP: python3 is not available");
        return;
    };
    assert!(ok, "{out}");
    assert!(out.contains("VERIFIED"), "{out}");
    println!("{out}");
    // A changed argv fails there too.
    let text =
        String::from_utf8(bytes.clone())
            .unwrap()
            .replacen("marker-2; ls", "marker-7; ls", 1);
    let (ok, out) = python(text.as_bytes(), Some(&key)).unwrap();
    assert!(!ok && out.contains("record seq"), "{out}");
    // So does a changed signature: the Ed25519 check is pure Python, never skipped.
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let sig = v["tree_head"]["signature"].as_str().unwrap().to_owned();
    let flipped = if sig.ends_with('0') { "1" } else { "0" };
    v["tree_head"]["signature"] = format!("{}{flipped}", &sig[..sig.len() - 1]).into();
    let (ok, out) = python(&serde_json::to_vec(&v).unwrap(), Some(&key)).unwrap();
    assert!(!ok && out.contains("signature does not verify"), "{out}");
    // And a key other than the one trusted.
    let other = Node::new(9).key.public_key().to_string();
    let (ok, out) = python(&bytes, Some(&other)).unwrap();
    assert!(
        !ok && out.contains("not signed by the trusted key"),
        "{out}"
    );
}

/// A `destroyed.manifest_digest` that names no `fs_diff` record before it is refused by
/// both verifiers, though everything is properly hashed and signed.
#[test]
fn python_verifier_checks_the_manifest_digest() {
    use rampart_audit::{verify_bundle, Chain};
    use rampart_types::audit::{Destroyed, EventBody};

    let mut node = Node::new(4);
    let s = session(&mut node, "pyth1n", 3);
    let key = node.key.public_key();
    // The same log, its last record (`destroyed`) replaced by one naming `wrong`.
    let mut with_digest = |wrong: rampart_types::audit::Hash| {
        let mut events = s.events.clone();
        let last = events.pop().unwrap();
        assert!(matches!(last.body, EventBody::Destroyed(_)));
        let mut chain = Chain::new(s.chain.sandbox().clone());
        let mut out = Vec::new();
        for e in events {
            out.push(chain.append(e.body, e.time).unwrap());
        }
        out.push(
            chain
                .append(
                    EventBody::Destroyed(Destroyed {
                        reason: "api".into(),
                        manifest_digest: Some(wrong),
                        artifacts: None,
                    }),
                    last.time,
                )
                .unwrap(),
        );
        node.export(&chain, out, s.blobs.clone()).to_bytes()
    };
    // The record before the fs_diff (the snapshot), then a hash of nothing in the log.
    let snapshot = s.events[s.events.len() - 3].hash;
    assert!(matches!(
        s.events[s.events.len() - 3].body,
        EventBody::Snapshot(_)
    ));
    let nothing = rampart_audit::hash::content_digest(b"no such record");
    for wrong in [snapshot, nothing] {
        let bytes = with_digest(wrong);
        let err = verify_bundle(&bytes, Some(&key)).unwrap_err();
        assert!(err.to_string().contains("manifest_digest"), "{err}");
        let Some((ok, out)) = python(&bytes, Some(&key.to_string())) else {
            println!("SKIP: python3 is not available");
            return;
        };
        assert!(!ok, "{out}");
        assert!(
            out.contains("manifest_digest") && out.contains(&wrong.to_hex()),
            "{out}"
        );
    }
    // The unchanged log (digest of its fs_diff) passes both.
    let good = s.events.last().unwrap();
    let EventBody::Destroyed(d) = &good.body else {
        panic!("the session ends with destroyed")
    };
    let bytes = with_digest(d.manifest_digest.unwrap());
    verify_bundle(&bytes, Some(&key)).unwrap();
    let (ok, out) = python(&bytes, Some(&key.to_string())).unwrap();
    assert!(ok, "{out}");
}

/// `destroyed.artifacts`: the files' blobs travel in the bundle; both verifiers accept it,
/// and both refuse an artifact blob whose bytes were changed, or one of another size than
/// the record lists.
#[test]
fn both_verifiers_check_artifact_blobs() {
    use base64::Engine as _;
    use rampart_audit::{referenced_blobs, verify_bundle, Chain};
    use rampart_types::audit::{ArtifactFile, Artifacts, Destroyed, EventBody};

    let mut node = Node::new(5);
    let s = session(&mut node, "art1fact", 2);
    let key = node.key.public_key();
    let out = b"the report the sandbox left\n".to_vec();
    let digest = rampart_audit::hash::content_digest(&out);
    let build = |size: u64| {
        let mut events = s.events.clone();
        let last = events.pop().unwrap();
        let EventBody::Destroyed(d) = last.body else {
            panic!("the session ends with destroyed")
        };
        let mut chain = Chain::new(s.chain.sandbox().clone());
        let mut v = Vec::new();
        for e in events {
            v.push(chain.append(e.body, e.time).unwrap());
        }
        v.push(
            chain
                .append(
                    EventBody::Destroyed(Destroyed {
                        artifacts: Some(Artifacts {
                            paths: vec!["/home/user/out".into()],
                            files: vec![ArtifactFile {
                                path: "/home/user/out/report.txt".into(),
                                size,
                                digest,
                                mode: 0o644,
                            }],
                            skipped: 1,
                            truncated: false,
                        }),
                        ..d
                    }),
                    last.time,
                )
                .unwrap(),
        );
        (chain, v)
    };
    let (chain, events) = build(out.len() as u64);
    assert!(referenced_blobs(&events).contains(&digest));
    let mut blobs = s.blobs.clone();
    blobs.push(out.clone());
    let mut node2 = node;
    let bytes = node2.export(&chain, events, blobs.clone()).to_bytes();
    let report = verify_bundle(&bytes, Some(&key)).unwrap();
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    let py = python(&bytes, Some(&key.to_string()));
    if let Some((ok, text)) = &py {
        assert!(ok, "{text}");
    } else {
        println!("SKIP: python3 is not available");
    }
    // The artifact's bytes changed in the bundle: refused by both.
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    v["blobs"][digest.to_hex()] = b64.encode(b"something else").into();
    let tampered = serde_json::to_vec(&v).unwrap();
    let err = verify_bundle(&tampered, Some(&key)).unwrap_err();
    assert!(err.to_string().contains(&digest.to_hex()[..12]), "{err}");
    if py.is_some() {
        let (ok, text) = python(&tampered, Some(&key.to_string())).unwrap();
        assert!(!ok && text.contains("does not match its digest"), "{text}");
    }
    // A record that lists another size than the blob has: refused by both.
    let (chain, events) = build(out.len() as u64 + 1);
    let bytes = node2.export(&chain, events, blobs).to_bytes();
    let err = verify_bundle(&bytes, Some(&key)).unwrap_err();
    assert!(err.to_string().contains("artifact"), "{err}");
    if py.is_some() {
        let (ok, text) = python(&bytes, Some(&key.to_string())).unwrap();
        assert!(!ok && text.contains("artifact blob"), "{text}");
    }
}
