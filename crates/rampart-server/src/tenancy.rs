//! Tenants on the API (`docs/tenants.md`): their administration (`/v1/tenants`, admins
//! only), their create rate (`creates_per_minute`, with `X-RateLimit-*` headers), their
//! usage (`/v1/usage`) and the node's change log (`/v1/changes`), which records every call
//! that changes something with who made it and what it answered.
//!
//! Quotas on what a tenant holds are not here: core checks them in the transaction that
//! admits each sandbox.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery};
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rampart_core::Manager;
use rampart_store::tenants::{Change, TenantError, TenantRow, TenantStore};
use rampart_types::tenant::{CreateTenant, QuotaRefusal, Quotas, TenantInfo, UsageReport};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The window of `creates_per_minute`.
const RATE_WINDOW: Duration = Duration::from_secs(60);

/// The tenant side of the API: the tenant store, the create rate limiter and the change log.
#[derive(Debug)]
pub(crate) struct Tenancy {
    store: Arc<TenantStore>,
    /// The creates of each tenant in the last minute.
    windows: Mutex<HashMap<String, VecDeque<Instant>>>,
    /// Changes to append to the log (written off the request path, in batches).
    changes: tokio::sync::mpsc::UnboundedSender<Change>,
    /// On a node of a fleet: the quotas each tenant's copy was last made with.
    mirrored: Mutex<HashMap<String, rampart_types::tenant::Quotas>>,
}

/// The rate limit as it stands after a request that counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateState {
    /// Creates allowed a minute.
    pub(crate) limit: u64,
    /// Creates left in the window.
    pub(crate) remaining: u64,
    /// Seconds until one more is allowed (0: one is).
    pub(crate) reset_secs: u64,
}

impl RateState {
    /// Adds the `X-RateLimit-*` headers.
    pub(crate) fn write(&self, h: &mut HeaderMap) {
        let mut put = |name: &'static str, v: u64| {
            if let Ok(v) = HeaderValue::from_str(&v.to_string()) {
                h.insert(name, v);
            }
        };
        put("x-ratelimit-limit", self.limit);
        put("x-ratelimit-remaining", self.remaining);
        put("x-ratelimit-reset", self.reset_secs);
    }
}

/// A create refused by the rate limit.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RateRefusal {
    pub(crate) state: RateState,
    pub(crate) tenant: String,
    /// Creates made in the window.
    pub(crate) used: u64,
    /// Creates the request asked for.
    pub(crate) requested: u64,
}

impl RateRefusal {
    /// The 429 of the native API.
    pub(crate) fn native(&self) -> Response {
        let s = self.state;
        let e = ApiError {
            quota: Some(QuotaRefusal {
                limit: "creates_per_minute".into(),
                used: self.used as f64,
                requested: self.requested as f64,
                max: s.limit as f64,
            }),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                self.message(),
            )
        };
        let mut r = e.into_response();
        self.headers(r.headers_mut());
        r
    }

    /// What it says.
    pub(crate) fn message(&self) -> String {
        format!(
            "rate limit creates_per_minute exceeded: tenant {} made {} creates in the last \
             minute, this asks for {} more, the most is {}; try again in {} s",
            self.tenant,
            self.used,
            self.requested,
            self.state.limit,
            self.state.reset_secs.max(1)
        )
    }

    /// The rate headers and `Retry-After`.
    pub(crate) fn headers(&self, h: &mut HeaderMap) {
        self.state.write(h);
        if let Ok(v) = HeaderValue::from_str(&self.state.reset_secs.max(1).to_string()) {
            h.insert(axum::http::header::RETRY_AFTER, v);
        }
    }
}

