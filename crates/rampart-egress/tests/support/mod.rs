#![allow(dead_code)] // each test file uses a part of it
//! A small private "internet" in network namespaces for the egress tests.
//!
//! ```text
//!  sandbox netns (sb)          router netns (rt): the "host"          internet netns (in)
//!  eth0 203.0.113.2  <-veth->  vsb 203.0.113.1   vin 198.51.100.1 <-veth-> eth0 198.51.100.2/.3/.4
//!  default via .1              nft: tcp -> :15001, dns -> :15053       DNS :53, HTTP :80, HTTPS :443
//!                              Egress runs here
//! ```

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

pub const PROXY_PORT: u16 = 15001;
pub const DNS_PORT: u16 = 15053;
pub const SANDBOX_IP: &str = "203.0.113.2";
pub const GATEWAY_IP: &str = "203.0.113.1";
pub const HOST_OTHER_IP: &str = "198.51.100.1";
pub const WEB1: &str = "198.51.100.2";
pub const WEB2: &str = "198.51.100.3";
pub const WEB3: &str = "198.51.100.4";
pub const DNS_SERVER: &str = "198.51.100.2:53";
/// A test host in 198.18.0.0/15 (benchmarking: not globally reachable), routed by the router.
pub const BENCH_HOST: &str = "198.18.0.2";
/// A test host in 192.0.0.0/24 (IETF protocol assignments: not globally reachable).
pub const IETF_HOST: &str = "192.0.0.2";
/// A test host on a network attached to the router's own interface (11.22.33.0/24, an
/// address that would be global, but directly on the "host").
pub const ATTACHED_HOST: &str = "11.22.33.2";
/// A test host at a global-looking address (11.22.44.0/24) that the router reaches through
/// the internet namespace: not special, not attached to the router. Lives only in the test's
/// namespaces.
pub const GLOBAL_HOST: &str = "11.22.44.2";

/// The test zone: name -> address. Everything below `tunnel.test` answers TXT and A.
pub fn zone() -> HashMap<&'static str, &'static str> {
    HashMap::from([
        ("allowed.test", WEB1),
        ("api.test", WEB2),
        ("other.test", WEB2), // shares api.test's address (a CDN)
        ("denied.test", WEB3),
        ("unlisted.test", WEB3),
        ("a.wild.test", WEB1),
    ])
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?}: {}",
            args,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The three namespaces; removed on drop.
