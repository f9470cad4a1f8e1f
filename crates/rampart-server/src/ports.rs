//! Exposed ports: a server listening on port P inside a sandbox, reached from outside through
//! the daemon, by path (`/v1/sandboxes/{id}/ports/{P}/...`) or by host name
//! (`{P}-{id}.<domain>`, on the daemon's own listener, before the `/v1` router). HTTP is
//! streamed both ways and upgrades (WebSocket) are relayed, over the agent's port tunnel
//! (see [`crate::proxy`]).
//!
//! Every port is private to the holder of the sandbox's access token (made at create and
//! returned by create and `GET /v1/sandboxes/{id}`; an E2B sandbox's is its E2B access
//! token), given as `X-Rampart-Token`, `Authorization: Bearer`, or for browsers a
//! `rampart_token` query parameter (then kept in a cookie of that name). A port the sandbox
//! made public (`POST /v1/sandboxes/{id}/ports/{P}/public`, or `public_ports` at create)
//! needs no token. The daemon's own credentials never reach the server inside.

use crate::error::ApiError;
use crate::extract::{QueryPairs, SandboxPath};
use crate::AppState;
use axum::body::Body;
use axum::extract::{FromRequestParts, OriginalUri, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rampart_core::{AgentError, CoreError, Principal};
use rampart_store::access::AccessStore;
use rampart_store::StoreError;
use rampart_types::{ApiErrorBody, PortInfo, PortList, SandboxId, SandboxState};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The header that carries a sandbox's access token.
pub const TOKEN_HEADER: &str = "x-rampart-token";
/// The query parameter and cookie that carry a sandbox's access token (browsers).
pub const TOKEN_PARAM: &str = "rampart_token";
/// The default domain of host-name routing (`{port}-{id}.localhost`).
pub const DEFAULT_DOMAIN: &str = "localhost";
/// envd's port inside an E2B sandbox: its host names stay with the E2B proxy.
const ENVD_PORT: u16 = 49983;
/// The policy of every answer of the path form: the page runs, in an opaque origin.
const PATH_FORM_CSP: &str =
    "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

/// Options of the daemon's HTTP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerOptions {
    /// The domain of host-name routing: `{port}-{id}.<domain>` reaches port `port` of sandbox
    /// `id`. Lowercase; `localhost` by default.
    pub domain: String,
    /// The TCP address the daemon listens on: a `Host` naming it is one of the daemon's.
    pub listen: Option<std::net::SocketAddr>,
    /// More host names the native API answers to over TCP (beyond the loopback names, the
    /// listen address and `domain`): the names of a reverse proxy in front of it.
    pub allowed_hosts: Vec<String>,
    /// HTTPS on the TCP listener with the operator's certificate (`--tls-cert`,
    /// `--tls-key`); none: plain HTTP. The Unix socket is never TLS.
    pub tls: Option<crate::tls::TlsConfig>,
    /// E2B's `allowPublicTraffic` for a create that does not say (E2B's default: true):
    /// every port of the sandbox but envd's and the code interpreter's answers without the
    /// traffic token.
    pub e2b_public_traffic: bool,
    /// `idle_pause_secs` of every sandbox the E2B API makes (`[e2b] idle_pause_secs`): it
    /// sleeps after that long without a request and the next one wakes it. None: never.
    pub e2b_idle_pause_secs: Option<u64>,
    /// The token of the fleet this node serves (`rampart serve --fleet`): over TCP the
    /// native API then answers only requests carrying it, from the fleet's gateways, on
    /// behalf of the principal the gateway names; the node's own keys are refused there (its
    /// Unix socket is unchanged). None: a single host.
    pub fleet_token: Option<String>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            domain: DEFAULT_DOMAIN.into(),
            listen: None,
            allowed_hosts: Vec::new(),
            tls: None,
            e2b_public_traffic: true,
            e2b_idle_pause_secs: None,
            fleet_token: None,
        }
    }
}

/// Whether `domain` can be the domain of host-name routing: lowercase DNS labels
/// (`a-z`, `0-9`, `-`) separated by dots.
pub fn valid_domain(domain: &str) -> bool {
    !domain.is_empty()
        && domain.len() <= 200
        && domain.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// What the port proxy keeps: the domain, and core's store of every sandbox's access (its
/// token, public ports and E2B facts: an E2B sandbox's envd access token opens its ports too).
pub(crate) struct Ports {
    domain: String,
    /// The TCP listener serves HTTPS: the URLs the daemon hands out are `https://`.
    tls: bool,
    access: Arc<AccessStore>,
}

impl std::fmt::Debug for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ports")
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

fn store_error(e: StoreError) -> ApiError {
    ApiError::internal(format!("port access store: {e}"))
}

/// Runs a store call on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("port access store: {e}")))?
        .map_err(store_error)
}

/// The E2B options of sandbox `id` in `access` (none: not made through the E2B API).
fn e2b_options(
    access: &AccessStore,
    id: &str,
) -> Result<Option<crate::e2b::options::Options>, StoreError> {
    Ok(access
        .e2b(id)?
        .map(|f| crate::e2b::options::Options::parse(&f.options)))
}

impl Ports {
    /// Port access over core's store of every sandbox's access.
    pub(crate) fn with_access(opts: &ServerOptions, access: Arc<AccessStore>) -> Ports {
        Ports {
            domain: opts.domain.clone(),
            tls: opts.tls.is_some(),
            access,
        }
    }

    /// The token of a sandbox: its own, else its E2B access token, else none.
    pub(crate) async fn token(&self, id: &SandboxId) -> Result<Option<String>, ApiError> {
        let access = self.access.clone();
        let sid = id.as_str().to_owned();
        blocking(move || {
            if let Some(t) = access.token(&sid)? {
                return Ok(Some(t));
            }
            Ok(access.e2b(&sid)?.map(|f| f.access_token))
        })
        .await
    }

    /// The token of a sandbox, made now if it has none (a sandbox made before tokens were).
    pub(crate) async fn ensure_token(&self, id: &SandboxId) -> Result<String, ApiError> {
        if let Some(t) = self.token(id).await? {
            return Ok(t);
        }
        let access = self.access.clone();
        let sid = id.as_str().to_owned();
        blocking(move || access.issue(&sid, &[])).await
    }

    /// Whether `port` of `id` answers without a token: made public (native API), or every
    /// port of an E2B sandbox with `allowPublicTraffic` but envd's and the code
    /// interpreter's.
    async fn is_public(&self, id: &SandboxId, port: u16) -> Result<bool, ApiError> {
        let access = self.access.clone();
        let sid = id.as_str().to_owned();
        blocking(move || {
            if access.is_public(&sid, port)? {
                return Ok(true);
            }
            Ok(e2b_options(&access, &sid)?.is_some_and(|o| o.is_public(port)))
        })
        .await
    }

