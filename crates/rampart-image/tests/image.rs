//! rampart-image: spec errors, OCI layouts made by hand (whiteouts, an opaque directory),
//! hostile archives refused, cache keys, and the builder's cache and failure behaviour with
//! a fake step runner (the real one, on the jail, is exercised by
//! `crates/rampart-cli/tests/templates.rs`).

use rampart_image::build::{step_key, BuildEvent, BuildOptions, Builder, RunRequest, StepRunner};
use rampart_image::extract::apply_layer;
use rampart_image::spec::{Base, Ready};
use rampart_image::{ImageError, Spec, Step, Store, TemplateConfig};
use sha2::Digest as _;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

// ---------- specs ----------

fn parse(s: &str) -> Result<Spec, rampart_image::SpecError> {
    Spec::parse(s, Path::new("/specdir"))
}

#[test]
fn spec_parses_every_step_kind() {
    let s = parse(
        r#"
name = "demo"
from = "debian:bookworm"
[debian]
variant = "minbase"
packages = ["ca-certificates"]
[[steps]]
apt = ["python3", "curl"]
[[steps]]
pip = ["requests==2.31.0"]
[[steps]]
copy = { src = "app", dest = "/opt/app" }
[[steps]]
run = "echo hi"
[[steps]]
env = { A = "1" }
[[steps]]
user = "user"
[[steps]]
workdir = "/home/user"
[start]
cmd = ["python3", "-m", "http.server"]
ready = { port = 8000, timeout_secs = 5 }
"#,
    )
    .unwrap();
    assert_eq!(s.name.as_deref(), Some("demo"));
    assert!(matches!(s.from, Base::Debian { ref suite, .. } if suite == "bookworm"));
    let kinds: Vec<_> = s.steps.iter().map(Step::kind).collect();
    assert_eq!(
        kinds,
        ["apt", "pip", "copy", "run", "env", "user", "workdir"]
    );
    assert_eq!(s.start.as_ref().unwrap().ready, Some(Ready::Port(8000)));
    assert_eq!(s.start.as_ref().unwrap().timeout_secs, 5);
    let o = parse("from = \"oci:img\"").unwrap();
    assert_eq!(o.from, Base::Oci(PathBuf::from("/specdir/img")));
}

#[test]
fn spec_errors_name_the_field() {
    let cases: &[(&str, &str)] = &[
        ("", "from"),
        ("from = \"ubuntu:jammy\"", "from"),
        ("from = \"debian:bookworm\"\nfoo = 1", "foo"),
        ("from = \"oci:x\"\n[debian]\nvariant = \"apt\"", "debian"),
        ("from = \"debian:bookworm\"\n[debian]\nvariant = \"full\"", "debian.variant"),
        ("from = \"oci:x\"\n[[steps]]\ncpy = \"a\"", "steps[1]"),
        ("from = \"oci:x\"\n[[steps]]\napt = []", "steps[1].apt"),
        ("from = \"oci:x\"\n[[steps]]\napt = [\"foo; rm -rf /\"]", "steps[1].apt"),
        ("from = \"oci:x\"\n[[steps]]\nrun = \"true\"\n[[steps]]\ncopy = { src = \"../etc\", dest = \"/x\" }", "steps[2].copy.src"),
        ("from = \"oci:x\"\n[[steps]]\ncopy = { src = \"a\", dest = \"rel\" }", "steps[1].copy.dest"),
        ("from = \"oci:x\"\n[[steps]]\npip = [\"--index-url=evil\"]", "steps[1].pip"),
        ("from = \"oci:x\"\n[[steps]]\nworkdir = \"x\"", "steps[1].workdir"),
        ("from = \"oci:x\"\n[[steps]]\nrun = \"a\"\napt = [\"b\"]", "steps[1]"),
        ("from = \"oci:x\"\n[start]\ncmd = \"x\"\nready = { port = 0 }", "start.ready.port"),
        ("from = \"oci:x\"\n[start]\nready = { port = 80 }", "start.cmd"),
        ("name = \"Bad Name\"\nfrom = \"oci:x\"", "name"),
        ("name = \"base\"\nfrom = \"oci:x\"", "name"),
        ("from = [", "toml"),
    ];
    for (text, field) in cases {
        let e = parse(text).expect_err(text);
        assert_eq!(&e.field, field, "{text:?}: {e}");
    }
}

// ---------- tars ----------

/// A tar entry for the hand-made archives.
enum E<'a> {
    Dir(&'a str, u32),
    File(&'a str, &'a [u8], u32),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    /// A raw name (bypassing the tar crate's own `..` check), regular file.
    RawFile(&'a [u8], &'a [u8]),
}

fn tar_of(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        match e {
            E::Dir(p, m) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*m);
                h.set_size(0);
                b.append_data(&mut h, p, &[][..]).unwrap();
            }
            E::File(p, d, m) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*m);
                h.set_size(d.len() as u64);
                b.append_data(&mut h, p, *d).unwrap();
            }
            E::Symlink(p, t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, p, t).unwrap();
            }
            E::Hardlink(p, t) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_mode(0o644);
                h.set_size(0);
                // Raw link name: the tar crate refuses `..` itself.
                let name = &mut h.as_old_mut().linkname;
                name[..t.len()].copy_from_slice(t.as_bytes());
                let name = &mut h.as_old_mut().name;
                name[..p.len()].copy_from_slice(p.as_bytes());
                h.set_cksum();
                b.append(&h, &[][..]).unwrap();
            }
            E::RawFile(p, d) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(d.len() as u64);
                let name = &mut h.as_old_mut().name;
                name[..p.len()].copy_from_slice(p);
                h.set_cksum();
                b.append(&h, *d).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

