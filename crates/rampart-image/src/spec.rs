//! The template spec: TOML, documented in `docs/templates.md`.
//!
//! ```toml
//! name = "py"                       # optional; `--name` overrides
//! from = "debian:bookworm"          # or "oci:PATH" (layout dir or archive), "template:NAME",
//!                                   # "image:REF" (pulled from a registry, e.g. image:python:3)
//! [debian]                          # only with from = "debian:..."
//! variant = "apt"                   # or "minbase"
//! packages = ["ca-certificates"]
//! [[steps]]
//! apt = ["python3", "python3-pip"]
//! [[steps]]
//! copy = { src = "app", dest = "/opt/app" }
//! [[steps]]
//! run = "useradd -m -s /bin/bash user"
//! [[steps]]
//! env = { APP_MODE = "demo" }
//! [[steps]]
//! user = "user"
//! [[steps]]
//! workdir = "/home/user"
//! [start]
//! cmd = ["python3", "-m", "http.server", "8000"]
//! ready = { port = 8000, timeout_secs = 30 }   # or { cmd = "test -f /tmp/ready" }
//! [build]
//! network = "registries"            # or "none", or { allow = ["pypi.org", "10.0.0.0/8"] }
//! ```
//!
//! Every error names the field it is about (`steps[2].copy.src: ...`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toml::Value;

/// A spec error: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// The field path, e.g. `steps[2].apt`, or `toml` for a syntax error.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        message: message.into(),
    }
}

/// The debootstrap variant of a `debian:` base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// Essential packages and apt.
    Minbase,
    /// Essential packages, apt (mmdebstrap's `apt` variant).
    Apt,
}

impl Variant {
    /// mmdebstrap's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Minbase => "minbase",
            Variant::Apt => "apt",
        }
    }
}

/// Where a template starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// A Debian suite made by mmdebstrap.
    Debian {
        /// Suite, e.g. `bookworm`.
        suite: String,
        /// Variant.
        variant: Variant,
        /// Extra packages given to mmdebstrap (`--include`).
        packages: Vec<String>,
        /// Mirror URL.
        mirror: String,
    },
    /// An OCI image layout directory, or an OCI / `docker save` archive (tar).
    Oci(PathBuf),
    /// Another template, by name.
    Template(String),
    /// An image pulled from a registry (`image:python:3`, `image:ghcr.io/o/r@sha256:...`).
    Image(crate::reference::ImageRef),
}

/// The readiness check of a start command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ready {
    /// Ready once something listens on this TCP port (inside the sandbox).
    Port(u16),
    /// Ready once this shell command exits 0 (retried).
    Cmd(String),
}

/// What runs at create, and when the sandbox counts as ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartSpec {
    /// The program and its arguments.
    pub cmd: Vec<String>,
    /// The readiness check (none: started is ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<Ready>,
    /// How long a create waits for readiness, seconds.
    pub timeout_secs: u64,
}

/// One build step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Debian packages (`apt-get install --no-install-recommends`).
    Apt(Vec<String>),
    /// Python packages (`pip install`).
    Pip(Vec<String>),
    /// Node.js packages, installed globally as root (`npm install -g`).
    Npm(Vec<String>),
    /// Files from the spec's directory into the image.
    Copy {
        /// Source, relative to the spec's directory (file or directory).
        src: PathBuf,
        /// Absolute destination inside the image (a file source and a destination ending in
        /// `/` put the file into that directory).
        dest: String,
        /// Owner of every copied entry, `user[:group]` (names of the image's `/etc/passwd`
        /// and `/etc/group`, or numbers); root when none.
        owner: Option<String>,
        /// Permission bits of every copied entry; the source's when none.
        mode: Option<u32>,
    },
    /// A shell command (`/bin/sh -c`).
    Run {
        /// The command.
        cmd: String,
        /// Who runs it (none: the template's user so far).
        user: Option<String>,
    },
    /// Environment variables (metadata; no layer).
    Env(BTreeMap<String, String>),
    /// Default user (metadata; no layer).
    User(String),
    /// Default working directory (metadata; no layer).
    Workdir(String),
}

