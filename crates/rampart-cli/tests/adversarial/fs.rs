//! Host files: read by path from inside, and through the file API with `..`, absolute and
//! relative symlinks, and a symlink swap race.

use super::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Removes host files on drop.
struct RemoveOnDrop(Vec<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            if p.is_dir() {
                let _ = std::fs::remove_dir_all(p);
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// Secret files planted on the host for one test.
struct Secrets {
    /// The content that must never come back.
    content: String,
    /// Their common file name.
    name: String,
    /// In the daemon's temp dir (the parent of its data dir).
    in_tmp: PathBuf,
    /// In /root.
    in_root: PathBuf,
    _cleanup: RemoveOnDrop,
}

fn plant_secrets(d: &Daemon) -> Secrets {
    let content = format!("RAMPART-HOST-SECRET-{}", token());
    let name = format!("rampart-test-secret-{}", token());
    let in_tmp = d.root.join(&name);
    let in_root = PathBuf::from("/root").join(&name);
    std::fs::write(&in_tmp, &content).expect("write secret in temp dir");
    std::fs::write(&in_root, &content).expect("write secret in /root");
    Secrets {
        content,
        name,
        in_tmp: in_tmp.clone(),
        in_root: in_root.clone(),
        _cleanup: RemoveOnDrop(vec![in_tmp, in_root]),
    }
}

impl Secrets {
    fn paths(&self) -> [String; 2] {
        [
            self.in_tmp.display().to_string(),
            self.in_root.display().to_string(),
        ]
    }
    fn assert_intact(&self) {
        for p in [&self.in_tmp, &self.in_root] {
            let now = std::fs::read_to_string(p)
                .unwrap_or_else(|e| panic!("host secret {} is gone: {e}", p.display()));
            assert_eq!(
                now,
                self.content,
                "host secret {} was modified from inside",
                p.display()
            );
        }
    }
}

#[test]
fn sandbox_blocks_host_file_read_by_path() {
    let Some(d) = daemon() else { return };
    let s = plant_secrets(d);
    let sb = sandbox(d);
    let mut script = String::new();
    for p in s.paths() {
        for prefix in [
            "",
            "/proc/1/root",
            "/proc/self/root",
            "/proc/thread-self/root",
            "/../../..",
            "/proc/1/cwd/../../..",
        ] {
            script.push_str(&format!("cat '{prefix}{p}' 2>&1; "));
        }
    }
    // Every process's root and cwd, as seen from inside.
    for p in s.paths() {
        script.push_str(&format!(
            "for r in /proc/[0-9]*/root /proc/[0-9]*/cwd; do cat \"$r{p}\" 2>/dev/null; done; "
        ));
    }
    script.push_str("echo done");
    for user in ["user", "root"] {
        let r = sb.bash(user, &script, 60);
        assert!(
            !r.stdout.contains(&s.content) && !r.stderr.contains(&s.content),
            "reading a host file by path from inside (as {user}) returned the secret:\n{}",
            show(&r)
        );
        assert!(
            r.stdout.contains("done"),
            "the probe did not run to its end:\n{}",
            show(&r)
        );
    }
    // Look for the file by name anywhere in the sandbox (except /proc and /sys).
    let r = sb.bash(
        "root",
        &format!("find / \\( -path /proc -o -path /sys \\) -prune -o -name '{}' -print 2>/dev/null; echo end", s.name),
        120,
    );
    assert_eq!(
        r.stdout.trim(),
        "end",
        "the host secret file is visible inside the sandbox:\n{}",
        show(&r)
    );

    // Writes to paths shared with the template (/usr is the host's /usr, read-only) land in
    // the sandbox's own layer, never on the host.
    let probe = format!("rampart-adv-{}", token());
    let _cleanup = RemoveOnDrop(vec![
        PathBuf::from("/usr").join(&probe),
        PathBuf::from("/usr/bin").join(&probe),
    ]);
    let r = sb.bash(
        "root",
        &format!("touch /usr/{probe} /usr/bin/{probe} 2>&1; echo x >> /usr/bin/env 2>&1; echo end"),
        30,
    );
    assert!(
        !Path::new("/usr").join(&probe).exists() && !Path::new("/usr/bin").join(&probe).exists(),
        "a file created inside under /usr appeared on the host:\n{}",
        show(&r)
    );
    let env_tail = std::fs::read("/usr/bin/env").expect("read host /usr/bin/env");
    assert!(
        !env_tail.ends_with(b"x\n"),
        "appending to /usr/bin/env inside modified the host's file:\n{}",
        show(&r)
    );
    s.assert_intact();
    assert_host_healthy(d);
}

/// Paths that try to reach `secret` (absolute host path `abs`) through `..` sequences.
fn dotdot_variants(abs: &str, name: &str) -> Vec<String> {
    let rel = abs.trim_start_matches('/');
    let mut v = vec![
        abs.to_string(),
        format!("/proc/1/root{abs}"),
        format!("/proc/self/root{abs}"),
    ];
    for n in 1..=12 {
        let up = "../".repeat(n);
        v.push(format!("{up}{rel}"));
        v.push(format!("/{up}{rel}"));
        v.push(format!("/home/user/{up}{rel}"));
        // Relative to wherever the sandbox's root lives under the daemon's data dir, the
        // secret sits next to `data/`.
        v.push(format!("{up}{name}"));
        v.push(format!("/{up}{name}"));
        v.push(format!("/home/user/{up}{name}"));
        v.push(format!("/home/user/{}{}", "..%2f".repeat(n), name));
    }
    v
}

/// Asserts a file API response does not carry the secret; a 200 list must not name it.
fn assert_no_leak(what: &str, r: &Resp, s: &Secrets) {
    assert!(
        !r.text().contains(&s.content),
        "{what} returned the host secret: {} {}",
        r.status,
        r.text()
    );
    if r.status == 200 {
        if let Ok(v) = serde_json::from_slice::<Value>(&r.body) {
            // The host directory holds `daemon.log`, `data/` and the secret; a decoy inside
            // the sandbox may share the secret's name but not its size.
            let leaked: Vec<&Value> = v["entries"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|e| {
                            let name = e["name"].as_str().unwrap_or("");
                            let size = e["size"].as_u64().unwrap_or(0);
                            name == "daemon.log"
                                || (name == s.name && size == s.content.len() as u64)
                        })
                        .collect()
                })
                .unwrap_or_default();
            assert!(
                leaked.is_empty(),
                "{what} listed the host directory holding the secret: {}",
                r.text()
            );
        }
    }
}

