//! E2B's template API (`Template().build()`, `Template.exists`, tags, list, delete) on
//! Rampart's template builder (core's [`rampart_core::template_builds`], `rampart-image`): the
//! same builder, cache and store as `rampart template build`.
//!
//! - `POST /v3/templates` reserves a build of `name[:tag]` (+ `tags`); the template id is the
//!   name. `GET /templates/{id}/files/{hash}` answers `present`, or an upload link the daemon
//!   serves itself (`PUT /e2b/uploads/{token}`, one use, an hour). `POST /v2/templates/{id}/
//!   builds/{bid}` translates the SDK's steps into a build plan and starts it;
//!   `GET /templates/{id}/builds/{bid}/status` (and `/logs`) give its status and log;
//!   `DELETE /v2/templates/{id}/builds/{bid}` cancels it (Rampart's: E2B has no cancel).
//! - Limits (core's `BuildConfig`): a tenant's reservations and started builds are capped
//!   (429 with the reason), reservations not started expire, steps and builds time out
//!   (the build ends `error` with the reason), tenants' builds take the build slot in turn.
//! - Bases: `fromTemplate` (`base`, or any built template or `name:tag`), `fromImage`
//!   `e2bdev/base` (the built-in `base`) or `debian:SUITE` (mmdebstrap from deb.debian.org,
//!   with E2B's `user` account added); any other image is refused with the reason (nothing
//!   is pulled from a registry).
//! - Steps: `RUN` (as its user), `COPY` (uploaded archive, Docker's placement, owner, mode,
//!   symlinks kept as links), `ENV`, `WORKDIR` (made if missing), `USER`; `startCmd` and
//!   `readyCmd` become the template's start command and readiness check (run at each create).

use super::wire::parse_body;
use super::{E2b, E2bError, ENVD_VERSION};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt as _;
use rampart_core::template_builds::{BuildInfo, BuildPlan, LogEntry, PlanStep};
use rampart_core::templates::{Access, TemplateRef};
use rampart_core::Principal;
use rampart_image::credentials::Credentials;
use rampart_image::ecr::AwsKeys;
use rampart_image::reference::ImageRef;
use rampart_image::registry::RegistryAuth;
use rampart_image::spec::{Base, BuildNetwork, Ready, StartSpec, Variant};
use rampart_image::{Step, Store};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use tokio::io::AsyncWriteExt as _;

/// The template of E2B's `base` (and of an empty template id).
pub(super) const BASE: &str = "base";
/// The template of E2B's code interpreter (`e2b-code-interpreter`'s default).
pub(super) const CODE_INTERPRETER: &str = "code-interpreter-v1";

/// Maps an E2B template id to a Rampart template.
pub(super) fn template_of(name: &str) -> Result<&'static str, E2bError> {
    match name {
        "" | "base" | "rampart" => Ok(BASE),
        "code-interpreter-v1" | "code-interpreter" | "code-interpreter-stateful" => {
            Ok(CODE_INTERPRETER)
        }
        other => Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!(
                "template \"{other}\" not found: this server has the \"base\" and \
                 \"code-interpreter-v1\" templates"
            ),
        )),
    }
}

/// Most log entries of one status answer (the SDK drains the rest).
const STATUS_LOG_PAGE: usize = 100;
/// How long a create waits for a template's ready command, seconds.
const READY_TIMEOUT_SECS: u64 = 120;
/// The `user` account E2B's templates have (uid 1000, passwordless sudo, `/home/user`).
const E2B_USER: &str = "user";
/// Packages a `debian:` base gets besides mmdebstrap's: what E2B's provisioning and its ready
/// checks use (`sudo`, `ss`, `pgrep`, `curl`).
const DEBIAN_PACKAGES: &[&str] = &["sudo", "iproute2", "procps", "curl", "ca-certificates"];

fn not_found_template(id: &str) -> E2bError {
    E2bError::new(
        StatusCode::NOT_FOUND,
        format!("template \"{id}\" not found"),
    )
}

fn store(st: &E2b) -> Option<Store> {
    st.manager.template_store()
}

/// The one resolution of a template name for the request's caller (core's
/// `templates::lookup`: a tenant's own, the operator's, a built-in; another tenant's is not
/// found).
fn resolve(st: &E2b, who: &Principal, name: &str, access: Access) -> Result<TemplateRef, E2bError> {
    st.manager
        .template_ref(who, name, access)
        .map_err(|e| match e {
            rampart_core::CoreError::NoTemplate(_) => not_found_template(name),
            other => E2bError::from(other),
        })
}

/// The build `bid` of template `id` if the caller may see it (core's `TemplateBuilds::get`
/// checks the owner; `id` is the name its owner knows it by, or for the node the stored
/// name).
fn build_of(st: &E2b, who: &Principal, id: &str, bid: &str) -> Result<BuildInfo, E2bError> {
    let id = split_name(id).0;
    st.manager
        .template_builds()
        .get(who.tenant.as_deref(), bid)
        // The node may also name a tenant's template as stored (`<tenant>~<name>`); for a
        // tenant, `get` already answered only its own builds.
        .filter(|i| i.name == id || i.stored == id)
        .ok_or_else(|| not_found_build(id, bid))
}

