//! The per-sandbox hash chain: building it and checking it.

use crate::canonical::{normalize_numbers, EncodeError, StrictValue};
use crate::error::VerifyError;
use crate::hash::{event_canonical_bytes, event_hash, genesis, sha256, EVENT_DOMAIN};
use crate::merkle::HeadLeaf;
use rampart_types::audit::{Authority, Event, EventBody, Hash};
use rampart_types::SandboxId;
use serde::Deserialize;
use serde_json::Value;
use time::OffsetDateTime;

/// An audit timestamp: RFC 3339, UTC, exactly three fraction digits
/// (`2026-05-01T12:00:00.123Z`).
pub fn format_time(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// The current time as an audit timestamp.
pub fn now() -> String {
    format_time(OffsetDateTime::now_utc())
}

/// Whether `s` is an audit timestamp (shape and calendar validity).
pub fn is_valid_time(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 24 {
        return false;
    }
    for (i, &c) in b.iter().enumerate() {
        let ok = match i {
            4 | 7 => c == b'-',
            10 => c == b'T',
            13 | 16 => c == b':',
            19 => c == b'.',
            23 => c == b'Z',
            _ => c.is_ascii_digit(),
        };
        if !ok {
            return false;
        }
    }
    let num = |r: std::ops::Range<usize>| -> u32 {
        b[r].iter().fold(0u32, |n, &c| n * 10 + u32::from(c - b'0'))
    };
    let (year, month, day) = (num(0..4) as i32, num(5..7) as u8, num(8..10) as u8);
    let Ok(month) = time::Month::try_from(month) else {
        return false;
    };
    time::Date::from_calendar_date(year, month, day).is_ok()
        && num(11..13) < 24
        && num(14..16) < 60
        && num(17..19) < 60
}

/// Fills in what the canonical encoding requires of a body: numbers in the free-form JSON
/// members (`created.spec`, `created.policy`, `network.detail`, `policy_changed.policy`)
/// that are not safe integers become strings (see [`normalize_numbers`]).
pub fn normalize_body(body: &mut EventBody) {
    match body {
        EventBody::Created(c) => {
            normalize_numbers(&mut c.spec);
            normalize_numbers(&mut c.policy);
        }
        EventBody::Network(n) => normalize_numbers(&mut n.detail),
        EventBody::PolicyChanged(p) => normalize_numbers(&mut p.policy),
        _ => {}
    }
}

/// Why [`Chain::advance`] refused an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// the event does not extend this chain
    #[error("event seq {seq} does not extend the chain of {sandbox} at length {length}")]
    DoesNotExtend {
        /// The event's seq.
        seq: u64,
        /// The chain's sandbox.
        sandbox: String,
        /// The chain's length.
        length: u64,
    },
    /// the event cannot be encoded
    #[error("the event cannot be encoded: {0}")]
    Encode(#[from] EncodeError),
}

/// One sandbox's chain: its length and head. Builds events that extend it.
///
/// The daemon keeps one per live sandbox. To record something inside a store transaction:
/// `let e = chain.next_event(body, now())?;` write `e` in the same transaction as the state
/// change, and once it commits, `chain.advance(&e)?`. (If the transaction fails, the chain
/// is untouched.) [`Chain::append`] does both when nothing can fail in between.
/// After a restart, [`Chain::resume`] from the last stored event (`seq + 1`, `hash`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    sandbox: SandboxId,
    length: u64,
    head: Hash,
}

impl Chain {
    /// An empty chain; its head is the sandbox's genesis value.
    pub fn new(sandbox: SandboxId) -> Self {
        let head = genesis(&sandbox);
        Chain {
            sandbox,
            length: 0,
            head,
        }
    }

    /// A chain of `length` events whose last hash is `head` (for `length` 0, pass
    /// [`genesis`]). Trusts its inputs; verify the stored events first if in doubt.
    pub fn resume(sandbox: SandboxId, length: u64, head: Hash) -> Self {
        Chain {
            sandbox,
            length,
            head,
        }
    }

    /// The chain that `events` form, after checking them with [`verify_chain`].
    pub fn from_events(sandbox: SandboxId, events: &[Event]) -> Result<Self, VerifyError> {
        let summary = verify_chain(&sandbox, events)?;
        Ok(Chain {
            sandbox,
            length: summary.length,
            head: summary.head,
        })
    }

    /// The sandbox.
    pub fn sandbox(&self) -> &SandboxId {
        &self.sandbox
    }

    /// How many events the chain holds (the next event's seq).
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Whether the chain holds no event.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// The last event's hash (genesis when empty).
    pub fn head(&self) -> Hash {
        self.head
    }

    /// The Merkle leaf that publishes this chain's current head.
    pub fn leaf(&self) -> HeadLeaf {
        HeadLeaf {
            sandbox: self.sandbox.clone(),
            length: self.length,
            head: self.head,
        }
    }

