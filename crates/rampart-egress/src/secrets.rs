//! Secrets bound to hosts: placeholders, validation, and rewriting request headers.

use base64::Engine;
use rampart_types::network::{SecretInfo, SecretInjection, SecretSpec};
use rand::Rng;

use crate::policy::{Rule, Target};
use crate::EgressError;

/// A secret value; its `Debug` never shows it.
#[derive(Clone)]
pub(crate) struct SecretValue(String);

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A secret as the proxy holds it.
#[derive(Debug)]
pub(crate) struct BoundSecret {
    pub name: String,
    value: SecretValue,
    pub host_rules: Vec<Rule>,
    /// The hosts (of `host_rules`) written `http://host`: plain HTTP to them gets the value
    /// too (at an address the sandbox's resolver answered for them).
    pub plain_rules: Vec<Rule>,
    pub hosts: Vec<String>,
    pub inject: SecretInjection,
    pub placeholder: String,
    pub env: Option<String>,
}

fn bad(name: &str, reason: impl Into<String>) -> EgressError {
    EgressError::InvalidSecret {
        name: name.to_string(),
        reason: reason.into(),
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A new placeholder `rampart-secret-<name>-<32 hex digits>`.
pub(crate) fn new_placeholder(name: &str) -> String {
    let r: [u8; 16] = rand::thread_rng().gen();
    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
    format!("rampart-secret-{name}-{hex}")
}

impl BoundSecret {
    /// Validates `spec`; `placeholder` is the one to keep (a restarted daemon reuses it).
    pub fn new(spec: &SecretSpec, placeholder: Option<String>) -> Result<Self, EgressError> {
        let name = &spec.name;
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(bad(name, "name must be 1-64 letters, digits, '_' or '-'"));
        }
        if spec.value.is_empty() {
            return Err(bad(name, "empty value"));
        }
        if spec
            .value
            .bytes()
            .any(|b| b == b'\r' || b == b'\n' || b == 0)
        {
            return Err(bad(name, "value must not contain CR, LF or NUL"));
        }
        if spec.hosts.is_empty() {
            return Err(bad(
                name,
                "no hosts: a secret must be bound to at least one host",
            ));
        }
        let mut host_rules = Vec::new();
        let mut plain_rules = Vec::new();
        for h in &spec.hosts {
            // `http://host`: the binding allows plain HTTP to that host as well.
            let (h, plain) = match h.get(..7) {
                Some(p) if p.eq_ignore_ascii_case("http://") => (&h[7..], true),
                _ => (h.as_str(), false),
            };
            let r = Rule::parse(h).map_err(|e| bad(name, e.to_string()))?;
            if matches!(r.target, Target::Net(_)) {
                return Err(bad(
                    name,
                    format!("host {h:?} must be a domain, not an address"),
                ));
            }
            if plain {
                plain_rules.push(r.clone());
            }
            host_rules.push(r);
        }
        match &spec.inject {
            SecretInjection::Header { name: h, template } => {
                if !is_token(h) {
                    return Err(bad(name, format!("invalid header name {h:?}")));
                }
                if !template.contains("{value}") {
                    return Err(bad(name, "header template must contain {value}"));
                }
                if template.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                    return Err(bad(name, "header template must not contain CR, LF or NUL"));
                }
            }
            SecretInjection::Basic { username } => {
                if username.contains(':') || username.bytes().any(|b| b < 0x20) {
                    return Err(bad(
                        name,
                        "basic-auth user name must not contain ':' or controls",
                    ));
                }
            }
            SecretInjection::Placeholder => {}
        }
        if let Some(env) = &spec.env {
            let ok = !env.is_empty()
                && !env.as_bytes()[0].is_ascii_digit()
                && env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok {
                return Err(bad(name, format!("invalid env var name {env:?}")));
            }
        }
        let placeholder = placeholder
            .filter(|p| p.starts_with(&format!("rampart-secret-{name}-")))
            .unwrap_or_else(|| new_placeholder(name));
        Ok(BoundSecret {
            name: name.clone(),
            value: SecretValue(spec.value.clone()),
            host_rules,
            plain_rules,
            hosts: spec.hosts.clone(),
            inject: spec.inject.clone(),
            placeholder,
            env: spec.env.clone(),
        })
    }

    /// Whether requests to `host` (normalized, port given if known) get this secret.
    pub fn bound_to(&self, host: &str, port: Option<u16>) -> bool {
        self.host_rules
            .iter()
            .any(|r| r.matches_name(host) && r.matches_port(port))
    }

    /// Whether plain HTTP requests to `host` may get this secret (its binding says
    /// `http://host`).
    pub fn plain_http_to(&self, host: &str, port: Option<u16>) -> bool {
        self.plain_rules
            .iter()
            .any(|r| r.matches_name(host) && r.matches_port(port))
    }

    /// What the API shows.
    pub fn info(&self) -> SecretInfo {
        SecretInfo {
            name: self.name.clone(),
            hosts: self.hosts.clone(),
            inject: self.inject.clone(),
            placeholder: self.placeholder.clone(),
            env: self.env.clone(),
        }
    }
}