    /// The E2B options of `id` (none: not made through the E2B API).
    async fn e2b_options(
        &self,
        id: &SandboxId,
    ) -> Result<Option<crate::e2b::options::Options>, ApiError> {
        let access = self.access.clone();
        let sid = id.as_str().to_owned();
        blocking(move || e2b_options(&access, &sid)).await
    }

    pub(crate) async fn public_ports(&self, id: &SandboxId) -> Result<Vec<u16>, ApiError> {
        let access = self.access.clone();
        let sid = id.as_str().to_owned();
        blocking(move || access.public_ports(&sid)).await
    }

    async fn set_public(&self, id: &SandboxId, port: u16, public: bool) -> Result<(), ApiError> {
        let access = self.access.clone();
        let sid = id.as_str().to_owned();
        blocking(move || access.set_public(&sid, port, public)).await
    }
}

impl Ports {
    /// What the proxies need to recognise any sandbox's token.
    pub(crate) fn known_credentials(&self) -> Credentials {
        Credentials {
            access: Some(self.access.clone()),
        }
    }
}

/// Headers that carry Rampart's credentials (a sandbox's access token, an E2B access token or
/// API key), never forwarded into a sandbox whatever their value.
pub(crate) const CREDENTIAL_HEADERS: [&str; 4] = [
    TOKEN_HEADER,
    "x-access-token",
    "e2b-traffic-access-token",
    "x-api-key",
];

/// The store that knows every sandbox's tokens: its port-access token and, for an E2B
/// sandbox, its E2B access token (both 64 lowercase hex digits).
#[derive(Clone, Default)]
pub(crate) struct Credentials {
    pub(crate) access: Option<Arc<AccessStore>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}

impl Credentials {
    /// Which of `candidates` (64 lowercase hex digits each) are the token of some sandbox. A
    /// store that fails counts every candidate as a token (fail closed: stripped).
    fn tokens_among(&self, candidates: Vec<String>) -> std::collections::HashSet<String> {
        candidates
            .into_iter()
            .filter(|c| {
                self.access.as_ref().is_some_and(|a| {
                    a.is_token(c).unwrap_or(true) || a.is_e2b_token(c).unwrap_or(true)
                })
            })
            .collect()
    }
}

/// Hex digits in a sandbox's token.
const TOKEN_HEX: usize = 2 * rampart_store::access::TOKEN_BYTES;

/// The words of `text` that could be a sandbox's token: runs of exactly [`TOKEN_HEX`] hex
/// digits (not part of a longer run), lowercased.
fn token_words(text: &[u8], out: &mut Vec<String>) {
    let mut i = 0;
    while i < text.len() {
        if !text[i].is_ascii_hexdigit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < text.len() && text[i].is_ascii_hexdigit() {
            i += 1;
        }
        if i - start == TOKEN_HEX {
            out.push(String::from_utf8_lossy(&text[start..i]).to_ascii_lowercase());
        }
    }
}

/// Whether `text` holds something shaped like an API key, an E2B one (`e2b_` and 40 hex
/// digits) or a native one (`rampart_` and 40 hex digits), in any case: every such value is
/// taken for a key, known to this daemon or not.
fn has_api_key(text: &[u8]) -> bool {
    let shaped = |prefix: &str, is: fn(&str) -> bool| {
        let n = prefix.len();
        text.windows(n).enumerate().any(|(i, w)| {
            w.eq_ignore_ascii_case(prefix.as_bytes())
                && (i == 0 || !text[i - 1].is_ascii_alphanumeric())
                && is(
                    &String::from_utf8_lossy(&text[i..text.len().min(i + n + 40)])
                        .to_ascii_lowercase(),
                )
                && text.get(i + n + 40).is_none_or(|b| !b.is_ascii_hexdigit())
        })
    };
    shaped(
        rampart_store::keys::KEY_PREFIX,
        rampart_store::keys::is_key_shaped,
    ) || shaped(
        rampart_store::node_keys::NODE_KEY_PREFIX,
        rampart_store::node_keys::is_node_key_shaped,
    )
}

/// The texts a header value is searched in: itself, and for `Basic` credentials the decoded
/// `user:password`.
fn header_texts(name: &header::HeaderName, v: &HeaderValue) -> Vec<Vec<u8>> {
    let mut out = vec![v.as_bytes().to_vec()];
    if name == header::AUTHORIZATION || name == header::PROXY_AUTHORIZATION {
        if let Some((scheme, rest)) = v.to_str().ok().and_then(|t| t.trim().split_once(' ')) {
            if scheme.eq_ignore_ascii_case("basic") {
                use base64::Engine as _;
                if let Ok(d) = base64::engine::general_purpose::STANDARD.decode(rest.trim()) {
                    out.push(d);
                }
            }
        }
    }
    out
}

/// The `k=v` pairs of a query, each with its decoded key and value.
fn query_pairs(query: &str) -> Vec<(&str, Vec<u8>)> {
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let decoded = serde_urlencoded::from_str::<Vec<(String, String)>>(kv)
                .ok()
                .and_then(|v| v.into_iter().next())
                .map(|(k, v)| format!("{k}={v}").into_bytes())
                .unwrap_or_default();
            (kv, decoded)
        })
        .collect()
}

