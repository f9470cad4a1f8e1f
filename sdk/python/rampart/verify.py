"""Offline verification of what a Rampart node signed, in pure Python (no dependency).

- `verify_bundle(data, trusted_key=None)`: a sandbox's audit bundle (docs/proof.md): the hash
  chain, the blobs (artifact blobs against their listed size too), the anchor, the inclusion
  proof in the signed tree, the key id and the Ed25519 signature, that a `destroyed`
  record's `manifest_digest` names an `fs_diff` record before it, that each `package` record
  holds together (`package_problem`), the approvals (a decision follows its request, an exec
  or connection under an approval follows its approval), each event's `auth` (the policy
  digest recomputed from the record, a principal that may exec) and that a command the
  approval policy holds carries an approval. It checks the cryptography and the encoding;
  the Rust verifier (`rampart audit verify`) also checks each body's members and types.
- `verify_usage(data, trusted_key=None)`: a usage report (docs/tenants.md): each record's
  hash and link, the head, the totals, the signature.

Both raise `VerificationError` naming the first thing that is wrong. Pin `trusted_key`
(`ed25519:<hex>`, from `GET /v1/audit/key` or the node's operator) to know who signed.

`python -m rampart.verify BUNDLE [KEY]` verifies a bundle file (exit 0 or 1).
"""

import base64
import dataclasses
import hashlib
import json
import math
import re
import sys
from typing import Any, Optional

try:
    from . import _ed25519
except ImportError:  # run as a file beside _ed25519.py (tools/verify_bundle.py)
    import _ed25519  # type: ignore[no-redef]

BUNDLE_FORMAT = "rampart.audit.bundle.v1"


class VerificationError(Exception):
    """What a bundle or report does not pass, first."""


@dataclasses.dataclass(frozen=True)
class BundleReport:
    """A verified bundle."""

    sandbox: str
    records: int
    tree_size: int
    key_id: str
    key: str


@dataclasses.dataclass(frozen=True)
class UsageCheck:
    """A verified usage report."""

    records: int
    tenant: Optional[str]
    key: str


