//! `rampart serve`: the daemon.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use rampart_core::{AuditConfig, CoreConfig, Manager};
use rampart_types::limits::parse_size;
use rampart_types::Limits;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default listen address: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3000";
/// How long shutdown waits for open connections (streams, shells) before leaving.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `rampart serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (every request but /health needs an API key over TCP).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// More host names the native API answers to over TCP, comma-separated (the names of a
    /// reverse proxy in front of it); loopback names, the listen address and the domain
    /// always are.
    #[arg(
        long,
        value_name = "NAMES",
        env = "RAMPART_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    allowed_hosts: Vec<String>,
    /// Data directory (state.db, templates, sandboxes). Default: /var/lib/rampart for root,
    /// else $XDG_DATA_HOME/rampart.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// TOML config file: defaults and maxima of limits, timeouts, max sandboxes, uid range.
    #[arg(long, value_name = "FILE", env = "RAMPART_CONFIG")]
    config: Option<PathBuf>,
    /// The `rampart-jailer` binary (default: next to this executable).
    #[arg(long, value_name = "PATH", env = "RAMPART_JAILER_BIN")]
    jailer_bin: Option<PathBuf>,
    /// The `rampart-agent` binary (default: next to this executable).
    #[arg(long, value_name = "PATH", env = "RAMPART_AGENT_BIN")]
    agent_bin: Option<PathBuf>,
    /// Log format (the level comes from RUST_LOG, default `info`).
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Domain of host-name routing to sandbox ports: `{port}-{id}.<DOMAIN>` (default
    /// `localhost`).
    #[arg(long, value_name = "DOMAIN")]
    domain: Option<String>,
    /// A PEM certificate chain (the server's certificate first): the TCP listener serves
    /// HTTPS with it instead of plain HTTP. A wildcard certificate for `*.<DOMAIN>` serves
    /// the host-form URLs `https://{port}-{id}.<DOMAIN>`. Needs --tls-key.
    #[arg(long, value_name = "FILE", env = "RAMPART_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", env = "RAMPART_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// E2B's `allowPublicTraffic` for a create that does not say: `true` (E2B's default;
    /// every port but envd's and the code interpreter's answers without the sandbox's
    /// traffic token) or `false` (every port needs it). Overrides the config file's
    /// `[e2b] allow_public_traffic`.
    #[arg(
        long,
        value_name = "BOOL",
        env = "RAMPART_E2B_ALLOW_PUBLIC_TRAFFIC",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    e2b_allow_public_traffic: Option<bool>,
    /// Disk overcommit ratio (overrides the config file's `disk_overcommit`; 1.0, the
    /// default, admits no more disk quota than the store can hold).
    #[arg(long, value_name = "RATIO", env = "RAMPART_DISK_OVERCOMMIT")]
    disk_overcommit: Option<f64>,
    /// The isolation tier of a sandbox whose request and template name none: `namespace`
    /// (the default) or `gvisor` (overrides the config file's `default_isolation`).
    #[arg(long, value_name = "TIER", env = "RAMPART_DEFAULT_ISOLATION")]
    default_isolation: Option<rampart_types::Tier>,
    /// A warm pool: `TEMPLATE=SIZE` (or `TEMPLATE:TIER=SIZE`) sandboxes launched ahead of
    /// the creates that claim them; repeatable (replaces the config file's `[warm]`).
    #[arg(
        long,
        value_name = "TEMPLATE=SIZE",
        env = "RAMPART_WARM",
        value_delimiter = ','
    )]
    warm: Vec<rampart_core::WarmPool>,
    #[command(flatten)]
    fleet: crate::commands::fleet::JoinArgs,
}

/// A size in a config file: bytes (`536870912`) or text (`"512M"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

impl SizeValue {
    fn bytes(&self, field: &str) -> Result<u64> {
        match self {
            SizeValue::Bytes(b) => Ok(*b),
            SizeValue::Text(t) => parse_size(t)
                .ok_or_else(|| anyhow!("{field}: cannot read {t:?} as a size (e.g. 512M, 2G)")),
        }
    }
}

/// Limits in a config file; unset fields keep the built-in value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsConfig {
    cpus: Option<f64>,
    memory: Option<SizeValue>,
    pids: Option<u64>,
    disk: Option<SizeValue>,
    open_files: Option<u64>,
}