/// One header line of a head.
pub(crate) struct Header {
    pub name: String,
    pub value: Vec<u8>,
}

fn replace_all(hay: &[u8], needle: &[u8], with: &[u8]) -> Option<Vec<u8>> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    let mut found = false;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
            found = true;
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    found.then_some(out)
}

/// Headers that carry credentials: where a `placeholder` secret may be put (its placeholder
/// anywhere else stays a placeholder, so that a header the server reflects never carries
/// the value).
pub(crate) fn is_credential_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "authorization" | "cookie" | "api-key" | "apikey" | "token" | "key"
    ) || [
        "-key",
        "-token",
        "-secret",
        "-auth",
        "-authorization",
        "-credential",
        "-credentials",
        "-password",
        "-apikey",
    ]
    .iter()
    .any(|sfx| n.ends_with(sfx))
}

/// What the proxy knows about the other end of a relayed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// TLS whose certificate the proxy verified for the connection's name.
    VerifiedTls,
    /// Plain HTTP; `pinned`: the destination is an address the sandbox's resolver answered
    /// for the connection's name. Only secrets whose binding allows plain HTTP go, and only
    /// then.
    Plain { pinned: bool },
}

/// What a request asks for after it, besides more requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Switch {
    /// Nothing: the connection stays HTTP.
    No,
    /// A `CONNECT`: a tunnel once the server answers 2xx.
    Connect,
    /// A WebSocket upgrade: raw once the server answers 101.
    Upgrade,
}

/// A parsed request head ready to forward.
#[derive(Debug)]
pub(crate) struct RequestHead {
    /// The bytes to send upstream (secrets in place).
    pub bytes: Vec<u8>,
    /// Request body framing.
    pub body: BodyFraming,
    /// Whether the connection may switch protocols after it (and how).
    pub switch: Switch,
    /// A `HEAD` request (its response has no body).
    pub head_method: bool,
    /// HTTP/1.x minor version.
    pub version: u8,
    /// Names of the secrets injected.
    pub used: Vec<String>,
}

/// Why a request head is not forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// The request names another destination than the connection's, names two, or names
    /// one that does not parse: the text it named (for the log; never a header value but
    /// the host's).
    Misdirected(String),
    /// Not a request this relay forwards.
    Malformed(&'static str),
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadError::Misdirected(_) => f.write_str("request for another host on this connection"),
            HeadError::Malformed(r) => f.write_str(r),
        }
    }
}

/// How the body of a request or response is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    None,
    Length(u64),
    Chunked,
    /// Until the server closes (responses only).
    Close,
}

