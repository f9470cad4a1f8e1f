//! `rampart bench`: Rampart measured side by side with its peers on this machine, in one run.
//!
//! Peers: `bwrap --unshare-all` (bubblewrap), `runc run` of an OCI bundle over the same `/usr`
//! (Docker's runtime) and `unshare -U -m -p -n -i -u --fork` (util-linux). Rampart is measured
//! through its HTTP API, as a user sees it: create -> first exec result -> destroy, the exec
//! round trip on a warm sandbox, create+destroy throughput at concurrency 8, and memory per
//! idle sandbox. These machines are shared and noisy: the ratios are the result, absolute
//! times only a hint.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod compare;
mod cpu;
mod desktop;
mod fleet;
mod gvisor;
mod net;
mod persist;
mod pool;
mod profile;

/// Options of `rampart bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Iterations of each latency measurement.
    #[arg(long, default_value_t = 50)]
    pub iterations: usize,
    /// Sandboxes kept alive for the memory measurement.
    #[arg(long, default_value_t = 1000)]
    pub idle: usize,
    /// create+destroy cycles for the throughput measurement.
    #[arg(long, default_value_t = 200)]
    pub cycles: usize,
    /// Concurrency of the throughput measurement.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Use this running daemon instead of starting a private one.
    #[arg(long)]
    pub daemon: Option<String>,
    /// Write the results as JSON to this file too.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Execs per mode of the audit on/off measurement (alternating one by one).
    #[arg(long, default_value_t = 1500)]
    pub audit_execs: usize,
    /// Events in the generated bundle of the verification-speed measurement.
    #[arg(long, default_value_t = 100_000)]
    pub verify_events: u64,
    /// Only the audit measurements (exec throughput with the audit log on and off,
    /// verification speed).
    #[arg(long)]
    pub audit_only: bool,
    /// Only the pause and resume latency measurement.
    #[arg(long)]
    pub pause_only: bool,
    /// Only the snapshot and fork measurement against the writable layer's size (1 MiB,
    /// 100 MiB, 1 GiB), next to a plain `cp --sparse` of the same disk image.
    #[arg(long)]
    pub persist: bool,
    /// Only the egress measurement: one HTTPS request direct, through the egress proxy's SNI
    /// check and through the secret-injecting proxy (private network namespaces; root).
    #[arg(long)]
    pub egress: bool,
    /// Only the sandbox-network measurement: create + first exec with network `none` against
    /// `allowlist`, alternating, on a private daemon with its own nftables table.
    #[arg(long)]
    pub net: bool,
    /// Only the template build measurement: cold, warm cache, one step changed (root; a
    /// private data directory; no network).
    #[arg(long)]
    pub templates: bool,
    /// Only the desktop measurement: create -> first screenshot, the screenshot round trip,
    /// an idle desktop's memory. Needs `--daemon` with the `desktop` template built.
    #[arg(long, requires = "daemon")]
    pub desktop: bool,
    /// Only the warm-pool measurement: create from a warm pool against a cold create on the
    /// same private daemon, next to bwrap; the E2B SDK's create + run + kill and
    /// create+destroy throughput with the pool (root; its own network table).
    #[arg(long)]
    pub pool: bool,
    /// Sandboxes in each warm pool of `--pool`.
    #[arg(long, default_value_t = 16)]
    pub pool_size: usize,
    /// Compare this build's daemon with another build's (a `rampart` binary): whole runs,
    /// alternately A B A B (`--pairs`), every figure's ratio B/A pair by pair and its median,
    /// the peers' own ratios showing the machine's drift; `--json` keeps all of it.
    #[arg(long, value_name = "OTHER_BINARY")]
    pub compare: Option<PathBuf>,
    /// Only the create profile: each step of a cold create as the daemon measures it
    /// (`rampart_sandbox_create_step_seconds`), next to the create + first exec the client
    /// sees (a private daemon).
    #[arg(long)]
    pub profile: bool,
    /// Only the fleet measurement: what the gateway adds to an exec and a create (each call
    /// through the gateway and straight to the node, alternately) and create+destroy per
    /// second through the gateway, on a fleet of 3 nodes this starts (root; etcd).
    #[arg(long)]
    pub fleet: bool,
    /// Pairs of runs of `--compare`.
    #[arg(long, default_value_t = 3)]
    pub pairs: usize,
    /// Both isolation tiers side by side with `runsc do` and the namespace peers: create +
    /// first exec, exec, pause to disk with memory and restore by memory held, fork of a
    /// running sandbox, wake on access, memory per idle sandbox.
    #[arg(long)]
    pub gvisor: bool,
}

/// Latency samples of one measurement.
#[derive(Debug, Clone)]
struct Samples {
    name: String,
    ms: Vec<f64>,
}

impl Samples {
    fn new(name: &str) -> Self {
        Samples {
            name: name.to_owned(),
            ms: Vec::new(),
        }
    }
    fn push(&mut self, d: Duration) {
        self.ms.push(d.as_secs_f64() * 1000.0);
    }
    fn pct(&self, p: f64) -> f64 {
        if self.ms.is_empty() {
            return f64::NAN;
        }
        let mut v = self.ms.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let idx = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[idx.min(v.len() - 1)]
    }
}

/// A daemon started by the bench, removed at the end.
struct PrivateDaemon {
    child: std::process::Child,
    data_dir: PathBuf,
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        // SIGTERM the daemon we started (by pid), then remove its data dir. Sandboxes were
        // destroyed by the bench itself.
        // SAFETY: kill(2) on the pid of our own child process; no memory is touched.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        // The copy-on-write store it may have mounted (rampart_jail::store).
        let store = self.data_dir.join("store");
        if std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(&*store.to_string_lossy()))
        {
            let _ = Command::new("umount").arg("-l").arg(&store).status();
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn start_private_daemon() -> Result<(String, PrivateDaemon)> {
    start_private_daemon_with("main", None)
}

/// A private daemon with its own data directory (`rampart-bench-<pid>-<name>`) and, if
/// given, a config file of this text.
/// Environment variable naming the `rampart` binary the private daemons run (default: this
/// one), to measure another build's daemon with the same client.
const BENCH_DAEMON_ENV: &str = "RAMPART_BENCH_DAEMON";

/// The API key of the benchmark's requests: `RAMPART_API_KEY` when set (a daemon given with
/// `--daemon`), else one made for this run and registered in each private daemon's store
/// before it starts.
fn bench_key() -> &'static str {
    static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    KEY.get_or_init(|| match std::env::var("RAMPART_API_KEY") {
        Ok(k) if !k.trim().is_empty() => k.trim().to_owned(),
        _ => format!(
            "{}{}",
            rampart_store::node_keys::NODE_KEY_PREFIX,
            rampart_store::keys::random_hex(rampart_store::node_keys::NODE_KEY_HEX_LEN / 2)
        ),
    })
}

