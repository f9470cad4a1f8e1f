//! The builder: base, steps, the step cache, and the build sandbox on the jail.
//!
//! Cache keys (hex SHA-256 of length-prefixed fields, see [`crate::digest::KeyHasher`]):
//! - `debian:` base: suite, variant, sorted extra packages, mirror.
//! - OCI layer: the layer blob's digest (a layer is extracted on its own, so its key does
//!   not depend on the layers below).
//! - a step: the key of the layer chain below it, the step's kind and inputs (packages,
//!   command, copy destination and every copied file's relative path, type, mode and
//!   content digest), and the metadata in effect (user, workdir, env) for steps that run.
//!
//! A step whose key is in the store is not run again ("cached"); a change to one step
//! changes its key and so the keys of every layer step after it.
//!
//! The network of a step (`[build] network` of the spec, [`step_network`]): every `apt`,
//! `pip` and `run` step runs in a network namespace of its own. With `none` it has only its
//! loopback; otherwise [`JailRunner`] gives it a link of its own to the host (rampart-net's
//! veth wiring and an nftables table of the build's own, as for a sandbox) whose DNS and TCP
//! go only to an egress proxy and resolver (rampart-egress) started for that step, under an
//! `allowlist` policy of the spec's rules or of the package registries
//! ([`registry_hosts`]). The host's loopback and addresses, metadata and private ranges are
//! never reachable. The step's `/etc/resolv.conf` names its resolver (a file in the step's
//! scratch directory, bound read-only).

use crate::digest::KeyHasher;
use crate::oci;
use crate::spec::{Base, BuildNetwork, Spec, Step};
use crate::store::{remove_tree, Manifest, Store, TemplateConfig, SCHEMA};
use crate::{io, ImageError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most layers of a template (each is one overlay lower directory of every sandbox, and the
/// overlay's mount options must fit in one page).
pub const MAX_LAYERS: usize = 48;

/// Environment of build steps, under the template's own.
pub const BUILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A progress event.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum BuildEvent {
    /// A step begins (index 0 = the base).
    Step {
        /// Index (0 = base).
        index: usize,
        /// Total steps including the base.
        total: usize,
        /// Kind.
        kind: String,
        /// Description.
        describe: String,
    },
    /// Output of the running step.
    Output {
        /// Text (lossy UTF-8).
        text: String,
    },
    /// A step ended.
    StepDone {
        /// Index.
        index: usize,
        /// Whether its layer came from the cache.
        cached: bool,
        /// Seconds taken.
        secs: f64,
    },
}

/// One step in a build's report.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepReport {
    /// Index (0 = base).
    pub index: usize,
    /// Kind (`base`, `apt`, ...).
    pub kind: String,
    /// Description.
    pub describe: String,
    /// Layer keys made or reused (none for metadata steps).
    pub layers: Vec<String>,
    /// Whether every layer came from the cache.
    pub cached: bool,
    /// Seconds taken.
    pub secs: f64,
}

/// What a build made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildReport {
    /// The name.
    pub name: String,
    /// The template id.
    pub id: String,
    /// The manifest.
    pub manifest: Manifest,
    /// Steps.
    pub steps: Vec<StepReport>,
    /// Seconds in all.
    pub secs: f64,
}

/// What a build step's sandbox may reach, resolved from the spec's `[build] network`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepNetwork {
    /// Nothing: only its loopback (`network = "none"`).
    None,
    /// Its own link to the host, every DNS query and TCP connection through the egress
    /// resolver and proxy, which allow only what these rules name (a sandbox's `allowlist`
    /// policy; always-blocked and private addresses stay blocked).
    Egress {
        /// The allow rules.
        allow: Vec<String>,
    },
}

/// The registries build steps reach by default besides the apt sources: PyPI (`pip`), npm
/// and crates.io (cargo's sparse index and downloads).
pub const REGISTRY_HOSTS: &[&str] = &[
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "crates.io",
    "static.crates.io",
    "index.crates.io",
];

/// The host name of a URL (`http://user@host:80/path` -> `host`), lowercase; `None` for
/// URLs without one (`file:`, `cdrom:`). `mirror+http://` and `tor+http://` count as HTTP.
fn url_host(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.rsplit('+').next().unwrap_or(scheme);
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let hostport = authority.rsplit('@').next().unwrap_or(authority);
    let host = if let Some(v6) = hostport.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        hostport.split(':').next().unwrap_or("")
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// The hosts of the apt sources under `etc_apt` (normally `/etc/apt`): `sources.list` and
/// `sources.list.d/*.list` (one-line format) and `sources.list.d/*.sources` (deb822, stanzas
/// with `Enabled: no` skipped). Sorted, without duplicates.
pub fn apt_source_hosts(etc_apt: &Path) -> Vec<String> {
    let mut files = vec![etc_apt.join("sources.list")];
    if let Ok(rd) = std::fs::read_dir(etc_apt.join("sources.list.d")) {
        let mut more: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "list" || x == "sources"))
            .collect();
        more.sort();
        files.extend(more);
    }
    let mut hosts = Vec::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        if f.extension().is_some_and(|x| x == "sources") {
            hosts.extend(deb822_uris(&text).iter().filter_map(|u| url_host(u)));
        } else {
            hosts.extend(one_line_uris(&text).iter().filter_map(|u| url_host(u)));
        }
    }
    hosts.sort();
    hosts.dedup();
    hosts
}

/// The URIs of a one-line-format sources list (`deb [options] URI suite components`).
fn one_line_uris(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut rest = match line.split_once(char::is_whitespace) {
            Some(("deb" | "deb-src", rest)) => rest.trim_start(),
            _ => continue,
        };
        if let Some(opts) = rest.strip_prefix('[') {
            rest = opts
                .split_once(']')
                .map(|(_, r)| r.trim_start())
                .unwrap_or("");
        }
        if let Some(uri) = rest.split_whitespace().next() {
            out.push(uri.to_owned());
        }
    }
    out
}

/// The URIs of the enabled stanzas of a deb822 `.sources` file.
fn deb822_uris(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stanza: Vec<(String, String)> = Vec::new();
    let mut flush = |stanza: &mut Vec<(String, String)>| {
        let enabled = !stanza
            .iter()
            .any(|(k, v)| k == "enabled" && v.trim().eq_ignore_ascii_case("no"));
        if enabled {
            for (k, v) in stanza.iter() {
                if k == "uris" {
                    out.extend(v.split_whitespace().map(str::to_owned));
                }
            }
        }
        stanza.clear();
    };
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            flush(&mut stanza);
        } else if line.starts_with([' ', '\t']) {
            if let Some((_, v)) = stanza.last_mut() {
                v.push(' ');
                v.push_str(line.trim());
            }
        } else if let Some((k, v)) = line.split_once(':') {
            stanza.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    flush(&mut stanza);
    out
}

/// The default allow rules of build steps (`network = "registries"`): the hosts of the
/// host's apt sources (`/etc/apt`), the host of the spec's Debian mirror, and
/// [`REGISTRY_HOSTS`]. Sorted, without duplicates; names that are not valid rules are left
/// out.
pub fn registry_hosts(spec: &Spec) -> Vec<String> {
    let mut hosts = apt_source_hosts(Path::new("/etc/apt"));
    if let Base::Debian { mirror, .. } = &spec.from {
        hosts.extend(url_host(mirror));
    }
    hosts.extend(REGISTRY_HOSTS.iter().map(|h| (*h).to_owned()));
    hosts.sort();
    hosts.dedup();
    hosts.retain(|h| {
        let p = rampart_types::NetworkPolicy {
            mode: rampart_types::NetworkMode::Allowlist,
            allow: vec![h.clone()],
            ..Default::default()
        };
        rampart_egress::validate_policy(&p).is_ok()
    });
    hosts
}

