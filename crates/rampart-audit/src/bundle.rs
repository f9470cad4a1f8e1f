//! Audit bundles: one self-contained file per sandbox, verifiable offline.

use crate::chain::{ChainVerifier, RawEvent};
use crate::error::VerifyError;
use crate::hash::{content_digest, genesis};
use crate::key::{PublicKey, SignedTreeHead};
use crate::merkle::{verify_inclusion, HeadLeaf};
use crate::report::{Activity, Report};
use base64::Engine as _;
use rampart_types::audit::{ContentRecord, Event, EventBody, Hash};
use rampart_types::SandboxId;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::{BTreeMap, BTreeSet};

/// The `format` of the bundles this crate writes and reads.
pub const BUNDLE_FORMAT: &str = "rampart.audit.bundle.v1";

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Where a bundle's chain sits in the node's signed Merkle log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Anchor {
    /// Index of the chain-head leaf in the node's log.
    pub leaf_index: u64,
    /// The chain length that leaf publishes (must be the number of events).
    pub chain_length: u64,
    /// The chain head that leaf publishes (must be the last event's hash).
    pub chain_head: Hash,
    /// Inclusion proof of the leaf in the tree of the bundle's signed tree head.
    pub inclusion_proof: Vec<Hash>,
}

/// A bundle, as written. See `docs/proof.md` for the file format.
#[derive(Debug, Clone, PartialEq)]
pub struct Bundle {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The node's public key.
    pub public_key: PublicKey,
    /// The signed tree head the anchor proves inclusion in.
    pub tree_head: SignedTreeHead,
    /// The chain head's leaf and its inclusion proof.
    pub anchor: Anchor,
    /// The whole log, from seq 0.
    pub events: Vec<Event>,
    /// Blobs by content digest (SHA-256 of the bytes).
    pub blobs: BTreeMap<Hash, Vec<u8>>,
}

impl Bundle {
    /// Assembles a bundle. The anchor's chain length and head are taken from `events`
    /// (genesis for an empty log); the caller gives the leaf index where that head was
    /// published, the inclusion proof of that leaf in `tree_head`'s tree, and the blobs
    /// (see [`referenced_blobs`]; blobs are filed under their own digest).
    ///
    /// For the bundle to verify, the leaf `(sandbox, events.len(), last hash)` must have been
    /// appended to the node log at `leaf_index` before `tree_head` was signed: export
    /// publishes the sandbox's current head first.
    pub fn assemble(
        sandbox: SandboxId,
        events: Vec<Event>,
        blobs: impl IntoIterator<Item = Vec<u8>>,
        leaf_index: u64,
        inclusion_proof: Vec<Hash>,
        tree_head: SignedTreeHead,
        public_key: PublicKey,
    ) -> Bundle {
        let chain_head = events
            .last()
            .map(|e| e.hash)
            .unwrap_or_else(|| genesis(&sandbox));
        let anchor = Anchor {
            leaf_index,
            chain_length: events.len() as u64,
            chain_head,
            inclusion_proof,
        };
        let blobs = blobs.into_iter().map(|b| (content_digest(&b), b)).collect();
        Bundle {
            sandbox,
            public_key,
            tree_head,
            anchor,
            events,
            blobs,
        }
    }

    /// The bundle's chain-head leaf.
    pub fn leaf(&self) -> HeadLeaf {
        HeadLeaf {
            sandbox: self.sandbox.clone(),
            length: self.anchor.chain_length,
            head: self.anchor.chain_head,
        }
    }

    /// The bundle file: JSON, one event per line.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.events.len() * 400);
        let put = |out: &mut Vec<u8>, v: &dyn erased::Ser| v.write(out);
        out.extend_from_slice(b"{\"format\":");
        put(&mut out, &BUNDLE_FORMAT);
        out.extend_from_slice(b",\n\"sandbox\":");
        put(&mut out, &self.sandbox);
        out.extend_from_slice(b",\n\"public_key\":");
        put(&mut out, &self.public_key);
        out.extend_from_slice(b",\n\"tree_head\":");
        put(&mut out, &self.tree_head);
        out.extend_from_slice(b",\n\"anchor\":");
        put(&mut out, &self.anchor);
        out.extend_from_slice(b",\n\"events\":[");
        for (i, e) in self.events.iter().enumerate() {
            out.extend_from_slice(if i == 0 { b"\n" } else { b",\n" });
            put(&mut out, e);
        }
        out.extend_from_slice(b"\n],\n\"blobs\":{");
        for (i, (digest, bytes)) in self.blobs.iter().enumerate() {
            out.extend_from_slice(if i == 0 { b"\n\"" } else { b",\n\"" });
            out.extend_from_slice(digest.to_hex().as_bytes());
            out.extend_from_slice(b"\":\"");
            out.extend_from_slice(B64.encode(bytes).as_bytes());
            out.push(b'"');
        }
        out.extend_from_slice(b"\n}}\n");
        out
    }
}

