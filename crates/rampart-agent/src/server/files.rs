//! `GET /files` (download) and `POST /files` (upload), streamed both ways.

use super::fs::{chown_to, make_dirs, write_metadata};
use super::users::{self, User};
use super::{http_error, json, Body, State};
use crate::connect::Code;
use crate::proto::WrittenEntry;
use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Request, Response};
use std::collections::BTreeMap;
use std::io::{ErrorKind, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Decode a URL query into pairs.
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    fn dec(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < b.len() => {
                    let h = std::str::from_utf8(&b[i + 1..i + 3])
                        .ok()
                        .and_then(|h| u8::from_str_radix(h, 16).ok());
                    match h {
                        Some(v) => {
                            out.push(v);
                            i += 2;
                        }
                        None => out.push(b'%'),
                    }
                }
                c => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (dec(k), dec(v))
        })
        .collect()
}

fn query(req: &Request<Incoming>) -> BTreeMap<String, String> {
    parse_query(req.uri().query().unwrap_or_default())
        .into_iter()
        .collect()
}

fn status_for(code: Code) -> u16 {
    match code {
        Code::Unauthenticated => 401,
        Code::PermissionDenied => 403,
        _ => 400,
    }
}

fn user_for(state: &State, q: &BTreeMap<String, String>) -> Result<User, Box<Response<Body>>> {
    users::resolve(
        q.get("username").map(String::as_str),
        &state.config.default_user,
    )
    .map_err(|e| Box::new(http_error(status_for(e.code), &e.message)))
}

/// `GET /files?path=&username=`.
pub fn download(state: &Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let q = query(&req);
    let user = match user_for(state, &q) {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let Some(path) = q.get("path").filter(|p| !p.is_empty()) else {
        return http_error(400, "the path query parameter is required");
    };
    let p = super::resolve_path(path, &user.home);
    let file = match std::fs::File::open(&p) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return http_error(404, &format!("path '{}' does not exist", p.display()))
        }
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            return http_error(403, &format!("path '{}': permission denied", p.display()))
        }
        Err(e) => return http_error(500, &format!("opening '{}': {e}", p.display())),
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => return http_error(500, &format!("stat '{}': {e}", p.display())),
    };
    if meta.is_dir() {
        return http_error(400, &format!("path '{}' is a directory", p.display()));
    }
    if !meta.is_file() {
        return http_error(
            400,
            &format!("path '{}' is not a regular file", p.display()),
        );
    }
    let len = meta.len();
    let mut r = Response::new(Body::File {
        file,
        remaining: len,
    });
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    r.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(len));
    r
}

/// An upload failure.
struct UpErr(u16, String);

fn io_up(e: &std::io::Error, what: &str, p: &Path) -> UpErr {
    let status = match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => 507,
        _ => match e.kind() {
            ErrorKind::PermissionDenied => 403,
            ErrorKind::AlreadyExists | ErrorKind::InvalidInput | ErrorKind::InvalidData => 400,
            _ if e.raw_os_error() == Some(libc::EISDIR)
                || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                400
            }
            _ => 500,
        },
    };
    if status == 507 {
        return UpErr(
            507,
            format!("not enough disk space to write '{}'", p.display()),
        );
    }
    UpErr(status, format!("{what} '{}': {e}", p.display()))
}

/// A file being written: created (0644), chowned, then filled chunk by chunk.
struct Sink {
    path: PathBuf,
    out: Out,
}

enum Out {
    Plain(std::fs::File),
    Gzip(Box<flate2::write::MultiGzDecoder<std::fs::File>>),
}

impl Sink {
    fn open(path: PathBuf, user: &User, gzip: bool) -> Result<Sink, UpErr> {
        if let Some(parent) = path.parent() {
            make_dirs(parent, user)
                .map_err(|e| io_up(&e, "creating parent directories of", &path))?;
        }
        if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            return Err(UpErr(
                400,
                format!("path '{}' is a directory", path.display()),
            ));
        }
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&path)
            .map_err(|e| io_up(&e, "opening", &path))?;
        chown_to(&path, user).map_err(|e| io_up(&e, "chown", &path))?;
        let out = if gzip {
            Out::Gzip(Box::new(flate2::write::MultiGzDecoder::new(f)))
        } else {
            Out::Plain(f)
        };
        Ok(Sink { path, out })
    }

    fn write(&mut self, b: &[u8]) -> Result<(), UpErr> {
        let r = match &mut self.out {
            Out::Plain(f) => f.write_all(b),
            Out::Gzip(d) => d.write_all(b),
        };
        r.map_err(|e| self.err(&e))
    }

    fn finish(self) -> Result<PathBuf, UpErr> {
        let r = match self.out {
            Out::Plain(_) => Ok(()),
            Out::Gzip(mut d) => d.try_finish().and_then(|()| d.flush()),
        };
        match r {
            Ok(()) => Ok(self.path),
            Err(e) => Err(io_up(&e, "writing", &self.path)),
        }
    }

    fn err(&self, e: &std::io::Error) -> UpErr {
        if e.kind() == ErrorKind::InvalidInput || e.kind() == ErrorKind::InvalidData {
            return UpErr(
                400,
                format!("invalid gzip body for '{}': {e}", self.path.display()),
            );
        }
        io_up(e, "writing", &self.path)
    }
}