/// A UUID for a template id made without an API build (`rampart template build`).
fn uuid_of(id: &str) -> String {
    let h: String = id.chars().chain(std::iter::repeat('0')).take(32).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Splits `name[:tag]`.
fn split_name(n: &str) -> (&str, Option<&str>) {
    match n.split_once(':') {
        Some((a, b)) => (a, Some(b)),
        None => (n, None),
    }
}

#[derive(Debug, Default, Deserialize)]
struct RequestV3 {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    alias: Option<String>,
    #[serde(default)]
    tags: Option<Vec<String>>,
}

/// `POST /v3/templates`: 202 `TemplateRequestResponseV3`.
pub(crate) async fn request_build(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    body: Bytes,
) -> Result<Response, E2bError> {
    let r: RequestV3 = parse_body(&body)?;
    let full = r
        .name
        .or(r.alias)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| E2bError::bad_request("name: a template build needs a name"))?;
    let (name, tag) = split_name(&full);
    let mut tags: Vec<String> = tag.into_iter().map(str::to_owned).collect();
    for t in r.tags.unwrap_or_default() {
        if !tags.contains(&t) {
            tags.push(t);
        }
    }
    if tags.is_empty() {
        tags.push(rampart_image::DEFAULT_TAG.to_owned());
    }
    let t = resolve(&st, &who, name, Access::Write)?;
    let info = st
        .manager
        .template_builds()
        .reserve(who.tenant.as_deref(), &t, &tags)
        .map_err(E2bError::from)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "templateID": info.name,
            "buildID": info.build_id,
            "public": false,
            "names": [info.name],
            "aliases": [info.name],
            "tags": info.tags,
        })),
    )
        .into_response())
}

/// `GET /templates/{id}/files/{hash}`: 201 `TemplateBuildFileUpload`.
pub(crate) async fn file_upload_link(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path((id, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, E2bError> {
    // Files are uploaded for a build of one's own template; the hash's presence and the
    // link are of the caller's uploads only.
    resolve(&st, &who, split_name(&id).0, Access::Write)?;
    let b = st.manager.template_builds();
    if !rampart_core::template_builds::is_files_hash(&hash) {
        return Err(E2bError::bad_request(format!(
            "hash {hash:?}: expected the SDK's files hash (64 hex digits)"
        )));
    }
    let hash = hash.to_ascii_lowercase();
    let present = b.has_upload(who.tenant.as_deref(), &hash);
    // A link even when present: the SDK uploads again with `force_upload`.
    let token = b.upload_token(who.tenant.as_deref(), &hash)?;
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .ok_or_else(|| E2bError::bad_request("the request has no Host header"))?;
    let scheme = if st.tls {
        "https"
    } else {
        headers
            .get("x-forwarded-proto")
            .and_then(|h| h.to_str().ok())
            .filter(|p| *p == "https")
            .unwrap_or("http")
    };
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "present": present,
            "url": format!("{scheme}://{host}/e2b/uploads/{token}"),
        })),
    )
        .into_response())
}

