//! Desktops and browsers (tier 4): the `desktop` template (`templates/desktop.toml`, built
//! here from Debian's packages; its layers are cached in this test's data directory under
//! the target directory, so only the first run downloads them), driven by the unmodified
//! `e2b-desktop` SDK through the three E2B variables, and its Chromium driven from outside
//! by Playwright over CDP through the port proxy, within the sandbox's egress policy (test
//! hosts in a network namespace). Every screenshot and action is in the record, the typed
//! text is not, and the bundle verifies.
//!
//! `scripts/test` installs the SDK and Playwright (`scripts/desktop-sdks.sh`, into
//! `target/desktop-venv`); without them this prints `skipped: <reason>`.

mod support;

use serde_json::{json, Value};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use support::{client, target_dir, workspace};

fn venv_python() -> PathBuf {
    support::venv_python("RAMPART_DESKTOP_VENV", "desktop-venv")
}

fn skip_reason() -> Option<String> {
    if let Some(why) = support::skip_reason() {
        return Some(why);
    }
    support::venv_lacks(
        &venv_python(),
        "e2b_desktop, playwright",
        "scripts/desktop-sdks.sh makes it",
    )
}

/// Builds the desktop template in `data` (cached after the first build); `Err` with why
/// when the host cannot (no mmdebstrap, no Debian mirror).
fn build_template(data: &Path) -> Result<(), String> {
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["template", "build", "--data-dir"])
        .arg(data)
        .arg("-f")
        .arg(workspace().join("templates/desktop.toml"))
        .output()
        .expect("run rampart template build");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("--- rampart template build -f templates/desktop.toml ---\n{text}");
    if out.status.success() {
        return Ok(());
    }
    let offline = [
        "Temporary failure resolving",
        "Could not resolve",
        "mmdebstrap: not found",
        "No such file or directory (os error 2): mmdebstrap",
    ];
    if offline.iter().any(|m| text.contains(m)) {
        return Err(
            "the desktop template cannot be built here (no Debian mirror or no \
                    mmdebstrap; scripts/setup-host.sh installs it)"
                .into(),
        );
    }
    panic!("building the desktop template failed:\n{text}");
}

/// The daemon of this test on its cached data directory; on drop its sandboxes are
/// destroyed, it is stopped and its store unmounted (the directory stays, for the cache).
struct Node {
    daemon: support::Daemon,
}

impl Drop for Node {
    fn drop(&mut self) {
        support::destroy_all(&self.daemon.url);
        self.daemon.stop();
        support::unmount_store(&self.daemon.data);
    }
}

