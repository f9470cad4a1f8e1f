//! The fleet from the command line: `rampart serve --fleet` (a node joins), `rampart
//! gateway` (the front door), `rampart fleet up|down` (a whole fleet on this machine).

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use rampart_core::{Manager, Principal};
use rampart_fleet::{Capacity, NodeFacts, NodeRecord, TenantDef};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// `rampart serve`'s fleet flags.
#[derive(Debug, Clone, Args)]
pub struct JoinArgs {
    /// Join a fleet: etcd's client URLs, comma-separated (`http://10.0.0.1:2379,...`). Over
    /// TCP the node then answers only the fleet's gateways.
    #[arg(
        long,
        value_name = "ENDPOINTS",
        env = "RAMPART_FLEET",
        value_delimiter = ','
    )]
    pub fleet: Vec<String>,
    /// The node's name in the fleet (default: the host name).
    #[arg(long, value_name = "NAME", env = "RAMPART_NODE_NAME")]
    pub node_name: Option<String>,
    /// The URL gateways reach this node at (default: `http://<listen address>`).
    #[arg(long, value_name = "URL", env = "RAMPART_ADVERTISE")]
    pub advertise: Option<String>,
    /// The prefix of the fleet's keys in etcd.
    #[arg(long, value_name = "PREFIX", env = "RAMPART_FLEET_PREFIX", default_value = rampart_fleet::DEFAULT_PREFIX)]
    pub fleet_prefix: String,
    /// Seconds the node's record outlives its last renewal (it renews every third of it).
    #[arg(
        long,
        value_name = "SECS",
        env = "RAMPART_FLEET_TTL",
        default_value_t = 10
    )]
    pub fleet_ttl: u64,
}

/// What a daemon tells the fleet about itself.
struct DaemonFacts {
    manager: Arc<Manager>,
    data_dir: PathBuf,
    /// The node's tenants, for the fleet's to be mirrored into (opened once).
    tenants: rampart_store::tenants::TenantStore,
    max_sandboxes: u64,
    tiers: Vec<String>,
}

