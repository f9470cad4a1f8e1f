//! The egress proxy: every TCP connection of a sandbox arrives here (nftables `redirect`),
//! is judged by the original destination and the name in its first bytes, and is spliced to
//! the destination, or, for hosts that a secret is bound to, relayed request by request with
//! the secret put in.

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rampart_types::network::{NetEventKind, PackageFetch, Verdict};
use sha2::{Digest, Sha256};
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf,
};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::netlog::Draft;
use crate::packages::{is_registry_host, recognise, Fetch};
use crate::peek::{classify, Peek};
use crate::policy::canonical;
use crate::secrets::{
    first_request_misdirected, rewrite_head_at, BodyFraming, HeadError, Header, Scrubber, Switch,
    Transport,
};
use crate::upstream::Upstream;
use crate::{Inner, LiveConn, Sandbox};

/// The most bytes read to find the SNI or Host.
const PEEK_CAP: usize = 16 * 1024;
/// How long a connection that would be allowed without a name waits for first bytes
/// (server-speaks-first protocols send nothing).
const RAW_WAIT: Duration = Duration::from_millis(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head relayed on an intercepted connection.
const HEAD_CAP: usize = 64 * 1024;

pub(crate) async fn serve(l: TcpListener, inner: Arc<Inner>, stop: CancellationToken) {
    loop {
        let (s, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            r = l.accept() => match r {
                Ok(v) => v,
                Err(_) => {
                    // EMFILE and friends: back off a little instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let inner = inner.clone();
        tokio::spawn(async move { handle(inner, s, peer).await });
    }
}

/// The destination the sandbox connected to, before the nftables redirect.
fn original_dst(s: &TcpStream) -> io::Result<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    let v4 = || -> io::Result<SocketAddr> {
        let sin = getsockopt(s, sockopt::OriginalDst).map_err(io::Error::from)?;
        Ok(SocketAddr::V4(SocketAddrV4::new(
            u32::from_be(sin.sin_addr.s_addr).into(),
            u16::from_be(sin.sin_port),
        )))
    };
    match s.local_addr()? {
        SocketAddr::V4(_) => v4(),
        SocketAddr::V6(l) if l.ip().to_ipv4_mapped().is_some() => v4(),
        SocketAddr::V6(_) => {
            let sin6 = getsockopt(s, sockopt::Ip6tOriginalDst).map_err(io::Error::from)?;
            Ok(SocketAddr::V6(SocketAddrV6::new(
                sin6.sin6_addr.s6_addr.into(),
                u16::from_be(sin6.sin6_port),
                0,
                0,
            )))
        }
    }
}

/// Counts a sandbox's connections held by the proxy (from accept to close).
struct OpenGuard<'a> {
    sb: &'a Sandbox,
    count: usize,
}

impl<'a> OpenGuard<'a> {
    fn new(sb: &'a Sandbox) -> Self {
        let count = sb.open_conns.fetch_add(1, Ordering::Relaxed) + 1;
        OpenGuard { sb, count }
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.sb.open_conns.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Bytes counted on a connection.
#[derive(Debug, Default)]
struct Counters {
    out: AtomicU64,
    inn: AtomicU64,
}

fn conn_draft(kind: NetEventKind, d: &crate::Decision, ip: IpAddr, port: u16) -> Draft {
    let mut dr = Draft::new(kind, d.verdict, d.rule.clone());
    dr.addrs = vec![ip.to_string()];
    dr.port = Some(port);
    dr
}

fn deny(rule: &str) -> crate::Decision {
    crate::Decision {
        verdict: Verdict::Deny,
        rule: rule.to_string(),
    }
}

async fn handle(inner: Arc<Inner>, client: TcpStream, peer: SocketAddr) {
    let Some(sb) = inner.by_ip(peer.ip()) else {
        return; // not a sandbox: close
    };
    let dst = match original_dst(&client) {
        Ok(d) => d,
        Err(_) => {
            let local = client.local_addr().map(|a| a.ip()).unwrap_or(peer.ip());
            sb.log.push(conn_draft(
                NetEventKind::Connect,
                &deny("no-original-destination"),
                local,
                0,
            ));
            return;
        }
    };
    handle_for(&inner, sb, client, dst).await
}

/// Judges and serves a connection of `sb` to `dst`.
pub(crate) async fn handle_for(
    inner: &Inner,
    sb: Arc<Sandbox>,
    mut client: TcpStream,
    dst: SocketAddr,
) {
    let _ = client.set_nodelay(true);
    let ip = canonical(dst.ip());
    let port = dst.port();
    // Refused before anything is read: logged as a denied connect under `rule`.
    let refuse = |rule: &str| {
        sb.log
            .push(conn_draft(NetEventKind::Connect, &deny(rule), ip, port));
    };
    let bl = inner.blocklist();
    if let Some(cat) = bl.always_blocked(ip) {
        return refuse(&format!("blocked:{cat}"));
    }
    let held = OpenGuard::new(&sb);
    if held.count > crate::CONNS_PER_SANDBOX {
        return refuse("limit:open_connections");
    }
    if let Some(b) = &sb.limiters().connections {
        if !b.try_take() {
            return refuse("limit:connections_per_second");
        }
    }
    // Read the first bytes: long enough for a name when one is needed, briefly otherwise.
    let nameless = sb.decide(&bl, ip, port, None);
    let wait = if nameless.allowed() {
        RAW_WAIT.min(inner.peek_timeout)
    } else {
        inner.peek_timeout
    };
    let (pre, peek) = tokio::select! {
        _ = sb.gone.cancelled() => return,
        r = read_first(&mut client, wait, inner.peek_timeout) => r,
    };
    let name = match &peek {
        Peek::Tls(n) | Peek::Http(n) => n.clone(),
        _ => None,
    };
    // Registered before the verdict, so a policy change from here on cuts it if it must.
    let conn_id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
    let live = Arc::new(LiveConn {
        ip,
        port,
        name: name.clone(),
        cancel: sb.gone.child_token(),
        cut: std::sync::Mutex::new(None),
    });
    sb.conns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(conn_id, live.clone());
    // One request, one destination: a first request that names two, or one that does not
    // parse, is refused before anything is judged by it.
    let misdirected = match &peek {
        Peek::Http(n) => first_request_misdirected(&pre, port)
            .map(|seen| (n.clone().unwrap_or_else(|| ip.to_string()), seen)),
        _ => None,
    };
    if let Some((judged, seen)) = misdirected {
        sb.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&conn_id);
        let mut dr = conn_draft(
            NetEventKind::Connect,
            &deny(&format!("misdirected:{judged}")),
            ip,
            port,
        );
        dr.name = Some(seen);
        sb.log.push(dr);
        return;
    }
    let bl = inner.blocklist();
    let mut d = sb.decide(&bl, ip, port, name.as_deref());
    if let Some(rule) = sb.ask_rule(&d, &bl, ip, port, name.as_deref()) {
        // Held for a person's decision (nothing has gone upstream yet).
        let host = name.as_deref().unwrap_or_default();
        let asker = inner
            .asker
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .map(|a| a.0);
        d = match sb.held(asker, &sb.log.id, &client, host, port, &rule).await {
            Some(a) if a.approved => crate::Decision {
                verdict: Verdict::Allow,
                rule: format!("approved:{}", a.approval),
            },
            Some(a) => deny(&format!("refused:{}", a.approval)),
            None => deny(&format!("withdrawn:{rule}")),
        };
    }
    let mut dr = conn_draft(NetEventKind::Connect, &d, ip, port);
    dr.name = name.clone();
    sb.log.push(dr);
    if !d.allowed() {
        sb.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&conn_id);
        if matches!(peek, Peek::Http(_)) {
            let body = format!(
                "rampart: connection denied by the network policy ({})\n",
                d.rule
            );
            let resp = format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tokio::time::timeout(Duration::from_secs(1), client.write_all(resp.as_bytes()))
                .await;
        }
        return;
    }

    let counters = Counters::default();
    let secrets = sb.secrets();
    let bound = name
        .as_deref()
        .is_some_and(|n| secrets.iter().any(|s| s.bound_to(n, Some(port))));
    // A package registry's HTTPS is terminated too (when the sandbox has a CA: see
    // `docs/network.md`, "Packages"), to read what is fetched and hash it.
    let registry = name
        .as_deref()
        .is_some_and(|n| port == 443 && is_registry_host(n) && sb.ca().is_some());
    let result = match (&peek, &name) {
        (Peek::Tls(_), Some(n)) if bound || registry => {
            intercept(inner, &sb, client, pre, dst, n, &counters, &live.cancel).await
        }
        // Plain HTTP is relayed request by request: every request on the connection must
        // name the destination it was judged by (the same host, or no name when it was
        // judged without one). A secret goes over plain HTTP only when its binding says so
        // (`http://host`), and only at an address the sandbox's resolver answered for the
        // host: no certificate proves who is at the other end, and `open` mode or an
        // address rule admits any address whatever Host the request names.
        (Peek::Http(_), _) => match connect(inner, &sb, dst).await {
            Ok(up) => {
                let c = Rewind::new(pre, client);
                let rl = Relay {
                    sb: &sb,
                    conn: name.as_deref(),
                    ip,
                    port,
                    transport: Transport::Plain {
                        pinned: name.as_deref().is_some_and(|n| sb.is_pinned(ip, n)),
                    },
                    c: &counters,
                };
                http_relay(&rl, c, up, &live.cancel).await
            }
            Err(e) => Err(e),
        },
        _ => match connect(inner, &sb, dst).await {
            Ok(up) => splice(&sb, client, up, &pre, &counters, &live.cancel).await,
            Err(e) => Err(e),
        },
    };
    sb.conns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&conn_id);
    let cut = live.cut.lock().unwrap_or_else(|e| e.into_inner()).take();
    let (verdict, rule) = match cut {
        Some(r) => (Verdict::Deny, r),
        None => match &result {
            Ok(()) => (Verdict::Allow, d.rule.clone()),
            Err(e) => (Verdict::Allow, format!("{} ({})", d.rule, short_err(e))),
        },
    };
    let mut dr = Draft::new(NetEventKind::Close, verdict, rule);
    dr.addrs = vec![ip.to_string()];
    dr.port = Some(port);
    dr.name = name;
    dr.bytes_out = Some(counters.out.load(Ordering::Relaxed));
    dr.bytes_in = Some(counters.inn.load(Ordering::Relaxed));
    sb.log.push(dr);
}

/// A short reason for the log: the error kind, or our own message (never request data).
fn short_err(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::Other => e
            .get_ref()
            .map(|i| i.to_string())
            .unwrap_or_else(|| "error".into())
            .chars()
            .take(120)
            .collect(),
        k => format!("{k}").to_lowercase(),
    }
}

