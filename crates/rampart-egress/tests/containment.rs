//! Containment findings of the egress path (issue 10), each as the real attack against the
//! real proxy and resolver, with test hosts in network namespaces made by the test.
//! Needs root, `ip` and `nft`; skips with a printed reason otherwise.

mod support;

use std::future::Future;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use rampart_egress::Egress;
use rampart_types::network::{
    NetEventKind, NetLogEntry, NetworkMode, NetworkPolicy, SecretInjection, SecretSpec, Verdict,
};
use support::*;

/// Any address: the sandbox's DNS traffic is redirected to the resolver whatever it names.
const ANY_DNS: &str = "192.0.2.53:53";
const SECRET_VALUE: &str = "sk-live-0a1b2c3d4e5f6789";
const KEY_VALUE: &str = "key-value-5e4d3c2b1a";

struct Ctx {
    egress: Egress,
    sb: String,
    seen: Arc<Seen>,
    egress_ca: String,
}

impl Ctx {
    async fn sandbox<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        in_ns(&self.sb, f).await
    }
    fn log(&self) -> Vec<NetLogEntry> {
        self.egress.log("sbx1", 0, 100_000).expect("attached")
    }
    /// Waits (10 s at most) for a log entry that `pred` accepts.
    async fn wait_entry(&self, what: &str, pred: impl Fn(&NetLogEntry) -> bool) -> NetLogEntry {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(e) = self.log().into_iter().rev().find(|e| pred(e)) {
                return e;
            }
            assert!(
                Instant::now() < deadline,
                "no log entry {what}: {:#?}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    async fn misdirected(&self, name: &str) -> NetLogEntry {
        self.wait_entry(&format!("misdirected for {name}"), |e| {
            e.kind == NetEventKind::Connect
                && e.verdict == Verdict::Deny
                && e.rule.starts_with("misdirected")
                && e.name.as_deref() == Some(name)
        })
        .await
    }
    async fn resolve(&self, name: &'static str) {
        let (code, _) = self
            .sandbox(move || dns_query(ANY_DNS, name, RecordType::A, false))
            .await;
        assert_eq!(code, ResponseCode::NoError, "{name}");
    }
    fn placeholder(&self, secret: &str) -> String {
        self.egress
            .secrets("sbx1")
            .unwrap()
            .into_iter()
            .find(|s| s.name == secret)
            .unwrap()
            .placeholder
    }
    /// Request heads the test servers received that contain `needle`.
    fn received(&self, needle: &str) -> Vec<String> {
        self.seen
            .requests()
            .into_iter()
            .filter(|h| h.contains(needle))
            .collect()
    }
}

/// The responses in `raw` (what a client read from a connection), each as its head and its
/// decoded body (chunked framing removed).
fn responses(raw: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = raw;
    while let Some((head, after)) = rest.split_once("\r\n\r\n") {
        let head = head.to_string();
        let lower = head.to_ascii_lowercase();
        let header = |n: &str| {
            lower.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == n).then(|| v.trim().to_string())
            })
        };
        let mut body = String::new();
        if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            let mut r = after;
            loop {
                let Some((size, tail)) = r.split_once("\r\n") else {
                    r = "";
                    break;
                };
                let n =
                    usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap_or(0);
                if n == 0 {
                    r = tail.split_once("\r\n").map_or("", |(_, t)| t);
                    break;
                }
                let n = n.min(tail.len());
                body.push_str(&tail[..n]);
                r = tail[n..].strip_prefix("\r\n").unwrap_or(&tail[n..]);
            }
            rest = r;
        } else if let Some(n) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            let n = n.min(after.len());
            body.push_str(&after[..n]);
            rest = &after[n..];
        } else {
            body.push_str(after);
            rest = "";
        }
        out.push((head, body));
        if rest.is_empty() {
            break;
        }
    }
    out
}

fn default_policy() -> NetworkPolicy {
    policy(
        NetworkMode::Allowlist,
        &["allowed.test", "api.test", "other.test"],
        &["denied.test"],
    )
}

fn bearer(hosts: &[&str]) -> SecretSpec {
    SecretSpec {
        name: "api_token".into(),
        value: SECRET_VALUE.into(),
        hosts: hosts.iter().map(|s| s.to_string()).collect(),
        inject: SecretInjection::Header {
            name: "Authorization".into(),
            template: "Bearer {value}".into(),
        },
        env: Some("API_TOKEN".into()),
    }
}

