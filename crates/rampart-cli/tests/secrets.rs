//! Secrets that never enter a sandbox, end to end: a real daemon, a test "internet" in a
//! network namespace this test makes (a DNS server for `*.secrets.test`, an HTTPS server
//! with a test CA answering as two hosts, A and B), a named secret stored through the CLI
//! (value on stdin) and bound to host A, and a sandbox that refers to it by name.
//!
//! What it shows: the sandbox sees only the placeholder; a request to A carries the real
//! value in the configured header (the server's log, kept outside the sandbox, shows it);
//! a request to B with the placeholder carries the placeholder; the network log records
//! `secret_used` with the secret's name. Then the value is searched for everywhere and found
//! nowhere: every file of the sandbox (grep over / inside, with a pattern that does not
//! itself contain the value), the host-side directories of the sandbox and the daemon's data
//! directory (but for `state.db`, where values are kept at rest by design), the environment
//! of every process inside, the readable memory of every process inside (read from the host
//! through `/proc/<pid>/mem`), the daemon's log, every API answer about the sandbox and the
//! secrets, and the audit bundle. The echo server answers with digests of the header values
//! only, so that the response itself does not carry the value into the sandbox (a server
//! that reflects the secret would: see docs/network.md).

mod support;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{
    client, free_port, post, sandboxes_dir, skip_reason, start, token, wait_until, Api as _,
    Daemon, Sandbox, TableGuard, TestNetns,
};

const HOST_A: &str = "a.secrets.test";
const HOST_B: &str = "b.secrets.test";
const HOST_SIDE: &str = "203.0.113.1";
const ADDR_A: &str = "203.0.113.2";
const ADDR_B: &str = "203.0.113.3";

fn skip() -> bool {
    if let Some(r) = skip_reason() {
        eprintln!("SKIP: {r}");
        return true;
    }
    for (bin, arg) in [
        ("nft", "--version"),
        ("openssl", "version"),
        ("python3", "--version"),
        ("ip", "-V"),
    ] {
        if Command::new(bin).arg(arg).output().is_err() {
            eprintln!("SKIP: {bin} is not installed");
            return true;
        }
    }
    false
}

/// Destroys every sandbox of the daemon at this URL when dropped (before the daemon is
/// killed, as it is declared after it), so a failed test leaves no sandbox running.
struct Sandboxes(String);

impl Drop for Sandboxes {
    fn drop(&mut self) {
        support::destroy_all(&self.0);
    }
}

/// The test CA and the servers' certificate (for both test names), made with openssl.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn make_pki(dir: &Path) -> Option<Pki> {
    let run = |args: &[&str]| {
        let o = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()?;
        if !o.status.success() {
            eprintln!("openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
            return None;
        }
        Some(())
    };
    std::fs::write(
        dir.join("ext.cnf"),
        format!(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{HOST_A},DNS:{HOST_B}\n"
        ),
    )
    .ok()?;
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
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
            "/CN=rampart secrets test CA",
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
    Some(Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("srv.pem"),
        key: dir.join("srv.key"),
    })
}

/// The servers of the test internet: DNS for the two test names (NXDOMAIN for the rest)
/// and HTTPS answering any path with the request's header names and the SHA-256 of each
/// value, logging the full request (host, path, headers) as JSON lines to a file outside
/// every sandbox.
const SERVERS: &str = r#"
import hashlib, http.server, json, socket, ssl, struct, sys, threading
log, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]
names = {"a.secrets.test.": "203.0.113.2", "b.secrets.test.": "203.0.113.3"}

def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("203.0.113.2", 53))
    while True:
        q, peer = s.recvfrom(4096)
        try:
            i, labels = 12, []
            while q[i] != 0:
                n = q[i]
                labels.append(q[i + 1:i + 1 + n].decode().lower())
                i += 1 + n
            qtype, _ = struct.unpack(">HH", q[i + 1:i + 5])
            question = q[12:i + 5]
        except Exception:
            continue
        ip = names.get(".".join(labels) + ".")
        an = 1 if ip is not None and qtype == 1 else 0
        flags = 0x8180 if ip is not None else 0x8183
        r = q[:2] + struct.pack(">HHHHH", flags, 1, an, 0, 0) + question
        if an:
            r += b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(ip)
        s.sendto(r, peer)

