//! Template build steps and the network (tier 3, adversarial): a build step runs in a network
//! namespace of its own whose only way out is the egress proxy, under the spec's
//! `[build] network` policy (docs/templates.md, "Builds").
//!
//! The image is the host's dash and coreutils (`rampart_image::sample`) plus bash, `timeout`,
//! `dd`, `od`, `head` and `tr` copied in by a `copy` step; a `run` step then probes with
//! bash's `/dev/tcp` and `/dev/udp` and prints what it got, and the test reads the step's
//! output from `rampart template build --json`:
//!
//! - `sandbox_blocks_build_step_host_network`: a daemon runs on 127.0.0.1:<port> (on the
//!   build's data directory) and the test listens on the host's loopback and on the host's
//!   own address; the step tries the daemon's API, 169.254.169.254:80 and both listeners, and
//!   must reach none of them (the listeners count what they accepted).
//! - `build_network_none_and_registries`: with `network = "none"` DNS and TCP fail; with the
//!   default (`registries`), a name outside the registries gets NXDOMAIN from the build's
//!   resolver, and `pypi.org` resolves (that half is skipped, with the reason, when pypi.org
//!   is not reachable from this host).
//! - `apt_step_through_the_egress_proxy`: a `debian:bookworm` base (mmdebstrap, on the host)
//!   and an `apt` step installing `hello` over plain HTTP to deb.debian.org through the
//!   egress proxy (skipped, with the reason, without mmdebstrap or deb.debian.org).
//! - `failed_interrupted_and_killed_builds_leave_no_network`: a failing step, a step
//!   interrupted with SIGINT, and a build killed with SIGKILL inside a step (whose link and
//!   table the next build removes).
//!
//! After every build: no build sandbox, temp layer, cgroup, mount, link (`rbld*`) or nftables
//! table (`rampart_build_*`) is left. Needs root, `nft` and the `rampart-jailer` /
//! `rampart-agent` binaries next to `rampart`; otherwise it prints `skipped: <reason>`.

mod support;

use serde_json::Value;
use std::io::Write as _;
use std::net::{TcpListener, ToSocketAddrs as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{free_port, skip_reason, start, token};

/// Host programs the probe needs, copied into the image's `/usr/bin`.
const PROBE_TOOLS: &[&str] = &["bash", "timeout", "dd", "od", "head", "tr"];

fn rampart() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rampart"))
}

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_rampart"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Why this host cannot run these tests, if it cannot.
fn skip() -> Option<String> {
    if let Some(r) = skip_reason() {
        return Some(r);
    }
    if Command::new("nft").arg("--version").output().is_err() {
        return Some(
            "nft is not installed (Debian package nftables; scripts/setup-host.sh)".into(),
        );
    }
    for t in PROBE_TOOLS {
        if which(t).is_none() {
            return Some(format!("{t} is not installed on the host"));
        }
    }
    None
}

fn which(prog: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(prog))
        .find(|p| p.is_file())
}

/// Removes a test's directory when dropped (also when the test fails).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The build context: `image/` (sample OCI image) and `bin/` (the probe's tools).
fn make_context(ctx: &Path) {
    let bin = ctx.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let mut extra = vec![bin_dir().join("rampart-agent")];
    for t in PROBE_TOOLS {
        let src = which(t).unwrap();
        std::fs::copy(&src, bin.join(t)).unwrap();
        extra.push(src);
    }
    rampart_image::sample::write_host_image(&ctx.join("image"), &extra).unwrap();
}

/// Bash functions of the probe: `tcp NAME HOST PORT [REQUEST]` prints the first line it got
/// back (or the error), `dns NAME QUERY` sends a raw DNS query (printf escapes) to the
/// nameserver of /etc/resolv.conf and prints the first 8 bytes of the answer in hex.
const PROBE_LIB: &str = r#"
ns=127.0.0.1
if [ -r /etc/resolv.conf ]; then
  while read -r k v _; do [ "$k" = nameserver ] && ns=$v; done < /etc/resolv.conf
fi
echo "probe: nameserver $ns"
tcp() {
  out=$(timeout 8 bash -c 'exec 3<>"/dev/tcp/$1/$2" || exit 1; if [ -n "$3" ]; then printf "$3" >&3; fi; timeout 4 head -c 300 <&3' _ "$2" "$3" "$4" 2>&1 | tr -d '\r' | head -n 1)
  echo "probe: tcp $1: ${out:-<nothing>}"
}
dns() {
  out=$(timeout 6 bash -c 'exec 3<>"/dev/udp/$1/53" || exit 1; printf "$2" >&3; timeout 4 dd bs=1500 count=1 <&3 2>/dev/null | od -An -tx1 -N8' _ "$ns" "$2" 2>&1 | tr -s ' \n' '  ')
  echo "probe: dns $1: ${out:-<nothing>}"
}
"#;

