//! The E2B control plane: create, connect/resume, get, list, kill, timeout, pause, metrics.

use super::options::Options;
use super::templates::{template_of, BASE};
use super::wire::{parse_body, sandbox_json, CLIENT_ID};
use super::{E2b, E2bError, ENVD_VERSION};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rampart_core::Principal;
use rampart_core::{CoreError, CreateOptions};
use rampart_store::access::E2bSandbox;
use rampart_types::{CreateSandbox, OnTimeout, SandboxId, SandboxInfo, SandboxState};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Most list items per page (E2B's maximum).
const MAX_PAGE: usize = 100;

/// `NewSandbox` / `NewSandboxV2`. Unknown keys are ignored (SDK versions differ); keys that
/// ask for something this server cannot do are refused by [`check_unsupported`].
#[derive(Debug, Default, Deserialize)]
struct NewSandbox {
    #[serde(rename = "templateID", default)]
    template_id: Option<String>,
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(rename = "envVars", default)]
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "autoPause", default)]
    auto_pause: Option<bool>,
    #[serde(rename = "autoPauseMemory", default)]
    auto_pause_memory: Option<bool>,
    #[serde(rename = "autoResume", default)]
    auto_resume: Option<Value>,
    #[serde(default)]
    network: Option<Value>,
    /// `false`: no network (mode `none`); otherwise the sandbox gets an `open` network when
    /// this daemon has sandbox networks (E2B sandboxes have internet by default).
    #[serde(default)]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    mcp: Option<Value>,
    #[serde(rename = "volumeMounts", default)]
    volume_mounts: Option<Value>,
    /// Workload identity (`iam.tokens`): refused, see [`super::network::IAM_REFUSAL`].
    #[serde(default)]
    iam: Option<Value>,
}

/// Why `mcp` at create is refused (docs/e2b.md).
const MCP_REFUSAL: &str = "Failed to start MCP gateway: this server cannot run E2B's MCP \
gateway, which pulls the MCP servers it is given from E2B's catalog of container images; this \
host reaches no such registry. Start the MCP server you need inside the sandbox yourself \
(commands.run), or drive sandboxes through Rampart's own MCP server (`rampart mcp`, docs/mcp.md)";

fn check_unsupported(n: &NewSandbox) -> Result<(), E2bError> {
    let set = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
    // An empty `tokens` map asks for nothing (the SDK's default is to send no `iam`).
    let tokens = n
        .iam
        .as_ref()
        .and_then(|v| v.get("tokens"))
        .and_then(Value::as_object)
        .is_some_and(|t| !t.is_empty());
    if tokens {
        return Err(E2bError::bad_request(super::network::IAM_REFUSAL));
    }
    if set(&n.mcp) {
        // E2B's `mcp` starts its MCP gateway (template `mcp-gateway`), which pulls the MCP
        // servers named from E2B's catalog (container images) at start. The SDK reports that
        // gateway failing to start as "Failed to start MCP gateway: <why>"; this server says
        // the same at create, before any sandbox is made.
        return Err(E2bError::bad_request(MCP_REFUSAL));
    }
    Ok(())
}

/// `autoResume` (`{"enabled": bool}`; a bare bool from older clients).
fn auto_resume_of(n: &NewSandbox) -> Result<bool, E2bError> {
    let on = match &n.auto_resume {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => match v.get("enabled") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(E2bError::bad_request("autoResume.enabled: a boolean"));
            }
        },
    };
    if on && n.auto_pause != Some(true) {
        return Err(E2bError::bad_request(
            "autoResume needs autoPause (lifecycle on_timeout \"pause\")",
        ));
    }
    if on && n.auto_pause_memory == Some(false) {
        return Err(E2bError::bad_request(
            "autoResume cannot be combined with a filesystem-only auto-pause",
        ));
    }
    Ok(on)
}

fn sandbox_id(id: &str) -> Result<SandboxId, E2bError> {
    SandboxId::parse(id).map_err(|_| E2bError::not_found(id))
}