    /// The next event, with seq, prev and hash filled in; the chain does not move (see
    /// [`Chain::advance`]). `time` should come from [`now`]. Free-form JSON members are
    /// normalized first ([`normalize_body`]).
    pub fn next_event(&self, mut body: EventBody, time: String) -> Result<Event, EncodeError> {
        normalize_body(&mut body);
        let value = serde_json::to_value(&body).map_err(|e| EncodeError::Json(e.to_string()))?;
        let mut scratch = Vec::with_capacity(512);
        let hash = event_hash(
            self.length,
            &time,
            self.sandbox.as_str(),
            &self.head,
            None,
            &value,
            &mut scratch,
        )?;
        Ok(Event {
            seq: self.length,
            time,
            sandbox: self.sandbox.clone(),
            prev: self.head,
            hash,
            auth: None,
            body,
        })
    }

    /// [`Chain::next_event`], with the event's canonical JSON (the bytes
    /// [`crate::canonical::to_canonical`] makes of the whole event), both from one encoding of
    /// the body: the canonical event is the hashed object with `"hash"` inserted between
    /// `"body"` and `"prev"` (the keys are sorted).
    pub fn next_event_json(
        &self,
        mut body: EventBody,
        time: String,
        auth: Option<Authority>,
    ) -> Result<(Event, String), EncodeError> {
        normalize_body(&mut body);
        let value = serde_json::to_value(&body).map_err(|e| EncodeError::Json(e.to_string()))?;
        let auth_value = auth
            .as_ref()
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| EncodeError::Json(e.to_string()))?;
        let mut buf = Vec::with_capacity(1024);
        buf.extend_from_slice(EVENT_DOMAIN);
        event_canonical_bytes(
            self.length,
            &time,
            self.sandbox.as_str(),
            &self.head,
            auth_value.as_ref(),
            &value,
            &mut buf,
        )?;
        let hash = sha256(&buf);
        let hashed = &buf[EVENT_DOMAIN.len()..];
        // What follows the body: `,"prev":"<hex>","sandbox":..,"seq":..,"time":..}`. Nothing
        // after it can hold this text (an id, digits, a timestamp), so the last one is it.
        const PREV: &[u8] = b",\"prev\":\"";
        let split = hashed
            .windows(PREV.len())
            .rposition(|w| w == PREV)
            .ok_or(EncodeError::NoPrev)?;
        let mut json = String::with_capacity(hashed.len() + 80);
        // The canonical encoder writes UTF-8 text.
        json.push_str(std::str::from_utf8(&hashed[..split])?);
        json.push_str(",\"hash\":\"");
        hash.write_hex(&mut json);
        json.push('"');
        json.push_str(std::str::from_utf8(&hashed[split..])?);
        let event = Event {
            seq: self.length,
            time,
            sandbox: self.sandbox.clone(),
            prev: self.head,
            hash,
            auth,
            body,
        };
        Ok((event, json))
    }

    /// Moves the chain past `event`, which must have been made by [`Chain::next_event`] on
    /// this chain in its current state (its hash is recomputed and checked).
    pub fn advance(&mut self, event: &Event) -> Result<(), ChainError> {
        let refuse = || ChainError::DoesNotExtend {
            seq: event.seq,
            sandbox: self.sandbox.to_string(),
            length: self.length,
        };
        if event.seq != self.length || event.prev != self.head || event.sandbox != self.sandbox {
            return Err(refuse());
        }
        let value =
            serde_json::to_value(&event.body).map_err(|e| EncodeError::Json(e.to_string()))?;
        let auth = event
            .auth
            .as_ref()
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| EncodeError::Json(e.to_string()))?;
        let mut scratch = Vec::with_capacity(512);
        let hash = event_hash(
            event.seq,
            &event.time,
            event.sandbox.as_str(),
            &event.prev,
            auth.as_ref(),
            &value,
            &mut scratch,
        )?;
        if hash != event.hash {
            return Err(refuse());
        }
        self.length += 1;
        self.head = event.hash;
        Ok(())
    }

    /// [`Chain::next_event`] then [`Chain::advance`].
    pub fn append(&mut self, body: EventBody, time: String) -> Result<Event, EncodeError> {
        let event = self.next_event(body, time)?;
        self.length += 1;
        self.head = event.hash;
        Ok(event)
    }
}

/// What a verified chain amounts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSummary {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// Number of events.
    pub length: u64,
    /// The last event's hash (genesis when empty).
    pub head: Hash,
    /// Time of the first event.
    pub first_time: Option<String>,
    /// Time of the last event.
    pub last_time: Option<String>,
    /// Seqs of events whose time is earlier than the event before (a clock stepped back;
    /// not an integrity failure, but worth a look).
    pub time_regressions: Vec<u64>,
}

/// An event as read from a file, before its body is interpreted: the hash is checked
/// over exactly what was read.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEvent {
    pub seq: u64,
    pub time: String,
    pub sandbox: String,
    pub prev: Hash,
    pub hash: Hash,
    /// Absent in older records; never `null` (one meaning, one spelling).
    #[serde(default, deserialize_with = "present")]
    pub auth: Option<StrictValue>,
    pub body: StrictValue,
}