fn placeholder_secret() -> SecretSpec {
    SecretSpec {
        name: "api_key".into(),
        value: KEY_VALUE.into(),
        hosts: vec!["api.test".into()],
        inject: SecretInjection::Placeholder,
        env: Some("API_KEY".into()),
    }
}

/// Builds the network, starts the egress service in the router netns with `sbx1` attached
/// at the sandbox address with `policy` and `secrets`, and runs `f`.
fn scenario<F, Fut>(policy: NetworkPolicy, secrets: Vec<SecretSpec>, f: F)
where
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    with_egress(2, policy, secrets, |w| {
        f(Ctx {
            egress: w.egress,
            sb: w.sb,
            seen: w.seen,
            egress_ca: w.attachment.ca_cert_pem.unwrap_or_default(),
        })
    });
}

// ---- 7: secret injection leaks back ----

/// A secret goes only where its binding says: a `header` secret into its header (not into
/// any other header the sandbox put its placeholder in, which the server could reflect), a
/// `placeholder` secret only into credential headers.
#[test]
fn sandbox_blocks_secret_injection_into_other_headers() {
    scenario(
        default_policy(),
        vec![bearer(&["api.test"]), placeholder_secret()],
        |cx| async move {
            cx.resolve("api.test").await;
            let ph = cx.placeholder("api_token");
            let key = cx.placeholder("api_key");
            let ca = cx.egress_ca.clone();
            let req = format!(
                "GET /plain HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {ph}\r\n\
                 X-Echo: {ph}\r\nX-Api-Key: {key}\r\nX-Reflect: {key}\r\nConnection: close\r\n\r\n"
            );
            let got = cx
                .sandbox(move || tls_all(WEB2, "api.test", &ca, req.as_bytes()))
                .await
                .unwrap();
            assert!(got.starts_with("HTTP/1.1 200"), "{got}");
            let heads = cx.received("GET /plain");
            assert_eq!(heads.len(), 1, "{heads:?}");
            let head = &heads[0];
            assert!(
                head.contains(&format!("Authorization: Bearer {SECRET_VALUE}\r\n")),
                "{head}"
            );
            assert!(
                head.contains(&format!("X-Api-Key: {KEY_VALUE}\r\n")),
                "{head}"
            );
            // Nowhere else.
            assert!(head.contains(&format!("X-Echo: {ph}\r\n")), "{head}");
            assert!(head.contains(&format!("X-Reflect: {key}\r\n")), "{head}");
            assert_eq!(head.matches(SECRET_VALUE).count(), 1, "{head}");
            assert_eq!(head.matches(KEY_VALUE).count(), 1, "{head}");
        },
    );
}

