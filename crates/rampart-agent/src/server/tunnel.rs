//! The port tunnel: `GET /tunnel/{port}` with `Connection: upgrade` and
//! `Upgrade: rampart-tunnel` connects to `127.0.0.1:{port}` inside the sandbox (the agent runs
//! in the sandbox's network namespace) and, after `101 Switching Protocols`, relays raw bytes
//! both ways until either side closes. Whatever runs over TCP passes: HTTP, NDJSON streams,
//! WebSockets.
//!
//! A port outside 1..=65535 answers 400; nothing listening answers 502
//! `{"code":502,"message":"port is not open"}` (before the upgrade, so the caller can tell).
//!
//! `GET /tunnel/` (no port) answers `{"listening": [ports]}`: the TCP ports listening inside
//! on an address the tunnel reaches (`127.0.0.1`, `0.0.0.0`, `::`), ascending.

use super::{http_error, Body};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, UPGRADE};
use hyper::{Method, Request, Response, StatusCode};

/// The `Upgrade` protocol name of the tunnel.
pub const PROTOCOL: &str = "rampart-tunnel";

/// The path prefix of the tunnel endpoint.
pub const PREFIX: &str = "/tunnel/";

/// Whether the request asks to upgrade to the tunnel protocol.
fn wants_tunnel(req: &Request<Incoming>) -> bool {
    let has = |name, want: &str| {
        req.headers().get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(want)))
        })
    };
    has(UPGRADE, PROTOCOL) && has(CONNECTION, "upgrade")
}

/// Parses the port of `/tunnel/{port}`: 1..=65535.
pub fn parse_port(rest: &str) -> Option<u16> {
    if rest.is_empty() || rest.len() > 5 || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse::<u16>().ok().filter(|&p| p != 0)
}

/// The listening ports of a `/proc/net/tcp` or `tcp6` table whose address the tunnel
/// reaches (`127.0.0.1`, `0.0.0.0`, `::`, `::ffff:127.0.0.1`).
pub fn parse_listening(table: &str) -> Vec<u16> {
    const REACHABLE: [&str; 4] = [
        "0100007F",
        "00000000",
        "00000000000000000000000000000000",
        "0000000000000000FFFF00000100007F",
    ];
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (addr, port) = f.get(1)?.split_once(':')?;
            (f.get(3) == Some(&"0A") && REACHABLE.contains(&addr))
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

/// `GET /tunnel/`: `{"listening": [ports]}` from this network namespace's TCP tables.
async fn listening() -> Response<Body> {
    let mut ports = std::collections::BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(t) = tokio::fs::read_to_string(table).await {
            ports.extend(parse_listening(&t));
        }
    }
    super::json(&serde_json::json!({ "listening": ports }))
}

/// Serves `/tunnel/{port}` (`rest` is what follows the prefix).
pub async fn tunnel(mut req: Request<Incoming>, rest: &str) -> Response<Body> {
    if rest.is_empty() && req.method() == Method::GET && !wants_tunnel(&req) {
        return listening().await;
    }
    if req.method() != Method::GET {
        return http_error(405, "method not allowed: the tunnel is opened with GET");
    }
    let Some(port) = parse_port(rest) else {
        return http_error(400, &format!("invalid port {rest:?}: must be 1..65535"));
    };
    if !wants_tunnel(&req) {
        return http_error(
            400,
            &format!("the tunnel needs `Connection: upgrade` and `Upgrade: {PROTOCOL}`"),
        );
    }
    let mut upstream = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return http_error(502, "port is not open");
        }
        Err(e) => return http_error(502, &format!("port is not open: {e}")),
    };
    let _ = upstream.set_nodelay(true);
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(up) => {
                let mut down = hyper_util::rt::TokioIo::new(up);
                // Ends when both directions have ended (each EOF is passed on as a shutdown).
                let _ = tokio::io::copy_bidirectional(&mut down, &mut upstream).await;
            }
            Err(e) => eprintln!("rampart-agent: tunnel to port {port}: upgrade failed: {e}"),
        }
    });
    let mut r = Response::new(Body::Full(None));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    r.headers_mut()
        .insert(UPGRADE, HeaderValue::from_static(PROTOCOL));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_ports_parse() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1
   1: 0100007F:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2
   2: 0100007F:0051 0100007F:1234 01 00000000:00000000 00:00000000 00000000     0        0 3
   3: 0200000A:0052 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4
";
        assert_eq!(parse_listening(tcp), vec![8000, 80]);
        let tcp6 = "  sl  local_address remote_address st
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A
   1: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A
";
        assert_eq!(parse_listening(tcp6), vec![8080]);
    }

    #[test]
    fn ports_parse() {
        assert_eq!(parse_port("1"), Some(1));
        assert_eq!(parse_port("49999"), Some(49999));
        assert_eq!(parse_port("65535"), Some(65535));
        for bad in [
            "", "0", "65536", "99999", "-1", "+80", "80/x", "123456", " 80",
        ] {
            assert_eq!(parse_port(bad), None, "{bad:?}");
        }
    }
}