/// `PUT /e2b/uploads/{token}`: stores the archive of the token's hash (the token is the
/// authorization, as a presigned URL's signature is; one use).
pub(crate) async fn upload(
    State(st): State<E2b>,
    Path(token): Path<String>,
    body: Body,
) -> Result<Response, E2bError> {
    let b = st.manager.template_builds().clone();
    let ticket = b.take_upload(&token).ok_or_else(|| {
        E2bError::new(
            StatusCode::FORBIDDEN,
            "this upload link is unknown, used or expired: ask for a new one",
        )
    })?;
    // Bounded by what the owner's disk quota and the host's disk have left.
    let mut bound = st.manager.begin_upload(&ticket).await?;
    let tmp = b.upload_tmp(&ticket)?;
    let r = async {
        let mut f = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .await
            .map_err(|e| E2bError::internal(format!("creating the upload: {e}")))?;
        let mut n: u64 = 0;
        let mut s = body.into_data_stream();
        while let Some(chunk) = s.next().await {
            let chunk =
                chunk.map_err(|e| E2bError::bad_request(format!("reading the upload: {e}")))?;
            n += chunk.len() as u64;
            if n > rampart_core::template_builds::MAX_UPLOAD_BYTES {
                return Err(E2bError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "the upload is larger than {} bytes",
                        rampart_core::template_builds::MAX_UPLOAD_BYTES
                    ),
                ));
            }
            bound.take(chunk.len() as u64)?;
            f.write_all(&chunk)
                .await
                .map_err(|e| E2bError::internal(format!("writing the upload: {e}")))?;
        }
        f.sync_all()
            .await
            .map_err(|e| E2bError::internal(format!("writing the upload: {e}")))?;
        if n == 0 {
            return Err(E2bError::bad_request("the upload is empty"));
        }
        b.commit_upload(&tmp, &ticket).map_err(E2bError::from)
    }
    .await;
    if r.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    drop(bound);
    r?;
    Ok(StatusCode::OK.into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartV2 {
    #[serde(default)]
    from_image: Option<String>,
    #[serde(default)]
    from_template: Option<String>,
    #[serde(default)]
    from_image_registry: Option<Value>,
    #[serde(default)]
    force: Option<bool>,
    #[serde(default)]
    steps: Option<Vec<StepV2>>,
    #[serde(default)]
    start_cmd: Option<String>,
    #[serde(default)]
    ready_cmd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StepV2 {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Option<Vec<String>>,
    #[serde(default)]
    files_hash: Option<String>,
    #[serde(default)]
    force: Option<bool>,
}

/// A path made absolute against `cwd` and normalized (`.`, `..`, repeated `/`), keeping a
/// trailing `/`.
fn absolute(cwd: &str, p: &str) -> String {
    let joined = if p.starts_with('/') {
        p.to_owned()
    } else {
        format!("{}/{p}", cwd.trim_end_matches('/'))
    };
    let mut out: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    let mut s = format!("/{}", out.join("/"));
    if (p.ends_with('/') || p.ends_with("/.")) && s != "/" {
        s.push('/');
    }
    s
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Plan steps, each with the SDK step name it reports.
type Steps = Vec<(PlanStep, Option<String>)>;

/// What a build step needs of the image so far.
struct Cursor {
    user: String,
    workdir: String,
}

/// The base of an E2B build, the metadata it starts with, the steps it adds first and the
/// credentials of its registry.
type BaseOf = (Base, Cursor, Steps, Option<RegistryAuth>);

fn base_of(st: &E2b, who: &Principal, t: &StartV2) -> Result<BaseOf, E2bError> {
    let builtin = |name: &str| {
        (
            Base::Template(name.to_owned()),
            Cursor {
                user: E2B_USER.into(),
                workdir: format!("/home/{E2B_USER}"),
            },
            Vec::new(),
            None,
        )
    };
    if let Some(tpl) = t.from_template.as_deref().filter(|s| !s.is_empty()) {
        return match tpl {
            "base" | "rampart" => Ok(builtin(rampart_image::build::BUILTIN_BASE)),
            // The code interpreter's template: its sandboxes start the interpreter's server,
            // and so do those of a template built on it.
            "code-interpreter-v1" | "code-interpreter" => Ok(builtin(CODE_INTERPRETER)),
            other => {
                let unknown = || {
                    E2bError::bad_request(format!("fromTemplate: template \"{other}\" not found"))
                };
                let r = resolve(st, who, other, Access::Read).map_err(|_| unknown())?;
                let s = store(st).ok_or_else(unknown)?;
                let (_, m) = s.resolve(&r.stored_ref()).map_err(|_| unknown())?;
                let user = m.config.user.clone().unwrap_or_else(|| "root".into());
                let workdir = m.config.workdir.clone().unwrap_or_else(|| "/".into());
                Ok((
                    Base::Template(r.stored_ref()),
                    Cursor { user, workdir },
                    Vec::new(),
                    None,
                ))
            }
        };
    }
    let image = t
        .from_image
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| E2bError::bad_request("the build names no fromImage or fromTemplate"))?;
    let bare = image
        .trim_start_matches("docker.io/")
        .trim_start_matches("library/");
    let (repo, tag) = match bare.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, t),
        _ => (bare, "latest"),
    };
    if repo == "e2bdev/base" {
        return Ok(builtin(rampart_image::build::BUILTIN_BASE));
    }
    if repo == "e2bdev/code-interpreter" {
        return Ok(builtin(CODE_INTERPRETER));
    }
    let refuse = |why: &str| E2bError::bad_request(format!("fromImage {image:?}: {why}"));
    if repo != "debian" || image.contains('@') {
        // Any other image is pulled from its registry (or the operator's mirror of it).
        let r = ImageRef::parse(image).map_err(|e| E2bError::bad_request(e.to_string()))?;
        let creds = registry_credentials(t.from_image_registry.as_ref())?;
        return Ok((
            Base::Image(r),
            Cursor {
                user: E2B_USER.into(),
                workdir: format!("/home/{E2B_USER}"),
            },
            e2b_account_steps(image_account_cmd()),
            creds,
        ));
    }
    if t.from_image_registry.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(refuse(
            "registry credentials are of no use for debian images, which are made with \
             mmdebstrap from deb.debian.org",
        ));
    }
    let (suite, variant) = match tag.strip_suffix("-slim") {
        Some(s) => (s, Variant::Minbase),
        None => (tag, Variant::Apt),
    };
    let suite = match suite {
        "latest" => "stable",
        "11" => "bullseye",
        "12" => "bookworm",
        "13" => "trixie",
        s => s,
    };
    if suite.is_empty() || !suite.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
        return Err(refuse(&format!("{suite:?} is not a Debian suite")));
    }
    Ok((
        Base::Debian {
            suite: suite.to_owned(),
            variant,
            packages: DEBIAN_PACKAGES.iter().map(|s| (*s).to_owned()).collect(),
            mirror: rampart_image::spec::DEFAULT_MIRROR.to_owned(),
        },
        Cursor {
            user: E2B_USER.into(),
            workdir: format!("/home/{E2B_USER}"),
        },
        e2b_account_steps(format!(
            "set -e; if ! id -u {u} >/dev/null 2>&1; then \
             if getent passwd 1000 >/dev/null; then useradd -m -s /bin/bash {u}; \
             else useradd -m -s /bin/bash -u 1000 {u}; fi; fi; \
             mkdir -p /etc/sudoers.d; echo '{u} ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/{u}; \
             chmod 0440 /etc/sudoers.d/{u}",
            u = E2B_USER
        )),
        None,
    ))
}