mod erased {
    /// Writes a serializable value as compact JSON (these types cannot fail to serialize:
    /// no maps with non-string keys, no floats).
    pub trait Ser {
        fn write(&self, out: &mut Vec<u8>);
    }
    impl<T: serde::Serialize + ?Sized> Ser for T {
        fn write(&self, out: &mut Vec<u8>) {
            if serde_json::to_writer(&mut *out, self).is_err() {
                out.extend_from_slice(b"null");
            }
        }
    }
}

/// Reads only the `seq` of a raw record (to tell a missing record from a reordered one).
fn seq_of(r: &RawValue) -> Option<u64> {
    #[derive(Deserialize)]
    struct Seq {
        seq: u64,
    }
    serde_json::from_str::<Seq>(r.get()).ok().map(|s| s.seq)
}

/// The content digests of every blob the events refer to (what an exporter should put in
/// the bundle), artifacts included.
pub fn referenced_blobs(events: &[Event]) -> BTreeSet<Hash> {
    let mut set = BTreeSet::new();
    for e in events {
        for (_, r) in content_records(&e.body) {
            if let Some(b) = r.blob {
                set.insert(b);
            }
        }
        for r in artifact_records(&e.body) {
            set.insert(r.digest);
        }
    }
    set
}

/// The files `destroyed.artifacts` lists, as content records: each kept whole, its blob
/// named by its digest.
pub(crate) fn artifact_records(body: &EventBody) -> Vec<ContentRecord> {
    match body {
        EventBody::Destroyed(d) => d
            .artifacts
            .iter()
            .flat_map(|a| &a.files)
            .map(|f| ContentRecord {
                size: f.size,
                digest: f.digest,
                blob: Some(f.digest),
                truncated: false,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The content records of a body, with their names.
pub(crate) fn content_records(body: &EventBody) -> Vec<(&'static str, &ContentRecord)> {
    let mut v = Vec::new();
    match body {
        EventBody::Exec(x) => {
            if let Some(r) = &x.input {
                v.push(("input", r));
            }
        }
        EventBody::Exit(x) => {
            v.push(("stdout", &x.stdout));
            v.push(("stderr", &x.stderr));
            if let Some(r) = &x.streamed_input {
                v.push(("streamed_input", r));
            }
        }
        EventBody::Desktop(d) => {
            if let Some(r) = &d.image {
                v.push(("image", r));
            }
        }
        _ => {}
    }
    v
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BundleIn<'a> {
    format: String,
    sandbox: String,
    public_key: String,
    tree_head: SignedTreeHead,
    anchor: Anchor,
    #[serde(borrow)]
    events: Vec<&'a RawValue>,
    #[serde(deserialize_with = "unique_map")]
    blobs: BTreeMap<String, String>,
}

/// A string map that refuses a name given twice (two readers could keep different ones).
fn unique_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of strings")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Self::Value, A::Error> {
            let mut m = BTreeMap::new();
            while let Some((k, v)) = a.next_entry::<String, String>()? {
                if m.contains_key(&k) {
                    return Err(serde::de::Error::custom(format!("duplicate blob {k:?}")));
                }
                m.insert(k, v);
            }
            Ok(m)
        }
    }
    d.deserialize_map(V)
}

/// Verifies a bundle file, offline. With `trusted_key`, the bundle must be signed by that
/// key; without, the bundle's own key is used and the report warns that it is not pinned.
///
/// Checks, in order (the first failure is returned): the format; the key (pinned, matches
/// the tree head's key id); the tree head's signature; every event (position, sandbox,
/// seq, time, link, hash, body type and shape), naming the first bad one; the chain length
/// and head against the signed leaf (truncation, extra events); the leaf's inclusion proof
/// against the signed root; every blob against its digest, and every content record
/// against its blob.
pub fn verify_bundle(bytes: &[u8], trusted_key: Option<&PublicKey>) -> Result<Report, VerifyError> {
    let b: BundleIn<'_> =
        serde_json::from_slice(bytes).map_err(|e| VerifyError::Malformed(e.to_string()))?;
    if b.format != BUNDLE_FORMAT {
        return Err(VerifyError::UnsupportedFormat(b.format));
    }
    let sandbox = SandboxId::parse(&b.sandbox)
        .map_err(|e| VerifyError::Malformed(format!("sandbox {:?}: {e}", b.sandbox)))?;
    let key = PublicKey::parse(&b.public_key)?;
    let mut warnings = Vec::new();
    match trusted_key {
        Some(t) if *t != key => {
            return Err(VerifyError::UntrustedKey {
                found: key.key_id(),
                trusted: t.key_id(),
            })
        }
        Some(_) => {}
        None => warnings.push(format!(
            "key not pinned: the bundle verifies against its own key {} (id {}); pass the node's \
             published key to know who signed it",
            key,
            key.key_id().short()
        )),
    }
    b.tree_head.verify(&key)?;

    // The log, one record at a time; what is kept of each is its content records and its
    // line in the activity summary.
    let mut chain = ChainVerifier::new(sandbox.clone());
    let mut records: Vec<(u64, &'static str, ContentRecord)> = Vec::new();
    let mut activity = Activity::default();
    for (i, r) in b.events.iter().enumerate() {
        let e: RawEvent = serde_json::from_str(r.get()).map_err(|err| VerifyError::BadRecord {
            position: i as u64,
            reason: err.to_string(),
        })?;
        let later = &b.events[i + 1..];
        let body = chain.check(&e, |seq| later.iter().any(|r| seq_of(r) == Some(seq)))?;
        for (name, rec) in content_records(&body) {
            records.push((e.seq, name, rec.clone()));
        }
        for rec in artifact_records(&body) {
            records.push((e.seq, "artifact", rec));
        }
        activity.push(e.seq, &e.time, &body);
    }
    let summary = chain.finish();
    for seq in &summary.time_regressions {
        warnings.push(format!(
            "record seq {seq} is timed before the record before it"
        ));
    }

    // The anchor.
    let found = summary.length;
    let last = found.checked_sub(1);
    if b.anchor.chain_length > found {
        return Err(VerifyError::Truncated {
            seq: last,
            expected: b.anchor.chain_length,
            found,
        });
    }
    if b.anchor.chain_length < found {
        return Err(VerifyError::Unanchored {
            seq: b.anchor.chain_length,
            expected: b.anchor.chain_length,
        });
    }
    if b.anchor.chain_head != summary.head {
        return Err(VerifyError::HeadMismatch { seq: last });
    }
    let leaf = HeadLeaf {
        sandbox: sandbox.clone(),
        length: found,
        head: summary.head,
    };
    verify_inclusion(
        &leaf.hash(),
        b.anchor.leaf_index,
        b.tree_head.tree_size,
        &b.anchor.inclusion_proof,
        &b.tree_head.root_hash,
    )?;

    // The blobs.
    let mut first_use: BTreeMap<Hash, u64> = BTreeMap::new();
    for (seq, _, r) in &records {
        if let Some(d) = r.blob {
            first_use.entry(d).or_insert(*seq);
        }
    }
    let mut blobs: BTreeMap<Hash, Vec<u8>> = BTreeMap::new();
    for (k, v) in &b.blobs {
        let digest = Hash::parse(k).map_err(|e| VerifyError::BadBlob {
            key: k.clone(),
            reason: e.to_string(),
        })?;
        let data = B64.decode(v).map_err(|e| VerifyError::BadBlob {
            key: k.clone(),
            reason: e.to_string(),
        })?;
        if content_digest(&data) != digest {
            return Err(VerifyError::BlobMismatch {
                digest,
                seq: first_use.get(&digest).copied(),
            });
        }
        blobs.insert(digest, data);
    }
    let mut missing = 0u64;
    for (seq, name, r) in &records {
        check_content(*seq, name, r, &blobs, &mut missing)?;
    }
    if missing > 0 {
        warnings.push(format!(
            "{missing} referenced blob(s) are not in the bundle: only their digests are known"
        ));
    }
    let unused = blobs.keys().filter(|d| !first_use.contains_key(d)).count();
    if unused > 0 {
        warnings.push(format!(
            "{unused} blob(s) in the bundle are not referenced by any record"
        ));
    }

    Ok(Report {
        sandbox,
        events: found,
        chain_head: summary.head,
        first_time: summary.first_time,
        last_time: summary.last_time,
        leaf_index: b.anchor.leaf_index,
        tree_size: b.tree_head.tree_size,
        tree_root: b.tree_head.root_hash,
        signed_at: b.tree_head.timestamp.clone(),
        key,
        key_pinned: trusted_key.is_some(),
        blobs_verified: blobs.len() as u64,
        warnings,
        activity,
    })
}

fn check_content(
    seq: u64,
    name: &str,
    r: &ContentRecord,
    blobs: &BTreeMap<Hash, Vec<u8>>,
    missing: &mut u64,
) -> Result<(), VerifyError> {
    let bad = |reason: String| VerifyError::BadContent {
        seq,
        reason: format!("{name}: {reason}"),
    };
    if r.size == 0 && r.digest != content_digest(b"") {
        return Err(bad(
            "empty content with a digest that is not SHA-256 of nothing".into(),
        ));
    }
    let Some(blob) = r.blob else { return Ok(()) };
    if !r.truncated && blob != r.digest {
        return Err(bad(
            "the blob is not the whole content but it is not marked truncated".into(),
        ));
    }
    match blobs.get(&blob) {
        None => *missing += 1,
        Some(data) => {
            let len = data.len() as u64;
            if (!r.truncated && len != r.size) || (r.truncated && len >= r.size) {
                return Err(bad(format!(
                    "the blob has {len} bytes, which does not fit a size of {} (truncated: {})",
                    r.size, r.truncated
                )));
            }
        }
    }
    Ok(())
}
