//! Template builds through the API (E2B's `Template().build()`): the same builder as
//! `rampart template build` (`rampart-image`: its step cache, its build sandboxes and their
//! networks), run by the daemon, one build at a time, with the state and log an API client
//! polls, and the file archives `copy` steps take (uploaded by the client, kept by hash).
//!
//! - A build is reserved ([`TemplateBuilds::reserve`], status `waiting`), then started with
//!   its plan ([`TemplateBuilds::start`], `building`), and ends `ready` (its name and tags point
//!   at the new template) or `error` (with the reason and the step); a failed build leaves no
//!   layer, name or temp directory half-made (the builder's guarantee).
//! - Builds run one at a time in the daemon; a build of `rampart template build` on the host
//!   holding the store's lock makes an API build wait (its log says so) until it ends.
//! - Uploads: `<data>/images/uploads/<hash>.tar` (the archive as sent, gzip or plain), written
//!   to a temp file and renamed into place when complete. A `copy` step's archive is unpacked
//!   with the layer extractor's rules (no entry leaves the directory, symlinks are never
//!   followed) into a temp directory of the store, arranged as Docker's `COPY` places its
//!   sources, and copied by the builder's `copy` step (whose cache key covers every copied
//!   file: a layer is reused only for the same content).
//! - Build records live in memory (the last [`MAX_BUILDS`]): after a restart, a build's
//!   status is unknown, its template (if it was ready) remains.

use crate::CoreError;
use rampart_image::build::{BuildEvent, BuildOptions, Builder, JailRunner, DEFAULT_BUILD_UID_BASE};
use rampart_image::spec::{Base, BuildNetwork, StartSpec};
use rampart_image::{ImageError, Spec, Step, Store};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Read;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Builds kept in memory (oldest finished ones are forgotten first).
pub const MAX_BUILDS: usize = 256;
/// Log entries kept per build (later ones are dropped, with a note).
pub const MAX_LOG_ENTRIES: usize = 50_000;
/// Largest upload accepted, bytes.
pub const MAX_UPLOAD_BYTES: u64 = 4 << 30;
/// How long an upload link stays valid.
pub const UPLOAD_LINK_TTL: Duration = Duration::from_secs(3600);

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

#[derive(Debug)]
struct Record {
    info: BuildInfo,
    logs: Vec<LogEntry>,
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
    /// Whether sandboxes run in the jail (builds need it).
    jailed: bool,
    builds: Mutex<HashMap<String, Record>>,
    order: Mutex<VecDeque<String>>,
    uploads: Mutex<HashMap<String, Upload>>,
    /// One build at a time in this daemon.
    run: tokio::sync::Mutex<()>,
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

impl TemplateBuilds {
    pub(crate) fn new(cfg: &crate::CoreConfig, templates_dir: &Path, jailed: bool) -> Self {
        TemplateBuilds {
            data: cfg.data_dir.clone(),
            templates_dir: templates_dir.to_path_buf(),
            jailer_bin: cfg.jailer_bin.clone(),
            agent_bin: cfg.agent_bin.clone(),
            registry: cfg.registry.clone(),
            jailed,
            builds: Mutex::new(HashMap::new()),
            order: Mutex::new(VecDeque::new()),
            uploads: Mutex::new(HashMap::new()),
            run: tokio::sync::Mutex::new(()),
        }
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

    /// Reserves a build of template `t` (resolved for writing by
    /// [`crate::templates::lookup`]) with `tags` (store references are the stored name for
    /// `default` and `stored:TAG`); status `waiting`, owned by the caller's `tenant` (None:
    /// the node).
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
        // Forget the oldest finished builds beyond the bound.
        while order.len() >= MAX_BUILDS {
            let Some(pos) = order.iter().position(|id| {
                b.get(id).is_none_or(|r| {
                    matches!(r.info.status, BuildStatus::Ready | BuildStatus::Error)
                })
            }) else {
                break;
            };
            if let Some(id) = order.remove(pos) {
                b.remove(&id);
            }
        }
        order.push_back(info.build_id.clone());
        b.insert(
            info.build_id.clone(),
            Record {
                info: info.clone(),
                logs: Vec::new(),
            },
        );
        Ok(info)
    }

    /// A build's record, if a caller of `tenant` may see it (its tenant's, or any for the
    /// node): another tenant's build is None, as one that does not exist.
    pub fn get(&self, tenant: Option<&str>, build_id: &str) -> Option<BuildInfo> {
        let b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
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
        let b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<BuildInfo> = b
            .values()
            .filter(|r| r.info.stored == t.stored)
            .filter(|r| may_see(tenant, r.info.owner.as_deref()))
            .map(|r| r.info.clone())
            .collect();
        v.sort_by(|a, b| b.created_at.cmp(&a.created_at));
        v
    }

    /// Log entries of a build from `offset`, at most `limit` (None: no such build the
    /// caller may see, see [`TemplateBuilds::get`]).
    pub fn logs(
        &self,
        tenant: Option<&str>,
        build_id: &str,
        offset: usize,
        limit: usize,
    ) -> Option<Vec<LogEntry>> {
        let b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
        b.get(build_id)
            .filter(|r| may_see(tenant, r.info.owner.as_deref()))
            .map(|r| r.logs.iter().skip(offset).take(limit).cloned().collect())
    }