pub struct TestNet {
    pub sb: String,
    pub rt: String,
    pub inet: String,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl TestNet {
    /// Builds the namespaces, or `None` with a printed reason when this host cannot.
    pub fn new() -> Option<TestNet> {
        if Command::new("nft").arg("--version").output().is_err() {
            eprintln!("SKIP: nft (nftables) is not installed");
            return None;
        }
        remove_stale();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = std::process::id();
        let net = TestNet {
            sb: format!("reg{p}x{n}sb"),
            rt: format!("reg{p}x{n}rt"),
            inet: format!("reg{p}x{n}in"),
        };
        if let Err(e) = run(&["ip", "netns", "add", &net.sb]) {
            eprintln!("SKIP: cannot make a network namespace: {e}");
            return None;
        }
        if let Err(e) = net.setup() {
            panic!("cannot build the test network: {e}");
        }
        Some(net)
    }

    fn setup(&self) -> Result<(), String> {
        let (sb, rt, inet) = (&self.sb, &self.rt, &self.inet);
        for ns in [sb, rt, inet] {
            if ns != sb {
                run(&["ip", "netns", "add", ns])?;
            }
            run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        run(&[
            "ip", "-n", rt, "link", "add", "vsb", "type", "veth", "peer", "name", "eth0", "netns",
            sb,
        ])?;
        run(&[
            "ip", "-n", rt, "link", "add", "vin", "type", "veth", "peer", "name", "eth0", "netns",
            inet,
        ])?;
        run(&[
            "ip",
            "-n",
            rt,
            "addr",
            "add",
            "203.0.113.1/24",
            "dev",
            "vsb",
        ])?;
        run(&[
            "ip",
            "-n",
            rt,
            "addr",
            "add",
            "198.51.100.1/24",
            "dev",
            "vin",
        ])?;
        run(&["ip", "-n", rt, "link", "set", "vsb", "up"])?;
        run(&["ip", "-n", rt, "link", "set", "vin", "up"])?;
        run(&[
            "ip",
            "-n",
            sb,
            "addr",
            "add",
            "203.0.113.2/24",
            "dev",
            "eth0",
        ])?;
        run(&["ip", "-n", sb, "link", "set", "eth0", "up"])?;
        run(&[
            "ip",
            "-n",
            sb,
            "route",
            "add",
            "default",
            "via",
            "203.0.113.1",
        ])?;
        run(&["ip", "-n", rt, "addr", "add", "11.22.33.1/24", "dev", "vin"])?;
        for a in [
            "198.51.100.2/24",
            "198.51.100.3/24",
            "198.51.100.4/24",
            "198.18.0.2/24",
            "192.0.0.2/24",
            "11.22.33.2/24",
            "11.22.44.2/24",
        ] {
            run(&["ip", "-n", inet, "addr", "add", a, "dev", "eth0"])?;
        }
        run(&["ip", "-n", inet, "link", "set", "eth0", "up"])?;
        run(&[
            "ip",
            "-n",
            inet,
            "route",
            "add",
            "default",
            "via",
            "198.51.100.1",
        ])?;
        for net in ["198.18.0.0/24", "192.0.0.0/24", "11.22.44.0/24"] {
            run(&["ip", "-n", rt, "route", "add", net, "via", WEB1])?;
        }
        let rules = format!(
            "table inet t {{
               chain pre {{ type nat hook prerouting priority dstnat; policy accept;
                 iifname \"vsb\" udp dport 53 redirect to :{DNS_PORT}
                 iifname \"vsb\" tcp dport 53 redirect to :{DNS_PORT}
                 iifname \"vsb\" meta l4proto tcp redirect to :{PROXY_PORT}
               }}
               chain forward_drop {{ type filter hook forward priority 0; policy drop; }}
             }}"
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", rt, "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        child
            .stdin
            .take()
            .ok_or("no stdin")?
            .write_all(rules.as_bytes())
            .map_err(|e| e.to_string())?;
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("nft: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(())
    }
}

/// Removes namespaces left by a test process that was killed (`reg<pid>x...`).
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/var/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix("reg") else {
            continue;
        };
        let Some((pid, _)) = rest.split_once('x') else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run(&["ip", "netns", "del", &name]);
        }
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for ns in [&self.sb, &self.rt, &self.inet] {
            let _ = run(&["ip", "netns", "del", ns]);
        }
    }
}

/// Moves the calling thread into netns `ns`.
pub fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("open netns");
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
}

/// Runs `f` on a new thread inside netns `ns` and waits for it (from async code).
pub async fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter(&ns);
        let _ = tx.send(f());
    });
    rx.await.expect("netns thread panicked")
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The test CA and a server certificate for every test name.
pub struct TestPki {
    pub ca_pem: String,
    pub server: Arc<rustls::ServerConfig>,
}

pub fn test_pki() -> TestPki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "rampart egress test CA");
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca = ca.self_signed(&ca_key).unwrap();
    let names: Vec<String> = zone().keys().map(|s| s.to_string()).collect();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone(), ca.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    TestPki {
        ca_pem: ca.pem(),
        server: Arc::new(server),
    }
}

/// What the internet saw.
#[derive(Default)]
pub struct Seen {
    /// Every DNS question name that reached the test DNS server.
    pub dns: Mutex<Vec<String>>,
    /// Every request head that reached the HTTP and HTTPS servers (what the server got,
    /// whatever the response carried back).
    pub requests: Mutex<Vec<String>>,
}