/// A member that, when present, has a value (`null` is refused).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<StrictValue>, D::Error> {
    let v = StrictValue::deserialize(d)?;
    if v.0.is_null() {
        return Err(serde::de::Error::custom(
            "auth is absent or an object, never null",
        ));
    }
    Ok(Some(v))
}

/// Checks typed events as one sandbox's complete log from seq 0: order, links, hashes,
/// times, body shapes. Stops at the first bad record and names it.
pub fn verify_chain(sandbox: &SandboxId, events: &[Event]) -> Result<ChainSummary, VerifyError> {
    let mut v = ChainVerifier::new(sandbox.clone());
    for (i, e) in events.iter().enumerate() {
        let body = serde_json::to_value(&e.body).map_err(|err| VerifyError::BadRecord {
            position: i as u64,
            reason: err.to_string(),
        })?;
        let auth = e
            .auth
            .as_ref()
            .map(|a| serde_json::to_value(a).map(StrictValue))
            .transpose()
            .map_err(|err| VerifyError::BadRecord {
                position: i as u64,
                reason: err.to_string(),
            })?;
        let raw = RawEvent {
            seq: e.seq,
            time: e.time.clone(),
            sandbox: e.sandbox.to_string(),
            prev: e.prev,
            hash: e.hash,
            auth,
            body: StrictValue(body),
        };
        v.check(&raw, |seq| events[i + 1..].iter().any(|x| x.seq == seq))?;
    }
    Ok(v.finish())
}

/// Whether the principal a record names (`caller`) may run commands: a native key's scopes
/// (`key:<id>:<name> (<scopes>) ...`) must hold `exec` or `admin`; the node's socket, E2B
/// keys (whose teams hold every right) and the node itself may.
pub fn may_exec(caller: &str) -> bool {
    let Some(rest) = caller.strip_prefix("key:") else {
        return true;
    };
    // The scopes are the last ` (a,b,c)` group of lowercase names (a key's name may hold
    // parentheses of its own before it).
    let scopes = rest.rmatch_indices(" (").find_map(|(i, _)| {
        let inner = &rest[i + 2..];
        let end = inner.find(')')?;
        let list = &inner[..end];
        list.bytes()
            .all(|b| b.is_ascii_lowercase() || b == b',')
            .then_some(list)
    });
    scopes.is_some_and(|l| l.split(',').any(|s| s == "exec" || s == "admin"))
}

/// Checks a log one record at a time, in order (so a large log never has to be held
/// parsed in memory).
#[derive(Debug)]
pub(crate) struct ChainVerifier {
    sandbox: SandboxId,
    head: Hash,
    next: u64,
    first_time: Option<String>,
    last_time: Option<String>,
    regressions: Vec<u64>,
    scratch: Vec<u8>,
    /// Hashes of the `fs_diff` records seen (a `destroyed.manifest_digest` names one).
    fs_diffs: std::collections::HashSet<Hash>,
    /// Approvals requested (id to the request's digest) and those approved.
    requested: std::collections::HashMap<String, String>,
    approved: std::collections::HashSet<String>,
    /// Host approvals requested: id to the `host:port` asked about.
    asked_hosts: std::collections::HashMap<String, String>,
    /// The policy in force so far.
    policy: crate::authority::PolicyState,
}

impl ChainVerifier {
    pub(crate) fn new(sandbox: SandboxId) -> Self {
        let head = genesis(&sandbox);
        ChainVerifier {
            sandbox,
            head,
            next: 0,
            first_time: None,
            last_time: None,
            regressions: Vec::new(),
            scratch: Vec::with_capacity(1024),
            fs_diffs: std::collections::HashSet::new(),
            requested: std::collections::HashMap::new(),
            approved: std::collections::HashSet::new(),
            asked_hosts: std::collections::HashMap::new(),
            policy: crate::authority::PolicyState::new(),
        }
    }