impl Tenancy {
    /// The tenant side over `store`, appending changes through `manager`.
    pub(crate) fn new(store: Arc<TenantStore>, manager: Option<Arc<Manager>>) -> Arc<Tenancy> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        if let Some(m) = manager {
            tokio::spawn(write_changes(m, rx));
        }
        Arc::new(Tenancy {
            store,
            windows: Mutex::new(HashMap::new()),
            changes: tx,
            mirrored: Mutex::new(HashMap::new()),
        })
    }

    /// On a node of a fleet: makes this node's copy of `tenant` (or brings its quotas up to
    /// date) as the fleet's gateway says it is. A read of the store only when they changed.
    pub(crate) fn mirror(
        &self,
        tenant: &str,
        quotas: &rampart_types::tenant::Quotas,
    ) -> Result<(), String> {
        let mut m = self.mirrored.lock().unwrap_or_else(|p| p.into_inner());
        if m.get(tenant) == Some(quotas) {
            return Ok(());
        }
        self.store
            .ensure(tenant, quotas)
            .map_err(|e| e.to_string())?;
        m.insert(tenant.to_owned(), quotas.clone());
        Ok(())
    }

    /// Counts a create of `tenant` against its `creates_per_minute`. Ok(None): no limit.
    pub(crate) fn take_create(&self, tenant: &str) -> Result<Option<RateState>, RateRefusal> {
        self.take_creates(tenant, 1)
    }

    /// Counts `n` creates at once (a fork of `n`): all of them, or none when fewer are left.
    pub(crate) fn take_creates(
        &self,
        tenant: &str,
        n: u64,
    ) -> Result<Option<RateState>, RateRefusal> {
        let limit = match self.store.get(tenant) {
            Ok(Some(t)) => t.quotas.creates_per_minute,
            // A tenant that is gone is refused by the create itself.
            _ => None,
        };
        let Some(limit) = limit else {
            return Ok(None);
        };
        let now = Instant::now();
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let q = w.entry(tenant.to_owned()).or_default();
        while q
            .front()
            .is_some_and(|t| now.duration_since(*t) >= RATE_WINDOW)
        {
            q.pop_front();
        }
        let reset = |q: &VecDeque<Instant>| {
            q.front().map_or(0, |t| {
                RATE_WINDOW
                    .saturating_sub(now.duration_since(*t))
                    .as_secs_f64()
                    .ceil() as u64
            })
        };
        if q.len() as u64 + n > limit {
            return Err(RateRefusal {
                state: RateState {
                    limit,
                    remaining: limit.saturating_sub(q.len() as u64),
                    reset_secs: reset(q),
                },
                tenant: tenant.to_owned(),
                used: q.len() as u64,
                requested: n,
            });
        }
        for _ in 0..n {
            q.push_back(now);
        }
        let remaining = limit - q.len() as u64;
        Ok(Some(RateState {
            limit,
            remaining,
            reset_secs: if remaining == 0 { reset(q) } else { 0 },
        }))
    }

    /// Records a call of `p` that may have changed something (any method but GET, HEAD,
    /// OPTIONS; not an MCP message, whose tools' API calls are recorded themselves).
    pub(crate) fn log_call(
        &self,
        p: &rampart_core::Principal,
        method: &Method,
        path: &str,
        status: StatusCode,
    ) {
        if !is_change(method) || path.starts_with("/mcp") {
            return;
        }
        let _ = self.changes.send(Change {
            seq: 0,
            at_ms: rampart_store::now_ms(),
            principal: p.caller.clone(),
            key_id: p.key_id.clone(),
            tenant: p.tenant.clone(),
            method: method.to_string(),
            path: path.to_owned(),
            status: status.as_u16(),
        });
    }
}

/// Whether a request may change something (and so goes in the change log).
pub(crate) fn is_change(m: &Method) -> bool {
    !matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Whether `path` (with `method`) makes sandboxes: counted by `creates_per_minute`.
pub(crate) fn is_create(method: &Method, path: &str) -> bool {
    if *method != Method::POST {
        return false;
    }
    let p = path.trim_end_matches('/');
    let segs: Vec<&str> = p.trim_start_matches('/').split('/').collect();
    matches!(
        segs.as_slice(),
        ["v1", "sandboxes"]
            | ["v1", "sandboxes", _, "fork"]
            | ["sandboxes"]
            | ["v2", "sandboxes"]
            | ["sandboxes", _, "fork"]
    )
}

/// How long the change log gathers entries before it writes them: one transaction per
/// window however many calls came in, rather than one per call. A crash of the daemon loses
/// at most this much of the log.
const CHANGES_WINDOW: Duration = Duration::from_millis(100);

/// Appends changes in batches, off the request path.
async fn write_changes(m: Arc<Manager>, mut rx: tokio::sync::mpsc::UnboundedReceiver<Change>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + CHANGES_WINDOW;
        while batch.len() < 4096 {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(c)) => batch.push(c),
                Ok(None) | Err(_) => break,
            }
        }
        let m = m.clone();
        let r = tokio::task::spawn_blocking(move || m.record_changes(&batch)).await;
        if let Ok(Err(e)) = r {
            tracing::warn!("writing the change log: {e}");
        }
    }
}

