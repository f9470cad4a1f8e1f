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
/// both sides agree (101), bytes are relayed both ways until either side closes.
pub(crate) async fn forward_over(
    up: hyper::upgrade::Upgraded,
    port: u16,
    mut req: Request,
    private: &[&str],
    host: Option<&str>,
) -> Result<Response, String> {
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake::<_, Body>(up)
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