#[test]
fn sandbox_blocks_file_api_dotdot_and_absolute_symlinks() {
    let Some(d) = daemon() else { return };
    let s = plant_secrets(d);
    let sb = sandbox(d);
    let host_dir = d.root.display().to_string();

    // `..` sequences and host paths straight through the API.
    let mut statuses = BTreeMap::<u16, usize>::new();
    for p in s.paths() {
        for v in dotdot_variants(&p, &s.name) {
            for ep in ["", "/stat"] {
                let r = sb.files("GET", ep, &v, Body::None);
                *statuses.entry(r.status).or_default() += 1;
                assert_no_leak(&format!("GET files{ep}?path={v}"), &r, &s);
            }
        }
    }
    for v in dotdot_variants(&host_dir, "") {
        let r = sb.files("GET", "/list", &v, Body::None);
        assert_no_leak(&format!("GET files/list?path={v}"), &r, &s);
    }
    eprintln!("dotdot requests by status: {statuses:?}");

    // Absolute and relative symlinks made inside, pointing at the host paths.
    let mut script = String::from("set -e; cd /home/user; ");
    script.push_str(&format!(
        "ln -s '{}' abs_tmp; ln -s '{}' abs_root; ln -s '{host_dir}' absdir; ",
        s.paths()[0],
        s.paths()[1]
    ));
    script.push_str(&format!("ln -s '/proc/1/root{}' proc_root; ", s.paths()[0]));
    for n in 1..=10 {
        script.push_str(&format!(
            "ln -s '{}{}' rel{n}; ",
            "../".repeat(n),
            s.paths()[0].trim_start_matches('/')
        ));
        script.push_str(&format!("ln -s '{}' reldir{n}; ", "../".repeat(n)));
    }
    script.push_str("echo 'inside' > mv-src; ls -la");
    let r = sb.bash("user", &script, 30);
    assert_eq!(
        r.exit_code,
        Some(0),
        "making symlinks inside failed:\n{}",
        show(&r)
    );

    let mut links = vec![
        "abs_tmp".to_string(),
        "abs_root".into(),
        "proc_root".into(),
        format!("absdir/{}", s.name),
    ];
    for n in 1..=10 {
        links.push(format!("rel{n}"));
        links.push(format!("reldir{n}/{}", s.name));
        links.push(format!(
            "reldir{n}/{}/{}",
            host_dir.trim_start_matches('/'),
            s.name
        ));
    }
    for l in &links {
        let p = format!("/home/user/{l}");
        for ep in ["", "/stat"] {
            let r = sb.files("GET", ep, &p, Body::None);
            assert_no_leak(&format!("GET files{ep}?path={p}"), &r, &s);
        }
    }
    for p in ["/home/user/absdir".to_string(), "/home/user/reldir3".into()] {
        for depth in ["1", "3"] {
            let url = format!(
                "/v1/sandboxes/{}/files/list?path={}&depth={depth}",
                sb.id,
                pct_encode(&p)
            );
            let r = get(d, &url);
            assert_no_leak(&format!("GET files/list?path={p}&depth={depth}"), &r, &s);
        }
    }

    // Writes, mkdir, move and delete through the symlinks must not touch the host.
    let pw = format!("pwned-{}", token());
    let r = sb.files(
        "PUT",
        "",
        &format!("/home/user/absdir/{pw}"),
        Body::Bytes(b"pwned"),
    );
    assert!(
        !d.root.join(&pw).exists(),
        "PUT through an absolute dir symlink created a host file: {} {}",
        r.status,
        r.text()
    );
    let r = sb.files("PUT", "", "/home/user/abs_tmp", Body::Bytes(b"overwritten"));
    s.assert_intact();
    eprintln!(
        "PUT through a file symlink to a host path: {} {}",
        r.status,
        r.text()
    );
    for n in 1..=10 {
        let _ = sb.files(
            "PUT",
            "",
            &format!(
                "/home/user/reldir{n}/{}/{pw}",
                host_dir.trim_start_matches('/')
            ),
            Body::Bytes(b"pwned"),
        );
        let _ = sb.files(
            "PUT",
            "",
            &format!(
                "/home/user/{}{}/{pw}",
                "../".repeat(n),
                host_dir.trim_start_matches('/')
            ),
            Body::Bytes(b"pwned"),
        );
    }
    assert!(
        !d.root.join(&pw).exists(),
        "PUT through a relative symlink or `..` created a host file"
    );
    let pd = format!("pwndir-{}", token());
    let r = sb.post_json(
        "/files/mkdir",
        &serde_json::json!({"path": format!("/home/user/absdir/{pd}")}),
    );
    assert!(
        !d.root.join(&pd).exists(),
        "mkdir through a dir symlink created a host directory: {} {}",
        r.status,
        r.text()
    );
    let mv = format!("moved-{}", token());
    let r = sb.post_json(
        "/files/move",
        &serde_json::json!({"from": "/home/user/mv-src", "to": format!("/home/user/absdir/{mv}")}),
    );
    assert!(
        !d.root.join(&mv).exists(),
        "move through a dir symlink put a file on the host: {} {}",
        r.status,
        r.text()
    );
    let r = sb.post_json("/files/move", &serde_json::json!({"from": format!("/home/user/absdir/{}", s.name), "to": "/home/user/stolen"}));
    s.assert_intact();
    let got = sb.files("GET", "", "/home/user/stolen", Body::None);
    assert_no_leak("GET of a file moved in from a host path", &got, &s);
    eprintln!("move from a host path: {} {}", r.status, r.text());
    for p in [
        format!("/home/user/absdir/{}", s.name),
        "/home/user/abs_tmp".into(),
        s.paths()[0].clone(),
        format!("../../../../../../{}", s.name),
    ] {
        let _ = sb.files("DELETE", "", &p, Body::None);
    }
    s.assert_intact();
    assert_host_healthy(d);
}

