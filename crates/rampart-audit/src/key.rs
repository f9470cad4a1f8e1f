//! The node key (Ed25519) and signed tree heads.

use crate::canonical::write_string;
use crate::error::VerifyError;
use crate::hash::{sha256, TREE_HEAD_DOMAIN};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use rampart_types::audit::Hash;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// First line of a node key file.
const KEY_FILE_HEADER: &str = "rampart-node-key v1 ed25519";

/// Errors of loading or creating a node key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// the node key file cannot be read or written
    #[error("node key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// the node key file is readable by others than its owner
    #[error("node key file {path} has mode {mode:o}; it must not be readable by group or others (chmod 600)")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// the node key file belongs to another user
    #[error("node key file {path} belongs to uid {uid}, not to this process's user")]
    Owner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
    },
    /// the node key file is not in the expected format
    #[error("node key file {0} is not in the expected format")]
    Format(PathBuf),
}

/// A node's public key. Written `ed25519:<64 hex digits>`; its id is the SHA-256 of the
/// 32 raw key bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    /// The raw 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// A key from its raw 32 bytes (refuses points that are not valid keys).
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, VerifyError> {
        VerifyingKey::from_bytes(bytes)
            .map(PublicKey)
            .map_err(|e| VerifyError::BadKey(e.to_string()))
    }

    /// Parses `ed25519:<hex>` (or the bare 64 hex digits).
    pub fn parse(s: &str) -> Result<Self, VerifyError> {
        let hex = s.trim().strip_prefix("ed25519:").unwrap_or(s.trim());
        let h = Hash::parse(hex).map_err(|_| {
            VerifyError::BadKey("expected ed25519:<64 lowercase hex digits>".into())
        })?;
        PublicKey::from_bytes(&h.0)
    }

    /// The key id: SHA-256 of the raw key bytes.
    pub fn key_id(&self) -> Hash {
        sha256(self.0.as_bytes())
    }

    /// Checks `signature` over `message`, strictly (no malleable or weak-key signatures).
    pub(crate) fn verify(&self, message: &[u8], signature: &Signature) -> bool {
        self.0.verify_strict(message, signature).is_ok()
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ed25519:{}", Hash(self.to_bytes()))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl std::str::FromStr for PublicKey {
    type Err = VerifyError;
    fn from_str(s: &str) -> Result<Self, VerifyError> {
        PublicKey::parse(s)
    }
}

impl Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PublicKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A node's signing key. Its `Debug` shows only the key id.
pub struct NodeKey {
    signing: SigningKey,
}

impl fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeKey(id {})", self.public_key().key_id())
    }
}

impl NodeKey {
    /// A fresh random key (from the operating system's generator).
    pub fn generate() -> Self {
        NodeKey {
            signing: SigningKey::generate(&mut rand::rngs::OsRng),
        }
    }

