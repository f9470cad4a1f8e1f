//! `create`, `ls`, `rm`, `info`, `timeout`.

use super::parse_pairs;
use crate::client::Client;
use anyhow::{anyhow, Result};
use clap::Args;
use rampart_types::limits::parse_size;
use rampart_types::{CreateSandbox, LimitsRequest, OnTimeout, SandboxInfo, SetTimeout};
use reqwest::Method;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Flags that describe a new sandbox (`create` and `run`).
#[derive(Debug, Clone, Args)]
pub struct CreateFlags {
    /// Template to start from.
    #[arg(long, short = 't')]
    pub template: Option<String>,
    /// Isolation tier: `namespace` or `gvisor` (a kernel in user space between the
    /// sandbox and the host's); the template's or the daemon's default when absent.
    #[arg(long, value_name = "TIER")]
    pub isolation: Option<rampart_types::Tier>,
    /// Seconds until the sandbox is destroyed (the daemon's default: 300).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Pause the sandbox at its deadline instead of destroying it.
    #[arg(long)]
    pub pause_on_timeout: bool,
    /// Put the sandbox to sleep (paused; on the gvisor tier to disk with its memory) after
    /// this many seconds without a request; the next request wakes it.
    #[arg(long, value_name = "SECS")]
    pub idle_pause: Option<u64>,
    /// Memory limit, e.g. 512M, 2G.
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// CPU share in vCPUs, e.g. 0.5, 1, 2.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Most processes and threads.
    #[arg(long)]
    pub pids: Option<u64>,
    /// Size of the writable disk, e.g. 2G.
    #[arg(long, value_name = "SIZE")]
    pub disk: Option<String>,
    /// Open-file limit per process.
    #[arg(long, value_name = "N")]
    pub open_files: Option<u64>,
    /// Environment variable for every process (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Label (repeatable), usable as a filter of `ls`.
    #[arg(long = "metadata", short = 'm', value_name = "K=V")]
    pub metadata: Vec<String>,
    /// Start from this snapshot (its files over its template).
    #[arg(long, value_name = "NAME")]
    pub snapshot: Option<String>,
    /// Mount a volume (repeatable): NAME:/path, or NAME:/path:ro for read-only.
    #[arg(long = "volume", value_name = "NAME:/PATH[:ro]")]
    pub volumes: Vec<String>,
    /// Network: --net-mode, --allow, --deny.
    #[command(flatten)]
    pub net: super::net::NetFlags,
    /// Bind a stored secret (`rampart secret set`) by name (repeatable); needs a network.
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Keep this path (file or directory) when the sandbox ends (repeatable); `rampart
    /// artifacts ID` lists what was kept.
    #[arg(long = "artifact", value_name = "/PATH")]
    pub artifacts: Vec<String>,
}

fn size(flag: &str, v: &Option<String>) -> Result<Option<u64>> {
    v.as_deref()
        .map(|s| {
            parse_size(s).ok_or_else(|| {
                anyhow!("{flag}: cannot read {s:?} as a size (examples: 512M, 2G, 1048576)")
            })
        })
        .transpose()
}

impl CreateFlags {
    /// The request body.
    pub fn request(&self) -> Result<CreateSandbox> {
        Ok(CreateSandbox {
            template: self.template.clone(),
            isolation: self.isolation,
            limits: LimitsRequest {
                cpus: self.cpus,
                memory_bytes: size("--memory", &self.memory)?,
                pids: self.pids,
                disk_bytes: size("--disk", &self.disk)?,
                open_files: self.open_files,
            },
            env: parse_pairs("--env", &self.env)?,
            metadata: parse_pairs("--metadata", &self.metadata)?,
            timeout_secs: self.timeout,
            on_timeout: self.pause_on_timeout.then_some(OnTimeout::Pause),
            idle_pause_secs: self.idle_pause,
            snapshot: self.snapshot.clone(),
            volumes: self
                .volumes
                .iter()
                .map(|v| super::persist::parse_volume(v))
                .collect::<Result<_>>()?,
            network: self.net.policy()?,
            secrets: super::secret::references(&self.secrets),
            artifacts: self.artifacts.clone(),
            ..CreateSandbox::default()
        })
    }
}

