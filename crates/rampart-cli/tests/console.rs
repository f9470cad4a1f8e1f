//! The web console (`/console`) in a real browser: Debian's chromium and chromedriver,
//! driven by Selenium (`scripts/console-browser.sh` installs them; the venv is
//! `target/console-venv`), against a real daemon. The sandbox is made through the API first
//! (a command run, a file written, a server listening, a snapshot and a volume), then
//! `tests/console/browser.py` signs in, finds it, opens it, sees the command's `exec` and
//! `exit` in the timeline with the bundle verified in the browser, types into the terminal
//! and sees the output, downloads and uploads a file, edits the policy, and more.
//! `RAMPART_CONSOLE_SHOTS=DIR` keeps a screenshot of each page there (docs/console.md's).
//!
//! Without the browser, the venv, or root and the kernel features, it prints
//! `skipped: <reason>`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::{workspace, Api as _, Sandbox};
use tokio_tungstenite::tungstenite;

fn python() -> PathBuf {
    support::venv_python("RAMPART_CONSOLE_VENV", "console-venv")
}

fn browser_missing() -> Option<String> {
    for bin in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        if !Path::new(bin).exists() {
            return Some(format!(
                "no {bin} (scripts/console-browser.sh installs chromium and chromium-driver)"
            ));
        }
    }
    let ok = Command::new(python())
        .args(["-c", "import selenium"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Some(format!(
            "no venv with selenium at {} (scripts/console-browser.sh makes it; needs PyPI)",
            python().display()
        ));
    }
    None
}