/// Removes every Rampart credential from a request about to be forwarded into a sandbox
/// (by the port proxy or the envd proxy): the [`CREDENTIAL_HEADERS`]; any other header
/// value, cookie or query parameter that holds a sandbox's token (any sandbox's, as a whole
/// hex word, in any case; in `Authorization: Basic` also once decoded) or an E2B API key
/// (`e2b_` + 40 hex digits); the `rampart_token` cookie and query parameter. Everything else
/// of the request is kept as it came: an `Authorization` that carries none of them (the
/// application's own) goes through. The body is not looked at.
pub(crate) async fn strip_credentials(creds: &Credentials, req: &mut Request) {
    let h = req.headers_mut();
    for name in CREDENTIAL_HEADERS {
        h.remove(name);
    }
    // What could be a token, from every header value, cookie and query pair.
    let mut words = Vec::new();
    for (name, v) in h.iter() {
        for t in header_texts(name, v) {
            token_words(&t, &mut words);
        }
    }
    let query = req.uri().query().map(str::to_owned);
    let pairs = query.as_deref().map(query_pairs).unwrap_or_default();
    for (raw, decoded) in &pairs {
        token_words(raw.as_bytes(), &mut words);
        token_words(decoded, &mut words);
    }
    words.sort();
    words.dedup();
    // None: the lookup failed, every hex word is taken for a token.
    let tokens = if words.is_empty() {
        Some(Default::default())
    } else {
        let c = creds.clone();
        tokio::task::spawn_blocking(move || c.tokens_among(words))
            .await
            .ok()
    };
    let carries = |text: &[u8]| {
        if has_api_key(text) {
            return true;
        }
        let mut w = Vec::new();
        token_words(text, &mut w);
        w.iter()
            .any(|w| tokens.as_ref().is_none_or(|t| t.contains(w)))
    };
    // Headers: each value that carries one goes; a cookie header loses only those cookies.
    let h = req.headers_mut();
    let names: Vec<header::HeaderName> = h.keys().cloned().collect();
    for name in names {
        let vals: Vec<HeaderValue> = h.get_all(&name).iter().cloned().collect();
        let keep: Vec<HeaderValue> = if name == header::COOKIE {
            let cookies: Vec<String> = vals
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(';'))
                .map(str::trim)
                .filter(|c| {
                    !c.is_empty()
                        && c.split_once('=').map(|(k, _)| k.trim()) != Some(TOKEN_PARAM)
                        && !carries(c.as_bytes())
                })
                .map(str::to_owned)
                .collect();
            HeaderValue::from_str(&cookies.join("; "))
                .ok()
                .filter(|_| !cookies.is_empty())
                .into_iter()
                .collect()
        } else {
            vals.iter()
                .filter(|v| !header_texts(&name, v).iter().any(|t| carries(t)))
                .cloned()
                .collect()
        };
        if keep.len() != vals.len() || name == header::COOKIE {
            h.remove(&name);
            for v in keep {
                h.append(name.clone(), v);
            }
        }
    }
    // The query: pairs that carry one (or are `rampart_token`) go, the rest stay as sent.
    if query.is_some() {
        let kept: Vec<&str> = pairs
            .iter()
            .filter(|(raw, decoded)| {
                !is_token_pair(raw) && !carries(raw.as_bytes()) && !carries(decoded)
            })
            .map(|(raw, _)| *raw)
            .collect();
        let mut pq = req.uri().path().to_owned();
        if !kept.is_empty() {
            pq.push('?');
            pq.push_str(&kept.join("&"));
        }
        if let Ok(uri) = pq.parse() {
            *req.uri_mut() = uri;
        }
    }
}

/// Parses a `{port}` path segment: 1-65535.
fn parse_port(raw: &str) -> Result<u16, ApiError> {
    match raw.parse::<u16>() {
        Ok(p) if p > 0 && raw.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(ApiError::bad_request(format!(
            "port: {raw:?} is not a port; use 1-65535"
        ))),
    }
}

/// The sandbox of a port request, if it can serve one: 404 when unknown or ended, 409 when
/// not running.
async fn running(st: &AppState, who: &Principal, id: &SandboxId) -> Result<(), ApiError> {
    let info = st.manager.sandbox(who, id)?.info()?;
    match info.state {
        SandboxState::Running => Ok(()),
        // Asleep (it has an idle sleep): an authorized request wakes it (see `relay`).
        SandboxState::Paused if info.idle_pause_secs.is_some() => Ok(()),
        SandboxState::Paused | SandboxState::Creating => Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "sandbox {id} is {}; its ports answer once it runs{}",
                info.state.as_str(),
                if info.state == SandboxState::Paused {
                    " (POST /v1/sandboxes/{id}/resume)"
                } else {
                    ""
                }
            ),
        )),
        _ => Err(ApiError::not_found(format!(
            "sandbox {id} has ended ({}); its ports are gone",
            info.state.as_str()
        ))),
    }
}

/// Where a credential was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Header,
    Bearer,
    Query,
    Cookie,
}

/// The candidate tokens of a request, with where each came from.
fn credentials(headers: &HeaderMap, query: Option<&str>) -> Vec<(String, Source)> {
    let mut out = Vec::new();
    for h in [TOKEN_HEADER, "x-access-token", "e2b-traffic-access-token"] {
        for v in headers.get_all(h) {
            if let Ok(v) = v.to_str() {
                out.push((v.trim().to_owned(), Source::Header));
            }
        }
    }
    for v in headers.get_all(header::AUTHORIZATION) {
        // A native API key is the caller's credential for `/v1`, never a sandbox's token.
        if let Some(t) = v
            .to_str()
            .ok()
            .and_then(bearer)
            .filter(|t| !rampart_store::node_keys::is_node_key_shaped(t))
        {
            out.push((t.to_owned(), Source::Bearer));
        }
    }
    if let Some(q) = query {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q).unwrap_or_default();
        for (k, v) in pairs {
            if k == TOKEN_PARAM {
                out.push((v, Source::Query));
            }
        }
    }
    for v in headers.get_all(header::COOKIE) {
        let Ok(v) = v.to_str() else { continue };
        for c in v.split(';') {
            if let Some((k, val)) = c.trim().split_once('=') {
                if k == TOKEN_PARAM {
                    out.push((val.to_owned(), Source::Cookie));
                }
            }
        }
    }
    out
}

/// The token of `Authorization: Bearer <token>`.
fn bearer(v: &str) -> Option<&str> {
    let (scheme, rest) = v.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// Whether a request carries a Rampart credential (not only E2B's headers).
fn has_rampart_credential(headers: &HeaderMap, query: Option<&str>) -> bool {
    headers.contains_key(TOKEN_HEADER)
        || credentials(headers, query)
            .iter()
            .any(|(_, s)| *s != Source::Header)
}

/// What authorization decided: whether to set the cookie (the token came in the query).
#[derive(Debug, Default)]
struct Granted {
    set_cookie: Option<String>,
}

/// Authorizes a request for `port` of `id`: a public port needs nothing; otherwise one of
/// the request's credentials must be the sandbox's token (401 without any, 403 when none is).
async fn authorize(
    st: &AppState,
    id: &SandboxId,
    port: u16,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Granted, ApiError> {
    if st.ports.is_public(id, port).await? {
        return Ok(Granted::default());
    }
    let given = credentials(headers, query);
    if given.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            format!(
                "port {port} of sandbox {id} is private: send the sandbox's access token (in \
                 the answer of create and of GET /v1/sandboxes/{id}) as the X-Rampart-Token \
                 header, as Authorization: Bearer, or as ?{TOKEN_PARAM}= (browsers; it is then \
                 kept in a cookie), or make the port public (POST \
                 /v1/sandboxes/{id}/ports/{port}/public)"
            ),
        ));
    }
    let Some(token) = st.ports.token(id).await? else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("sandbox {id} has no access token; its private ports cannot be opened"),
        ));
    };
    match given
        .iter()
        .find(|(t, _)| crate::proxy::same_secret(t.as_bytes(), token.as_bytes()))
    {
        Some((_, Source::Query)) => Ok(Granted {
            set_cookie: Some(token),
        }),
        Some(_) => Ok(Granted::default()),
        None => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("the access token given does not open sandbox {id}"),
        )),
    }
}

