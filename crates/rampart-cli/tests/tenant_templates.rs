//! Templates, their builds, logs, tags and uploads belong to the tenant that made them
//! (issue 33), attacked from where a tenant stands: a daemon started as operators start
//! it, tenants `acme` (A) and `rival` (B) with E2B keys and native keys made with the CLI,
//! the E2B template API driven by hand (the requests the SDK's `Template.build` sends).
//!
//! - `sandbox_blocks_tenant_overwriting_a_template`: B building a template of the name A
//!   built makes B's own; A's sandboxes (native and E2B create) still run A's; the
//!   operator's template is published to both and neither may rebuild or retag it; B
//!   cannot move A's tags.
//! - `sandbox_blocks_tenant_deleting_a_template`: every verb of B on A's template answers
//!   what it answers for a name that does not exist; B deletes nothing of A's, nor the
//!   operator's or a built-in template.
//! - `sandbox_blocks_tenant_reading_build_logs`: A's builds and their logs are not B's.
//! - `sandbox_blocks_tenant_swapping_uploaded_files`: uploads are kept per tenant: B
//!   neither learns that A uploaded a files hash nor replaces A's archive under it, nor
//!   builds from A's upload.
//! - `sandbox_blocks_unauthenticated_wake`: a request without the sandbox's token, for a
//!   paused `autoResume` sandbox (the `E2b-Sandbox-Id` header and the
//!   `49983-ID.localhost` host), is refused (401) and leaves it paused.
//!
//! Needs root, the jailer and the agent (template builds need the namespace tier);
//! otherwise it prints `skipped: <reason>`.

mod support;

use reqwest::Method;
use serde_json::{json, Value};

use support::{
    e2b_call as e2b, make_key, native_call as native, reserve_build as request_build, start_tidy,
    Answer, Tidy,
};

/// A daemon with tenants `acme` and `rival`, each with an E2B key and a native key, and the
/// operator's E2B key.
struct World {
    d: Tidy,
    a_e2b: String,
    a_key: String,
    b_e2b: String,
    b_key: String,
    op_e2b: String,
}

fn world(name: &str) -> Option<World> {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return None;
    }
    let d = start_tidy(name);
    support::make_tenants(&d.url, &["acme", "rival"]);
    Some(World {
        a_e2b: make_key(&d.data, &["--e2b", "--tenant", "acme"]),
        a_key: make_key(&d.data, &["--tenant", "acme"]),
        b_e2b: make_key(&d.data, &["--e2b", "--tenant", "rival"]),
        b_key: make_key(&d.data, &["--tenant", "rival"]),
        op_e2b: make_key(&d.data, &["--e2b"]),
        d,
    })
}

/// Builds `name` on `base` with `steps` as the SDK does ([`support::build_on_base`]); the
/// build id and its final status answer. Fails the test if the build does not end `ready`.
fn build(url: &str, key: &str, name: &str, steps: Value) -> (String, Value) {
    let (bid, st) = support::build_on_base(url, key, name, steps);
    assert_eq!(st["status"], "ready", "the build of {name} failed: {st:?}");
    (bid, st)
}

/// A build step writing `text` into `/opt/who`, as root.
fn writes(text: &str) -> Value {
    json!([{"type": "RUN", "args": [format!("echo {text} > /opt/who"), "root"]}])
}

/// `/opt/who` in a new sandbox of `template` made with the native API and tenant key `key`
/// (the sandbox is destroyed after).
fn who_native(url: &str, key: &str, template: &str) -> String {
    let c = native(
        url,
        key,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"template": template})),
    );
    assert!(c.status < 300, "create of {template}: {:?}", c.body);
    let id = c.body["id"].as_str().unwrap().to_owned();
    let out = read_who(url, key, &id);
    native(
        url,
        key,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
    );
    out
}

