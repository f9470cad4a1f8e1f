//! Authentication of the native API, attacked as another host user would: a daemon started
//! as operators start it (`rampart serve`, a fresh data directory, no key given), then
//! - as host user `nobody` over TCP without a key: 401 on list, create, exec, files,
//!   secrets, network and `/metrics`; `/health` answers 200;
//! - with a malformed, unknown, revoked or expired key: 401 saying which;
//! - a valid key with `Host: evil.example` (DNS rebinding): refused (421);
//! - over the Unix socket: root works without a key, the CLI uses it; `nobody` cannot reach
//!   it, and when made able to connect (CAP_DAC_OVERRIDE) is refused by `SO_PEERCRED`;
//! - the admin key file is 0600, the socket 0660; the E2B API keeps its own keys; the port
//!   proxy's path form keeps its sandbox tokens.
//!
//! Needs root (the daemon, setpriv) and `curl`; otherwise it prints `skipped: <reason>`.

mod support;

use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use support::{free_port, token, wait_until, Daemon};

const NOBODY: u32 = 65534;

/// Why this test cannot run here, if it cannot.
fn skip() -> Option<String> {
    if let Some(why) = support::skip_reason() {
        return Some(why);
    }
    for tool in ["curl", "setpriv"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// A daemon started as an operator starts one: no key registered beforehand. Removed
/// (directory and all) when dropped.
struct Fresh {
    daemon: Daemon,
    root: PathBuf,
}

impl Drop for Fresh {
    fn drop(&mut self) {
        self.daemon.stop();
        support::unmount_store(&self.daemon.data);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn start_fresh() -> Fresh {
    let root = std::env::temp_dir().join(format!("rampart-auth-{}", token()));
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let daemon = support::spawn_daemon(&data, free_port(), &[]);
    Fresh { daemon, root }
}

/// What curl got: the status and the body (parsed as JSON when it is).
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Value,
    text: String,
}

/// Runs curl with `args` (as `nobody` when `as_nobody`, with the extra setpriv `caps`);
/// the status is what `-w` prints last. A failed connection is status 0.
fn curl(as_nobody: bool, caps: &[&str], args: &[&str]) -> Answer {
    let mut cmd = if as_nobody {
        let mut c = Command::new("setpriv");
        c.args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
        ]);
        c.args(caps);
        c.args(["--", "curl"]);
        c
    } else {
        Command::new("curl")
    };
    let out = cmd
        .args(["-sS", "-m", "60", "-w", "\n%{http_code}"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run curl");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (text, code) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    Answer {
        status: code.trim().parse().unwrap_or(0),
        body: serde_json::from_str(text).unwrap_or(Value::Null),
        text: format!("{text}{}", String::from_utf8_lossy(&out.stderr)),
    }
}

/// The message of an API error answer.
fn message(a: &Answer) -> String {
    a.body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Every way of calling the native API, as curl arguments (after the URL is appended).
fn endpoints(url: &str, id: &str) -> Vec<(String, Vec<String>)> {
    let j = |m: &str, path: &str, body: &str| {
        let mut v = vec![
            "-X".to_owned(),
            m.to_owned(),
            format!("{url}{path}"),
            "-H".into(),
            "content-type: application/json".into(),
        ];
        if !body.is_empty() {
            v.extend(["-d".to_owned(), body.to_owned()]);
        }
        (format!("{m} {path}"), v)
    };
    vec![
        j("GET", "/v1/sandboxes", ""),
        j("POST", "/v1/sandboxes", "{}"),
        j("GET", &format!("/v1/sandboxes/{id}"), ""),
        j("DELETE", &format!("/v1/sandboxes/{id}"), ""),
        j(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            r#"{"cmd":["id"]}"#,
        ),
        j(
            "GET",
            &format!("/v1/sandboxes/{id}/files?path=/etc/passwd"),
            "",
        ),
        j("GET", &format!("/v1/sandboxes/{id}/network"), ""),
        j(
            "PUT",
            &format!("/v1/sandboxes/{id}/network"),
            r#"{"mode":"open"}"#,
        ),
        j("GET", "/v1/secrets", ""),
        j("GET", "/metrics", ""),
    ]
}

#[test]
fn the_native_api_answers_only_its_administrator() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = start_fresh();
    let url = d.daemon.url.clone();
    let data = d.daemon.data.clone();
    let log = || support::log_tail(&data.with_extension("log"));

    // First start: the admin key, 0600, and the socket, 0660.
    let key_file = data.join("admin-key");
    let admin = std::fs::read_to_string(&key_file)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", key_file.display(), log()));
    let admin = admin.trim().to_owned();
    assert!(
        admin.starts_with("rampart_") && admin.len() == 48,
        "{admin:?}"
    );
    assert_eq!(mode(&key_file), 0o600, "the admin key file");
    let sock = data.join("rampart.sock");
    assert_eq!(mode(&sock), 0o660, "the socket");
    let bearer = format!("Authorization: Bearer {admin}");

    // The administrator over TCP makes a sandbox for the attacks to aim at.
    let made = curl(
        false,
        &[],
        &[
            "-X",
            "POST",
            &format!("{url}/v1/sandboxes"),
            "-H",
            &bearer,
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"timeout_secs": 600}"#,
        ],
    );
    assert_eq!(
        made.status,
        201,
        "create with the admin key: {}\n{}",
        made.text,
        log()
    );
    let id = made.body["id"].as_str().unwrap().to_owned();

    // 1. nobody, no key: 401 everywhere but /health; nothing changed.
    for (what, args) in endpoints(&url, &id) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let a = curl(true, &[], &args);
        assert_eq!(a.status, 401, "nobody, {what}: {}", a.text);
        assert_eq!(
            a.body["error"]["code"], "unauthorized",
            "{what}: {}",
            a.text
        );
        assert!(
            message(&a).contains("missing API key"),
            "{what}: {}",
            a.text
        );
    }
    let h = curl(true, &[], &[&format!("{url}/health")]);
    assert_eq!(h.status, 200, "/health: {}", h.text);
    let listed = curl(false, &[], &[&format!("{url}/v1/sandboxes"), "-H", &bearer]);
    assert_eq!(listed.status, 200, "{}", listed.text);
    let ids: Vec<&str> = listed
        .body
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, [id.as_str()], "the sandbox is still there, alone");

    // 2. Bad keys: 401 saying which.
    let list = format!("{url}/v1/sandboxes");
    let unknown = format!("rampart_{}", "0".repeat(40));
    let cases: Vec<(String, &str)> = vec![
        ("Authorization: Bearer".into(), "malformed Authorization"),
        ("Authorization: Basic dXNlcjpwYXNz".into(), "not Bearer"),
        (
            format!("Authorization: Bearer e2b_{}", "0".repeat(40)),
            "starts with `rampart_`",
        ),
        ("Authorization: Bearer rampart_0123".into(), "40 hex digits"),
        (
            format!("Authorization: Bearer rampart_{}", "Z".repeat(40)),
            "lowercase hex",
        ),
        (
            format!("Authorization: Bearer {unknown}"),
            "unknown API key",
        ),
        (format!("X-API-Key: {unknown}"), "unknown API key"),
    ];
    for (header, why) in &cases {
        let a = curl(true, &[], &[&list, "-H", header]);
        assert_eq!(a.status, 401, "{header}: {}", a.text);
        assert!(
            message(&a).contains(why),
            "{header}: want {why:?}: {}",
            a.text
        );
    }
    // The admin key works as X-API-Key too, for any host user who has it.
    let a = curl(true, &[], &[&list, "-H", &format!("X-API-Key: {admin}")]);
    assert_eq!(a.status, 200, "X-API-Key: {}", a.text);

    // 3. A key made with `rampart keys create --native`, then revoked: refused at once.
    let rk = |args: &[&str]| {
        support::cli_local(&data, &[&["keys"], args].concat())
            .unwrap_or_else(|e| panic!("rampart keys {args:?}: {e}"))
    };
    let made: Value =
        serde_json::from_str(&rk(&["create", "--native", "--name", "ci", "--json"])).unwrap();
    let (k, kid) = (
        made["key"].as_str().unwrap().to_owned(),
        made["id"].as_str().unwrap().to_owned(),
    );
    assert_eq!(made["scopes"], json!(["admin"]), "{made}");
    let with_k = format!("Authorization: Bearer {k}");
    assert_eq!(curl(true, &[], &[&list, "-H", &with_k]).status, 200);
    let ls: Value = serde_json::from_str(&rk(&["ls", "--json"])).unwrap();
    assert!(
        !ls.to_string().contains(&k),
        "keys ls shows a key itself: {ls}"
    );
    assert!(ls.to_string().contains(&kid), "{ls}");
    rk(&["rm", &kid]);
    let a = curl(true, &[], &[&list, "-H", &with_k]);
    assert_eq!(a.status, 401, "revoked: {}", a.text);
    assert!(message(&a).contains("revoked"), "{}", a.text);

    // An expiring key: works, then (once its second has passed) answers "expired".
    let made: Value =
        serde_json::from_str(&rk(&["create", "--native", "--expires", "1s", "--json"])).unwrap();
    let with_e = format!("Authorization: Bearer {}", made["key"].as_str().unwrap());
    let first = curl(true, &[], &[&list, "-H", &with_e]);
    assert!(
        first.status == 200 || message(&first).contains("expired"),
        "{}",
        first.text
    );
    wait_until("the key expires", 30, || {
        message(&curl(true, &[], &[&list, "-H", &with_e])).contains("expired")
    });

    // 4. DNS rebinding: a valid key, a Host that is not the daemon's.
    let a = curl(
        false,
        &[],
        &[&list, "-H", &bearer, "-H", "Host: evil.example"],
    );
    assert_eq!(a.status, 421, "Host evil.example: {}", a.text);
    assert!(message(&a).contains("evil.example"), "{}", a.text);
    let a = curl(
        false,
        &[],
        &[
            &format!("{url}/metrics"),
            "-H",
            &bearer,
            "-H",
            "Host: evil.example:80",
        ],
    );
    assert_eq!(a.status, 421, "/metrics, Host evil.example: {}", a.text);
    let a = curl(
        false,
        &[],
        &[&list, "-H", &bearer, "-H", "Host: localhost:9999"],
    );
    assert_eq!(a.status, 200, "Host localhost: {}", a.text);
    let a = curl(false, &[], &[&format!("{url}/metrics"), "-H", &bearer]);
    assert_eq!(a.status, 200, "/metrics with the key: {}", a.text);

    // 5. The Unix socket: root needs no key; nobody cannot reach it, and one that could
    // connect is refused by who it is.
    let s = sock.to_string_lossy().into_owned();
    let a = curl(
        false,
        &[],
        &["--unix-socket", &s, "http://localhost/v1/sandboxes"],
    );
    assert_eq!(a.status, 200, "root on the socket: {}", a.text);
    let a = curl(
        true,
        &[],
        &["--unix-socket", &s, "http://localhost/v1/sandboxes"],
    );
    assert!(
        a.status == 0 || a.status == 401,
        "nobody on the socket: {} {}",
        a.status,
        a.text
    );
    let caps = ["--inh-caps=+dac_override", "--ambient-caps=+dac_override"];
    let a = curl(
        true,
        &caps,
        &["--unix-socket", &s, "http://localhost/v1/sandboxes"],
    );
    if a.status == 0 {
        eprintln!(
            "note: setpriv could not give nobody CAP_DAC_OVERRIDE: {}",
            a.text
        );
    } else {
        assert_eq!(a.status, 401, "nobody connected to the socket: {}", a.text);
        assert!(message(&a).contains(&format!("uid {NOBODY}")), "{}", a.text);
    }
    // The CLI on the daemon's host uses the socket, with no key.
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rampart"))
            .args(args)
            .env_remove("RAMPART_HOST")
            .env_remove("RAMPART_API_KEY")
            .env("RAMPART_SOCKET", &sock)
            .output()
            .unwrap()
    };
    let out = cli(&["exec", &id, "--", "echo", "through-the-socket"]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("through-the-socket"),
        "rampart exec over the socket: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // An exec with stdin goes over the exec WebSocket, on the socket too.
    let mut child = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["exec", "--stdin", &id, "--", "cat"])
        .env_remove("RAMPART_HOST")
        .env_remove("RAMPART_API_KEY")
        .env("RAMPART_SOCKET", &sock)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"over-the-websocket\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout) == "over-the-websocket\n",
        "rampart exec --stdin over the socket: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Over TCP without RAMPART_API_KEY it says what to do.
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["ls"])
        .env("RAMPART_HOST", &url)
        .env_remove("RAMPART_API_KEY")
        .env_remove("RAMPART_SOCKET")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("RAMPART_API_KEY"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["ls", "--json"])
        .env("RAMPART_HOST", &url)
        .env("RAMPART_API_KEY", &admin)
        .env_remove("RAMPART_SOCKET")
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&id),
        "rampart ls with RAMPART_API_KEY: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // 6. The other surfaces keep their own credentials: the E2B API its keys, the port
    // proxy's path form the sandbox's token.
    let a = curl(true, &[], &[&format!("{url}/sandboxes"), "-H", &bearer]);
    assert_eq!(a.status, 401, "E2B without its key: {}", a.text);
    let e2b = std::fs::read_to_string(data.join("api-key")).unwrap();
    let a = curl(
        true,
        &[],
        &[
            &format!("{url}/sandboxes"),
            "-H",
            &format!("X-API-Key: {}", e2b.trim()),
        ],
    );
    assert_eq!(a.status, 200, "E2B with its key: {}", a.text);
    let a = curl(
        true,
        &[],
        &[&format!("{url}/v1/sandboxes/{id}/ports/8080/")],
    );
    assert_eq!(a.status, 401, "port proxy without a token: {}", a.text);
    assert!(message(&a).contains("access token"), "{}", a.text);

    let a = curl(
        false,
        &[],
        &[
            "-X",
            "DELETE",
            &format!("{url}/v1/sandboxes/{id}"),
            "-H",
            &bearer,
        ],
    );
    assert_eq!(a.status, 200, "destroy: {}", a.text);
}

