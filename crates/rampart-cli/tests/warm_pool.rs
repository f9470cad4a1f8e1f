//! Warm pools (issue 30), from where users and operators stand: a daemon started with
//! `--warm base=2` (or `[warm]` in its config file), tenants with native keys made as
//! operators make them.
//!
//! - `a_create_claims_a_warm_sandbox_for_its_tenant_only`: a tenant's create is served by a
//!   pooled sandbox, which becomes its own (labels, deadline, record with `"pool": true` and
//!   the tenant's caller); another tenant cannot see it; pooled sandboxes are listed for
//!   nobody and the pools are the node's (403 for a tenant); a claim over the tenant's quota
//!   is refused and leaves the pooled sandbox in its pool; a create the pool cannot serve
//!   (an environment) is launched cold; the pool refills; `/metrics` counts the hit.
//! - `a_crashed_daemon_leaves_no_warm_sandbox_behind`: `kill -9` of the daemon, a start on
//!   the same data: the old pooled sandboxes have no process left and are recorded ended,
//!   the new pools are filled with new ones; a SIGTERM destroys those.
//! - `an_e2b_create_claims_a_networked_warm_sandbox`: with `--warm base@open=2` and sandbox
//!   networks, the E2B API's default create (internet on) is served by a pooled sandbox
//!   wired with the open policy; its network and its record carry the create's words for
//!   it; a native create with `{"network": {"mode": "open"}}` is served from the same pool,
//!   and one without a network is not.
//! - `a_create_at_capacity_takes_a_warm_sandboxs_place`: with `max_sandboxes = 2` and a
//!   pool of 2, a create no pool serves makes a pooled sandbox give up its place; the pool
//!   does not take it back while the node is full.
//! - `a_template_built_again_drains_its_pool`: a pool of a built template; the template is
//!   built again through the API: the pooled sandbox of the old build ends, the pool refills
//!   from the new build, and a create gets the new build's files.
//! - `a_pool_beyond_capacity_is_refused_at_start`: `[warm]` larger than `max_sandboxes`
//!   stops `serve` at start with the reason, and `--warm` with a bad value too.
//!
//! Needs root, the jailer and the agent; otherwise it prints `skipped: <reason>`.

mod support;

use reqwest::Method;
use serde_json::json;
use std::collections::BTreeSet;
use std::process::Command;
use support::{make_key, native_call as native, start_tidy_with, wait_until, Tidy};

/// The ids of the sandboxes ready in the daemon's pools.
fn pooled(d: &Tidy) -> BTreeSet<String> {
    let a = native(&d.url, support::admin_key(), Method::GET, "/v1/pools", None);
    assert_eq!(a.status, 200, "GET /v1/pools: {:?}", a.body);
    a.body
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["ids"].as_array().unwrap().clone())
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// Waits until the pools hold `n` ready sandboxes, and returns their ids.
fn filled(d: &Tidy, n: usize) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    wait_until(&format!("{n} warm sandboxes"), 120, || {
        ids = pooled(d);
        ids.len() == n
    });
    ids
}

/// Pids of the processes whose cgroup is sandbox `id`'s (its own directory, in any
/// hierarchy, v1 or v2).
fn processes_of(id: &str) -> Vec<i32> {
    let needle = format!("/{id}");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cg = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        if cg
            .lines()
            .any(|l| l.ends_with(&needle) || l.contains(&format!("{needle}/")))
        {
            out.push(pid);
        }
    }
    out
}

