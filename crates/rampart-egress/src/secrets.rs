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
        for h in &spec.hosts {
            let r = Rule::parse(h).map_err(|e| bad(name, e.to_string()))?;
            if matches!(r.target, Target::Net(_)) {
                return Err(bad(
                    name,
                    format!("host {h:?} must be a domain, not an address"),
                ));
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

/// One header line of a request head.
struct Header {
    name: String,
    value: Vec<u8>,
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

/// A parsed request head ready to forward.
#[derive(Debug)]
pub(crate) struct RequestHead {
    /// The bytes to send upstream (secrets in place).
    pub bytes: Vec<u8>,
    /// The Host header's name, if any.
    pub host: Option<String>,
    /// Request body framing.
    pub body: BodyFraming,
    /// Whether after this request the connection stops being HTTP (Upgrade, CONNECT).
    pub upgrade: bool,
    /// Names of the secrets injected.
    pub used: Vec<String>,
}

/// How the body of a request is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// Parses a complete request head (through the blank line) and places the secrets bound to
/// `host`. Errors are short reasons for the log (they never contain header values).
pub(crate) fn rewrite_head(
    head: &[u8],
    secrets: &[std::sync::Arc<BoundSecret>],
    host: &str,
    port: u16,
) -> Result<RequestHead, &'static str> {
    let mut hbuf = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut hbuf);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err("incomplete request head"),
        Err(_) => return Err("malformed request head"),
    }
    let method = req.method.unwrap_or("GET").to_string();
    let path = req.path.unwrap_or("/").to_string();
    let version = req.version.unwrap_or(1);
    let mut headers: Vec<Header> = req
        .headers
        .iter()
        .map(|h| Header {
            name: h.name.to_string(),
            value: h.value.to_vec(),
        })
        .collect();
    let get = |n: &str| -> Option<String> {
        headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(n))
            .map(|h| String::from_utf8_lossy(&h.value).to_string())
    };
    // The host the server will serve: an absolute-form target (`GET http://h/`) or a
    // CONNECT's authority wins over the Host header at the server, so it is the one
    // judged (as its text when it is no name, so that it never passes for the connection's).
    let authority = if method.eq_ignore_ascii_case("CONNECT") {
        Some(path.as_str())
    } else if path.starts_with('/') {
        None // origin-form (a `://` in it is in the path or query)
    } else {
        path.split_once("://").map(|(_, rest)| {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            &rest[..end]
        })
    };
    let req_host = match authority {
        Some(a) => {
            let a = a.rsplit_once('@').map_or(a, |(_, h)| h);
            Some(crate::peek::host_name(a).unwrap_or_else(|| a.to_ascii_lowercase()))
        }
        None => get("host").and_then(|v| crate::peek::host_name(&v)),
    };
    let te = get("transfer-encoding")
        .unwrap_or_default()
        .to_ascii_lowercase();
    let body = if te.contains("chunked") {
        BodyFraming::Chunked
    } else if !te.is_empty() {
        return Err("unsupported transfer-encoding");
    } else {
        let lens: Vec<&Header> = headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
            .collect();
        match lens.as_slice() {
            [] => BodyFraming::None,
            [h] => BodyFraming::Length(
                std::str::from_utf8(&h.value)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .ok_or("bad content-length")?,
            ),
            _ => return Err("duplicate content-length"),
        }
    };
    let upgrade = method.eq_ignore_ascii_case("CONNECT") || get("upgrade").is_some();
    let mut used = Vec::new();
    let name_matches = req_host.as_deref().is_none_or(|h| h == host);
    // A server answers TRACE with the request it received, secrets included.
    let echoed = method.eq_ignore_ascii_case("TRACE");
    if name_matches && !echoed {
        for s in secrets.iter().filter(|s| s.bound_to(host, Some(port))) {
            let mut injected = false;
            for h in headers.iter_mut() {
                if let Some(v) =
                    replace_all(&h.value, s.placeholder.as_bytes(), s.value.0.as_bytes())
                {
                    h.value = v;
                    injected = true;
                }
            }
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
            if let Some((n, v)) = set {
                headers.retain(|h| !h.name.eq_ignore_ascii_case(&n));
                headers.push(Header {
                    name: n,
                    value: v.into_bytes(),
                });
                injected = true;
            }
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
        host: req_host,
        body,
        upgrade,
        used,
    })
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

    #[test]
    fn header_injection_only_for_bound_host() {
        let s = secret(SecretInjection::Header {
            name: "Authorization".into(),
            template: "Bearer {value}".into(),
        });
        let head = b"GET /x HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: nope\r\n\r\n";
        let r = rewrite_head(head, std::slice::from_ref(&s), "api.example.com", 443).unwrap();
        let text = String::from_utf8(r.bytes).unwrap();
        assert!(text.contains("Authorization: Bearer s3cr3t\r\n"), "{text}");
        assert!(!text.contains("nope"));
        assert_eq!(r.used, vec!["tok".to_string()]);
        let r = rewrite_head(head, std::slice::from_ref(&s), "other.example.com", 443).unwrap();
        assert!(!String::from_utf8(r.bytes).unwrap().contains("s3cr3t"));
        // A Host header naming another host than the connection gets nothing.
        let head2 = b"GET / HTTP/1.1\r\nHost: evil.com\r\n\r\n";
        let r = rewrite_head(head2, &[s], "api.example.com", 443).unwrap();
        assert!(r.used.is_empty());
    }

    #[test]
    fn absolute_form_and_connect_targets_are_the_host_judged() {
        let s = secret(SecretInjection::Header {
            name: "Authorization".into(),
            template: "Bearer {value}".into(),
        });
        let one = std::slice::from_ref(&s);
        for (head, want) in [
            (
                &b"GET http://evil.com/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n"[..],
                "evil.com",
            ),
            (
                b"GET http://u@203.0.113.9:80?q HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
                "203.0.113.9:80",
            ),
            (
                b"CONNECT evil.com:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
                "evil.com",
            ),
        ] {
            let r = rewrite_head(head, one, "api.example.com", 443).unwrap();
            assert_eq!(r.host.as_deref(), Some(want));
            assert!(r.used.is_empty());
        }
        // Origin-form: a URL in the query names nothing.
        let head = b"GET /login?next=http://evil.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n";
        let r = rewrite_head(head, one, "api.example.com", 443).unwrap();
        assert_eq!(r.host.as_deref(), Some("api.example.com"));
        assert_eq!(r.used, vec!["tok".to_string()]);
        let head = b"GET https://API.example.com./x HTTP/1.1\r\nHost: api.example.com\r\n\r\n";
        let r = rewrite_head(head, one, "api.example.com", 443).unwrap();
        assert_eq!(r.host.as_deref(), Some("api.example.com"));
        assert_eq!(r.used, vec!["tok".to_string()]);
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
        let r = rewrite_head(head.as_bytes(), &[s], "api.example.com", 443).unwrap();
        assert!(r.used.is_empty());
        assert!(!String::from_utf8(r.bytes).unwrap().contains("s3cr3t"));
    }

    #[test]
    fn placeholder_and_basic() {
        let s = secret(SecretInjection::Placeholder);
        let head = format!(
            "POST / HTTP/1.1\r\nHost: api.example.com\r\nX-Key: k={}\r\nContent-Length: 3\r\n\r\n",
            s.placeholder
        );
        let r = rewrite_head(
            head.as_bytes(),
            std::slice::from_ref(&s),
            "api.example.com",
            443,
        )
        .unwrap();
        let text = String::from_utf8(r.bytes).unwrap();
        assert!(text.contains("X-Key: k=s3cr3t\r\n"));
        assert_eq!(r.body, BodyFraming::Length(3));
        let b = secret(SecretInjection::Basic {
            username: "me".into(),
        });
        let r = rewrite_head(b"GET / HTTP/1.1\r\n\r\n", &[b], "api.example.com", 443).unwrap();
        assert!(String::from_utf8(r.bytes)
            .unwrap()
            .contains("Authorization: Basic bWU6czNjcjN0\r\n"));
        assert!(format!("{s:?}").contains("<redacted>"));
        assert!(!format!("{s:?}").contains("s3cr3t"));
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
