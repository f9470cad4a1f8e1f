//! E2B network options (`network=SandboxNetworkOpts(...)`, `allow_internet_access`,
//! `update_network`) driven by the unmodified `e2b==2.63.0` SDK (sync and async,
//! `tests/e2b/network.py`) against a real daemon whose sandboxes reach a test internet in a
//! network namespace this test makes, never the real one: a DNS server for
//! `*.e2bnet.test` and, as hosts A and B, HTTP on 80 and HTTPS on 443 (a test CA the daemon
//! trusts upstream) answering any path and logging each request's headers to a file outside
//! every sandbox, where the script checks what the proxy injected.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{start_tidy_with, target_dir, wait_until, workspace, TableGuard, TestNetns};

const HOST_A: &str = "a.e2bnet.test";
const HOST_B: &str = "b.e2bnet.test";
const HOST_SIDE: &str = "198.51.100.1";
const ADDR_A: &str = "198.51.100.2";
const ADDR_B: &str = "198.51.100.3";

fn skip() -> Option<String> {
    if let Some(r) = support::skip_reason() {
        return Some(r);
    }
    for (bin, arg) in [
        ("nft", "--version"),
        ("openssl", "version"),
        ("python3", "--version"),
        ("ip", "-V"),
    ] {
        if Command::new(bin).arg(arg).output().is_err() {
            return Some(format!("{bin} is not installed"));
        }
    }
    support::venv_lacks(
        &support::venv_python("RAMPART_E2B_VENV", "e2b-venv"),
        "e2b, httpx",
        "scripts/test makes it",
    )
}

/// Makes the test CA and a certificate for both names; returns (ca, cert, key).
fn make_pki(dir: &Path) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let run = |args: &[&str]| -> Option<()> {
        let o = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()?;
        o.status.success().then_some(())
    };
    std::fs::write(
        dir.join("ext.cnf"),
        format!(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{HOST_A},DNS:{HOST_B}\n"
        ),
    )
    .ok()?;
    let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    let ec: Vec<&str> = ec.split(' ').collect();
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=rampart e2b network test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    ]
    .concat())?;
    run(&[
        &["req"][..],
        &ec,
        &[
            "-keyout",
            "srv.key",
            "-out",
            "srv.csr",
            "-subj",
            &format!("/CN={HOST_A}"),
        ],
    ]
    .concat())?;
    run(&[
        "x509",
        "-req",
        "-in",
        "srv.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "srv.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ])?;
    Some((dir.join("ca.pem"), dir.join("srv.pem"), dir.join("srv.key")))
}

/// DNS for the two names, and HTTP (80) and HTTPS (443) on both addresses answering 200 to
/// any GET, logging `{"path", "headers"}` per request; a SOCKS5 proxy (user `u`, password
/// `p`) on A's 1080, and the same over TLS (A's certificate) on 1443, logging each tunnel as
/// `{"path": "<socks>", "headers": [["target", ...], ["user", ...], ["tls", ...]]}`.
const SERVERS: &str = r#"
import http.server, json, socket, ssl, struct, sys, threading
log, cert, key, a, b = sys.argv[1:6]
names = {"a.e2bnet.test.": a, "b.e2bnet.test.": b}
def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((a, 53))
    while True:
        q, peer = s.recvfrom(4096)
        try:
            i, labels = 12, []
            while q[i] != 0:
                n = q[i]; labels.append(q[i + 1:i + 1 + n].decode().lower()); i += 1 + n
            qtype, _ = struct.unpack(">HH", q[i + 1:i + 5]); question = q[12:i + 5]
        except Exception:
            continue
        ip = names.get(".".join(labels) + ".")
        an = 1 if ip is not None and qtype == 1 else 0
        flags = 0x8180 if ip is not None else 0x8183
        r = q[:2] + struct.pack(">HHHHH", flags, 1, an, 0, 0) + question
        if an:
            r += b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(ip)
        s.sendto(r, peer)
lock = threading.Lock()
class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        with lock, open(log, "a") as f:
            f.write(json.dumps({"path": self.path, "headers": list(self.headers.items())}) + "\n")
        b = b"ok\n"
        self.send_response(200); self.send_header("Content-Length", str(len(b)))
        self.end_headers(); self.wfile.write(b)
    def log_message(self, *x):
        pass