/// The network of `spec`'s build steps.
pub fn step_network(spec: &Spec) -> StepNetwork {
    match &spec.network {
        BuildNetwork::None => StepNetwork::None,
        BuildNetwork::Allow(a) => StepNetwork::Egress { allow: a.clone() },
        BuildNetwork::Registries => StepNetwork::Egress {
            allow: registry_hosts(spec),
        },
    }
}

/// A command to run in a build sandbox.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// Lower layers, bottom first.
    pub layers: Vec<PathBuf>,
    /// The upper directory (becomes the layer).
    pub upper: PathBuf,
    /// The overlay work directory.
    pub work: PathBuf,
    /// Shell command (`/bin/sh -c`).
    pub command: String,
    /// User.
    pub user: String,
    /// Working directory.
    pub cwd: Option<String>,
    /// Environment.
    pub env: BTreeMap<String, String>,
    /// What the step may reach.
    pub network: StepNetwork,
    /// A host directory of the step's own for the runner's files (its `resolv.conf`, the
    /// egress state), removed after the step.
    pub scratch: PathBuf,
    /// Layers on the built-in `base`: its directory (its `rootfs/` is the bottom of `/`,
    /// the host's `/usr` the bottom of `/usr`) and the upper and work directories of the
    /// `/usr` overlay (the builder moves that upper into the layer's `usr/` afterwards).
    pub on_base: Option<OnBase>,
}

/// How a build step on the built-in `base` is mounted (see [`RunRequest::on_base`]).
#[derive(Debug, Clone)]
pub struct OnBase {
    /// The `base` template's directory (holding `rootfs/`).
    pub template_dir: PathBuf,
    /// The `/usr` overlay's upper directory.
    pub usr_upper: PathBuf,
    /// Its work directory.
    pub usr_work: PathBuf,
}

/// Runs build steps in sandboxes. [`JailRunner`] is the real one.
pub trait StepRunner: std::fmt::Debug {
    /// Runs `req`, passing output to `out`; returns the exit code. Must stop (leaving no
    /// process or mount) when `cancel` is set, returning [`ImageError::Interrupted`].
    /// After it returns, `req.upper` holds the layer with owners as seen in the sandbox.
    fn run(
        &self,
        req: &RunRequest,
        out: &mut dyn FnMut(&[u8]),
        cancel: &AtomicBool,
    ) -> Result<i32, ImageError>;
}

/// Build options.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// Ignore cached step layers (rebuild every step; the base is still reused).
    pub no_cache: bool,
    /// Ignore cached layers from this step on (1 = the first step; E2B's `skip_cache()`
    /// before a step).
    pub no_cache_from: Option<usize>,
    /// The build's id, kept with the name it sets (E2B's `buildID`).
    pub build_id: Option<String>,
    /// The user and password of an `image:` base's registry.
    pub registry_auth: Option<crate::registry::RegistryAuth>,
    /// Leave an `image:` base's `Entrypoint`/`Cmd` out of the template's start command (E2B
    /// runs only the start command a build sets).
    pub drop_image_cmd: bool,
}

/// The name of the built-in template built templates may stack on (`from =
/// "template:base"`).
pub const BUILTIN_BASE: &str = "base";

/// The key of a chain of layers.
pub fn chain_key(layers: &[String]) -> String {
    let mut k = KeyHasher::new("rampart layer chain v1");
    for l in layers {
        k.str(l);
    }
    k.finish()
}

/// The cache key of the `debian:` base.
pub fn debian_key(suite: &str, variant: &str, packages: &[String], mirror: &str) -> String {
    let mut p = packages.to_vec();
    p.sort();
    p.dedup();
    let mut k = KeyHasher::new("rampart debian base v1");
    k.str(suite).str(variant).str(mirror);
    for x in &p {
        k.str(x);
    }
    k.finish()
}

fn config_fields(k: &mut KeyHasher, c: &TemplateConfig) {
    k.str(c.user.as_deref().unwrap_or(""));
    k.str(c.workdir.as_deref().unwrap_or(""));
    for (n, v) in &c.env {
        k.str(n).str(v);
    }
}

/// The cache key of a layer step on `chain` under metadata `config`; `spec_dir` is where
/// `copy` sources are read from.
pub fn step_key(
    chain: &[String],
    step: &Step,
    config: &TemplateConfig,
    spec_dir: &Path,
) -> Result<String, ImageError> {
    let mut k = KeyHasher::new("rampart step v1");
    k.str(&chain_key(chain)).str(step.kind());
    match step {
        Step::Apt(p) | Step::Pip(p) | Step::Npm(p) => {
            for x in p {
                k.str(x);
            }
            config_fields(&mut k, config);
        }
        Step::Run { cmd, user } => {
            k.str(cmd);
            // A run as the template's user keeps its v1 key.
            if let Some(u) = user {
                k.str("as").str(u);
            }
            config_fields(&mut k, config);
        }
        Step::Copy {
            src,
            dest,
            owner,
            mode,
        } => {
            k.str(dest);
            hash_tree(&mut k, &spec_dir.join(src), Path::new(""))?;
            if owner.is_some() || mode.is_some() {
                k.str("owner").str(owner.as_deref().unwrap_or(""));
                k.str("mode")
                    .str(&mode.map(|m| m.to_string()).unwrap_or_default());
                // The owner's name is resolved through the image's /etc/passwd.
                if owner.is_some() {
                    config_fields(&mut k, config);
                }
            }
        }
        Step::Env(_) | Step::User(_) | Step::Workdir(_) => {}
    }
    Ok(k.finish())
}

/// Hashes a file tree: relative paths, types, modes, link targets, contents.
fn hash_tree(k: &mut KeyHasher, p: &Path, rel: &Path) -> Result<(), ImageError> {
    let md = std::fs::symlink_metadata(p).map_err(io(format!("copy source {}", p.display())))?;
    k.str(&rel.to_string_lossy());
    k.field(&(md.mode() & 0o7777).to_le_bytes());
    let ft = md.file_type();
    if ft.is_symlink() {
        let t = std::fs::read_link(p).map_err(io(format!("readlink {}", p.display())))?;
        k.str("l").str(&t.to_string_lossy());
    } else if ft.is_dir() {
        k.str("d");
        let mut names: Vec<_> = std::fs::read_dir(p)
            .map_err(io(format!("read {}", p.display())))?
            .flatten()
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for n in names {
            hash_tree(k, &p.join(&n), &rel.join(&n))?;
        }
    } else if ft.is_file() {
        k.str("f").field(&md.len().to_le_bytes());
        let mut f = std::fs::File::open(p).map_err(io(format!("open {}", p.display())))?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = f
                .read(&mut buf)
                .map_err(io(format!("read {}", p.display())))?;
            if n == 0 {
                break;
            }
            k.raw(&buf[..n]);
        }
    } else {
        return Err(ImageError::Spec(crate::SpecError {
            field: "copy.src".into(),
            message: format!("{} is not a file, directory or symlink", p.display()),
        }));
    }
    Ok(())
}

/// Owner and mode of copied entries.
#[derive(Debug, Clone, Copy)]
struct CopyAttrs {
    uid: u32,
    gid: u32,
    mode: Option<u32>,
}

