//! Wire messages of the envd-compatible protocol (proto3 canonical JSON).
//!
//! Output follows protojson: lowerCamelCase names, default values omitted, `int64` as strings,
//! enums as names, `bytes` as padded standard base64, empty messages as `{}`. Input is lenient:
//! camelCase and snake_case names, numbers or strings for integers, enum names or numbers,
//! `null` as the default, unknown fields ignored.

use base64::Engine as _;
use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Protocol version served in `GET /info` (bumped on any incompatible wire change).
pub const PROTOCOL_VERSION: u32 = 1;

// ---------- helpers ----------

fn is_false(b: &bool) -> bool {
    !*b
}
fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}
fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

/// `null` or absent => default.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrStr {
    I(i64),
    U(u64),
    F(f64),
    S(String),
}

fn num_i64<E: de::Error>(v: NumOrStr) -> Result<i64, E> {
    match v {
        NumOrStr::I(i) => Ok(i),
        NumOrStr::U(u) => i64::try_from(u).map_err(|_| E::custom("integer out of range")),
        NumOrStr::F(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(f as i64),
        NumOrStr::F(_) => Err(E::custom("not an integer")),
        NumOrStr::S(s) => s.trim().parse().map_err(|_| E::custom("not an integer")),
    }
}

fn de_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match Option::<NumOrStr>::deserialize(d)? {
        None => Ok(0),
        Some(v) => u32::try_from(num_i64::<D::Error>(v)?)
            .map_err(|_| de::Error::custom("uint32 out of range")),
    }
}
fn de_opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match Option::<NumOrStr>::deserialize(d)? {
        None => Ok(None),
        Some(v) => u32::try_from(num_i64::<D::Error>(v)?)
            .map(Some)
            .map_err(|_| de::Error::custom("uint32 out of range")),
    }
}
fn de_i32<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    match Option::<NumOrStr>::deserialize(d)? {
        None => Ok(0),
        Some(v) => i32::try_from(num_i64::<D::Error>(v)?)
            .map_err(|_| de::Error::custom("int32 out of range")),
    }
}
fn de_i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match Option::<NumOrStr>::deserialize(d)? {
        None => Ok(0),
        Some(v) => num_i64(v),
    }
}
fn ser_i64_str<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

/// Serde adapter for proto `bytes` (standard base64 with padding).
mod b64 {
    use super::*;
    pub fn serialize<S: Serializer>(v: &Option<bytes::Bytes>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b)),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bytes::Bytes>, D::Error> {
        let Some(s) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        // protojson accepts standard or URL-safe, padded or not.
        let s = s.trim_end_matches('=');
        let eng = if s.contains(['-', '_']) {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
        } else {
            base64::engine::general_purpose::STANDARD_NO_PAD
        };
        eng.decode(s)
            .map(|v| Some(v.into()))
            .map_err(de::Error::custom)
    }
}

/// An empty message: `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

macro_rules! proto_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $num:literal => $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub enum $name { $($(#[$vm])* $var),+ }
        impl $name {
            /// Proto enum value name.
            pub fn as_str(self) -> &'static str { match self { $($name::$var => $s),+ } }
            /// Proto enum number.
            pub fn number(self) -> i32 { match self { $($name::$var => $num),+ } }
            fn from_number(n: i64) -> Option<Self> { match n { $($num => Some($name::$var),)+ _ => None } }
            fn from_name(n: &str) -> Option<Self> { match n { $($s => Some($name::$var),)+ _ => None } }
            fn is_default(&self) -> bool { *self == Self::default() }
        }
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> { s.serialize_str(self.as_str()) }
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                match Option::<NumOrStr>::deserialize(d)? {
                    None => Ok(Self::default()),
                    Some(NumOrStr::S(s)) => Self::from_name(&s)
                        .or_else(|| s.parse::<i64>().ok().and_then(Self::from_number))
                        .ok_or_else(|| de::Error::custom(format!("unknown {} value {s:?}", stringify!($name)))),
                    Some(v) => { let n = num_i64::<D::Error>(v)?; Self::from_number(n)
                        .ok_or_else(|| de::Error::custom(format!("unknown {} value {n}", stringify!($name)))) }
                }
            }
        }
    };
}

// ---------- process ----------

/// `process.PTY`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pty {
    /// Terminal size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<PtySize>,
}