/// Removes the daemon's credentials from a request that goes to the sandbox: the token
/// headers, a bearer token that is the sandbox's, the `rampart_token` cookie and query
/// parameter.
fn scrub(req: &mut Request, token: Option<&str>) {
    let h = req.headers_mut();
    for name in [TOKEN_HEADER, "x-access-token", "e2b-traffic-access-token"] {
        h.remove(name);
    }
    let ours = |v: &HeaderValue| {
        let t = v.to_str().ok().and_then(bearer);
        matches!((t, token), (Some(t), Some(k)) if crate::proxy::same_secret(t.as_bytes(), k.as_bytes()))
    };
    if h.get_all(header::AUTHORIZATION).iter().any(ours) {
        h.remove(header::AUTHORIZATION);
    }
    // A page opened with `?rampart_token=` names it in the Referer of what it loads next.
    if h.get_all(header::REFERER).iter().any(|v| {
        v.as_bytes()
            .windows(TOKEN_PARAM.len())
            .any(|w| w == TOKEN_PARAM.as_bytes())
    }) {
        h.remove(header::REFERER);
    }
    let cookies: Vec<String> = h
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && c.split_once('=').map(|(k, _)| k) != Some(TOKEN_PARAM))
        .map(str::to_owned)
        .collect();
    h.remove(header::COOKIE);
    if !cookies.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&cookies.join("; ")) {
            h.insert(header::COOKIE, v);
        }
    }
}

/// Whether a `k=v` query pair is the token's, its key decoded as [`credentials`] decodes it
/// (`rampart%5Ftoken=` is accepted as the token, so it must not go through either).
fn is_token_pair(kv: &str) -> bool {
    serde_urlencoded::from_str::<Vec<(String, String)>>(kv)
        .ok()
        .and_then(|v| v.into_iter().next())
        .is_some_and(|(k, _)| k == TOKEN_PARAM)
}

/// `rest` (a path starting with `/`, or empty) and the query without `rampart_token`.
fn path_and_query(rest: &str, query: Option<&str>) -> String {
    let mut out = if rest.is_empty() {
        "/".to_owned()
    } else {
        rest.to_owned()
    };
    let kept: Vec<&str> = query
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty() && !is_token_pair(kv))
        .collect();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    out
}

/// Sends `req` (already authorized, its URI the path and query for the server inside) to
/// `port` of `id` through the agent's tunnel.
async fn relay(
    st: &AppState,
    who: &Principal,
    id: &SandboxId,
    port: u16,
    req: Request,
) -> Response {
    let sandbox = match st.manager.sandbox(who, id) {
        Ok(s) => s,
        Err(e) => return ApiError::from(e).into_response(),
    };
    // Woken first if it sleeps (and has an idle sleep); a paused one otherwise is 409.
    if let Err(e) = sandbox.wake().await {
        return ApiError::from(e).into_response();
    }
    let up = match sandbox.tunnel(port).await {
        Ok(up) => up,
        Err(CoreError::Agent(AgentError::Rpc { message, .. }))
            if message.starts_with("port is not open") =>
        {
            return ApiError::new(
                StatusCode::BAD_GATEWAY,
                "port_closed",
                format!(
                    "nothing listens on port {port} in sandbox {id} (the daemon connects to \
                     127.0.0.1:{port} inside; a server bound to another address is not reached)"
                ),
            )
            .into_response()
        }
        Err(e) => {
            return match running(st, who, id).await {
                Err(gone) => gone.into_response(),
                Ok(()) => ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "agent_error",
                    format!("cannot reach port {port} in sandbox {id}: {e}"),
                )
                .into_response(),
            }
        }
    };
    match crate::proxy::forward_over(up, port, req, &[], None, false).await {
        Ok(r) => r,
        Err(e) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "port_error",
            format!("port {port} of sandbox {id}: {e}"),
        )
        .into_response(),
    }
}

/// Keeps the cookies a sandbox's server sets to that server: every `Set-Cookie` loses its
/// `Domain` (host-only: a `Domain=<domain>` cookie would reach every sandbox's host form); in
/// the path form (`prefix` = `/v1/sandboxes/{id}/ports/{P}`), its `Path` is put under
/// `prefix` (all path-form pages share the daemon's origin: a `Path=/` session cookie would
/// be sent to every other sandbox's server, and another sandbox could plant one for it). A
/// value that is not text is dropped.
fn confine_cookies(headers: &mut HeaderMap, prefix: Option<&str>) {
    let set: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .cloned()
        .collect();
    if set.is_empty() {
        return;
    }
    headers.remove(header::SET_COOKIE);
    for v in set {
        let Ok(v) = v.to_str() else { continue };
        let mut parts = v.split(';');
        let mut out = parts.next().unwrap_or_default().trim().to_owned();
        let mut path = None;
        for a in parts {
            let a = a.trim();
            let name = a.split('=').next().unwrap_or_default().trim();
            if name.eq_ignore_ascii_case("domain") {
                continue;
            }
            if prefix.is_some() && name.eq_ignore_ascii_case("path") {
                path = a.split_once('=').map(|(_, p)| p.trim().to_owned());
                continue;
            }
            if !a.is_empty() {
                out.push_str("; ");
                out.push_str(a);
            }
        }
        if let Some(prefix) = prefix {
            let p = path
                .filter(|p| p.starts_with('/'))
                .unwrap_or_else(|| "/".into());
            out.push_str(&format!("; Path={prefix}{p}"));
        }
        if let Ok(v) = HeaderValue::from_str(&out) {
            headers.append(header::SET_COOKIE, v);
        }
    }
}

/// The largest DevTools listing rewritten (`/json/version`, `/json/list`).
const DEVTOOLS_LISTING_MAX: usize = 1 << 20;

/// The request's `Host` when it is a plain `name[:port]` (or `[v6]:port`), safe to put in a
/// URL the answer names.
pub(crate) fn plain_host(headers: &HeaderMap) -> Option<&str> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    (!host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b)))
    .then_some(host)
}

/// For a request of a DevTools protocol's listing (`/json/version`, `/json`, `/json/list`,
/// as Chromium serves them, e.g. the browser of `POST /v1/sandboxes/{id}/browser`): the
/// WebSocket address the server inside names (`ws://localhost:{port}`, as the proxy sends
/// it that `Host`) and the one that reaches it through the daemon (the request's `Host`
/// and, in the path form, `prefix`), so that a client that follows the listing
/// (Playwright's `connect_over_cdp`, Puppeteer's `browserURL`) connects through the proxy.
fn devtools_listing(
    rest: &str,
    headers: &HeaderMap,
    prefix: &str,
    port: u16,
) -> Option<(String, String)> {
    let path = rest.trim_end_matches('/');
    if !matches!(path, "/json" | "/json/version" | "/json/list") {
        return None;
    }
    let host = plain_host(headers)?;
    let prefix = if prefix == "/" { "" } else { prefix };
    Some((format!("localhost:{port}"), format!("{host}{prefix}")))
}