/// Copies `src` into `fs` at `dest` (absolute inside the image; a file source with a `dest`
/// ending in `/` goes into that directory), entries owned by `attrs` (root by default),
/// modes kept unless `attrs` sets one. Parent directories the image below has (in `lowers`,
/// its roots top first) keep their owner and mode (the layer's copy of a directory is what
/// the merged view shows); new ones are 0755, owned by root.
fn copy_into(
    fs: &Path,
    src: &Path,
    dest: &str,
    attrs: CopyAttrs,
    lowers: &[PathBuf],
) -> Result<(), ImageError> {
    let mut d = fs.to_path_buf();
    let mut comps: Vec<String> = dest
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_owned)
        .collect();
    let src_is_dir = std::fs::symlink_metadata(src).is_ok_and(|m| m.is_dir());
    if dest.ends_with('/') && !src_is_dir {
        if let Some(n) = src.file_name() {
            comps.push(n.to_string_lossy().into_owned());
        }
    }
    let Some((last, parents)) = comps.split_last() else {
        // dest = "/": copy a directory's contents into the root.
        return copy_tree(src, fs, true, attrs);
    };
    let mut rel = PathBuf::new();
    for c in parents {
        d.push(c);
        rel.push(c);
        if !d.exists() {
            std::fs::create_dir(&d).map_err(io(format!("mkdir {}", d.display())))?;
            let below = lowers
                .iter()
                .find_map(|r| std::fs::symlink_metadata(r.join(&rel)).ok())
                .filter(|m| m.is_dir());
            let (mode, uid, gid) = below
                .map(|m| (m.mode() & 0o7777, m.uid(), m.gid()))
                .unwrap_or((0o755, 0, 0));
            std::os::unix::fs::lchown(&d, Some(uid), Some(gid))
                .map_err(io(format!("chown {}", d.display())))?;
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode))
                .map_err(io(format!("chmod {}", d.display())))?;
        }
    }
    copy_tree(src, &d.join(last), false, attrs)
}

fn copy_tree(src: &Path, dst: &Path, merge: bool, a: CopyAttrs) -> Result<(), ImageError> {
    let md = std::fs::symlink_metadata(src).map_err(io(format!("stat {}", src.display())))?;
    let ft = md.file_type();
    if ft.is_symlink() {
        let t = std::fs::read_link(src).map_err(io(format!("readlink {}", src.display())))?;
        std::os::unix::fs::symlink(t, dst).map_err(io(format!("symlink {}", dst.display())))?;
        std::os::unix::fs::lchown(dst, Some(a.uid), Some(a.gid))
            .map_err(io(format!("chown {}", dst.display())))?;
        return Ok(());
    }
    if ft.is_dir() {
        if !(merge && dst.is_dir()) {
            std::fs::create_dir(dst).map_err(io(format!("mkdir {}", dst.display())))?;
        }
        for e in std::fs::read_dir(src)
            .map_err(io(format!("read {}", src.display())))?
            .flatten()
        {
            copy_tree(&e.path(), &dst.join(e.file_name()), false, a)?;
        }
    } else if ft.is_file() {
        std::fs::copy(src, dst).map_err(io(format!("copy {}", src.display())))?;
    } else {
        return Ok(());
    }
    std::os::unix::fs::lchown(dst, Some(a.uid), Some(a.gid))
        .map_err(io(format!("chown {}", dst.display())))?;
    let mode = a.mode.unwrap_or(md.mode() & 0o7777);
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("chmod {}", dst.display())))
}

/// The top-most `rel` file of the merged view of `roots` (top first), unless a whiteout
/// hides it.
fn merged_file(roots: &[PathBuf], rel: &str) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    for r in roots {
        if let Ok(md) = std::fs::symlink_metadata(r.join(rel)) {
            if md.file_type().is_char_device() && md.rdev() == 0 {
                return None;
            }
            if md.is_file() {
                return std::fs::read_to_string(r.join(rel)).ok();
            }
            return None;
        }
    }
    None
}

/// Resolves `user[:group]` (names through the image's `/etc/passwd` and `/etc/group`, or
/// numbers) to ids; a user alone gets its primary group.
fn resolve_owner(roots: &[PathBuf], owner: &str) -> Result<(u32, u32), String> {
    let (u, g) = match owner.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (owner, None),
    };
    let passwd = merged_file(roots, "etc/passwd").unwrap_or_default();
    let find = |text: &str, name: &str, gid_field: bool| -> Option<(u32, u32)> {
        text.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 3 || f[0] != name {
                return None;
            }
            let id = f[2].parse().ok()?;
            let g = if gid_field {
                f.get(3).and_then(|g| g.parse().ok()).unwrap_or(id)
            } else {
                id
            };
            Some((id, g))
        })
    };
    let (uid, primary) = match u.parse::<u32>() {
        Ok(n) => (n, find(&passwd, u, true).map(|x| x.1).unwrap_or(n)),
        Err(_) => find(&passwd, u, true)
            .ok_or_else(|| format!("owner {owner:?}: no user {u:?} in the image's /etc/passwd"))?,
    };
    let gid = match g {
        None => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                let group = merged_file(roots, "etc/group").unwrap_or_default();
                find(&group, g, false).map(|x| x.0).ok_or_else(|| {
                    format!("owner {owner:?}: no group {g:?} in the image's /etc/group")
                })?
            }
        },
    };
    Ok((uid, gid))
}

/// Moves the `/usr` overlay's upper directory of a build step on `base` into the layer's
/// `usr/` (the layer then holds `/usr` changes like any other path).
fn merge_usr_upper(fs: &Path, usr_upper: &Path) -> Result<(), ImageError> {
    let empty = std::fs::read_dir(usr_upper).map_or(true, |mut r| r.next().is_none());
    if empty {
        return Ok(());
    }
    let usr = fs.join("usr");
    match std::fs::symlink_metadata(&usr) {
        Err(_) => {
            std::fs::rename(usr_upper, &usr).map_err(io("move the /usr changes into the layer"))
        }
        Ok(md) if md.is_dir() => {
            for e in std::fs::read_dir(usr_upper)
                .map_err(io("read the /usr changes"))?
                .flatten()
            {
                let to = usr.join(e.file_name());
                if std::fs::symlink_metadata(&to).is_ok() {
                    remove_tree(&to).map_err(io(format!("replace {}", to.display())))?;
                }
                std::fs::rename(e.path(), &to).map_err(io(format!("move {}", to.display())))?;
            }
            Ok(())
        }
        Ok(_) => Err(ImageError::Sandbox(
            "the step replaced /usr with a non-directory".into(),
        )),
    }
}

/// Turns a build sandbox's upper directory into a layer: owners moved from the sandbox's
/// uid range back to the image's (`uid_base + n` -> `n`; setuid/setgid bits restored after
/// the chown), overlayfs bookkeeping xattrs other than `opaque` dropped, and the empty
/// `/etc/resolv.conf` mount point removed.
pub fn finish_upper(upper: &Path, uid_base: u32, had_resolv_conf: bool) -> Result<(), ImageError> {
    let rc = upper.join("etc/resolv.conf");
    // Only through a real `etc/` of the layer: a step that made `/etc` a symlink must not
    // lead this removal onto the host.
    let real_etc = std::fs::symlink_metadata(upper.join("etc")).is_ok_and(|m| m.is_dir());
    if !had_resolv_conf && real_etc {
        if let Ok(md) = std::fs::symlink_metadata(&rc) {
            if md.is_file() && md.len() == 0 {
                let _ = std::fs::remove_file(&rc);
            }
        }
    }
    rampart_jail::persist::shift_tree(upper, uid_base, 0, &mut |p| strip_overlay_xattrs(p)).map_err(
        |e| match e {
            rampart_jail::JailError::Sys { step, source } => ImageError::Io { what: step, source },
            e => ImageError::Io {
                what: format!("shift owners under {}", upper.display()),
                source: std::io::Error::other(e.to_string()),
            },
        },
    )
}

fn strip_overlay_xattrs(p: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return;
    };
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C string and buffer of the given length.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return;
    }
    for name in buf[..n as usize].split(|b| *b == 0) {
        if name.starts_with(b"trusted.overlay.") && name != b"trusted.overlay.opaque" {
            if let Ok(k) = std::ffi::CString::new(name) {
                // SAFETY: valid C strings.
                unsafe { libc::lremovexattr(c.as_ptr(), k.as_ptr()) };
            }
        }
    }
}

/// Whether any layer of `layers` (bottom first) has `/etc/resolv.conf` as its top-most
/// entry that is not a whiteout (an approximation of the merged view).
fn chain_has(layers: &[PathBuf], rel: &str) -> bool {
    for l in layers.iter().rev() {
        if let Ok(md) = std::fs::symlink_metadata(l.join(rel)) {
            use std::os::unix::fs::FileTypeExt;
            return !(md.file_type().is_char_device() && md.rdev() == 0);
        }
    }
    false
}

