//! Exposed ports, end to end: a real daemon, servers inside sandboxes (`python3 -m
//! http.server` and a small stdlib WebSocket echo), reached through the path form
//! (`/v1/sandboxes/{id}/ports/{P}/...`) and the host form (`{P}-{id}.localhost`) with the
//! sandbox's token, refused without it or with another sandbox's, open without it once
//! public, gone after destroy; `rampart port` prints working URLs.
//!
//! Needs root (sandboxes); skipped with a reason otherwise.

mod support;

use futures::{SinkExt, StreamExt};
use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};
use std::net::SocketAddr;
use support::Sandbox;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// A WebSocket echo server on the standard library: greets with the request's path and
/// whether any of the daemon's credentials reached it, then echoes every message.
const WS_ECHO: &str = r#"
import base64, hashlib, json, socket, sys, threading
G = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def frame(op, p):
    n = len(p)
    if n < 126: h = bytes([0x80 | op, n])
    elif n < 65536: h = bytes([0x80 | op, 126]) + n.to_bytes(2, "big")
    else: h = bytes([0x80 | op, 127]) + n.to_bytes(8, "big")
    return h + p
def serve(c):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(4096)
        if not chunk: return
        data += chunk
    head, buf = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    hdrs = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
    acc = base64.b64encode(hashlib.sha1((hdrs["sec-websocket-key"] + G).encode()).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + "\r\n\r\n").encode())
    leak = any(h in hdrs for h in ("x-rampart-token", "x-access-token", "authorization")) or "rampart_token" in head.decode().lower()
    c.sendall(frame(1, json.dumps({"path": lines[0].split(" ")[1], "leak": leak, "host": hdrs.get("host")}).encode()))
    def need(n):
        nonlocal buf
        while len(buf) < n:
            chunk = c.recv(65536)
            if not chunk: raise EOFError
            buf += chunk
        out, buf = buf[:n], buf[n:]
        return out
    while True:
        b0, b1 = need(2)
        op, n = b0 & 15, b1 & 127
        if n == 126: n = int.from_bytes(need(2), "big")
        elif n == 127: n = int.from_bytes(need(8), "big")
        mask = need(4) if b1 & 128 else b"\0\0\0\0"
        p = bytes(x ^ mask[i % 4] for i, x in enumerate(need(n)))
        if op == 8:
            c.sendall(frame(8, b""))
            return
        c.sendall(frame(10 if op == 9 else op, p))
def safe(c):
    try: serve(c)
    except Exception: pass
    finally: c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=safe, args=(c,), daemon=True).start()
"#;

const HTTP_PORT: u16 = 8000;
const WS_PORT: u16 = 8001;

/// A daemon of this test's own; when dropped, its sandboxes are destroyed, then it is
/// killed, then its directory removed.
struct Env {
    daemon: Option<support::Daemon>,
    data: std::path::PathBuf,
    port: u16,
    http: Client,
    _dir: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            support::destroy_all(&d.url);
        }
    }
}

