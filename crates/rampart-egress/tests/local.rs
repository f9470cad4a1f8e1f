//! The egress service on loopback, without network namespaces: attach/detach bookkeeping,
//! state kept across a restart, the resolver's answers and pins, the event hook.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use rampart_egress::{Egress, EgressConfig, EgressError};
use rampart_types::network::{
    NetEventKind, NetworkMode, NetworkPolicy, SecretInjection, SecretSpec, Verdict,
};

fn cfg(state: &std::path::Path, upstream: Vec<SocketAddr>) -> EgressConfig {
    EgressConfig {
        listen: vec!["127.0.0.1".parse().unwrap()],
        proxy_port: 0,
        dns_port: 0,
        upstream_dns: upstream,
        state_dir: state.to_path_buf(),
        ..Default::default()
    }
}

fn allow(names: &[&str]) -> NetworkPolicy {
    NetworkPolicy {
        mode: NetworkMode::Allowlist,
        allow: names.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn secret(name: &str, value: &str) -> SecretSpec {
    SecretSpec {
        name: name.into(),
        value: value.into(),
        hosts: vec!["api.example.com".into()],
        inject: SecretInjection::Basic {
            username: "me".into(),
        },
        env: Some(format!("{}_TOKEN", name.to_uppercase())),
    }
}

#[tokio::test]
async fn attach_bookkeeping_and_state_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("egress");
    let ip: IpAddr = "10.201.0.3".parse().unwrap();
    let gw: IpAddr = "10.201.0.2".parse().unwrap();
    let e = Egress::start(cfg(&state, vec![])).await.unwrap();
    assert_ne!(e.proxy_port(), 0);
    assert_ne!(e.dns_port(), 0);

    // Refusals name what is wrong and leave nothing behind.
    let err = e.attach("../x", ip, gw, allow(&[]), vec![]).unwrap_err();
    assert!(matches!(err, EgressError::InvalidId(_)), "{err}");
    let err = e
        .attach("s1", ip, gw, allow(&["ok.com", "b@d"]), vec![])
        .unwrap_err();
    assert!(err.to_string().contains("\"b@d\""), "{err}");
    let err = e
        .attach(
            "s1",
            ip,
            gw,
            allow(&[]),
            vec![secret("a", "v"), secret("a", "w")],
        )
        .unwrap_err();
    assert!(matches!(err, EgressError::DuplicateSecret(_)), "{err}");
    assert!(!state.join("s1").exists());

    let a1 = e
        .attach(
            "s1",
            ip,
            gw,
            allow(&["api.example.com"]),
            vec![secret("gh", "value-1")],
        )
        .unwrap();
    assert!(state.join("s1/ca.key").exists());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(state.join("s1/ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "CA key readable by others: {mode:o}");
    }
    let err = e
        .attach("s1", "10.201.0.5".parse().unwrap(), gw, allow(&[]), vec![])
        .unwrap_err();
    assert!(matches!(err, EgressError::AlreadyAttached(_)));
    let err = e.attach("s2", ip, gw, allow(&[]), vec![]).unwrap_err();
    assert!(
        matches!(err, EgressError::AlreadyAttached(_)),
        "same address"
    );
    for f in std::fs::read_dir(state.join("s1")).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        assert!(!text.contains("value-1"));
    }

    // A restarted daemon attaching the same sandbox keeps its CA and placeholders.
    drop(e);
    let e = Egress::start(cfg(&state, vec![])).await.unwrap();
    let a2 = e
        .attach(
            "s1",
            ip,
            gw,
            allow(&["api.example.com"]),
            vec![secret("gh", "value-1")],
        )
        .unwrap();
    assert_eq!(a1.ca_cert_pem, a2.ca_cert_pem);
    assert_eq!(a1.env, a2.env);
    assert_eq!(a1.env[0].0, "GH_TOKEN");

    assert!(e.detach("s1"));
    assert!(!e.detach("s1"));
    assert!(!state.join("s1").exists());
    assert!(e.log("s1", 0, 10).is_none());
    assert!(matches!(
        e.set_policy("s1", allow(&[])),
        Err(EgressError::NotAttached(_))
    ));
}

#[tokio::test]
async fn the_ca_is_made_only_for_a_sandbox_with_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("egress");
    let gw: IpAddr = "10.201.0.2".parse().unwrap();
    let e = Egress::start(cfg(&state, vec![])).await.unwrap();

    // Without secrets: no CA, nothing written.
    let a = e
        .attach(
            "plain",
            "10.201.0.3".parse().unwrap(),
            gw,
            allow(&["ok.com"]),
            vec![],
        )
        .unwrap();
    assert!(a.ca_cert_pem.is_none());
    assert!(a.env.is_empty());
    assert!(e.ca_cert_pem("plain").is_none());
    assert!(!state.join("plain").exists());

    // Secrets given later make the CA (kept, with the placeholders, in the state dir).
    let info = e.set_secrets("plain", vec![secret("gh", "v")]).unwrap();
    let ca = e.ca_cert_pem("plain").expect("a CA once it has secrets");
    assert!(ca.contains("BEGIN CERTIFICATE"));
    assert!(state.join("plain/ca.key").exists());
    assert!(state.join("plain/placeholders.json").exists());
    // Replacing them keeps the CA and the placeholder of a kept name.
    let again = e.set_secrets("plain", vec![secret("gh", "w")]).unwrap();
    assert_eq!(e.ca_cert_pem("plain").as_deref(), Some(ca.as_str()));
    assert_eq!(info, again);
    // Taking them away keeps the CA (the sandbox's trust store may have it).
    e.set_secrets("plain", vec![]).unwrap();
    assert_eq!(e.ca_cert_pem("plain").as_deref(), Some(ca.as_str()));
    assert!(!state.join("plain/placeholders.json").exists());

    // With secrets at attach: the CA comes with the attachment.
    let b = e
        .attach(
            "sec",
            "10.201.0.5".parse().unwrap(),
            gw,
            allow(&["api.example.com"]),
            vec![secret("gh", "v")],
        )
        .unwrap();
    assert_eq!(b.ca_cert_pem, e.ca_cert_pem("sec"));
    assert_ne!(
        b.ca_cert_pem.as_deref(),
        Some(ca.as_str()),
        "one CA per sandbox"
    );

    assert!(e.detach("plain"));
    assert!(e.detach("sec"));
    assert!(!state.join("plain").exists());
    assert!(!state.join("sec").exists());
}