threading.Thread(target=dns, daemon=True).start()
def exact(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
def pipe(x, y):
    try:
        while True:
            d = x.recv(65536)
            if not d:
                break
            y.sendall(d)
    except Exception:
        pass
    for s in (x, y):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except Exception:
            pass
def socks(c, tls):
    try:
        ver, n = exact(c, 2)
        methods = exact(c, n)
        if 2 not in methods:
            c.sendall(b"\x05\xff"); return
        c.sendall(b"\x05\x02")
        _, ul = exact(c, 2); user = exact(c, ul); pl = exact(c, 1)[0]; pw = exact(c, pl)
        if (user, pw) != (b"u", b"p"):
            c.sendall(b"\x01\x01"); return
        c.sendall(b"\x01\x00")
        _, cmd, _, atyp = exact(c, 4)
        if atyp == 1:
            host = socket.inet_ntoa(exact(c, 4))
        elif atyp == 4:
            host = socket.inet_ntop(socket.AF_INET6, exact(c, 16))
        else:
            host = exact(c, exact(c, 1)[0]).decode()
        port = struct.unpack(">H", exact(c, 2))[0]
        with lock, open(log, "a") as f:
            f.write(json.dumps({"path": "<socks>", "headers": [["target", f"{host}:{port}"], ["user", user.decode()], ["tls", "1" if tls else "0"]]}) + "\n")
        up = socket.create_connection((host, port), timeout=5)
        c.sendall(b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00")
        threading.Thread(target=pipe, args=(up, c), daemon=True).start()
        pipe(c, up)
    except Exception:
        pass
def socks_server(port, tls):
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((a, port)); l.listen(64)
    while True:
        c, _ = l.accept()
        if tls:
            try:
                c = ctx.wrap_socket(c, server_side=True)
            except Exception:
                continue
        threading.Thread(target=socks, args=(c, tls), daemon=True).start()
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
threading.Thread(target=socks_server, args=(1080, False), daemon=True).start()
threading.Thread(target=socks_server, args=(1443, True), daemon=True).start()
ctx.set_alpn_protocols(["http/1.1"])
class Tls(http.server.ThreadingHTTPServer):
    def get_request(self):
        conn, addr = self.socket.accept()
        return ctx.wrap_socket(conn, server_side=True, do_handshake_on_connect=False), addr
servers = [Tls(("0.0.0.0", 443), Echo), http.server.ThreadingHTTPServer(("0.0.0.0", 80), Echo)]
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("ready", flush=True)
servers[0].serve_forever()
"#;

struct Internet {
    server: Option<Child>,
    log: PathBuf,
    _netns: TestNetns,
}

impl Internet {
    fn start(dir: &Path, cert: &Path, key: &Path) -> Option<Internet> {
        let ns = format!("rst-e2bn-{}", std::process::id());
        let link = format!("xe2n{}", std::process::id() % 100_000);
        let netns = TestNetns::new(
            &ns,
            &link,
            &format!("{HOST_SIDE}/29"),
            &[&format!("{ADDR_A}/29"), &format!("{ADDR_B}/29")],
        )?;
        let mut h = Internet {
            server: None,
            log: dir.join("requests.jsonl"),
            _netns: netns,
        };
        let script = dir.join("servers.py");
        std::fs::write(&script, SERVERS).ok()?;
        std::fs::write(&h.log, "").ok()?;
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, "python3"])
            .arg(&script)
            .arg(&h.log)
            .arg(cert)
            .arg(key)
            .args([ADDR_A, ADDR_B])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("servers.err")).ok()?)
            .spawn()
            .ok()?;
        h.server = Some(child);
        for (addr, port) in [(ADDR_B, 80), (ADDR_B, 443), (ADDR_A, 1080), (ADDR_A, 1443)] {
            wait_until("the test internet's servers accept", 30, || {
                std::net::TcpStream::connect_timeout(
                    &format!("{addr}:{port}").parse().unwrap(),
                    Duration::from_millis(200),
                )
                .is_ok()
            });
        }
        Some(h)
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn e2b_network_options_on_the_egress_policy() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some((ca, cert, key)) = make_pki(tmp.path()) else {
        eprintln!("skipped: openssl could not make the test CA");
        return;
    };
    let Some(inet) = Internet::start(tmp.path(), &cert, &key) else {
        eprintln!("skipped: could not make the test internet (ip netns)");
        return;
    };
    let t = (std::process::id().wrapping_mul(11) + 5) % 250;
    let table = format!("rampart_e2bn_{}", std::process::id());
    let _table = TableGuard(table.clone());
    let pool = format!("10.252.{t}.0/24");
    let prefix = format!("re{t}n");
    let upstream_dns = format!("{ADDR_A}:53");
    let roots = ca.to_string_lossy().into_owned();
    let d = start_tidy_with(
        "e2b-net",
        &[
            ("RAMPART_NET_POOL", pool.as_str()),
            ("RAMPART_NET_LINK_PREFIX", prefix.as_str()),
            ("RAMPART_NET_TABLE", table.as_str()),
            ("RAMPART_NET_DNS_PORT", "0"),
            ("RAMPART_NET_PROXY_PORT", "0"),
            ("RAMPART_NET_UPSTREAM_DNS", upstream_dns.as_str()),
            ("RAMPART_NET_UPSTREAM_ROOTS", roots.as_str()),
            // The test internet's SOCKS5 proxies (sandboxes' `egress_proxy`).
            ("RAMPART_NET_PROXY_ALLOW", "198.51.100.0/24"),
        ],
    );
    let key = std::fs::read_to_string(d.data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();
    let tests = workspace().join("tests/e2b");
    let py = support::venv_python("RAMPART_E2B_VENV", "e2b-venv");
    let out = Command::new(&py)
        .arg(tests.join("network.py"))
        .current_dir(&tests)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(
            "HOME",
            std::env::var_os("HOME").unwrap_or_else(|| "/root".into()),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("E2B_API_KEY", &key)
        .env("E2B_API_URL", &d.url)
        .env("E2B_SANDBOX_URL", &d.url)
        .env("E2B_NET_HOST_A", HOST_A)
        .env("E2B_NET_HOST_B", HOST_B)
        .env("E2B_NET_ADDR_A", ADDR_A)
        .env("E2B_NET_ADDR_B", ADDR_B)
        .env("E2B_NET_LOG", &inet.log)
        .stdin(Stdio::null())
        .output()
        .expect("run tests/e2b/network.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "--- network.py ---\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut failed: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with("FAIL "))
        .map(str::to_owned)
        .collect();
    assert!(stdout.contains("SUMMARY "), "network.py did not finish");
    let mut passed = stdout.lines().filter(|l| l.starts_with("PASS ")).count();

    // The JS SDK from npm, when scripts/test installed it.
    let node = std::env::var_os("RAMPART_E2B_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("e2b-node"));
    if node.join("node_modules/e2b").is_dir() {
        // ESM resolves `e2b` from the script's own directory: run a copy placed there.
        let script = node.join("rampart-network-test.mjs");
        std::fs::copy(tests.join("network.mjs"), &script).unwrap();
        let out = Command::new("node")
            .arg(&script)
            .current_dir(&node)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(
                "HOME",
                std::env::var_os("HOME").unwrap_or_else(|| "/root".into()),
            )
            .env("E2B_API_KEY", &key)
            .env("E2B_API_URL", &d.url)
            .env("E2B_SANDBOX_URL", &d.url)
            .env("E2B_NET_HOST_A", HOST_A)
            .env("E2B_NET_HOST_B", HOST_B)
            .env("E2B_NET_LOG", &inet.log)
            .stdin(Stdio::null())
            .output()
            .expect("run tests/e2b/network.mjs");
        let js = String::from_utf8_lossy(&out.stdout);
        eprintln!(
            "--- network.mjs ---\n{js}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(js.contains("SUMMARY "), "network.mjs did not finish");
        failed.extend(
            js.lines()
                .filter(|l| l.starts_with("FAIL "))
                .map(str::to_owned),
        );
        passed += js.lines().filter(|l| l.starts_with("PASS ")).count();
    } else {
        eprintln!(
            "JS SDK skipped: no {}",
            node.join("node_modules/e2b").display()
        );
    }
    assert!(failed.is_empty(), "failed:\n{}", failed.join("\n"));
    assert!(passed >= 8, "only {passed} passed");
    eprintln!("passed: {passed}");
}
