//! Pulling an image from a registry (the OCI distribution API, which Docker Hub, GHCR,
//! Quay, GCR/Artifact Registry, ECR and `registry:2` serve) into a temporary OCI layout that
//! [`crate::oci`] then reads as it reads any layout.
//!
//! - References are read as Docker reads them: `python:3` is `docker.io/library/python:3`,
//!   `ghcr.io/o/r@sha256:...` names a registry and a digest.
//! - Auth: anonymous, or the given user and password; a `Bearer` challenge is answered at its
//!   realm (with the credentials, if any), a `Basic` one with the credentials.
//! - The manifest of this host's platform is picked from an index; manifests fetched by digest
//!   and every blob are checked against their digest; a blob may not exceed the size its
//!   descriptor gives. Layers already in the store (keyed by digest) are not fetched again.
//! - Addresses: a registry named in a build (by a tenant, through the E2B API) could point
//!   the daemon at the host's own networks. Every address the client connects to (the
//!   registry, the token realm, each redirect) must be public, unless it is in a range the
//!   operator allows or its host is an operator-configured mirror. Plain HTTP only for
//!   operator-named insecure registries and mirrors.

use crate::credentials::Credentials;
use crate::digest::hex;
use crate::oci::{self, OciImage};
use crate::reference::{ImageRef, DOCKER_HUB};
use crate::store::Store;
use crate::{io, ImageError};
use futures::StreamExt as _;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The host Docker Hub's API is served from.
const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// The media types a manifest request accepts: OCI and Docker schema 2, images and indexes.
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
                      application/vnd.oci.image.manifest.v1+json, \
                      application/vnd.docker.distribution.manifest.list.v2+json, \
                      application/vnd.docker.distribution.manifest.v2+json";

/// Largest manifest or config read (bytes).
const MAX_DOC: usize = 8 << 20;

fn reg(m: impl Into<String>) -> ImageError {
    ImageError::Registry(m.into())
}

/// What the operator sets for pulls (`[templates]` of the daemon's config).
#[derive(Debug, Clone, Default)]
pub struct RegistryConfig {
    /// Registry name (as in references: `docker.io`, `ghcr.io`) to the base URL pulls of it
    /// go to instead (`https://mirror.example:5000`): pull-through caches. A mirror's host
    /// may have any address.
    pub mirrors: BTreeMap<String, String>,
    /// Registries (`host` or `host:port`) spoken to over plain HTTP.
    pub insecure: Vec<String>,
    /// Address ranges beyond the public ones that registries may have.
    pub allow_cidrs: Vec<ipnet::IpNet>,
    /// More trusted roots (PEM), e.g. a private registry's CA.
    pub ca_pem: Option<Vec<u8>>,
    /// ECR's API endpoint for every region (default `https://api.ecr.REGION.amazonaws.com/`);
    /// its host may have any address.
    pub ecr_endpoint: Option<String>,
}

impl RegistryConfig {
    /// Reads `RAMPART_REGISTRY_MIRRORS` (`name=url,...`), `RAMPART_REGISTRY_INSECURE`
    /// (`host[:port],...`), `RAMPART_REGISTRY_ALLOW` (CIDRs) and `RAMPART_REGISTRY_CA` (a PEM
    /// file) over `self`.
    pub fn with_env(mut self) -> Result<Self, ImageError> {
        let list = |k: &str| -> Vec<String> {
            std::env::var(k)
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        for m in list("RAMPART_REGISTRY_MIRRORS") {
            let (name, url) = m.split_once('=').ok_or_else(|| {
                reg(format!(
                    "RAMPART_REGISTRY_MIRRORS: {m:?} is not NAME=URL (e.g. docker.io=https://mirror:5000)"
                ))
            })?;
            self.mirrors.insert(name.to_owned(), url.to_owned());
        }
        self.insecure.extend(list("RAMPART_REGISTRY_INSECURE"));
        for c in list("RAMPART_REGISTRY_ALLOW") {
            self.allow_cidrs.push(
                c.parse().map_err(|e| {
                    reg(format!("RAMPART_REGISTRY_ALLOW: {c:?} is not a CIDR: {e}"))
                })?,
            );
        }
        if let Ok(e) = std::env::var("RAMPART_ECR_ENDPOINT") {
            self.ecr_endpoint = Some(e);
        }
        if let Ok(p) = std::env::var("RAMPART_REGISTRY_CA") {
            self.ca_pem = Some(std::fs::read(&p).map_err(io(format!("read {p}")))?);
        }
        self.check()?;
        Ok(self)
    }

    /// Checks the mirrors' URLs, the ECR endpoint and the CA.
    pub fn check(&self) -> Result<(), ImageError> {
        let ecr = self
            .ecr_endpoint
            .iter()
            .map(|u| ("ecr_endpoint".to_owned(), u));
        let mirrors = self
            .mirrors
            .iter()
            .map(|(n, u)| (format!("mirror of {n}"), u));
        for (what, url) in mirrors.chain(ecr) {
            let u = reqwest::Url::parse(url)
                .map_err(|e| reg(format!("{what}: {url:?} is not a URL: {e}")))?;
            if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
                return Err(reg(format!("{what}: {url:?} is not an http(s) URL")));
            }
        }
        if let Some(pem) = &self.ca_pem {
            reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| reg(format!("registry CA: {e}")))?;
        }
        Ok(())
    }
}