/// A DNS query for `name` (type A, recursion desired) as printf escapes.
fn dns_query(name: &str) -> String {
    let mut b: Vec<u8> = vec![0x52, 0x4d, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for l in name.split('.') {
        b.push(l.len() as u8);
        b.extend_from_slice(l.as_bytes());
    }
    b.extend_from_slice(&[0, 0, 1, 0, 1]);
    b.iter().map(|x| format!("\\x{x:02x}")).collect()
}

/// Writes `spec.toml` (the copy step, the probe as a run step, `extra` TOML before the
/// steps) and the probe script into `ctx`.
fn write_spec(ctx: &Path, name: &str, extra: &str, probe: &str) -> PathBuf {
    std::fs::write(
        ctx.join("probe.sh"),
        format!("{PROBE_LIB}\n{probe}\nexit 0\n"),
    )
    .unwrap();
    let spec = format!(
        "name = \"{name}\"\nfrom = \"oci:image\"\n{extra}\n\
         [[steps]]\ncopy = {{ src = \"bin\", dest = \"/usr/bin\" }}\n\
         [[steps]]\ncopy = {{ src = \"probe.sh\", dest = \"/probe.sh\" }}\n\
         [[steps]]\nrun = \"/usr/bin/bash /probe.sh\"\n"
    );
    let f = ctx.join(format!("{name}.toml"));
    std::fs::write(&f, spec).unwrap();
    f
}

/// Runs `rampart template build --json --no-cache`; (exit code, the steps' output, stderr).
fn build(data: &Path, spec_file: &Path) -> (i32, String, String) {
    let o = rampart()
        .args(["template", "build", "--json", "--no-cache", "--data-dir"])
        .arg(data)
        .arg("-f")
        .arg(spec_file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let mut output = String::new();
    for l in stderr.lines() {
        if let Ok(v) = serde_json::from_str::<Value>(l) {
            if v["event"] == "output" {
                output.push_str(v["text"].as_str().unwrap_or(""));
            }
        }
    }
    (o.status.code().unwrap_or(-1), output, stderr)
}

/// The text after `probe: <what>: ` in the step's output.
fn probe_line<'a>(output: &'a str, what: &str) -> &'a str {
    let prefix = format!("probe: {what}: ");
    output
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no `{prefix}` line in the step's output:\n{output}"))
}

/// The answer bytes a `dns` probe printed (empty: no answer).
fn dns_answer(line: &str) -> Vec<u8> {
    line.split_whitespace()
        .map_while(|h| u8::from_str_radix(h, 16).ok())
        .collect()
}

/// A listener that sends `banner` to every connection and counts them.
fn listener(addr: &str, banner: &str) -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind(addr).unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let banner = format!("{banner}\n");
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            h.fetch_add(1, Ordering::SeqCst);
            let _ = c.write_all(banner.as_bytes());
        }
    });
    (port, hits)
}

/// The host's address on its default route (no packet is sent: a UDP connect only routes).
fn host_address() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// What a build must never leave: temp layers, build sandboxes, cgroups, mounts, build links
/// and build nftables tables.
fn assert_clean(data: &Path) {
    let images = data.join("images");
    let count = |p: &Path| std::fs::read_dir(p).map(|r| r.count()).unwrap_or(0);
    assert_eq!(count(&images.join("tmp")), 0, "images/tmp is not empty");
    assert_eq!(count(&images.join("build")), 0, "build sandboxes are left");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&images.to_string_lossy().into_owned()),
        "a mount under {} is left",
        images.display()
    );
}

