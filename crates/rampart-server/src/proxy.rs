//! Relaying one HTTP request to a server listening inside a sandbox, over a byte tunnel the
//! agent opened to it (`AgentClient::tunnel`): the body streamed both ways, an upgrade (a
//! WebSocket) passed through. Shared by the native port proxy (`ports`) and the E2B proxy.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use hyper_util::rt::TokioIo;

/// Headers that belong to one hop, never forwarded either way.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "transfer-encoding",
    "host",
];

/// Removes the hop-by-hop headers and the `private` ones (the proxy's own credentials and
/// routing headers) from `headers`.
pub(crate) fn strip(headers: &mut HeaderMap, private: &[&str]) {
    for h in HOP_BY_HOP.iter().chain(private) {
        headers.remove(*h);
    }
}

/// Constant-time equality of two secrets.
pub(crate) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a request (or answer) asks for a protocol upgrade (e.g. a WebSocket).
pub(crate) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// Makes a request to be sent upstream HTTP/1.1 with its path and query only (origin form).
pub(crate) fn origin_form(parts: &mut axum::http::request::Parts) -> Result<(), String> {
    let path_q = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".into());
    parts.uri = path_q
        .parse()
        .map_err(|e| format!("request path {path_q:?}: {e}"))?;
    parts.version = axum::http::Version::HTTP_11;
    Ok(())
}

/// Sends `req` to the server at the other end of the tunnel `up` (port `port` inside the
/// sandbox) and streams its answer back. The request goes with its path and query as they
/// are, `Host: localhost:{port}` (or `host`), without hop-by-hop headers and without the `private`
/// ones (also removed from the answer). An upgrade (a WebSocket) is passed through: after
/// both sides agree (101), bytes are relayed both ways until either side closes. With `tls`,
/// the server speaks TLS itself: the hop to it is TLS ([`tls_to_sandbox`]).
pub(crate) async fn forward_over(
    up: rampart_core::Tunnel,
    port: u16,
    req: Request,
    private: &[&str],
    host: Option<&str>,
    tls: bool,
) -> Result<Response, String> {
    if !tls {
        return forward_on(up, port, req, private, host).await;
    }
    let stream = tls_to_sandbox(TokioIo::new(up), host.unwrap_or("localhost"))
        .await
        .map_err(|e| format!("TLS with the sandbox's server: {e}"))?;
    forward_on(TokioIo::new(stream), port, req, private, host).await
}

/// A TLS client over `io` to a server inside a sandbox (E2B's `httpsPorts`), with SNI `host`
/// (its part before any `:`; `localhost` if it is not a DNS name). The server's certificate
/// is not verified (a server inside a sandbox has no certificate anyone could check; E2B's
/// proxy does the same): this encrypts the hop, it authenticates nothing. The handshake's
/// signatures are still checked against the certificate's key.
pub(crate) async fn tls_to_sandbox<T>(
    io: T,
    host: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<T>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use rustls::pki_types::ServerName;
    static CONFIG: std::sync::OnceLock<std::sync::Arc<rustls::ClientConfig>> =
        std::sync::OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut c = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|_| {
                rustls::ClientConfig::builder_with_provider(provider.clone())
                    .with_protocol_versions(rustls::DEFAULT_VERSIONS)
                    .expect("rustls's default versions")
            })
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(Unverified(provider)))
            .with_no_client_auth();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        std::sync::Arc::new(c)
    });
    let name = host.split(':').next().unwrap_or("localhost");
    let name = ServerName::try_from(name.to_owned())
        .unwrap_or_else(|_| ServerName::try_from("localhost").expect("a DNS name"));
    tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, io)
        .await
}

/// Accepts any certificate (see [`tls_to_sandbox`]); checks the handshake's signatures.
#[derive(Debug)]
struct Unverified(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// [`forward_over`] on a connection `io` to the server.
async fn forward_on<T>(
    io: T,
    port: u16,
    mut req: Request,
    private: &[&str],
    host: Option<&str>,
) -> Result<Response, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    // Header names as clients wrote them on the wire (`Host`, `User-Agent`), which servers
    // and programs that read raw requests expect, not HTTP/2's lowercase.
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake::<_, Body>(io)
        .await
        .map_err(|e| format!("handshake with the sandbox's server: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("port proxy connection: {e}");
        }
    });
    let upgrade = is_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let keep: Vec<(header::HeaderName, HeaderValue)> = if upgrade {
        [header::CONNECTION, header::UPGRADE]
            .into_iter()
            .filter_map(|h| parts.headers.get(&h).cloned().map(|v| (h, v)))
            .collect()
    } else {
        Vec::new()
    };
    strip(&mut parts.headers, private);
    parts.headers.extend(keep);
    let host = host
        .and_then(|h| HeaderValue::from_str(h).ok())
        .or_else(|| HeaderValue::from_str(&format!("localhost:{port}")).ok())
        .unwrap_or(HeaderValue::from_static("localhost"));
    parts.headers.insert(header::HOST, host);
    origin_form(&mut parts)?;
    let mut resp = sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|e| format!("the sandbox's server: {e}"))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err("the sandbox's server switched protocols unasked".into());
        };
        let server_upgrade = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            let (Ok(c), Ok(s)) = (client_upgrade.await, server_upgrade.await) else {
                return;
            };
            let mut c = TokioIo::new(c);
            let mut s = TokioIo::new(s);
            let _ = tokio::io::copy_bidirectional(&mut c, &mut s).await;
        });
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = resp.into_parts();
    strip(&mut parts.headers, private);
    Ok(Response::from_parts(parts, Body::new(body)))
}
