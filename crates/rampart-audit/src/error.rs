//! Why a log, a proof or a bundle does not verify.

use rampart_types::audit::Hash;

/// Why verification failed. Variants about one record carry its `seq`
/// (see [`VerifyError::seq`]): the first bad record, in log order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// the bundle is not well-formed
    #[error("the bundle is not well-formed: {0}")]
    Malformed(String),
    /// the bundle's format is not one this verifier knows
    #[error("unsupported bundle format {0:?} (this verifier reads rampart.audit.bundle.v1)")]
    UnsupportedFormat(String),
    /// a record of the log cannot be read
    #[error("record at position {position} cannot be read: {reason}")]
    BadRecord {
        /// Position in the log (the seq it should have).
        position: u64,
        /// What is wrong.
        reason: String,
    },
    /// a record belongs to another sandbox's log
    #[error("record seq {seq} belongs to sandbox {found:?}, not to {expected:?} (spliced in?)")]
    WrongSandbox {
        /// The record's seq.
        seq: u64,
        /// The sandbox it names.
        found: String,
        /// The sandbox of this log.
        expected: String,
    },
    /// a record is missing
    #[error("record seq {seq} is missing (the next record present is seq {found})")]
    Missing {
        /// The seq that is absent.
        seq: u64,
        /// The seq found in its place.
        found: u64,
    },
    /// records are out of order
    #[error("record seq {seq} is out of order: found at position {position}")]
    OutOfOrder {
        /// The seq of the record found out of place.
        seq: u64,
        /// Where it was found.
        position: u64,
    },
    /// a record's time is not RFC 3339 UTC with milliseconds
    #[error("record seq {seq} has a malformed time {time:?} (want YYYY-MM-DDTHH:MM:SS.mmmZ)")]
    BadTime {
        /// The record's seq.
        seq: u64,
        /// The time as found.
        time: String,
    },
    /// a record does not link to the one before it
    #[error("record seq {seq} does not link to the record before it (prev is not its hash)")]
    BrokenLink {
        /// The record's seq.
        seq: u64,
    },
    /// a record's hash does not match its content
    #[error("record seq {seq} has been altered: its hash does not match its content")]
    BadHash {
        /// The record's seq.
        seq: u64,
    },
    /// a record is of a type this verifier does not know
    #[error(
        "record seq {seq} has unknown type {event_type:?} (a newer format?); refusing to skip it"
    )]
    UnknownType {
        /// The record's seq.
        seq: u64,
        /// The type found.
        event_type: String,
    },
    /// a record's body is not well-formed for its type
    #[error("record seq {seq} has a malformed body: {reason}")]
    BadBody {
        /// The record's seq.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// the log ends before the published chain head
    #[error("the log is truncated: it has {found} records but the signed head says {expected}")]
    Truncated {
        /// The last record present (`None` when there is none).
        seq: Option<u64>,
        /// How many records the signed chain head covers.
        expected: u64,
        /// How many records the bundle holds.
        found: u64,
    },
    /// the log holds records beyond the signed chain head
    #[error(
        "record seq {seq} and after are not covered by the signed chain head ({expected} records)"
    )]
    Unanchored {
        /// The first record not covered.
        seq: u64,
        /// How many records the signed chain head covers.
        expected: u64,
    },
    /// the log's last hash is not the signed chain head
    #[error("the log's head (record seq {seq:?}) is not the signed chain head")]
    HeadMismatch {
        /// The last record (`None` for an empty log).
        seq: Option<u64>,
    },
    /// a blob does not match its digest
    #[error("blob {digest} does not match its digest (first used by record seq {seq:?})")]
    BlobMismatch {
        /// The digest it is filed under.
        digest: Hash,
        /// The first record that refers to it, if any.
        seq: Option<u64>,
    },
    /// a blob cannot be read
    #[error("blob {key:?} cannot be read: {reason}")]
    BadBlob {
        /// Its key in the bundle.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// a record's content record contradicts its blob
    #[error("record seq {seq}: {reason}")]
    BadContent {
        /// The record's seq.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// the inclusion proof does not lead to the signed root
    #[error("the chain head is not in the signed tree: {0}")]
    BadInclusionProof(#[from] ProofError),
    /// the public key cannot be read
    #[error("the public key cannot be read: {0}")]
    BadKey(String),
    /// the tree head was signed by another key than the bundle's
    #[error("the tree head names key {found}, but the bundle's key is {expected}")]
    KeyIdMismatch {
        /// The key id the tree head names.
        found: Hash,
        /// The id of the bundle's public key.
        expected: Hash,
    },
    /// the bundle's key is not the trusted key
    #[error("the bundle is signed by key {found}, not by the trusted key {trusted}")]
    UntrustedKey {
        /// The id of the bundle's key.
        found: Hash,
        /// The id of the trusted key.
        trusted: Hash,
    },
    /// the tree head's signature is not valid
    #[error("the tree head's signature is not valid for the node key")]
    BadSignature,
}

impl VerifyError {
    /// The seq of the record this error is about, if it is about one.
    pub fn seq(&self) -> Option<u64> {
        use VerifyError::*;
        match self {
            BadRecord { position, .. } => Some(*position),
            WrongSandbox { seq, .. }
            | Missing { seq, .. }
            | OutOfOrder { seq, .. }
            | BadTime { seq, .. }
            | BrokenLink { seq }
            | BadHash { seq }
            | UnknownType { seq, .. }
            | BadBody { seq, .. }
            | Unanchored { seq, .. }
            | BadContent { seq, .. } => Some(*seq),
            Truncated { seq, .. } | HeadMismatch { seq } | BlobMismatch { seq, .. } => *seq,
            _ => None,
        }
    }
}

/// Why a Merkle proof does not verify or cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// the leaf index is not inside the tree
    #[error("leaf index {index} is not inside a tree of size {size}")]
    IndexOutOfRange {
        /// The index asked for.
        index: u64,
        /// The tree size.
        size: u64,
    },
    /// the tree sizes are not in order
    #[error("tree size {old} is larger than tree size {new}")]
    SizesOutOfOrder {
        /// The earlier size.
        old: u64,
        /// The later size.
        new: u64,
    },
    /// the proof has the wrong number of hashes
    #[error("the proof has the wrong number of hashes")]
    WrongLength,
    /// the proof does not lead to the expected root
    #[error("the proof does not lead to the expected root")]
    RootMismatch,
}