fn parse_time(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &Rfc3339).ok()
}

impl E2b {
    /// The E2B facts of a sandbox (core's, kept with it while it is alive), if the E2B API
    /// made it.
    pub(crate) async fn facts(&self, id: &SandboxId) -> Result<Option<E2bSandbox>, E2bError> {
        let access = self.manager.access();
        let sid = id.as_str().to_owned();
        tokio::task::spawn_blocking(move || access.e2b(&sid))
            .await
            .map_err(|e| E2bError::internal(e.to_string()))?
            .map_err(|e| E2bError::internal(format!("access store: {e}")))
    }

    /// The sandbox and its E2B facts, if the E2B API made it and it is alive.
    pub(crate) async fn lookup(
        &self,
        who: &Principal,
        id: &SandboxId,
    ) -> Result<Option<(SandboxInfo, E2bSandbox)>, E2bError> {
        let info = match self.manager.sandbox(who, id).and_then(|s| s.info()) {
            Ok(i) => i,
            Err(CoreError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if !matches!(
            info.state,
            SandboxState::Running | SandboxState::Creating | SandboxState::Paused
        ) {
            return Ok(None);
        }
        Ok(self.facts(id).await?.map(|f| (info, f)))
    }

    pub(super) async fn must(
        &self,
        who: &Principal,
        id: &str,
    ) -> Result<(SandboxId, SandboxInfo, E2bSandbox), E2bError> {
        let sid = sandbox_id(id)?;
        match self.lookup(who, &sid).await? {
            Some((i, f)) => Ok((sid, i, f)),
            None => Err(E2bError::not_found(id)),
        }
    }
}

fn state_name(info: &SandboxInfo) -> &'static str {
    if info.state == SandboxState::Paused {
        "paused"
    } else {
        "running"
    }
}

/// The `ListedSandbox` / `SandboxDetail` fields.
fn detail_json(st: &E2b, info: &SandboxInfo, facts: &E2bSandbox, with_token: bool) -> Value {
    let mut v = json!({
        "templateID": facts.template,
        "alias": facts.template,
        "sandboxID": info.id.as_str(),
        "clientID": CLIENT_ID,
        "startedAt": info.created_at,
        "endAt": info.expires_at,
        "cpuCount": info.limits.cpus.ceil().max(1.0) as u64,
        "memoryMB": info.limits.memory_bytes >> 20,
        "diskSizeMB": info.limits.disk_bytes >> 20,
        "envdVersion": ENVD_VERSION,
        "state": state_name(info),
        "metadata": info.metadata,
        "volumeMounts": super::volumes::mounts_json(&facts.options),
    });
    if with_token {
        let o = Options::parse(&facts.options);
        v["envdAccessToken"] = json!(facts.access_token);
        v["domain"] = json!(st.domain);
        let on_timeout = if o.auto_pause { "pause" } else { "kill" };
        v["lifecycle"] = json!({"autoResume": o.auto_resume, "onTimeout": on_timeout});
        v["allowInternetAccess"] = json!(o.allow_internet_access.unwrap_or(true));
        if let Some(n) = o.network {
            v["network"] = n;
        }
    }
    v
}

/// `POST /sandboxes`, `POST /v2/sandboxes`: 201 `Sandbox`. With `Idempotency-Key`, a
/// repeat of the same request (same key and body, same API key) answers what the first one
/// did, without making another sandbox.
pub(crate) async fn create(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, E2bError> {
    let answer = match super::idempotency::key_of(&headers)? {
        Some(k) => {
            let caller = who.key_id.clone().unwrap_or_default();
            st.idempotency
                .run(&caller, &k, &body, || create_now(&st, &who, &body))
                .await?
        }
        None => create_now(&st, &who, &body).await?,
    };
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// The create itself (once per idempotency key).
async fn create_now(st: &E2b, who: &Principal, body: &Bytes) -> Result<Value, E2bError> {
    let n: NewSandbox = parse_body(body)?;
    check_unsupported(&n)?;
    let auto_resume = auto_resume_of(&n)?;
    let requested = n.template_id.clone().unwrap_or_else(|| BASE.into());
    // --- snapshots (e2b/persist.rs): a `templateID` naming one of the caller's snapshots
    // starts from it; core takes the template from the snapshot.
    let snapshot = super::persist::snapshot_for_create(st, who, &requested)?;
    // --- end snapshots
    let template = match template_of(&requested) {
        Ok(t) => Some(t.to_owned()),
        Err(_) if snapshot.is_some() => None,
        // A built template (`rampart template build` or the SDK's `Template.build`, by
        // name or `name:tag`; docs/templates.md).
        Err(_) if super::templates::is_built(st, who, &requested) => Some(requested.clone()),
        Err(e) => return Err(e),
    };
    let net = match &n.network {
        Some(v) if !v.is_null() => Some(super::network::parse(v)?),
        _ => None,
    };
    // E2B sandboxes have internet by default: without `network` or
    // `allow_internet_access` they get an open network when this daemon has sandbox
    // networks. Rules asked for need them (core answers 503 otherwise).
    let (policy, secrets) = super::network::policy_of(net.as_ref(), n.allow_internet_access)?;
    let network = match (&net, n.allow_internet_access) {
        (None, None) => st.manager.network_available().then_some(policy),
        // No network at all, loopback only (`update_network` wires it later if asked).
        (None, Some(false)) => None,
        _ => Some(policy),
    };
    let options = Options {
        network: net.as_ref().map(super::network::info_of),
        allow_internet_access: n.allow_internet_access,
        // E2B's default is public (the operator may say otherwise: `--e2b-allow-public-traffic`).
        allow_public_traffic: net
            .as_ref()
            .and_then(|n| n.allow_public_traffic)
            .unwrap_or(st.public_traffic),
        mask_request_host: net.as_ref().and_then(|n| n.mask_request_host.clone()),
        https_ports: net
            .as_ref()
            .and_then(|n| n.https_ports.clone())
            .unwrap_or_default(),
        auto_resume,
        auto_pause: n.auto_pause == Some(true),
        timeout: n.timeout,
        // Volumes (`volumeMounts`): e2b/volumes.rs.
        volume_mounts: super::volumes::mounts_of(n.volume_mounts.as_ref())?,
    };
    let req = CreateSandbox {
        template,
        snapshot,
        env: n.env_vars.unwrap_or_default(),
        metadata: n.metadata.unwrap_or_default(),
        timeout_secs: n.timeout,
        // autoPause: at its timeout the sandbox is paused instead of killed; with
        // `autoPauseMemory: false` (`mode="filesystem"`) paused to its filesystem.
        on_timeout: (n.auto_pause == Some(true)).then_some(if n.auto_pause_memory == Some(false) {
            OnTimeout::PauseFilesystem
        } else {
            OnTimeout::Pause
        }),
        network,
        secrets,
        volumes: super::volumes::native_mounts(&options.volume_mounts),
        // The node's idle sleep for E2B sandboxes (`[e2b] idle_pause_secs`): the next
        // request (envd, a port) wakes it.
        idle_pause_secs: st.idle_pause_secs,
        ..Default::default()
    };
    // Core makes the envd access token and records it, with the template name asked for and
    // the E2B options, in the create's own transaction; the sandbox's end forgets them.
    let opts = CreateOptions {
        e2b_template: Some(requested),
        e2b_options: Some(options.to_json()),
    };
    let created = st.manager.create_with(who, req, opts).await?;
    let facts = created.e2b.ok_or_else(|| {
        E2bError::internal("the sandbox was made without its E2B facts".to_owned())
    })?;
    Ok(sandbox_json(&created.info, &facts, &st.domain))
}

/// `PUT /sandboxes/{id}/network` (`update_network`): replaces the sandbox's egress rules
/// and header transforms at once (fields left out are cleared, as E2B does;
/// `allowPublicTraffic` and `maskRequestHost` are create's and stay). Live connections the
/// new rules deny are cut. 204.
pub(crate) async fn update_network(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let v: Value = parse_body(&body)?;
    let (sid, info, facts) = st.must(&who, &id).await?;
    if info.state != SandboxState::Running {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is paused: resume it to change its network"),
        ));
    }
    let net = super::network::parse(&v)?;
    if net.allow_public_traffic.is_some()
        || net.mask_request_host.is_some()
        || net.https_ports.is_some()
    {
        return Err(E2bError::bad_request(
            "allowPublicTraffic, maskRequestHost and httpsPorts are set at create only",
        ));
    }
    let (policy, secrets) = super::network::policy_of(Some(&net), net.allow_internet_access)?;
    st.manager
        .sandbox(&who, &sid)?
        .set_network_and_secrets(policy, secrets)
        .await?;
    let mut o = Options::parse(&facts.options);
    let mut shown = super::network::info_of(&net);
    if let Some(old) = o.network.as_ref() {
        for k in ["allowPublicTraffic", "maskRequestHost", "httpsPorts"] {
            if let Some(x) = old.get(k) {
                shown[k] = x.clone();
            }
        }
    }
    o.network = Some(shown);
    if net.allow_internet_access.is_some() {
        o.allow_internet_access = net.allow_internet_access;
    }
    let access = st.manager.access();
    let sid_s = sid.as_str().to_owned();
    let json = o.to_json();
    tokio::task::spawn_blocking(move || access.set_e2b_options(&sid_s, &json))
        .await
        .map_err(|e| E2bError::internal(e.to_string()))??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /sandboxes/{id}`: 200 `SandboxDetail`.
pub(crate) async fn get_one(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let (_, info, facts) = st.must(&who, &id).await?;
    Ok(Json(detail_json(&st, &info, &facts, true)).into_response())
}

/// `DELETE /sandboxes/{id}`: 204; 404 when unknown or already ended (the SDK returns False).
pub(crate) async fn kill(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let (sid, _, _) = st.must(&who, &id).await?;
    match st.manager.sandbox(&who, &sid)?.destroy().await {
        Ok(_) | Err(CoreError::NotFound(_)) => {}
        Err(e) => return Err(e.into()),
    }
    // Its E2B facts went with it (core forgets them at any end).
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `ConnectSandboxV2`.
#[derive(Debug, Default, Deserialize)]
struct ConnectBody {
    #[serde(default)]
    timeout: Option<u64>,
    /// `false`: `on_resume="reboot"`.
    #[serde(default)]
    memory: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct TimeoutBody {
    #[serde(default)]
    timeout: Option<u64>,
}

/// `POST /sandboxes/{id}/timeout` `{"timeout": secs}`: 204.
pub(crate) async fn set_timeout(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let b: TimeoutBody = parse_body(&body)?;
    let secs = b
        .timeout
        .ok_or_else(|| E2bError::bad_request("timeout: required (seconds)"))?;
    let (sid, _, _) = st.must(&who, &id).await?;
    st.manager
        .sandbox(&who, &sid)?
        .set_timeout(secs.max(1))
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sandboxes/{id}/connect`, `POST /v2/sandboxes/{id}/connect`: 200 `Sandbox` for a
/// running sandbox, whose deadline is only ever extended (now + timeout if later); a paused
/// one is resumed first and answers 201.
pub(crate) async fn connect(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let b: ConnectBody = parse_body(&body)?;
    let (sid, info, facts) = st.must(&who, &id).await?;
    let (status, info) = if info.state == SandboxState::Paused {
        // `on_resume="reboot"` (`memory: false`): a cold boot from the disk; a sandbox paused
        // to its filesystem always boots so.
        let reboot = b.memory == Some(false);
        (
            StatusCode::CREATED,
            st.manager.sandbox(&who, &sid)?.resume_with(reboot).await?,
        )
    } else {
        (StatusCode::OK, info)
    };
    extend(&st, &who, &sid, &info, b.timeout).await?;
    let info = st.manager.sandbox(&who, &sid)?.info()?;
    Ok((status, Json(sandbox_json(&info, &facts, &st.domain))).into_response())
}

/// Moves the deadline to now + `timeout` if that is later than the current one.
async fn extend(
    st: &E2b,
    who: &Principal,
    sid: &SandboxId,
    info: &SandboxInfo,
    timeout: Option<u64>,
) -> Result<(), E2bError> {
    if let Some(secs) = timeout.filter(|&s| s > 0) {
        let wanted = OffsetDateTime::now_utc() + time::Duration::seconds(secs as i64);
        let current = parse_time(&info.expires_at);
        if current.is_none_or(|c| wanted > c) {
            st.manager.sandbox(who, sid)?.set_timeout(secs).await?;
        }
    }
    Ok(())
}

/// `POST /sandboxes/{id}/resume` (old SDKs): 201 `Sandbox` for a paused sandbox, resumed
/// (with the body's `timeout`, if any, extending its deadline); 409 for a running one, like
/// E2B's API.
pub(crate) async fn resume(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let b: TimeoutBody = parse_body(&body)?;
    let (sid, info, facts) = st.must(&who, &id).await?;
    if info.state != SandboxState::Paused {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is already running"),
        ));
    }
    let info = st.manager.sandbox(&who, &sid)?.resume().await?;
    extend(&st, &who, &sid, &info, b.timeout).await?;
    let info = st.manager.sandbox(&who, &sid)?.info()?;
    Ok((
        StatusCode::CREATED,
        Json(sandbox_json(&info, &facts, &st.domain)),
    )
        .into_response())
}

