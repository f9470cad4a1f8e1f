//! SHA-256 and the domain-separated hashes of the audit log.
//!
//! Every hash that commits to a structure starts with a domain string ending in a NUL byte,
//! so the bytes of one kind of record can never be taken for another kind.

use crate::canonical::{write_canonical, write_string, EncodeError};
use rampart_types::audit::{ContentRecord, Hash};
use rampart_types::SandboxId;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Domain of an event hash: `SHA-256(EVENT_DOMAIN || canonical event without "hash")`.
pub const EVENT_DOMAIN: &[u8] = b"rampart.audit.event.v1\0";
/// Domain of a sandbox's genesis value: `SHA-256(GENESIS_DOMAIN || sandbox id)`.
pub const GENESIS_DOMAIN: &[u8] = b"rampart.audit.genesis.v1\0";
/// Domain at the start of a Merkle leaf's data (a published chain head).
pub const HEAD_DOMAIN: &[u8] = b"rampart.audit.head.v1\0";
/// Domain of the message a node key signs for a tree head.
pub const TREE_HEAD_DOMAIN: &[u8] = b"rampart.audit.tree-head.v1\0";

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> Hash {
    Hash(Sha256::digest(bytes).into())
}

/// The content digest of some bytes: their plain SHA-256 (what `sha256sum` prints).
pub fn content_digest(bytes: &[u8]) -> Hash {
    sha256(bytes)
}

/// The `prev` of a sandbox's first event: `SHA-256("rampart.audit.genesis.v1\0" || id)`.
/// Each sandbox's chain starts somewhere else, so an event spliced in from another
/// sandbox's log never links.
pub fn genesis(sandbox: &SandboxId) -> Hash {
    let mut h = Sha256::new();
    h.update(GENESIS_DOMAIN);
    h.update(sandbox.as_str().as_bytes());
    Hash(h.finalize().into())
}

/// The canonical bytes an event's hash covers: the canonical JSON of the object
/// `{"auth","body","prev","sandbox","seq","time"}` (the event without its `hash` member;
/// `auth` only when the event has one).
pub fn event_canonical_bytes(
    seq: u64,
    time: &str,
    sandbox: &str,
    prev: &Hash,
    auth: Option<&Value>,
    body: &Value,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    if seq > crate::canonical::MAX_SAFE_INTEGER {
        return Err(EncodeError::IntegerOutOfRange(seq.into()));
    }
    match auth {
        Some(a) => {
            out.extend_from_slice(b"{\"auth\":");
            write_canonical(a, out)?;
            out.extend_from_slice(b",\"body\":");
        }
        None => out.extend_from_slice(b"{\"body\":"),
    }
    write_canonical(body, out)?;
    out.extend_from_slice(b",\"prev\":\"");
    let mut hex = String::with_capacity(64);
    prev.write_hex(&mut hex);
    out.extend_from_slice(hex.as_bytes());
    out.extend_from_slice(b"\",\"sandbox\":");
    write_string(sandbox, out);
    out.extend_from_slice(b",\"seq\":");
    out.extend_from_slice(seq.to_string().as_bytes());
    out.extend_from_slice(b",\"time\":");
    write_string(time, out);
    out.push(b'}');
    Ok(())
}

/// An event's hash: `SHA-256(EVENT_DOMAIN || event_canonical_bytes(..))`. `scratch` is a
/// reusable buffer (cleared first).
#[allow(clippy::too_many_arguments)]
pub fn event_hash(
    seq: u64,
    time: &str,
    sandbox: &str,
    prev: &Hash,
    auth: Option<&Value>,
    body: &Value,
    scratch: &mut Vec<u8>,
) -> Result<Hash, EncodeError> {
    scratch.clear();
    scratch.extend_from_slice(EVENT_DOMAIN);
    event_canonical_bytes(seq, time, sandbox, prev, auth, body, scratch)?;
    Ok(sha256(scratch))
}

/// Computes a [`ContentRecord`] over bytes that arrive in pieces (a process's output),
/// keeping at most `cap` bytes of them as the blob.
///
/// ```
/// # use rampart_audit::ContentHasher;
/// let mut h = ContentHasher::new(4);
/// h.update(b"hello ");
/// h.update(b"world");
/// let (record, kept) = h.finish();
/// assert_eq!(record.size, 11);
/// assert!(record.truncated);
/// assert_eq!(kept.as_deref(), Some(&b"hell"[..]));
/// ```
#[derive(Debug, Clone)]
pub struct ContentHasher {
    all: Sha256,
    size: u64,
    cap: usize,
    kept: Vec<u8>,
}

impl ContentHasher {
    /// A hasher that keeps the first `cap` bytes (0 keeps nothing).
    pub fn new(cap: usize) -> Self {
        ContentHasher {
            all: Sha256::new(),
            size: 0,
            cap,
            kept: Vec::new(),
        }
    }

    /// Feeds more bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.all.update(bytes);
        self.size += bytes.len() as u64;
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&bytes[..room.min(bytes.len())]);
    }

    /// The record, and the bytes to store as its blob (content-addressed by
    /// `record.blob`). No blob is kept for empty content or a zero cap.
    pub fn finish(self) -> (ContentRecord, Option<Vec<u8>>) {
        let digest = Hash(self.all.finalize().into());
        let truncated = self.size > self.kept.len() as u64;
        if self.kept.is_empty() {
            let record = ContentRecord {
                size: self.size,
                digest,
                blob: None,
                truncated,
            };
            return (record, None);
        }
        let blob = if truncated {
            content_digest(&self.kept)
        } else {
            digest
        };
        let record = ContentRecord {
            size: self.size,
            digest,
            blob: Some(blob),
            truncated,
        };
        (record, Some(self.kept))
    }

    /// The record of `bytes` given whole, keeping at most `cap` of them.
    pub fn record(bytes: &[u8], cap: usize) -> (ContentRecord, Option<Vec<u8>>) {
        let mut h = ContentHasher::new(cap);
        h.update(bytes);
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_empty_is_the_known_value() {
        assert_eq!(
            sha256(b"").to_hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn genesis_differs_per_sandbox() {
        let a = genesis(&SandboxId::parse("aaaa").unwrap());
        let b = genesis(&SandboxId::parse("aaab").unwrap());
        assert_ne!(a, b);
    }

    #[test]
    fn content_records() {
        let (r, kept) = ContentHasher::record(b"abc", 10);
        assert_eq!(r.digest, sha256(b"abc"));
        assert_eq!(r.blob, Some(r.digest));
        assert!(!r.truncated);
        assert_eq!(kept.unwrap(), b"abc");
        let (r, kept) = ContentHasher::record(b"", 10);
        assert_eq!((r.size, r.blob, r.truncated, kept), (0, None, false, None));
        let (r, kept) = ContentHasher::record(b"abc", 0);
        assert_eq!((r.blob, r.truncated, kept), (None, true, None));
    }
}
