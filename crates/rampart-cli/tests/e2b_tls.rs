//! Host-form URLs over HTTPS (issue 31, item 8): `rampart serve --domain test.example
//! --tls-cert F --tls-key K` with a wildcard certificate for `*.test.example` from a test CA
//! made here with rcgen.
//!
//! - `serve_refuses_tls_it_cannot_serve`: a certificate or key that cannot be read or parsed,
//!   a key of another certificate, and a certificate without its key each fail `serve` at
//!   start with the reason.
//! - `host_form_urls_over_https`: the daemon answers HTTPS with the certificate (and no plain
//!   HTTP on that port); the unmodified `e2b` SDK (`tests/e2b/tls.py`), configured only by
//!   `E2B_API_KEY` and `E2B_API_URL=https://api.test.example` and trusting the test CA by
//!   `SSL_CERT_FILE`, runs commands and reads and writes files through envd at
//!   `https://49983-<id>.test.example` (the domain the create answered), reaches a server in
//!   the sandbox at `https://8000-<id>.test.example` without a token by default (E2B's
//!   `allowPublicTraffic`), and with the traffic token only when the create said
//!   `allow_public_traffic=False` (403 without it, as E2B's proxy); names of another domain
//!   and unknown ids reach nothing; the host form is E2B's proxy for an E2B sandbox:
//!   `mask_request_host` applied, header names as written (`Host`), a killed sandbox's port
//!   answers 502 with E2B's body, and a request to a paused `auto_resume` sandbox's port
//!   wakes it.
//!   The test domain's names are resolved by the script's own CONNECT proxy (to the daemon on
//!   loopback) and by reqwest's `resolve` here: no DNS, nothing leaves the machine.
//!   The unmodified JS SDK (`tests/e2b/tls.mjs`, through its `proxy` option) does the same
//!   for envd, a public port, a private one (403 without the traffic token) and the mask.
//! - `the_operator_can_make_ports_private`: `--e2b-allow-public-traffic false` makes a
//!   default create's ports need the token, over plain HTTP.
//!
//! Needs root and the binaries; the SDK part needs `target/e2b-venv` (`scripts/e2b-sdks.sh`).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{free_port, provision, token, wait_until, Daemon, DAEMON_ENV};

const DOMAIN: &str = "test.example";

/// A test CA and a wildcard certificate for `*.test.example` (and `test.example`) it signed,
/// written as PEM files in `dir`; also a key of nobody's certificate.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    other_key: PathBuf,
}

fn make_pki(dir: &Path) -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "rampart e2b_tls test CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![format!("*.{DOMAIN}"), DOMAIN.to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    let p = Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
        other_key: dir.join("other-key.pem"),
    };
    std::fs::write(&p.ca, ca.pem()).unwrap();
    std::fs::write(&p.cert, leaf.pem()).unwrap();
    std::fs::write(&p.key, key.serialize_pem()).unwrap();
    std::fs::write(&p.other_key, other.serialize_pem()).unwrap();
    p
}

/// A temp directory of this test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("rampart-{name}-{}", token()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        support::unmount_store(&self.0.join("data"));
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Sandbox networks of this test's own (pool, link prefix and nftables table, removed when
/// the guard drops), as E2B creates get an open network by default; `n` tells apart the
/// daemons of one test process.
fn net_env(n: u32) -> (Vec<(String, String)>, support::TableGuard) {
    let t = (std::process::id().wrapping_mul(17) + 7 + n) % 250;
    let table = format!("rampart_e2btls_{}_{n}", std::process::id());
    let env = [
        ("RAMPART_NET_POOL", format!("10.254.{t}.0/24")),
        ("RAMPART_NET_LINK_PREFIX", format!("rt{t}s")),
        ("RAMPART_NET_TABLE", table.clone()),
        ("RAMPART_NET_DNS_PORT", "0".into()),
        ("RAMPART_NET_PROXY_PORT", "0".into()),
    ];
    (
        env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        support::TableGuard(table),
    )
}

