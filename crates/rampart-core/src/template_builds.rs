//! Template builds through the API (E2B's `Template().build()`): the same builder as
//! `rampart template build` (`rampart-image`: its step cache, its build sandboxes and their
//! networks), run by the daemon, with the state and log an API client polls, and the file
//! archives `copy` steps take (uploaded by the client, kept by hash).
//!
//! - A build is reserved ([`TemplateBuilds::reserve`], status `waiting`), then started with
//!   its plan ([`TemplateBuilds::start`], `building`), and ends `ready` (its name and tags point
//!   at the new template) or `error` (with the reason and the step); a failed build leaves no
//!   layer, name or temp directory half-made (the builder's guarantee).
//! - A reservation never started expires ([`BuildConfig::reservation_ttl`]); a tenant holds
//!   at most [`BuildConfig::max_reserved_per_tenant`] of them and
//!   [`BuildConfig::max_active_per_tenant`] started builds not yet ended (beyond: refused,
//!   [`CoreError::Capacity`], with the reason).
//! - Builds run one at a time in the daemon (the store's lock: a build of `rampart template
//!   build` on the host holding it makes an API build wait, its log says so). Started builds
//!   wait in one queue per tenant; when the slot frees, the next build is taken from the next
//!   tenant in turn (round robin), never one global FIFO: a tenant queueing many builds delays
//!   another's by at most one of its builds.
//! - A step runs at most [`BuildConfig::step_timeout`], a build at most
//!   [`BuildConfig::build_timeout`]; a build may be cancelled ([`TemplateBuilds::cancel`]).
//!   Either way the build ends `error` with the reason, and its build sandbox is killed (the
//!   builder's cancel flag: the runner destroys the sandbox).
//! - Logs are on disk, one file per build (`<data>/build-logs/<build id>.jsonl`, 0600 in a
//!   0700 directory, one JSON entry a line), never in the daemon's memory: a line longer than
//!   [`BuildConfig::log_line_max_bytes`] is cut (with a note of the bytes dropped), and a log
//!   longer than [`BuildConfig::log_max_bytes`] keeps its first part and its end (a small
//!   tail kept in memory while the build runs), with a note of what was dropped between.
//!   Output is split into lines linearly ([`LineSplitter`]: each byte is scanned once).
//! - Disk: a step writes to a disk of [`BuildConfig::disk_bytes`] (a tenant's build: at most
//!   what its `max_disk_bytes` has left), see `rampart_image::step_disk`; a `copy` step's
//!   upload unpacks to at most as much.
//! - Uploads: `<data>/images/uploads/<hash>.tar` (the archive as sent, gzip or plain), written
//!   to a temp file and renamed into place when complete; bounded while received by what
//!   its owner's disk quota and the host's disk have left ([`TemplateBuilds::begin_upload`]),
//!   counted as its owner's, removed when unused for [`BuildConfig::upload_ttl`]
//!   (`crate::stored`). A `copy` step's archive is unpacked
//!   with the layer extractor's rules (no entry leaves the directory, symlinks are never
//!   followed) into a temp directory of the store, arranged as Docker's `COPY` places its
//!   sources, and copied by the builder's `copy` step (whose cache key covers every copied
//!   file: a layer is reused only for the same content).
//! - Build records live in memory (the last [`MAX_BUILDS`], a few hundred bytes each, their
//!   logs on disk): after a restart, a build's status is unknown (its log is removed), its
//!   template (if it was ready) remains.

use crate::CoreError;
use rampart_image::build::{BuildEvent, BuildOptions, Builder, JailRunner, DEFAULT_BUILD_UID_BASE};
use rampart_image::spec::{Base, BuildNetwork, StartSpec};
use rampart_image::{ImageError, Spec, Step, Store};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufRead as _, Read, Seek as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Builds kept in memory (oldest finished ones are forgotten first, with their logs); when
/// as many are unfinished, a new reservation is refused.
pub const MAX_BUILDS: usize = 256;
/// Largest upload accepted, bytes.
pub const MAX_UPLOAD_BYTES: u64 = 4 << 30;
/// How long an upload link stays valid.
pub const UPLOAD_LINK_TTL: Duration = Duration::from_secs(3600);
/// Most of a build's log kept in memory (the end of a log past its bound, while it runs).
pub const MAX_LOG_TAIL_BYTES: u64 = 256 << 10;
/// Room for the note a cut line ends with (` [line cut: N bytes dropped]`).
const CUT_NOTE_ROOM: usize = 48;
/// Entries between two positions of the on-disk log index (so a read from an offset seeks).
const LOG_INDEX_EVERY: u64 = 256;

/// Template builds' bounds and timeouts (part of [`crate::CoreConfig`]). Defaults: logs of
/// 8 MiB and lines of 16 KiB per build, reservations expire after 10 minutes, 8 reservations
/// and 4 started builds per tenant, steps of 30 minutes, builds of 2 hours, a build disk of
/// 8 GiB, uploads kept 24 hours after their upload or last use.
/// [`BuildConfig::from_env`] reads overrides from `RAMPART_BUILD_*` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildConfig {
    /// A build's log on disk, bytes (past it: its first part and its end are kept).
    pub log_max_bytes: u64,
    /// A log line, bytes (longer: cut, with the count of bytes dropped).
    pub log_line_max_bytes: usize,
    /// How long a reserved build may wait to be started before it is forgotten.
    pub reservation_ttl: Duration,
    /// Reserved, not started builds a tenant (or the node) may hold.
    pub max_reserved_per_tenant: usize,
    /// Started builds not yet ended (queued or running) a tenant (or the node) may hold.
    pub max_active_per_tenant: usize,
    /// Longest a step (the base included) may run.
    pub step_timeout: Duration,
    /// Longest a build may run (from when it takes the build slot).
    pub build_timeout: Duration,
    /// A build's disk, bytes: what a `run` (`apt`, `pip`, `npm`) step may write (an image of
    /// this size, see `rampart_image::step_disk`) and what a `copy` step's upload may unpack
    /// to. A tenant's build has at most what its `max_disk_bytes` has left.
    pub disk_bytes: u64,
    /// How long an upload no build used is kept (from its upload or its last use).
    pub upload_ttl: Duration,
}

impl Default for BuildConfig {
    fn default() -> Self {
        BuildConfig {
            log_max_bytes: 8 << 20,
            log_line_max_bytes: 16 << 10,
            reservation_ttl: Duration::from_secs(600),
            max_reserved_per_tenant: 8,
            max_active_per_tenant: 4,
            step_timeout: Duration::from_secs(30 * 60),
            build_timeout: Duration::from_secs(2 * 3600),
            disk_bytes: 8 << 30,
            upload_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

/// The environment variables [`BuildConfig::from_env`] reads, with what each sets.
pub const BUILD_ENV: &[(&str, &str)] = &[
    ("RAMPART_BUILD_LOG_MAX_BYTES", "log_max_bytes"),
    ("RAMPART_BUILD_LOG_LINE_MAX_BYTES", "log_line_max_bytes"),
    ("RAMPART_BUILD_RESERVATION_TTL_SECS", "reservation_ttl"),
    ("RAMPART_BUILD_MAX_RESERVED", "max_reserved_per_tenant"),
    ("RAMPART_BUILD_MAX_ACTIVE", "max_active_per_tenant"),
    ("RAMPART_BUILD_STEP_TIMEOUT_SECS", "step_timeout"),
    ("RAMPART_BUILD_TIMEOUT_SECS", "build_timeout"),
    ("RAMPART_BUILD_DISK_BYTES", "disk_bytes"),
    ("RAMPART_BUILD_UPLOAD_TTL_SECS", "upload_ttl"),
];

impl BuildConfig {
    /// The defaults, with each `RAMPART_BUILD_*` variable of [`BUILD_ENV`] that is set to a
    /// number above 0 in its place (another value is ignored, with a warning).
    pub fn from_env() -> Self {
        let mut c = BuildConfig::default();
        for (var, _) in BUILD_ENV {
            let Ok(v) = std::env::var(var) else { continue };
            let n = match v.trim().parse::<u64>() {
                Ok(n) if n > 0 => n,
                _ => {
                    tracing::warn!("{var}={v:?} is not a number above 0; using the default");
                    continue;
                }
            };
            let z = usize::try_from(n).unwrap_or(usize::MAX);
            match *var {
                "RAMPART_BUILD_LOG_MAX_BYTES" => c.log_max_bytes = n.max(4096),
                "RAMPART_BUILD_LOG_LINE_MAX_BYTES" => c.log_line_max_bytes = z.max(64),
                "RAMPART_BUILD_RESERVATION_TTL_SECS" => c.reservation_ttl = Duration::from_secs(n),
                "RAMPART_BUILD_MAX_RESERVED" => c.max_reserved_per_tenant = z,
                "RAMPART_BUILD_MAX_ACTIVE" => c.max_active_per_tenant = z,
                "RAMPART_BUILD_STEP_TIMEOUT_SECS" => c.step_timeout = Duration::from_secs(n),
                "RAMPART_BUILD_TIMEOUT_SECS" => c.build_timeout = Duration::from_secs(n),
                "RAMPART_BUILD_DISK_BYTES" => {
                    c.disk_bytes = n.max(rampart_image::step_disk::MIN_STEP_DISK_BYTES);
                }
                "RAMPART_BUILD_UPLOAD_TTL_SECS" => c.upload_ttl = Duration::from_secs(n),
                _ => {}
            }
        }
        c
    }
}

/// A build's state (E2B's `TemplateBuildStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildStatus {
    /// Reserved, not started (or waiting for the store).
    Waiting,
    /// Running.
    Building,
    /// Done: the template is usable.
    Ready,
    /// Failed.
    Error,
}

impl BuildStatus {
    /// E2B's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BuildStatus::Waiting => "waiting",
            BuildStatus::Building => "building",
            BuildStatus::Ready => "ready",
            BuildStatus::Error => "error",
        }
    }
}