/// Rewrites a DevTools listing's WebSocket addresses from `inside` to `outside`
/// (`ws://` and the `ws=` of front-end URLs); any other answer passes as it is.
async fn rewrite_devtools(resp: Response, inside: &str, outside: &str) -> Response {
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if resp.status() != StatusCode::OK || !json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = match axum::body::to_bytes(body, DEVTOOLS_LISTING_MAX).await {
        Ok(b) => b,
        Err(e) => {
            return ApiError::new(
                StatusCode::BAD_GATEWAY,
                "port_error",
                format!("a DevTools listing of the sandbox: {e}"),
            )
            .into_response()
        }
    };
    let text = String::from_utf8_lossy(&bytes)
        .replace(&format!("ws://{inside}/"), &format!("ws://{outside}/"))
        .replace(&format!("ws={inside}/"), &format!("ws={outside}/"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(text))
}

/// Checks, scrubs, rewrites and relays one request for `port` of `id`; `rest` is the path
/// for the server inside; `cookie_path` the path of the cookie set when the token came in
/// the query.
async fn serve_port(
    st: &AppState,
    id: &SandboxId,
    port: u16,
    rest: &str,
    cookie_path: &str,
    mut req: Request,
) -> Response {
    let who = &crate::caller::of(&req);
    if let Err(e) = running(st, who, id).await {
        return e.into_response();
    }
    let query = req.uri().query().map(str::to_owned);
    let granted = match authorize(st, id, port, req.headers(), query.as_deref()).await {
        Ok(g) => g,
        Err(e) => return e.into_response(),
    };
    let token = match st.ports.token(id).await {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    scrub(&mut req, token.as_deref());
    let devtools = devtools_listing(rest, req.headers(), cookie_path, port);
    let pq = path_and_query(rest, query.as_deref());
    match pq.parse() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(e) => return ApiError::bad_request(format!("path {pq:?}: {e}")).into_response(),
    }
    // Any other sandbox's token, an E2B key: none reaches the server inside either.
    strip_credentials(&st.ports.known_credentials(), &mut req).await;
    let mut resp = relay(st, who, id, port, req).await;
    if let Some((inside, outside)) = devtools {
        resp = rewrite_devtools(resp, &inside, &outside).await;
    }
    confine_cookies(
        resp.headers_mut(),
        (cookie_path != "/").then_some(cookie_path),
    );
    if cookie_path != "/" {
        // The path form serves the sandbox's pages on the daemon's own origin: a browser must
        // not let their scripts call `/v1` as that origin (read tokens, exec in sandboxes).
        // An opaque origin makes those calls cross-origin, which the API never allows.
        resp.headers_mut().append(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(PATH_FORM_CSP),
        );
    }
    if let Some(t) = granted.set_cookie {
        let c = format!("{TOKEN_PARAM}={t}; Path={cookie_path}; HttpOnly; SameSite=Lax");
        if let Ok(v) = HeaderValue::from_str(&c) {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}

/// `ANY /v1/sandboxes/{id}/ports/{port}/...`: relayed to port `port` inside the sandbox
/// (the path after the port, with the query; `/` when none).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}/{path}", tag = "ports",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("port" = u16, Path, description = "Port inside the sandbox (1-65535)"),
        ("path" = String, Path, description = "Path for the server inside (any method)"),
        ("rampart_token" = Option<String>, Query, description = "The sandbox's access token \
            (browsers; kept in a cookie); or the X-Rampart-Token header, or Authorization: \
            Bearer. Not needed for a public port"),
    ),
    responses(
        (status = 200, description = "The answer of the server inside, streamed (any status; \
            101 for an upgrade such as a WebSocket)"),
        (status = 401, description = "A private port and no token given", body = ApiErrorBody),
        (status = 403, description = "The token given is not the sandbox's", body = ApiErrorBody),
        (status = 404, description = "No such sandbox, or it has ended", body = ApiErrorBody),
        (status = 409, description = "The sandbox is paused", body = ApiErrorBody),
        (status = 502, description = "Nothing listens on the port", body = ApiErrorBody),
    ))]
pub(crate) async fn proxy(State(st): State<AppState>, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let params = match Path::<Vec<(String, String)>>::from_request_parts(&mut parts, &()).await {
        Ok(Path(p)) => p,
        Err(e) => return ApiError::bad_request(e.body_text()).into_response(),
    };
    let original = parts
        .extensions
        .get::<OriginalUri>()
        .map(|o| o.0.clone())
        .unwrap_or_else(|| parts.uri.clone());
    let req = Request::from_parts(parts, body);
    let get = |k: &str| {
        params
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    };
    let id = match SandboxId::parse(get("id")) {
        Ok(id) => id,
        Err(e) => return ApiError::bad_request(format!("id: {e}")).into_response(),
    };
    let port = match parse_port(get("port")) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    // The path after `/sandboxes/{id}/ports/{port}`, as sent (not decoded).
    let path = original.path();
    let prefix = format!("/sandboxes/{}/ports/{}", id.as_str(), get("port"));
    let (cookie_path, rest) = match path.find(&prefix) {
        Some(i) => (&path[..i + prefix.len()], &path[i + prefix.len()..]),
        None => (path, ""),
    };
    let cookie_path = cookie_path.to_owned();
    let rest = rest.to_owned();
    serve_port(&st, &id, port, &rest, &cookie_path, req).await
}

/// What a host name routes to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HostTarget {
    pub(crate) port: u16,
    pub(crate) id: String,
}

