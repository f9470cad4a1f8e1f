//! Templates as content-addressed, read-only root filesystems with metadata.
//!
//! - [`spec`]: the build spec (TOML), parsed with errors that name the offending field.
//! - [`store`]: the layer store under `<data>/images/`: layers (directories in overlayfs
//!   format, immutable, named by their cache key), template manifests (named by the digest of
//!   their canonical JSON), names pointing at manifests, garbage collection.
//! - [`extract`]: applying one layer tar into an empty directory with openat-style safety
//!   (no path or link may leave the layer; symlinks from the archive are never followed),
//!   turning OCI whiteouts into overlayfs whiteouts.
//! - [`oci`]: reading an OCI image layout directory or an OCI / `docker save` archive.
//! - [`reference`]: image references (`python:3`, `ghcr.io/o/r@sha256:...`).
//! - [`credentials`]: a registry login.
//! - [`registry`]: pulling an image from a registry (the OCI distribution API) into a layout.
//! - [`build`]: the builder: the step cache, the build sandbox runner on the jail, progress.
//!
//! Layout and formats are documented in `docs/templates.md`.

pub mod build;
pub mod credentials;
pub mod digest;
pub mod ecr;
pub mod extract;
pub mod oci;
pub mod reference;
pub mod registry;
pub mod sample;
pub mod spec;
pub mod step_disk;
pub mod store;

pub use spec::{Spec, SpecError, Step};
pub use store::{Manifest, Store, StoreLock, TemplateConfig};

/// Errors of the image store and builder.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The spec is invalid.
    #[error("spec: {0}")]
    Spec(#[from] SpecError),
    /// A file system operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An archive entry would escape the layer or is otherwise refused.
    #[error("refused archive entry {path:?}: {reason}")]
    Refused {
        /// The entry's path as the archive names it.
        path: String,
        /// Why.
        reason: String,
    },
    /// An OCI image is malformed or unsupported.
    #[error("OCI image: {0}")]
    Oci(String),
    /// A template name is unknown.
    #[error("unknown template {0:?}")]
    UnknownTemplate(String),
    /// A name is invalid or reserved.
    #[error("template name {name:?}: {reason}")]
    BadName {
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The store is corrupt (a manifest or layer missing or unreadable).
    #[error("store: {0}")]
    Corrupt(String),
    /// A build step failed.
    #[error("step {index} ({kind}) failed: {message}")]
    Step {
        /// Step number, from 1 (0 = the base).
        index: usize,
        /// The step's kind.
        kind: String,
        /// Why.
        message: String,
    },
    /// The build was interrupted.
    #[error("build interrupted")]
    Interrupted,
    /// The build sandbox failed.
    #[error("build sandbox: {0}")]
    Sandbox(String),
    /// Pulling an image from a registry failed.
    #[error("registry: {0}")]
    Registry(String),
    /// Another build holds the store's lock.
    #[error("another build holds {0}")]
    Locked(String),
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ImageError {
    let what = what.into();
    move |source| ImageError::Io { what, source }
}

/// Names `base` and `code-interpreter-v1` are served by the daemon's built-in templates and
/// cannot be taken by built ones.
pub const RESERVED_NAMES: &[&str] = &["base", "code-interpreter-v1"];

/// The tag a bare template name stands for (E2B's `default`).
pub const DEFAULT_TAG: &str = "default";

/// Checks a template reference, `name` or `name:tag` (a tag: 1 to 64 bytes of
/// `[A-Za-z0-9._-]`, starting with a letter or digit); returns the store's spelling of it
/// (`name:default` is `name`).
pub fn check_ref(r: &str) -> Result<String, ImageError> {
    let Some((name, tag)) = r.split_once(':') else {
        check_stored_name(r)?;
        return Ok(r.to_owned());
    };
    check_stored_name(name)?;
    check_tag(tag).map_err(|reason| ImageError::BadName {
        name: r.to_owned(),
        reason,
    })?;
    Ok(if tag == DEFAULT_TAG {
        name.to_owned()
    } else {
        format!("{name}:{tag}")
    })
}

/// Checks a tag (see [`check_ref`]).
pub fn check_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty() || tag.len() > 64 {
        return Err("a tag must be 1 to 64 bytes".into());
    }
    if !tag
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(format!(
            "tag {tag:?}: only A-Z, a-z, 0-9, '.', '_' and '-' are allowed"
        ));
    }
    if !tag.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(format!("tag {tag:?} must start with a letter or a digit"));
    }
    Ok(())
}

/// Separates the tenant from the template name in the store's name of a tenant's template
/// (`acme~shared`): neither a tenant name nor a template name contains it, so a tenant's
/// name never equals the operator's nor another tenant's.
pub const OWNER_SEP: char = '~';

/// Checks a name as the store keeps it: a template name ([`check_name`]), or a tenant's
/// template `<tenant>~<name>` (a tenant name as `rampart_types::tenant` checks it).
pub fn check_stored_name(name: &str) -> Result<(), ImageError> {
    match name.split_once(OWNER_SEP) {
        None => check_name(name),
        Some((owner, rest)) => {
            rampart_types::tenant::check_tenant_name(owner).map_err(|reason| {
                ImageError::BadName {
                    name: name.to_owned(),
                    reason: reason.to_string(),
                }
            })?;
            check_name(rest)
        }
    }
}

/// Checks a template name: 1 to 64 bytes of `[a-z0-9._-]`, starting with a letter or digit,
/// not reserved.
pub fn check_name(name: &str) -> Result<(), ImageError> {
    let bad = |reason: &str| ImageError::BadName {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    if name.is_empty() || name.len() > 64 {
        return Err(bad("must be 1 to 64 bytes"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    {
        return Err(bad("only a-z, 0-9, '.', '_' and '-' are allowed"));
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(bad("must start with a letter or a digit"));
    }
    if RESERVED_NAMES.contains(&name) {
        return Err(bad("reserved for a built-in template"));
    }
    Ok(())
}
