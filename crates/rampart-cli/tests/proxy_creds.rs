//! Credentials stop at the proxies: a server inside a sandbox that answers with the request
//! it got (line and headers) is reached through the port proxy (path and host forms) and the
//! envd proxy (E2B routing headers, another port than envd's), with every Rampart credential
//! a client could send along: another sandbox's access token, an E2B access token and API
//! key, the `rampart_token` cookie and query parameter, tokens in custom headers, cookies and
//! query parameters, a `Basic` credential wrapping a token. None may arrive; everything else
//! of the request (the application's own `Authorization`, cookies, query) must.
//!
//! Needs root (sandboxes); skipped with a reason otherwise.

mod support;

use reqwest::blocking::Client;
use serde_json::{json, Value};
use std::net::SocketAddr;
use support::Sandbox;

/// Port of the echo server inside.
const ECHO_PORT: u16 = 8000;

/// Answers every request with JSON: the request line and every header as received.
const ECHO: &str = r#"
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def answer(self):
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n).decode("latin-1") if n else ""
        out = json.dumps({"line": self.requestline, "headers": [[k, v] for k, v in self.headers.items()], "body": body}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = do_PUT = answer
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

fn post(c: &Client, url: &str, headers: &[(&str, &str)], body: Value) -> (u16, Value) {
    let mut r = c.post(url).json(&body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().unwrap();
    let s = r.status().as_u16();
    (s, r.json().unwrap_or(Value::Null))
}

/// Starts the echo server as `user` in `sb` and waits until its port answers.
fn start_echo(sb: &Sandbox) {
    let c = sb.http();
    let r = c
        .put(sb.url("/files?path=/home/user/echo.py&user=user"))
        .body(ECHO)
        .send()
        .unwrap();
    assert!(r.status().is_success(), "upload echo.py: {}", r.status());
    let v = sb.exec(json!({"cmd": ["bash", "-c",
        format!("cd /home/user && (nohup python3 echo.py {ECHO_PORT} >/dev/null 2>&1 &)")],
        "user": "user"}));
    assert_eq!(&v["exit_code"], &json!(0), "start echo: {v}");
    support::wait_until("the echo server listens", 60, || {
        c.get(sb.url("/ports"))
            .send()
            .ok()
            .and_then(|r| r.json::<Value>().ok())
            .is_some_and(|l| {
                l["ports"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|e| e["port"] == ECHO_PORT && e["listening"] == true)
                })
            })
    });
}

/// What the echo server saw, as text (the request line, then `name: value` per header).
fn seen(v: &Value) -> String {
    let mut s = format!("{}\n", v["line"].as_str().unwrap_or_default());
    for h in v["headers"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "{}: {}\n",
            h[0].as_str().unwrap_or_default(),
            h[1].as_str().unwrap_or_default()
        ));
    }
    s.push_str(v["body"].as_str().unwrap_or_default());
    s
}