/// Parses `{port}-{id}.<domain>[:listen port]`.
pub(crate) fn host_target(host: &str, domain: &str) -> Option<HostTarget> {
    let name = match host.rsplit_once(':') {
        Some((n, p)) if p.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => host,
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let label = name.strip_suffix(domain)?.strip_suffix('.')?;
    let (port, id) = label.split_once('-')?;
    let port = parse_port(port).ok()?;
    if id.is_empty() || id.contains('.') {
        return None;
    }
    Some(HostTarget {
        port,
        id: id.to_owned(),
    })
}

/// Middleware in front of the whole router: a request whose `Host` is
/// `{port}-{id}.<domain>` goes to that port of that sandbox. Left to the E2B proxy: envd's
/// port, requests with E2B's routing header, and every request without a Rampart credential
/// for a sandbox made through the E2B API (so the E2B SDKs and the programs they start see
/// E2B's answers: its token rules, `maskRequestHost`, auto-resume, its errors).
pub(crate) async fn host_route(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
    let Some(t) = host.and_then(|h| host_target(&h, &st.ports.domain)) else {
        return next.run(req).await;
    };
    if t.port == ENVD_PORT || req.headers().contains_key("e2b-sandbox-id") {
        return next.run(req).await;
    }
    let Ok(id) = SandboxId::parse(&t.id) else {
        return ApiError::not_found(format!("no sandbox {:?}", t.id)).into_response();
    };
    if !has_rampart_credential(req.headers(), req.uri().query()) {
        match st.ports.e2b_options(&id).await {
            Ok(Some(_)) => return next.run(req).await,
            Ok(None) => {}
            Err(e) => return e.into_response(),
        }
        // A sandbox that is not there (ended: its E2B facts are forgotten with it) is
        // answered as E2B's proxy answers it, to the SDKs that ask without a credential.
        let who = crate::caller::of(&req);
        let alive = st
            .manager
            .sandbox(&who, &id)
            .and_then(|s| s.info())
            .is_ok_and(|i| i.state.is_alive());
        if !alive {
            return next.run(req).await;
        }
    }
    let rest = req.uri().path().to_owned();
    serve_port(&st, &id, t.port, &rest, "/", req).await
}

/// The base URL a client reached the daemon at: `https` when the daemon serves TLS, else
/// `X-Forwarded-Proto` or `http`; and `Host`.
fn base_of(headers: &HeaderMap, tls: bool) -> (String, String) {
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .filter(|s| !tls && (*s == "https" || *s == "http"))
        .unwrap_or(if tls { "https" } else { "http" })
        .to_owned();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1:3000")
        .to_owned();
    (scheme, host)
}

/// The ports listening inside a sandbox on an address the tunnel reaches (asked of its
/// agent; none when it does not answer).
async fn listening(st: &AppState, who: &Principal, id: &SandboxId) -> BTreeSet<u16> {
    let Ok(sandbox) = st.manager.sandbox(who, id) else {
        return BTreeSet::new();
    };
    match sandbox.listening_ports().await {
        Ok(p) => p.into_iter().collect(),
        Err(e) => {
            tracing::debug!(id = %id, "listing the listening ports: {e}");
            BTreeSet::new()
        }
    }
}

fn port_info(
    (scheme, host): &(String, String),
    domain: &str,
    id: &SandboxId,
    port: u16,
    listening: bool,
    public: bool,
) -> PortInfo {
    let listen_port = host
        .rsplit_once(':')
        .filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()))
        .map(|(_, p)| format!(":{p}"))
        .unwrap_or_default();
    PortInfo {
        port,
        listening,
        public,
        url: format!("{scheme}://{host}/v1/sandboxes/{id}/ports/{port}/"),
        host_url: format!("{scheme}://{port}-{id}.{domain}{listen_port}/"),
    }
}

/// `GET /v1/sandboxes/{id}/ports`: the ports that listen inside or are public, with their
/// URLs; `?port=P` adds port P whatever its state.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", tag = "ports",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("port" = Option<u16>, Query, description = "Also list this port"),
    ),
    responses(
        (status = 200, description = "The sandbox's ports", body = PortList),
        (status = 400, description = "Malformed id or port", body = ApiErrorBody),
        (status = 404, description = "No such sandbox, or it has ended", body = ApiErrorBody),
    ))]
pub(crate) async fn list(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    QueryPairs(q): QueryPairs,
    headers: HeaderMap,
) -> Result<Json<PortList>, ApiError> {
    let mut extra = Vec::new();
    for (k, v) in q {
        match k.as_str() {
            "port" => extra.push(parse_port(&v)?),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "{k}: unknown query parameter; expected port"
                )))
            }
        }
    }
    let info = st.manager.sandbox(&who, &id)?.info()?;
    if !matches!(
        info.state,
        SandboxState::Running | SandboxState::Paused | SandboxState::Creating
    ) {
        return Err(ApiError::not_found(format!(
            "sandbox {id} has ended ({}); its ports are gone",
            info.state.as_str()
        )));
    }
    let public: BTreeSet<u16> = st.ports.public_ports(&id).await?.into_iter().collect();
    let e2b = st.ports.e2b_options(&id).await?;
    let listen = if info.state == SandboxState::Running {
        listening(&st, &who, &id).await
    } else {
        BTreeSet::new()
    };
    let base = base_of(&headers, st.ports.tls);
    let all: BTreeSet<u16> = public
        .iter()
        .chain(listen.iter())
        .chain(extra.iter())
        .copied()
        .collect();
    let ports = all
        .into_iter()
        .map(|p| {
            port_info(
                &base,
                &st.ports.domain,
                &id,
                p,
                listen.contains(&p),
                public.contains(&p) || e2b.as_ref().is_some_and(|o| o.is_public(p)),
            )
        })
        .collect();
    Ok(Json(PortList {
        id: id.as_str().to_owned(),
        ports,
    }))
}

/// Whether a request comes from a web page: browsers send `Origin` on every POST and DELETE
/// and `Sec-Fetch-Site` (`none` only for what the user typed or bookmarked).
fn from_browser(headers: &HeaderMap) -> bool {
    headers.contains_key(header::ORIGIN)
        || headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes() != b"none")
}

/// Whether a browser's request comes from a page of the daemon's own origin: `Origin` names
/// exactly the `Host` it was sent to, and `Sec-Fetch-Site`, when sent, says `same-origin`.
/// A page of an exposed port never is: by host name it is another origin, by path an opaque
/// one (`Origin: null`).
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let (Some(origin), Some(host)) = (text(header::ORIGIN), text(header::HOST)) else {
        return false;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    let fetch_ok = text(axum::http::HeaderName::from_static("sec-fetch-site"))
        .is_none_or(|s| s == "same-origin");
    authority.is_some_and(|a| a.eq_ignore_ascii_case(host)) && fetch_ok
}

/// Middleware on `/v1` (paths seen without the prefix): a request from a browser page that
/// could change something (any method but GET, HEAD, OPTIONS) is refused, except what goes
/// to a sandbox's port (`/sandboxes/{id}/ports/{P}/...`, whose server answers for itself).
/// Pages that sandboxes serve run in the user's browser on the daemon's site (path form) or
/// a sibling of it (`{P}-{id}.localhost`); the API has no CORS and its key is a header a
/// browser does not add by itself, so reads are closed to them; this refusal is a second
/// wall for "simple" body-less POSTs (pause, resume) and form posts.
/// The console (`/console`) is the one page let through: same origin as the daemon, and its
/// request carries the key in a header, which only script holding the key can set (a page a
/// sandbox serves by path runs in an opaque origin, see [`PATH_FORM_CSP`]).
pub(crate) async fn refuse_browser_writes(req: Request, next: Next) -> Response {
    let reads = matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    );
    let h = req.headers();
    let console =
        same_origin(h) && (h.contains_key(header::AUTHORIZATION) || h.contains_key("x-api-key"));
    if reads || !from_browser(h) || console || is_port_path(req.uri().path()) {
        return next.run(req).await;
    }
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "requests from a browser page (Origin or Sec-Fetch-Site header present) cannot \
         change anything through the API",
    )
    .into_response()
}

/// Whether `path` (under `/v1`, the prefix stripped or not) is relayed to a sandbox's port:
/// `/sandboxes/{id}/ports/{P}` and below, except the `/public` endpoints (which refuse
/// browsers themselves).
fn is_port_path(path: &str) -> bool {
    let p = path.strip_prefix("/v1").unwrap_or(path);
    let seg: Vec<&str> = p.split('/').collect();
    matches!(seg.as_slice(), ["", "sandboxes", _, "ports", _, ..])
}