    /// A key from a 32-byte seed (for tests and tools).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        NodeKey {
            signing: SigningKey::from_bytes(seed),
        }
    }

    /// Loads the key at `path`. Refuses a file that group or others can read, or that
    /// another user owns.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let io_err = |source| KeyError::Io {
            path: path.to_owned(),
            source,
        };
        let meta = fs::metadata(path).map_err(io_err)?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions {
                path: path.to_owned(),
                mode,
            });
        }
        // SAFETY: geteuid takes no arguments, touches no memory and always succeeds.
        let euid = unsafe { libc::geteuid() };
        if meta.uid() != euid {
            return Err(KeyError::Owner {
                path: path.to_owned(),
                uid: meta.uid(),
            });
        }
        let text = fs::read_to_string(path).map_err(io_err)?;
        let mut lines = text.lines();
        if lines.next() != Some(KEY_FILE_HEADER) {
            return Err(KeyError::Format(path.to_owned()));
        }
        let seed = lines
            .next()
            .and_then(|l| Hash::parse(l.trim()).ok())
            .ok_or_else(|| KeyError::Format(path.to_owned()))?;
        if lines.any(|l| !l.trim().is_empty()) {
            return Err(KeyError::Format(path.to_owned()));
        }
        Ok(NodeKey::from_seed(&seed.0))
    }

    /// Loads the key at `path`, or makes one there if there is none.
    ///
    /// A new key is written to a temporary file created with `O_CREAT|O_EXCL` and mode
    /// 0600 (never readable by others, not even for a moment), synced, then linked to
    /// `path` (which fails if another process got there first: its key is then loaded).
    /// The directory must exist.
    pub fn load_or_create(path: &Path) -> Result<Self, KeyError> {
        match NodeKey::load(path) {
            Err(KeyError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
            other => return other,
        }
        let io_err = |source| KeyError::Io {
            path: path.to_owned(),
            source,
        };
        let key = NodeKey::generate();
        let name = path
            .file_name()
            .ok_or_else(|| KeyError::Format(path.to_owned()))?;
        let tmp = path.with_file_name(format!(
            ".{}.{}.{:016x}.tmp",
            name.to_string_lossy(),
            std::process::id(),
            rand::random::<u64>()
        ));
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            let seed = Hash(key.signing.to_bytes());
            f.write_all(format!("{KEY_FILE_HEADER}\n{seed}\n").as_bytes())?;
            f.sync_all()
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(e));
        }
        let linked = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    fs::File::open(dir)
                        .and_then(|d| d.sync_all())
                        .map_err(io_err)?;
                }
                Ok(key)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => NodeKey::load(path),
            Err(e) => Err(io_err(e)),
        }
    }

    /// The public half.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.signing.verifying_key())
    }

    /// The public key's id.
    pub fn key_id(&self) -> Hash {
        self.public_key().key_id()
    }

    /// Signs `message` as it is (for formats that carry their own domain separation, as
    /// DSSE's pre-authentication encoding does): the 64 signature bytes.
    pub fn sign_bytes(&self, message: &[u8]) -> [u8; 64] {
        self.signing.sign(message).to_bytes()
    }

    /// Signs `message` (which starts with its own domain string); the signature in hex.
    pub fn sign_hex(&self, message: &[u8]) -> String {
        let sig = self.signing.sign(message);
        sig.to_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Signs a tree head of `tree_size` leaves with root `root_hash` at `timestamp` (an
    /// audit timestamp, see [`crate::now`]).
    pub fn sign_tree_head(
        &self,
        tree_size: u64,
        root_hash: Hash,
        timestamp: String,
    ) -> SignedTreeHead {
        let mut sth = SignedTreeHead {
            tree_size,
            root_hash,
            timestamp,
            key_id: self.key_id(),
            signature: String::new(),
        };
        let sig = self.signing.sign(&sth.signed_message());
        sth.signature = sig.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
        sth
    }
}

/// A signed tree head: the node's statement "my Merkle log of chain heads had `tree_size`
/// leaves and root `root_hash` at `timestamp`".
///
/// Signed message: `"rampart.audit.tree-head.v1\0" ||` the canonical JSON of
/// `{"key_id","root_hash","timestamp","tree_size"}`. `signature` is the 64-byte Ed25519
/// signature in hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedTreeHead {
    /// Number of leaves.
    pub tree_size: u64,
    /// The Merkle root of those leaves.
    pub root_hash: Hash,
    /// When it was signed (audit timestamp).
    pub timestamp: String,
    /// The id of the key that signed it.
    pub key_id: Hash,
    /// Ed25519 signature, 128 hex digits.
    pub signature: String,
}

impl SignedTreeHead {
    /// The bytes the signature covers.
    pub fn signed_message(&self) -> Vec<u8> {
        let mut m = Vec::with_capacity(256);
        m.extend_from_slice(TREE_HEAD_DOMAIN);
        m.extend_from_slice(b"{\"key_id\":\"");
        m.extend_from_slice(self.key_id.to_hex().as_bytes());
        m.extend_from_slice(b"\",\"root_hash\":\"");
        m.extend_from_slice(self.root_hash.to_hex().as_bytes());
        m.extend_from_slice(b"\",\"timestamp\":");
        write_string(&self.timestamp, &mut m);
        m.extend_from_slice(b",\"tree_size\":");
        m.extend_from_slice(self.tree_size.to_string().as_bytes());
        m.push(b'}');
        m
    }