    /// Checks the next record and returns its typed body. `appears_later(seq)` tells
    /// whether a record with that seq comes later in the log (only asked on failure, to
    /// tell a missing record from a reordered one).
    pub(crate) fn check(
        &mut self,
        e: &RawEvent,
        appears_later: impl FnOnce(u64) -> bool,
    ) -> Result<EventBody, VerifyError> {
        let position = self.next;
        if e.sandbox != self.sandbox.as_str() {
            return Err(VerifyError::WrongSandbox {
                seq: e.seq,
                found: e.sandbox.clone(),
                expected: self.sandbox.to_string(),
            });
        }
        if e.seq != position {
            return Err(if e.seq > position && !appears_later(position) {
                VerifyError::Missing {
                    seq: position,
                    found: e.seq,
                }
            } else {
                VerifyError::OutOfOrder {
                    seq: e.seq,
                    position,
                }
            });
        }
        if !is_valid_time(&e.time) {
            return Err(VerifyError::BadTime {
                seq: e.seq,
                time: e.time.clone(),
            });
        }
        if e.prev != self.head {
            return Err(VerifyError::BrokenLink { seq: e.seq });
        }
        let computed = event_hash(
            e.seq,
            &e.time,
            &e.sandbox,
            &e.prev,
            e.auth.as_ref().map(|a| &a.0),
            &e.body.0,
            &mut self.scratch,
        )
        .map_err(|err| VerifyError::BadBody {
            seq: e.seq,
            reason: err.to_string(),
        })?;
        if computed != e.hash {
            return Err(VerifyError::BadHash { seq: e.seq });
        }
        let body = interpret(e.seq, &e.body.0)?;
        self.policy.observe(&body);
        if let Some(a) = &e.auth {
            let a = Authority::deserialize(&a.0).map_err(|err| VerifyError::BadBody {
                seq: e.seq,
                reason: format!("auth: {err}"),
            })?;
            if a.policy != self.policy.digest() {
                return Err(VerifyError::BadBody {
                    seq: e.seq,
                    reason: format!(
                        "names policy {}, but the policy the record puts in force is {}",
                        a.policy.short(),
                        self.policy.digest().short()
                    ),
                });
            }
            if matches!(body, EventBody::Exec(_)) && !may_exec(&a.principal) {
                return Err(VerifyError::BadBody {
                    seq: e.seq,
                    reason: format!(
                        "done for {}, whose scopes hold neither exec nor admin",
                        a.principal
                    ),
                });
            }
        }
        match &body {
            EventBody::FsDiff(_) => {
                self.fs_diffs.insert(e.hash);
            }
            EventBody::ApprovalRequested(r) => {
                self.requested
                    .insert(r.approval_id.clone(), r.digest.clone());
                if r.kind == "host" {
                    self.asked_hosts
                        .insert(r.approval_id.clone(), r.request.clone());
                }
            }
            EventBody::Network(n) => {
                // A connection let through by an approval names it: one given before, for
                // this very host and port.
                let rule = n.detail.get("rule").and_then(|r| r.as_str());
                if let Some(a) = rule.and_then(|r| r.strip_prefix("approved:")) {
                    let this = format!("{}:{}", n.host, n.port.unwrap_or(0));
                    if !self.approved.contains(a) || self.asked_hosts.get(a) != Some(&this) {
                        return Err(VerifyError::BadBody {
                            seq: e.seq,
                            reason: format!(
                                "a connection to {this} let through under approval {a}, which \
                                 no record before it approved for that host"
                            ),
                        });
                    }
                }
            }
            EventBody::ApprovalDecided(d) => {
                let bad = |reason: String| VerifyError::BadBody { seq: e.seq, reason };
                match self.requested.get(&d.approval_id) {
                    None => {
                        return Err(bad(format!(
                            "decides approval {} that no approval_requested before it asked for",
                            d.approval_id
                        )))
                    }
                    Some(digest) if *digest != d.digest => {
                        return Err(bad(format!(
                            "decides approval {} on another request than was asked (digest {})",
                            d.approval_id, d.digest
                        )))
                    }
                    Some(_) => {}
                }
                if d.decision == "approved" {
                    self.approved.insert(d.approval_id.clone());
                }
            }
            EventBody::Exec(x) => {
                if let Some(c) = &x.caller {
                    if !may_exec(c) {
                        return Err(VerifyError::BadBody {
                            seq: e.seq,
                            reason: format!(
                                "asked by {c}, whose scopes hold neither exec nor admin"
                            ),
                        });
                    }
                }
                if x.approval.is_none() {
                    if let Some(rule) = self.policy.holds(&x.argv) {
                        return Err(VerifyError::BadBody {
                            seq: e.seq,
                            reason: format!(
                                "runs a command the approval policy holds ({rule:?}) without \
                                 an approval"
                            ),
                        });
                    }
                }
                if let Some(a) = &x.approval {
                    if !self.approved.contains(a) {
                        return Err(VerifyError::BadBody {
                            seq: e.seq,
                            reason: format!(
                                "runs under approval {a}, which no record before it approved"
                            ),
                        });
                    }
                }
            }
            EventBody::Package(p) => {
                if let Err(why) = package_well_formed(p) {
                    return Err(VerifyError::BadBody {
                        seq: e.seq,
                        reason: why.to_string(),
                    });
                }
            }
            EventBody::Destroyed(d) => {
                if let Some(m) = d.manifest_digest {
                    if !self.fs_diffs.contains(&m) {
                        return Err(VerifyError::BadBody {
                            seq: e.seq,
                            reason: format!(
                                "manifest_digest {} names no fs_diff record before it",
                                m.to_hex()
                            ),
                        });
                    }
                }
            }
            _ => {}
        }
        match &mut self.last_time {
            Some(last) => {
                if e.time < *last {
                    self.regressions.push(e.seq);
                }
                last.clone_from(&e.time);
            }
            None => {
                self.first_time = Some(e.time.clone());
                self.last_time = Some(e.time.clone());
            }
        }
        self.head = e.hash;
        self.next += 1;
        Ok(body)
    }