impl LimitsConfig {
    fn apply(&self, section: &str, mut l: Limits) -> Result<Limits> {
        if let Some(c) = self.cpus {
            if !(c.is_finite() && c > 0.0) {
                bail!("{section}.cpus: must be a positive number");
            }
            l.cpus = c;
        }
        if let Some(m) = &self.memory {
            l.memory_bytes = m.bytes(&format!("{section}.memory"))?;
        }
        if let Some(p) = self.pids {
            l.pids = p;
        }
        if let Some(d) = &self.disk {
            l.disk_bytes = d.bytes(&format!("{section}.disk"))?;
        }
        if let Some(o) = self.open_files {
            l.open_files = o;
        }
        Ok(l)
    }
}

/// The config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    jailer_bin: Option<PathBuf>,
    agent_bin: Option<PathBuf>,
    max_sandboxes: Option<usize>,
    default_timeout_secs: Option<u64>,
    max_timeout_secs: Option<u64>,
    uid_range_start: Option<u32>,
    uid_slots: Option<u32>,
    /// How long a sandbox asleep for its idleness stays frozen before it is paused to its
    /// filesystem, on the namespace tier (default 3600; 0: it stays frozen).
    idle_cold_secs: Option<u64>,
    /// How far disk quotas may exceed what the store can hold (1.0: not at all).
    disk_overcommit: Option<f64>,
    #[serde(default)]
    default_limits: LimitsConfig,
    #[serde(default)]
    max_limits: LimitsConfig,
    #[serde(default)]
    audit: AuditFileConfig,
    #[serde(default)]
    artifacts: ArtifactsFileConfig,
    /// Domain of host-name routing to sandbox ports.
    domain: Option<String>,
    /// A PEM certificate chain: the TCP listener serves HTTPS with it (needs `tls_key`).
    tls_cert: Option<PathBuf>,
    /// The PEM private key of `tls_cert`.
    tls_key: Option<PathBuf>,
    /// The E2B-compatible API (see `docs/e2b.md`).
    #[serde(default)]
    e2b: E2bFileConfig,
    /// More host names the native API answers to over TCP.
    #[serde(default)]
    allowed_hosts: Vec<String>,
    /// Sandbox networks (see `docs/network.md`).
    #[serde(default)]
    network: super::net::NetworkFileConfig,
    /// Approvals (see `docs/api.md`, "Approvals").
    #[serde(default)]
    approvals: ApprovalsFileConfig,
    /// Lifecycle events and webhooks (see `docs/events.md`).
    #[serde(default)]
    events: EventsFileConfig,
    /// Template builds' image pulls (see `docs/templates.md`, "Images from a registry").
    #[serde(default)]
    templates: TemplatesFileConfig,
    /// The tier of a sandbox whose request names none (`namespace` or `gvisor`).
    default_isolation: Option<String>,
    /// The gVisor tier (see `docs/isolation.md`).
    #[serde(default)]
    gvisor: GvisorFileConfig,
    /// Warm pools: `"TEMPLATE" = SIZE` or `"TEMPLATE:TIER" = SIZE`.
    #[serde(default)]
    warm: std::collections::BTreeMap<String, usize>,
}

/// `[e2b]` of the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct E2bFileConfig {
    /// `allowPublicTraffic` of a create that does not say (default true, as E2B's).
    allow_public_traffic: Option<bool>,
    /// Every E2B sandbox sleeps after this many seconds without a request (none: never).
    idle_pause_secs: Option<u64>,
}

/// The TLS configuration of `--tls-cert`/`--tls-key` (or the config file's `tls_cert` and
/// `tls_key`): both or neither; read and checked now, so that a certificate that cannot be
/// served fails `serve` before anything starts.
fn resolve_tls(
    a: &ServeArgs,
    file: &FileConfig,
    domain: &str,
) -> Result<Option<rampart_server::TlsConfig>> {
    let cert = a.tls_cert.clone().or(file.tls_cert.clone());
    let key = a.tls_key.clone().or(file.tls_key.clone());
    let (cert, key) = match (cert, key) {
        (None, None) => return Ok(None),
        (Some(c), Some(k)) => (c, k),
        (Some(_), None) => bail!(
            "--tls-cert is given without --tls-key (or tls_cert without tls_key in the config \
             file): HTTPS needs both, the certificate and its private key"
        ),
        (None, Some(_)) => bail!(
            "--tls-key is given without --tls-cert (or tls_key without tls_cert in the config \
             file): HTTPS needs both, the certificate and its private key"
        ),
    };
    let tls = rampart_server::TlsConfig::load(&cert, &key).map_err(|e| anyhow!("{e}"))?;
    let probe = format!("49983-sandbox.{domain}");
    if !tls.covers(&probe) {
        tracing::warn!(
            "the TLS certificate {} does not name *.{domain}: clients will refuse the host-form \
             URLs https://{{port}}-{{id}}.{domain} (give a wildcard certificate for *.{domain}, or \
             --domain the domain it names)",
            cert.display()
        );
    }
    Ok(Some(tls))
}