/// The header `name` (lowercase) as the echo server saw it.
fn header(v: &Value, name: &str) -> Vec<String> {
    v["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| h[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .map(|h| h[1].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn sandbox_blocks_credential_forwarding() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    if !std::path::Path::new("/usr/bin/python3").exists() {
        eprintln!("skipped: python3 is not installed (the echo server inside uses it)");
        return;
    }
    let d = support::start_tidy("proxy-creds");
    let url = d.url.clone();
    let c = support::client();
    let key = std::fs::read_to_string(d.data.join("api-key"))
        .expect("the daemon writes <data>/api-key")
        .trim()
        .to_owned();

    // Sandbox A serves the echo on a private port; B is another sandbox, whose token a
    // client sends along (a misdirected SDK, a browser's cookie, a shared header).
    let create = |body: Value| {
        let sb = Sandbox::create(&d, body);
        let token = sb.info["access_token"].as_str().unwrap().to_owned();
        (sb, token)
    };
    let (sa, a_token) = create(json!({"timeout_secs": 600}));
    let a = &sa.id;
    let (_b, b_token) = create(json!({"timeout_secs": 600}));
    // E, made through the E2B API: its E2B access token.
    let (s, e) = post(
        &c,
        &format!("{url}/sandboxes"),
        &[("x-api-key", &key)],
        json!({"templateID": "base", "timeout": 600, "allow_internet_access": false}),
    );
    assert_eq!(s, 201, "E2B create: {e}");
    let e_id = e["sandboxID"].as_str().unwrap().to_owned();
    let e_token = e["envdAccessToken"].as_str().unwrap().to_owned();
    start_echo(&sa);
    let e_sb = Sandbox::adopt(&d, &e_id);
    start_echo(&e_sb);

    let secrets = [
        ("A's token", a_token.clone()),
        ("B's token", b_token.clone()),
        ("E's E2B token", e_token.clone()),
        ("the E2B API key", key.clone()),
    ];
    let basic = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("me:{b_token}"))
    };
    // Everything a client might send along, besides what opens the port.
    let extra: Vec<(&str, String)> = vec![
        ("authorization", format!("Bearer {b_token}")),
        ("proxy-authorization", format!("Basic {basic}")),
        ("x-api-key", key.clone()),
        ("e2b-traffic-access-token", e_token.clone()),
        ("x-custom-token", b_token.to_uppercase()),
        ("x-forwarded-key", format!("key={key}")),
        (
            "cookie",
            format!("rampart_token={a_token}; session=keep-me; other={b_token}; k={key}"),
        ),
        ("referer", format!("http://x/?token={b_token}")),
        ("x-keep", "kept".into()),
    ];
    let query =
        format!("?rampart_token={a_token}&keep=1&t={b_token}&k={key}&e={e_token}&q=two%20words");
    let check = |how: &str, r: reqwest::blocking::Response| {
        let status = r.status().as_u16();
        let v: Value = r.json().unwrap_or(Value::Null);
        assert_eq!(status, 200, "{how}: {v}");
        let text = seen(&v);
        for (what, s) in &secrets {
            assert!(
                !text.to_lowercase().contains(&s.to_lowercase()),
                "{how}: {what} reached the server inside:\n{text}"
            );
        }
        // The rest of the request arrived as it was sent.
        assert_eq!(header(&v, "x-keep"), ["kept"], "{how}:\n{text}");
        assert_eq!(header(&v, "cookie"), ["session=keep-me"], "{how}:\n{text}");
        let line = v["line"].as_str().unwrap_or_default();
        assert!(
            line.contains("/echo/path?keep=1&q=two%20words "),
            "{how}: {line}"
        );
        v
    };

    // 1. The port proxy, path form, opened with A's token in X-Rampart-Token.
    let mut r = c
        .get(format!(
            "{url}/v1/sandboxes/{a}/ports/{ECHO_PORT}/echo/path{query}"
        ))
        .header("x-rampart-token", &a_token);
    for (k, v) in &extra {
        r = r.header(*k, v);
    }
    check("port proxy (path form)", r.send().unwrap());

    // 2. The host form, opened by the `rampart_token` query parameter (becomes a cookie).
    let name = format!("{ECHO_PORT}-{a}.localhost");
    let addr: SocketAddr = format!("127.0.0.1:{}", url.rsplit(':').next().unwrap())
        .parse()
        .unwrap();
    let hc = support::client_builder()
        .resolve(&name, addr)
        .build()
        .unwrap();
    let mut r = hc.get(format!("http://{name}:{}/echo/path{query}", addr.port()));
    for (k, v) in &extra {
        r = r.header(*k, v);
    }
    check("port proxy (host form)", r.send().unwrap());

    // 3. The envd proxy, to a port of E (E2B routing headers, E's token in X-Access-Token),
    // with A's and B's tokens along.
    let mut r = c
        .post(format!("{url}/echo/path{query}"))
        .header("e2b-sandbox-id", &e_id)
        .header("e2b-sandbox-port", ECHO_PORT.to_string())
        .header("x-access-token", &e_token)
        .header("x-rampart-token", &a_token)
        .body("a body");
    for (k, v) in &extra {
        r = r.header(*k, v);
    }
    let v = check("envd proxy (port)", r.send().unwrap());
    assert_eq!(v["body"], "a body");

    // 4. An Authorization of the application's own passes, through both proxies.
    let r = c
        .get(format!("{url}/v1/sandboxes/{a}/ports/{ECHO_PORT}/own"))
        .header("x-rampart-token", &a_token)
        .header("authorization", "Bearer app-session-1")
        .send()
        .unwrap();
    let v: Value = r.json().unwrap();
    assert_eq!(header(&v, "authorization"), ["Bearer app-session-1"]);
    let r = c
        .get(format!("{url}/own"))
        .header("e2b-sandbox-id", &e_id)
        .header("e2b-sandbox-port", ECHO_PORT.to_string())
        .header("x-access-token", &e_token)
        .header("authorization", "Basic dXNlcjo=")
        .send()
        .unwrap();
    let v: Value = r.json().unwrap();
    assert_eq!(header(&v, "authorization"), ["Basic dXNlcjo="]);
}
