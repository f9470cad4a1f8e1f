//! The host's disk is inside every quota (issue 33, findings 5-7), attacked as a tenant
//! does: a daemon started as operators start it, with small build and tenant disk bounds
//! set for it (tens of MiB: nothing here assumes an amount of free host disk beyond a few
//! hundred MiB), tenants and keys made through the API and the CLI, the E2B template API
//! driven by hand (the requests the SDK's `Template.build` sends).
//!
//! - `sandbox_blocks_build_step_writing_past_its_disk`: a `RUN` step writing more than the
//!   build's disk (`RAMPART_BUILD_DISK_BYTES`) fails the build, saying so, and leaves no
//!   mount, loop device or file; a step within it builds a layer whose content, owner and
//!   mode arrive intact, counted as the tenant's.
//! - `sandbox_blocks_copy_upload_expanding_past_build_disk`: a small gzip upload that
//!   unpacks past the build's disk fails its `COPY` step, saying so, leaving nothing.
//! - `sandbox_blocks_uploads_past_disk_quota`: a tenant's uploads count against its
//!   `max_disk_bytes`: one past it is refused while received and nothing of it is kept.
//! - `sandbox_blocks_uploads_kept_forever`: an upload no build uses is removed after its
//!   TTL (`RAMPART_BUILD_UPLOAD_TTL_SECS`) by the disk scan (`RAMPART_DISK_SCAN_SECS`), and
//!   stops counting. The test waits for that event (no sleep, no timing assertion).
//! - `sandbox_blocks_artifacts_outside_disk_quota`: the artifacts an ended sandbox left
//!   count against its tenant's `max_disk_bytes`: the next create that would pass it is
//!   refused.
//!
//! Needs root, the jailer and the agent (template builds need the namespace tier), and
//! `mkfs.ext4`; otherwise it prints `skipped: <reason>`.

mod support;

use reqwest::Method;
use serde_json::{json, Value};
use std::io::Read as _;
use std::path::Path;
use std::time::{Duration, Instant};
use support::{admin_key, e2b_call as e2b, make_key, native_call as native, start_tidy_with, Tidy};

const MIB: u64 = 1 << 20;
/// The build disk of the daemons here.
const BUILD_DISK: u64 = 64 * MIB;

fn skip() -> bool {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return true;
    }
    let mkfs = std::process::Command::new("mkfs.ext4").arg("-V").output();
    if !mkfs.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: no mkfs.ext4 (e2fsprogs)");
        return true;
    }
    false
}

/// Makes tenant `name` with `quotas` (201 asserted).
fn tenant(url: &str, name: &str, quotas: Value) {
    let a = native(
        url,
        admin_key(),
        Method::POST,
        "/v1/tenants",
        Some(json!({"name": name, "quotas": quotas})),
    );
    assert_eq!(a.status, 201, "create tenant {name}: {:?}", a.body);
}

/// What tenant `name` holds now (`holds` of `GET /v1/tenants/{name}`).
fn holds(url: &str, name: &str) -> Value {
    let a = native(
        url,
        admin_key(),
        Method::GET,
        &format!("/v1/tenants/{name}"),
        None,
    );
    assert_eq!(a.status, 200, "{:?}", a.body);
    a.body["holds"].clone()
}

fn stored_bytes(url: &str, name: &str) -> u64 {
    holds(url, name)["stored_bytes"].as_u64().unwrap_or(0)
}

/// Starts a build of `name` on `base` with `steps` and waits for it to end: its final
/// status answer.
fn build(url: &str, key: &str, name: &str, steps: Value) -> Value {
    support::build_on_base(url, key, name, steps).1
}