async fn set_public(
    st: &AppState,
    who: &Principal,
    id: &SandboxId,
    raw_port: &str,
    headers: &HeaderMap,
    public: bool,
) -> Result<Json<PortInfo>, ApiError> {
    // A body-less POST is a "simple" cross-origin request: without this, a page a sandbox
    // serves (through either form) or any web site could make a browser open private ports.
    if from_browser(headers) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "requests from a browser page (Origin or Sec-Fetch-Site header present) cannot              make ports public or private",
        ));
    }
    let port = parse_port(raw_port)?;
    running(st, who, id).await.or_else(|e| {
        // A paused sandbox's ports can still be made public or private.
        if e.status == StatusCode::CONFLICT {
            Ok(())
        } else {
            Err(e)
        }
    })?;
    st.ports.set_public(id, port, public).await?;
    Ok(Json(port_info(
        &base_of(headers, st.ports.tls),
        &st.ports.domain,
        id,
        port,
        false,
        public,
    )))
}

/// `POST /v1/sandboxes/{id}/ports/{port}/public`: the port is reachable without the
/// sandbox's token from now on. Other methods on this path are relayed to `/public` inside.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports/{port}/public", tag = "ports",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("port" = u16, Path, description = "Port inside the sandbox (1-65535)"),
    ),
    responses(
        (status = 200, description = "The port, now public (`listening` is not checked)", body = PortInfo),
        (status = 400, description = "Malformed id or port", body = ApiErrorBody),
        (status = 403, description = "Asked by a browser page (Origin or Sec-Fetch-Site header)", body = ApiErrorBody),
        (status = 404, description = "No such sandbox, or it has ended", body = ApiErrorBody),
    ))]
pub(crate) async fn make_public(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path((id, port)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<PortInfo>, ApiError> {
    let id = SandboxId::parse(&id).map_err(|e| ApiError::bad_request(format!("id: {e}")))?;
    set_public(&st, &who, &id, &port, &headers, true).await
}

/// `DELETE /v1/sandboxes/{id}/ports/{port}/public`: the port needs the token again.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/ports/{port}/public", tag = "ports",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("port" = u16, Path, description = "Port inside the sandbox (1-65535)"),
    ),
    responses(
        (status = 200, description = "The port, now private", body = PortInfo),
        (status = 400, description = "Malformed id or port", body = ApiErrorBody),
        (status = 403, description = "Asked by a browser page (Origin or Sec-Fetch-Site header)", body = ApiErrorBody),
        (status = 404, description = "No such sandbox, or it has ended", body = ApiErrorBody),
    ))]