impl Step {
    /// The step's kind as the spec spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Apt(_) => "apt",
            Step::Pip(_) => "pip",
            Step::Npm(_) => "npm",
            Step::Copy { .. } => "copy",
            Step::Run { .. } => "run",
            Step::Env(_) => "env",
            Step::User(_) => "user",
            Step::Workdir(_) => "workdir",
        }
    }
    /// Whether the step makes a layer (the others only change metadata).
    pub fn makes_layer(&self) -> bool {
        matches!(
            self,
            Step::Apt(_) | Step::Pip(_) | Step::Npm(_) | Step::Copy { .. } | Step::Run { .. }
        )
    }
    /// A one-line description.
    pub fn describe(&self) -> String {
        match self {
            Step::Apt(p) => format!("apt {}", p.join(" ")),
            Step::Pip(p) => format!("pip {}", p.join(" ")),
            Step::Npm(p) => format!("npm {}", p.join(" ")),
            Step::Copy {
                src,
                dest,
                owner,
                mode,
            } => {
                let mut d = format!("copy {} -> {dest}", src.display());
                if let Some(o) = owner {
                    d.push_str(&format!(" (owner {o})"));
                }
                if let Some(m) = mode {
                    d.push_str(&format!(" (mode {m:04o})"));
                }
                d
            }
            Step::Run { cmd, user: None } => format!("run {cmd}"),
            Step::Run { cmd, user: Some(u) } => format!("run (as {u}) {cmd}"),
            Step::Env(e) => format!(
                "env {}",
                e.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Step::User(u) => format!("user {u}"),
            Step::Workdir(w) => format!("workdir {w}"),
        }
    }
}

/// What the build steps (`apt`, `pip`, `run`) may reach: `[build] network`. Every step runs
/// in a network namespace of its own; with a network, its only way out is the egress proxy
/// (its DNS and TCP judged like a sandbox's `allowlist` policy), and the host's loopback and
/// addresses, metadata and private ranges are never reachable (a private range only through an
/// address rule in `allow`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum BuildNetwork {
    /// The package registries: the hosts of the host's apt sources and the spec's Debian
    /// mirror, PyPI, npm and crates.io (`network = "registries"`, the default).
    #[default]
    Registries,
    /// No network at all: the steps have only their loopback (`network = "none"`).
    None,
    /// Only these destinations, in the rule syntax of a sandbox's network policy (`pypi.org`,
    /// `*.example.com`, `github.com:22`, `203.0.113.7`, `198.51.100.0/24`):
    /// `network = { allow = [...] }`.
    Allow(Vec<String>),
}

/// A parsed spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The template's name, if the spec gives one.
    pub name: Option<String>,
    /// The base.
    pub from: Base,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Start command.
    pub start: Option<StartSpec>,
    /// What the build steps may reach (`[build] network`).
    pub network: BuildNetwork,
    /// The isolation tier of its sandboxes unless their create names one (`isolation =
    /// "gvisor"`).
    pub isolation: Option<rampart_types::Tier>,
    /// The directory `copy` sources and `oci:` paths are relative to.
    pub dir: PathBuf,
}

/// Default mirror of `debian:` bases (the only one reachable from the build hosts).
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// Default readiness timeout, seconds.
pub const DEFAULT_READY_TIMEOUT: u64 = 60;

impl Spec {
    /// Reads and parses a spec file; relative paths in it are relative to its directory.
    pub fn load(path: &Path) -> Result<Spec, crate::ImageError> {
        let text = std::fs::read_to_string(path)
            .map_err(crate::io(format!("read spec {}", path.display())))?;
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        Ok(Spec::parse(&text, &dir)?)
    }