/// `/opt/who` in a new sandbox of `template` made with the E2B API (E2B key `e2b_key`),
/// read through the native API with the same tenant's `key`.
fn who_e2b(url: &str, e2b_key: &str, key: &str, template: &str) -> String {
    let c = e2b(
        url,
        e2b_key,
        Method::POST,
        "/sandboxes",
        Some(json!({"templateID": template})),
    );
    assert_eq!(c.status, 201, "E2B create of {template}: {:?}", c.body);
    let id = c.body["sandboxID"].as_str().unwrap().to_owned();
    let out = read_who(url, key, &id);
    e2b(
        url,
        e2b_key,
        Method::DELETE,
        &format!("/sandboxes/{id}"),
        None,
    );
    out
}

fn read_who(url: &str, key: &str, id: &str) -> String {
    let x = native(
        url,
        key,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": ["cat", "/opt/who"]})),
    );
    assert_eq!(x.status, 200, "{:?}", x.body);
    x.body["stdout"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The template ids a list answer (`GET /templates`) names.
fn listed(a: &Answer) -> Vec<String> {
    a.body
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|t| t["templateID"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn sandbox_blocks_tenant_overwriting_a_template() {
    let Some(w) = world("tenant-tpl-overwrite") else {
        return;
    };
    let url = &w.d.url;
    build(url, &w.a_e2b, "shared", writes("tenant-a"));
    build(url, &w.b_e2b, "shared", writes("tenant-b"));
    // Each tenant's "shared" is its own, by either road in.
    assert_eq!(who_native(url, &w.a_key, "shared"), "tenant-a");
    assert_eq!(who_e2b(url, &w.a_e2b, &w.a_key, "shared"), "tenant-a");
    assert_eq!(who_native(url, &w.b_key, "shared"), "tenant-b");
    assert_eq!(who_e2b(url, &w.b_e2b, &w.b_key, "shared"), "tenant-b");

    // The operator's template is published to every tenant; no tenant rebuilds or retags it.
    build(url, &w.op_e2b, "published", writes("operator"));
    for (e2b_key, key) in [(&w.a_e2b, &w.a_key), (&w.b_e2b, &w.b_key)] {
        assert_eq!(who_native(url, key, "published"), "operator");
        let l = e2b(url, e2b_key, Method::GET, "/templates", None);
        assert!(listed(&l).contains(&"published".to_owned()), "{:?}", l.body);
        let r = request_build(url, e2b_key, "published");
        assert_eq!(
            r.status, 403,
            "a tenant rebuilds the operator's: {:?}",
            r.body
        );
        let t = e2b(
            url,
            e2b_key,
            Method::POST,
            "/templates/tags",
            Some(json!({"target": "published:default", "tags": ["mine"]})),
        );
        assert_eq!(
            t.status, 403,
            "a tenant retags the operator's: {:?}",
            t.body
        );
        for builtin in ["base", "code-interpreter-v1"] {
            let r = request_build(url, e2b_key, builtin);
            assert_eq!(r.status, 403, "a tenant rebuilds {builtin}: {:?}", r.body);
        }
    }
    assert_eq!(who_native(url, &w.a_key, "published"), "operator");
    let ex = e2b(
        url,
        &w.op_e2b,
        Method::GET,
        "/templates/published/tags/exists?tag=mine",
        None,
    );
    assert_eq!(ex.body["exists"], false, "{:?}", ex.body);

    // Tags: A tags its template; B cannot move A's tag (its own namespace has none).
    let t = e2b(
        url,
        &w.a_e2b,
        Method::POST,
        "/templates/tags",
        Some(json!({"target": "shared:default", "tags": ["v2"]})),
    );
    assert_eq!(t.status, 201, "{:?}", t.body);
    let t = e2b(
        url,
        &w.b_e2b,
        Method::POST,
        "/templates/tags",
        Some(json!({"target": "shared:v2", "tags": ["v3"]})),
    );
    assert_eq!(t.status, 404, "B tags A's tag: {:?}", t.body);
    let t = e2b(
        url,
        &w.b_e2b,
        Method::POST,
        "/templates/tags",
        Some(json!({"target": "shared:default", "tags": ["v2"]})),
    );
    assert_eq!(t.status, 201, "B tags its own: {:?}", t.body);
    assert_eq!(who_native(url, &w.a_key, "shared:v2"), "tenant-a");
    assert_eq!(who_native(url, &w.b_key, "shared:v2"), "tenant-b");
}

#[test]
fn sandbox_blocks_tenant_deleting_a_template() {
    let Some(w) = world("tenant-tpl-delete") else {
        return;
    };
    let url = &w.d.url;
    build(url, &w.a_e2b, "a-only", writes("tenant-a"));
    build(url, &w.op_e2b, "published", writes("operator"));

    // Every verb of B on A's template answers as on a name that does not exist.
    let verbs = |name: &str| -> Vec<(Method, String, Option<Value>)> {
        vec![
            (Method::GET, format!("/templates/{name}"), None),
            (Method::GET, format!("/templates/{name}/tags"), None),
            (Method::GET, format!("/templates/{name}/tags/count"), None),
            (
                Method::GET,
                format!("/templates/{name}/tags/exists?tag=default"),
                None,
            ),
            (Method::GET, format!("/templates/aliases/{name}"), None),
            (
                Method::POST,
                "/templates/tags".into(),
                Some(json!({"target": format!("{name}:default"), "tags": ["x"]})),
            ),
            (
                Method::DELETE,
                "/templates/tags".into(),
                Some(json!({"name": name, "tags": ["default"]})),
            ),
            (
                Method::POST,
                "/sandboxes".into(),
                Some(json!({"templateID": name})),
            ),
            (Method::DELETE, format!("/templates/{name}"), None),
        ]
    };
    for ((m, p, b), (_, q, c)) in verbs("a-only").into_iter().zip(verbs("no-such-tpl")) {
        let theirs = e2b(url, &w.b_e2b, m.clone(), &p, b);
        let none = e2b(url, &w.b_e2b, m.clone(), &q, c);
        assert_eq!(
            theirs.status, none.status,
            "{m} {p}: {:?} vs {:?}",
            theirs.body, none.body
        );
        assert_eq!(
            theirs.body.to_string().replace("a-only", "NAME"),
            none.body.to_string().replace("no-such-tpl", "NAME"),
            "{m} {p}"
        );
        assert!(
            theirs.status >= 400 || m == Method::GET,
            "{m} {p}: {:?}",
            theirs.body
        );
    }
    // The native API too.
    let theirs = native(
        url,
        &w.b_key,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"template": "a-only"})),
    );
    let none = native(
        url,
        &w.b_key,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"template": "no-such-tpl"})),
    );
    assert_eq!(theirs.status, none.status, "{:?}", theirs.body);
    assert!(theirs.status >= 400, "{:?}", theirs.body);
    let g = native(url, &w.b_key, Method::GET, "/v1/templates/a-only", None);
    assert_eq!(g.status, 404, "{:?}", g.body);
    let l = native(url, &w.b_key, Method::GET, "/v1/templates", None);
    assert!(!l.body.to_string().contains("a-only"), "{:?}", l.body);
    let l = e2b(url, &w.b_e2b, Method::GET, "/templates", None);
    assert!(
        !listed(&l).iter().any(|n| n.contains("a-only")),
        "{:?}",
        l.body
    );

    // B deletes neither the operator's nor a built-in template.
    for name in ["published", "base"] {
        let d = e2b(
            url,
            &w.b_e2b,
            Method::DELETE,
            &format!("/templates/{name}"),
            None,
        );
        assert_eq!(d.status, 403, "B deletes {name}: {:?}", d.body);
    }
    // Everything of A's and the operator's is still there.
    assert_eq!(who_native(url, &w.a_key, "a-only"), "tenant-a");
    assert_eq!(who_native(url, &w.b_key, "published"), "operator");
    let l = e2b(url, &w.a_e2b, Method::GET, "/templates", None);
    assert!(listed(&l).contains(&"a-only".to_owned()), "{:?}", l.body);
    // The operator sees A's template under its stored name.
    let l = e2b(url, &w.op_e2b, Method::GET, "/templates", None);
    assert!(
        listed(&l).contains(&"acme~a-only".to_owned()),
        "{:?}",
        l.body
    );
    // A deletes its own.
    let d = e2b(url, &w.a_e2b, Method::DELETE, "/templates/a-only", None);
    assert_eq!(d.status, 204, "{:?}", d.body);
}