/// Text of a host for the log: printable ASCII, at most 255 characters.
fn log_text(v: &str) -> String {
    v.chars()
        .take(255)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

/// The parsed headers of a head, owned.
fn owned_headers(h: &[httparse::Header<'_>]) -> Vec<Header> {
    h.iter()
        .map(|h| Header {
            name: h.name.to_string(),
            value: h.value.to_vec(),
        })
        .collect()
}

/// Whether the first request head in `buf` (the bytes the proxy peeked) fails to name its
/// destination unambiguously (one `Host` that parses, a target that agrees with it and has
/// the connection's port): `Some` with the text it named then, `None` when it is fine. A
/// head that is not complete or does not parse is left to the relay (`None`).
pub(crate) fn first_request_misdirected(buf: &[u8], port: u16) -> Option<String> {
    let mut hbuf = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut hbuf);
    let Ok(httparse::Status::Complete(_)) = req.parse(buf) else {
        return None;
    };
    let headers = owned_headers(req.headers);
    match request_destination(
        req.method.unwrap_or("GET"),
        req.path.unwrap_or("/"),
        &headers,
        port,
    ) {
        Err(HeadError::Misdirected(seen)) => Some(seen),
        _ => None,
    }
}

/// The destination a request names, judged strictly: at most one `Host`, which must parse;
/// an absolute-form target (or a CONNECT's authority, which a server obeys over Host) that
/// must parse, carry no user info and agree with the Host header.
fn request_destination(
    method: &str,
    target: &str,
    headers: &[Header],
    port: u16,
) -> Result<Option<crate::peek::HostId>, HeadError> {
    use crate::peek::parse_host;
    let hosts: Vec<&Header> = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .collect();
    let host_text = |h: &Header| String::from_utf8_lossy(&h.value).trim().to_string();
    let host = match hosts.as_slice() {
        [] => None,
        [h] => {
            let t = host_text(h);
            if t.is_empty() {
                None
            } else {
                Some(parse_host(&t).ok_or_else(|| HeadError::Misdirected(log_text(&t)))?)
            }
        }
        many => {
            let all: Vec<String> = many.iter().map(|h| host_text(h)).collect();
            // The log names the first one that is not the first (the one smuggled in).
            return Err(HeadError::Misdirected(log_text(
                all.iter()
                    .skip(1)
                    .find(|t| **t != all[0])
                    .unwrap_or(&all[0]),
            )));
        }
    };
    let authority = if method.eq_ignore_ascii_case("CONNECT") {
        Some(target)
    } else if target.starts_with('/') || target == "*" {
        None // origin-form (a `://` in it is in the path or query) or asterisk-form
    } else {
        let (scheme, rest) = target
            .split_once("://")
            .ok_or(HeadError::Malformed("bad request target"))?;
        if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
            return Err(HeadError::Malformed("bad request target"));
        }
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        Some(&rest[..end])
    };
    let Some(a) = authority else {
        return Ok(host);
    };
    if a.contains('@') {
        return Err(HeadError::Misdirected(log_text(a)));
    }
    let t = parse_host(a).ok_or_else(|| HeadError::Misdirected(log_text(a)))?;
    if let Some(h) = &host {
        if *h != t {
            return Err(HeadError::Misdirected(log_text(a)));
        }
    }
    // A target's port, when it has one, is the connection's: a server that forwards (a
    // proxy) would otherwise go to a port the policy did not judge.
    if target_port(a).is_some_and(|p| p != port) {
        return Err(HeadError::Misdirected(log_text(a)));
    }
    Ok(Some(t))
}

/// The port of an authority that parsed (`host:port`, `[v6]:port`), if it names one.
fn target_port(a: &str) -> Option<u16> {
    let after = match a.strip_prefix('[') {
        Some(rest) => rest.split_once(']')?.1.strip_prefix(':')?,
        None => a.split_once(':')?.1,
    };
    after.parse().ok()
}

/// [`rewrite_head_at`] for a connection to an address no request names (tests).
#[cfg(test)]
pub(crate) fn rewrite_head(
    head: &[u8],
    secrets: &[std::sync::Arc<BoundSecret>],
    conn: Option<&str>,
    port: u16,
    transport: Transport,
) -> Result<RequestHead, HeadError> {
    let ip = std::net::IpAddr::from([198, 51, 100, 4]);
    rewrite_head_at(head, secrets, conn, ip, port, transport)
}