    /// Parses a spec's text.
    pub fn parse(text: &str, dir: &Path) -> Result<Spec, SpecError> {
        let v: toml::Table = toml::from_str(text).map_err(|e| err("toml", e.message()))?;
        let allowed = [
            "name",
            "from",
            "debian",
            "steps",
            "start",
            "build",
            "isolation",
        ];
        for k in v.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(err(
                    k.as_str(),
                    format!("unknown field (expected one of {})", allowed.join(", ")),
                ));
            }
        }
        let name = match v.get("name") {
            None => None,
            Some(n) => {
                let s = want_str("name", n)?;
                crate::check_name(s).map_err(|e| err("name", e.to_string()))?;
                Some(s.to_owned())
            }
        };
        let from_s = want_str("from", v.get("from").ok_or_else(|| err("from", "missing"))?)?;
        let from = parse_from(from_s, v.get("debian"), dir)?;
        let mut steps = Vec::new();
        if let Some(s) = v.get("steps") {
            let arr = s
                .as_array()
                .ok_or_else(|| err("steps", "must be an array of tables ([[steps]])"))?;
            for (i, st) in arr.iter().enumerate() {
                steps.push(parse_step(&format!("steps[{}]", i + 1), st)?);
            }
        }
        let start = v.get("start").map(parse_start).transpose()?;
        let network = v
            .get("build")
            .map(parse_build)
            .transpose()?
            .unwrap_or_default();
        let isolation = v
            .get("isolation")
            .map(|t| {
                want_str("isolation", t)?
                    .parse::<rampart_types::Tier>()
                    .map_err(|e| err("isolation", e))
            })
            .transpose()?;
        Ok(Spec {
            name,
            from,
            steps,
            start,
            network,
            isolation,
            dir: dir.to_path_buf(),
        })
    }
}

fn want_str<'a>(field: &str, v: &'a Value) -> Result<&'a str, SpecError> {
    v.as_str()
        .ok_or_else(|| err(field, format!("must be a string, not {}", v.type_str())))
}

fn want_str_list(field: &str, v: &Value) -> Result<Vec<String>, SpecError> {
    let arr = v.as_array().ok_or_else(|| {
        err(
            field,
            format!("must be a list of strings, not {}", v.type_str()),
        )
    })?;
    if arr.is_empty() {
        return Err(err(field, "must not be empty"));
    }
    arr.iter()
        .enumerate()
        .map(|(i, x)| want_str(&format!("{field}[{}]", i + 1), x).map(str::to_owned))
        .collect()
}

/// A Debian package name, optionally `=version` or `/suite`.
fn check_package(field: &str, p: &str) -> Result<(), SpecError> {
    let name = p.split(['=', '/']).next().unwrap_or("");
    let ok_name = name.len() >= 2
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
    let ok_rest = p
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"+-.:~=/_".contains(&b));
    if ok_name && ok_rest {
        Ok(())
    } else {
        Err(err(field, format!("{p:?} is not a Debian package name")))
    }
}

/// A pip requirement: no whitespace, no shell metacharacters, not an option.
fn check_pip(field: &str, p: &str) -> Result<(), SpecError> {
    let ok = !p.is_empty()
        && !p.starts_with('-')
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.[],<>=!~:/@+".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(err(field, format!("{p:?} is not a pip requirement")))
    }
}

/// An npm package spec (`name`, `@scope/name`, `name@version`): no whitespace, no shell
/// metacharacters, not an option.
fn check_npm(field: &str, p: &str) -> Result<(), SpecError> {
    let ok = !p.is_empty()
        && !p.starts_with('-')
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@/~^<>=:+".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(err(field, format!("{p:?} is not an npm package")))
    }
}

/// A user name (or number) of the image.
pub fn check_user(field: &str, u: &str) -> Result<(), SpecError> {
    if u.is_empty()
        || u.len() > 64
        || u.contains(['/', '\0', ':'])
        || u.contains(char::is_whitespace)
    {
        return Err(err(field, format!("{u:?} is not a user name")));
    }
    Ok(())
}