/// `rampart create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    flags: CreateFlags,
    /// Print the sandbox object as JSON instead of its id.
    #[arg(long)]
    json: bool,
}

/// Creates a sandbox through the API.
pub async fn create_sandbox(client: &Client, req: &CreateSandbox) -> Result<SandboxInfo> {
    client
        .json(client.request(Method::POST, "/v1/sandboxes").json(req))
        .await
}

/// Destroys a sandbox through the API.
pub async fn destroy_sandbox(client: &Client, id: &str) -> Result<SandboxInfo> {
    client
        .json(client.request(Method::DELETE, &format!("/v1/sandboxes/{id}")))
        .await
}

/// `rampart create`.
pub async fn create(host: &crate::client::Endpoint, a: CreateArgs) -> Result<u8> {
    let client = Client::new(host)?;
    let info = create_sandbox(&client, &a.flags.request()?).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        println!("{}", info.id);
    }
    Ok(0)
}

/// `rampart ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only sandboxes in this state (creating, running, paused, stopping, destroyed, failed).
    #[arg(long)]
    state: Option<String>,
    /// Only sandboxes with this label (repeatable).
    #[arg(long = "metadata", short = 'm', value_name = "K=V")]
    metadata: Vec<String>,
    /// Print a JSON array.
    #[arg(long)]
    json: bool,
}

/// `rampart ls`.
pub async fn ls(host: &crate::client::Endpoint, a: LsArgs) -> Result<u8> {
    let client = Client::new(host)?;
    let mut query: Vec<(String, String)> = Vec::new();
    if let Some(s) = &a.state {
        query.push(("state".into(), s.clone()));
    }
    for (k, v) in parse_pairs("--metadata", &a.metadata)? {
        query.push(("metadata".into(), format!("{k}={v}")));
    }
    let list: Vec<SandboxInfo> = client
        .json(client.request(Method::GET, "/v1/sandboxes").query(&query))
        .await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    let now = OffsetDateTime::now_utc();
    let rows: Vec<[String; 8]> = list
        .iter()
        .map(|s| {
            [
                s.id.to_string(),
                s.template.clone(),
                s.isolation.to_string(),
                s.state.as_str().to_owned(),
                relative(&s.created_at, now),
                if s.state.is_alive() {
                    relative(&s.expires_at, now)
                } else {
                    "-".into()
                },
                human_size(s.limits.memory_bytes),
                format!("{}", s.limits.cpus),
            ]
        })
        .collect();
    print_table(
        &[
            "ID",
            "TEMPLATE",
            "ISOLATION",
            "STATE",
            "CREATED",
            "EXPIRES",
            "MEMORY",
            "CPUS",
        ],
        &rows,
    );
    Ok(0)
}

fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}   "));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// `1.5G`, `512M`, `1000B`.
pub fn human_size(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    for (u, m) in UNITS {
        if b >= m {
            let v = b as f64 / m as f64;
            return if (b / m) * m == b {
                format!("{}{u}", b / m)
            } else {
                format!("{v:.1}{u}")
            };
        }
    }
    format!("{b}B")
}

/// `5s ago`, `in 4m`, or the raw text when it does not parse.
fn relative(ts: &str, now: OffsetDateTime) -> String {
    let Ok(t) = OffsetDateTime::parse(ts, &Rfc3339) else {
        return ts.to_owned();
    };
    let secs = (t - now).whole_seconds();
    let a = secs.unsigned_abs();
    if a == 0 {
        return "now".into();
    }
    let d = if a < 60 {
        format!("{a}s")
    } else if a < 600 {
        format!("{}m{}s", a / 60, a % 60)
    } else if a < 3600 {
        format!("{}m", a / 60)
    } else if a < 86400 {
        format!("{}h{}m", a / 3600, a % 3600 / 60)
    } else {
        format!("{}d", a / 86400)
    };
    if secs < 0 {
        format!("{d} ago")
    } else {
        format!("in {d}")
    }
}