/// Polls `f` until it holds (every 250 ms, at most `secs`).
fn eventually(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The data directory's build leftovers: mount points under its `images/tmp` (in the host's
/// mount table, where the daemon mounts a step's disk), loop devices backed by a file there
/// that still exists, and step directories. (A loop device whose image was removed may
/// stay attached a while in another process's private mount namespace made while the step
/// ran, e.g. a warm jailer of another daemon: its backing file then reads `(deleted)`.)
fn leftovers(data: &Path) -> Vec<String> {
    let tmp = data.join("images").join("tmp");
    let t = tmp.to_string_lossy().into_owned();
    let mut v: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&t)))
        .map(str::to_owned)
        .collect();
    if let Ok(rd) = std::fs::read_dir("/sys/block") {
        for e in rd.flatten() {
            let f = e.path().join("loop").join("backing_file");
            if let Ok(b) = std::fs::read_to_string(&f) {
                if b.trim().starts_with(&t) && !b.trim().ends_with("(deleted)") {
                    v.push(format!("{}: {}", e.path().display(), b.trim()));
                }
            }
        }
    }
    // The step directories themselves (the store's lock and other files are not ours).
    if let Ok(rd) = std::fs::read_dir(&tmp) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("step") || n.starts_with("api-build") {
                v.push(e.path().display().to_string());
            }
        }
    }
    v
}

fn build_daemon(name: &str) -> Tidy {
    let disk = BUILD_DISK.to_string();
    start_tidy_with(name, &[("RAMPART_BUILD_DISK_BYTES", disk.as_str())])
}

#[test]
fn sandbox_blocks_build_step_writing_past_its_disk() {
    if skip() {
        return;
    }
    let d = build_daemon("disk-build-step");
    let url = &d.url;
    tenant(url, "acme", json!({}));
    let key = make_key(&d.data, &["--e2b", "--tenant", "acme"]);
    let native_key = make_key(&d.data, &["--tenant", "acme"]);

    // Three times the build's disk: refused inside (ENOSPC), the build fails saying why.
    let st = build(
        url,
        &key,
        "fill",
        json!([{"type": "RUN", "args": ["head -c 200M /dev/zero > /home/user/big", "root"]}]),
    );
    assert_eq!(st["status"], "error", "a step wrote past its disk: {st}");
    assert!(
        st.to_string().contains("disk is full"),
        "the failure does not say the disk is full: {st}"
    );
    eventually("the failed step's disk is gone", 60, || {
        leftovers(&d.data).is_empty()
    });

    // Within it: the layer arrives whole (content, owner, mode) and is the tenant's.
    let st = build(
        url,
        &key,
        "fits",
        json!([{"type": "RUN", "args": [
            "head -c 8M /dev/urandom > /opt/blob && sha256sum /opt/blob > /opt/blob.sum \
             && chown 1000:1000 /opt/blob && chmod 4750 /opt/blob && mkdir -p /opt/gone \
             && rm -rf /usr/share/doc",
            "root"]}]),
    );
    assert_eq!(st["status"], "ready", "a step within its disk: {st}");
    eventually("the step's disk is gone", 60, || {
        leftovers(&d.data).is_empty()
    });
    let c = native(
        url,
        &native_key,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"template": "fits"})),
    );
    assert!(c.status < 300, "create of fits: {:?}", c.body);
    let id = c.body["id"].as_str().unwrap().to_owned();
    let x = native(
        url,
        &native_key,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": ["sh", "-c",
            "sha256sum -c /opt/blob.sum >/dev/null && stat -c '%u:%g %a' /opt/blob \
             && test ! -e /usr/share/doc && echo gone"]})),
    );
    native(
        url,
        &native_key,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
    );
    assert_eq!(x.status, 200, "{:?}", x.body);
    assert_eq!(
        x.body["stdout"].as_str().unwrap_or_default().trim(),
        "1000:1000 4750\ngone",
        "{:?}",
        x.body
    );
    // Its layer counts as the tenant's (at least the 8 MiB it wrote).
    let held = stored_bytes(url, "acme");
    assert!(
        held >= 8 * MIB,
        "the tenant's layers are not counted: {held}"
    );
}