#[test]
fn a_create_claims_a_warm_sandbox_for_its_tenant_only() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = start_tidy_with("pool-claim", &[("RAMPART_WARM", "base=2")]);
    support::make_tenants(&d.url, &["acme", "rival"]);
    let q = native(
        &d.url,
        support::admin_key(),
        Method::PUT,
        "/v1/tenants/acme/quotas",
        Some(json!({"max_sandboxes": 1})),
    );
    assert_eq!(q.status, 200, "set acme's quota: {:?}", q.body);
    let (a, b) = (
        make_key(&d.data, &["--tenant", "acme"]),
        make_key(&d.data, &["--tenant", "rival"]),
    );
    let warm = filled(&d, 2);
    // Nobody's: not listed, the pools are the node's.
    let listed = native(
        &d.url,
        support::admin_key(),
        Method::GET,
        "/v1/sandboxes",
        None,
    );
    assert_eq!(listed.body, json!([]), "pooled sandboxes are listed");
    let p = native(&d.url, &a, Method::GET, "/v1/pools", None);
    assert_eq!(p.status, 403, "a tenant sees the pools: {:?}", p.body);
    // Nobody's, the node administrator's neither: no verb reaches one before its claim.
    let one = warm.iter().next().unwrap();
    for (method, path) in [
        (Method::GET, format!("/v1/sandboxes/{one}")),
        (Method::POST, format!("/v1/sandboxes/{one}/exec")),
        (Method::DELETE, format!("/v1/sandboxes/{one}")),
    ] {
        let r = native(
            &d.url,
            support::admin_key(),
            method.clone(),
            &path,
            Some(json!({"cmd": ["true"]})),
        );
        assert_eq!(r.status, 404, "{method} {path}: {:?}", r.body);
    }
    assert_eq!(pooled(&d), warm);

    // A tenant's create: a claim.
    let c = native(
        &d.url,
        &a,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"metadata": {"job": "7"}, "timeout_secs": 60})),
    );
    assert_eq!(c.status, 201, "acme's create: {:?}", c.body);
    let id = c.body["id"].as_str().unwrap().to_owned();
    assert!(
        warm.contains(&id),
        "{id} did not come from the pool {warm:?}"
    );
    assert_eq!(c.body["tenant"], "acme");
    assert_eq!(c.body["metadata"], json!({"job": "7"}));
    let created = c.body["created_at"].as_str().unwrap();
    let expires = c.body["expires_at"].as_str().unwrap();
    assert_ne!(created, expires);
    let x = native(
        &d.url,
        &a,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": ["sh", "-c", "hostname; echo ok > /tmp/f; cat /tmp/f"]})),
    );
    assert_eq!(x.status, 200, "exec: {:?}", x.body);
    assert_eq!(x.body["stdout"], format!("{id}\nok\n"));
    // Its record starts at the claim, for acme's caller, and says where it came from.
    let rec = native(
        &d.url,
        &a,
        Method::GET,
        &format!("/v1/sandboxes/{id}/audit"),
        None,
    );
    assert_eq!(rec.status, 200, "record: {:?}", rec.body);
    let first = &rec.body["events"][0];
    assert_eq!(first["seq"], 0);
    assert_eq!(first["body"]["type"], "created");
    assert_eq!(first["body"]["spec"]["pool"], true);
    assert_eq!(first["body"]["spec"]["metadata"], json!({"job": "7"}));
    let caller = first["auth"]["principal"].as_str().unwrap();
    assert!(caller.contains("tenant acme"), "record's caller: {caller}");

    // Another tenant: not found, not listed.
    let other = native(
        &d.url,
        &b,
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        None,
    );
    assert_eq!(other.status, 404, "rival sees acme's: {:?}", other.body);
    let theirs = native(&d.url, &b, Method::GET, "/v1/sandboxes", None);
    assert_eq!(theirs.body, json!([]));
    let mine = native(&d.url, &a, Method::GET, "/v1/sandboxes", None);
    assert_eq!(mine.body.as_array().unwrap().len(), 1);

    // Over acme's quota: refused, and the pooled sandbox stays in its pool.
    let before = filled(&d, 2);
    let over = native(&d.url, &a, Method::POST, "/v1/sandboxes", Some(json!({})));
    assert!(
        over.status == 429 || over.status == 403,
        "acme's second create: {} {:?}",
        over.status,
        over.body
    );
    assert!(
        over.body.to_string().contains("max_sandboxes"),
        "the refusal names the quota: {:?}",
        over.body
    );
    assert_eq!(pooled(&d), before, "a refused claim changed the pool");

    // What a pool cannot serve (an environment is fixed at launch) is launched cold.
    let cold = native(
        &d.url,
        &b,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"env": {"GREETING": "hi"}})),
    );
    assert_eq!(cold.status, 201, "rival's create: {:?}", cold.body);
    let cold_id = cold.body["id"].as_str().unwrap();
    assert!(
        !before.contains(cold_id),
        "a create with env was served warm"
    );
    let x = native(
        &d.url,
        &b,
        Method::POST,
        &format!("/v1/sandboxes/{cold_id}/exec"),
        Some(json!({"cmd": ["sh", "-c", "echo $GREETING"]})),
    );
    assert_eq!(x.body["stdout"], "hi\n");
    assert_eq!(pooled(&d), before);

    // The admin's view counts the hit.
    let m = support::client()
        .get(format!("{}/metrics", d.url))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        m.lines().any(
            |l| l.starts_with("rampart_pool_claims_total{result=\"hit\"} ") && !l.ends_with(" 0")
        ),
        "no hit in /metrics"
    );
    assert!(m.contains("rampart_pool_ready{isolation=\"namespace\",template=\"base\"} 2"));
}

