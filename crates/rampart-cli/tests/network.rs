//! Sandbox networks end to end: a real daemon, real sandboxes with a network, a test
//! "internet" host in a network namespace the test makes (198.51.100.0/24), and the leak
//! test (200 networked sandboxes with a `kill -9` of the daemon in the middle).
//!
//! Each daemon gets its own address pool, link prefix, nftables table and egress ports, so
//! these tests run next to any other daemon on the host.

mod support;

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::{TcpListener, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{
    client, free_port, skip_reason, start, wait_until, Daemon, Sandbox, TableGuard, TestNetns,
};

fn skip() -> bool {
    if let Some(r) = skip_reason() {
        eprintln!("SKIP: {r}");
        return true;
    }
    if Command::new("nft").arg("--version").output().is_err() {
        eprintln!("SKIP: nft (Debian package nftables) is not installed");
        return true;
    }
    false
}

/// The network identity of one test daemon.
struct NetEnv {
    pool: String,
    prefix: String,
    table: String,
}

impl NetEnv {
    fn new(n: u32) -> NetEnv {
        let t = (std::process::id().wrapping_mul(13) + n * 101) % 250;
        NetEnv {
            pool: format!("10.252.{t}.0/24"),
            prefix: format!("rc{t}z"),
            table: format!("rampart_cli_{}_{n}", std::process::id()),
        }
    }
    fn envs(&self) -> Vec<(&str, &str)> {
        vec![
            ("RAMPART_NET_POOL", self.pool.as_str()),
            ("RAMPART_NET_LINK_PREFIX", self.prefix.as_str()),
            ("RAMPART_NET_TABLE", self.table.as_str()),
            ("RAMPART_NET_DNS_PORT", "0"),
            ("RAMPART_NET_PROXY_PORT", "0"),
            ("RAMPART_JAIL_POOL", "0"),
        ]
    }
    fn links(&self) -> Vec<String> {
        std::fs::read_dir("/sys/class/net")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&self.prefix))
            .collect()
    }
    fn table_json(&self) -> Option<String> {
        let o = Command::new("nft")
            .args(["-j", "list", "table", "inet", &self.table])
            .output()
            .ok()?;
        o.status.success().then(|| strip_handles(&o.stdout))
    }
    fn remove_table(&self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

/// nft JSON without the volatile `handle` numbers and metainfo.
fn strip_handles(out: &[u8]) -> String {
    let mut v: Value = serde_json::from_slice(out).unwrap_or(Value::Null);
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("handle");
                m.remove("metainfo");
                for x in m.values_mut() {
                    walk(x);
                }
            }
            Value::Array(a) => {
                a.retain(|x| x.get("metainfo").is_none());
                for x in a {
                    walk(x);
                }
            }
            _ => {}
        }
    }
    walk(&mut v);
    v.to_string()
}

fn create(d: &Daemon, network: Value) -> Sandbox {
    Sandbox::create(d, json!({ "network": network, "timeout_secs": 600 }))
}

/// Runs `sh -c script` in a sandbox: (exit code, stdout).
fn sh(sb: &Sandbox, script: &str) -> (i64, String) {
    let v = sb.exec(json!({ "cmd": ["sh", "-c", script], "timeout_secs": 30 }));
    let out = v["stdout"].as_str().unwrap_or_default().to_owned();
    (v["exit_code"].as_i64().unwrap_or(-1), out)
}

/// A test "internet" host: a network namespace with an HTTP server on 198.51.100.2:8080,
/// linked to the host (198.51.100.1/30). Removed on drop.
struct InternetHost {
    server: Option<Child>,
    _netns: TestNetns,
}

