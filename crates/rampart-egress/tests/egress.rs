//! The egress proxy and resolver against a private "internet" in network namespaces.
//! Needs root, `ip` and `nft`; skips with a printed reason otherwise.

mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use rampart_egress::Egress;
use rampart_types::network::{
    NetEventKind, NetLogEntry, NetworkMode, SecretInjection, SecretSpec, Verdict,
};
use support::*;

/// Any address: the sandbox's DNS traffic is redirected to the resolver whatever it names.
const ANY_DNS: &str = "192.0.2.53:53";
const SECRET_VALUE: &str = "sk-live-9f8e7d6c5b4a";

struct Ctx {
    egress: Egress,
    sb: String,
    seen: Arc<Seen>,
    test_ca: String,
    egress_ca_pem: String,
}

impl Ctx {
    /// Runs a blocking client function inside the sandbox netns.
    async fn sandbox<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        in_ns(&self.sb, f).await
    }
    fn log(&self) -> Vec<NetLogEntry> {
        self.egress.log("sbx1", 0, 100_000).expect("attached")
    }
    /// The last log entry of `kind` for `name` (waits for it: entries land as the proxy acts).
    async fn entry(
        &self,
        kind: NetEventKind,
        name: Option<&str>,
        addr: Option<&str>,
    ) -> NetLogEntry {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(e) = self.log().into_iter().rev().find(|e| {
                e.kind == kind
                    && name.is_none_or(|n| e.name.as_deref() == Some(n))
                    && addr.is_none_or(|a| e.addrs.iter().any(|x| x == a))
            }) {
                return e;
            }
            assert!(
                Instant::now() < deadline,
                "no {kind:?} entry for {name:?} {addr:?}: {:#?}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    /// Sends two plain-HTTP requests on one connection to `ip`, the first for `host`, the second
    /// for `other.test`: at most the first is answered, and the second is logged as misdirected.
    async fn second_host_on_connection_is_refused(&self, ip: &'static str, host: &str) {
        let request = format!(
            "GET / HTTP/1.1\r\nHost: {host}\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n"
        );
        let got = self
            .sandbox(move || tcp_exchange(format!("{ip}:80").parse().unwrap(), request.as_bytes()))
            .await
            .unwrap_or_default();
        assert!(got.matches("HTTP/1.1 200").count() <= 1, "{got}");
        let e = self
            .entry(NetEventKind::Connect, Some("other.test"), None)
            .await;
        assert_eq!(
            (e.verdict, e.rule.as_str()),
            (Verdict::Deny, format!("misdirected:{host}").as_str())
        );
    }
}

fn secret() -> SecretSpec {
    SecretSpec {
        name: "api_token".into(),
        value: SECRET_VALUE.into(),
        hosts: vec!["api.test".into()],
        inject: SecretInjection::Header {
            name: "Authorization".into(),
            template: "Bearer {value}".into(),
        },
        env: Some("API_TOKEN".into()),
    }
}

/// Builds the network, starts the egress service in the router netns with `sbx1` attached
/// at the sandbox address, and runs `f`.
fn scenario<F, Fut>(f: F)
where
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let allow = policy(
        NetworkMode::Allowlist,
        &["allowed.test", "api.test", "*.wild.test"],
        &["denied.test"],
    );
    with_egress(1, allow, vec![secret()], |w| {
        let att = &w.attachment;
        assert!(att
            .ca_cert_pem
            .as_ref()
            .unwrap()
            .contains("BEGIN CERTIFICATE"));
        assert_eq!(att.env.len(), 1);
        assert_eq!(att.env[0].0, "API_TOKEN");
        assert!(att.env[0].1.starts_with("rampart-secret-api_token-"));
        assert!(!format!("{att:?}").contains(SECRET_VALUE));
        let egress_ca_pem = att.ca_cert_pem.clone().unwrap();
        f(Ctx {
            egress: w.egress,
            sb: w.sb,
            seen: w.seen,
            test_ca: w.test_ca,
            egress_ca_pem,
        })
    });
}