#[test]
fn a_crashed_daemon_leaves_no_warm_sandbox_behind() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let envs = [("RAMPART_WARM", "base=2")];
    let mut d = start_tidy_with("pool-crash", &envs);
    let old = filled(&d, 2);
    for id in &old {
        assert!(!processes_of(id).is_empty(), "{id} runs nothing");
    }
    // A crash: kill -9 of the daemon this test started, by its pid.
    d.daemon.child.kill().unwrap();
    d.daemon.child.wait().unwrap();
    let port: u16 = d.url.rsplit(':').next().unwrap().parse().unwrap();
    let again = support::start(&d.data, port, &envs);
    // The stopped value must not drop now: its Drop would unmount the new daemon's store.
    std::mem::forget(std::mem::replace(&mut d.daemon, again));
    let new = filled(&d, 2);
    assert!(
        old.is_disjoint(&new),
        "old warm sandboxes were pooled again"
    );
    for id in &old {
        assert_eq!(processes_of(id), Vec::<i32>::new(), "{id} left processes");
        let a = native(
            &d.url,
            support::admin_key(),
            Method::GET,
            &format!("/v1/sandboxes/{id}"),
            None,
        );
        assert_eq!(a.body["state"], "destroyed", "{id}: {:?}", a.body);
    }
    // A stop as operators stop it: the pools end with the daemon.
    d.daemon.stop();
    for id in &new {
        assert_eq!(
            processes_of(id),
            Vec::<i32>::new(),
            "{id} outlived its daemon"
        );
    }
}

#[test]
fn an_e2b_create_claims_a_networked_warm_sandbox() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let t = (std::process::id().wrapping_mul(13) + 7) % 250;
    let table = format!("rampart_pool_{}", std::process::id());
    let _table = support::TableGuard(table.clone());
    let pool = format!("10.251.{t}.0/24");
    let prefix = format!("rp{t}w");
    let d = start_tidy_with(
        "pool-net",
        &[
            ("RAMPART_WARM", "base@open=2"),
            ("RAMPART_NET_POOL", pool.as_str()),
            ("RAMPART_NET_LINK_PREFIX", prefix.as_str()),
            ("RAMPART_NET_TABLE", table.as_str()),
            ("RAMPART_NET_DNS_PORT", "0"),
            ("RAMPART_NET_PROXY_PORT", "0"),
        ],
    );
    let warm = filled(&d, 2);
    let p = native(&d.url, support::admin_key(), Method::GET, "/v1/pools", None);
    assert_eq!(p.body[0]["network"], "open", "{:?}", p.body);
    let key = std::fs::read_to_string(d.data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();
    let c = support::e2b_call(
        &d.url,
        &key,
        Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base", "timeout": 120})),
    );
    assert_eq!(c.status, 201, "E2B create: {:?}", c.body);
    let id = c.body["sandboxID"].as_str().unwrap().to_owned();
    assert!(
        warm.contains(&id),
        "{id} did not come from the pool {warm:?}"
    );
    assert!(c.body["envdAccessToken"]
        .as_str()
        .is_some_and(|t| !t.is_empty()));
    // Wired: an interface beside loopback and the node's resolver.
    let x = native(
        &d.url,
        support::admin_key(),
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": ["sh", "-c", "grep -c eth0 /proc/net/dev; cat /etc/resolv.conf"]})),
    );
    assert!(
        x.body["stdout"]
            .as_str()
            .unwrap()
            .starts_with("1\nnameserver "),
        "{:?}",
        x.body
    );
    let net = native(
        &d.url,
        support::admin_key(),
        Method::GET,
        &format!("/v1/sandboxes/{id}/network"),
        None,
    );
    assert_eq!(net.body["policy"]["mode"], "open", "{:?}", net.body);
    // The E2B create's own words: an open network where allow wins.
    assert_eq!(net.body["policy"]["precedence"], "allow", "{:?}", net.body);
    let rec = native(
        &d.url,
        support::admin_key(),
        Method::GET,
        &format!("/v1/sandboxes/{id}/audit"),
        None,
    );
    let first = &rec.body["events"][0]["body"];
    assert_eq!(first["spec"]["pool"], true);
    assert_eq!(first["policy"]["mode"], "open");
    // Native: an open network is served by the same pool, no network is not.
    let left = pooled(&d);
    let open = native(
        &d.url,
        support::admin_key(),
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"network": {"mode": "open"}})),
    );
    assert_eq!(open.status, 201, "{:?}", open.body);
    assert!(left.contains(open.body["id"].as_str().unwrap()));
    let left = pooled(&d);
    let none = native(
        &d.url,
        support::admin_key(),
        Method::POST,
        "/v1/sandboxes",
        Some(json!({})),
    );
    assert_eq!(none.status, 201, "{:?}", none.body);
    assert!(!left.contains(none.body["id"].as_str().unwrap()));
}

