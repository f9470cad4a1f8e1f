"""Verifies a Rampart DSSE export with a standard library (securesystemslib), not Rampart's
code: `verify_dsse.py ENVELOPE ed25519:<hex> KEYID`. Prints `VERIFIED ...` and exits 0, or
says what failed and exits 1. Run by crates/rampart-cli/tests/approvals.rs."""

import json
import sys

from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey


def main(path, public, keyid):
    key = SSlibKey(keyid, "ed25519", "ed25519", {"public": public.removeprefix("ed25519:")})
    try:
        env = Envelope.from_dict(json.load(open(path, "rb")))
        env.verify([key], 1)
    except (VerificationError, ValueError, KeyError) as e:
        print("NOT VERIFIED:", type(e).__name__, e)
        return 1
    if env.payload_type != "application/vnd.in-toto+json":
        print("NOT VERIFIED: payload type", env.payload_type)
        return 1
    st = json.loads(env.payload)
    if st.get("_type") != "https://in-toto.io/Statement/v1":
        print("NOT VERIFIED: not an in-toto Statement v1")
        return 1
    subject = st["subject"][0]
    print("VERIFIED", subject["name"], "sha256:" + subject["digest"]["sha256"],
          "commands", len(st["predicate"]["commands"]),
          "approvals", len(st["predicate"]["approvals"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
