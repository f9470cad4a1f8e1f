//! Lineage: a sandbox made from a snapshot or a fork's consistent point begins its record
//! where its parent's was. Its `created` event names the parent in `spec.parent`: the
//! parent's id, the seq and hash of the parent's `snapshot` event that recorded the point,
//! the snapshot's name and the digest of the saved processes (`checkpoint_digest`, on a
//! tier that keeps memory). [`verify_lineage`] checks a child's bundle against its parent's:
//! both verify, and the parent's record holds, at that seq, that hash, on a `snapshot` event
//! with that name and that digest. A chain of sandboxes is checked one link at a time.

use crate::bundle::verify_bundle;
use crate::error::VerifyError;
use crate::key::PublicKey;
use serde_json::Value;

/// Why a lineage does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineageError {
    /// The child's bundle does not verify.
    #[error("the child's bundle: {0}")]
    Child(#[source] VerifyError),
    /// The parent's bundle does not verify.
    #[error("the parent's bundle: {0}")]
    Parent(#[source] VerifyError),
    /// The child's `created` names no parent.
    #[error("the child's record names no parent (it was not made from a snapshot or a fork)")]
    NoParent,
    /// The parent's bundle is of another sandbox than the one the child names.
    #[error("the child names parent {named}, the parent's bundle is of {found}")]
    OtherSandbox {
        /// The id the child names.
        named: String,
        /// The id of the parent's bundle.
        found: String,
    },
    /// The parent's record has no event at the seq the child names.
    #[error("the parent's record has no event {seq} (it has {len})")]
    NoEvent {
        /// The seq the child names.
        seq: u64,
        /// How many events the parent's record has.
        len: usize,
    },
    /// The parent's event at that seq has another hash.
    #[error("the parent's event {seq} has hash {found}; the child names {named}")]
    Head {
        /// The seq.
        seq: u64,
        /// The hash the child names.
        named: String,
        /// The parent's event's hash.
        found: String,
    },
    /// The parent's event at that seq is not the snapshot the child names.
    #[error("the parent's event {seq} is not the snapshot {snapshot:?} (it is {found})")]
    NotTheSnapshot {
        /// The seq.
        seq: u64,
        /// The snapshot's name the child names.
        snapshot: String,
        /// What the event is.
        found: String,
    },
    /// The digest of the saved processes differs.
    #[error(
        "checkpoint digest: the child names {named}, the parent's snapshot recorded {found}",
        named = show(.named), found = show(.found)
    )]
    Digest {
        /// The digest the child names.
        named: Option<String>,
        /// The digest the parent's snapshot event recorded.
        found: Option<String>,
    },
    /// A bundle that verified but whose JSON lacks what lineage reads.
    #[error("malformed bundle: {0}")]
    Malformed(String),
}

fn show(d: &Option<String>) -> &str {
    d.as_deref().unwrap_or("none")
}

/// A lineage that holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    /// The child's id.
    pub child: String,
    /// The parent's id.
    pub parent: String,
    /// The seq of the parent's `snapshot` event.
    pub seq: u64,
    /// The snapshot's (or fork point's) name.
    pub snapshot: String,
    /// The digest of the saved processes, when the point kept them.
    pub checkpoint_digest: Option<String>,
}

impl std::fmt::Display for Lineage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LINEAGE VERIFIED: sandbox {} was made from {:?} of sandbox {} (its event {}){}",
            self.child,
            self.snapshot,
            self.parent,
            self.seq,
            match &self.checkpoint_digest {
                Some(d) => format!(", with its processes and memory ({d})"),
                None => ", its disk only".into(),
            }
        )
    }
}

/// Checks that the sandbox of bundle `child` was made from a point of the sandbox of bundle
/// `parent` (see the module's doc). Both bundles are verified first, against `trusted_key`
/// when given (both come from one node).
pub fn verify_lineage(
    child: &[u8],
    parent: &[u8],
    trusted_key: Option<&PublicKey>,
) -> Result<Lineage, LineageError> {
    verify_bundle(child, trusted_key).map_err(LineageError::Child)?;
    verify_bundle(parent, trusted_key).map_err(LineageError::Parent)?;
    let json = |b: &[u8]| -> Result<Value, LineageError> {
        serde_json::from_slice(b).map_err(|e| LineageError::Malformed(e.to_string()))
    };
    let (c, p) = (json(child)?, json(parent)?);
    let named = &c["events"][0]["body"]["spec"]["parent"];
    if !named.is_object() {
        return Err(LineageError::NoParent);
    }
    let text = |v: &Value| v.as_str().map(str::to_owned);
    let want = text(&named["sandbox"]).ok_or(LineageError::NoParent)?;
    let found = text(&p["sandbox"]).unwrap_or_default();
    if want != found {
        return Err(LineageError::OtherSandbox { named: want, found });
    }
    let seq = named["seq"]
        .as_u64()
        .ok_or_else(|| LineageError::Malformed("spec.parent.seq is not a number".into()))?;
    let events = p["events"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let event = usize::try_from(seq)
        .ok()
        .and_then(|i| events.get(i))
        .ok_or(LineageError::NoEvent {
            seq,
            len: events.len(),
        })?;
    let (head, hash) = (
        text(&named["head"]).unwrap_or_default(),
        text(&event["hash"]).unwrap_or_default(),
    );
    if head != hash {
        return Err(LineageError::Head {
            seq,
            named: head,
            found: hash,
        });
    }
    let snapshot = text(&named["snapshot"]).unwrap_or_default();
    let body = &event["body"];
    if body["type"] != "snapshot" || body["name"] != snapshot.as_str() {
        return Err(LineageError::NotTheSnapshot {
            seq,
            snapshot,
            found: body["type"].as_str().unwrap_or("unknown").to_owned(),
        });
    }
    let (named_digest, found_digest) = (
        text(&named["checkpoint_digest"]),
        text(&body["checkpoint_digest"]),
    );
    if named_digest != found_digest {
        return Err(LineageError::Digest {
            named: named_digest,
            found: found_digest,
        });
    }
    Ok(Lineage {
        child: text(&c["sandbox"]).unwrap_or_default(),
        parent: want,
        seq,
        snapshot,
        checkpoint_digest: named_digest,
    })
}