#[test]
fn allowed_names_resolve_and_connect_others_get_nxdomain_and_nothing() {
    scenario(|cx| async move {
        // Allowed name: resolves (through the upstream) and connects, HTTP and HTTPS.
        let (code, addrs) = cx
            .sandbox(|| dns_query(ANY_DNS, "allowed.test", RecordType::A, false))
            .await;
        assert_eq!(code, ResponseCode::NoError);
        assert_eq!(addrs, vec![WEB1.parse::<std::net::IpAddr>().unwrap()]);
        let e = cx
            .entry(NetEventKind::Dns, Some("allowed.test"), None)
            .await;
        assert_eq!(
            (e.verdict, e.rule.as_str()),
            (Verdict::Allow, "allow:allowed.test")
        );
        assert_eq!(e.addrs, vec![WEB1.to_string()]);
        assert_eq!(e.qtype.as_deref(), Some("A"));

        let body = cx
            .sandbox(|| http_get(WEB1, "allowed.test", &[]))
            .await
            .unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        let e = cx
            .entry(NetEventKind::Connect, Some("allowed.test"), Some(WEB1))
            .await;
        assert_eq!(
            (e.verdict, e.rule.as_str(), e.port),
            (Verdict::Allow, "allow:allowed.test", Some(80))
        );
        let close = cx
            .entry(NetEventKind::Close, Some("allowed.test"), Some(WEB1))
            .await;
        assert!(
            close.bytes_out.unwrap() > 0 && close.bytes_in.unwrap() > 0,
            "{close:?}"
        );

        // Plain HTTP: every request on the connection must name the same host.
        cx.second_host_on_connection_is_refused(WEB1, "allowed.test")
            .await;

        // HTTPS passes through untouched: the client trusts only the test CA.
        let ca = cx.test_ca.clone();
        let body = cx
            .sandbox(move || https_get(WEB1, "allowed.test", &ca, &[]))
            .await
            .unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");

        // A wildcard rule.
        let (code, _) = cx
            .sandbox(|| dns_query(ANY_DNS, "a.wild.test", RecordType::A, true))
            .await;
        assert_eq!(code, ResponseCode::NoError);
        assert_eq!(
            cx.entry(NetEventKind::Dns, Some("a.wild.test"), None)
                .await
                .rule,
            "allow:*.wild.test"
        );

        // Denied and unlisted names: NXDOMAIN, never asked upstream, and no connection.
        for (name, rule) in [
            ("denied.test", "deny:denied.test"),
            ("unlisted.test", "default"),
        ] {
            let (code, addrs) = cx
                .sandbox(move || dns_query(ANY_DNS, name, RecordType::A, false))
                .await;
            assert_eq!(code, ResponseCode::NXDomain, "{name}");
            assert!(addrs.is_empty());
            let e = cx.entry(NetEventKind::Dns, Some(name), None).await;
            assert_eq!((e.verdict, e.rule.as_str()), (Verdict::Deny, rule));
            let got = cx.sandbox(move || http_get(WEB3, name, &[])).await;
            let text = got.unwrap_or_default();
            assert!(text.starts_with("HTTP/1.1 403"), "{name}: {text}");
            let e = cx
                .entry(NetEventKind::Connect, Some(name), Some(WEB3))
                .await;
            assert_eq!((e.verdict, e.rule.as_str()), (Verdict::Deny, rule));
        }
        let asked = cx.seen.dns.lock().unwrap().clone();
        assert!(
            !asked
                .iter()
                .any(|n| n == "denied.test" || n == "unlisted.test"),
            "{asked:?}"
        );

        // A raw IP that no allowed name resolved to is dropped; so is a nameless
        // connection to an address an allowed name did resolve to.
        let got = cx
            .sandbox(|| http_get(WEB3, WEB3, &[]))
            .await
            .unwrap_or_default();
        assert!(!got.contains("200 OK"), "{got}");
        let e = cx.entry(NetEventKind::Connect, None, Some(WEB3)).await;
        assert_eq!((e.verdict, e.rule.as_str()), (Verdict::Deny, "default"));
        let got = cx
            .sandbox(|| tcp_exchange(format!("{WEB1}:80").parse().unwrap(), b"\x00\x01raw bytes"))
            .await
            .unwrap_or_default();
        assert!(got.is_empty(), "{got}");

        // SNI for a name that is not allowed, on an allowed (pinned) address: refused.
        let (code, _) = cx
            .sandbox(|| dns_query(ANY_DNS, "api.test", RecordType::A, false))
            .await;
        assert_eq!(code, ResponseCode::NoError);
        for (sni, rule) in [
            ("other.test", "default"),
            ("denied.test", "deny:denied.test"),
        ] {
            let ca = cx.test_ca.clone();
            let r = cx.sandbox(move || https_get(WEB2, sni, &ca, &[])).await;
            assert!(r.is_err(), "{sni}: {r:?}");
            let e = cx.entry(NetEventKind::Connect, Some(sni), Some(WEB2)).await;
            assert_eq!((e.verdict, e.rule.as_str()), (Verdict::Deny, rule));
        }
        // An allowed name on an address it did not resolve to: refused.
        let ca = cx.test_ca.clone();
        let r = cx
            .sandbox(move || https_get(WEB3, "allowed.test", &ca, &[]))
            .await;
        assert!(r.is_err(), "{r:?}");
        let e = cx
            .entry(NetEventKind::Connect, Some("allowed.test"), Some(WEB3))
            .await;
        assert_eq!(
            (e.verdict, e.rule.as_str()),
            (Verdict::Deny, "not-resolved:allowed.test")
        );

        // Metadata, the host's own addresses: refused whatever the policy.
        cx.egress
            .set_policy("sbx1", policy(NetworkMode::Open, &[], &[]))
            .unwrap();
        for (ip, rule) in [
            ("169.254.169.254", "blocked:metadata"),
            (GATEWAY_IP, "blocked:host"),
            (HOST_OTHER_IP, "blocked:host"),
        ] {
            let got = cx
                .sandbox(move || http_get(ip, "allowed.test", &[]))
                .await
                .unwrap_or_default();
            assert!(got.is_empty(), "{ip}: {got}");
            let e = cx.entry(NetEventKind::Connect, None, Some(ip)).await;
            assert_eq!((e.verdict, e.rule.as_str()), (Verdict::Deny, rule), "{ip}");
        }
        // ... while open mode lets a raw global IP through (not one of a special-purpose
        // range such as WEB3's TEST-NET-2, nor one on a network of the host's).
        let got = cx
            .sandbox(|| http_get(GLOBAL_HOST, GLOBAL_HOST, &[]))
            .await
            .unwrap();
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert_eq!(
            cx.entry(NetEventKind::Connect, None, Some(GLOBAL_HOST))
                .await
                .rule,
            "open"
        );
        let got = cx
            .sandbox(|| http_get(WEB3, WEB3, &[]))
            .await
            .unwrap_or_default();
        assert!(!got.contains("200 OK"), "{got}");
        assert_eq!(
            cx.entry(NetEventKind::Connect, None, Some(WEB3)).await.rule,
            "blocked:special"
        );

        // Mode none: nothing resolves.
        cx.egress
            .set_policy("sbx1", policy(NetworkMode::None, &["allowed.test"], &[]))
            .unwrap();
        let (code, _) = cx
            .sandbox(|| dns_query(ANY_DNS, "allowed.test", RecordType::A, false))
            .await;
        assert_eq!(code, ResponseCode::NXDomain);
        assert_eq!(
            cx.entry(NetEventKind::Dns, Some("allowed.test"), None)
                .await
                .rule,
            "mode:none"
        );

        // The log is followable and paginates.
        let all = cx.log();
        assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
        let after = cx.egress.log("sbx1", all[2].seq, 2).unwrap();
        assert_eq!(after.len(), 2);
        assert_eq!(after[0].seq, all[3].seq);
    });
}