/// A policy that allows a package registry gets a CA at attach (its TLS is intercepted to
/// record downloads), kept across a restart; a re-attach makes none for a sandbox that had
/// none (its trust store has no CA), and a daemon configured not to record packages (the
/// template builder) makes none at all.
#[tokio::test]
async fn a_registry_in_the_policy_brings_a_ca_at_create_only() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("egress");
    let gw: IpAddr = "10.201.0.2".parse().unwrap();
    let ip = |n: u8| -> IpAddr { format!("10.201.0.{n}").parse().unwrap() };
    assert!(rampart_egress::policy_needs_ca(&allow(&["pypi.org"])));
    assert!(rampart_egress::policy_needs_ca(&allow(&["*.crates.io"])));
    assert!(!rampart_egress::policy_needs_ca(&allow(&["ok.com"])));
    let open = NetworkPolicy {
        mode: NetworkMode::Open,
        ..Default::default()
    };
    assert!(rampart_egress::policy_needs_ca(&open));
    {
        let e = Egress::start(cfg(&state, vec![])).await.unwrap();
        let a = e
            .attach("pkg", ip(3), gw, allow(&["pypi.org"]), vec![])
            .unwrap();
        let ca = a.ca_cert_pem.expect("a CA for a registry");
        assert!(state.join("pkg/ca.key").exists());
        assert!(a.env.is_empty());
        // A restarted daemon re-attaches it with the same CA; one that had none gets none,
        // even if its policy now allows a registry.
        drop(e);
        let e = Egress::start(cfg(&state, vec![])).await.unwrap();
        let again = e
            .reattach("pkg", ip(3), gw, allow(&["pypi.org"]), vec![])
            .unwrap();
        assert_eq!(again.ca_cert_pem.as_deref(), Some(ca.as_str()));
        let none = e
            .reattach("late", ip(4), gw, allow(&["pypi.org"]), vec![])
            .unwrap();
        assert!(none.ca_cert_pem.is_none());
        assert!(!state.join("late").exists());
        assert!(e.detach("pkg") && e.detach("late"));
        assert!(!state.join("pkg").exists());
    }
    let e = Egress::start(rampart_egress::EgressConfig {
        record_packages: false,
        ..cfg(&state, vec![])
    })
    .await
    .unwrap();
    let a = e
        .attach("build", ip(5), gw, allow(&["pypi.org"]), vec![])
        .unwrap();
    assert!(a.ca_cert_pem.is_none());
    assert!(e.detach("build"));
}

/// A one-name upstream resolver on loopback counting the questions it gets.
async fn upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, peer) = sock.recv_from(&mut buf).await.unwrap();
            let q = Message::from_vec(&buf[..n]).unwrap();
            let query = q.queries()[0].clone();
            s2.lock().unwrap().push(query.name().to_ascii());
            let mut r = Message::new();
            r.set_id(q.id())
                .set_message_type(MessageType::Response)
                .set_op_code(OpCode::Query)
                .add_query(query.clone());
            if query.query_type() == RecordType::A {
                r.add_answer(Record::from_rdata(
                    query.name().clone(),
                    5,
                    RData::A(A("93.184.216.34".parse().unwrap())),
                ));
            }
            sock.send_to(&r.to_vec().unwrap(), peer).await.unwrap();
        }
    });
    (addr, seen)
}

