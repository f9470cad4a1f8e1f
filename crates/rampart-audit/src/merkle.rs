//! The node's append-only Merkle log of published chain heads (RFC 6962 / RFC 9162 hashing
//! with SHA-256).
//!
//! - leaf hash `= SHA-256(0x00 || leaf data)`, interior node `= SHA-256(0x01 || left || right)`,
//!   the root of the empty tree `= SHA-256("")`;
//! - a tree of `n > 1` leaves splits at `k`, the largest power of two smaller than `n`.
//!
//! Functions here work on a slice of leaf hashes, whatever stores them: the daemon keeps the
//! leaves in its database and the hashes in a [`MerkleLog`].

use crate::error::ProofError;
use crate::hash::HEAD_DOMAIN;
use rampart_types::audit::Hash;
use rampart_types::SandboxId;
use sha2::{Digest, Sha256};

/// A published chain head: the data of one leaf of the node's Merkle log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadLeaf {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// How many events its chain had.
    pub length: u64,
    /// The hash of its last event (genesis when `length` is 0).
    pub head: Hash,
}

impl HeadLeaf {
    /// The leaf data: `"rampart.audit.head.v1\0" || u8 len(id) || id || u64be length || head`.
    pub fn data(&self) -> Vec<u8> {
        let id = self.sandbox.as_str().as_bytes();
        let mut d = Vec::with_capacity(HEAD_DOMAIN.len() + 1 + id.len() + 8 + 32);
        d.extend_from_slice(HEAD_DOMAIN);
        // Ids are at most 64 bytes (SandboxId guarantees it).
        d.push(id.len() as u8);
        d.extend_from_slice(id);
        d.extend_from_slice(&self.length.to_be_bytes());
        d.extend_from_slice(&self.head.0);
        d
    }

    /// The leaf hash, `SHA-256(0x00 || data)`.
    pub fn hash(&self) -> Hash {
        leaf_hash(&self.data())
    }
}

/// `SHA-256(0x00 || data)`.
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(data);
    Hash(h.finalize().into())
}

/// `SHA-256(0x01 || left || right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left.0);
    h.update(right.0);
    Hash(h.finalize().into())
}

/// The root of the empty tree, `SHA-256("")`.
pub fn empty_root() -> Hash {
    Hash(Sha256::digest([]).into())
}

/// The largest power of two strictly smaller than `n` (`n >= 2`).
fn split(n: usize) -> usize {
    debug_assert!(n >= 2);
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

/// The root of the tree whose leaf hashes are `leaves` (RFC 6962 `MTH`).
pub fn root(leaves: &[Hash]) -> Hash {
    if leaves.is_empty() {
        return empty_root();
    }
    let mut range = CompactRange::default();
    for l in leaves {
        range.push(*l);
    }
    range.root()
}

/// Root of a non-empty slice, by recursion (used for proof siblings).
fn subtree_root(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => empty_root(),
        1 => leaves[0],
        n => {
            let k = split(n);
            node_hash(&subtree_root(&leaves[..k]), &subtree_root(&leaves[k..]))
        }
    }
}

/// The inclusion proof (RFC 6962 audit path) of leaf `index` in the tree of all `leaves`,
/// from the leaf's sibling up.
pub fn inclusion_proof(leaves: &[Hash], index: u64) -> Result<Vec<Hash>, ProofError> {
    let size = leaves.len() as u64;
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    let mut proof = Vec::new();
    path(index as usize, leaves, &mut proof);
    Ok(proof)
}

fn path(m: usize, leaves: &[Hash], out: &mut Vec<Hash>) {
    let n = leaves.len();
    if n <= 1 {
        return;
    }
    let k = split(n);
    if m < k {
        path(m, &leaves[..k], out);
        out.push(subtree_root(&leaves[k..]));
    } else {
        path(m - k, &leaves[k..], out);
        out.push(subtree_root(&leaves[..k]));
    }
}