impl InternetHost {
    fn start() -> Option<InternetHost> {
        let ns = format!("rnt-inet-{}", std::process::id());
        let link = format!("xinet{}", std::process::id() % 100_000);
        let mut h = InternetHost {
            server: None,
            _netns: TestNetns::new(&ns, &link, "198.51.100.1/30", &["198.51.100.2/30"])?,
        };
        let dir = tempfile::tempdir().unwrap().keep();
        std::fs::write(dir.join("index.html"), "hello from the test internet\n").unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-m", "http.server", "8080"])
            .args(["--bind", "198.51.100.2"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        h.server = Some(child);
        wait_until("the test internet's server answers", 30, || {
            std::net::TcpStream::connect_timeout(
                &"198.51.100.2:8080".parse().unwrap(),
                Duration::from_millis(200),
            )
            .is_ok()
        });
        Some(h)
    }
}

impl Drop for InternetHost {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The host's first global IPv4 address outside the test ranges.
fn host_ipv4() -> Option<String> {
    let o = Command::new("ip")
        .args(["-j", "-4", "addr"])
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&o.stdout).ok()?;
    for l in v.as_array()? {
        for a in l["addr_info"].as_array()? {
            let ip = a["local"].as_str()?;
            if a["scope"] == "global" && !ip.starts_with("10.25") && !ip.starts_with("198.51.") {
                return Some(ip.to_owned());
            }
        }
    }
    None
}

#[test]
fn sandbox_network_is_confined() {
    if skip() {
        return;
    }
    let net = NetEnv::new(1);
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let _table = TableGuard(net.table.clone());
    let d = start(&data, free_port(), &net.envs());
    let inet = InternetHost::start();

    // Host services: a TCP server and a UDP socket on every host address.
    let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    tcp.set_nonblocking(true).unwrap();
    let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    udp.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();

    let a = create(
        &d,
        json!({"mode": "allowlist", "allow": ["198.51.100.0/24"]}),
    );
    let b = create(&d, json!({"mode": "allowlist"}));
    let info: Value = client()
        .get(a.url("/network"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let addr = info["address"].as_str().unwrap().to_owned();
    let gw = info["gateway"].as_str().unwrap().to_owned();
    let b_addr: Value = client()
        .get(b.url("/network"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let b_addr = b_addr["address"].as_str().unwrap().to_owned();

    // eth0 with its address, a default route via the gateway, resolv.conf on the gateway.
    let (_, out) = sh(
        &a,
        "ip -4 -o addr show eth0; ip -4 route; cat /etc/resolv.conf",
    );
    assert!(out.contains(&format!("{addr}/31")), "{out}");
    assert!(out.contains(&format!("default via {gw}")), "{out}");
    assert!(out.contains(&format!("nameserver {gw}")), "{out}");
    let (_, v6) = sh(&a, "ip -6 addr show eth0");
    assert!(!v6.contains("inet6"), "IPv6 inside: {v6}");

    // A server in B, reachable from B itself.
    let (_, _) = sh(&b,
        "cd /tmp && echo secret-of-b > index.html && (python3 -m http.server 8000 >/dev/null 2>&1 &) ; \
         for i in $(seq 50); do curl -s -m1 http://127.0.0.1:8000/ >/dev/null && break; sleep 0.1; done",
    );
    let (_, own) = sh(&b, "curl -s -m 3 http://127.0.0.1:8000/");
    assert!(own.contains("secret-of-b"), "B's own server: {own}");

    // What A must not reach: the host (gateway and its other address), the daemon's API,
    // metadata, the other sandbox.
    let mut targets = vec![
        format!("http://{gw}:{tcp_port}/"),
        format!("http://{b_addr}:8000/"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        format!("http://{gw}:{}/health", d.url.rsplit(':').next().unwrap()),
    ];
    if let Some(h) = host_ipv4() {
        targets.push(format!("http://{h}:{tcp_port}/"));
        targets.push(format!(
            "http://{h}:{}/health",
            d.url.rsplit(':').next().unwrap()
        ));
    }
    for t in &targets {
        let (code, out) = sh(&a, &format!("curl -s -m 3 {t}"));
        assert!(
            code != 0 && out.is_empty(),
            "{t} reachable from a sandbox: {code} {out}"
        );
    }
    // Nothing arrived at the host's TCP server.
    assert!(
        tcp.accept().is_err(),
        "a sandbox connected to a host service"
    );

    // UDP and ICMP out: nothing arrives, ping fails.
    sh(&a,
        &format!(
            "for i in 1 2 3; do echo leak > /dev/udp/{gw}/{udp_port}; echo leak > /dev/udp/198.51.100.2/{udp_port}; done"
        ),
    );
    let mut buf = [0u8; 64];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "UDP from a sandbox reached the host"
    );
    let (code, _) = sh(
        &a,
        &format!("ping -c1 -W1 {gw} || ping -c1 -W1 198.51.100.2"),
    );
    assert_ne!(code, 0, "ICMP out of a sandbox");

    if let Some(_inet) = &inet {
        // Through the proxy, an allowed raw destination works...
        let (code, out) = sh(&a, "curl -s -m 5 http://198.51.100.2:8080/");
        assert!(out.contains("hello from the test internet"), "{code} {out}");
        // ...and is denied once the policy no longer allows it (PUT applies at once).
        let r = client()
            .put(a.url("/network"))
            .json(&json!({"mode": "allowlist", "allow": []}))
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        let (_, out) = sh(&a, "curl -s -m 3 http://198.51.100.2:8080/");
        assert!(!out.contains("hello"), "{out}");
        // B never had it.
        let (_, out) = sh(&b, "curl -s -m 3 http://198.51.100.2:8080/");
        assert!(!out.contains("hello"), "{out}");
        // The log says why.
        let log: Value = client()
            .get(a.url("/network/log"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let entries = log["entries"].as_array().unwrap();
        assert!(entries.iter().any(|e| e["verdict"] == "allow"), "{log}");
        assert!(entries.iter().any(|e| e["verdict"] == "deny"), "{log}");
        // The audit record has the policy it was created with and the change.
        let audit = client()
            .get(a.url("/audit"))
            .send()
            .unwrap()
            .text()
            .unwrap();
        assert!(audit.contains("policy_changed"), "{audit}");
        assert!(audit.contains("198.51.100.0/24"), "{audit}");
    } else {
        eprintln!("note: no test internet host (ip netns failed); proxy path not exercised");
    }

    // Secrets: a placeholder in the environment, the egress CA in the trust store, and the
    // value nowhere in what the sandbox sees.
    let sec = Sandbox::create(
        &d,
        json!({
            "network": {"mode": "allowlist", "allow": ["api.example.com"]},
            "secrets": [{"name": "tok", "value": "s3cr3t-value-42", "hosts": ["api.example.com"],
                         "inject": {"kind": "header", "name": "Authorization",
                                    "template": "Bearer {value}"},
                         "env": "TOK"}],
        }),
    );
    let (_, out) = sh(
        &sec,
        "echo \"tok=$TOK\"; echo \"ssl=$SSL_CERT_FILE\"; \
         tail -c 2000 /etc/ssl/certs/ca-certificates.crt | grep -c 'BEGIN CERTIFICATE'; \
         head -1 /usr/local/share/ca-certificates/rampart-egress.crt; \
         env; cat /etc/resolv.conf",
    );
    assert!(out.contains("tok=rampart-secret-"), "{out}");
    assert!(
        out.contains("ssl=/etc/ssl/certs/ca-certificates.crt"),
        "{out}"
    );
    assert!(out.contains("-----BEGIN CERTIFICATE-----"), "{out}");
    assert!(
        !out.contains("s3cr3t-value-42"),
        "the secret value is inside: {out}"
    );
    sec.destroy();

    // Mode none: no eth0 at all.
    let c = create(&d, json!({"mode": "none"}));
    let (_, links) = sh(&c, "ls /sys/class/net");
    assert_eq!(links.split_whitespace().collect::<Vec<_>>(), vec!["lo"]);

    for sb in [&a, &b, &c] {
        sb.destroy();
    }
    assert!(net.links().is_empty(), "links left: {:?}", net.links());
    // A clean stop with no networked sandbox alive removes the table too.
    assert!(net.table_json().is_some());
    let mut d = d;
    // SAFETY: kill(2) on the pid of the daemon this test spawned (not yet reaped).
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    let _ = d.child.wait();
    assert!(
        net.table_json().is_none(),
        "the table stayed after a clean stop"
    );
    drop(d);
}

/// A snapshot of what the host's network looks like, limited to what a daemon with `net`
/// could have made (other tests change the rest of the host at the same time).
fn ours(net: &NetEnv) -> (Vec<String>, Vec<String>, Vec<String>) {
    let pool_prefix = net.pool.rsplit_once('.').unwrap().0.to_owned() + ".";
    let json = |args: &[&str]| -> Value {
        let o = Command::new("ip").args(args).output().unwrap();
        serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
    };
    let links: Vec<String> = json(&["-j", "link"])
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
        .filter(|n| n.starts_with(&net.prefix))
        .collect();
    let addrs: Vec<String> = json(&["-j", "addr"])
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a["local"].as_str().map(str::to_owned))
        .filter(|a| a.starts_with(&pool_prefix))
        .collect();
    let routes: Vec<String> = json(&["-j", "route"])
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| r.to_string())
        .filter(|r| r.contains(&pool_prefix) || r.contains(&net.prefix))
        .collect();
    (links, addrs, routes)
}

fn nft_tables() -> BTreeSet<String> {
    let o = Command::new("nft")
        .args(["-j", "list", "tables"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    v["nftables"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|t| {
            let t = t.get("table")?;
            Some(format!("{} {}", t["family"].as_str()?, t["name"].as_str()?))
        })
        .collect()
}

fn sandboxes_alive(d: &Daemon) -> Vec<String> {
    let v: Value = client()
        .get(format!("{}/v1/sandboxes", d.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    v.as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|s| s["id"].as_str().map(str::to_owned))
        .collect()
}

/// Creates and destroys `n` networked sandboxes, `threads` at a time.
fn churn(d: &Daemon, n: usize, threads: usize) {
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for _ in (t..n).step_by(threads) {
                    create(d, json!({"mode": "allowlist"})).destroy();
                }
            });
        }
    });
}

#[test]
fn networked_sandboxes_leak_nothing_across_kill_9() {
    if skip() {
        return;
    }
    let net = NetEnv::new(2);
    let before = ours(&net);
    let tables_before = nft_tables();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let port = free_port();
    let _table = TableGuard(net.table.clone());
    let mut d = start(&data, port, &net.envs());
    let table = net.table_json().expect("the daemon's table is loaded");

    churn(&d, 100, 4);
    // Some alive, some being created, when the daemon dies.
    let alive: Vec<Sandbox> = (0..6)
        .map(|_| create(&d, json!({"mode": "allowlist"})))
        .collect();
    let url = d.url.clone();
    let inflight: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let _ = client()
                    .post(format!("{url}/v1/sandboxes"))
                    .json(&json!({"network": {"mode": "allowlist"}}))
                    .send();
            })
        })
        .collect();
    // SIGKILL (by pid: the harness's child).
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    for t in inflight {
        let _ = t.join();
    }
    assert_eq!(
        net.table_json().as_deref(),
        Some(table.as_str()),
        "the table stays"
    );

