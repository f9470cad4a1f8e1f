//! Reading OCI images: an image layout directory (`oci-layout`, `index.json`, `blobs/`),
//! or an archive (tar) of one, or a `docker save` archive (`manifest.json`).
//!
//! Only the parts Rampart uses are read (by hand, with serde): the manifest's ordered
//! layers and the config's `Env`, `User`, `WorkingDir`, `Entrypoint` and `Cmd`. Blobs named
//! by digest are checked against it as they are read.

use crate::digest::{hex, KeyHasher};
use crate::store::{Store, TemplateConfig, TmpDir};
use crate::{io, ImageError};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// One layer of an image.
#[derive(Debug, Clone)]
pub struct OciLayer {
    /// The blob (a tar, maybe gzip-compressed).
    pub path: PathBuf,
    /// Its digest (`sha256:...`) if the image names one, checked while reading.
    pub digest: Option<String>,
    /// The store key of the extracted layer.
    pub key: String,
}

/// An image, read.
#[derive(Debug)]
pub struct OciImage {
    /// Layers, bottom first.
    pub layers: Vec<OciLayer>,
    /// Metadata from the image config.
    pub config: TemplateConfig,
    /// An unpacked archive, kept while the layers are read.
    _unpacked: Option<TmpDir>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub(crate) media_type: String,
    pub(crate) digest: String,
    /// Bytes (0: not given).
    #[serde(default)]
    pub(crate) size: u64,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Clone, Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Index {
    pub(crate) manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ImageManifest {
    pub(crate) config: Descriptor,
    pub(crate) layers: Vec<Descriptor>,
}

#[derive(Debug, Default, Deserialize)]
struct ImageConfigFile {
    #[serde(default)]
    config: Option<ImageConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ImageConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerManifest {
    config: String,
    layers: Vec<String>,
}

fn oci(m: impl Into<String>) -> ImageError {
    ImageError::Oci(m.into())
}

fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> Result<T, ImageError> {
    let b = std::fs::read(p).map_err(io(format!("read {}", p.display())))?;
    serde_json::from_slice(&b).map_err(|e| oci(format!("{}: {e}", p.display())))
}

/// `p`, with its symlinks resolved, if that is inside `root`; when `confine` is false
/// (a layout directory the operator named), `p` as is. An unpacked archive's symlinks are
/// the archive's own: `blobs -> /` or `l -> /root` must not make the import read host files.
fn confined(root: &Path, p: PathBuf, confine: bool) -> Result<PathBuf, ImageError> {
    if !confine {
        return Ok(p);
    }
    let r = std::fs::canonicalize(root).map_err(io(format!("open {}", root.display())))?;
    let c = std::fs::canonicalize(&p).map_err(io(format!("open {}", p.display())))?;
    if !c.starts_with(&r) {
        return Err(oci(format!(
            "{} leads outside the archive",
            p.strip_prefix(root).unwrap_or(&p).display()
        )));
    }
    Ok(c)
}

/// The path of a blob in a layout, refusing digests that are not `sha256:<64 hex>`.
fn blob(root: &Path, digest: &str, confine: bool) -> Result<PathBuf, ImageError> {
    let hexd = digest
        .strip_prefix("sha256:")
        .filter(|h| crate::digest::is_hex64(h))
        .ok_or_else(|| oci(format!("unsupported digest {digest:?} (sha256 only)")))?;
    confined(root, root.join("blobs").join("sha256").join(hexd), confine)
}

/// Reads a blob fully, checking its digest.
fn read_blob(root: &Path, digest: &str, confine: bool) -> Result<Vec<u8>, ImageError> {
    let p = blob(root, digest, confine)?;
    let b = std::fs::read(&p).map_err(io(format!("read blob {digest}")))?;
    let got = format!("sha256:{}", hex(&Sha256::digest(&b)));
    if got != digest {
        return Err(oci(format!("blob {digest} has digest {got}")));
    }
    Ok(b)
}

/// The store key of an OCI layer: independent of the layers below it, since each layer is
/// extracted on its own (overlayfs stacks them).
pub fn layer_key(digest: &str) -> String {
    let mut k = KeyHasher::new("rampart oci layer v1");
    k.str(digest);
    k.finish()
}

/// Opens an image: a layout directory, or a tar archive (OCI layout or `docker save`),
/// which is unpacked (safely) into a temporary directory of `store`.
pub fn open(path: &Path, store: &Store) -> Result<OciImage, ImageError> {
    let md = std::fs::metadata(path).map_err(io(format!("open image {}", path.display())))?;
    if md.is_dir() {
        return open_dir(path, None);
    }
    let tmp = store.tmp_dir("oci-archive")?;
    let f = std::fs::File::open(path).map_err(io(format!("open {}", path.display())))?;
    crate::extract::apply_layer(f, tmp.path())?;
    let root = tmp.path().to_path_buf();
    open_dir(&root, Some(tmp))
}

/// Opens a layout a pull wrote into `tmp` (kept with the image). Layer blobs the store
/// already has are absent from it; nothing reads them.
pub(crate) fn open_pulled(tmp: TmpDir) -> Result<OciImage, ImageError> {
    let mut img = open_dir(tmp.path(), None)?;
    img._unpacked = Some(tmp);
    Ok(img)
}

fn open_dir(root: &Path, unpacked: Option<TmpDir>) -> Result<OciImage, ImageError> {
    let arch = unpacked.is_some();
    if root.join("index.json").is_file() {
        let idx: Index = read_json(&confined(root, root.join("index.json"), arch)?)?;
        let mut desc = pick(&idx.manifests)?.clone();
        // An index may point at another index (multi-platform).
        let mut depth = 0;
        let manifest: ImageManifest = loop {
            let b = read_blob(root, &desc.digest, arch)?;
            let v: serde_json::Value =
                serde_json::from_slice(&b).map_err(|e| oci(format!("manifest: {e}")))?;
            if v.get("manifests").is_some() {
                depth += 1;
                if depth > 4 {
                    return Err(oci("nested indexes too deep"));
                }
                let inner: Index =
                    serde_json::from_value(v).map_err(|e| oci(format!("index: {e}")))?;
                desc = pick(&inner.manifests)?.clone();
                continue;
            }
            break serde_json::from_value(v).map_err(|e| oci(format!("manifest: {e}")))?;
        };
        let cfg: ImageConfigFile =
            serde_json::from_slice(&read_blob(root, &manifest.config.digest, arch)?)
                .map_err(|e| oci(format!("config: {e}")))?;
        let mut layers = Vec::new();
        for l in &manifest.layers {
            if l.media_type.contains("zstd") {
                return Err(oci(format!(
                    "layer {} is zstd-compressed ({}); only gzip and plain tar are supported",
                    l.digest, l.media_type
                )));
            }
            if l.media_type.contains("nondistributable") || l.media_type.contains("foreign") {
                return Err(oci(format!("layer {} is not distributable", l.digest)));
            }
            layers.push(OciLayer {
                path: blob(root, &l.digest, arch)?,
                digest: Some(l.digest.clone()),
                key: layer_key(&l.digest),
            });
        }
        return Ok(OciImage {
            layers,
            config: map_config(cfg.config.unwrap_or_default()),
            _unpacked: unpacked,
        });
    }
    if root.join("manifest.json").is_file() {
        let dm: Vec<DockerManifest> =
            read_json(&confined(root, root.join("manifest.json"), arch)?)?;
        let m = dm
            .into_iter()
            .next()
            .ok_or_else(|| oci("manifest.json lists no image"))?;
        let cpath = confined(root, safe_join(root, &m.config)?, arch)?;
        let cfg: ImageConfigFile = read_json(&cpath)?;
        let mut layers = Vec::new();
        for l in &m.layers {
            let p = confined(root, safe_join(root, l)?, arch)?;
            // Name the layer by its content.
            let mut h = Sha256::new();
            let mut f = std::fs::File::open(&p).map_err(io(format!("open {}", p.display())))?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = f
                    .read(&mut buf)
                    .map_err(io(format!("read {}", p.display())))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            let d = format!("sha256:{}", hex(&h.finalize()));
            layers.push(OciLayer {
                path: p,
                key: layer_key(&d),
                digest: Some(d),
            });
        }
        return Ok(OciImage {
            layers,
            config: map_config(cfg.config.unwrap_or_default()),
            _unpacked: unpacked,
        });
    }
    Err(oci(format!(
        "{} is neither an OCI image layout (index.json) nor a docker save archive (manifest.json)",
        root.display()
    )))
}

fn safe_join(root: &Path, rel: &str) -> Result<PathBuf, ImageError> {
    let comps = crate::extract::components(rel)?;
    let mut p = root.to_path_buf();
    for c in comps {
        p.push(std::ffi::OsStr::new(
            &String::from_utf8_lossy(&c).into_owned(),
        ));
    }
    Ok(p)
}

/// This host's architecture as OCI names it.
pub(crate) fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        o => o,
    }
}

/// The manifest of this host's platform (linux and [`host_arch`]) in an index, or one that
/// names no platform.
pub(crate) fn pick_platform(ds: &[Descriptor]) -> Option<&Descriptor> {
    let arch = host_arch();
    ds.iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .or_else(|| ds.iter().find(|d| d.platform.is_none()))
}

/// The platforms an index lists, for an error.
pub(crate) fn platforms(ds: &[Descriptor]) -> String {
    let v: Vec<String> = ds
        .iter()
        .filter_map(|d| d.platform.as_ref())
        .map(|p| format!("{}/{}", p.os, p.architecture))
        .collect();
    if v.is_empty() {
        "none named".into()
    } else {
        v.join(", ")
    }
}

/// Picks the linux/amd64 (or the only, or the first) manifest of a layout's index.
fn pick(ds: &[Descriptor]) -> Result<&Descriptor, ImageError> {
    pick_platform(ds)
        .or_else(|| ds.first())
        .ok_or_else(|| oci("index.json lists no manifest"))
}

fn map_config(c: ImageConfig) -> TemplateConfig {
    let mut env = BTreeMap::new();
    for kv in c.env.unwrap_or_default() {
        if let Some((k, v)) = kv.split_once('=') {
            if !k.is_empty() && !k.contains('\0') && !v.contains('\0') {
                env.insert(k.to_owned(), v.to_owned());
            }
        }
    }
    let user = c
        .user
        .filter(|u| !u.is_empty())
        // `user:group` -> the user part (the agent resolves names and numbers).
        .map(|u| u.split(':').next().unwrap_or("root").to_owned())
        .or_else(|| Some("root".to_owned()));
    let workdir = c.working_dir.filter(|w| w.starts_with('/'));
    let mut cmd: Vec<String> = c.entrypoint.unwrap_or_default();
    cmd.extend(c.cmd.unwrap_or_default());
    let start = if cmd.is_empty() {
        None
    } else {
        Some(crate::spec::StartSpec {
            cmd,
            ready: None,
            timeout_secs: crate::spec::DEFAULT_READY_TIMEOUT,
        })
    };
    TemplateConfig {
        user,
        workdir,
        env,
        start,
        isolation: None,
    }
}

/// Extracts a layer blob into `dest` (empty), checking its digest as it streams.
pub fn extract_layer(
    l: &OciLayer,
    dest: &Path,
) -> Result<crate::extract::ExtractStats, ImageError> {
    let f = std::fs::File::open(&l.path).map_err(io(format!("open layer {}", l.path.display())))?;
    let mut hr = HashingReader {
        inner: f,
        h: Sha256::new(),
    };
    let st = crate::extract::apply_layer(&mut hr, dest)?;
    // Drain what the tar reader left (padding), so the digest covers the whole blob.
    std::io::copy(&mut hr, &mut std::io::sink()).map_err(io("read layer"))?;
    if let Some(d) = &l.digest {
        let got = format!("sha256:{}", hex(&hr.h.finalize()));
        if &got != d {
            return Err(oci(format!("layer {d} has digest {got}")));
        }
    }
    Ok(st)
}

struct HashingReader<R> {
    inner: R,
    h: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.h.update(&buf[..n]);
        Ok(n)
    }
}