/// Parses a complete request head (through the blank line), checks that it names the
/// connection's destination (`conn`: the name judged, `None` for a connection to `ip`
/// judged without one, which only requests naming no host or that address may use; over
/// verified TLS a request without Host goes to the SNI's host, over plain HTTP a named
/// connection's requests must name it) and, only then, places the secrets bound to `conn`
/// that `transport` admits. Errors are short reasons for the log (they never contain
/// header values).
pub(crate) fn rewrite_head_at(
    head: &[u8],
    secrets: &[std::sync::Arc<BoundSecret>],
    conn: Option<&str>,
    ip: std::net::IpAddr,
    port: u16,
    transport: Transport,
) -> Result<RequestHead, HeadError> {
    use crate::peek::HostId;
    let mut hbuf = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut hbuf);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => {
            return Err(HeadError::Malformed("incomplete request head"))
        }
        Err(_) => return Err(HeadError::Malformed("malformed request head")),
    }
    let method = req.method.unwrap_or("GET").to_string();
    let path = req.path.unwrap_or("/").to_string();
    let version = req.version.unwrap_or(1);
    let mut headers = owned_headers(req.headers);
    // One request, one destination: judged before anything else.
    let dest = request_destination(&method, &path, &headers, port)?;
    let tls = transport == Transport::VerifiedTls;
    match (conn, &dest) {
        (Some(c), Some(HostId::Name(n))) if n == c => {}
        (Some(_), None) if tls => {}
        (Some(c), None) => return Err(HeadError::Misdirected(format!("(no host for {c})"))),
        (None, None) => {}
        (None, Some(HostId::Addr(a))) if crate::policy::canonical(*a) == ip => {}
        (_, Some(HostId::Name(n))) => return Err(HeadError::Misdirected(n.clone())),
        (_, Some(HostId::Addr(a))) => return Err(HeadError::Misdirected(a.to_string())),
    }
    let get = |n: &str| -> Option<String> {
        headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(n))
            .map(|h| String::from_utf8_lossy(&h.value).to_string())
    };
    let te: Vec<String> = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("transfer-encoding"))
        .map(|h| {
            String::from_utf8_lossy(&h.value)
                .trim()
                .to_ascii_lowercase()
        })
        .collect();
    let lens: Vec<&Header> = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
        .collect();
    let body = match (te.as_slice(), lens.as_slice()) {
        ([], []) => BodyFraming::None,
        ([t], []) if t == "chunked" => BodyFraming::Chunked,
        ([], [h]) => BodyFraming::Length(
            std::str::from_utf8(&h.value)
                .ok()
                .map(str::trim)
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse().ok())
                .ok_or(HeadError::Malformed("bad content-length"))?,
        ),
        ([], _) => return Err(HeadError::Malformed("duplicate content-length")),
        (_, []) => return Err(HeadError::Malformed("unsupported transfer-encoding")),
        _ => {
            return Err(HeadError::Malformed(
                "both transfer-encoding and content-length",
            ))
        }
    };
    // Switching protocols: a CONNECT (to the connection's own host, checked above), or an
    // upgrade to WebSocket; any other upgrade (h2c, which would carry requests for any
    // host) is taken off the request, and the server answers it as plain HTTP/1.1.
    let switch = if method.eq_ignore_ascii_case("CONNECT") {
        Switch::Connect
    } else if let Some(u) = get("upgrade") {
        let websocket = u.split(',').all(|p| {
            p.trim()
                .split('/')
                .next()
                .unwrap_or("")
                .eq_ignore_ascii_case("websocket")
        });
        if websocket {
            Switch::Upgrade
        } else {
            headers.retain(|h| {
                !h.name.eq_ignore_ascii_case("upgrade")
                    && !h.name.eq_ignore_ascii_case("http2-settings")
            });
            Switch::No
        }
    } else {
        Switch::No
    };
    let mut used = Vec::new();
    // A server answers TRACE with the request it received, secrets included.
    let echoed = method.eq_ignore_ascii_case("TRACE");
    let bound: Vec<&std::sync::Arc<BoundSecret>> = match conn {
        Some(c) => secrets
            .iter()
            .filter(|s| match transport {
                Transport::VerifiedTls => s.bound_to(c, Some(port)),
                Transport::Plain { pinned } => pinned && s.plain_http_to(c, Some(port)),
            })
            .collect(),
        None => Vec::new(),
    };
    if !bound.is_empty() {
        // Responses are scrubbed of the values: ask for them uncompressed.
        headers.retain(|h| !h.name.eq_ignore_ascii_case("accept-encoding"));
        headers.push(Header {
            name: "Accept-Encoding".into(),
            value: b"identity".to_vec(),
        });
    }
    if !echoed {
        for s in bound {
            let set = match &s.inject {
                SecretInjection::Header { name, template } => {
                    Some((name.clone(), template.replace("{value}", &s.value.0)))
                }
                SecretInjection::Basic { username } => {
                    let b = base64::engine::general_purpose::STANDARD
                        .encode(format!("{username}:{}", s.value.0));
                    Some(("Authorization".to_string(), format!("Basic {b}")))
                }
                SecretInjection::Placeholder => None,
            };
            let injected = match set {
                Some((n, v)) => {
                    headers.retain(|h| !h.name.eq_ignore_ascii_case(&n));
                    headers.push(Header {
                        name: n,
                        value: v.into_bytes(),
                    });
                    true
                }
                None => {
                    let mut any = false;
                    for h in headers.iter_mut().filter(|h| is_credential_header(&h.name)) {
                        if let Some(v) =
                            replace_all(&h.value, s.placeholder.as_bytes(), s.value.0.as_bytes())
                        {
                            h.value = v;
                            any = true;
                        }
                    }
                    any
                }
            };
            if injected {
                used.push(s.name.clone());
            }
        }
    }
    let mut bytes = Vec::with_capacity(head.len() + 128);
    bytes.extend_from_slice(format!("{method} {path} HTTP/1.{version}\r\n").as_bytes());
    for h in &headers {
        bytes.extend_from_slice(h.name.as_bytes());
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(&h.value);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"\r\n");
    Ok(RequestHead {
        bytes,
        body,
        switch,
        head_method: method.eq_ignore_ascii_case("HEAD"),
        version,
        used,
    })
}