impl Seen {
    /// The request heads received so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// Starts the DNS, HTTP and HTTPS servers in netns `inet`; they live until the process ends.
pub fn start_world(inet: &str, pki: &TestPki) -> Arc<Seen> {
    let seen = Arc::new(Seen::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = seen.clone();
    let server_cfg = pki.server.clone();
    let ns = inet.to_string();
    std::thread::spawn(move || {
        enter(&ns);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let udp = tokio::net::UdpSocket::bind("0.0.0.0:53").await.unwrap();
            let http = tokio::net::TcpListener::bind("0.0.0.0:80").await.unwrap();
            let https = tokio::net::TcpListener::bind("0.0.0.0:443").await.unwrap();
            tokio::spawn(dns_server(udp, s2.clone()));
            let s3 = s2.clone();
            tokio::spawn(async move {
                loop {
                    let (s, _) = http.accept().await.unwrap();
                    tokio::spawn(echo_http(s, s3.clone()));
                }
            });
            let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg);
            tokio::spawn(async move {
                loop {
                    let (s, _) = https.accept().await.unwrap();
                    let acceptor = acceptor.clone();
                    let seen = s2.clone();
                    tokio::spawn(async move {
                        if let Ok(t) = acceptor.accept(s).await {
                            echo_http(t, seen).await;
                        }
                    });
                }
            });
            tx.send(()).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap();
    seen
}

async fn dns_server(sock: tokio::net::UdpSocket, seen: Arc<Seen>) {
    let zone = zone();
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = sock.recv_from(&mut buf).await.unwrap();
        let Ok(q) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let mut r = Message::new();
        r.set_id(q.id())
            .set_message_type(MessageType::Response)
            .set_op_code(OpCode::Query)
            .set_recursion_available(true);
        let mut blackhole = false;
        for query in q.queries() {
            r.add_query(query.clone());
            let name = query.name().to_ascii().trim_end_matches('.').to_lowercase();
            seen.dns.lock().unwrap().push(name.clone());
            if name.ends_with(".blackhole.test") {
                blackhole = true; // never answered
                continue;
            }
            if let Some(ip) = zone.get(name.as_str()) {
                if query.query_type() == RecordType::A {
                    r.add_answer(Record::from_rdata(
                        query.name().clone(),
                        300,
                        RData::A(A(ip.parse().unwrap())),
                    ));
                }
            } else if name.ends_with(".tunnel.test") {
                r.add_answer(Record::from_rdata(
                    query.name().clone(),
                    300,
                    RData::TXT(TXT::new(vec!["leaked".into()])),
                ));
            } else {
                r.set_response_code(ResponseCode::NXDomain);
            }
        }
        if blackhole {
            continue;
        }
        let _ = sock.send_to(&r.to_vec().unwrap(), peer).await;
    }
}

/// An HTTP/1.1 server answering each request with its head as the body (and recording the
/// head in `seen`). Paths: `/stream` sends a line every 20 ms forever; `/echo-headers` also
/// reflects the `Authorization` header in a response header; `/chunked` (and paths below
/// it) sends the head as a chunked body in 7-byte chunks; `/split` writes the head and 70 KiB of padding in two
/// writes 30 ms apart, split in the middle of the `Authorization` value; `/close` answers without a length and closes;
/// `/ws` with `Upgrade: websocket` answers `101` and then echoes raw bytes (`/ws-auth` first
/// sends `auth=<Authorization header>` raw). `Connection:
/// close` is honoured.
async fn echo_http<S>(s: S, seen: Arc<Seen>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let (r, mut w) = tokio::io::split(s);
    let mut r = tokio::io::BufReader::new(r);
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        seen.requests.lock().unwrap().push(head.clone());
        let header = |name: &str| {
            head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_string())
            })
        };
        let len = header("content-length")
            .map(|v| v.parse::<usize>().unwrap_or(0))
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).await.is_err() {
            return;
        }
        let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let path = head.split(' ').nth(1).unwrap_or("/").to_string();
        if path == "/stream" {
            let _ = w
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                .await;
            loop {
                if w.write_all(b"tick\n").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if (path == "/ws" || path == "/ws-auth") && header("upgrade").is_some() {
            let _ = w
                .write_all(
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
                )
                .await;
            if path == "/ws-auth" {
                // Reflects the Authorization header in the raw stream.
                let auth = header("authorization").unwrap_or_default();
                let _ = w.write_all(format!("auth={auth}\n").as_bytes()).await;
                let _ = w.flush().await;
            }
            let mut buf = [0u8; 4096];
            loop {
                let n = match r.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if w.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
        let conn = if close { "close" } else { "keep-alive" };
        let ok = match path.as_str() {
            "/echo-headers" => {
                let auth = header("authorization").unwrap_or_default();
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nX-Echo-Auth: {auth}\r\nContent-Length: {}\r\nConnection: {conn}\r\n\r\n{head}",
                    head.len()
                );
                w.write_all(resp.as_bytes()).await.is_ok()
            }
            p if p == "/chunked" || p.starts_with("/chunked/") => {
                let mut resp = format!(
                    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: {conn}\r\n\r\n"
                )
                .into_bytes();
                for c in head.as_bytes().chunks(7) {
                    resp.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                    resp.extend_from_slice(c);
                    resp.extend_from_slice(b"\r\n");
                }
                resp.extend_from_slice(b"0\r\n\r\n");
                w.write_all(&resp).await.is_ok()
            }
            "/split" => {
                // Longer than what the proxy reads whole: it is streamed.
                let at = head
                    .to_ascii_lowercase()
                    .find("authorization:")
                    .map(|i| (i + 25).min(head.len()))
                    .unwrap_or(head.len() / 2);
                let pad = "x".repeat(70 * 1024);
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: {conn}\r\n\r\n{}",
                    head.len() + pad.len(),
                    &head[..at]
                );
                let first = w.write_all(resp.as_bytes()).await.is_ok() && w.flush().await.is_ok();
                tokio::time::sleep(Duration::from_millis(30)).await;
                first
                    && w.write_all(format!("{}{pad}", &head[at..]).as_bytes())
                        .await
                        .is_ok()
            }
            "/close" => {
                let resp = format!("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{head}");
                let _ = w.write_all(resp.as_bytes()).await;
                let _ = w.shutdown().await;
                return;
            }
            _ => {
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: {conn}\r\n\r\n{head}",
                    head.len()
                );
                w.write_all(resp.as_bytes()).await.is_ok()
            }
        };
        let _ = w.flush().await;
        if !ok || close {
            let _ = w.shutdown().await;
            return;
        }
    }
}