#[test]
fn sandbox_blocks_tenant_reading_build_logs() {
    let Some(w) = world("tenant-tpl-logs") else {
        return;
    };
    let url = &w.d.url;
    let secret = format!("secret-of-a-{}", support::token());
    let (a_bid, status) = build(
        url,
        &w.a_e2b,
        "shared",
        json!([{"type": "RUN", "args": [format!("echo {secret}"), "root"]}]),
    );
    assert!(status.to_string().contains(&secret), "{status}");
    let (b_bid, _) = build(url, &w.b_e2b, "shared", writes("tenant-b"));
    for path in [
        format!("/templates/shared/builds/{a_bid}/status"),
        format!("/templates/shared/builds/{a_bid}/logs"),
        format!("/templates/acme~shared/builds/{a_bid}/logs"),
    ] {
        let r = e2b(url, &w.b_e2b, Method::GET, &path, None);
        assert_eq!(r.status, 404, "{path}: {:?}", r.body);
        assert!(
            !r.body.to_string().contains(&secret),
            "{path}: {:?}",
            r.body
        );
    }
    let r = e2b(
        url,
        &w.b_e2b,
        Method::POST,
        &format!("/v2/templates/shared/builds/{a_bid}"),
        Some(json!({"fromTemplate": "base"})),
    );
    assert_eq!(r.status, 404, "B starts A's build: {:?}", r.body);
    // B's view of "shared" is its own, with its own build only.
    let g = e2b(url, &w.b_e2b, Method::GET, "/templates/shared", None);
    assert_eq!(g.status, 200, "{:?}", g.body);
    let text = g.body.to_string();
    assert!(
        text.contains(&b_bid) && !text.contains(&a_bid),
        "{:?}",
        g.body
    );
    // A still reads its own log.
    let r = e2b(
        url,
        &w.a_e2b,
        Method::GET,
        &format!("/templates/shared/builds/{a_bid}/logs"),
        None,
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(r.body.to_string().contains(&secret), "{:?}", r.body);
}

/// A tar archive of one file `who.txt` holding `text`.
fn archive(text: &str) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(text.len() as u64);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    b.append_data(&mut h, "who.txt", text.as_bytes()).unwrap();
    b.into_inner().unwrap()
}

