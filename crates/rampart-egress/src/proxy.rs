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

use rampart_types::network::{NetEventKind, Verdict};
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf,
};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::netlog::Draft;
use crate::peek::{classify, Peek};
use crate::policy::canonical;
use crate::secrets::{rewrite_head, BodyFraming};
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
    let d = sb.decide(&inner.blocklist(), ip, port, name.as_deref());
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
    let result = match (&peek, &name) {
        (Peek::Tls(_), Some(n)) if bound => {
            intercept(inner, &sb, client, pre, dst, n, &counters, &live.cancel).await
        }
        // Plain HTTP with a name is relayed request by request: every request on the
        // connection must name the same host. A bound host gets its secrets only at an
        // address the sandbox's resolver answered for it: no certificate proves who is at
        // the other end, and `open` mode or an address rule admits any address whatever
        // Host the request names.
        (Peek::Http(_), Some(n)) => match connect(dst).await {
            Ok(up) => {
                let c = Rewind::new(pre, client);
                let inject = sb.is_pinned(ip, n);
                http_relay(&sb, c, up, n, port, inject, &counters, &live.cancel).await
            }
            Err(e) => Err(e),
        },
        _ => match connect(dst).await {
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

async fn connect(dst: SocketAddr) -> io::Result<TcpStream> {
    let s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(dst))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "upstream connect timed out"))??;
    let _ = s.set_nodelay(true);
    Ok(s)
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
            _ => return (buf, Peek::Other),
        };
        if n == 0 {
            return (buf, Peek::Other);
        }
        buf.extend_from_slice(&chunk[..n]);
        match classify(&buf) {
            Peek::NeedMore if buf.len() < PEEK_CAP => continue,
            Peek::NeedMore => return (buf, Peek::Other),
            p => return (buf, p),
        }
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
    upstream: TcpStream,
    pre: &[u8],
    c: &Counters,
    cancel: &CancellationToken,
) -> io::Result<()> {
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
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
    // Every sandbox with secrets has a CA (and only secret-bound hosts are intercepted).
    let ca = sb
        .ca()
        .ok_or_else(|| io::Error::other("the sandbox has no CA (no secrets)"))?;
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
        let up = connect(dst).await?;
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
    http_relay(sb, tls_client, tls_up, name, dst.port(), true, c, cancel).await
}

/// Relays HTTP/1.1 requests from the sandbox to `host`, placing secrets into each request
/// head when `inject` says the upstream is known to be that host; responses are spliced
/// back unchanged.
#[allow(clippy::too_many_arguments)]
async fn http_relay<C, U>(
    sb: &Sandbox,
    client: C,
    upstream: U,
    host: &str,
    port: u16,
    inject: bool,
    c: &Counters,
    cancel: &CancellationToken,
) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let mut cr = BufReader::with_capacity(16 * 1024, cr);
    let requests = async {
        loop {
            let Some(head) = read_head(&mut cr).await? else {
                let _ = uw.shutdown().await;
                return Ok(());
            };
            let secrets = sb.secrets();
            let secrets: &[_] = if inject { &secrets } else { &[] };
            let rh = rewrite_head(&head, secrets, host, port).map_err(io::Error::other)?;
            if let Some(h) = &rh.host {
                if h != host {
                    let mut dr = Draft::new(
                        NetEventKind::Connect,
                        Verdict::Deny,
                        format!("misdirected:{host}"),
                    );
                    dr.name = Some(h.clone());
                    dr.port = Some(port);
                    sb.log.push(dr);
                    return Err(io::Error::other(
                        "request for another host on this connection",
                    ));
                }
            }
            for s in &rh.used {
                let mut dr = Draft::new(
                    NetEventKind::SecretUsed,
                    Verdict::Allow,
                    format!("secret:{s}"),
                );
                dr.name = Some(host.to_string());
                dr.port = Some(port);
                dr.secret = Some(s.clone());
                sb.log.push(dr);
            }
            throttle(sb, rh.bytes.len()).await;
            uw.write_all(&rh.bytes).await?;
            c.out.fetch_add(rh.bytes.len() as u64, Ordering::Relaxed);
            match rh.body {
                BodyFraming::None => {}
                BodyFraming::Length(n) => copy_exact(sb, &mut cr, &mut uw, n, c).await?,
                BodyFraming::Chunked => copy_chunked(sb, &mut cr, &mut uw, c).await?,
            }
            uw.flush().await?;
            if rh.upgrade {
                return pump(Some(sb), &mut cr, &mut uw, &c.out).await;
            }
        }
    };
    let responses = pump(None, &mut ur, &mut cw, &c.inn);
    tokio::select! {
        _ = cancel.cancelled() => Ok(()),
        r = async { tokio::try_join!(requests, responses) } => r.map(|_| ()),
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