/// A bound host that reflects the secret hands back only its placeholder: in response
/// headers, Content-Length, chunked, close-delimited bodies, and a value split across
/// writes; each scrub is logged.
#[test]
fn sandbox_blocks_secret_echoed_back_in_responses() {
    scenario(
        default_policy(),
        vec![bearer(&["api.test"])],
        |cx| async move {
            cx.resolve("api.test").await;
            let ph = cx.placeholder("api_token");
            for path in ["/", "/echo-headers", "/chunked", "/split", "/close"] {
                let ca = cx.egress_ca.clone();
                let req =
                    format!("GET {path} HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n");
                let got = cx
                    .sandbox(move || tls_all(WEB2, "api.test", &ca, req.as_bytes()))
                    .await
                    .unwrap();
                assert!(got.starts_with("HTTP/1.1 200"), "{path}: {got}");
                let r = responses(&got);
                assert_eq!(r.len(), 1, "{path}: {got}");
                let got = format!("{}\r\n\r\n{}", r[0].0, r[0].1);
                assert!(
                    !got.contains(SECRET_VALUE),
                    "{path}: the value came back: {got}"
                );
                assert!(
                    got.contains(&format!("authorization: Bearer {ph}"))
                        || got.contains(&format!("Authorization: Bearer {ph}")),
                    "{path}: no placeholder where the value was: {got}"
                );
                if path == "/echo-headers" {
                    assert!(
                        got.contains(&format!("X-Echo-Auth: Bearer {ph}\r\n")),
                        "{got}"
                    );
                }
                // The server did get the value.
                let heads = cx.received(&format!("GET {path} "));
                assert!(
                    heads.last().is_some_and(|h| h.contains(SECRET_VALUE)),
                    "{path}: {heads:?}"
                );
            }
            // Keep-alive: the re-framed responses leave the connection usable.
            let ca = cx.egress_ca.clone();
            let req = "GET /chunked HTTP/1.1\r\nHost: api.test\r\n\r\n\
                   GET /split HTTP/1.1\r\nHost: api.test\r\n\r\n\
                   GET /echo-headers HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n";
            let got = cx
                .sandbox(move || tls_all(WEB2, "api.test", &ca, req.as_bytes()))
                .await
                .unwrap();
            let r = responses(&got);
            assert_eq!(r.len(), 3, "{got}");
            for (head, body) in &r {
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                assert!(!body.contains(SECRET_VALUE), "{body}");
                assert!(body.contains(&format!("Bearer {ph}")), "{body}");
            }
            let e = cx
                .wait_entry("scrub", |e| {
                    e.kind == NetEventKind::SecretUsed && e.rule.starts_with("scrub:")
                })
                .await;
            assert_eq!(e.secret.as_deref(), Some("api_token"));
            assert_eq!(e.name.as_deref(), Some("api.test"));
            // After a 101 the stream is raw: a value in it cuts the connection.
            let ca = cx.egress_ca.clone();
            let req = "GET /ws-auth HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
            let got = cx
                .sandbox(move || tls_all(WEB2, "api.test", &ca, req.as_bytes()))
                .await
                .unwrap_or_default();
            assert!(got.starts_with("HTTP/1.1 101"), "{got}");
            assert!(!got.contains(SECRET_VALUE), "{got}");
            assert!(
                cx.received("GET /ws-auth ")
                    .iter()
                    .any(|h| h.contains(SECRET_VALUE)),
                "{:?}",
                cx.seen.requests()
            );
            cx.wait_entry("cut raw stream", |e| {
                e.kind == NetEventKind::Close && e.rule.contains("a secret value in a raw stream")
            })
            .await;
            let log = serde_json::to_string(&cx.log()).unwrap();
            assert!(!log.contains(SECRET_VALUE));
        },
    );
}

/// Plain HTTP carries no secret unless its binding says so (`http://host`), and then the
/// response is scrubbed all the same.
#[test]
fn sandbox_blocks_secret_over_plain_http_without_opt_in() {
    scenario(
        default_policy(),
        vec![bearer(&["api.test"])],
        |cx| async move {
            cx.resolve("api.test").await;
            let ph = cx.placeholder("api_token");
            let p2 = ph.clone();
            let got = cx
                .sandbox(move || {
                    http_get(
                        WEB2,
                        "api.test",
                        &[("Authorization", &format!("Bearer {p2}"))],
                    )
                })
                .await
                .unwrap();
            assert!(got.starts_with("HTTP/1.1 200"), "{got}");
            assert!(
                cx.received(SECRET_VALUE).is_empty(),
                "the value went over plain HTTP: {:?}",
                cx.seen.requests()
            );
            // Opted in: injected over plain HTTP, scrubbed on the way back.
            let info = cx
                .egress
                .set_secrets("sbx1", vec![bearer(&["http://api.test"])])
                .unwrap();
            assert_eq!(info[0].placeholder, ph);
            let got = cx
                .sandbox(|| http_get(WEB2, "api.test", &[]))
                .await
                .unwrap();
            assert!(got.starts_with("HTTP/1.1 200"), "{got}");
            assert_eq!(cx.received(SECRET_VALUE).len(), 1);
            assert!(!got.contains(SECRET_VALUE), "{got}");
            assert!(got.contains(&format!("Bearer {ph}")), "{got}");
            cx.wait_entry("secret_used over http", |e| {
                e.kind == NetEventKind::SecretUsed
                    && e.rule.starts_with("secret:")
                    && e.port == Some(80)
            })
            .await;
        },
    );
}

// ---- 10: a bound secret goes to a foreign host ----