/// A client builder whose requests carry [`bench_key`].
pub(crate) fn http_builder() -> reqwest::blocking::ClientBuilder {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(v) = format!("Bearer {}", bench_key()).parse() {
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    reqwest::blocking::Client::builder().default_headers(headers)
}

fn start_private_daemon_with(name: &str, config: Option<&str>) -> Result<(String, PrivateDaemon)> {
    // Another build's daemon can be measured with this build's client (before/after).
    let exe = match std::env::var_os(BENCH_DAEMON_ENV) {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()?,
    };
    let port = free_port()?;
    let data_dir =
        std::env::temp_dir().join(format!("rampart-bench-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&data_dir)?;
    // The benchmark is the node's administrator of its private daemons.
    let keys = rampart_store::node_keys::NodeKeyStore::open(&data_dir.join("state.db"))?;
    match keys.import(
        &rampart_store::node_keys::NewKey {
            name: "bench".into(),
            scopes: vec![rampart_store::node_keys::SCOPE_ADMIN.into()],
            expires_at_ms: None,
            tenant: None,
        },
        bench_key(),
    ) {
        Ok(_) | Err(rampart_store::node_keys::NewKeyError::Exists(_)) => {}
        Err(e) => return Err(e).context("registering the benchmark's API key"),
    }
    drop(keys);
    let mut cmd = Command::new(&exe);
    // The density measurements keep up to a thousand sandboxes alive whose sparse disks stay
    // nearly empty: the daemon is told to admit their quotas beyond the space the store holds
    // (a daemon of another build given by RAMPART_BENCH_DAEMON must know `disk_overcommit`,
    // as every build since disk admission does).
    let text = match config {
        Some(t) => format!("disk_overcommit = 1000.0\n{t}"),
        None => "disk_overcommit = 1000.0\n".to_string(),
    };
    let text = Some(text);
    if let Some(text) = text {
        let path = data_dir.join("bench.toml");
        std::fs::write(&path, text)?;
        cmd.arg("serve").arg("--config").arg(path);
    } else {
        cmd.arg("serve");
    }
    let child = cmd
        .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(&data_dir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .context("starting a private daemon")?;
    let daemon = PrivateDaemon { child, data_dir };
    let url = format!("http://127.0.0.1:{port}");
    Ok((url, daemon))
}

fn wait_healthy(client: &reqwest::blocking::Client, url: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(r) = client.get(format!("{url}/health")).send() {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("the daemon at {url} did not become healthy within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn time_cmd(cmd: &mut Command) -> Result<Duration> {
    let t = Instant::now();
    let out = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).output()?;
    let d = t.elapsed();
    if !out.status.success() {
        bail!(
            "{:?} failed: {}",
            cmd,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(d)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|c| c.is_file())
    })
}

/// An OCI bundle for runc: a rootfs of usr-merge symlinks with the host `/usr` bound read-only,
/// the same files the bwrap and Rampart runs see.
fn runc_bundle(dir: &Path) -> Result<()> {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(rootfs.join("usr"))?;
    for d in ["proc", "dev", "sys", "tmp"] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }
    for l in ["bin", "sbin", "lib", "lib64"] {
        if Path::new("/usr").join(l).exists() {
            let _ = std::os::unix::fs::symlink(format!("usr/{l}"), rootfs.join(l));
        }
    }
    let status = Command::new("runc")
        .args(["spec", "--bundle"])
        .arg(dir)
        .status()
        .context("runc spec")?;
    if !status.success() {
        bail!("runc spec failed");
    }
    let path = dir.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    spec["process"]["terminal"] = json!(false);
    spec["process"]["args"] = json!(["true"]);
    spec["root"]["readonly"] = json!(true);
    spec["mounts"]
        .as_array_mut()
        .context("config.json has no mounts")?
        .push(
            json!({"destination": "/usr", "type": "bind", "source": "/usr",
                     "options": ["rbind", "ro"]}),
        );
    std::fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
    Ok(())
}

fn measure_peers(iterations: usize) -> Result<Vec<Samples>> {
    let mut out = Vec::new();
    if which("bwrap").is_some() {
        let mut s = Samples::new("bwrap --unshare-all, /usr ro, true");
        for _ in 0..iterations {
            s.push(time_cmd(Command::new("bwrap").args([
                "--unshare-all",
                "--ro-bind",
                "/usr",
                "/usr",
                "--symlink",
                "usr/bin",
                "/bin",
                "--symlink",
                "usr/lib",
                "/lib",
                "--symlink",
                "usr/lib64",
                "/lib64",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "true",
            ]))?);
        }
        out.push(s);
    } else {
        eprintln!("bench: bwrap not found (apt install bubblewrap); skipping that peer");
    }
    if which("unshare").is_some() {
        let mut s = Samples::new("unshare -U -m -p -n -i -u --fork true");
        for _ in 0..iterations {
            s.push(time_cmd(
                Command::new("unshare")
                    .args(["-U", "-m", "-p", "-n", "-i", "-u", "--fork", "true"]),
            )?);
        }
        out.push(s);
    }
    if which("runc").is_some() {
        let dir = tempfile_dir("rampart-bench-runc")?;
        let res = (|| -> Result<Samples> {
            runc_bundle(&dir)?;
            let mut s = Samples::new("runc run (OCI bundle, /usr ro), true");
            for i in 0..iterations {
                let name = format!("rampart-bench-{}-{i}", std::process::id());
                s.push(time_cmd(
                    Command::new("runc")
                        .args(["run", "--bundle"])
                        .arg(&dir)
                        .arg(&name),
                )?);
            }
            Ok(s)
        })();
        let _ = std::fs::remove_dir_all(&dir);
        match res {
            Ok(s) => out.push(s),
            Err(e) => eprintln!("bench: runc could not run here, skipping that peer: {e:#}"),
        }
    } else {
        eprintln!("bench: runc not found (apt install runc); skipping that peer");
    }
    Ok(out)
}

fn tempfile_dir(prefix: &str) -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

struct Api {
    client: reqwest::blocking::Client,
    url: String,
}

impl Api {
    fn create(&self) -> Result<String> {
        self.create_with(&json!({}))
    }
    /// A create with this body; its id.
    fn create_with(&self, body: &Value) -> Result<String> {
        let r = self
            .client
            .post(format!("{}/v1/sandboxes", self.url))
            .json(body)
            .send()?;
        let status = r.status();
        let v: Value = r.json()?;
        if !status.is_success() {
            bail!("create: {status}: {v}");
        }
        Ok(v["id"].as_str().context("create: no id")?.to_owned())
    }
    /// Waits (polling its state 20 ms apart, at most `within`) until `id` is `want`.
    fn wait_state(&self, id: &str, want: &str, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        while self.state(id)? != want {
            if Instant::now() > deadline {
                bail!("sandbox {id} was not {want} within {} s", within.as_secs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The state `GET /v1/sandboxes/{id}` answers.
    fn state(&self, id: &str) -> Result<String> {
        let v: Value = self
            .client
            .get(format!("{}/v1/sandboxes/{id}", self.url))
            .send()?
            .json()?;
        Ok(v["state"].as_str().unwrap_or_default().to_owned())
    }

    fn exec_true(&self, id: &str) -> Result<()> {
        let r = self
            .client
            .post(format!("{}/v1/sandboxes/{id}/exec", self.url))
            .json(&json!({"cmd": ["true"]}))
            .send()?;
        let status = r.status();
        let v: Value = r.json()?;
        if !status.is_success() || v["exit_code"] != json!(0) {
            bail!("exec: {status}: {v}");
        }
        Ok(())
    }
    /// A streamed exec of `true` (`accept: application/x-ndjson`, the CLI's and the SDKs'
    /// path) on the client's kept-alive connection, read to its `exit` event.
    fn exec_true_streamed(&self, id: &str) -> Result<()> {
        let r = self
            .client
            .post(format!("{}/v1/sandboxes/{id}/exec", self.url))
            .header("accept", "application/x-ndjson")
            .json(&json!({"cmd": ["true"]}))
            .send()?;
        let status = r.status();
        let text = r.text()?;
        let exit = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["type"] == "exit");
        match exit {
            Some(v) if status.is_success() && v["exit_code"] == json!(0) => Ok(()),
            _ => bail!("streamed exec: {status}: {text}"),
        }
    }
    /// `POST /v1/sandboxes/{id}/pause` or `/resume`; checks the state it answers.
    fn pause(&self, id: &str, resume: bool) -> Result<()> {
        self.pause_with(id, resume, None)
    }
    /// [`Api::pause`] with a body (`{"memory": false}`: to the filesystem).
    fn pause_with(&self, id: &str, resume: bool, body: Option<Value>) -> Result<()> {
        let (verb, want) = if resume {
            ("resume", "running")
        } else {
            ("pause", "paused")
        };
        let mut req = self
            .client
            .post(format!("{}/v1/sandboxes/{id}/{verb}", self.url));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send()?;
        let status = r.status();
        let v: Value = r.json()?;
        if !status.is_success() || v["state"] != json!(want) {
            bail!("{verb}: {status}: {v}");
        }
        Ok(())
    }
    fn destroy(&self, id: &str) -> Result<()> {
        let r = self
            .client
            .delete(format!("{}/v1/sandboxes/{id}", self.url))
            .send()?;
        if !r.status().is_success() {
            bail!("destroy: {}: {}", r.status(), r.text().unwrap_or_default());
        }
        Ok(())
    }
}

fn mem_used_bytes() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal:").context("MemTotal")?;
    let avail = field("MemAvailable:").context("MemAvailable")?;
    Ok(total - avail)
}

/// Memory charged to Rampart's cgroup subtree (all sandboxes), if the host exposes it.
fn subtree_memory_bytes() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory/rampart/memory.usage_in_bytes",
        "/sys/fs/cgroup/rampart/memory.current",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
}

/// Runs the benchmark and prints the report.
pub fn run(args: BenchArgs) -> Result<()> {
    if args.net {
        return net::run(&args);
    }
    if args.fleet {
        return fleet::run(&args);
    }
    if args.pool {
        return pool::run(&args);
    }
    if args.gvisor {
        return gvisor::run(&args);
    }
    if args.profile {
        return profile::run(&args);
    }
    if let Some(other) = &args.compare {
        return compare::run(&args, other);
    }
    if args.templates {
        return crate::commands::template::bench(args.iterations.min(20));
    }
    if args.egress {
        return run_egress(&args);
    }
    let client = http_builder()
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(args.concurrency.max(1))
        .build()?;
    let mut _private = None;
    let url = match &args.daemon {
        Some(u) => u.trim_end_matches('/').to_owned(),
        None => {
            let (u, d) = start_private_daemon()?;
            _private = Some(d);
            u
        }
    };
    wait_healthy(&client, &url)?;
    if args.audit_only {
        drop(_private);
        let audit = measure_audit(&client, &args)?;
        print_audit(&audit);
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_vec_pretty(&audit.to_json())?)?;
        }
        return Ok(());
    }
    let api = Api {
        client: client.clone(),
        url,
    };
    if args.desktop {
        return desktop::run(&args, &api);
    }
    if args.persist {
        let data = _private.as_ref().map(|d| d.data_dir.clone());
        return persist::run(&api, data.as_deref(), args.iterations);
    }
    if args.pause_only {
        let p = measure_pause(&api, args.iterations)?;
        print_pause(&p);
        return Ok(());
    }

    let daemon_pid = _private.as_ref().map(|d| d.child.id());
    let f = measure_all(&api, &args, daemon_pid)?;

    print_latency(&f, args.iterations);
    print_density(&f, &args);
    print_cpu(&f.warm.cpu, &f.throughput.cpu, args.concurrency);
    let key_file = _private.as_ref().map(|d| d.data_dir.join("api-key"));
    let e2b = measure_e2b_sdk(&api.url, key_file.as_deref(), args.iterations.min(30));
    let e2b = e2b.unwrap_or_default();
    print_e2b(&e2b);
    drop(api);
    drop(_private);
    let audit = measure_audit(&client, &args)?;
    print_audit(&audit);
    print_targets(&f, &args, &e2b, &audit);
    if let Some(path) = &args.json {
        write_json(path, &f, &args, &e2b, &audit)?;
    }
    Ok(())
}

/// The figures of a full run but the E2B SDK's and the audit's, in the order they are taken.
struct Figures {
    /// bwrap, runc, unshare: whichever are installed.
    peers: Vec<Samples>,
    /// create + first exec result.
    cycle: Samples,
    /// create + first exec + destroy.
    full: Samples,
    warm: WarmExec,
    /// `rampart run -- true` as a whole process.
    cli: Samples,
    pause: PauseBench,
    throughput: Throughput,
    idle: IdleMemory,
}

impl Figures {
    /// bwrap's p50, which the latency rows are compared to (when bwrap is installed).
    fn bwrap_p50(&self) -> Option<f64> {
        self.peers
            .iter()
            .find(|s| s.name.starts_with("bwrap"))
            .map(|s| s.pct(50.0))
    }

    /// The latency table's rows, in its order.
    fn latency_rows(&self) -> Vec<&Samples> {
        let mut rows: Vec<&Samples> = self.peers.iter().collect();
        rows.extend([
            &self.cycle,
            &self.full,
            &self.cli,
            &self.warm.rtt,
            &self.warm.streamed,
            &self.warm.host,
        ]);
        rows.extend(self.pause.rows());
        rows
    }
}

/// Takes every measurement of a full run (against the daemon `api` speaks to; `daemon_pid`
/// when it is the private one, for its CPU).
fn measure_all(api: &Api, args: &BenchArgs, daemon_pid: Option<u32>) -> Result<Figures> {
    eprintln!("bench: peers ({} iterations each)...", args.iterations);
    let peers = measure_peers(args.iterations)?;
    let (cycle, full) = measure_create_cycle(api, args.iterations)?;
    let warm = measure_warm_exec(api, args.iterations, daemon_pid)?;
    let cli = measure_cli_run(api, args.iterations)?;
    let pause = measure_pause(api, args.iterations)?;
    let throughput = measure_throughput(api, args.cycles, args.concurrency, daemon_pid)?;
    let idle = measure_idle(api, args.idle)?;
    Ok(Figures {
        peers,
        cycle,
        full,
        warm,
        cli,
        pause,
        throughput,
        idle,
    })
}

/// create -> first exec result, and -> destroyed: (to the exec's result, to the destroy).
fn measure_create_cycle(api: &Api, iterations: usize) -> Result<(Samples, Samples)> {
    eprintln!("bench: rampart create -> first exec -> destroy...");
    // Warm-up: the first create builds the cached disk image of this size.
    let id = api.create()?;
    api.exec_true(&id)?;
    api.destroy(&id)?;
    let mut cycle = Samples::new("rampart create + first exec result");
    let mut full = Samples::new("rampart create + first exec + destroy");
    for _ in 0..iterations {
        let t = Instant::now();
        let id = api.create()?;
        api.exec_true(&id)?;
        cycle.push(t.elapsed());
        api.destroy(&id)?;
        full.push(t.elapsed());
    }
    Ok((cycle, full))
}

/// The exec round trip on a warm sandbox, plain and streamed, next to the host's own
/// fork + exec + wait, and the CPU they cost.
struct WarmExec {
    rtt: Samples,
    streamed: Samples,
    host: Samples,
    cpu: ExecCpu,
}

fn measure_warm_exec(api: &Api, iterations: usize, daemon_pid: Option<u32>) -> Result<WarmExec> {
    eprintln!("bench: exec round trip on a warm sandbox...");
    let id = api.create()?;
    let mut rtt = Samples::new("rampart exec round trip (warm, `true`)");
    let mut streamed = Samples::new("rampart streamed exec, kept-alive connection (warm, `true`)");
    let mut host = Samples::new("host fork + exec + wait of `true` (the exec's peer)");
    let cpu0 = (
        daemon_pid.and_then(cpu::proc_cpu),
        cpu::sandbox_cpu(&id),
        cpu::own_children(),
    );
    // Alternating, so that the machine's noise falls on all three alike.
    for _ in 0..iterations.max(100) {
        let t = Instant::now();
        api.exec_true(&id)?;
        rtt.push(t.elapsed());
        let t = Instant::now();
        api.exec_true_streamed(&id)?;
        streamed.push(t.elapsed());
        host.push(time_cmd(&mut Command::new("true"))?);
    }
    let execs = 2 * iterations.max(100);
    let cpu = ExecCpu {
        daemon: match (cpu0.0, daemon_pid.and_then(cpu::proc_cpu)) {
            (Some(a), Some(b)) => Some((
                cpu::per_op_ms(b.user.saturating_sub(a.user), execs),
                cpu::per_op_ms(b.sys.saturating_sub(a.sys), execs),
            )),
            _ => None,
        },
        sandbox: match (cpu0.1, cpu::sandbox_cpu(&id)) {
            (Some(a), Some(b)) => Some(cpu::per_op_ms(b.saturating_sub(a), execs)),
            _ => None,
        },
        host: cpu::per_op_ms(
            cpu::own_children().saturating_sub(cpu0.2),
            iterations.max(100),
        ),
    };
    api.destroy(&id)?;
    Ok(WarmExec {
        rtt,
        streamed,
        host,
        cpu,
    })
}

/// `rampart run -- true` as a whole process (this executable, against the same daemon).
fn measure_cli_run(api: &Api, iterations: usize) -> Result<Samples> {
    eprintln!("bench: the CLI as a whole process: `rampart run -- true`...");
    let exe = std::env::current_exe()?;
    let mut cli = Samples::new("`rampart run -- true` (whole CLI process: create, exec, destroy)");
    for _ in 0..iterations {
        cli.push(time_cmd(
            Command::new(&exe)
                .args(["run", "--", "true"])
                .env("RAMPART_HOST", &api.url)
                .env("RAMPART_API_KEY", bench_key()),
        )?);
    }
    Ok(cli)
}

/// create+destroy per second at a concurrency, and the CPU each costs.
struct Throughput {
    rate: f64,
    cpu: CreateCpu,
}

fn measure_throughput(
    api: &Api,
    cycles: usize,
    concurrency: usize,
    daemon_pid: Option<u32>,
) -> Result<Throughput> {
    eprintln!("bench: {cycles} create+destroy at concurrency {concurrency}...");
    let per = cycles.div_ceil(concurrency.max(1));
    let cd0 = (daemon_pid.and_then(cpu::proc_cpu), cpu::machine_busy());
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..concurrency.max(1))
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    for _ in 0..per {
                        let id = api.create()?;
                        api.destroy(&id)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("bench worker panicked"))??;
        }
        Ok(())
    })?;
    let done = per * concurrency.max(1);
    let rate = done as f64 / t.elapsed().as_secs_f64();
    let cpu = CreateCpu {
        daemon: match (cd0.0, daemon_pid.and_then(cpu::proc_cpu)) {
            (Some(a), Some(b)) => Some((
                cpu::per_op_ms((b.user + b.sys).saturating_sub(a.user + a.sys), done),
                cpu::per_op_ms(b.children.saturating_sub(a.children), done),
            )),
            _ => None,
        },
        machine: match (cd0.1, cpu::machine_busy()) {
            (Some(a), Some(b)) => Some(cpu::per_op_ms(b.saturating_sub(a), done)),
            _ => None,
        },
    };
    Ok(Throughput { rate, cpu })
}