/// `rampart serve` on `port` with `data`, `args` and `envs`, its log next to `data`.
fn serve(data: &Path, port: u16, args: &[&str], envs: &[(String, String)]) -> std::process::Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data.with_extension("log"))
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(data)
        .args(args)
        .env_remove("RAMPART_SOCKET")
        .env_remove("RAMPART_TLS_CERT")
        .env_remove("RAMPART_TLS_KEY")
        .env_remove("RAMPART_E2B_ALLOW_PUBLIC_TRAFFIC")
        .envs(DAEMON_ENV.iter().copied())
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawn rampart serve")
}

/// A client that trusts the test CA only and sends `test.example` and `api.test.example`
/// to the daemon on loopback (the port stays the URL's).
fn tls_client(ca: &Path, port: u16) -> reqwest::blocking::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    let at: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    support::client_builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .resolve(DOMAIN, at)
        .resolve(&format!("api.{DOMAIN}"), at)
        .build()
        .unwrap()
}

/// Destroys every sandbox of the daemon through `base` with `c` (the native API).
fn destroy_all(c: &reqwest::blocking::Client, base: &str) {
    if let Ok(r) = c.get(format!("{base}/v1/sandboxes")).send() {
        if let Ok(serde_json::Value::Array(list)) = r.json::<serde_json::Value>() {
            for s in list {
                if let Some(id) = s["id"].as_str() {
                    let _ = c.delete(format!("{base}/v1/sandboxes/{id}")).send();
                }
            }
        }
    }
}

#[test]
fn serve_refuses_tls_it_cannot_serve() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = TempDir::new("e2b-tls-refusals");
    let pki = make_pki(&tmp.0);
    let garbage = tmp.0.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let missing = tmp.0.join("missing.pem");
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--tls-cert".into(),
                s(&missing),
                "--tls-key".into(),
                s(&pki.key),
            ],
            "cannot read the TLS certificate",
        ),
        (
            vec![
                "--tls-cert".into(),
                s(&pki.cert),
                "--tls-key".into(),
                s(&missing),
            ],
            "cannot read the TLS key",
        ),
        (
            vec![
                "--tls-cert".into(),
                s(&garbage),
                "--tls-key".into(),
                s(&pki.key),
            ],
            "is not a PEM certificate chain",
        ),
        (
            vec![
                "--tls-cert".into(),
                s(&pki.cert),
                "--tls-key".into(),
                s(&garbage),
            ],
            "is not a PEM private key",
        ),
        (
            // The certificate's PEM given as the key: no private key in it.
            vec![
                "--tls-cert".into(),
                s(&pki.cert),
                "--tls-key".into(),
                s(&pki.cert),
            ],
            "is not a PEM private key",
        ),
        (
            vec![
                "--tls-cert".into(),
                s(&pki.cert),
                "--tls-key".into(),
                s(&pki.other_key),
            ],
            "cannot serve the certificate",
        ),
        (
            vec!["--tls-cert".into(), s(&pki.cert)],
            "--tls-cert is given without --tls-key",
        ),
    ];
    for (i, (args, want)) in cases.iter().enumerate() {
        let data = tmp.0.join(format!("data{i}"));
        let port = free_port();
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(["--domain", DOMAIN]);
        let mut child = serve(&data, port, &args, &[]);
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("serve {args:?} did not stop within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let log = std::fs::read_to_string(data.with_extension("log")).unwrap_or_default();
        assert!(!status.success(), "serve {args:?} started: {log}");
        assert!(
            log.contains(want),
            "serve {args:?}: want {want:?} in:\n{log}"
        );
        // Nothing was made: the failure came before the data directory.
        assert!(!data.join("state.db").exists(), "{args:?} made a store");
    }
}

