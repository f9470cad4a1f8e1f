//! Audit events: the records of the per-sandbox, hash-chained log.
//!
//! These are plain data. Hashing, chaining, signing and verification live in the
//! `rampart-audit` crate; `docs/proof.md` describes the wire format precisely.
//!
//! Every body struct refuses unknown fields, and [`EventBody`] is tagged by `type`: a body
//! of a type this version does not know is an error, never skipped. Fields whose value is
//! absent are written as `null` (never omitted) so that one meaning has one encoding.

use crate::SandboxId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A 32-byte SHA-256 value, written as 64 lowercase hex digits.
///
/// Used for event hashes, chain links and content digests. A content digest is the plain
/// SHA-256 of the bytes (what `sha256sum` prints); event and tree hashes are
/// domain-separated (see `docs/proof.md`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Hash(pub [u8; 32]);

/// Errors of parsing a [`Hash`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HashParseError {
    /// a hash must be 64 lowercase hex digits
    #[error("a hash must be 64 lowercase hex digits")]
    Invalid,
}

impl Hash {
    /// The all-zero value (never the hash of anything in practice; used as a placeholder).
    pub const ZERO: Hash = Hash([0; 32]);

    /// Parses 64 lowercase hex digits. Uppercase is refused so a hash has one spelling.
    pub fn parse(s: &str) -> Result<Self, HashParseError> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return Err(HashParseError::Invalid);
        }
        let mut out = [0u8; 32];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            let hi = hex_val(pair[0]).ok_or(HashParseError::Invalid)?;
            let lo = hex_val(pair[1]).ok_or(HashParseError::Invalid)?;
            out[i] = (hi << 4) | lo;
        }
        Ok(Hash(out))
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Writes the 64 hex digits into `out`.
    pub fn write_hex(&self, out: &mut String) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for byte in self.0 {
            out.push(DIGITS[(byte >> 4) as usize] as char);
            out.push(DIGITS[(byte & 15) as usize] as char);
        }
    }

    /// The 64 hex digits.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        self.write_hex(&mut s);
        s
    }

    /// The first 12 hex digits, for display.
    pub fn short(&self) -> String {
        let mut s = self.to_hex();
        s.truncate(12);
        s
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", self.to_hex())
    }
}

impl std::str::FromStr for Hash {
    type Err = HashParseError;
    fn from_str(s: &str) -> Result<Self, HashParseError> {
        Hash::parse(s)
    }
}

impl Serialize for Hash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Hash;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("64 lowercase hex digits")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Hash, E> {
                Hash::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// Reads an `Option` field that must be present (as `null` when absent): serde would
/// otherwise take a missing member for `None`, giving one meaning two spellings.
fn required<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// Reads a member added to a body after records without it were written: absent (an older
/// record) or a value, never `null`, so that each meaning still has one spelling.
fn added_member<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// One record of a sandbox's audit log.
///
/// `hash` is computed over (`seq`, `time`, `sandbox`, `prev`, `body`); `prev` is the `hash`
/// of the record before, or the sandbox's genesis value for `seq` 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// Position in the sandbox's log, from 0, without gaps.
    pub seq: u64,
    /// When it happened: RFC 3339, UTC, milliseconds (`2026-05-01T12:00:00.123Z`).
    pub time: String,
    /// The sandbox whose log this is.
    pub sandbox: SandboxId,
    /// The hash of the previous record (the genesis value for `seq` 0).
    pub prev: Hash,
    /// This record's hash.
    pub hash: Hash,
    /// Who it was done for and the policy in force (absent in records made before events
    /// named them; never `null`, see [`added_member`]). Covered by `hash`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub auth: Option<Authority>,
    /// What happened.
    pub body: EventBody,
}

/// Who an event was done for, and the digest of the policy in force when it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Authority {
    /// The principal, as `created.caller` names callers (`key:<id>:<name> (<scopes>)
    /// tenant <t> from <addr>`, `socket uid 0`, `e2b-key:...`); `sandbox` for what the
    /// sandbox's own processes did (its network traffic); `node` for the daemon's own work
    /// (the reaper, recovery).
    pub principal: String,
    /// SHA-256 of the canonical JSON of `{"approvals": A, "network": N}`: the sandbox's
    /// approval policy (its create request's `approvals`, `null` when none) and its network
    /// policy (`created.policy`, then each `policy_changed.policy`), as the record holds
    /// them. A verifier recomputes it from the record.
    pub policy: Hash,
}