/// A gzip tar holding one file `big.bin` of `len` zero bytes (small: zeros compress).
fn zeros_archive(len: u64) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    let mut h = tar::Header::new_gnu();
    h.set_size(len);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    b.append_data(&mut h, "big.bin", std::io::repeat(0).take(len))
        .unwrap();
    b.into_inner().unwrap().finish().unwrap()
}

/// A plain tar holding one file `f.bin` of `len` bytes (not compressible).
fn random_archive(len: usize, seed: u8) -> Vec<u8> {
    let mut data = vec![0u8; len];
    let mut x: u32 = 0x9e37_79b9 ^ u32::from(seed);
    for v in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *v = x as u8;
    }
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(len as u64);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_cksum();
    b.append_data(&mut h, "f.bin", &data[..]).unwrap();
    b.into_inner().unwrap()
}

fn hash_of(b: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
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

/// PUTs `body` to an upload link: the status, or 0 when the daemon closed the connection
/// before answering (it may, refusing a body while it is sent).
fn put(link: &str, body: Vec<u8>) -> u16 {
    match support::slow_client().put(link).body(body).send() {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// Uploads `body` for template `name`: its hash and the upload's status.
fn upload(url: &str, key: &str, name: &str, body: Vec<u8>) -> (String, u16) {
    let hash = hash_of(&body);
    let (_, link) = upload_link(url, key, name, &hash);
    (hash, put(&link, body))
}

/// Files (any kind) in the tenant's uploads directory.
fn upload_files(data: &Path, tenant: &str) -> Vec<String> {
    let hex: String = tenant.bytes().map(|b| format!("{b:02x}")).collect();
    std::fs::read_dir(data.join(format!("images/uploads/tenant-{hex}")))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn sandbox_blocks_copy_upload_expanding_past_build_disk() {
    if skip() {
        return;
    }
    let d = build_daemon("disk-build-copy");
    let url = &d.url;
    tenant(url, "acme", json!({}));
    let key = make_key(&d.data, &["--e2b", "--tenant", "acme"]);
    // 200 MiB of zeros: a few hundred KiB of gzip.
    let body = zeros_archive(200 * MIB);
    assert!(body.len() < 4 << 20, "{}", body.len());
    let (hash, status) = upload(url, &key, "bomb", body);
    assert_eq!(status, 200);
    let st = build(
        url,
        &key,
        "bomb",
        json!([{"type": "COPY", "args": ["big.bin", "/opt/big.bin"], "filesHash": hash}]),
    );
    assert_eq!(
        st["status"], "error",
        "an upload unpacked past the disk: {st}"
    );
    assert!(
        st.to_string().contains("build's disk limit"),
        "the failure does not name the limit: {st}"
    );
    eventually("the failed build's staging is gone", 60, || {
        leftovers(&d.data).is_empty()
    });
}

#[test]
fn sandbox_blocks_uploads_past_disk_quota() {
    if skip() {
        return;
    }
    let d = start_tidy_with("disk-uploads-quota", &[]);
    let url = &d.url;
    tenant(url, "acme", json!({"max_disk_bytes": 32 * MIB}));
    let key = make_key(&d.data, &["--e2b", "--tenant", "acme"]);

    // 20 MiB fits in 32.
    let (first, status) = upload(url, &key, "a", random_archive(20 << 20, 1));
    assert_eq!(status, 200);
    assert!(upload_link(url, &key, "a", &first).0);
    let held = stored_bytes(url, "acme");
    assert!(held >= 20 * MIB, "the upload is not counted: {held}");

    // 20 MiB more does not: refused while received, nothing of it kept.
    let (second, status) = upload(url, &key, "a", random_archive(20 << 20, 2));
    assert_ne!(
        status, 200,
        "an upload past the tenant's disk quota was kept"
    );
    assert!(!upload_link(url, &key, "a", &second).0);
    eventually("no partial upload is left", 60, || {
        upload_files(&d.data, "acme")
            .iter()
            .all(|f| !f.ends_with(".part"))
    });
    assert_eq!(
        upload_files(&d.data, "acme"),
        vec![format!("{first}.tar")],
        "only the first upload is kept"
    );
    // A sandbox whose disk would pass the quota beside the upload is refused too.
    let native_key = make_key(&d.data, &["--tenant", "acme"]);
    let c = native(
        url,
        &native_key,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"template": "base", "limits": {"disk_bytes": 16 * MIB}})),
    );
    if let Some(id) = c.body["id"].as_str() {
        native(
            url,
            &native_key,
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            None,
        );
    }
    assert_eq!(c.status, 403, "{:?}", c.body);
    assert_eq!(c.body["error"]["quota"]["limit"], "max_disk_bytes");
}

#[test]
fn sandbox_blocks_uploads_kept_forever() {
    if skip() {
        return;
    }
    // Uploads unused for 2 s expire; the scan runs every second.
    let d = start_tidy_with(
        "disk-uploads-ttl",
        &[
            ("RAMPART_BUILD_UPLOAD_TTL_SECS", "2"),
            ("RAMPART_DISK_SCAN_SECS", "1"),
        ],
    );
    let url = &d.url;
    tenant(url, "acme", json!({}));
    let key = make_key(&d.data, &["--e2b", "--tenant", "acme"]);
    let (hash, status) = upload(url, &key, "a", random_archive(4 << 20, 3));
    assert_eq!(status, 200);
    // Whenever the scan comes (nothing here asserts when): the upload goes, and with it
    // what the tenant is counted for.
    eventually("the unused upload expires", 120, || {
        !upload_link(url, &key, "a", &hash).0
    });
    eventually("the expired upload stops counting", 120, || {
        stored_bytes(url, "acme") == 0
    });
    assert!(upload_files(&d.data, "acme").is_empty());
}

#[test]
fn sandbox_blocks_artifacts_outside_disk_quota() {
    if skip() {
        return;
    }
    let d = start_tidy_with("disk-artifacts", &[]);
    let url = &d.url;
    tenant(url, "acme", json!({"max_disk_bytes": 160 * MIB}));
    let key = make_key(&d.data, &["--tenant", "acme"]);
    let create = |disk: u64| {
        native(
            url,
            &key,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"template": "base", "limits": {"disk_bytes": disk},
                        "artifacts": ["/home/user/out"]})),
        )
    };
    let destroy = |id: &str| {
        native(
            url,
            &key,
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            None,
        )
    };
    let c = create(128 * MIB);
    assert!(c.status < 300, "{:?}", c.body);
    let id = c.body["id"].as_str().unwrap().to_owned();
    let x = native(
        url,
        &key,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": ["sh", "-c",
            "mkdir -p /home/user/out && head -c 60M /dev/urandom > /home/user/out/big"]})),
    );
    assert_eq!(x.status, 200, "{:?}", x.body);
    assert_eq!(x.body["exit_code"], 0, "{:?}", x.body);
    let r = destroy(&id);
    assert!(r.status < 300, "{:?}", r.body);
    let a = native(
        url,
        &key,
        Method::GET,
        &format!("/v1/sandboxes/{id}/artifacts"),
        None,
    );
    assert_eq!(a.status, 200, "{:?}", a.body);
    // The 60 MiB kept are the tenant's (and nothing else it holds now).
    eventually("the artifacts count as the tenant's", 60, || {
        stored_bytes(url, "acme") >= 60 * MIB
    });
    // 60 MiB kept + 128 MiB asked > 160 MiB: refused.
    let c = create(128 * MIB);
    if let Some(id) = c.body["id"].as_str() {
        destroy(id);
    }
    assert_eq!(c.status, 403, "{:?}", c.body);
    assert_eq!(c.body["error"]["quota"]["limit"], "max_disk_bytes");
    // What fits beside them is still admitted.
    let c = create(64 * MIB);
    assert!(c.status < 300, "{:?}", c.body);
    destroy(c.body["id"].as_str().unwrap());
}