class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        hs = list(self.headers.items())
        with open(log, "a") as f:
            f.write(json.dumps({"path": self.path, "headers": hs}) + "\n")
        body = "".join("%s: sha256=%s\n" % (k.lower(), hashlib.sha256(v.encode()).hexdigest()) for k, v in hs)
        b = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def do_TRACE(self):
        # As real servers that allow TRACE do: the request received, verbatim.
        hs = list(self.headers.items())
        with open(log, "a") as f:
            f.write(json.dumps({"path": self.path, "headers": hs}) + "\n")
        b = ("TRACE %s HTTP/1.1\r\n" % self.path + "".join("%s: %s\r\n" % (k, v) for k, v in hs)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "message/http")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass

threading.Thread(target=dns, daemon=True).start()
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
ctx.set_alpn_protocols(["http/1.1"])
class Server(http.server.ThreadingHTTPServer):
    def get_request(self):
        conn, addr = self.socket.accept()
        return ctx.wrap_socket(conn, server_side=True, do_handshake_on_connect=False), addr
srv = Server(("0.0.0.0", 443), Echo)
print("ready", flush=True)
srv.serve_forever()
"#;

/// The test internet: a network namespace linked to the host (203.0.113.1/29 on the host,
/// .2 and .3 inside) running [`SERVERS`]. Removed on drop.
struct Internet {
    server: Option<Child>,
    log: PathBuf,
    _netns: TestNetns,
}

impl Internet {
    fn start(dir: &Path, pki: &Pki) -> Option<Internet> {
        let ns = format!("rst-sec-{}", std::process::id());
        let link = format!("xsec{}", std::process::id() % 100_000);
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
            .arg(&pki.cert)
            .arg(&pki.key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("servers.err")).ok()?)
            .spawn()
            .ok()?;
        h.server = Some(child);
        wait_until("the test internet's HTTPS server accepts", 30, || {
            std::net::TcpStream::connect_timeout(
                &format!("{ADDR_A}:443").parse().unwrap(),
                Duration::from_millis(200),
            )
            .is_ok()
        });
        Some(h)
    }

    /// The requests the servers saw: (path, headers).
    fn requests(&self) -> Vec<(String, Vec<(String, String)>)> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|v| {
                let hs = v["headers"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|p| {
                                (
                                    p[0].as_str().unwrap_or_default().to_owned(),
                                    p[1].as_str().unwrap_or_default().to_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                (v["path"].as_str().unwrap_or_default().to_owned(), hs)
            })
            .collect()
    }

    /// The value of header `name` (case-insensitive) on the request to `path`.
    fn header(&self, path: &str, name: &str) -> Option<String> {
        self.requests()
            .into_iter()
            .filter(|(p, _)| p == path)
            .flat_map(|(_, hs)| hs)
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
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

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return false;
    };
    let mut i = 0;
    while let Some(p) = hay[i..].iter().position(|&b| b == first) {
        let at = i + p;
        if hay.len() - at < needle.len() {
            return false;
        }
        if &hay[at + 1..at + needle.len()] == rest {
            return true;
        }
        i = at + 1;
    }
    false
}

fn get(d: &Daemon, path: &str) -> (u16, Vec<u8>) {
    let r = client().get(format!("{}{path}", d.url)).send().unwrap();
    let s = r.status().as_u16();
    (s, r.bytes().unwrap().to_vec())
}

/// Runs `sh -c script` in a sandbox as its default user: (exit code, stdout, stderr).
fn sh(sb: &Sandbox, script: &str) -> (i64, String, String) {
    sh_as(sb, "user", script)
}