/// `[gvisor]` of the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GvisorFileConfig {
    /// The `runsc` binary (default: `runsc` on the PATH).
    runsc: Option<PathBuf>,
    /// Its platform (default `ptrace`).
    platform: Option<String>,
}

/// `[templates]` of the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplatesFileConfig {
    /// Registry name (`docker.io`, `ghcr.io`) to the URL of a mirror pulls of it go to.
    #[serde(default)]
    registry_mirrors: std::collections::BTreeMap<String, String>,
    /// Registries (`host[:port]`) spoken to over plain HTTP.
    #[serde(default)]
    insecure_registries: Vec<String>,
    /// Address ranges that are not public but that registries may have (default none).
    #[serde(default)]
    registry_allow_cidrs: Vec<String>,
    /// A PEM file of more roots trusted for registries.
    registry_ca: Option<PathBuf>,
    /// ECR's API endpoint for every region (default `https://api.ecr.REGION.amazonaws.com/`).
    ecr_endpoint: Option<String>,
}

/// The registry configuration of `[templates]`, with `RAMPART_REGISTRY_*` over it.
fn resolve_registry(
    t: &TemplatesFileConfig,
) -> anyhow::Result<rampart_image::registry::RegistryConfig> {
    let cfg = rampart_image::registry::RegistryConfig {
        mirrors: t.registry_mirrors.clone(),
        insecure: t.insecure_registries.clone(),
        allow_cidrs: rampart_core::events::parse_cidrs(&t.registry_allow_cidrs)
            .map_err(|m| anyhow::anyhow!("[templates] registry_allow_cidrs: {m}"))?,
        ca_pem: match &t.registry_ca {
            Some(p) => Some(std::fs::read(p).map_err(|e| {
                anyhow::anyhow!("[templates] registry_ca: read {}: {e}", p.display())
            })?),
            None => None,
        },
        ecr_endpoint: t.ecr_endpoint.clone(),
    };
    // Checked (mirror URLs, the CA) once the environment is read over it.
    cfg.with_env()
        .map_err(|e| anyhow::anyhow!("[templates] or RAMPART_REGISTRY_*: {e}"))
}

/// `[events]` of the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsFileConfig {
    /// Seconds lifecycle events are kept (default 604800: 7 days).
    retention_secs: Option<u64>,
    /// Address ranges that are not public but that webhooks may be posted to (default none).
    #[serde(default)]
    webhook_allow_cidrs: Vec<String>,
}

/// `[approvals]` of the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalsFileConfig {
    /// Where each held request and each decision is posted.
    webhook_url: Option<String>,
    /// The HMAC key of the webhook's `X-Rampart-Signature` (unsigned without one).
    webhook_secret: Option<String>,
}

/// `[audit]` of the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditFileConfig {
    /// Record the audit log (default true; false only for measurements).
    enabled: Option<bool>,
    /// Bytes of each output stream kept as a blob (default 1M).
    blob_cap: Option<SizeValue>,
    /// Seconds between publications of live sandboxes' chain heads (default 60).
    publish_interval_secs: Option<u64>,
    /// Record `fs_diff` at destroy (default true).
    fs_diff: Option<bool>,
    /// Most entries an `fs_diff` lists (default 10000).
    fs_diff_max_entries: Option<usize>,
    /// Most bytes an `fs_diff` hashes (default 256M).
    fs_diff_max_hash: Option<SizeValue>,
    /// Network events a sandbox records in a burst before the rest are counted (default 1000).
    network_events_burst: Option<u32>,
    /// Network events per second a sandbox records in the long run (default 50).
    network_events_per_sec: Option<f64>,
}

/// `[artifacts]` of the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ArtifactsFileConfig {
    /// Seconds artifacts are kept after their sandbox ended (default 604800: 7 days).
    retention_secs: Option<u64>,
    /// Most files kept per sandbox (default 10000).
    max_files: Option<usize>,
    /// Most bytes kept per sandbox (default 1G).
    max_bytes: Option<SizeValue>,
}

fn read_config(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
}

fn host_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The built-in maxima: the host's CPUs and RAM, 32768 pids, 64 GiB disk, 1M open files.
fn builtin_max_limits() -> Limits {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;
    Limits {
        cpus,
        memory_bytes: host_memory_bytes().unwrap_or(4 << 30),
        pids: 32768,
        disk_bytes: 64 << 30,
        open_files: 1 << 20,
    }
}