pub(crate) async fn make_private(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path((id, port)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<PortInfo>, ApiError> {
    let id = SandboxId::parse(&id).map_err(|e| ApiError::bad_request(format!("id: {e}")))?;
    set_public(&st, &who, &id, &port, &headers, false).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    #[test]
    fn host_names_route() {
        let t = |h: &str| host_target(h, "localhost");
        assert_eq!(
            t("8000-abc123.localhost:3000"),
            Some(HostTarget {
                port: 8000,
                id: "abc123".into()
            })
        );
        assert_eq!(
            t("8000-ABC123.LOCALHOST"),
            Some(HostTarget {
                port: 8000,
                id: "abc123".into()
            })
        );
        assert_eq!(t("localhost:3000"), None);
        assert_eq!(t("127.0.0.1:3000"), None);
        assert_eq!(t("0-abc.localhost"), None);
        assert_eq!(t("70000-abc.localhost"), None);
        assert_eq!(t("8000-abc.example.com"), None);
        assert_eq!(t("8000-abc.evil-localhost"), None);
        assert_eq!(t("8000-a.b.localhost"), None);
        assert_eq!(
            host_target("80-x.sbx.example.com", "sbx.example.com"),
            Some(HostTarget {
                port: 80,
                id: "x".into()
            })
        );
    }

    #[test]
    fn browser_requests_are_recognised() {
        let mut h = HeaderMap::new();
        assert!(!from_browser(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("none"));
        assert!(!from_browser(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-site"));
        assert!(from_browser(&h));
        let mut h = HeaderMap::new();
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(from_browser(&h));
    }

    #[test]
    fn cookies_stay_with_their_server() {
        let set = |vals: &[&str], prefix: Option<&str>| {
            let mut h = HeaderMap::new();
            for v in vals {
                h.append(header::SET_COOKIE, HeaderValue::from_str(v).unwrap());
            }
            confine_cookies(&mut h, prefix);
            h.get_all(header::SET_COOKIE)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        let pre = "/v1/sandboxes/a/ports/80";
        assert_eq!(
            set(
                &[
                    "sid=1; Path=/; Domain=localhost; HttpOnly",
                    "x=2",
                    "y=3; path=/app; DOMAIN=.example.com",
                    "z=4; Path=rel"
                ],
                Some(pre)
            ),
            [
                "sid=1; HttpOnly; Path=/v1/sandboxes/a/ports/80/",
                "x=2; Path=/v1/sandboxes/a/ports/80/",
                "y=3; Path=/v1/sandboxes/a/ports/80/app",
                "z=4; Path=/v1/sandboxes/a/ports/80/",
            ]
        );
        // The host form: its own origin; only Domain goes.
        assert_eq!(
            set(&["sid=1; Path=/; Domain=localhost; Secure"], None),
            ["sid=1; Path=/; Secure"]
        );
        assert!(set(&[], Some(pre)).is_empty());
    }

    #[test]
    fn port_paths_are_told_apart() {
        assert!(is_port_path("/sandboxes/a/ports/80"));
        assert!(is_port_path("/v1/sandboxes/a/ports/80/x/y"));
        assert!(!is_port_path("/sandboxes/a/ports"));
        assert!(!is_port_path("/sandboxes/a/pause"));
        assert!(!is_port_path("/sandboxes"));
    }

    #[test]
    fn domains() {
        assert!(valid_domain("localhost"));
        assert!(valid_domain("sbx.example.com"));
        for bad in ["", "Local", "a..b", "-a.b", "a_b", "a.b-", "a b"] {
            assert!(!valid_domain(bad), "{bad:?}");
        }
    }

    #[test]
    fn credentials_are_found_and_scrubbed() {
        let mut h = HeaderMap::new();
        h.insert(
            "cookie",
            HeaderValue::from_static("a=1; rampart_token=c; b=2"),
        );
        h.insert("authorization", HeaderValue::from_static("Bearer tok"));
        h.insert(TOKEN_HEADER, HeaderValue::from_static("x"));
        let got = credentials(&h, Some("q=1&rampart_token=qq"));
        assert!(got.contains(&("x".into(), Source::Header)));
        assert!(got.contains(&("tok".into(), Source::Bearer)));
        assert!(got.contains(&("qq".into(), Source::Query)));
        assert!(got.contains(&("c".into(), Source::Cookie)));
        let mut req = Request::new(Body::empty());
        *req.headers_mut() = h;
        scrub(&mut req, Some("tok"));
        assert!(!req.headers().contains_key(TOKEN_HEADER));
        assert!(!req.headers().contains_key("authorization"));
        assert_eq!(req.headers()["cookie"], "a=1; b=2");
        // Someone else's bearer token is the server's business.
        let mut req = Request::new(Body::empty());
        req.headers_mut()
            .insert("authorization", HeaderValue::from_static("Bearer app"));
        scrub(&mut req, Some("tok"));
        assert_eq!(req.headers()["authorization"], "Bearer app");
        assert_eq!(path_and_query("", Some("rampart_token=x")), "/");
        // An encoded key is the token too (credentials() decodes it): never passed on.
        let enc = "rampart%5Ftoken=x&a=1";
        assert!(credentials(&HeaderMap::new(), Some(enc)).contains(&("x".into(), Source::Query)));
        assert_eq!(path_and_query("/p", Some(enc)), "/p?a=1");
        let mut req = Request::new(Body::empty());
        req.headers_mut().insert(
            "referer",
            HeaderValue::from_static("http://h/v1/sandboxes/s/ports/80/?rampart_token=x"),
        );
        scrub(&mut req, Some("x"));
        assert!(!req.headers().contains_key("referer"));
        assert_eq!(
            path_and_query("/a/b", Some("x=1&rampart_token=y&z=%20")),
            "/a/b?x=1&z=%20"
        );
    }

    /// Every Rampart credential goes, whichever sandbox it opens and wherever it is; the
    /// rest of the request stays as it came.
    #[tokio::test]
    async fn every_credential_is_stripped() {
        use rampart_store::{access, SandboxStore as _};
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        // An E2B sandbox, as core records it (its facts in the create's transaction).
        let store = rampart_store::SqliteStore::open(&db).unwrap();
        let e2b_token = access::new_token();
        let created = rampart_store::now_ms();
        store
            .insert_creating(
                &rampart_store::NewSandbox {
                    id: SandboxId::parse("e").unwrap(),
                    template: "base".into(),
                    limits: Default::default(),
                    env: Default::default(),
                    metadata: Default::default(),
                    created_at_ms: created,
                    expires_at_ms: created + 60_000,
                    access: Some(access::NewAccess {
                        token: access::new_token(),
                        public_ports: vec![],
                        e2b: Some(access::E2bSandbox {
                            access_token: e2b_token.clone(),
                            template: "base".into(),
                            options: String::new(),
                        }),
                    }),
                    on_timeout: Default::default(),
                    isolation: Default::default(),
                    idle_pause_secs: None,
                    pooled: false,
                    network: None,
                    request: None,
                    tenant: None,
                },
                10,
                10,
            )
            .unwrap();
        let access = Arc::new(AccessStore::open(&db).unwrap());
        let other = access.issue("other", &[]).unwrap();
        let keys = rampart_store::keys::KeyStore::open_in_memory().unwrap();
        let (_, key) = keys.create_key("k").unwrap();
        let creds = Credentials {
            access: Some(access),
        };
        use base64::Engine as _;
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("u:{other}"));
        let digest = "ab".repeat(32); // a hex word that is no one's token
        let mut req = Request::builder()
            .uri(format!(
                "/p?a=1&t={other}&k={key}&x=%20y&up={}&d={digest}",
                other.to_uppercase()
            ))
            .header("authorization", format!("Bearer {other}"))
            .header("proxy-authorization", format!("Basic {basic}"))
            .header("x-api-key", key.as_str())
            .header("x-access-token", "whatever")
            .header("x-rampart-token", "whatever")
            .header("e2b-traffic-access-token", "whatever")
            .header("x-custom", format!("k={key}"))
            .header("x-e2b", e2b_token.as_str())
            .header("x-list", "keep-me")
            .header("x-list", format!("tok {other}"))
            .header("etag", format!("\"{digest}\""))
            .header(
                "cookie",
                format!("a=1; rampart_token=z; s={other}; b=2; k={key}"),
            )
            .header("cookie", format!("c=3; e={e2b_token}"))
            .body(Body::empty())
            .unwrap();
        strip_credentials(&creds, &mut req).await;
        let h = req.headers();
        for gone in [
            "authorization",
            "proxy-authorization",
            "x-api-key",
            "x-access-token",
            "x-rampart-token",
            "e2b-traffic-access-token",
            "x-custom",
            "x-e2b",
        ] {
            assert!(!h.contains_key(gone), "{gone}: {:?}", h.get(gone));
        }
        let list: Vec<_> = h.get_all("x-list").iter().collect();
        assert_eq!(list, ["keep-me"]);
        assert_eq!(h["etag"], format!("\"{digest}\"").as_str());
        assert_eq!(h["cookie"], "a=1; b=2; c=3");
        assert_eq!(req.uri().to_string(), format!("/p?a=1&x=%20y&d={digest}"));

        // The application's own Authorization (no Rampart credential in it) goes through,
        // and so does the E2B SDK's `Basic user:` of the envd protocol.
        for auth in ["Bearer app-token", "Basic dXNlcjo=", "Token abc"] {
            let mut req = Request::builder()
                .uri("/q")
                .header("authorization", auth)
                .body(Body::empty())
                .unwrap();
            strip_credentials(&creds, &mut req).await;
            assert_eq!(req.headers()["authorization"], auth);
            assert_eq!(req.uri(), "/q");
        }
        // Without stores no token is known: a hex word stays (a store that fails, though,
        // takes every hex word for a token).
        let broken = Credentials::default();
        let mut req = Request::builder()
            .uri("/r")
            .header("x-digest", digest.as_str())
            .body(Body::empty())
            .unwrap();
        strip_credentials(&broken, &mut req).await;
        assert!(
            req.headers().contains_key("x-digest"),
            "no store: nothing known"
        );
    }

    #[test]
    fn key_and_token_shapes() {
        let k = format!("e2b_{}", "0a".repeat(20));
        assert!(has_api_key(k.as_bytes()));
        assert!(has_api_key(format!("x={k};").as_bytes()));
        assert!(has_api_key(k.to_uppercase().as_bytes()));
        assert!(!has_api_key(format!("{k}0").as_bytes()));
        assert!(!has_api_key(format!("xe2b_{}", "0a".repeat(20)).as_bytes()));
        assert!(!has_api_key(b"e2b_0123"));
        let mut w = Vec::new();
        token_words(
            format!(
                "a {} {}0 -{}-",
                "F".repeat(64),
                "1".repeat(64),
                "2".repeat(64)
            )
            .as_bytes(),
            &mut w,
        );
        assert_eq!(w, ["f".repeat(64), "2".repeat(64)]);
    }
}