/// What an audit event records, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    /// The sandbox was created.
    Created(Created),
    /// A process was started.
    Exec(Exec),
    /// A process ended.
    Exit(Exit),
    /// A file operation made through the API.
    File(FileChange),
    /// The writable layer against the template, at snapshot or destroy.
    FsDiff(FsDiff),
    /// A network decision (DNS answer, connection verdict).
    Network(Network),
    /// A secret was substituted on the way to a host.
    SecretUsed(SecretUsed),
    /// The network policy changed.
    PolicyChanged(PolicyChanged),
    /// The sandbox's deadline changed.
    TimeoutChanged(TimeoutChanged),
    /// The sandbox was paused.
    Paused(Pause),
    /// The sandbox was resumed.
    Resumed(Resume),
    /// A snapshot was taken.
    Snapshot(Snapshot),
    /// The sandbox was destroyed.
    Destroyed(Destroyed),
    /// A request was held for a person's approval.
    ApprovalRequested(ApprovalRequested),
    /// A held request was approved, denied, or timed out.
    ApprovalDecided(ApprovalDecided),
    /// Values declared sensitive were edited out of what the record keeps.
    Redacted(Redacted),
    /// A package download seen by the egress proxy (fetched, or refused by the policy).
    Package(Package),
    /// An action on the sandbox's desktop (a click, keys, typed text) or a screenshot of it.
    Desktop(Desktop),
}

impl EventBody {
    /// Every `type` this version knows, in declaration order.
    pub const TYPES: [&'static str; 18] = [
        "created",
        "exec",
        "exit",
        "file",
        "fs_diff",
        "network",
        "secret_used",
        "policy_changed",
        "timeout_changed",
        "paused",
        "resumed",
        "snapshot",
        "destroyed",
        "approval_requested",
        "approval_decided",
        "redacted",
        "package",
        "desktop",
    ];

    /// The body's `type` tag.
    pub fn type_name(&self) -> &'static str {
        match self {
            EventBody::Created(_) => "created",
            EventBody::Exec(_) => "exec",
            EventBody::Exit(_) => "exit",
            EventBody::File(_) => "file",
            EventBody::FsDiff(_) => "fs_diff",
            EventBody::Network(_) => "network",
            EventBody::SecretUsed(_) => "secret_used",
            EventBody::PolicyChanged(_) => "policy_changed",
            EventBody::TimeoutChanged(_) => "timeout_changed",
            EventBody::Paused(_) => "paused",
            EventBody::Resumed(_) => "resumed",
            EventBody::Snapshot(_) => "snapshot",
            EventBody::Destroyed(_) => "destroyed",
            EventBody::ApprovalRequested(_) => "approval_requested",
            EventBody::ApprovalDecided(_) => "approval_decided",
            EventBody::Redacted(_) => "redacted",
            EventBody::Package(_) => "package",
            EventBody::Desktop(_) => "desktop",
        }
    }
}

/// `paused`: `{}` for a pause that froze the processes (memory kept), as records before
/// pauses to the filesystem were written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pause {
    /// `false`: paused to its filesystem: every process ended, the disk was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
    /// `true`: put to sleep because it went its `idle_pause_secs` without a request (the
    /// next request wakes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<bool>,
}

/// `resumed`: `{}` for a resume that thawed the processes where they were.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// `true`: booted again from its disk (a cold boot: no process of before runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot: Option<bool>,
    /// `true`: woken by a request for it (it has an idle sleep), not by a resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub woken: Option<bool>,
}

/// `created`: the sandbox as asked for and as built.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Created {
    /// The creation request (or resolved spec) as JSON. Non-integer numbers are recorded
    /// as decimal strings (see `docs/proof.md`, "numbers").
    pub spec: serde_json::Value,
    /// Template name.
    pub template: String,
    /// The template's content digest, as the template store spells it.
    pub template_digest: String,
    /// The network policy as JSON, `null` when none.
    pub policy: serde_json::Value,
    /// Who asked (the API caller's identity, e.g. a key id; `local` for the Unix socket).
    pub caller: String,
}

/// Size and digest of some bytes (process output or input), with the kept copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContentRecord {
    /// Total size in bytes.
    pub size: u64,
    /// SHA-256 of all the bytes.
    pub digest: Hash,
    /// SHA-256 of the bytes kept as a blob: all of them when not `truncated`, else the first
    /// bytes up to the cap. `null` when nothing was kept.
    #[serde(deserialize_with = "required")]
    pub blob: Option<Hash>,
    /// Whether the kept blob is only a prefix (the bytes were longer than the cap).
    pub truncated: bool,
}

