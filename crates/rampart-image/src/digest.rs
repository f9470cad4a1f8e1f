//! SHA-256 digests spelled `sha256:<hex>` and the hex form used in file names.

use sha2::{Digest as _, Sha256};

/// Lowercase hex of bytes.
pub fn hex(b: &[u8]) -> String {
    const H: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push(H[(x >> 4) as usize] as char);
        s.push(H[(x & 15) as usize] as char);
    }
    s
}

/// Hex SHA-256 of bytes.
pub fn sha256_hex(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

/// A hasher of length-prefixed fields, so that `("ab","c")` and `("a","bc")` differ.
#[derive(Debug, Default, Clone)]
pub struct KeyHasher(Sha256);

impl KeyHasher {
    /// A new hasher, domain-separated by `tag`.
    pub fn new(tag: &str) -> KeyHasher {
        let mut k = KeyHasher(Sha256::new());
        k.field(tag.as_bytes());
        k
    }
    /// Adds one field.
    pub fn field(&mut self, b: &[u8]) -> &mut Self {
        self.0.update((b.len() as u64).to_le_bytes());
        self.0.update(b);
        self
    }
    /// Adds a string field.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.field(s.as_bytes())
    }
    /// Raw update (for streamed content, after a length field of its own).
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.update(b);
        self
    }
    /// The hex digest.
    pub fn finish(self) -> String {
        hex(&self.0.finalize())
    }
}

/// Whether `s` is 64 lowercase hex digits.
pub fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
