//! Package downloads: which hosts are registries (their TLS is intercepted so that paths can
//! be read and bodies hashed), how a request's path names a package in each registry's URL
//! layout, and the `packages` rules of a policy (names denied by pattern, pinned versions).

use rampart_types::network::PackagePolicy;
use regex::Regex;

use crate::policy::RuleError;

/// Hosts whose HTTPS the proxy terminates (with the sandbox's CA) when the policy allows
/// them, to see what is fetched: PyPI, npm, crates.io, Debian and Ubuntu archives.
pub const REGISTRY_HOSTS: [&str; 13] = [
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    "crates.io",
    "static.crates.io",
    "index.crates.io",
    "deb.debian.org",
    "security.debian.org",
    "ftp.debian.org",
    "archive.ubuntu.com",
    "security.ubuntu.com",
    "ports.ubuntu.com",
];

/// Whether `host` (lowercase, no trailing dot) is a registry whose TLS is intercepted.
pub fn is_registry_host(host: &str) -> bool {
    REGISTRY_HOSTS.contains(&host)
}

/// A package that a request's path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    /// `pypi`, `npm`, `debian` or `crates`.
    pub ecosystem: &'static str,
    /// Normalized name.
    pub name: String,
    /// Version.
    pub version: String,
    /// The path, without the query.
    pub path: String,
}

/// PEP 503 normalization: lowercase, runs of `-`, `_`, `.` as one `-`.
fn pypi_normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.extend(c.to_lowercase());
        }
    }
    out
}

/// Decodes `%XX` escapes; `None` for a bad escape or a result that is not UTF-8.
fn unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn plausible(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 214
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.+~:@".contains(c))
}

/// A PyPI distribution file name: a wheel (`name-ver(-build)?-py-abi-plat.whl`, name with
/// `_` for `-`) or an sdist (`name-ver.tar.gz` / `.zip`; the version is what follows the
/// last `-` that is followed by a digit).
fn pypi_file(file: &str) -> Option<(String, String)> {
    if let Some(stem) = file.strip_suffix(".whl") {
        let parts: Vec<&str> = stem.split('-').collect();
        if !(5..=6).contains(&parts.len()) {
            return None;
        }
        return Some((pypi_normalize(parts[0]), parts[1].to_string()));
    }
    let stem = [".tar.gz", ".zip", ".tar.bz2", ".tgz"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))?;
    let cut = stem
        .match_indices('-')
        .map(|(i, _)| i)
        .rfind(|&i| stem[i + 1..].starts_with(|c: char| c.is_ascii_digit()))?;
    Some((pypi_normalize(&stem[..cut]), stem[cut + 1..].to_string()))
}

/// The package a request for `target` at `host` fetches, by the registries' URL layouts.
/// `target` is the request target as sent (origin form, or absolute form on plain HTTP).
///
/// - PyPI (`files.pythonhosted.org`, `pypi.org`): `/packages/.../<file>`, a wheel or sdist.
/// - npm (`registry.npmjs.org`, `registry.yarnpkg.com`): `/<name>/-/<name>-<ver>.tgz`,
///   `/@scope/<name>/-/<name>-<ver>.tgz` (also with `%2f` for the `/`).
/// - crates.io (`static.crates.io`, `crates.io`): `/crates/<name>/<name>-<ver>.crate`,
///   `/api/v1/crates/<name>/<ver>/download`.
/// - Debian pools (any host: mirrors vary): `.../pool/<component>/<p>/<src>/<name>_<ver>_<arch>.deb`.
pub fn recognise(host: &str, target: &str) -> Option<Fetch> {
    let mut path = target;
    if let Some(rest) = path
        .strip_prefix("http://")
        .or_else(|| path.strip_prefix("https://"))
    {
        path = rest.find('/').map_or("/", |i| &rest[i..]);
    }
    let path = path.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return None;
    }
    let segs: Vec<&str> = path[1..].split('/').collect();
    let fetch = |ecosystem, name: String, version: String| {
        // A scoped npm name (`@scope/name`) has the one `/`.
        let bare = match name.split_once('/') {
            Some((scope, n)) if ecosystem == "npm" && scope.starts_with('@') => {
                format!("{scope}-{n}")
            }
            _ => name.clone(),
        };
        (plausible(&bare) && plausible(&version)).then(|| Fetch {
            ecosystem,
            name,
            version,
            path: path.to_string(),
        })
    };
    match host {
        "files.pythonhosted.org" | "pypi.org" => {
            if segs.first() != Some(&"packages") || segs.len() < 3 {
                return None;
            }
            let file = unescape(segs.last()?)?;
            let (name, version) = pypi_file(&file)?;
            fetch("pypi", name, version)
        }
        "registry.npmjs.org" | "registry.yarnpkg.com" => {
            let p = unescape(&path[1..].replacen("%2f", "/", 1).replacen("%2F", "/", 1))?;
            let (name, file) = p.split_once("/-/")?;
            if file.contains('/') {
                return None;
            }
            let base = match name.split_once('/') {
                Some((scope, n)) if scope.starts_with('@') && scope.len() > 1 => n,
                Some(_) => return None,
                None => name,
            };
            let version = file
                .strip_suffix(".tgz")?
                .strip_prefix(base)?
                .strip_prefix('-')?;
            let lower = name.to_ascii_lowercase();
            fetch("npm", lower, version.to_string())
        }
        "static.crates.io" | "crates.io" => match segs.as_slice() {
            ["crates", name, file] => {
                let v = file.strip_suffix(".crate")?.strip_prefix(*name)?;
                fetch(
                    "crates",
                    name.to_ascii_lowercase(),
                    v.strip_prefix('-')?.to_string(),
                )
            }
            ["api", "v1", "crates", name, version, "download"] => {
                fetch("crates", name.to_ascii_lowercase(), (*version).to_string())
            }
            _ => None,
        },
        _ => {
            let pool = segs.iter().position(|s| *s == "pool")?;
            if segs.len() < pool + 5 {
                return None;
            }
            let file = unescape(segs.last()?)?;
            let stem = file
                .strip_suffix(".deb")
                .or_else(|| file.strip_suffix(".udeb"))?;
            let mut parts = stem.split('_');
            let (name, version, _arch) = (parts.next()?, parts.next()?, parts.next()?);
            if parts.next().is_some() {
                return None;
            }
            fetch("debian", name.to_ascii_lowercase(), version.to_string())
        }
    }
}