/// `exec`: a process was started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exec {
    /// The daemon's id of this process; the matching `exit` carries it too.
    pub exec_id: String,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Working directory, `null` for the user's home.
    #[serde(deserialize_with = "required")]
    pub cwd: Option<String>,
    /// The user it runs as.
    pub user: String,
    /// Names of the environment variables given (never their values), sorted.
    pub env_names: Vec<String>,
    /// Whether stdin was open (input given at start or streamed later).
    pub stdin: bool,
    /// Whether it ran under a pseudo-terminal.
    pub pty: bool,
    /// The input given at start (the request's stdin), `null` when none.
    #[serde(deserialize_with = "required")]
    pub input: Option<ContentRecord>,
    /// Who asked for it, as `created.caller` names callers (absent in records made before
    /// callers were named per action; never `null`, see [`added_member`]).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub caller: Option<String>,
    /// The approval it ran under, when the sandbox's policy held it (absent otherwise, and
    /// in records made before approvals existed; never `null`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub approval: Option<String>,
}

/// `exit`: a process ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exit {
    /// The `exec_id` of its `exec` record.
    pub exec_id: String,
    /// Exit code, `null` when a signal ended it.
    #[serde(deserialize_with = "required")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, if any.
    #[serde(deserialize_with = "required")]
    pub signal: Option<i32>,
    /// Whether the exec's timeout killed it.
    pub timed_out: bool,
    /// Wall time in milliseconds.
    pub wall_ms: u64,
    /// CPU time (user + system) in milliseconds, when known.
    #[serde(deserialize_with = "required")]
    pub cpu_ms: Option<u64>,
    /// Peak memory in bytes, when known.
    #[serde(deserialize_with = "required")]
    pub peak_memory_bytes: Option<u64>,
    /// Its stdout (or the terminal's output under a PTY).
    pub stdout: ContentRecord,
    /// Its stderr.
    pub stderr: ContentRecord,
    /// Input streamed to stdin after start (interactive sessions), `null` when none.
    #[serde(deserialize_with = "required")]
    pub streamed_input: Option<ContentRecord>,
}

/// The kind of a [`FileChange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileOp {
    /// A file was written (created or replaced).
    Write,
    /// A file or directory was moved to `to`.
    Move,
    /// A file or directory was removed.
    Remove,
    /// A directory was made.
    Mkdir,
}

/// `file`: a file operation made through the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileChange {
    /// What was done.
    pub op: FileOp,
    /// The path inside the sandbox.
    pub path: String,
    /// The destination of a move, else `null`.
    #[serde(deserialize_with = "required")]
    pub to: Option<String>,
    /// Bytes written (for `write`), else `null`.
    #[serde(deserialize_with = "required")]
    pub size: Option<u64>,
    /// SHA-256 of the bytes written (for `write`), else `null`.
    #[serde(deserialize_with = "required")]
    pub digest: Option<Hash>,
    /// Who did it, as `created.caller` names callers (absent in records made before
    /// callers were named per action; never `null`, see [`added_member`]).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub caller: Option<String>,
}

/// One path of an [`FsDiff`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsEntry {
    /// The path inside the sandbox.
    pub path: String,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// SHA-256 of a regular file's content (for `removed`: the template's), else `null`.
    #[serde(deserialize_with = "required")]
    pub digest: Option<Hash>,
}

/// `fs_diff`: the writable layer against the template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsDiff {
    /// Why it was taken: `snapshot` or `destroy`.
    pub reason: String,
    /// Paths that are new.
    pub added: Vec<FsEntry>,
    /// Paths whose content or kind changed.
    pub changed: Vec<FsEntry>,
    /// Paths of the template that are gone.
    pub removed: Vec<FsEntry>,
    /// The node's bounds (entries listed, bytes hashed) cut the manifest short, or some
    /// digests are missing: the lists are not the whole difference.
    pub truncated: bool,
}

/// `network`: a network decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    /// `dns` or `connect` (more may come).
    pub kind: String,
    /// The host name or address concerned.
    pub host: String,
    /// Destination port, when there is one.
    #[serde(deserialize_with = "required")]
    pub port: Option<u16>,
    /// `allowed` or `denied`.
    pub verdict: String,
    /// Anything else (DNS answers, rule matched...) as JSON; `null` when nothing.
    pub detail: serde_json::Value,
}

/// `secret_used`: a secret was substituted on the way to a host (name only, never value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretUsed {
    /// The secret's name.
    pub name: String,
    /// The host it was sent to.
    pub host: String,
}

