//! The `rampart bench --egress` measurement: the latency of one HTTPS request (new TCP
//! connection, TLS handshake, GET, response) made directly, through the proxy's SNI check, and
//! through the secret-injecting proxy (TLS terminated with the sandbox CA, header rewritten,
//! TLS to the server), interleaved in the same run.
//!
//! The server lives in a network namespace of its own (198.51.100.2, reached over a veth
//! from a second namespace where the proxy and the client run), so nothing touches the host's
//! network. Needs root and `ip`.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampart_types::network::{NetworkMode, NetworkPolicy, SecretInjection, SecretSpec};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::{Egress, EgressConfig, EgressError};

/// Why the measurement could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A command (`ip`) could not be started.
    #[error("{program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A command ran and failed. `stderr` is the tool's own text, as it printed it.
    #[error("{args:?}: {stderr}")]
    Command {
        /// The command line.
        args: Vec<String>,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
    /// An I/O error: opening a namespace, building a runtime, binding, connecting, writing.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Entering a network namespace.
    #[error(transparent)]
    Setns(#[from] nix::Error),
    /// Making the test CA or the server's certificate.
    #[error(transparent)]
    Certificate(#[from] rcgen::Error),
    /// Building a TLS configuration, or a TLS handshake.
    #[error(transparent)]
    Tls(#[from] rustls::Error),
    /// Reading a PEM.
    #[error(transparent)]
    Pem(#[from] rustls::pki_types::pem::Error),
    /// The server name is not one.
    #[error(transparent)]
    ServerName(#[from] rustls::pki_types::InvalidDnsNameError),
    /// A constant address did not parse.
    #[error("addr: {0}")]
    Addr(#[from] std::net::AddrParseError),
    /// The egress proxy could not be started, or a sandbox attached.
    #[error(transparent)]
    Egress(#[from] EgressError),
    /// The server's namespace thread did not report it listening.
    #[error(transparent)]
    ServerStart(#[from] std::sync::mpsc::RecvTimeoutError),
    /// The measuring thread panicked.
    #[error("bench thread panicked")]
    Panicked,
    /// The secret-injecting attachment came without a CA.
    #[error("no sandbox CA")]
    NoSandboxCa,
    /// A reply without a header/body separator.
    #[error("no response: {text:?}")]
    NoResponse {
        /// What came back.
        text: String,
    },
    /// A path answered another body than the server's.
    #[error("{path}: unexpected body {body:?}")]
    UnexpectedBody {
        /// `direct` or `sni path`.
        path: &'static str,
        /// The body.
        body: String,
    },
    /// The secret-injecting path answered, but the server did not see the secret.
    #[error("secret path: the secret did not arrive ({body:?})")]
    SecretMissing {
        /// The body.
        body: String,
    },
}

/// Latencies in milliseconds of each path, one sample per request.
#[derive(Debug, Clone, Default)]
pub struct EgressBench {
    /// Straight to the server.
    pub direct: Vec<f64>,
    /// Through the proxy: SNI read and judged, then spliced.
    pub sni: Vec<f64>,
    /// Through the proxy with a secret bound to the name: TLS terminated and re-originated,
    /// the header injected.
    pub secret: Vec<f64>,
}

/// The `p` percentile (0..=100) of samples.
pub fn percentile(ms: &[f64], p: f64) -> f64 {
    if ms.is_empty() {
        return f64::NAN;
    }
    let mut v = ms.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

fn run_cmd(args: &[&str]) -> Result<(), BenchError> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|source| BenchError::Spawn {
            program: args[0].to_string(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BenchError::Command {
            args: args.iter().map(|a| a.to_string()).collect(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

struct Netns(Vec<String>);

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = run_cmd(&["ip", "netns", "del", n]);
        }
    }
}

fn enter(ns: &str) -> Result<(), BenchError> {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}"))?;
    Ok(nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)?)
}

const SERVER: &str = "198.51.100.2:443";
const NAME: &str = "bench.test";
const SECRET: &str = "bench-secret-value";

fn pki() -> Result<(String, Arc<rustls::ServerConfig>), BenchError> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "rampart bench CA");
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca = ca.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let leaf =
        rcgen::CertificateParams::new(vec![NAME.to_string()])?.signed_by(&key, &ca, &ca_key)?;
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone(), ca.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )?;
    Ok((ca.pem(), Arc::new(cfg)))
}

fn client_config(roots_pem: &str) -> Result<Arc<rustls::ClientConfig>, BenchError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(roots_pem.as_bytes()) {
        roots.add(c?)?;
    }
    Ok(Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    ))
}

/// An HTTPS server answering every request with a small body; closes after each response.
async fn server(l: tokio::net::TcpListener, cfg: Arc<rustls::ServerConfig>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    loop {
        let Ok((s, _)) = l.accept().await else {
            continue;
        };
        let _ = s.set_nodelay(true);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(t) = acceptor.accept(s).await else {
                return;
            };
            let (r, mut w) = tokio::io::split(t);
            let mut r = tokio::io::BufReader::new(r);
            let mut saw_secret = false;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                saw_secret |= line.contains(SECRET);
                if line == "\r\n" {
                    break;
                }
            }
            let body = if saw_secret { "ok+secret\n" } else { "ok\n" };
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = w.write_all(resp.as_bytes()).await;
            let _ = w.shutdown().await;
        });
    }
}