/// The builder.
#[derive(Debug)]
pub struct Builder<'a> {
    store: &'a Store,
    runner: &'a dyn StepRunner,
    /// Set to stop the build.
    pub cancel: Arc<AtomicBool>,
    /// The uid base the runner's sandboxes use (to shift owners back).
    pub uid_base: u32,
    /// The built-in templates builds may stack on (`from = "template:base"`), by name, with
    /// their directories (none: such a build fails saying so).
    pub builtins: Vec<(String, PathBuf)>,
    /// How `image:` bases are pulled.
    pub registry: crate::registry::RegistryConfig,
    /// The disk of a `run`, `apt`, `pip` or `npm` step, bytes: what it writes goes to an
    /// image of this size ([`crate::step_disk`]) and writing past it fails the step. None:
    /// a host directory, unbounded (the host's own builds of the operator's templates).
    pub step_disk_bytes: Option<u64>,
}

impl<'a> Builder<'a> {
    /// A builder over `store`, running steps with `runner` (whose sandboxes map root to
    /// `uid_base`).
    pub fn new(store: &'a Store, runner: &'a dyn StepRunner, uid_base: u32) -> Builder<'a> {
        Builder {
            store,
            runner,
            cancel: Arc::new(AtomicBool::new(false)),
            uid_base,
            builtins: Vec::new(),
            registry: Default::default(),
            step_disk_bytes: None,
        }
    }

    /// Pulls `image:` bases with `cfg` (mirrors, insecure registries, allowed ranges).
    pub fn with_registry(mut self, cfg: crate::registry::RegistryConfig) -> Self {
        self.registry = cfg;
        self
    }

    /// Extracts the layers of `img` the store lacks and appends every layer's key to
    /// `layers`; whether all were in the store already.
    fn import_layers(
        &self,
        img: &oci::OciImage,
        layers: &mut Vec<String>,
        events: &mut dyn FnMut(BuildEvent),
    ) -> Result<bool, ImageError> {
        let mut cached = true;
        for l in &img.layers {
            self.check_cancel()?;
            if !self.store.has_layer(&l.key) {
                cached = false;
                let tmp = self.store.tmp_dir("oci-layer")?;
                let fs = tmp.path().join("fs");
                std::fs::create_dir(&fs).map_err(io("mkdir layer"))?;
                let st = oci::extract_layer(l, &fs)?;
                events(BuildEvent::Output {
                    text: format!(
                        "layer {}: {} entries, {} whiteouts, {} opaque directories\n",
                        l.digest.as_deref().unwrap_or("?"),
                        st.entries,
                        st.whiteouts,
                        st.opaque_dirs
                    ),
                });
                self.store.commit_layer(
                    &fs,
                    &l.key,
                    &format!("oci layer {}", l.digest.as_deref().unwrap_or("?")),
                )?;
            }
            layers.push(l.key.clone());
        }
        Ok(cached)
    }

    /// Lets builds stack on the built-in `base`, whose directory is `dir`.
    pub fn with_base_dir(self, dir: PathBuf) -> Self {
        self.with_builtin(BUILTIN_BASE, dir)
    }

    /// Lets builds stack on the built-in template `name` (a root like `base`'s, under the
    /// host's `/usr`), whose directory is `dir`.
    pub fn with_builtin(mut self, name: &str, dir: PathBuf) -> Self {
        self.builtins.push((name.to_owned(), dir));
        self
    }

    /// The directory of the built-in template `name`, if builds may stack on it.
    fn builtin_dir(&self, name: &str) -> Option<&PathBuf> {
        self.builtins
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d)
    }

    fn check_cancel(&self) -> Result<(), ImageError> {
        if self.cancel.load(Ordering::SeqCst) {
            Err(ImageError::Interrupted)
        } else {
            Ok(())
        }
    }

    /// Builds `spec` as `name` (the caller holds the store's lock). On failure or
    /// interruption nothing half-made remains: layers are made in `tmp/` and renamed into
    /// place only when complete, and the name is set last.
    pub fn build(
        &self,
        spec: &Spec,
        name: &str,
        opts: &BuildOptions,
        events: &mut dyn FnMut(BuildEvent),
    ) -> Result<BuildReport, ImageError> {
        crate::check_ref(name)?;
        let t_all = Instant::now();
        let total = spec.steps.len() + 1;
        let mut report = Vec::new();
        let mut chain = vec![self.store.ensure_skeleton()?];
        let mut config = TemplateConfig::default();
        // The base.
        let t0 = Instant::now();
        let describe = match &spec.from {
            Base::Debian { suite, variant, .. } => format!("debian:{suite} ({})", variant.as_str()),
            Base::Oci(p) => format!("oci:{}", p.display()),
            Base::Template(n) => format!("template:{n}"),
            Base::Image(r) => format!("image:{r}"),
        };
        events(BuildEvent::Step {
            index: 0,
            total,
            kind: "base".into(),
            describe: describe.clone(),
        });
        let network = step_network(spec);
        if spec.steps.iter().any(|s| {
            matches!(
                s,
                Step::Apt(_) | Step::Pip(_) | Step::Npm(_) | Step::Run { .. }
            )
        }) {
            events(BuildEvent::Output {
                text: match &network {
                    StepNetwork::None => "network of the steps: none\n".to_owned(),
                    StepNetwork::Egress { allow } => format!(
                        "network of the steps: through the egress proxy, allowing {}\n",
                        allow.join(", ")
                    ),
                },
            });
        }
        let mut base_layers = Vec::new();
        let mut base_cached = true;
        // Layers stacked on a built-in template (`base`).
        let mut on: Option<String> = None;
        match &spec.from {
            Base::Debian {
                suite,
                variant,
                packages,
                mirror,
            } => {
                let key = debian_key(suite, variant.as_str(), packages, mirror);
                if !self.store.has_layer(&key) {
                    base_cached = false;
                    let tmp = self.store.tmp_dir("debian")?;
                    let fs = tmp.path().join("fs");
                    mmdebstrap(
                        suite,
                        variant.as_str(),
                        packages,
                        mirror,
                        &fs,
                        &self.cancel,
                        events,
                    )?;
                    self.store.commit_layer(&fs, &key, &describe)?;
                }
                base_layers.push(key);
                config.user = Some("root".into());
                config.env.insert("PATH".into(), BUILD_PATH.into());
            }
            Base::Oci(p) => {
                let img = oci::open(p, self.store)?;
                base_cached &= self.import_layers(&img, &mut base_layers, events)?;
                config = img.config;
            }
            Base::Image(r) => {
                let img = crate::registry::pull(
                    &self.registry,
                    r,
                    opts.registry_auth.as_ref(),
                    self.store,
                    &self.cancel,
                    &mut |text| events(BuildEvent::Output { text }),
                )?;
                base_cached &= self.import_layers(&img, &mut base_layers, events)?;
                config = img.config;
                if opts.drop_image_cmd {
                    config.start = None;
                }
            }
            Base::Template(n) if n == BUILTIN_BASE || self.builtin_dir(n).is_some() => {
                if self.builtin_dir(n).is_none() {
                    return Err(ImageError::Spec(crate::SpecError {
                        field: "from".into(),
                        message: "template:base: the built-in base is not available to this \
                                  build (pass the daemon's data directory)"
                            .into(),
                    }));
                }
                // The built-in's root provides the mount points: no skeleton.
                chain.clear();
                on = Some(n.clone());
                // What a sandbox of `base` starts with.
                config.user = Some(rampart_jail::template::USER_NAME.to_owned());
                config.workdir = Some(format!("/home/{}", rampart_jail::template::USER_NAME));
            }
            Base::Template(n) => {
                let (_, m) = self.store.resolve(n)?;
                self.store.layer_paths(&m)?;
                // Its chain starts with the skeleton already (or stacks on `base`).
                chain.clear();
                base_layers = m.layers;
                config = m.config;
                on = m.base;
                if on.as_deref().is_some_and(|b| self.builtin_dir(b).is_none()) {
                    return Err(ImageError::Spec(crate::SpecError {
                        field: "from".into(),
                        message: format!(
                            "template:{n} stacks on the built-in base, which is not \
                             available to this build"
                        ),
                    }));
                }
            }
        }
        chain.extend(base_layers.iter().cloned());
        let planned = chain.len() + spec.steps.iter().filter(|s| s.makes_layer()).count();
        if planned > MAX_LAYERS {
            return Err(ImageError::Spec(crate::SpecError {
                field: "steps".into(),
                message: format!(
                    "{planned} layers (base included): a template may have at most \
                     {MAX_LAYERS} (each is an overlay lower directory and the mount options \
                     must fit in a page); merge steps"
                ),
            }));
        }
        let secs = t0.elapsed().as_secs_f64();
        events(BuildEvent::StepDone {
            index: 0,
            cached: base_cached,
            secs,
        });
        report.push(StepReport {
            index: 0,
            kind: "base".into(),
            describe,
            layers: base_layers,
            cached: base_cached,
            secs,
        });
        // The steps.
        for (i, step) in spec.steps.iter().enumerate() {
            self.check_cancel()?;
            let index = i + 1;
            let t0 = Instant::now();
            events(BuildEvent::Step {
                index,
                total,
                kind: step.kind().into(),
                describe: step.describe(),
            });
            let mut layers = Vec::new();
            let mut cached = true;
            match step {
                Step::Env(e) => config.env.extend(e.clone()),
                Step::User(u) => config.user = Some(u.clone()),
                Step::Workdir(w) => config.workdir = Some(w.clone()),
                _ => {
                    // The key of a chain on `base` names it first.
                    let key_chain: Vec<String> = on
                        .iter()
                        .map(|b| format!("builtin:{b}"))
                        .chain(chain.iter().cloned())
                        .collect();
                    let key = step_key(&key_chain, step, &config, &spec.dir)?;
                    let skip = opts.no_cache || opts.no_cache_from.is_some_and(|f| index >= f);
                    if skip || !self.store.has_layer(&key) {
                        cached = false;
                        self.make_step_layer(
                            index,
                            step,
                            &chain,
                            on.as_deref(),
                            &config,
                            &spec.dir,
                            &key,
                            &network,
                            events,
                        )?;
                    }
                    chain.push(key.clone());
                    layers.push(key);
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            events(BuildEvent::StepDone {
                index,
                cached,
                secs,
            });
            report.push(StepReport {
                index,
                kind: step.kind().into(),
                describe: step.describe(),
                layers,
                cached,
                secs,
            });
        }
        self.check_cancel()?;
        if let Some(s) = &spec.start {
            config.start = Some(s.clone());
        }
        if spec.isolation.is_some() {
            config.isolation = spec.isolation;
        }
        let manifest = Manifest {
            schema: SCHEMA,
            layers: chain,
            config,
            base: on,
        };
        let id = self.store.put_manifest(&manifest)?;
        self.store.tag_build(name, &id, opts.build_id.as_deref())?;
        Ok(BuildReport {
            name: name.to_owned(),
            id,
            manifest,
            steps: report,
            secs: t_all.elapsed().as_secs_f64(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn make_step_layer(
        &self,
        index: usize,
        step: &Step,
        chain: &[String],
        on_base: Option<&str>,
        config: &TemplateConfig,
        spec_dir: &Path,
        key: &str,
        network: &StepNetwork,
        events: &mut dyn FnMut(BuildEvent),
    ) -> Result<(), ImageError> {
        let tmp = self.store.tmp_dir(&format!("step{index}"))?;
        let fs = tmp.path().join("fs");
        let fail = |message: String| ImageError::Step {
            index,
            kind: step.kind().into(),
            message,
        };
        let layer_paths: Vec<PathBuf> = chain.iter().map(|k| self.store.layer_fs(k)).collect();
        let base_dir =
            match on_base {
                Some(b) => Some(self.builtin_dir(b).cloned().ok_or_else(|| {
                    fail(format!("the built-in {b} is not available to this build"))
                })?),
                None => None,
            };
        let command = match step {
            Step::Copy {
                src,
                dest,
                owner,
                mode,
            } => {
                let mut roots: Vec<PathBuf> = layer_paths.iter().rev().cloned().collect();
                roots.extend(base_dir.iter().map(|d| d.join("rootfs")));
                let (uid, gid) = match owner {
                    None => (0, 0),
                    Some(o) => resolve_owner(&roots, o).map_err(fail)?,
                };
                // On `base`, /usr below the layers is the host's.
                let mut lowers = roots.clone();
                if base_dir.is_some() && dest.trim_start_matches('/').starts_with("usr/") {
                    lowers.push(PathBuf::from("/"));
                }
                let attrs = CopyAttrs {
                    uid,
                    gid,
                    mode: *mode,
                };
                std::fs::create_dir(&fs).map_err(io("mkdir layer"))?;
                std::fs::set_permissions(&fs, std::fs::Permissions::from_mode(0o755))
                    .map_err(io("chmod layer"))?;
                copy_into(&fs, &spec_dir.join(src), dest, attrs, &lowers)
                    .map_err(|e| fail(e.to_string()))?;
                self.store.commit_layer(&fs, key, &step.describe())?;
                return Ok(());
            }
            Step::Apt(p) => format!(
                "set -e; export DEBIAN_FRONTEND=noninteractive; apt-get update -q; \
                 apt-get install -y -q --no-install-recommends {}; apt-get clean; \
                 rm -rf /var/lib/apt/lists/*",
                p.join(" ")
            ),
            Step::Pip(p) => format!(
                "set -e; if python3 -m pip --version >/dev/null 2>&1; then \
                 python3 -m pip install --no-cache-dir --break-system-packages --root-user-action=ignore {pk} \
                 || python3 -m pip install --no-cache-dir {pk}; \
                 else echo 'pip: python3 -m pip is not available in the image' >&2; exit 127; fi",
                pk = p.join(" ")
            ),
            Step::Npm(p) => format!(
                "set -e; if command -v npm >/dev/null 2>&1; then \
                 npm install -g --no-fund --no-audit --no-update-notifier {}; \
                 else echo 'npm: npm is not available in the image' >&2; exit 127; fi",
                p.join(" ")
            ),
            Step::Run { cmd, .. } => cmd.clone(),
            Step::Env(_) | Step::User(_) | Step::Workdir(_) => return Ok(()),
        };
        let mut rc_roots = layer_paths.clone();
        if let Some(b) = &base_dir {
            rc_roots.insert(0, b.join("rootfs"));
        }
        let had_rc = chain_has(&rc_roots, "etc/resolv.conf");
        let mut env = BTreeMap::new();
        env.insert("PATH".to_owned(), BUILD_PATH.to_owned());
        env.insert("HOME".to_owned(), "/root".to_owned());
        env.extend(config.env.clone());
        // apt, pip and npm run as root; `run` as its own user or the template's so far.
        let user = match step {
            Step::Run { user: Some(u), .. } => u.clone(),
            Step::Run { user: None, .. } => config.user.clone().unwrap_or_else(|| "root".into()),
            _ => "root".into(),
        };
        // The step writes to its disk when it has one (bounded), else to `tmp` (the host's).
        let disk = match self.step_disk_bytes {
            Some(n) => Some(crate::step_disk::StepDisk::make(tmp.path(), n)?),
            None => None,
        };
        let wdir = disk
            .as_ref()
            .map_or_else(|| tmp.path().to_path_buf(), |d| d.root().to_path_buf());
        let upper = wdir.join("fs");
        let on_base = match &base_dir {
            Some(d) => {
                let b = OnBase {
                    template_dir: d.clone(),
                    usr_upper: wdir.join("usr-upper"),
                    usr_work: wdir.join("usr-work"),
                };
                for p in [&b.usr_upper, &b.usr_work] {
                    std::fs::create_dir(p).map_err(io(format!("mkdir {}", p.display())))?;
                    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
                        .map_err(io(format!("chmod {}", p.display())))?;
                }
                Some(b)
            }
            None => None,
        };
        let req = RunRequest {
            layers: layer_paths,
            upper: upper.clone(),
            work: wdir.join("work"),
            command,
            user,
            cwd: match step {
                Step::Run { .. } => config.workdir.clone(),
                _ => Some("/".into()),
            },
            env,
            network: network.clone(),
            scratch: tmp.path().join("scratch"),
            on_base,
        };
        std::fs::create_dir(&req.scratch).map_err(io("mkdir the step's scratch directory"))?;
        let mut out = |b: &[u8]| {
            events(BuildEvent::Output {
                text: String::from_utf8_lossy(b).into_owned(),
            })
        };
        let code = self.runner.run(&req, &mut out, &self.cancel)?;
        self.check_cancel()?;
        if code != 0 {
            if let Some(d) = disk.as_ref().filter(|d| d.full()) {
                return Err(fail(format!(
                    "exited with status {code}; the step's disk is full (the build's disk \
                     limit is {} bytes; a step may write at most that much)",
                    d.bytes()
                )));
            }
            return Err(fail(format!("exited with status {code}")));
        }
        if let Some(b) = &req.on_base {
            merge_usr_upper(&upper, &b.usr_upper)?;
            let _ = remove_tree(&b.usr_work);
        }
        finish_upper(&upper, self.uid_base, had_rc)?;
        let _ = remove_tree(&req.work);
        if let Some(d) = disk {
            // Out of the step's disk into the store's file system; the disk goes.
            crate::step_disk::StepDisk::copy_out(&upper, &fs)?;
            drop(d);
        }
        self.store.commit_layer(&fs, key, &step.describe())?;
        Ok(())
    }
}

/// Runs mmdebstrap (in a private mount namespace of its own, so that its mounts of `/proc`
/// and `/dev` in the new tree die with it), streaming its output; kills it on cancel.
fn mmdebstrap(
    suite: &str,
    variant: &str,
    packages: &[String],
    mirror: &str,
    dest: &Path,
    cancel: &AtomicBool,
    events: &mut dyn FnMut(BuildEvent),
) -> Result<(), ImageError> {
    let fail = |message: String| ImageError::Step {
        index: 0,
        kind: "base".into(),
        message,
    };
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "mmdebstrap"])
        .arg("--mode=root")
        .arg(format!("--variant={variant}"))
        .arg("--format=directory");
    if !packages.is_empty() {
        cmd.arg(format!("--include={}", packages.join(",")));
    }
    cmd.arg(suite).arg(dest).arg(mirror);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| {
        fail(format!(
            "cannot run mmdebstrap ({e}); install it (scripts/setup-host.sh does)"
        ))
    })?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let mut readers = Vec::new();
    for r in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut br = std::io::BufReader::new(r);
            let mut line = String::new();
            while br.read_line(&mut line).unwrap_or(0) > 0 {
                let _ = tx.send(std::mem::take(&mut line));
            }
        }));
    }
    drop(tx);
    let mut tail = String::new();
    let status = loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(l) => {
                tail.push_str(&l);
                if tail.len() > 4096 {
                    tail.drain(..tail.len() - 4096);
                }
                events(BuildEvent::Output { text: l });
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {}
        }
        if cancel.load(Ordering::SeqCst) {
            // Our own child, by pid: SIGTERM lets mmdebstrap clean up, then SIGKILL.
            let pid = child.id() as i32;
            // SAFETY: kill(2) of our own child process.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(ImageError::Interrupted);
        }
        if let Some(st) = child.try_wait().map_err(io("wait for mmdebstrap"))? {
            break st;
        }
    };
    for r in readers {
        let _ = r.join();
    }
    while let Ok(l) = rx.try_recv() {
        events(BuildEvent::Output { text: l });
    }
    if !status.success() {
        return Err(fail(format!(
            "mmdebstrap failed ({status}): {}",
            tail.trim()
        )));
    }
    Ok(())
}