/// Memory per idle sandbox, and the create latency with many alive.
struct IdleMemory {
    /// Sandboxes that were alive (fewer than asked when a create failed).
    alive: usize,
    /// Host memory used per idle sandbox (bytes).
    per_idle: f64,
    /// Memory charged to the sandboxes' cgroups per idle sandbox (bytes), when readable.
    per_idle_cgroup: Option<f64>,
    /// Creates with about 100 alive.
    at_100: Samples,
    /// Creates with the most alive.
    at_n: Samples,
}

impl IdleMemory {
    /// Create p50 with the most alive over create p50 with 100 alive, when both were taken.
    fn flat(&self) -> Option<f64> {
        (!self.at_100.ms.is_empty() && !self.at_n.ms.is_empty())
            .then(|| self.at_n.pct(50.0) / self.at_100.pct(50.0))
    }
}

fn measure_idle(api: &Api, idle: usize) -> Result<IdleMemory> {
    eprintln!("bench: memory with {idle} idle sandboxes...");
    let before = mem_used_bytes()?;
    let cg_before = subtree_memory_bytes();
    let mut ids = Vec::with_capacity(idle);
    let mut mem_err = None;
    // Create latency with about 100 alive and with the most alive (20 creates each).
    let mut at_100 = Samples::new("create with 100 alive");
    let mut at_n = Samples::new(&format!("create with {idle} alive"));
    for i in 0..idle {
        let t = Instant::now();
        let made = api.create();
        if (100..120).contains(&i) {
            at_100.push(t.elapsed());
        } else if i + 20 >= idle && i >= 120 {
            at_n.push(t.elapsed());
        }
        match made {
            Ok(id) => ids.push(id),
            Err(e) => {
                mem_err = Some(e);
                break;
            }
        }
    }
    // Touch each once so every agent has served a request (as an idle sandbox in use has).
    for id in &ids {
        api.exec_true(id)?;
    }
    let after = mem_used_bytes()?;
    let cg_after = subtree_memory_bytes();
    let alive = ids.len();
    for id in &ids {
        let _ = api.destroy(id);
    }
    if let Some(e) = mem_err {
        eprintln!("bench: stopped at {alive} idle sandboxes: {e:#}");
    }
    let per_idle = (after.saturating_sub(before)) as f64 / alive.max(1) as f64;
    let per_idle_cgroup = match (cg_before, cg_after) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / alive.max(1) as f64),
        _ => None,
    };
    Ok(IdleMemory {
        alive,
        per_idle,
        per_idle_cgroup,
        at_100,
        at_n,
    })
}

