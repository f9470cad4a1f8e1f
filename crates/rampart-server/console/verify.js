// Verification of a sandbox's audit bundle in the browser (docs/proof.md), with the
// browser's own SHA-256 and Ed25519 (WebCrypto): the hash chain, the blobs, the anchor, the
// inclusion proof in the signed tree head, the key id and the signature, and that a
// `destroyed` record's `manifest_digest` names an `fs_diff` record before it. The same
// checks as the Python SDK's `rampart.verify.verify_bundle`; the console fetches the bundle
// and the node key from the daemon, and this code decides.
"use strict";

const RampartVerify = (() => {
  const enc = new TextEncoder();

  class VerificationError extends Error {}

  const fail = (msg) => {
    throw new VerificationError(msg);
  };

  function hex(bytes) {
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function unhex(text, what) {
    if (typeof text !== "string" || text.length % 2 || /[^0-9a-fA-F]/.test(text)) {
      fail(`${what} is not hex`);
    }
    const out = new Uint8Array(text.length / 2);
    for (let i = 0; i < out.length; i++) out[i] = parseInt(text.substr(i * 2, 2), 16);
    return out;
  }

  function concat(...parts) {
    const n = parts.reduce((a, p) => a + p.length, 0);
    const out = new Uint8Array(n);
    let o = 0;
    for (const p of parts) {
      out.set(p, o);
      o += p.length;
    }
    return out;
  }

  const equal = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

  async function sha256(bytes) {
    return new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  }

  // The canonical JSON of what the node signs (RFC 8785 for strings, integers, arrays and
  // objects; the bundle holds no floating-point numbers).
  function canonical(v) {
    if (v === null) return "null";
    if (v === true) return "true";
    if (v === false) return "false";
    if (typeof v === "number") {
      if (!Number.isSafeInteger(v)) fail("a number that is not a safe integer");
      return String(v);
    }
    if (typeof v === "string") return JSON.stringify(v);
    if (Array.isArray(v)) return "[" + v.map(canonical).join(",") + "]";
    if (typeof v === "object") {
      // Keys in UTF-16 code unit order, which is what Array.prototype.sort compares.
      const keys = Object.keys(v).sort();
      return "{" + keys.map((k) => JSON.stringify(k) + ":" + canonical(v[k])).join(",") + "}";
    }
    fail("an unexpected JSON value");
  }

  function pick(obj, keys) {
    const out = {};
    for (const k of keys) {
      if (!(k in obj)) fail(`missing member ${k}`);
      out[k] = obj[k];
    }
    return out;
  }

  const node = (l, r) => sha256(concat(Uint8Array.of(1), l, r));

  // Whether the principal a record names may run commands: a native key's scopes (the last
  // " (a,b)" group of "key:<id>:<name> (scopes) ...") hold exec or admin; the socket, E2B
  // keys and the node itself may.
  function mayExec(caller) {
    if (!caller.startsWith("key:")) return true;
    const groups = [...caller.matchAll(/ \(([a-z,]+)\)/g)];
    if (!groups.length) return false;
    return groups[groups.length - 1][1].split(",").some((s) => s === "exec" || s === "admin");
  }

  // Why a `package` record does not hold together, or null (as the Rust and Python
  // verifiers judge it).
  const PACKAGE_MEMBERS = ["ecosystem", "name", "path", "registry", "rule", "sha256", "size", "type", "verdict", "version"];
  function packageProblem(body) {
    const keys = Object.keys(body).sort();
    if (keys.join(",") !== PACKAGE_MEMBERS.join(",")) return `package members ${keys.join(",")}`;
    if (!["pypi", "npm", "debian", "crates"].includes(body.ecosystem)) {
      return `package of unknown ecosystem ${JSON.stringify(body.ecosystem)}`;
    }
    for (const k of ["name", "version", "registry", "path", "rule"]) {
      if (typeof body[k] !== "string" || !body[k]) return `package without a ${k}`;
    }
    if (!body.path.startsWith("/")) return "package path is not absolute";
    const { sha256, size, rule } = body;
    if (body.verdict === "allowed") {
      if (typeof sha256 !== "string" || !/^[0-9a-f]{64}$/.test(sha256)) return "an allowed package without its sha256";
      if (!Number.isSafeInteger(size) || size < 0) return "an allowed package without its size";
      if (rule !== "package" && !rule.startsWith("pinned:")) return `an allowed package under rule ${JSON.stringify(rule)}`;
    } else if (body.verdict === "denied") {
      if (sha256 !== null || size !== null) return "a denied package with a digest or size";
      if (rule !== "unpinned" && !rule.startsWith("package-deny:")) return `a denied package under rule ${JSON.stringify(rule)}`;
    } else {
      return `package verdict ${JSON.stringify(body.verdict)}`;
    }
    return null;
  }

  // RFC 9162 inclusion proof.
  async function inclusion(leaf, index, size, proof, root) {
    if (index >= size) return false;
    let fn = index;
    let sn = size - 1;
    let r = leaf;
    for (const p of proof) {
      if (sn === 0) return false;
      if (fn % 2 === 1 || fn === sn) {
        r = await node(p, r);
        while (fn % 2 === 0 && fn !== 0) {
          fn = Math.floor(fn / 2);
          sn = Math.floor(sn / 2);
        }
      } else {
        r = await node(r, p);
      }
      fn = Math.floor(fn / 2);
      sn = Math.floor(sn / 2);
    }
    return sn === 0 && equal(r, root);
  }

  function keyBytes(text) {
    const b = unhex(String(text).trim().replace(/^ed25519:/, ""), "the public key");
    if (b.length !== 32) fail("the public key is not 32 bytes");
    return b;
  }

  async function ed25519(pub, msg, sig) {
    const key = await crypto.subtle.importKey("raw", pub, { name: "Ed25519" }, false, ["verify"]);
    return crypto.subtle.verify({ name: "Ed25519" }, key, sig, msg);
  }

  function b64(text) {
    const bin = atob(text);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function u64be(n) {
    const out = new Uint8Array(8);
    let x = BigInt(n);
    for (let i = 7; i >= 0; i--) {
      out[i] = Number(x & 0xffn);
      x >>= 8n;
    }
    return out;
  }

  // Verifies `text` (the bundle's JSON); `trustedKey` (`ed25519:<hex>`) pins the signer.
  // Resolves to {sandbox, records, treeSize, keyId}; rejects with VerificationError naming
  // the first thing that is wrong.
  async function verifyBundle(text, trustedKey) {
    let b;
    try {
      b = JSON.parse(text);
    } catch (e) {
      fail(`not JSON: ${e.message}`);
    }
    if (!b || b.format !== "rampart.audit.bundle.v1") fail("not a Rampart audit bundle");
    try {
      return await check(b, trustedKey);
    } catch (e) {
      if (e instanceof VerificationError) throw e;
      throw new VerificationError(`malformed bundle: ${e.message}`);
    }
  }

  async function check(b, trustedKey) {
    const sandbox = b.sandbox;
    const pub = keyBytes(b.public_key);
    const keyId = await sha256(pub);
    if (trustedKey && !equal(keyBytes(trustedKey), pub)) {
      fail("the bundle is not signed by the node's key");
    }
    const sth = b.tree_head;
    if (!equal(unhex(sth.key_id, "the tree head's key id"), keyId)) {
      fail("the tree head names another key");
    }
    const msg = concat(
      enc.encode("rampart.audit.tree-head.v1\0"),
      enc.encode(canonical(pick(sth, ["key_id", "root_hash", "timestamp", "tree_size"]))),
    );
    const sig = unhex(sth.signature, "the signature");
    if (sig.length !== 64) fail("the signature is not 64 bytes");
    if (!(await ed25519(pub, msg, sig))) fail("the tree head's signature does not verify");
    let head = await sha256(concat(enc.encode("rampart.audit.genesis.v1\0"), enc.encode(sandbox)));
    const fsDiffs = new Set();
    const used = new Map();
    const artifactSizes = new Map();
    const requested = new Map();
    const approved = new Set();
    const askedHosts = new Map();
    let approvalsPolicy = null;
    let networkPolicy = null;
    let inForce = null;
    for (const [i, e] of b.events.entries()) {
      if (e.sandbox !== sandbox) fail(`record ${i} belongs to another sandbox`);
      if (e.seq !== i) fail(`record at position ${i} has seq ${e.seq}`);
      if (!equal(unhex(e.prev, "prev"), head)) {
        fail(`record seq ${i} does not link to the one before it`);
      }
      const signed = pick(e, ["body", "prev", "sandbox", "seq", "time"]);
      if ("auth" in e) {
        if (!e.auth || typeof e.auth !== "object") fail(`record seq ${i}: auth is absent or an object, never ${e.auth}`);
        signed.auth = e.auth;
      }
      const h = await sha256(concat(enc.encode("rampart.audit.event.v1\0"), enc.encode(canonical(signed))));
      if (hex(h) !== e.hash) fail(`record seq ${i}: its content does not match its hash`);
      head = h;
      const body = e.body || {};
      // The policy in force, as the record puts it: the create request's approvals and
      // the network policy (then each policy_changed); each event's auth names its digest.
      if (body.type === "created") {
        approvalsPolicy = (body.spec && "approvals" in body.spec) ? body.spec.approvals : null;
        networkPolicy = "policy" in body ? body.policy : null;
        inForce = null;
      } else if (body.type === "policy_changed") {
        networkPolicy = body.policy;
        inForce = null;
      }
      if ("auth" in e) {
        if (inForce === null) {
          inForce = hex(await sha256(enc.encode(canonical({ approvals: approvalsPolicy, network: networkPolicy }))));
        }
        if (e.auth.policy !== inForce) {
          fail(`record seq ${i}: names policy ${e.auth.policy}, but the policy the record puts in force is ${inForce}`);
        }
        if (body.type === "exec" && !mayExec(e.auth.principal || "")) {
          fail(`record seq ${i}: done for ${e.auth.principal}, whose scopes hold neither exec nor admin`);
        }
      }
      if (body.type === "fs_diff") {
        fsDiffs.add(hex(h));
      } else if (body.type === "destroyed") {
        if (!("manifest_digest" in body)) fail(`record seq ${i}: destroyed without manifest_digest`);
        const m = body.manifest_digest;
        if (m !== null && !fsDiffs.has(m)) {
          fail(`record seq ${i}: manifest_digest ${m} names no fs_diff record before it`);
        }
        // `artifacts`: absent, or the files kept, each blob named by its digest.
        if ("artifacts" in body) {
          const arts = body.artifacts;
          if (!arts || typeof arts !== "object" || !Array.isArray(arts.files)) {
            fail(`record seq ${i}: artifacts is not an object with files`);
          }
          for (const f of arts.files) {
            if (typeof f.digest !== "string" || !/^[0-9a-f]{64}$/.test(f.digest)) {
              fail(`record seq ${i}: artifact ${f.path} has a digest that is not 64 lowercase hex digits`);
            }
            artifactSizes.set(f.digest, f.size);
            if (!used.has(f.digest)) used.set(f.digest, i);
          }
        }
      }
      if (body.type === "approval_requested") {
        requested.set(body.approval_id, body.digest);
        if (body.kind === "host") askedHosts.set(body.approval_id, body.request);
      } else if (body.type === "network") {
        const rule = body.detail && body.detail.rule;
        if (typeof rule === "string" && rule.startsWith("approved:")) {
          const a = rule.slice("approved:".length);
          const here = `${body.host}:${body.port || 0}`;
          if (!approved.has(a) || askedHosts.get(a) !== here) {
            fail(`record seq ${i}: a connection to ${here} let through under approval ${a}, which no record before it approved for that host`);
          }
        }
      } else if (body.type === "approval_decided") {
        if (!requested.has(body.approval_id)) {
          fail(`record seq ${i}: decides approval ${body.approval_id} that no approval_requested before it asked for`);
        }
        if (requested.get(body.approval_id) !== body.digest) {
          fail(`record seq ${i}: decides approval ${body.approval_id} on another request than was asked`);
        }
        if (body.decision === "approved") approved.add(body.approval_id);
      } else if (body.type === "package") {
        const why = packageProblem(body);
        if (why) fail(`record seq ${i}: ${why}`);
      } else if (body.type === "exec") {
        if ("caller" in body && !mayExec(body.caller)) {
          fail(`record seq ${i}: asked by ${body.caller}, whose scopes hold neither exec nor admin`);
        }
        if ("approval" in body && !approved.has(body.approval)) {
          fail(`record seq ${i}: runs under approval ${body.approval}, which no record before it approved`);
        }
      }
      for (const name of ["input", "stdout", "stderr", "streamed_input", "image"]) {
        const rec = body[name];
        if (rec && typeof rec === "object" && rec.blob && !used.has(rec.blob)) used.set(rec.blob, i);
      }
    }
    const a = b.anchor;
    const n = b.events.length;
    if (a.chain_length !== n) {
      fail(`the signed head covers ${a.chain_length} records, the bundle has ${n}`);
    }
    if (!equal(unhex(a.chain_head, "the chain head"), head)) {
      fail("the log's head is not the signed chain head");
    }
    const sid = enc.encode(sandbox);
    const leafData = concat(
      enc.encode("rampart.audit.head.v1\0"),
      Uint8Array.of(sid.length),
      sid,
      u64be(n),
      head,
    );
    const leaf = await sha256(concat(Uint8Array.of(0), leafData));
    const proof = a.inclusion_proof.map((p) => unhex(p, "a proof hash"));
    if (!(await inclusion(leaf, a.leaf_index, sth.tree_size, proof, unhex(sth.root_hash, "the root")))) {
      fail("the chain head is not in the signed tree");
    }
    for (const [digest, data] of Object.entries(b.blobs || {})) {
      const raw = b64(data);
      if (hex(await sha256(raw)) !== digest) {
        fail(`blob ${digest} (record seq ${used.get(digest)}) does not match its digest`);
      }
      if (artifactSizes.has(digest) && raw.length !== artifactSizes.get(digest)) {
        fail(`artifact blob ${digest} (record seq ${used.get(digest)}) has ${raw.length} bytes, not the ${artifactSizes.get(digest)} listed`);
      }
    }
    return { sandbox, records: n, treeSize: sth.tree_size, keyId: hex(keyId) };
  }

  return { verifyBundle, VerificationError, canonical, packageProblem };
})();