/// How a pull logs in to its registry.
#[derive(Debug, Clone)]
pub enum RegistryAuth {
    /// A user and password (or token).
    Login(Credentials),
    /// An AWS access key, exchanged for an ECR login first.
    Aws(crate::ecr::AwsKeys),
}

/// The login `docker login` stored for `image`'s registry, read from Docker's config
/// (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`): its `auths` entry's `auth`
/// (base64 of `user:password`) or `username` and `password`. Credential helpers
/// (`credsStore`, `credHelpers`) are not run. For a build on the host by its operator
/// (`rampart template build`); the daemon never reads it.
pub fn docker_config_login(image: &ImageRef) -> Option<RegistryAuth> {
    let path = match std::env::var_os("DOCKER_CONFIG") {
        Some(d) => PathBuf::from(d).join("config.json"),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".docker/config.json"),
    };
    let text = std::fs::read_to_string(path).ok()?;
    login_from_docker_config(&text, &image.registry)
}

fn login_from_docker_config(text: &str, registry: &str) -> Option<RegistryAuth> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let auths = v.get("auths")?.as_object()?;
    let key_host = |k: &str| {
        let k = k
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let host = k.split('/').next().unwrap_or(k);
        match host {
            "index.docker.io" | "registry-1.docker.io" => DOCKER_HUB.to_owned(),
            h => h.to_owned(),
        }
    };
    let entry = auths
        .iter()
        .find(|(k, _)| key_host(k) == registry)
        .map(|(_, e)| e)?;
    let field = |k: &str| {
        entry
            .get(k)
            .and_then(|x| x.as_str())
            .filter(|s| !s.is_empty())
    };
    let (username, password) = match field("auth") {
        Some(a) => {
            use base64::Engine as _;
            let d = base64::engine::general_purpose::STANDARD.decode(a).ok()?;
            let d = String::from_utf8(d).ok()?;
            let (u, p) = d.split_once(':')?;
            (u.to_owned(), p.to_owned())
        }
        None => (field("username")?.to_owned(), field("password")?.to_owned()),
    };
    Some(RegistryAuth::Login(Credentials { username, password }))
}

/// Checks the addresses the client connects to.
#[derive(Debug)]
struct AddrCheck {
    allow: Vec<ipnet::IpNet>,
    /// Operator-configured mirror hosts: any address.
    trusted: Vec<String>,
}

impl AddrCheck {
    fn check(&self, host: &str, ip: IpAddr) -> Result<(), String> {
        if self.trusted.iter().any(|t| t.eq_ignore_ascii_case(host)) {
            return Ok(());
        }
        let Some(why) = rampart_egress::refused_on_behalf(ip, &self.allow) else {
            return Ok(());
        };
        let ip = rampart_egress::policy::canonical(ip);
        Err(format!(
            "{host} has the address {ip}, which is not public ({why}); registries are reached \
             only at public addresses other than this host's, unless the operator allows the \
             range ([templates] registry_allow_cidrs) or names a mirror"
        ))
    }

    /// Checks a URL whose host is an IP literal (the resolver is not asked for those).
    fn check_url(&self, u: &reqwest::Url) -> Result<(), String> {
        let host = u.host_str().ok_or_else(|| format!("{u} has no host"))?;
        match host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            Ok(ip) => self.check(host, ip),
            Err(_) => Ok(()),
        }
    }
}