fn run_script(d: &support::Daemon, key: &str, script: &str, args: &[&str], envs: &[(&str, &str)]) {
    let mut path = workspace().join("tests/e2b").join(script);
    let program = if script.ends_with(".mjs") {
        // ESM resolves `@e2b/desktop` from the script's own directory: run a copy there.
        let copy = target_dir().join("desktop-node").join(script);
        std::fs::copy(&path, &copy).unwrap();
        path = copy;
        PathBuf::from("node")
    } else {
        venv_python()
    };
    let out = Command::new(program)
        .arg(&path)
        .args(args)
        .current_dir(workspace().join("tests/e2b"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(
            "HOME",
            std::env::var_os("HOME").unwrap_or_else(|| "/root".into()),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("E2B_API_KEY", key)
        .env("E2B_API_URL", &d.url)
        .env("E2B_SANDBOX_URL", &d.url)
        .env("E2B_DOMAIN", "localhost")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run the script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- {script} ---\n{stdout}{stderr}");
    assert!(
        out.status.success() && stdout.contains("SUMMARY ") && !stdout.contains("FAIL "),
        "{script} failed:\n{stdout}\n{stderr}\n{}",
        support::log_tail(&d.data.with_extension("log"))
    );
}

/// One HTTP/1.1 request to the daemon with a `Host` of the host form; status, headers, body.
fn host_form(addr: &str, host: &str, path: &str, extra: &str) -> (u16, String, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{extra}\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP head");
    let head = String::from_utf8_lossy(&raw[..at]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head, raw[at + 4..].to_vec())
}

/// Opens noVNC's WebSocket (`/websockify`) through the host form and reads the VNC server's
/// first message: the RFB protocol version.
fn vnc_banner(addr: &str, host: &str, cookie: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    write!(
        s,
        "GET /websockify HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: binary\r\nCookie: {cookie}\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // One server frame, unmasked: FIN|binary, then a 7-bit length.
    let mut h = [0u8; 2];
    s.read_exact(&mut h).unwrap();
    let mut payload = vec![0u8; (h[1] & 0x7f) as usize];
    s.read_exact(&mut payload).unwrap();
    String::from_utf8_lossy(&payload).into_owned()
}

const HOSTS_SIDE: &str = "203.0.113.33/29";
const HOSTS_ADDR: &str = "203.0.113.34";

#[test]
fn a_desktop_is_driven_by_the_e2b_desktop_sdk_and_its_browser_by_playwright() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = target_dir().join("desktop-test");
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    if let Err(why) = build_template(&data) {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(_hosts) =
        support::TestHosts::start(tmp.path(), "desk", HOSTS_SIDE, HOSTS_ADDR, "desktop.test")
    else {
        eprintln!("skipped: could not make the test hosts (ip netns)");
        return;
    };
    let t = (std::process::id().wrapping_mul(13) + 7) % 250;
    let table = format!("rampart_desk_{}", std::process::id());
    let _table = support::TableGuard(table.clone());
    let pool = format!("10.251.{t}.0/24");
    let prefix = format!("rk{t}z");
    let upstream = format!("{HOSTS_ADDR}:53");
    let port = support::free_port();
    let node = Node {
        daemon: support::start(
            &data,
            port,
            &[
                ("RAMPART_NET_POOL", pool.as_str()),
                ("RAMPART_NET_LINK_PREFIX", prefix.as_str()),
                ("RAMPART_NET_TABLE", table.as_str()),
                ("RAMPART_NET_DNS_PORT", "0"),
                ("RAMPART_NET_PROXY_PORT", "0"),
                ("RAMPART_NET_UPSTREAM_DNS", upstream.as_str()),
            ],
        ),
    };
    let d = &node.daemon;
    let addr = format!("127.0.0.1:{port}");
    let key = std::fs::read_to_string(data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();
    let c = client();

    // ---- The e2b-desktop SDK, unmodified.
    let facts_path = tmp.path().join("facts.json");
    let shot = root.join("screenshot.png");
    run_script(
        d,
        &key,
        "desktop.py",
        &[],
        &[
            ("RAMPART_DESKTOP_FACTS", facts_path.to_str().unwrap()),
            ("RAMPART_DESKTOP_SHOT", shot.to_str().unwrap()),
        ],
    );
    // And the JS SDK from npm, when it is installed.
    if target_dir()
        .join("desktop-node/node_modules/@e2b/desktop")
        .exists()
    {
        run_script(d, &key, "desktop.mjs", &[], &[]);
    } else {
        eprintln!(
            "skipped the JS desktop script: no target/desktop-node (scripts/desktop-sdks.sh)"
        );
    }
    let facts: Value = serde_json::from_slice(&std::fs::read(&facts_path).unwrap()).unwrap();
    let id = facts["sandbox"].as_str().unwrap().to_owned();
    let info: Value = c
        .get(format!("{}/v1/sandboxes/{id}", d.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let token = info["access_token"].as_str().unwrap().to_owned();

    // The stream URL the SDK gave names the host form of port 6080. The SDK made the sandbox
    // with E2B's default, `allowPublicTraffic`: the viewer opens without a token, as it
    // does for a person who opens `stream.get_url()`, and its WebSocket reaches the VNC
    // server (the VNC password `require_auth` set still guards the screen). A token given
    // anyway (`?rampart_token=`) is no obstacle.
    let url = facts["stream_url"].as_str().unwrap();
    let host = format!("6080-{id}.localhost");
    assert!(
        url.starts_with(&format!("https://{host}/vnc.html?")),
        "{url}"
    );
    let path = &url[url.find("/vnc.html").unwrap()..];
    let (st, head, body) = host_form(&addr, &host, path, "");
    assert_eq!(st, 200, "the viewer without a token: {head}");
    let page = String::from_utf8_lossy(&body);
    assert!(page.contains("noVNC"), "{page}");
    let (st, head, _) = host_form(&addr, &host, &format!("{path}&rampart_token={token}"), "");
    assert_eq!(st, 200, "{head}");
    let banner = vnc_banner(&addr, &host, "");
    assert!(banner.starts_with("RFB 003."), "{banner:?}");

    // ---- What the agent did and saw is on the record; the typed text is not.
    let events = audit_events(d, &id);
    let desktop: Vec<&Value> = events
        .iter()
        .map(|e| &e["body"])
        .filter(|b| b["type"] == "desktop")
        .collect();
    let shots: Vec<&str> = desktop
        .iter()
        .filter(|b| b["action"] == "screenshot")
        .filter_map(|b| b["image"]["digest"].as_str())
        .collect();
    for want in facts["screenshots"].as_array().unwrap() {
        assert!(
            shots.contains(&want.as_str().unwrap()),
            "screenshot {want} is not in the record: {shots:?}"
        );
    }
    assert!(desktop
        .iter()
        .any(|b| b["action"] == "move" && b["x"] == 123 && b["y"] == 234));
    assert!(desktop
        .iter()
        .any(|b| b["action"] == "click" && b["button"] == "right"));
    assert!(desktop
        .iter()
        .any(|b| b["action"] == "click" && b["repeat"] == 2));
    assert!(desktop
        .iter()
        .any(|b| b["action"] == "key" && b["keys"] == json!(["Control_L+l"])));
    let typed: Vec<&&Value> = desktop.iter().filter(|b| b["action"] == "type").collect();
    let chars: u64 = typed
        .iter()
        .map(|b| b["text"]["chars"].as_u64().unwrap())
        .sum();
    assert_eq!(chars, facts["typed_chars"].as_u64().unwrap(), "{typed:?}");
    let all = serde_json::to_string(&events).unwrap();
    assert!(
        !all.contains("rampart-desktop-$((6*7))"),
        "the typed text is in the record"
    );

    // The bundle holds the screenshots as blobs and verifies.
    let bundle = c
        .get(format!("{}/v1/sandboxes/{id}/audit/bundle", d.url))
        .send()
        .unwrap()
        .bytes()
        .unwrap();
    let b: Value = serde_json::from_slice(&bundle).unwrap();
    for want in facts["screenshots"].as_array().unwrap() {
        assert!(b["blobs"].get(want.as_str().unwrap()).is_some(), "{want}");
    }
    assert!(!String::from_utf8_lossy(&bundle).contains("rampart-desktop-$((6*7))"));
    let bundle_path = tmp.path().join("bundle.json");
    std::fs::write(&bundle_path, &bundle).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["audit", "verify"])
        .arg(&bundle_path)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("Desktop ("), "{report}");
    assert!(report.contains("screenshot 1024x768"), "{report}");
    let out = Command::new("python3")
        .arg(workspace().join("sdk/python/rampart/verify.py"))
        .arg(&bundle_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Python verifier: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // ---- The native desktop API on the same sandbox: a screenshot (recorded), an action.
    let r = c
        .post(format!("{}/v1/sandboxes/{id}/desktop/screenshot", d.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let png = r.bytes().unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let r = c
        .post(format!("{}/v1/sandboxes/{id}/desktop/actions", d.url))
        .json(&json!({"action": "type", "text": "native secret text"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = c
        .post(format!("{}/v1/sandboxes/{id}/desktop/actions", d.url))
        .json(&json!({"action": "click", "x": 5}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 400, "x without y");
    let all = serde_json::to_string(&audit_events(d, &id)).unwrap();
    assert!(!all.contains("native secret text"));
    let digest = sha256_hex(&png);
    assert!(
        all.contains(&digest),
        "the native screenshot is not recorded"
    );

    // A crashed X server is an error, not a hang.
    let r = c
        .post(format!("{}/v1/sandboxes/{id}/exec", d.url))
        .json(&json!({"cmd": ["sh", "-c", "pkill -KILL -x Xvfb; while pgrep -x Xvfb; do sleep 0.1; done"]}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(format!("{}/v1/sandboxes/{id}/desktop/screenshot", d.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 502);
    let body: Value = r.json().unwrap();
    assert!(
        body.to_string().contains("no X server answers on :0"),
        "{body}"
    );

    // ---- A browser in a sandbox whose policy allows one test host: Playwright from outside.
    let r = c
        .post(format!("{}/v1/sandboxes", d.url))
        .json(&json!({
            "template": "desktop",
            "timeout_secs": 300,
            "network": {"mode": "allowlist", "allow": ["allowed.desktop.test"]},
        }))
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
    let sb: Value = r.json().unwrap();
    let bid = sb["id"].as_str().unwrap().to_owned();
    let btoken = sb["access_token"].as_str().unwrap().to_owned();
    let r = c
        .post(format!("{}/v1/sandboxes/{bid}/browser", d.url))
        .send()
        .unwrap();
    let status = r.status();
    let browser: Value = r.json().unwrap();
    assert_eq!(status, 200, "{browser}");
    assert_eq!(browser["headed"], false, "no display: headless");
    let cdp = browser["cdp_url"].as_str().unwrap();
    let ws = browser["ws_url"].as_str().unwrap();
    assert!(
        cdp.ends_with(&format!("/v1/sandboxes/{bid}/ports/9222")),
        "{cdp}"
    );
    run_script(
        d,
        &key,
        "desktop_cdp.py",
        &[
            cdp,
            ws,
            &btoken,
            "http://allowed.desktop.test/page.html",
            "http://other.desktop.test/page.html",
        ],
        &[],
    );
    // The network log names what the browser loaded and what it was refused.
    let log = c
        .get(format!("{}/v1/sandboxes/{bid}/network/log", d.url))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(log.contains("allowed.desktop.test"), "{log}");
    assert!(log.contains("other.desktop.test"), "{log}");
}

/// Every event of a sandbox's record, page by page.
fn audit_events(d: &support::Daemon, id: &str) -> Vec<Value> {
    let c = client();
    let mut out = Vec::new();
    let mut after: Option<u64> = None;
    loop {
        let q = after.map(|a| format!("&after={a}")).unwrap_or_default();
        let page: Value = c
            .get(format!("{}/v1/sandboxes/{id}/audit?limit=500{q}", d.url))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let events = page["events"].as_array().cloned().unwrap_or_default();
        let next = page["next_after"].as_u64();
        let done = events.is_empty() || next.is_none() || next == after;
        out.extend(events);
        if done {
            return out;
        }
        after = next;
    }
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}