async fn ask(dns: SocketAddr, from: &str, name: &str, t: RecordType) -> Message {
    let s = tokio::net::UdpSocket::bind(format!("{from}:0"))
        .await
        .unwrap();
    let mut m = Message::new();
    m.set_id(7)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    s.send_to(&m.to_vec().unwrap(), dns).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(Duration::from_secs(10), s.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    Message::from_vec(&buf[..n]).unwrap()
}

#[tokio::test]
async fn resolver_answers_allowed_names_only_and_feeds_the_event_hook() {
    let dir = tempfile::tempdir().unwrap();
    let (up, seen) = upstream().await;
    let e = Egress::start(cfg(&dir.path().join("egress"), vec![up]))
        .await
        .unwrap();
    let dns: SocketAddr = format!("127.0.0.1:{}", e.dns_port()).parse().unwrap();
    let mut events = e.take_events().unwrap();
    assert!(e.take_events().is_none());

    // Unknown sandbox (127.0.0.2 is not attached): NXDOMAIN, nothing asked upstream.
    let r = ask(dns, "127.0.0.2", "api.example.com", RecordType::A).await;
    assert_eq!(r.response_code(), ResponseCode::NXDomain);
    assert_eq!(r.id(), 7);
    assert!(seen.lock().unwrap().is_empty());

    // A sandbox at 127.0.0.2 (loopback stands in for its link here).
    e.attach(
        "s1",
        "127.0.0.2".parse().unwrap(),
        "127.0.0.1".parse().unwrap(),
        allow(&["api.example.com", "*.cdn.example.com"]),
        vec![],
    )
    .unwrap();
    let r = ask(dns, "127.0.0.2", "API.Example.com.", RecordType::A).await;
    assert_eq!(r.response_code(), ResponseCode::NoError);
    assert_eq!(r.answers().len(), 1);
    let r = ask(dns, "127.0.0.2", "x.cdn.example.com", RecordType::TXT).await;
    assert_eq!(r.response_code(), ResponseCode::NoError);
    for (name, t) in [
        ("cdn.example.com", RecordType::A),
        ("secret-data.evil.com", RecordType::TXT),
        ("example.com", RecordType::MX),
    ] {
        let r = ask(dns, "127.0.0.2", name, t).await;
        assert_eq!(r.response_code(), ResponseCode::NXDomain, "{name}");
    }
    let asked = seen.lock().unwrap().clone();
    assert_eq!(asked.len(), 2, "{asked:?}");

    let log = e.log("s1", 0, 100).unwrap();
    let dns_entries: Vec<_> = log.iter().filter(|l| l.kind == NetEventKind::Dns).collect();
    assert_eq!(dns_entries.len(), 5);
    assert_eq!(dns_entries[0].name.as_deref(), Some("api.example.com"));
    assert_eq!(dns_entries[0].addrs, vec!["93.184.216.34".to_string()]);
    assert_eq!(dns_entries[0].rule, "allow:api.example.com");
    assert_eq!(dns_entries[1].rule, "allow:*.cdn.example.com");
    assert_eq!(dns_entries[2].rule, "default");
    assert_eq!(dns_entries[3].qtype.as_deref(), Some("TXT"));
    assert_eq!(dns_entries[3].verdict, Verdict::Deny);

    // The event hook sees the same entries, with the sandbox id.
    for want in &log {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ev.sandbox, "s1");
        assert_eq!(&ev.entry, want);
    }

    // Mode none: even an allowed name gets nothing.
    e.set_policy(
        "s1",
        NetworkPolicy {
            mode: NetworkMode::None,
            allow: vec!["api.example.com".into()],
            ..Default::default()
        },
    )
    .unwrap();
    let r = ask(dns, "127.0.0.2", "api.example.com", RecordType::A).await;
    assert_eq!(r.response_code(), ResponseCode::NXDomain);
    assert_eq!(seen.lock().unwrap().len(), 2);

    // Garbage gets FORMERR or nothing, never a crash.
    let s = tokio::net::UdpSocket::bind("127.0.0.2:0").await.unwrap();
    s.send_to(b"\x12\x34garbage", dns).await.unwrap();
    let mut buf = [0u8; 512];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), s.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let r = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(r.id(), 0x1234);
    assert_eq!(r.response_code(), ResponseCode::FormErr);
}

/// One sandbox may hold 1,024 proxied connections (two descriptors each): at a service's
/// usual soft limit of 1,024 open files it alone would exhaust the daemon's descriptors.
#[tokio::test]
async fn start_raises_the_open_files_limit_to_the_hard_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if hard <= 1024 {
        eprintln!("skip: hard open files limit {hard} leaves nothing to raise");
        return;
    }
    setrlimit(Resource::RLIMIT_NOFILE, 1024, hard).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _e = Egress::start(cfg(&dir.path().join("egress"), vec![]))
        .await
        .unwrap();
    assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (hard, hard));
}

#[tokio::test]
async fn a_failed_start_leaves_no_listener_behind() {
    let dir = tempfile::tempdir().unwrap();
    // A port free now; the second listen address is on no interface, so its bind fails
    // after the first address's listeners are bound.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = cfg(dir.path(), vec![]);
    c.listen.push("192.0.2.1".parse().unwrap());
    c.proxy_port = port;
    assert!(Egress::start(c).await.is_err());
    // The proxy port on the first address is free again.
    tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the failed start left its proxy listener bound");
}
