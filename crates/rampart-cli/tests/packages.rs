//! Packages fetched through a sandbox's network, end to end, against the real PyPI: a real
//! daemon (its own nftables table, link prefix, address pool and egress ports), a sandbox of
//! the base template whose allowlist names `pypi.org` and `files.pythonhosted.org`, and a
//! real `pip install six==1.16.0` inside.
//!
//! What it shows: the egress proxy intercepts the registries' TLS with the sandbox's CA (pip
//! trusts it), recognises the wheel download and records a `package` event;
//! `GET /v1/sandboxes/{id}/packages` lists it with the SHA-256 that `sha256sum` gives of the
//! same wheel inside the sandbox and that PyPI publishes for it; a package whose name a
//! `deny` pattern matches is refused (pip fails, a denied event names the rule), and so is
//! an unpinned one under `require_pinned`; an npm tarball, a crate and a Debian package
//! (HTTPS and plain HTTP) fetched with curl are recorded with their `sha256sum` digests; a policy with an invalid pattern is a 400 that
//! changes nothing; the bundle verifies with `rampart audit verify`, the Python verifier and
//! the console's verify.js (under node), and its report lists the packages; the list is
//! still there after the sandbox is destroyed; a `kill -9` and restart of the daemon keeps
//! recording (the sandbox keeps its CA).
//!
//! Skipped, with the reason, without root, `nft`, the binaries, or when one of the
//! registries (PyPI, npm, static.crates.io, deb.debian.org) cannot be reached from this host.

mod support;

use serde_json::{json, Value};
use std::net::ToSocketAddrs as _;
use std::process::Command;
use std::time::Duration;
use support::{client, free_port, skip_reason, start, wait_until, Daemon, Sandbox, TableGuard};

fn skip() -> Option<String> {
    if let Some(r) = skip_reason() {
        return Some(r);
    }
    if Command::new("nft").arg("--version").output().is_err() {
        return Some("nft (Debian package nftables) is not installed".into());
    }
    for (host, port) in [
        ("pypi.org", 443),
        ("files.pythonhosted.org", 443),
        ("registry.npmjs.org", 443),
        ("static.crates.io", 443),
        ("deb.debian.org", 443),
        ("deb.debian.org", 80),
    ] {
        let addrs = match (host, port).to_socket_addrs() {
            Ok(a) => a.collect::<Vec<_>>(),
            Err(e) => return Some(format!("{host} does not resolve on this host: {e}")),
        };
        if !addrs
            .iter()
            .any(|a| std::net::TcpStream::connect_timeout(a, Duration::from_secs(5)).is_ok())
        {
            return Some(format!("{host}:{port} is unreachable from this host"));
        }
    }
    None
}

/// Destroys every sandbox of the daemon when dropped (declared after the daemon).
struct Sandboxes(String);

impl Drop for Sandboxes {
    fn drop(&mut self) {
        support::destroy_all(&self.0);
    }
}

