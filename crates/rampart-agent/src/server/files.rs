//! `GET /files` (download) and `POST /files` (upload), streamed both ways.

use super::creds::{self, Creds};
use super::fs::{chown_to, clear_metadata, code_of, make_dirs, write_metadata};
use super::users::{self, User};
use super::{http_error, json, Body, State};
use crate::connect::Code;
use crate::proto::WrittenEntry;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Request, Response};
use std::collections::BTreeMap;
use std::io::{ErrorKind, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Decode a URL query into pairs.
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    fn dec(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'+' => out.push(b' '),
                // Exactly two hex digits (`u8::from_str_radix` would also take `+F`).
                b'%' if i + 2 < b.len()
                    && b[i + 1].is_ascii_hexdigit()
                    && b[i + 2].is_ascii_hexdigit() =>
                {
                    let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                    out.push((hex(b[i + 1]) << 4) | hex(b[i + 2]));
                    i += 2;
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

fn user_for(state: &State, q: &BTreeMap<String, String>) -> Result<User, Box<Response<Body>>> {
    users::resolve(
        q.get("username").map(String::as_str),
        &state.config.default_user,
    )
    .map_err(|e| Box::new(http_error(http_status(e.code), &e.message)))
}

/// The HTTP status of a Connect code on the `/files` endpoints.
fn http_status(code: Code) -> u16 {
    match code {
        Code::NotFound => 404,
        Code::PermissionDenied => 403,
        Code::Unauthenticated => 401,
        Code::AlreadyExists => 409,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
        Code::ResourceExhausted => 507,
        _ => 500,
    }
}

/// Whether `f` is on a file system whose files the kernel makes as they are read (procfs,
/// sysfs), so that their size says nothing of their content: procfs files report 0 bytes,
/// sysfs files a page (`/sys/kernel/mm/transparent_hugepage/enabled`: 4096 for 23 bytes).
fn generated_by_the_kernel(f: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd as _;
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    const SYSFS_MAGIC: i64 = 0x6265_6572;
    // SAFETY: an all-zero statfs is a valid value to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on a descriptor we hold, into a statfs we own.
    if unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    let kind = st.f_type as i64;
    kind == PROC_SUPER_MAGIC || kind == SYSFS_MAGIC
}

/// Open `p` for download: the file and its length, None when it is to be read to its end
/// (a file that reports 0 bytes, or one of procfs or sysfs, see
/// [`generated_by_the_kernel`]).
fn open_for_download(p: &Path) -> Result<(std::fs::File, Option<u64>), UpErr> {
    let file = std::fs::File::open(p).map_err(|e| match code_of(&e) {
        Code::NotFound => UpErr(404, format!("path '{}' does not exist", p.display())),
        Code::PermissionDenied => UpErr(403, format!("path '{}': permission denied", p.display())),
        c => UpErr(http_status(c), format!("opening '{}': {e}", p.display())),
    })?;
    let meta = file
        .metadata()
        .map_err(|e| UpErr(500, format!("stat '{}': {e}", p.display())))?;
    if meta.is_dir() {
        return Err(UpErr(400, format!("path '{}' is a directory", p.display())));
    }
    if !meta.is_file() {
        return Err(UpErr(
            400,
            format!("path '{}' is not a regular file", p.display()),
        ));
    }
    let len = meta.len();
    if len == 0 || generated_by_the_kernel(&file) {
        return Ok((file, None));
    }
    Ok((file, Some(len)))
}

/// `GET /files?path=&username=`: opened with the user's permissions.
pub async fn download(state: &Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let q = query(&req);
    let user = match user_for(state, &q) {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let Some(path) = q.get("path").filter(|p| !p.is_empty()) else {
        return http_error(400, "the path query parameter is required");
    };
    let p = super::resolve_path(path, &user.home);
    let (file, len) = match creds::run(Creds::of(&user), move || open_for_download(&p)).await {
        Ok(Ok(f)) => f,
        Ok(Err(UpErr(status, msg))) => return http_error(status, &msg),
        Err(e) => return http_error(500, &e.message),
    };
    // A file the kernel makes as it is read (procfs, sysfs: `/proc/sys/kernel/random/boot_id`
    // reports 0 bytes) is read to its end, as `cat` does, without a length. A truly empty
    // file ends at once.
    let mut r = match len {
        None => Response::new(Body::FileToEof(file)),
        Some(len) => {
            let mut r = Response::new(Body::File {
                file,
                remaining: len,
            });
            r.headers_mut()
                .insert(CONTENT_LENGTH, HeaderValue::from(len));
            r
        }
    };
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    r
}

/// An upload failure.
struct UpErr(u16, String);

fn io_up(e: &std::io::Error, what: &str, p: &Path) -> UpErr {
    match code_of(e) {
        Code::ResourceExhausted => UpErr(
            507,
            format!("not enough disk space to write '{}'", p.display()),
        ),
        c => UpErr(http_status(c), format!("{what} '{}': {e}", p.display())),
    }
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

/// Makes the missing parent directories of `path` as the agent (root in the sandbox), each
/// 0755 and owned by `user`, wherever they are in the sandbox's own filesystem, as E2B's envd
/// makes them: a write to `/0/a.txt` works for `user`. Existing ones are left as they are.
async fn make_parents(path: &Path, user: &User) -> Result<(), UpErr> {
    let Some(parent) = path.parent().map(Path::to_path_buf) else {
        return Ok(());
    };
    let (p, u) = (path.to_path_buf(), user.clone());
    creds::run(None, move || {
        make_dirs(&parent, &u).map_err(|e| io_up(&e, "creating parent directories of", &p))
    })
    .await
    .unwrap_or_else(|e| Err(UpErr(500, e.message)))
}

impl Sink {
    /// Opens `path` for writing as the calling thread's user (its parents exist, see
    /// [`make_parents`]).
    fn open(path: PathBuf, user: &User, gzip: bool) -> Result<Sink, UpErr> {
        if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            return Err(UpErr(
                400,
                format!("path '{}' is a directory", path.display()),
            ));
        }
        // Like `open(O_CREAT)` in the sandbox: a symlink is followed, and a dangling one
        // creates its target when the target's directory exists.
        let f = match std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(match std::fs::read_link(&path) {
                    Ok(target) => UpErr(
                        404,
                        format!(
                            "'{}' is a symbolic link to '{}', whose directory does not exist",
                            path.display(),
                            target.display()
                        ),
                    ),
                    Err(_) => UpErr(
                        404,
                        format!("the directory of '{}' does not exist", path.display()),
                    ),
                })
            }
            Err(e) => return Err(io_up(&e, "opening", &path)),
        };
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
    // The file was written anew: what an earlier write set goes.
    clear_metadata(path).map_err(|e| io_up(&e, "clearing the metadata of", path))?;
    for (k, v) in metadata {
        write_metadata(path, k, v)
            .map_err(|e| io_up(&e, &format!("setting metadata '{k}' on"), path))?;
    }
    Ok(())
}

/// How long a failed upload keeps reading (and discarding) the rest of the request body, so
/// that a client still sending sees the answer instead of a broken connection.
const LINGER: std::time::Duration = std::time::Duration::from_secs(5);

/// Forward the request body's data to the upload. Once the upload stops taking it (it failed
/// and answers), read and discard the rest for at most [`LINGER`], then drop the body, which
/// closes the connection (the error answer says `connection: close`).
fn pump(body: Incoming) -> mpsc::Receiver<Result<Bytes, hyper::Error>> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut body = body;
        loop {
            match body.frame().await {
                None => return,
                Some(Err(e)) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        if tx.send(Ok(d)).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
        let deadline = tokio::time::Instant::now() + LINGER;
        while let Ok(Some(Ok(_))) = tokio::time::timeout_at(deadline, body.frame()).await {}
    });
    rx
}

/// One file being written by a worker thread acting as the user; chunks go through a small
/// queue, so a slow disk slows the client down and never the agent's other work.
struct Writer {
    tx: mpsc::Sender<Bytes>,
    job: tokio::task::JoinHandle<Result<Result<PathBuf, UpErr>, crate::connect::RpcError>>,
}

impl Writer {
    fn start(path: PathBuf, user: &User, gzip: bool, metadata: BTreeMap<String, String>) -> Writer {
        let (tx, mut rx) = mpsc::channel::<Bytes>(4);
        let u = user.clone();
        let creds = Creds::of(user);
        let job = tokio::spawn(async move {
            if let Err(e) = make_parents(&path, &u).await {
                return Ok(Err(e));
            }
            creds::run(creds, move || {
                let mut sink = Sink::open(path, &u, gzip)?;
                while let Some(b) = rx.blocking_recv() {
                    sink.write(&b)?;
                }
                let p = sink.finish()?;
                apply_metadata(&p, &metadata)?;
                Ok(p)
            })
            .await
        });
        Writer { tx, job }
    }

    /// Queue a chunk; `false` when the writer has stopped (its result says why).
    async fn send(&self, b: Bytes) -> bool {
        self.tx.send(b).await.is_ok()
    }

    /// Close the queue and wait for the file to be complete.
    async fn finish(self) -> Result<PathBuf, UpErr> {
        drop(self.tx);
        match self.job.await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(UpErr(500, e.message)),
            Err(e) => Err(UpErr(500, format!("the file writer failed: {e}"))),
        }
    }
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
        Err(UpErr(status, msg)) => {
            // The rest of the body is discarded (for a while) and the connection not reused.
            let mut r = http_error(status, &msg);
            r.headers_mut()
                .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
            r
        }
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
    let mut body = pump(req.into_body());

    if ct.to_ascii_lowercase().starts_with("multipart/form-data") {
        if gzip {
            return Err(UpErr(
                400,
                "gzip content-encoding is only supported for octet-stream uploads".into(),
            ));
        }
        let boundary = multer::parse_boundary(&ct)
            .map_err(|e| UpErr(400, format!("bad multipart content-type: {e}")))?;
        let stream = futures::stream::poll_fn(move |cx| body.poll_recv(cx));
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
            let w = Writer::start(path, user, false, metadata.clone());
            let mut field = field;
            let mut broken = None;
            loop {
                match field.chunk().await {
                    Ok(Some(c)) => {
                        if !w.send(c).await {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        broken = Some(UpErr(400, format!("reading part for '{target}': {e}")));
                        break;
                    }
                }
            }
            let p = w.finish().await?;
            if let Some(e) = broken {
                return Err(e);
            }
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
    let w = Writer::start(path, user, gzip, metadata.clone());
    let mut broken = None;
    while let Some(chunk) = body.recv().await {
        match chunk {
            Ok(d) => {
                if !w.send(d).await {
                    break;
                }
            }
            Err(e) => {
                broken = Some(UpErr(400, format!("reading body: {e}")));
                break;
            }
        }
    }
    let p = w.finish().await?;
    if let Some(e) = broken {
        return Err(e);
    }
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
        assert_eq!(
            parse_query("a=%+F&b=%-1"),
            vec![("a".into(), "% F".into()), ("b".into(), "%-1".into())]
        );
    }
}