    // Restart: the live ones work again, the rest is cleaned.
    drop(d);
    let d = start(&data, port, &net.envs());
    // Replaced at start (same rules; the egress ports here are picked at random).
    let table = net
        .table_json()
        .expect("the daemon's table is loaded again");
    let now: BTreeSet<String> = sandboxes_alive(&d).into_iter().collect();
    for sb in &alive {
        let id = &sb.id;
        assert!(now.contains(id), "{id} was not re-attached");
    }
    let (_, out) = sh(&alive[0], "ip -4 -o addr show eth0");
    assert!(out.contains("/31"), "{out}");
    wait_until("only the re-attached sandboxes have links", 30, || {
        net.links().len() == now.len()
    });
    for id in &now {
        Sandbox::adopt(&d, id).destroy();
    }
    churn(&d, 100 - alive.len(), 4);
    assert!(net.links().is_empty(), "links left: {:?}", net.links());
    assert_eq!(
        net.table_json().as_deref(),
        Some(table.as_str()),
        "no per-sandbox rules"
    );
    drop(d);

    // The table is the daemon's and stays while sandboxes may run; removing it, the host is
    // as before.
    net.remove_table();
    assert_eq!(ours(&net), before, "links, addresses or routes left behind");
    let tables_after = nft_tables();
    let ours_left: Vec<_> = tables_after
        .difference(&tables_before)
        .filter(|t| t.contains(&net.table))
        .collect();
    assert!(ours_left.is_empty(), "{ours_left:?}");
    // Every egress state directory went with its sandbox.
    let egress = data.join("egress");
    let left: Vec<_> = std::fs::read_dir(&egress)
        .map(|r| r.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "egress state left: {left:?}");
}