impl Env {
    fn base(&self) -> &str {
        &self.daemon.as_ref().expect("a running daemon").url
    }
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base())
    }
    /// Kills the daemon with SIGKILL (as a crash would) and starts it again on the same data
    /// directory and port; sandboxes keep running meanwhile.
    fn restart(&mut self) {
        drop(self.daemon.take());
        self.daemon = Some(support::start(&self.data, self.port, &[]));
    }
    fn host_url(&self, port: u16, id: &str, path: &str) -> String {
        format!("http://{port}-{id}.localhost:{}{path}", self.port)
    }
    fn post(&self, path: &str, body: Value) -> Response {
        self.http.post(self.url(path)).json(&body).send().unwrap()
    }
    fn get(&self, path: &str) -> Response {
        self.http.get(self.url(path)).send().unwrap()
    }
    fn delete(&self, path: &str) -> Response {
        self.http.delete(self.url(path)).send().unwrap()
    }
    /// `rampart port ID PORT ARGS...` against this daemon: its stdout (it must succeed).
    fn port_cli(&self, id: &str, port: u16, args: &[&str]) -> String {
        let port = port.to_string();
        let mut all = vec!["port", id, &port];
        all.extend_from_slice(args);
        let out = support::cli(self.base(), &all, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        String::from_utf8(out.stdout).unwrap()
    }
    /// A sandbox and its access token (from the create's answer).
    fn create(&self, body: Value) -> (Sandbox, String) {
        let sb = Sandbox::create(self.daemon.as_ref().expect("a running daemon"), body);
        let token = sb.info["access_token"]
            .as_str()
            .expect("create returns the token")
            .to_owned();
        assert_eq!(token.len(), 64);
        (sb, token)
    }
    /// Runs `bash -c script` as `user` in `sb`; it must exit 0.
    fn exec(&self, sb: &Sandbox, script: &str) {
        let v = sb.exec(json!({"cmd": ["bash", "-c", script], "user": "user"}));
        assert_eq!(v["exit_code"], 0, "{script}: {v}");
    }
    fn put_file(&self, sb: &Sandbox, path: &str, data: Vec<u8>) {
        let r = self
            .http
            .put(sb.url(&format!("/files?path={path}&user=user")))
            .body(data)
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
    /// Starts the HTTP server (serving /home/user/www) and the WebSocket echo in `id`, and
    /// waits until the daemon lists both as listening.
    fn start_servers(&self, sb: &Sandbox) {
        self.put_file(
            sb,
            "/home/user/www/index.txt",
            b"hello from inside\n".to_vec(),
        );
        self.put_file(sb, "/home/user/www/big.bin", big());
        self.put_file(sb, "/home/user/ws.py", WS_ECHO.as_bytes().to_vec());
        self.exec(
            sb,
            &format!(
                "cd /home/user && (nohup python3 -m http.server {HTTP_PORT} --directory www \
                 >/dev/null 2>&1 &) && (nohup python3 ws.py {WS_PORT} >/dev/null 2>&1 &)"
            ),
        );
        support::wait_until("both servers listen", 60, || {
            let l = self.ports(&sb.id);
            [HTTP_PORT, WS_PORT].iter().all(|p| {
                l["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["port"] == *p && e["listening"] == true)
            })
        });
    }
    fn ports(&self, id: &str) -> Value {
        let r = self.get(&format!("/v1/sandboxes/{id}/ports"));
        assert_eq!(r.status(), 200);
        r.json().unwrap()
    }
}

/// 3 MiB of varied bytes (streamed through the proxy and compared).
fn big() -> Vec<u8> {
    (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect()
}

fn setup() -> Option<Env> {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return None;
    }
    if !std::path::Path::new("/usr/bin/python3").exists() {
        eprintln!("skipped: python3 is not installed (the servers inside use it)");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    let data = dir.path().join("data");
    let daemon = support::start(&data, port, &[]);
    let http = support::client();
    Some(Env {
        daemon: Some(daemon),
        data,
        port,
        http,
        _dir: dir,
    })
}

/// A client that sends these `{port}-{id}.localhost` names to the daemon (no DNS needed).
fn host_client(env: &Env, names: &[String]) -> Client {
    let addr: SocketAddr = format!("127.0.0.1:{}", env.port).parse().unwrap();
    let mut b = support::client_builder();
    for n in names {
        b = b.resolve(n, addr);
    }
    b.build().unwrap()
}

fn error_code(r: Response) -> String {
    let v: Value = r.json().unwrap();
    v["error"]["code"].as_str().unwrap_or_default().to_owned()
}

/// Opens a WebSocket to `url` over a TCP connection to the daemon, with `headers`; returns
/// the greeting, or the HTTP status of a refused handshake.
fn ws_roundtrip(env: &Env, url: &str, headers: &[(&str, &str)]) -> Result<Value, u16> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut req = url.into_client_request().unwrap();
        for (k, v) in headers {
            let name: reqwest::header::HeaderName = k.parse().expect("header name");
            req.headers_mut()
                .insert(name, v.parse().expect("header value"));
        }
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", env.port))
            .await
            .unwrap();
        let (mut ws, _) = match tokio_tungstenite::client_async(req, tcp).await {
            Ok(x) => x,
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => return Err(r.status().as_u16()),
            Err(e) => panic!("websocket handshake with {url}: {e}"),
        };
        let greeting = match ws.next().await {
            Some(Ok(Message::Text(t))) => serde_json::from_str::<Value>(&t).unwrap(),
            other => panic!("expected the greeting, got {other:?}"),
        };
        for msg in ["one", "two", &"x".repeat(100_000)] {
            ws.send(Message::text(msg.to_string())).await.unwrap();
            match ws.next().await {
                Some(Ok(Message::Text(t))) => assert_eq!(t.as_str(), msg),
                other => panic!("expected the echo of {} bytes, got {other:?}", msg.len()),
            }
        }
        ws.send(Message::Binary(vec![0u8, 1, 2, 255].into()))
            .await
            .unwrap();
        match ws.next().await {
            Some(Ok(Message::Binary(b))) => assert_eq!(&b[..], &[0u8, 1, 2, 255]),
            other => panic!("expected the binary echo, got {other:?}"),
        }
        let _ = ws.close(None).await;
        Ok(greeting)
    })
}