/// The report's "Latency" section.
fn print_latency(f: &Figures, iterations: usize) {
    let bwrap_p50 = f.bwrap_p50();
    println!("\n## Latency (ms), {iterations} iterations\n");
    println!("| what | p50 | p99 | p50 vs bwrap |");
    println!("|---|---:|---:|---:|");
    for s in &f.latency_rows() {
        let ratio = bwrap_p50
            .map(|b| format!("{:.2}x", s.pct(50.0) / b))
            .unwrap_or("-".into());
        println!(
            "| {} | {:.2} | {:.2} | {} |",
            s.name,
            s.pct(50.0),
            s.pct(99.0),
            ratio
        );
    }
}

/// The report's "Throughput and density" section.
fn print_density(f: &Figures, args: &BenchArgs) {
    let idle = &f.idle;
    println!("\n## Throughput and density\n");
    println!("| what | value |");
    println!("|---|---:|");
    println!(
        "| create+destroy per second, concurrency {} | {:.1} |",
        args.concurrency, f.throughput.rate
    );
    println!(
        "| host memory per idle sandbox ({} alive) | {:.2} MiB |",
        idle.alive,
        idle.per_idle / (1024.0 * 1024.0)
    );
    if let Some(r) = idle.flat() {
        println!(
            "| create p50 with {} alive / with 100 alive | {:.2} ({:.2} / {:.2} ms) |",
            args.idle,
            r,
            idle.at_n.pct(50.0),
            idle.at_100.pct(50.0)
        );
    }
    if let Some(c) = idle.per_idle_cgroup {
        println!(
            "| memory charged to the sandboxes' cgroups per idle sandbox ({} alive) | {:.2} MiB |",
            idle.alive,
            c / (1024.0 * 1024.0)
        );
    }
}