/// Checks that `leaf` is leaf `index` of the tree of `size` leaves whose root is `root`
/// (RFC 9162, section 2.1.3.2).
pub fn verify_inclusion(
    leaf: &Hash,
    index: u64,
    size: u64,
    proof: &[Hash],
    root: &Hash,
) -> Result<(), ProofError> {
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    let (mut fnode, mut snode) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if snode == 0 {
            return Err(ProofError::WrongLength);
        }
        if fnode & 1 == 1 || fnode == snode {
            r = node_hash(p, &r);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return Err(ProofError::WrongLength);
    }
    if &r != root {
        return Err(ProofError::RootMismatch);
    }
    Ok(())
}

/// The consistency proof (RFC 6962 `PROOF(m, D[n])`) that the tree of the first
/// `old_size` leaves is a prefix of the tree of all `leaves`. Empty when `old_size` is 0
/// or equals the size.
pub fn consistency_proof(leaves: &[Hash], old_size: u64) -> Result<Vec<Hash>, ProofError> {
    let n = leaves.len() as u64;
    if old_size > n {
        return Err(ProofError::SizesOutOfOrder {
            old: old_size,
            new: n,
        });
    }
    let mut proof = Vec::new();
    if old_size > 0 && old_size < n {
        subproof(old_size as usize, leaves, true, &mut proof);
    }
    Ok(proof)
}

fn subproof(m: usize, leaves: &[Hash], complete: bool, out: &mut Vec<Hash>) {
    let n = leaves.len();
    if m == n {
        if !complete {
            out.push(subtree_root(leaves));
        }
        return;
    }
    let k = split(n);
    if m <= k {
        subproof(m, &leaves[..k], complete, out);
        out.push(subtree_root(&leaves[k..]));
    } else {
        subproof(m - k, &leaves[k..], false, out);
        out.push(subtree_root(&leaves[..k]));
    }
}