fn meminfo(field: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

impl NodeFacts for DaemonFacts {
    fn audit_key(&self) -> String {
        self.manager.audit_key().0
    }

    fn record(&self, sandboxes: u64) -> NodeRecord {
        let node = Principal::node("fleet");
        let disk_free_bytes = nix::sys::statvfs::statvfs(&self.data_dir)
            .map(|s| s.blocks_available() * s.fragment_size())
            .unwrap_or(0);
        NodeRecord {
            name: String::new(),
            url: String::new(),
            tiers: self.tiers.clone(),
            capacity: Capacity {
                memory_available_bytes: meminfo("MemAvailable:"),
                memory_total_bytes: meminfo("MemTotal:"),
                cpus: std::thread::available_parallelism()
                    .map(|n| n.get() as u32)
                    .unwrap_or(1),
                disk_free_bytes,
                sandboxes,
                max_sandboxes: self.max_sandboxes,
            },
            templates: self
                .manager
                .templates(&node)
                .into_iter()
                .map(|t| t.name)
                .collect(),
            audit_key: Some(self.audit_key()),
            schedulable: true,
            version: rampart_server::VERSION.to_owned(),
            started_ms: 0,
            updated_ms: 0,
        }
    }

    fn sandboxes(&self) -> Vec<(String, Option<String>)> {
        self.manager
            .list(&Principal::node("fleet"), None, &BTreeMap::new())
            .map(|l| {
                l.into_iter()
                    .map(|s| (s.id.to_string(), s.tenant))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn mirror_tenants(&self, tenants: &[TenantDef]) {
        for t in tenants {
            if let Err(e) = self.tenants.ensure(&t.name, &t.quotas) {
                tracing::warn!("fleet: mirroring tenant {}: {e}", t.name);
            }
        }
    }
}

/// The node's name in the fleet `j` names (None: no fleet): `--node-name`, else the host
/// name.
pub fn node_name(j: &JoinArgs) -> Result<Option<String>> {
    if j.fleet.is_empty() {
        if j.node_name.is_some() || j.advertise.is_some() {
            bail!("--node-name and --advertise name this node in a fleet: give --fleet too");
        }
        return Ok(None);
    }
    let name = match &j.node_name {
        Some(n) => n.clone(),
        None => nix::unistd::gethostname()
            .context("--node-name: none given and the host name is unreadable")?
            .to_string_lossy()
            .into_owned(),
    };
    if name.is_empty()
        || name.len() > 253
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        bail!("--node-name {name:?}: use up to 253 letters, digits, '-', '_' and '.'");
    }
    Ok(Some(name))
}

/// Joins the fleet `j` names, if any: the membership (its token is what the node's TCP API
/// answers to).
pub async fn join(
    j: &JoinArgs,
    manager: &Arc<Manager>,
    core: &rampart_core::CoreConfig,
    listen: std::net::SocketAddr,
) -> Result<Option<rampart_fleet::Membership>> {
    // Named (and checked) with the rest of the configuration: `node_name`.
    let Some(name) = core.node_name.clone() else {
        return Ok(None);
    };
    let url = match &j.advertise {
        Some(u) => u.trim_end_matches('/').to_owned(),
        None if listen.ip().is_unspecified() => bail!(
            "--advertise: the daemon listens on every address ({listen}); say which URL the \
             fleet's gateways reach it at"
        ),
        None => format!("http://{listen}"),
    };
    let mut tiers = vec!["namespace".to_owned()];
    if rampart_core::isolation::find_runsc(&core.gvisor).is_ok() {
        tiers.push("gvisor".into());
    }
    let tenants = rampart_store::tenants::TenantStore::open(&core.data_dir.join("state.db"))
        .context("fleet: cannot open the node's tenant store")?;
    let facts = Arc::new(DaemonFacts {
        manager: manager.clone(),
        data_dir: core.data_dir.clone(),
        tenants,
        max_sandboxes: core.max_sandboxes as u64,
        tiers,
    });
    let cfg = rampart_fleet::NodeConfig {
        endpoints: j.fleet.clone(),
        prefix: j.fleet_prefix.clone(),
        name,
        url,
        ttl: Duration::from_secs(j.fleet_ttl.max(2)),
    };
    let m = rampart_fleet::Membership::join(cfg, facts)
        .await
        .with_context(|| format!("cannot join the fleet at {}", j.fleet.join(",")))?;
    Ok(Some(m))
}

/// The host of a URL (`http://10.0.0.2:3000` -> `10.0.0.2:3000`), for the daemon's Host check.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let host = rest.split('/').next()?;
    (!host.is_empty()).then(|| host.to_owned())
}

/// `rampart gateway`.
#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: String,
    /// etcd's client URLs, comma-separated.
    #[arg(
        long,
        value_name = "ENDPOINTS",
        env = "RAMPART_FLEET",
        value_delimiter = ',',
        required = true
    )]
    fleet: Vec<String>,
    /// The gateway's directory: its admin key (`admin-key`) when none is given.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// A file holding the fleet's admin key (`rampart_` and 40 hex digits): made an admin key
    /// of the fleet if it is not one yet. Default: `<data-dir>/admin-key`, made at first start.
    #[arg(long, value_name = "FILE", env = "RAMPART_ADMIN_KEY_FILE")]
    admin_key_file: Option<PathBuf>,
    /// The gateway's name (default: `gateway-<host name>-<port>`).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// The prefix of the fleet's keys in etcd.
    #[arg(long, value_name = "PREFIX", env = "RAMPART_FLEET_PREFIX", default_value = rampart_fleet::DEFAULT_PREFIX)]
    fleet_prefix: String,
    /// How many nodes a create compares (best of K by free capacity).
    #[arg(long, value_name = "K", default_value_t = 3)]
    choices: usize,
    /// The domain of host-name routing to sandboxes (`{port}-{id}.<DOMAIN>`): the nodes'
    /// `--domain`.
    #[arg(long, value_name = "DOMAIN", default_value = rampart_server::DEFAULT_DOMAIN)]
    domain: String,
}