/// `rampart rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// Sandbox ids.
    #[arg(required = true)]
    ids: Vec<String>,
}

/// `rampart rm`: destroys each; exits 1 if any failed.
pub async fn rm(host: &crate::client::Endpoint, a: RmArgs) -> Result<u8> {
    let client = Client::new(host)?;
    let mut code = 0;
    for id in &a.ids {
        match destroy_sandbox(&client, id).await {
            Ok(_) => println!("{id}"),
            Err(e) => {
                eprintln!("rampart: {id}: {e:#}");
                code = 1;
            }
        }
    }
    Ok(code)
}

/// `rampart info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Sandbox id.
    id: String,
    /// Print the sandbox object as JSON.
    #[arg(long)]
    json: bool,
}

/// `rampart info`.
pub async fn info(host: &crate::client::Endpoint, a: InfoArgs) -> Result<u8> {
    let client = Client::new(host)?;
    let s: SandboxInfo = client
        .json(client.request(Method::GET, &format!("/v1/sandboxes/{}", a.id)))
        .await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(0);
    }
    let now = OffsetDateTime::now_utc();
    println!("id:          {}", s.id);
    println!("template:    {}", s.template);
    println!("isolation:   {}", s.isolation);
    println!("state:       {}", s.state.as_str());
    println!(
        "created:     {} ({})",
        s.created_at,
        relative(&s.created_at, now)
    );
    println!(
        "expires:     {} ({})",
        s.expires_at,
        relative(&s.expires_at, now)
    );
    if let Some(secs) = s.idle_pause_secs {
        println!("idle pause:  after {secs} s without a request (the next one wakes it)");
    }
    if let Some(e) = &s.ended_at {
        println!("ended:       {e}");
    }
    if let Some(r) = &s.reason {
        println!("reason:      {r}");
    }
    let l = &s.limits;
    println!(
        "limits:      {} cpus, {} memory, {} pids, {} disk, {} open files",
        l.cpus,
        human_size(l.memory_bytes),
        l.pids,
        human_size(l.disk_bytes),
        l.open_files
    );
    if !s.env_names.is_empty() {
        println!("env:         {}", s.env_names.join(", "));
    }
    for (k, v) in &s.metadata {
        println!("metadata:    {k}={v}");
    }
    Ok(0)
}

/// `rampart timeout`.
#[derive(Debug, Args)]
pub struct TimeoutArgs {
    /// Sandbox id.
    id: String,
    /// Seconds from now.
    secs: u64,
}

/// `rampart timeout`.
pub async fn timeout(host: &crate::client::Endpoint, a: TimeoutArgs) -> Result<u8> {
    let client = Client::new(host)?;
    let s: SandboxInfo = client
        .json(
            client
                .request(Method::POST, &format!("/v1/sandboxes/{}/timeout", a.id))
                .json(&SetTimeout {
                    timeout_secs: a.secs,
                }),
        )
        .await?;
    println!("{} expires at {}", s.id, s.expires_at);
    Ok(0)
}

/// `rampart pause`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    /// Sandbox ids.
    #[arg(required = true)]
    pub ids: Vec<String>,
    /// Pause to the filesystem: every process ends, the disk is kept, and the resume boots
    /// the sandbox again from it (no memory is kept).
    #[arg(long, conflicts_with = "disk")]
    pub filesystem: bool,
    /// Pause to disk with the memory: every process is saved beside the disk and ends,
    /// nothing stays in RAM, and the resume restores them where they were (the gvisor tier).
    #[arg(long, alias = "memory")]
    pub disk: bool,
}

/// How `rampart pause` pauses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseKind {
    /// Frozen, memory kept in RAM.
    Freeze,
    /// To the filesystem (processes end).
    Filesystem,
    /// To disk with the memory (a checkpoint).
    Disk,
}

impl PauseArgs {
    /// The kind of pause asked for.
    pub fn kind(&self) -> PauseKind {
        match (self.filesystem, self.disk) {
            (true, _) => PauseKind::Filesystem,
            (false, true) => PauseKind::Disk,
            (false, false) => PauseKind::Freeze,
        }
    }
}