/// An owner: `user` or `user:group`.
pub fn check_owner(field: &str, o: &str) -> Result<(), SpecError> {
    let (u, g) = match o.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (o, None),
    };
    check_user(field, u)?;
    if let Some(g) = g {
        check_user(field, g).map_err(|_| err(field, format!("{o:?} is not user[:group]")))?;
    }
    Ok(())
}

/// An octal mode (`"755"`, `"0755"`, `"0o755"`) up to `0o7777`.
pub fn parse_mode(m: &str) -> Option<u32> {
    let d = m.strip_prefix("0o").unwrap_or(m);
    if d.is_empty() || d.len() > 5 {
        return None;
    }
    u32::from_str_radix(d, 8).ok().filter(|m| *m <= 0o7777)
}

fn check_abs(field: &str, p: &str) -> Result<(), SpecError> {
    if !p.starts_with('/') || p.contains('\0') {
        return Err(err(field, format!("{p:?} must be an absolute path")));
    }
    if p.split('/').any(|c| c == "..") {
        return Err(err(field, format!("{p:?} must not contain '..'")));
    }
    Ok(())
}

fn parse_from(s: &str, debian: Option<&Value>, dir: &Path) -> Result<Base, SpecError> {
    let (scheme, rest) = s.split_once(':').ok_or_else(|| {
        err(
            "from",
            format!("{s:?}: expected debian:SUITE, oci:PATH, template:NAME or image:REF"),
        )
    })?;
    if scheme != "debian" && debian.is_some() {
        return Err(err("debian", "only allowed with from = \"debian:SUITE\""));
    }
    match scheme {
        "debian" => {
            if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
                return Err(err("from", format!("{rest:?} is not a Debian suite name")));
            }
            let mut variant = Variant::Apt;
            let mut packages = Vec::new();
            let mut mirror = DEFAULT_MIRROR.to_owned();
            if let Some(d) = debian {
                let t = d
                    .as_table()
                    .ok_or_else(|| err("debian", "must be a table"))?;
                for (k, v) in t {
                    match k.as_str() {
                        "variant" => {
                            variant = match want_str("debian.variant", v)? {
                                "apt" => Variant::Apt,
                                "minbase" => Variant::Minbase,
                                o => {
                                    return Err(err(
                                        "debian.variant",
                                        format!("{o:?}: expected \"apt\" or \"minbase\""),
                                    ))
                                }
                            }
                        }
                        "packages" => {
                            packages = want_str_list("debian.packages", v)?;
                            for p in &packages {
                                check_package("debian.packages", p)?;
                            }
                        }
                        "mirror" => {
                            let m = want_str("debian.mirror", v)?;
                            if !(m.starts_with("http://") || m.starts_with("https://"))
                                || m.contains(char::is_whitespace)
                            {
                                return Err(err("debian.mirror", "must be an http(s) URL"));
                            }
                            mirror = m.to_owned();
                        }
                        o => {
                            return Err(err(
                                format!("debian.{o}"),
                                "unknown field (expected variant, packages, mirror)",
                            ))
                        }
                    }
                }
            }
            Ok(Base::Debian {
                suite: rest.to_owned(),
                variant,
                packages,
                mirror,
            })
        }
        "oci" => {
            if rest.is_empty() {
                return Err(err("from", "oci: needs a path"));
            }
            Ok(Base::Oci(dir.join(rest)))
        }
        "template" => {
            if rest.is_empty() {
                return Err(err("from", "template: needs a name"));
            }
            Ok(Base::Template(rest.to_owned()))
        }
        "image" => crate::reference::ImageRef::parse(rest)
            .map(Base::Image)
            .map_err(|e| err("from", e.to_string())),
        o => Err(err(
            "from",
            format!("unknown base kind {o:?} (expected debian, oci, template or image)"),
        )),
    }
}

const STEP_KINDS: &str = "apt, pip, npm, copy, run, env, user, workdir";

