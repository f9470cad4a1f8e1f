//! Usage reports that verify offline (`GET /v1/usage`, `rampart usage verify`).
//!
//! A report ([`UsageReport`]) holds one record per sandbox. Each record's `hash` is
//! SHA-256 over [`USAGE_RECORD_DOMAIN`] and the canonical JSON of the record without its
//! `hash` (so with its `prev`, the hash of the record before it, zeros for the first):
//! a record changed, dropped, added or moved breaks the chain at that record. `head` is the
//! last record's hash, and the node key signs [`USAGE_REPORT_DOMAIN`] followed by the
//! canonical JSON of the header (`version`, `tenant`, `from`, `to`, `generated_at`,
//! `totals`, `count`, `head`). Numbers that are not integers (vCPU-seconds, GiB-seconds) are
//! hashed as their shortest decimal spelling ([`crate::canonical::normalize_numbers`]).
//! The verifier also checks that the totals are the sums of the records.

use crate::canonical::{normalize_numbers, to_canonical, EncodeError};
use crate::hash::sha256;
use crate::key::{verify_hex, NodeKey, PublicKey};
use rampart_types::tenant::{SandboxUsage, UsageReport, UsageSignature, UsageTotals};
use serde_json::Value;

/// Domain of a usage record's hash.
pub const USAGE_RECORD_DOMAIN: &[u8] = b"rampart.usage.record.v1\0";
/// Domain of the message a node key signs for a usage report.
pub const USAGE_REPORT_DOMAIN: &[u8] = b"rampart.usage.report.v1\0";
/// The report format this module writes and reads.
pub const USAGE_FORMAT: u32 = 1;
/// The `prev` of a report's first record.
pub const ZERO_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Why a usage report does not verify. Its `Display` names the first bad record.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UsageVerifyError {
    /// Not a usage report.
    #[error("not a usage report: {0}")]
    Format(String),
    /// A format version this verifier does not know.
    #[error(
        "usage report version {0} is not supported (this verifier reads version {USAGE_FORMAT})"
    )]
    Version(u32),
    /// A record whose `prev` is not the hash of the record before it.
    #[error("record {index} (sandbox {id}): its prev does not link to the record before it (a record was removed, added or moved)")]
    Link {
        /// Its index in `sandboxes`.
        index: usize,
        /// Its sandbox.
        id: String,
    },
    /// A record whose content does not match its hash.
    #[error("record {index} (sandbox {id}): its content does not match its hash (it was changed)")]
    Content {
        /// Its index in `sandboxes`.
        index: usize,
        /// Its sandbox.
        id: String,
    },
    /// `head` is not the last record's hash.
    #[error(
        "the head is not the hash of the last record (records were removed or added at the end)"
    )]
    Head,
    /// A total that is not the sum of the records.
    #[error("totals.{0} is not the sum of the records")]
    Totals(&'static str),
    /// Signed by another key than the one expected.
    #[error("signed by key {found}, not by the expected key {expected}")]
    KeyMismatch {
        /// The key the report names.
        found: String,
        /// The key given to check against.
        expected: String,
    },
    /// The signature does not verify.
    #[error("the node's signature over the report does not verify (its header, totals or head were changed)")]
    Signature,
    /// A value could not be hashed.
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

/// What a verified report says, for printing.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageCheck {
    /// Records checked.
    pub records: usize,
    /// The key that signed it.
    pub key: String,
    /// The tenant it covers.
    pub tenant: Option<String>,
}

fn canonical_of(mut v: Value) -> Result<Vec<u8>, EncodeError> {
    normalize_numbers(&mut v);
    to_canonical(&v)
}

fn to_value<T: serde::Serialize>(v: &T) -> Result<Value, UsageVerifyError> {
    serde_json::to_value(v).map_err(|e| UsageVerifyError::Format(e.to_string()))
}

/// The hash (hex) a record should carry: over the record with `prev`, without `hash`.
pub fn record_hash(rec: &SandboxUsage) -> Result<String, UsageVerifyError> {
    let mut v = to_value(rec)?;
    if let Value::Object(m) = &mut v {
        m.remove("hash");
    }
    let mut bytes = USAGE_RECORD_DOMAIN.to_vec();
    bytes.extend(canonical_of(v)?);
    Ok(sha256(&bytes).to_hex())
}

/// The bytes a report's signature covers.
pub fn signed_message(r: &UsageReport) -> Result<Vec<u8>, UsageVerifyError> {
    let header = serde_json::json!({
        "version": r.version,
        "tenant": r.tenant,
        "from": r.from,
        "to": r.to,
        "generated_at": r.generated_at,
        "totals": to_value(&r.totals)?,
        "count": r.sandboxes.len() as u64,
        "head": r.head,
    });
    let mut m = USAGE_REPORT_DOMAIN.to_vec();
    m.extend(canonical_of(header)?);
    Ok(m)
}