/// One log line of a build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// RFC 3339.
    pub timestamp: String,
    /// `debug`, `info`, `warn` or `error`.
    pub level: &'static str,
    /// The text (one line).
    pub message: String,
    /// The step it belongs to (`base`, a step number, `finalize`), if any.
    pub step: Option<String>,
}

/// What a build is to do: the builder's spec, with `copy` steps of uploaded archives.
#[derive(Debug, Clone)]
pub struct BuildPlan {
    /// The base.
    pub from: Base,
    /// The steps, with the step name each reports (its index among the client's steps).
    pub steps: Vec<(PlanStep, Option<String>)>,
    /// Started at every create.
    pub start: Option<StartSpec>,
    /// What the steps may reach.
    pub network: BuildNetwork,
    /// Rebuild every step (ignore the cache).
    pub no_cache: bool,
    /// Rebuild from this step on (1 = the first).
    pub no_cache_from: Option<usize>,
    /// The user and password of an `image:` base's registry.
    pub registry_auth: Option<rampart_image::registry::RegistryAuth>,
}

/// A step of a [`BuildPlan`].
#[derive(Debug, Clone)]
pub enum PlanStep {
    /// A builder step as is.
    Step(Step),
    /// Files of an uploaded archive (`<hash>`), placed as Docker's `COPY src dest` does:
    /// one file to `dest` (into it if it ends in `/`), a directory's contents into `dest`,
    /// several sources into the directory `dest`.
    CopyUpload {
        /// The archive's hash (E2B's `filesHash`).
        hash: String,
        /// Absolute destination (a trailing `/` kept).
        dest: String,
        /// Owner `user[:group]`.
        owner: Option<String>,
        /// Permission bits.
        mode: Option<u32>,
    },
}

/// A build's record.
#[derive(Debug, Clone)]
pub struct BuildInfo {
    /// Build id (a UUID).
    pub build_id: String,
    /// The template's name, as its owner knows it.
    pub name: String,
    /// The store's name of the template (`<tenant>~<name>` for a tenant's).
    pub stored: String,
    /// The tenant that asked for it (None: the node). Only it (and the node) sees the
    /// build, its status and its log; its uploads are its own.
    pub owner: Option<String>,
    /// Its tags (the first is the one the build sets first).
    pub tags: Vec<String>,
    /// Status.
    pub status: BuildStatus,
    /// Why it failed, and at which step.
    pub reason: Option<(String, Option<String>)>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339, when it ended.
    pub finished_at: Option<String>,
    /// The template id it made.
    pub template_id: Option<String>,
}

/// The largest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn floor_boundary(s: &str, max: usize) -> usize {
    if max >= s.len() {
        return s.len();
    }
    let mut i = max;
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `text` cut to `max` bytes (on a character boundary), with a note of the bytes dropped.
fn cut_line(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let keep = floor_boundary(text, max);
    format!(
        "{} [line cut: {} bytes dropped]",
        &text[..keep],
        text.len() - keep
    )
}

/// Splits a step's output into lines, linearly: each byte of output is scanned once (only
/// the new text is searched for a newline, never what was buffered before), and at most
/// `max` bytes of a line are kept (the rest counted and dropped, the line ending with a
/// note of how many bytes were dropped; the cut falls on a UTF-8 character boundary).
#[derive(Debug)]
pub struct LineSplitter {
    /// The line so far (at most `max` bytes).
    buf: String,
    max: usize,
    /// Bytes of the current line dropped past `max`.
    dropped: u64,
    /// Bytes scanned for newlines, in all.
    scanned: u64,
}

impl LineSplitter {
    /// A splitter keeping at most `max` bytes of a line.
    pub fn new(max: usize) -> Self {
        LineSplitter {
            buf: String::new(),
            max,
            dropped: 0,
            scanned: 0,
        }
    }

    /// Adds output; each line it completes goes to `emit` (without its newline or a `\r`
    /// before it; empty lines are skipped).
    pub fn push(&mut self, text: &str, emit: &mut dyn FnMut(String)) {
        let mut rest = text;
        self.scanned += text.len() as u64;
        while let Some(p) = rest.find('\n') {
            self.take(&rest[..p]);
            if let Some(l) = self.line() {
                emit(l);
            }
            rest = &rest[p + 1..];
        }
        self.take(rest);
    }

    /// Ends the output: the line not ended by a newline, if any (trimmed at its end).
    pub fn finish(&mut self) -> Option<String> {
        let l = self.line()?;
        let t = l.trim_end();
        (!t.is_empty()).then(|| t.to_owned())
    }

    /// Bytes scanned for a newline so far (each byte of output once).
    pub fn scanned(&self) -> u64 {
        self.scanned
    }

    /// Bytes held for the line not yet ended.
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    fn take(&mut self, s: &str) {
        if self.dropped > 0 {
            self.dropped += s.len() as u64;
            return;
        }
        let room = self.max.saturating_sub(self.buf.len());
        let keep = floor_boundary(s, room);
        self.buf.push_str(&s[..keep]);
        self.dropped += (s.len() - keep) as u64;
    }

    fn line(&mut self) -> Option<String> {
        let mut l = std::mem::take(&mut self.buf);
        let dropped = std::mem::take(&mut self.dropped);
        if l.ends_with('\r') {
            l.pop();
        }
        if dropped > 0 {
            l.push_str(&format!(" [line cut: {dropped} bytes dropped]"));
        }
        (!l.is_empty()).then_some(l)
    }
}

/// A build's log on disk (see the module's documentation): the file, an index of every
/// [`LOG_INDEX_EVERY`]th entry's position, and the tail of a log past its bound.
#[derive(Debug)]
struct BuildLog {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// Writing failed (the disk): later entries are dropped.
    broken: bool,
    /// Entries and bytes in the file.
    entries: u64,
    bytes: u64,
    /// Byte position of entry `k * LOG_INDEX_EVERY`.
    index: Vec<u64>,
    /// Bytes of the log's first part (past them, entries go to the tail).
    head_max: u64,
    tail_max: u64,
    line_max: usize,
    /// The last entries once the first part is full (serialized, newline included).
    tail: VecDeque<String>,
    tail_bytes: u64,
    /// Entries (and their bytes) dropped between the first part and the tail.
    dropped: u64,
    dropped_bytes: u64,
    /// The first part is full.
    cutting: bool,
    /// The build ended: nothing more is written.
    closed: bool,
}

/// A log level as the static string [`LogEntry`] carries.
fn level_of(s: &str) -> &'static str {
    match s {
        "debug" => "debug",
        "warn" => "warn",
        "error" => "error",
        _ => "info",
    }
}

impl BuildLog {
    fn new(path: PathBuf, cfg: &BuildConfig) -> Self {
        let tail_max = MAX_LOG_TAIL_BYTES.min(cfg.log_max_bytes / 4);
        BuildLog {
            path,
            file: None,
            broken: false,
            entries: 0,
            bytes: 0,
            index: Vec::new(),
            head_max: cfg.log_max_bytes - tail_max,
            tail_max,
            line_max: cfg.log_line_max_bytes,
            tail: VecDeque::new(),
            tail_bytes: 0,
            dropped: 0,
            dropped_bytes: 0,
            cutting: false,
            closed: false,
        }
    }

    fn encode(e: &LogEntry, line_max: usize) -> String {
        // A line the splitter cut carries its note past the bound: it is not cut again.
        let m = if e.message.len() > line_max + CUT_NOTE_ROOM {
            cut_line(&e.message, line_max)
        } else {
            e.message.clone()
        };
        let mut v = serde_json::json!({
            "t": e.timestamp,
            "l": e.level,
            "m": m,
        });
        if let Some(s) = &e.step {
            v["s"] = serde_json::Value::String(s.clone());
        }
        let mut line = v.to_string();
        line.push('\n');
        line
    }