/// Runs `sh -c script` in a sandbox as `user`: (exit code, stdout, stderr).
fn sh_as(sb: &Sandbox, user: &str, script: &str) -> (i64, String, String) {
    let v = sb.exec(json!({ "cmd": ["sh", "-c", script], "timeout_secs": 300, "user": user }));
    (
        v["exit_code"].as_i64().unwrap_or(-1),
        v["stdout"].as_str().unwrap_or_default().to_owned(),
        v["stderr"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Runs the CLI against the daemon with `stdin`: (success, stdout, stderr).
fn cli(d: &Daemon, args: &[&str], stdin: &str) -> (bool, String, String) {
    let o = d.cli_stdin(args, Some(stdin.as_bytes()));
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Every regular file under `root` (symlinks not followed), but for `skip`.
fn files_under(root: &Path, skip: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if skip(&p) {
            continue;
        }
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            files_under(&p, skip, out);
        } else if m.is_file() {
            out.push(p);
        }
    }
}

/// Searches the data of file `path` (holes skipped) for `needle`: (bytes read, found).
fn search_file(path: &Path, needle: &[u8]) -> std::io::Result<(u64, bool)> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::FileExt as _;
    let f = std::fs::File::open(path)?;
    let len = f.metadata()?.len() as i64;
    let fd = f.as_raw_fd();
    let (mut pos, mut read) = (0i64, 0u64);
    let overlap = needle.len() as u64;
    let mut buf = vec![0u8; 8 << 20];
    while pos < len {
        // SAFETY: lseek(2) on a file descriptor `f` owns; no memory is touched.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: no data after pos.
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let end = if hole < 0 { len } else { hole } as u64;
        let mut off = data as u64;
        while off < end {
            let want = ((end - off) as usize).min(buf.len());
            let n = f.read_at(&mut buf[..want], off)?;
            if n == 0 {
                break;
            }
            read += n as u64;
            if contains(&buf[..n], needle) {
                return Ok((read, true));
            }
            if off + n as u64 >= end {
                break;
            }
            off += (n as u64).saturating_sub(overlap).max(1);
        }
        pos = end as i64;
    }
    Ok((read, false))
}

/// The pids (host view) of the processes in the PID namespace `pidns` (`pid:[N]`).
fn pids_in(pidns: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                .is_ok_and(|l| l.to_string_lossy() == pidns)
        })
        .collect()
}

/// Searches the readable memory of process `pid` for `needle`: (bytes read, found).
fn search_memory(pid: i32, needle: &[u8]) -> (u64, bool) {
    use std::os::unix::fs::FileExt as _;
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return (0, false);
    };
    let Ok(mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return (0, false);
    };
    let mut read = 0u64;
    for l in maps.lines() {
        let mut f = l.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        if !perms.starts_with('r') || l.ends_with("[vvar]") || l.ends_with("[vsyscall]") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let mut off = a;
        let overlap = needle.len() as u64;
        while off < b {
            let len = (b - off).min(8 << 20) as usize;
            let mut buf = vec![0u8; len];
            let Ok(n) = mem.read_at(&mut buf, off) else {
                break;
            };
            if n == 0 {
                break;
            }
            read += n as u64;
            if contains(&buf[..n], needle) {
                return (read, true);
            }
            if off + (n as u64) >= b {
                break;
            }
            off += (n as u64).saturating_sub(overlap).max(1);
        }
    }
    (read, false)
}

/// A standard base64 encoding (with padding).
fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// What the searches need to know about the daemon.
struct Ctx<'a> {
    d: &'a Daemon,
    data: &'a Path,
    daemon_log: &'a Path,
    tmp: &'a Path,
}