/// The report's E2B SDK section (when the SDK was measured).
fn print_e2b(e2b: &[Samples]) {
    if e2b.is_empty() {
        return;
    }
    println!("\n## Through the unmodified E2B Python SDK (e2b==2.63.0)\n");
    println!("| what | p50 ms | p99 ms |");
    println!("|---|---:|---:|");
    for s in e2b {
        println!("| {} | {:.1} | {:.1} |", s.name, s.pct(50.0), s.pct(99.0));
    }
    println!("| E2B's published sandbox start time (cloud) | about 150 | - |");
}

/// The report's "Targets" section.
fn print_targets(f: &Figures, args: &BenchArgs, e2b: &[Samples], audit: &AuditBench) {
    let (warm, p, idle) = (&f.warm, &f.pause, &f.idle);
    let rate = f.throughput.rate;
    println!("\n## Targets\n");
    if let Some(b) = f.bwrap_p50() {
        let r = f.cycle.pct(50.0) / b;
        println!(
            "- create + first exec p50 <= 1.5x bwrap: {:.2}x ({})",
            r,
            pass(r <= 1.5)
        );
        let r = f.cli.pct(50.0) / b;
        println!(
            "- `rampart run -- true` p50 <= 3x bwrap: {:.2}x ({})",
            r,
            pass(r <= 3.0)
        );
    }
    println!(
        "- streamed exec on a kept-alive connection p50 <= 3 ms: {:.3} ms ({})",
        warm.streamed.pct(50.0),
        pass(warm.streamed.pct(50.0) <= 3.0)
    );
    let share = warm.rtt.pct(50.0) - warm.host.pct(50.0);
    println!(
        "- exec round trip above host fork+exec+wait <= 0.2 ms: {:.3} ms ({:.3} - {:.3}) ({})",
        share,
        warm.rtt.pct(50.0),
        warm.host.pct(50.0),
        pass(share <= 0.2)
    );
    if let Some(r) = idle.flat() {
        println!(
            "- create p50 with {} alive <= 1.3x with 100 alive: {:.2}x ({})",
            args.idle,
            r,
            pass(r <= 1.3)
        );
    }
    println!(
        "- resume p50 < 5 ms: {:.3} ms ({})",
        p.resume.pct(50.0),
        pass(p.resume.pct(50.0) < 5.0)
    );
    println!(
        "- a boot from the disk costs {:.2}x a fresh create (p50, same run)",
        p.boot.pct(50.0) / p.create.pct(50.0)
    );
    println!(
        "- >= 300 create+destroy per second: {:.1} ({})",
        rate,
        pass(rate >= 300.0)
    );
    // The larger of the two views, so the target is judged on the worse one.
    let mib = idle.per_idle.max(idle.per_idle_cgroup.unwrap_or(0.0)) / (1024.0 * 1024.0);
    println!(
        "- <= 1 MiB per idle sandbox: {:.2} MiB ({})",
        mib,
        pass(mib <= 1.0)
    );
    for s in e2b {
        if s.name.contains("create") {
            println!(
                "- E2B SDK create + run + kill p50 <= 30 ms: {:.1} ms ({})",
                s.pct(50.0),
                pass(s.pct(50.0) <= 30.0)
            );
        }
    }
    audit.print_targets();
}