#[test]
fn sandbox_blocks_bound_secret_sent_to_a_foreign_host() {
    scenario(
        default_policy(),
        vec![bearer(&["api.test"])],
        |cx| async move {
            cx.resolve("api.test").await;
            for (case, req) in [
            (
                "unparsable host",
                "GET /f1 HTTP/1.1\r\nHost: forbidden.example:1:1\r\nConnection: close\r\n\r\n",
            ),
            (
                "second host",
                "GET /f2 HTTP/1.1\r\nHost: api.test\r\nHost: forbidden.example\r\nConnection: close\r\n\r\n",
            ),
            (
                "absolute target",
                "GET http://forbidden.example/f3 HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n",
            ),
            (
                "keep-alive",
                "GET /ok HTTP/1.1\r\nHost: api.test\r\n\r\nGET /f4 HTTP/1.1\r\nHost: forbidden.example\r\nConnection: close\r\n\r\n",
            ),
        ] {
            let ca = cx.egress_ca.clone();
            let got = cx
                .sandbox(move || tls_all(WEB2, "api.test", &ca, req.as_bytes()))
                .await
                .unwrap_or_default();
            assert!(
                got.matches("HTTP/1.1 200").count() <= usize::from(case == "keep-alive"),
                "{case}: {got}"
            );
            let reached = cx.received("forbidden.example");
            assert!(reached.is_empty(), "{case}: reached the server: {reached:?}");
            let e = cx
                .wait_entry(&format!("misdirected ({case})"), |e| {
                    e.kind == NetEventKind::Connect
                        && e.verdict == Verdict::Deny
                        && e.rule == "misdirected:api.test"
                })
                .await;
            assert_eq!(e.port, Some(443));
        }
            // Every refusal happened before the secret was considered: the only requests with
            // the value are the allowed ones.
            for h in cx.received(SECRET_VALUE) {
                assert!(h.starts_with("GET /ok "), "{h}");
            }
        },
    );
}

// ---- 11: `Upgrade:` switches the checks off ----

#[test]
fn sandbox_blocks_requests_smuggled_after_an_unanswered_upgrade() {
    scenario(
        default_policy(),
        vec![bearer(&["api.test"])],
        |cx| async move {
            cx.resolve("allowed.test").await;
            cx.resolve("api.test").await;
            // Plain HTTP: an upgrade the server does not accept (200, not 101), then a request
            // for a denied host on the same connection.
            let req = "GET /u1 HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\
                   GET /u2 HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n";
            let got = cx
                .sandbox(move || tcp_all(format!("{WEB1}:80").parse().unwrap(), req.as_bytes()))
                .await
                .unwrap_or_default();
            assert!(got.matches("HTTP/1.1 200").count() <= 1, "{got}");
            assert!(
                cx.received("denied.test").is_empty(),
                "{:?}",
                cx.seen.requests()
            );
            cx.misdirected("denied.test").await;
            // The same over the intercepted connection of a bound host.
            let ca = cx.egress_ca.clone();
            let req = "GET /u3 HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\
                   GET /u4 HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n";
            let got = cx
                .sandbox(move || tls_all(WEB2, "api.test", &ca, req.as_bytes()))
                .await
                .unwrap_or_default();
            assert!(got.matches("HTTP/1.1 200").count() <= 1, "{got}");
            assert!(
                cx.received("other.test").is_empty(),
                "{:?}",
                cx.seen.requests()
            );
            cx.misdirected("other.test").await;
            // A real 101 still switches to a raw relay.
            let got = cx
            .sandbox(|| {
                use std::io::{Read, Write};
                let mut s = std::net::TcpStream::connect(format!("{WEB1}:80")).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                s.write_all(
                    b"GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                )
                .unwrap();
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut buf).unwrap();
                    assert!(n > 0);
                    got.extend_from_slice(&buf[..n]);
                }
                s.write_all(b"\x81\x05raw!!").unwrap();
                let mut echo = [0u8; 7];
                s.read_exact(&mut echo).unwrap();
                (String::from_utf8_lossy(&got).to_string(), echo)
            })
            .await;
            assert!(got.0.starts_with("HTTP/1.1 101"), "{}", got.0);
            assert_eq!(&got.1, b"\x81\x05raw!!");
        },
    );
}

// ---- 12: unparsable or duplicate Host on plain HTTP ----