impl Ctx<'_> {
    /// Searches for `value` everywhere a sandbox `id` leaves traces and asserts it is in
    /// none of them.
    fn search_everywhere(&self, sb: &Sandbox, value: &str) {
        let (d, id) = (self.d, sb.id.as_str());
        // Letters and digits only, so that a bracket pattern can match it without
        // containing it.
        assert!(value.bytes().all(|b| b.is_ascii_alphanumeric()));
        let pattern: String = value.chars().map(|c| format!("[{c}]")).collect();

        // 1. Every file of the sandbox, from inside as root.
        let (code, out, err) = sh_as(
            sb,
            "root",
            &format!(
                "sync; grep -rlsE '{pattern}' / --exclude-dir=proc --exclude-dir=sys \
                 --exclude-dir=dev; echo \"grep-exit=$?\""
            ),
        );
        assert_eq!(code, 0, "{err}");
        // 1: no match; 2: no match but some file could not be read (sockets, vanished).
        let found = out.trim();
        assert!(
            found == "grep-exit=1" || found == "grep-exit=2",
            "files inside {id} with the value: {out} {err}"
        );

        // 2. The environment of every process inside (as root: all of them).
        let (_, out, _) = sh_as(
            sb,
            "root",
            &format!(
                "for f in /proc/[0-9]*/environ; do cat \"$f\" 2>/dev/null; echo; done | \
                 grep -cE '{pattern}'"
            ),
        );
        assert_eq!(out.trim(), "0", "environments in {id} with the value");

        // 3. The environment, command line and memory of every process inside, from the
        // host.
        let (_, ns, _) = sh(sb, "readlink /proc/self/ns/pid");
        let pids = pids_in(ns.trim());
        assert!(!pids.is_empty(), "processes of {id} ({ns}): {pids:?}");
        let mut total = 0u64;
        for pid in &pids {
            for what in ["environ", "cmdline"] {
                let b = std::fs::read(format!("/proc/{pid}/{what}")).unwrap_or_default();
                assert!(!contains(&b, value.as_bytes()), "{what} of pid {pid}");
            }
            let (n, found) = search_memory(*pid, value.as_bytes());
            assert!(!found, "the value is in the memory of pid {pid} (in {id})");
            total += n;
        }
        assert!(total > 1 << 20, "read only {total} bytes of memory");
        eprintln!(
            "{id}: searched {total} bytes of memory of {} processes",
            pids.len()
        );

        // 4. Every API answer about the sandbox and the secrets, and the audit bundle (as
        // a file).
        for path in [
            format!("/v1/sandboxes/{id}"),
            "/v1/sandboxes".to_owned(),
            format!("/v1/sandboxes/{id}/network"),
            format!("/v1/sandboxes/{id}/network/log"),
            format!("/v1/sandboxes/{id}/ports"),
            format!("/v1/sandboxes/{id}/audit?limit=10000"),
            format!("/v1/sandboxes/{id}/audit/bundle"),
            "/v1/secrets".to_owned(),
        ] {
            let (s, body) = get(d, &path);
            assert!(s < 500, "{path}: {s}");
            assert!(
                !contains(&body, value.as_bytes()),
                "the value is in GET {path}"
            );
            if path.ends_with("/bundle") {
                assert_eq!(s, 200, "{path}");
                let f = self.tmp.join(format!("bundle-{id}.json"));
                std::fs::write(&f, &body).unwrap();
                let (_, found) = search_file(&f, value.as_bytes()).unwrap();
                assert!(!found, "the value is in the audit bundle");
            }
        }

        // 5. The host side: the data directory (the sandbox's disk, egress state, audit
        // journal...) but the templates, the shared image cache and state.db (values at
        // rest, by design), and the daemon's log.
        let skip_paths = |p: &Path| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name == "templates"
                || name == "cache"
                || name.starts_with("state.db")
                || name == "store.img"
        };
        let mut files = Vec::new();
        files_under(self.data, &skip_paths, &mut files);
        files_under(&sandboxes_dir(self.data).join(id), &skip_paths, &mut files);
        files.push(self.daemon_log.to_path_buf());
        files.sort();
        files.dedup();
        let mut bytes = 0u64;
        for f in &files {
            let Ok((n, found)) = search_file(f, value.as_bytes()) else {
                continue;
            };
            bytes += n;
            assert!(!found, "the value is in {} (host side)", f.display());
        }
        eprintln!(
            "{id}: searched {} host-side files ({bytes} bytes of data)",
            files.len()
        );
        let dlog = std::fs::read_to_string(self.daemon_log).unwrap_or_default();
        assert!(dlog.len() > 1000, "the daemon's log is (nearly) empty");
    }
}