/// The results as JSON (`--json`).
fn write_json(
    path: &Path,
    f: &Figures,
    args: &BenchArgs,
    e2b: &[Samples],
    audit: &AuditBench,
) -> Result<()> {
    let idle = &f.idle;
    let to_json =
        |s: &Samples| json!({"name": s.name, "p50_ms": s.pct(50.0), "p99_ms": s.pct(99.0)});
    let v = json!({
        "latency": f.latency_rows().iter().map(|s| to_json(s)).collect::<Vec<_>>(),
        "e2b_sdk": e2b.iter().map(to_json).collect::<Vec<_>>(),
        "create_p50_ms_at_100_alive": (!idle.at_100.ms.is_empty()).then(|| idle.at_100.pct(50.0)),
        "create_p50_ms_at_most_alive": (!idle.at_n.ms.is_empty()).then(|| idle.at_n.pct(50.0)),
        "creates_per_second": f.throughput.rate,
        "concurrency": args.concurrency,
        "idle_sandboxes": idle.alive,
        "bytes_per_idle_sandbox": idle.per_idle,
        "cgroup_bytes_per_idle_sandbox": idle.per_idle_cgroup,
        "audit": audit.to_json(),
        "cpu_ms": {
            "exec_daemon_user_sys": f.warm.cpu.daemon,
            "exec_sandbox": f.warm.cpu.sandbox,
            "exec_host_peer": f.warm.cpu.host,
            "create_destroy_daemon_and_jailers": f.throughput.cpu.daemon,
            "create_destroy_machine": f.throughput.cpu.machine,
        },
    });
    std::fs::write(path, serde_json::to_vec_pretty(&v)?)?;
    Ok(())
}

/// CPU per exec on a warm sandbox.
struct ExecCpu {
    /// The daemon's own (user, system) ms per exec (a private daemon only).
    daemon: Option<(f64, f64)>,
    /// The sandbox's cgroup (its agent and the command) ms per exec.
    sandbox: Option<f64>,
    /// The host peer's fork + exec + wait of `true`, ms of the child per run.
    host: f64,
}

/// CPU per create + destroy at the bench's concurrency.
struct CreateCpu {
    /// The daemon's own ms and its reaped children's (the jailers) ms (a private daemon).
    daemon: Option<(f64, f64)>,
    /// The whole machine's busy ms (kernel threads and everything else running included).
    machine: Option<f64>,
}

fn print_cpu(e: &ExecCpu, c: &CreateCpu, concurrency: usize) {
    println!("\n## Where the CPU goes (ms of CPU per operation)\n");
    println!("| what | ms |");
    println!("|---|---:|");
    if let Some((u, s)) = e.daemon {
        println!("| exec: the daemon (HTTP, core, audit record, agent RPC) user + system | {u:.3} + {s:.3} |");
    }
    if let Some(s) = e.sandbox {
        println!("| exec: the sandbox's cgroup (agent, fork + exec + wait of `true`) | {s:.3} |");
    }
    println!(
        "| exec peer: the host's `true` child (exec + run + exit) | {:.3} |",
        e.host
    );
    if let Some((d, j)) = c.daemon {
        println!("| create+destroy (concurrency {concurrency}): the daemon | {d:.2} |");
        println!("| create+destroy: the jailers (reaped children of the daemon) | {j:.2} |");
    }
    if let Some(m) = c.machine {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        println!(
            "| create+destroy: the whole machine busy (kernel threads included) | {m:.2} (bounds the rate at {:.0}/s on {cpus} CPUs) |",
            cpus as f64 * 1000.0 / m.max(0.001)
        );
    }
}

/// `Sandbox.create()` + `commands.run("true")` + `kill()` through the unmodified E2B Python
/// SDK, from the venv `scripts/e2b-sdks.sh` makes under `target/`. `None` (with the reason on
/// stderr) when the venv or an API key is missing.
fn measure_e2b_sdk(url: &str, key_file: Option<&Path>, iterations: usize) -> Option<Vec<Samples>> {
    const SCRIPT: &str = r#"
import sys, time
from e2b import Sandbox
n = int(sys.argv[1])
Sandbox.create().kill()  # warm-up
for _ in range(n):
    t = time.perf_counter()
    sbx = Sandbox.create()
    sbx.commands.run("true")
    sbx.kill()
    print("cycle", (time.perf_counter() - t) * 1000.0, flush=True)
sbx = Sandbox.create()
sbx.commands.run("true")
for _ in range(n):
    t = time.perf_counter()
    sbx.commands.run("true")
    print("run", (time.perf_counter() - t) * 1000.0, flush=True)
sbx.kill()
"#;
    let exe = std::env::current_exe().ok()?;
    let python = exe.parent()?.parent()?.join("e2b-venv/bin/python");
    if !python.is_file() {
        eprintln!(
            "bench: no E2B SDK venv at {} (scripts/e2b-sdks.sh makes it); skipping the SDK row",
            python.display()
        );
        return None;
    }
    let key = match key_file.and_then(|f| std::fs::read_to_string(f).ok()) {
        Some(k) => k.trim().to_owned(),
        None => match std::env::var("E2B_API_KEY") {
            Ok(k) => k,
            Err(_) => {
                eprintln!("bench: no API key for the E2B SDK row (set E2B_API_KEY); skipping it");
                return None;
            }
        },
    };
    eprintln!("bench: {iterations} create + run + kill through the E2B Python SDK...");
    let out = Command::new(&python)
        .args(["-c", SCRIPT, &iterations.to_string()])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("E2B_API_KEY", key)
        .env("E2B_API_URL", url)
        .env("E2B_SANDBOX_URL", url)
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "bench: the E2B SDK run failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let of = |kind: &str, name: &str| {
        let mut s = Samples::new(name);
        s.ms = text
            .lines()
            .filter_map(|l| l.strip_prefix(kind)?.trim().parse().ok())
            .collect();
        s
    };
    let rows = vec![
        of(
            "cycle ",
            "e2b SDK: Sandbox.create() + commands.run(\"true\") + kill()",
        ),
        of("run ", "e2b SDK: commands.run(\"true\") on a warm sandbox"),
    ];
    (rows.iter().all(|s| !s.ms.is_empty())).then_some(rows)
}