fn written(path: &Path, metadata: &BTreeMap<String, String>) -> WrittenEntry {
    WrittenEntry {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        entry_type: "file".into(),
        path: path.to_string_lossy().into_owned(),
        metadata: if metadata.is_empty() {
            None
        } else {
            Some(metadata.clone())
        },
    }
}

fn apply_metadata(path: &Path, metadata: &BTreeMap<String, String>) -> Result<(), UpErr> {
    for (k, v) in metadata {
        write_metadata(path, k, v).map_err(|e| {
            UpErr(
                500,
                format!("setting metadata '{k}' on '{}': {e}", path.display()),
            )
        })?;
    }
    Ok(())
}

/// `POST /files`: multipart (`file` parts, filename = target) or a raw body with `?path=`.
pub async fn upload(state: &Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let q = query(&req);
    let user = match user_for(state, &q) {
        Ok(u) => u,
        Err(r) => return *r,
    };
    match upload_inner(&q, &user, req).await {
        Ok(entries) => json(&entries),
        Err(UpErr(status, msg)) => http_error(status, &msg),
    }
}

async fn upload_inner(
    q: &BTreeMap<String, String>,
    user: &User,
    req: Request<Incoming>,
) -> Result<Vec<WrittenEntry>, UpErr> {
    let h = req.headers();
    let ct = h
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let encoding = h
        .get(hyper::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .trim()
        .to_ascii_lowercase();
    let gzip = match encoding.as_str() {
        "" | "identity" => false,
        "gzip" | "x-gzip" => true,
        other => {
            return Err(UpErr(
                400,
                format!("unsupported content-encoding '{other}'"),
            ))
        }
    };
    let mut metadata = BTreeMap::new();
    for (k, v) in h {
        if let Some(key) = k.as_str().strip_prefix("x-metadata-") {
            let v = v
                .to_str()
                .map_err(|_| UpErr(400, format!("metadata '{key}' is not valid text")))?;
            metadata.insert(key.to_ascii_lowercase(), v.to_string());
        }
    }
    let qpath = q.get("path").filter(|p| !p.is_empty()).cloned();
    let body = req.into_body();

    if ct.to_ascii_lowercase().starts_with("multipart/form-data") {
        if gzip {
            return Err(UpErr(
                400,
                "gzip content-encoding is only supported for octet-stream uploads".into(),
            ));
        }
        let boundary = multer::parse_boundary(&ct)
            .map_err(|e| UpErr(400, format!("bad multipart content-type: {e}")))?;
        let stream = http_body_util::BodyStream::new(body).filter_map(|f| async move {
            match f {
                Ok(f) => f.into_data().ok().map(Ok::<Bytes, hyper::Error>),
                Err(e) => Some(Err(e)),
            }
        });
        let mut mp = multer::Multipart::new(stream, boundary);
        let mut out = Vec::new();
        let mut first = true;
        loop {
            let field = match mp.next_field().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return Err(UpErr(400, format!("malformed multipart body: {e}"))),
            };
            if field.name() != Some("file") {
                continue;
            }
            let target = match (&qpath, field.file_name()) {
                (Some(p), _) if first => p.clone(),
                (_, Some(f)) if !f.is_empty() => f.to_string(),
                _ => {
                    return Err(UpErr(
                        400,
                        "a file part has no filename and no path was given".into(),
                    ))
                }
            };
            first = false;
            let path = super::resolve_path(&target, &user.home);
            let mut sink = Sink::open(path, user, false)?;
            let mut field = field;
            loop {
                match field.chunk().await {
                    Ok(Some(c)) => sink.write(&c)?,
                    Ok(None) => break,
                    Err(e) => return Err(UpErr(400, format!("reading part for '{target}': {e}"))),
                }
            }
            let p = sink.finish()?;
            apply_metadata(&p, &metadata)?;
            out.push(written(&p, &metadata));
        }
        if out.is_empty() {
            return Err(UpErr(400, "the multipart body has no 'file' part".into()));
        }
        return Ok(out);
    }

    let Some(target) = qpath else {
        return Err(UpErr(
            400,
            "the path query parameter is required for a raw upload".into(),
        ));
    };
    let path = super::resolve_path(&target, &user.home);
    let mut sink = Sink::open(path, user, gzip)?;
    let mut body = body;
    loop {
        match body.frame().await {
            None => break,
            Some(Err(e)) => return Err(UpErr(400, format!("reading body: {e}"))),
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    sink.write(&d)?;
                }
            }
        }
    }
    let p = sink.finish()?;
    apply_metadata(&p, &metadata)?;
    Ok(vec![written(&p, &metadata)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = parse_query("path=%2Fhome%2Fuser%2Fa+b.txt&username=root&x=%zz&y");
        assert_eq!(q[0], ("path".into(), "/home/user/a b.txt".into()));
        assert_eq!(q[1], ("username".into(), "root".into()));
        assert_eq!(q[2], ("x".into(), "%zz".into()));
        assert_eq!(q[3], ("y".into(), "".into()));
        assert_eq!(parse_query("a=%4"), vec![("a".into(), "%4".into())]);
    }
}