    pub(crate) fn finish(self) -> ChainSummary {
        ChainSummary {
            sandbox: self.sandbox,
            length: self.next,
            head: self.head,
            first_time: self.first_time,
            last_time: self.last_time,
            time_regressions: self.regressions,
        }
    }
}

/// The ecosystems a `package` record may name.
pub const PACKAGE_ECOSYSTEMS: [&str; 4] = ["pypi", "npm", "debian", "crates"];

/// Why a `package` body does not hold together (see [`package_well_formed`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackageError {
    /// An ecosystem not in [`PACKAGE_ECOSYSTEMS`].
    #[error("package of unknown ecosystem {ecosystem:?}")]
    Ecosystem {
        /// The ecosystem named.
        ecosystem: String,
    },
    /// An empty name, version or registry.
    #[error("package without a name, version or registry")]
    Incomplete,
    /// A path that does not start with `/`.
    #[error("package path {path:?} is not absolute")]
    RelativePath {
        /// The path.
        path: String,
    },
    /// `allowed` without its digest and size.
    #[error("an allowed package without its sha256 and size")]
    AllowedWithoutDigest,
    /// `allowed` under a rule that does not allow (`package`, `pinned:...`).
    #[error("an allowed package under rule {rule:?}")]
    AllowedRule {
        /// The rule.
        rule: String,
    },
    /// `denied` with a digest or a size.
    #[error("a denied package with a digest or size")]
    DeniedWithDigest,
    /// `denied` under a rule that does not refuse (`unpinned`, `package-deny:...`).
    #[error("a denied package under rule {rule:?}")]
    DeniedRule {
        /// The rule.
        rule: String,
    },
    /// A verdict other than `allowed` or `denied`.
    #[error("package verdict {verdict:?} (allowed or denied)")]
    Verdict {
        /// The verdict.
        verdict: String,
    },
}

/// Whether a `package` body holds together: a known ecosystem, a name, version, registry
/// and path; `allowed` with a digest and a size (the download completed) under an allowing
/// rule, `denied` with neither (nothing was fetched) under a refusing one.
pub fn package_well_formed(p: &rampart_types::audit::Package) -> Result<(), PackageError> {
    if !PACKAGE_ECOSYSTEMS.contains(&p.ecosystem.as_str()) {
        return Err(PackageError::Ecosystem {
            ecosystem: p.ecosystem.clone(),
        });
    }
    if p.name.is_empty() || p.version.is_empty() || p.registry.is_empty() {
        return Err(PackageError::Incomplete);
    }
    if !p.path.starts_with('/') {
        return Err(PackageError::RelativePath {
            path: p.path.clone(),
        });
    }
    let fetched = p.sha256.is_some() && p.size.is_some();
    let nothing = p.sha256.is_none() && p.size.is_none();
    match p.verdict.as_str() {
        "allowed" if !fetched => Err(PackageError::AllowedWithoutDigest),
        "allowed" if p.rule != "package" && !p.rule.starts_with("pinned:") => {
            Err(PackageError::AllowedRule {
                rule: p.rule.clone(),
            })
        }
        "denied" if !nothing => Err(PackageError::DeniedWithDigest),
        "denied" if p.rule != "unpinned" && !p.rule.starts_with("package-deny:") => {
            Err(PackageError::DeniedRule {
                rule: p.rule.clone(),
            })
        }
        "allowed" | "denied" => Ok(()),
        v => Err(PackageError::Verdict { verdict: v.into() }),
    }
}