/// Connects to `dst` for `sb`: directly, or through its policy's upstream proxy.
async fn connect(inner: &Inner, sb: &Sandbox, dst: SocketAddr) -> io::Result<Upstream> {
    if let Some(p) = &sb.policy().source.upstream_proxy {
        let bl = inner.blocklist();
        return crate::upstream::dial(p, dst, &inner.upstream_proxy_allow, &bl, &inner.client_tls)
            .await;
    }
    let s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(dst))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "upstream connect timed out"))??;
    let _ = s.set_nodelay(true);
    Ok(Upstream::Tcp(s))
}

/// Reads until the first bytes say what they are. Waits `first` for the first byte and
/// `total` overall.
async fn read_first(c: &mut TcpStream, first: Duration, total: Duration) -> (Vec<u8>, Peek) {
    let mut buf = Vec::with_capacity(2048);
    let start = tokio::time::Instant::now();
    let mut chunk = [0u8; 4096];
    loop {
        let limit = if buf.is_empty() { first } else { total };
        let left = limit.saturating_sub(start.elapsed());
        let n = match tokio::time::timeout(left, c.read(&mut chunk)).await {
            Ok(Ok(n)) => n,
            _ => return unfinished(buf),
        };
        if n == 0 {
            return unfinished(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
        match classify(&buf) {
            Peek::NeedMore if buf.len() < PEEK_CAP => continue,
            Peek::NeedMore => return unfinished(buf),
            p => return (buf, p),
        }
    }
}

/// First bytes that did not finish saying what they are (too long, too slow). An HTTP
/// request head still unfinished is HTTP without a name: it is relayed as HTTP and its
/// requests are judged (so it cannot pass for raw TCP by being long or slow).
fn unfinished(buf: Vec<u8>) -> (Vec<u8>, Peek) {
    const METHODS: [&[u8]; 9] = [
        b"GET ",
        b"POST ",
        b"PUT ",
        b"DELETE ",
        b"HEAD ",
        b"OPTIONS ",
        b"PATCH ",
        b"CONNECT ",
        b"TRACE ",
    ];
    let first_line = buf.split(|b| *b == b'\n').next().unwrap_or(&[]);
    let http = METHODS.iter().any(|m| buf.starts_with(m))
        || (buf.len() > first_line.len() && first_line.windows(7).any(|w| w == b" HTTP/1"));
    if http && classify(&buf) == Peek::NeedMore {
        (buf, Peek::Http(None))
    } else {
        (buf, Peek::Other)
    }
}

/// Applies the sandbox's egress bandwidth limit to `n` bytes about to be sent.
async fn throttle(sb: &Sandbox, n: usize) {
    if let Some(b) = &sb.limiters().egress {
        let d = b.take_debt(n as f64);
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }
}

async fn pump<R, W>(sb: Option<&Sandbox>, r: &mut R, w: &mut W, count: &AtomicU64) -> io::Result<()>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            let _ = w.shutdown().await;
            return Ok(());
        }
        if let Some(sb) = sb {
            throttle(sb, n).await;
        }
        w.write_all(&buf[..n]).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
}