pub use netslot::{BUILD_NET_BLOCK, BUILD_NET_SLOTS};

/// Removes the links and nftables tables of build network slots that no process holds (left
/// by builds killed with SIGKILL). Blocking (one `nft list tables`); [`JailRunner::new`] does
/// it too.
pub fn clean_network_leftovers() {
    netslot::clean_leftovers();
}
pub use runner::{JailRunner, DEFAULT_BUILD_UID_BASE};

/// The host side of build steps' networks: one slot per concurrent step on the host.
///
/// Builds in one data directory run one at a time (the store's lock), but builds in other
/// data directories may run at the same time, so each networked step takes a free slot `n`
/// (`0..BUILD_NET_SLOTS`), held by an abstract Unix socket `@rampart-build-net-<n>` that the
/// kernel releases when the process exits however it exits. Slot `n` owns:
///
/// - the address pair of `10.202.0.(4n)/30` (gateway `.4n`, the step's sandbox `.4n+1`),
/// - host links named `rbld<n in hex><8 hex digits>` (rampart-net's naming),
/// - the nftables table `inet rampart_build_<n>` (rampart-net's firewall for that prefix),
///
/// all removed when the step ends; a build killed with SIGKILL leaves them, and they are
/// removed by the next step that takes the slot and by [`clean_leftovers`] (every
/// [`JailRunner::new`]) for slots no process holds.
mod netslot {
    use crate::ImageError;
    use rampart_net::{AddressPool, Net, NetConfig, NetHandle};
    use std::os::linux::net::SocketAddrExt as _;
    use std::os::unix::net::{SocketAddr, UnixListener};

