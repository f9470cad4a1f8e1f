//! E2B's snapshots and fork on core's (the native `/v1` API's) implementation: one
//! implementation, two faces (`docs/persistence.md`, `docs/e2b.md`).
//!
//! * `POST /sandboxes/{id}/snapshots` (`create_snapshot`): [`Manager::snapshot`], 201
//!   `{"snapshotID", "names"}`. This tier keeps the filesystem only: `memory: true`
//!   (`mode="full"`) is refused; left out (the SDK's default) it is a filesystem snapshot.
//! * `GET /snapshots` (`list_snapshots`): the caller's tenant's snapshots, newest first,
//!   paged with `limit` / `nextToken` and the `X-Next-Token` header.
//! * `DELETE /templates/{id}` (`delete_snapshot`, and the template delete): a snapshot when
//!   `id` names one, a template otherwise.
//! * `POST /sandboxes/{id}/fork`: [`Manager::fork_with`], all forks or none.
//! * A create whose `templateID` names a snapshot starts from it ([`snapshot_for_create`]).
//!
//! A tenant's key sees, deletes and forks from its own snapshots and sandboxes only (core
//! qualifies the names and scopes the ids by the request's principal).
//!
//! [`Manager::snapshot`]: rampart_core::Manager::snapshot
//! [`Manager::fork_with`]: rampart_core::Manager::fork_with

use super::options::Options;
use super::wire::{parse_body, sandbox_json};
use super::{E2b, E2bError};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rampart_core::{CoreError, CreateOptions, Principal};
use rampart_types::{CreateSnapshot, ForkSandbox, SnapshotInfo};
use serde::Deserialize;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Most forks one call makes (E2B's `count` is 1 to 20; core's limit is the same).
const MAX_FORKS: u32 = 20;
/// Most snapshots per page (and the default, as E2B's API).
const MAX_PAGE: usize = 100;

/// Why `memory: true` is refused.
const NO_MEMORY: &str = "mode=\"full\" (memory: true) is refused for this sandbox: its \
isolation tier (namespaces) keeps the filesystem only, not the processes or memory. Use \
mode=\"filesystem\", or leave mode out (a filesystem snapshot; a sandbox created from it boots \
fresh from that disk), or create the sandbox on the gvisor tier, whose snapshots keep memory";

/// `SandboxSnapshotRequest`.
#[derive(Debug, Default, Deserialize)]
struct SnapshotBody {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    memory: Option<bool>,
}

/// `SandboxForkRequest`.
#[derive(Debug, Default, Deserialize)]
struct ForkBody {
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    count: Option<i64>,
}

/// E2B's `SnapshotInfo`: the id is the snapshot's name (what `Sandbox.create` takes).
fn snapshot_json(s: &SnapshotInfo) -> Value {
    json!({"snapshotID": s.name, "names": [s.name]})
}

fn not_found_snapshot(id: &str) -> E2bError {
    E2bError::new(
        StatusCode::NOT_FOUND,
        format!("snapshot \"{id}\" doesn't exist or you don't have access to it"),
    )
}

/// Whether `id` names a template rather than a snapshot (the built-in templates always do;
/// a create and a delete resolve names the same way: built-in template, snapshot, built
/// template).
fn builtin_template(id: &str) -> bool {
    super::templates::template_of(id).is_ok()
}

