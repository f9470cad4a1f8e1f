//! What the `agent_path` fuzz target checks: how the agent turns a requested path into the
//! path it opens (`server::resolve_path`, used by every filesystem RPC through
//! `server::fs::user_path` and by `/files`), and the parser of the sandbox's own
//! `/etc/passwd` and `/etc/group` that supplies the home directory relative paths start
//! from. Shared (by `#[path]`) with `crates/rampart-agent/tests/fuzz_corpus.rs`.
//!
//! The agent runs as PID 1 inside the sandbox, so the sandbox root is its `/`. The invariant
//! is that a resolved path is absolute and clean (only normal components after the root:
//! no `..`, no `.`), so that, put under a root directory, it names something under that
//! root; it is checked against a small real tree too (built once per process), whose
//! symlinks all point inside it: following them never leaves the tree. The resolved path
//! must also be the one a plain reference model gives (POSIX-style lexical cleaning, `~`
//! and relative paths from the home).
//!
//! The first byte picks what the rest is (fields separated by 0xFF, which UTF-8 never has):
//! - 0: `home` 0xFF `path`.
//! - 1: `passwd` 0xFF `group` 0xFF `user` 0xFF `path`: the user's home from the databases.
//! - 2: a `/files` query string: its `path` (and `username`) as the download and upload
//!   handlers take them.

use rampart_agent::server::{self, files, users::UserDb};
use std::path::{Component, PathBuf};
use std::sync::OnceLock;

/// Runs every check that applies to `data`; panics on a violation.
pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let fields: Vec<String> = rest
        .split(|b| *b == 0xff)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    let field = |i: usize| fields.get(i).map(String::as_str).unwrap_or_default();
    match mode % 3 {
        0 => resolved(field(1), field(0)),
        1 => {
            let db = UserDb::parse(field(0), field(1));
            let Some(user) = db.user(field(2)) else {
                return;
            };
            assert_eq!(user.groups.first(), Some(&user.gid), "{user:?}");
            let mut g = user.groups.clone();
            g.sort_unstable();
            g.dedup();
            assert_eq!(g.len(), user.groups.len(), "duplicate groups: {user:?}");
            let _ = db.uid_names();
            let _ = db.gid_names();
            resolved(field(3), &user.home);
        }
        _ => {
            let q = files::parse_query(field(0));
            let get = |k: &str| {
                q.iter()
                    .rev()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.as_str())
            };
            // BTreeMap::from_iter keeps the last of repeated keys, as `query()` does.
            if let Some(p) = get("path").filter(|p| !p.is_empty()) {
                resolved(p, "/home/user");
            }
        }
    }
}

/// The reference: split on `/`, drop empty and `.` segments, `..` removes the previous one
/// (never above the root). Absolute paths stand alone; `~` and `~/x` start from the home,
/// as does any other relative path.
pub fn model(path: &str, home: &str) -> String {
    let (base, rest) = if path.starts_with('/') {
        ("", path)
    } else if path == "~" {
        (home, "")
    } else if let Some(r) = path.strip_prefix("~/") {
        (home, r)
    } else {
        (home, path)
    };
    let mut segs: Vec<&str> = Vec::new();
    for s in base.split('/').chain(rest.split('/')) {
        match s {
            "" | "." => {}
            ".." => {
                segs.pop();
            }
            s => segs.push(s),
        }
    }
    format!("/{}", segs.join("/"))
}

/// The temporary tree standing for a sandbox root: a few directories, a file, and symlinks
/// that point inside it (relative and absolute-under-the-root).
fn tree() -> &'static (PathBuf, PathBuf) {
    static TREE: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    TREE.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("rampart-fuzz-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["home/user/a/b", "etc", "tmp", "root"] {
            std::fs::create_dir_all(root.join(d)).expect("temp tree");
        }
        std::fs::write(
            root.join("etc/passwd"),
            "user:x:1000:1000::/home/user:/bin/sh\n",
        )
        .expect("temp tree");
        let links: [(&str, PathBuf); 4] = [
            ("home/user/up", PathBuf::from("..")),
            ("home/user/etc", PathBuf::from("../../etc")),
            ("home/user/a/top", PathBuf::from("../../..")),
            ("tmp/abs", root.join("home/user/a")),
        ];
        for (l, t) in links {
            std::os::unix::fs::symlink(t, root.join(l)).expect("temp tree");
        }
        let canon = std::fs::canonicalize(&root).expect("temp tree");
        (root, canon)
    })
}

/// Removes the temporary tree, if this process made one (for the replay test).
#[allow(dead_code)]
pub fn cleanup() {
    let root = std::env::temp_dir().join(format!("rampart-fuzz-root-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(root);
}

fn resolved(path: &str, home: &str) {
    let p = server::resolve_path(path, home);
    // Absolute and clean: the root, then normal components only.
    let mut comps = p.components();
    assert_eq!(comps.next(), Some(Component::RootDir), "{path:?} -> {p:?}");
    for c in comps {
        assert!(
            matches!(c, Component::Normal(_)),
            "{path:?} (home {home:?}) -> {p:?} has {c:?}"
        );
    }
    // The reference model.
    assert_eq!(
        p.to_str(),
        Some(model(path, home).as_str()),
        "{path:?} with home {home:?}"
    );
    // Resolving a resolved path changes nothing, whatever the home.
    let s = p.to_str().expect("UTF-8 in, UTF-8 out");
    assert_eq!(server::resolve_path(s, "/elsewhere"), p);
    // Put under a root directory it stays under it, lexically and on a real tree.
    let (root, canon_root) = tree();
    let rel = p.strip_prefix("/").expect("absolute");
    let inside = root.join(rel);
    assert!(inside.starts_with(root), "{inside:?} left {root:?}");
    assert_eq!(
        inside.components().count(),
        root.components().count() + rel.components().count(),
        "{inside:?}"
    );
    if let Ok(real) = std::fs::canonicalize(&inside) {
        assert!(
            real.starts_with(canon_root),
            "{path:?} -> {inside:?} -> {real:?} left the root"
        );
    }
}
