#!/usr/bin/env python3
"""An independent verifier of Rampart audit bundles, written from docs/proof.md only.

Usage: verify_bundle.py BUNDLE [ed25519:<hex of the trusted key>]

Standard library only, except the Ed25519 signature check, which uses the `cryptography`
package when it is installed (and says so when it is not). It checks the hash chain, the
blobs, the anchor, the inclusion proof, the key id and the signature, and that a
`destroyed` record's `manifest_digest` (when not null) is the hash of an `fs_diff` record
before it. It does not check body shapes as strictly as the Rust verifier (members and
types); it is a cross-check of the cryptography and the encoding, and an example for third
parties.
Exit status 0: verified; 1: not verified (the reason is printed).
"""
import base64
import hashlib
import json
import sys

FORMAT = "rampart.audit.bundle.v1"


def sha256(b):
    return hashlib.sha256(b).digest()


def jcs(value):
    """Canonical JSON of the subset Rampart uses (RFC 8785 for strings, integers, ...)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        if abs(value) > 2**53 - 1:
            raise ValueError("integer out of range")
        return str(value)
    if isinstance(value, float):
        raise ValueError("floating-point numbers are not allowed")
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ",".join(jcs(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + jcs(value[k]) for k in keys) + "}"
    raise ValueError("unexpected JSON value")


def no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("duplicate member " + k)
        d[k] = v
    return d


def fail(msg):
    print("NOT VERIFIED: " + msg)
    sys.exit(1)


def node(l, r):
    return sha256(b"\x01" + l + r)


def verify_inclusion(leaf, index, size, proof, root):
    if index >= size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def main():
    raw = open(sys.argv[1], "rb").read()
    b = json.loads(raw, object_pairs_hook=no_duplicates, parse_float=lambda s: fail("float " + s))
    if b["format"] != FORMAT:
        fail("unknown format")
    sandbox = b["sandbox"]
    pub = bytes.fromhex(b["public_key"].removeprefix("ed25519:"))
    key_id = sha256(pub)
    if len(sys.argv) > 2 and bytes.fromhex(sys.argv[2].removeprefix("ed25519:")) != pub:
        fail("the bundle is not signed by the trusted key")
    sth = b["tree_head"]
    if bytes.fromhex(sth["key_id"]) != key_id:
        fail("the tree head names another key")
    msg = b"rampart.audit.tree-head.v1\0" + jcs(
        {k: sth[k] for k in ("key_id", "root_hash", "timestamp", "tree_size")}).encode()
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        try:
            Ed25519PublicKey.from_public_bytes(pub).verify(bytes.fromhex(sth["signature"]), msg)
        except Exception:
            fail("bad signature")
    except ImportError:
        print("warning: `cryptography` is not installed; signature NOT checked")

    head = sha256(b"rampart.audit.genesis.v1\0" + sandbox.encode())
    used = {}
    fs_diffs = set()  # hashes (hex) of the fs_diff records so far
    for i, e in enumerate(b["events"]):
        if e["sandbox"] != sandbox:
            fail(f"record {i} belongs to another sandbox")
        if e["seq"] != i:
            fail(f"record at position {i} has seq {e['seq']}")
        if bytes.fromhex(e["prev"]) != head:
            fail(f"record seq {i} does not link")
        signed = {k: e[k] for k in ("body", "prev", "sandbox", "seq", "time")}
        h = sha256(b"rampart.audit.event.v1\0" + jcs(signed).encode())
        if h.hex() != e["hash"]:
            fail(f"record seq {i}: bad hash")
        head = h
        body = e["body"]
        if body.get("type") == "fs_diff":
            fs_diffs.add(h.hex())
        elif body.get("type") == "destroyed":
            if "manifest_digest" not in body:
                fail(f"record seq {i}: destroyed without manifest_digest")
            m = body["manifest_digest"]
            if m is not None and m not in fs_diffs:
                fail(f"record seq {i}: manifest_digest {m} names no fs_diff record before it")
        for name in ("input", "stdout", "stderr", "streamed_input"):
            rec = body.get(name)
            if isinstance(rec, dict) and rec.get("blob"):
                used.setdefault(rec["blob"], i)
    a = b["anchor"]
    n = len(b["events"])
    if a["chain_length"] != n:
        fail(f"the signed head covers {a['chain_length']} records, the bundle has {n}")
    if bytes.fromhex(a["chain_head"]) != head:
        fail("the log's head is not the signed chain head")
    sid = sandbox.encode()
    leaf_data = (b"rampart.audit.head.v1\0" + bytes([len(sid)]) + sid
                 + n.to_bytes(8, "big") + head)
    leaf = sha256(b"\x00" + leaf_data)
    proof = [bytes.fromhex(p) for p in a["inclusion_proof"]]
    if not verify_inclusion(leaf, a["leaf_index"], sth["tree_size"], proof, bytes.fromhex(sth["root_hash"])):
        fail("the chain head is not in the signed tree")
    for digest, data in b["blobs"].items():
        if sha256(base64.b64decode(data, validate=True)).hex() != digest:
            fail(f"blob {digest} (record seq {used.get(digest)}) does not match its digest")
    print(f"VERIFIED: sandbox {sandbox}, {n} records, tree size {sth['tree_size']}, "
          f"key id {key_id.hex()[:12]}")


if __name__ == "__main__":
    main()