async fn splice(
    sb: &Sandbox,
    client: TcpStream,
    upstream: Upstream,
    pre: &[u8],
    c: &Counters,
    cancel: &CancellationToken,
) -> io::Result<()> {
    let (cr, cw) = client.into_split();
    match upstream {
        Upstream::Tcp(u) => {
            let (ur, uw) = u.into_split();
            splice_halves(sb, (cr, cw), (ur, uw), pre, c, cancel).await
        }
        Upstream::Tls(u) => {
            let (ur, uw) = tokio::io::split(*u);
            splice_halves(sb, (cr, cw), (ur, uw), pre, c, cancel).await
        }
    }
}

/// Relays bytes both ways between the client's and the upstream's halves, `pre` (what was
/// read to judge the connection) first.
async fn splice_halves<CR, CW, UR, UW>(
    sb: &Sandbox,
    (mut cr, mut cw): (CR, CW),
    (mut ur, mut uw): (UR, UW),
    pre: &[u8],
    c: &Counters,
    cancel: &CancellationToken,
) -> io::Result<()>
where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    UR: AsyncRead + Unpin,
    UW: AsyncWrite + Unpin,
{
    let run = async {
        if !pre.is_empty() {
            throttle(sb, pre.len()).await;
            uw.write_all(pre).await?;
            c.out.fetch_add(pre.len() as u64, Ordering::Relaxed);
        }
        tokio::try_join!(
            pump(Some(sb), &mut cr, &mut uw, &c.out),
            pump(None, &mut ur, &mut cw, &c.inn)
        )
        .map(|_| ())
    };
    tokio::select! {
        _ = cancel.cancelled() => Ok(()),
        r = run => r,
    }
}