fn parse_step(field: &str, v: &Value) -> Result<Step, SpecError> {
    let t = v
        .as_table()
        .ok_or_else(|| err(field, "must be a table with one key"))?;
    if t.len() != 1 {
        return Err(err(
            field,
            format!("must have exactly one key, one of {STEP_KINDS}"),
        ));
    }
    let (k, v) = t.iter().next().ok_or_else(|| err(field, "empty"))?;
    let f = format!("{field}.{k}");
    Ok(match k.as_str() {
        "apt" => {
            let p = want_str_list(&f, v)?;
            for x in &p {
                check_package(&f, x)?;
            }
            Step::Apt(p)
        }
        "pip" => {
            let p = want_str_list(&f, v)?;
            for x in &p {
                check_pip(&f, x)?;
            }
            Step::Pip(p)
        }
        "npm" => {
            let p = want_str_list(&f, v)?;
            for x in &p {
                check_npm(&f, x)?;
            }
            Step::Npm(p)
        }
        "copy" => {
            let c = v
                .as_table()
                .ok_or_else(|| err(&f, "must be a table { src = ..., dest = ... }"))?;
            for key in c.keys() {
                if !["src", "dest", "owner", "mode"].contains(&key.as_str()) {
                    return Err(err(
                        format!("{f}.{key}"),
                        "unknown field (expected src, dest, owner, mode)",
                    ));
                }
            }
            let src = want_str(
                &format!("{f}.src"),
                c.get("src")
                    .ok_or_else(|| err(format!("{f}.src"), "missing"))?,
            )?;
            if src.is_empty() || src.starts_with('/') || src.split('/').any(|c| c == "..") {
                return Err(err(
                    format!("{f}.src"),
                    format!("{src:?} must be a relative path inside the spec's directory"),
                ));
            }
            let dest = want_str(
                &format!("{f}.dest"),
                c.get("dest")
                    .ok_or_else(|| err(format!("{f}.dest"), "missing"))?,
            )?;
            check_abs(&format!("{f}.dest"), dest)?;
            let owner = match c.get("owner") {
                None => None,
                Some(o) => {
                    let o = want_str(&format!("{f}.owner"), o)?;
                    check_owner(&format!("{f}.owner"), o)?;
                    Some(o.to_owned())
                }
            };
            let mode = match c.get("mode") {
                None => None,
                Some(Value::Integer(m)) if (0..=0o7777).contains(m) => Some(*m as u32),
                Some(Value::String(m)) => Some(parse_mode(m).ok_or_else(|| {
                    err(format!("{f}.mode"), format!("{m:?} is not an octal mode"))
                })?),
                Some(_) => {
                    return Err(err(
                        format!("{f}.mode"),
                        "must be an octal string (\"0755\") or an integer up to 0o7777",
                    ))
                }
            };
            Step::Copy {
                src: PathBuf::from(src),
                dest: dest.to_owned(),
                owner,
                mode,
            }
        }
        "run" => {
            let (cmd_v, user) = match v {
                Value::Table(t) => {
                    for key in t.keys() {
                        if key != "cmd" && key != "user" {
                            return Err(err(
                                format!("{f}.{key}"),
                                "unknown field (expected cmd, user)",
                            ));
                        }
                    }
                    let user = match t.get("user") {
                        None => None,
                        Some(u) => {
                            let u = want_str(&format!("{f}.user"), u)?;
                            check_user(&format!("{f}.user"), u)?;
                            Some(u.to_owned())
                        }
                    };
                    (
                        t.get("cmd")
                            .ok_or_else(|| err(format!("{f}.cmd"), "missing"))?,
                        user,
                    )
                }
                v => (v, None),
            };
            let s = match cmd_v {
                Value::String(s) => s.clone(),
                Value::Array(_) => want_str_list(&f, cmd_v)?.join(" && "),
                o => return Err(err(&f, format!("must be a string, not {}", o.type_str()))),
            };
            if s.trim().is_empty() || s.contains('\0') {
                return Err(err(&f, "must be a non-empty command"));
            }
            Step::Run { cmd: s, user }
        }
        "env" => {
            let t = v
                .as_table()
                .ok_or_else(|| err(&f, "must be a table of NAME = \"value\""))?;
            let mut m = BTreeMap::new();
            for (name, val) in t {
                if name.is_empty() || name.contains(['=', '\0']) {
                    return Err(err(&f, format!("{name:?} is not a variable name")));
                }
                let val = want_str(&format!("{f}.{name}"), val)?;
                if val.contains('\0') {
                    return Err(err(format!("{f}.{name}"), "contains NUL"));
                }
                m.insert(name.clone(), val.to_owned());
            }
            Step::Env(m)
        }
        "user" => {
            let u = want_str(&f, v)?;
            check_user(&f, u)?;
            Step::User(u.to_owned())
        }
        "workdir" => {
            let w = want_str(&f, v)?;
            check_abs(&f, w)?;
            Step::Workdir(w.to_owned())
        }
        o => {
            return Err(err(
                field,
                format!("unknown step kind {o:?} (expected one of {STEP_KINDS})"),
            ))
        }
    })
}