/// `process.PTY.Size`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PtySize {
    /// Columns.
    #[serde(
        default,
        deserialize_with = "de_u32",
        skip_serializing_if = "is_zero_u32"
    )]
    pub cols: u32,
    /// Rows.
    #[serde(
        default,
        deserialize_with = "de_u32",
        skip_serializing_if = "is_zero_u32"
    )]
    pub rows: u32,
}

/// `process.ProcessConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessConfig {
    /// Program.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub cmd: String,
    /// Arguments.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub args: Vec<String>,
    /// Extra environment.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub envs: BTreeMap<String, String>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `process.ProcessSelector` (oneof pid | tag).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessSelector {
    /// Pid.
    #[serde(
        default,
        deserialize_with = "de_opt_u32",
        skip_serializing_if = "Option::is_none"
    )]
    pub pid: Option<u32>,
    /// Tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `process.ProcessInfo`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// How it was started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ProcessConfig>,
    /// Pid.
    #[serde(
        default,
        deserialize_with = "de_u32",
        skip_serializing_if = "is_zero_u32"
    )]
    pub pid: u32,
    /// Tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `process.ListResponse`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListResponse {
    /// Running processes.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub processes: Vec<ProcessInfo>,
}

/// `process.StartRequest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StartRequest {
    /// What to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessConfig>,
    /// PTY, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
    /// Tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Keep stdin open (absent => true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
}

/// `process.UpdateRequest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UpdateRequest {
    /// Which process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    /// New PTY size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
}

/// `process.ProcessEvent.StartEvent`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StartEvent {
    /// Pid.
    #[serde(
        default,
        deserialize_with = "de_u32",
        skip_serializing_if = "is_zero_u32"
    )]
    pub pid: u32,
}

/// `process.ProcessEvent.DataEvent` (oneof stdout | stderr | pty).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DataEvent {
    /// Stdout bytes.
    #[serde(default, with = "b64", skip_serializing_if = "Option::is_none")]
    pub stdout: Option<bytes::Bytes>,
    /// Stderr bytes.
    #[serde(default, with = "b64", skip_serializing_if = "Option::is_none")]
    pub stderr: Option<bytes::Bytes>,
    /// PTY bytes.
    #[serde(default, with = "b64", skip_serializing_if = "Option::is_none")]
    pub pty: Option<bytes::Bytes>,
}

/// `process.ProcessEvent.EndEvent`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    /// Exit code (-1 when killed by a signal, like Go's `ProcessState.ExitCode`).
    #[serde(
        default,
        alias = "exit_code",
        deserialize_with = "de_i32",
        skip_serializing_if = "is_zero_i32"
    )]
    pub exit_code: i32,
    /// Exited normally.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub exited: bool,
    /// `exit status N`, `signal: killed`, ...
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub status: String,
    /// Error text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `process.ProcessEvent` (oneof start | data | end | keepalive).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessEvent {
    /// Started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartEvent>,
    /// Output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataEvent>,
    /// Ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<EndEvent>,
    /// Keepalive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<Empty>,
}

/// `process.StartResponse` / `process.ConnectResponse`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessEventResponse {
    /// The event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<ProcessEvent>,
}

/// `process.ProcessInput` (oneof stdin | pty).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessInput {
    /// Stdin bytes.
    #[serde(default, with = "b64", skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bytes::Bytes>,
    /// PTY bytes.
    #[serde(default, with = "b64", skip_serializing_if = "Option::is_none")]
    pub pty: Option<bytes::Bytes>,
}

/// `process.SendInputRequest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SendInputRequest {
    /// Which process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    /// Input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<ProcessInput>,
}

/// `process.StreamInputRequest.StartEvent`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamInputStart {
    /// Which process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
}

/// `process.StreamInputRequest.DataEvent`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamInputData {
    /// Input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<ProcessInput>,
}

/// `process.StreamInputRequest` (oneof start | data | keepalive).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamInputRequest {
    /// First message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StreamInputStart>,
    /// Input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<StreamInputData>,
    /// Keepalive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<Empty>,
}

proto_enum! {
    /// `process.Signal`.
    Signal {
        /// Unspecified.
        #[default]
        Unspecified = 0 => "SIGNAL_UNSPECIFIED",
        /// SIGTERM.
        Sigterm = 15 => "SIGNAL_SIGTERM",
        /// SIGKILL.
        Sigkill = 9 => "SIGNAL_SIGKILL",
    }
}

