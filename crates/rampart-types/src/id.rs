//! Sandbox identifiers.

use rand::Rng;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Length of a generated sandbox id (20 characters, like E2B's ids).
pub const ID_LEN: usize = 20;

/// Errors of parsing a sandbox id.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdError {
    /// sandbox id must be 1 to 64 characters of a-z and 0-9
    #[error("sandbox id must be 1 to 64 characters of a-z and 0-9")]
    Invalid,
}

/// A sandbox id: 1-64 characters of `[a-z0-9]`. Generated ids are 20 random characters
/// (about 103 bits), unique across nodes without coordination.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String, example = "i552502ea4f054027987")]
pub struct SandboxId(String);

impl SandboxId {
    /// A fresh random id. The first character is a letter so the id is also a valid DNS label
    /// start and never looks like a number.
    pub fn generate() -> Self {
        const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
        const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut rng = rand::thread_rng();
        let mut s = String::with_capacity(ID_LEN);
        s.push(LETTERS[rng.gen_range(0..LETTERS.len())] as char);
        for _ in 1..ID_LEN {
            s.push(ALNUM[rng.gen_range(0..ALNUM.len())] as char);
        }
        SandboxId(s)
    }

    /// Parses and validates an id.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        if s.is_empty()
            || s.len() > 64
            || !s
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(IdError::Invalid);
        }
        Ok(SandboxId(s.to_owned()))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SandboxId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        SandboxId::parse(&s)
    }
}

impl From<SandboxId> for String {
    fn from(id: SandboxId) -> String {
        id.0
    }
}

impl std::str::FromStr for SandboxId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        SandboxId::parse(s)
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SandboxId({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_valid_and_distinct() {
        let a = SandboxId::generate();
        let b = SandboxId::generate();
        assert_ne!(a, b);
        assert_eq!(SandboxId::parse(a.as_str()).unwrap(), a);
        assert_eq!(a.as_str().len(), ID_LEN);
    }

    #[test]
    fn bad_ids_are_refused() {
        for bad in ["", "../etc", "ABC", "a b", &"a".repeat(65)] {
            assert_eq!(SandboxId::parse(bad), Err(IdError::Invalid), "{bad:?}");
        }
        assert!(serde_json::from_str::<SandboxId>("\"x/y\"").is_err());
    }
}