    fn decode(line: &str) -> Option<LogEntry> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        Some(LogEntry {
            timestamp: v["t"].as_str()?.to_owned(),
            level: level_of(v["l"].as_str().unwrap_or("info")),
            message: v["m"].as_str()?.to_owned(),
            step: v["s"].as_str().map(str::to_owned),
        })
    }

    fn push(&mut self, e: &LogEntry) {
        if self.closed || self.broken {
            return;
        }
        let line = Self::encode(e, self.line_max);
        let n = line.len() as u64;
        if !self.cutting && self.bytes + n <= self.head_max {
            self.append(&line);
            return;
        }
        self.cutting = true;
        self.tail_bytes += n;
        self.tail.push_back(line);
        while self.tail_bytes > self.tail_max && self.tail.len() > 1 {
            if let Some(old) = self.tail.pop_front() {
                self.tail_bytes -= old.len() as u64;
                self.dropped += 1;
                self.dropped_bytes += old.len() as u64;
            }
        }
    }

    fn append(&mut self, line: &str) {
        if self.file.is_none() {
            let opened = self
                .path
                .parent()
                .map(|d| {
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(d)
                })
                .unwrap_or(Ok(()))
                .and_then(|()| {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .mode(0o600)
                        .open(&self.path)
                });
            match opened {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    tracing::warn!("build log {}: {e}", self.path.display());
                    self.broken = true;
                    return;
                }
            }
        }
        let Some(f) = self.file.as_mut() else { return };
        if let Err(e) = f.write_all(line.as_bytes()) {
            tracing::warn!("build log {}: {e}", self.path.display());
            self.broken = true;
            return;
        }
        if self.entries.is_multiple_of(LOG_INDEX_EVERY) {
            self.index.push(self.bytes);
        }
        self.entries += 1;
        self.bytes += line.len() as u64;
    }

    /// The build ended: the note of what was dropped and the tail go to the file, which is
    /// closed.
    fn close(&mut self) {
        if self.closed {
            return;
        }
        if self.cutting && !self.broken {
            let note = LogEntry {
                timestamp: now(),
                level: "warn",
                message: format!(
                    "log cut: {} entries ({} bytes) dropped here; a build's log keeps its \
                     first {} and its last {} bytes",
                    self.dropped, self.dropped_bytes, self.head_max, self.tail_max
                ),
                step: None,
            };
            let note = Self::encode(&note, self.line_max);
            self.append(&note);
            while let Some(l) = self.tail.pop_front() {
                self.append(&l);
            }
            self.tail_bytes = 0;
        }
        self.closed = true;
        self.file = None;
    }

    /// Calls `f` with each entry from `offset` (in the file) until it answers false.
    fn scan(&self, offset: u64, f: &mut dyn FnMut(LogEntry) -> bool) {
        if offset >= self.entries {
            return;
        }
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return;
        };
        let slot = usize::try_from(offset / LOG_INDEX_EVERY).unwrap_or(usize::MAX);
        let Some(&pos) = self.index.get(slot) else {
            return;
        };
        if file.seek(std::io::SeekFrom::Start(pos)).is_err() {
            return;
        }
        let mut skip = offset % LOG_INDEX_EVERY;
        // Only what the index knows of (a write in progress is not read).
        let r = std::io::BufReader::new(file.take(self.bytes - pos));
        for line in r.lines() {
            let Ok(line) = line else { return };
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if let Some(e) = Self::decode(&line) {
                if !f(e) {
                    return;
                }
            }
        }
    }

    fn remove(&mut self) {
        self.file = None;
        self.closed = true;
        let _ = std::fs::remove_file(&self.path);
    }
}

/// How a running (or queued) build is stopped: the builder's cancel flag, why it was set,
/// and the step running (for its timeout).
#[derive(Debug)]
struct Control {
    cancel: Arc<AtomicBool>,
    why: Mutex<Option<String>>,
    /// When the current step began, and its name.
    step: Mutex<(Instant, Option<String>)>,
}

impl Control {
    fn new() -> Self {
        Control {
            cancel: Arc::new(AtomicBool::new(false)),
            why: Mutex::new(None),
            step: Mutex::new((Instant::now(), None)),
        }
    }

    /// Stops the build for `why` (the first reason given stays).
    fn stop(&self, why: String) {
        let mut w = self.why.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_none() {
            *w = Some(why);
        }
        self.cancel.store(true, Ordering::SeqCst);
    }

    fn why(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn stopped(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    fn step_began(&self, name: Option<String>) {
        *self.step.lock().unwrap_or_else(|e| e.into_inner()) = (Instant::now(), name);
    }
}

#[derive(Debug)]
struct Record {
    info: BuildInfo,
    log: Arc<Mutex<BuildLog>>,
    /// When it was reserved (a reservation not started expires).
    reserved: Instant,
    /// It was started (queued or running, or ended).
    started: bool,
    control: Arc<Control>,
}

impl Record {
    fn ended(&self) -> bool {
        matches!(self.info.status, BuildStatus::Ready | BuildStatus::Error)
    }
}

/// A started build waiting for the build slot.
#[derive(Debug)]
struct Job {
    id: String,
    info: BuildInfo,
    plan: BuildPlan,
    control: Arc<Control>,
}

/// Started builds by owner (None: the node), served round robin.
#[derive(Debug, Default)]
struct Queue {
    waiting: BTreeMap<Option<String>, VecDeque<Job>>,
    /// The owner served last.
    last: Option<Option<String>>,
    /// The build holding the slot.
    running: Option<String>,
}

impl Queue {
    /// The next build: the first of the next owner after the last served (in name order,
    /// wrapping around).
    fn next(&mut self) -> Option<Job> {
        let key = match &self.last {
            Some(last) => self
                .waiting
                .range::<Option<String>, _>((
                    std::ops::Bound::Excluded(last),
                    std::ops::Bound::Unbounded,
                ))
                .next()
                .map(|(k, _)| k.clone())
                .or_else(|| self.waiting.keys().next().cloned()),
            None => self.waiting.keys().next().cloned(),
        }?;
        let q = self.waiting.get_mut(&key)?;
        let job = q.pop_front();
        if q.is_empty() {
            self.waiting.remove(&key);
        }
        self.last = Some(key);
        job
    }

    fn remove(&mut self, id: &str) -> Option<Job> {
        let mut found = None;
        for q in self.waiting.values_mut() {
            if let Some(p) = q.iter().position(|j| j.id == id) {
                found = q.remove(p);
                break;
            }
        }
        self.waiting.retain(|_, q| !q.is_empty());
        found
    }
}

#[derive(Debug)]
struct Upload {
    hash: String,
    /// The tenant whose uploads it goes to (None: the node's).
    owner: Option<String>,
    expires: Instant,
}

/// An upload link taken ([`TemplateBuilds::take_upload`]): what it stores, and whose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadTicket {
    /// The files hash it is for.
    pub hash: String,
    /// The tenant whose uploads it goes to (None: the node's).
    pub owner: Option<String>,
}

/// The daemon's template builds.
#[derive(Debug)]
pub struct TemplateBuilds {
    data: PathBuf,
    /// The built-in templates' directory (`base`, `code-interpreter-v1`: builds stack on them).
    templates_dir: PathBuf,
    jailer_bin: PathBuf,
    agent_bin: PathBuf,
    /// How `image:` bases are pulled.
    registry: rampart_image::registry::RegistryConfig,
    /// Bounds and timeouts.
    cfg: BuildConfig,
    /// Whether sandboxes run in the jail (builds need it).
    jailed: bool,
    builds: Mutex<HashMap<String, Record>>,
    order: Mutex<VecDeque<String>>,
    uploads: Mutex<HashMap<String, Upload>>,
    /// Started builds and the one slot (lock order: `queue` before `builds`).
    queue: Mutex<Queue>,
    /// The state store: tenants' disk quotas and what they keep (`crate::stored`).
    store: Arc<dyn rampart_store::SandboxStore>,
    /// Bytes of uploads being received, per owner (counted against its quota meanwhile).
    inflight: Arc<Mutex<HashMap<Option<String>, u64>>>,
    /// Told the stored name of each template built (its warm pools drain).
    on_built: std::sync::OnceLock<OnBuilt>,
}

/// What [`TemplateBuilds::on_built`] calls.
struct OnBuilt(Box<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for OnBuilt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnBuilt")
    }
}

/// The bound of one upload being received ([`TemplateBuilds::begin_upload`]): what it may
/// still write; its bytes count as its owner's while it lasts.
#[derive(Debug)]
pub struct UploadBound {
    owner: Option<String>,
    inflight: Arc<Mutex<HashMap<Option<String>, u64>>>,
    /// Most bytes, and why (the error past it).
    max: u64,
    why: UploadLimit,
    taken: u64,
}