#[test]
fn dns_tunnelling_to_a_name_not_allowed_reaches_nothing() {
    scenario(|cx| async move {
        let mut rx = cx.egress.subscribe("sbx1").unwrap();
        let names: Vec<String> = (0..60)
            .map(|i| format!("{:016x}{i}.exfil.tunnel.test", rand::random::<u64>()))
            .collect();
        let n2 = names.clone();
        let codes = cx
            .sandbox(move || {
                n2.iter()
                    .enumerate()
                    .map(|(i, n)| {
                        let t = if i % 2 == 0 {
                            RecordType::TXT
                        } else {
                            RecordType::A
                        };
                        dns_query(ANY_DNS, n, t, i % 3 == 0)
                    })
                    .collect::<Vec<_>>()
            })
            .await;
        for (code, addrs) in codes {
            assert_eq!(code, ResponseCode::NXDomain);
            assert!(addrs.is_empty());
        }
        // Every query was logged as denied, and the test DNS server saw none of them.
        let mut logged = 0;
        while logged < names.len() {
            let e = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .unwrap()
                .unwrap();
            if e.kind == NetEventKind::Dns {
                assert_eq!((e.verdict, e.rule.as_str()), (Verdict::Deny, "default"));
                logged += 1;
            }
        }
        let asked = cx.seen.dns.lock().unwrap().clone();
        assert!(
            !asked.iter().any(|n| n.ends_with("tunnel.test")),
            "{asked:?}"
        );
        // An allowed name's TXT goes upstream (allowed names are answered whatever the type).
        let (code, _) = cx
            .sandbox(|| dns_query(ANY_DNS, "allowed.test", RecordType::TXT, false))
            .await;
        assert_eq!(code, ResponseCode::NoError);
        assert!(cx
            .seen
            .dns
            .lock()
            .unwrap()
            .iter()
            .any(|n| n == "allowed.test"));
    });
}