/// Resolves names and refuses any answer with an address [`AddrCheck`] refuses.
struct CheckedResolver(Arc<AddrCheck>);

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let check = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            for a in &addrs {
                check
                    .check(&host, a.ip())
                    .map_err(|m| Box::new(std::io::Error::other(m)))?;
            }
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// The error text of `e` with its sources (reqwest's own is only "error sending request").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// What a pull reports as it goes.
pub type Progress<'a> = &'a mut dyn FnMut(String);

/// Pulls `image` (logging in with `auth`, if any) into a temporary layout of `store` and
/// opens it.
/// Layers `store` has already are not fetched (their blobs are absent from the layout).
pub fn pull(
    cfg: &RegistryConfig,
    image: &ImageRef,
    auth: Option<&RegistryAuth>,
    store: &Store,
    cancel: &AtomicBool,
    progress: Progress<'_>,
) -> Result<OciImage, ImageError> {
    let tmp = store.tmp_dir("pull")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io("start the pull's runtime"))?;
    rt.block_on(pull_into(
        cfg,
        image,
        auth,
        store,
        tmp.path(),
        cancel,
        progress,
    ))?;
    oci::open_pulled(tmp)
}

async fn pull_into(
    cfg: &RegistryConfig,
    image: &ImageRef,
    auth: Option<&RegistryAuth>,
    store: &Store,
    dir: &Path,
    cancel: &AtomicBool,
    progress: Progress<'_>,
) -> Result<(), ImageError> {
    let mut s = Session::new(cfg, image)?;
    match auth {
        None => {}
        Some(RegistryAuth::Login(c)) => s.creds = Some(c.clone()),
        Some(RegistryAuth::Aws(keys)) => {
            s.creds = Some(ecr_login(cfg, keys).await?);
            progress(format!(
                "logged in to ECR ({}) as {}\n",
                keys.region, keys.access_key_id
            ));
        }
    }
    progress(format!("pulling {image} from {}\n", s.base));
    // The manifest, through an index if it is one.
    let mut reference = image.reference.clone();
    let mut by_digest = image.is_digest();
    let mut depth = 0;
    let (manifest_bytes, media_type, manifest) = loop {
        let (bytes, ct) = s.manifest(&reference).await?;
        if by_digest {
            check_digest(&reference, &bytes)?;
        }
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| reg(format!("{image}: the manifest is not JSON: {e}")))?;
        let mt = v
            .get("mediaType")
            .and_then(|m| m.as_str())
            .map(str::to_owned)
            .unwrap_or(ct);
        if v.get("fsLayers").is_some()
            || mt.starts_with("application/vnd.docker.distribution.manifest.v1")
        {
            return Err(reg(format!(
                "{image}: a schema 1 manifest (deprecated by Docker in 2019); push the image \
                 again with a current client"
            )));
        }
        if v.get("manifests").is_some() {
            depth += 1;
            if depth > 2 {
                return Err(reg(format!("{image}: indexes nested too deep")));
            }
            let idx: oci::Index =
                serde_json::from_value(v).map_err(|e| reg(format!("{image}: index: {e}")))?;
            let d = oci::pick_platform(&idx.manifests).ok_or_else(|| {
                reg(format!(
                    "{image} has no image for linux/{} (it has: {})",
                    oci::host_arch(),
                    oci::platforms(&idx.manifests)
                ))
            })?;
            reference = d.digest.clone();
            by_digest = true;
            continue;
        }
        let m: oci::ImageManifest =
            serde_json::from_value(v).map_err(|e| reg(format!("{image}: manifest: {e}")))?;
        break (bytes, mt, m);
    };
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(io("mkdir blobs"))?;
    let manifest_digest = format!("sha256:{}", hex(&Sha256::digest(&manifest_bytes)));
    write_blob(&blobs, &manifest_digest, &manifest_bytes)?;
    // The config.
    let cfg_bytes = s.blob_bytes(&manifest.config.digest).await?;
    check_digest(&manifest.config.digest, &cfg_bytes)?;
    write_blob(&blobs, &manifest.config.digest, &cfg_bytes)?;
    // The layers the store does not have.
    let total = manifest.layers.len();
    for (i, l) in manifest.layers.iter().enumerate() {
        if cancel.load(Ordering::Relaxed) {
            return Err(ImageError::Interrupted);
        }
        if store.has_layer(&oci::layer_key(&l.digest)) {
            progress(format!("layer {}/{total} {}: cached\n", i + 1, l.digest));
            continue;
        }
        let path = blob_path(&blobs, &l.digest)?;
        let n = s.blob_to_file(&l.digest, l.size, &path, cancel).await?;
        progress(format!(
            "layer {}/{total} {}: pulled, {:.1} MB\n",
            i + 1,
            l.digest,
            n as f64 / 1e6
        ));
    }
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
        .map_err(io("write oci-layout"))?;
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": media_type, "digest": manifest_digest, "size": manifest_bytes.len()}]});
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&index).unwrap_or_default(),
    )
    .map_err(io("write index.json"))?;
    progress(format!("pulled {image} ({manifest_digest})\n"));
    Ok(())
}

