//! Image references as Docker reads them: `python:3` is `docker.io/library/python:3`,
//! `ghcr.io/o/r@sha256:...` names a registry and a digest. A build spec's base
//! (`from = "image:..."`) holds one; the registry client pulls what it names.

use crate::ImageError;

/// Docker Hub's name in references.
pub(crate) const DOCKER_HUB: &str = "docker.io";

/// An image reference: registry, repository, and a tag or digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// The registry as references name it (`docker.io`, `ghcr.io`, `localhost:5000`).
    pub registry: String,
    /// The repository (`library/python`).
    pub repository: String,
    /// A tag (`3`) or a digest (`sha256:...`).
    pub reference: String,
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sep = if self.is_digest() { '@' } else { ':' };
        write!(
            f,
            "{}/{}{sep}{}",
            self.registry, self.repository, self.reference
        )
    }
}

fn valid_component(c: &str) -> bool {
    // Docker's path component: [a-z0-9]+ separated by `.`, `_`, `__` or `-`s.
    !c.is_empty()
        && c.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && c.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

impl ImageRef {
    /// Reads a reference as Docker does.
    pub fn parse(s: &str) -> Result<ImageRef, ImageError> {
        let bad = |why: &str| ImageError::Registry(format!("image reference {s:?}: {why}"));
        if s.is_empty() || s.len() > 512 || s.chars().any(|c| c.is_whitespace() || c == '\0') {
            return Err(bad("empty, too long or has white space"));
        }
        let (name, digest) = match s.split_once('@') {
            Some((n, d)) => {
                let ok = d
                    .strip_prefix("sha256:")
                    .is_some_and(crate::digest::is_hex64);
                if !ok {
                    return Err(bad("the digest must be sha256:<64 hex digits>"));
                }
                (n, Some(d.to_owned()))
            }
            None => (s, None),
        };
        // A tag follows the last `:` after the last `/`.
        let (name, tag) = match name.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (n, Some(t.to_owned())),
            _ => (name, None),
        };
        if let Some(t) = &tag {
            let ok = t.len() <= 128
                && t.bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !ok {
                return Err(bad("the tag must be [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"));
            }
        }
        let (registry, repo) = match name.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_owned(), rest.to_owned())
            }
            _ => (DOCKER_HUB.to_owned(), name.to_owned()),
        };
        let registry = if registry == "index.docker.io" {
            DOCKER_HUB.to_owned()
        } else {
            registry
        };
        let repo = if registry == DOCKER_HUB && !repo.contains('/') {
            format!("library/{repo}")
        } else {
            repo
        };
        if !repo.split('/').all(valid_component) {
            return Err(bad(
                "the repository must be lowercase path components ([a-z0-9] separated by . _ -)",
            ));
        }
        if !registry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        {
            return Err(bad("the registry is not a host name or host:port"));
        }
        Ok(ImageRef {
            registry,
            repository: repo,
            reference: digest.or(tag).unwrap_or_else(|| "latest".into()),
        })
    }

    /// Whether the reference is a digest (`sha256:...`) rather than a tag.
    pub(crate) fn is_digest(&self) -> bool {
        self.reference.starts_with("sha256:")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_read_as_docker_reads_them() {
        let r = |s: &str| ImageRef::parse(s).unwrap();
        assert_eq!(
            r("python:3"),
            ImageRef {
                registry: "docker.io".into(),
                repository: "library/python".into(),
                reference: "3".into()
            }
        );
        assert_eq!(r("ubuntu").reference, "latest");
        assert_eq!(
            r("docker.io/library/python:3.12-slim").repository,
            "library/python"
        );
        assert_eq!(r("e2bdev/base").repository, "e2bdev/base");
        let g = r("ghcr.io/owner/repo/sub:v1.2");
        assert_eq!(
            (
                g.registry.as_str(),
                g.repository.as_str(),
                g.reference.as_str()
            ),
            ("ghcr.io", "owner/repo/sub", "v1.2")
        );
        let l = r("localhost:5000/app");
        assert_eq!(
            (l.registry.as_str(), l.reference.as_str()),
            ("localhost:5000", "latest")
        );
        let d = format!("sha256:{}", "a".repeat(64));
        let p = r(&format!("127.0.0.1:5000/x/y@{d}"));
        assert_eq!(
            (p.registry.as_str(), p.reference.as_str()),
            ("127.0.0.1:5000", d.as_str())
        );
        assert_eq!(p.to_string(), format!("127.0.0.1:5000/x/y@{d}"));
        assert_eq!(r("python:3").to_string(), "docker.io/library/python:3");
        for bad in [
            "",
            "Python:3",
            "python:3 x",
            "python@sha256:xyz",
            "python:-x",
            "a//b",
            "x/../y",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
