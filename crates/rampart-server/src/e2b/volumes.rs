//! E2B volumes: the control plane (`/volumes`, with `X-API-KEY`) and the volume file API
//! (`/volumecontent/{volumeID}/...`, with the volume's token as `Authorization: Bearer`),
//! served on the native volumes (`/v1/volumes`: one implementation, two faces).
//!
//! - A volume's E2B id is its name (names are unique per tenant, as E2B's are per team).
//!   E2B's create takes only a name: the volume gets [`DEFAULT_SIZE_MIB`] (its image is
//!   sparse; the size is its quota).
//! - The token is `vol.<tenant hex>.<HMAC-SHA256>` over the tenant, the name and the volume's
//!   creation time, keyed by `<data>/e2b-volume-key` (made at first use, mode 0600): it
//!   opens only that volume of that tenant, and a volume made again under the same name gets
//!   a new one. Deleting the key file revokes every token.
//! - The file API runs on [`rampart_core::volume_files`]: the daemon mounts the volume's
//!   file system detached over its one loop device (shared with any sandbox that has it
//!   mounted: one ext4 instance, never two writers), walks paths by descriptor beneath its
//!   root (`..` refused, symlinks followed only while they stay inside) and keeps the volume
//!   from being removed while a call runs.

use super::options::{Mount, Options};
use super::wire::parse_body;
use super::{E2b, E2bError};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt as _;
use hmac::{Hmac, Mac};
use rampart_core::volume_files::{EntryKind, EntryMeta, VolumeEntry, VolumeRoot};
use rampart_core::{CoreError, Principal};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Sha256;
use std::sync::Arc;

/// Size quota of a volume made through the E2B API (MiB).
pub(crate) const DEFAULT_SIZE_MIB: u64 = 1024;
/// The file in the data directory holding the key of volume tokens.
const KEY_FILE: &str = "e2b-volume-key";

fn not_found(id: &str) -> E2bError {
    E2bError::new(StatusCode::NOT_FOUND, format!("volume {id:?} not found"))
}

/// A core error of a volume call, with E2B's statuses (404 for a missing volume).
fn vol_err(id: &str, e: CoreError) -> E2bError {
    match e {
        CoreError::NotFound(m) if m.starts_with("volume ") => not_found(id),
        CoreError::WrongState { .. } => E2bError::new(
            StatusCode::CONFLICT,
            format!("volume {id:?} is mounted by a sandbox: kill the sandbox first"),
        ),
        e => E2bError::from(e),
    }
}

#[derive(Debug, Default, Deserialize)]
struct NewVolume {
    #[serde(default)]
    name: String,
}

/// The token key, made at first use.
fn key(st: &E2b) -> Result<Vec<u8>, E2bError> {
    static KEY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let path = st.manager.data_dir().join(KEY_FILE);
    if let Some(k) = KEY.get() {
        return Ok(k.clone());
    }
    let k = match std::fs::read_to_string(&path) {
        Ok(s) if s.trim().len() >= 64 => s.trim().as_bytes().to_vec(),
        _ => {
            let k = rampart_store::keys::random_hex(32);
            super::write_secret(&path, &format!("{k}\n"))
                .map_err(|e| E2bError::internal(format!("writing {}: {e}", path.display())))?;
            k.into_bytes()
        }
    };
    Ok(KEY.get_or_init(|| k).clone())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn mac(st: &E2b, tenant: &str, name: &str, created_at: &str) -> Result<Hmac<Sha256>, E2bError> {
    let mut m = Hmac::<Sha256>::new_from_slice(&key(st)?)
        .map_err(|e| E2bError::internal(format!("volume token key: {e}")))?;
    m.update(format!("e2b-volume\0{tenant}\0{name}\0{created_at}").as_bytes());
    Ok(m)
}

/// The token of volume `v` for the current caller's tenant.
fn token_of(st: &E2b, who: &Principal, v: &rampart_types::VolumeInfo) -> Result<String, E2bError> {
    let tenant = who.tenant.clone().unwrap_or_default();
    let m = mac(st, &tenant, &v.name, &v.created_at)?;
    Ok(format!(
        "vol.{}.{}",
        hex(tenant.as_bytes()),
        hex(&m.finalize().into_bytes())
    ))
}

fn with_token(st: &E2b, who: &Principal, v: &rampart_types::VolumeInfo) -> Result<Value, E2bError> {
    Ok(json!({"volumeID": v.name, "name": v.name, "token": token_of(st, who, v)?}))
}

/// `POST /volumes`: 201 `VolumeAndToken`.
pub(crate) async fn create(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let n: NewVolume = parse_body(&body)?;
    rampart_core::persist::check_plain_name("name", &n.name)
        .map_err(|e| E2bError::bad_request(e.to_string()))?;
    if st.manager.volume(&who, &n.name).is_ok() {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("a volume named {:?} exists", n.name),
        ));
    }
    let v = st
        .manager
        .create_volume(
            &who,
            rampart_types::CreateVolume {
                name: n.name.clone(),
                size_mib: DEFAULT_SIZE_MIB,
            },
        )
        .await
        .map_err(|e| vol_err(&n.name, e))?;
    Ok((StatusCode::CREATED, Json(with_token(&st, &who, &v)?)).into_response())
}