#[test]
fn policy_update_applies_to_the_next_connection_and_cuts_live_ones() {
    scenario(|cx| async move {
        let (code, _) = cx
            .sandbox(|| dns_query(ANY_DNS, "allowed.test", RecordType::A, false))
            .await;
        assert_eq!(code, ResponseCode::NoError);
        // A live streaming connection.
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let stream = tokio::spawn(cx.sandbox_stream(started_tx));
        started_rx.await.unwrap();
        cx.egress
            .set_policy("sbx1", policy(NetworkMode::Allowlist, &["api.test"], &[]))
            .unwrap();
        // The live connection ends (the proxy cut it).
        let read_after = tokio::time::timeout(Duration::from_secs(20), stream)
            .await
            .unwrap()
            .unwrap();
        assert!(read_after, "stream did not end after the policy change");
        let e = cx
            .entry(NetEventKind::Close, Some("allowed.test"), Some(WEB1))
            .await;
        assert_eq!((e.verdict, e.rule.as_str()), (Verdict::Deny, "default"));
        // The next connection obeys the new policy.
        let got = cx
            .sandbox(|| http_get(WEB1, "allowed.test", &[]))
            .await
            .unwrap_or_default();
        assert!(got.starts_with("HTTP/1.1 403"), "{got}");
        // And back.
        cx.egress
            .set_policy(
                "sbx1",
                policy(NetworkMode::Allowlist, &["allowed.test"], &[]),
            )
            .unwrap();
        let got = cx
            .sandbox(|| http_get(WEB1, "allowed.test", &[]))
            .await
            .unwrap();
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        // A bad rule is refused by name and changes nothing.
        let err = cx
            .egress
            .set_policy("sbx1", policy(NetworkMode::Allowlist, &["bad rule!"], &[]))
            .unwrap_err();
        assert!(err.to_string().contains("\"bad rule!\""), "{err}");
        assert_eq!(
            cx.egress.policy("sbx1").unwrap().allow,
            vec!["allowed.test".to_string()]
        );
    });
}