/// A socket put outside the 0700 data directory (`serve --socket`, as `/run/rampart`): the
/// daemon makes its directory 0750 with the socket's group, so a member of that group (here
/// `nobody` with the group as its primary group, which `SO_PEERCRED` reports) is the node's
/// administrator without a key, and `nobody` in its own group cannot even reach it.
#[test]
fn a_socket_outside_the_data_directory_serves_its_group() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = std::env::temp_dir().join(format!("rampart-sock-{}", token()));
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    // The test's own root is traversable, as `/run` is.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = root.join("run").join("rampart.sock");
    let sock_s = sock.to_string_lossy().into_owned();
    let daemon = support::spawn_daemon(&data, free_port(), &[("RAMPART_SOCKET", &sock_s)]);
    let mut fresh = Fresh { daemon, root };
    let dir = sock.parent().unwrap();
    assert_eq!(mode(dir), 0o750, "the socket's directory");
    use std::os::unix::fs::MetadataExt as _;
    let group = std::fs::metadata(dir).unwrap().gid();
    assert_eq!(std::fs::metadata(&sock).unwrap().gid(), group);
    assert_eq!(mode(&sock), 0o660);
    let in_group = [format!("--regid={group}")];
    let mut cmd = Command::new("setpriv");
    cmd.args([
        &format!("--reuid={NOBODY}"),
        &in_group[0],
        "--clear-groups",
        "--",
    ])
    .args([
        "curl",
        "-sS",
        "-m",
        "30",
        "-w",
        "\n%{http_code}",
        "--unix-socket",
        &sock_s,
    ])
    .arg("http://localhost/v1/sandboxes");
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.ends_with("\n200"),
        "a member of group {group} on the socket: {text}"
    );
    let a = curl(
        true,
        &[],
        &["--unix-socket", &sock_s, "http://localhost/v1/sandboxes"],
    );
    assert_eq!(
        a.status, 0,
        "nobody outside the group reached the socket: {}",
        a.text
    );
    fresh.daemon.stop();
    assert!(!sock.exists(), "the socket is removed at shutdown");
}
