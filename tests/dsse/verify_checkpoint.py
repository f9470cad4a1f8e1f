"""Verifies a Rampart checkpoint (c2sp.org/tlog-checkpoint in a c2sp.org/signed-note) with
the spec and pyca/cryptography only, not Rampart's code: `verify_checkpoint.py NOTE VKEY`,
VKEY being the note verifier key `<name>+<key hash hex>+<base64(0x01 || key)>`. Prints
`VERIFIED <origin> <size> <root b64>` and exits 0, or says what failed and exits 1."""

import base64
import hashlib
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def main(path, vkey):
    name, khash, kdata = vkey.split("+", 2)
    raw = base64.b64decode(kdata)
    if raw[0] != 1 or len(raw) != 33:
        print("NOT VERIFIED: not an Ed25519 verifier key")
        return 1
    want = hashlib.sha256(name.encode() + b"\n" + raw).digest()[:4]
    if want.hex() != khash:
        print("NOT VERIFIED: the verifier key's hash does not match its name and key")
        return 1
    key = Ed25519PublicKey.from_public_bytes(raw[1:])
    note = open(path, encoding="utf-8").read()
    body, _, sigs = note.partition("\n\n")
    body += "\n"
    ok = False
    for line in sigs.splitlines():
        if not line.startswith("\u2014 "):
            print("NOT VERIFIED: a malformed signature line")
            return 1
        n, sig = line[2:].split(" ", 1)
        sig = base64.b64decode(sig)
        if n == name and sig[:4] == want:
            try:
                key.verify(sig[4:], body.encode())
                ok = True
            except InvalidSignature:
                pass
    if not ok:
        print("NOT VERIFIED: no valid signature by", name)
        return 1
    origin, size, root = body.splitlines()[:3]
    if origin != name:
        print("NOT VERIFIED: origin", origin)
        return 1
    print("VERIFIED", origin, int(size), root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