/// The caller's snapshot named `id`, if there is one. A name that cannot be a snapshot's
/// (a built-in template's, or one with a `:tag`) is none.
fn snapshot_named(st: &E2b, who: &Principal, id: &str) -> Result<Option<SnapshotInfo>, E2bError> {
    if builtin_template(id) {
        return Ok(None);
    }
    match st.manager.get_snapshot(who, id) {
        Ok(s) => Ok(Some(s)),
        Err(CoreError::NotFound(_) | CoreError::BadRequest { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// For a create: the snapshot the `templateID` names (`Sandbox.create(template=snapshotID)`),
/// or None when it names a template.
pub(super) fn snapshot_for_create(
    st: &E2b,
    who: &Principal,
    template_id: &str,
) -> Result<Option<String>, E2bError> {
    Ok(snapshot_named(st, who, template_id)?.map(|s| s.name))
}

/// `POST /sandboxes/{id}/snapshots`: 201 `{"snapshotID", "names"}`. The sandbox (running or
/// paused) is frozen while its writable layer is copied, then goes on as before; a gVisor
/// sandbox is saved with its memory, copied and restored, and its snapshot keeps its
/// processes.
pub(crate) async fn create_snapshot(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let b: SnapshotBody = parse_body(&body)?;
    let name = b.name.filter(|n| !n.is_empty());
    if let Some(n) = &name {
        // A snapshot's name is what a create takes as its `templateID`: it may not be a
        // template's too.
        if builtin_template(n) || super::templates::is_built(&st, &who, n) {
            return Err(E2bError::bad_request(format!(
                "name: \"{n}\" is a template's name; give the snapshot another"
            )));
        }
    }
    let (sid, _, _) = st.must(&who, &id).await?;
    let sandbox = st.manager.sandbox(&who, &sid)?;
    // A gVisor sandbox's snapshot keeps its processes and memory, as E2B's do; the
    // namespace tier keeps its filesystem only and refuses to be asked for more.
    let gvisor = sandbox.info()?.isolation == rampart_types::Tier::Gvisor;
    if b.memory == Some(true) && !gvisor {
        return Err(E2bError::bad_request(NO_MEMORY));
    }
    let req = CreateSnapshot {
        name,
        memory: gvisor && b.memory != Some(false),
        stop: false,
    };
    let info = sandbox.snapshot(req).await?;
    Ok((StatusCode::CREATED, Json(snapshot_json(&info))).into_response())
}

/// The list query.
#[derive(Debug)]
struct ListQuery {
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: usize,
    next_token: Option<String>,
}

fn list_query(raw: Option<&str>) -> Result<ListQuery, E2bError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw.unwrap_or_default())
        .map_err(|e| E2bError::bad_request(format!("query: {e}")))?;
    let mut q = ListQuery {
        sandbox_id: None,
        name: None,
        limit: MAX_PAGE,
        next_token: None,
    };
    for (k, v) in pairs {
        match k.as_str() {
            "sandboxID" => q.sandbox_id = Some(v).filter(|s| !s.is_empty()),
            "name" => q.name = Some(v).filter(|s| !s.is_empty()),
            "limit" => {
                let n: usize = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| E2bError::bad_request("limit: a positive number"))?;
                q.limit = n.min(MAX_PAGE);
            }
            "nextToken" => q.next_token = Some(v).filter(|s| !s.is_empty()),
            _ => {}
        }
    }
    Ok(q)
}

/// The order of the list (newest first) and its paging key: the time taken (ns since the
/// epoch; RFC 3339 strings do not sort, their fractions vary in length) and the name.
fn key_of(s: &SnapshotInfo) -> (i128, String) {
    let t = OffsetDateTime::parse(&s.created_at, &Rfc3339)
        .map(OffsetDateTime::unix_timestamp_nanos)
        .unwrap_or(0);
    (t, s.name.clone())
}

/// The paging token: hex of the last item's time and name.
fn token_of(s: &SnapshotInfo) -> String {
    let (t, n) = key_of(s);
    format!("{t}\n{n}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn untoken(tok: &str) -> Option<(i128, String)> {
    if !tok.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..tok.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(tok.get(i..i + 2)?, 16).ok())
        .collect();
    let s = String::from_utf8(bytes?).ok()?;
    let (t, n) = s.split_once('\n')?;
    Some((t.parse().ok()?, n.to_owned()))
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=`: 200 `[SnapshotInfo]`, newest first;
/// `X-Next-Token` when more pages follow.
pub(crate) async fn list_snapshots(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    RawQuery(raw): RawQuery,
) -> Result<Response, E2bError> {
    let q = list_query(raw.as_deref())?;
    let after = match q.next_token.as_deref() {
        None => None,
        Some(tok) => Some(
            untoken(tok)
                .ok_or_else(|| E2bError::bad_request("nextToken: not a token of this server"))?,
        ),
    };
    let mut all: Vec<SnapshotInfo> = st
        .manager
        .list_snapshots(&who)?
        .into_iter()
        .filter(|s| q.sandbox_id.as_ref().is_none_or(|id| &s.source == id))
        .filter(|s| q.name.as_ref().is_none_or(|n| &s.name == n))
        .filter(|s| after.as_ref().is_none_or(|a| key_of(s) < *a))
        .collect();
    all.sort_by_key(|s| std::cmp::Reverse(key_of(s)));
    let end = q.limit.min(all.len());
    let page: Vec<Value> = all[..end].iter().map(snapshot_json).collect();
    let mut headers = HeaderMap::new();
    if end < all.len() && end > 0 {
        if let Ok(v) = HeaderValue::from_str(&token_of(&all[end - 1])) {
            headers.insert("x-next-token", v);
        }
    }
    Ok((headers, Json(Value::Array(page))).into_response())
}

/// `DELETE /templates/{id}` (`Sandbox.delete_snapshot`, and the template delete): removes
/// the snapshot `id` names (204; sandboxes made from it keep their own copy; 409 while a
/// create is cloning it), or else the template (`templates::delete`); 404 when neither.
pub(crate) async fn delete_template_or_snapshot(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    if snapshot_named(&st, &who, &id)?.is_none() {
        return super::templates::delete(State(st), crate::caller::Caller(who), Path(id)).await;
    }
    match st.manager.delete_snapshot(&who, &id).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT.into_response()),
        // Removed meanwhile.
        Err(CoreError::NotFound(_)) => Err(not_found_snapshot(&id)),
        Err(CoreError::WrongState { state, .. }) => Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("snapshot \"{id}\" is {state}"),
        )),
        Err(e) => Err(e.into()),
    }
}

/// `POST /sandboxes/{id}/fork` `{"timeout"?, "count"?}`: 201, one `{"sandbox"}` or
/// `{"error": {"code", "message"}}` per fork, in order: each succeeds or fails on its own
/// (a tenant's quota, the host's capacity), as E2B's. All are made from one consistent point
/// of the source's filesystem (running or paused; it goes on as before), through the normal
/// create path with the source's create request, each with a fresh identity and envd token.
/// What fails before any fork is made (the source, its consistent point) fails the call.
pub(crate) async fn fork(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let b: ForkBody = parse_body(&body)?;
    let count = match b.count {
        None => 1,
        Some(n) if (1..=i64::from(MAX_FORKS)).contains(&n) => n as u32,
        Some(n) => {
            return Err(E2bError::bad_request(format!(
                "count: {n} is not between 1 and {MAX_FORKS}"
            )))
        }
    };
    if b.timeout == Some(0) {
        return Err(E2bError::bad_request(
            "timeout: a positive number of seconds",
        ));
    }
    let (sid, _, facts) = st.must(&who, &id).await?;
    // A fork of `count` is `count` creates against its tenant's rate: the guard counted
    // one, the rest are counted here, all or none (as the native API).
    let more = u64::from(count) - 1;
    let tenant = who.tenant.clone();
    if let (Some(t), Some(tenancy), true) = (tenant, &st.tenancy, more > 0) {
        if let Err(refused) = tenancy.take_creates(&t, more) {
            let mut r =
                E2bError::new(StatusCode::TOO_MANY_REQUESTS, refused.message()).into_response();
            refused.headers(r.headers_mut());
            return Ok(r);
        }
    }
    // Each fork has the source's E2B template name and options (its lifecycle and network
    // as shown), with the new timeout if one was given.
    let mut options = Options::parse(&facts.options);
    if b.timeout.is_some() {
        options.timeout = b.timeout;
    }
    let opts = CreateOptions {
        e2b_template: Some(facts.template.clone()),
        e2b_options: Some(options.to_json()),
    };
    let req = ForkSandbox {
        count,
        timeout_secs: b.timeout,
    };
    let made = st.manager.sandbox(&who, &sid)?.fork_each(req, opts).await?;
    let mut out = Vec::with_capacity(made.len());
    for r in made {
        let item = match r {
            Ok(c) => match c.e2b.as_ref() {
                Some(facts) => json!({"sandbox": sandbox_json(&c.info, facts, &st.domain)}),
                None => fork_error(E2bError::internal(format!(
                    "fork {} was made without its E2B facts",
                    c.info.id
                ))),
            },
            Err(e) => fork_error(e.into()),
        };
        out.push(item);
    }
    Ok((StatusCode::CREATED, Json(Value::Array(out))).into_response())
}

/// One fork's error, as E2B answers it in a fork's entry.
fn fork_error(e: E2bError) -> Value {
    json!({"error": e.body()})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_queries_parse() {
        let q = list_query(Some("sandboxID=abc&name=n&limit=1&nextToken=00")).unwrap();
        assert_eq!(q.sandbox_id.as_deref(), Some("abc"));
        assert_eq!(q.name.as_deref(), Some("n"));
        assert_eq!(q.limit, 1);
        assert_eq!(q.next_token.as_deref(), Some("00"));
        assert_eq!(list_query(None).unwrap().limit, MAX_PAGE);
        assert_eq!(list_query(Some("limit=1000")).unwrap().limit, MAX_PAGE);
        assert!(list_query(Some("limit=0")).is_err());
        assert!(list_query(Some("limit=x")).is_err());
    }

    #[test]
    fn tokens_round_trip() {
        let s = SnapshotInfo {
            name: "snap-1".into(),
            source: "sbx".into(),
            template: "base".into(),
            memory: false,
            size_bytes: 0,
            created_at: "2026-01-01T00:00:00.123Z".into(),
        };
        let tok = token_of(&s);
        assert_eq!(untoken(&tok), Some(key_of(&s)));
        assert!(untoken("zz").is_none());
        assert!(untoken("abc").is_none());
        // Fractions of any length order by time, not as text.
        let later = SnapshotInfo {
            created_at: "2026-01-01T00:00:00.5Z".into(),
            ..s.clone()
        };
        let whole = SnapshotInfo {
            created_at: "2026-01-01T00:00:00Z".into(),
            ..s
        };
        assert!(key_of(&later) > key_of(&whole));
    }

    #[test]
    fn builtin_template_names_are_never_snapshots() {
        assert!(builtin_template("base"));
        assert!(builtin_template("code-interpreter-v1"));
        assert!(!builtin_template("my-snapshot"));
    }
}