#[test]
fn sandbox_blocks_unjudged_requests_with_a_bad_host_on_plain_http() {
    let web3 = format!("{WEB3}/32");
    let p = policy(
        NetworkMode::Allowlist,
        &["allowed.test", "api.test", &web3],
        &["denied.test"],
    );
    scenario(p, vec![], |cx| async move {
        cx.resolve("allowed.test").await;
        for (case, ip, req) in [
            (
                "unparsable host",
                WEB3,
                "GET /b1 HTTP/1.1\r\nHost: forbidden.example:1:1\r\n\r\nGET /b1b HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n",
            ),
            (
                "address host, then a name",
                WEB3,
                "GET /b2 HTTP/1.1\r\nHost: 198.51.100.4\r\n\r\nGET /b2b HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n",
            ),
            (
                "second host",
                WEB1,
                "GET /b3 HTTP/1.1\r\nHost: allowed.test\r\nHost: denied.test\r\nConnection: close\r\n\r\n",
            ),
            (
                "absolute target",
                WEB1,
                "GET http://denied.test/b4 HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n",
            ),
        ] {
            let got = cx
                .sandbox(move || tcp_all(format!("{ip}:80").parse().unwrap(), req.as_bytes()))
                .await
                .unwrap_or_default();
            assert!(got.matches("HTTP/1.1 200").count() <= 1, "{case}: {got}");
            for needle in ["denied.test", "forbidden.example"] {
                let reached = cx.received(needle);
                assert!(reached.is_empty(), "{case}: reached the server: {reached:?}");
            }
            cx.wait_entry(&format!("misdirected ({case})"), |e| {
                e.kind == NetEventKind::Connect
                    && e.verdict == Verdict::Deny
                    && e.rule.starts_with("misdirected")
                    && e.addrs.iter().any(|a| a == ip)
            })
            .await;
        }
    });
}

// ---- 13: one tenant's sandboxes starve everyone's DNS ----

fn query_bytes(name: &str, id: u16) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    m.to_vec().unwrap()
}

#[test]
fn sandbox_blocks_dns_starvation_by_other_sandboxes() {
    const FLOODERS: usize = 8;
    scenario(
        policy(NetworkMode::Allowlist, &["allowed.test"], &[]),
        vec![],
        |cx| async move {
            // Eight more sandboxes on the same link, in open mode.
            let mut flood_ips = Vec::new();
            for i in 0..FLOODERS {
                let ip = format!("203.0.113.{}", 10 + i);
                let out = std::process::Command::new("ip")
                    .args([
                        "-n",
                        &cx.sb,
                        "addr",
                        "add",
                        &format!("{ip}/24"),
                        "dev",
                        "eth0",
                    ])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{out:?}");
                cx.egress
                    .attach(
                        &format!("flood{i}"),
                        ip.parse().unwrap(),
                        GATEWAY_IP.parse().unwrap(),
                        policy(NetworkMode::Open, &[], &[]),
                        vec![],
                    )
                    .unwrap();
                flood_ips.push(ip);
            }
            // Each asks, as fast as it likes, for names the upstream never answers.
            let stop = Arc::new(AtomicBool::new(false));
            let mut floods = Vec::new();
            for ip in flood_ips {
                let stop = stop.clone();
                let sb = cx.sb.clone();
                floods.push(std::thread::spawn(move || {
                    enter(&sb);
                    let s = UdpSocket::bind(format!("{ip}:0")).unwrap();
                    s.connect(ANY_DNS).unwrap();
                    let mut n: u32 = 0;
                    let send = |n: &mut u32| {
                        *n += 1;
                        let name = format!("q{n}x{}.blackhole.test", rand::random::<u32>());
                        let _ = s.send(&query_bytes(&name, *n as u16));
                    };
                    // A burst that fills this sandbox's share at once (so that the flood's
                    // queries time out together), then a steady stream that takes every
                    // slot that frees (about 200 queries a second per sandbox).
                    for _ in 0..80 {
                        send(&mut n);
                    }
                    while !stop.load(Ordering::Relaxed) {
                        send(&mut n);
                        send(&mut n);
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }));
            }
            // The flood holds the resolver's upstream capacity: wait until the upstream has
            // seen the queries that fill it (8 sandboxes at 64 queries in flight each, the
            // per-sandbox cap, is all of the resolver's 512).
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let n = cx
                    .seen
                    .dns
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|n| n.ends_with(".blackhole.test"))
                    .count();
                if n >= FLOODERS * 64 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the flood reached the upstream {n} times"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // The victim's lookups still succeed, each at once, back to back for 4 s (past
            // the moment the flood's first queries time out upstream and it takes their
            // slots again), while the flood goes on.
            let results = cx
                .sandbox(|| {
                    let s = UdpSocket::bind(format!("{SANDBOX_IP}:0")).unwrap();
                    s.connect(ANY_DNS).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    let mut out = Vec::new();
                    let start = Instant::now();
                    let mut id = 40000u16;
                    while start.elapsed() < Duration::from_secs(4) || out.len() < 20 {
                        id = id.wrapping_add(1);
                        let t = Instant::now();
                        s.send(&query_bytes("allowed.test", id)).unwrap();
                        let mut buf = [0u8; 4096];
                        let r = loop {
                            match s.recv(&mut buf) {
                                Ok(n) => match Message::from_vec(&buf[..n]) {
                                    Ok(m) if m.id() == id => break Ok(m.response_code()),
                                    _ => continue,
                                },
                                Err(e) => break Err(e.to_string()),
                            }
                        };
                        let failed = r.is_err();
                        out.push((r, t.elapsed()));
                        if failed {
                            break;
                        }
                    }
                    out
                })
                .await;
            stop.store(true, Ordering::Relaxed);
            for f in floods {
                f.join().unwrap();
            }
            let failed: Vec<_> = results
                .iter()
                .filter(|(r, _)| r.as_ref().ok() != Some(&ResponseCode::NoError))
                .collect();
            assert!(failed.is_empty(), "victim lookups failed: {results:?}");
            let entry = cx
                .wait_entry("victim dns", |e| {
                    e.kind == NetEventKind::Dns && e.name.as_deref() == Some("allowed.test")
                })
                .await;
            assert_eq!(entry.addrs, vec![WEB1.to_string()]);
        },
    );
}