#[test]
fn host_form_urls_over_https() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let py = support::venv_python("RAMPART_E2B_VENV", "e2b-venv");
    if let Some(why) = support::venv_lacks(
        &py,
        "e2b, httpx",
        "scripts/test makes it with `pip install e2b==2.63.0`",
    ) {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = TempDir::new("e2b-tls");
    let pki = make_pki(&tmp.0);
    let data = tmp.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    provision(&data);
    let port = free_port();
    let (net, _table) = net_env(0);
    let child = serve(
        &data,
        port,
        &[
            "--domain",
            DOMAIN,
            "--tls-cert",
            pki.cert.to_str().unwrap(),
            "--tls-key",
            pki.key.to_str().unwrap(),
        ],
        &net,
    );
    let base = format!("https://{DOMAIN}:{port}");
    // Stopped by pid (SIGTERM) and its store unmounted when dropped, after its sandboxes.
    let daemon = Daemon {
        child,
        url: base.clone(),
        data: data.clone(),
    };
    let c = tls_client(&pki.ca, port);
    wait_until("the daemon answers /health over HTTPS", 180, || {
        c.get(format!("{base}/health"))
            .send()
            .is_ok_and(|r| r.status().is_success())
    });
    struct Cleanup<'a>(&'a reqwest::blocking::Client, &'a str, Daemon);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            destroy_all(self.0, self.1);
            self.2.stop();
        }
    }
    let _cleanup = Cleanup(&c, &base, daemon);

    // The certificate is the operator's, and the port speaks only TLS.
    let r = support::client()
        .get(format!("http://127.0.0.1:{port}/health"))
        .send();
    assert!(
        r.is_err(),
        "plain HTTP answered on the TLS port: {:?}",
        r.map(|r| r.status())
    );
    let untrusting = reqwest::blocking::Client::builder()
        .tls_built_in_root_certs(false)
        .resolve(DOMAIN, format!("127.0.0.1:{port}").parse().unwrap())
        .build()
        .unwrap();
    let r = untrusting.get(format!("{base}/health")).send();
    assert!(
        r.is_err(),
        "a client without the test CA trusted the daemon"
    );

    let key = std::fs::read_to_string(data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();
    // The create's answer names the daemon's domain.
    let r = c
        .post(format!("https://api.{DOMAIN}:{port}/v2/sandboxes"))
        .header("x-api-key", &key)
        .json(&serde_json::json!({"templateID": "base", "timeout": 60}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: serde_json::Value = r.json().unwrap();
    assert_eq!(created["domain"], DOMAIN, "{created}");
    let id = created["sandboxID"].as_str().unwrap();
    // envd at the host form, over HTTPS, with the token (and not without).
    let host = format!("49983-{id}.{DOMAIN}");
    let envd = tls_client(&pki.ca, port);
    let envd = |token: Option<&str>| {
        let mut r = envd
            .post(format!("https://{DOMAIN}:{port}/process.Process/List"))
            .header("host", &host)
            .json(&serde_json::json!({}));
        if let Some(t) = token {
            r = r.header("x-access-token", t);
        }
        r.send().unwrap().status().as_u16()
    };
    assert_eq!(envd(None), 401);
    assert_eq!(envd(created["envdAccessToken"].as_str()), 200);
    let r = c
        .delete(format!("https://api.{DOMAIN}:{port}/sandboxes/{id}"))
        .header("x-api-key", &key)
        .send()
        .unwrap();
    assert_eq!(r.status(), 204);

    // The unmodified SDK, through host-form URLs only.
    let tests = support::workspace().join("tests/e2b");
    let port_s = port.to_string();
    let report = support::run_sdk_script(
        &py,
        &tests.join("tls.py"),
        &tests,
        &[
            ("E2B_API_KEY", &key),
            ("E2B_API_URL", &format!("https://api.{DOMAIN}")),
            ("SSL_CERT_FILE", pki.ca.to_str().unwrap()),
            ("RAMPART_TLS_PORT", &port_s),
        ],
    );
    eprintln!("passed ({}): {:?}", report.passed.len(), report.passed);
    assert!(
        report.failed.is_empty(),
        "SDK tests failed:\n{}",
        report.failed.join("\n")
    );
    assert_eq!(report.passed.len(), 6, "{:?}", report.passed);

    // The unmodified JS SDK (npm), the same way (its own `proxy` option to the script's
    // CONNECT proxy; the test CA by NODE_EXTRA_CA_CERTS). ESM resolves the SDK from the
    // script's directory: a copy goes there under this test's own name.
    let node = std::env::var_os("RAMPART_E2B_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::target_dir().join("e2b-node"));
    if !node.join("node_modules/e2b").is_dir() || !node.join("node_modules/undici").is_dir() {
        eprintln!(
            "JS SDK part skipped: no {}/node_modules/e2b (scripts/e2b-sdks.sh installs it)",
            node.display()
        );
        return;
    }
    let script = node.join(format!("rampart-tls-{}.mjs", std::process::id()));
    std::fs::copy(tests.join("tls.mjs"), &script).unwrap();
    // Its runner (`./harness.mjs`), beside it.
    std::fs::copy(tests.join("harness.mjs"), node.join("harness.mjs")).unwrap();
    let report = support::run_sdk_script(
        Path::new("node"),
        &script,
        &node,
        &[
            ("E2B_API_KEY", &key),
            ("E2B_API_URL", &format!("https://api.{DOMAIN}")),
            ("NODE_EXTRA_CA_CERTS", pki.ca.to_str().unwrap()),
            ("RAMPART_TLS_PORT", &port_s),
        ],
    );
    let _ = std::fs::remove_file(&script);
    assert!(
        report.failed.is_empty(),
        "JS SDK tests failed:\n{}",
        report.failed.join("\n")
    );
    assert_eq!(report.passed.len(), 3, "{:?}", report.passed);
}

#[test]
fn the_operator_can_make_ports_private() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = TempDir::new("e2b-private");
    let data = tmp.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    provision(&data);
    let port = free_port();
    let (net, _table) = net_env(1);
    let child = serve(&data, port, &["--e2b-allow-public-traffic", "false"], &net);
    let base = format!("http://127.0.0.1:{port}");
    let daemon = Daemon {
        child,
        url: base.clone(),
        data: data.clone(),
    };
    let c = support::client();
    wait_until("the daemon answers /health", 180, || {
        c.get(format!("{base}/health"))
            .send()
            .is_ok_and(|r| r.status().is_success())
    });
    struct Cleanup(Daemon);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            support::destroy_all(&self.0.url);
            self.0.stop();
        }
    }
    let _cleanup = Cleanup(daemon);
    let key = std::fs::read_to_string(data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();
    let create = |body: serde_json::Value| -> serde_json::Value {
        let r = c
            .post(format!("{base}/v2/sandboxes"))
            .header("x-api-key", &key)
            .json(&body)
            .send()
            .unwrap();
        assert_eq!(r.status(), 201);
        r.json().unwrap()
    };
    // A server on 8000 inside; its answer through the host form, with or without a token.
    let reach = |sbx: &serde_json::Value, token: Option<&str>| -> u16 {
        let id = sbx["sandboxID"].as_str().unwrap();
        let mut r = c
            .get(format!("{base}/"))
            .header("host", format!("8000-{id}.localhost:{port}"));
        if let Some(t) = token {
            r = r.header("e2b-traffic-access-token", t);
        }
        r.send().unwrap().status().as_u16()
    };
    let start_server = |sbx: &serde_json::Value| {
        let id = sbx["sandboxID"].as_str().unwrap();
        let r = c
            .post(format!("{base}/v1/sandboxes/{id}/processes"))
            .json(&serde_json::json!({
                "cmd": ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1",
                        "--directory", "/etc"],
            }))
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{:?}", r.text());
        wait_until("the server inside listens", 30, || {
            reach(sbx, sbx["trafficAccessToken"].as_str()) == 200
        });
    };
    let private = create(serde_json::json!({"templateID": "base", "timeout": 120}));
    start_server(&private);
    assert_eq!(
        reach(&private, None),
        403,
        "the operator's default: private"
    );
    let public = create(serde_json::json!({
        "templateID": "base", "timeout": 120,
        "network": {"allowPublicTraffic": true},
    }));
    start_server(&public);
    assert_eq!(reach(&public, None), 200, "a create that asks is public");
}