fn sha(b: &[u8]) -> String {
    let d = sha2::Sha256::digest(b);
    d.iter().map(|x| format!("{x:02x}")).collect()
}

/// Writes an OCI image layout with these layer blobs (bottom first) and config.
pub fn write_layout(dir: &Path, layers: &[Vec<u8>], config: serde_json::Value) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |b: &[u8]| {
        let h = sha(b);
        std::fs::write(blobs.join(&h), b).unwrap();
        (format!("sha256:{h}"), b.len())
    };
    let mut descs = Vec::new();
    for l in layers {
        let (d, n) = put(l);
        let gz = l.starts_with(&[0x1f, 0x8b]);
        descs.push(serde_json::json!({
            "mediaType": if gz { "application/vnd.oci.image.layer.v1.tar+gzip" } else { "application/vnd.oci.image.layer.v1.tar" },
            "digest": d, "size": n }));
    }
    let cfg = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": []}
    }))
    .unwrap();
    let (cd, cn) = put(&cfg);
    let man = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cn},
        "layers": descs,
    }))
    .unwrap();
    let (md, mn) = put(&man);
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": mn}]
        }))
        .unwrap(),
    )
    .unwrap();
}

fn whiteout_layers() -> Vec<Vec<u8>> {
    let l1 = tar_of(&[
        E::Dir("etc/", 0o755),
        E::File("etc/keep", b"keep", 0o644),
        E::File("etc/gone", b"gone", 0o644),
        E::Dir("opt/", 0o755),
        E::Dir("opt/app/", 0o755),
        E::File("opt/app/old1", b"1", 0o644),
        E::File("opt/app/old2", b"2", 0o644),
        E::File("bin/tool", b"#!/bin/sh\n", 0o4755),
        E::Symlink("etc/link", "/etc/keep"),
        E::Hardlink("etc/keep2", "etc/keep"),
    ]);
    let l2 = tar_of(&[
        E::File("etc/.wh.gone", b"", 0o644),
        E::File("opt/app/.wh..wh..opq", b"", 0o644),
        E::File("opt/app/new", b"new", 0o600),
        E::File("etc/added", b"added", 0o640),
    ]);
    vec![gzip(&l1), l2]
}

