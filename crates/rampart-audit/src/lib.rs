//! The proof: a hash-chained, signed record of every sandbox, verifiable offline.
//!
//! This crate is pure: no database, no network, no clock except [`now`]. The wire format
//! is specified in `docs/proof.md`; the event types are in [`rampart_types::audit`].
//!
//! # The pieces
//!
//! - **Events** ([`Event`], [`EventBody`]): one ordered log per sandbox. Each event's
//!   `hash` is SHA-256 over a domain string and the canonical JSON ([`canonical`]) of the
//!   event without its hash; `prev` links to the event before, or to the sandbox's
//!   [`genesis`] value.
//! - **[`Chain`]**: builds a sandbox's events ([`Chain::next_event`] + [`Chain::advance`],
//!   or [`Chain::append`]); [`verify_chain`] checks stored events.
//! - **Node log** ([`merkle`]): an RFC 6962 Merkle tree whose leaves are published chain
//!   heads ([`HeadLeaf`]); [`MerkleLog`] keeps it in memory with an O(log n) root.
//! - **Signed tree head** ([`SignedTreeHead`]): the node key ([`NodeKey`], Ed25519) signs
//!   `(tree_size, root_hash, timestamp, key_id)`.
//! - **Bundle** ([`Bundle`]): the events, blobs, signed tree head, inclusion proof and public
//!   key in one JSON file; [`verify_bundle`] checks it all and returns a [`Report`].
//!
//! # Wiring it into the daemon
//!
//! At start: `let key = NodeKey::load_or_create(&state_dir.join("node.key"))?;` (serve
//! `key.public_key().to_string()` and `key.key_id()` at `/v1/audit/key`). Load the stored
//! leaf hashes in index order into `MerkleLog::from_leaves`, and for each live sandbox
//! `Chain::resume(id, last_seq + 1, last_hash)` (or `Chain::new(id)` when it has no event).
//!
//! Recording (in the same store transaction as the state change it records):
//!
//! ```
//! # use rampart_audit::*;
//! # use rampart_types::{SandboxId, audit::*};
//! # let id = SandboxId::generate();
//! let mut chain = Chain::new(id);
//! let event = chain.next_event(EventBody::Snapshot(Snapshot { name: "s1".into(), ..Default::default() }), now())?;
//! // INSERT the event (seq, time, prev, hash, body JSON) in the transaction; on commit:
//! chain.advance(&event)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Process output: feed it to a [`ContentHasher`] with the blob cap; the `exit` event takes
//! the [`ContentRecord`]s and the kept bytes go to the blob store under `record.blob`.
//!
//! Publishing (at every destroy, at a fixed interval for live sandboxes whose head moved,
//! and before exporting a bundle): `let leaf = chain.leaf();` store it (index = current log
//! size), `let index = log.push(leaf.hash());`, then
//! `let sth = key.sign_tree_head(log.size(), log.root(), now());` and store `sth`.
//!
//! Exporting: publish the sandbox's head as above, then
//! `Bundle::assemble(id, events, blobs, index, log.inclusion_proof(index, sth.tree_size)?, sth, key.public_key())`
//! where `blobs` are the stored bytes of [`referenced_blobs`]`(&events)`, and serve
//! [`Bundle::to_bytes`]. `rampart audit verify FILE [--key K]` is
//! `verify_bundle(&bytes, key.as_ref())` and prints the [`Report`] (its `Display`), or the
//! [`VerifyError`] (its `Display` names the first bad record; [`VerifyError::seq`] gives it).
//! A later tree head can be shown to extend an earlier one with
//! [`MerkleLog::consistency_proof`] / [`merkle::verify_consistency`].

pub mod authority;
pub mod bundle;
pub mod canonical;
pub mod chain;
pub mod checkpoint;
pub mod dsse;
pub mod error;
pub mod hash;
pub mod key;
pub mod lineage;
pub mod merkle;
pub mod redact;
pub mod report;
pub mod usage;

pub use bundle::{referenced_blobs, verify_bundle, Anchor, Bundle, BUNDLE_FORMAT};
pub use canonical::EncodeError;
pub use chain::{format_time, now, verify_chain, Chain, ChainError, ChainSummary};
pub use error::{ProofError, VerifyError};
pub use hash::{content_digest, genesis, ContentHasher};
pub use key::{KeyError, NodeKey, PublicKey, SignedTreeHead};
pub use merkle::{HeadLeaf, MerkleLog};
pub use rampart_types::audit::{ContentRecord, Event, EventBody, Hash};
pub use report::{Activity, Report};