#[allow(clippy::too_many_arguments)]
async fn intercept(
    inner: &Inner,
    sb: &Sandbox,
    client: TcpStream,
    pre: Vec<u8>,
    dst: SocketAddr,
    name: &str,
    c: &Counters,
    cancel: &CancellationToken,
) -> io::Result<()> {
    // Only a sandbox with a CA has its secret-bound and registry hosts intercepted.
    let ca = sb
        .ca()
        .ok_or_else(|| io::Error::other("the sandbox has no CA"))?;
    let cfg = ca
        .server_config(name)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    let setup = async {
        let tls_client =
            tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(Rewind::new(pre, client)))
                .await
                .map_err(|_| io::Error::other("client handshake timed out"))?
                .map_err(|e| io::Error::other(format!("client handshake: {e}")))?;
        let up = connect(inner, sb, dst).await?;
        let sn = rustls::pki_types::ServerName::try_from(name.to_string())
            .map_err(|_| io::Error::other("bad server name"))?;
        let tls_up = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            tokio_rustls::TlsConnector::from(inner.client_tls.clone()).connect(sn, up),
        )
        .await
        .map_err(|_| io::Error::other("upstream handshake timed out"))?
        .map_err(|e| io::Error::other(format!("upstream tls: {e}")))?;
        Ok::<_, io::Error>((tls_client, tls_up))
    };
    let (tls_client, tls_up) = tokio::select! {
        _ = cancel.cancelled() => return Ok(()),
        r = setup => r?,
    };
    // The upstream proved with its certificate that it is `name`.
    let rl = Relay {
        sb,
        conn: Some(name),
        ip: canonical(dst.ip()),
        port: dst.port(),
        transport: Transport::VerifiedTls,
        c,
    };
    http_relay(&rl, tls_client, tls_up, cancel).await
}

/// A relayed HTTP connection: what it was judged as.
struct Relay<'a> {
    sb: &'a Sandbox,
    /// The name the connection was judged by (`None`: judged without one).
    conn: Option<&'a str>,
    ip: IpAddr,
    port: u16,
    transport: Transport,
    c: &'a Counters,
}

impl Relay<'_> {
    fn log_misdirected(&self, seen: String) {
        let judged = self
            .conn
            .map(str::to_string)
            .unwrap_or_else(|| self.ip.to_string());
        let mut dr = Draft::new(
            NetEventKind::Connect,
            Verdict::Deny,
            format!("misdirected:{judged}"),
        );
        dr.name = Some(seen);
        dr.addrs = vec![self.ip.to_string()];
        dr.port = Some(self.port);
        self.sb.log.push(dr);
    }

    /// The host a request of this connection names: the judged name, else the address.
    fn host(&self) -> String {
        self.conn
            .map(str::to_string)
            .unwrap_or_else(|| self.ip.to_string())
    }

    /// A `package` entry: a completed download (`sha256` and `size`) or a refused one.
    fn log_package(&self, f: &Fetch, verdict: Verdict, rule: &str, got: Option<(String, u64)>) {
        let mut dr = Draft::new(NetEventKind::Package, verdict, rule);
        dr.name = Some(self.host());
        dr.addrs = vec![self.ip.to_string()];
        dr.port = Some(self.port);
        let (sha256, size) = got.unzip();
        dr.package = Some(PackageFetch {
            ecosystem: f.ecosystem.to_string(),
            name: f.name.clone(),
            version: f.version.clone(),
            registry: self.host(),
            path: f.path.clone(),
            sha256,
            size,
        });
        self.sb.log.push(dr);
    }

    /// One entry per secret whose value was taken out of what went back to the sandbox.
    fn log_scrubbed(&self, hits: &[String]) {
        for s in hits {
            let mut dr = Draft::new(
                NetEventKind::SecretUsed,
                Verdict::Deny,
                format!("scrub:{s}"),
            );
            dr.name = Some(
                self.conn
                    .map(str::to_string)
                    .unwrap_or_else(|| self.ip.to_string()),
            );
            dr.addrs = vec![self.ip.to_string()];
            dr.port = Some(self.port);
            dr.secret = Some(s.clone());
            self.sb.log.push(dr);
        }
    }
}

/// What the response side needs to know about the request it answers next.
struct Pending {
    head_method: bool,
    version: u8,
    switch: Switch,
    /// Told whether the connection switched protocols (for a request that may switch).
    decided: Option<tokio::sync::oneshot::Sender<bool>>,
    /// The package download this request is (allowed, with the rule that allowed it).
    package: Option<(Fetch, String)>,
    /// An answer the proxy gives itself instead of the server's (a refused package): sent,
    /// then the connection is closed.
    answer: Option<Vec<u8>>,
}

/// How the request side ended.
enum ReqEnd {
    /// The sandbox closed its side.
    Eof,
    /// A request was refused: the answers to the requests before it are still relayed,
    /// then the connection is closed with this error.
    Refused(io::Error),
}

