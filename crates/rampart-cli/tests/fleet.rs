//! The fleet (issue 29), as users run it: `rampart fleet up` starts a real 3-member etcd,
//! real daemons joined to it and a gateway, all on loopback; every call goes through the
//! gateway's HTTP API with keys made through it.
//!
//! - `a_fleet_places_routes_and_keeps_tenants_apart`: 9 creates spread 3/3/3 over 3 nodes;
//!   exec and files reach each sandbox through the gateway; a node refuses its own admin key
//!   and a forged gateway header over TCP; a tenant's `max_sandboxes` holds across nodes;
//!   another tenant gets 404 for its sandbox and an empty list; a second gateway gives the
//!   same answers; a destroy through the gateway removes the sandbox from the catalog;
//!   `fleet down` leaves no process it started.
//! - `a_killed_node_is_lost_then_comes_back`: `kill -9` of a node: within its lease its
//!   sandboxes are `lost` (an exec is 503 `node_lost`), `GET /v1/nodes` says so, creates go
//!   to the live node; the node started again re-attaches its sandboxes and the gateway
//!   routes to them again.
//!
//! Needs root, the jailer and the agent, and `etcd` (scripts/setup-host.sh installs
//! etcd-server); otherwise it prints `skipped: <reason>`.

mod support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

/// A fleet `rampart fleet up` started; `fleet down` when dropped.
struct Fleet {
    dir: tempfile::TempDir,
    file: Value,
}