#[test]
fn oci_layers_are_extracted_in_overlay_format() {
    if !is_root() {
        eprintln!("skipped: needs root (owners, trusted xattrs)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    write_layout(
        &img,
        &whiteout_layers(),
        serde_json::json!({"Env": ["A=1", "PATH=/usr/bin:/bin"], "User": "1000:1000", "WorkingDir": "/opt/app", "Cmd": ["/bin/sh"]}),
    );
    let store = Store::open(&d.path().join("data")).unwrap();
    let image = rampart_image::oci::open(&img, &store).unwrap();
    assert_eq!(image.layers.len(), 2);
    assert_eq!(image.config.env.get("A").map(String::as_str), Some("1"));
    assert_eq!(image.config.user.as_deref(), Some("1000"));
    assert_eq!(image.config.workdir.as_deref(), Some("/opt/app"));
    assert_eq!(image.config.start.as_ref().unwrap().cmd, ["/bin/sh"]);
    let mut dirs = Vec::new();
    for (i, l) in image.layers.iter().enumerate() {
        let out = d.path().join(format!("l{i}"));
        std::fs::create_dir(&out).unwrap();
        rampart_image::oci::extract_layer(l, &out).unwrap();
        dirs.push(out);
    }
    // Layer 1: modes (setuid kept), owners, links.
    let tool = std::fs::metadata(dirs[0].join("bin/tool")).unwrap();
    assert_eq!(tool.mode() & 0o7777, 0o4755);
    assert_eq!(tool.uid(), 0);
    assert_eq!(
        std::fs::read_link(dirs[0].join("etc/link")).unwrap(),
        Path::new("/etc/keep")
    );
    assert_eq!(
        std::fs::metadata(dirs[0].join("etc/keep2")).unwrap().ino(),
        std::fs::metadata(dirs[0].join("etc/keep")).unwrap().ino()
    );
    // Layer 2: an overlayfs whiteout and an opaque directory.
    let wh = std::fs::symlink_metadata(dirs[1].join("etc/gone")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
    assert!(!dirs[1].join("etc/.wh.gone").exists());
    assert_eq!(
        xattr(&dirs[1].join("opt/app"), "trusted.overlay.opaque"),
        Some(b"y".to_vec())
    );
    // The merged view, through a real overlay in a mount namespace of this thread.
    let merged = d.path().join("merged");
    std::fs::create_dir(&merged).unwrap();
    let dirs2 = dirs.clone();
    let m2 = merged.clone();
    let listing = std::thread::spawn(move || {
        // SAFETY: unshare of this thread's mount namespace only.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNS) };
        assert_eq!(rc, 0);
        run(&["mount", "--make-rprivate", "/"]);
        run(&[
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            &format!("ro,lowerdir={}:{}", dirs2[1].display(), dirs2[0].display()),
            m2.to_str().unwrap(),
        ]);
        let mut names: Vec<String> = Vec::new();
        for sub in ["etc", "opt/app"] {
            let mut v: Vec<String> = std::fs::read_dir(m2.join(sub))
                .unwrap()
                .map(|e| format!("{sub}/{}", e.unwrap().file_name().to_string_lossy()))
                .collect();
            v.sort();
            names.extend(v);
        }
        names
        // The namespace (and the mount) ends with this thread.
    })
    .join()
    .unwrap();
    assert_eq!(
        listing,
        [
            "etc/added",
            "etc/keep",
            "etc/keep2",
            "etc/link",
            "opt/app/new"
        ]
    );
}

fn run(args: &[&str]) {
    let st = std::process::Command::new(args[0])
        .args(&args[1..])
        .status()
        .unwrap();
    assert!(st.success(), "{args:?}");
}

fn xattr(p: &Path, k: &str) -> Option<Vec<u8>> {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let k = std::ffi::CString::new(k).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings and buffer.
    let n = unsafe { libc::lgetxattr(c.as_ptr(), k.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

/// A layer that expands past its file system's room (a gzip bomb) is refused before it
/// fills the disk; a small layer still goes.
#[test]
fn a_layer_never_fills_the_disk() {
    let d = tempfile::tempdir().unwrap();
    let fs = d.path().join("small");
    std::fs::create_dir(&fs).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&fs)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let r = std::panic::catch_unwind(|| {
        let zeros = vec![0u8; 16 << 20];
        let bomb = gzip(&tar_of(&[E::File("big", &zeros, 0o644)]));
        assert!(bomb.len() < 1 << 20, "a small gzip: {}", bomb.len());
        let dest = fs.join("bomb");
        std::fs::create_dir(&dest).unwrap();
        let e = apply_layer(&bomb[..], &dest).unwrap_err();
        assert!(e.to_string().contains("not enough space"), "{e}");
        assert!(!dest.join("big").exists());
        let dest = fs.join("fine");
        std::fs::create_dir(&dest).unwrap();
        apply_layer(&tar_of(&[E::File("small", &[1u8; 4096], 0o644)])[..], &dest).unwrap();
    });
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(&fs)
        .status();
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn hostile_archives_are_refused_and_write_nothing_outside() {
    if !is_root() {
        eprintln!("skipped: needs root (owners)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let outside = d.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let outside_s = outside.to_str().unwrap().to_owned();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("dotdot path", tar_of(&[E::RawFile(b"../evil", b"x")])),
        (
            "nested dotdot",
            tar_of(&[E::RawFile(b"a/../../evil", b"x")]),
        ),
        (
            "absolute symlink then write-through",
            tar_of(&[
                E::Symlink("link", &outside_s),
                E::File("link/pwned", b"x", 0o644),
            ]),
        ),
        (
            "relative symlink climbing out",
            tar_of(&[E::Dir("a/", 0o755), E::Symlink("a/up", "../../..")]),
        ),
        (
            "hard link out",
            tar_of(&[E::Hardlink("h", "../../etc/passwd")]),
        ),
    ];
    for (what, t) in cases {
        let dest = d.path().join(format!("dest-{}", what.replace(' ', "-")));
        std::fs::create_dir(&dest).unwrap();
        let r = apply_layer(&t[..], &dest);
        assert!(
            matches!(r, Err(ImageError::Refused { .. })),
            "{what}: {r:?}"
        );
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "{what}: wrote outside"
        );
        assert!(!d.path().join("evil").exists(), "{what}");
    }
    // A directory entry replaces a symlink of the same name (never follows it).
    let dest = d.path().join("replaced");
    std::fs::create_dir(&dest).unwrap();
    apply_layer(
        &tar_of(&[
            E::Symlink("etc", &outside_s),
            E::Dir("etc/", 0o755),
            E::File("etc/passwd", b"x", 0o644),
        ])[..],
        &dest,
    )
    .unwrap();
    assert!(std::fs::symlink_metadata(dest.join("etc"))
        .unwrap()
        .is_dir());
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    // An absolute symlink alone is fine (it resolves inside the sandbox's root).
    let dest = d.path().join("ok");
    std::fs::create_dir(&dest).unwrap();
    apply_layer(
        &tar_of(&[E::Symlink("etc/mtab", "/proc/self/mounts")])[..],
        &dest,
    )
    .unwrap();
}

#[test]
fn a_tampered_blob_is_refused() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    write_layout(
        &img,
        &[tar_of(&[E::File("a", b"a", 0o644)])],
        serde_json::json!({}),
    );
    // Corrupt the layer blob in place.
    let blobs = img.join("blobs/sha256");
    let store = Store::open(&d.path().join("data")).unwrap();
    let image = rampart_image::oci::open(&img, &store).unwrap();
    let p = blobs.join(
        image.layers[0]
            .digest
            .as_ref()
            .unwrap()
            .trim_start_matches("sha256:"),
    );
    let mut b = std::fs::read(&p).unwrap();
    // The file's content (after the 512-byte header): the tar still parses.
    b[512] ^= 1;
    std::fs::write(&p, b).unwrap();
    let out = d.path().join("x");
    std::fs::create_dir(&out).unwrap();
    let e = rampart_image::oci::extract_layer(&image.layers[0], &out).unwrap_err();
    assert!(e.to_string().contains("digest"), "{e}");
}

// ---------- cache keys ----------

#[test]
fn cache_keys_follow_inputs() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("app")).unwrap();
    std::fs::write(d.path().join("app/a.txt"), "one").unwrap();
    let copy = Step::Copy {
        src: "app".into(),
        dest: "/opt/app".into(),
        owner: None,
        mode: None,
    };
    let chain = vec!["a".repeat(64)];
    let cfg = TemplateConfig::default();
    let k1 = step_key(&chain, &copy, &cfg, d.path()).unwrap();
    assert_eq!(k1, step_key(&chain, &copy, &cfg, d.path()).unwrap());
    std::fs::write(d.path().join("app/a.txt"), "two").unwrap();
    let k2 = step_key(&chain, &copy, &cfg, d.path()).unwrap();
    assert_ne!(k1, k2, "content changes the key");
    let chain2 = vec!["b".repeat(64)];
    assert_ne!(
        k2,
        step_key(&chain2, &copy, &cfg, d.path()).unwrap(),
        "the chain below changes it"
    );
    let run = Step::Run {
        cmd: "echo hi".into(),
        user: None,
    };
    let r1 = step_key(&chain, &run, &cfg, d.path()).unwrap();
    let mut cfg2 = cfg.clone();
    cfg2.user = Some("user".into());
    assert_ne!(
        r1,
        step_key(&chain, &run, &cfg2, d.path()).unwrap(),
        "the user changes a run"
    );
    assert_ne!(
        r1,
        step_key(
            &chain,
            &Step::Run {
                cmd: "echo ho".into(),
                user: None
            },
            &cfg,
            d.path()
        )
        .unwrap()
    );
    assert_ne!(
        r1,
        step_key(
            &chain,
            &Step::Run {
                cmd: "echo hi".into(),
                user: Some("root".into())
            },
            &cfg,
            d.path()
        )
        .unwrap(),
        "a run's own user changes its key"
    );
    assert_eq!(
        rampart_image::build::debian_key("bookworm", "apt", &["b".into(), "a".into()], "m"),
        rampart_image::build::debian_key("bookworm", "apt", &["a".into(), "b".into()], "m"),
    );
}

// ---------- the builder, with a fake runner ----------

/// Writes `/ran/<n>` into the upper directory for each run; fails commands containing "FAIL".
#[derive(Debug, Default)]
struct FakeRunner {
    runs: std::sync::Mutex<Vec<String>>,
    users: std::sync::Mutex<Vec<String>>,
}

impl StepRunner for FakeRunner {
    fn run(
        &self,
        req: &RunRequest,
        out: &mut dyn FnMut(&[u8]),
        _c: &AtomicBool,
    ) -> Result<i32, ImageError> {
        let mut runs = self.runs.lock().unwrap();
        runs.push(req.command.clone());
        self.users.lock().unwrap().push(req.user.clone());
        std::fs::create_dir_all(req.upper.join("ran")).unwrap();
        std::fs::write(req.upper.join(format!("ran/{}", runs.len())), &req.command).unwrap();
        out(b"fake output\n");
        Ok(if req.command.contains("FAIL") { 1 } else { 0 })
    }
}

#[test]
fn rebuild_reuses_layers_up_to_the_changed_step_and_failures_leave_nothing() {
    if !is_root() {
        eprintln!("skipped: needs root (owners)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    write_layout(
        &img,
        &whiteout_layers(),
        serde_json::json!({"User": "root"}),
    );
    std::fs::write(d.path().join("hello.txt"), "hello").unwrap();
    let spec_text = |run2: &str| {
        format!(
            "from = \"oci:img\"\n[[steps]]\nrun = \"echo one\"\n[[steps]]\ncopy = {{ src = \"hello.txt\", dest = \"/srv/hello.txt\" }}\n[[steps]]\nenv = {{ X = \"1\" }}\n[[steps]]\nrun = \"{run2}\"\n"
        )
    };
    let store = Store::open(&d.path().join("data")).unwrap();
    let fake = FakeRunner::default();
    let b = Builder::new(&store, &fake, 100_000);
    let mut evs = Vec::new();
    let spec = Spec::parse(&spec_text("echo two"), d.path()).unwrap();
    let r1 = b
        .build(&spec, "t", &BuildOptions::default(), &mut |e| evs.push(e))
        .unwrap();
    // Metadata steps (env) make no layer and count as cached.
    assert!(
        r1.steps
            .iter()
            .filter(|s| s.kind != "env")
            .all(|s| !s.cached),
        "{:?}",
        r1.steps
    );
    assert!(evs
        .iter()
        .any(|e| matches!(e, BuildEvent::Output { text } if text.contains("fake output"))));
    assert_eq!(
        r1.manifest.config.env.get("X").map(String::as_str),
        Some("1")
    );
    // skeleton + 2 OCI layers + run + copy + run
    assert_eq!(r1.manifest.layers.len(), 6);
    // Same spec: everything cached, same id.
    let r2 = b
        .build(&spec, "t", &BuildOptions::default(), &mut |_| {})
        .unwrap();
    assert!(r2.steps.iter().all(|s| s.cached));
    assert_eq!(r1.id, r2.id);
    // Change the copied file: base and the first run are reused, the rest redone.
    std::fs::write(d.path().join("hello.txt"), "hello again").unwrap();
    let r3 = b
        .build(&spec, "t", &BuildOptions::default(), &mut |_| {})
        .unwrap();
    let cached: Vec<bool> = r3.steps.iter().map(|s| s.cached).collect();
    assert_eq!(cached, [true, true, false, true, false]);
    assert_ne!(r3.id, r1.id);
    assert_eq!(fake.runs.lock().unwrap().len(), 3);
    // A second template sharing the steps shares the layers.
    let r4 = b
        .build(&spec, "t2", &BuildOptions::default(), &mut |_| {})
        .unwrap();
    assert_eq!(r4.manifest.layers, r3.manifest.layers);
    assert_eq!(store.list().len(), 2);
    // A failing step: no new layer, nothing in tmp, the name not moved.
    let layers_before = std::fs::read_dir(store.root().join("layers"))
        .unwrap()
        .count();
    let bad = Spec::parse(&spec_text("FAIL"), d.path()).unwrap();
    let e = b
        .build(&bad, "t", &BuildOptions::default(), &mut |_| {})
        .unwrap_err();
    assert!(matches!(e, ImageError::Step { index: 4, .. }), "{e}");
    assert_eq!(
        std::fs::read_dir(store.root().join("layers"))
            .unwrap()
            .count(),
        layers_before
    );
    assert_eq!(
        std::fs::read_dir(store.root().join("tmp")).unwrap().count(),
        0
    );
    assert_eq!(store.resolve("t").unwrap().0, r3.id);
    // Interrupted before a step: nothing kept either.
    b.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = b
        .build(&spec, "t3", &BuildOptions::default(), &mut |_| {})
        .unwrap_err();
    assert!(matches!(e, ImageError::Interrupted));
    assert!(store.name("t3").is_none());
    assert_eq!(
        std::fs::read_dir(store.root().join("tmp")).unwrap().count(),
        0
    );
    // rm + gc: t's old layers (from r1) and now t2's go once unreferenced.
    store.remove("t2").unwrap();
    let g = store.gc().unwrap();
    assert!(
        !g.layers.is_empty(),
        "r1's last two layers are unreferenced"
    );
    for k in &r3.manifest.layers {
        assert!(store.has_layer(k), "t's layers stay");
    }
    store.remove("t").unwrap();
    store.gc().unwrap();
    assert_eq!(
        std::fs::read_dir(store.root().join("layers"))
            .unwrap()
            .count(),
        0
    );
}

/// Writes the whiteout layout at `dir/img`, opens a store at `dir/data` and builds `spec`
/// (relative to `dir`) as template "p" with the fake runner.
fn build_p(dir: &Path, spec: &str) -> (Store, rampart_image::build::BuildReport) {
    write_layout(&dir.join("img"), &whiteout_layers(), serde_json::json!({}));
    let store = Store::open(&dir.join("data")).unwrap();
    let fake = FakeRunner::default();
    let spec = Spec::parse(spec, dir).unwrap();
    let r = Builder::new(&store, &fake, 100_000)
        .build(&spec, "p", &BuildOptions::default(), &mut |_| {})
        .unwrap();
    (store, r)
}

#[test]
fn gc_keeps_layers_pinned_by_live_sandboxes() {
    if !is_root() {
        eprintln!("skipped: needs root (owners)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (store, r) = build_p(d.path(), "from = \"oci:img\"\n[[steps]]\nrun = \"x\"\n");
    let sandbox_dir = d.path().join("sandboxes/abc");
    std::fs::create_dir_all(&sandbox_dir).unwrap();
    store.pin("abc", &sandbox_dir, &r.manifest.layers).unwrap();
    store.remove("p").unwrap();
    // What the sandbox's root is made of stays known after its template's name went.
    let want: Vec<PathBuf> = r
        .manifest
        .layers
        .iter()
        .map(|k| store.layer_fs(k))
        .collect();
    assert_eq!(store.pinned_layers("abc"), Some(want));
    assert_eq!(store.pinned_layers("../abc"), None);
    let g = store.gc().unwrap();
    assert!(g.layers.is_empty(), "a live sandbox's layers stay: {g:?}");
    for k in &r.manifest.layers {
        assert!(store.has_layer(k));
    }
    // The sandbox is gone: its pin is pruned and the layers go.
    std::fs::remove_dir(&sandbox_dir).unwrap();
    let g = store.gc().unwrap();
    assert_eq!(g.layers.len(), r.manifest.layers.len());
    assert_eq!(
        std::fs::read_dir(store.root().join("pins"))
            .unwrap()
            .count(),
        0
    );
}

/// gc waits for a create that holds the pin guard (between its resolve and its pin).
#[test]
fn gc_waits_for_a_create_between_resolve_and_pin() {
    if !is_root() {
        eprintln!("skipped: needs root (owners)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (store, r) = build_p(d.path(), "from = \"oci:img\"\n");
    // A create resolved "p" and holds the guard; the template is removed meanwhile.
    let guard = store.pin_guard().unwrap();
    let (id, m) = store.resolve("p").unwrap();
    assert_eq!(id, r.id);
    store.remove("p").unwrap();
    let root = store.root().to_path_buf();
    let gc = std::thread::spawn(move || {
        let s = Store::open_existing(root.parent().unwrap()).unwrap();
        s.gc().unwrap()
    });
    // gc waits on the guard (without it, it would be done in milliseconds and take the
    // layers: the create has not pinned them yet).
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_millis(500) {
        assert!(!gc.is_finished(), "gc ran while a create held the guard");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The create pins, its sandbox's directory appears (the jail's launch), it lets go.
    let sandbox_dir = d.path().join("sandboxes/abc");
    store.pin("abc", &sandbox_dir, &m.layers).unwrap();
    std::fs::create_dir_all(&sandbox_dir).unwrap();
    drop(guard);
    let g = gc.join().unwrap();
    assert!(g.layers.is_empty(), "the pinned layers stay: {g:?}");
    for k in &m.layers {
        assert!(store.has_layer(k));
    }
}

/// Turning a build upper into a layer never follows a symlink the step made (`etc -> dir`
/// outside) to remove a file there.
#[test]
fn finishing_an_upper_never_follows_its_symlinks() {
    let d = tempfile::tempdir().unwrap();
    let outside = d.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("resolv.conf"), "").unwrap();
    let upper = d.path().join("upper");
    std::fs::create_dir(&upper).unwrap();
    std::os::unix::fs::symlink(&outside, upper.join("etc")).unwrap();
    rampart_image::build::finish_upper(&upper, 1 << 30, false).unwrap();
    assert!(
        outside.join("resolv.conf").exists(),
        "a host file was removed"
    );
}

/// Turning a build upper into a layer moves owners from the sandbox's range back to the
/// image's, keeps set-id bits, and drops overlayfs bookkeeping xattrs other than `opaque`.
#[test]
fn finishing_an_upper_shifts_owners_and_strips_overlay_xattrs() {
    if !is_root() {
        eprintln!("skipped: needs root (chown, trusted xattrs)");
        return;
    }
    let base = 1u32 << 30;
    let d = tempfile::tempdir().unwrap();
    let upper = d.path().join("upper");
    std::fs::create_dir_all(upper.join("a/b")).unwrap();
    let f = upper.join("a/b/tool");
    std::fs::write(&f, "x").unwrap();
    for (p, id) in [(&upper, base), (&upper.join("a"), base + 7), (&f, base + 5)] {
        std::os::unix::fs::lchown(p, Some(id), Some(id)).unwrap();
    }
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    let set = |p: &Path, k: &str, v: &[u8]| {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        let k = std::ffi::CString::new(k).unwrap();
        // SAFETY: valid C strings and buffer.
        let rc = unsafe { libc::lsetxattr(c.as_ptr(), k.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        rc == 0
    };
    let a = upper.join("a");
    if !set(&a, "trusted.overlay.opaque", b"y") || !set(&a, "trusted.overlay.origin", b"o") {
        eprintln!("skipped: no trusted xattrs here");
        return;
    }
    rampart_image::build::finish_upper(&upper, base, false).unwrap();
    let md = |p: &Path| std::fs::symlink_metadata(p).unwrap();
    assert_eq!((md(&upper).uid(), md(&upper).gid()), (0, 0));
    assert_eq!((md(&a).uid(), md(&a).gid()), (7, 7));
    assert_eq!((md(&f).uid(), md(&f).gid()), (5, 5));
    assert_eq!(md(&f).mode() & 0o7777, 0o4755, "set-id bit kept");
    assert_eq!(
        xattr(&a, "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(xattr(&a, "trusted.overlay.origin"), None);
}

/// Layers keep images' setuid-root files: host users must not reach the store.
#[test]
fn the_store_is_closed_to_host_users() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("data")).unwrap();
    let store = Store::open(&d.path().join("data")).unwrap();
    for d in ["layers", "tmp"] {
        let mode = std::fs::metadata(store.root().join(d)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700, "images/{d} mode {mode:o}");
    }
}

/// A tar of every file under `dir` (paths relative to it).
fn tar_dir(dir: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", dir).unwrap();
    b.into_inner().unwrap()
}

/// An archive's own symlinks never lead the import to host files: a `docker save` archive
/// whose layer (or config) path goes through `l -> /somewhere`, or an OCI archive whose
/// `blobs` is a link out, is refused.
#[test]
fn archive_symlinks_never_lead_to_host_files() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(&d.path().join("data")).unwrap();
    // Host files outside the archive: a tar and a JSON config.
    let host = d.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(
        host.join("private.tar"),
        tar_of(&[E::File("secret", b"host secret\n", 0o600)]),
    )
    .unwrap();
    std::fs::write(host.join("cfg.json"), br#"{"config":{}}"#).unwrap();
    let host_s = host.to_str().unwrap();
    let ds = tar_of(&[
        E::Symlink("l", host_s),
        E::File(
            "manifest.json",
            br#"[{"Config":"l/cfg.json","Layers":["l/private.tar"]}]"#,
            0o644,
        ),
    ]);
    let dsa = d.path().join("ds.tar");
    std::fs::write(&dsa, ds).unwrap();
    let e = rampart_image::oci::open(&dsa, &store).unwrap_err();
    assert!(e.to_string().contains("outside the archive"), "{e}");
    // An OCI layout archive whose blobs/ is a link to a copy of a layout elsewhere.
    let img = d.path().join("img");
    write_layout(&img, &whiteout_layers(), serde_json::json!({}));
    let oa = tar_of(&[
        E::Symlink("blobs", &format!("{}/blobs", img.display())),
        E::File(
            "index.json",
            &std::fs::read(img.join("index.json")).unwrap(),
            0o644,
        ),
        E::File("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#, 0o644),
    ]);
    let oaa = d.path().join("oa.tar");
    std::fs::write(&oaa, oa).unwrap();
    let e = rampart_image::oci::open(&oaa, &store).unwrap_err();
    assert!(e.to_string().contains("outside the archive"), "{e}");
    assert_eq!(
        std::fs::read_dir(store.root().join("tmp")).unwrap().count(),
        0,
        "the unpacked archive is removed"
    );
}

#[test]
fn oci_and_docker_save_archives_are_read() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(&d.path().join("data")).unwrap();
    // An OCI layout as a tar archive.
    let img = d.path().join("img");
    write_layout(
        &img,
        &whiteout_layers(),
        serde_json::json!({"Env": ["A=1"], "User": "root"}),
    );
    let archive = d.path().join("img.tar");
    std::fs::write(&archive, tar_dir(&img)).unwrap();
    let a = rampart_image::oci::open(&archive, &store).unwrap();
    assert_eq!(a.layers.len(), 2);
    assert_eq!(a.config.env.get("A").map(String::as_str), Some("1"));
    let keys: Vec<_> = a.layers.iter().map(|l| l.key.clone()).collect();
    drop(a);
    assert_eq!(
        std::fs::read_dir(store.root().join("tmp")).unwrap().count(),
        0,
        "the unpacked archive goes with the image"
    );
    // The same layers from the directory have the same keys (shared in the store).
    let b = rampart_image::oci::open(&img, &store).unwrap();
    assert_eq!(
        b.layers.iter().map(|l| l.key.clone()).collect::<Vec<_>>(),
        keys
    );
    // A `docker save` archive: manifest.json, <id>/layer.tar, <config>.json.
    let ds = d.path().join("ds");
    std::fs::create_dir_all(ds.join("abc")).unwrap();
    std::fs::write(
        ds.join("abc/layer.tar"),
        tar_of(&[E::File("hello", b"docker\n", 0o644)]),
    )
    .unwrap();
    std::fs::write(
        ds.join("cfg.json"),
        br#"{"config":{"Env":["B=2"],"User":"nobody","WorkingDir":"/w","Cmd":["sleep","1"]}}"#,
    )
    .unwrap();
    std::fs::write(
        ds.join("manifest.json"),
        br#"[{"Config":"cfg.json","RepoTags":["x:latest"],"Layers":["abc/layer.tar"]}]"#,
    )
    .unwrap();
    let dsa = d.path().join("ds.tar");
    std::fs::write(&dsa, tar_dir(&ds)).unwrap();
    let c = rampart_image::oci::open(&dsa, &store).unwrap();
    assert_eq!(c.layers.len(), 1);
    assert_eq!(c.config.user.as_deref(), Some("nobody"));
    assert_eq!(c.config.workdir.as_deref(), Some("/w"));
    assert_eq!(c.config.start.as_ref().unwrap().cmd, ["sleep", "1"]);
    let out = d.path().join("out");
    std::fs::create_dir(&out).unwrap();
    rampart_image::oci::extract_layer(&c.layers[0], &out).unwrap();
    assert_eq!(
        std::fs::read_to_string(out.join("hello")).unwrap(),
        "docker\n"
    );
    // A zstd layer is refused with the reason.
    let z = d.path().join("z");
    write_layout(
        &z,
        &[vec![0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0]],
        serde_json::json!({}),
    );
    let zi = rampart_image::oci::open(&z, &store).unwrap();
    let zo = d.path().join("zo");
    std::fs::create_dir(&zo).unwrap();
    let e = rampart_image::oci::extract_layer(&zi.layers[0], &zo).unwrap_err();
    assert!(e.to_string().contains("zstd"), "{e}");
}

#[test]
fn new_step_kinds_parse_and_name_their_errors() {
    let s = parse(
        r#"from = "template:base"
[[steps]]
npm = ["typescript@5", "@scope/tool"]
[[steps]]
run = { cmd = ["id -un", "true"], user = "user" }
[[steps]]
copy = { src = "a", dest = "/etc/app/", owner = "user:user", mode = "0640" }
"#,
    )
    .unwrap();
    assert_eq!(s.from, Base::Template("base".into()));
    assert_eq!(
        s.steps[0],
        Step::Npm(vec!["typescript@5".into(), "@scope/tool".into()])
    );
    assert_eq!(
        s.steps[1],
        Step::Run {
            cmd: "id -un && true".into(),
            user: Some("user".into())
        }
    );
    assert_eq!(
        s.steps[2],
        Step::Copy {
            src: "a".into(),
            dest: "/etc/app/".into(),
            owner: Some("user:user".into()),
            mode: Some(0o640)
        }
    );
    for (extra, field) in [
        ("[[steps]]\nnpm = [\"--global\"]", "steps[1].npm"),
        ("[[steps]]\nnpm = [\"a; rm -rf /\"]", "steps[1].npm"),
        (
            "[[steps]]\nrun = { cmd = \"x\", user = \"a b\" }",
            "steps[1].run.user",
        ),
        (
            "[[steps]]\nrun = { cmd = \"x\", as = \"root\" }",
            "steps[1].run.as",
        ),
        (
            "[[steps]]\ncopy = { src = \"a\", dest = \"/x\", mode = \"999\" }",
            "steps[1].copy.mode",
        ),
        (
            "[[steps]]\ncopy = { src = \"a\", dest = \"/x\", owner = \"a:b:c\" }",
            "steps[1].copy.owner",
        ),
    ] {
        let e = parse(&format!("from = \"oci:x\"\n{extra}")).unwrap_err();
        assert_eq!(e.field, field, "{extra}: {e}");
    }
}

#[test]
fn template_references_and_tags() {
    assert_eq!(rampart_image::check_ref("t").unwrap(), "t");
    assert_eq!(rampart_image::check_ref("t:default").unwrap(), "t");
    assert_eq!(rampart_image::check_ref("t:V1.2-rc").unwrap(), "t:V1.2-rc");
    for bad in ["t:", "t:a/b", "t:-x", "T:x", "base", "base:v1", "t:a:b"] {
        assert!(rampart_image::check_ref(bad).is_err(), "{bad}");
    }
    // A tenant's template: `<tenant>~<name>`, one owner, a valid name under it.
    assert_eq!(rampart_image::check_ref("acme~t:v1").unwrap(), "acme~t:v1");
    assert_eq!(
        rampart_image::check_ref("acme~t:default").unwrap(),
        "acme~t"
    );
    for bad in [
        "~t",
        "acme~",
        "a~b~c",
        "acme~base",
        "Acme~t",
        "a/b~t",
        "acme~T",
    ] {
        assert!(rampart_image::check_ref(bad).is_err(), "{bad}");
    }
    assert!(rampart_image::check_name("acme~t").is_err());
}

#[test]
fn run_users_copy_owners_tags_and_skipping_the_cache() {
    if !is_root() {
        eprintln!("skipped: needs root (owners)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    write_layout(
        &d.path().join("img"),
        &whiteout_layers(),
        serde_json::json!({"User": "root"}),
    );
    std::fs::write(d.path().join("cfg.json"), "{}").unwrap();
    let spec = Spec::parse(
        r#"from = "oci:img"
[[steps]]
run = { cmd = "echo as-user", user = "1000" }
[[steps]]
run = "echo as-template-user"
[[steps]]
copy = { src = "cfg.json", dest = "/etc/app/", owner = "1000:1000", mode = "0640" }
[[steps]]
run = "echo last"
"#,
        d.path(),
    )
    .unwrap();
    let store = Store::open(&d.path().join("data")).unwrap();
    let fake = FakeRunner::default();
    let b = Builder::new(&store, &fake, 100_000);
    let opts = BuildOptions {
        build_id: Some("b1".into()),
        ..Default::default()
    };
    let r = b.build(&spec, "t:v1", &opts, &mut |_| {}).unwrap();
    assert_eq!(*fake.users.lock().unwrap(), ["1000", "root", "root"]);
    // The copy went into /etc/app/ with its owner and mode.
    let copy_layer = store.layer_fs(&r.steps[3].layers[0]);
    let md = std::fs::metadata(copy_layer.join("etc/app/cfg.json")).unwrap();
    assert_eq!(
        (md.uid(), md.gid(), md.mode() & 0o7777),
        (1000, 1000, 0o640)
    );
    // Tagged: `t:v1` is a reference of its own, with the build id; `t` is not made.
    let rec = store.name("t:v1").unwrap();
    assert_eq!(rec.build.as_deref(), Some("b1"));
    assert!(store.name("t").is_none());
    store.tag("t", &r.id).unwrap();
    let tags: Vec<String> = store.tags("t").into_iter().map(|(t, _)| t).collect();
    assert_eq!(tags, ["default", "v1"]);
    // Skipping the cache from step 3 on redoes steps 3 and 4 only.
    let before = fake.runs.lock().unwrap().len();
    let opts = BuildOptions {
        no_cache_from: Some(3),
        ..Default::default()
    };
    let r2 = b.build(&spec, "t:v1", &opts, &mut |_| {}).unwrap();
    let cached: Vec<bool> = r2.steps.iter().map(|s| s.cached).collect();
    assert_eq!(cached, [true, true, true, false, false]);
    assert_eq!(fake.runs.lock().unwrap().len(), before + 1);
    store.remove("t:v1").unwrap();
    assert!(store.name("t:v1").is_none());
    // `template:base` needs the built-in base's directory.
    let e = b
        .build(
            &Spec::parse(
                "from = \"template:base\"\n[[steps]]\nrun = \"true\"",
                d.path(),
            )
            .unwrap(),
            "onbase",
            &BuildOptions::default(),
            &mut |_| {},
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("built-in base is not available"),
        "{e}"
    );
}