#[derive(Debug, Default, Deserialize)]
struct PauseBody {
    /// `false` (`mode="filesystem"`): a pause to the filesystem (the processes end, the disk
    /// is kept, the resume boots from it); otherwise the processes are frozen, memory kept.
    #[serde(default)]
    memory: Option<bool>,
    /// `strict=True`: refuse (503) when the sandbox's envd does not answer.
    #[serde(rename = "requireHealthyGuest", default)]
    require_healthy_guest: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: 204 once every process of the sandbox is frozen (memory
/// kept; envd answers 502 until it is resumed by connect); 409 when already paused (the SDK
/// returns `False`).
pub(crate) async fn pause(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let b: PauseBody = parse_body(&body)?;
    let (sid, info, _) = st.must(&who, &id).await?;
    if info.state == SandboxState::Paused {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is already paused"),
        ));
    }
    let to_disk = b.memory == Some(false);
    // A pause to the filesystem always needs a guest that answers (as E2B's does).
    if b.require_healthy_guest == Some(true) || to_disk {
        let sandbox = st.manager.sandbox(&who, &sid)?;
        sandbox.running()?;
        let healthy = tokio::time::timeout(std::time::Duration::from_secs(2), sandbox.health())
            .await
            .is_ok_and(|r| r.is_ok());
        if !healthy {
            return Err(E2bError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("sandbox \"{id}\": envd does not respond; not paused"),
            ));
        }
    }
    st.manager.sandbox(&who, &sid)?.pause_with(!to_disk).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Every other E2B path (snapshots, fork, templates, network, logs): 404 in E2B's