fn tenancy(st: &AppState) -> Result<&Arc<Tenancy>, ApiError> {
    st.tenancy.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unsupported",
            "this server has no tenant store",
        )
    })
}

fn tenant_error(e: TenantError) -> ApiError {
    let message = e.to_string();
    match e {
        TenantError::Name(_) | TenantError::Quota(_) => ApiError::bad_request(message),
        TenantError::Exists(_) | TenantError::Busy { .. } => {
            ApiError::new(StatusCode::CONFLICT, "conflict", message)
        }
        TenantError::NotFound(_) => ApiError::not_found(message),
        TenantError::Store(_) => ApiError::internal(message),
    }
}

fn info(t: &Tenancy, row: TenantRow) -> TenantInfo {
    let holds = t.store.holdings(&row.name).ok();
    TenantInfo {
        created_at: time::OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(row.created_at_ms) * 1_000_000,
        )
        .ok()
        .and_then(|d| {
            d.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default(),
        approvals: t.store.approvals(&row.name).ok().flatten(),
        name: row.name,
        quotas: row.quotas,
        holds,
    }
}

/// `POST /v1/tenants` (admin).
pub(crate) async fn create(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<CreateTenant>,
) -> Result<(StatusCode, Json<TenantInfo>), ApiError> {
    let t = tenancy(&st)?;
    if let Some(p) = &req.approvals {
        rampart_core::approvals::check(p).map_err(ApiError::from)?;
    }
    let row = t
        .store
        .create(&req.name, &req.quotas)
        .map_err(tenant_error)?;
    if let Some(p) = &req.approvals {
        if let Err(e) = t.store.set_approvals(&row.name, Some(p)) {
            // Nothing half-made: the tenant goes with its policy.
            let _ = t.store.delete(&row.name);
            return Err(tenant_error(e));
        }
    }
    Ok((StatusCode::CREATED, Json(info(t, row))))
}

/// `PUT /v1/tenants/{name}/approvals` (admin): replaces its default approval policy.
/// Sandboxes created from then on are held to it.
pub(crate) async fn set_approvals(
    State(st): State<AppState>,
    Path(name): Path<String>,
    ApiJson(p): ApiJson<rampart_types::ApprovalPolicy>,
) -> Result<Json<TenantInfo>, ApiError> {
    rampart_core::approvals::check(&p).map_err(ApiError::from)?;
    put_approvals(&st, name, Some(&p))
}

/// `DELETE /v1/tenants/{name}/approvals` (admin): removes its default approval policy.
pub(crate) async fn clear_approvals(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<TenantInfo>, ApiError> {
    put_approvals(&st, name, None)
}

fn put_approvals(
    st: &AppState,
    name: String,
    p: Option<&rampart_types::ApprovalPolicy>,
) -> Result<Json<TenantInfo>, ApiError> {
    let t = tenancy(st)?;
    t.store.set_approvals(&name, p).map_err(tenant_error)?;
    match t.store.get(&name) {
        Ok(Some(r)) => Ok(Json(info(t, r))),
        Ok(None) => Err(ApiError::not_found(format!("tenant {name} not found"))),
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

/// `GET /v1/tenants` (admin).
pub(crate) async fn list(State(st): State<AppState>) -> Result<Json<Vec<TenantInfo>>, ApiError> {
    let t = tenancy(&st)?;
    let rows = t
        .store
        .list()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(rows.into_iter().map(|r| info(t, r)).collect()))
}

/// `GET /v1/tenants/{name}` (admin).
pub(crate) async fn get_one(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<TenantInfo>, ApiError> {
    let t = tenancy(&st)?;
    match t.store.get(&name) {
        Ok(Some(r)) => Ok(Json(info(t, r))),
        Ok(None) => Err(ApiError::not_found(format!("tenant {name} not found"))),
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

/// `PUT /v1/tenants/{name}/quotas` (admin): replaces its quotas.
pub(crate) async fn set_quotas(
    State(st): State<AppState>,
    Path(name): Path<String>,
    ApiJson(q): ApiJson<Quotas>,
) -> Result<Json<TenantInfo>, ApiError> {
    let t = tenancy(&st)?;
    let row = t.store.set_quotas(&name, &q).map_err(tenant_error)?;
    Ok(Json(info(t, row)))
}

/// `DELETE /v1/tenants/{name}` (admin): refused while it has alive sandboxes; revokes its
/// keys.
pub(crate) async fn delete(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let t = tenancy(&st)?;
    t.store.delete(&name).map_err(tenant_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// The query of `GET /v1/usage`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UsageQuery {
    /// Start (RFC 3339; default: the start of time).
    from: Option<String>,
    /// End (RFC 3339; default: now).
    to: Option<String>,
    /// An admin's choice of tenant (a tenant's key gets its own whatever it says).
    tenant: Option<String>,
}

fn parse_time(field: &str, s: &str) -> Result<i64, ApiError> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
        .map_err(|e| ApiError::bad_request(format!("{field}: {s:?} is not an RFC 3339 time: {e}")))
}

/// `GET /v1/usage?from=&to=[&tenant=]`: the usage report, signed by the node key.
pub(crate) async fn usage(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> Result<Json<UsageReport>, ApiError> {
    let m = &*st.manager;
    let from = match &q.from {
        Some(s) => parse_time("from", s)?,
        None => 0,
    };
    let to = match &q.to {
        Some(s) => parse_time("to", s)?,
        None => rampart_store::now_ms(),
    };
    if to < from {
        return Err(ApiError::bad_request("to: the range ends before it starts"));
    }
    if let Some(t) = &q.tenant {
        rampart_types::tenant::check_tenant_name(t).map_err(ApiError::bad_request)?;
    }
    Ok(Json(m.usage_report(&who, q.tenant, from, to).await?))
}

/// The query of `GET /v1/changes`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChangesQuery {
    /// Entries after this one (default: from the first).
    after: Option<i64>,
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
}

/// `GET /v1/changes`: the node's change log (a tenant's key: its own entries).
pub(crate) async fn changes(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    ApiQuery(q): ApiQuery<ChangesQuery>,
) -> Result<Json<Vec<Change>>, ApiError> {
    let m = &*st.manager;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    Ok(Json(m.changes(&who, q.after.unwrap_or(0), limit)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_are_counted_in_a_minute_window() {
        let store = Arc::new(TenantStore::open_in_memory().unwrap());
        store
            .create(
                "acme",
                &Quotas {
                    creates_per_minute: Some(2),
                    ..Quotas::default()
                },
            )
            .unwrap();
        store.create("free", &Quotas::default()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _g = rt.enter();
        let t = Tenancy::new(store, None);
        let a = t.take_create("acme").unwrap().unwrap();
        assert_eq!((a.limit, a.remaining), (2, 1));
        let b = t.take_create("acme").unwrap().unwrap();
        assert_eq!(b.remaining, 0);
        assert!(b.reset_secs > 0 && b.reset_secs <= 60);
        let refused = t.take_create("acme").unwrap_err();
        assert_eq!(refused.state.remaining, 0);
        assert!(refused.message().contains("creates_per_minute"));
        assert_eq!(t.take_create("free").unwrap(), None);
        // A fork of n takes n, all or none.
        store_fork(&t);
    }

    fn store_fork(t: &Tenancy) {
        t.store
            .create(
                "forky",
                &Quotas {
                    creates_per_minute: Some(3),
                    ..Quotas::default()
                },
            )
            .unwrap();
        t.take_create("forky").unwrap();
        let refused = t.take_creates("forky", 3).unwrap_err();
        assert_eq!((refused.used, refused.requested), (1, 3));
        assert_eq!(refused.state.remaining, 2, "a refused fork takes nothing");
        assert_eq!(t.take_creates("forky", 2).unwrap().unwrap().remaining, 0);
    }

    #[test]
    fn creates_are_the_paths_that_make_sandboxes() {
        assert!(is_create(&Method::POST, "/v1/sandboxes"));
        assert!(is_create(&Method::POST, "/v1/sandboxes/abc/fork"));
        assert!(is_create(&Method::POST, "/sandboxes"));
        assert!(is_create(&Method::POST, "/v2/sandboxes"));
        assert!(is_create(&Method::POST, "/sandboxes/abc/fork"));
        assert!(!is_create(&Method::GET, "/v1/sandboxes"));
        assert!(!is_create(&Method::POST, "/v1/sandboxes/abc/exec"));
    }
}
