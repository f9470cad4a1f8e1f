//! Tampering with a bundle in every way the issue lists: each is detected and the failing
//! record named. An untouched bundle verifies.

mod common;

use common::{session, Node};
use rampart_audit::hash::{event_hash, genesis};
use rampart_audit::*;
use rampart_types::SandboxId;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const A: &str = "aaaa1111";
const B: &str = "bbbb2222";
/// Events of the fixture: 0 created; 1 exec, 2 exit; 3 exec, 4 exit (flooded), 5 file,
/// 6 network, 7 secret_used, 8 network; 9 exec, 10 exit; 11 exec, 12 exit; 13 snapshot,
/// 14 fs_diff, 15 destroyed.
const N: u64 = 16;

struct Fixture {
    node: Node,
    bundle: Value,
    /// The same node's log of another sandbox.
    other: Value,
}

fn fixture() -> Fixture {
    let mut node = Node::new(1);
    let a = session(&mut node, A, 4);
    let b = session(&mut node, B, 4);
    let other = node.export(&b.chain, b.events, b.blobs);
    let bundle = node.export(&a.chain, a.events, a.blobs);
    assert_eq!(bundle.events.len() as u64, N);
    Fixture {
        node,
        bundle: to_json(&bundle.to_bytes()),
        other: to_json(&other.to_bytes()),
    }
}

fn to_json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn verify(v: &Value, key: Option<&PublicKey>) -> Result<Report, VerifyError> {
    verify_bundle(&bytes(v), key)
}

fn events(v: &mut Value) -> &mut Vec<Value> {
    v["events"].as_array_mut().unwrap()
}

/// What an attacker without the key can do: recompute every link and hash from `from` on.
fn rehash(v: &mut Value, from: usize) {
    let sandbox = SandboxId::parse(v["sandbox"].as_str().unwrap()).unwrap();
    let evs = events(v);
    let mut prev = if from == 0 {
        genesis(&sandbox)
    } else {
        Hash::parse(evs[from - 1]["hash"].as_str().unwrap()).unwrap()
    };
    let mut scratch = Vec::new();
    // A thorough forger keeps `destroyed.manifest_digest` naming the fs_diff record.
    let mut fs_diff: Option<Hash> = None;
    for e in evs.iter_mut().skip(from) {
        e["prev"] = json!(prev.to_hex());
        if e["body"]["type"] == "destroyed" && !e["body"]["manifest_digest"].is_null() {
            if let Some(d) = fs_diff {
                e["body"]["manifest_digest"] = json!(d.to_hex());
            }
        }
        let h = event_hash(
            e["seq"].as_u64().unwrap(),
            e["time"].as_str().unwrap(),
            e["sandbox"].as_str().unwrap(),
            &prev,
            e.get("auth"),
            &e["body"],
            &mut scratch,
        )
        .unwrap();
        e["hash"] = json!(h.to_hex());
        if e["body"]["type"] == "fs_diff" {
            fs_diff = Some(h);
        }
        prev = h;
    }
}

/// What a node can do (with its key): publish the bundle's current head and re-sign.
fn reanchor(node: &mut Node, v: &mut Value) {
    let sandbox = SandboxId::parse(v["sandbox"].as_str().unwrap()).unwrap();
    let evs = events(v);
    let length = evs.len() as u64;
    let head = evs
        .last()
        .map(|e| Hash::parse(e["hash"].as_str().unwrap()).unwrap())
        .unwrap_or_else(|| genesis(&sandbox));
    let (index, proof, sth) = node.publish(&HeadLeaf {
        sandbox,
        length,
        head,
    });
    v["anchor"] = json!({"leaf_index": index, "chain_length": length, "chain_head": head, "inclusion_proof": proof});
    v["tree_head"] = serde_json::to_value(sth).unwrap();
    v["public_key"] = json!(node.key.public_key().to_string());
}