/// Pause and resume, frozen and to the filesystem, with a fresh create in the same run.
struct PauseBench {
    pause: Samples,
    resume: Samples,
    pause_fs: Samples,
    boot: Samples,
    create: Samples,
    /// An exec of a sandbox asleep for its idleness (frozen): its wake and the exec.
    wake: Samples,
    /// The same exec once it is awake.
    awake: Samples,
}

impl PauseBench {
    /// Its figures (the wake's only when the daemon has idle sleep: `--compare` runs
    /// builds from before it).
    fn rows(&self) -> Vec<&Samples> {
        [
            &self.pause,
            &self.resume,
            &self.pause_fs,
            &self.boot,
            &self.create,
            &self.wake,
            &self.awake,
        ]
        .into_iter()
        .filter(|s| !s.ms.is_empty())
        .collect()
    }
}

/// How many times the wake on access is measured (each waits a second for the sleep).
const WAKES: usize = 10;

/// Pause and resume latency through the API (request to answer: the sandbox's cgroup frozen
/// or thawed and the state recorded) of a warm sandbox running a few processes; then the
/// pause to the filesystem (flush, kill, disk at rest) and the boot from that disk, next to a
/// fresh create of the same template in the same run (what a boot from the disk is worth).
fn measure_pause(api: &Api, iterations: usize) -> Result<PauseBench> {
    eprintln!("bench: pause / resume of a warm sandbox...");
    let id = api.create()?;
    let r = api
        .client
        .post(format!("{}/v1/sandboxes/{id}/exec", api.url))
        .json(&json!({"cmd": ["sh", "-c", "for i in 1 2 3 4; do sleep 1000 & done; exit 0"]}))
        .send()?;
    if !r.status().is_success() {
        bail!("exec: {}", r.status());
    }
    let mut p = PauseBench {
        pause: Samples::new("rampart pause (API, warm sandbox, 6 processes)"),
        resume: Samples::new("rampart resume (API, warm sandbox, 6 processes)"),
        pause_fs: Samples::new("rampart pause to the filesystem (API, 6 processes)"),
        boot: Samples::new("rampart resume: boot from the disk (API, then exec true)"),
        create: Samples::new("rampart create (API, fresh sandbox, then exec true)"),
        wake: Samples::new("rampart wake on access: exec true of a sleeping sandbox (API)"),
        awake: Samples::new("rampart exec true of the same sandbox, awake (API)"),
    };
    let res = (|| -> Result<()> {
        for _ in 0..iterations.max(20) {
            let t = Instant::now();
            api.pause(&id, false)?;
            p.pause.push(t.elapsed());
            let t = Instant::now();
            api.pause(&id, true)?;
            p.resume.push(t.elapsed());
        }
        // Still alive and working after all that.
        api.exec_true(&id)?;
        let cold = Some(json!({"memory": false}));
        for _ in 0..iterations.max(20) {
            let t = Instant::now();
            api.pause_with(&id, false, cold.clone())?;
            p.pause_fs.push(t.elapsed());
            let t = Instant::now();
            api.pause(&id, true)?;
            api.exec_true(&id)?;
            p.boot.push(t.elapsed());
            let t = Instant::now();
            let fresh = api.create()?;
            api.exec_true(&fresh)?;
            p.create.push(t.elapsed());
            api.destroy(&fresh)?;
        }
        Ok(())
    })();
    api.destroy(&id)?;
    res?;
    // Idle sleep: a sandbox that sleeps after 1 s without a request; its next exec wakes it.
    let sleepy = match api.create_with(&json!({"idle_pause_secs": 1})) {
        Ok(id) => id,
        Err(e) if e.to_string().contains("unknown field `idle_pause_secs`") => {
            eprintln!("bench: this daemon has no idle sleep; no wake figure");
            return Ok(p);
        }
        Err(e) => return Err(e),
    };
    let res = (|| -> Result<()> {
        for _ in 0..WAKES {
            api.wait_state(&sleepy, "paused", Duration::from_secs(30))?;
            let t = Instant::now();
            api.exec_true(&sleepy)?;
            p.wake.push(t.elapsed());
            let t = Instant::now();
            api.exec_true(&sleepy)?;
            p.awake.push(t.elapsed());
        }
        Ok(())
    })();
    api.destroy(&sleepy)?;
    res?;
    Ok(p)
}

fn print_pause(p: &PauseBench) {
    println!(
        "\n## Pause and resume (ms), {} iterations\n",
        p.pause.ms.len()
    );
    println!("| what | p50 | p99 |");
    println!("|---|---:|---:|");
    for s in p.rows() {
        println!("| {} | {:.3} | {:.3} |", s.name, s.pct(50.0), s.pct(99.0));
    }
    println!(
        "\n- resume p50 < 5 ms: {:.3} ms ({})",
        p.resume.pct(50.0),
        pass(p.resume.pct(50.0) < 5.0)
    );
    println!(
        "- a boot from the disk costs {:.2}x a fresh create (p50, same run)",
        p.boot.pct(50.0) / p.create.pct(50.0)
    );
    if !p.wake.ms.is_empty() {
        println!(
            "- a woken sandbox's first exec costs {:.3} ms more than an awake one's (p50, {} wakes)",
            p.wake.pct(50.0) - p.awake.pct(50.0),
            p.wake.ms.len()
        );
    }
}