/// Checks that the tree of `old_size` leaves with root `old_root` is a prefix of the tree
/// of `new_size` leaves with root `new_root` (RFC 9162, section 2.1.4.2).
pub fn verify_consistency(
    old_size: u64,
    new_size: u64,
    old_root: &Hash,
    new_root: &Hash,
    proof: &[Hash],
) -> Result<(), ProofError> {
    if old_size > new_size {
        return Err(ProofError::SizesOutOfOrder {
            old: old_size,
            new: new_size,
        });
    }
    if old_size == new_size {
        if !proof.is_empty() {
            return Err(ProofError::WrongLength);
        }
        return if old_root == new_root {
            Ok(())
        } else {
            Err(ProofError::RootMismatch)
        };
    }
    if old_size == 0 {
        // Every tree extends the empty one.
        if !proof.is_empty() {
            return Err(ProofError::WrongLength);
        }
        return if *old_root == empty_root() {
            Ok(())
        } else {
            Err(ProofError::RootMismatch)
        };
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if old_size.is_power_of_two() {
        path.push(*old_root);
    }
    path.extend_from_slice(proof);
    let Some((first, rest)) = path.split_first() else {
        return Err(ProofError::WrongLength);
    };
    let (mut fnode, mut snode) = (old_size - 1, new_size - 1);
    while fnode & 1 == 1 {
        fnode >>= 1;
        snode >>= 1;
    }
    let (mut fr, mut sr) = (*first, *first);
    for c in rest {
        if snode == 0 {
            return Err(ProofError::WrongLength);
        }
        if fnode & 1 == 1 || fnode == snode {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return Err(ProofError::WrongLength);
    }
    if &fr != old_root || &sr != new_root {
        return Err(ProofError::RootMismatch);
    }
    Ok(())
}

/// The roots of the perfect subtrees that make up a tree (one per set bit of its size,
/// largest first): enough to compute the root after each append in O(log n).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactRange {
    size: u64,
    peaks: Vec<Hash>,
}

impl CompactRange {
    /// Number of leaves.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Appends a leaf hash.
    pub fn push(&mut self, leaf: Hash) {
        let mut h = leaf;
        let mut s = self.size;
        // Merge equal-sized perfect subtrees: one per trailing 1 bit of the old size.
        while s & 1 == 1 {
            // The number of peaks equals the number of set bits of size, so a trailing
            // 1 bit means a peak exists.
            let Some(left) = self.peaks.pop() else { break };
            h = node_hash(&left, &h);
            s >>= 1;
        }
        self.peaks.push(h);
        self.size += 1;
    }

    /// The tree's root.
    pub fn root(&self) -> Hash {
        let mut iter = self.peaks.iter().rev();
        let Some(last) = iter.next() else {
            return empty_root();
        };
        iter.fold(*last, |acc, left| node_hash(left, &acc))
    }
}

/// An in-memory Merkle log: all leaf hashes plus a [`CompactRange`] for the current root.
///
/// The daemon loads it from its stored leaves at start ([`MerkleLog::from_leaves`]),
/// [`push`](MerkleLog::push)es a [`HeadLeaf::hash`] each time it publishes a chain head
/// (after storing the leaf), and signs [`root`](MerkleLog::root) as a tree head.
#[derive(Debug, Clone, Default)]
pub struct MerkleLog {
    leaves: Vec<Hash>,
    range: CompactRange,
}

impl MerkleLog {
    /// An empty log.
    pub fn new() -> Self {
        MerkleLog::default()
    }

    /// A log holding these leaf hashes, in order.
    pub fn from_leaves(leaves: Vec<Hash>) -> Self {
        let mut range = CompactRange::default();
        for l in &leaves {
            range.push(*l);
        }
        MerkleLog { leaves, range }
    }

    /// Appends a leaf hash; returns its index.
    pub fn push(&mut self, leaf: Hash) -> u64 {
        self.leaves.push(leaf);
        self.range.push(leaf);
        self.range.size() - 1
    }

    /// Number of leaves.
    pub fn size(&self) -> u64 {
        self.leaves.len() as u64
    }

    /// The leaf hashes.
    pub fn leaves(&self) -> &[Hash] {
        &self.leaves
    }

    /// The current root, in O(log n).
    pub fn root(&self) -> Hash {
        self.range.root()
    }

    /// The root of the first `size` leaves (an earlier tree head).
    pub fn root_at(&self, size: u64) -> Result<Hash, ProofError> {
        let slice = self.prefix(size)?;
        Ok(root(slice))
    }

    /// The inclusion proof of leaf `index` in the tree of the first `size` leaves.
    pub fn inclusion_proof(&self, index: u64, size: u64) -> Result<Vec<Hash>, ProofError> {
        inclusion_proof(self.prefix(size)?, index)
    }

    /// The consistency proof from the tree of `old_size` leaves to that of `new_size`.
    pub fn consistency_proof(&self, old_size: u64, new_size: u64) -> Result<Vec<Hash>, ProofError> {
        consistency_proof(self.prefix(new_size)?, old_size)
    }

    fn prefix(&self, size: u64) -> Result<&[Hash], ProofError> {
        if size > self.size() {
            return Err(ProofError::SizesOutOfOrder {
                old: size,
                new: self.size(),
            });
        }
        Ok(&self.leaves[..size as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Hash {
        Hash::parse(s).unwrap()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The RFC 6962 reference leaves of the Certificate Transparency test suite.
    fn reference_leaves() -> Vec<Hash> {
        [
            "",
            "00",
            "10",
            "2021",
            "3031",
            "40414243",
            "5051525354555657",
            "606162636465666768696a6b6c6d6e6f",
        ]
        .iter()
        .map(|d| leaf_hash(&unhex(d)))
        .collect()
    }

    const ROOTS: [&str; 9] = [
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ];

    #[test]
    fn roots_match_rfc6962_vectors() {
        let leaves = reference_leaves();
        let mut log = MerkleLog::new();
        assert_eq!(log.root(), h(ROOTS[0]));
        for n in 0..=8 {
            assert_eq!(root(&leaves[..n]), h(ROOTS[n]), "size {n}");
            assert_eq!(subtree_root(&leaves[..n]), h(ROOTS[n]), "size {n}");
            if n > 0 {
                log.push(leaves[n - 1]);
                assert_eq!(log.root(), h(ROOTS[n]), "incremental size {n}");
            }
        }
    }

    #[test]
    fn inclusion_proofs_match_rfc6962_vectors() {
        let leaves = reference_leaves();
        let want0 = [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ];
        let want5 = [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ];
        for (index, want) in [(0u64, want0), (5, want5)] {
            let proof = inclusion_proof(&leaves, index).unwrap();
            assert_eq!(proof, want.iter().map(|s| h(s)).collect::<Vec<_>>());
            verify_inclusion(&leaves[index as usize], index, 8, &proof, &h(ROOTS[8])).unwrap();
        }
    }

    #[test]
    fn consistency_proofs_match_rfc6962_vectors() {
        let leaves = reference_leaves();
        let p = consistency_proof(&leaves, 2).unwrap();
        assert_eq!(
            &p[..2],
            &[
                h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
                h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
            ]
        );
        let p = consistency_proof(&leaves[..5], 2).unwrap();
        assert_eq!(
            p,
            vec![
                h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
                h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
            ]
        );
    }

    fn synthetic(n: usize) -> Vec<Hash> {
        (0..n)
            .map(|i| leaf_hash(&(i as u64).to_be_bytes()))
            .collect()
    }

    #[test]
    fn every_inclusion_proof_verifies_and_wrong_ones_fail() {
        let all = synthetic(64);
        for size in 1..=64usize {
            let leaves = &all[..size];
            let r = root(leaves);
            for index in 0..size {
                let proof = inclusion_proof(leaves, index as u64).unwrap();
                let leaf = &leaves[index];
                verify_inclusion(leaf, index as u64, size as u64, &proof, &r).unwrap();
                // Wrong index, wrong size, wrong leaf, shortened or lengthened proof: fail.
                if size > 1 {
                    let other = (index + 1) % size;
                    assert!(verify_inclusion(leaf, other as u64, size as u64, &proof, &r).is_err());
                    assert!(verify_inclusion(
                        &leaves[other],
                        index as u64,
                        size as u64,
                        &proof,
                        &r
                    )
                    .is_err());
                }
                // (The same path can be valid for size + 1, e.g. leaf 0 of 3 and of 4: the
                // size is bound by the signed tree head, not by the path.)
                assert!(verify_inclusion(leaf, size as u64, size as u64, &proof, &r).is_err());
                if !proof.is_empty() {
                    let short = &proof[..proof.len() - 1];
                    assert!(verify_inclusion(leaf, index as u64, size as u64, short, &r).is_err());
                    let mut flipped = proof.clone();
                    flipped[0].0[0] ^= 1;
                    assert!(
                        verify_inclusion(leaf, index as u64, size as u64, &flipped, &r).is_err()
                    );
                }
                let mut long = proof.clone();
                long.push(r);
                assert!(verify_inclusion(leaf, index as u64, size as u64, &long, &r).is_err());
            }
        }
    }

    #[test]
    fn every_consistency_proof_verifies_and_wrong_ones_fail() {
        let all = synthetic(40);
        let mut log = MerkleLog::new();
        for l in &all {
            log.push(*l);
        }
        for new in 0..=40u64 {
            let new_root = log.root_at(new).unwrap();
            for old in 0..=new {
                let old_root = log.root_at(old).unwrap();
                let proof = log.consistency_proof(old, new).unwrap();
                verify_consistency(old, new, &old_root, &new_root, &proof).unwrap();
                if old > 0 && old < new {
                    let mut bad = proof.clone();
                    bad[0].0[5] ^= 0x40;
                    assert!(verify_consistency(old, new, &old_root, &new_root, &bad).is_err());
                    assert!(verify_consistency(old, new, &new_root, &new_root, &proof).is_err());
                    assert!(
                        verify_consistency(old - 1, new, &old_root, &new_root, &proof).is_err()
                            || log.root_at(old - 1).unwrap() == old_root
                    );
                }
            }
        }
        assert!(log.consistency_proof(5, 4).is_err());
    }

    #[test]
    fn head_leaf_data_is_as_documented() {
        let leaf = HeadLeaf {
            sandbox: SandboxId::parse("ab").unwrap(),
            length: 3,
            head: Hash([7; 32]),
        };
        let d = leaf.data();
        assert!(d.starts_with(b"rampart.audit.head.v1\0\x02ab\0\0\0\0\0\0\0\x03"));
        assert_eq!(d.len(), 22 + 1 + 2 + 8 + 32);
        assert_eq!(leaf.hash(), leaf_hash(&d));
    }
}