const NETWORK_FORMS: &str = "expected \"registries\", \"none\" or { allow = [\"host\", ...] }";

fn parse_build(v: &Value) -> Result<BuildNetwork, SpecError> {
    let t = v
        .as_table()
        .ok_or_else(|| err("build", "must be a table"))?;
    let mut network = BuildNetwork::default();
    for (k, v) in t {
        match k.as_str() {
            "network" => network = parse_network(v)?,
            o => {
                return Err(err(
                    format!("build.{o}"),
                    "unknown field (expected network)",
                ))
            }
        }
    }
    Ok(network)
}

fn parse_network(v: &Value) -> Result<BuildNetwork, SpecError> {
    const F: &str = "build.network";
    match v {
        Value::String(s) => match s.as_str() {
            "registries" => Ok(BuildNetwork::Registries),
            "none" => Ok(BuildNetwork::None),
            o => Err(err(F, format!("{o:?}: {NETWORK_FORMS}"))),
        },
        Value::Table(t) => {
            for k in t.keys() {
                if k != "allow" {
                    return Err(err(format!("{F}.{k}"), "unknown field (expected allow)"));
                }
            }
            let f = format!("{F}.allow");
            let allow = want_str_list(&f, t.get("allow").ok_or_else(|| err(&f, "missing"))?)?;
            for (i, rule) in allow.iter().enumerate() {
                let policy = rampart_types::NetworkPolicy {
                    mode: rampart_types::NetworkMode::Allowlist,
                    allow: vec![rule.clone()],
                    ..Default::default()
                };
                rampart_egress::validate_policy(&policy)
                    .map_err(|e| err(format!("{f}[{}]", i + 1), e.to_string()))?;
            }
            Ok(BuildNetwork::Allow(allow))
        }
        o => Err(err(
            F,
            format!(
                "must be a string or a table, not {}: {NETWORK_FORMS}",
                o.type_str()
            ),
        )),
    }
}