fn check_digest(digest: &str, bytes: &[u8]) -> Result<(), ImageError> {
    let got = format!("sha256:{}", hex(&Sha256::digest(bytes)));
    if got != digest {
        return Err(reg(format!("the registry sent {got} for {digest}")));
    }
    Ok(())
}

/// The hex of a `sha256:<64 hex>` digest (no other is accepted: it names files and URLs).
fn sha256_hex(digest: &str) -> Result<&str, ImageError> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| crate::digest::is_hex64(h))
        .ok_or_else(|| reg(format!("unsupported digest {digest:?} (sha256 only)")))
}

fn blob_path(blobs: &Path, digest: &str) -> Result<PathBuf, ImageError> {
    Ok(blobs.join(sha256_hex(digest)?))
}

fn write_blob(blobs: &Path, digest: &str, bytes: &[u8]) -> Result<(), ImageError> {
    std::fs::write(blob_path(blobs, digest)?, bytes).map_err(io("write blob"))
}

/// A client whose every connection (and redirect, at most 5; plain HTTP only when
/// `plain_ok`) goes to addresses `check` allows.
fn client(
    cfg: &RegistryConfig,
    check: Arc<AddrCheck>,
    plain_ok: bool,
) -> Result<reqwest::Client, ImageError> {
    let rc = check.clone();
    let mut b = reqwest::Client::builder()
        .user_agent(concat!("rampart/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(15))
        .read_timeout(Duration::from_secs(60))
        .dns_resolver(Arc::new(CheckedResolver(check)))
        .redirect(reqwest::redirect::Policy::custom(move |a| {
            if a.previous().len() >= 5 {
                return a.error("more than 5 redirects");
            }
            let u = a.url();
            let verdict = if u.scheme() != "https" && !(plain_ok && u.scheme() == "http") {
                Err(format!("a redirect to {} (not https)", u.scheme()))
            } else {
                rc.check_url(u)
            };
            match verdict {
                Ok(()) => a.follow(),
                Err(m) => a.error(m),
            }
        }));
    if let Some(pem) = &cfg.ca_pem {
        for c in reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| reg(format!("registry CA: {e}")))?
        {
            b = b.add_root_certificate(c);
        }
    }
    b.build()
        .map_err(|e| reg(format!("HTTP client: {}", chain(&e))))
}

/// Exchanges `keys` for an ECR login at the operator's endpoint (whose host, like a
/// mirror's, may have any address) or the region's.
async fn ecr_login(
    cfg: &RegistryConfig,
    keys: &crate::ecr::AwsKeys,
) -> Result<Credentials, ImageError> {
    keys.check()?;
    let (endpoint, trusted) = match &cfg.ecr_endpoint {
        Some(e) => {
            let u = reqwest::Url::parse(e).map_err(|x| reg(format!("ecr_endpoint {e:?}: {x}")))?;
            let host = u.host_str().unwrap_or_default().to_owned();
            (u, vec![host])
        }
        None => {
            let e = keys.endpoint();
            let u = reqwest::Url::parse(&e).map_err(|x| reg(format!("ECR endpoint {e:?}: {x}")))?;
            (u, Vec::new())
        }
    };
    let check = Arc::new(AddrCheck {
        allow: cfg.allow_cidrs.clone(),
        trusted,
    });
    check.check_url(&endpoint).map_err(reg)?;
    let c = client(cfg, check, false)?;
    crate::ecr::login(&c, &endpoint, keys).await
}

/// One pull's client, base URL and authorization.
struct Session {
    client: reqwest::Client,
    base: reqwest::Url,
    repository: String,
    registry: String,
    creds: Option<Credentials>,
    /// The `Authorization` value that works, once known.
    auth: Option<String>,
    check: Arc<AddrCheck>,
}

impl Session {
    fn new(cfg: &RegistryConfig, image: &ImageRef) -> Result<Session, ImageError> {
        let (base, trusted) = match cfg.mirrors.get(&image.registry) {
            Some(m) => {
                let u = reqwest::Url::parse(m)
                    .map_err(|e| reg(format!("mirror of {}: {e}", image.registry)))?;
                let host = u.host_str().unwrap_or_default().to_owned();
                (u, vec![host])
            }
            None => {
                let host = if image.registry == DOCKER_HUB {
                    DOCKER_HUB_API
                } else {
                    &image.registry
                };
                let scheme = if cfg.insecure.iter().any(|i| i == &image.registry) {
                    "http"
                } else {
                    "https"
                };
                let u = reqwest::Url::parse(&format!("{scheme}://{host}/"))
                    .map_err(|e| reg(format!("registry {host:?}: {e}")))?;
                (u, Vec::new())
            }
        };
        let check = Arc::new(AddrCheck {
            allow: cfg.allow_cidrs.clone(),
            trusted,
        });
        check.check_url(&base).map_err(reg)?;
        let client = client(cfg, check.clone(), base.scheme() == "http")?;
        Ok(Session {
            client,
            base,
            repository: image.repository.clone(),
            registry: image.registry.clone(),
            creds: None,
            auth: None,
            check,
        })
    }

    fn url(&self, kind: &str, reference: &str) -> reqwest::Url {
        let path = format!(
            "{}v2/{}/{kind}/{reference}",
            self.base.path().trim_end_matches('/').to_owned() + "/",
            self.repository
        );
        let mut u = self.base.clone();
        u.set_path(&path);
        u
    }

    fn net(&self, e: reqwest::Error) -> ImageError {
        reg(format!(
            "cannot reach {} (at {}): {}",
            self.registry,
            self.base,
            chain(&e)
        ))
    }

    /// GET `url`, answering one auth challenge.
    async fn get(
        &mut self,
        url: reqwest::Url,
        accept: Option<&str>,
    ) -> Result<reqwest::Response, ImageError> {
        let mut challenged = false;
        loop {
            let mut rb = self.client.get(url.clone());
            if let Some(a) = accept {
                rb = rb.header(reqwest::header::ACCEPT, a);
            }
            if let Some(h) = &self.auth {
                rb = rb.header(reqwest::header::AUTHORIZATION, h);
            }
            let r = rb.send().await.map_err(|e| self.net(e))?;
            if r.status() != reqwest::StatusCode::UNAUTHORIZED || challenged {
                return Ok(r);
            }
            challenged = true;
            let ch = r
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .ok_or_else(|| {
                    reg(format!(
                        "{} answered 401 with no WWW-Authenticate challenge",
                        self.registry
                    ))
                })?;
            self.authenticate(&ch).await?;
        }
    }

    async fn authenticate(&mut self, challenge: &str) -> Result<(), ImageError> {
        let (scheme, params) = parse_challenge(challenge);
        if scheme.eq_ignore_ascii_case("basic") {
            let c = self.creds.as_ref().ok_or_else(|| {
                reg(format!(
                    "{} asks for a user and password (none were given)",
                    self.registry
                ))
            })?;
            use base64::Engine as _;
            self.auth = Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", c.username, c.password))
            ));
            return Ok(());
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(reg(format!(
                "{} asks for {scheme} authentication, which is not supported",
                self.registry
            )));
        }
        let realm = params.get("realm").ok_or_else(|| {
            reg(format!(
                "{}: a Bearer challenge without a realm",
                self.registry
            ))
        })?;
        let mut u = reqwest::Url::parse(realm)
            .map_err(|e| reg(format!("{}: token realm {realm:?}: {e}", self.registry)))?;
        if u.scheme() != "https" && !(u.scheme() == "http" && self.base.scheme() == "http") {
            return Err(reg(format!(
                "{}: the token realm {realm} is not https",
                self.registry
            )));
        }
        self.check.check_url(&u).map_err(reg)?;
        {
            let mut q = u.query_pairs_mut();
            if let Some(s) = params.get("service") {
                q.append_pair("service", s);
            }
            let scope = params
                .get("scope")
                .cloned()
                .unwrap_or_else(|| format!("repository:{}:pull", self.repository));
            q.append_pair("scope", &scope);
        }
        let mut rb = self.client.get(u);
        if let Some(c) = &self.creds {
            rb = rb.basic_auth(&c.username, Some(&c.password));
        }
        let r = rb.send().await.map_err(|e| self.net(e))?;
        let status = r.status();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(reg(format!(
                "{}: the token service refused {} ({status})",
                self.registry,
                if self.creds.is_some() {
                    "the user and password"
                } else {
                    "an anonymous pull (the repository may be private: give a user and password)"
                }
            )));
        }
        if !status.is_success() {
            return Err(reg(format!(
                "{}: the token service answered {status}",
                self.registry
            )));
        }
        let body = read_capped(r, 1 << 20, &self.registry).await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&body)
            .map_err(|e| reg(format!("{}: the token answer: {e}", self.registry)))?;
        let t = t
            .token
            .or(t.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| reg(format!("{}: the token answer has no token", self.registry)))?;
        self.auth = Some(format!("Bearer {t}"));
        Ok(())
    }

    /// An answer that is not 2xx, as an error naming what was asked.
    async fn failed(&self, what: &str, r: reqwest::Response) -> ImageError {
        let status = r.status();
        let body = read_capped(r, 64 << 10, &self.registry)
            .await
            .unwrap_or_default();
        // The distribution API's errors: {"errors": [{"code", "message"}]}.
        let detail = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| {
                let e = v.get("errors")?.as_array()?.first()?.clone();
                Some(format!(
                    "{} {}",
                    e.get("code")?.as_str()?,
                    e.get("message").and_then(|m| m.as_str()).unwrap_or("")
                ))
            })
            .unwrap_or_default();
        let why = match status.as_u16() {
            401 | 403 => {
                "access denied (a private repository needs a user and password that may pull it)"
            }
            404 => "not found",
            _ => "refused",
        };
        reg(format!(
            "{}: {what}: {why} ({status}{}{})",
            self.registry,
            if detail.is_empty() { "" } else { ": " },
            detail.trim()
        ))
    }

    async fn manifest(&mut self, reference: &str) -> Result<(Vec<u8>, String), ImageError> {
        let url = self.url("manifests", reference);
        let r = self.get(url, Some(ACCEPT)).await?;
        if !r.status().is_success() {
            let what = format!("manifest {}:{reference}", self.repository);
            return Err(self.failed(&what, r).await);
        }
        let ct = r
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        Ok((read_capped(r, MAX_DOC, &self.registry).await?, ct))
    }

    async fn blob_response(&mut self, digest: &str) -> Result<reqwest::Response, ImageError> {
        sha256_hex(digest)?;
        let url = self.url("blobs", digest);
        let r = self.get(url, None).await?;
        if !r.status().is_success() {
            return Err(self.failed(&format!("blob {digest}"), r).await);
        }
        Ok(r)
    }

    async fn blob_bytes(&mut self, digest: &str) -> Result<Vec<u8>, ImageError> {
        let r = self.blob_response(digest).await?;
        read_capped(r, MAX_DOC, &self.registry).await
    }

    /// Streams a blob into `path` (through a temporary name), checking its size against
    /// `size` (when the descriptor gives one) and its digest; returns its length.
    async fn blob_to_file(
        &mut self,
        digest: &str,
        size: u64,
        path: &Path,
        cancel: &AtomicBool,
    ) -> Result<u64, ImageError> {
        // The descriptor's size bounds the download (OCI and Docker require it), and the
        // store's file system keeps its reserve (as a layer's extraction does).
        if size == 0 {
            return Err(reg(format!("the manifest gives no size for blob {digest}")));
        }
        let part = path.with_extension("part");
        let mut f = std::fs::File::create(&part).map_err(io("create blob"))?;
        if !crate::extract::fd_has_room(std::os::fd::AsRawFd::as_raw_fd(&f), size) {
            return Err(reg(format!(
                "not enough space left in the store for blob {digest} ({size} bytes; a reserve \
                 is kept free)"
            )));
        }
        let r = self.blob_response(digest).await?;
        let mut h = Sha256::new();
        let mut n: u64 = 0;
        let mut body = r.bytes_stream();
        while let Some(chunk) = body.next().await {
            if cancel.load(Ordering::Relaxed) {
                return Err(ImageError::Interrupted);
            }
            let chunk = chunk.map_err(|e| self.net(e))?;
            n += chunk.len() as u64;
            if n > size {
                return Err(reg(format!(
                    "blob {digest} is longer than its descriptor's {size} bytes"
                )));
            }
            h.update(&chunk);
            f.write_all(&chunk).map_err(io("write blob"))?;
        }
        let got = format!("sha256:{}", hex(&h.finalize()));
        if got != digest {
            return Err(reg(format!("the registry sent {got} for {digest}")));
        }
        f.sync_all().map_err(io("sync blob"))?;
        std::fs::rename(&part, path).map_err(io("rename blob"))?;
        Ok(n)
    }
}

