//! The node's signed tree heads as C2SP checkpoints (`c2sp.org/tlog-checkpoint`) in signed
//! notes (`c2sp.org/signed-note`): the form transparency-log tooling (witnesses, monitors,
//! `golang.org/x/mod/sumdb/note`) reads.
//!
//! ```text
//! rampart/<first 16 hex digits of the node key id>
//! <tree size>
//! <root hash, base64>
//!
//! — rampart/<...> <base64(key hash (4 bytes) || Ed25519 signature (64 bytes))>
//! ```
//!
//! The signature is over the note's text (the three lines, each ending in a newline); the
//! key hash is the first 4 bytes of SHA-256(name || "\n" || 0x01 || public key). The tree is
//! the node log of `merkle` (RFC 6962 hashing), so an inclusion proof of a bundle checks
//! against a checkpoint's root.

use crate::key::{NodeKey, PublicKey};
use crate::Hash;
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// Ed25519's signature type byte in signed notes.
const ED25519: u8 = 0x01;

/// The note name (and checkpoint origin) of the node whose key is `key`.
pub fn origin(key: &PublicKey) -> String {
    format!("rampart/{}", &key.key_id().to_hex()[..16])
}

fn key_hash(name: &str, key: &PublicKey) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([ED25519]);
    h.update(key.to_bytes());
    let d = h.finalize();
    [d[0], d[1], d[2], d[3]]
}

/// The verifier key of the node's notes: `<name>+<key hash hex>+<base64(0x01 || key)>`.
pub fn verifier_key(key: &PublicKey) -> String {
    let name = origin(key);
    let mut raw = vec![ED25519];
    raw.extend_from_slice(&key.to_bytes());
    format!(
        "{name}+{}+{}",
        hex4(key_hash(&name, key)),
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

fn hex4(b: [u8; 4]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The checkpoint of a tree of `size` leaves with root `root`, signed by `key`.
pub fn signed(key: &NodeKey, size: u64, root: &Hash) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let name = origin(&key.public_key());
    let body = format!("{name}\n{size}\n{}\n", b64.encode(root.0));
    let mut sig = key_hash(&name, &key.public_key()).to_vec();
    sig.extend_from_slice(&key.sign_bytes(body.as_bytes()));
    format!("{body}\n\u{2014} {name} {}\n", b64.encode(sig))
}

/// Why a checkpoint note does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// No blank line between the body and the signatures.
    #[error("not a signed note: no blank line before the signatures")]
    NotSignedNote,
    /// A line after the blank line that is not `— <name> <base64>`.
    #[error("not a signature line: {line:?}")]
    SignatureLine {
        /// The line.
        line: String,
    },
    /// A signature that is not base64.
    #[error("signature: {0}")]
    SignatureBase64(#[source] base64::DecodeError),
    /// No signature line by the node's key verifies.
    #[error("no valid signature by {name}")]
    NoValidSignature {
        /// The key's name (the note's expected origin).
        name: String,
    },
    /// The first line is not the node's name.
    #[error("the origin is not the node's")]
    Origin,
    /// The second line is not a number.
    #[error("the tree size is not a number")]
    Size,
    /// The third line is not 32 bytes of base64.
    #[error("the root is not 32 bytes of base64")]
    Root,
}

/// Checks a checkpoint note against `key`: its tree size and root.
pub fn verify(note: &str, key: &PublicKey) -> Result<(u64, Hash), CheckpointError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (body, sigs) = note
        .split_once("\n\n")
        .ok_or(CheckpointError::NotSignedNote)?;
    let body = format!("{body}\n");
    let name = origin(key);
    let want = key_hash(&name, key);
    let mut ok = false;
    for line in sigs.lines() {
        let bad_line = || CheckpointError::SignatureLine { line: line.into() };
        let Some(rest) = line.strip_prefix("\u{2014} ") else {
            return Err(bad_line());
        };
        let Some((n, sig)) = rest.split_once(' ') else {
            return Err(bad_line());
        };
        let raw = b64.decode(sig).map_err(CheckpointError::SignatureBase64)?;
        if n == name && raw.len() == 68 && raw[..4] == want {
            ok = crate::key::verify_bytes(key, body.as_bytes(), &raw[4..]);
        }
    }
    if !ok {
        return Err(CheckpointError::NoValidSignature { name });
    }
    let mut lines = body.lines();
    if lines.next() != Some(name.as_str()) {
        return Err(CheckpointError::Origin);
    }
    let size = lines
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or(CheckpointError::Size)?;
    let root = lines
        .next()
        .and_then(|l| b64.decode(l).ok())
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or(CheckpointError::Root)?;
    Ok((size, Hash(root)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_verifies_and_a_changed_one_does_not() {
        let key = NodeKey::generate();
        let root = crate::hash::sha256(b"root");
        let note = signed(&key, 42, &root);
        assert!(
            note.contains("\n42\n") && note.contains("\n\n\u{2014} rampart/"),
            "{note}"
        );
        assert_eq!(verify(&note, &key.public_key()).unwrap(), (42, root));
        let changed = note.replacen("\n42\n", "\n43\n", 1);
        assert!(verify(&changed, &key.public_key()).is_err());
        let other = NodeKey::generate();
        assert!(verify(&note, &other.public_key()).is_err());
        let vkey = verifier_key(&key.public_key());
        let parts: Vec<&str> = vkey.splitn(3, '+').collect();
        assert_eq!(parts[0], origin(&key.public_key()));
        assert!(parts[1].len() == 8 && parts[2].len() == 44, "{vkey}");
    }
}