/// One pin of `packages.pinned`.
#[derive(Debug, Clone)]
struct Pin {
    text: String,
    ecosystem: Option<String>,
    name: String,
    version: String,
}

/// The `packages` rules, parsed.
#[derive(Debug, Clone, Default)]
pub struct PackageRules {
    deny: Vec<(String, Regex)>,
    require_pinned: bool,
    pins: Vec<Pin>,
}

fn rule_err(rule: String, reason: &'static str) -> RuleError {
    RuleError { rule, reason }
}

const ECOSYSTEMS: [&str; 4] = ["pypi", "npm", "debian", "crates"];

fn normalize(ecosystem: &str, name: &str) -> String {
    if ecosystem == "pypi" {
        pypi_normalize(name)
    } else {
        name.to_ascii_lowercase()
    }
}

impl PackageRules {
    /// Parses the rules; the first bad one is the error (nothing is applied then).
    pub fn compile(p: &PackagePolicy) -> Result<PackageRules, RuleError> {
        let mut deny = Vec::new();
        for pat in &p.deny {
            let at = || format!("packages.deny: {pat}");
            if pat.is_empty() {
                return Err(rule_err(at(), "empty pattern"));
            }
            if pat.len() > 512 {
                return Err(rule_err(at(), "pattern longer than 512 bytes"));
            }
            let re = regex::RegexBuilder::new(pat)
                .size_limit(1 << 20)
                .build()
                .map_err(|_| rule_err(at(), "not a valid regular expression"))?;
            deny.push((pat.clone(), re));
        }
        if !p.pinned.is_empty() && !p.require_pinned {
            return Err(rule_err(
                "packages.pinned".into(),
                "pins are only enforced with require_pinned: true",
            ));
        }
        let mut pins = Vec::new();
        for text in &p.pinned {
            let at = || format!("packages.pinned: {text}");
            let (eco, rest) = match text.split_once(':') {
                Some((e, r)) if ECOSYSTEMS.contains(&e) => (Some(e.to_string()), r),
                Some(_) => {
                    return Err(rule_err(
                        at(),
                        "unknown ecosystem (pypi, npm, debian or crates)",
                    ))
                }
                None => (None, text.as_str()),
            };
            let (name, version) = rest
                .split_once("==")
                .ok_or_else(|| rule_err(at(), "a pin is name==version"))?;
            let (name, version) = (name.trim(), version.trim());
            if !plausible(name) || !plausible(version) {
                return Err(rule_err(at(), "a pin is name==version"));
            }
            pins.push(Pin {
                text: text.clone(),
                name: normalize(eco.as_deref().unwrap_or(""), name),
                ecosystem: eco,
                version: version.to_string(),
            });
        }
        Ok(PackageRules {
            deny,
            require_pinned: p.require_pinned,
            pins,
        })
    }