#[derive(Debug, Clone)]
enum UploadLimit {
    /// [`MAX_UPLOAD_BYTES`].
    Size,
    /// The owner's `max_disk_bytes`: (held before, the quota).
    Quota(u64, u64),
    /// The host's disk (see `crate::capacity`).
    Host,
}

impl UploadBound {
    /// Counts `n` more bytes; past the bound, the error to answer (the upload is dropped).
    pub fn take(&mut self, n: u64) -> Result<(), CoreError> {
        let total = self.taken.saturating_add(n);
        if total > self.max {
            return Err(match &self.why {
                UploadLimit::Size => CoreError::BadRequest {
                    field: "upload".into(),
                    message: format!("the upload is larger than {MAX_UPLOAD_BYTES} bytes"),
                },
                UploadLimit::Quota(used, max) => CoreError::Store(
                    rampart_store::StoreError::Quota(rampart_types::tenant::QuotaRefusal {
                        limit: "max_disk_bytes".into(),
                        used: *used as f64,
                        requested: total as f64,
                        max: *max as f64,
                    }),
                ),
                UploadLimit::Host => CoreError::Capacity(format!(
                    "disk: the upload passed the {} bytes the host's disk has left beside what \
                     is promised to sandboxes, snapshots and volumes",
                    self.max
                )),
            });
        }
        self.taken = total;
        let mut m = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(self.owner.clone()).or_default() += n;
        Ok(())
    }
}

impl Drop for UploadBound {
    fn drop(&mut self) {
        let mut m = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = m.get_mut(&self.owner) {
            *v = v.saturating_sub(self.taken);
            if *v == 0 {
                m.remove(&self.owner);
            }
        }
    }
}

fn now() -> String {
    rampart_image::store::now_rfc3339()
}