// ---- blocking clients (run them inside the sandbox netns with `in_ns`) ----

/// A DNS query over UDP (or TCP) to `server`; returns the rcode and the A addresses.
pub fn dns_query(
    server: &str,
    name: &str,
    qtype: RecordType,
    tcp: bool,
) -> (ResponseCode, Vec<IpAddr>) {
    let mut m = Message::new();
    let id: u16 = rand::random();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    let bytes = m.to_vec().unwrap();
    let resp = if tcp {
        let mut s = TcpStream::connect(server).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = (bytes.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&bytes);
        s.write_all(&out).unwrap();
        let mut len = [0u8; 2];
        s.read_exact(&mut len).unwrap();
        let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
        s.read_exact(&mut buf).unwrap();
        buf
    } else {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.connect(server).unwrap();
        s.send(&bytes).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.recv(&mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let r = Message::from_vec(&resp).unwrap();
    assert_eq!(r.id(), id);
    let addrs = r
        .answers()
        .iter()
        .filter_map(|rec| match rec.data() {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            _ => None,
        })
        .collect();
    (r.response_code(), addrs)
}

/// Sends `request` on a plain TCP connection and returns what came back before EOF (or
/// an error string). An empty answer means the proxy closed the connection.
pub fn tcp_exchange(addr: SocketAddr, request: &[u8]) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                // One response is enough: stop at the end of its body.
                if let Some(text) = complete_response(&out) {
                    return Ok(text);
                }
            }
            Err(e) if out.is_empty() => return Err(e.to_string()),
            Err(_) => break,
        }
    }
    Ok(String::from_utf8_lossy(&out).to_string())
}

fn complete_response(b: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(b).to_string();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let len: usize = head.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("content-length:")
            .map(|v| v.trim().parse().unwrap_or(0))
    })?;
    (body.len() >= len).then_some(text)
}

/// A GET over plain HTTP with the given Host and extra headers.
pub fn http_get(ip: &str, host: &str, headers: &[(&str, &str)]) -> Result<String, String> {
    let mut req = format!("GET / HTTP/1.1\r\nHost: {host}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    tcp_exchange(format!("{ip}:80").parse().unwrap(), req.as_bytes())
}

/// A GET over HTTPS to `ip:443` with SNI `sni`, trusting only `roots_pem`.
pub fn https_get(
    ip: &str,
    sni: &str,
    roots_pem: &str,
    headers: &[(&str, &str)],
) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(roots_pem.as_bytes()) {
        let c: CertificateDer<'static> = c.unwrap();
        roots.add(c).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn = rustls::ClientConnection::new(
        Arc::new(cfg),
        ServerName::try_from(sni.to_string()).unwrap(),
    )
    .unwrap();
    let sock = TcpStream::connect_timeout(
        &format!("{ip}:443").parse().unwrap(),
        Duration::from_secs(10),
    )
    .map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let mut req = format!("GET / HTTP/1.1\r\nHost: {sni}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    tls.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match tls.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if let Some(text) = complete_response(&out) {
                    return Ok(text);
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(String::from_utf8_lossy(&out).to_string())
}

/// Sends `request` on a TCP connection and returns everything that came back until the
/// other side closed (or 10 s passed without a byte).
pub fn tcp_all(addr: SocketAddr, request: &[u8]) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).map_err(|e| e.to_string())?;
    Ok(read_to_close(&mut s))
}