    /// How many build steps on one host can have a network at the same time.
    pub const BUILD_NET_SLOTS: u32 = 16;
    /// The address block of build steps' links (`BUILD_NET_SLOTS` /30 blocks).
    pub const BUILD_NET_BLOCK: &str = "10.202.0.0/26";

    fn lock(n: u32) -> Option<UnixListener> {
        let name = format!("rampart-build-net-{n}");
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
        UnixListener::bind_addr(&addr).ok()
    }

    /// The wiring of slot `n` (with the egress ports, once known; placeholders before).
    pub(super) fn net(n: u32, dns_port: u16, proxy_port: u16) -> Result<Net, ImageError> {
        let bad = |e: rampart_net::NetError| ImageError::Sandbox(format!("build network: {e}"));
        Net::new(NetConfig {
            pool: AddressPool::parse(&format!("10.202.0.{}/30", 4 * n)).map_err(bad)?,
            link_prefix: format!("rbld{n:x}"),
            table: format!("rampart_build_{n}"),
            dns_port,
            proxy_port,
        })
        .map_err(bad)
    }

    /// A slot this process holds.
    #[derive(Debug)]
    pub(super) struct Slot {
        pub n: u32,
        pub handle: NetHandle,
        _lock: UnixListener,
    }

    /// Takes a free slot and removes what a killed build left in it.
    pub(super) fn take() -> Result<Slot, ImageError> {
        for n in 0..BUILD_NET_SLOTS {
            let Some(l) = lock(n) else { continue };
            let net = net(n, 1, 2)?;
            let handle = net
                .handle(0)
                .map_err(|e| ImageError::Sandbox(format!("build network: {e}")))?;
            clean(&net);
            return Ok(Slot {
                n,
                handle,
                _lock: l,
            });
        }
        Err(ImageError::Sandbox(format!(
            "build network: all {BUILD_NET_SLOTS} slots are taken by other builds on this host"
        )))
    }

    /// Removes a slot's leftover link (the caller holds its lock; its table is replaced
    /// whole when the step installs it).
    fn clean(net: &Net) {
        if let Ok(h) = net.handle(0) {
            if std::path::Path::new("/sys/class/net")
                .join(&h.host_if)
                .exists()
            {
                if let Err(e) = net.remove_link(&h.host_if) {
                    tracing::warn!(link = %h.host_if, "removing a leftover build link: {e}");
                }
            }
        }
    }