/// `process.SendSignalRequest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SendSignalRequest {
    /// Which process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    /// Signal.
    #[serde(default, skip_serializing_if = "Signal::is_default")]
    pub signal: Signal,
}

/// `process.CloseStdinRequest` / `process.ConnectRequest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SelectorRequest {
    /// Which process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
}

// ---------- filesystem ----------

proto_enum! {
    /// `filesystem.FileType`.
    FileType {
        /// Unspecified (e.g. a dangling symlink).
        #[default]
        Unspecified = 0 => "FILE_TYPE_UNSPECIFIED",
        /// Regular file.
        File = 1 => "FILE_TYPE_FILE",
        /// Directory.
        Directory = 2 => "FILE_TYPE_DIRECTORY",
        /// Symlink.
        Symlink = 3 => "FILE_TYPE_SYMLINK",
    }
}

proto_enum! {
    /// `filesystem.EventType`.
    EventType {
        /// Unspecified.
        #[default]
        Unspecified = 0 => "EVENT_TYPE_UNSPECIFIED",
        /// Created.
        Create = 1 => "EVENT_TYPE_CREATE",
        /// Written.
        Write = 2 => "EVENT_TYPE_WRITE",
        /// Removed.
        Remove = 3 => "EVENT_TYPE_REMOVE",
        /// Renamed (moved away).
        Rename = 4 => "EVENT_TYPE_RENAME",
        /// Attributes changed.
        Chmod = 5 => "EVENT_TYPE_CHMOD",
    }
}

/// `filesystem.EntryInfo`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    /// Base name.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
    /// Type (of the target for a symlink).
    #[serde(rename = "type", default, skip_serializing_if = "FileType::is_default")]
    pub file_type: FileType,
    /// Absolute path.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub path: String,
    /// Size (int64, a JSON string).
    #[serde(
        default,
        deserialize_with = "de_i64",
        serialize_with = "ser_i64_str",
        skip_serializing_if = "is_zero_i64"
    )]
    pub size: i64,
    /// Permission bits.
    #[serde(
        default,
        deserialize_with = "de_u32",
        skip_serializing_if = "is_zero_u32"
    )]
    pub mode: u32,
    /// `ls -l` style (Go `FileMode.String`).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub permissions: String,
    /// Owner name.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub owner: String,
    /// Group name.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub group: String,
    /// RFC 3339 modification time.
    #[serde(
        default,
        alias = "modified_time",
        skip_serializing_if = "Option::is_none"
    )]
    pub modified_time: Option<String>,
    /// Resolved absolute target, only for symlinks.
    #[serde(
        default,
        alias = "symlink_target",
        skip_serializing_if = "Option::is_none"
    )]
    pub symlink_target: Option<String>,
    /// `user.e2b.*` xattrs.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub metadata: BTreeMap<String, String>,
    /// Whether the entry is a symlink.
    #[serde(
        default,
        alias = "is_symlink",
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub is_symlink: bool,
}

/// Requests with just a path: Stat, MakeDir, Remove.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PathRequest {
    /// Path.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub path: String,
}

/// `filesystem.MoveRequest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MoveRequest {
    /// From.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub source: String,
    /// To.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub destination: String,
}

/// Responses with one entry: Stat, MakeDir, Move.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EntryResponse {
    /// The entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// `filesystem.ListDirRequest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListDirRequest {
    /// Directory.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub path: String,
    /// Depth (0 => 1).
    #[serde(
        default,
        deserialize_with = "de_u32",
        skip_serializing_if = "is_zero_u32"
    )]
    pub depth: u32,
}

/// `filesystem.ListDirResponse`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListDirResponse {
    /// Entries, lexical depth-first.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub entries: Vec<EntryInfo>,
}

/// `filesystem.WatchDirRequest` / `filesystem.CreateWatcherRequest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchRequest {
    /// Directory.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub path: String,
    /// Watch subdirectories too.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub recursive: bool,
    /// Attach an entry to each event.
    #[serde(
        default,
        alias = "include_entry",
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub include_entry: bool,
    /// Accepted and ignored.
    #[serde(
        default,
        alias = "allow_network_mounts",
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub allow_network_mounts: bool,
}