/// Relays HTTP/1.1 requests from the sandbox, each judged by the destination it names
/// (`rewrite_head`), with the secrets its binding admits on this transport; responses are
/// read one by one and scrubbed of every secret value of the sandbox on their way back.
/// Raw relaying starts only after the server accepted an allowed upgrade (101) or CONNECT.
async fn http_relay<C, U>(
    rl: &Relay<'_>,
    client: C,
    upstream: U,
    cancel: &CancellationToken,
) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (cr, cw) = tokio::io::split(client);
    let (ur, uw) = tokio::io::split(upstream);
    let cr = BufReader::with_capacity(16 * 1024, cr);
    let ur = BufReader::with_capacity(16 * 1024, ur);
    let (tx, rx) = tokio::sync::mpsc::channel::<Pending>(64);
    let requests = relay_requests(rl, cr, uw, tx);
    let responses = relay_responses(rl, ur, cw, rx);
    tokio::pin!(requests, responses);
    let run = async {
        let mut refused = None;
        let mut requests_done = false;
        loop {
            tokio::select! {
                r = &mut requests, if !requests_done => {
                    requests_done = true;
                    match r? {
                        ReqEnd::Eof => {}
                        ReqEnd::Refused(e) => refused = Some(e),
                    }
                }
                r = &mut responses => {
                    r?;
                    return match refused {
                        Some(e) => Err(e),
                        None => Ok(()),
                    };
                }
            }
        }
    };
    tokio::select! {
        _ = cancel.cancelled() => Ok(()),
        r = run => r,
    }
}

async fn relay_requests<R, W>(
    rl: &Relay<'_>,
    mut cr: BufReader<R>,
    mut uw: W,
    tx: tokio::sync::mpsc::Sender<Pending>,
) -> io::Result<ReqEnd>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (sb, c) = (rl.sb, rl.c);
    loop {
        let Some(head) = read_head(&mut cr).await? else {
            let _ = uw.shutdown().await;
            return Ok(ReqEnd::Eof);
        };
        let secrets = sb.secrets();
        let rh = match rewrite_head_at(&head, &secrets, rl.conn, rl.ip, rl.port, rl.transport) {
            Ok(rh) => rh,
            Err(HeadError::Misdirected(seen)) => {
                rl.log_misdirected(seen);
                return Ok(ReqEnd::Refused(io::Error::other(
                    "request for another host on this connection",
                )));
            }
            Err(e @ HeadError::Malformed(_)) => return Err(io::Error::other(e.to_string())),
        };
        for s in &rh.used {
            let mut dr = Draft::new(
                NetEventKind::SecretUsed,
                Verdict::Allow,
                format!("secret:{s}"),
            );
            dr.name = rl.conn.map(str::to_string);
            dr.addrs = vec![rl.ip.to_string()];
            dr.port = Some(rl.port);
            dr.secret = Some(s.clone());
            sb.log.push(dr);
        }
        let package = match package_of(&head, &rl.host()) {
            None => None,
            Some(f) => match sb.policy().packages.judge(&f) {
                Ok(rule) => Some((f, rule)),
                Err(rule) => {
                    rl.log_package(&f, Verdict::Deny, &rule.to_string(), None);
                    let body = format!(
                        "rampart: package {} {} ({}) refused by the network policy ({rule})\n",
                        f.name, f.version, f.ecosystem
                    );
                    let answer = format!(
                        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    tx.send(Pending {
                        head_method: false,
                        version: rh.version,
                        switch: Switch::No,
                        decided: None,
                        package: None,
                        answer: Some(answer.into_bytes()),
                    })
                    .await
                    .map_err(|_| io::Error::other("the response side ended"))?;
                    return Ok(ReqEnd::Refused(io::Error::other(
                        "package refused by the policy",
                    )));
                }
            },
        };
        let (decided, verdict) = if rh.switch == Switch::No {
            (None, None)
        } else {
            let (a, b) = tokio::sync::oneshot::channel();
            (Some(a), Some(b))
        };
        tx.send(Pending {
            head_method: rh.head_method,
            version: rh.version,
            switch: rh.switch,
            decided,
            package,
            answer: None,
        })
        .await
        .map_err(|_| io::Error::other("the response side ended"))?;
        throttle(sb, rh.bytes.len()).await;
        uw.write_all(&rh.bytes).await?;
        c.out.fetch_add(rh.bytes.len() as u64, Ordering::Relaxed);
        match rh.body {
            BodyFraming::None | BodyFraming::Close => {}
            BodyFraming::Length(n) => copy_exact(sb, &mut cr, &mut uw, n, c).await?,
            BodyFraming::Chunked => copy_chunked(sb, &mut cr, &mut uw, c).await?,
        }
        uw.flush().await?;
        // Nothing more is read from the sandbox until the server said whether it switches.
        if let Some(v) = verdict {
            if v.await == Ok(true) {
                pump(Some(sb), &mut cr, &mut uw, &c.out).await?;
                return Ok(ReqEnd::Eof);
            }
        }
    }
}