/// Build links and tables: none may be left once no build runs. (Only called when this test
/// binary's builds are over; a build of another process could hold one meanwhile, so the
/// check waits a little for those.)
fn assert_no_build_network() {
    let links = || -> Vec<String> {
        std::fs::read_dir("/sys/class/net")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("rbld"))
            .collect()
    };
    let tables = || -> Vec<String> {
        let o = Command::new("nft")
            .args(["list", "tables"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains("rampart_build_"))
            .map(str::to_owned)
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (l, t) = (links(), tables());
        if l.is_empty() && t.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "build network left: links {l:?}, tables {t:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

static BUILDS: std::sync::Mutex<usize> = std::sync::Mutex::new(0);

/// Held shared by the tests whose builds may take any slot, exclusively by the one that
/// checks what a killed build leaves in its slot (so that no other build of this binary
/// takes that slot meanwhile).
static SLOTS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Counts this binary's running tests, so the last one checks the build network is gone.
struct Running;

impl Running {
    fn new() -> Running {
        *BUILDS.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        Running
    }
    /// Whether this is the only test still running.
    fn last(&self) -> bool {
        *BUILDS.lock().unwrap_or_else(|e| e.into_inner()) == 1
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        *BUILDS.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
    }
}

#[test]
fn sandbox_blocks_build_step_host_network() {
    if let Some(r) = skip() {
        eprintln!("skipped: {r}");
        return;
    }
    let _slots = SLOTS.read().unwrap_or_else(|e| e.into_inner());
    let running = Running::new();
    let root = std::env::temp_dir().join(format!("rampart-build-net-{}", token()));
    let _cleanup = RemoveOnDrop(root.clone());
    let data = root.join("data");
    let ctx = root.join("ctx");
    std::fs::create_dir_all(&data).unwrap();
    make_context(&ctx);
    // The daemon (API only: its own sandbox networks are not needed here).
    let api_port = free_port();
    let daemon = start(&data, api_port, &[("RAMPART_NET", "off")]);
    let banner = format!("host-service-{}", token());
    let (lo_port, lo_hits) = listener("127.0.0.1:0", &banner);
    let (any_port, any_hits) = listener("0.0.0.0:0", &banner);
    let host_ip = host_address();
    let mut probe = format!(
        "tcp api 127.0.0.1 {api_port} 'GET /health HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n'\n\
         tcp metadata 169.254.169.254 80 'GET /latest/meta-data/ HTTP/1.0\\r\\nMetadata: true\\r\\n\\r\\n'\n\
         tcp loopback 127.0.0.1 {lo_port}\n"
    );
    if let Some(ip) = host_ip {
        probe.push_str(&format!("tcp hostaddr {ip} {any_port}\n"));
    } else {
        eprintln!("note: the host has no default-route address; the host-address probe is skipped");
    }
    let spec = write_spec(&ctx, "attack", "", &probe);
    let (code, output, stderr) = build(&data, &spec);
    eprintln!("--- the step printed ---\n{output}--- end ---");
    assert_eq!(code, 0, "the build failed: {stderr}");
    let api = probe_line(&output, "tcp api");
    assert!(
        !api.contains("HTTP/"),
        "the build step reached the daemon's API on 127.0.0.1:{api_port}: {api}"
    );
    let md = probe_line(&output, "tcp metadata");
    assert!(
        !md.contains("HTTP/"),
        "the build step reached 169.254.169.254:80: {md}"
    );
    let lo = probe_line(&output, "tcp loopback");
    assert!(
        !lo.contains(&banner),
        "the build step reached the host's loopback service: {lo}"
    );
    assert_eq!(
        lo_hits.load(Ordering::SeqCst),
        0,
        "the loopback service was reached"
    );
    if host_ip.is_some() {
        let ha = probe_line(&output, "tcp hostaddr");
        assert!(
            !ha.contains(&banner),
            "the build step reached a service on the host's address: {ha}"
        );
        assert_eq!(
            any_hits.load(Ordering::SeqCst),
            0,
            "the host service was reached"
        );
    }
    // The daemon still answers (nothing of the build disturbed it).
    let health = support::client()
        .get(format!("{}/health", daemon.url))
        .send()
        .map(|r| r.status().as_u16());
    assert!(matches!(health, Ok(200)), "{health:?}");
    drop(daemon);
    assert_clean(&data);
    if running.last() {
        assert_no_build_network();
    }
}

#[test]
fn build_network_none_and_registries() {
    if let Some(r) = skip() {
        eprintln!("skipped: {r}");
        return;
    }
    let _slots = SLOTS.read().unwrap_or_else(|e| e.into_inner());
    let running = Running::new();
    let root = std::env::temp_dir().join(format!("rampart-build-net2-{}", token()));
    let _cleanup = RemoveOnDrop(root.clone());
    let data = root.join("data");
    let ctx = root.join("ctx");
    std::fs::create_dir_all(&data).unwrap();
    make_context(&ctx);
    let banner = format!("host-service-{}", token());
    let (any_port, any_hits) = listener("0.0.0.0:0", &banner);
    let target = host_address()
        .map(|ip| ip.to_string())
        .unwrap_or_else(|| "192.0.2.1".into());
    let outside = format!("not-a-registry-{}.example.com", token());

    // network = "none": no DNS, no TCP (the step has only its loopback).
    let spec = write_spec(
        &ctx,
        "none",
        "[build]\nnetwork = \"none\"\n",
        &format!(
            "dns pypi '{}'\ntcp out {target} {any_port}\n",
            dns_query("pypi.org")
        ),
    );
    let (code, output, stderr) = build(&data, &spec);
    eprintln!("--- network = \"none\": the step printed ---\n{output}--- end ---");
    assert_eq!(code, 0, "the build failed: {stderr}");
    let a = dns_answer(probe_line(&output, "dns pypi"));
    assert!(a.is_empty(), "DNS answered with network = none: {a:02x?}");
    let t = probe_line(&output, "tcp out");
    assert!(!t.contains(&banner), "TCP got out with network = none: {t}");
    assert_eq!(any_hits.load(Ordering::SeqCst), 0);
    assert_clean(&data);

    // The default (registries): a name outside them is NXDOMAIN from the build's resolver.
    let pypi_reachable = ("pypi.org", 443)
        .to_socket_addrs()
        .map_err(|e| format!("pypi.org does not resolve on this host: {e}"))
        .and_then(|mut a| {
            a.find(|a| std::net::TcpStream::connect_timeout(a, Duration::from_secs(5)).is_ok())
                .ok_or_else(|| "pypi.org:443 is unreachable from this host".to_owned())
        });
    let spec = write_spec(
        &ctx,
        "registries",
        "",
        &format!(
            "dns outside '{}'\ndns pypi '{}'\n",
            dns_query(&outside),
            dns_query("pypi.org")
        ),
    );
    let (code, output, stderr) = build(&data, &spec);
    eprintln!("--- network = \"registries\": the step printed ---\n{output}--- end ---");
    assert_eq!(code, 0, "the build failed: {stderr}");
    let a = dns_answer(probe_line(&output, "dns outside"));
    assert!(a.len() >= 8, "no DNS answer for {outside}: {a:02x?}");
    assert_eq!(a[3] & 0x0f, 3, "{outside}: not NXDOMAIN: {a:02x?}");
    assert!(
        output.contains(&format!("deny dns {outside}")),
        "the build's output does not show the resolver's refusal:\n{output}"
    );
    match pypi_reachable {
        Err(why) => eprintln!("skipped (pypi.org half): {why}"),
        Ok(_) => {
            let a = dns_answer(probe_line(&output, "dns pypi"));
            assert!(a.len() >= 8, "no DNS answer for pypi.org: {a:02x?}");
            assert_eq!(a[3] & 0x0f, 0, "pypi.org: rcode is not NOERROR: {a:02x?}");
            assert!(
                u16::from_be_bytes([a[6], a[7]]) > 0,
                "pypi.org: no answer records: {a:02x?}"
            );
        }
    }
    assert_clean(&data);
    if running.last() {
        assert_no_build_network();
    }
}

#[test]
fn apt_step_through_the_egress_proxy() {
    if let Some(r) = skip() {
        eprintln!("skipped: {r}");
        return;
    }
    if Command::new("mmdebstrap")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: mmdebstrap is not installed (scripts/setup-host.sh installs it)");
        return;
    }
    let reachable = ("deb.debian.org", 80)
        .to_socket_addrs()
        .map_err(|e| format!("deb.debian.org does not resolve: {e}"))
        .and_then(|mut a| {
            a.find(|a| std::net::TcpStream::connect_timeout(a, Duration::from_secs(5)).is_ok())
                .ok_or_else(|| "deb.debian.org:80 is unreachable".to_owned())
        });
    if let Err(r) = reachable {
        eprintln!("skipped: {r}");
        return;
    }
    let _slots = SLOTS.read().unwrap_or_else(|e| e.into_inner());
    let running = Running::new();
    let root = std::env::temp_dir().join(format!("rampart-build-net-apt-{}", token()));
    let _cleanup = RemoveOnDrop(root.clone());
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let spec = root.join("apt.toml");
    // The base comes from mmdebstrap on the host; the apt step runs in the build sandbox,
    // over plain HTTP to deb.debian.org through the egress proxy (the default network).
    std::fs::write(
        &spec,
        "name = \"apt-net\"\nfrom = \"debian:bookworm\"\n[debian]\nvariant = \"minbase\"\n\
         [[steps]]\napt = [\"hello\"]\n[[steps]]\nrun = \"hello\"\n",
    )
    .unwrap();
    let (code, output, stderr) = build(&data, &spec);
    let tail: String = {
        let lines: Vec<&str> = output.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    eprintln!("--- the steps printed (last lines) ---\n{tail}\n--- end ---");
    assert_eq!(code, 0, "the build failed: {stderr}");
    assert!(output.contains("Hello, world!"), "{tail}");
    assert_clean(&data);
    if running.last() {
        assert_no_build_network();
    }
}

/// Starts `rampart template build --json` and reads its stderr until the step printed
/// `sleeping` (it is then inside its run step, with its network set up).
fn build_until_sleeping(
    data: &Path,
    spec_file: &Path,
) -> (
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStderr>>,
) {
    use std::io::BufRead as _;
    let mut child = rampart()
        .args(["template", "build", "--json", "--no-cache", "--data-dir"])
        .arg(data)
        .arg("-f")
        .arg(spec_file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        let l = lines
            .next()
            .expect("the build ended before its run step")
            .unwrap();
        if l.contains("\"event\":\"output\"") && l.contains("sleeping") {
            break;
        }
    }
    (child, lines)
}

/// The build links and tables that exist now.
fn build_network_now() -> (Vec<String>, Vec<String>) {
    let links = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("rbld"))
        .collect();
    let o = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    let tables = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("rampart_build_"))
        .map(str::to_owned)
        .collect();
    (links, tables)
}