#[test]
fn a_secret_reaches_only_its_host_and_is_found_nowhere_else() {
    if skip() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(pki) = make_pki(tmp.path()) else {
        eprintln!("SKIP: openssl could not make the test CA");
        return;
    };
    let Some(inet) = Internet::start(tmp.path(), &pki) else {
        eprintln!("SKIP: could not make the test internet (ip netns)");
        return;
    };
    let t = (std::process::id().wrapping_mul(7) + 3) % 250;
    let table = format!("rampart_sec_{}", std::process::id());
    let _table = TableGuard(table.clone());
    let pool = format!("10.253.{t}.0/24");
    let prefix = format!("rs{t}z");
    let upstream_dns = format!("{ADDR_A}:53");
    let roots = pki.ca.to_string_lossy().into_owned();
    let data = tmp.path().join("data");
    let envs = [
        ("RAMPART_NET_POOL", pool.as_str()),
        ("RAMPART_NET_LINK_PREFIX", prefix.as_str()),
        ("RAMPART_NET_TABLE", table.as_str()),
        ("RAMPART_NET_DNS_PORT", "0"),
        ("RAMPART_NET_PROXY_PORT", "0"),
        ("RAMPART_NET_UPSTREAM_DNS", upstream_dns.as_str()),
        ("RAMPART_NET_UPSTREAM_ROOTS", roots.as_str()),
        ("RAMPART_JAIL_POOL", "0"),
        ("RUST_LOG", "trace"),
    ];
    let d = start(&data, free_port(), &envs);
    let _sandboxes = Sandboxes(d.url.clone());
    let daemon_log = data.with_extension("log");

    // The value: letters and digits only, so that a bracket pattern can match it without
    // containing it.
    let value = format!("Sv{}{}", token(), token());
    let pattern: String = value.chars().map(|c| format!("[{c}]")).collect();
    assert!(!pattern.contains(&value));

    // Stored through the CLI, value on stdin.
    let (ok, out, err) = cli(
        &d,
        &[
            "secret",
            "set",
            "api_token",
            "--to",
            HOST_A,
            "--header",
            "Authorization: Bearer {value}",
            "--env",
            "API_TOKEN",
        ],
        &format!("{value}\n"),
    );
    assert!(ok, "secret set: {out} {err}");
    assert!(
        !out.contains(&value) && !err.contains(&value),
        "{out} {err}"
    );
    let (ok, out, _) = cli(&d, &["secret", "ls"], "");
    assert!(
        ok && out.contains("api_token") && out.contains(HOST_A),
        "{out}"
    );
    assert!(!out.contains(&value));
    // state.db, where values are kept at rest, is the owner's only.
    {
        use std::os::unix::fs::PermissionsExt as _;
        let m = std::fs::metadata(data.join("state.db"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(m & 0o077, 0, "state.db is mode {m:o}");
    }
    // A reference to an unknown secret is refused, naming it.
    let (s, v) = post(
        &d,
        "/v1/sandboxes",
        json!({"network": {"mode": "allowlist", "allow": [HOST_A]}, "secrets": [{"name": "nope"}]}),
    );
    assert_eq!(s, 400, "{v}");
    assert!(v.to_string().contains("nope"), "{v}");
    // The same through the CLI, and `rampart create --secret NAME` binding the stored one.
    let (ok, out, err) = cli(&d, &["create", "--allow", HOST_A, "--secret", "nope"], "");
    assert!(!ok && err.contains("nope"), "{out} {err}");
    let (ok, out, err) = cli(
        &d,
        &[
            "create",
            "--allow",
            HOST_A,
            "--secret",
            "api_token",
            "--timeout",
            "600",
        ],
        "",
    );
    assert!(ok, "create --secret: {out} {err}");
    let by_cli = Sandbox::adopt(&d, out.trim());
    let (_, env, _) = sh(&by_cli, "printf %s \"$API_TOKEN\"");
    assert!(env.starts_with("rampart-secret-api_token-"), "{env}");
    let (ok, _, err) = cli(&d, &["rm", &by_cli.id], "");
    assert!(ok, "{err}");

    // A sandbox that refers to the stored secret by name.
    let mut sb = Sandbox::create(
        &d,
        json!({
            "network": {"mode": "allowlist", "allow": [HOST_A, HOST_B]},
            "secrets": [{"name": "api_token"}],
            "timeout_secs": 900,
        }),
    );
    let id = sb.id.clone();

    // The placeholder, not the value, is in its environment.
    let (_, out, _) = sh(&sb, "printf %s \"$API_TOKEN\"");
    let placeholder = out.trim().to_owned();
    assert!(
        placeholder.starts_with("rampart-secret-api_token-"),
        "{out}"
    );
    assert!(!placeholder.contains(&value));

    // To A: the real value in the configured header (the server's log, outside the
    // sandbox, shows it); the sandbox gets only its digest back.
    let (code, out, err) = sh(&sb, &format!("curl -sS -m 20 https://{HOST_A}/to-a"));
    if code != 0 {
        let (_, log) = get(&d, &format!("/v1/sandboxes/{id}/network/log"));
        panic!(
            "curl to A: {code} {out} {err}\nnetwork log: {}\nserver saw: {:?}",
            String::from_utf8_lossy(&log),
            inet.requests()
        );
    }
    assert_eq!(
        inet.header("/to-a", "authorization").as_deref(),
        Some(format!("Bearer {value}").as_str()),
        "what A saw: {:?}",
        inet.requests()
    );
    assert!(
        out.contains(&format!(
            "authorization: sha256={}",
            sha256_hex(&format!("Bearer {value}"))
        )),
        "A's echo: {out}"
    );
    // The sandbox's own Authorization header is replaced too.
    let (code, out, err) = sh(
        &sb,
        &format!(
            "curl -sS -m 20 -H \"Authorization: Bearer $API_TOKEN\" https://{HOST_A}/to-a-own"
        ),
    );
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(
        inet.header("/to-a-own", "authorization").as_deref(),
        Some(format!("Bearer {value}").as_str())
    );

    // To B with the placeholder: the placeholder arrives (TLS passes through: the sandbox
    // sees the real server's certificate, hence the test CA here).
    let ca_pem = std::fs::read_to_string(&pki.ca).unwrap();
    sb.exec(json!({"cmd": ["sh", "-c", "cat > /tmp/test-ca.pem"], "stdin": ca_pem}));
    let (code, out, err) = sh(
        &sb,
        &format!(
            "curl -sS -m 20 --cacert /tmp/test-ca.pem -H \"Authorization: Bearer $API_TOKEN\" \
             https://{HOST_B}/to-b"
        ),
    );
    assert_eq!(code, 0, "curl to B: {out} {err}");
    assert_eq!(
        inet.header("/to-b", "authorization").as_deref(),
        Some(format!("Bearer {placeholder}").as_str()),
        "what B saw: {:?}",
        inet.requests()
    );
    // B with the sandbox CA instead fails: B is not intercepted.
    let (code, _, _) = sh(
        &sb,
        &format!("curl -sS -m 20 https://{HOST_B}/to-b-nocacert"),
    );
    assert_ne!(code, 0, "B was intercepted (the sandbox CA verified it)");

    // A live process that made a request to A, for the memory search.
    let (code, out, err) = sh(&sb, &format!(
            "nohup python3 -c \"import urllib.request, time; \
             b = urllib.request.urlopen('https://{HOST_A}/from-python').read(); \
             open('/tmp/py-done', 'wb').write(b); time.sleep(900)\" >/dev/null 2>&1 & \
             for i in $(seq 200); do [ -s /tmp/py-done ] && break; sleep 0.1; done; cat /tmp/py-done"
        ),
    );
    assert!(
        out.contains("authorization: sha256="),
        "python to A: {code} {out} {err}"
    );
    assert_eq!(
        inet.header("/from-python", "authorization").as_deref(),
        Some(format!("Bearer {value}").as_str())
    );

    // A TRACE to A (which reflects the request it got) carries no secret; a request on A's
    // connection that names B (domain fronting) is refused and reaches no server with it.
    let (code, out, err) = sh(
        &sb,
        &format!("curl -sS -m 20 -X TRACE https://{HOST_A}/trace"),
    );
    assert!(
        out.contains("TRACE /trace"),
        "TRACE to A: {code} {out} {err}"
    );
    assert!(!out.contains(&value), "TRACE reflected the value");
    assert!(
        inet.header("/trace", "authorization")
            .is_none_or(|h| !h.contains(&value)),
        "A got the value on a TRACE"
    );
    let (_, out, _) = sh(
        &sb,
        &format!("curl -sS -m 20 -H 'Host: {HOST_B}' https://{HOST_A}/fronted"),
    );
    assert!(!out.contains(&value));
    assert!(
        inet.header("/fronted", "authorization")
            .is_none_or(|h| !h.contains(&value)),
        "a fronted request got the value: {:?}",
        inet.requests()
    );

    // The network log: secret_used with the name, for A only.
    let (_, log) = get(&d, &format!("/v1/sandboxes/{id}/network/log"));
    let log: Value = serde_json::from_slice(&log).unwrap();
    let used: Vec<&Value> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "secret_used")
        .collect();
    assert!(!used.is_empty(), "no secret_used entry: {log}");
    for e in &used {
        assert_eq!(e["secret"], "api_token", "{e}");
        assert_eq!(e["name"], HOST_A, "{e}");
    }

    // ---- The value, searched for everywhere ----

    // The searches work: a probe written inside is found by the same grep over / and, once
    // synced, by the host-side search of the sandbox's disk.
    let probe = format!("Sv{}", token());
    let probe_pattern: String = probe.chars().map(|c| format!("[{c}]")).collect();
    let (_, out, _) = sh_as(
        &sb,
        "root",
        &format!(
            "mkdir -p /var/tmp/probe && printf %s {probe} > /var/tmp/probe/file && sync && \
             grep -rlsE '{probe_pattern}' / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev"
        ),
    );
    assert!(
        out.contains("/var/tmp/probe/file"),
        "the search does not work: {out}"
    );
    let disk = sandboxes_dir(&data).join(&id).join("disk.img");
    if disk.exists() {
        let (_, found) = search_file(&disk, probe.as_bytes()).unwrap();
        assert!(found, "the probe is not in {}", disk.display());
    } else {
        eprintln!("note: no disk image for the sandbox; its directory is searched as files");
    }
    // The placeholder is in the environment of the sandbox's processes.
    let (_, out, _) = sh_as(
        &sb,
        "root",
        "for f in /proc/[0-9]*/environ; do cat \"$f\" 2>/dev/null; echo; done | tr '\\0' '\\n' | \
         grep -c '^API_TOKEN=rampart-secret-'",
    );
    assert_ne!(out.trim(), "0", "no placeholder in any environment");

    let ctx = Ctx {
        d: &d,
        data: &data,
        daemon_log: &daemon_log,
        tmp: tmp.path(),
    };
    ctx.search_everywhere(&sb, &value);

    // The secrets list names it, without a value.
    let (_, body) = get(&d, "/v1/secrets");
    let listed: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(listed[0]["name"], "api_token", "{listed}");
    assert!(listed[0].get("value").is_none(), "{listed}");
    // The audit record has secret_used events, with the name and host only.
    let mut used = Vec::new();
    wait_until("secret_used in the audit record", 30, || {
        let (_, events) = get(&d, &format!("/v1/sandboxes/{id}/audit?limit=10000"));
        let page: Value = serde_json::from_slice(&events).unwrap_or(Value::Null);
        used = page["events"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|e| e["body"]["type"] == "secret_used")
                    .map(|e| e["body"].clone())
                    .collect()
            })
            .unwrap_or_default();
        !used.is_empty()
    });
    for b in &used {
        assert_eq!(b["name"], "api_token", "{b}");
        assert_eq!(b["host"], HOST_A, "{b}");
    }

    // A secret given inline (basic auth this time) is found nowhere either.
    let value2 = format!("Sv{}{}", token(), token());
    let sb2 = Sandbox::create(
        &d,
        json!({
            "network": {"mode": "allowlist", "allow": [HOST_A]},
            "secrets": [{"name": "pw", "value": value2, "hosts": [HOST_A],
                         "inject": {"kind": "basic", "username": "bob"}, "env": "PW"}],
            "timeout_secs": 900,
        }),
    );
    assert!(
        !sb2.info.to_string().contains(&value2),
        "the create answer has the value"
    );
    let id2 = sb2.id.clone();
    let (code, out, err) = sh(&sb2, &format!("curl -sS -m 20 https://{HOST_A}/basic"));
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(
        inet.header("/basic", "authorization"),
        Some(format!(
            "Basic {}",
            base64(format!("bob:{value2}").as_bytes())
        )),
        "what A saw: {:?}",
        inet.requests()
    );
    ctx.search_everywhere(&sb2, &value2);
    // ...and the first secret's value is not in the second sandbox either.
    ctx.search_everywhere(&sb2, &value);

    // Removing the stored secret leaves the running sandbox's copy alone.
    let (ok, _, err) = cli(&d, &["secret", "rm", "api_token"], "");
    assert!(ok, "{err}");
    let (ok, out, _) = cli(&d, &["secret", "ls"], "");
    assert!(ok && !out.contains("api_token"), "{out}");
    let (ok, _, _) = cli(&d, &["secret", "rm", "api_token"], "");
    assert!(!ok, "removing a missing secret succeeded");
    let (code, out, err) = sh(&sb, &format!("curl -sS -m 20 https://{HOST_A}/after-rm"));
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(
        inet.header("/after-rm", "authorization").as_deref(),
        Some(format!("Bearer {value}").as_str())
    );

    // A fork binds the same value (its create request kept the resolved secret), though the
    // stored secret is gone; and it is found nowhere in the fork either.
    let (s, v) = post(
        &d,
        &format!("/v1/sandboxes/{id}/fork"),
        json!({"count": 1, "timeout_secs": 900}),
    );
    let mut ids = vec![id.clone(), id2.clone()];
    if s == 201 {
        let f = Sandbox::adopt(&d, v["sandboxes"][0]["id"].as_str().unwrap());
        ids.push(f.id.clone());
        let (code, out, err) = sh(&f, &format!("curl -sS -m 20 https://{HOST_A}/from-fork"));
        assert_eq!(code, 0, "{out} {err}");
        assert_eq!(
            inet.header("/from-fork", "authorization").as_deref(),
            Some(format!("Bearer {value}").as_str())
        );
        ctx.search_everywhere(&f, &value);
    } else {
        eprintln!("note: fork is not available on this host ({s}: {v}); not checked");
    }

    // The daemon killed (-9) and started again: the sandboxes keep their secrets (kept
    // with their network settings), the stored ones are still listed.
    let (ok, _, err) = cli(
        &d,
        &["secret", "set", "again", "--to", HOST_B, "--placeholder"],
        "another-value\n",
    );
    assert!(ok, "{err}");
    let mut d = d;
    d.child.kill().unwrap(); // SIGKILL, by pid: a crash, not a clean stop
    let _ = d.child.wait();
    drop(d);
    let d = start(&data, free_port(), &envs);
    let _sandboxes_again = Sandboxes(d.url.clone());
    sb.reattach(&d);
    let (ok, out, _) = cli(&d, &["secret", "ls", "--json"], "");
    assert!(
        ok && out.contains("\"again\"") && !out.contains("another-value"),
        "{out}"
    );
    wait_until("the sandbox is running again after the restart", 60, || {
        let (_, b) = get(&d, &format!("/v1/sandboxes/{id}"));
        serde_json::from_slice::<Value>(&b).is_ok_and(|v| v["state"] == "running")
    });
    let (code, out, err) = sh(
        &sb,
        &format!("curl -sS -m 20 https://{HOST_A}/after-restart"),
    );
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(
        inet.header("/after-restart", "authorization").as_deref(),
        Some(format!("Bearer {value}").as_str())
    );
    let (_, out, _) = sh(&sb, "printf %s \"$API_TOKEN\"");
    assert_eq!(
        out.trim(),
        placeholder,
        "the placeholder changed across the restart"
    );

    for i in &ids {
        Sandbox::adopt(&d, i).destroy();
    }
    drop(d);
    drop(inet);
}