/// The steps that give an image E2B's `user` account (made by `cmd`, as root), then make it
/// the user and its home the working directory.
fn e2b_account_steps(cmd: String) -> Steps {
    let base = || Some("base".to_owned());
    vec![
        (
            PlanStep::Step(Step::Run {
                cmd,
                user: Some("root".into()),
            }),
            base(),
        ),
        (PlanStep::Step(Step::User(E2B_USER.into())), base()),
        (
            PlanStep::Step(Step::Workdir(format!("/home/{E2B_USER}"))),
            base(),
        ),
    ]
}

/// E2B's `user` account in a pulled image, whatever its tools: `useradd` (Debian, Ubuntu,
/// Fedora) or BusyBox's `adduser` (Alpine); passwordless sudo when the image has sudo; its
/// shell bash when there is one.
fn image_account_cmd() -> String {
    format!(
        "set -e; u={u}; sh=/bin/sh; if [ -x /bin/bash ]; then sh=/bin/bash; fi; \
         if ! id -u $u >/dev/null 2>&1; then \
         if command -v useradd >/dev/null 2>&1; then \
         if command -v getent >/dev/null 2>&1 && getent passwd 1000 >/dev/null; then \
         useradd -m -s $sh $u; else useradd -m -s $sh -u 1000 $u; fi; \
         elif command -v adduser >/dev/null 2>&1; then adduser -D -s $sh -u 1000 $u || adduser -D -s $sh $u; \
         else echo \"the image has no useradd or adduser to make the account $u\" >&2; exit 1; fi; fi; \
         if [ ! -d /home/$u ]; then mkdir -p /home/$u; chown $u /home/$u 2>/dev/null || true; fi; \
         if command -v sudo >/dev/null 2>&1; then mkdir -p /etc/sudoers.d; \
         echo \"$u ALL=(ALL:ALL) NOPASSWD: ALL\" > /etc/sudoers.d/$u; chmod 0440 /etc/sudoers.d/$u; fi",
        u = E2B_USER
    )
}

/// The registry login of an E2B build (`fromImageRegistry`): `registry` (a user and
/// password, `from_image(image, username, password)`), `gcp` (a service account's JSON key,
/// sent as GCP registries take it: user `_json_key`), `aws` (an access key, exchanged for an
/// ECR login with ECR's `GetAuthorizationToken`).
fn registry_credentials(v: Option<&Value>) -> Result<Option<RegistryAuth>, E2bError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let field = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let login = |username: String, password: String| {
        Ok(Some(RegistryAuth::Login(Credentials {
            username,
            password,
        })))
    };
    let missing = |what: &str| E2bError::bad_request(format!("fromImageRegistry: {what}"));
    match field("type").as_deref() {
        Some("registry") => match (field("username"), field("password")) {
            (Some(u), Some(p)) => login(u, p),
            _ => Err(missing("a registry login needs a username and a password")),
        },
        Some("gcp") => match field("serviceAccountJson") {
            Some(j) => login("_json_key".into(), j),
            None => Err(missing("a gcp login needs serviceAccountJson")),
        },
        Some("aws") => match (
            field("awsAccessKeyId"),
            field("awsSecretAccessKey"),
            field("awsRegion"),
        ) {
            (Some(access_key_id), Some(secret_access_key), Some(region)) => {
                let keys = AwsKeys {
                    access_key_id,
                    secret_access_key,
                    region,
                };
                keys.check()
                    .map_err(|e| E2bError::bad_request(format!("fromImageRegistry: {e}")))?;
                Ok(Some(RegistryAuth::Aws(keys)))
            }
            _ => Err(missing(
                "an aws login needs awsAccessKeyId, awsSecretAccessKey and awsRegion",
            )),
        },
        o => Err(missing(&format!(
            "unknown type {o:?} (expected registry, gcp or aws)"
        ))),
    }
}