impl Ctx {
    /// Opens `GET /stream` to allowed.test in the sandbox; signals once bytes flow; resolves
    /// to true when the stream ends (EOF or reset).
    fn sandbox_stream(
        &self,
        started: tokio::sync::oneshot::Sender<()>,
    ) -> impl Future<Output = bool> + Send + 'static {
        let sb = self.sb.clone();
        async move {
            in_ns(&sb, move || {
                use std::io::{Read, Write};
                let mut s = std::net::TcpStream::connect(format!("{WEB1}:80")).unwrap();
                s.write_all(b"GET /stream HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
                    .unwrap();
                s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
                let mut buf = [0u8; 4096];
                let mut total = 0;
                let mut started = Some(started);
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => return true,
                        Ok(n) => {
                            total += n;
                            if total > 100 {
                                if let Some(tx) = started.take() {
                                    let _ = tx.send(());
                                }
                            }
                        }
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                || e.kind() == std::io::ErrorKind::TimedOut =>
                        {
                            return false
                        }
                        Err(_) => return true,
                    }
                }
            })
            .await
        }
    }
}

#[test]
fn a_secret_reaches_only_its_bound_host_in_the_configured_header() {
    scenario(|cx| async move {
        let placeholder = cx.egress.secrets("sbx1").unwrap()[0].placeholder.clone();
        assert!(!placeholder.contains(SECRET_VALUE));
        for name in ["api.test", "allowed.test"] {
            let (code, _) = cx
                .sandbox(move || dns_query(ANY_DNS, name, RecordType::A, false))
                .await;
            assert_eq!(code, ResponseCode::NoError);
        }
        // HTTPS to the bound host: the sandbox trusts its own CA; the server sees the value
        // in the configured header.
        let sandbox_ca = cx.egress_ca();
        let ph = placeholder.clone();
        let body = cx
            .sandbox(move || {
                https_get(
                    WEB2,
                    "api.test",
                    &sandbox_ca,
                    &[("Authorization", &format!("Bearer {ph}"))],
                )
            })
            .await
            .unwrap();
        assert!(
            cx.last_request()
                .contains(&format!("Authorization: Bearer {SECRET_VALUE}\r\n")),
            "{:?}",
            cx.seen.requests()
        );
        // The server's echo of it comes back with the placeholder in its place.
        assert!(!body.contains(SECRET_VALUE), "{body}");
        assert!(
            body.contains(&format!("Authorization: Bearer {placeholder}\r\n")),
            "{body}"
        );
        let e = cx
            .entry(NetEventKind::SecretUsed, Some("api.test"), None)
            .await;
        assert_eq!(e.secret.as_deref(), Some("api_token"));
        // Without any header from the sandbox, the header is set all the same.
        let sandbox_ca = cx.egress_ca();
        let body = cx
            .sandbox(move || https_get(WEB2, "api.test", &sandbox_ca, &[]))
            .await
            .unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(
            cx.last_request()
                .contains(&format!("Authorization: Bearer {SECRET_VALUE}\r\n")),
            "{:?}",
            cx.seen.requests()
        );
        assert!(!body.contains(SECRET_VALUE), "{body}");
        // curl (OpenSSL) accepts the proxy's leaf when it trusts the sandbox CA, as a
        // sandbox's tools will once its trust store holds it.
        if std::process::Command::new("curl")
            .arg("--version")
            .output()
            .is_ok()
        {
            let ca_file =
                std::env::temp_dir().join(format!("egress-ca-{}.pem", std::process::id()));
            std::fs::write(&ca_file, cx.egress_ca()).unwrap();
            let (f, resolve) = (ca_file.clone(), format!("api.test:443:{WEB2}"));
            // On a thread inside the sandbox netns: this runtime must keep serving the proxy.
            let out = cx
                .sandbox(move || {
                    std::process::Command::new("curl")
                        .args(["-sS", "-m", "10", "--cacert"])
                        .arg(&f)
                        .args(["--resolve", &resolve, "https://api.test/"])
                        .output()
                        .unwrap()
                })
                .await;
            let _ = std::fs::remove_file(&ca_file);
            let body = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "curl: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                cx.last_request()
                    .contains(&format!("Authorization: Bearer {SECRET_VALUE}\r\n")),
                "{:?}",
                cx.seen.requests()
            );
            assert!(
                !body.contains(SECRET_VALUE) && body.contains(&placeholder),
                "{body}"
            );
        } else {
            eprintln!("note: curl not installed; OpenSSL acceptance of the sandbox CA not checked");
        }
        // Plain HTTP to the bound host: not injected (the binding does not say
        // `http://api.test`).
        let body = cx
            .sandbox(|| http_get(WEB2, "api.test", &[]))
            .await
            .unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(!cx.last_request().contains(SECRET_VALUE), "{body}");

        // Another allowed host sees the placeholder, over HTTPS (not intercepted: the test
        // CA verifies) and HTTP.
        let ca = cx.test_ca.clone();
        let ph = placeholder.clone();
        let body = cx
            .sandbox(move || {
                https_get(
                    WEB1,
                    "allowed.test",
                    &ca,
                    &[("Authorization", &format!("Bearer {ph}"))],
                )
            })
            .await
            .unwrap();
        assert!(
            body.contains(&format!("Authorization: Bearer {placeholder}")),
            "{body}"
        );
        assert!(!body.contains(SECRET_VALUE));
        let ph = placeholder.clone();
        let body = cx
            .sandbox(move || http_get(WEB1, "allowed.test", &[("X-Key", &ph)]))
            .await
            .unwrap();
        assert!(
            body.contains(&placeholder) && !body.contains(SECRET_VALUE),
            "{body}"
        );

        // A second request for another host on the bound host's connection is refused.
        cx.second_host_on_connection_is_refused(WEB2, "api.test")
            .await;

        // The value is in no log entry, no API answer, no Debug output.
        let log = serde_json::to_string(&cx.log()).unwrap();
        assert!(!log.contains(SECRET_VALUE));
        let info = serde_json::to_string(&cx.egress.secrets("sbx1").unwrap()).unwrap();
        assert!(!info.contains(SECRET_VALUE));
        assert!(!format!("{:?}", cx.egress).contains(SECRET_VALUE));
        assert!(!format!("{:?}", secret()).contains(SECRET_VALUE));

        // New secrets keep the placeholder of a secret that keeps its name.
        let mut s = secret();
        s.value = "rotated-value".into();
        let info = cx.egress.set_secrets("sbx1", vec![s]).unwrap();
        assert_eq!(info[0].placeholder, placeholder);
        let sandbox_ca = cx.egress_ca();
        let body = cx
            .sandbox(move || https_get(WEB2, "api.test", &sandbox_ca, &[]))
            .await
            .unwrap();
        assert!(
            cx.last_request()
                .contains("Authorization: Bearer rotated-value\r\n"),
            "{:?}",
            cx.seen.requests()
        );
        assert!(!body.contains("rotated-value"), "{body}");

        // Detach forgets the sandbox: its connections get nothing.
        assert!(cx.egress.detach("sbx1"));
        let got = cx
            .sandbox(|| http_get(WEB1, "allowed.test", &[]))
            .await
            .unwrap_or_default();
        assert!(got.is_empty(), "{got}");
        let (code, _) = cx
            .sandbox(|| dns_query(ANY_DNS, "allowed.test", RecordType::A, false))
            .await;
        assert_eq!(code, ResponseCode::NXDomain);
    });
}