/// One request on a new connection to `addr` with TLS for `NAME`; returns the body.
async fn request(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> Result<String, BenchError> {
    let s = tokio::net::TcpStream::connect(addr).await?;
    let _ = s.set_nodelay(true);
    let name = ServerName::try_from(NAME.to_string())?;
    let mut t = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, s)
        .await?;
    t.write_all(format!("GET / HTTP/1.1\r\nHost: {NAME}\r\nAuthorization: x\r\n\r\n").as_bytes())
        .await?;
    let mut out = Vec::new();
    let _ = t.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).to_string();
    match text.split_once("\r\n\r\n") {
        Some((_, b)) => Ok(b.to_string()),
        None => Err(BenchError::NoResponse { text }),
    }
}

/// Accepts on `l` and hands each connection to the proxy as `sandbox_ip` -> `SERVER`.
async fn front(l: tokio::net::TcpListener, egress: Arc<Egress>, sandbox_ip: IpAddr) {
    let dst: SocketAddr = SERVER.parse().expect("constant address");
    loop {
        let Ok((s, _)) = l.accept().await else {
            continue;
        };
        let egress = egress.clone();
        tokio::spawn(async move { egress.serve_connection(s, sandbox_ip, dst).await });
    }
}

/// Runs the measurement: `iterations` requests per path, interleaved.
pub fn run(iterations: usize) -> Result<EgressBench, BenchError> {
    let pid = std::process::id();
    let (rt_ns, in_ns) = (format!("rbe{pid}rt"), format!("rbe{pid}in"));
    run_cmd(&["ip", "netns", "add", &rt_ns])?;
    let mut guard = Netns(vec![rt_ns.clone()]);
    run_cmd(&["ip", "netns", "add", &in_ns])?;
    guard.0.push(in_ns.clone());
    for ns in [&rt_ns, &in_ns] {
        run_cmd(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
    }
    run_cmd(&[
        "ip", "-n", &rt_ns, "link", "add", "vin", "type", "veth", "peer", "name", "eth0", "netns",
        &in_ns,
    ])?;
    run_cmd(&[
        "ip",
        "-n",
        &rt_ns,
        "addr",
        "add",
        "198.51.100.1/24",
        "dev",
        "vin",
    ])?;
    run_cmd(&["ip", "-n", &rt_ns, "link", "set", "vin", "up"])?;
    run_cmd(&[
        "ip",
        "-n",
        &in_ns,
        "addr",
        "add",
        "198.51.100.2/24",
        "dev",
        "eth0",
    ])?;
    run_cmd(&["ip", "-n", &in_ns, "link", "set", "eth0", "up"])?;

    let (ca_pem, server_cfg) = pki()?;
    let (tx, rx) = std::sync::mpsc::channel::<Result<(), BenchError>>();
    let ns = in_ns.clone();
    std::thread::spawn(move || {
        let tx2 = tx.clone();
        let r = (move || {
            enter(&ns)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind(SERVER).await?;
                let _ = tx2.send(Ok(()));
                server(l, server_cfg).await;
                Ok::<(), BenchError>(())
            })
        })();
        if let Err(e) = r {
            let _ = tx.send(Err(e));
        }
    });
    rx.recv_timeout(Duration::from_secs(10))??;

    let ns = rt_ns.clone();
    let out = std::thread::spawn(move || -> Result<EgressBench, BenchError> {
        enter(&ns)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(measure(iterations, ca_pem))
    })
    .join()
    .map_err(|_| BenchError::Panicked)?;
    drop(guard);
    out
}