/// Replaces secret values with their placeholders in a stream of bytes going back to the
/// sandbox, across read boundaries: bytes that may be the start of a value are held back
/// until the next bytes (or the end) tell.
pub(crate) struct Scrubber {
    /// (value, placeholder, secret name)
    pairs: Vec<(Vec<u8>, Vec<u8>, String)>,
    /// Bytes that start some value.
    first: [bool; 256],
    carry: Vec<u8>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("secrets", &self.pairs.len())
            .finish_non_exhaustive()
    }
}

impl Scrubber {
    pub fn new(secrets: &[std::sync::Arc<BoundSecret>]) -> Self {
        let mut first = [false; 256];
        for s in secrets {
            if let Some(b) = s.value.0.as_bytes().first() {
                first[usize::from(*b)] = true;
            }
        }
        Scrubber {
            first,
            pairs: secrets
                .iter()
                .map(|s| {
                    (
                        s.value.0.as_bytes().to_vec(),
                        s.placeholder.as_bytes().to_vec(),
                        s.name.clone(),
                    )
                })
                .collect(),
            carry: Vec::new(),
        }
    }

    /// Whether there is anything to scrub.
    pub fn active(&self) -> bool {
        !self.pairs.is_empty()
    }

    /// Scrubs `input` (after what was held back) into `out`; names of the secrets found are
    /// added to `hits`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>, hits: &mut Vec<String>) {
        if self.pairs.is_empty() {
            out.extend_from_slice(input);
            return;
        }
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(input);
        let mut i = 0;
        'scan: while i < buf.len() {
            // Straight to the next byte that may start a value.
            let skip = buf[i..]
                .iter()
                .position(|b| self.first[usize::from(*b)])
                .unwrap_or(buf.len() - i);
            out.extend_from_slice(&buf[i..i + skip]);
            i += skip;
            if i == buf.len() {
                break;
            }
            let rest = &buf[i..];
            let mut partial = false;
            for (value, ph, name) in &self.pairs {
                if rest.len() >= value.len() {
                    if rest.starts_with(value) {
                        out.extend_from_slice(ph);
                        if !hits.contains(name) {
                            hits.push(name.clone());
                        }
                        i += value.len();
                        continue 'scan;
                    }
                } else if value.starts_with(rest) {
                    partial = true;
                }
            }
            if partial {
                // Maybe a value split across reads: keep it for the next bytes.
                self.carry = rest.to_vec();
                return;
            }
            out.push(buf[i]);
            i += 1;
        }
    }

    /// The end of the stream: what was held back was no value.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.carry);
    }

    /// Scrubs a complete piece of bytes (a response head).
    pub fn scrub_all(&self, input: &[u8], hits: &mut Vec<String>) -> Vec<u8> {
        let mut s = Scrubber {
            pairs: self.pairs.clone(),
            first: self.first,
            carry: Vec::new(),
        };
        let mut out = Vec::with_capacity(input.len());
        s.feed(input, &mut out, hits);
        s.finish(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn secret(inject: SecretInjection) -> Arc<BoundSecret> {
        Arc::new(
            BoundSecret::new(
                &SecretSpec {
                    name: "tok".into(),
                    value: "s3cr3t".into(),
                    hosts: vec!["api.example.com".into()],
                    inject,
                    env: Some("TOK".into()),
                },
                None,
            )
            .unwrap(),
        )
    }

    const TLS: Transport = Transport::VerifiedTls;
    const HOST: Option<&str> = Some("api.example.com");

    fn text(r: &RequestHead) -> String {
        String::from_utf8(r.bytes.clone()).unwrap()
    }

    #[test]
    fn header_injection_only_for_bound_host_and_only_in_its_header() {
        let s = secret(SecretInjection::Header {
            name: "Authorization".into(),
            template: "Bearer {value}".into(),
        });
        let head = format!(
            "GET /x HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: nope\r\nX-Echo: {}\r\n\r\n",
            s.placeholder
        );
        let r = rewrite_head(head.as_bytes(), std::slice::from_ref(&s), HOST, 443, TLS).unwrap();
        let t = text(&r);
        assert!(t.contains("Authorization: Bearer s3cr3t\r\n"), "{t}");
        assert!(!t.contains("nope"));
        // The placeholder elsewhere stays a placeholder.
        assert!(t.contains(&format!("X-Echo: {}\r\n", s.placeholder)), "{t}");
        assert_eq!(t.matches("s3cr3t").count(), 1);
        assert!(t.contains("Accept-Encoding: identity\r\n"));
        assert_eq!(r.used, vec!["tok".to_string()]);
        // Another connection's host gets nothing (and the request is misdirected there).
        let r = rewrite_head(
            head.as_bytes(),
            std::slice::from_ref(&s),
            Some("other.example.com"),
            443,
            TLS,
        );
        assert_eq!(
            r.unwrap_err(),
            HeadError::Misdirected("api.example.com".into())
        );
        let head2 = b"GET / HTTP/1.1\r\nHost: evil.com\r\n\r\n";
        let r = rewrite_head(head2, &[s], HOST, 443, TLS);
        assert_eq!(r.unwrap_err(), HeadError::Misdirected("evil.com".into()));
    }

    #[test]
    fn one_request_one_destination() {
        let s = secret(SecretInjection::Header {
            name: "Authorization".into(),
            template: "Bearer {value}".into(),
        });
        let one = std::slice::from_ref(&s);
        for (head, seen) in [
            (
                &b"GET http://evil.com/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n"[..],
                "evil.com",
            ),
            (
                b"GET http://u@api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
                "u@api.example.com",
            ),
            (
                b"CONNECT evil.com:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
                "evil.com:443",
            ),
            (
                b"GET / HTTP/1.1\r\nHost: forbidden.example:1:1\r\n\r\n",
                "forbidden.example:1:1",
            ),
            (
                b"GET / HTTP/1.1\r\nHost: api.example.com\r\nHost: forbidden.example\r\n\r\n",
                "forbidden.example",
            ),
            (
                b"GET / HTTP/1.1\r\nHost: 203.0.113.9\r\n\r\n",
                "203.0.113.9",
            ),
        ] {
            let r = rewrite_head(head, one, HOST, 443, TLS);
            assert_eq!(r.unwrap_err(), HeadError::Misdirected(seen.into()));
        }
        // Origin-form: a URL in the query names nothing.
        let head = b"GET /login?next=http://evil.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n";
        let r = rewrite_head(head, one, HOST, 443, TLS).unwrap();
        assert_eq!(r.used, vec!["tok".to_string()]);
        let head = b"GET https://API.example.com./x HTTP/1.1\r\nHost: api.example.com\r\n\r\n";
        let r = rewrite_head(head, one, HOST, 443, TLS).unwrap();
        assert_eq!(r.used, vec!["tok".to_string()]);
        // No Host over verified TLS: the SNI's host. Over plain HTTP: refused.
        let head = b"GET / HTTP/1.0\r\n\r\n";
        assert!(rewrite_head(head, one, HOST, 443, TLS).is_ok());
        let plain = Transport::Plain { pinned: true };
        assert!(matches!(
            rewrite_head(head, one, HOST, 80, plain),
            Err(HeadError::Misdirected(_))
        ));
        // A connection judged without a name: no name may appear later, an address may.
        assert!(rewrite_head(
            b"GET / HTTP/1.1\r\nHost: 198.51.100.4\r\n\r\n",
            one,
            None,
            80,
            plain
        )
        .is_ok());
        assert_eq!(
            rewrite_head(
                b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
                one,
                None,
                80,
                plain
            )
            .unwrap_err(),
            HeadError::Misdirected("api.example.com".into())
        );
    }

    #[test]
    fn plain_http_gets_a_secret_only_when_its_binding_says_so() {
        let s = secret(SecretInjection::Header {
            name: "Authorization".into(),
            template: "Bearer {value}".into(),
        });
        let head = b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n";
        let plain = Transport::Plain { pinned: true };
        let r = rewrite_head(head, std::slice::from_ref(&s), HOST, 80, plain).unwrap();
        assert!(r.used.is_empty() && !text(&r).contains("s3cr3t"));
        let opted = Arc::new(
            BoundSecret::new(
                &SecretSpec {
                    name: "tok".into(),
                    value: "s3cr3t".into(),
                    hosts: vec!["HTTP://api.example.com".into()],
                    inject: SecretInjection::Placeholder,
                    env: None,
                },
                None,
            )
            .unwrap(),
        );
        assert!(opted.bound_to("api.example.com", Some(443)));
        let head = format!(
            "GET / HTTP/1.1\r\nHost: api.example.com\r\nX-Api-Key: {}\r\n\r\n",
            opted.placeholder
        );
        let one = std::slice::from_ref(&opted);
        let r = rewrite_head(head.as_bytes(), one, HOST, 80, plain).unwrap();
        assert!(text(&r).contains("X-Api-Key: s3cr3t\r\n"));
        // Not at an address the resolver did not answer for the host.
        let r = rewrite_head(
            head.as_bytes(),
            one,
            HOST,
            80,
            Transport::Plain { pinned: false },
        )
        .unwrap();
        assert!(r.used.is_empty());
    }

    #[test]
    fn upgrades_and_framing() {
        let up = |h: &str| rewrite_head(h.as_bytes(), &[], HOST, 443, TLS);
        let r = up("GET / HTTP/1.1\r\nHost: api.example.com\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n").unwrap();
        assert_eq!(r.switch, Switch::Upgrade);
        let r = up(
            "GET / HTTP/1.1\r\nHost: api.example.com\r\nUpgrade: h2c\r\nHTTP2-Settings: x\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.switch, Switch::No);
        assert!(!text(&r).to_ascii_lowercase().contains("upgrade: h2c"));
        assert!(!text(&r).contains("HTTP2-Settings"));
        let r =
            up("CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n").unwrap();
        assert_eq!(r.switch, Switch::Connect);
        let r = up("HEAD / HTTP/1.0\r\nHost: api.example.com\r\n\r\n").unwrap();
        assert!(r.head_method);
        assert_eq!(r.version, 0);
        for bad in [
            "POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: +3\r\n\r\n",
        ] {
            assert!(matches!(up(bad), Err(HeadError::Malformed(_))), "{bad}");
        }
    }

    #[test]
    fn trace_gets_no_secret() {
        let s = secret(SecretInjection::Header {
            name: "Authorization".into(),
            template: "Bearer {value}".into(),
        });
        let head = format!(
            "TRACE / HTTP/1.1\r\nHost: api.example.com\r\nX-Key: {}\r\n\r\n",
            s.placeholder
        );
        let r = rewrite_head(head.as_bytes(), &[s], HOST, 443, TLS).unwrap();
        assert!(r.used.is_empty());
        assert!(!text(&r).contains("s3cr3t"));
    }

    #[test]
    fn placeholder_and_basic() {
        let s = secret(SecretInjection::Placeholder);
        let head = format!(
            "POST / HTTP/1.1\r\nHost: api.example.com\r\nX-Key: k={0}\r\nX-Other: {0}\r\nContent-Length: 3\r\n\r\n",
            s.placeholder
        );
        let r = rewrite_head(head.as_bytes(), std::slice::from_ref(&s), HOST, 443, TLS).unwrap();
        let t = text(&r);
        assert!(t.contains("X-Key: k=s3cr3t\r\n"));
        assert!(
            t.contains(&format!("X-Other: {}\r\n", s.placeholder)),
            "{t}"
        );
        assert_eq!(r.body, BodyFraming::Length(3));
        let b = secret(SecretInjection::Basic {
            username: "me".into(),
        });
        let r = rewrite_head(b"GET / HTTP/1.1\r\n\r\n", &[b], HOST, 443, TLS).unwrap();
        assert!(text(&r).contains("Authorization: Basic bWU6czNjcjN0\r\n"));
        assert!(format!("{s:?}").contains("<redacted>"));
        assert!(!format!("{s:?}").contains("s3cr3t"));
    }

    #[test]
    fn scrubbing_across_read_boundaries() {
        let s = secret(SecretInjection::Placeholder);
        let ph = s.placeholder.clone();
        let data = b"xx s3cr3t yy s3cr3 s3cr3ts3cr3t s".to_vec();
        let want = format!("xx {ph} yy s3cr3 {ph}{ph} s");
        for split in 1..6 {
            let mut sc = Scrubber::new(std::slice::from_ref(&s));
            let mut out = Vec::new();
            let mut hits = Vec::new();
            for piece in data.chunks(split) {
                sc.feed(piece, &mut out, &mut hits);
            }
            sc.finish(&mut out);
            assert_eq!(String::from_utf8(out).unwrap(), want, "{split}");
            assert_eq!(hits, vec!["tok".to_string()]);
        }
        // Held back only while it may be a value.
        let mut sc = Scrubber::new(&[s]);
        let mut out = Vec::new();
        sc.feed(b"abc s3c", &mut out, &mut Vec::new());
        assert_eq!(out, b"abc ");
        sc.feed(b"x", &mut out, &mut Vec::new());
        assert_eq!(out, b"abc s3cx");
    }

    #[test]
    fn validation() {
        let mut spec = SecretSpec {
            name: "bad name".into(),
            value: "v".into(),
            hosts: vec!["a.com".into()],
            inject: SecretInjection::Placeholder,
            env: None,
        };
        assert!(BoundSecret::new(&spec, None).is_err());
        spec.name = "ok".into();
        spec.hosts = vec!["10.0.0.1".into()];
        assert!(BoundSecret::new(&spec, None).is_err());
        spec.hosts = vec![];
        assert!(BoundSecret::new(&spec, None).is_err());
        spec.hosts = vec!["a.com".into()];
        spec.value = "a\nb".into();
        let e = BoundSecret::new(&spec, None).unwrap_err().to_string();
        assert!(!e.contains("a\nb"));
    }
}