#[test]
fn a_secret_goes_over_plain_http_only_to_an_address_resolved_for_its_host() {
    scenario(|cx| async move {
        // A binding that allows plain HTTP.
        let mut s = secret();
        s.hosts = vec!["http://api.test".into()];
        cx.egress.set_secrets("sbx1", vec![s]).unwrap();
        let (code, _) = cx
            .sandbox(|| dns_query(ANY_DNS, "api.test", RecordType::A, false))
            .await;
        assert_eq!(code, ResponseCode::NoError);
        let web1_net = format!("{WEB1}/32");
        let web2_net = format!("{WEB2}/32");
        for p in [
            // The test hosts are in TEST-NET-2: open mode reaches them through rules.
            policy(NetworkMode::Open, &[&web1_net, &web2_net], &[]),
            policy(NetworkMode::Allowlist, &["api.test", &web1_net], &[]),
        ] {
            cx.egress.set_policy("sbx1", p.clone()).unwrap();
            // Both policies admit plain HTTP to WEB1 (another server) naming the bound
            // host: it must not get the value.
            let body = cx
                .sandbox(|| http_get(WEB1, "api.test", &[]))
                .await
                .unwrap();
            assert!(body.contains("HTTP/1.1 200"), "{p:?}: {body}");
            assert!(!cx.last_request().contains(SECRET_VALUE), "{p:?}: {body}");
            // The bound host at the address its name resolved to still gets it (and its
            // echo comes back scrubbed).
            let body = cx
                .sandbox(|| http_get(WEB2, "api.test", &[]))
                .await
                .unwrap();
            assert!(
                cx.last_request()
                    .contains(&format!("Authorization: Bearer {SECRET_VALUE}\r\n")),
                "{p:?}: {:?}",
                cx.seen.requests()
            );
            assert!(!body.contains(SECRET_VALUE), "{p:?}: {body}");
        }
    });
}