/// Asks for the upload link of `hash` for template `name`: (present, url).
fn upload_link(url: &str, key: &str, name: &str, hash: &str) -> (bool, String) {
    let r = e2b(
        url,
        key,
        Method::GET,
        &format!("/templates/{name}/files/{hash}"),
        None,
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    (
        r.body["present"].as_bool().unwrap(),
        r.body["url"].as_str().unwrap().to_owned(),
    )
}

fn put(link: &str, body: Vec<u8>) -> u16 {
    support::slow_client()
        .put(link)
        .body(body)
        .send()
        .unwrap()
        .status()
        .as_u16()
}

fn copy_step(hash: &str) -> Value {
    json!([{"type": "COPY", "args": ["who.txt", "/opt/who"], "filesHash": hash}])
}

#[test]
fn sandbox_blocks_tenant_swapping_uploaded_files() {
    let Some(w) = world("tenant-tpl-files") else {
        return;
    };
    let url = &w.d.url;
    use sha2::Digest as _;
    let hash = hex(&sha2::Sha256::digest(support::token().as_bytes()));
    // A uploads its files under `hash`.
    let (present, link) = upload_link(url, &w.a_e2b, "a-copy", &hash);
    assert!(!present);
    assert_eq!(put(&link, archive("files-of-a")), 200);
    assert!(upload_link(url, &w.a_e2b, "a-copy", &hash).0);
    // B does not learn that A has it, and its upload under the same hash is its own.
    let (present, link) = upload_link(url, &w.b_e2b, "b-copy", &hash);
    assert!(!present, "B sees that A uploaded {hash}");
    assert_eq!(put(&link, archive("files-of-b")), 200);
    build(url, &w.a_e2b, "a-copy", copy_step(&hash));
    assert_eq!(who_native(url, &w.a_key, "a-copy"), "files-of-a");
    build(url, &w.b_e2b, "b-copy", copy_step(&hash));
    assert_eq!(who_native(url, &w.b_key, "b-copy"), "files-of-b");

    // B cannot build from an upload only A made.
    let only_a = hex(&sha2::Sha256::digest(support::token().as_bytes()));
    let (_, link) = upload_link(url, &w.a_e2b, "a-copy", &only_a);
    assert_eq!(put(&link, archive("only-a")), 200);
    let r = request_build(url, &w.b_e2b, "b-steal");
    assert_eq!(r.status, 202, "{:?}", r.body);
    let bid = r.body["buildID"].as_str().unwrap();
    let s = e2b(
        url,
        &w.b_e2b,
        Method::POST,
        &format!("/v2/templates/b-steal/builds/{bid}"),
        Some(json!({"fromTemplate": "base", "steps": copy_step(&only_a)})),
    );
    assert_eq!(s.status, 400, "B builds from A's upload: {:?}", s.body);
    assert!(
        s.body.to_string().contains("were not uploaded"),
        "{:?}",
        s.body
    );
    // Nor ask for links of the operator's published template's files.
    build(url, &w.op_e2b, "published", writes("operator"));
    let r = e2b(
        url,
        &w.b_e2b,
        Method::GET,
        &format!("/templates/published/files/{hash}"),
        None,
    );
    assert_eq!(r.status, 403, "{:?}", r.body);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The state of E2B sandbox `id` as its owner sees it.
fn e2b_state(url: &str, key: &str, id: &str) -> String {
    let g = e2b(url, key, Method::GET, &format!("/sandboxes/{id}"), None);
    assert_eq!(g.status, 200, "{:?}", g.body);
    g.body["state"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn sandbox_blocks_unauthenticated_wake() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = start_tidy("tenant-tpl-wake");
    let url = &d.url;
    let key = make_key(&d.data, &["--e2b"]);
    let c = e2b(
        url,
        &key,
        Method::POST,
        "/sandboxes",
        Some(
            json!({"templateID": "base", "timeout": 300, "autoPause": true,
                    "autoResume": {"enabled": true}}),
        ),
    );
    assert_eq!(c.status, 201, "{:?}", c.body);
    let id = c.body["sandboxID"].as_str().unwrap().to_owned();
    let token = c.body["envdAccessToken"].as_str().unwrap().to_owned();
    let p = e2b(
        url,
        &key,
        Method::POST,
        &format!("/sandboxes/{id}/pause"),
        None,
    );
    assert!(p.status < 300, "{:?}", p.body);
    assert_eq!(e2b_state(url, &key, &id), "paused");

    let list = || {
        support::slow_client()
            .post(format!("{url}/process.Process/List"))
            .header("content-type", "application/json")
            .body("{}")
    };
    // No token: by the routing header, by the host name, and a bare health check.
    let r = support::send(list().header("e2b-sandbox-id", &id));
    assert_eq!(r.status, 401, "{:?}", r.body);
    assert_eq!(e2b_state(url, &key, &id), "paused", "woken without a token");
    let r = support::send(list().header("host", format!("49983-{id}.localhost")));
    assert_eq!(r.status, 401, "{:?}", r.body);
    assert_eq!(
        e2b_state(url, &key, &id),
        "paused",
        "woken by host without a token"
    );
    let r = support::send(
        list()
            .header("e2b-sandbox-id", &id)
            .header("x-access-token", "wrong"),
    );
    assert_eq!(r.status, 401, "{:?}", r.body);
    let r = support::send(
        support::slow_client()
            .get(format!("{url}/health"))
            .header("e2b-sandbox-id", &id),
    );
    assert!(r.status >= 400, "{:?}", r.body);
    assert_eq!(
        e2b_state(url, &key, &id),
        "paused",
        "woken by a bare /health"
    );

    // With its token, the request wakes it and is served.
    let r = support::send(
        list()
            .header("e2b-sandbox-id", &id)
            .header("x-access-token", &token),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(e2b_state(url, &key, &id), "running");
    e2b(url, &key, Method::DELETE, &format!("/sandboxes/{id}"), None);
}