#[test]
fn failed_interrupted_and_killed_builds_leave_no_network() {
    if let Some(r) = skip() {
        eprintln!("skipped: {r}");
        return;
    }
    let _slots = SLOTS.write().unwrap_or_else(|e| e.into_inner());
    let running = Running::new();
    let root = std::env::temp_dir().join(format!("rampart-build-net-kill-{}", token()));
    let _cleanup = RemoveOnDrop(root.clone());
    let data = root.join("data");
    let ctx = root.join("ctx");
    std::fs::create_dir_all(&data).unwrap();
    make_context(&ctx);
    // A step that fails: its network goes with it.
    let spec = write_spec(&ctx, "fails", "", "echo failing; exit 3");
    let (code, _, stderr) = build(&data, &spec);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("exited with status 3"), "{stderr}");
    assert_clean(&data);
    // Interrupted (SIGINT) inside a networked step.
    let spec = write_spec(&ctx, "sleeps", "", "echo sleeping; exec sleep 1000");
    let (mut child, _lines) = build_until_sleeping(&data, &spec);
    let (links, tables) = build_network_now();
    assert!(
        !links.is_empty() && !tables.is_empty(),
        "no build network while the step runs: {links:?} {tables:?}"
    );
    // SAFETY: kill(2) on the pid of the build this test spawned (not yet reaped).
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(130), "{st:?}");
    assert_clean(&data);
    // Killed (SIGKILL) inside a networked step: its sandbox, link and table are left ...
    let (mut child, _lines) = build_until_sleeping(&data, &spec);
    let (before_links, before_tables) = build_network_now();
    let _ = child.kill();
    let _ = child.wait();
    let (links, tables) = build_network_now();
    let left_link: Vec<&String> = links.iter().filter(|l| before_links.contains(l)).collect();
    let left_table: Vec<&String> = tables
        .iter()
        .filter(|t| before_tables.contains(t))
        .collect();
    // (Its sandbox outlives it, and so does its link; the table always stays.)
    eprintln!("left by the killed build: links {left_link:?}, tables {left_table:?}");
    assert!(
        !left_table.is_empty(),
        "a killed build is expected to leave its table: {tables:?}"
    );
    // ... and the next build (any data directory would do) removes them.
    let spec = write_spec(&ctx, "after", "[build]\nnetwork = \"none\"\n", "echo after");
    let (code, output, stderr) = build(&data, &spec);
    assert_eq!(code, 0, "{stderr}");
    assert!(output.contains("after"), "{output}");
    assert_clean(&data);
    let (links, tables) = build_network_now();
    for l in left_link {
        assert!(
            !links.contains(l),
            "the killed build's link {l} is still there"
        );
    }
    for t in left_table {
        assert!(
            !tables.contains(t),
            "the killed build's table {t} is still there"
        );
    }
    if running.last() {
        assert_no_build_network();
    }
}