    /// Removes the links and tables of slots that no process holds (left by killed builds).
    pub fn clean_leftovers() {
        let tables: Vec<u32> = std::process::Command::new("nft")
            .args(["list", "tables", "inet"])
            .stderr(std::process::Stdio::null())
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter_map(|l| l.trim().strip_prefix("table inet rampart_build_"))
                    .filter_map(|n| n.trim().parse().ok())
                    .filter(|n| *n < BUILD_NET_SLOTS)
                    .collect()
            })
            .unwrap_or_default();
        for n in 0..BUILD_NET_SLOTS {
            let Ok(net) = net(n, 1, 2) else { continue };
            let has_link = net.links().is_ok_and(|l| !l.is_empty());
            if !has_link && !tables.contains(&n) {
                continue;
            }
            let Some(_lock) = lock(n) else { continue };
            if has_link {
                for (name, _) in net.links().unwrap_or_default() {
                    if let Err(e) = net.remove_link(&name) {
                        tracing::warn!(link = %name, "removing a leftover build link: {e}");
                    }
                }
            }
            if tables.contains(&n) {
                if let Err(e) = net.firewall().remove() {
                    tracing::warn!("removing the leftover build table of slot {n}: {e}");
                }
            }
        }
    }
}

mod runner {
    use super::netslot::{self, Slot};
    use super::{RunRequest, StepNetwork, StepRunner};
    use crate::ImageError;
    use futures::StreamExt as _;
    use rampart_agent::client::{AgentClient, ProcessEvent, StartOptions};
    use rampart_egress::{Egress, EgressConfig, NetEvent};
    use rampart_jail::{BuildMounts, Jail, JailConfig, LaunchSpec};
    use rampart_net::Net;
    use rampart_types::{Limits, NetLogEntry, NetworkMode, NetworkPolicy, SandboxId, Verdict};
    use std::net::IpAddr;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    use tokio::sync::mpsc;

    /// Default first host uid of build sandboxes: above the daemon's default sandbox
    /// ranges (`2^29 + 1024 * 65536`); one range, builds run one at a time (store lock).
    pub const DEFAULT_BUILD_UID_BASE: u32 = 1 << 30;

    /// Runs build steps in jail sandboxes: the template so far as idmapped lower layers, a
    /// host directory as the upper layer, a network namespace of its own (with the step's
    /// network: a link to the host whose DNS and TCP go only to an egress resolver and proxy
    /// started for the step, see the module documentation), its own cgroup subtree
    /// `rampart-build` and state directory `<data>/images/build`.
    #[derive(Debug)]
    pub struct JailRunner {
        jail: Jail,
        uid_base: u32,
        limits: Limits,
    }

    impl JailRunner {
        /// Sets up the build tier and removes leftovers of an interrupted earlier build (its
        /// sandboxes, and the links and nftables tables of build network slots no process
        /// holds).
        pub fn new(
            data: &Path,
            jailer_bin: PathBuf,
            agent_bin: PathBuf,
            uid_base: u32,
        ) -> Result<JailRunner, ImageError> {
            let jail = Jail::new(JailConfig {
                state_dir: data.join("images").join("build"),
                jailer_bin,
                agent_bin,
                cgroup_subtree: "rampart-build".into(),
            })
            .map_err(|e| ImageError::Sandbox(e.to_string()))?;
            netslot::clean_leftovers();
            // Only this data directory's: the cgroup subtree is shared by every build on
            // the host, and a build of another data directory running now is not ours.
            let state_dir = data.join("images").join("build");
            for id in jail.leftovers().unwrap_or_default() {
                if state_dir.join(id.as_str()).exists() {
                    let _ = jail.destroy(&id);
                }
            }
            jail.settle();
            Ok(JailRunner {
                jail,
                uid_base,
                limits: Limits {
                    cpus: 2.0,
                    memory_bytes: 2 << 30,
                    pids: 4096,
                    disk_bytes: 256 << 20,
                    open_files: 4096,
                },
            })
        }

        /// The uid base of its sandboxes.
        pub fn uid_base(&self) -> u32 {
            self.uid_base
        }
    }

    /// A step's network while it runs: its slot, link, table and egress service. Dropping it
    /// stops the egress service and removes the link, then the table; the slot is freed
    /// last.
    struct StepNet {
        net: Net,
        egress: Option<Egress>,
        wired: bool,
        table: bool,
        _slot: Slot,
    }

    impl Drop for StepNet {
        fn drop(&mut self) {
            if let Some(e) = self.egress.take() {
                drop(e);
            }
            // The link first: processes the step left behind still run in its sandbox
            // until it is destroyed, and must never have a link without the table.
            if self.wired {
                if let Err(e) = self.net.unwire(0) {
                    tracing::warn!("removing the build step's link: {e}");
                }
            }
            if self.table {
                if let Err(e) = self.net.firewall().remove() {
                    tracing::warn!("removing the build step's nftables table: {e}");
                }
            }
        }
    }

    /// Wires the launched step sandbox (PID 1 `pid`) into `slot` and starts its egress
    /// service with an allowlist of `allow`: link, resolver and proxy on the gateway address
    /// (which exists once the link does), the slot's nftables table (which needs their
    /// ports), the attachment. Nothing but the sandbox's agent runs inside until this
    /// returns: the step's command starts after. On error, what was made is removed (by
    /// dropping the partial [`StepNet`]).
    fn setup(
        slot: Slot,
        pid: i32,
        rt: &tokio::runtime::Runtime,
        id: &SandboxId,
        allow: &[String],
        state_dir: PathBuf,
    ) -> Result<(StepNet, Option<mpsc::Receiver<NetEvent>>), ImageError> {
        let fail =
            |what: &str, e: String| ImageError::Sandbox(format!("build network: {what}: {e}"));
        let mut sn = StepNet {
            net: netslot::net(slot.n, 1, 2)?,
            egress: None,
            wired: false,
            table: false,
            _slot: slot,
        };
        let h = sn._slot.handle.clone();
        // On error `wire` leaves nothing behind.
        sn.net
            .wire(pid, 0)
            .map_err(|e| fail("wiring the link", e.to_string()))?;
        sn.wired = true;
        let egress = rt
            .block_on(Egress::start(EgressConfig {
                listen: vec![IpAddr::V4(h.gateway)],
                proxy_port: 0,
                dns_port: 0,
                state_dir,
                blocked: vec![super::BUILD_NET_BLOCK.to_owned()],
                // A step's trust store is the image's own: no CA, no interception.
                record_packages: false,
                ..EgressConfig::default()
            }))
            .map_err(|e| fail("starting the egress proxy", e.to_string()))?;
        let events = egress.take_events();
        let (dns_port, proxy_port) = (egress.dns_port(), egress.proxy_port());
        sn.egress = Some(egress);
        sn.net = netslot::net(sn._slot.n, dns_port, proxy_port)?;
        sn.table = true;
        sn.net
            .install_firewall()
            .map_err(|e| fail("installing the firewall", e.to_string()))?;
        let policy = NetworkPolicy {
            mode: NetworkMode::Allowlist,
            allow: allow.to_vec(),
            ..NetworkPolicy::default()
        };
        if let Some(e) = &sn.egress {
            e.attach(
                id.as_str(),
                IpAddr::V4(h.address),
                IpAddr::V4(h.gateway),
                policy,
                Vec::new(),
            )
            .map_err(|e| fail("attaching to the egress proxy", e.to_string()))?;
        }
        Ok((sn, events))
    }

    /// Writes the step's `resolv.conf` (mode 0644: read inside by the sandbox's users).
    fn write_resolv_conf(path: &Path, text: &str) -> Result<(), ImageError> {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::write(path, text).map_err(crate::io("write the step's resolv.conf"))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
            .map_err(crate::io("chmod the step's resolv.conf"))
    }