/// error shape, so the SDK raises its own exception (or returns `False` where 404 means so).
pub(crate) async fn unsupported(uri: axum::http::Uri) -> E2bError {
    E2bError::new(
        StatusCode::NOT_FOUND,
        format!("{} is not supported by this server", uri.path()),
    )
}

/// `GET /sandboxes/{id}/metrics?start=&end=`: 200 `[SandboxMetric]`, the samples kept over
/// the sandbox's life in that range (see `metrics.rs`).
pub(crate) async fn metrics(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, E2bError> {
    let (start, end) = super::metrics::range_of(raw.as_deref())?;
    let (_, info, _) = st.must(&who, &id).await?;
    let samples = super::metrics::answer(&st, &info, start, end).await;
    Ok(Json(Value::Array(samples)).into_response())
}

/// Decodes E2B's double-encoded metadata filter (`a%20b=c%26d` after the normal query
/// decoding: unescape, split on `&` and `=`, unescape each side).
fn metadata_filter(raw: &str) -> Result<BTreeMap<String, String>, E2bError> {
    let once = pct_decode(raw);
    let mut out = BTreeMap::new();
    for pair in once.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(pct_decode(k), pct_decode(v));
    }
    Ok(out)
}

/// Percent-decoding (`+` stays `+`, like Go's PathUnescape of the metadata parts).
fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The list query.
#[derive(Debug, Default)]
struct ListQuery {
    metadata: BTreeMap<String, String>,
    states: Option<Vec<String>>,
    templates: Option<String>,
    started_after: Option<OffsetDateTime>,
    started_before: Option<OffsetDateTime>,
    ascending: bool,
    limit: usize,
    next_token: Option<String>,
}

