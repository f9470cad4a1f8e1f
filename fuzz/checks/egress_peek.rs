//! What the `egress_peek` fuzz target checks on `rampart_egress::peek`, the parser of the
//! first bytes a sandbox sends on every TCP connection (TLS ClientHello and SNI, HTTP/1
//! request line and Host). Shared (by `#[path]`) with
//! `crates/rampart-egress/tests/fuzz_corpus.rs`.
//!
//! Always checked (a violation panics):
//! - `classify`, `host_name` and `parse_host` never panic;
//! - `parse_host` (the strict authority parser) and `host_name` agree where both find
//!   something: the same normalized name, and never a name for an IP literal;
//! - a name it returns is already normalized (`policy::normalize_name` leaves it as is);
//! - the name judged does not depend on how the bytes arrive: the proxy classifies what it
//!   has read so far and stops at the first answer that is not `NeedMore`, and a sandbox
//!   chooses its segment sizes, so every prefix that gets an answer names the same host
//!   (or none), and once there is an answer more bytes never need more;
//! - a real TLS server (rustls' `Acceptor`) reading the same bytes does not see another
//!   server name than the one the proxy judged (that would be domain fronting past the
//!   policy).
//!
//! With `RAMPART_FUZZ_STRICT=1` in the environment, also (these are known differences, see
//! fuzz/README.md):
//! - every prefix that gets an answer gets the same answer (not just the same name: `Other`
//!   and `Tls(None)` are judged alike, but the proxy answers a denied HTTP request with a 403);
//! - the proxy names no host where rustls reads none (an IP literal in the SNI, say);
//! - an HTTP request with more than one Host header, or an absolute-form target
//!   (`GET http://other/ HTTP/1.1`, which RFC 9112 says a server must prefer over Host) that
//!   names another host, gets no name.

use rampart_egress::peek::{classify, host_name, parse_host, HostId, Peek};
use rampart_egress::policy::normalize_name;

fn strict() -> bool {
    static STRICT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *STRICT.get_or_init(|| std::env::var_os("RAMPART_FUZZ_STRICT").is_some_and(|v| v == "1"))
}

/// Runs every check that applies to `data`; panics on a violation.
pub fn check(data: &[u8]) {
    let full = classify(data);
    names_normalized(&full);
    // As the proxy sees it, byte by byte: the first answer, and every later one.
    let cuts: Vec<usize> = if data.len() <= 1024 {
        (1..=data.len()).collect()
    } else {
        (1..=1024)
            .chain((1025..data.len()).step_by(61))
            .chain([data.len()])
            .collect()
    };
    let mut first: Option<(usize, Peek)> = None;
    for n in cuts {
        let p = classify(&data[..n]);
        if p == Peek::NeedMore {
            assert!(
                first.is_none(),
                "{n} bytes need more after {first:?} had an answer"
            );
            continue;
        }
        match &first {
            None => first = Some((n, p)),
            Some((m, f)) => same_answer(f, &p, *m, n),
        }
    }
    if let Some((n, p)) = &first {
        same_answer(p, &full, *n, data.len());
    }
    match &full {
        Peek::Tls(name) => tls_differential(data, name.as_deref()),
        Peek::Http(name) => http_differential(data, name.as_deref()),
        _ => {}
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Some(n) = host_name(s) {
            assert_eq!(normalize_name(&n).as_deref(), Some(n.as_str()));
            assert!(n.parse::<std::net::IpAddr>().is_err(), "{n:?} is an IP");
        }
        authority(s);
    }
}

/// `parse_host` (the strict authority parser): a name comes out normalized and is what the
/// looser `host_name` finds too; an address is one `host_name` refuses as a name.
fn authority(s: &str) {
    match parse_host(s) {
        Some(HostId::Name(n)) => {
            assert_eq!(normalize_name(&n).as_deref(), Some(n.as_str()), "{s:?}");
            assert!(
                n.parse::<std::net::IpAddr>().is_err(),
                "{s:?}: {n:?} is an IP"
            );
            assert_eq!(host_name(s), Some(n), "{s:?}");
        }
        Some(HostId::Addr(a)) => {
            assert_eq!(host_name(s), None, "{s:?} is the address {a}");
        }
        None => {}
    }
}

/// The name the policy judges.
fn name(p: &Peek) -> Option<&str> {
    match p {
        Peek::Tls(n) | Peek::Http(n) => n.as_deref(),
        _ => None,
    }
}

/// Two answers for prefixes of the same bytes (`m` and `n` long) must name the same host
/// (what the policy judges); in strict mode they must be the same answer.
fn same_answer(a: &Peek, b: &Peek, m: usize, n: usize) {
    assert_eq!(
        name(a),
        name(b),
        "the first {m} bytes are {a:?}, the first {n} are {b:?}"
    );
    if strict() {
        assert_eq!(a, b, "the first {m} bytes vs the first {n}");
    }
}

fn names_normalized(p: &Peek) {
    if let Peek::Tls(Some(n)) | Peek::Http(Some(n)) = p {
        assert_eq!(
            normalize_name(n).as_deref(),
            Some(n.as_str()),
            "name {n:?} is not normalized"
        );
    }
}

/// The server name rustls reads from the same bytes: `None` if it wants more, `Some(Err)`
/// if it rejects the hello.
fn rustls_server_name(data: &[u8]) -> Option<Result<Option<String>, String>> {
    let mut acc = rustls::server::Acceptor::default();
    let mut rd = data;
    loop {
        match acc.read_tls(&mut rd) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    match acc.accept() {
        Ok(Some(a)) => Some(Ok(a.client_hello().server_name().map(str::to_owned))),
        Ok(None) => None,
        Err((e, _)) => Some(Err(e.to_string())),
    }
}

fn tls_differential(data: &[u8], ours: Option<&str>) {
    let Some(theirs) = rustls_server_name(data) else {
        return;
    };
    match (ours, theirs) {
        (Some(a), Ok(Some(b))) => {
            let b = normalize_name(&b);
            assert_eq!(
                Some(a),
                b.as_deref(),
                "the proxy judged SNI {a:?}, a TLS server reads {b:?}"
            );
        }
        (Some(a), Ok(None)) if strict() => {
            panic!("the proxy judged SNI {a:?}, a TLS server reads no server name")
        }
        _ => {}
    }
}

fn http_differential(data: &[u8], ours: Option<&str>) {
    let Some(ours) = ours else {
        return;
    };
    if !strict() {
        return;
    }
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut headers);
    if !matches!(req.parse(data), Ok(httparse::Status::Complete(_))) {
        return;
    }
    let hosts: Vec<Option<String>> = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .map(|h| std::str::from_utf8(h.value).ok().and_then(host_name))
        .collect();
    assert!(
        hosts.iter().all(|h| h.as_deref() == Some(ours)),
        "the proxy judged Host {ours:?}, the request has Host headers {hosts:?}"
    );
    if let Some(path) = req.path {
        let lower = path.to_ascii_lowercase();
        if let Some(rest) = lower
            .strip_prefix("http://")
            .or_else(|| lower.strip_prefix("https://"))
        {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
            let authority = authority.rsplit('@').next().unwrap_or_default();
            let target = host_name(authority);
            assert_eq!(
                target.as_deref(),
                Some(ours),
                "the proxy judged Host {ours:?}, the request line targets {path:?}"
            );
        }
    }
}