    fn log(&self, build_id: &str, level: &'static str, step: Option<String>, message: String) {
        let mut b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = b.get_mut(build_id) {
            if r.logs.len() < MAX_LOG_ENTRIES {
                r.logs.push(LogEntry {
                    timestamp: now(),
                    level,
                    message,
                    step,
                });
            } else if r.logs.len() == MAX_LOG_ENTRIES {
                r.logs.push(LogEntry {
                    timestamp: now(),
                    level: "warn",
                    message: format!("log truncated at {MAX_LOG_ENTRIES} entries"),
                    step: None,
                });
            }
        }
    }

    fn set(&self, build_id: &str, f: impl FnOnce(&mut BuildInfo)) {
        let mut b = self.builds.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = b.get_mut(build_id) {
            f(&mut r.info);
        }
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

    /// Moves a complete upload into place (its owner's uploads).
    pub fn commit_upload(&self, tmp: &Path, ticket: &UploadTicket) -> Result<(), CoreError> {
        let to = self.upload_path(ticket.owner.as_deref(), &ticket.hash);
        std::fs::rename(tmp, &to).map_err(CoreError::io(format!("rename to {}", to.display())))
    }

    /// Starts a reserved build with `plan` (one a caller of `tenant` may see); returns at
    /// once (poll [`TemplateBuilds::get`]).
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
        self.set(build_id, |i| i.status = BuildStatus::Building);
        let me = self.clone();
        let id = build_id.to_owned();
        tokio::spawn(async move {
            let _one = me.run.lock().await;
            let me2 = me.clone();
            let id2 = id.clone();
            let r = tokio::task::spawn_blocking(move || me2.run_build(&id2, &info, plan)).await;
            let r = match r {
                Ok(r) => r,
                Err(e) => Err((format!("the build task failed: {e}"), None)),
            };
            match r {
                Ok(tid) => {
                    me.log(
                        &id,
                        "info",
                        Some("finalize".into()),
                        "Template is ready".into(),
                    );
                    me.set(&id, |i| {
                        i.status = BuildStatus::Ready;
                        i.template_id = Some(tid);
                        i.finished_at = Some(now());
                    });
                }
                Err((message, step)) => {
                    me.log(
                        &id,
                        "error",
                        step.clone(),
                        format!("Build failed: {message}"),
                    );
                    me.set(&id, |i| {
                        i.status = BuildStatus::Error;
                        i.reason = Some((message, step));
                        i.finished_at = Some(now());
                    });
                }
            }
        });
        Ok(())
    }

    /// Runs one build (blocking); the template id, or the reason and the step.
    fn run_build(
        &self,
        id: &str,
        info: &BuildInfo,
        plan: BuildPlan,
    ) -> Result<String, (String, Option<String>)> {
        let store = Store::open(&self.data).map_err(|e| (e.to_string(), None))?;
        // The store's lock: a host build may hold it; wait for it to end.
        let mut said = false;
        let _lock = loop {
            match store.lock() {
                Ok(l) => break l,
                Err(ImageError::Locked(what)) => {
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
                    let src = stage_upload(&self.upload_path(info.owner.as_deref(), &hash), &at)
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
            dir: staging.path().to_path_buf(),
        };
        let runner = JailRunner::new(
            &self.data,
            self.jailer_bin.clone(),
            self.agent_bin.clone(),
            DEFAULT_BUILD_UID_BASE,
        )
        .map_err(|e| (e.to_string(), None))?;
        let builder = crate::templates::with_builtins(
            Builder::new(&store, &runner, runner.uid_base()),
            &self.templates_dir,
        )
        .with_registry(self.registry.clone());
        let step_name = |index: usize| -> Option<String> {
            if index == 0 {
                Some("base".into())
            } else {
                names.get(index - 1).cloned().flatten()
            }
        };
        let mut current: (usize, usize, String) = (0, 0, String::new());
        let mut pending = String::new();
        let mut events = |ev: BuildEvent| match ev {
            BuildEvent::Step {
                index,
                total,
                describe,
                ..
            } => {
                current = (index, total, describe.clone());
                self.log(
                    id,
                    "info",
                    step_name(index),
                    format!("[builder {}/{}] {describe}", index + 1, total),
                );
            }
            BuildEvent::Output { text } => {
                pending.push_str(&text);
                while let Some(p) = pending.find('\n') {
                    let line: String = pending.drain(..=p).collect();
                    let line = line.trim_end_matches(['\n', '\r']);
                    if !line.is_empty() {
                        self.log(id, "info", step_name(current.0), line.to_owned());
                    }
                }
            }
            BuildEvent::StepDone {
                index,
                cached,
                secs,
            } => {
                if !pending.trim().is_empty() {
                    let line = std::mem::take(&mut pending);
                    self.log(id, "info", step_name(index), line.trim_end().to_owned());
                }
                pending.clear();
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
fn stage_upload(archive: &Path, at: &Path) -> Result<PathBuf, String> {
    let open = || -> Result<Box<dyn Read>, String> {
        let f = std::fs::File::open(archive).map_err(|e| format!("{}: {e}", archive.display()))?;
        rampart_image::extract::decompressed(std::io::BufReader::new(f)).map_err(|e| e.to_string())
    };
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