fn list_query(raw: Option<&str>) -> Result<ListQuery, E2bError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw.unwrap_or_default())
        .map_err(|e| E2bError::bad_request(format!("query: {e}")))?;
    let mut q = ListQuery {
        limit: MAX_PAGE,
        ..Default::default()
    };
    for (k, v) in pairs {
        match k.as_str() {
            "metadata" | "query" => q.metadata.extend(metadata_filter(&v)?),
            "state" => {
                let s: Vec<String> = v
                    .split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect();
                for x in &s {
                    if x != "running" && x != "paused" {
                        return Err(E2bError::bad_request(format!(
                            "state: {x:?} is not running or paused"
                        )));
                    }
                }
                q.states = Some(s);
            }
            "template" => q.templates = Some(v),
            "startedAfter" | "startedBefore" => {
                let t = parse_time(&v).ok_or_else(|| {
                    E2bError::bad_request(format!("{k}: {v:?} is not an RFC 3339 time"))
                })?;
                if k == "startedAfter" {
                    q.started_after = Some(t);
                } else {
                    q.started_before = Some(t);
                }
            }
            "order" => match v.as_str() {
                "asc" => q.ascending = true,
                "desc" => q.ascending = false,
                _ => return Err(E2bError::bad_request("order: asc or desc")),
            },
            "limit" => {
                let n: usize = v
                    .parse()
                    .map_err(|_| E2bError::bad_request("limit: a positive number"))?;
                if n == 0 {
                    return Err(E2bError::bad_request("limit: a positive number"));
                }
                q.limit = n.min(MAX_PAGE);
            }
            "nextToken" => q.next_token = Some(v).filter(|s| !s.is_empty()),
            _ => {}
        }
    }
    Ok(q)
}