fn get(d: &Daemon, path: &str) -> (u16, Value) {
    let r = client().get(format!("{}{path}", d.url)).send().unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

fn put(d: &Daemon, path: &str, body: &Value) -> (u16, Value) {
    let r = client()
        .put(format!("{}{path}", d.url))
        .json(body)
        .send()
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

/// `sh -c script` in the sandbox: (exit code, stdout + stderr).
fn sh(sb: &Sandbox, script: &str) -> (i64, String) {
    let v = sb.exec(json!({
        "cmd": ["sh", "-c", script],
        "env": {"PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        "timeout_secs": 180,
    }));
    let out = format!(
        "{}{}",
        v["stdout"].as_str().unwrap_or_default(),
        v["stderr"].as_str().unwrap_or_default()
    );
    (v["exit_code"].as_i64().unwrap_or(-1), out)
}

/// The package entries of the sandbox named `name` with `verdict`.
fn entries(d: &Daemon, id: &str, name: &str, verdict: &str) -> Vec<Value> {
    let (status, list) = get(d, &format!("/v1/sandboxes/{id}/packages"));
    assert_eq!(status, 200, "{list}");
    list.as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] == name && p["verdict"] == verdict)
        .cloned()
        .collect()
}

#[test]
fn pip_install_through_the_proxy_is_recorded_with_its_digest() {
    if let Some(r) = skip() {
        eprintln!("SKIP: {r}");
        return;
    }
    let t = (std::process::id().wrapping_mul(11) + 7) % 250;
    let table = format!("rampart_pkg_{}", std::process::id());
    let _table = TableGuard(table.clone());
    let pool = format!("10.251.{t}.0/24");
    let prefix = format!("rp{t}z");
    let envs = [
        ("RAMPART_NET_POOL", pool.as_str()),
        ("RAMPART_NET_LINK_PREFIX", prefix.as_str()),
        ("RAMPART_NET_TABLE", table.as_str()),
        ("RAMPART_NET_DNS_PORT", "0"),
        ("RAMPART_NET_PROXY_PORT", "0"),
        ("RAMPART_JAIL_POOL", "0"),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let port = free_port();
    let mut d = start(&data, port, &envs);
    let _sandboxes = Sandboxes(d.url.clone());

    let allow = json!(["pypi.org", "files.pythonhosted.org"]);
    // A bad pattern is a 400 naming it, and no sandbox is made.
    let (status, body) = support::post(
        &d,
        "/v1/sandboxes",
        json!({"network": {"mode": "allowlist", "allow": allow,
                           "packages": {"deny": ["^evil-", "(unclosed"]}}}),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body.to_string().contains("(unclosed") && body.to_string().contains("regular expression"),
        "{body}"
    );
    let policy = json!({"mode": "allowlist", "allow": allow,
                        "packages": {"deny": ["^evil-", "^idna$"]}});
    let mut sb = Sandbox::create(&d, json!({"network": policy.clone(), "timeout_secs": 900}));
    let id = sb.id.clone();

    if std::env::var_os("PKG_DEBUG").is_some() {
        let (_, out) = sh(&sb, "env | sort; python3 -m pip --version; python3 -c 'import ssl;print(ssl.get_default_verify_paths())'; grep -c BEGIN /etc/ssl/certs/ca-certificates.crt; ls -la /etc/ssl/certs | head; python3 -m pip config list; curl -sv https://pypi.org/simple/six/ -o /dev/null 2>&1 | grep -iE 'issuer|subject|error|HTTP/'");
        eprintln!("DEBUG:\n{out}");
        eprintln!(
            "NETLOG: {}",
            get(&d, &format!("/v1/sandboxes/{}/network/log", sb.id)).1
        );
    }
    // A pinned install: recorded with the digest of what was fetched.
    let (code, out) = sh(
        &sb,
        "python3 -m pip install --no-cache-dir --target /tmp/site six==1.16.0",
    );
    assert_eq!(code, 0, "pip install failed:\n{out}\n{}", sb.log_tail());
    wait_until("the six download in /packages", 30, || {
        !entries(&d, &id, "six", "allowed").is_empty()
    });
    let six = entries(&d, &id, "six", "allowed").remove(0);
    assert_eq!(six["ecosystem"], "pypi");
    assert_eq!(six["version"], "1.16.0");
    assert_eq!(six["registry"], "files.pythonhosted.org");
    assert_eq!(six["rule"], "package");
    let path = six["path"].as_str().unwrap();
    assert!(
        path.starts_with("/packages/") && path.ends_with("/six-1.16.0-py2.py3-none-any.whl"),
        "{six}"
    );
    // The same wheel, hashed inside.
    let (code, out) = sh(
        &sb,
        "python3 -m pip download --no-cache-dir --no-deps -d /tmp/w six==1.16.0 >/dev/null \
         && sha256sum /tmp/w/six-1.16.0-py2.py3-none-any.whl",
    );
    assert_eq!(code, 0, "pip download failed:\n{out}");
    let inside = out.split_whitespace().next().unwrap_or_default().to_owned();
    assert_eq!(six["sha256"], inside.as_str(), "{six} vs sha256sum {out}");
    // PyPI's simple index publishes each file's digest in its link (`#sha256=`).
    let (code, published) = sh(
        &sb,
        "python3 -c 'import re,urllib.request; \
         page=urllib.request.urlopen(\"https://pypi.org/simple/six/\").read().decode(); \
         print(re.search(r\"six-1\\.16\\.0-py2\\.py3-none-any\\.whl#sha256=([0-9a-f]{64})\", page).group(1))'",
    );
    assert_eq!(code, 0, "PyPI's index: {published}");
    assert_eq!(inside, published.trim(), "the wheel's digest is PyPI's");
    assert_eq!(six["size"].as_u64(), Some(11053), "the wheel's size: {six}");
    // Both downloads were recorded.
    wait_until("the second six download in /packages", 30, || {
        entries(&d, &id, "six", "allowed").len() >= 2
    });

    // A name the deny pattern matches: refused by the proxy, pip fails, recorded as denied.
    let (code, out) = sh(
        &sb,
        "python3 -m pip install --no-cache-dir --target /tmp/site2 --no-deps idna==3.7",
    );
    assert_ne!(code, 0, "a denied package installed:\n{out}");
    assert!(
        out.contains("403"),
        "pip's error does not show the 403:\n{out}"
    );
    wait_until("the denied idna in /packages", 30, || {
        !entries(&d, &id, "idna", "denied").is_empty()
    });
    let idna = entries(&d, &id, "idna", "denied").remove(0);
    assert_eq!(idna["rule"], "package-deny:^idna$", "{idna}");
    assert_eq!(idna["sha256"], Value::Null);
    assert!(entries(&d, &id, "idna", "allowed").is_empty());
    let (code, _) = sh(&sb, "test -e /tmp/site2/idna");
    assert_ne!(code, 0, "idna reached the sandbox");

    // The other registries, fetched with curl: an npm tarball, a crate, a Debian package over
    // HTTPS and over plain HTTP, each recorded with the digest `sha256sum` gives inside.
    let wide = json!({"mode": "allowlist",
        "allow": ["pypi.org", "files.pythonhosted.org", "registry.npmjs.org",
                  "static.crates.io", "deb.debian.org"],
        "packages": policy["packages"]});
    let (status, body) = put(&d, &format!("/v1/sandboxes/{id}/network"), &wide);
    assert!(status == 200 || status == 204, "{status} {body}");
    for (n, (url, ecosystem, name, version)) in [
        (
            "https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz",
            "npm",
            "left-pad",
            "1.3.0",
        ),
        (
            "https://static.crates.io/crates/cfg-if/cfg-if-1.0.0.crate",
            "crates",
            "cfg-if",
            "1.0.0",
        ),
        (
            "https://deb.debian.org/debian/pool/main/h/hello/hello_2.10-3_amd64.deb",
            "debian",
            "hello",
            "2.10-3",
        ),
        (
            "http://deb.debian.org/debian/pool/main/h/hello/hello_2.10-3_amd64.deb",
            "debian",
            "hello",
            "2.10-3",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let (code, out) = sh(
            &sb,
            &format!("curl -sSf -o /tmp/f{n} {url} && sha256sum /tmp/f{n}"),
        );
        assert_eq!(code, 0, "curl {url}: {out}");
        let digest = out.split_whitespace().next().unwrap_or_default().to_owned();
        let seen = if url.starts_with("http://") { 2 } else { 1 };
        wait_until(&format!("{url} in /packages"), 30, || {
            let got = entries(&d, &id, name, "allowed");
            got.len() >= seen
                && got.iter().all(|p| {
                    p["ecosystem"] == ecosystem
                        && p["version"] == version
                        && p["sha256"] == digest.as_str()
                })
        });
    }

    // A policy change with a bad pin is a 400 and changes nothing.
    let bad = json!({"mode": "allowlist", "allow": allow,
                     "packages": {"require_pinned": true, "pinned": ["six"]}});
    let (status, body) = put(&d, &format!("/v1/sandboxes/{id}/network"), &bad);
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("name==version"), "{body}");
    let (_, info) = get(&d, &format!("/v1/sandboxes/{id}/network"));
    assert_eq!(info["policy"]["packages"], policy["packages"], "{info}");

    // Pinned versions only: six 1.16.0 passes, idna (unpinned) does not.
    let pinned = json!({"mode": "allowlist", "allow": allow,
                        "packages": {"require_pinned": true, "pinned": ["pypi:six==1.16.0"]}});
    let (status, body) = put(&d, &format!("/v1/sandboxes/{id}/network"), &pinned);
    assert!(status == 200 || status == 204, "{status} {body}");
    let (code, out) = sh(
        &sb,
        "python3 -m pip download --no-cache-dir --no-deps -d /tmp/w3 six==1.16.0",
    );
    assert_eq!(code, 0, "a pinned download failed:\n{out}");
    wait_until("the pinned six download in /packages", 30, || {
        entries(&d, &id, "six", "allowed")
            .iter()
            .any(|p| p["rule"] == "pinned:pypi:six==1.16.0")
    });
    let (code, out) = sh(
        &sb,
        "python3 -m pip download --no-cache-dir --no-deps -d /tmp/w4 idna==3.7",
    );
    assert_ne!(code, 0, "an unpinned download passed:\n{out}");
    wait_until("the unpinned idna in /packages", 30, || {
        entries(&d, &id, "idna", "denied")
            .iter()
            .any(|p| p["rule"] == "unpinned")
    });

    // kill -9 of the daemon and a new one on the same data: the sandbox is re-attached with
    // its CA (pip still trusts the registries' certificates) and downloads are still recorded.
    let pinned_before = entries(&d, &id, "six", "allowed").len();
    d.child.kill().unwrap();
    let _ = d.child.wait();
    drop(d);
    let d = start(&data, port, &envs);
    let _sandboxes_again = Sandboxes(d.url.clone());
    sb.reattach(&d);
    let (code, out) = sh(
        &sb,
        "python3 -m pip download --no-cache-dir --no-deps -d /tmp/w5 six==1.16.0",
    );
    assert_eq!(
        code, 0,
        "a pinned download after the restart failed:\n{out}"
    );
    wait_until(
        "the six download after the restart in /packages",
        30,
        || entries(&d, &id, "six", "allowed").len() > pinned_before,
    );

    // The bundle verifies with all three verifiers, and its report lists the packages.
    let bundle = client()
        .get(sb.url("/audit/bundle"))
        .send()
        .unwrap()
        .bytes()
        .unwrap();
    let file = tmp.path().join("bundle.json");
    std::fs::write(&file, &bundle).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["audit", "verify"])
        .arg(&file)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Packages ("), "{text}");
    assert!(
        text.contains(&format!(
            "pypi    six==1.16.0 from files.pythonhosted.org  sha256 {inside}"
        )),
        "{text}"
    );
    assert!(
        text.contains("idna==3.7") && text.contains("package-deny:^idna$"),
        "{text}"
    );
    let py = Command::new("python3")
        .arg(support::workspace().join("crates/rampart-audit/tools/verify_bundle.py"))
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        py.status.success(),
        "{}{}",
        String::from_utf8_lossy(&py.stdout),
        String::from_utf8_lossy(&py.stderr)
    );
    // The Python verifier's shape check refuses a package record that does not hold
    // together (checked on bodies: a changed body would already fail its hash).
    let checks = r#"
import json, sys
sys.path.insert(0, sys.argv[1])
import verify
good = [e["body"] for e in json.load(open(sys.argv[2]))["events"] if e["body"]["type"] == "package"]
assert good and all(verify.package_problem(b) is None for b in good), good
allowed = next(b for b in good if b["verdict"] == "allowed")
for change in ({"sha256": None}, {"size": None}, {"ecosystem": "cpan"}, {"rule": "unpinned"},
               {"verdict": "maybe"}, {"extra": 1}):
    bad = dict(allowed, **change)
    assert verify.package_problem(bad), change
print("ok")
"#;
    let py = Command::new("python3")
        .args(["-c", checks])
        .arg(support::workspace().join("sdk/python/rampart"))
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        py.status.success(),
        "{}{}",
        String::from_utf8_lossy(&py.stdout),
        String::from_utf8_lossy(&py.stderr)
    );
    match node_verify(&file) {
        Err(why) => eprintln!("SKIP (verify.js half): {why}"),
        Ok(out) => assert!(out.contains("ok"), "{out}"),
    }

    // The Python SDK's `Sandbox.packages()` (when its venv is there: scripts/*-sdks.sh).
    let venv = support::venv_python("RAMPART_SDK_VENV", "sdk-venv");
    if venv.is_file() {
        let script = "import os, sys\n\
            sys.path.insert(0, os.environ['SDK'])\n\
            import rampart\n\
            with rampart.Rampart() as c:\n\
            \x20   ps = c.get(os.environ['ID']).packages()\n\
            print(sorted({(p['name'], p['verdict']) for p in ps}))\n";
        let out = Command::new(&venv)
            .args(["-c", script])
            .env("SDK", support::workspace().join("sdk/python"))
            .env("ID", &id)
            .env("RAMPART_HOST", &d.url)
            .env("RAMPART_API_KEY", support::admin_key())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("('idna', 'denied')") && text.contains("('six', 'allowed')"),
            "{text}"
        );
    } else {
        eprintln!("SKIP (SDK half): no SDK venv at {}", venv.display());
    }

    // The DSSE predicate lists them too.
    let (status, env) = get(&d, &format!("/v1/sandboxes/{id}/audit/dsse"));
    assert_eq!(status, 200);
    let payload = base64_decode(env["payload"].as_str().unwrap());
    let statement: Value = serde_json::from_slice(&payload).unwrap();
    let listed = statement["predicate"]["packages"].as_array().unwrap();
    assert!(
        listed
            .iter()
            .any(|p| p["name"] == "six" && p["sha256"] == inside.as_str()),
        "{listed:?}"
    );

    // Still listed after the sandbox is gone.
    let before = get(&d, &format!("/v1/sandboxes/{id}/packages")).1;
    sb.destroy();
    let (status, after) = get(&d, &format!("/v1/sandboxes/{id}/packages"));
    assert_eq!(status, 200, "{after}");
    assert_eq!(before, after);
}