async fn measure(iterations: usize, ca_pem: String) -> Result<EgressBench, BenchError> {
    let state = std::env::temp_dir().join(format!("rampart-egress-bench-{}", std::process::id()));
    let egress = Egress::start(EgressConfig {
        listen: vec!["127.0.0.1".parse()?],
        proxy_port: 0,
        dns_port: 0,
        upstream_dns: vec!["127.0.0.1:9".parse()?],
        extra_upstream_roots: vec![ca_pem.clone()],
        state_dir: state.clone(),
        ..Default::default()
    })
    .await?;
    let policy = NetworkPolicy {
        mode: NetworkMode::Allowlist,
        allow: vec![NAME.into(), format!("{SERVER}")],
        ..Default::default()
    };
    let gw: IpAddr = "127.0.0.1".parse()?;
    let (sni_ip, secret_ip): (IpAddr, IpAddr) = ("127.0.0.2".parse()?, "127.0.0.3".parse()?);
    egress.attach("bench-sni", sni_ip, gw, policy.clone(), vec![])?;
    let att = egress.attach(
        "bench-secret",
        secret_ip,
        gw,
        policy,
        vec![SecretSpec {
            name: "bench".into(),
            value: SECRET.into(),
            hosts: vec![NAME.into()],
            inject: SecretInjection::Header {
                name: "Authorization".into(),
                template: "Bearer {value}".into(),
            },
            env: None,
        }],
    )?;
    let egress = Arc::new(egress);
    let l_sni = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let l_sec = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let (a_sni, a_sec) = (l_sni.local_addr()?, l_sec.local_addr()?);
    tokio::spawn(front(l_sni, egress.clone(), sni_ip));
    tokio::spawn(front(l_sec, egress.clone(), secret_ip));
    let direct_cfg = client_config(&ca_pem)?;
    let sandbox_cfg = client_config(att.ca_cert_pem.as_deref().ok_or(BenchError::NoSandboxCa)?)?;
    let server: SocketAddr = SERVER.parse()?;

    // Warm up each path (and check each does what it should).
    let b = request(server, direct_cfg.clone()).await?;
    if b != "ok\n" {
        return Err(BenchError::UnexpectedBody {
            path: "direct",
            body: b,
        });
    }
    let b = request(a_sni, direct_cfg.clone()).await?;
    if b != "ok\n" {
        return Err(BenchError::UnexpectedBody {
            path: "sni path",
            body: b,
        });
    }
    let b = request(a_sec, sandbox_cfg.clone()).await?;
    if b != "ok+secret\n" {
        return Err(BenchError::SecretMissing { body: b });
    }
    let mut out = EgressBench::default();
    for _ in 0..iterations.max(1) {
        let t = Instant::now();
        request(server, direct_cfg.clone()).await?;
        out.direct.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        request(a_sni, direct_cfg.clone()).await?;
        out.sni.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        request(a_sec, sandbox_cfg.clone()).await?;
        out.secret.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    egress.detach("bench-sni");
    egress.detach("bench-secret");
    let _ = std::fs::remove_dir_all(&state);
    Ok(out)
}

impl EgressBench {
    /// p50 and p99 of a path.
    fn stats(ms: &[f64]) -> (f64, f64) {
        (percentile(ms, 50.0), percentile(ms, 99.0))
    }

    /// The report as a Markdown table with the targets (< 1 ms added at p50 through the SNI
    /// check, < 5 ms through the secret-injecting proxy).
    pub fn report(&self) -> String {
        let (d50, d99) = Self::stats(&self.direct);
        let (s50, s99) = Self::stats(&self.sni);
        let (x50, x99) = Self::stats(&self.secret);
        let pass = |ok: bool| if ok { "PASS" } else { "FAIL" };
        format!(
            "## Egress: one HTTPS request (new connection + TLS + GET), {n} per path, interleaved\n\n\
             | path | p50 ms | p99 ms | added at p50, ms |\n|---|---|---|---|\n\
             | direct | {d50:.3} | {d99:.3} | - |\n\
             | through the SNI check | {s50:.3} | {s99:.3} | {:.3} |\n\
             | through the secret-injecting proxy | {x50:.3} | {x99:.3} | {:.3} |\n\n\
             - SNI check adds < 1 ms at p50: {:.3} ms ({})\n\
             - secret injection adds < 5 ms at p50: {:.3} ms ({})\n",
            s50 - d50,
            x50 - d50,
            s50 - d50,
            pass(s50 - d50 < 1.0),
            x50 - d50,
            pass(x50 - d50 < 5.0),
            n = self.direct.len(),
        )
    }

    /// The figures as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let (d50, d99) = Self::stats(&self.direct);
        let (s50, s99) = Self::stats(&self.sni);
        let (x50, x99) = Self::stats(&self.secret);
        serde_json::json!({
            "iterations": self.direct.len(),
            "direct_ms": {"p50": d50, "p99": d99},
            "sni_ms": {"p50": s50, "p99": s99, "added_p50": s50 - d50},
            "secret_ms": {"p50": x50, "p99": x99, "added_p50": x50 - d50},
        })
    }
}