#[test]
fn untouched_bundle_verifies_and_reports_what_happened() {
    let f = fixture();
    let key = f.node.key.public_key();
    let r = verify(&f.bundle, Some(&key)).unwrap();
    assert_eq!(r.events, N);
    assert!(r.key_pinned);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_eq!(r.activity.commands.len(), 4);
    assert_eq!(r.activity.commands[1].exit_code, Some(1));
    assert_eq!(
        r.activity.hosts["pypi.org"].secrets,
        vec!["PYPI_TOKEN".to_string()]
    );
    assert_eq!(r.activity.hosts["evil.example"].denied, 1);
    let text = r.to_string();
    for needle in [
        "VERIFIED",
        "pinned",
        "marker-3",
        "exit 1",
        "/home/user/main.py",
        "/etc/motd",
        "pypi.org",
        "PYPI_TOKEN",
        "snapshot snap1",
        "destroyed (api)",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from\n{text}");
    }
    // The other sandbox's bundle verifies too, and without a pinned key it says so.
    let r = verify(&f.other, None).unwrap();
    assert!(!r.key_pinned);
    assert!(
        r.warnings.iter().any(|w| w.contains("key not pinned")),
        "{:?}",
        r.warnings
    );
    // The bundle bytes as written verify as well (not only after a JSON round trip).
    let mut node = Node::new(1);
    let s = session(&mut node, A, 4);
    let b = node.export(&s.chain, s.events, s.blobs);
    verify_bundle(&b.to_bytes(), Some(&key)).unwrap();
}

#[test]
fn flipped_event_byte_is_named() {
    let f = fixture();
    let mut raw = bytes(&f.bundle);
    let needle = b"marker-2; ls";
    let at = raw.windows(needle.len()).position(|w| w == needle).unwrap();
    assert_eq!(
        raw.windows(needle.len()).filter(|w| *w == needle).count(),
        1
    );
    raw[at + 7] = b'7';
    assert_eq!(
        verify_bundle(&raw, None).unwrap_err(),
        VerifyError::BadHash { seq: 9 }
    );
}

#[test]
fn flipped_blob_byte_is_named() {
    let f = fixture();
    let digest = content_digest(b"marker-2\nfile-a\n");
    let mut v = f.bundle.clone();
    let blob = v["blobs"][digest.to_hex()].as_str().unwrap().to_owned();
    let mut chars: Vec<char> = blob.chars().collect();
    chars[4] = if chars[4] == 'A' { 'B' } else { 'A' };
    v["blobs"][digest.to_hex()] = json!(chars.into_iter().collect::<String>());
    assert_eq!(
        verify(&v, None).unwrap_err(),
        VerifyError::BlobMismatch {
            digest,
            seq: Some(10)
        }
    );
}

#[test]
fn flipped_signature_is_detected() {
    let f = fixture();
    let mut v = f.bundle.clone();
    let sig = v["tree_head"]["signature"].as_str().unwrap().to_owned();
    let first = if sig.starts_with('0') { "1" } else { "0" };
    let flipped = format!("{first}{}", &sig[1..]);
    v["tree_head"]["signature"] = json!(flipped);
    assert_eq!(verify(&v, None).unwrap_err(), VerifyError::BadSignature);
    // So is a changed tree head field under an intact signature.
    let mut v = f.bundle.clone();
    v["tree_head"]["timestamp"] = json!("2030-01-01T00:00:00.000Z");
    assert_eq!(verify(&v, None).unwrap_err(), VerifyError::BadSignature);
}

#[test]
fn dropped_event_is_named() {
    let f = fixture();
    let mut v = f.bundle.clone();
    events(&mut v).remove(5);
    assert_eq!(
        verify(&v, None).unwrap_err(),
        VerifyError::Missing { seq: 5, found: 6 }
    );
    // Even with seqs renumbered and hashes recomputed (no key): the signed head differs.
    for (i, e) in events(&mut v).iter_mut().enumerate() {
        e["seq"] = json!(i);
    }
    rehash(&mut v, 5);
    assert_eq!(
        verify(&v, None).unwrap_err(),
        VerifyError::Truncated {
            seq: Some(N - 2),
            expected: N,
            found: N - 1
        }
    );
}