impl Ctx {
    /// The last request head a test server received.
    fn last_request(&self) -> String {
        self.seen.requests().pop().unwrap_or_default()
    }
    /// The sandbox's CA (what its trust store would hold).
    fn egress_ca(&self) -> String {
        self.egress_ca_pem.clone()
    }
}

/// Package downloads over plain HTTP (a Debian pool path on any host): hashed as relayed,
/// by length and chunked (the digest is of the body without its chunk framing), recorded
/// once whole; a name a `deny` pattern matches gets the proxy's 403 and never goes upstream.
#[test]
fn package_downloads_are_hashed_and_denied_ones_never_reach_upstream() {
    use sha2::{Digest, Sha256};
    scenario(|cx| async move {
        let mut p = policy(
            NetworkMode::Allowlist,
            &["allowed.test", "api.test", "*.wild.test"],
            &["denied.test"],
        );
        p.packages.deny = vec!["^evil-".into()];
        cx.egress.set_policy("sbx1", p).unwrap();
        let (code, _) = cx
            .sandbox(|| dns_query(ANY_DNS, "allowed.test", RecordType::A, false))
            .await;
        assert_eq!(code, ResponseCode::NoError);
        let get = |path: &'static str| {
            let req =
                format!("GET {path} HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n");
            move || tcp_all(format!("{WEB1}:80").parse().unwrap(), req.as_bytes())
        };
        let package = |name: &'static str| {
            let log = cx.log();
            log.into_iter()
                .filter(|e| e.kind == NetEventKind::Package)
                .find(|e| e.package.as_ref().is_some_and(|p| p.name == name))
        };
        for (path, name) in [
            ("/debian/pool/main/h/hello/hello_2.10-3_amd64.deb", "hello"),
            (
                "/chunked/pool/main/c/curl/curl_7.88.1-10+deb12u5_amd64.deb",
                "curl",
            ),
        ] {
            let got = cx.sandbox(get(path)).await.unwrap();
            assert!(got.starts_with("HTTP/1.1 200"), "{got}");
            // The body the server sent is the request head it saw.
            let head = cx
                .seen
                .requests()
                .into_iter()
                .find(|h| h.starts_with(&format!("GET {path} ")))
                .expect("the server saw the request");
            let deadline = Instant::now() + Duration::from_secs(10);
            let e = loop {
                if let Some(e) = package(name) {
                    break e;
                }
                assert!(
                    Instant::now() < deadline,
                    "no package entry: {:#?}",
                    cx.log()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            let p = e.package.unwrap();
            assert_eq!((e.verdict, e.rule.as_str()), (Verdict::Allow, "package"));
            assert_eq!(p.ecosystem, "debian");
            assert_eq!(p.registry, "allowed.test");
            assert_eq!(p.path, path);
            let want: String = Sha256::digest(head.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(p.sha256.as_deref(), Some(want.as_str()), "{path}");
            assert_eq!(p.size, Some(head.len() as u64));
        }
        // Denied by name: the proxy answers 403 and the server never sees the request.
        let path = "/debian/pool/main/e/evil-tool/evil-tool_1.0_amd64.deb";
        let got = cx.sandbox(get(path)).await.unwrap();
        assert!(got.starts_with("HTTP/1.1 403"), "{got}");
        assert!(got.contains("package-deny:^evil-"), "{got}");
        let e = cx
            .entry(NetEventKind::Package, Some("allowed.test"), None)
            .await;
        let p = e.package.unwrap();
        assert_eq!(
            (e.verdict, e.rule.as_str()),
            (Verdict::Deny, "package-deny:^evil-")
        );
        assert_eq!(
            (p.name.as_str(), p.sha256, p.size),
            ("evil-tool", None, None)
        );
        assert!(
            !cx.seen.requests().iter().any(|h| h.contains("evil-tool")),
            "a denied package went upstream"
        );
    });
}

#[test]
fn connection_rate_and_egress_bandwidth_limits_hold() {
    scenario(|cx| async move {
        let (code, _) = cx
            .sandbox(|| dns_query(ANY_DNS, "allowed.test", RecordType::A, false))
            .await;
        assert_eq!(code, ResponseCode::NoError);
        let mut p = policy(NetworkMode::Allowlist, &["allowed.test"], &[]);
        p.limits.connections_per_second = Some(1);
        cx.egress.set_policy("sbx1", p).unwrap();
        // A bucket of 1 refilled at 1/s admits at most 1 + T connections in T seconds.
        let (ok, secs) = cx
            .sandbox(|| {
                let t = Instant::now();
                let ok = (0..4)
                    .filter(|_| {
                        http_get(WEB1, "allowed.test", &[])
                            .map(|r| r.starts_with("HTTP/1.1 200"))
                            .unwrap_or(false)
                    })
                    .count();
                (ok, t.elapsed().as_secs_f64())
            })
            .await;
        assert!(ok >= 1);
        assert!(
            ok as f64 <= 1.0 + secs + 0.01,
            "{ok} connections in {secs} s"
        );
        if ok < 4 {
            let e = cx.entry(NetEventKind::Connect, None, Some(WEB1)).await;
            assert_eq!(
                (e.verdict, e.rule.as_str()),
                (Verdict::Deny, "limit:connections_per_second")
            );
        }

        // 2 Mbit/s (250 kB/s, 64 KiB burst): a 512 KiB upload cannot take less than ~1.8 s.
        let mut p = policy(NetworkMode::Allowlist, &["allowed.test"], &[]);
        p.limits.egress_mbps = Some(2);
        cx.egress.set_policy("sbx1", p).unwrap();
        let (status, secs) = cx
            .sandbox(|| {
                let body = vec![b'x'; 512 * 1024];
                let mut req = format!(
                    "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                req.extend_from_slice(&body);
                let t = Instant::now();
                let r =
                    tcp_exchange(format!("{WEB1}:80").parse().unwrap(), &req).unwrap_or_default();
                (
                    r.lines().next().unwrap_or("").to_string(),
                    t.elapsed().as_secs_f64(),
                )
            })
            .await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        let floor = (512.0 * 1024.0 - 65536.0) / 250_000.0;
        assert!(secs >= floor * 0.95, "512 KiB in {secs} s at 2 Mbit/s");
        // Its close entry counts every byte sent (it lands once the connection ends).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cx
            .log()
            .iter()
            .any(|e| e.kind == NetEventKind::Close && e.bytes_out.unwrap_or(0) >= 512 * 1024)
        {
            assert!(
                Instant::now() < deadline,
                "no close entry with the upload's bytes"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}