/// Reads a body as its type, strictly: unknown types fail by name; unknown members,
/// missing members (an absent optional member must be spelled `null`) and mistyped members
/// fail. Together with the canonical hash this gives each record exactly one reading.
fn interpret(seq: u64, body: &Value) -> Result<EventBody, VerifyError> {
    let Some(event_type) = body.get("type").and_then(Value::as_str) else {
        return Err(VerifyError::BadBody {
            seq,
            reason: "no \"type\" string".into(),
        });
    };
    if !EventBody::TYPES.contains(&event_type) {
        return Err(VerifyError::UnknownType {
            seq,
            event_type: event_type.to_owned(),
        });
    }
    EventBody::deserialize(body).map_err(|e| VerifyError::BadBody {
        seq,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_types::audit::Snapshot;

    fn sid(s: &str) -> SandboxId {
        SandboxId::parse(s).unwrap()
    }

    #[test]
    fn times() {
        assert!(is_valid_time("2026-05-01T12:00:00.123Z"));
        assert!(!is_valid_time("2026-02-30T12:00:00.123Z"));
        assert!(!is_valid_time("2026-05-01T24:00:00.123Z"));
        assert!(!is_valid_time("2026-05-01T12:00:00Z"));
        assert!(!is_valid_time("2026-05-01 12:00:00.123Z"));
        assert!(is_valid_time(&now()));
        let t = OffsetDateTime::from_unix_timestamp_nanos(1_700_000_000_123_456_789).unwrap();
        assert_eq!(format_time(t), "2023-11-14T22:13:20.123Z");
    }

    #[test]
    fn next_event_json_is_the_canonical_event() {
        use crate::canonical::to_canonical;
        use rampart_types::audit::Exec;
        let mut c = Chain::new(sid("abc"));
        let bodies = [
            EventBody::Paused(Default::default()),
            EventBody::Exec(Exec {
                exec_id: "x1".into(),
                // Text that looks like the member after the body does not confuse it.
                argv: vec!["echo".into(), ",\"prev\":\"".into(), "é\u{1}\"".into()],
                cwd: None,
                user: "user".into(),
                env_names: vec!["A".into()],
                stdin: false,
                pty: false,
                input: None,
                caller: None,
                approval: None,
            }),
        ];
        for body in bodies {
            let (event, json) = c.next_event_json(body.clone(), now(), None).unwrap();
            assert_eq!(
                event,
                c.next_event(body.clone(), event.time.clone()).unwrap()
            );
            let value = serde_json::to_value(&event).unwrap();
            assert_eq!(json.as_bytes(), to_canonical(&value).unwrap());
            // With an authority: sorted before the body, covered by the hash.
            let auth = Authority {
                principal: "key:k1:ci (exec)".into(),
                policy: crate::authority::PolicyState::new().digest(),
            };
            let (signed, json) = c.next_event_json(body, now(), Some(auth)).unwrap();
            assert_ne!(signed.hash, event.hash);
            let value = serde_json::to_value(&signed).unwrap();
            assert_eq!(json.as_bytes(), to_canonical(&value).unwrap());
            assert!(json.starts_with("{\"auth\":{"), "{json}");
            c.advance(&signed).unwrap();
        }
    }

    /// Each event's `auth` names the policy the record puts in force at it, and an exec
    /// is done for a principal that may exec.
    #[test]
    fn an_event_names_the_policy_the_record_puts_in_force() {
        use rampart_types::audit::{Created, Exec, PolicyChanged};
        let created = EventBody::Created(Created {
            spec: serde_json::json!({"approvals": {"commands": ["^rm "]}}),
            template: "base".into(),
            template_digest: "x".into(),
            policy: serde_json::json!({"mode": "none"}),
            caller: "local".into(),
        });
        let changed = EventBody::PolicyChanged(PolicyChanged {
            policy: serde_json::json!({"mode": "open"}),
        });
        let exec = |argv: &[&str]| {
            EventBody::Exec(Exec {
                exec_id: "x1".into(),
                argv: argv.iter().map(|a| a.to_string()).collect(),
                cwd: None,
                user: "user".into(),
                env_names: vec![],
                stdin: false,
                pty: false,
                input: None,
                caller: None,
                approval: None,
            })
        };
        // Events as the daemon makes them: the digest after each body.
        let build = |bodies: &[EventBody], principal: &str, lie_at: Option<usize>| {
            let mut c = Chain::new(sid("abc"));
            let mut p = crate::authority::PolicyState::new();
            let mut out = Vec::new();
            for (i, b) in bodies.iter().enumerate() {
                p.observe(b);
                let policy = if lie_at == Some(i) {
                    crate::authority::PolicyState::new().digest()
                } else {
                    p.digest()
                };
                let auth = Authority {
                    principal: principal.into(),
                    policy,
                };
                let (e, _) = c.next_event_json(b.clone(), now(), Some(auth)).unwrap();
                c.advance(&e).unwrap();
                out.push(e);
            }
            verify_chain(&sid("abc"), &out)
        };
        let bodies = [created.clone(), exec(&["ls"]), changed, exec(&["ls"])];
        assert!(build(&bodies, "key:k:ci (exec)", None).is_ok());
        for lie in [0, 1, 2, 3] {
            assert!(
                matches!(
                    build(&bodies, "key:k:ci (exec)", Some(lie)),
                    Err(VerifyError::BadBody { seq, .. }) if seq == lie as u64
                ),
                "a stale policy digest at {lie} verified"
            );
        }
        assert!(matches!(
            build(&bodies, "key:k:ro (audit)", None),
            Err(VerifyError::BadBody { seq: 1, .. })
        ));
        // A command the approval policy holds, recorded without an approval.
        assert!(matches!(
            build(
                &[created, exec(&["rm", "-rf", "/"])],
                "key:k:ci (exec)",
                None
            ),
            Err(VerifyError::BadBody { seq: 1, .. })
        ));
    }

    #[test]
    fn chain_builds_and_verifies() {
        let mut c = Chain::new(sid("abc"));
        let g = c.head();
        let mut events = Vec::new();
        for i in 0..5 {
            let body = if i % 2 == 0 {
                EventBody::Paused(Default::default())
            } else {
                EventBody::Snapshot(Snapshot {
                    name: format!("s{i}"),
                    ..Default::default()
                })
            };
            events.push(c.append(body, now()).unwrap());
        }
        assert_eq!(events[0].prev, g);
        assert_eq!(c.len(), 5);
        let s = verify_chain(&sid("abc"), &events).unwrap();
        assert_eq!((s.length, s.head), (5, c.head()));
        assert_eq!(Chain::from_events(sid("abc"), &events).unwrap(), c);

        // next_event does not move the chain; advance checks.
        let e = c
            .next_event(EventBody::Resumed(Default::default()), now())
            .unwrap();
        assert_eq!(c.len(), 5);
        let mut forged = e.clone();
        forged.time = "2000-01-01T00:00:00.000Z".into();
        assert!(c.advance(&forged).is_err());
        c.advance(&e).unwrap();
        assert!(c.advance(&e).is_err());
        assert_eq!(c.len(), 6);

        let mut bad = events.clone();
        bad[2].body = EventBody::Snapshot(Snapshot {
            name: "evil".into(),
            ..Default::default()
        });
        assert_eq!(
            verify_chain(&sid("abc"), &bad),
            Err(VerifyError::BadHash { seq: 2 })
        );
        assert!(matches!(
            verify_chain(&sid("abd"), &events),
            Err(VerifyError::WrongSandbox { seq: 0, .. })
        ));
    }

    /// `destroyed.manifest_digest` must name an `fs_diff` record of the log.
    #[test]
    fn a_manifest_digest_names_an_fs_diff_record() {
        use rampart_types::audit::{Destroyed, FsDiff};
        let diff = EventBody::FsDiff(FsDiff {
            reason: "destroy".into(),
            added: Vec::new(),
            changed: Vec::new(),
            removed: Vec::new(),
            truncated: false,
        });
        let destroyed = |m: Option<Hash>| {
            EventBody::Destroyed(Destroyed {
                reason: "api".into(),
                manifest_digest: m,
                artifacts: None,
            })
        };
        let mut c = Chain::new(sid("abc"));
        let d = c.append(diff.clone(), now()).unwrap();
        let ok = c.append(destroyed(Some(d.hash)), now()).unwrap();
        assert!(verify_chain(&sid("abc"), &[d.clone(), ok]).is_ok());

        let mut c = Chain::new(sid("abc"));
        let p = c
            .append(EventBody::Paused(Default::default()), now())
            .unwrap();
        let bad = c.append(destroyed(Some(p.hash)), now()).unwrap();
        assert!(matches!(
            verify_chain(&sid("abc"), &[p, bad]),
            Err(VerifyError::BadBody { seq: 1, .. })
        ));
        let mut c = Chain::new(sid("abc"));
        let none = c.append(destroyed(None), now()).unwrap();
        assert!(verify_chain(&sid("abc"), &[none]).is_ok());
    }

    /// An `exec` that names an approval needs an `approval_decided` before it that approved
    /// that approval, on the request it asked about.
    #[test]
    fn an_exec_runs_only_under_an_approval_given_before_it() {
        use rampart_types::audit::{ApprovalDecided, ApprovalRequested, Exec};
        let requested = EventBody::ApprovalRequested(ApprovalRequested {
            approval_id: "ap_1".into(),
            kind: "command".into(),
            request: "rm x".into(),
            digest: "d1".into(),
            rule: "^rm".into(),
            caller: "key:k".into(),
        });
        let decided = |decision: &str, digest: &str| {
            EventBody::ApprovalDecided(ApprovalDecided {
                approval_id: "ap_1".into(),
                decision: decision.into(),
                by: "key:j".into(),
                reason: None,
                digest: digest.into(),
            })
        };
        let exec = EventBody::Exec(Exec {
            exec_id: "x1".into(),
            argv: vec!["rm".into(), "x".into()],
            cwd: None,
            user: "user".into(),
            env_names: vec![],
            stdin: false,
            pty: false,
            input: None,
            caller: Some("key:k:agent (exec)".into()),
            approval: Some("ap_1".into()),
        });
        let run = |bodies: Vec<EventBody>| {
            let mut c = Chain::new(sid("abc"));
            let evs: Vec<_> = bodies
                .into_iter()
                .map(|b| c.append(b, now()).unwrap())
                .collect();
            verify_chain(&sid("abc"), &evs)
        };
        assert!(run(vec![
            requested.clone(),
            decided("approved", "d1"),
            exec.clone()
        ])
        .is_ok());
        for (bodies, seq) in [
            (vec![exec.clone()], 0),
            (
                vec![requested.clone(), decided("denied", "d1"), exec.clone()],
                2,
            ),
            (vec![requested.clone(), decided("approved", "d2")], 1),
            (vec![decided("approved", "d1")], 0),
        ] {
            match run(bodies) {
                Err(VerifyError::BadBody { seq: s, .. }) => assert_eq!(s, seq),
                other => panic!("expected a bad body at {seq}: {other:?}"),
            }
        }
    }

    /// A connection let through under an approval names one approved before it, for the
    /// same host and port.
    #[test]
    fn a_connection_runs_only_under_an_approval_of_its_host() {
        use rampart_types::audit::{ApprovalDecided, ApprovalRequested, Network};
        let requested = |kind: &str| {
            EventBody::ApprovalRequested(ApprovalRequested {
                approval_id: "ap_1".into(),
                kind: kind.into(),
                request: "a.example.com:443".into(),
                digest: "d1".into(),
                rule: "*.example.com".into(),
                caller: "sandbox abc".into(),
            })
        };
        let decided = |decision: &str| {
            EventBody::ApprovalDecided(ApprovalDecided {
                approval_id: "ap_1".into(),
                decision: decision.into(),
                by: "key:j".into(),
                reason: None,
                digest: "d1".into(),
            })
        };
        let conn = |host: &str| {
            EventBody::Network(Network {
                kind: "connect".into(),
                host: host.into(),
                port: Some(443),
                verdict: "allowed".into(),
                detail: serde_json::json!({"rule": "approved:ap_1"}),
            })
        };
        let run = |bodies: Vec<EventBody>| {
            let mut c = Chain::new(sid("abc"));
            let evs: Vec<_> = bodies
                .into_iter()
                .map(|b| c.append(b, now()).unwrap())
                .collect();
            verify_chain(&sid("abc"), &evs)
        };
        assert!(run(vec![
            requested("host"),
            decided("approved"),
            conn("a.example.com")
        ])
        .is_ok());
        for (bodies, seq) in [
            (vec![conn("a.example.com")], 0),
            (
                vec![requested("host"), decided("denied"), conn("a.example.com")],
                2,
            ),
            (
                vec![
                    requested("host"),
                    decided("approved"),
                    conn("b.example.com"),
                ],
                2,
            ),
            (
                vec![
                    requested("command"),
                    decided("approved"),
                    conn("a.example.com"),
                ],
                2,
            ),
        ] {
            match run(bodies) {
                Err(VerifyError::BadBody { seq: s, .. }) => assert_eq!(s, seq),
                other => panic!("expected a bad body at {seq}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_exec_is_asked_by_a_principal_that_may_exec() {
        for (c, ok) in [
            ("key:abc:ci (exec,files) from 10.0.0.1:4000", true),
            ("key:abc:ops (admin)", true),
            (
                "key:abc:ro (audit,sandboxes) tenant acme from 1.2.3.4:5",
                false,
            ),
            ("key:abc:weird (exec) name (audit) via mcp:claude", false),
            ("socket uid 0", true),
            ("e2b-key:k1:team from 127.0.0.1:1", true),
            ("local", true),
        ] {
            assert_eq!(may_exec(c), ok, "{c}");
        }
    }

    #[test]
    fn package_records_must_hold_together() {
        use rampart_types::audit::Package;
        let ok = Package {
            ecosystem: "pypi".into(),
            name: "six".into(),
            version: "1.16.0".into(),
            registry: "files.pythonhosted.org".into(),
            path: "/packages/x/six-1.16.0-py2.py3-none-any.whl".into(),
            verdict: "allowed".into(),
            rule: "package".into(),
            sha256: Some(Hash([7; 32])),
            size: Some(11053),
        };
        assert_eq!(package_well_formed(&ok), Ok(()));
        let denied = Package {
            verdict: "denied".into(),
            rule: "package-deny:^six$".into(),
            sha256: None,
            size: None,
            ..ok.clone()
        };
        assert_eq!(package_well_formed(&denied), Ok(()));
        for bad in [
            Package {
                ecosystem: "cpan".into(),
                ..ok.clone()
            },
            Package {
                sha256: None,
                ..ok.clone()
            },
            Package {
                rule: "unpinned".into(),
                ..ok.clone()
            },
            Package {
                size: Some(1),
                ..denied.clone()
            },
            Package {
                rule: "package".into(),
                ..denied.clone()
            },
            Package {
                verdict: "maybe".into(),
                ..ok.clone()
            },
            Package {
                name: String::new(),
                ..ok.clone()
            },
        ] {
            assert!(package_well_formed(&bad).is_err(), "{bad:?}");
        }
        // In a chain: the verifier refuses the record by its seq.
        let sb = sid("abc");
        let mut chain = Chain::new(sb.clone());
        let t = "2026-05-01T12:00:00.000Z".to_string();
        let good = chain
            .append(EventBody::Package(ok.clone()), t.clone())
            .unwrap();
        let bad = chain
            .append(EventBody::Package(Package { sha256: None, ..ok }), t)
            .unwrap();
        assert!(verify_chain(&sb, std::slice::from_ref(&good)).is_ok());
        match verify_chain(&sb, &[good, bad]) {
            Err(VerifyError::BadBody { seq: 1, reason }) => {
                assert!(reason.contains("sha256"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_and_sloppy_bodies_are_named() {
        let v: Value = serde_json::json!({"type": "teleported"});
        assert!(matches!(
            interpret(7, &v),
            Err(VerifyError::UnknownType { seq: 7, .. })
        ));
        let v: Value = serde_json::json!({"type": "destroyed", "reason": "api"});
        assert!(matches!(
            interpret(3, &v),
            Err(VerifyError::BadBody { seq: 3, .. })
        ));
        let v: Value =
            serde_json::json!({"type": "destroyed", "reason": "api", "manifest_digest": null});
        assert!(interpret(3, &v).is_ok());
    }
}
