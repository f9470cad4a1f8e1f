//! Where an allowed connection goes out: straight to its destination, or through the SOCKS5
//! proxy the sandbox's policy names (`upstream_proxy`, E2B's `egress_proxy`).
//!
//! The proxy is dialed from the host, after the policy judged the connection, so nothing
//! inside the sandbox can see it or route around it. Its address is resolved at each dial and
//! every address it resolves to must be one the daemon may connect to for a caller: a public
//! address, or one in a range the operator allows ([`crate::EgressConfig::upstream_proxy_allow`]);
//! never the host's own, a metadata or loopback address otherwise. The address dialed is the
//! one checked. The destination is given to the proxy as the address the policy judged
//! (never a name the proxy would resolve again). When the proxy cannot be reached, refuses,
//! or does not speak SOCKS5, the connection fails: it never falls back to going out directly.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ipnet::IpNet;
use rampart_types::UpstreamProxy;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::policy::{canonical, special, Blocklist};

/// How long a dial (TCP, TLS, SOCKS5 handshake) may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to where an allowed connection goes.
pub(crate) enum Upstream {
    /// Plain TCP: to the destination, or to the proxy (which then relays).
    Tcp(TcpStream),
    /// TLS to the proxy, which relays.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Upstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Upstream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Upstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Upstream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Upstream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Upstream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A proxy address that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("upstream proxy: {0}")]
struct InvalidProxy(#[source] rampart_types::UpstreamProxyError);

/// An I/O error for a proxy address that does not parse, keeping why as its source.
fn invalid(e: rampart_types::UpstreamProxyError) -> io::Error {
    io::Error::other(InvalidProxy(e))
}

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(format!("upstream proxy: {}", msg.into()))
}

/// Why the daemon may not dial `ip` for a caller's proxy (None: it may).
pub fn refused_proxy_address(ip: IpAddr, allow: &[IpNet], blocklist: &Blocklist) -> Option<String> {
    let ip = canonical(ip);
    if allow.iter().any(|n| n.contains(&ip)) {
        return None;
    }
    let why = blocklist
        .always_blocked(ip)
        .or_else(|| blocklist.on_host_network(ip).then_some("host network"))
        .or_else(|| special(ip));
    why.map(|w| {
        format!(
            "{ip} is not a public address ({w}); a proxy must be reachable on a public address \
             unless the operator allows its range ([network] upstream_proxy_allow)"
        )
    })
}

/// Resolves the proxy's address; every address it resolves to must be allowed
/// ([`refused_proxy_address`]). Returns the first.
pub async fn resolve_proxy(
    p: &UpstreamProxy,
    allow: &[IpNet],
    blocklist: &Blocklist,
) -> io::Result<SocketAddr> {
    let (host, port) = p.host_port().map_err(invalid)?;
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => {
            tokio::time::timeout(DIAL_TIMEOUT, tokio::net::lookup_host((host.as_str(), port)))
                .await
                .map_err(|_| err(format!("resolving {host} timed out")))?
                .map_err(|e| err(format!("{host} does not resolve: {e}")))?
                .collect()
        }
    };
    if addrs.is_empty() {
        return Err(err(format!("{host} has no address")));
    }
    for a in &addrs {
        if let Some(why) = refused_proxy_address(a.ip(), allow, blocklist) {
            return Err(err(why));
        }
    }
    Ok(addrs[0])
}

/// Connects to `dst` through the proxy `p`: TCP (and TLS) to the proxy's checked address,
/// then SOCKS5 CONNECT to `dst` (with the user name and password when given).
pub(crate) async fn dial(
    p: &UpstreamProxy,
    dst: SocketAddr,
    allow: &[IpNet],
    blocklist: &Blocklist,
    roots: &Arc<rustls::ClientConfig>,
) -> io::Result<Upstream> {
    let run = async {
        let at = resolve_proxy(p, allow, blocklist).await?;
        let tcp = TcpStream::connect(at)
            .await
            .map_err(|e| err(format!("connecting to {at}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        if !p.tls {
            return Ok(Upstream::Tcp(socks(tcp, p, dst).await?));
        }
        let config = match &p.ca_cert {
            Some(pem) => tls_config(pem)?,
            None => roots.clone(),
        };
        let (host, _) = p.host_port().map_err(invalid)?;
        let name = p.server_name.clone().unwrap_or(host);
        let sn = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|_| err(format!("{name:?} is not a server name")))?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(sn, tcp)
            .await
            .map_err(|e| err(format!("TLS with {at}: {e}")))?;
        Ok(Upstream::Tls(Box::new(socks(tls, p, dst).await?)))
    };
    tokio::time::timeout(DIAL_TIMEOUT, run)
        .await
        .map_err(|_| err("timed out"))?
}

/// The SOCKS5 handshake on `s`, asking for `dst`; `s` then carries the connection.
async fn socks<S>(s: S, p: &UpstreamProxy, dst: SocketAddr) -> io::Result<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let r = match (&p.username, &p.password) {
        (Some(u), pw) => {
            tokio_socks::tcp::Socks5Stream::connect_with_password_and_socket(
                s,
                dst,
                u,
                pw.as_deref().unwrap_or_default(),
            )
            .await
        }
        (None, _) => tokio_socks::tcp::Socks5Stream::connect_with_socket(s, dst).await,
    };
    r.map(|s| s.into_inner())
        .map_err(|e| err(format!("SOCKS5 to {dst}: {e}")))
}

/// A client config trusting only the PEM certificates `pem`.
fn tls_config(pem: &str) -> io::Result<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let c = c.map_err(|e| err(format!("ca_cert: {e}")))?;
        roots.add(c).map_err(|e| err(format!("ca_cert: {e}")))?;
    }
    if roots.is_empty() {
        return Err(err("ca_cert holds no certificate"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let c = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_addresses_must_be_public_unless_allowed() {
        let bl = Blocklist::default();
        for bad in [
            "127.0.0.1",
            "10.1.2.3",
            "169.254.169.254",
            "192.168.1.1",
            "::1",
        ] {
            let ip: IpAddr = bad.parse().unwrap();
            assert!(refused_proxy_address(ip, &[], &bl).is_some(), "{bad}");
        }
        assert!(refused_proxy_address("8.8.8.8".parse().unwrap(), &[], &bl).is_none());
        let allow: Vec<IpNet> = vec!["10.1.0.0/16".parse().unwrap()];
        assert!(refused_proxy_address("10.1.2.3".parse().unwrap(), &allow, &bl).is_none());
        assert!(refused_proxy_address("10.2.0.1".parse().unwrap(), &allow, &bl).is_some());
    }

    #[tokio::test]
    async fn a_refused_proxy_address_is_never_dialed() {
        let bl = Blocklist::default();
        let p = UpstreamProxy {
            address: "127.0.0.1:1080".into(),
            username: None,
            password: None,
            tls: false,
            server_name: None,
            ca_cert: None,
        };
        let e = resolve_proxy(&p, &[], &bl).await.unwrap_err();
        assert!(e.to_string().contains("not a public address"), "{e}");
    }
}