/// `filesystem.FilesystemEvent`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FilesystemEvent {
    /// Path relative to the watched directory.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
    /// Kind.
    #[serde(
        rename = "type",
        default,
        skip_serializing_if = "EventType::is_default"
    )]
    pub event_type: EventType,
    /// Entry, when asked for and still present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// `filesystem.WatchDirResponse` (oneof start | filesystem | keepalive).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WatchDirResponse {
    /// First message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Empty>,
    /// A change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemEvent>,
    /// Keepalive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<Empty>,
}

/// `filesystem.CreateWatcherResponse` / `GetWatcherEventsRequest` / `RemoveWatcherRequest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatcherId {
    /// Watcher id.
    #[serde(
        default,
        alias = "watcher_id",
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub watcher_id: String,
}

/// `filesystem.GetWatcherEventsResponse`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WatcherEvents {
    /// Events since the last call.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub events: Vec<FilesystemEvent>,
}

/// `/files` upload answer item.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WrittenEntry {
    /// Base name.
    #[serde(default)]
    pub name: String,
    /// `file` or `dir`.
    #[serde(rename = "type", default)]
    pub entry_type: String,
    /// Absolute path.
    #[serde(default)]
    pub path: String,
    /// Metadata written with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// `GET /info` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// Crate version of the agent.
    pub version: String,
    /// Wire protocol version ([`PROTOCOL_VERSION`]).
    pub protocol: u32,
}

