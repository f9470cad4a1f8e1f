//! Redaction of declared-sensitive values from what the record keeps: the bytes of a
//! process's output or input are edited as they pass (each occurrence of a value becomes
//! `[REDACTED:<name>]`) before they are hashed and kept, so neither the blobs nor the
//! digests hold or betray the value; the edits are counted, and the daemon records a
//! `redacted` event naming what was edited where (never the value).

use crate::hash::ContentHasher;
use rampart_types::audit::ContentRecord;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The shortest value that may be declared sensitive: redacting shorter ones would edit
/// ordinary output (and a short value is guessed from the edits' positions anyway).
pub const MIN_SECRET_LEN: usize = 6;

/// Values to redact: `(name, value)`.
pub type Secrets = Arc<[(String, Vec<u8>)]>;

/// A streaming replacer of [`Secrets`] (an occurrence split across two updates is found).
#[derive(Debug, Clone)]
pub struct Redactor {
    secrets: Secrets,
    longest: usize,
    carry: Vec<u8>,
    hits: BTreeMap<String, u64>,
}

impl Redactor {
    /// A redactor of `secrets` (values shorter than [`MIN_SECRET_LEN`] are ignored).
    pub fn new(secrets: Secrets) -> Self {
        let longest = secrets.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
        Redactor {
            secrets,
            longest,
            carry: Vec::new(),
            hits: BTreeMap::new(),
        }
    }

    fn at(&self, buf: &[u8]) -> Option<usize> {
        self.secrets
            .iter()
            .position(|(_, v)| v.len() >= MIN_SECRET_LEN && buf.starts_with(v))
    }

    fn could_start(&self, tail: &[u8]) -> bool {
        self.secrets
            .iter()
            .any(|(_, v)| v.len() >= MIN_SECRET_LEN && v.starts_with(tail))
    }

    /// Feeds `input`; what is certainly not (part of) a value goes to `out`, with the
    /// values replaced.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.longest < MIN_SECRET_LEN {
            out.extend_from_slice(input);
            return;
        }
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(input);
        let mut i = 0;
        let mut plain = 0;
        while i < buf.len() {
            let rest = &buf[i..];
            if let Some(k) = self.at(rest) {
                out.extend_from_slice(&buf[plain..i]);
                let name = &self.secrets[k].0;
                out.extend_from_slice(format!("[REDACTED:{name}]").as_bytes());
                *self.hits.entry(name.clone()).or_default() += 1;
                i += self.secrets[k].1.len();
                plain = i;
                continue;
            }
            if rest.len() < self.longest && self.could_start(rest) {
                break; // the next update may complete it
            }
            i += 1;
        }
        out.extend_from_slice(&buf[plain..i]);
        self.carry = buf[i..].to_vec();
    }

    /// Ends the stream: what was held back (not a whole value) goes to `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.carry);
    }

    /// How many occurrences of each value were replaced so far, by name.
    pub fn hits(&self) -> &BTreeMap<String, u64> {
        &self.hits
    }
}

/// A [`ContentHasher`] behind a [`Redactor`]: what it hashes and keeps is the edited bytes.
#[derive(Debug, Clone)]
pub struct RedactingHasher {
    hasher: ContentHasher,
    redactor: Option<Redactor>,
    scratch: Vec<u8>,
}

impl RedactingHasher {
    /// Keeps the first `cap` bytes; redacts `secrets` (none: a plain hasher).
    pub fn new(cap: usize, secrets: Option<Secrets>) -> Self {
        RedactingHasher {
            hasher: ContentHasher::new(cap),
            redactor: secrets.filter(|s| !s.is_empty()).map(Redactor::new),
            scratch: Vec::new(),
        }
    }

    /// Feeds more bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        match &mut self.redactor {
            None => self.hasher.update(bytes),
            Some(r) => {
                self.scratch.clear();
                r.feed(bytes, &mut self.scratch);
                self.hasher.update(&self.scratch);
            }
        }
    }

    /// The record and blob of the edited bytes, and the replacements made, by name.
    pub fn finish(mut self) -> (ContentRecord, Option<Vec<u8>>, BTreeMap<String, u64>) {
        let hits = match &mut self.redactor {
            None => BTreeMap::new(),
            Some(r) => {
                let mut tail = Vec::new();
                r.finish(&mut tail);
                self.hasher.update(&tail);
                r.hits().clone()
            }
        };
        let (record, blob) = self.hasher.finish();
        (record, blob, hits)
    }

    /// The record of `bytes` given whole.
    pub fn record(
        bytes: &[u8],
        cap: usize,
        secrets: Option<Secrets>,
    ) -> (ContentRecord, Option<Vec<u8>>, BTreeMap<String, u64>) {
        let mut h = RedactingHasher::new(cap, secrets);
        h.update(bytes);
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> Secrets {
        Arc::from(vec![
            ("TOKEN".to_string(), b"s3cr3t-value".to_vec()),
            ("PW".to_string(), b"hunter22".to_vec()),
            ("SHORT".to_string(), b"ab".to_vec()),
        ])
    }

    fn run(chunks: &[&[u8]]) -> (Vec<u8>, BTreeMap<String, u64>) {
        let mut r = Redactor::new(secrets());
        let mut out = Vec::new();
        for c in chunks {
            r.feed(c, &mut out);
        }
        r.finish(&mut out);
        (out, r.hits().clone())
    }

    #[test]
    fn values_are_replaced_wherever_the_stream_is_cut() {
        let text = b"token=s3cr3t-value pw=hunter22 again s3cr3t-value; ab stays";
        let want = b"token=[REDACTED:TOKEN] pw=[REDACTED:PW] again [REDACTED:TOKEN]; ab stays";
        for cut in 0..text.len() {
            for cut2 in cut..text.len() {
                let (out, hits) = run(&[&text[..cut], &text[cut..cut2], &text[cut2..]]);
                assert_eq!(out, want, "cut at {cut}, {cut2}");
                assert_eq!(hits["TOKEN"], 2);
                assert_eq!(hits["PW"], 1);
                assert!(!hits.contains_key("SHORT"));
            }
        }
        // A prefix of a value at the end is output as it is.
        let (out, hits) = run(&[b"x s3cr3t-val"]);
        assert_eq!(out, b"x s3cr3t-val");
        assert!(hits.is_empty());
        // Byte by byte.
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(run(&bytes).0, want);
    }

    #[test]
    fn the_record_is_of_the_edited_bytes() {
        let (r, blob, hits) = RedactingHasher::record(b"a hunter22 b", 1024, Some(secrets()));
        assert_eq!(blob.as_deref(), Some(&b"a [REDACTED:PW] b"[..]));
        assert_eq!(r.digest, crate::content_digest(b"a [REDACTED:PW] b"));
        assert_eq!(hits["PW"], 1);
        let (plain, _, none) = RedactingHasher::record(b"a hunter22 b", 1024, None);
        assert_eq!(plain.digest, crate::content_digest(b"a hunter22 b"));
        assert!(none.is_empty());
    }
}