const SWAPPER: &str = r#"
import ctypes, os, sys, time
host_dir, host_file, name = sys.argv[1], sys.argv[2], sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
os.chdir('/home/user')
os.makedirs('d_real', exist_ok=True)
open('d_real/' + name, 'w').write('decoy\n')
open('f_real', 'w').write('decoy\n')
os.symlink(host_dir, 'race')
os.symlink(host_file, 'racefile')
def xchg(a, b):
    if libc.renameat2(-100, a, -100, b, 2) != 0:
        e = ctypes.get_errno()
        raise OSError(e, 'renameat2 RENAME_EXCHANGE: ' + os.strerror(e))
n = 0
open('started', 'w').write('1')
end = time.time() + 60
while not os.path.exists('stop') and time.time() < end:
    for _ in range(200):
        xchg(b'race', b'd_real')
        xchg(b'racefile', b'f_real')
        n += 1
print('swaps', n)
"#;

#[test]
fn sandbox_blocks_file_api_symlink_race() {
    let Some(d) = daemon() else { return };
    let s = plant_secrets(d);
    let sb = sandbox(d);
    let host_dir = d.root.display().to_string();
    let pw = format!("pwned-{}", token());
    let (swapper, counts) = std::thread::scope(|scope| {
        let args = vec![host_dir.clone(), s.paths()[0].clone(), s.name.clone()];
        let sbr = &sb;
        let h = scope.spawn(move || sbr.py("user", SWAPPER, &args, 90));
        let started = wait_for(60, || {
            (sb.files("GET", "", "/home/user/started", Body::None).status == 200).then_some(())
        });
        let mut counts = BTreeMap::<String, usize>::new();
        if started.is_some() {
            let t0 = Instant::now();
            let mut i = 0usize;
            while i < 3000 && t0.elapsed() < Duration::from_secs(8) {
                for p in [
                    format!("/home/user/race/{}", s.name),
                    "/home/user/racefile".into(),
                ] {
                    let r = sb.files("GET", "", &p, Body::None);
                    assert_no_leak(
                        &format!("GET files?path={p} during a symlink swap race"),
                        &r,
                        &s,
                    );
                    let kind = if r.status == 200 && r.text() == "decoy\n" {
                        "decoy".to_string()
                    } else {
                        r.status.to_string()
                    };
                    *counts.entry(kind).or_default() += 1;
                }
                if i.is_multiple_of(10) {
                    let r = sb.files("GET", "/list", "/home/user/race", Body::None);
                    assert_no_leak(
                        "GET files/list?path=/home/user/race during the race",
                        &r,
                        &s,
                    );
                    let _ = sb.files(
                        "PUT",
                        "",
                        &format!("/home/user/race/{pw}"),
                        Body::Bytes(b"pwned"),
                    );
                    assert!(
                        !d.root.join(&pw).exists(),
                        "PUT during a symlink swap race created a host file"
                    );
                }
                i += 1;
            }
        }
        let _ = sb.files("PUT", "", "/home/user/stop", Body::Bytes(b"1"));
        let res = h.join().expect("swapper thread");
        assert!(
            started.is_some(),
            "the in-sandbox swapper never started:\n{}",
            show(&res)
        );
        (res, counts)
    });
    assert!(
        swapper.exit_code == Some(0) && swapper.stdout.contains("swaps "),
        "the in-sandbox swapper failed:\n{}",
        show(&swapper)
    );
    eprintln!(
        "symlink race: swapper {}; API reads by outcome {counts:?}",
        swapper.stdout.trim()
    );
    s.assert_intact();
    assert!(
        !d.root.join(&pw).exists(),
        "a PUT during the race created a host file"
    );
    assert_host_healthy(d);
}