impl Fleet {
    fn up(nodes: usize, ttl: u64) -> Fleet {
        let dir = tempfile::Builder::new()
            .prefix("rampart-fleet-")
            .tempdir()
            .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
            .args([
                "fleet",
                "up",
                "--nodes",
                &nodes.to_string(),
                "--ttl",
                &ttl.to_string(),
            ])
            .arg("--dir")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rampart fleet up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file: Value = serde_json::from_slice(&out.stdout).unwrap();
        let on_disk: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("fleet.json")).unwrap()).unwrap();
        assert_eq!(
            file, on_disk,
            "fleet up prints what it writes to fleet.json"
        );
        Fleet { dir, file }
    }

    fn gateway(&self) -> String {
        self.file["gateway"].as_str().unwrap().to_owned()
    }

    fn admin(&self) -> String {
        self.file["admin_key"].as_str().unwrap().to_owned()
    }

    fn node(&self, i: usize) -> (String, i32, String) {
        let n = &self.file["nodes"][i];
        (
            n["name"].as_str().unwrap().to_owned(),
            n["pid"].as_i64().unwrap() as i32,
            n["url"].as_str().unwrap().to_owned(),
        )
    }

    fn pids(&self) -> Vec<i32> {
        ["etcd", "nodes", "gateways"]
            .iter()
            .flat_map(|k| self.file[k].as_array().cloned().unwrap_or_default())
            .map(|p| p["pid"].as_i64().unwrap() as i32)
            .collect()
    }

    fn etcd(&self) -> String {
        self.file["etcd"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["endpoint"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Another gateway on the same fleet (with the same admin key), answering `/health`.
    fn second_gateway(&self) -> (std::process::Child, String) {
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let dir = self.dir.path();
        let child = Command::new(env!("CARGO_BIN_EXE_rampart"))
            .args(["gateway", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--fleet", &self.etcd(), "--name", "gateway-b", "--data-dir"])
            .arg(dir.join("gateway-b"))
            .arg("--admin-key-file")
            .arg(dir.join("gateway").join("admin-key"))
            .stdout(std::fs::File::create(dir.join("gateway-b.log")).unwrap())
            .stderr(std::fs::File::create(dir.join("gateway-b.err")).unwrap())
            .spawn()
            .unwrap();
        wait_until("the second gateway answers /health", 60, || {
            client()
                .get(format!("{url}/health"))
                .send()
                .is_ok_and(|r| r.status().is_success())
        });
        (child, url)
    }

    fn down(&self) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_rampart"))
            .args(["fleet", "down", "--dir"])
            .arg(self.dir.path())
            .output()
            .unwrap()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if self.dir.path().join("fleet.json").exists() {
            let _ = self.down();
        }
    }
}

/// `rampart ARGS` pointed at the gateway `g` with `key` (RAMPART_HOST, RAMPART_API_KEY): its
/// stdout; the test fails with its stderr if it fails.
fn cli_at(g: &str, key: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(args)
        .env("RAMPART_HOST", g)
        .env("RAMPART_API_KEY", key)
        .env_remove("RAMPART_SOCKET")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rampart {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kill -9` of a process this test's fleet started (by its pid).
fn kill9(pid: i32) -> bool {
    // SAFETY: kill(2) has no memory effects; the pid is one the fleet started.
    unsafe { libc::kill(pid, libc::SIGKILL) == 0 }
}

fn skip() -> Option<String> {
    if let Some(r) = skip_reason() {
        return Some(r);
    }
    let has_etcd = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("etcd").is_file()))
        .unwrap_or(false);
    (!has_etcd).then(|| "no etcd on the PATH (apt-get install etcd-server)".into())
}

/// A call with key `key`: status and JSON body.
fn call(method: &str, url: &str, key: &str, body: Option<Value>) -> (u16, Value) {
    let c = client();
    let mut r = c
        .request(method.parse().unwrap(), url)
        .header("Authorization", format!("Bearer {key}"));
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn create(g: &str, key: &str) -> (u16, Value) {
    call("POST", &format!("{g}/v1/sandboxes"), key, Some(json!({})))
}

fn exec(g: &str, key: &str, id: &str, script: &str) -> (u16, Value) {
    call(
        "POST",
        &format!("{g}/v1/sandboxes/{id}/exec"),
        key,
        Some(json!({"cmd": ["sh", "-c", script]})),
    )
}

#[test]
fn a_fleet_places_routes_and_keeps_tenants_apart() {
    if let Some(r) = skip() {
        eprintln!("skipped: {r}");
        return;
    }
    let f = Fleet::up(3, 10);
    let (g, admin) = (f.gateway(), f.admin());

    let (s, nodes) = call("GET", &format!("{g}/v1/nodes"), &admin, None);
    assert_eq!(s, 200, "{nodes}");
    let nodes = nodes["nodes"].as_array().unwrap().clone();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert!(nodes.iter().all(|n| n["state"] == "ready"), "{nodes:?}");

    // Placement spreads 9 creates over the 3 nodes.
    let mut ids = Vec::new();
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..9 {
        let (s, b) = create(&g, &admin);
        assert_eq!(s, 201, "{b}");
        *per_node
            .entry(b["node"].as_str().unwrap().to_owned())
            .or_default() += 1;
        ids.push((
            b["id"].as_str().unwrap().to_owned(),
            b["node"].as_str().unwrap().to_owned(),
        ));
    }
    assert_eq!(
        per_node.values().copied().collect::<Vec<_>>(),
        vec![3, 3, 3],
        "{per_node:?}"
    );

    // A drained node takes no new sandbox (the CLI against the gateway); undrained, it does.
    let rampart = |args: &[&str]| cli_at(&g, &admin, args);
    rampart(&["node", "drain", "node-2"]);
    let listed: Value = serde_json::from_str(&rampart(&["node", "ls", "--json"])).unwrap();
    let state_of = |v: &Value, n: &str| {
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == json!(n))
            .unwrap()["state"]
            .clone()
    };
    assert_eq!(state_of(&listed, "node-2"), "draining", "{listed}");
    let mut drained_ids = Vec::new();
    for _ in 0..3 {
        let (s, b) = create(&g, &admin);
        assert_eq!(s, 201, "{b}");
        assert_ne!(b["node"], "node-2", "placed on a drained node: {b}");
        drained_ids.push(b["id"].as_str().unwrap().to_owned());
    }
    rampart(&["node", "undrain", "node-2"]);
    let listed: Value = serde_json::from_str(&rampart(&["node", "ls", "--json"])).unwrap();
    assert_eq!(state_of(&listed, "node-2"), "ready", "{listed}");
    for id in drained_ids {
        let (s, b) = call("DELETE", &format!("{g}/v1/sandboxes/{id}"), &admin, None);
        assert!(s == 200 || s == 204, "{s} {b}");
    }

    // Exec and files reach every sandbox through the gateway, on the node the catalog says.
    for (id, node) in &ids {
        let (s, b) = exec(&g, &admin, id, "hostname");
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["stdout"].as_str().unwrap().trim(), id);
        let (s, info) = call("GET", &format!("{g}/v1/sandboxes/{id}"), &admin, None);
        assert_eq!(s, 200, "{info}");
        assert_eq!(info["node"], json!(node));
    }
    let (id0, _) = &ids[0];
    let c = client();
    let put = c
        .put(format!(
            "{g}/v1/sandboxes/{id0}/files?path=/tmp/through-the-gateway"
        ))
        .header("Authorization", format!("Bearer {admin}"))
        .body("fleet")
        .send()
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().unwrap());
    let (_, b) = exec(&g, &admin, id0, "cat /tmp/through-the-gateway");
    assert_eq!(b["stdout"], "fleet");

    // A server inside a sandbox, through the gateway's port proxy (path form), with the
    // sandbox's own token; without it, refused.
    {
        let (id, _) = &ids[3];
        let (_, b) = exec(
            &g,
            &admin,
            id,
            "mkdir -p /home/user/www && echo served-through-the-fleet > /home/user/www/i.txt && \
             (nohup python3 -m http.server 8000 --directory /home/user/www >/dev/null 2>&1 &)",
        );
        assert_eq!(b["exit_code"], 0, "{b}");
        let (_, info) = call("GET", &format!("{g}/v1/sandboxes/{id}"), &admin, None);
        let token = info["access_token"]
            .as_str()
            .expect("an access token")
            .to_owned();
        let plain = reqwest::blocking::Client::new();
        wait_until(
            "the sandbox's server answers through the gateway",
            60,
            || {
                plain
                    .get(format!("{g}/v1/sandboxes/{id}/ports/8000/i.txt"))
                    .header("x-rampart-token", &token)
                    .send()
                    .is_ok_and(|r| r.status().is_success())
            },
        );
        let body = plain
            .get(format!("{g}/v1/sandboxes/{id}/ports/8000/i.txt"))
            .header("x-rampart-token", &token)
            .send()
            .unwrap()
            .text()
            .unwrap();
        assert_eq!(body, "served-through-the-fleet\n");
        let refused = plain
            .get(format!("{g}/v1/sandboxes/{id}/ports/8000/i.txt"))
            .send()
            .unwrap();
        assert!(refused.status().is_client_error(), "{}", refused.status());
    }

    // A snapshot is kept on its sandbox's node: creates from it go there, and its listing
    // says where.
    {
        let (id, node) = &ids[2];
        let (_, b) = exec(&g, &admin, id, "echo kept > /home/user/kept.txt");
        assert_eq!(b["exit_code"], 0, "{b}");
        let (s, b) = call(
            "POST",
            &format!("{g}/v1/sandboxes/{id}/snapshots"),
            &admin,
            Some(json!({"name": "fleet-snap"})),
        );
        assert_eq!(s, 201, "{b}");
        for _ in 0..3 {
            let (s, b) = call(
                "POST",
                &format!("{g}/v1/sandboxes"),
                &admin,
                Some(json!({"snapshot": "fleet-snap"})),
            );
            assert_eq!(s, 201, "{b}");
            assert_eq!(b["node"], json!(node), "{b}");
            let child = b["id"].as_str().unwrap().to_owned();
            let (_, out) = exec(&g, &admin, &child, "cat /home/user/kept.txt");
            assert_eq!(out["stdout"], "kept\n", "{out}");
            call("DELETE", &format!("{g}/v1/sandboxes/{child}"), &admin, None);
        }
        let (s, list) = call("GET", &format!("{g}/v1/snapshots"), &admin, None);
        assert_eq!(s, 200, "{list}");
        assert!(
            list.as_array()
                .unwrap()
                .iter()
                .any(|x| x["name"] == "fleet-snap" && x["node"] == json!(node)),
            "{list}"
        );
        let (s, b) = call(
            "DELETE",
            &format!("{g}/v1/snapshots/fleet-snap"),
            &admin,
            None,
        );
        assert!(s == 200 || s == 204, "{s} {b}");
        let (s, _) = call("GET", &format!("{g}/v1/snapshots/fleet-snap"), &admin, None);
        assert_eq!(s, 404);
    }

    // The record: a bundle fetched through the gateway names its node in `created` and
    // verifies with the fleet's key set (the key of the node that signed it), not with a set
    // of the other nodes' keys.
    {
        let (id, node) = &ids[1];
        let bundle = client()
            .get(format!("{g}/v1/sandboxes/{id}/audit/bundle"))
            .header("Authorization", format!("Bearer {admin}"))
            .send()
            .unwrap();
        assert!(bundle.status().is_success());
        let bundle = bundle.bytes().unwrap();
        assert!(
            String::from_utf8_lossy(&bundle).contains(&format!("\"node\":\"{node}\"")),
            "the record names its node"
        );
        let (s, set) = call("GET", &format!("{g}/v1/audit/keys"), &admin, None);
        assert_eq!(s, 200, "{set}");
        assert_eq!(set["keys"].as_array().map(Vec::len), Some(3), "{set}");
        let files = f.dir.path();
        std::fs::write(files.join("bundle.json"), &bundle).unwrap();
        std::fs::write(files.join("keys.json"), set.to_string()).unwrap();
        let verify = |keys: &str| {
            Command::new(env!("CARGO_BIN_EXE_rampart"))
                .args(["audit", "verify"])
                .arg(files.join("bundle.json"))
                .arg("--key-set")
                .arg(files.join(keys))
                .output()
                .unwrap()
        };
        let out = verify("keys.json");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains(&format!("signed by node {node}")), "{said}");
        let others: Vec<Value> = set["keys"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["node"] != json!(node))
            .cloned()
            .collect();
        std::fs::write(
            files.join("others.json"),
            json!({"keys": others}).to_string(),
        )
        .unwrap();
        let out = verify("others.json");
        assert!(
            !out.status.success(),
            "verified without the signing node's key"
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("FAILED"));
    }

    // A WebSocket through the gateway: the exec stream, the key offered as a subprotocol (as
    // the console sends it), never passed on or echoed.
    {
        use tokio_tungstenite::tungstenite;
        use tungstenite::client::IntoClientRequest as _;
        let ws_url = format!(
            "{}/v1/sandboxes/{id0}/exec/ws",
            g.replacen("http://", "ws://", 1)
        );
        let mut req = ws_url.as_str().into_client_request().unwrap();
        req.headers_mut().insert(
            "sec-websocket-protocol",
            format!("rampart.v1, rampart.key.{admin}").parse().unwrap(),
        );
        let (mut ws, resp) = tungstenite::connect(req).expect("a WebSocket through the gateway");
        assert_eq!(resp.headers()["sec-websocket-protocol"], "rampart.v1");
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
        // "over-ws\n", base64 as the stream carries output.
        assert!(out.contains("b3Zlci13cwo="), "{out}");
    }

    // A node answers only the fleet's gateways over TCP: not the gateway's admin key, not a
    // forged principal header without the fleet's token.
    let (_, _, url0) = f.node(0);
    let (s, b) = call("GET", &format!("{url0}/v1/sandboxes"), &admin, None);
    assert_eq!(s, 401, "{b}");
    assert!(b.to_string().contains("fleet"), "{b}");
    let forged = c
        .get(format!("{url0}/v1/sandboxes"))
        .header("Authorization", format!("Bearer {admin}"))
        .header("x-rampart-gateway-principal", "e30")
        .send()
        .unwrap();
    assert_eq!(forged.status().as_u16(), 401);

    // Tenants: made through the gateway, kept in etcd, their quota counted over every node;
    // over the HTTP API and with the CLI pointed at the gateway (RAMPART_HOST).
    let (s, b) = call(
        "POST",
        &format!("{g}/v1/tenants"),
        &admin,
        Some(json!({"name": "acme", "quotas": {"max_sandboxes": 2}})),
    );
    assert_eq!(s, 201, "{b}");
    rampart(&["tenant", "create", "globex", "--max-sandboxes", "5"]);
    let shown: Value =
        serde_json::from_str(&rampart(&["tenant", "show", "globex", "--json"])).unwrap();
    let shown = if shown.is_array() {
        shown[0].clone()
    } else {
        shown
    };
    assert_eq!(shown["quotas"]["max_sandboxes"], 5, "{shown}");
    let key_of = |tenant: &str| {
        let made: Value =
            serde_json::from_str(&rampart(&["keys", "create", "--tenant", tenant, "--json"]))
                .unwrap();
        assert_eq!(made["kind"], "native", "{made}");
        made["key"].as_str().unwrap().to_owned()
    };
    let (acme, globex) = (key_of("acme"), key_of("globex"));
    let keys: Value =
        serde_json::from_str(&rampart(&["keys", "ls", "--json", "--tenant", "acme"])).unwrap();
    assert_eq!(keys.as_array().map(Vec::len), Some(1), "{keys}");
    let mut acme_nodes = std::collections::BTreeSet::new();
    let mut acme_ids = Vec::new();
    for _ in 0..2 {
        let (s, b) = create(&g, &acme);
        assert_eq!(s, 201, "{b}");
        acme_nodes.insert(b["node"].as_str().unwrap().to_owned());
        acme_ids.push(b["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        acme_nodes.len(),
        2,
        "two creates on two nodes: {acme_nodes:?}"
    );
    let (s, b) = create(&g, &acme);
    assert_eq!(s, 429, "{b}");
    assert!(b.to_string().contains("across the fleet"), "{b}");
    // A fork counts too: the tenant is at its quota, so a fork of one is refused before it
    // is made; the admin's fork of two is, and both forks are in the catalog on the source's
    // node.
    let (s, b) = call(
        "POST",
        &format!("{g}/v1/sandboxes/{}/fork", acme_ids[0]),
        &acme,
        Some(json!({"count": 1})),
    );
    assert_eq!(s, 429, "{b}");
    assert!(b.to_string().contains("the fork asks for 1 more"), "{b}");
    let (s, b) = call(
        "POST",
        &format!("{g}/v1/sandboxes/{}/fork", ids[0].0),
        &admin,
        Some(json!({"count": 2})),
    );
    assert!(s == 200 || s == 201, "{s} {b}");
    let mut forked = Vec::new();
    for sb in b["sandboxes"].as_array().expect("the forks") {
        let fid = sb["id"].as_str().unwrap().to_owned();
        let (s, info) = call("GET", &format!("{g}/v1/sandboxes/{fid}"), &admin, None);
        assert_eq!((s, &info["node"]), (200, &json!(ids[0].1)), "{info}");
        forked.push(fid);
    }
    assert_eq!(forked.len(), 2, "{b}");
    for fid in forked {
        call("DELETE", &format!("{g}/v1/sandboxes/{fid}"), &admin, None);
    }
    let (s, b) = call(
        "GET",
        &format!("{g}/v1/sandboxes/{}", acme_ids[0]),
        &globex,
        None,
    );
    assert_eq!(s, 404, "{b}");
    let (s, b) = exec(&g, &globex, &acme_ids[0], "true");
    assert_eq!(s, 404, "{b}");
    let (s, b) = call("GET", &format!("{g}/v1/sandboxes"), &globex, None);
    assert_eq!((s, b.as_array().map(Vec::len)), (200, Some(0)), "{b}");
    let (s, b) = call("GET", &format!("{g}/v1/sandboxes"), &acme, None);
    assert_eq!(s, 200);
    let mut listed: Vec<String> = b
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    let mut want = acme_ids.clone();
    want.sort();
    assert_eq!(listed, want);
    let (s, b) = call("GET", &format!("{g}/v1/nodes"), &acme, None);
    assert_eq!(s, 403, "{b}");

    // Usage over the fleet: each node's signed report for the tenant, each verifying with
    // that node's key from the fleet's key set.
    {
        let v: Value = serde_json::from_str(&cli_at(&g, &acme, &["usage", "--json"])).unwrap();
        let nodes = v["nodes"].as_array().expect("one report per node");
        assert_eq!(nodes.len(), 3, "{v}");
        let (_, set) = call("GET", &format!("{g}/v1/audit/keys"), &admin, None);
        let mut counted = 0;
        for n in nodes {
            assert_eq!(n["report"]["tenant"], "acme", "{n}");
            counted += n["report"]["sandboxes"].as_array().unwrap().len();
            let key = set["keys"]
                .as_array()
                .unwrap()
                .iter()
                .find(|k| k["node"] == n["node"])
                .unwrap()["public_key"]
                .as_str()
                .unwrap()
                .to_owned();
            let file = f.dir.path().join("usage.json");
            std::fs::write(&file, n["report"].to_string()).unwrap();
            let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
                .args(["usage", "verify"])
                .arg(&file)
                .args(["--key", &key])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        assert!(counted >= 2, "acme's sandboxes are in the reports: {v}");
    }

    // The gateway's metrics: the node's admin only; requests by route, etcd's time.
    let metrics = client()
        .get(format!("{g}/metrics"))
        .header("Authorization", format!("Bearer {admin}"))
        .send()
        .unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    let text = metrics.text().unwrap();
    for want in [
        "rampart_gateway_requests_total{route=\"create\",status=\"2xx\"}",
        "rampart_gateway_etcd_seconds_count{op=\"record\"}",
        "rampart_gateway_nodes{state=\"ready\"} 3",
    ] {
        assert!(text.contains(want), "{want} not in:\n{text}");
    }
    let (s, _) = call("GET", &format!("{g}/metrics"), &acme, None);
    assert_eq!(s, 403);

    // A second gateway on the same fleet answers alike.
    let (mut second, g2) = f.second_gateway();
    let ids_of = |gw: &str, key: &str| {
        let (s, b) = call("GET", &format!("{gw}/v1/sandboxes"), key, None);
        assert_eq!(s, 200, "{b}");
        let mut v: Vec<(String, String)> = b
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["id"].as_str().unwrap().to_owned(),
                    s["node"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids_of(&g, &admin), ids_of(&g2, &admin));
    assert_eq!(ids_of(&g2, &acme).len(), 2);
    let (s, b) = exec(&g2, &acme, &acme_ids[1], "echo via-b");
    assert_eq!((s, b["stdout"].as_str()), (200, Some("via-b\n")), "{b}");

    // A destroy through one gateway: gone for both, and room again in the tenant's quota.
    let (s, b) = call(
        "DELETE",
        &format!("{g2}/v1/sandboxes/{}", acme_ids[1]),
        &acme,
        None,
    );
    assert!(s == 200 || s == 204, "{s} {b}");
    wait_until(
        "the first gateway no longer knows the destroyed sandbox",
        30,
        || {
            call(
                "GET",
                &format!("{g}/v1/sandboxes/{}", acme_ids[1]),
                &acme,
                None,
            )
            .0 == 404
        },
    );
    let (s, b) = create(&g, &acme);
    assert_eq!(s, 201, "{b}");
    let _ = second.kill();
    let _ = second.wait();

    // Each node has an address of its own, in a network namespace of its own.
    let netns: Vec<String> = f.file["network"]["netns"]
        .as_array()
        .expect("fleet up made a network")
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(netns.len(), 3);
    let hosts: std::collections::BTreeSet<String> = (0..3)
        .map(|i| {
            f.node(i)
                .2
                .split("//")
                .nth(1)
                .unwrap()
                .split(':')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(hosts.len(), 3, "{hosts:?}");

    // Down: every process it started is gone, and its network.
    let pids = f.pids();
    let out = f.down();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for pid in pids {
        assert!(
            !process_alive(pid),
            "pid {pid} of the fleet still runs after down"
        );
    }
    for ns in &netns {
        assert!(!Path::new("/run/netns").join(ns).exists(), "{ns} is left");
    }
    let bridge = f.file["network"]["bridge"].as_str().unwrap();
    assert!(
        !Path::new("/sys/class/net").join(bridge).exists(),
        "{bridge} is left"
    );
}

/// The command line and environment of a running process, to start it again the same way.
fn command_of(pid: i32) -> Command {
    let args: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let env: Vec<(String, String)> = std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap()
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv).into_owned();
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect();
    let mut c = Command::new(&args[0]);
    c.args(&args[1..]).env_clear().envs(env);
    c
}

#[test]
fn a_killed_node_is_lost_then_comes_back() {
    if let Some(r) = skip() {
        eprintln!("skipped: {r}");
        return;
    }
    let mut f = Fleet::up(2, 3);
    let (g, admin) = (f.gateway(), f.admin());
    let mut on: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for _ in 0..4 {
        let (s, b) = create(&g, &admin);
        assert_eq!(s, 201, "{b}");
        on.entry(b["node"].as_str().unwrap().to_owned())
            .or_default()
            .push(b["id"].as_str().unwrap().to_owned());
    }
    let (name, pid, _) = f.node(0);
    let victims = on.get(&name).cloned().unwrap_or_default();
    assert_eq!(victims.len(), 2, "{on:?}");
    // Started again as `fleet up` started it: in its network namespace.
    let again_args = command_of(pid);
    let mut again = match f.file["network"]["netns"][0].as_str() {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{ns}"))
                .arg("--")
                .arg(again_args.get_program())
                .args(again_args.get_args())
                .env_clear()
                .envs(again_args.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))));
            c
        }
        None => again_args,
    };
    assert!(kill9(pid));
    wait_until("the node is reported lost", 60, || {
        let (_, b) = call("GET", &format!("{g}/v1/nodes"), &admin, None);
        b["nodes"].as_array().is_some_and(|ns| {
            ns.iter()
                .any(|n| n["name"] == json!(name) && n["state"] == "lost")
        })
    });
    for id in &victims {
        let (s, b) = call("GET", &format!("{g}/v1/sandboxes/{id}"), &admin, None);
        assert_eq!((s, b["state"].as_str()), (200, Some("lost")), "{b}");
        assert_eq!(b["node"], json!(name));
        let (s, b) = exec(&g, &admin, id, "true");
        assert_eq!(s, 503, "{b}");
        assert_eq!(b["error"]["code"], "node_lost", "{b}");
    }
    let (_, list) = call("GET", &format!("{g}/v1/sandboxes"), &admin, None);
    let lost = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "lost")
        .count();
    assert_eq!(lost, 2, "{list}");
    for _ in 0..2 {
        let (s, b) = create(&g, &admin);
        assert_eq!(s, 201, "{b}");
        assert_ne!(
            b["node"],
            json!(name),
            "a create went to the lost node: {b}"
        );
    }

    // The node comes back on its data: its sandboxes are found again and served.
    let log = f.dir.path().join(format!("{name}.again.log"));
    let child = {
        use std::os::unix::process::CommandExt as _;
        again
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let new_pid = child.id() as i32;
    f.file["nodes"][0]["pid"] = json!(new_pid);
    std::fs::write(
        f.dir.path().join("fleet.json"),
        serde_json::to_vec(&f.file).unwrap(),
    )
    .unwrap();
    for id in &victims {
        wait_until("the node's sandbox is served again", 120, || {
            let (s, b) = call("GET", &format!("{g}/v1/sandboxes/{id}"), &admin, None);
            s == 200 && b["state"] == "running"
        });
        let (s, b) = exec(&g, &admin, id, "echo back");
        assert_eq!((s, b["stdout"].as_str()), (200, Some("back\n")), "{b}");
    }

    // A node that stops answering etcd past its lease (stopped, not killed) is lost, and
    // joins again by itself when it runs again: its sandboxes are served again.
    let (other, other_pid, _) = f.node(1);
    let theirs = on.get(&other).cloned().unwrap_or_default();
    // SAFETY: kill(2) on the pid of a node this test's fleet started.
    assert_eq!(unsafe { libc::kill(other_pid, libc::SIGSTOP) }, 0);
    let lost = |n: &str| {
        let (_, b) = call("GET", &format!("{g}/v1/nodes"), &admin, None);
        b["nodes"].as_array().is_some_and(|ns| {
            ns.iter()
                .any(|x| x["name"] == json!(n) && x["state"] == "lost")
        })
    };
    wait_until("the stopped node is reported lost", 60, || lost(&other));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(other_pid, libc::SIGCONT) }, 0);
    wait_until("the node joined again", 60, || !lost(&other));
    for id in &theirs {
        let (s, b) = exec(&g, &admin, id, "echo rejoined");
        assert_eq!((s, b["stdout"].as_str()), (200, Some("rejoined\n")), "{b}");
    }

    // A second daemon under a live node's name, at another address, is refused at start.
    let port = free_port();
    let data = f.dir.path().join("impostor");
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(&data)
        .args(["--fleet", &f.etcd(), "--node-name", &other])
        .args(["--advertise", &format!("http://127.0.0.1:{port}")])
        .env_remove("RAMPART_SOCKET")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second {other} started");
    assert!(said.contains("already in the fleet"), "{said}");
}

#[test]
fn the_e2b_sdk_works_through_the_gateway() {
    if let Some(r) = skip() {
        eprintln!("skipped: {r}");
        return;
    }
    let python = venv_python("RAMPART_E2B_VENV", "e2b-venv");
    if let Some(r) = venv_lacks(&python, "e2b, httpx", "scripts/e2b-sdks.sh makes it") {
        eprintln!("skipped: {r}");
        return;
    }
    let f = Fleet::up(2, 10);
    let (g, admin) = (f.gateway(), f.admin());
    let mut keys = Vec::new();
    for t in ["acme", "other"] {
        let (s, b) = call(
            "POST",
            &format!("{g}/v1/tenants"),
            &admin,
            Some(json!({"name": t})),
        );
        assert_eq!(s, 201, "{b}");
        let (s, b) = call(
            "POST",
            &format!("{g}/v1/keys"),
            &admin,
            Some(json!({"name": format!("{t}-e2b"), "tenant": t, "kind": "e2b"})),
        );
        assert_eq!(s, 201, "{b}");
        let key = b["key"].as_str().unwrap().to_owned();
        assert!(key.starts_with("e2b_"), "{key}");
        keys.push(key);
    }
    // An E2B key is for the E2B API only.
    let (s, b) = call("GET", &format!("{g}/v1/sandboxes"), &keys[0], None);
    assert_eq!(s, 403, "{b}");
    let dir = workspace().join("tests/e2b");
    let report = run_sdk_script(
        &python,
        &dir.join("fleet.py"),
        &dir,
        &[
            ("E2B_API_KEY", &keys[0]),
            ("E2B_API_URL", &g),
            ("E2B_SANDBOX_URL", &g),
            ("FLEET_ADMIN", &admin),
            ("FLEET_NODES", "2"),
            ("FLEET_OTHER_E2B_KEY", &keys[1]),
        ],
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.passed.len(), 4, "{:?}", report.passed);
}

/// The pid and name of the etcd member that leads now (`etcdctl endpoint status`).
fn etcd_leader(f: &Fleet) -> (i32, String) {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["endpoint", "status", "-w", "json", "--endpoints", &f.etcd()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    let leader = all
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["Status"]["header"]["member_id"] == e["Status"]["leader"])
        .expect("a leader");
    let endpoint = leader["Endpoint"].as_str().unwrap();
    let member = f.file["etcd"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["endpoint"] == json!(endpoint))
        .unwrap();
    (
        member["pid"].as_i64().unwrap() as i32,
        member["name"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn losing_the_etcd_leader_or_a_gateway_loses_no_create() {
    if let Some(r) = skip() {
        eprintln!("skipped: {r}");
        return;
    }
    if Command::new("etcdctl").arg("version").output().is_err() {
        eprintln!("skipped: no etcdctl (apt-get install etcd-client)");
        return;
    }
    let f = Fleet::up(2, 10);
    let (g, admin) = (f.gateway(), f.admin());
    // A second gateway, to go on when the first is killed.
    let (mut second, g2) = f.second_gateway();
    let mut acknowledged = Vec::new();
    let mut create_and_run = |gw: &str, i: usize| {
        let (s, b) = create(gw, &admin);
        assert_eq!(s, 201, "create {i} through {gw}: {b}");
        let id = b["id"].as_str().unwrap().to_owned();
        let (s, out) = exec(gw, &admin, &id, "echo $((40+2))");
        assert_eq!(
            (s, out["stdout"].as_str()),
            (200, Some("42\n")),
            "exec {i}: {out}"
        );
        acknowledged.push(id);
    };
    for i in 0..5 {
        create_and_run(&g, i);
    }
    let (leader, name) = etcd_leader(&f);
    assert!(kill9(leader), "kill {name}");
    for i in 5..15 {
        create_and_run(&g, i);
    }
    let gw_pid = f.file["gateways"][0]["pid"].as_i64().unwrap() as i32;
    assert!(kill9(gw_pid));
    for i in 15..20 {
        create_and_run(&g2, i);
    }
    // Everything acknowledged is usable through the gateway that is left.
    let (s, list) = call("GET", &format!("{g2}/v1/sandboxes"), &admin, None);
    assert_eq!(s, 200, "{list}");
    let listed: std::collections::BTreeSet<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "running")
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    for id in &acknowledged {
        assert!(
            listed.contains(id.as_str()),
            "{id} is not listed running: {list}"
        );
    }
    let (s, b) = exec(&g2, &admin, &acknowledged[0], "true");
    assert_eq!(s, 200, "{b}");

    // Without etcd at all, a create is refused with the reason and leaves nothing behind.
    for e in f.file["etcd"].as_array().unwrap() {
        let pid = e["pid"].as_i64().unwrap() as i32;
        if process_alive(pid) {
            kill9(pid);
        }
    }
    let (s, b) = create(&g2, &admin);
    assert_eq!(s, 503, "{b}");
    assert!(b.to_string().contains("etcd"), "{b}");
    let node_socks: Vec<PathBuf> = (0..2)
        .map(|i| f.dir.path().join(f.node(i).0).join("rampart.sock"))
        .collect();
    let alive: usize = node_socks
        .iter()
        .map(|sock| {
            let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
                .arg("--socket")
                .arg(sock)
                .args(["ls", "--json"])
                .output()
                .unwrap();
            serde_json::from_slice::<Vec<Value>>(&out.stdout)
                .map(|v| v.len())
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(
        alive,
        acknowledged.len(),
        "the refused create left a sandbox behind"
    );
    let _ = second.kill();
    let _ = second.wait();
}