fn bad(field: &str, message: impl Into<String>) -> CoreError {
    CoreError::BadRequest {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// A random UUID (version 4).
fn uuid() -> String {
    let h = rampart_store::access::new_token();
    let mut b: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(h.get(i * 2..i * 2 + 2).unwrap_or("00"), 16).unwrap_or(0))
        .collect();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let x: String = b.iter().map(|v| format!("{v:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

/// Whether a caller of `tenant` (None: the node, which sees all) may see an object of
/// `owner`.
fn may_see(tenant: Option<&str>, owner: Option<&str>) -> bool {
    tenant.is_none() || tenant == owner
}

/// Whether `h` is a files hash (64 hex digits).
pub fn is_files_hash(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Who a caller is, in messages.
fn whose(owner: Option<&str>) -> String {
    match owner {
        Some(t) => format!("tenant \"{t}\""),
        None => "the node".to_owned(),
    }
}

impl TemplateBuilds {
    pub(crate) fn new(
        cfg: &crate::CoreConfig,
        templates_dir: &Path,
        jailed: bool,
        store: Arc<dyn rampart_store::SandboxStore>,
    ) -> Self {
        let data = cfg.data_dir.clone();
        // Logs of a previous run: their builds are forgotten.
        let _ = std::fs::remove_dir_all(data.join("build-logs"));
        TemplateBuilds {
            data,
            templates_dir: templates_dir.to_path_buf(),
            jailer_bin: cfg.jailer_bin.clone(),
            agent_bin: cfg.agent_bin.clone(),
            registry: cfg.registry.clone(),
            cfg: cfg.builds.clone(),
            jailed,
            builds: Mutex::new(HashMap::new()),
            order: Mutex::new(VecDeque::new()),
            uploads: Mutex::new(HashMap::new()),
            queue: Mutex::new(Queue::default()),
            store,
            inflight: Arc::new(Mutex::new(HashMap::new())),
            on_built: std::sync::OnceLock::new(),
        }
    }

    /// The uploads directory of every owner: (owner, directory).
    pub(crate) fn upload_dirs(&self) -> Vec<(Option<String>, PathBuf)> {
        let base = self.uploads_dir(None);
        let mut v = vec![(None, base.clone())];
        if let Ok(rd) = std::fs::read_dir(&base) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                let Some(hex) = n.strip_prefix("tenant-") else {
                    continue;
                };
                let bytes: Option<Vec<u8>> = (0..hex.len() / 2)
                    .map(|i| u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok())
                    .collect();
                if let Some(name) = bytes.and_then(|b| String::from_utf8(b).ok()) {
                    if hex.len() % 2 == 0 && self.uploads_dir(Some(&name)) == e.path() {
                        v.push((Some(name), e.path()));
                    }
                }
            }
        }
        v
    }

    /// Records what `owner` (a tenant) keeps in uploads now (`crate::stored`).
    fn measure_uploads(&self, owner: Option<&str>) {
        let Some(t) = owner else { return };
        let _g = crate::stored::lock();
        let bytes = crate::stored::uploads_bytes(&self.uploads_dir(owner));
        if let Err(e) = self.store.set_stored(t, crate::stored::UPLOADS, bytes) {
            tracing::warn!(tenant = t, "recording the tenant's uploads: {e}");
        }
    }

    /// Starts receiving an upload of `ticket`: it may write at most the least of
    /// [`MAX_UPLOAD_BYTES`], what its owner's `max_disk_bytes` has left (beside its other
    /// uploads being received) and `host_room` (what the host's disk has left beside what
    /// is promised, less the other uploads being received). Refused at once when nothing is
    /// left.
    pub fn begin_upload(
        &self,
        ticket: &UploadTicket,
        host_room: u64,
    ) -> Result<UploadBound, CoreError> {
        let owner = ticket.owner.clone();
        let (mine, all) = {
            let m = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
            (m.get(&owner).copied().unwrap_or(0), m.values().sum::<u64>())
        };
        let mut max = MAX_UPLOAD_BYTES;
        let mut why = UploadLimit::Size;
        let host = host_room.saturating_sub(all);
        if host < max {
            max = host;
            why = UploadLimit::Host;
        }
        if let Some(t) = owner.as_deref() {
            if let Some(room) = self.store.tenant_disk_room(t)? {
                let room = room.saturating_sub(mine);
                if room < max {
                    max = room;
                    let (used, quota) = crate::stored::disk_quota(&*self.store, t);
                    why = UploadLimit::Quota(used.saturating_add(mine), quota);
                }
            }
        }
        let mut b = UploadBound {
            owner,
            inflight: self.inflight.clone(),
            max,
            why,
            taken: 0,
        };
        if b.max == 0 {
            b.take(1)?;
        }
        Ok(b)
    }

    /// The bounds and timeouts builds run with.
    pub fn config(&self) -> &BuildConfig {
        &self.cfg
    }

    /// The log file of build `id` (`<data>/build-logs/<id>.jsonl`).
    fn log_path(&self, id: &str) -> PathBuf {
        self.data.join("build-logs").join(format!("{id}.jsonl"))
    }

    /// The uploads of `owner` (None: the node's, `uploads/`; a tenant's:
    /// `uploads/tenant-<hex of its name>/`, never a path made of the name itself).
    fn uploads_dir(&self, owner: Option<&str>) -> PathBuf {
        let base = self.data.join("images").join("uploads");
        match owner {
            None => base,
            Some(t) => {
                let hex: String = t.bytes().map(|b| format!("{b:02x}")).collect();
                base.join(format!("tenant-{hex}"))
            }
        }
    }

    fn upload_path(&self, owner: Option<&str>, hash: &str) -> PathBuf {
        self.uploads_dir(owner).join(format!("{hash}.tar"))
    }

    /// Forgets reservations never started within the TTL.
    fn expire(&self, b: &mut HashMap<String, Record>, order: &mut VecDeque<String>) {
        let ttl = self.cfg.reservation_ttl;
        let gone: Vec<String> = b
            .iter()
            .filter(|(_, r)| {
                !r.started && r.info.status == BuildStatus::Waiting && r.reserved.elapsed() > ttl
            })
            .map(|(id, _)| id.clone())
            .collect();
        if gone.is_empty() {
            return;
        }
        for id in &gone {
            if let Some(r) = b.remove(id) {
                r.log.lock().unwrap_or_else(|e| e.into_inner()).remove();
            }
        }
        order.retain(|id| b.contains_key(id));
    }

    /// The records, with expired reservations forgotten first.
    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        let mut b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
        let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        self.expire(&mut b, &mut order);
        drop(order);
        b
    }

    /// Reserves a build of template `t` (resolved for writing by
    /// [`crate::templates::lookup`]) with `tags` (store references are the stored name for
    /// `default` and `stored:TAG`); status `waiting`, owned by the caller's `tenant` (None:
    /// the node). Refused ([`CoreError::Capacity`]) when the caller holds
    /// [`BuildConfig::max_reserved_per_tenant`] reservations not started, or the daemon
    /// [`MAX_BUILDS`] builds not ended.
    pub fn reserve(
        &self,
        tenant: Option<&str>,
        t: &crate::templates::TemplateRef,
        tags: &[String],
    ) -> Result<BuildInfo, CoreError> {
        if t.owner == crate::templates::Owner::BuiltIn {
            return Err(CoreError::Forbidden(format!(
                "template \"{}\" is built in and cannot be changed",
                t.name
            )));
        }
        rampart_image::check_stored_name(&t.stored).map_err(|e| bad("name", e.to_string()))?;
        if tags.is_empty() {
            return Err(bad("tags", "a build needs at least one tag"));
        }
        for t in tags {
            rampart_image::check_tag(t).map_err(|e| bad("tags", e))?;
        }
        let info = BuildInfo {
            build_id: uuid(),
            name: t.name.clone(),
            stored: t.stored.clone(),
            owner: tenant.map(str::to_owned),
            tags: tags.to_vec(),
            status: BuildStatus::Waiting,
            reason: None,
            created_at: now(),
            finished_at: None,
            template_id: None,
        };
        let mut b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
        let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        self.expire(&mut b, &mut order);
        let reserved = b
            .values()
            .filter(|r| !r.started && !r.ended() && r.info.owner.as_deref() == tenant)
            .count();
        if reserved >= self.cfg.max_reserved_per_tenant {
            return Err(CoreError::Capacity(format!(
                "{} holds {reserved} template builds reserved and not started (at most {}); \
                 start or let them expire (after {} s) first",
                whose(tenant),
                self.cfg.max_reserved_per_tenant,
                self.cfg.reservation_ttl.as_secs()
            )));
        }
        // Forget the oldest finished builds beyond the bound.
        while order.len() >= MAX_BUILDS {
            let Some(pos) = order
                .iter()
                .position(|id| b.get(id).is_none_or(Record::ended))
            else {
                return Err(CoreError::Capacity(format!(
                    "the daemon holds {MAX_BUILDS} template builds not ended; try again later"
                )));
            };
            if let Some(id) = order.remove(pos) {
                if let Some(r) = b.remove(&id) {
                    r.log.lock().unwrap_or_else(|e| e.into_inner()).remove();
                }
            }
        }
        order.push_back(info.build_id.clone());
        b.insert(
            info.build_id.clone(),
            Record {
                info: info.clone(),
                log: Arc::new(Mutex::new(BuildLog::new(
                    self.log_path(&info.build_id),
                    &self.cfg,
                ))),
                reserved: Instant::now(),
                started: false,
                control: Arc::new(Control::new()),
            },
        );
        Ok(info)
    }

    /// A build's record, if a caller of `tenant` may see it (its tenant's, or any for the
    /// node): another tenant's build is None, as one that does not exist (so is an expired
    /// reservation).
    pub fn get(&self, tenant: Option<&str>, build_id: &str) -> Option<BuildInfo> {
        let b = self.records();
        b.get(build_id)
            .filter(|r| may_see(tenant, r.info.owner.as_deref()))
            .map(|r| r.info.clone())
    }

    /// Every build of template `t` a caller of `tenant` may see, newest first (a tenant
    /// sees none of the operator's builds of a template the operator publishes).
    pub fn of_template(
        &self,
        tenant: Option<&str>,
        t: &crate::templates::TemplateRef,
    ) -> Vec<BuildInfo> {
        let b = self.records();
        let mut v: Vec<BuildInfo> = b
            .values()
            .filter(|r| r.info.stored == t.stored)
            .filter(|r| may_see(tenant, r.info.owner.as_deref()))
            .map(|r| r.info.clone())
            .collect();
        v.sort_by(|a, b| b.created_at.cmp(&a.created_at));
        v
    }

    /// The log of a build the caller may see.
    fn log_of(&self, tenant: Option<&str>, build_id: &str) -> Option<Arc<Mutex<BuildLog>>> {
        let b = self.records();
        b.get(build_id)
            .filter(|r| may_see(tenant, r.info.owner.as_deref()))
            .map(|r| r.log.clone())
    }

    /// Log entries of a build from `offset`, at most `limit` (None: no such build the
    /// caller may see, see [`TemplateBuilds::get`]). Read from the build's log file; while a
    /// build whose log passed its bound runs, the entries past its first part appear when
    /// it ends (its last ones, after a note of what was dropped).
    pub fn logs(
        &self,
        tenant: Option<&str>,
        build_id: &str,
        offset: usize,
        limit: usize,
    ) -> Option<Vec<LogEntry>> {
        let log = self.log_of(tenant, build_id)?;
        let l = log.lock().unwrap_or_else(|e| e.into_inner());
        let mut v = Vec::new();
        if limit > 0 {
            l.scan(offset as u64, &mut |e| {
                v.push(e);
                v.len() < limit
            });
        }
        Some(v)
    }

    /// Calls `f` with each log entry of a build in order until it answers false (false: no
    /// such build the caller may see). Reads the file as it goes: nothing but the entry at
    /// hand is held.
    pub fn scan_logs(
        &self,
        tenant: Option<&str>,
        build_id: &str,
        f: &mut dyn FnMut(LogEntry) -> bool,
    ) -> bool {
        let Some(log) = self.log_of(tenant, build_id) else {
            return false;
        };
        let l = log.lock().unwrap_or_else(|e| e.into_inner());
        l.scan(0, f);
        true
    }

    fn log(&self, build_id: &str, level: &'static str, step: Option<String>, message: String) {
        let log = {
            let b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
            match b.get(build_id) {
                Some(r) => r.log.clone(),
                None => return,
            }
        };
        let e = LogEntry {
            timestamp: now(),
            level,
            message,
            step,
        };
        log.lock().unwrap_or_else(|e| e.into_inner()).push(&e);
    }

    /// Ends a build `error` for `message` (at `step`), its log closed.
    fn fail(&self, build_id: &str, message: String, step: Option<String>) {
        self.log(
            build_id,
            "error",
            step.clone(),
            format!("Build failed: {message}"),
        );
        self.end(build_id, |i| {
            i.status = BuildStatus::Error;
            i.reason = Some((message, step));
        });
    }

    /// Sets a build's final state and closes its log.
    fn end(&self, build_id: &str, f: impl FnOnce(&mut BuildInfo)) {
        let log = {
            let mut b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
            let Some(r) = b.get_mut(build_id) else { return };
            f(&mut r.info);
            r.info.finished_at = Some(now());
            r.log.clone()
        };
        log.lock().unwrap_or_else(|e| e.into_inner()).close();
    }

    /// Whether a caller of `tenant` (None: the node) uploaded the archive `hash`: another
    /// tenant's uploads are not seen.
    pub fn has_upload(&self, tenant: Option<&str>, hash: &str) -> bool {
        self.has_upload_of(tenant, hash)
    }

    fn has_upload_of(&self, owner: Option<&str>, hash: &str) -> bool {
        is_files_hash(hash) && self.upload_path(owner, hash).is_file()
    }

    /// A one-use token that lets a client upload the archive `hash` (for
    /// [`UPLOAD_LINK_TTL`]) into the uploads of a caller of `tenant` (None: the node).
    pub fn upload_token(&self, tenant: Option<&str>, hash: &str) -> Result<String, CoreError> {
        if !is_files_hash(hash) {
            return Err(bad(
                "hash",
                format!("{hash:?} is not a files hash (64 hex digits)"),
            ));
        }
        let token = rampart_store::access::new_token();
        let mut u = self.uploads.lock().unwrap_or_else(|e| e.into_inner());
        let t = Instant::now();
        u.retain(|_, v| v.expires > t);
        u.insert(
            token.clone(),
            Upload {
                hash: hash.to_ascii_lowercase(),
                owner: tenant.map(str::to_owned),
                expires: t + UPLOAD_LINK_TTL,
            },
        );
        Ok(token)
    }

    /// Takes an upload token: the hash it is for and whose uploads it goes to, if valid.
    pub fn take_upload(&self, token: &str) -> Option<UploadTicket> {
        let mut u = self.uploads.lock().unwrap_or_else(|e| e.into_inner());
        let up = u.remove(token)?;
        (up.expires > Instant::now()).then_some(UploadTicket {
            hash: up.hash,
            owner: up.owner,
        })
    }

    /// A temp file for the upload of `ticket` (under its owner's uploads directory).
    pub fn upload_tmp(&self, ticket: &UploadTicket) -> Result<PathBuf, CoreError> {
        let hash = &ticket.hash;
        let dir = self.uploads_dir(ticket.owner.as_deref());
        // Private, as the store's other directories are.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(CoreError::io(format!("mkdir {}", dir.display())))?;
        Ok(dir.join(format!(
            ".{hash}.{}.part",
            rampart_store::access::new_token()
        )))
    }

    /// Moves a complete upload into place (its owner's uploads), and counts it as its
    /// owner's.
    pub fn commit_upload(&self, tmp: &Path, ticket: &UploadTicket) -> Result<(), CoreError> {
        let to = self.upload_path(ticket.owner.as_deref(), &ticket.hash);
        // Checked again as it is kept: what the tenant took on while it was received
        // (sandboxes, volumes) counts too. An upload it replaces is counted already.
        if let Some(t) = ticket.owner.as_deref() {
            let _g = crate::stored::lock();
            let len = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
            let adds = len(tmp).saturating_sub(len(&to));
            if let Some(room) = self.store.tenant_disk_room(t)? {
                if adds > room {
                    let (used, max) = crate::stored::disk_quota(&*self.store, t);
                    return Err(CoreError::Store(rampart_store::StoreError::Quota(
                        rampart_types::tenant::QuotaRefusal {
                            limit: "max_disk_bytes".into(),
                            used: used as f64,
                            requested: adds as f64,
                            max: max as f64,
                        },
                    )));
                }
            }
        }
        std::fs::rename(tmp, &to).map_err(CoreError::io(format!("rename to {}", to.display())))?;
        // Its TTL runs from now (`crate::stored`).
        if let Ok(f) = std::fs::OpenOptions::new().append(true).open(&to) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        self.measure_uploads(ticket.owner.as_deref());
        Ok(())
    }

    /// Starts a reserved build with `plan` (one a caller of `tenant` may see); returns at
    /// once (poll [`TemplateBuilds::get`]). The build waits in its owner's queue for the
    /// build slot (status `building`, its log saying so). Refused
    /// ([`CoreError::Capacity`]) when its owner holds
    /// [`BuildConfig::max_active_per_tenant`] started builds not ended.
    pub fn start(
        self: &Arc<Self>,
        tenant: Option<&str>,
        build_id: &str,
        plan: BuildPlan,
    ) -> Result<(), CoreError> {
        let info = self
            .get(tenant, build_id)
            .ok_or_else(|| CoreError::NotFound(format!("build {build_id}")))?;
        if info.status != BuildStatus::Waiting {
            return Err(CoreError::Conflict(format!(
                "build {build_id} was already started ({})",
                info.status.as_str()
            )));
        }
        if !self.jailed {
            return Err(CoreError::Unsupported(
                "template builds need the namespace isolation tier (this daemon runs another)"
                    .into(),
            ));
        }
        for (s, _) in &plan.steps {
            if let PlanStep::CopyUpload { hash, .. } = s {
                if !self.has_upload_of(info.owner.as_deref(), hash) {
                    return Err(bad(
                        "steps",
                        format!("the files of hash {hash} were not uploaded"),
                    ));
                }
            }
        }
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let ahead = {
            let mut b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
            let owner = info.owner.as_deref();
            let active = b
                .values()
                .filter(|r| r.started && !r.ended() && r.info.owner.as_deref() == owner)
                .count();
            let Some(r) = b.get_mut(build_id) else {
                return Err(CoreError::NotFound(format!("build {build_id}")));
            };
            if r.started || r.info.status != BuildStatus::Waiting {
                return Err(CoreError::Conflict(format!(
                    "build {build_id} was already started ({})",
                    r.info.status.as_str()
                )));
            }
            if active >= self.cfg.max_active_per_tenant {
                return Err(CoreError::Capacity(format!(
                    "{} has {active} template builds started and not ended (at most {}); \
                     wait for one to end or cancel one",
                    whose(owner),
                    self.cfg.max_active_per_tenant
                )));
            }
            r.started = true;
            r.info.status = BuildStatus::Building;
            q.waiting.values().map(VecDeque::len).sum::<usize>() + usize::from(q.running.is_some())
        };
        let control = {
            let b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
            b.get(build_id)
                .map(|r| r.control.clone())
                .unwrap_or_else(|| Arc::new(Control::new()))
        };
        if ahead > 0 {
            self.log(
                build_id,
                "info",
                None,
                format!("queued: {ahead} builds ahead (builds run one at a time, tenants in turn)"),
            );
        }
        q.waiting
            .entry(info.owner.clone())
            .or_default()
            .push_back(Job {
                id: build_id.to_owned(),
                info,
                plan,
                control,
            });
        drop(q);
        self.pump();
        Ok(())
    }

    /// Cancels a build a caller of `tenant` may see: a reservation or a queued build ends at
    /// once, a running one is stopped (its build sandbox killed) and ends `error` shortly
    /// after; the build's record as it is after the request. A build already ended is a
    /// [`CoreError::Conflict`].
    pub fn cancel(&self, tenant: Option<&str>, build_id: &str) -> Result<BuildInfo, CoreError> {
        let why = "cancelled by the API".to_owned();
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let (started, control, status) = {
            let b = self.records();
            let r = b
                .get(build_id)
                .filter(|r| may_see(tenant, r.info.owner.as_deref()))
                .ok_or_else(|| CoreError::NotFound(format!("build {build_id}")))?;
            (r.started, r.control.clone(), r.info.status)
        };
        if matches!(status, BuildStatus::Ready | BuildStatus::Error) {
            return Err(CoreError::Conflict(format!(
                "build {build_id} already ended ({})",
                status.as_str()
            )));
        }
        control.stop(why.clone());
        if !started {
            // A reservation: it ends here.
            let mut b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = b.get_mut(build_id) {
                r.started = true;
            }
            drop(b);
            self.fail(build_id, why, None);
        } else if q.remove(build_id).is_some() {
            self.fail(build_id, format!("{why} before it ran"), None);
        }
        // Running: the builder stops at its next check; the build task ends it.
        drop(q);
        self.get(tenant, build_id)
            .ok_or_else(|| CoreError::NotFound(format!("build {build_id}")))
    }

    /// Gives the build slot, if free, to the next queued build (owners in turn).
    fn pump(self: &Arc<Self>) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.running.is_some() {
            return;
        }
        let Some(job) = q.next() else { return };
        q.running = Some(job.id.clone());
        drop(q);
        let me = self.clone();
        tokio::spawn(async move {
            let id = job.id.clone();
            me.run_job(job).await;
            me.queue.lock().unwrap_or_else(|e| e.into_inner()).running = None;
            me.pump();
            drop(id);
        });
    }

    /// Calls `f` with the stored name of each template built from now on (once set).
    pub(crate) fn on_built(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.on_built.set(OnBuilt(Box::new(f)));
    }

    /// Runs a build holding the slot, watching its step and build timeouts, and records how
    /// it ended.
    async fn run_job(self: &Arc<Self>, job: Job) {
        let Job {
            id,
            info,
            plan,
            control,
        } = job;
        if control.stopped() {
            let why = control.why().unwrap_or_else(|| "cancelled".into());
            self.fail(&id, why, None);
            return;
        }
        let me = self.clone();
        let (id2, c2) = (id.clone(), control.clone());
        let info_owner = info.owner.clone();
        let stored = info.stored.clone();
        let began = Instant::now();
        control.step_began(None);
        let mut task = tokio::task::spawn_blocking(move || me.run_build(&id2, &info, plan, &c2));
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let r = loop {
            tokio::select! {
                r = &mut task => break r,
                _ = tick.tick() => self.watch(&control, began),
            }
        };
        let r = match r {
            Ok(r) => r,
            Err(e) => Err((format!("the build task failed: {e}"), None)),
        };
        match r {
            Ok(tid) => {
                // The tenant's templates' layers are its own to keep (`crate::stored`).
                if let Some(t) = info_owner.as_deref() {
                    let (store, t) = (self.store.clone(), t.to_owned());
                    let data = self.data.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        crate::stored::measure_layers_of(&data, &*store, &t)
                    })
                    .await;
                }
                self.log(
                    &id,
                    "info",
                    Some("finalize".into()),
                    "Template is ready".into(),
                );
                self.end(&id, |i| {
                    i.status = BuildStatus::Ready;
                    i.template_id = Some(tid);
                });
                if let Some(f) = self.on_built.get() {
                    (f.0)(&stored);
                }
            }
            Err((message, step)) => self.fail(&id, message, step),
        }
    }

    /// Stops a build past its build timeout, or whose step is past the step timeout.
    fn watch(&self, control: &Control, began: Instant) {
        if control.stopped() {
            return;
        }
        let limit = self.cfg.build_timeout;
        if began.elapsed() > limit {
            control.stop(format!(
                "the build timed out: it ran longer than {} s (the daemon's build timeout)",
                limit.as_secs()
            ));
            return;
        }
        let limit = self.cfg.step_timeout;
        let (at, name) = control
            .step
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if at.elapsed() > limit {
            let which = match name {
                Some(n) => format!("step {n}"),
                None => "a step".to_owned(),
            };
            control.stop(format!(
                "{which} timed out: it ran longer than {} s (the daemon's step timeout)",
                limit.as_secs()
            ));
        }
    }

    /// Runs one build (blocking); the template id, or the reason and the step.
    fn run_build(
        &self,
        id: &str,
        info: &BuildInfo,
        plan: BuildPlan,
        control: &Control,
    ) -> Result<String, (String, Option<String>)> {
        let stopped = || control.why().unwrap_or_else(|| "cancelled".into());
        let store = Store::open(&self.data).map_err(|e| (e.to_string(), None))?;
        // The store's lock: a host build may hold it; wait for it to end.
        let mut said = false;
        let _lock = loop {
            match store.lock() {
                Ok(l) => break l,
                Err(ImageError::Locked(what)) => {
                    if control.stopped() {
                        return Err((stopped(), None));
                    }
                    if !said {
                        self.log(
                            id,
                            "info",
                            None,
                            format!("waiting for another template build ({what})"),
                        );
                        said = true;
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => return Err((e.to_string(), None)),
            }
        };
        let staging = store
            .tmp_dir("api-build")
            .map_err(|e| (e.to_string(), None))?;
        // The build's disk: the daemon's bound, or what the tenant's disk quota has left.
        let mut disk = self.cfg.disk_bytes;
        if let Some(t) = info.owner.as_deref() {
            match self.store.tenant_disk_room(t) {
                Ok(Some(room)) if room < rampart_image::step_disk::MIN_STEP_DISK_BYTES => {
                    let (used, max) = crate::stored::disk_quota(&*self.store, t);
                    return Err((
                        format!(
                            "quota max_disk_bytes exceeded: the tenant holds {used} bytes of \
                             disk, the most is {max}; a build needs at least {} bytes",
                            rampart_image::step_disk::MIN_STEP_DISK_BYTES
                        ),
                        None,
                    ));
                }
                Ok(Some(room)) => disk = disk.min(room),
                Ok(None) => {}
                Err(e) => return Err((e.to_string(), None)),
            }
        }
        let mut names = Vec::new();
        let mut steps = Vec::new();
        for (i, (s, name)) in plan.steps.into_iter().enumerate() {
            names.push(name.clone());
            steps.push(match s {
                PlanStep::Step(s) => s,
                PlanStep::CopyUpload {
                    hash,
                    dest,
                    owner,
                    mode,
                } => {
                    let at = staging.path().join(format!("copy{}", i + 1));
                    let src =
                        stage_upload(&self.upload_path(info.owner.as_deref(), &hash), &at, disk)
                            .map_err(|e| (format!("copy: {e}"), name.clone()))?;
                    Step::Copy {
                        src: src
                            .strip_prefix(staging.path())
                            .unwrap_or(&src)
                            .to_path_buf(),
                        dest,
                        owner,
                        mode,
                    }
                }
            });
        }
        let spec = Spec {
            name: None,
            from: plan.from,
            steps,
            start: plan.start,
            network: plan.network,
            isolation: None,
            dir: staging.path().to_path_buf(),
        };
        let runner = JailRunner::new(
            &self.data,
            self.jailer_bin.clone(),
            self.agent_bin.clone(),
            DEFAULT_BUILD_UID_BASE,
        )
        .map_err(|e| (e.to_string(), None))?;
        let mut builder = crate::templates::with_builtins(
            Builder::new(&store, &runner, runner.uid_base()),
            &self.templates_dir,
        )
        .with_registry(self.registry.clone());
        // Cancel and the timeouts set it: the runner kills the step's sandbox.
        builder.cancel = control.cancel.clone();
        // What a step writes goes to a disk of the build's size, never the host's directly.
        builder.step_disk_bytes = Some(disk);
        let step_name = |index: usize| -> Option<String> {
            if index == 0 {
                Some("base".into())
            } else {
                names.get(index - 1).cloned().flatten()
            }
        };
        let mut current: (usize, usize, String) = (0, 0, String::new());
        let mut lines = LineSplitter::new(self.cfg.log_line_max_bytes);
        let mut events = |ev: BuildEvent| match ev {
            BuildEvent::Step {
                index,
                total,
                describe,
                ..
            } => {
                current = (index, total, describe.clone());
                control.step_began(step_name(index));
                self.log(
                    id,
                    "info",
                    step_name(index),
                    format!("[builder {}/{}] {describe}", index + 1, total),
                );
            }
            BuildEvent::Output { text } => {
                let step = step_name(current.0);
                lines.push(&text, &mut |l| self.log(id, "info", step.clone(), l));
            }
            BuildEvent::StepDone {
                index,
                cached,
                secs,
            } => {
                if let Some(l) = lines.finish() {
                    self.log(id, "info", step_name(index), l);
                }
                let msg = if cached {
                    format!("CACHED [builder {}/{}] {}", index + 1, current.1, current.2)
                } else {
                    format!(
                        "DONE [builder {}/{}] {} ({secs:.2} s)",
                        index + 1,
                        current.1,
                        current.2
                    )
                };
                self.log(id, "info", step_name(index), msg);
            }
        };
        let opts = BuildOptions {
            no_cache: plan.no_cache,
            no_cache_from: plan.no_cache_from,
            build_id: Some(id.to_owned()),
            registry_auth: plan.registry_auth.clone(),
            // E2B runs only the start command a build sets, never the image's `CMD`.
            drop_image_cmd: true,
        };
        let (first, rest) = info
            .tags
            .split_first()
            .ok_or_else(|| ("a build needs a tag".to_owned(), None))?;
        let primary = format!("{}:{first}", info.stored);
        let report = builder
            .build(&spec, &primary, &opts, &mut events)
            .map_err(|e| {
                if control.stopped() {
                    let step = control
                        .step
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .1
                        .clone();
                    return (stopped(), step);
                }
                let step = match &e {
                    ImageError::Step { index, .. } => step_name(*index),
                    _ => None,
                };
                (e.to_string(), step)
            })?;
        for t in rest {
            store
                .tag_build(&format!("{}:{t}", info.stored), &report.id, Some(id))
                .map_err(|e| (e.to_string(), Some("finalize".into())))?;
        }
        let cached = report.steps.iter().filter(|s| s.cached).count();
        self.log(
            id,
            "info",
            Some("finalize".into()),
            format!(
                "built {} (sha256:{}) in {:.2} s; {cached} of {} steps from the cache; tags: {}",
                info.name,
                report.id,
                report.secs,
                report.steps.len(),
                info.tags.join(", ")
            ),
        );
        Ok(report.id)
    }
}

/// Unpacks the upload `archive` (gzip or plain tar) into `at` and arranges it for a `copy`
/// as Docker's `COPY` places its sources; returns the path the builder's `copy` step takes:
/// a single file (to `dest`, or into it when `dest` ends in `/`), or a directory whose
/// contents go into `dest` (one directory source, or several sources merged: files by name,
/// directories by their contents).
fn stage_upload(archive: &Path, at: &Path, limit: u64) -> Result<PathBuf, String> {
    // A use: the upload is kept its TTL from now (`crate::stored`).
    if let Ok(f) = std::fs::OpenOptions::new().append(true).open(archive) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
    let over = std::rc::Rc::new(std::cell::Cell::new(false));
    let too_big = || {
        format!("the uploaded archive unpacks to more than {limit} bytes (the build's disk limit)")
    };
    let open = || -> Result<Box<dyn Read>, String> {
        let f = std::fs::File::open(archive).map_err(|e| format!("{}: {e}", archive.display()))?;
        let r = rampart_image::extract::decompressed(std::io::BufReader::new(f))
            .map_err(|e| e.to_string())?;
        // The unpacked stream is bounded: an archive that expands past the build's disk is
        // refused as it is read, before it is written out.
        Ok(Box::new(Bounded {
            inner: r,
            left: limit,
            over: over.clone(),
        }))
    };
    let r = stage_bounded(&open, at, limit);
    if over.get() {
        let _ = rampart_image::store::remove_tree(at);
        return Err(too_big());
    }
    if r.is_err() {
        let _ = rampart_image::store::remove_tree(at);
    }
    r
}

/// A reader that fails once more than `left` bytes were read (and says so in `over`).
struct Bounded<R> {
    inner: R,
    left: u64,
    over: std::rc::Rc<std::cell::Cell<bool>>,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.over.set(true);
            return Err(std::io::Error::other(
                "the archive unpacks past the build's disk limit",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// [`stage_upload`] once its reader is bounded.
fn stage_bounded(
    open: &dyn Fn() -> Result<Box<dyn Read>, String>,
    at: &Path,
    limit: u64,
) -> Result<PathBuf, String> {
    // The archive's own entries: the sources are those whose parent is not one.
    let mut entries: Vec<String> = Vec::new();
    let mut ar = tar::Archive::new(open()?);
    for e in ar
        .entries()
        .map_err(|e| format!("reading the archive: {e}"))?
    {
        let e = e.map_err(|e| format!("reading the archive: {e}"))?;
        let p = e.path().map_err(|e| format!("an entry's path: {e}"))?;
        let p = p
            .to_string_lossy()
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_owned();
        if !p.is_empty() && p != "." {
            entries.push(p);
        }
    }
    if entries.is_empty() {
        return Err("the uploaded archive is empty".into());
    }
    let set: std::collections::BTreeSet<&str> = entries.iter().map(String::as_str).collect();
    let mut tops: Vec<&str> = entries
        .iter()
        .map(String::as_str)
        .filter(|p| {
            let mut q = *p;
            while let Some((parent, _)) = q.rsplit_once('/') {
                if set.contains(parent) {
                    return false;
                }
                q = parent;
            }
            true
        })
        .collect();
    tops.sort_unstable();
    tops.dedup();
    let tree = at.join("tree");
    std::fs::create_dir_all(&tree).map_err(|e| format!("mkdir {}: {e}", tree.display()))?;
    rampart_image::extract::apply_layer(open()?, &tree).map_err(|e| e.to_string())?;
    // What was written, as the files' lengths say (sparse entries included).
    let size = rampart_image::store::tree_size(&tree);
    if size > limit {
        return Err(format!(
            "the uploaded archive unpacks to {size} bytes, more than {limit} (the build's disk \
             limit)"
        ));
    }
    let is_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    if let [one] = tops.as_slice() {
        let p = tree.join(one);
        // One file (or link): to `dest`, or into it with a trailing `/`.
        // One directory: its contents into `dest`.
        return Ok(p);
    }
    // Several sources: into the directory `dest` (files by name, directories' contents).
    let merged = at.join("merged");
    std::fs::create_dir(&merged).map_err(|e| format!("mkdir {}: {e}", merged.display()))?;
    let mut placed: BTreeMap<std::ffi::OsString, ()> = BTreeMap::new();
    for t in &tops {
        let p = tree.join(t);
        let moves: Vec<(PathBuf, std::ffi::OsString)> = if is_dir(&p) {
            std::fs::read_dir(&p)
                .map_err(|e| format!("read {}: {e}", p.display()))?
                .flatten()
                .map(|e| (e.path(), e.file_name()))
                .collect()
        } else {
            match p.file_name() {
                Some(n) => vec![(p.clone(), n.to_owned())],
                None => Vec::new(),
            }
        };
        for (from, name) in moves {
            let to = merged.join(&name);
            if placed.insert(name.clone(), ()).is_some() {
                let _ = rampart_image::store::remove_tree(&to);
            }
            std::fs::rename(&from, &to).map_err(|e| format!("arrange {}: {e}", to.display()))?;
        }
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(max: usize, chunks: &[&str]) -> (Vec<String>, Option<String>, LineSplitter) {
        let mut s = LineSplitter::new(max);
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut |l| out.push(l));
        }
        let last = s.finish();
        (out, last, s)
    }

    #[test]
    fn lines_are_split_across_chunks() {
        let (out, last, _) = split(100, &["ab", "c\nde", "f\r\n\n", "g\nh", "i"]);
        assert_eq!(out, ["abc", "def", "g"]);
        assert_eq!(last.as_deref(), Some("hi"));
    }

    #[test]
    fn long_lines_are_cut_with_the_count_dropped() {
        let (out, last, _) = split(4, &["abcdefghij\n", "xy", "zzzzzz", "\nok\n", "tail-end"]);
        assert_eq!(
            out,
            [
                "abcd [line cut: 6 bytes dropped]",
                "xyzz [line cut: 4 bytes dropped]",
                "ok"
            ]
        );
        assert_eq!(last.as_deref(), Some("tail [line cut: 4 bytes dropped]"));
    }

    #[test]
    fn cuts_fall_on_utf8_boundaries() {
        // "é" is 2 bytes, "€" 3: 5 bytes fall inside "€", so the cut keeps "aé".
        let (out, _, _) = split(5, &["aé€b\n"]);
        assert_eq!(out, ["aé [line cut: 4 bytes dropped]"]);
        // Room left inside a character on a later chunk: nothing after the cut is kept.
        let (out, _, _) = split(4, &["abc", "€d\n"]);
        assert_eq!(out, ["abc [line cut: 4 bytes dropped]"]);
        for l in &out {
            assert!(std::str::from_utf8(l.as_bytes()).is_ok());
        }
        assert_eq!(cut_line("€€", 4), "€ [line cut: 3 bytes dropped]");
    }

    #[test]
    fn output_is_scanned_once_and_held_bounded() {
        // 64 MiB without a newline, in 64 KiB chunks, then a newline: every byte is scanned
        // once (nothing buffered is searched again) and at most the bound is held.
        let chunk = "x".repeat(64 << 10);
        let mut s = LineSplitter::new(16 << 10);
        let mut out = Vec::new();
        let mut total = 0u64;
        for _ in 0..1024 {
            s.push(&chunk, &mut |l| out.push(l));
            total += chunk.len() as u64;
            assert!(s.held() <= 16 << 10);
        }
        s.push("\n", &mut |l| out.push(l));
        total += 1;
        assert_eq!(s.scanned(), total);
        assert_eq!(out.len(), 1);
        assert!(out[0].ends_with(&format!(
            "[line cut: {} bytes dropped]",
            (64u64 << 20) - (16 << 10)
        )));
    }

    #[test]
    fn a_log_past_its_bound_keeps_its_start_and_end() {
        let dir = std::env::temp_dir().join(format!("rampart-buildlog-{}", uuid()));
        let cfg = BuildConfig {
            log_max_bytes: 64 << 10,
            log_line_max_bytes: 1024,
            ..BuildConfig::default()
        };
        let mut l = BuildLog::new(dir.join("b.jsonl"), &cfg);
        for i in 0..10_000 {
            l.push(&LogEntry {
                timestamp: now(),
                level: "info",
                message: format!("line {i} {}", "y".repeat(if i == 5 { 5000 } else { 10 })),
                step: Some("1".into()),
            });
        }
        assert!(l.tail_bytes <= l.tail_max);
        l.close();
        let size = std::fs::metadata(dir.join("b.jsonl")).unwrap().len();
        assert!(size <= (64 << 10) + 1024, "{size}");
        let mut all = Vec::new();
        l.scan(0, &mut |e| {
            all.push(e.message);
            true
        });
        assert!(all[0].starts_with("line 0 "));
        assert!(all[5].ends_with("bytes dropped]"), "{}", all[5]);
        assert!(all.iter().any(|m| m.starts_with("log cut: ")));
        assert!(all.last().unwrap().starts_with("line 9999 "));
        // Reads from an offset seek through the index.
        let mut from = Vec::new();
        l.scan(300, &mut |e| {
            from.push(e.message);
            from.len() < 2
        });
        assert_eq!(from, all[300..302]);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.join("b.jsonl"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_queue_serves_owners_in_turn() {
        let mut q = Queue::default();
        let job = |id: &str| Job {
            id: id.into(),
            info: BuildInfo {
                build_id: id.into(),
                name: String::new(),
                stored: String::new(),
                owner: None,
                tags: Vec::new(),
                status: BuildStatus::Building,
                reason: None,
                created_at: String::new(),
                finished_at: None,
                template_id: None,
            },
            plan: BuildPlan {
                from: Base::Template("base".into()),
                steps: Vec::new(),
                start: None,
                network: BuildNetwork::None,
                no_cache: false,
                no_cache_from: None,
                registry_auth: None,
            },
            control: Arc::new(Control::new()),
        };
        for id in ["b1", "b2", "b3"] {
            q.waiting
                .entry(Some("b".into()))
                .or_default()
                .push_back(job(id));
        }
        q.waiting
            .entry(Some("a".into()))
            .or_default()
            .push_back(job("a1"));
        q.waiting.entry(None).or_default().push_back(job("n1"));
        let order: Vec<String> = std::iter::from_fn(|| q.next().map(|j| j.id)).collect();
        assert_eq!(order, ["n1", "a1", "b1", "b2", "b3"]);
        // After b was served, a newcomer a goes before b's next.
        for id in ["b4", "b5"] {
            q.waiting
                .entry(Some("b".into()))
                .or_default()
                .push_back(job(id));
        }
        assert_eq!(q.next().map(|j| j.id).as_deref(), Some("b4"));
        q.waiting
            .entry(Some("a".into()))
            .or_default()
            .push_back(job("a2"));
        assert_eq!(q.next().map(|j| j.id).as_deref(), Some("a2"));
        assert_eq!(q.next().map(|j| j.id).as_deref(), Some("b5"));
    }
}