#[test]
fn reordered_events_are_named() {
    let f = fixture();
    let mut v = f.bundle.clone();
    events(&mut v).swap(5, 6);
    assert_eq!(
        verify(&v, None).unwrap_err(),
        VerifyError::OutOfOrder {
            seq: 6,
            position: 5
        }
    );
    // With seqs swapped back the links break at the first moved record.
    let evs = events(&mut v);
    let (s5, s6) = (evs[5]["seq"].clone(), evs[6]["seq"].clone());
    evs[5]["seq"] = s6;
    evs[6]["seq"] = s5;
    assert_eq!(
        verify(&v, None).unwrap_err(),
        VerifyError::BrokenLink { seq: 5 }
    );
}

#[test]
fn spliced_event_from_another_sandbox_is_named() {
    let f = fixture();
    let foreign = f.other["events"][9].clone();
    // Replaced.
    let mut v = f.bundle.clone();
    events(&mut v)[9] = foreign.clone();
    assert!(
        matches!(verify(&v, None).unwrap_err(), VerifyError::WrongSandbox { seq: 9, ref found, .. } if found == B)
    );
    // Inserted.
    let mut v = f.bundle.clone();
    events(&mut v).insert(9, foreign.clone());
    assert!(matches!(
        verify(&v, None).unwrap_err(),
        VerifyError::WrongSandbox { seq: 9, .. }
    ));
    // Relabelled as ours: it does not link (each sandbox's chain starts at its own genesis).
    let mut v = f.bundle.clone();
    let mut relabelled = foreign;
    relabelled["sandbox"] = json!(A);
    events(&mut v)[9] = relabelled;
    assert_eq!(
        verify(&v, None).unwrap_err(),
        VerifyError::BrokenLink { seq: 9 }
    );
    // A whole foreign chain under our name fails at its first record.
    let mut v = f.other.clone();
    v["sandbox"] = json!(A);
    assert!(matches!(
        verify(&v, None).unwrap_err(),
        VerifyError::WrongSandbox { seq: 0, .. }
    ));
}

#[test]
fn truncated_log_is_detected() {
    let f = fixture();
    let mut v = f.bundle.clone();
    events(&mut v).truncate(N as usize - 2);
    assert_eq!(
        verify(&v, None).unwrap_err(),
        VerifyError::Truncated {
            seq: Some(N - 3),
            expected: N,
            found: N - 2
        }
    );
    // Rewriting the anchor to match does not help: the leaf is not in the signed tree.
    let head = v["events"][N as usize - 3]["hash"].clone();
    v["anchor"]["chain_length"] = json!(N - 2);
    v["anchor"]["chain_head"] = head;
    assert_eq!(
        verify(&v, None).unwrap_err(),
        VerifyError::BadInclusionProof(ProofError::RootMismatch)
    );
    // An empty log is truncated too.
    let mut v = f.bundle.clone();
    events(&mut v).clear();
    assert_eq!(
        verify(&v, None).unwrap_err(),
        VerifyError::Truncated {
            seq: None,
            expected: N,
            found: 0
        }
    );
}

#[test]
fn events_beyond_the_signed_head_are_named() {
    let f = fixture();
    let mut v = f.bundle.clone();
    let mut extra = v["events"][13].clone();
    extra["seq"] = json!(N);
    events(&mut v).push(extra);
    rehash(&mut v, N as usize);
    assert_eq!(
        verify(&v, None).unwrap_err(),
        VerifyError::Unanchored {
            seq: N,
            expected: N
        }
    );
}

#[test]
fn other_nodes_key_is_refused() {
    let f = fixture();
    let other = NodeKey::from_seed(&[2; 32]).public_key();
    let ours = f.node.key.public_key();
    assert_eq!(
        verify(&f.bundle, Some(&other)).unwrap_err(),
        VerifyError::UntrustedKey {
            found: ours.key_id(),
            trusted: other.key_id()
        }
    );
    // Swapping in another key without re-signing: the tree head names another key.
    let mut v = f.bundle.clone();
    v["public_key"] = json!(other.to_string());
    assert!(matches!(
        verify(&v, None).unwrap_err(),
        VerifyError::KeyIdMismatch { .. }
    ));
    v["tree_head"]["key_id"] = json!(other.key_id().to_hex());
    assert_eq!(verify(&v, None).unwrap_err(), VerifyError::BadSignature);
}

