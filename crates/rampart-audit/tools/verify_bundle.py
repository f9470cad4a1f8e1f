#!/usr/bin/env python3
"""An independent verifier of Rampart audit bundles, written from docs/proof.md only.

Usage: verify_bundle.py BUNDLE [ed25519:<hex of the trusted key>]

It is the Python SDK's verifier (`sdk/python/rampart/verify.py`, `rampart.verify_bundle`),
run from the checkout without installing anything: the standard library only, the Ed25519
signature included (`sdk/python/rampart/_ed25519.py`, pure Python). It checks the hash chain,
the blobs, the anchor, the inclusion proof, the key id and the signature, and that a
`destroyed` record's `manifest_digest` (when not null) is the hash of an `fs_diff` record
before it. It does not check body shapes as strictly as the Rust verifier (members and
types); it is a cross-check of the cryptography and the encoding, and an example for third
parties. Exit status 0: verified; 1: not verified (the reason is printed).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "sdk", "python", "rampart"))

import verify  # noqa: E402

sys.exit(verify.main())