    /// Judges a download: `Ok(rule)` to let it through (the rule as the log names it),
    /// `Err` with why to refuse it.
    pub fn judge(&self, f: &Fetch) -> Result<String, PackageRefusal> {
        if let Some((pat, _)) = self.deny.iter().find(|(_, re)| re.is_match(&f.name)) {
            return Err(PackageRefusal::Denied {
                pattern: pat.clone(),
            });
        }
        if !self.require_pinned {
            return Ok("package".into());
        }
        let pin = self.pins.iter().find(|p| {
            p.ecosystem.as_deref().is_none_or(|e| e == f.ecosystem)
                && normalize(f.ecosystem, &p.name) == f.name
                && p.version == f.version
        });
        match pin {
            Some(p) => Ok(format!("pinned:{}", p.text)),
            None => Err(PackageRefusal::Unpinned),
        }
    }
}

/// Why a download is refused. The message is the rule as the network log names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackageRefusal {
    /// Its name matches a `deny` pattern.
    #[error("package-deny:{pattern}")]
    Denied {
        /// The pattern, as written.
        pattern: String,
    },
    /// `require_pinned`, and no pin names this package and version.
    #[error("unpinned")]
    Unpinned,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(host: &str, path: &str) -> Option<(&'static str, String, String)> {
        recognise(host, path).map(|f| (f.ecosystem, f.name, f.version))
    }

    fn some(e: &'static str, n: &str, v: &str) -> Option<(&'static str, String, String)> {
        Some((e, n.into(), v.into()))
    }

    #[test]
    fn pypi_wheels_and_sdists() {
        let h = "files.pythonhosted.org";
        assert_eq!(
            r(h, "/packages/d9/5a/e7c31adbe875f2abbb91bd84cf2dc52d792b5a01506781dbcf25c91daf11/six-1.16.0-py2.py3-none-any.whl"),
            some("pypi", "six", "1.16.0")
        );
        assert_eq!(
            r(
                h,
                "/packages/ab/cd/ef/Typing_Extensions-4.12.2-1-py3-none-any.whl?x=1"
            ),
            some("pypi", "typing-extensions", "4.12.2")
        );
        assert_eq!(
            r(
                h,
                "/packages/source/z/zope.interface/zope.interface-6.0.tar.gz"
            ),
            some("pypi", "zope-interface", "6.0")
        );
        assert_eq!(
            r(h, "/packages/aa/bb/python-dateutil-2.9.0.post0.tar.gz"),
            some("pypi", "python-dateutil", "2.9.0.post0")
        );
        // The index and metadata are not downloads.
        assert_eq!(r("pypi.org", "/simple/six/"), None);
        assert_eq!(
            r(
                h,
                "/packages/aa/bb/six-1.16.0-py2.py3-none-any.whl.metadata"
            ),
            None
        );
        assert_eq!(r(h, "/other/six-1.16.0-py2.py3-none-any.whl"), None);
        assert_eq!(r(h, "/packages/aa/bb/README.txt"), None);
    }

    #[test]
    fn npm_tarballs_plain_and_scoped() {
        let h = "registry.npmjs.org";
        assert_eq!(
            r(h, "/left-pad/-/left-pad-1.3.0.tgz"),
            some("npm", "left-pad", "1.3.0")
        );
        assert_eq!(
            r(h, "/@types/node/-/node-20.11.5.tgz"),
            some("npm", "@types/node", "20.11.5")
        );
        assert_eq!(
            r(h, "/@types%2fnode/-/node-20.11.5.tgz"),
            some("npm", "@types/node", "20.11.5")
        );
        assert_eq!(
            r(h, "/@babel/core/-/core-7.0.0-beta.44.tgz"),
            some("npm", "@babel/core", "7.0.0-beta.44")
        );
        // Metadata documents, a tarball of another name, nested paths: not downloads.
        assert_eq!(r(h, "/left-pad"), None);
        assert_eq!(r(h, "/@types%2fnode"), None);
        assert_eq!(r(h, "/left-pad/-/right-pad-1.3.0.tgz"), None);
        assert_eq!(r(h, "/a/b/-/b-1.0.0.tgz"), None);
        assert_eq!(r(h, "/a/-/x/a-1.0.0.tgz"), None);
    }

    #[test]
    fn crates_both_layouts() {
        assert_eq!(
            r("static.crates.io", "/crates/serde/serde-1.0.200.crate"),
            some("crates", "serde", "1.0.200")
        );
        assert_eq!(
            r(
                "static.crates.io",
                "/crates/tokio-util/tokio-util-0.7.10.crate"
            ),
            some("crates", "tokio-util", "0.7.10")
        );
        assert_eq!(
            r("crates.io", "/api/v1/crates/rand/0.8.5/download"),
            some("crates", "rand", "0.8.5")
        );
        assert_eq!(r("static.crates.io", "/crates/serde/tokio-1.0.crate"), None);
        assert_eq!(r("index.crates.io", "/se/rd/serde"), None);
        assert_eq!(r("crates.io", "/api/v1/crates/rand"), None);
    }

    #[test]
    fn debian_pool_on_any_mirror() {
        assert_eq!(
            r(
                "deb.debian.org",
                "/debian/pool/main/c/curl/curl_7.88.1-10+deb12u5_amd64.deb"
            ),
            some("debian", "curl", "7.88.1-10+deb12u5")
        );
        assert_eq!(
            r(
                "archive.ubuntu.com",
                "http://archive.ubuntu.com/ubuntu/pool/main/libx/libxml2/libxml2_2.9.14%2bdfsg-1_amd64.deb"
            ),
            some("debian", "libxml2", "2.9.14+dfsg-1")
        );
        assert_eq!(
            r(
                "deb.debian.org",
                "/debian/pool/main/s/systemd/libsystemd0_1%3a252-2_amd64.deb"
            ),
            some("debian", "libsystemd0", "1:252-2")
        );
        assert_eq!(
            r("deb.debian.org", "/debian/dists/bookworm/InRelease"),
            None
        );
        assert_eq!(
            r("deb.debian.org", "/debian/pool/main/c/curl/curl_7.88.dsc"),
            None
        );
        assert_eq!(r("example.com", "/pool/x.deb"), None);
    }

    #[test]
    fn odd_paths_are_not_packages() {
        for (h, p) in [
            ("files.pythonhosted.org", ""),
            ("files.pythonhosted.org", "*"),
            ("registry.npmjs.org", "/-/v1/search?text=x"),
            ("registry.npmjs.org", "/x/-/x-%zz.tgz"),
            ("static.crates.io", "/crates/a b/a b-1.0.crate"),
            ("deb.debian.org", "/pool/main/c/c/x_1_amd64_extra.deb"),
        ] {
            assert_eq!(recognise(h, p), None, "{h} {p}");
        }
    }

    fn policy(deny: &[&str], pinned: Option<&[&str]>) -> PackagePolicy {
        PackagePolicy {
            deny: deny.iter().map(|s| s.to_string()).collect(),
            require_pinned: pinned.is_some(),
            pinned: pinned
                .unwrap_or(&[])
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }

    fn fetch(e: &'static str, n: &str, v: &str) -> Fetch {
        Fetch {
            ecosystem: e,
            name: n.into(),
            version: v.into(),
            path: "/".into(),
        }
    }

    #[test]
    fn policy_validation_names_the_bad_rule() {
        let e = PackageRules::compile(&policy(&["^evil-", "(unclosed"], None)).unwrap_err();
        assert_eq!(e.rule, "packages.deny: (unclosed");
        assert!(e.to_string().contains("not a valid regular expression"));
        assert!(PackageRules::compile(&policy(&[""], None)).is_err());
        let e = PackageRules::compile(&policy(&[], Some(&["six"]))).unwrap_err();
        assert_eq!(e.reason, "a pin is name==version");
        let e = PackageRules::compile(&policy(&[], Some(&["cpan:six==1"]))).unwrap_err();
        assert!(e.reason.contains("unknown ecosystem"));
        let mut p = policy(&[], None);
        p.pinned = vec!["six==1.16.0".into()];
        assert!(
            PackageRules::compile(&p).is_err(),
            "pins without require_pinned"
        );
        assert!(PackageRules::compile(&policy(&[], Some(&["pypi:six==1.16.0", "x==1"]))).is_ok());
    }

    #[test]
    fn deny_patterns_and_pins_decide() {
        let p = PackageRules::compile(&policy(&["^evil-", "mal"], None)).unwrap();
        assert_eq!(
            p.judge(&fetch("pypi", "evil-pkg", "1")),
            Err(PackageRefusal::Denied {
                pattern: "^evil-".into()
            })
        );
        assert_eq!(
            p.judge(&fetch("npm", "normal", "1")),
            Err(PackageRefusal::Denied {
                pattern: "mal".into()
            })
        );
        assert_eq!(p.judge(&fetch("npm", "six", "1")), Ok("package".into()));
        let p = PackageRules::compile(&policy(&[], Some(&["pypi:Six==1.16.0", "left-pad==1.3.0"])))
            .unwrap();
        assert_eq!(
            p.judge(&fetch("pypi", "six", "1.16.0")),
            Ok("pinned:pypi:Six==1.16.0".into())
        );
        assert_eq!(
            p.judge(&fetch("pypi", "six", "1.17.0")),
            Err(PackageRefusal::Unpinned)
        );
        assert_eq!(
            p.judge(&fetch("npm", "six", "1.16.0")),
            Err(PackageRefusal::Unpinned)
        );
        assert!(p.judge(&fetch("npm", "left-pad", "1.3.0")).is_ok());
        assert!(p.judge(&fetch("crates", "left-pad", "1.3.0")).is_ok());
        assert_eq!(
            p.judge(&fetch("pypi", "requests", "2.0")),
            Err(PackageRefusal::Unpinned)
        );
    }
}