/// The paging token: hex of `created_at` and id of the last item of the page.
fn token_of(info: &SandboxInfo) -> String {
    let raw = format!("{}\n{}", info.created_at, info.id.as_str());
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

fn untoken(tok: &str) -> Option<(OffsetDateTime, String)> {
    if !tok.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..tok.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(tok.get(i..i + 2)?, 16).ok())
        .collect();
    let s = String::from_utf8(bytes?).ok()?;
    let (t, id) = s.split_once('\n')?;
    Some((parse_time(t)?, id.to_owned()))
}

async fn listed(
    st: &E2b,
    who: &Principal,
    q: &ListQuery,
) -> Result<Vec<(SandboxInfo, E2bSandbox)>, E2bError> {
    let all = st.manager.list(who, None, &q.metadata)?;
    let mut out = Vec::new();
    for info in all {
        if !matches!(info.state, SandboxState::Running | SandboxState::Paused) {
            continue;
        }
        let Some(facts) = st.facts(&info.id).await? else {
            continue;
        };
        let state = state_name(&info);
        if q.states
            .as_ref()
            .is_some_and(|s| !s.iter().any(|x| x == state))
        {
            continue;
        }
        if let Some(t) = &q.templates {
            if !t
                .split(',')
                .any(|t| t == facts.template || t == info.template)
            {
                continue;
            }
        }
        let started = parse_time(&info.created_at);
        if let (Some(a), Some(s)) = (q.started_after, started) {
            if s < a {
                continue;
            }
        }
        if let (Some(b), Some(s)) = (q.started_before, started) {
            if s >= b {
                continue;
            }
        }
        out.push((info, facts));
    }
    let key = |i: &SandboxInfo| (parse_time(&i.created_at), i.id.as_str().to_owned());
    out.sort_by_key(|a| key(&a.0));
    if !q.ascending {
        out.reverse();
    }
    Ok(out)
}