/// `rampart resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// Sandbox ids.
    #[arg(required = true)]
    pub ids: Vec<String>,
    /// Boot the sandbox again from its disk instead of thawing its processes (a sandbox
    /// paused with `--filesystem` always boots so).
    #[arg(long)]
    pub reboot: bool,
}

/// Pauses (`resume` false, as `kind` says) or resumes a sandbox through the API; a resume
/// of kind [`PauseKind::Filesystem`] boots it from its disk.
async fn pause_sandbox(
    client: &Client,
    id: &str,
    resume: bool,
    kind: PauseKind,
) -> Result<SandboxInfo> {
    let (verb, body) = match (resume, kind) {
        (false, PauseKind::Freeze) => ("pause", None),
        (false, PauseKind::Filesystem) => ("pause", Some(serde_json::json!({"memory": false}))),
        (false, PauseKind::Disk) => ("pause", Some(serde_json::json!({"disk": true}))),
        (true, PauseKind::Filesystem) => ("resume", Some(serde_json::json!({"reboot": true}))),
        (true, _) => ("resume", None),
    };
    let mut req = client.request(Method::POST, &format!("/v1/sandboxes/{id}/{verb}"));
    if let Some(b) = body {
        req = req.json(&b);
    }
    client.json(req).await
}

/// `rampart pause` / `rampart resume`: each id in turn; exits 1 if any failed.
pub async fn pause(
    host: &crate::client::Endpoint,
    ids: &[String],
    resume: bool,
    kind: PauseKind,
) -> Result<u8> {
    let client = Client::new(host)?;
    let mut code = 0;
    for id in ids {
        match pause_sandbox(&client, id, resume, kind).await {
            Ok(s) => println!("{} {}", s.id, s.state.as_str()),
            Err(e) => {
                eprintln!("rampart: {id}: {e:#}");
                code = 1;
            }
        }
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_relative() {
        let now = OffsetDateTime::parse("2026-01-01T00:10:00Z", &Rfc3339).unwrap();
        assert_eq!(relative("2026-01-01T00:10:00.300Z", now), "now");
        assert_eq!(relative("2026-01-01T00:09:30Z", now), "30s ago");
        assert_eq!(relative("2026-01-01T00:14:59Z", now), "in 4m59s");
        assert_eq!(relative("2026-01-01T02:10:00Z", now), "in 2h0m");
        assert_eq!(relative("garbage", now), "garbage");
    }

    #[test]
    fn sizes_print() {
        assert_eq!(human_size(512 << 20), "512M");
        assert_eq!(human_size(3 << 29), "1.5G");
        assert_eq!(human_size(100), "100B");
    }

    #[test]
    fn create_flags_build_the_request() {
        let f = CreateFlags {
            template: None,
            isolation: None,
            timeout: Some(60),
            pause_on_timeout: false,
            idle_pause: None,
            memory: Some("256M".into()),
            cpus: Some(0.5),
            pids: None,
            disk: Some("1G".into()),
            open_files: None,
            env: vec!["A=1".into()],
            metadata: vec!["team=x".into()],
            snapshot: None,
            volumes: vec!["data:/data:ro".into()],
            net: Default::default(),
            secrets: vec!["tok".into()],
            artifacts: vec!["/home/user/out".into()],
        };
        let r = f.request().unwrap();
        assert_eq!(r.artifacts, ["/home/user/out"]);
        assert!(r.volumes[0].read_only);
        assert_eq!(r.limits.memory_bytes, Some(256 << 20));
        assert_eq!(r.limits.disk_bytes, Some(1 << 30));
        assert_eq!(r.env["A"], "1");
        assert_eq!(r.metadata["team"], "x");
        assert_eq!(r.secrets[0].name, "tok");
        assert!(r.secrets[0].value.is_empty());
        let bad = CreateFlags {
            memory: Some("lots".into()),
            ..f
        };
        assert!(bad.request().unwrap_err().to_string().contains("--memory"));
    }
}