/// `policy_changed`: the network policy now in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyChanged {
    /// The new policy as JSON.
    pub policy: serde_json::Value,
}

/// `timeout_changed`: the sandbox's new deadline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutChanged {
    /// The new deadline, RFC 3339 UTC.
    pub expires_at: String,
}

/// `snapshot`: a snapshot (or a fork's consistent point) was taken.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// The snapshot's name (a fork's consistent point: `.fork-...`).
    pub name: String,
    /// `true`: its processes and memory were saved too (the gVisor tier), and a sandbox
    /// made from it continues them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
    /// The SHA-256 of the saved processes' image (`sha256:<hex>`), with `memory`: what a
    /// sandbox made from it names as its parent's (its `created.spec.parent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_digest: Option<String>,
    /// A fork's consistent point: how many sandboxes are made from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forks: Option<u32>,
}

/// `approval_requested`: a request the sandbox's approval policy holds until a person
/// decides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequested {
    /// The approval's id.
    pub approval_id: String,
    /// What is held: `command`.
    pub kind: String,
    /// The exact command line.
    pub request: String,
    /// SHA-256 (hex) of the request as made; the decision and the `exec` that follows name it.
    pub digest: String,
    /// The policy's pattern it matched.
    pub rule: String,
    /// Who asked.
    pub caller: String,
}

/// `approval_decided`: the decision on a held request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecided {
    /// The approval's id.
    pub approval_id: String,
    /// `approved`, `denied`, `timed_out`, or `withdrawn` (the asker left before a decision).
    pub decision: String,
    /// Who decided (`node` when nobody did).
    pub by: String,
    /// Why, as given.
    #[serde(deserialize_with = "required")]
    pub reason: Option<String>,
    /// The digest of the request decided on.
    pub digest: String,
}

/// `redacted`: values declared sensitive at create (`secret_env`) were replaced by
/// `[REDACTED:<name>]` in the bytes of one record member before they were hashed and kept.
/// Names where and which, never the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redacted {
    /// The exec whose record member was edited.
    pub exec_id: String,
    /// The member: `input`, `stdout`, `stderr` or `streamed_input`.
    pub field: String,
    /// The names of the values replaced, sorted.
    pub names: Vec<String>,
    /// How many replacements were made.
    pub count: u64,
}

/// `desktop`: what an exec did on the sandbox's desktop (read from its command: `xdotool`,
/// `scrot`), recorded right after that exec's `exec`; a screenshot is recorded when it was
/// taken (before its exec's `exit`), with the image kept as a blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Desktop {
    /// The exec that carried it.
    pub exec_id: String,
    /// `screenshot`, `click`, `mouse_down`, `mouse_up`, `move`, `key`, `key_down`,
    /// `key_up` or `type`.
    pub action: String,
    /// Where (`move`, and a click or screenshot pointer when the command named one).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub x: Option<i64>,
    /// Where, with `x`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub y: Option<i64>,
    /// The button of a click, press or release: `left`, `middle`, `right`, `wheel_up`,
    /// `wheel_down`, `wheel_left`, `wheel_right`, or its number for others.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub button: Option<String>,
    /// How many times (a double click is 2; a scroll by 3 is 3).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub repeat: Option<u64>,
    /// The keys of `key`, `key_down`, `key_up` (X keysym names, `ctrl+c` as one entry).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub keys: Option<Vec<String>>,
    /// Text typed: its length and digest only, never the text (it may be a password).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub text: Option<TypedText>,
    /// The screenshot's image (PNG), kept whole as a blob.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub image: Option<ContentRecord>,
    /// The screenshot's size in pixels, from its header.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub width: Option<u32>,
    /// The screenshot's height in pixels.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub height: Option<u32>,
    /// Why a screenshot's image is not in the record (the command failed, the file is not
    /// on the sandbox's disk, it is too large, not a PNG).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub missing: Option<String>,
}

/// Text typed on a desktop, as the record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypedText {
    /// Its length in characters.
    pub chars: u64,
    /// SHA-256 of its UTF-8 bytes.
    pub digest: Hash,
}