/// The build plan of an E2B `TemplateBuildStartV2`.
fn plan_of(st: &E2b, who: &Principal, t: StartV2) -> Result<BuildPlan, E2bError> {
    let (from, mut cur, mut steps, registry_auth) = base_of(st, who, &t)?;
    let mut no_cache_from = None;
    let bad = |i: usize, m: String| E2bError::bad_request(format!("steps[{i}]: {m}"));
    for (i, s) in t.steps.unwrap_or_default().into_iter().enumerate() {
        let n = i + 1;
        let name = Some(n.to_string());
        let args = s.args.unwrap_or_default();
        if args.iter().any(|a| a.contains('\0')) {
            return Err(bad(n, "an argument contains NUL".into()));
        }
        if s.force == Some(true) && no_cache_from.is_none() {
            no_cache_from = Some(steps.len() + 1);
        }
        match s.kind.as_str() {
            "RUN" => {
                let cmd = args
                    .first()
                    .filter(|c| !c.trim().is_empty())
                    .ok_or_else(|| bad(n, "RUN needs a command".into()))?;
                let user = args.get(1).filter(|u| !u.is_empty()).cloned();
                if let Some(u) = &user {
                    rampart_image::spec::check_user("user", u)
                        .map_err(|e| bad(n, e.to_string()))?;
                }
                steps.push((
                    PlanStep::Step(Step::Run {
                        cmd: cmd.clone(),
                        user,
                    }),
                    name,
                ));
            }
            "ENV" => {
                if args.len() % 2 != 0 {
                    return Err(bad(n, "ENV needs name/value pairs".into()));
                }
                let mut m = BTreeMap::new();
                for kv in args.chunks(2) {
                    if kv[0].is_empty() || kv[0].contains('=') {
                        return Err(bad(n, format!("{:?} is not a variable name", kv[0])));
                    }
                    m.insert(kv[0].clone(), kv[1].clone());
                }
                steps.push((PlanStep::Step(Step::Env(m)), name));
            }
            "WORKDIR" => {
                let w = args
                    .first()
                    .filter(|w| !w.is_empty())
                    .ok_or_else(|| bad(n, "WORKDIR needs a path".into()))?;
                let w = absolute(&cur.workdir, w).trim_end_matches('/').to_owned();
                let w = if w.is_empty() { "/".to_owned() } else { w };
                if w != "/" {
                    // As Docker's WORKDIR: made if missing (owned by the user so far).
                    let mut cmd = format!("[ -d {q} ] || mkdir -p {q}", q = sh_quote(&w));
                    if cur.user != "root" {
                        cmd = format!(
                            "[ -d {q} ] || {{ mkdir -p {q} && chown {u} {q}; }}",
                            q = sh_quote(&w),
                            u = sh_quote(&cur.user)
                        );
                    }
                    steps.push((
                        PlanStep::Step(Step::Run {
                            cmd,
                            user: Some("root".into()),
                        }),
                        name.clone(),
                    ));
                }
                cur.workdir = w.clone();
                steps.push((PlanStep::Step(Step::Workdir(w)), name));
            }
            "USER" => {
                let u = args
                    .first()
                    .map(|u| split_name(u).0.to_owned())
                    .filter(|u| !u.is_empty())
                    .ok_or_else(|| bad(n, "USER needs a user".into()))?;
                rampart_image::spec::check_user("user", &u).map_err(|e| bad(n, e.to_string()))?;
                cur.user = u.clone();
                steps.push((PlanStep::Step(Step::User(u)), name));
            }
            "COPY" => {
                let hash = s
                    .files_hash
                    .filter(|h| rampart_core::template_builds::is_files_hash(h))
                    .ok_or_else(|| bad(n, "COPY needs the files' filesHash".into()))?
                    .to_ascii_lowercase();
                let dest = args
                    .get(1)
                    .filter(|d| !d.is_empty())
                    .ok_or_else(|| bad(n, "COPY needs a destination".into()))?;
                let owner = match args.get(2).filter(|u| !u.is_empty()) {
                    Some(o) => Some(o.clone()),
                    // E2B: files belong to the template's user so far.
                    None => (cur.user != "root").then(|| cur.user.clone()),
                };
                if let Some(o) = &owner {
                    rampart_image::spec::check_owner("user", o)
                        .map_err(|e| bad(n, e.to_string()))?;
                }
                let mode = match args.get(3).filter(|m| !m.is_empty()) {
                    Some(m) => Some(
                        rampart_image::spec::parse_mode(m)
                            .ok_or_else(|| bad(n, format!("{m:?} is not an octal mode")))?,
                    ),
                    None => None,
                };
                steps.push((
                    PlanStep::CopyUpload {
                        hash,
                        dest: absolute(&cur.workdir, dest),
                        owner,
                        mode,
                    },
                    name,
                ));
            }
            other => {
                return Err(bad(
                    n,
                    format!("unknown step type {other:?} (expected RUN, COPY, ENV, WORKDIR, USER)"),
                ))
            }
        }
    }
    let start = match (&t.start_cmd, &t.ready_cmd) {
        (None, None) => None,
        (s, r) => Some(StartSpec {
            cmd: s
                .iter()
                .filter(|s| !s.trim().is_empty())
                .map(|s| vec!["/bin/sh".to_owned(), "-c".to_owned(), s.clone()])
                .next()
                .unwrap_or_default(),
            ready: r
                .as_ref()
                .filter(|r| !r.trim().is_empty())
                .map(|r| Ready::Cmd(r.clone())),
            timeout_secs: READY_TIMEOUT_SECS,
        }),
    };
    Ok(BuildPlan {
        from,
        steps,
        start,
        network: BuildNetwork::Registries,
        no_cache: t.force == Some(true),
        no_cache_from,
        registry_auth,
    })
}

/// `POST /v2/templates/{id}/builds/{bid}`: 202; the build runs in the background.
pub(crate) async fn start_build(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path((id, bid)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let t: StartV2 = parse_body(&body)?;
    let b = st.manager.template_builds();
    let info = build_of(&st, &who, &id, &bid)?;
    let plan = plan_of(&st, &who, t)?;
    b.start(who.tenant.as_deref(), &info.build_id, plan)?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// `DELETE /v2/templates/{id}/builds/{bid}`: cancels a build (Rampart's; E2B's API has no
/// cancel): 202 with `{templateID, buildID, status}` (a reservation or a queued build is
/// `error` at once; a running one is stopped, its build sandbox killed, and ends `error`
/// with the reason `cancelled by the API` shortly after: poll the status); 404 for a build
/// the caller cannot see; 409 for one already ended.
pub(crate) async fn cancel_build(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path((id, bid)): Path<(String, String)>,
) -> Result<Response, E2bError> {
    let info = build_of(&st, &who, &id, &bid)?;
    let info = st
        .manager
        .template_builds()
        .cancel(who.tenant.as_deref(), &info.build_id)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "templateID": info.name,
            "buildID": info.build_id,
            "status": info.status.as_str(),
        })),
    )
        .into_response())
}

fn not_found_build(id: &str, bid: &str) -> E2bError {
    E2bError::new(
        StatusCode::NOT_FOUND,
        format!("build \"{bid}\" of template \"{id}\" not found"),
    )
}