/// The daemon's umask: every file and directory it creates is private to it (0600, 0700)
/// unless made otherwise on purpose (template content that sandboxes read is given its modes
/// explicitly; the jailer is spawned with 0022).
const DAEMON_UMASK: u32 = 0o077;

/// State files the daemon tightens to 0600 at start when an older daemon left them readable
/// by group or others (the store and the journal also do it for theirs when they open them).
/// `node.key` is not in the list: a signing key others could read is refused (`rampart_audit`).
const PRIVATE_FILES: [&str; 7] = [
    "state.db",
    "state.db-wal",
    "state.db-shm",
    "audit.journal",
    "audit.journal.1",
    "api-key",
    rampart_server::ADMIN_KEY_FILE,
];

/// Creates the data directory (and any missing parent) with mode 0700.
pub(crate) fn create_data_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))
}

/// Checks that `p`, a parent of the data directory `dir`, lets no other user replace what is
/// under it: owned by root or `euid`, and not writable by group or others unless sticky (like
/// `/tmp`, where only an entry's owner may rename or remove it).
fn check_parent(dir: &Path, p: &Path, euid: u32) -> Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(l) = std::fs::symlink_metadata(p) else {
        return Ok(()); // missing: made below, 0700
    };
    if l.uid() != 0 && l.uid() != euid {
        bail!(
            "the data directory {} is not safe: {} belongs to uid {}, who could replace it. \
             Fix: choose a --data-dir whose every parent belongs to root or to uid {euid} (the \
             daemon's user)",
            dir.display(),
            p.display(),
            l.uid()
        );
    }
    let Ok(m) = std::fs::metadata(p) else {
        return Ok(());
    };
    let mode = m.mode() & 0o7777;
    if m.is_dir() && mode & 0o022 != 0 && mode & 0o1000 == 0 {
        bail!(
            "the data directory {} is not safe: {} is writable by other users (mode {mode:04o}) \
             and has no sticky bit, so another user could move the data directory away and put \
             their own in its place. Fix: `chmod go-w {}`, or choose a --data-dir under \
             directories only root or uid {euid} can write",
            dir.display(),
            p.display(),
            p.display()
        );
    }
    Ok(())
}

/// Makes sure the data directory is the daemon's alone before anything is read or written
/// in it (see `docs/threat-model.md`, "State and proxy credentials"):
/// - missing: created, with its missing parents, mode 0700;
/// - a parent (of the path given or of its real location) owned by another user than root
///   or the daemon's, or writable by group or others without the sticky bit: refused;
/// - owned by another user: refused (another user's files never become the daemon's state);
/// - writable by group or others: refused (they may have planted files: a `state.db`, a
///   symlink); the operator checks it and chmods it, or starts afresh;
/// - readable or searchable by group or others (e.g. 0755, from `mkdir` with umask 022):
///   made 0700, with a log line saying so; so are the state files of [`PRIVATE_FILES`] that
///   are readable by group or others.
///
/// Every refusal names the path and the fix.
fn secure_data_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let euid = nix::unistd::geteuid().as_raw();
    let abs = std::path::absolute(dir)
        .with_context(|| format!("the data directory {}", dir.display()))?;
    for p in abs.ancestors().skip(1) {
        check_parent(&abs, p, euid)?;
    }
    match std::fs::symlink_metadata(&abs) {
        Ok(l) if l.file_type().is_symlink() && l.uid() != 0 && l.uid() != euid => bail!(
            "the data directory {} is a symlink that belongs to uid {}, who could point it \
             elsewhere. Fix: choose a --data-dir that is a real directory of uid {euid}",
            abs.display(),
            l.uid()
        ),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            create_data_dir(&abs)?;
            tracing::info!("created the data directory {} (mode 0700)", abs.display());
        }
        Err(e) => return Err(e).with_context(|| format!("the data directory {}", abs.display())),
    }
    let real = std::fs::canonicalize(&abs)
        .with_context(|| format!("the data directory {}", abs.display()))?;
    if real != abs {
        for p in real.ancestors().skip(1) {
            check_parent(&abs, p, euid)?;
        }
    }
    let md = std::fs::metadata(&real)
        .with_context(|| format!("the data directory {}", real.display()))?;
    if !md.is_dir() {
        bail!(
            "the data directory {} is not a directory. Fix: pass --data-dir a directory (it is \
             made, mode 0700, if missing)",
            abs.display()
        );
    }
    if md.uid() != euid {
        bail!(
            "the data directory {} belongs to uid {}, not to uid {euid} that runs the daemon: \
             another user's files must not become the daemon's state. Fix: `chown -R {euid} {}` \
             if it is this daemon's, or choose another --data-dir",
            abs.display(),
            md.uid(),
            real.display()
        );
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o022 != 0 {
        bail!(
            "the data directory {} is writable by other users (mode {mode:04o}): they may have \
             put files in it for the daemon to trust (a state.db, a symlink). Fix: check what \
             it holds, then `chmod 700 {}`; or start with a new directory",
            abs.display(),
            real.display()
        );
    }
    if mode != 0o700 {
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot chmod the data directory {}", real.display()))?;
        tracing::warn!(
            "the data directory {} was mode {mode:04o} (other users could read the daemon's \
             state); made it 0700",
            abs.display()
        );
    }
    for name in PRIVATE_FILES {
        let p = real.join(name);
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let mode = m.mode() & 0o7777;
        if m.is_file() && m.uid() == euid && mode & 0o077 != 0 {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("cannot chmod {}", p.display()))?;
            tracing::warn!(
                "{} was mode {mode:04o} (readable by other users); made it 0600",
                p.display()
            );
        }
    }
    Ok(())
}