async fn read_capped(r: reqwest::Response, max: usize, who: &str) -> Result<Vec<u8>, ImageError> {
    let mut out = Vec::new();
    let mut body = r.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| reg(format!("cannot read from {who}: {}", chain(&e))))?;
        if out.len() + chunk.len() > max {
            return Err(reg(format!("{who} sent a document over {max} bytes")));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// `Bearer realm="...",service="...",scope="..."` -> ("Bearer", {realm, service, scope}).
fn parse_challenge(h: &str) -> (String, BTreeMap<String, String>) {
    let h = h.trim();
    let (scheme, rest) = h.split_once(' ').unwrap_or((h, ""));
    let mut params = BTreeMap::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let Some((k, after)) = rest.split_once('=') else {
            break;
        };
        let k = k.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (v, next) = if let Some(q) = after.strip_prefix('"') {
            // A quoted value (no escapes in practice; `\"` is honoured).
            let mut v = String::new();
            let mut chars = q.char_indices();
            let mut end = q.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            v.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => v.push(c),
                }
            }
            (v, &q[end.min(q.len())..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_owned(), &after[end..])
        };
        params.insert(k, v);
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    (scheme.to_owned(), params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_logins_are_found_by_registry() {
        let cfg = r#"{"auths": {
            "https://index.docker.io/v1/": {"auth": "aHViOmh1Yi1wYXNz"},
            "ghcr.io": {"username": "gh", "password": "gh-pass"},
            "quay.io": {"identitytoken": "x"}
        }, "credsStore": "desktop"}"#;
        let login = |r: &str| match login_from_docker_config(cfg, r) {
            Some(RegistryAuth::Login(c)) => Some((c.username, c.password)),
            _ => None,
        };
        assert_eq!(login("docker.io"), Some(("hub".into(), "hub-pass".into())));
        assert_eq!(login("ghcr.io"), Some(("gh".into(), "gh-pass".into())));
        assert_eq!(login("quay.io"), None);
        assert_eq!(login("example.com"), None);
        assert!(login_from_docker_config("not json", "ghcr.io").is_none());
    }

    #[test]
    fn challenges_are_parsed() {
        let (s, p) = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/python:pull""#,
        );
        assert_eq!(s, "Bearer");
        assert_eq!(p["realm"], "https://auth.docker.io/token");
        assert_eq!(p["service"], "registry.docker.io");
        assert_eq!(p["scope"], "repository:library/python:pull");
        let (s, p) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!(
            (s.as_str(), p["realm"].as_str()),
            ("Basic", "Registry Realm")
        );
        let (_, p) = parse_challenge("Bearer realm=https://x/t, service=svc");
        assert_eq!(
            (p["realm"].as_str(), p["service"].as_str()),
            ("https://x/t", "svc")
        );
    }

    #[test]
    fn private_addresses_are_refused_unless_allowed_or_a_mirror() {
        let c = AddrCheck {
            allow: vec!["10.9.0.0/16".parse().unwrap()],
            trusted: vec!["mirror.internal".into()],
        };
        for ip in [
            "127.0.0.1",
            "169.254.169.254",
            "10.0.0.1",
            "::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(c.check("r.example", ip.parse().unwrap()).is_err(), "{ip}");
        }
        assert!(c.check("r.example", "10.9.1.1".parse().unwrap()).is_ok());
        assert!(c
            .check("r.example", "93.184.216.34".parse().unwrap())
            .is_ok());
        assert!(c
            .check("mirror.internal", "127.0.0.1".parse().unwrap())
            .is_ok());
        let u = reqwest::Url::parse("https://169.254.169.254/v2/").unwrap();
        assert!(c.check_url(&u).is_err());
    }
}