fn read_to_close(s: &mut impl Read) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).to_string()
}

/// Sends `request` over TLS to `ip:443` with SNI `sni` (trusting only `roots_pem`) and
/// returns everything that came back until the other side closed (or 10 s of silence).
pub fn tls_all(ip: &str, sni: &str, roots_pem: &str, request: &[u8]) -> Result<String, String> {
    let mut tls = tls_connect(ip, sni, roots_pem)?;
    tls.write_all(request).map_err(|e| e.to_string())?;
    Ok(read_to_close(&mut tls))
}

/// A TLS connection to `ip:443` with SNI `sni`, trusting only `roots_pem`.
pub fn tls_connect(
    ip: &str,
    sni: &str,
    roots_pem: &str,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(roots_pem.as_bytes()) {
        let c: CertificateDer<'static> = c.unwrap();
        roots.add(c).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let conn = rustls::ClientConnection::new(
        Arc::new(cfg),
        ServerName::try_from(sni.to_string()).unwrap(),
    )
    .unwrap();
    let sock = TcpStream::connect_timeout(
        &format!("{ip}:443").parse().unwrap(),
        Duration::from_secs(10),
    )
    .map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    Ok(rustls::StreamOwned::new(conn, sock))
}

/// What [`with_egress`] hands the test: the egress service in the router netns with `sbx1`
/// attached at [`SANDBOX_IP`], the sandbox netns, the world's record of requests, and the
/// test PKI's CA.
pub struct World {
    pub egress: rampart_egress::Egress,
    pub attachment: rampart_egress::Attachment,
    pub sb: String,
    pub seen: Arc<Seen>,
    pub test_ca: String,
}

/// Builds the network, starts the egress service in the router netns (on a runtime with
/// `threads` workers; 1 = current thread) with `sbx1` attached under `policy` and `secrets`,
/// and runs `f` there. Skips (prints why) when the host has no network namespaces or nft.
pub fn with_egress<F, Fut>(
    threads: usize,
    policy: rampart_types::network::NetworkPolicy,
    secrets: Vec<rampart_types::network::SecretSpec>,
    f: F,
) where
    F: FnOnce(World) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let Some(net) = TestNet::new() else {
        eprintln!("skipped: no network namespaces / nftables on this host");
        return;
    };
    let pki = test_pki();
    let seen = start_world(&net.inet, &pki);
    let (rt_ns, sb_ns) = (net.rt.clone(), net.sb.clone());
    let test_ca = pki.ca_pem.clone();
    let result = std::thread::spawn(move || {
        enter(&rt_ns);
        let state = tempfile::tempdir().unwrap();
        let rt = if threads > 1 {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        .unwrap();
        rt.block_on(async move {
            let egress = rampart_egress::Egress::start(rampart_egress::EgressConfig {
                proxy_port: PROXY_PORT,
                dns_port: DNS_PORT,
                upstream_dns: vec![DNS_SERVER.parse().unwrap()],
                extra_upstream_roots: vec![test_ca.clone()],
                state_dir: state.path().join("egress"),
                blocked: vec!["203.0.113.0/24".into()],
                ..Default::default()
            })
            .await
            .expect("start egress");
            let attachment = egress
                .attach(
                    "sbx1",
                    SANDBOX_IP.parse().unwrap(),
                    GATEWAY_IP.parse().unwrap(),
                    policy,
                    secrets,
                )
                .expect("attach");
            f(World {
                egress,
                attachment,
                sb: sb_ns,
                seen,
                test_ca,
            })
            .await;
        });
    })
    .join();
    drop(net);
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// A policy of `mode` with these allow and deny rules.
pub fn policy(
    mode: rampart_types::network::NetworkMode,
    allow: &[&str],
    deny: &[&str],
) -> rampart_types::network::NetworkPolicy {
    rampart_types::network::NetworkPolicy {
        mode,
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}