/// Reads the admin key at `file`, or makes one there (0600) if it does not exist.
fn admin_key_at(file: &Path) -> Result<String> {
    match std::fs::read_to_string(file) {
        Ok(k) => Ok(k.trim().to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let key = rampart_store::node_keys::generate();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(file)
                .with_context(|| format!("cannot make {}", file.display()))?;
            writeln!(f, "{key}")?;
            Ok(key)
        }
        Err(e) => Err(anyhow!("cannot read {}: {e}", file.display())),
    }
}

/// `rampart gateway`: serves until SIGTERM or SIGINT.
pub async fn gateway(a: GatewayArgs) -> Result<u8> {
    crate::commands::serve::init_logging(crate::commands::serve::LogFormat::Text);
    let listen: std::net::SocketAddr = a.listen.parse().map_err(|_| {
        anyhow!(
            "--listen: {:?} is not an address like 127.0.0.1:8080",
            a.listen
        )
    })?;
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("cannot make {}", a.data_dir.display()))?;
    let key_file = a
        .admin_key_file
        .clone()
        .unwrap_or_else(|| a.data_dir.join("admin-key"));
    let admin_key = admin_key_at(&key_file)?;
    let name = a.name.clone().unwrap_or_else(|| {
        let host = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "host".into());
        format!("gateway-{host}-{}", listen.port())
    });
    let g = rampart_fleet::Gateway::start(rampart_fleet::GatewayConfig {
        endpoints: a.fleet.clone(),
        prefix: a.fleet_prefix.clone(),
        name: name.clone(),
        admin_key: Some(admin_key),
        choices: a.choices,
        domain: a.domain.to_ascii_lowercase(),
    })
    .await
    .with_context(|| {
        format!(
            "cannot start the gateway on the fleet at {}",
            a.fleet.join(",")
        )
    })?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    tracing::info!(%listen, gateway = %name, "the fleet's gateway listening on http://{listen} (admin key in {})", key_file.display());
    g.serve(listener, async {
        let sig = crate::commands::serve::shutdown_signal().await;
        tracing::info!("{sig}: the gateway stops");
    })
    .await
    .context("the gateway's server failed")?;
    Ok(0)
}

/// `rampart fleet`.
#[derive(Debug, Args)]
pub struct FleetArgs {
    #[command(subcommand)]
    cmd: FleetCmd,
}

#[derive(Debug, Subcommand)]
enum FleetCmd {
    /// Start a fleet on this machine: etcd members, nodes and a gateway, all on loopback.
    Up(UpArgs),
    /// Stop the fleet `up` started in DIR: every process it started, nothing else.
    Down(DownArgs),
}

#[derive(Debug, Args)]
struct UpArgs {
    /// How many nodes.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// How many etcd members.
    #[arg(long, default_value_t = 3)]
    etcd: usize,
    /// The fleet's directory (data, logs, fleet.json).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Seconds a node's record outlives its last renewal.
    #[arg(long, default_value_t = 10)]
    ttl: u64,
    /// Every node on this host's loopback instead of in a network namespace of its own.
    #[arg(long)]
    loopback: bool,
}

#[derive(Debug, Args)]
struct DownArgs {
    /// The directory `fleet up` wrote.
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
}

/// `rampart fleet up|down`.
pub fn fleet(a: FleetArgs) -> Result<u8> {
    match a.cmd {
        FleetCmd::Up(u) => up(u),
        FleetCmd::Down(d) => down(&d.dir),
    }
}

/// A free loopback port (bound and let go: another process may take it first; `up` fails
/// with the reason then).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Proc {
    name: String,
    pid: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    endpoint: Option<String>,
}

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct FleetFile {
    gateway: String,
    admin_key: String,
    gateways: Vec<Proc>,
    nodes: Vec<Proc>,
    etcd: Vec<Proc>,
    /// The network `up` made (none with --loopback): removed by `down`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    network: Option<FleetNet>,
}

/// The hosts' network of a fleet on one machine: a bridge on this host (etcd and the
/// gateway's side) and one network namespace per node, wired to it by a veth pair.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
struct FleetNet {
    /// The bridge.
    bridge: String,
    /// Its address (etcd listens there): `a.b.c.1`.
    host: String,
    /// The /24 of the fleet.
    subnet: String,
    /// The nodes' network namespaces (`/run/netns/<name>`).
    netns: Vec<String>,
}