#[test]
fn exposed_ports_work_with_the_token_and_only_with_it() {
    let Some(env) = setup() else { return };
    let (sa, tok_a) = env.create(json!({"timeout_secs": 600}));
    let (sb, tok_b) = env.create(json!({"timeout_secs": 600, "public_ports": [HTTP_PORT]}));
    let (a, b) = (&sa.id, &sb.id);
    assert_ne!(tok_a, tok_b);

    // The token is in GET of one sandbox, not in the list.
    let one: Value = env.get(&format!("/v1/sandboxes/{a}")).json().unwrap();
    assert_eq!(one["access_token"], tok_a.as_str());
    let all: Value = env.get("/v1/sandboxes").json().unwrap();
    assert!(all
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s.get("access_token").is_none()));

    env.start_servers(&sa);
    env.start_servers(&sb);

    let path_a = |p: &str| env.url(&format!("/v1/sandboxes/{a}/ports/{HTTP_PORT}{p}"));
    let host_a = |p: &str| env.host_url(HTTP_PORT, a, p);
    let hc = host_client(
        &env,
        &[
            format!("{HTTP_PORT}-{a}.localhost"),
            format!("{WS_PORT}-{a}.localhost"),
            format!("{HTTP_PORT}-{b}.localhost"),
        ],
    );

    // With the token, both forms, header or bearer.
    for url in [path_a("/index.txt"), host_a("/index.txt")] {
        let r = hc
            .get(&url)
            .header("X-Rampart-Token", &tok_a)
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "{url}");
        assert_eq!(r.text().unwrap(), "hello from inside\n");
        let r = hc.get(&url).bearer_auth(&tok_a).send().unwrap();
        assert_eq!(r.status(), 200, "{url}");
    }
    // The path form runs pages in an opaque origin (they share the daemon's); the host form
    // is an origin of its own.
    let csp = |url: &str| {
        hc.get(url)
            .header("X-Rampart-Token", &tok_a)
            .send()
            .unwrap()
            .headers()
            .get("content-security-policy")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert!(csp(&path_a("/index.txt")).unwrap().starts_with("sandbox "));
    assert_eq!(csp(&host_a("/index.txt")), None);
    // Streamed, byte for byte.
    for url in [path_a("/big.bin"), host_a("/big.bin")] {
        let r = hc
            .get(&url)
            .header("X-Rampart-Token", &tok_a)
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.bytes().unwrap()[..] == big()[..], "{url}: body differs");
    }
    // The server's own 404 comes back as it is.
    let r = hc
        .get(path_a("/nope"))
        .header("X-Rampart-Token", &tok_a)
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.headers()["server"].to_str().unwrap().contains("Python"));

    // Without the token: 401; with another sandbox's: 403; both forms.
    for url in [path_a("/index.txt"), host_a("/index.txt")] {
        let r = hc.get(&url).send().unwrap();
        assert_eq!(r.status(), 401, "{url}");
        let v: Value = r.json().unwrap();
        assert_eq!(v["error"]["code"], "unauthorized");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("X-Rampart-Token"));
        let r = hc
            .get(&url)
            .header("X-Rampart-Token", &tok_b)
            .send()
            .unwrap();
        assert_eq!(r.status(), 403, "{url}");
        assert_eq!(error_code(r), "forbidden");
        let r = hc.get(&url).bearer_auth(&tok_b).send().unwrap();
        assert_eq!(r.status(), 403, "{url}");
    }

    // Browsers: the token in the query sets a cookie, which then suffices.
    let r = hc
        .get(format!("{}?rampart_token={tok_a}", path_a("/index.txt")))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.starts_with(&format!("rampart_token={tok_a};")),
        "{cookie}"
    );
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(
        cookie.contains(&format!("Path=/v1/sandboxes/{a}/ports/{HTTP_PORT}")),
        "{cookie}"
    );
    let r = hc
        .get(path_a("/index.txt"))
        .header("cookie", format!("other=1; rampart_token={tok_a}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = hc
        .get(format!("{}?rampart_token={tok_a}", host_a("/index.txt")))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .contains("Path=/;"));

    // WebSocket, both forms; the daemon's credentials never reach the server.
    let ws_path = format!(
        "ws://127.0.0.1:{}/v1/sandboxes/{a}/ports/{WS_PORT}/echo?x=1&rampart_token={tok_a}",
        env.port
    );
    let g = ws_roundtrip(&env, &ws_path, &[]).expect("path-form websocket");
    assert_eq!(g["path"], "/echo?x=1");
    assert_eq!(g["leak"], false);
    let ws_host = format!("ws://{WS_PORT}-{a}.localhost:{}/echo", env.port);
    let g = ws_roundtrip(&env, &ws_host, &[("x-rampart-token", &tok_a)]).expect("host websocket");
    assert_eq!(g["leak"], false);
    assert_eq!(g["path"], "/echo");
    assert_eq!(g["host"], format!("localhost:{WS_PORT}"));
    // Every credential form is removed. (On the host form, E2B's X-Access-Token alone is
    // left to the E2B proxy.)
    let ws_plain = format!(
        "ws://127.0.0.1:{}/v1/sandboxes/{a}/ports/{WS_PORT}/echo",
        env.port
    );
    let bearer = format!("Bearer {tok_a}");
    for h in [
        ("x-access-token", tok_a.as_str()),
        ("authorization", &bearer),
    ] {
        let g = ws_roundtrip(&env, &ws_plain, &[h]).expect("path-form websocket");
        assert_eq!(g["leak"], false, "{h:?}");
    }
    assert_eq!(ws_roundtrip(&env, &ws_host, &[]), Err(401));
    assert_eq!(
        ws_roundtrip(&env, &ws_host, &[("x-rampart-token", &tok_b)]),
        Err(403)
    );

    // Nothing listens: 502 with the reason.
    let r = hc
        .get(env.url(&format!("/v1/sandboxes/{a}/ports/8999/")))
        .header("X-Rampart-Token", &tok_a)
        .send()
        .unwrap();
    assert_eq!(r.status(), 502);
    assert_eq!(error_code(r), "port_closed");

    // B made 8000 public at create: no token needed, both forms; its 8001 is still private.
    let r = hc
        .get(env.url(&format!("/v1/sandboxes/{b}/ports/{HTTP_PORT}/index.txt")))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = hc
        .get(env.host_url(HTTP_PORT, b, "/index.txt"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let ws_b = format!(
        "ws://127.0.0.1:{}/v1/sandboxes/{b}/ports/{WS_PORT}/",
        env.port
    );
    assert_eq!(ws_roundtrip(&env, &ws_b, &[]), Err(401));
    let listed = env.ports(b);
    let e = listed["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["port"] == HTTP_PORT)
        .unwrap()
        .clone();
    assert_eq!(e["public"], true);
    assert_eq!(
        e["host_url"],
        format!("http://{HTTP_PORT}-{b}.localhost:{}/", env.port)
    );

    // A makes 8000 public: open without the token; private again: refused again.
    let r = env.post(
        &format!("/v1/sandboxes/{a}/ports/{HTTP_PORT}/public"),
        json!({}),
    );
    assert_eq!(r.status(), 200);
    let v: Value = r.json().unwrap();
    assert_eq!(v["public"], true);
    for url in [path_a("/index.txt"), host_a("/index.txt")] {
        let r = hc.get(&url).send().unwrap();
        assert_eq!(r.status(), 200, "{url}");
    }
    let r = env.delete(&format!("/v1/sandboxes/{a}/ports/{HTTP_PORT}/public"));
    assert_eq!(r.status(), 200);
    assert_eq!(hc.get(path_a("/index.txt")).send().unwrap().status(), 401);

    // `rampart port` prints both URLs; each works as printed (token in the query).
    let text = env.port_cli(a, HTTP_PORT, &[]);
    let urls: Vec<&str> = text.lines().collect();
    assert_eq!(urls.len(), 2, "{text}");
    assert!(urls[0].starts_with(&path_a("/?rampart_token=")), "{text}");
    assert!(urls[1].starts_with(&host_a("/?rampart_token=")), "{text}");
    for u in &urls {
        let r = hc.get(u.replace("/?", "/index.txt?")).send().unwrap();
        assert_eq!(r.status(), 200, "{u}");
    }
    let text = env.port_cli(a, HTTP_PORT, &["--public"]);
    assert!(!text.contains("rampart_token"), "{text}");
    let first = text.lines().next().unwrap();
    assert_eq!(
        hc.get(format!("{first}index.txt")).send().unwrap().status(),
        200
    );

    // After destroy: gone, whatever the token.
    let r = env.delete(&format!("/v1/sandboxes/{a}"));
    assert_eq!(r.status(), 200);
    for url in [path_a("/index.txt"), host_a("/index.txt")] {
        let r = hc
            .get(&url)
            .header("X-Rampart-Token", &tok_a)
            .send()
            .unwrap();
        assert_eq!(r.status(), 404, "{url}");
    }
    let r = env.get(&format!("/v1/sandboxes/{a}/ports"));
    assert_eq!(r.status(), 404);
    let gone: Value = env.get(&format!("/v1/sandboxes/{a}")).json().unwrap();
    assert!(gone.get("access_token").is_none(), "{gone}");
    let r = env.delete(&format!("/v1/sandboxes/{b}"));
    assert_eq!(r.status(), 200);
}

#[test]
fn bad_port_requests_are_refused_with_reasons() {
    let Some(env) = setup() else { return };
    let r = env.post(
        "/v1/sandboxes",
        json!({"public_ports": [0], "timeout_secs": 60}),
    );
    assert_eq!(r.status(), 400);
    let v: Value = r.json().unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("public_ports"));
    let (sb, _) = env.create(json!({"timeout_secs": 60}));
    let id = &sb.id;
    for p in ["0", "65536", "x"] {
        let r = env.get(&format!("/v1/sandboxes/{id}/ports/{p}/"));
        assert_eq!(r.status(), 400, "{p}");
    }
    let r = env.get("/v1/sandboxes/nosuchsandbox0000000/ports/80/");
    assert_eq!(r.status(), 404);
    let r = env.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(r.status(), 200);
}

#[test]
fn tokens_and_public_ports_survive_a_daemon_restart() {
    let Some(mut env) = setup() else { return };
    let (sa, tok) = env.create(json!({"timeout_secs": 600, "public_ports": [WS_PORT]}));
    let a = &sa.id;
    env.start_servers(&sa);
    env.restart();
    support::wait_until("the sandbox is re-attached", 60, || {
        env.get(&format!("/v1/sandboxes/{a}")).status() == 200
    });
    let one: Value = env.get(&format!("/v1/sandboxes/{a}")).json().unwrap();
    assert_eq!(one["state"], "running", "{one}");
    assert_eq!(one["access_token"], tok.as_str());
    let hc = host_client(&env, &[format!("{HTTP_PORT}-{a}.localhost")]);
    let private = env.host_url(HTTP_PORT, a, "/index.txt");
    assert_eq!(hc.get(&private).send().unwrap().status(), 401);
    let r = hc
        .get(&private)
        .header("X-Rampart-Token", &tok)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().unwrap(), "hello from inside\n");
    let ws = format!(
        "ws://127.0.0.1:{}/v1/sandboxes/{a}/ports/{WS_PORT}/",
        env.port
    );
    assert_eq!(ws_roundtrip(&env, &ws, &[]).unwrap()["leak"], false);
    assert_eq!(env.delete(&format!("/v1/sandboxes/{a}")).status(), 200);
}

/// A server inside that sets a site-wide session cookie (`Path=/`, `Domain=localhost`).
const COOKIE_SERVER: &str = r#"
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Set-Cookie", "sid=secret; Path=/; Domain=localhost; HttpOnly")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

#[test]
fn a_sandboxs_cookies_stay_with_its_server() {
    let Some(env) = setup() else { return };
    let (sb, tok) = env.create(json!({"timeout_secs": 300}));
    let id = &sb.id;
    let port = 8123u16;
    env.put_file(&sb, "/home/user/c.py", COOKIE_SERVER.as_bytes().to_vec());
    env.exec(
        &sb,
        &format!("cd /home/user && (nohup python3 c.py {port} >/dev/null 2>&1 &)"),
    );
    support::wait_until("the cookie server listens", 60, || {
        env.ports(id)["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["port"] == port && e["listening"] == true)
    });
    let host = format!("{port}-{id}.localhost");
    let hc = host_client(&env, std::slice::from_ref(&host));
    let cookie = |url: &str| {
        let r = hc.get(url).header("X-Rampart-Token", &tok).send().unwrap();
        assert_eq!(r.status(), 200, "{url}");
        r.headers()["set-cookie"].to_str().unwrap().to_owned()
    };
    // Path form: on the daemon's origin, confined to this port's prefix, host-only.
    let c = cookie(&env.url(&format!("/v1/sandboxes/{id}/ports/{port}/x")));
    assert_eq!(
        c,
        format!("sid=secret; HttpOnly; Path=/v1/sandboxes/{id}/ports/{port}/")
    );
    // Host form: its own origin keeps its path; never a cookie for every sandbox's host.
    let c = cookie(&format!("http://{host}:{}/x", env.port));
    assert_eq!(c, "sid=secret; Path=/; HttpOnly");
    env.delete(&format!("/v1/sandboxes/{id}"));
}