// ---- 14: open mode reaches internal ranges that are not RFC 1918 ----

#[test]
fn sandbox_blocks_open_mode_reaching_special_and_attached_networks() {
    scenario(
        policy(NetworkMode::Open, &[], &[]),
        vec![],
        |cx| async move {
            for (ip, rule) in [
                (BENCH_HOST, "blocked:special"),
                (IETF_HOST, "blocked:special"),
                (WEB3, "blocked:special"),
                (ATTACHED_HOST, "blocked:host-network"),
            ] {
                let got = cx
                    .sandbox(move || http_get(ip, ip, &[]))
                    .await
                    .unwrap_or_default();
                assert!(!got.contains("200 OK"), "{ip}: {got}");
                let e = cx
                    .wait_entry(&format!("connect to {ip}"), |e| {
                        e.kind == NetEventKind::Connect && e.addrs.iter().any(|a| a == ip)
                    })
                    .await;
                assert_eq!((e.verdict, e.rule.as_str()), (Verdict::Deny, rule), "{ip}");
            }
            // A global address is still open.
            let got = cx
                .sandbox(|| http_get(GLOBAL_HOST, GLOBAL_HOST, &[]))
                .await
                .unwrap();
            assert!(got.starts_with("HTTP/1.1 200"), "{got}");
            // Explicit rules still open them: by CIDR, and by name (resolved by the sandbox).
            let bench = "198.18.0.0/24".to_string();
            let attached = format!("{ATTACHED_HOST}/32");
            cx.egress
                .set_policy(
                    "sbx1",
                    policy(NetworkMode::Open, &[&bench, &attached, "allowed.test"], &[]),
                )
                .unwrap();
            for ip in [BENCH_HOST, ATTACHED_HOST] {
                let got = cx.sandbox(move || http_get(ip, ip, &[])).await.unwrap();
                assert!(got.starts_with("HTTP/1.1 200"), "{ip}: {got}");
            }
            cx.resolve("allowed.test").await;
            let got = cx
                .sandbox(|| http_get(WEB1, "allowed.test", &[]))
                .await
                .unwrap();
            assert!(got.starts_with("HTTP/1.1 200"), "{got}");
            // A name open mode admits implicitly does not open a special address.
            let got = cx
                .sandbox(|| http_get(WEB3, "unlisted.test", &[]))
                .await
                .unwrap_or_default();
            assert!(!got.contains("200 OK"), "{got}");
        },
    );
}
