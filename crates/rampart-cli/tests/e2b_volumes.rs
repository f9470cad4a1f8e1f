//! E2B volumes and secrets driven by the unmodified SDKs (`e2b==2.63.0` from PyPI,
//! `tests/e2b/volumes.py`; npm `e2b`, `tests/e2b/volumes.mjs`) against a real daemon:
//! `Volume` (create, list, get_info, destroy), its file API (`E2B_VOLUME_API_URL` set to the
//! daemon), `volume_mounts` at create, traversal attempts (`..`, symlinks made inside the
//! volume pointing at a host file this test made), and `Secret` used by a sandbox through a
//! `network.rules` placeholder, checked on a test host in a network namespace this test
//! makes (DNS for `*.e2bvol.test` and HTTP on 80 logging each request's headers to a file
//! outside every sandbox), never the internet.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{start_tidy_with, target_dir, wait_until, workspace, TableGuard, TestNetns};

const HOST: &str = "api.e2bvol.test";
const HOST_SIDE: &str = "198.51.100.9";
const ADDR: &str = "198.51.100.10";

fn skip() -> Option<String> {
    if let Some(r) = support::skip_reason() {
        return Some(r);
    }
    for (bin, arg) in [("nft", "--version"), ("python3", "--version"), ("ip", "-V")] {
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

/// DNS for the test name, and HTTP on 80 answering 200 to any GET, logging
/// `{"path", "headers"}` per request.
const SERVERS: &str = r#"
import http.server, json, socket, struct, sys, threading
log, addr, host = sys.argv[1:4]
def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    while True:
        q, peer = s.recvfrom(4096)
        try:
            i, labels = 12, []
            while q[i] != 0:
                n = q[i]; labels.append(q[i + 1:i + 1 + n].decode().lower()); i += 1 + n
            qtype, _ = struct.unpack(">HH", q[i + 1:i + 5]); question = q[12:i + 5]
        except Exception:
            continue
        found = ".".join(labels) == host
        an = 1 if found and qtype == 1 else 0
        flags = 0x8180 if found else 0x8183
        r = q[:2] + struct.pack(">HHHHH", flags, 1, an, 0, 0) + question
        if an:
            r += b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(addr)
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
print("ready", flush=True)
http.server.ThreadingHTTPServer(("0.0.0.0", 80), Echo).serve_forever()
"#;

struct TestHost {
    server: Option<Child>,
    log: PathBuf,
    _netns: TestNetns,
}

impl TestHost {
    fn start(dir: &Path) -> Option<TestHost> {
        let ns = format!("rst-e2bv-{}", std::process::id());
        let link = format!("xe2v{}", std::process::id() % 100_000);
        let netns = TestNetns::new(
            &ns,
            &link,
            &format!("{HOST_SIDE}/30"),
            &[&format!("{ADDR}/30")],
        )?;
        let mut h = TestHost {
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
            .args([ADDR, HOST])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("servers.err")).ok()?)
            .spawn()
            .ok()?;
        h.server = Some(child);
        wait_until("the test host accepts", 30, || {
            std::net::TcpStream::connect_timeout(
                &format!("{ADDR}:80").parse().unwrap(),
                Duration::from_millis(200),
            )
            .is_ok()
        });
        Some(h)
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `program script` with the E2B variables; returns (passed, failed lines).
fn run(program: &Path, script: &Path, cwd: &Path, envs: &[(&str, &str)]) -> (usize, Vec<String>) {
    let r = support::run_sdk_script(program, script, cwd, envs);
    (r.passed.len(), r.failed)
}

#[test]
fn e2b_volumes_and_secrets_with_the_unmodified_sdks() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(host) = TestHost::start(tmp.path()) else {
        eprintln!("skipped: could not make the test host (ip netns)");
        return;
    };
    // A file of the host no volume call may read, change or replace.
    let host_dir = tmp.path().join("host-only");
    std::fs::create_dir(&host_dir).unwrap();
    let host_file = host_dir.join("host-secret.txt");
    std::fs::write(&host_file, format!("host only {}\n", std::process::id())).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&host_file, std::fs::Permissions::from_mode(0o640)).unwrap();

    let t = (std::process::id().wrapping_mul(13) + 7) % 250;
    let table = format!("rampart_e2bv_{}", std::process::id());
    let _table = TableGuard(table.clone());
    let pool = format!("10.251.{t}.0/24");
    let prefix = format!("rv{t}n");
    let upstream_dns = format!("{ADDR}:53");
    let d = start_tidy_with(
        "e2b-vol",
        &[
            ("RAMPART_NET_POOL", pool.as_str()),
            ("RAMPART_NET_LINK_PREFIX", prefix.as_str()),
            ("RAMPART_NET_TABLE", table.as_str()),
            ("RAMPART_NET_DNS_PORT", "0"),
            ("RAMPART_NET_PROXY_PORT", "0"),
            ("RAMPART_NET_UPSTREAM_DNS", upstream_dns.as_str()),
        ],
    );
    let key = std::fs::read_to_string(d.data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();
    // Two tenants, each with an E2B key: each sees only its own volumes and secrets.
    for t in ["acme", "rival"] {
        let r = support::client()
            .post(format!("{}/v1/tenants", d.url))
            .json(&serde_json::json!({"name": t}))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{:?}", r.text());
    }
    let key_a = support::make_key(&d.data, &["--e2b", "--tenant", "acme"]);
    let key_b = support::make_key(&d.data, &["--e2b", "--tenant", "rival"]);
    let log = host.log.to_string_lossy().into_owned();
    let hf = host_file.to_string_lossy().into_owned();
    let envs = [
        ("E2B_API_KEY", key.as_str()),
        ("E2B_API_URL", d.url.as_str()),
        ("E2B_SANDBOX_URL", d.url.as_str()),
        ("E2B_VOLUME_API_URL", d.url.as_str()),
        ("E2B_NET_HOST", HOST),
        ("E2B_NET_LOG", log.as_str()),
        ("E2B_HOST_FILE", hf.as_str()),
        ("E2B_KEY_A", key_a.as_str()),
        ("E2B_KEY_B", key_b.as_str()),
    ];
    let tests = workspace().join("tests/e2b");
    let py = support::venv_python("RAMPART_E2B_VENV", "e2b-venv");
    let (mut passed, mut failed) = run(&py, &tests.join("volumes.py"), &tests, &envs);

    let node = std::env::var_os("RAMPART_E2B_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("e2b-node"));
    if node.join("node_modules/e2b").is_dir() {
        // ESM resolves `e2b` from the script's own directory: run a copy placed there.
        let script = node.join("rampart-volumes-test.mjs");
        std::fs::copy(tests.join("volumes.mjs"), &script).unwrap();
        let (p, f) = run(Path::new("node"), &script, &node, &envs);
        passed += p;
        failed.extend(f);
    } else {
        eprintln!(
            "JS SDK skipped: no {}",
            node.join("node_modules/e2b").display()
        );
    }

    // Nothing of the host changed.
    assert_eq!(
        std::fs::read_to_string(&host_file).unwrap(),
        format!("host only {}\n", std::process::id())
    );
    assert_eq!(
        std::fs::metadata(&host_file).unwrap().permissions().mode() & 0o777,
        0o640
    );
    let left: Vec<_> = std::fs::read_dir(&host_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    // The token key is the daemon's own.
    let m = std::fs::metadata(d.data.join("e2b-volume-key")).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
    assert!(failed.is_empty(), "failed:\n{}", failed.join("\n"));
    assert!(passed >= 7, "only {passed} passed");
    eprintln!("passed: {passed}");
}