fn parse_start(v: &Value) -> Result<StartSpec, SpecError> {
    let t = v
        .as_table()
        .ok_or_else(|| err("start", "must be a table"))?;
    for k in t.keys() {
        if !["cmd", "ready"].contains(&k.as_str()) {
            return Err(err(
                format!("start.{k}"),
                "unknown field (expected cmd, ready)",
            ));
        }
    }
    let cmd = match t.get("cmd") {
        None => return Err(err("start.cmd", "missing")),
        Some(Value::String(s)) => vec!["/bin/sh".to_owned(), "-c".to_owned(), s.clone()],
        Some(v) => want_str_list("start.cmd", v)?,
    };
    let mut ready = None;
    let mut timeout_secs = DEFAULT_READY_TIMEOUT;
    if let Some(r) = t.get("ready") {
        let r = r.as_table().ok_or_else(|| {
            err(
                "start.ready",
                "must be a table { port = N } or { cmd = \"...\" }",
            )
        })?;
        for (k, v) in r {
            match k.as_str() {
                "port" => {
                    let p = v
                        .as_integer()
                        .filter(|p| (1..=65535).contains(p))
                        .ok_or_else(|| err("start.ready.port", "must be a port 1-65535"))?;
                    if ready.is_some() {
                        return Err(err("start.ready", "give port or cmd, not both"));
                    }
                    ready = Some(Ready::Port(p as u16));
                }
                "cmd" => {
                    let c = want_str("start.ready.cmd", v)?;
                    if ready.is_some() {
                        return Err(err("start.ready", "give port or cmd, not both"));
                    }
                    ready = Some(Ready::Cmd(c.to_owned()));
                }
                "timeout_secs" => {
                    timeout_secs = v
                        .as_integer()
                        .filter(|s| (1..=3600).contains(s))
                        .ok_or_else(|| err("start.ready.timeout_secs", "must be 1 to 3600"))?
                        as u64;
                }
                o => {
                    return Err(err(
                        format!("start.ready.{o}"),
                        "unknown field (expected port, cmd, timeout_secs)",
                    ))
                }
            }
        }
        if ready.is_none() {
            return Err(err("start.ready", "needs port or cmd"));
        }
    }
    Ok(StartSpec {
        cmd,
        ready,
        timeout_secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<Spec, SpecError> {
        Spec::parse(&format!("from = \"template:x\"\n{extra}"), Path::new("."))
    }

    #[test]
    fn image_bases_are_references() {
        let s = Spec::parse("from = \"image:python:3.12-slim\"", Path::new(".")).unwrap();
        assert_eq!(
            s.from,
            Base::Image(crate::reference::ImageRef {
                registry: "docker.io".into(),
                repository: "library/python".into(),
                reference: "3.12-slim".into(),
            })
        );
        let e = Spec::parse("from = \"image:Python\"", Path::new(".")).unwrap_err();
        assert_eq!(e.field, "from");
        assert!(e.message.contains("lowercase"), "{e}");
    }

    #[test]
    fn build_network_forms() {
        assert_eq!(parse("").unwrap().network, BuildNetwork::Registries);
        assert_eq!(
            parse("[build]\nnetwork = \"registries\"").unwrap().network,
            BuildNetwork::Registries
        );
        assert_eq!(
            parse("[build]\nnetwork = \"none\"").unwrap().network,
            BuildNetwork::None
        );
        assert_eq!(
            parse("[build]\nnetwork = { allow = [\"pypi.org\", \"*.example.com\", \"198.51.100.0/24\", \"github.com:22\"] }")
                .unwrap()
                .network,
            BuildNetwork::Allow(vec![
                "pypi.org".into(),
                "*.example.com".into(),
                "198.51.100.0/24".into(),
                "github.com:22".into()
            ])
        );
        assert_eq!(
            parse("[build.network]\nallow = [\"pypi.org\"]")
                .unwrap()
                .network,
            BuildNetwork::Allow(vec!["pypi.org".into()])
        );
    }

    #[test]
    fn bad_build_networks_name_the_field() {
        for (text, field, needle) in [
            (
                "[build]\nnetwork = \"host\"",
                "build.network",
                "expected \"registries\"",
            ),
            (
                "[build]\nnetwork = 3",
                "build.network",
                "must be a string or a table",
            ),
            (
                "[build]\nnetwork = { allow = [] }",
                "build.network.allow",
                "must not be empty",
            ),
            (
                "[build]\nnetwork = { deny = [\"x.org\"] }",
                "build.network.deny",
                "unknown field",
            ),
            ("[build]\nnetwork = {}", "build.network.allow", "missing"),
            (
                "[build]\nnetwork = { allow = [\"pypi.org\", \"not a rule\"] }",
                "build.network.allow[2]",
                "invalid network rule",
            ),
            ("[build]\nnet = \"none\"", "build.net", "unknown field"),
            ("build = \"none\"", "build", "must be a table"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.field, field, "{text}: {e}");
            assert!(e.message.contains(needle), "{text}: {e}");
        }
    }
}