/// Format a time as RFC 3339 UTC like protojson (0, 3, 6 or 9 fractional digits).
pub fn rfc3339(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    let frac = if nanos == 0 {
        String::new()
    } else if nanos.is_multiple_of(1_000_000) {
        format!(".{:03}", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!(".{:06}", nanos / 1_000)
    } else {
        format!(".{nanos:09}")
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{frac}Z",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    //! Schema snapshot: a change of any of these strings is a wire change. Bump
    //! [`PROTOCOL_VERSION`] if it is incompatible.
    use super::*;

    fn j<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).expect("serialize")
    }

    #[test]
    fn snapshot_process_messages() {
        let start = ProcessEventResponse {
            event: Some(ProcessEvent {
                start: Some(StartEvent { pid: 1234 }),
                ..Default::default()
            }),
        };
        assert_eq!(j(&start), r#"{"event":{"start":{"pid":1234}}}"#);
        let data = ProcessEventResponse {
            event: Some(ProcessEvent {
                data: Some(DataEvent {
                    stdout: Some("hello\n".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        assert_eq!(j(&data), r#"{"event":{"data":{"stdout":"aGVsbG8K"}}}"#);
        let pty = DataEvent {
            pty: Some("x".into()),
            ..Default::default()
        };
        assert_eq!(j(&pty), r#"{"pty":"eA=="}"#);
        let end0 = ProcessEvent {
            end: Some(EndEvent {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            }),
            ..Default::default()
        };
        assert_eq!(
            j(&end0),
            r#"{"end":{"exited":true,"status":"exit status 0"}}"#
        );
        let killed = EndEvent {
            exit_code: -1,
            exited: false,
            status: "signal: killed".into(),
            error: Some(String::new()),
        };
        assert_eq!(
            j(&killed),
            r#"{"exitCode":-1,"status":"signal: killed","error":""}"#
        );
        let ka = ProcessEvent {
            keepalive: Some(Empty {}),
            ..Default::default()
        };
        assert_eq!(j(&ka), r#"{"keepalive":{}}"#);
        let list = ListResponse {
            processes: vec![ProcessInfo {
                config: Some(ProcessConfig {
                    cmd: "/bin/bash".into(),
                    args: vec!["-c".into(), "sleep 1".into()],
                    envs: [("A".to_string(), "1".to_string())].into(),
                    cwd: Some("/home/user".into()),
                }),
                pid: 7,
                tag: Some("t".into()),
            }],
        };
        assert_eq!(
            j(&list),
            r#"{"processes":[{"config":{"cmd":"/bin/bash","args":["-c","sleep 1"],"envs":{"A":"1"},"cwd":"/home/user"},"pid":7,"tag":"t"}]}"#
        );
        assert_eq!(j(&ListResponse::default()), "{}");
        assert_eq!(j(&Empty {}), "{}");
    }

    #[test]
    fn snapshot_filesystem_messages() {
        let e = EntryInfo {
            name: "a.txt".into(),
            file_type: FileType::File,
            path: "/home/user/a.txt".into(),
            size: 2,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            owner: "user".into(),
            group: "user".into(),
            modified_time: Some(rfc3339(1_735_689_600, 123_000_000)),
            symlink_target: None,
            metadata: [("k".to_string(), "v".to_string())].into(),
            is_symlink: false,
        };
        assert_eq!(
            j(&EntryResponse {
                entry: Some(e.clone())
            }),
            r#"{"entry":{"name":"a.txt","type":"FILE_TYPE_FILE","path":"/home/user/a.txt","size":"2","mode":420,"permissions":"-rw-r--r--","owner":"user","group":"user","modifiedTime":"2025-01-01T00:00:00.123Z","metadata":{"k":"v"}}}"#
        );
        let link = EntryInfo {
            name: "l".into(),
            file_type: FileType::Directory,
            path: "/l".into(),
            size: 4,
            mode: 0o755,
            permissions: "Lrwxrwxrwx".into(),
            owner: "root".into(),
            group: "root".into(),
            modified_time: Some(rfc3339(0, 0)),
            symlink_target: Some("/d".into()),
            metadata: BTreeMap::new(),
            is_symlink: true,
        };
        assert_eq!(
            j(&link),
            r#"{"name":"l","type":"FILE_TYPE_DIRECTORY","path":"/l","size":"4","mode":493,"permissions":"Lrwxrwxrwx","owner":"root","group":"root","modifiedTime":"1970-01-01T00:00:00Z","symlinkTarget":"/d","isSymlink":true}"#
        );
        let ev = WatchDirResponse {
            filesystem: Some(FilesystemEvent {
                name: "n/f".into(),
                event_type: EventType::Write,
                entry: None,
            }),
            ..Default::default()
        };
        assert_eq!(
            j(&ev),
            r#"{"filesystem":{"name":"n/f","type":"EVENT_TYPE_WRITE"}}"#
        );
        let st = WatchDirResponse {
            start: Some(Empty {}),
            ..Default::default()
        };
        assert_eq!(j(&st), r#"{"start":{}}"#);
        assert_eq!(
            j(&WatcherId {
                watcher_id: "w1".into()
            }),
            r#"{"watcherId":"w1"}"#
        );
        assert_eq!(j(&WatcherEvents::default()), "{}");
        assert_eq!(j(&ListDirResponse::default()), "{}");
        let w = WrittenEntry {
            name: "a".into(),
            entry_type: "file".into(),
            path: "/a".into(),
            metadata: None,
        };
        assert_eq!(j(&vec![w]), r#"[{"name":"a","type":"file","path":"/a"}]"#);
        assert_eq!(
            j(&AgentInfo {
                version: "0.1.0".into(),
                protocol: PROTOCOL_VERSION
            }),
            r#"{"version":"0.1.0","protocol":1}"#
        );
    }

    #[test]
    fn lenient_input() {
        let r: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"pid":"12"},"signal":9}"#).expect("parse");
        assert_eq!(r.signal, Signal::Sigkill);
        assert_eq!(r.process.and_then(|p| p.pid), Some(12));
        let r: WatchRequest =
            serde_json::from_str("{\n  \"path\": \"/x\",\n  \"include_entry\": true, \"zzz\": 1}")
                .expect("parse");
        assert!(r.include_entry);
        let r: StartRequest =
            serde_json::from_str(r#"{"process":{"cmd":"ls","args":null},"stdin":null}"#)
                .expect("parse");
        assert_eq!(r.stdin, None);
        let e: EndEvent = serde_json::from_str(r#"{"exit_code":"3"}"#).expect("parse");
        assert_eq!(e.exit_code, 3);
        let d: DataEvent = serde_json::from_str(r#"{"stdout":"aGVsbG8"}"#).expect("parse");
        assert_eq!(d.stdout.as_deref(), Some(&b"hello"[..]));
        assert!(serde_json::from_str::<SendSignalRequest>(r#"{"signal":"SIGNAL_NOPE"}"#).is_err());
    }

    #[test]
    fn time_format() {
        assert_eq!(rfc3339(951_782_400, 0), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000, 5), "2023-11-14T22:13:20.000000005Z");
        assert_eq!(rfc3339(1_700_000_000, 5_000), "2023-11-14T22:13:20.000005Z");
    }
}