/// Finds a helper binary: the flag/env/config value, else next to this executable.
fn helper_bin(name: &str, given: Option<PathBuf>, flag: &str) -> Result<PathBuf> {
    let path = match given {
        Some(p) => p,
        None => {
            let exe = std::env::current_exe().context("cannot locate the rampart executable")?;
            exe.parent()
                .map(|d| d.join(name))
                .ok_or_else(|| anyhow!("no directory for {name}"))?
        }
    };
    if !path.is_file() {
        bail!(
            "{name} not found at {}: build it (`cargo build -p {}`) or pass {flag}",
            path.display(),
            if name == "rampart-agent" {
                "rampart-agent"
            } else {
                "rampart-jail"
            }
        );
    }
    Ok(path)
}

/// Everything `serve` runs with, resolved from flags, the config file and defaults.
#[derive(Debug)]
struct Resolved {
    listen: SocketAddr,
    core: CoreConfig,
    server: rampart_server::ServerOptions,
}

fn resolve(a: &ServeArgs) -> Result<Resolved> {
    let file = match &a.config {
        Some(p) => read_config(p)?,
        None => FileConfig::default(),
    };
    let listen_text = a
        .listen
        .clone()
        .or(file.listen.clone())
        .unwrap_or(DEFAULT_LISTEN.into());
    let listen: SocketAddr = listen_text
        .parse()
        .map_err(|_| anyhow!("--listen: {listen_text:?} is not an address like 127.0.0.1:3000"))?;
    let data_dir = match a.data_dir.clone().or(file.data_dir.clone()) {
        // Absolute: the tier opens paths under it from other working directories.
        Some(d) => std::path::absolute(&d)
            .with_context(|| format!("--data-dir: cannot make {} absolute", d.display()))?,
        None => crate::data_dir::default_data_dir()?,
    };
    let jailer_bin = helper_bin(
        "rampart-jailer",
        a.jailer_bin.clone().or(file.jailer_bin.clone()),
        "--jailer-bin",
    )?;
    let agent_bin = helper_bin(
        "rampart-agent",
        a.agent_bin.clone().or(file.agent_bin.clone()),
        "--agent-bin",
    )?;

    let default_limits = file
        .default_limits
        .apply("default_limits", Limits::default())?;
    let max_limits = file.max_limits.apply("max_limits", builtin_max_limits())?;
    let checks: [(&str, f64, f64); 5] = [
        ("cpus", default_limits.cpus, max_limits.cpus),
        (
            "memory",
            default_limits.memory_bytes as f64,
            max_limits.memory_bytes as f64,
        ),
        ("pids", default_limits.pids as f64, max_limits.pids as f64),
        (
            "disk",
            default_limits.disk_bytes as f64,
            max_limits.disk_bytes as f64,
        ),
        (
            "open_files",
            default_limits.open_files as f64,
            max_limits.open_files as f64,
        ),
    ];
    for (field, d, m) in checks {
        if d > m {
            bail!("default_limits.{field} ({d}) is above max_limits.{field} ({m})");
        }
    }
    let default_timeout_secs = file.default_timeout_secs.unwrap_or(300);
    let max_timeout_secs = file.max_timeout_secs.unwrap_or(24 * 3600);
    if default_timeout_secs == 0 || default_timeout_secs > max_timeout_secs {
        bail!(
            "default_timeout_secs ({default_timeout_secs}) must be at least 1 and at most \
             max_timeout_secs ({max_timeout_secs})"
        );
    }
    let uid_range_start = file.uid_range_start.unwrap_or(0x7000_0000);
    let uid_slots = file.uid_slots.unwrap_or(4096);
    let end = u64::from(uid_range_start) + u64::from(uid_slots) * 65536;
    if uid_slots == 0 || end > u64::from(u32::MAX) || uid_range_start < 65536 {
        bail!(
            "uid_range_start ({uid_range_start}) and uid_slots ({uid_slots}): the ranges must lie \
             between 65536 and 2^32-1, with at least one slot"
        );
    }
    let mut audit = AuditConfig::default();
    if let Some(e) = file.audit.enabled {
        audit.enabled = e;
    }
    if let Some(c) = &file.audit.blob_cap {
        audit.blob_cap = usize::try_from(c.bytes("audit.blob_cap")?)
            .map_err(|_| anyhow!("audit.blob_cap is too large"))?;
    }
    if let Some(s) = file.audit.publish_interval_secs {
        if s == 0 {
            bail!("audit.publish_interval_secs must be at least 1");
        }
        audit.publish_interval = Duration::from_secs(s);
    }
    if let Some(f) = file.audit.fs_diff {
        audit.fs_diff = f;
    }
    if let Some(n) = file.audit.fs_diff_max_entries {
        audit.fs_diff_limits.max_entries = n;
    }
    if let Some(c) = &file.audit.fs_diff_max_hash {
        audit.fs_diff_limits.max_hash_bytes = c.bytes("audit.fs_diff_max_hash")?;
    }
    if let Some(n) = file.audit.network_events_burst {
        if n == 0 {
            bail!("audit.network_events_burst must be at least 1");
        }
        audit.network_events.burst = n;
    }
    if let Some(r) = file.audit.network_events_per_sec {
        if !(r.is_finite() && r > 0.0) {
            bail!("audit.network_events_per_sec must be above 0");
        }
        audit.network_events.per_sec = r;
    }
    let mut artifacts = rampart_core::artifacts::ArtifactConfig::default();
    if let Some(s) = file.artifacts.retention_secs {
        if s == 0 {
            bail!("artifacts.retention_secs must be at least 1");
        }
        artifacts.retention = Duration::from_secs(s);
    }
    if let Some(n) = file.artifacts.max_files {
        artifacts.limits.max_files = n;
    }
    if let Some(b) = &file.artifacts.max_bytes {
        artifacts.limits.max_bytes = b.bytes("artifacts.max_bytes")?;
    }
    if !audit.enabled {
        tracing::warn!("the audit record is disabled by the config file ([audit] enabled = false)");
    }
    let disk_overcommit = a.disk_overcommit.or(file.disk_overcommit).unwrap_or(1.0);
    if !(disk_overcommit.is_finite() && disk_overcommit > 0.0 && disk_overcommit <= 1000.0) {
        bail!(
            "disk_overcommit: must be a number above 0 (1.0: no overcommit), got {disk_overcommit}"
        );
    }
    let max_sandboxes = file.max_sandboxes.unwrap_or(1000);
    if max_sandboxes == 0 {
        bail!("max_sandboxes must be at least 1");
    }
    let domain = a
        .domain
        .clone()
        .or(file.domain.clone())
        .unwrap_or(rampart_server::DEFAULT_DOMAIN.into());
    if !rampart_server::valid_domain(&domain) {
        bail!(
            "domain {domain:?}: expected a lowercase DNS name such as localhost or \
             sandboxes.example.com"
        );
    }
    let tls = resolve_tls(a, &file, &domain)?;
    let e2b_public_traffic = a
        .e2b_allow_public_traffic
        .or(file.e2b.allow_public_traffic)
        .unwrap_or(true);
    let mut allowed_hosts = file.allowed_hosts.clone();
    allowed_hosts.extend(a.allowed_hosts.iter().map(|h| h.trim().to_owned()));
    allowed_hosts.retain(|h| !h.is_empty());
    for h in &allowed_hosts {
        if h.contains(['/', ' ', '@']) {
            bail!("allowed_hosts: {h:?} is not a host name (e.g. rampart.example.com)");
        }
    }
    Ok(Resolved {
        listen,
        server: rampart_server::ServerOptions {
            domain,
            listen: Some(listen),
            allowed_hosts,
            tls,
            e2b_public_traffic,
            e2b_idle_pause_secs: match file.e2b.idle_pause_secs {
                Some(0) => bail!("[e2b] idle_pause_secs must be at least 1 (leave it out: never)"),
                s => s,
            },
            fleet_token: None,
        },
        core: CoreConfig {
            data_dir,
            jailer_bin,
            agent_bin,
            default_limits,
            max_limits,
            default_timeout_secs,
            max_timeout_secs,
            idle_cold_secs: match file.idle_cold_secs {
                Some(0) => None,
                Some(s) => Some(s),
                None => Some(3600),
            },
            max_sandboxes,
            uid_range_start,
            uid_slots,
            disk_overcommit,
            audit,
            artifacts,
            network: super::net::resolve_network(&file.network)?,
            approvals_webhook: match &file.approvals.webhook_url {
                Some(url) => {
                    let w = rampart_core::webhook::WebhookConfig {
                        url: url.clone(),
                        secret: file.approvals.webhook_secret.clone(),
                    };
                    w.check().map_err(|e| anyhow::anyhow!("[approvals] {e}"))?;
                    Some(w)
                }
                None if file.approvals.webhook_secret.is_some() => {
                    bail!("[approvals] webhook_secret is set without webhook_url")
                }
                None => None,
            },
            events: {
                let mut e = rampart_core::events::EventsConfig::default();
                if let Some(r) = file.events.retention_secs {
                    if r == 0 {
                        bail!("[events] retention_secs must be at least 1");
                    }
                    e.retention_secs = r;
                }
                e.webhook_allow_cidrs =
                    rampart_core::events::parse_cidrs(&file.events.webhook_allow_cidrs)
                        .map_err(|m| anyhow::anyhow!("[events] webhook_allow_cidrs: {m}"))?;
                e
            },
            registry: resolve_registry(&file.templates)?,
            builds: rampart_core::template_builds::BuildConfig::from_env(),
            warm: if a.warm.is_empty() {
                file.warm
                    .iter()
                    .map(|(k, n)| {
                        format!("{k}={n}")
                            .parse::<rampart_core::WarmPool>()
                            .map_err(|e| anyhow!("[warm] {e}"))
                    })
                    .collect::<Result<_>>()?
            } else {
                a.warm.clone()
            },
            default_isolation: match (a.default_isolation, &file.default_isolation) {
                (Some(t), _) => t,
                (None, Some(t)) => t.parse().map_err(|e| anyhow!("default_isolation: {e}"))?,
                (None, None) => Default::default(),
            },
            gvisor: rampart_core::isolation::GvisorConfig {
                runsc: file.gvisor.runsc.clone(),
                platform: match &file.gvisor.platform {
                    Some(p) if !matches!(p.as_str(), "ptrace" | "systrap" | "kvm") => {
                        bail!("[gvisor] platform: {p:?} is not ptrace, systrap or kvm")
                    }
                    p => p.clone(),
                },
            },
            node_name: crate::commands::fleet::node_name(&a.fleet)?,
        },
    })
}