    /// Checks that `key` signed this tree head (key id and signature).
    pub fn verify(&self, key: &PublicKey) -> Result<(), VerifyError> {
        if self.key_id != key.key_id() {
            return Err(VerifyError::KeyIdMismatch {
                found: self.key_id,
                expected: key.key_id(),
            });
        }
        if self.tree_size > crate::canonical::MAX_SAFE_INTEGER
            || !crate::chain::is_valid_time(&self.timestamp)
        {
            return Err(VerifyError::BadSignature);
        }
        let sig = parse_signature(&self.signature).ok_or(VerifyError::BadSignature)?;
        if !key.verify(&self.signed_message(), &sig) {
            return Err(VerifyError::BadSignature);
        }
        Ok(())
    }
}

/// Whether `sig` (64 bytes) is `key`'s strict Ed25519 signature over `message`.
pub fn verify_bytes(key: &PublicKey, message: &[u8], sig: &[u8]) -> bool {
    <[u8; 64]>::try_from(sig).is_ok_and(|b| key.verify(message, &Signature::from_bytes(&b)))
}

/// Whether `sig_hex` (128 hex digits) is `key`'s strict Ed25519 signature over `message`.
pub fn verify_hex(key: &PublicKey, message: &[u8], sig_hex: &str) -> bool {
    parse_signature(sig_hex).is_some_and(|s| key.verify(message, &s))
}

fn parse_signature(hex: &str) -> Option<Signature> {
    if hex.len() != 128 {
        return None;
    }
    let a = Hash::parse(hex.get(..64)?).ok()?;
    let b = Hash::parse(hex.get(64..)?).ok()?;
    let mut bytes = [0u8; 64];
    bytes[..32].copy_from_slice(&a.0);
    bytes[32..].copy_from_slice(&b.0);
    Some(Signature::from_bytes(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_and_verify() {
        let k = NodeKey::from_seed(&[3; 32]);
        let sth = k.sign_tree_head(5, Hash([9; 32]), "2026-05-01T12:00:00.000Z".into());
        sth.verify(&k.public_key()).unwrap();
        let mut bad = sth.clone();
        bad.tree_size = 6;
        assert_eq!(bad.verify(&k.public_key()), Err(VerifyError::BadSignature));
        let other = NodeKey::from_seed(&[4; 32]);
        assert!(matches!(
            sth.verify(&other.public_key()),
            Err(VerifyError::KeyIdMismatch { .. })
        ));
        let msg = String::from_utf8_lossy(&sth.signed_message()).into_owned();
        assert!(msg.starts_with("rampart.audit.tree-head.v1\0{\"key_id\":\""));
        assert!(msg.ends_with("\"timestamp\":\"2026-05-01T12:00:00.000Z\",\"tree_size\":5}"));
    }

    #[test]
    fn public_key_text_round_trip() {
        let k = NodeKey::generate();
        let s = k.public_key().to_string();
        assert!(s.starts_with("ed25519:") && s.len() == 8 + 64);
        assert_eq!(PublicKey::parse(&s).unwrap(), k.public_key());
        assert!(PublicKey::parse("ed25519:00").is_err());
    }

    #[test]
    fn racing_creators_agree_on_one_key() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("node.key");
            let keys: Vec<PublicKey> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..4)
                    .map(|_| s.spawn(|| NodeKey::load_or_create(&path).unwrap().public_key()))
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(keys.windows(2).all(|w| w[0] == w[1]));
            assert_eq!(
                fs::read_dir(dir.path()).unwrap().count(),
                1,
                "no temporary file left"
            );
        }
    }

    #[test]
    fn key_file_is_private_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.key");
        let a = NodeKey::load_or_create(&path).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let b = NodeKey::load_or_create(&path).unwrap();
        assert_eq!(a.public_key(), b.public_key());
        // Only the key file is left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            NodeKey::load(&path),
            Err(KeyError::Permissions { .. })
        ));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, "garbage").unwrap();
        assert!(matches!(NodeKey::load(&path), Err(KeyError::Format(_))));
        assert!(!format!("{a:?}").contains(&Hash(a.signing.to_bytes()).to_hex()));
    }
}