#[test]
fn the_console_in_a_real_browser() {
    if let Some(why) = support::skip_reason().or_else(browser_missing) {
        eprintln!("skipped: {why}");
        return;
    }
    // Sandbox networks of its own (another test's daemon may hold the default table).
    let t = (std::process::id().wrapping_mul(11) + 5) % 250;
    let table = format!("rampart_console_{}", std::process::id());
    let _table = support::TableGuard(table.clone());
    let (pool, prefix) = (format!("10.251.{t}.0/24"), format!("rk{t}z"));
    let d = support::start_tidy_with(
        "console",
        &[
            ("RAMPART_NET_POOL", pool.as_str()),
            ("RAMPART_NET_LINK_PREFIX", prefix.as_str()),
            ("RAMPART_NET_TABLE", table.as_str()),
            ("RAMPART_NET_DNS_PORT", "0"),
            ("RAMPART_NET_PROXY_PORT", "0"),
        ],
    );
    let sb = Sandbox::create(
        &d,
        serde_json::json!({
            "timeout_secs": 900,
            "network": {"mode": "allowlist", "allow": ["example.com"]},
        }),
    );
    let r = sb.sh("echo console-check; (setsid python3 -m http.server 8000 >/dev/null 2>&1 &)");
    assert_eq!(r["exit_code"], 0, "{r}");
    let content = "what the agent wrote\nline two\n";
    let http = support::client();
    let w = http
        .put(sb.url("/files?path=/home/user/out/report.txt"))
        .body(content)
        .send()
        .unwrap();
    assert!(w.status().is_success(), "{:?}", w.text());
    let (st, snap) = support::post(
        &d,
        &format!("/v1/sandboxes/{}/snapshots", sb.id),
        serde_json::json!({"name": "console-snap"}),
    );
    assert_eq!(st, 201, "{snap}");
    let (st, vol) = support::post(
        &d,
        "/v1/volumes",
        serde_json::json!({"name": "console-vol", "size_mib": 64}),
    );
    assert_eq!(st, 201, "{vol}");
    support::wait_until("the server on port 8000 to listen", 30, || {
        http.get(sb.url("/ports"))
            .send()
            .ok()
            .and_then(|r| r.json::<serde_json::Value>().ok())
            .is_some_and(|v| v["ports"].to_string().contains("8000"))
    });

    // A command another key asks for in a sandbox whose policy holds `rm`: the console
    // approves it (its own key did not ask, so it may).
    let agent_key = support::make_key(
        &d.data,
        &[
            "--native",
            "--name",
            "agent",
            "--scope",
            "sandboxes",
            "--scope",
            "exec",
        ],
    );
    let agent = reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(300))
        .build()
        .unwrap();
    let governed: serde_json::Value = agent
        .post(format!("{}/v1/sandboxes", d.url))
        .bearer_auth(&agent_key)
        .json(&serde_json::json!({"approvals": {"commands": ["^rm "], "timeout_secs": 240}}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let gid = governed["id"]
        .as_str()
        .expect("the governed sandbox")
        .to_owned();
    let touched = agent
        .post(format!("{}/v1/sandboxes/{gid}/exec", d.url))
        .bearer_auth(&agent_key)
        .json(&serde_json::json!({"cmd": ["touch", "/tmp/held"]}))
        .send()
        .unwrap();
    assert_eq!(
        touched.status().as_u16(),
        200,
        "not held: it matches no pattern"
    );
    let held = {
        let (url, key, gid) = (d.url.clone(), agent_key.clone(), gid.clone());
        std::thread::spawn(move || {
            let c = reqwest::blocking::Client::builder()
                .timeout(std::time::Duration::from_secs(300))
                .build()
                .unwrap();
            c.post(format!("{url}/v1/sandboxes/{gid}/exec"))
                .bearer_auth(&key)
                .json(&serde_json::json!({"cmd": ["rm", "-v", "/tmp/held"]}))
                .send()
                .map(|r| (r.status().as_u16(), r.text().unwrap_or_default()))
        })
    };

    let downloads = d.root.join("downloads");
    std::fs::create_dir_all(&downloads).unwrap();
    let mut cmd = Command::new(python());
    cmd.arg(workspace().join("tests/console/browser.py"))
        .current_dir(&d.root)
        .env("RAMPART_URL", &d.url)
        .env("RAMPART_API_KEY", support::admin_key())
        .env("SANDBOX_ID", &sb.id)
        .env("EXPECT_FILE", "/home/user/out/report.txt")
        .env("EXPECT_CONTENT", content)
        .env("DOWNLOADS", &downloads)
        .env("HELD_REQUEST", "rm -v /tmp/held")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("HOME", &d.root)
        .stdin(Stdio::null());
    if let Some(shots) = std::env::var_os("RAMPART_CONSOLE_SHOTS") {
        cmd.env("SHOTS", shots);
    }
    let out = cmd.output().expect("run the browser test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "the console's browser test failed:\n{text}\n{}",
        d.log_tail()
    );
    assert!(text.contains("ALL 23 CHECKS PASSED"), "{text}");
    // The held command ran once the console approved it, and the record says who approved.
    let (status, answer) = held.join().unwrap().expect("the held exec's answer");
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("removed '/tmp/held'"), "{answer}");
    let rec: serde_json::Value = http
        .get(format!("{}/v1/sandboxes/{gid}/audit", d.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let decided = rec["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["body"]["type"] == "approval_decided")
        .unwrap_or_else(|| panic!("no decision in {rec}"));
    assert_eq!(decided["body"]["decision"], "approved");
    assert_eq!(decided["body"]["reason"], "checked in the console");

    // What the browser did is on the record, by the key it signed in with.
    let ev: serde_json::Value = http
        .get(sb.url("/audit?limit=1000"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let events = ev["events"].as_array().unwrap();
    let shell = events
        .iter()
        .find(|e| e["body"]["type"] == "exec" && e["body"]["pty"] == true)
        .unwrap_or_else(|| panic!("no PTY exec from the terminal in {ev}"));
    assert_eq!(shell["body"]["argv"], serde_json::json!(["bash", "-l"]));
    assert!(
        shell["body"]["caller"]
            .as_str()
            .unwrap()
            .starts_with("key:"),
        "{shell}"
    );
    assert!(
        events.iter().any(|e| e["body"]["type"] == "file"
            && e["body"]["path"] == "/home/user/out/from-browser.txt"),
        "the upload is not recorded: {ev}"
    );
}

/// The console's pages are served without a key and hold nothing secret; the API behind
/// them is not opened to pages of other origins by the console's allowances.
#[test]
fn console_pages_and_the_browser_walls() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("console-walls");
    let http = support::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let plain = reqwest::blocking::Client::new();
    let r = plain.get(format!("{}/console", d.url)).send().unwrap();
    assert_eq!(
        r.status().as_u16(),
        200,
        "redirected to /console/ and served"
    );
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(r.text().unwrap().contains("Rampart console"));
    let js = plain
        .get(format!("{}/console/vendor/xterm.js", d.url))
        .send()
        .unwrap();
    assert_eq!(js.status().as_u16(), 200);
    assert!(
        js.text().unwrap().len() > 100_000,
        "xterm.js is built in (scripts/console-assets.sh fetches it)"
    );

    let sb = Sandbox::create(&d, serde_json::json!({}));
    let port = d.url.rsplit(':').next().unwrap().to_owned();
    let same = format!("http://127.0.0.1:{port}");
    // A write from the console's own origin, with its key: allowed.
    let ok = http
        .post(sb.url("/timeout"))
        .header("origin", &same)
        .header("sec-fetch-site", "same-origin")
        .json(&serde_json::json!({"timeout_secs": 120}))
        .send()
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200, "{:?}", ok.text());
    // The same write from a page a sandbox serves by host name (another origin), or by path
    // (an opaque origin), or without a key header: refused.
    for (origin, site) in [
        (
            format!("http://8000-{}.localhost:{port}", sb.id),
            "same-site",
        ),
        ("null".to_string(), "cross-site"),
        ("http://evil.example".to_string(), "cross-site"),
    ] {
        let r = http
            .post(sb.url("/timeout"))
            .header("origin", &origin)
            .header("sec-fetch-site", site)
            .json(&serde_json::json!({"timeout_secs": 120}))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 403, "origin {origin}: {:?}", r.text());
    }
    let nokey = plain
        .post(sb.url("/timeout"))
        .header("origin", &same)
        .header("sec-fetch-site", "same-origin")
        .json(&serde_json::json!({"timeout_secs": 120}))
        .send()
        .unwrap();
    assert_eq!(nokey.status().as_u16(), 401);

    // The exec WebSocket: the key as a subprotocol, only from the daemon's own origin.
    let ws_url = sb.url("/exec/ws").replacen("http://", "ws://", 1);
    let key_proto = format!("rampart.v1, rampart.key.{}", support::admin_key());
    let attempt = |origin: Option<&str>, proto: &str| -> Result<String, u16> {
        use tungstenite::client::IntoClientRequest as _;
        let mut req = ws_url.as_str().into_client_request().unwrap();
        req.headers_mut()
            .insert("sec-websocket-protocol", proto.parse().unwrap());
        if let Some(o) = origin {
            req.headers_mut().insert("origin", o.parse().unwrap());
        }
        match tungstenite::connect(req) {
            Ok((mut ws, resp)) => {
                let chosen = resp.headers()["sec-websocket-protocol"]
                    .to_str()
                    .unwrap()
                    .to_owned();
                ws.send(tungstenite::Message::text(
                    r#"{"cmd":["sh","-c","echo over-ws"]}"#,
                ))
                .unwrap();
                let mut out = String::new();
                while let Ok(m) = ws.read() {
                    out.push_str(&m.to_string());
                    if out.contains("\"exit\"") {
                        break;
                    }
                }
                Ok(format!("{chosen}|{out}"))
            }
            Err(tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
            Err(e) => panic!("websocket: {e}"),
        }
    };
    let got = attempt(Some(&same), &key_proto).expect("the console's origin is let in");
    assert!(
        got.starts_with("rampart.v1|"),
        "the key is never echoed: {got}"
    );
    assert!(got.contains("\"start\""), "{got}");
    assert_eq!(
        attempt(
            Some(&format!("http://8000-{}.localhost:{port}", sb.id)),
            &key_proto
        ),
        Err(403)
    );
    assert_eq!(attempt(Some("null"), &key_proto), Err(403));
    assert_eq!(attempt(None, "rampart.v1"), Err(401), "no key, no session");
    assert_eq!(
        attempt(None, "rampart.v1, rampart.key.rampart_0000"),
        Err(401),
        "a malformed key"
    );
}