    impl StepRunner for JailRunner {
        fn run(
            &self,
            req: &RunRequest,
            out: &mut dyn FnMut(&[u8]),
            cancel: &AtomicBool,
        ) -> Result<i32, ImageError> {
            let id = SandboxId::generate();
            let slot = match &req.network {
                StepNetwork::None => None,
                StepNetwork::Egress { .. } => Some(netslot::take()?),
            };
            let resolv = req.scratch.join("resolv.conf");
            match &slot {
                Some(s) => write_resolv_conf(
                    &resolv,
                    &format!("nameserver {}\noptions edns0\n", s.handle.gateway),
                )?,
                None => write_resolv_conf(&resolv, "# rampart build: network = \"none\"\n")?,
            }
            let spec = LaunchSpec {
                id: id.clone(),
                // The builder drives the jail (the namespace tier) itself.
                tier: rampart_types::Tier::Namespace,
                template_dir: req
                    .on_base
                    .as_ref()
                    .map(|b| b.template_dir.clone())
                    .unwrap_or_default(),
                uid_base: self.uid_base,
                limits: self.limits.clone(),
                hostname: "rampart-build".into(),
                env: req
                    .env
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                layers: req.layers.clone(),
                layers_on_base: req.on_base.is_some(),
                build: Some(BuildMounts {
                    upper: req.upper.clone(),
                    work: req.work.clone(),
                    // A network namespace of its own (loopback only until wired below).
                    resolv_conf: Some(resolv),
                    usr_upper: req.on_base.as_ref().map(|b| b.usr_upper.clone()),
                    usr_work: req.on_base.as_ref().map(|b| b.usr_work.clone()),
                }),
                agent_args: vec!["--default-user".into(), "root".into()],
                files: Vec::new(),
            };
            let r = (|| {
                let launched = self
                    .jail
                    .launch(&spec)
                    .map_err(|e| ImageError::Sandbox(e.to_string()))?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(crate::io("start a runtime"))?;
                let (net, events) = match (slot, &req.network) {
                    (Some(slot), StepNetwork::Egress { allow }) => {
                        let (n, ev) = setup(
                            slot,
                            launched.pid,
                            &rt,
                            &id,
                            allow,
                            req.scratch.join("egress"),
                        )?;
                        (Some(n), ev)
                    }
                    _ => (None, None),
                };
                let r = rt.block_on(run_in(launched.agent_socket, req, out, cancel, events));
                drop(net);
                r
            })();
            let _ = self.jail.destroy(&id);
            self.jail.settle();
            r
        }
    }

    /// A line for the build's output about a refused DNS query or connection.
    fn describe_denial(e: &NetLogEntry) -> Option<String> {
        if e.verdict != Verdict::Deny {
            return None;
        }
        let kind = serde_json::to_value(e.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let what = match (&e.name, e.addrs.first()) {
            (Some(n), _) => n.clone(),
            (None, Some(a)) => a.clone(),
            (None, None) => "?".into(),
        };
        let port = e.port.map(|p| format!(":{p}")).unwrap_or_default();
        Some(format!(
            "rampart: network: deny {kind} {what}{port} ({})\n",
            e.rule
        ))
    }

    fn report(ev: &NetEvent, out: &mut dyn FnMut(&[u8])) {
        if let Some(l) = describe_denial(&ev.entry) {
            out(l.as_bytes());
        }
    }

    async fn run_in(
        sock: PathBuf,
        req: &RunRequest,
        out: &mut dyn FnMut(&[u8]),
        cancel: &AtomicBool,
        mut net_events: Option<mpsc::Receiver<NetEvent>>,
    ) -> Result<i32, ImageError> {
        let client = AgentClient::new(sock);
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.health().await.is_err() {
            if Instant::now() > deadline {
                return Err(ImageError::Sandbox(
                    "the build sandbox's agent did not answer".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let opts = StartOptions {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), req.command.clone()],
            envs: req.env.clone(),
            cwd: req.cwd.clone(),
            user: Some(req.user.clone()),
            ..Default::default()
        };
        let mut events = client
            .start(opts)
            .await
            .map_err(|e| ImageError::Sandbox(format!("start the step: {e}")))?;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(ProcessEvent::Stdout(b) | ProcessEvent::Stderr(b) | ProcessEvent::Pty(b))) => out(&b),
                    Some(Ok(ProcessEvent::End { exit_code, .. })) => {
                        if let Some(rx) = net_events.as_mut() {
                            while let Ok(ev) = rx.try_recv() {
                                report(&ev, out);
                            }
                        }
                        return Ok(exit_code);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(ImageError::Sandbox(format!("step output: {e}"))),
                    None => return Err(ImageError::Sandbox("the step's output ended without an exit".into())),
                },
                Some(ev) = async {
                    match net_events.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => report(&ev, out),
                _ = tick.tick() => {
                    if cancel.load(Ordering::SeqCst) {
                        return Err(ImageError::Interrupted);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod network_tests {
    use super::*;

    #[test]
    fn url_hosts() {
        for (u, h) in [
            ("http://deb.debian.org/debian", Some("deb.debian.org")),
            (
                "https://Mirror.Example.com:8443/x",
                Some("mirror.example.com"),
            ),
            ("http://user:pw@host.example/p", Some("host.example")),
            (
                "mirror+http://mirrors.example/list",
                Some("mirrors.example"),
            ),
            ("http://[2001:db8::1]:80/debian", Some("2001:db8::1")),
            ("file:/srv/repo", None),
            ("cdrom:[Debian]/", None),
            ("ftp://ftp.example/debian", None),
        ] {
            assert_eq!(url_host(u).as_deref(), h, "{u}");
        }
    }

    #[test]
    fn apt_sources_in_both_formats() {
        let d = std::env::temp_dir().join(format!("rampart-apt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sources.list.d")).unwrap();
        std::fs::write(
            d.join("sources.list"),
            "# comment\ndeb http://deb.debian.org/debian bookworm main\n\
             deb [arch=amd64 signed-by=/k.gpg] https://packages.example.com/apt stable main # tail\n\
             deb-src http://src.example.org/debian bookworm main\n\
             #deb http://commented.example/debian bookworm main\n",
        )
        .unwrap();
        std::fs::write(
            d.join("sources.list.d/a.sources"),
            "Types: deb\nURIs: http://deb.debian.org/debian-security\n  https://cont.example.net/x\n\
             Suites: bookworm-security\n\n# off\nTypes: deb\nURIs: http://disabled.example/\n\
             Enabled: no\n",
        )
        .unwrap();
        std::fs::write(
            d.join("sources.list.d/b.list.disabled"),
            "deb http://ignored.example/ x main\n",
        )
        .unwrap();
        std::fs::write(
            d.join("sources.list.d/c.list"),
            "deb file:/srv/repo ./\ndeb http://local.example/ x main\n",
        )
        .unwrap();
        assert_eq!(
            apt_source_hosts(&d),
            [
                "cont.example.net",
                "deb.debian.org",
                "local.example",
                "packages.example.com",
                "src.example.org"
            ]
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_step_network_follows_the_spec() {
        let spec = |extra: &str| {
            Spec::parse(
                &format!(
                    "from = \"debian:bookworm\"\n[debian]\nmirror = \"http://mirror.example.org/debian\"\n{extra}"
                ),
                Path::new("."),
            )
            .unwrap()
        };
        assert_eq!(
            step_network(&spec("[build]\nnetwork = \"none\"")),
            StepNetwork::None
        );
        assert_eq!(
            step_network(&spec("[build]\nnetwork = { allow = [\"pypi.org\"] }")),
            StepNetwork::Egress {
                allow: vec!["pypi.org".into()]
            }
        );
        let StepNetwork::Egress { allow } = step_network(&spec("")) else {
            panic!("the default has a network");
        };
        for h in REGISTRY_HOSTS.iter().copied().chain(["mirror.example.org"]) {
            assert!(allow.iter().any(|a| a == h), "{h} missing from {allow:?}");
        }
        assert!(allow.windows(2).all(|w| w[0] < w[1]), "{allow:?}");
    }
}