fn pass(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// Results of the audit measurements.
#[derive(Debug, Clone)]
struct AuditBench {
    /// Execs per second with the audit log on.
    on_rate: f64,
    /// Execs per second with it off.
    off_rate: f64,
    /// Median exec round trip with the audit log on, ms.
    p50_on_ms: f64,
    /// Median exec round trip with it off, ms.
    p50_off_ms: f64,
    /// Execs per mode.
    execs: usize,
    /// Events verified per second.
    verify_rate: f64,
    /// Events in the generated bundle.
    verify_events: u64,
    /// Size of the generated bundle.
    bundle_bytes: usize,
}

impl AuditBench {
    /// How much slower execs are with the audit log on (0.03 = 3 % slower).
    fn slowdown(&self) -> f64 {
        self.off_rate / self.on_rate - 1.0
    }
    fn to_json(&self) -> Value {
        json!({
            "exec_per_second_audit_on": self.on_rate,
            "exec_per_second_audit_off": self.off_rate,
            "exec_p50_ms_audit_on": self.p50_on_ms,
            "exec_p50_ms_audit_off": self.p50_off_ms,
            "execs_per_mode": self.execs,
            "slowdown": self.slowdown(),
            "verify_events_per_second": self.verify_rate,
            "verify_events": self.verify_events,
            "bundle_bytes": self.bundle_bytes,
        })
    }
    fn print_targets(&self) {
        let pct = self.slowdown() * 100.0;
        println!(
            "- exec throughput with the audit log at most 5% slower: {:.1}% ({})",
            pct,
            pass(pct <= 5.0)
        );
        println!(
            "- verification >= 100,000 events/s: {:.0} ({})",
            self.verify_rate,
            pass(self.verify_rate >= 100_000.0)
        );
    }
}

fn print_audit(a: &AuditBench) {
    println!("\n## Audit\n");
    println!("| what | value |");
    println!("|---|---:|");
    println!(
        "| exec/s, warm sandbox, audit log on ({} execs) | {:.1} |",
        a.execs, a.on_rate
    );
    println!(
        "| exec/s, warm sandbox, audit log off ({} execs) | {:.1} |",
        a.execs, a.off_rate
    );
    println!("| on / off | {:.3} |", a.on_rate / a.off_rate);
    println!(
        "| exec round trip p50, audit log on / off, ms | {:.3} / {:.3} ({:.3}) |",
        a.p50_on_ms,
        a.p50_off_ms,
        a.p50_off_ms / a.p50_on_ms
    );
    println!(
        "| bundle verification, events/s ({} events, {:.1} MiB) | {:.0} |",
        a.verify_events,
        a.bundle_bytes as f64 / (1024.0 * 1024.0),
        a.verify_rate
    );
}

/// Exec throughput with the audit log on and off (two private daemons, one per mode, run in
/// alternating rounds so that noise hits both), and verification speed of a generated bundle.
fn measure_audit(client: &reqwest::blocking::Client, args: &BenchArgs) -> Result<AuditBench> {
    eprintln!("bench: exec throughput with the audit log on and off...");
    let (on_url, _on) = start_private_daemon_with("audit-on", None)?;
    let (off_url, _off) =
        start_private_daemon_with("audit-off", Some("[audit]\nenabled = false\n"))?;
    wait_healthy(client, &on_url)?;
    wait_healthy(client, &off_url)?;
    let on = Api {
        client: client.clone(),
        url: on_url,
    };
    let off = Api {
        client: client.clone(),
        url: off_url,
    };
    let on_id = on.create()?;
    let off_id = off.create()?;
    for _ in 0..20 {
        on.exec_true(&on_id)?;
        off.exec_true(&off_id)?;
    }
    // One exec on each daemon in turn, the first of each pair alternating, so that load
    // from elsewhere on the machine hits both modes alike; each exec timed on its own.
    let execs = args.audit_execs.max(1);
    let (mut lat_on, mut lat_off) = (Vec::with_capacity(execs), Vec::with_capacity(execs));
    for i in 0..execs {
        let order: [(&Api, &str, bool); 2] = if i % 2 == 0 {
            [(&on, &on_id, true), (&off, &off_id, false)]
        } else {
            [(&off, &off_id, false), (&on, &on_id, true)]
        };
        for (api, id, is_on) in order {
            let t = Instant::now();
            api.exec_true(id)?;
            if is_on {
                lat_on.push(t.elapsed());
            } else {
                lat_off.push(t.elapsed());
            }
        }
    }
    let (t_on, t_off): (Duration, Duration) = (lat_on.iter().sum(), lat_off.iter().sum());
    lat_on.sort();
    lat_off.sort();
    let (p50_on, p50_off) = (lat_on[execs / 2], lat_off[execs / 2]);
    on.destroy(&on_id)?;
    off.destroy(&off_id)?;
    let on_rate = execs as f64 / t_on.as_secs_f64();
    let off_rate = execs as f64 / t_off.as_secs_f64();

    eprintln!(
        "bench: verifying a generated {}-event bundle...",
        args.verify_events
    );
    let bytes = generated_bundle(args.verify_events)?;
    let t = Instant::now();
    let report = rampart_audit::verify_bundle(&bytes, None)
        .map_err(|e| anyhow::anyhow!("the generated bundle does not verify: {e}"))?;
    let took = t.elapsed();
    Ok(AuditBench {
        on_rate,
        off_rate,
        p50_on_ms: p50_on.as_secs_f64() * 1000.0,
        p50_off_ms: p50_off.as_secs_f64() * 1000.0,
        execs,
        verify_rate: report.events as f64 / took.as_secs_f64(),
        verify_events: report.events,
        bundle_bytes: bytes.len(),
    })
}

/// A bundle of `n` events (exec/exit pairs with small output blobs), signed by a fresh key.
fn generated_bundle(n: u64) -> Result<Vec<u8>> {
    use rampart_audit::{Bundle, Chain, ContentHasher, EventBody, MerkleLog, NodeKey};
    use rampart_types::audit::{Exec, Exit};
    let id = rampart_types::SandboxId::generate();
    let mut chain = Chain::new(id.clone());
    let mut events = Vec::with_capacity(n as usize);
    let mut blobs = Vec::new();
    let time = rampart_audit::now();
    for i in 0..n {
        let body = if i % 2 == 0 {
            EventBody::Exec(Exec {
                exec_id: format!("x{i}"),
                argv: vec!["sh".into(), "-c".into(), format!("echo step {i}")],
                cwd: None,
                user: "user".into(),
                env_names: vec![],
                stdin: false,
                pty: false,
                input: None,
                caller: Some("key:0123456789ab:bench (exec)".into()),
                approval: None,
            })
        } else {
            let out = format!("step {}\n", i - 1).into_bytes();
            let (stdout, blob) = ContentHasher::record(&out, 1 << 20);
            blobs.extend(blob);
            let (stderr, _) = ContentHasher::record(b"", 1 << 20);
            EventBody::Exit(Exit {
                exec_id: format!("x{}", i - 1),
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                wall_ms: 1,
                cpu_ms: Some(0),
                peak_memory_bytes: None,
                stdout,
                stderr,
                streamed_input: None,
            })
        };
        events.push(chain.append(body, time.clone())?);
    }
    let key = NodeKey::generate();
    let mut log = MerkleLog::new();
    let index = log.push(chain.leaf().hash());
    let sth = key.sign_tree_head(log.size(), log.root(), rampart_audit::now());
    let proof = log.inclusion_proof(index, sth.tree_size)?;
    Ok(Bundle::assemble(id, events, blobs, index, proof, sth, key.public_key()).to_bytes())
}

/// `rampart bench --egress`: the egress proxy's added latency (see rampart_egress::bench).
fn run_egress(args: &BenchArgs) -> Result<()> {
    eprintln!(
        "bench: egress HTTPS latency ({} requests per path)...",
        args.iterations
    );
    let r = rampart_egress::bench::run(args.iterations).map_err(anyhow::Error::msg)?;
    println!("{}", r.report());
    if let Some(path) = &args.json {
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&json!({ "egress": r.to_json() }))?,
        )?;
    }
    Ok(())
}