/// Runs the console's verify.js under node against `file`, plus its package check on bad
/// bodies. `Err` (the reason) when node is missing or lacks WebCrypto's Ed25519.
fn node_verify(file: &std::path::Path) -> Result<String, String> {
    let js = support::workspace().join("crates/rampart-server/console/verify.js");
    let script = r#"
const fs = require("fs");
const src = fs.readFileSync(process.argv[1], "utf8");
const RampartVerify = new Function(src + "\nreturn RampartVerify;")();
const text = fs.readFileSync(process.argv[2], "utf8");
(async () => {
  try {
    await crypto.subtle.importKey("raw", new Uint8Array(32), { name: "Ed25519" }, false, ["verify"]);
  } catch (e) {
    console.log("SKIP: no Ed25519 in this node's WebCrypto: " + e);
    return;
  }
  await RampartVerify.verifyBundle(text);
  const b = JSON.parse(text);
  const allowed = b.events.map((e) => e.body).find((x) => x.type === "package" && x.verdict === "allowed");
  if (RampartVerify.packageProblem(allowed) !== null) throw new Error("good body refused");
  for (const change of [{ sha256: null }, { size: null }, { ecosystem: "cpan" }, { rule: "unpinned" }, { extra: 1 }]) {
    if (!RampartVerify.packageProblem({ ...allowed, ...change })) throw new Error("bad body passed: " + JSON.stringify(change));
  }
  console.log("ok");
})().catch((e) => { console.error(String(e)); process.exit(1); });
"#;
    let out = Command::new("node")
        .args(["-e", script])
        .arg(&js)
        .arg(file)
        .output()
        .map_err(|e| format!("node: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if let Some(why) = text.lines().find_map(|l| l.strip_prefix("SKIP: ")) {
        return Err(why.to_owned());
    }
    if !out.status.success() {
        panic!(
            "verify.js refused the bundle: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(text)
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64 payload")
}