/// Rounds to a thousandth (what reports carry).
pub fn milli(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The sums of `records`, as a report carries them.
pub fn totals_of(records: &[SandboxUsage]) -> UsageTotals {
    let mut t = UsageTotals {
        sandboxes: records.len() as u64,
        ..UsageTotals::default()
    };
    for r in records {
        t.vcpu_seconds += r.vcpu_seconds;
        t.memory_gib_seconds += r.memory_gib_seconds;
        t.memory_peak_bytes = t.memory_peak_bytes.max(r.memory_peak_bytes);
        t.disk_gib_seconds += r.disk_gib_seconds;
        t.egress_bytes += r.egress_bytes;
        t.exec_count += r.exec_count;
        t.running_seconds += r.running_seconds;
        t.paused_seconds += r.paused_seconds;
    }
    t.vcpu_seconds = milli(t.vcpu_seconds);
    t.memory_gib_seconds = milli(t.memory_gib_seconds);
    t.disk_gib_seconds = milli(t.disk_gib_seconds);
    t.running_seconds = milli(t.running_seconds);
    t.paused_seconds = milli(t.paused_seconds);
    t
}

/// Makes a report of `records` (their `prev` and `hash` are set here): chains them, sums
/// them and signs the whole with `key`.
pub fn seal(
    tenant: Option<String>,
    from: String,
    to: String,
    generated_at: String,
    mut records: Vec<SandboxUsage>,
    key: &NodeKey,
) -> Result<UsageReport, UsageVerifyError> {
    let mut prev = ZERO_HASH.to_owned();
    for r in &mut records {
        r.prev = prev;
        r.hash = String::new();
        r.hash = record_hash(r)?;
        prev = r.hash.clone();
    }
    let mut report = UsageReport {
        version: USAGE_FORMAT,
        tenant,
        from,
        to,
        generated_at,
        totals: totals_of(&records),
        sandboxes: records,
        head: prev,
        signature: UsageSignature {
            key: key.public_key().to_string(),
            key_id: key.key_id().to_hex(),
            sig: String::new(),
        },
    };
    report.signature.sig = key.sign_hex(&signed_message(&report)?);
    Ok(report)
}

fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

/// Verifies a report (its JSON bytes): every record's link and hash, the head, the totals and
/// the signature, against `expected` when given (else the key the report names; pin the
/// node's key, from `GET /v1/audit/key`, to know who signed it).
pub fn verify_usage(
    bytes: &[u8],
    expected: Option<&PublicKey>,
) -> Result<UsageCheck, UsageVerifyError> {
    let r: UsageReport =
        serde_json::from_slice(bytes).map_err(|e| UsageVerifyError::Format(e.to_string()))?;
    if r.version != USAGE_FORMAT {
        return Err(UsageVerifyError::Version(r.version));
    }
    let mut prev = ZERO_HASH.to_owned();
    for (index, rec) in r.sandboxes.iter().enumerate() {
        if rec.prev != prev {
            return Err(UsageVerifyError::Link {
                index,
                id: rec.id.clone(),
            });
        }
        if record_hash(rec)? != rec.hash {
            return Err(UsageVerifyError::Content {
                index,
                id: rec.id.clone(),
            });
        }
        prev = rec.hash.clone();
    }
    if r.head != prev {
        return Err(UsageVerifyError::Head);
    }
    let t = totals_of(&r.sandboxes);
    let checks: [(&'static str, bool); 9] = [
        ("sandboxes", t.sandboxes == r.totals.sandboxes),
        ("vcpu_seconds", same(t.vcpu_seconds, r.totals.vcpu_seconds)),
        (
            "memory_gib_seconds",
            same(t.memory_gib_seconds, r.totals.memory_gib_seconds),
        ),
        (
            "memory_peak_bytes",
            t.memory_peak_bytes == r.totals.memory_peak_bytes,
        ),
        (
            "disk_gib_seconds",
            same(t.disk_gib_seconds, r.totals.disk_gib_seconds),
        ),
        ("egress_bytes", t.egress_bytes == r.totals.egress_bytes),
        ("exec_count", t.exec_count == r.totals.exec_count),
        (
            "running_seconds",
            same(t.running_seconds, r.totals.running_seconds),
        ),
        (
            "paused_seconds",
            same(t.paused_seconds, r.totals.paused_seconds),
        ),
    ];
    if let Some((field, _)) = checks.iter().find(|(_, ok)| !ok) {
        return Err(UsageVerifyError::Totals(field));
    }
    let named = PublicKey::parse(&r.signature.key).map_err(|_| UsageVerifyError::Signature)?;
    if let Some(k) = expected {
        if *k != named {
            return Err(UsageVerifyError::KeyMismatch {
                found: named.to_string(),
                expected: k.to_string(),
            });
        }
    }
    if named.key_id().to_hex() != r.signature.key_id
        || !verify_hex(&named, &signed_message(&r)?, &r.signature.sig)
    {
        return Err(UsageVerifyError::Signature);
    }
    Ok(UsageCheck {
        records: r.sandboxes.len(),
        key: named.to_string(),
        tenant: r.tenant,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, cpu: f64, execs: u64) -> SandboxUsage {
        SandboxUsage {
            id: id.into(),
            tenant: Some("acme".into()),
            template: "base".into(),
            started_at: "2026-12-01T10:00:00.000Z".into(),
            ended_at: Some("2026-12-01T10:01:00.000Z".into()),
            vcpu_seconds: cpu,
            memory_gib_seconds: 30.0,
            memory_peak_bytes: 1 << 20,
            disk_gib_seconds: 120.0,
            egress_bytes: 512,
            exec_count: execs,
            running_seconds: 60.0,
            paused_seconds: 0.0,
            prev: String::new(),
            hash: String::new(),
        }
    }

    fn report(key: &NodeKey) -> Vec<u8> {
        let r = seal(
            Some("acme".into()),
            "2026-12-01T00:00:00.000Z".into(),
            "2026-12-02T00:00:00.000Z".into(),
            "2026-12-02T00:00:01.000Z".into(),
            vec![rec("a", 3.014, 2), rec("b", 0.5, 1), rec("c", 1.0, 0)],
            key,
        )
        .unwrap();
        serde_json::to_vec_pretty(&r).unwrap()
    }

    fn edit(bytes: &[u8], f: impl FnOnce(&mut Value)) -> Vec<u8> {
        let mut v: Value = serde_json::from_slice(bytes).unwrap();
        f(&mut v);
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn a_sealed_report_verifies_and_sums() {
        let key = NodeKey::from_seed(&[7; 32]);
        let bytes = report(&key);
        let ok = verify_usage(&bytes, Some(&key.public_key())).unwrap();
        assert_eq!(ok.records, 3);
        let r: UsageReport = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(r.totals.exec_count, 3);
        assert!((r.totals.vcpu_seconds - 4.514).abs() < 1e-9);
        assert_eq!(r.sandboxes[0].prev, ZERO_HASH);
        assert_eq!(r.head, r.sandboxes[2].hash);
    }

    #[test]
    fn tampering_names_the_bad_record() {
        let key = NodeKey::from_seed(&[7; 32]);
        let bytes = report(&key);
        let changed = edit(&bytes, |v| v["sandboxes"][1]["vcpu_seconds"] = 0.1.into());
        assert_eq!(
            verify_usage(&changed, None).unwrap_err(),
            UsageVerifyError::Content {
                index: 1,
                id: "b".into()
            }
        );
        let dropped = edit(&bytes, |v| {
            v["sandboxes"].as_array_mut().unwrap().remove(0);
        });
        assert_eq!(
            verify_usage(&dropped, None).unwrap_err(),
            UsageVerifyError::Link {
                index: 0,
                id: "b".into()
            }
        );
        let cut = edit(&bytes, |v| {
            v["sandboxes"].as_array_mut().unwrap().pop();
        });
        assert_eq!(
            verify_usage(&cut, None).unwrap_err(),
            UsageVerifyError::Head
        );
        let totals = edit(&bytes, |v| v["totals"]["exec_count"] = 1.into());
        assert_eq!(
            verify_usage(&totals, None).unwrap_err(),
            UsageVerifyError::Totals("exec_count")
        );
        let range = edit(&bytes, |v| v["to"] = "2026-12-03T00:00:00.000Z".into());
        assert_eq!(
            verify_usage(&range, None).unwrap_err(),
            UsageVerifyError::Signature
        );
        let other = NodeKey::from_seed(&[8; 32]);
        assert!(matches!(
            verify_usage(&bytes, Some(&other.public_key())).unwrap_err(),
            UsageVerifyError::KeyMismatch { .. }
        ));
        // Resealed by another key, it verifies only against that key.
        let forged = report(&other);
        assert!(verify_usage(&forged, Some(&key.public_key())).is_err());
    }
}