#[test]
fn bundle_resigned_by_another_key_fails_against_the_pinned_key() {
    let f = fixture();
    let ours = f.node.key.public_key();
    let mut v = f.bundle.clone();
    events(&mut v)[9]["body"]["argv"][2] = json!("echo innocent");
    rehash(&mut v, 9);
    let mut forger = Node::new(66);
    reanchor(&mut forger, &mut v);
    assert!(matches!(
        verify(&v, Some(&ours)).unwrap_err(),
        VerifyError::UntrustedKey { .. }
    ));
    // Unpinned, it verifies (it is a consistent record signed by *someone*), and says so.
    let r = verify(&v, None).unwrap();
    assert!(r.warnings.iter().any(|w| w.contains("key not pinned")));
    assert_eq!(r.key, forger.key.public_key());
}

#[test]
fn unknown_event_type_fails_by_name() {
    let mut f = fixture();
    let mut v = f.bundle.clone();
    let mut e = v["events"][13].clone();
    e["seq"] = json!(N);
    e["body"] = json!({"type": "teleported", "to": "mars"});
    events(&mut v).push(e);
    rehash(&mut v, N as usize);
    reanchor(&mut f.node, &mut v);
    let key = f.node.key.public_key();
    assert_eq!(
        verify(&v, Some(&key)).unwrap_err(),
        VerifyError::UnknownType {
            seq: N,
            event_type: "teleported".into()
        }
    );
    // A known type with an unknown member fails too.
    let mut v = f.bundle.clone();
    events(&mut v)[13]["body"]["extra"] = json!(1);
    rehash(&mut v, 13);
    reanchor(&mut f.node, &mut v);
    assert!(matches!(
        verify(&v, Some(&key)).unwrap_err(),
        VerifyError::BadBody { seq: 13, .. }
    ));
}