/// Runs `ip ARGS`; Err with its words when it fails.
fn ip(args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .context("cannot run ip (apt-get install iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A /24 in 172.31.0.0/16 no interface of this host is in.
fn free_subnet() -> Result<u8> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr"])
        .output()
        .context("cannot run ip (apt-get install iproute2)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let routes = std::process::Command::new("ip")
        .args(["-4", "route"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let start = (std::process::id() % 150) as u8 + 100;
    (0..150u8)
        .map(|k| 100 + (start - 100 + k) % 150)
        .find(|k| {
            let net = format!("172.31.{k}.");
            !text.contains(&net) && !routes.contains(&net)
        })
        .ok_or_else(|| anyhow!("no free /24 in 172.31.100-249.0 on this host"))
}

impl FleetNet {
    /// Makes the bridge (`a.b.c.1/24`) and `n` namespaces, node `i` at `a.b.c.(10+i)`.
    fn make(
        n: usize,
        file: &mut FleetFile,
        save: &dyn Fn(&FleetFile) -> Result<()>,
    ) -> Result<FleetNet> {
        // Choosing a free /24 and taking it is one step for every `fleet up` on this host
        // (held until the bridge has its address).
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open("/run/rampart-fleet-net.lock")
            .context("cannot open /run/rampart-fleet-net.lock")?;
        let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| anyhow!("locking /run/rampart-fleet-net.lock: {e}"))?;
        let k = free_subnet()?;
        let tag = format!("{:04x}", std::process::id() & 0xffff);
        let mut net = FleetNet {
            bridge: format!("rfb{tag}"),
            host: format!("172.31.{k}.1"),
            subnet: format!("172.31.{k}.0/24"),
            netns: Vec::new(),
        };
        ip(&["link", "add", &net.bridge, "type", "bridge"])?;
        file.network = Some(net.clone());
        save(file)?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", net.host),
            "dev",
            &net.bridge,
        ])?;
        ip(&["link", "set", &net.bridge, "up"])?;
        for i in 0..n {
            let ns = format!("rampart-fleet-{tag}-{i}");
            ip(&["netns", "add", &ns])?;
            net.netns.push(ns.clone());
            file.network = Some(net.clone());
            save(file)?;
            let (outer, inner) = (format!("rfv{tag}{i}"), format!("rfi{tag}{i}"));
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &outer, "master", &net.bridge, "up"])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["-n", &ns, "link", "set", &inner, "name", "eth0"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", net.node_ip(i)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// Node `i`'s address.
    fn node_ip(&self, i: usize) -> String {
        let base = self
            .host
            .rsplit_once('.')
            .map(|(b, _)| b)
            .unwrap_or("172.31.0");
        format!("{base}.{}", 10 + i)
    }

    /// Removes what `make` made (the veth pairs go with their namespaces).
    fn remove(&self) {
        for ns in &self.netns {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("rampart fleet down: {e}");
            }
        }
        if let Err(e) = ip(&["link", "del", &self.bridge]) {
            eprintln!("rampart fleet down: {e}");
        }
    }
}

fn spawn_logged(cmd: &mut std::process::Command, log: &Path) -> Result<i32> {
    use std::os::unix::process::CommandExt as _;
    let out =
        std::fs::File::create(log).with_context(|| format!("cannot make {}", log.display()))?;
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    Ok(child.id() as i32)
}

fn wait_health(url: &str, what: &str, pid: i32, log: &Path) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    loop {
        if client
            .get(format!("{url}/health"))
            .send()
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        if !Path::new(&format!("/proc/{pid}")).exists() || std::time::Instant::now() > deadline {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(15).collect();
            bail!(
                "{what} did not come up at {url}; its log ({}) ends:\n{}",
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn up(u: UpArgs) -> Result<u8> {
    if u.nodes == 0 || u.etcd == 0 {
        bail!("--nodes and --etcd need at least 1");
    }
    std::fs::create_dir_all(&u.dir).with_context(|| format!("cannot make {}", u.dir.display()))?;
    let dir = std::fs::canonicalize(&u.dir)?;
    if dir.join("fleet.json").exists() {
        bail!(
            "{} already holds a fleet (fleet.json); `rampart fleet down --dir {}` first",
            dir.display(),
            dir.display()
        );
    }
    let etcd = which("etcd").ok_or_else(|| {
        anyhow!("no etcd on the PATH: apt-get install etcd-server (scripts/setup-host.sh does)")
    })?;
    let me = std::env::current_exe()?;
    let mut file = FleetFile::default();
    // Written after each start: `down` stops whatever got started even if `up` fails.
    let save = |f: &FleetFile| -> Result<()> {
        std::fs::write(dir.join("fleet.json"), serde_json::to_vec_pretty(f)?)?;
        Ok(())
    };
    let result = (|| -> Result<()> {
        // As separate hosts would be: each node in a network namespace of its own with its
        // own address, etcd and the gateway on this host's side of a bridge.
        let net = if u.loopback {
            None
        } else {
            Some(FleetNet::make(u.nodes, &mut file, &save)?)
        };
        let etcd_ip = net
            .as_ref()
            .map_or("127.0.0.1".to_owned(), |n| n.host.clone());
        let members: Vec<(String, u16, u16)> = (0..u.etcd)
            .map(|i| Ok((format!("etcd-{i}"), free_port()?, free_port()?)))
            .collect::<Result<_>>()?;
        let cluster = members
            .iter()
            .map(|(n, _, peer)| format!("{n}=http://{etcd_ip}:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        for (n, client, peer) in &members {
            let data = dir.join(n);
            let log = dir.join(format!("{n}.log"));
            let client_url = format!("http://{etcd_ip}:{client}");
            let peer_url = format!("http://{etcd_ip}:{peer}");
            let pid = spawn_logged(
                std::process::Command::new(&etcd)
                    .arg("--name")
                    .arg(n)
                    .arg("--data-dir")
                    .arg(&data)
                    .args(["--listen-client-urls", &client_url])
                    .args(["--advertise-client-urls", &client_url])
                    .args(["--listen-peer-urls", &peer_url])
                    .args(["--initial-advertise-peer-urls", &peer_url])
                    .args(["--initial-cluster", &cluster])
                    .args(["--initial-cluster-state", "new"])
                    .args([
                        "--initial-cluster-token",
                        &format!("rampart-{}", std::process::id()),
                    ]),
                &log,
            )?;
            file.etcd.push(Proc {
                name: n.clone(),
                pid,
                url: None,
                endpoint: Some(client_url),
            });
            save(&file)?;
        }
        let endpoints: Vec<String> = file
            .etcd
            .iter()
            .filter_map(|e| e.endpoint.clone())
            .collect();
        for e in &file.etcd {
            let ep = e.endpoint.clone().unwrap_or_default();
            wait_health(&ep, &e.name, e.pid, &dir.join(format!("{}.log", e.name)))?;
        }
        let fleet = endpoints.join(",");
        for i in 0..u.nodes {
            let name = format!("node-{i}");
            let (listen, mut cmd) = match &net {
                Some(n) => {
                    let mut c = std::process::Command::new("nsenter");
                    c.arg(format!("--net=/run/netns/{}", n.netns[i]))
                        .arg("--")
                        .arg(&me);
                    (format!("{}:3000", n.node_ip(i)), c)
                }
                None => (
                    format!("127.0.0.1:{}", free_port()?),
                    std::process::Command::new(&me),
                ),
            };
            let url = format!("http://{listen}");
            let data = dir.join(&name);
            let log = dir.join(format!("{name}.log"));
            let pid = spawn_logged(
                cmd.args(["serve", "--listen", &listen, "--data-dir"])
                    .arg(&data)
                    .args(["--fleet", &fleet, "--node-name", &name, "--advertise", &url])
                    .args(["--fleet-ttl", &u.ttl.to_string()])
                    .env_remove("RAMPART_SOCKET")
                    // Each node's sandbox networks apart from the others' (as on separate
                    // hosts): its own address pool, link names, nftables table; its resolver
                    // and egress proxy on ports the kernel picks.
                    .env("RAMPART_NET_POOL", format!("10.{}.0.0/16", 120 + i))
                    .env("RAMPART_NET_LINK_PREFIX", format!("rf{i}"))
                    .env(
                        "RAMPART_NET_TABLE",
                        format!("rampart_fleet{i}_{}", std::process::id()),
                    )
                    .env("RAMPART_NET_DNS_PORT", "0")
                    .env("RAMPART_NET_PROXY_PORT", "0"),
                &log,
            )?;
            file.nodes.push(Proc {
                name: name.clone(),
                pid,
                url: Some(url.clone()),
                endpoint: None,
            });
            save(&file)?;
            wait_health(&url, &name, pid, &log)?;
        }
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        let gdir = dir.join("gateway");
        let log = dir.join("gateway.log");
        let pid = spawn_logged(
            std::process::Command::new(&me)
                .args([
                    "gateway",
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--fleet",
                    &fleet,
                    "--data-dir",
                ])
                .arg(&gdir)
                .args(["--name", "gateway-0"]),
            &log,
        )?;
        file.gateways.push(Proc {
            name: "gateway-0".into(),
            pid,
            url: Some(url.clone()),
            endpoint: None,
        });
        file.gateway = url.clone();
        save(&file)?;
        wait_health(&url, "the gateway", pid, &log)?;
        file.admin_key = std::fs::read_to_string(gdir.join("admin-key"))?
            .trim()
            .to_owned();
        save(&file)?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = down(&dir);
        return Err(e.context("rampart fleet up failed; what it started is stopped"));
    }
    println!("{}", serde_json::to_string_pretty(&file)?);
    Ok(0)
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether `pid` is alive and was started from `dir` (its command line names the directory),
/// so `down` never signals a process that reused the pid.
fn ours(pid: i32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let text = String::from_utf8_lossy(&cmdline);
    text.contains(&*dir.to_string_lossy())
}

fn stop(pid: i32, dir: &Path, grace: Duration) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    if !ours(pid, dir) {
        return;
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        // Our own child is reaped by init once we are not its parent; watch /proc.
        if !ours(pid, dir) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
}

fn down(dir: &Path) -> Result<u8> {
    let dir =
        std::fs::canonicalize(dir).with_context(|| format!("no fleet at {}", dir.display()))?;
    let path = dir.join("fleet.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let f: FleetFile = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a fleet file", path.display()))?;
    for g in &f.gateways {
        stop(g.pid, &dir, Duration::from_secs(10));
    }
    // Nodes stop as a daemon does at SIGTERM (their sandboxes keep running), so their
    // sandboxes are destroyed first, over each node's socket.
    for n in &f.nodes {
        let sock = dir.join(&n.name).join(rampart_server::SOCKET_FILE);
        if ours(n.pid, &dir) && sock.exists() {
            destroy_all(&sock);
        }
        stop(n.pid, &dir, Duration::from_secs(30));
    }
    for e in &f.etcd {
        stop(e.pid, &dir, Duration::from_secs(10));
    }
    if let Some(net) = &f.network {
        net.remove();
    }
    std::fs::remove_file(&path)?;
    println!("stopped the fleet in {}", dir.display());
    Ok(0)
}

/// Destroys every sandbox of the node whose socket is `sock` (`rampart ls` and `rampart rm`
/// over it).
fn destroy_all(sock: &Path) {
    let Ok(me) = std::env::current_exe() else {
        return;
    };
    let run = |args: &[&str]| {
        std::process::Command::new(&me)
            .arg("--socket")
            .arg(sock)
            .args(args)
            .output()
    };
    let ids: Vec<String> = match run(&["ls", "--json"]) {
        Ok(o) if o.status.success() => serde_json::from_slice::<Vec<serde_json::Value>>(&o.stdout)
            .unwrap_or_default()
            .iter()
            .filter_map(|s| s.get("id").and_then(|i| i.as_str()).map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    if ids.is_empty() {
        return;
    }
    let mut args = vec!["rm"];
    args.extend(ids.iter().map(String::as_str));
    if let Ok(o) = run(&args) {
        if !o.status.success() {
            eprintln!(
                "rampart fleet down: removing the sandboxes at {}: {}",
                sock.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
    }
}

/// A fleet's gateway's API, for the CLI's commands that only it serves (`rampart node`,
/// `rampart keys` with a host).
pub(crate) struct GatewayApi {
    base: String,
    key: Option<String>,
    client: reqwest::blocking::Client,
    /// Why a 404 on a collection means the endpoint is not a gateway.
    not_here: &'static str,
}

impl GatewayApi {
    /// The API at `host` (a URL, or `host:port` for http), with `key`.
    pub(crate) fn new(host: &str, key: Option<String>, not_here: &'static str) -> Result<Self> {
        let base = if host.contains("://") {
            host.trim_end_matches('/').to_owned()
        } else {
            format!("http://{}", host.trim_end_matches('/'))
        };
        Ok(GatewayApi {
            base,
            key: key.map(|k| k.trim().to_owned()),
            client: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
            not_here,
        })
    }

    /// Its URL.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// `method path` with `body`: the answer's JSON, or an error with the API's message.
    pub(crate) fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value> {
        let base = &self.base;
        let mut r = self.client.request(method.clone(), format!("{base}{path}"));
        if let Some(k) = &self.key {
            r = r.bearer_auth(k);
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().with_context(|| format!("cannot reach {base}"))?;
        let status = resp.status();
        let text = resp.text().unwrap_or_default();
        if status == reqwest::StatusCode::NOT_FOUND && path.matches('/').count() == 2 {
            bail!("{base}: {}", self.not_here);
        }
        if !status.is_success() {
            let why = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or(text);
            bail!("{method} {base}{path}: {status}: {why}");
        }
        Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
    }
}

/// `rampart node`.
#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(subcommand)]
    cmd: NodeCmd,
}

#[derive(Debug, Subcommand)]
enum NodeCmd {
    /// The fleet's nodes: state, address, sandboxes, free memory.
    #[command(alias = "list")]
    Ls {
        /// Print the gateway's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop placing new sandboxes on a node (what runs there goes on).
    Drain {
        /// The node's name.
        name: String,
    },
    /// Place new sandboxes on a drained node again.
    Undrain {
        /// The node's name.
        name: String,
    },
}

/// `rampart node ...`, against the gateway `host` names (`--host`, `RAMPART_HOST`).
pub fn node(a: NodeArgs, host: Option<String>, api_key: Option<String>) -> Result<u8> {
    let Some(host) = host else {
        bail!("rampart node talks to a fleet's gateway: set RAMPART_HOST (or --host) to its URL");
    };
    let api = GatewayApi::new(
        &host,
        api_key,
        "it is not a fleet's gateway (it has no /v1/nodes)",
    )?;
    let call = |m: reqwest::Method, path: &str| api.call(m, path, None);
    match a.cmd {
        NodeCmd::Ls { json } => {
            let v = call(reqwest::Method::GET, "/v1/nodes")?;
            if json {
                println!("{v}");
                return Ok(0);
            }
            println!(
                "{:<16} {:<9} {:<28} {:>9} {:>12} TIERS",
                "NAME", "STATE", "URL", "SANDBOXES", "MEM FREE"
            );
            for n in v["nodes"].as_array().into_iter().flatten() {
                let free = n["capacity"]["memory_available_bytes"].as_u64();
                println!(
                    "{:<16} {:<9} {:<28} {:>9} {:>12} {}",
                    n["name"].as_str().unwrap_or("?"),
                    n["state"].as_str().unwrap_or("?"),
                    n["url"].as_str().unwrap_or("-"),
                    n["catalog_sandboxes"].as_u64().unwrap_or(0),
                    free.map(|b| format!("{} MiB", b >> 20))
                        .unwrap_or_else(|| "-".into()),
                    n["tiers"]
                        .as_array()
                        .map(|t| t
                            .iter()
                            .filter_map(|x| x.as_str())
                            .collect::<Vec<_>>()
                            .join(","))
                        .unwrap_or_default()
                );
            }
        }
        NodeCmd::Drain { name } => {
            call(reqwest::Method::POST, &format!("/v1/nodes/{name}/drain"))?;
            println!("{name} draining");
        }
        NodeCmd::Undrain { name } => {
            call(reqwest::Method::DELETE, &format!("/v1/nodes/{name}/drain"))?;
            println!("{name} ready");
        }
    }
    Ok(0)
}