#[test]
fn a_create_at_capacity_takes_a_warm_sandboxs_place() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let config = support::config_file("max_sandboxes = 2\n\n[warm]\nbase = 2\n");
    let d = start_tidy_with("pool-full", &[("RAMPART_CONFIG", config.path.as_str())]);
    let before = filled(&d, 2);
    let admin = support::admin_key();
    let cold = native(
        &d.url,
        admin,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"env": {"K": "v"}})),
    );
    assert_eq!(cold.status, 201, "a create at capacity: {:?}", cold.body);
    assert!(!before.contains(cold.body["id"].as_str().unwrap()));
    let left = pooled(&d);
    assert_eq!(left.len(), 1, "one warm sandbox gave its place: {left:?}");
    assert!(left.is_subset(&before));
    // The remaining one is claimed; then the node is full.
    let warm = native(
        &d.url,
        admin,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({})),
    );
    assert_eq!(warm.status, 201, "{:?}", warm.body);
    assert!(left.contains(warm.body["id"].as_str().unwrap()));
    let full = native(
        &d.url,
        admin,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({})),
    );
    assert_eq!(full.status, 503, "a third create: {:?}", full.body);
    assert!(pooled(&d).is_empty());
}

/// Builds `name` on `base` through the E2B template API with `key`, its one step writing
/// `text` into `/opt/who`; fails the test unless the build ends `ready`.
fn build(url: &str, key: &str, name: &str, text: &str) {
    let steps = json!([{"type": "RUN", "args": [format!("echo {text} > /opt/who"), "root"]}]);
    let (_, st) = support::build_on_base(url, key, name, steps);
    assert_eq!(st["status"], "ready", "the build of {name}: {st:?}");
}

#[test]
fn a_template_built_again_drains_its_pool() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut d = start_tidy_with("pool-build", &[]);
    let key = std::fs::read_to_string(d.data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();
    build(&d.url, &key, "pooltpl", "one");
    // A pool of it from the next start (a pool names a template that is built).
    d.daemon.stop();
    let port: u16 = d.url.rsplit(':').next().unwrap().parse().unwrap();
    let again = support::start(&d.data, port, &[("RAMPART_WARM", "pooltpl=1")]);
    // The stopped value must not drop now: its Drop would unmount the new daemon's store.
    std::mem::forget(std::mem::replace(&mut d.daemon, again));
    let old = filled(&d, 1);
    build(&d.url, &key, "pooltpl", "two");
    let mut new = BTreeSet::new();
    wait_until("the pool refilled from the new build", 120, || {
        new = pooled(&d);
        new.len() == 1 && new.is_disjoint(&old)
    });
    for id in &old {
        assert_eq!(
            processes_of(id),
            Vec::<i32>::new(),
            "{id} outlived its build"
        );
    }
    let c = native(
        &d.url,
        support::admin_key(),
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"template": "pooltpl"})),
    );
    assert_eq!(c.status, 201, "{:?}", c.body);
    let id = c.body["id"].as_str().unwrap();
    assert!(new.contains(id), "{id} did not come from the pool {new:?}");
    let x = native(
        &d.url,
        support::admin_key(),
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": ["cat", "/opt/who"]})),
    );
    assert_eq!(x.body["stdout"], "two\n", "{:?}", x.body);
}

#[test]
fn a_pool_beyond_capacity_is_refused_at_start() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = std::env::temp_dir().join(format!("rampart-pool-cap-{}", support::token()));
    std::fs::create_dir_all(&root).unwrap();
    let config = root.join("rampart.toml");
    std::fs::write(&config, "max_sandboxes = 2\n\n[warm]\nbase = 5\n").unwrap();
    let serve = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rampart"))
            .args(["serve", "--listen"])
            .arg(format!("127.0.0.1:{}", support::free_port()))
            .arg("--data-dir")
            .arg(root.join("data"))
            .arg("--config")
            .arg(&config)
            .args(extra)
            .env_remove("RAMPART_SOCKET")
            .env_remove("RAMPART_WARM")
            .output()
            .unwrap()
    };
    let out = serve(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve started with a pool of 5 in 2");
    assert!(
        err.contains("warm pools of 5 sandboxes") && err.contains("max_sandboxes"),
        "the refusal: {err}"
    );
    let out = serve(&["--warm", "base=many"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("not a whole number"), "the refusal: {err}");
    support::unmount_store(&root.join("data"));
    let _ = std::fs::remove_dir_all(&root);
}
