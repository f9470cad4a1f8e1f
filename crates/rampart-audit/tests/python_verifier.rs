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
    let text = String::from_utf8(bytes)
        .unwrap()
        .replacen("marker-2; ls", "marker-7; ls", 1);
    let (ok, out) = python(text.as_bytes(), Some(&key)).unwrap();
    assert!(!ok && out.contains("record seq"), "{out}");
}