#[test]
fn content_record_contradicting_its_blob_is_named() {
    let mut f = fixture();
    let key = f.node.key.public_key();
    let mut v = f.bundle.clone();
    // seq 4's stdout was cut at the cap; claiming it whole contradicts the blob.
    assert_eq!(v["events"][4]["body"]["stdout"]["truncated"], json!(true));
    events(&mut v)[4]["body"]["stdout"]["truncated"] = json!(false);
    rehash(&mut v, 4);
    reanchor(&mut f.node, &mut v);
    assert!(matches!(
        verify(&v, Some(&key)).unwrap_err(),
        VerifyError::BadContent { seq: 4, .. }
    ));
    // A missing blob is only a warning (the digest is still committed).
    let mut v = f.bundle.clone();
    let first = v["blobs"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    v["blobs"].as_object_mut().unwrap().remove(&first);
    let r = verify(&v, Some(&key)).unwrap();
    assert!(
        r.warnings.iter().any(|w| w.contains("not in the bundle")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn ambiguous_json_is_refused() {
    let f = fixture();
    // A duplicate member could be read two ways by two parsers.
    let raw = String::from_utf8(bytes(&f.bundle)).unwrap();
    let dup = raw.replacen("\"pty\":false", "\"pty\":false,\"pty\":true", 1);
    assert!(matches!(
        verify_bundle(dup.as_bytes(), None).unwrap_err(),
        VerifyError::BadRecord { position: 1, .. }
    ));
    // Also for blobs.
    let (k, b64) = f.bundle["blobs"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    let dup = raw.replacen("\"blobs\":{", &format!("\"blobs\":{{\"{k}\":{b64},"), 1);
    assert!(dup.len() > raw.len());
    assert!(matches!(
        verify_bundle(dup.as_bytes(), None).unwrap_err(),
        VerifyError::Malformed(_)
    ));
    // A float has no single spelling.
    let mut v = f.bundle.clone();
    events(&mut v)[6]["body"]["detail"]["rtt"] = json!(0.25);
    assert!(matches!(
        verify(&v, None).unwrap_err(),
        VerifyError::BadRecord { position: 6, .. }
    ));
    // Not a bundle at all.
    assert!(matches!(
        verify_bundle(b"{", None).unwrap_err(),
        VerifyError::Malformed(_)
    ));
    let mut v = f.bundle.clone();
    v["format"] = json!("rampart.audit.bundle.v9");
    assert!(matches!(
        verify(&v, None).unwrap_err(),
        VerifyError::UnsupportedFormat(_)
    ));
    let mut v = f.bundle.clone();
    v["surprise"] = json!(1);
    assert!(matches!(
        verify(&v, None).unwrap_err(),
        VerifyError::Malformed(_)
    ));
}

#[test]
fn random_byte_flips_never_panic_and_never_pass_unnoticed() {
    let f = fixture();
    let original = bytes(&f.bundle);
    let key = f.node.key.public_key();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let mut accepted = 0;
    for _ in 0..3000 {
        let mut b = original.clone();
        for _ in 0..rng.gen_range(1..=3) {
            let at = rng.gen_range(0..b.len());
            b[at] ^= rng.gen_range(1..=255u8);
        }
        if verify_bundle(&b, Some(&key)).is_ok() {
            // Only a change that means nothing (whitespace) may pass.
            let same = serde_json::from_slice::<Value>(&b)
                .map(|v| v == f.bundle)
                .unwrap_or(false);
            assert!(same, "a meaningful change verified");
            accepted += 1;
        }
    }
    // Truncations anywhere, too.
    for cut in (0..original.len()).step_by(97) {
        assert!(verify_bundle(&original[..cut], Some(&key)).is_err());
    }
    println!("{accepted} of 3000 random flips changed nothing that matters");
}

#[test]
#[ignore = "prints a sample report"]
fn print_sample_report() {
    let f = fixture();
    println!("{}", verify(&f.bundle, None).unwrap());
    let mut v = f.bundle.clone();
    events(&mut v).swap(5, 6);
    println!("error: {}", verify(&v, None).unwrap_err());
}

#[test]
fn every_member_of_every_body_is_required() {
    // One meaning, one spelling: dropping any member of any body (even one that is null)
    // makes the record unreadable, so the typed reading of a record is exactly what was hashed.
    let mut f = fixture();
    let key = f.node.key.public_key();
    let mut checked = 0;
    for i in 0..N as usize {
        let members: Vec<String> = f.bundle["events"][i]["body"]
            .as_object()
            .unwrap()
            .keys()
            // `caller` was added later: records without it are older ones (tested below).
            .filter(|k| *k != "type" && *k != "caller")
            .cloned()
            .collect();
        for m in members {
            let mut v = f.bundle.clone();
            events(&mut v)[i]["body"]
                .as_object_mut()
                .unwrap()
                .remove(&m);
            rehash(&mut v, i);
            reanchor(&mut f.node, &mut v);
            let err = verify(&v, Some(&key)).unwrap_err();
            assert!(
                matches!(err, VerifyError::BadBody { seq, .. } if seq == i as u64),
                "seq {i} without {m}: {err}"
            );
            checked += 1;
        }
    }
    assert!(checked > 60, "{checked}");
    // A member added later is absent (an older record) or a value, never null.
    let i = (0..N as usize)
        .find(|i| f.bundle["events"][*i]["body"].get("caller").is_some())
        .expect("a body with a caller");
    let mut v = f.bundle.clone();
    events(&mut v)[i]["body"]["caller"] = serde_json::Value::Null;
    rehash(&mut v, i);
    reanchor(&mut f.node, &mut v);
    let err = verify(&v, Some(&key)).unwrap_err();
    assert!(
        matches!(err, VerifyError::BadBody { seq, .. } if seq == i as u64),
        "seq {i} with caller null: {err}"
    );
}