def _sha256(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def canonical(value: Any) -> str:
    """The canonical JSON of the subset Rampart signs (RFC 8785 for strings, integers,
    arrays and objects; no floating-point numbers)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        if abs(value) > 2**53 - 1:
            raise VerificationError("an integer out of the canonical range")
        return str(value)
    if isinstance(value, float):
        raise VerificationError("a floating-point number where none may be")
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical(value[k]) for k in keys) + "}"
    raise VerificationError("an unexpected JSON value")


def normalize_numbers(value: Any) -> Any:
    """Every non-integer number (and integer beyond 2^53-1) as its shortest decimal
    string, as the node hashes free-form numbers: 0.5 -> "0.5", 2.0 -> "2"."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if abs(value) <= 2**53 - 1 else str(value)
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        text = repr(value)
        if "e" in text or "E" in text:  # the node never writes an exponent
            text = format(value, "f").rstrip("0").rstrip(".")
        return text
    if isinstance(value, list):
        return [normalize_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: normalize_numbers(v) for k, v in value.items()}
    return value


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise VerificationError("a duplicate member " + k)
        d[k] = v
    return d


def may_exec(caller: str) -> bool:
    """Whether the principal a record names may run commands: a native key's scopes (the
    last ` (a,b)` group of `key:<id>:<name> (scopes) ...`) hold exec or admin; the socket,
    E2B keys and the node itself may."""
    if not caller.startswith("key:"):
        return True
    import re
    groups = re.findall(r" \(([a-z,]+)\)", caller)
    return bool(groups) and any(s in ("exec", "admin") for s in groups[-1].split(","))


def policy_digest(approvals: Any, network: Any) -> str:
    """The digest an event's ``auth.policy`` names: SHA-256 of the canonical JSON of
    ``{"approvals": A, "network": N}`` (free numbers normalized)."""
    v = normalize_numbers({"approvals": approvals, "network": network})
    return _sha256(canonical(v).encode()).hex()


_SAFE = set(b"@%+=:,./-_")


def _shell_join(argv) -> str:
    out = []
    for a in argv:
        if a and all(c < 128 and (chr(c).isalnum() or c in _SAFE) for c in a.encode()):
            out.append(a)
        else:
            out.append("'" + a.replace("'", "'\\''") + "'")
    return " ".join(out)


_KEYWORDS = ("then", "do", "else", "elif", "if", "while", "until", "!", "time")


def script_commands(script: str) -> list:
    """The commands of a shell script as the node reads them (rampart_types::approval::
    script_commands): the text between ; & | newline ( ) { } ` and $( outside quotes,
    trimmed, without the keywords that begin a compound command's body."""
    out, cur, quote = [], [], None

    def flush():
        t = "".join(cur).strip()
        while True:
            before = t
            for kw in _KEYWORDS:
                if t.startswith(kw) and t[len(kw):len(kw) + 1].isspace():
                    t = t[len(kw):].lstrip()
            if t == before:
                break
        if t:
            out.append(t)
        cur.clear()

    i, n = 0, len(script)
    while i < n:
        c = script[i]
        if quote is not None:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                cur.append(c)
                if i + 1 < n:
                    cur.append(script[i + 1])
                i += 2
                continue
            cur.append(c)
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif c == "\\":
            cur.append(c)
            if i + 1 < n:
                cur.append(script[i + 1])
                i += 1
        elif c in ";&|\n(){}`":
            flush()
        elif c == "$" and i + 1 < n and script[i + 1] == "(":
            i += 1
            flush()
        else:
            cur.append(c)
        i += 1
    flush()
    return out


def command_lines(argv) -> list:
    """The texts an approval policy's command patterns are matched against."""
    out = [_shell_join(argv)]
    shell = argv[0].rsplit("/", 1)[-1] if argv else None
    if shell in ("sh", "bash", "dash", "zsh", "ash"):
        for i, a in enumerate(argv):
            if a.startswith("-") and not a.startswith("--") and "c" in a:
                if i + 1 < len(argv):
                    out.append(argv[i + 1])
                    for cmd in script_commands(argv[i + 1]):
                        if cmd not in out:
                            out.append(cmd)
                break
    return out


def _holds(patterns, argv) -> Optional[str]:
    """The pattern of ``patterns`` that holds ``argv`` (Python's re reads the patterns;
    one it cannot read holds every command, as the node holds under a pattern it cannot
    compile)."""
    lines = command_lines(argv)
    for p in patterns:
        try:
            r = re.compile(p)
        except re.error:
            return p
        if any(r.search(line) for line in lines):
            return p
    return None


PACKAGE_MEMBERS = {"type", "ecosystem", "name", "version", "registry", "path", "verdict", "rule", "sha256", "size"}


def package_problem(body) -> "str | None":
    """Why a `package` record does not hold together, or None: exactly its members, a known
    ecosystem, a name, version, registry and absolute path; `allowed` with a sha256 (64
    lowercase hex digits) and a size under rule `package` or `pinned:...`, `denied` with
    both null under `unpinned` or `package-deny:...`."""
    if set(body) != PACKAGE_MEMBERS:
        return f"package members {sorted(body)}"
    if body["ecosystem"] not in ("pypi", "npm", "debian", "crates"):
        return f"package of unknown ecosystem {body['ecosystem']!r}"
    for k in ("name", "version", "registry", "path", "rule"):
        if not isinstance(body[k], str) or not body[k]:
            return f"package without a {k}"
    if not body["path"].startswith("/"):
        return "package path is not absolute"
    sha, size, rule = body["sha256"], body["size"], body["rule"]
    if body["verdict"] == "allowed":
        if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
            return "an allowed package without its sha256"
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return "an allowed package without its size"
        if rule != "package" and not rule.startswith("pinned:"):
            return f"an allowed package under rule {rule!r}"
    elif body["verdict"] == "denied":
        if sha is not None or size is not None:
            return "a denied package with a digest or size"
        if rule != "unpinned" and not rule.startswith("package-deny:"):
            return f"a denied package under rule {rule!r}"
    else:
        return f"package verdict {body['verdict']!r}"
    return None


def _key_bytes(text: str) -> bytes:
    try:
        b = bytes.fromhex(text.strip().removeprefix("ed25519:"))
    except ValueError:
        raise VerificationError(f"not a public key: {text!r}") from None
    if len(b) != 32:
        raise VerificationError(f"not a public key: {text!r}")
    return b


def _node(left: bytes, right: bytes) -> bytes:
    return _sha256(b"\x01" + left + right)


def _verify_inclusion(leaf, index, size, proof, root) -> bool:
    if index >= size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = _node(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = _node(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def _signature(sig_hex: str) -> bytes:
    try:
        sig = bytes.fromhex(sig_hex)
    except ValueError:
        raise VerificationError("the signature is not hex") from None
    if len(sig) != 64:
        raise VerificationError("the signature is not 64 bytes")
    return sig


def _artifacts(i, body, sizes, used):
    """`destroyed.artifacts`: absent (none asked for, or an older record) or an object,
    never null; each file's blob is named by its digest and has its size."""
    if "artifacts" not in body:
        return
    a = body["artifacts"]
    if not isinstance(a, dict) or set(a) != {"paths", "files", "skipped", "truncated"}:
        raise VerificationError(f"record seq {i}: artifacts is not an object of paths, files, skipped, truncated")
    for f in a["files"]:
        if set(f) != {"path", "size", "digest", "mode"}:
            raise VerificationError(f"record seq {i}: an artifact file without path, size, digest and mode")
        d = f["digest"]
        if not isinstance(d, str) or len(d) != 64 or d.strip("0123456789abcdef"):
            raise VerificationError(f"record seq {i}: artifact {f['path']!r} has a digest that is not 64 lowercase hex digits")
        if f["size"] == 0 and d != _sha256(b"").hex():
            raise VerificationError(f"record seq {i}: artifact {f['path']!r} is empty with a digest that is not SHA-256 of nothing")
        sizes[d] = f["size"]
        used.setdefault(d, i)


def verify_bundle(data: bytes, trusted_key: Optional[str] = None) -> BundleReport:
    """Verifies an audit bundle (its JSON bytes); raises VerificationError if it fails."""

    def no_floats(s):
        raise VerificationError("a floating-point number " + s)

    try:
        b = json.loads(data, object_pairs_hook=_no_duplicates, parse_float=no_floats)
    except json.JSONDecodeError as e:
        raise VerificationError(f"not JSON: {e}") from None
    if not isinstance(b, dict) or b.get("format") != BUNDLE_FORMAT:
        raise VerificationError("not a Rampart audit bundle (unknown format)")
    try:
        return _verify_bundle(b, trusted_key)
    except (KeyError, TypeError, ValueError) as e:
        raise VerificationError(f"malformed bundle: {e!r}") from None


def _verify_bundle(b, trusted_key):
    sandbox = b["sandbox"]
    pub = _key_bytes(b["public_key"])
    key_id = _sha256(pub)
    if trusted_key is not None and _key_bytes(trusted_key) != pub:
        raise VerificationError("the bundle is not signed by the trusted key")
    sth = b["tree_head"]
    if bytes.fromhex(sth["key_id"]) != key_id:
        raise VerificationError("the tree head names another key")
    msg = b"rampart.audit.tree-head.v1\0" + canonical(
        {k: sth[k] for k in ("key_id", "root_hash", "timestamp", "tree_size")}
    ).encode()
    if not _ed25519.verify(pub, msg, _signature(sth["signature"])):
        raise VerificationError("the tree head's signature does not verify")
    head = _sha256(b"rampart.audit.genesis.v1\0" + sandbox.encode())
    used = {}
    artifact_sizes = {}
    fs_diffs = set()
    requested, approved = {}, set()
    approvals_policy, network_policy, patterns = None, None, []
    in_force = policy_digest(None, None)
    asked_hosts = {}
    for i, e in enumerate(b["events"]):
        if e["sandbox"] != sandbox:
            raise VerificationError(f"record {i} belongs to another sandbox")
        if e["seq"] != i:
            raise VerificationError(f"record at position {i} has seq {e['seq']}")
        if bytes.fromhex(e["prev"]) != head:
            raise VerificationError(f"record seq {i} does not link to the one before it")
        signed = {k: e[k] for k in ("body", "prev", "sandbox", "seq", "time")}
        if "auth" in e:
            if not isinstance(e["auth"], dict):
                raise VerificationError(f"record seq {i}: auth is absent or an object, never {e['auth']!r}")
            signed["auth"] = e["auth"]
        h = _sha256(b"rampart.audit.event.v1\0" + canonical(signed).encode())
        if h.hex() != e["hash"]:
            raise VerificationError(f"record seq {i}: its content does not match its hash")
        head = h
        body = e["body"]
        if body.get("type") == "created":
            approvals_policy = (body.get("spec") or {}).get("approvals")
            network_policy = body.get("policy")
            patterns = [p for p in ((approvals_policy or {}).get("commands") or []) if isinstance(p, str)]
            in_force = policy_digest(approvals_policy, network_policy)
        elif body.get("type") == "policy_changed":
            network_policy = body.get("policy")
            in_force = policy_digest(approvals_policy, network_policy)
        if "auth" in e:
            if e["auth"].get("policy") != in_force:
                raise VerificationError(f"record seq {i}: names policy {e['auth'].get('policy')}, but the policy the record puts in force is {in_force}")
            if body.get("type") == "exec" and not may_exec(e["auth"].get("principal", "")):
                raise VerificationError(f"record seq {i}: done for {e['auth'].get('principal')}, whose scopes hold neither exec nor admin")
        if body.get("type") == "exec" and "approval" not in body:
            rule = _holds(patterns, body.get("argv") or [])
            if rule is not None:
                raise VerificationError(f"record seq {i}: runs a command the approval policy holds ({rule!r}) without an approval")
        if body.get("type") == "fs_diff":
            fs_diffs.add(h.hex())
        elif body.get("type") == "destroyed":
            if "manifest_digest" not in body:
                raise VerificationError(f"record seq {i}: destroyed without manifest_digest")
            m = body["manifest_digest"]
            if m is not None and m not in fs_diffs:
                raise VerificationError(f"record seq {i}: manifest_digest {m} names no fs_diff record before it")
            _artifacts(i, body, artifact_sizes, used)
        elif body.get("type") == "approval_requested":
            requested[body["approval_id"]] = body["digest"]
            if body.get("kind") == "host":
                asked_hosts[body["approval_id"]] = body["request"]
        elif body.get("type") == "network":
            rule = (body.get("detail") or {}).get("rule")
            if isinstance(rule, str) and rule.startswith("approved:"):
                a = rule[len("approved:"):]
                this = f"{body['host']}:{body['port'] or 0}"
                if a not in approved or asked_hosts.get(a) != this:
                    raise VerificationError(f"record seq {i}: a connection to {this} let through under approval {a}, which no record before it approved for that host")
        elif body.get("type") == "approval_decided":
            a = body["approval_id"]
            if a not in requested:
                raise VerificationError(f"record seq {i}: decides approval {a} that no approval_requested before it asked for")
            if requested[a] != body["digest"]:
                raise VerificationError(f"record seq {i}: decides approval {a} on another request than was asked")
            if body["decision"] == "approved":
                approved.add(a)
        elif body.get("type") == "package" and package_problem(body):
            raise VerificationError(f"record seq {i}: {package_problem(body)}")
        elif body.get("type") == "exec" and "caller" in body and not may_exec(body["caller"]):
            raise VerificationError(f"record seq {i}: asked by {body['caller']}, whose scopes hold neither exec nor admin")
        if body.get("type") == "exec" and "approval" in body:
            if body["approval"] not in approved:
                raise VerificationError(f"record seq {i}: runs under approval {body['approval']}, which no record before it approved")
        for name in ("input", "stdout", "stderr", "streamed_input", "image"):
            rec = body.get(name)
            if isinstance(rec, dict) and rec.get("blob"):
                used.setdefault(rec["blob"], i)
    a = b["anchor"]
    n = len(b["events"])
    if a["chain_length"] != n:
        raise VerificationError(f"the signed head covers {a['chain_length']} records, the bundle has {n}")
    if bytes.fromhex(a["chain_head"]) != head:
        raise VerificationError("the log's head is not the signed chain head")
    sid = sandbox.encode()
    leaf_data = b"rampart.audit.head.v1\0" + bytes([len(sid)]) + sid + n.to_bytes(8, "big") + head
    leaf = _sha256(b"\x00" + leaf_data)
    proof = [bytes.fromhex(p) for p in a["inclusion_proof"]]
    if not _verify_inclusion(leaf, a["leaf_index"], sth["tree_size"], proof, bytes.fromhex(sth["root_hash"])):
        raise VerificationError("the chain head is not in the signed tree")
    for digest, data in b["blobs"].items():
        raw = base64.b64decode(data, validate=True)
        if _sha256(raw).hex() != digest:
            raise VerificationError(f"blob {digest} (record seq {used.get(digest)}) does not match its digest")
        if digest in artifact_sizes and len(raw) != artifact_sizes[digest]:
            raise VerificationError(f"artifact blob {digest} (record seq {used.get(digest)}) has {len(raw)} bytes, not the {artifact_sizes[digest]} listed")
    return BundleReport(
        sandbox=sandbox,
        records=n,
        tree_size=sth["tree_size"],
        key_id=key_id.hex(),
        key="ed25519:" + pub.hex(),
    )


_ZERO = "0" * 64
_TOTALS = (
    "vcpu_seconds", "memory_gib_seconds", "disk_gib_seconds", "running_seconds", "paused_seconds",
)


def _milli(x: float) -> float:
    return round(x * 1000.0) / 1000.0


def verify_usage(data: bytes, trusted_key: Optional[str] = None) -> UsageCheck:
    """Verifies a usage report (its JSON bytes); raises VerificationError naming the first
    bad record."""
    try:
        r = json.loads(data, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise VerificationError(f"not JSON: {e}") from None
    try:
        return _verify_usage(r, trusted_key)
    except (KeyError, TypeError, ValueError) as e:
        raise VerificationError(f"malformed usage report: {e!r}") from None


def _verify_usage(r, trusted_key):
    if r.get("version") != 1:
        raise VerificationError(f"usage report version {r.get('version')} is not supported")
    prev = _ZERO
    for i, rec in enumerate(r["sandboxes"]):
        if rec["prev"] != prev:
            raise VerificationError(
                f"record {i} (sandbox {rec['id']}): its prev does not link to the record before it"
            )
        body = {k: v for k, v in rec.items() if k != "hash"}
        h = _sha256(b"rampart.usage.record.v1\0" + canonical(normalize_numbers(body)).encode()).hex()
        if h != rec["hash"]:
            raise VerificationError(f"record {i} (sandbox {rec['id']}): its content does not match its hash")
        prev = rec["hash"]
    if r["head"] != prev:
        raise VerificationError("the head is not the hash of the last record")
    recs, t = r["sandboxes"], r["totals"]
    if t["sandboxes"] != len(recs):
        raise VerificationError("totals.sandboxes is not the number of records")
    for k in _TOTALS:
        if not math.isclose(_milli(sum(x[k] for x in recs)), t[k], rel_tol=1e-6, abs_tol=1e-6):
            raise VerificationError(f"totals.{k} is not the sum of the records")
    for k in ("egress_bytes", "exec_count"):
        if sum(x[k] for x in recs) != t[k]:
            raise VerificationError(f"totals.{k} is not the sum of the records")
    if max((x["memory_peak_bytes"] for x in recs), default=0) != t["memory_peak_bytes"]:
        raise VerificationError("totals.memory_peak_bytes is not the highest peak")
    sig = r["signature"]
    pub = _key_bytes(sig["key"])
    if trusted_key is not None and _key_bytes(trusted_key) != pub:
        raise VerificationError("the report is not signed by the trusted key")
    header = {
        "version": r["version"], "tenant": r["tenant"], "from": r["from"], "to": r["to"],
        "generated_at": r["generated_at"], "totals": t, "count": len(recs), "head": r["head"],
    }
    msg = b"rampart.usage.report.v1\0" + canonical(normalize_numbers(header)).encode()
    if _sha256(pub).hex() != sig["key_id"] or not _ed25519.verify(pub, msg, _signature(sig["sig"])):
        raise VerificationError("the node's signature over the report does not verify")
    return UsageCheck(records=len(recs), tenant=r["tenant"], key="ed25519:" + pub.hex())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m rampart.verify BUNDLE [ed25519:<hex of the trusted key>]")
        return 2
    data = open(argv[0], "rb").read()
    try:
        rep = verify_bundle(data, argv[1] if len(argv) > 1 else None)
    except VerificationError as e:
        print("NOT VERIFIED: " + str(e))
        return 1
    print(f"VERIFIED: sandbox {rep.sandbox}, {rep.records} records, tree size {rep.tree_size}, "
          f"key id {rep.key_id[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