/// `GET /v2/sandboxes`: 200 `[ListedSandbox]`, newest first by default, `X-Next-Token` when
/// more pages follow.
pub(crate) async fn list(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    RawQuery(raw): RawQuery,
) -> Result<Response, E2bError> {
    let q = list_query(raw.as_deref())?;
    let items = listed(&st, &who, &q).await?;
    let start = match q.next_token.as_deref() {
        None => 0,
        Some(tok) => {
            let (t, id) = untoken(tok)
                .ok_or_else(|| E2bError::bad_request("nextToken: not a token of this server"))?;
            let after = (Some(t), id);
            items
                .iter()
                .position(|(i, _)| {
                    let k = (parse_time(&i.created_at), i.id.as_str().to_owned());
                    if q.ascending {
                        k > after
                    } else {
                        k < after
                    }
                })
                .unwrap_or(items.len())
        }
    };
    let end = (start + q.limit).min(items.len());
    let page: Vec<Value> = items[start..end]
        .iter()
        .map(|(i, f)| detail_json(&st, i, f, false))
        .collect();
    let mut headers = HeaderMap::new();
    if end < items.len() && end > start {
        if let Ok(v) = HeaderValue::from_str(&token_of(&items[end - 1].0)) {
            headers.insert("x-next-token", v);
        }
    }
    Ok((headers, Json(Value::Array(page))).into_response())
}

/// `GET /sandboxes` (old API): every running sandbox, no paging.
pub(crate) async fn list_v1(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    RawQuery(raw): RawQuery,
) -> Result<Response, E2bError> {
    let mut q = list_query(raw.as_deref())?;
    q.limit = usize::MAX;
    let items = listed(&st, &who, &q).await?;
    let page: Vec<Value> = items
        .iter()
        .map(|(i, f)| detail_json(&st, i, f, false))
        .collect();
    Ok(Json(Value::Array(page)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_decode_twice() {
        // The query value after the normal decoding.
        let m = metadata_filter("a%2520b%3Dc%2526d").unwrap();
        assert_eq!(m.get("a b").map(String::as_str), Some("c&d"));
        let m = metadata_filter("k%3Dv%26x%3Dy").unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m["x"], "y");
        assert_eq!(pct_decode("100%"), "100%");
        assert_eq!(pct_decode("%zz%41"), "%zzA");
    }

    #[test]
    fn list_queries_parse() {
        let q = list_query(Some(
            "metadata=a%252520b%3Dc%252526d&state=running%2Cpaused&order=asc&startedAfter=2025-01-02T03%3A04%3A05%2B00%3A00&template=base&limit=1",
        ))
        .unwrap();
        assert_eq!(q.metadata["a b"], "c&d");
        assert_eq!(
            q.states.as_deref(),
            Some(&["running".to_owned(), "paused".to_owned()][..])
        );
        assert!(q.ascending && q.limit == 1 && q.started_after.is_some());
        assert!(list_query(Some("state=dead")).is_err());
        assert!(list_query(Some("limit=0")).is_err());
    }

    #[test]
    fn tokens_round_trip() {
        let tok = "323032352d30312d30315430303a30303a30305a0a616263";
        let (t, id) = untoken(tok).unwrap();
        assert_eq!(id, "abc");
        assert_eq!(t.unix_timestamp(), 1_735_689_600);
        assert!(untoken("zz").is_none());
    }
}