fn level_rank(l: &str) -> u8 {
    match l {
        "debug" => 0,
        "info" => 1,
        "warn" => 2,
        _ => 3,
    }
}

fn entry_json(e: &LogEntry) -> Value {
    let mut v = json!({"timestamp": e.timestamp, "level": e.level, "message": e.message});
    if let Some(s) = &e.step {
        v["step"] = json!(s);
    }
    v
}

/// `GET /templates/{id}/builds/{bid}/status?logsOffset&limit&level`: 200 `TemplateBuildInfo`.
pub(crate) async fn build_status(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path((id, bid)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, E2bError> {
    let b = st.manager.template_builds();
    let info = build_of(&st, &who, &id, &bid)?;
    let offset: usize = q
        .get("logsOffset")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let limit = q
        .get("limit")
        .and_then(|v| v.parse().ok())
        .unwrap_or(STATUS_LOG_PAGE)
        .min(STATUS_LOG_PAGE);
    let min = q.get("level").map(|l| level_rank(l)).unwrap_or(0);
    let entries: Vec<Value> = b
        .logs(who.tenant.as_deref(), &bid, offset, limit)
        .unwrap_or_default()
        .iter()
        .filter(|e| level_rank(e.level) >= min)
        .map(entry_json)
        .collect();
    let mut v = json!({
        "templateID": info.name,
        "buildID": info.build_id,
        "status": info.status.as_str(),
        "logs": [],
        "logEntries": entries,
    });
    if let Some((message, step)) = &info.reason {
        v["reason"] = json!({"message": message});
        if let Some(s) = step {
            v["reason"]["step"] = json!(s);
        }
    }
    Ok(Json(v).into_response())
}

/// `GET /templates/{id}/builds/{bid}/logs?cursor&limit&direction&level`: 200 `{logs}`.
pub(crate) async fn build_logs(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path((id, bid)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, E2bError> {
    let b = st.manager.template_builds();
    build_of(&st, &who, &id, &bid)?;
    let limit: usize = q
        .get("limit")
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
        .min(1000);
    let min = q.get("level").map(|l| level_rank(l)).unwrap_or(0);
    // The cursor is a time in ms since the epoch (entries at or after it).
    let cursor_ms: Option<i128> = q.get("cursor").and_then(|v| v.parse().ok());
    let backward = q.get("direction").is_some_and(|d| d == "backward");
    let ms = |ts: &str| {
        time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339)
            .map(|t| t.unix_timestamp_nanos() / 1_000_000)
            .unwrap_or(0)
    };
    // Read from the build's log file as it goes: forward, the first `limit` entries that
    // match; backward, the last `limit` (a ring of them), newest first.
    let mut kept: std::collections::VecDeque<LogEntry> = std::collections::VecDeque::new();
    b.scan_logs(who.tenant.as_deref(), &bid, &mut |e| {
        let matches = level_rank(e.level) >= min
            && match cursor_ms {
                Some(c) if backward => ms(&e.timestamp) <= c,
                Some(c) => ms(&e.timestamp) >= c,
                None => true,
            };
        if matches {
            kept.push_back(e);
            if kept.len() > limit {
                if backward {
                    kept.pop_front();
                } else {
                    kept.pop_back();
                    return false;
                }
            }
        }
        true
    });
    if backward {
        kept = kept.into_iter().rev().collect();
    }
    let logs: Vec<Value> = kept.iter().take(limit).map(entry_json).collect();
    Ok(Json(json!({ "logs": logs })).into_response())
}

/// `GET /templates/aliases/{alias}`: 200 `{templateID, public}`, 404 when unknown (or
/// another tenant's). The built-in templates answer under every name E2B's SDKs use for
/// them (`base`, `code-interpreter-v1` and their aliases, see [`template_of`]): they exist
/// for every caller, without a build in the store.
pub(crate) async fn alias(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(alias): Path<String>,
) -> Result<Response, E2bError> {
    if let Ok(builtin) = template_of(&alias) {
        return Ok(Json(json!({"templateID": builtin, "public": true})).into_response());
    }
    let found = resolve(&st, &who, &alias, Access::Read)
        .ok()
        .filter(|r| store(&st).is_some_and(|s| s.name(&r.stored_ref()).is_some()));
    match found {
        Some(r) => Ok(Json(json!({"templateID": r.name, "public": is_public(&r)})).into_response()),
        None => Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("template alias \"{alias}\" not found"),
        )),
    }
}

/// Whether every tenant sees it (a built-in or the operator's template).
fn is_public(r: &TemplateRef) -> bool {
    r.tenant().is_none()
}

/// The built templates the caller sees (tags folded into their template), by the names it
/// knows them by: each name found in the store is resolved as the caller would name it, and
/// kept only if it resolves back to itself (so a tenant's own template hides the
/// operator's of the same name, and another tenant's never shows).
fn visible_templates(st: &E2b, who: &Principal, s: &Store) -> Vec<TemplateRef> {
    let mut stored: Vec<String> = s
        .list()
        .into_iter()
        .map(|t| split_name(&t.name).0.to_owned())
        .collect();
    stored.sort();
    stored.dedup();
    let mut out: Vec<TemplateRef> = stored
        .iter()
        .filter_map(|n| {
            let shown = st.manager.template_visible_name(who, n)?;
            let r = st.manager.template_ref(who, &shown, Access::Read).ok()?;
            (r.stored == *n).then_some(r)
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn template_json(st: &E2b, who: &Principal, s: &Store, t: &TemplateRef) -> Option<Value> {
    let tags = s.tags(&t.stored);
    let (_, rec) = tags
        .iter()
        .find(|(t, _)| t == rampart_image::DEFAULT_TAG)
        .or_else(|| tags.first())?;
    let created = tags
        .iter()
        .map(|(_, r)| r.created_at.clone())
        .min()
        .unwrap_or_default();
    let updated = tags
        .iter()
        .map(|(_, r)| r.created_at.clone())
        .max()
        .unwrap_or_default();
    let l = st.manager.default_limits();
    let builds = st
        .manager
        .template_builds()
        .of_template(who.tenant.as_deref(), t)
        .len()
        .max(1);
    let name = &t.name;
    Some(json!({
        "templateID": name,
        "buildID": rec.build.clone().unwrap_or_else(|| uuid_of(&rec.id)),
        "cpuCount": l.cpus.ceil().max(1.0) as u64,
        "memoryMB": l.memory_bytes >> 20,
        "diskSizeMB": l.disk_bytes >> 20,
        "public": is_public(t),
        "aliases": [name],
        "names": [name],
        "createdAt": created,
        "updatedAt": updated,
        "createdBy": null,
        "lastSpawnedAt": null,
        "spawnCount": 0,
        "buildCount": builds,
        "envdVersion": ENVD_VERSION,
        "buildStatus": "ready",
    }))
}

/// `GET /templates`, `GET /v2/templates`: the built templates the caller sees.
pub(crate) async fn list(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
) -> Result<Response, E2bError> {
    let Some(s) = store(&st) else {
        return Ok(Json(json!([])).into_response());
    };
    let v: Vec<Value> = visible_templates(&st, &who, &s)
        .iter()
        .filter_map(|t| template_json(&st, &who, &s, t))
        .collect();
    Ok(Json(v).into_response())
}

/// `GET /templates/{id}`: the template with its builds (a tenant sees the builds it made,
/// none of the operator's).
pub(crate) async fn get_one(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let t = resolve(&st, &who, split_name(&id).0, Access::Read)?;
    let s = store(&st).ok_or_else(|| not_found_template(&id))?;
    let mut v = template_json(&st, &who, &s, &t).ok_or_else(|| not_found_template(&id))?;
    let l = st.manager.default_limits();
    let builds: Vec<Value> = st
        .manager
        .template_builds()
        .of_template(who.tenant.as_deref(), &t)
        .iter()
        .map(|b| {
            json!({
                "buildID": b.build_id,
                "status": b.status.as_str(),
                "createdAt": b.created_at,
                "updatedAt": b.finished_at.clone().unwrap_or_else(|| b.created_at.clone()),
                "finishedAt": b.finished_at,
                "cpuCount": l.cpus.ceil().max(1.0) as u64,
                "memoryMB": l.memory_bytes >> 20,
                "envdVersion": ENVD_VERSION,
            })
        })
        .collect();
    v["builds"] = json!(builds);
    Ok(Json(v).into_response())
}

/// `DELETE /templates/{id}`: removes the template's name and every tag (layers stay until
/// `rampart template gc`); 204, 404 when unknown (or another tenant's), 403 for a built-in
/// template or, for a tenant, the operator's.
pub(crate) async fn delete(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    if rampart_image::RESERVED_NAMES.contains(&id.as_str()) {
        return Err(E2bError::new(
            StatusCode::FORBIDDEN,
            format!("template \"{id}\" is built in and cannot be deleted"),
        ));
    }
    let (name, tag) = split_name(&id);
    let t = match st.manager.template_ref(&who, name, Access::Write) {
        Ok(t) => t,
        // A name no template can have names nothing to delete (E2B answers 404: the SDK's
        // `delete_snapshot` then says False).
        Err(
            rampart_core::CoreError::BadRequest { .. } | rampart_core::CoreError::NoTemplate(_),
        ) => return Err(not_found_template(&id)),
        Err(e) => return Err(e.into()),
    };
    let s = store(&st).ok_or_else(|| not_found_template(&id))?;
    let refs: Vec<String> = match tag {
        Some(tag) => vec![t.stored_tag(Some(tag))],
        None => s
            .tags(&t.stored)
            .into_iter()
            .map(|(tag, _)| t.stored_tag(Some(&tag)))
            .collect(),
    };
    if refs.is_empty() || s.name(&refs[0]).is_none() {
        return Err(not_found_template(&id));
    }
    tokio::task::spawn_blocking(move || -> Result<(), E2bError> {
        for r in refs {
            s.remove(&r)
                .map_err(|e| E2bError::internal(format!("removing {r}: {e}")))?;
        }
        Ok(())
    })
    .await
    .map_err(|e| E2bError::internal(e.to_string()))??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
struct AssignTags {
    #[serde(default)]
    target: String,
    #[serde(default)]
    tags: Vec<String>,
}

/// `POST /templates/tags` `{target: "name:tag", tags}`: 201 `{tags, buildID}`; only the
/// template's owner tags it.
pub(crate) async fn assign_tags(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    body: Bytes,
) -> Result<Response, E2bError> {
    let a: AssignTags = parse_body(&body)?;
    if a.tags.is_empty() {
        return Err(E2bError::bad_request("tags: give at least one tag"));
    }
    for t in &a.tags {
        rampart_image::check_tag(t).map_err(E2bError::bad_request)?;
    }
    let t = resolve(&st, &who, &a.target, Access::Write)?;
    let s = store(&st).ok_or_else(|| not_found_template(&a.target))?;
    let rec = s
        .name(&t.stored_ref())
        .ok_or_else(|| not_found_template(&a.target))?;
    let build = rec.build.clone().unwrap_or_else(|| uuid_of(&rec.id));
    for tag in &a.tags {
        s.tag_build(&t.stored_tag(Some(tag)), &rec.id, rec.build.as_deref())
            .map_err(|e| E2bError::bad_request(e.to_string()))?;
    }
    Ok((
        StatusCode::CREATED,
        Json(json!({"tags": a.tags, "buildID": build})),
    )
        .into_response())
}

#[derive(Debug, Default, Deserialize)]
struct DeleteTags {
    #[serde(default)]
    name: String,
    #[serde(default)]
    tags: Vec<String>,
}

/// `DELETE /templates/tags` `{name, tags}`: 204; 404 when a tag is not the template's (or
/// the template is another tenant's).
pub(crate) async fn delete_tags(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    body: Bytes,
) -> Result<Response, E2bError> {
    let d: DeleteTags = parse_body(&body)?;
    let t = resolve(&st, &who, split_name(&d.name).0, Access::Write)?;
    let s = store(&st).ok_or_else(|| not_found_template(&d.name))?;
    let refs: Vec<String> = d.tags.iter().map(|tag| t.stored_tag(Some(tag))).collect();
    if let Some((i, _)) = refs.iter().enumerate().find(|(_, r)| s.name(r).is_none()) {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("tag \"{}:{}\" not found", t.name, d.tags[i]),
        ));
    }
    for r in refs {
        s.remove(&r)
            .map_err(|e| E2bError::internal(format!("removing {r}: {e}")))?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /templates/{id}/tags`: `[{tag, buildID, createdAt}]`.
pub(crate) async fn tags(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let r = resolve(&st, &who, split_name(&id).0, Access::Read)?;
    let s = store(&st).ok_or_else(|| not_found_template(&id))?;
    let t = s.tags(&r.stored);
    if t.is_empty() {
        return Err(not_found_template(&id));
    }
    let v: Vec<Value> = t
        .iter()
        .map(|(tag, r)| {
            json!({
                "tag": tag,
                "buildID": r.build.clone().unwrap_or_else(|| uuid_of(&r.id)),
                "createdAt": r.created_at,
            })
        })
        .collect();
    Ok(Json(v).into_response())
}

/// `GET /templates/{id}/tags/count`: `{total}`.
pub(crate) async fn tags_count(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let r = resolve(&st, &who, split_name(&id).0, Access::Read)?;
    let s = store(&st).ok_or_else(|| not_found_template(&id))?;
    let t = s.tags(&r.stored);
    if t.is_empty() {
        return Err(not_found_template(&id));
    }
    Ok(Json(json!({"total": t.len()})).into_response())
}

/// `GET /templates/{id}/tags/exists?tag=`: `{exists, normalizedTag}` (another tenant's
/// template has no tags, as one that does not exist).
pub(crate) async fn tag_exists(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, E2bError> {
    let tag = q
        .get("tag")
        .cloned()
        .ok_or_else(|| E2bError::bad_request("tag: missing"))?;
    let exists = resolve(&st, &who, split_name(&id).0, Access::Read)
        .ok()
        .and_then(|r| store(&st).and_then(|s| s.name(&r.stored_tag(Some(&tag)))))
        .is_some();
    Ok(Json(json!({"exists": exists, "normalizedTag": tag})).into_response())
}

/// Whether `requested` (a template name, `name:tag`) is a built template the caller may
/// start sandboxes of.
pub(crate) fn is_built(st: &E2b, who: &Principal, requested: &str) -> bool {
    resolve(st, who, requested, Access::Read)
        .ok()
        .is_some_and(|r| store(st).is_some_and(|s| s.name(&r.stored_ref()).is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_core::template_builds::BuildStatus;

    #[test]
    fn paths_are_made_absolute_like_docker() {
        assert_eq!(absolute("/home/user", "app"), "/home/user/app");
        assert_eq!(absolute("/home/user", "./src/"), "/home/user/src/");
        assert_eq!(
            absolute("/", "/etc/app/config.json"),
            "/etc/app/config.json"
        );
        assert_eq!(absolute("/a/b", "../c"), "/a/c");
        assert_eq!(absolute("/a", "/"), "/");
        assert_eq!(absolute("/a", "."), "/a");
    }

    #[test]
    fn uuids_of_template_ids_parse() {
        let u = uuid_of(&"ab".repeat(32));
        assert_eq!(u.len(), 36);
        assert_eq!(u.matches('-').count(), 4);
    }

    #[test]
    fn build_status_names() {
        assert_eq!(BuildStatus::Waiting.as_str(), "waiting");
    }

    #[test]
    fn templates_map_to_base() {
        assert_eq!(template_of("base").unwrap(), "base");
        assert_eq!(
            template_of("code-interpreter-v1").unwrap(),
            "code-interpreter-v1"
        );
        assert!(template_of("nope").is_err());
    }
}