/// `GET /volumes`: the caller's volumes.
pub(crate) async fn list(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
) -> Result<Json<Value>, E2bError> {
    let vols = st.manager.list_volumes(&who)?;
    Ok(Json(Value::Array(
        vols.iter()
            .map(|v| json!({"volumeID": v.name, "name": v.name}))
            .collect(),
    )))
}

/// `GET /volumes/{volumeID}`: `VolumeAndToken`.
pub(crate) async fn get_one(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, E2bError> {
    let v = st.manager.volume(&who, &id).map_err(|e| vol_err(&id, e))?;
    Ok(Json(with_token(&st, &who, &v)?))
}

/// `DELETE /volumes/{volumeID}`: 204; 409 while a sandbox has it mounted.
pub(crate) async fn delete(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    st.manager
        .delete_volume(&who, &id)
        .await
        .map_err(|e| vol_err(&id, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// The caller of a volume file request: the tenant its token names, once the token is
/// checked against volume `id` of that tenant.
async fn authorize(st: &E2b, headers: &HeaderMap, id: &str) -> Result<Principal, E2bError> {
    let unauthorized = |m: &str| E2bError::new(StatusCode::UNAUTHORIZED, m.to_owned());
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| {
            unauthorized("missing volume token: send Authorization: Bearer <the volume's token>")
        })?;
    let bad = || unauthorized("invalid volume token: get it from Volume.create or Volume.get_info");
    let mut parts = token.split('.');
    let (Some("vol"), Some(t), Some(m), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let tenant = unhex(t)
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(bad)?;
    let sig = unhex(m).ok_or_else(bad)?;
    let p = Principal {
        caller: format!("e2b-volume-token:{id}"),
        tenant: (!tenant.is_empty()).then_some(tenant.clone()),
        key_id: None,
    };
    let v = st
        .manager
        .volume(&p, id)
        // Another tenant's volume, or none: the same answer as a wrong token.
        .map_err(|_| bad())?;
    mac(st, &tenant, &v.name, &v.created_at)?
        .verify_slice(&sig)
        .map_err(|_| bad())?;
    Ok(p)
}

fn time_of((s, ns): (i64, u32)) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(s) * 1_000_000_000 + i128::from(ns))
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

/// `VolumeEntryStat`.
fn entry_json(e: &VolumeEntry) -> Value {
    let mut v = json!({
        "name": e.name,
        "type": match e.kind {
            EntryKind::File => "file",
            EntryKind::Directory => "directory",
            EntryKind::Symlink => "symlink",
            EntryKind::Unknown => "unknown",
        },
        "path": e.path,
        "size": e.size,
        "mode": e.mode,
        "uid": e.uid,
        "gid": e.gid,
        "atime": time_of(e.atime),
        "mtime": time_of(e.mtime),
        "ctime": time_of(e.ctime),
    });
    if let Some(t) = &e.target {
        v["target"] = json!(t);
    }
    v
}

/// The query of a volume file request.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Q {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: Option<u32>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
    #[serde(default)]
    mode: Option<u32>,
    #[serde(default)]
    force: Option<bool>,
}

impl Q {
    fn meta(&self) -> EntryMeta {
        EntryMeta {
            uid: self.uid,
            gid: self.gid,
            mode: self.mode,
        }
    }
}

/// Opens volume `id` as the token's caller and runs `f` on a blocking thread.
async fn run<T: Send + 'static>(
    st: &E2b,
    headers: &HeaderMap,
    id: &str,
    f: impl FnOnce(&Arc<VolumeRoot>) -> Result<T, CoreError> + Send + 'static,
) -> Result<T, E2bError> {
    let vol = open(st, headers, id).await?;
    tokio::task::spawn_blocking(move || f(&vol))
        .await
        .map_err(|e| E2bError::internal(format!("volume call: {e}")))?
        .map_err(file_err)
}

async fn open(st: &E2b, headers: &HeaderMap, id: &str) -> Result<Arc<VolumeRoot>, E2bError> {
    let p = authorize(st, headers, id).await?;
    st.manager
        .open_volume(&p, id)
        .await
        .map_err(|e| vol_err(id, e))
}

/// A file API error: a missing path is 404 (the SDK's `VolumePathNotFound`).
fn file_err(e: CoreError) -> E2bError {
    E2bError::from(e)
}

/// `GET /volumecontent/{id}/path`: the entry at `path`.
pub(crate) async fn stat(
    State(st): State<E2b>,
    Path(id): Path<String>,
    Query(q): Query<Q>,
    headers: HeaderMap,
) -> Result<Json<Value>, E2bError> {
    let e = run(&st, &headers, &id, move |v| v.stat(&q.path)).await?;
    Ok(Json(entry_json(&e)))
}

/// `GET /volumecontent/{id}/dir`: the entries under `path`, `depth` levels (default 1).
pub(crate) async fn list_dir(
    State(st): State<E2b>,
    Path(id): Path<String>,
    Query(q): Query<Q>,
    headers: HeaderMap,
) -> Result<Json<Value>, E2bError> {
    let es = run(&st, &headers, &id, move |v| {
        v.list(&q.path, q.depth.unwrap_or(1))
    })
    .await?;
    Ok(Json(Value::Array(es.iter().map(entry_json).collect())))
}

/// `POST /volumecontent/{id}/dir`: 201, the directory made (`force`: with its parents).
pub(crate) async fn make_dir(
    State(st): State<E2b>,
    Path(id): Path<String>,
    Query(q): Query<Q>,
    headers: HeaderMap,
) -> Result<Response, E2bError> {
    let e = run(&st, &headers, &id, move |v| {
        v.make_dir(&q.path, q.meta(), q.force == Some(true))
    })
    .await?;
    Ok((StatusCode::CREATED, Json(entry_json(&e))).into_response())
}

#[derive(Debug, Default, Deserialize)]
struct MetaBody {
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
    #[serde(default)]
    mode: Option<u32>,
}

/// `PATCH /volumecontent/{id}/path`: changes owner and mode; the entry after.
pub(crate) async fn update_meta(
    State(st): State<E2b>,
    Path(id): Path<String>,
    Query(q): Query<Q>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Value>, E2bError> {
    let b: MetaBody = parse_body(&body)?;
    let meta = EntryMeta {
        uid: b.uid,
        gid: b.gid,
        mode: b.mode,
    };
    let e = run(&st, &headers, &id, move |v| v.set_meta(&q.path, meta)).await?;
    Ok(Json(entry_json(&e)))
}

/// `DELETE /volumecontent/{id}/path`: 204 (a directory with what it holds).
pub(crate) async fn remove(
    State(st): State<E2b>,
    Path(id): Path<String>,
    Query(q): Query<Q>,
    headers: HeaderMap,
) -> Result<StatusCode, E2bError> {
    run(&st, &headers, &id, move |v| v.remove(&q.path)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /volumecontent/{id}/file`: the file's bytes, streamed. The volume stays open (and
/// cannot be removed) until the answer is sent.
pub(crate) async fn read_file(
    State(st): State<E2b>,
    Path(id): Path<String>,
    Query(q): Query<Q>,
    headers: HeaderMap,
) -> Result<Response, E2bError> {
    let vol = open(&st, &headers, &id).await?;
    let v2 = vol.clone();
    let (f, len) = tokio::task::spawn_blocking(move || v2.open_file(&q.path))
        .await
        .map_err(|e| E2bError::internal(format!("volume call: {e}")))?
        .map_err(file_err)?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(f)).map(move |c| {
        // Holds the volume open for as long as the body streams.
        let _held = &vol;
        c
    });
    Ok((
        StatusCode::OK,
        [
            ("content-type", "application/octet-stream".to_owned()),
            ("content-length", len.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// `PUT /volumecontent/{id}/file`: 201, the file written (created or replaced whole, never
/// half: the content goes to a hidden file renamed over the target at the end; `force`: the
/// missing parent directories are made).
pub(crate) async fn write_file(
    State(st): State<E2b>,
    Path(id): Path<String>,
    Query(q): Query<Q>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, E2bError> {
    let vol = open(&st, &headers, &id).await?;
    let v2 = vol.clone();
    let path = q.path.clone();
    let (meta, parents) = (q.meta(), q.force == Some(true));
    let mut up = tokio::task::spawn_blocking(move || v2.start_write(&path, meta, parents))
        .await
        .map_err(|e| E2bError::internal(format!("volume call: {e}")))?
        .map_err(file_err)?;
    let std_file = up
        .take_file()
        .ok_or_else(|| E2bError::internal("the upload has no file"))?;
    let mut f = tokio::fs::File::from_std(std_file);
    let mut s = body.into_data_stream();
    use tokio::io::AsyncWriteExt as _;
    while let Some(chunk) = s.next().await {
        let chunk = chunk.map_err(|e| E2bError::bad_request(format!("reading the body: {e}")))?;
        if let Err(e) = f.write_all(&chunk).await {
            return Err(if e.kind() == std::io::ErrorKind::StorageFull {
                E2bError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the volume {id:?} is full"),
                )
            } else {
                E2bError::internal(format!("writing {:?}: {e}", q.path))
            });
        }
    }
    f.flush()
        .await
        .map_err(|e| E2bError::internal(format!("writing {:?}: {e}", q.path)))?;
    up.put_back(f.into_std().await);
    let e = tokio::task::spawn_blocking(move || up.commit())
        .await
        .map_err(|e| E2bError::internal(format!("volume call: {e}")))?
        .map_err(file_err)?;
    drop(vol);
    Ok((StatusCode::CREATED, Json(entry_json(&e))).into_response())
}

/// The `volumeMounts` of a create (`[{name, path}]`), checked as far as the body goes
/// (core checks the rest: the volume exists and is the caller's, the path is usable).
pub(crate) fn mounts_of(v: Option<&Value>) -> Result<Vec<Mount>, E2bError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let mounts: Vec<Mount> = serde_json::from_value(v.clone()).map_err(|e| {
        E2bError::bad_request(format!("volumeMounts: a list of {{name, path}}: {e}"))
    })?;
    for m in &mounts {
        rampart_core::persist::check_plain_name("volumeMounts.name", &m.name)
            .map_err(|e| E2bError::bad_request(e.to_string()))?;
    }
    Ok(mounts)
}

/// The native mounts of E2B's (read-write, as E2B mounts them).
pub(crate) fn native_mounts(m: &[Mount]) -> Vec<rampart_types::VolumeMount> {
    m.iter()
        .map(|m| rampart_types::VolumeMount {
            name: m.name.clone(),
            path: m.path.clone(),
            read_only: false,
        })
        .collect()
}

/// `volumeMounts` of a sandbox's info, from its kept E2B options.
pub(crate) fn mounts_json(options: &str) -> Value {
    json!(Options::parse(options).volume_mounts)
}