/// The package a request head fetches (a `GET` whose target is a registry download).
fn package_of(head: &[u8], host: &str) -> Option<Fetch> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut parts = line.split(' ');
    if parts.next()? != "GET" {
        return None;
    }
    recognise(host, parts.next()?)
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter().fold(String::with_capacity(64), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

async fn write_client<W: AsyncWrite + Unpin>(w: &mut W, b: &[u8], c: &Counters) -> io::Result<()> {
    if b.is_empty() {
        return Ok(());
    }
    w.write_all(b).await?;
    c.inn.fetch_add(b.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// A response head, parsed.
struct ResponseHead {
    code: u16,
    version: u8,
    reason: String,
    headers: Vec<Header>,
}

fn parse_response(head: &[u8]) -> io::Result<ResponseHead> {
    let mut hbuf = [httparse::EMPTY_HEADER; 128];
    let mut r = httparse::Response::new(&mut hbuf);
    match r.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(io::Error::other("malformed response head")),
    }
    Ok(ResponseHead {
        code: r.code.unwrap_or(0),
        version: r.version.unwrap_or(1),
        reason: r.reason.unwrap_or("").to_string(),
        headers: r
            .headers
            .iter()
            .map(|h| Header {
                name: h.name.to_string(),
                value: h.value.to_vec(),
            })
            .collect(),
    })
}

impl ResponseHead {
    fn framing(&self, head_method: bool) -> io::Result<BodyFraming> {
        if head_method || self.code == 204 || self.code == 304 || self.code < 200 {
            return Ok(BodyFraming::None);
        }
        let te: Vec<String> = self
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("transfer-encoding"))
            .flat_map(|h| {
                String::from_utf8_lossy(&h.value)
                    .split(',')
                    .map(|t| t.trim().to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .collect();
        if let Some(last) = te.last() {
            return Ok(if last == "chunked" {
                BodyFraming::Chunked
            } else {
                BodyFraming::Close
            });
        }
        let mut len = None;
        for h in &self.headers {
            if h.name.eq_ignore_ascii_case("content-length") {
                let v = std::str::from_utf8(&h.value)
                    .ok()
                    .map(str::trim)
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| io::Error::other("bad content-length in response"))?;
                if len.is_some_and(|l| l != v) {
                    return Err(io::Error::other("conflicting content-length in response"));
                }
                len = Some(v);
            }
        }
        Ok(len.map_or(BodyFraming::Close, BodyFraming::Length))
    }

    /// The head with its framing headers replaced by `extra`.
    fn reframed(&self, extra: &[(&str, &str)], drop_connection: bool) -> Vec<u8> {
        let mut b =
            format!("HTTP/1.{} {} {}\r\n", self.version, self.code, self.reason).into_bytes();
        for h in &self.headers {
            let n = h.name.to_ascii_lowercase();
            if n == "content-length"
                || n == "transfer-encoding"
                || (drop_connection && (n == "connection" || n == "keep-alive"))
            {
                continue;
            }
            b.extend_from_slice(h.name.as_bytes());
            b.extend_from_slice(b": ");
            b.extend_from_slice(&h.value);
            b.extend_from_slice(b"\r\n");
        }
        for (n, v) in extra {
            b.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
        }
        b.extend_from_slice(b"\r\n");
        b
    }
}

/// Reads a body piece by piece by its framing.
struct BodyReader {
    st: BodyState,
    /// The trailer lines of a chunked body (without the final blank line).
    trailers: Vec<u8>,
}

enum BodyState {
    Length(u64),
    ChunkStart,
    ChunkData(u64),
    ChunkEnd,
    Close,
    Done,
}

async fn read_line<R: AsyncRead + Unpin>(r: &mut BufReader<R>) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let n = (&mut *r).take(8192).read_until(b'\n', &mut line).await?;
    if n == 0 || !line.ends_with(b"\n") {
        return Err(io::Error::other("bad chunked body"));
    }
    Ok(line)
}

impl BodyReader {
    fn new(f: BodyFraming) -> Self {
        BodyReader {
            st: match f {
                BodyFraming::None => BodyState::Done,
                BodyFraming::Length(n) => BodyState::Length(n),
                BodyFraming::Chunked => BodyState::ChunkStart,
                BodyFraming::Close => BodyState::Close,
            },
            trailers: Vec::new(),
        }
    }

    /// The next piece of the body's content; `None` at its end.
    async fn next<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut BufReader<R>,
    ) -> io::Result<Option<Vec<u8>>> {
        loop {
            match self.st {
                BodyState::Done => return Ok(None),
                BodyState::Length(0) => self.st = BodyState::Done,
                BodyState::Length(n) | BodyState::ChunkData(n) => {
                    let buf = r.fill_buf().await?;
                    if buf.is_empty() {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    let k = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
                    let piece = buf[..k].to_vec();
                    r.consume(k);
                    let left = n - k as u64;
                    self.st = match self.st {
                        BodyState::Length(_) => BodyState::Length(left),
                        _ if left == 0 => BodyState::ChunkEnd,
                        _ => BodyState::ChunkData(left),
                    };
                    return Ok(Some(piece));
                }
                BodyState::Close => {
                    let buf = r.fill_buf().await?;
                    if buf.is_empty() {
                        self.st = BodyState::Done;
                        return Ok(None);
                    }
                    let piece = buf.to_vec();
                    r.consume(piece.len());
                    return Ok(Some(piece));
                }
                BodyState::ChunkStart => {
                    let line = read_line(r).await?;
                    let text = std::str::from_utf8(&line)
                        .map_err(|_| io::Error::other("bad chunk size"))?;
                    let hex = text.split(';').next().unwrap_or("").trim();
                    if hex.is_empty() || hex.len() > 15 {
                        return Err(io::Error::other("bad chunk size"));
                    }
                    let size = u64::from_str_radix(hex, 16)
                        .map_err(|_| io::Error::other("bad chunk size"))?;
                    if size > 0 {
                        self.st = BodyState::ChunkData(size);
                        continue;
                    }
                    loop {
                        let l = read_line(r).await?;
                        if l == b"\r\n" || l == b"\n" {
                            break;
                        }
                        if self.trailers.len() + l.len() > HEAD_CAP {
                            return Err(io::Error::other("trailers too large"));
                        }
                        self.trailers.extend_from_slice(&l);
                    }
                    self.st = BodyState::Done;
                }
                BodyState::ChunkEnd => {
                    let l = read_line(r).await?;
                    if l != b"\r\n" && l != b"\n" {
                        return Err(io::Error::other("bad chunk end"));
                    }
                    self.st = BodyState::ChunkStart;
                }
            }
        }
    }
}

/// A response body with a length up to this is read whole, scrubbed and sent with its new
/// length; a longer one is sent on as chunks.
const BUFFERED_BODY_CAP: u64 = 64 * 1024;

/// How a response body goes to the sandbox.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    /// As it came, length unchanged (nothing to scrub).
    AsIs,
    /// Read whole, scrubbed, sent with its new length.
    Buffered,
    /// Re-framed as chunks (scrubbing may change its length).
    Chunked,
    /// Until the connection closes (for an HTTP/1.0 client, or a body that ends so).
    Close,
}

async fn relay_responses<R, W>(
    rl: &Relay<'_>,
    mut ur: BufReader<R>,
    mut cw: W,
    mut rx: tokio::sync::mpsc::Receiver<Pending>,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let c = rl.c;
    loop {
        // The next request answered, noticing meanwhile that the server closed.
        let next = tokio::select! {
            biased;
            p = rx.recv() => p,
            r = ur.fill_buf() => match r.map(|b| b.is_empty()) {
                Ok(true) => None,
                Ok(false) => rx.recv().await,
                Err(e) => return Err(e),
            },
        };
        let Some(mut p) = next else {
            let _ = cw.shutdown().await;
            return Ok(());
        };
        if let Some(answer) = p.answer.take() {
            write_client(&mut cw, &answer, c).await?;
            cw.flush().await?;
            let _ = cw.shutdown().await;
            return Ok(());
        }
        let secrets = rl.sb.secrets();
        let mut sc = Scrubber::new(&secrets);
        let mut hits = Vec::new();
        // Interim (1xx) answers go through; then the final one.
        let (raw_head, resp) = loop {
            let Some(head) = read_head(&mut ur).await? else {
                let _ = cw.shutdown().await;
                return Ok(());
            };
            let head = sc.scrub_all(&head, &mut hits);
            let resp = parse_response(&head)?;
            if (100..200).contains(&resp.code) && resp.code != 101 {
                write_client(&mut cw, &head, c).await?;
                continue;
            }
            break (head, resp);
        };
        let switched = match (resp.code, p.switch) {
            (101, Switch::Upgrade) => true,
            (101, _) => {
                return Err(io::Error::other(
                    "101 to a request that asked for no upgrade",
                ))
            }
            (200..=299, Switch::Connect) => true,
            _ => false,
        };
        if let Some(d) = p.decided.take() {
            let _ = d.send(switched);
        }
        if switched {
            write_client(&mut cw, &raw_head, c).await?;
            cw.flush().await?;
            rl.log_scrubbed(&hits);
            return raw_down(rl, ur, cw, sc).await;
        }
        let framing = resp.framing(p.head_method)?;
        // A package download is hashed as it streams, and recorded once whole.
        let mut digest = p
            .package
            .take()
            .filter(|_| resp.code == 200 && framing != BodyFraming::None)
            .map(|(f, rule)| (f, rule, Sha256::new(), 0u64));
        let out = match framing {
            BodyFraming::None => Out::AsIs,
            BodyFraming::Length(_) if !sc.active() => Out::AsIs,
            BodyFraming::Length(n) if n <= BUFFERED_BODY_CAP => Out::Buffered,
            BodyFraming::Close => Out::Close,
            _ if p.version == 0 => Out::Close,
            _ => Out::Chunked,
        };
        if out == Out::Buffered {
            let mut body = BodyReader::new(framing);
            let mut whole = Vec::new();
            while let Some(p) = body.next(&mut ur).await? {
                if let Some((_, _, h, n)) = &mut digest {
                    h.update(&p);
                    *n += p.len() as u64;
                }
                whole.extend_from_slice(&p);
            }
            let whole = sc.scrub_all(&whole, &mut hits);
            let len = whole.len().to_string();
            let mut bytes = resp.reframed(&[("Content-Length", &len)], false);
            bytes.extend_from_slice(&whole);
            write_client(&mut cw, &bytes, c).await?;
            cw.flush().await?;
            rl.log_scrubbed(&hits);
            if let Some((f, rule, h, n)) = digest {
                rl.log_package(&f, Verdict::Allow, &rule, Some((hex(&h.finalize()), n)));
            }
            continue;
        }
        let head = match out {
            Out::AsIs | Out::Buffered => raw_head,
            Out::Chunked => resp.reframed(&[("Transfer-Encoding", "chunked")], false),
            Out::Close => resp.reframed(&[("Connection", "close")], true),
        };
        write_client(&mut cw, &head, c).await?;
        let mut body = BodyReader::new(framing);
        let mut buf = Vec::new();
        loop {
            let piece = body.next(&mut ur).await?;
            if let (Some(p), Some((_, _, h, n))) = (&piece, &mut digest) {
                h.update(p);
                *n += p.len() as u64;
            }
            buf.clear();
            match &piece {
                Some(p) => sc.feed(p, &mut buf, &mut hits),
                None => sc.finish(&mut buf),
            }
            if !buf.is_empty() {
                if out == Out::Chunked {
                    let mut framed = format!("{:x}\r\n", buf.len()).into_bytes();
                    framed.extend_from_slice(&buf);
                    framed.extend_from_slice(b"\r\n");
                    write_client(&mut cw, &framed, c).await?;
                } else {
                    write_client(&mut cw, &buf, c).await?;
                }
                cw.flush().await?;
            }
            if piece.is_none() {
                break;
            }
        }
        if out == Out::Chunked {
            let trailers = sc.scrub_all(&body.trailers, &mut hits);
            let mut end = b"0\r\n".to_vec();
            end.extend_from_slice(&trailers);
            end.extend_from_slice(b"\r\n");
            write_client(&mut cw, &end, c).await?;
        }
        cw.flush().await?;
        rl.log_scrubbed(&hits);
        if let Some((f, rule, h, n)) = digest {
            rl.log_package(&f, Verdict::Allow, &rule, Some((hex(&h.finalize()), n)));
        }
        if out == Out::Close {
            let _ = cw.shutdown().await;
            return Ok(());
        }
    }
}

/// Server -> sandbox after a switch: raw, but a secret value in it ends the connection
/// (it cannot be replaced without breaking the protocol's own framing).
async fn raw_down<R, W>(
    rl: &Relay<'_>,
    mut ur: BufReader<R>,
    mut cw: W,
    mut sc: Scrubber,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut out = Vec::new();
    loop {
        let buf = ur.fill_buf().await?;
        out.clear();
        if buf.is_empty() {
            sc.finish(&mut out);
            write_client(&mut cw, &out, rl.c).await?;
            let _ = cw.shutdown().await;
            return Ok(());
        }
        let n = buf.len();
        let mut hits = Vec::new();
        sc.feed(buf, &mut out, &mut hits);
        ur.consume(n);
        if !hits.is_empty() {
            rl.log_scrubbed(&hits);
            return Err(io::Error::other("a secret value in a raw stream: cut"));
        }
        write_client(&mut cw, &out, rl.c).await?;
        cw.flush().await?;
    }
}

/// Reads one request head (through the blank line). `None` at a clean end of stream.
async fn read_head<R: AsyncRead + Unpin>(r: &mut BufReader<R>) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        let left = HEAD_CAP.saturating_sub(head.len()) as u64;
        if left == 0 {
            return Err(io::Error::other("request head too large"));
        }
        let n = (&mut *r).take(left).read_until(b'\n', &mut line).await?;
        if n == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        if !line.ends_with(b"\n") {
            return Err(io::Error::other("request head too large"));
        }
        let blank = line == b"\r\n" || line == b"\n";
        if blank && head.is_empty() {
            continue; // stray CRLF between requests
        }
        head.extend_from_slice(&line);
        if blank {
            return Ok(Some(head));
        }
    }
}