pub(crate) fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

pub(crate) async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// Makes the directory of a socket given outside the data directory (e.g. `/run/rampart`)
/// when it is missing: mode 0750, group `group`, so that members of the group can reach the
/// socket and nobody else can. A directory that exists is left as its owner set it.
fn prepare_socket_dir(sock: &std::path::Path, group: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let Some(dir) = sock.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    if dir.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::os::unix::fs::chown(dir, None, Some(group))
        .or_else(|e| {
            // A daemon that is not root keeps its own group.
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                Ok(())
            } else {
                Err(e)
            }
        })
        .with_context(|| format!("giving {} to group {group}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))
        .with_context(|| format!("chmod 0750 {}", dir.display()))?;
    Ok(())
}

/// `rampart serve`; `socket`: where to put the Unix socket (`--socket`, `RAMPART_SOCKET`;
/// default `<data>/rampart.sock`).
pub async fn run(a: ServeArgs, socket: Option<PathBuf>) -> Result<u8> {
    // Before anything is created: private from the first byte (not a chmod afterwards).
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(DAEMON_UMASK));
    init_logging(a.log_format);
    let r = resolve(&a)?;
    secure_data_dir(&r.core.data_dir)?;
    let listener = tokio::net::TcpListener::bind(r.listen)
        .await
        .with_context(|| format!("cannot listen on {}", r.listen))?;
    let data_dir = r.core.data_dir.clone();
    let core = r.core.clone();
    let manager = Manager::start(r.core)
        .await
        .map_err(|e| anyhow!("cannot start the daemon: {e}"))?;
    let mut server_opts = r.server.clone();
    let membership = match crate::commands::fleet::join(&a.fleet, &manager, &core, r.listen).await {
        Ok(m) => m,
        Err(e) => {
            manager.shutdown().await;
            return Err(e);
        }
    };
    if let Some(m) = &membership {
        server_opts.fleet_token = Some(m.token.clone());
        if let Some(h) = a
            .fleet
            .advertise
            .as_deref()
            .and_then(crate::commands::fleet::url_host)
        {
            server_opts.allowed_hosts.push(h);
        }
    }
    // The Unix socket, for the node's administrator (root, the daemon's user, the `rampart`
    // group). Without it (e.g. a data directory whose path is too long for a socket) the
    // daemon still serves TCP, where API keys are needed.
    let group = rampart_server::socket_group();
    let sock_path = match socket {
        Some(p) => {
            prepare_socket_dir(&p, group)?;
            p
        }
        None => data_dir.join(rampart_server::SOCKET_FILE),
    };
    let unix = match rampart_server::bind_socket(&sock_path, group) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(
                "no Unix socket: cannot listen on {}: {e}; only TCP (with API keys) is served",
                sock_path.display()
            );
            None
        }
    };
    let scheme = if r.server.tls.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!(
        listen = %r.listen,
        socket = %sock_path.display(),
        data_dir = %data_dir.display(),
        version = rampart_server::VERSION,
        "rampart listening on {scheme}://{} and on {} (group {group}, mode 0660)",
        r.listen,
        sock_path.display()
    );
    if !r.server.e2b_public_traffic {
        tracing::info!(
            "E2B sandboxes' ports need the traffic token unless a create allows public traffic \
             (--e2b-allow-public-traffic false)"
        );
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let had_socket = unix.is_some();
    let mut server = tokio::spawn(rampart_server::serve_all(
        listener,
        unix,
        manager.clone(),
        server_opts,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let outcome = tokio::select! {
        sig = shutdown_signal() => {
            tracing::info!("{sig}: shutting down; sandboxes keep running and are re-attached at the next start");
            let _ = stop_tx.send(());
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
                Ok(Ok(r)) => r.context("the HTTP server failed"),
                Ok(Err(e)) => Err(anyhow!("the HTTP server task failed: {e}")),
                Err(_) => {
                    tracing::info!("connections still open after {SHUTDOWN_GRACE:?}; leaving them");
                    server.abort();
                    Ok(())
                }
            }
        }
        r = &mut server => match r {
            Ok(r) => r.context("the HTTP server failed"),
            Err(e) => Err(anyhow!("the HTTP server task failed: {e}")),
        },
    };
    if let Some(m) = membership {
        m.leave().await;
    }
    manager.shutdown().await;
    if had_socket {
        let _ = std::fs::remove_file(&sock_path);
    }
    outcome.map(|()| 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_files_parse_and_refuse_unknown_keys() {
        let c: FileConfig = toml::from_str(
            r#"
            max_sandboxes = 10
            [default_limits]
            memory = "256M"
            cpus = 0.5
            [max_limits]
            memory = 1073741824
            "#,
        )
        .unwrap();
        let d = c
            .default_limits
            .apply("default_limits", Limits::default())
            .unwrap();
        assert_eq!(d.memory_bytes, 256 << 20);
        assert_eq!(d.cpus, 0.5);
        let m = c
            .max_limits
            .apply("max_limits", builtin_max_limits())
            .unwrap();
        assert_eq!(m.memory_bytes, 1 << 30);
        let a: FileConfig =
            toml::from_str("[audit]\nnetwork_events_burst = 20\nnetwork_events_per_sec = 50")
                .unwrap();
        assert_eq!(a.audit.network_events_burst, Some(20));
        assert_eq!(a.audit.network_events_per_sec, Some(50.0));
        let t: FileConfig = toml::from_str(
            "tls_cert = \"/etc/rampart/cert.pem\"\ntls_key = \"/etc/rampart/key.pem\"\n\
             [e2b]\nallow_public_traffic = false",
        )
        .unwrap();
        assert_eq!(
            t.tls_cert.as_deref(),
            Some(Path::new("/etc/rampart/cert.pem"))
        );
        assert_eq!(t.e2b.allow_public_traffic, Some(false));
        assert!(toml::from_str::<FileConfig>("[e2b]\npublic = true").is_err());
        assert!(toml::from_str::<FileConfig>("max_sandbox = 3").is_err());
        assert!(toml::from_str::<FileConfig>("[default_limits]\nmem = 1").is_err());
    }

    #[test]
    fn builtin_maxima_cover_the_defaults() {
        let m = builtin_max_limits();
        let d = Limits::default();
        assert!(m.cpus >= 1.0 && m.pids >= d.pids && m.disk_bytes >= d.disk_bytes);
    }
}