/// `package`: a package download the egress proxy recognised from a registry's URL layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Package {
    /// `pypi`, `npm`, `debian` or `crates`.
    pub ecosystem: String,
    /// The package's name, normalized (lowercase; PyPI's runs of `-_.` as `-`).
    pub name: String,
    /// Its version, as the file name gives it.
    pub version: String,
    /// The registry host it was fetched from.
    pub registry: String,
    /// The request's path, without the query.
    pub path: String,
    /// `allowed` (fetched whole) or `denied` (refused before any byte reached the sandbox).
    pub verdict: String,
    /// The rule that decided: `package`, `pinned:<pin>`, `package-deny:<pattern>`, `unpinned`.
    pub rule: String,
    /// SHA-256 of the response body as fetched; `null` when denied.
    #[serde(deserialize_with = "required")]
    pub sha256: Option<Hash>,
    /// Size in bytes of that body; `null` when denied.
    #[serde(deserialize_with = "required")]
    pub size: Option<u64>,
}

/// `destroyed`: the sandbox is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Destroyed {
    /// Why: `api`, `timeout`, `failed`, `shutdown`...
    pub reason: String,
    /// SHA-256 of the final writable-layer manifest, when one was taken.
    #[serde(deserialize_with = "required")]
    pub manifest_digest: Option<Hash>,
    /// The files kept as artifacts (the create request's `artifacts`): absent when none were
    /// asked for, and in records made before artifacts existed; never `null`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "added_member"
    )]
    pub artifacts: Option<Artifacts>,
}

/// What a sandbox kept of its files when it ended (`destroyed.artifacts`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifacts {
    /// The paths asked for at create, as given.
    pub paths: Vec<String>,
    /// Every regular file kept, sorted by path; its bytes are the blob named `digest`.
    pub files: Vec<ArtifactFile>,
    /// Entries under the paths that were not kept because they are not regular files
    /// (symbolic links, which are never followed, fifos, sockets, devices) or could not be
    /// read.
    pub skipped: u64,
    /// The node's bounds (files, bytes) stopped the capture: `files` is not all there was.
    pub truncated: bool,
}

/// One file of [`Artifacts`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactFile {
    /// Its absolute path inside the sandbox.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// SHA-256 of its bytes (the name of its blob).
    pub digest: Hash,
    /// Its permission bits (`st_mode & 0o7777`).
    pub mode: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_hex_round_trip_and_strictness() {
        let h = Hash([0xab; 32]);
        assert_eq!(Hash::parse(&h.to_hex()).unwrap(), h);
        assert!(Hash::parse(&"AB".repeat(32)).is_err());
        assert!(Hash::parse("ab").is_err());
        assert!(Hash::parse(&"zz".repeat(32)).is_err());
        let j = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<Hash>(&j).unwrap(), h);
    }

    #[test]
    fn bodies_are_tagged_and_strict() {
        let b = EventBody::Paused(Pause::default());
        assert_eq!(serde_json::to_string(&b).unwrap(), r#"{"type":"paused"}"#);
        let b: EventBody = serde_json::from_str(r#"{"type":"snapshot","name":"s1"}"#).unwrap();
        assert_eq!(b.type_name(), "snapshot");
        assert!(
            serde_json::from_str::<EventBody>(r#"{"type":"snapshot","name":"s","x":1}"#).is_err()
        );
        assert!(serde_json::from_str::<EventBody>(r#"{"type":"paused","x":1}"#).is_err());
        assert!(serde_json::from_str::<EventBody>(r#"{"type":"teleported"}"#).is_err());
        // Absent optional members are refused: `null` must be spelled out.
        assert!(
            serde_json::from_str::<EventBody>(r#"{"type":"destroyed","reason":"api"}"#).is_err()
        );
        let ok = r#"{"type":"destroyed","reason":"api","manifest_digest":null}"#;
        assert!(serde_json::from_str::<EventBody>(ok).is_ok());
        // `artifacts` was added later: absent (an older record) or an object, never null.
        let null = r#"{"type":"destroyed","reason":"api","manifest_digest":null,"artifacts":null}"#;
        assert!(serde_json::from_str::<EventBody>(null).is_err());
        let d = EventBody::Destroyed(Destroyed {
            reason: "api".into(),
            manifest_digest: None,
            artifacts: Some(Artifacts {
                paths: vec!["/out".into()],
                files: vec![ArtifactFile {
                    path: "/out/a".into(),
                    size: 1,
                    digest: Hash([1; 32]),
                    mode: 0o644,
                }],
                skipped: 0,
                truncated: false,
            }),
        });
        let j = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<EventBody>(&j).unwrap(), d);
        assert_eq!(
            serde_json::to_string(&serde_json::from_str::<EventBody>(ok).unwrap()).unwrap(),
            ok
        );
        for t in EventBody::TYPES {
            assert!(EventBody::TYPES.contains(&t));
        }
    }
}