async fn copy_exact<R, W>(
    sb: &Sandbox,
    r: &mut BufReader<R>,
    w: &mut W,
    mut n: u64,
    c: &Counters,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    while n > 0 {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let k = buf.len().min(n as usize);
        throttle(sb, k).await;
        w.write_all(&buf[..k]).await?;
        r.consume(k);
        n -= k as u64;
        c.out.fetch_add(k as u64, Ordering::Relaxed);
    }
    Ok(())
}

async fn copy_line<R, W>(r: &mut BufReader<R>, w: &mut W, c: &Counters) -> io::Result<Vec<u8>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut line = Vec::new();
    let n = (&mut *r).take(8192).read_until(b'\n', &mut line).await?;
    if n == 0 || !line.ends_with(b"\n") {
        return Err(io::Error::other("bad chunked body"));
    }
    w.write_all(&line).await?;
    c.out.fetch_add(line.len() as u64, Ordering::Relaxed);
    Ok(line)
}

async fn copy_chunked<R, W>(
    sb: &Sandbox,
    r: &mut BufReader<R>,
    w: &mut W,
    c: &Counters,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let line = copy_line(r, w, c).await?;
        let text = std::str::from_utf8(&line).map_err(|_| io::Error::other("bad chunk size"))?;
        let size_hex = text.split(';').next().unwrap_or("").trim();
        let size =
            u64::from_str_radix(size_hex, 16).map_err(|_| io::Error::other("bad chunk size"))?;
        if size == 0 {
            // Trailers, then the blank line.
            loop {
                let l = copy_line(r, w, c).await?;
                if l == b"\r\n" || l == b"\n" {
                    return Ok(());
                }
            }
        }
        copy_exact(sb, r, w, size, c).await?;
        let end = copy_line(r, w, c).await?;
        if end != b"\r\n" && end != b"\n" {
            return Err(io::Error::other("bad chunk end"));
        }
    }
}

/// A stream that first yields bytes already read from it.
#[derive(Debug)]
struct Rewind<S> {
    pre: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Rewind<S> {
    fn new(pre: Vec<u8>, inner: S) -> Self {
        Rewind { pre, pos: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.pre.len() {
            let n = (self.pre.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.pre[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
