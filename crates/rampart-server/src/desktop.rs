//! The desktop API: screenshots of a sandbox's desktop, actions on it (clicks, keys, typed
//! text), and a browser whose DevTools protocol is reached through the port proxy. Each
//! runs a command in the sandbox (`scrot`, `xdotool`, `rampart-browser` of the `desktop`
//! template) through core, so it is recorded like any exec, with its `desktop` events.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery, SandboxPath};
use crate::AppState;
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rampart_types::desktop::{BrowserInfo, DesktopAction};
use rampart_types::ApiErrorBody;
use serde::Deserialize;

/// `?display=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct DisplayQuery {
    /// The X display (default `:0`, the desktop template's).
    #[serde(default)]
    display: Option<String>,
}

/// `POST /v1/sandboxes/{id}/desktop/screenshot`: a PNG of the sandbox's screen, the pointer
/// drawn in. The image is also kept in the sandbox's audit record (a `desktop` event with
/// its digest, the image a blob of the bundle).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/desktop/screenshot", tag = "desktop",
    params(("id" = String, Path, description = "Sandbox id"), DisplayQuery),
    responses(
        (status = 200, description = "The PNG", content_type = "image/png"),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "The sandbox is not running", body = ApiErrorBody),
        (status = 502, description = "No X server answers on the display, or scrot failed", body = ApiErrorBody),
    ))]
pub(crate) async fn screenshot(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<DisplayQuery>,
) -> Result<Response, ApiError> {
    let m = &*st.manager;
    let png = m
        .sandbox(&who, &id)?
        .screenshot(q.display.as_deref())
        .await?;
    let mut resp = png.into_response();
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("image/png"));
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// `POST /v1/sandboxes/{id}/desktop/actions`: one action (`{"action": "click", "x": 10,
/// "y": 20}`, `move`, `mouse_down`, `mouse_up`, `drag`, `scroll`, `key`, `type`), done with
/// `xdotool` on the display. 204 once done.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/desktop/actions", tag = "desktop",
    params(("id" = String, Path, description = "Sandbox id"), DisplayQuery),
    request_body = DesktopAction,
    responses(
        (status = 204, description = "Done"),
        (status = 400, description = "A bad action", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 502, description = "No X server answers on the display, or xdotool failed", body = ApiErrorBody),
    ))]
pub(crate) async fn action(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<DisplayQuery>,
    ApiJson(a): ApiJson<DesktopAction>,
) -> Result<StatusCode, ApiError> {
    let m = &*st.manager;
    m.sandbox(&who, &id)?
        .desktop_action(&a, q.display.as_deref())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/sandboxes/{id}/browser`: starts the sandbox's Chromium (on the desktop when an
/// X server answers on the display, headless otherwise) with its DevTools protocol on
/// 127.0.0.1:9222 inside, or finds it running; answers where to reach that protocol through
/// the port proxy. Connect with the sandbox's access token (`X-Rampart-Token`), e.g.
/// Playwright's `connect_over_cdp(ws_url, headers=...)`. What the browser loads goes
/// through the sandbox's egress policy and is in its network log.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/browser", tag = "desktop",
    params(("id" = String, Path, description = "Sandbox id"), DisplayQuery),
    responses(
        (status = 200, description = "The browser and its endpoints", body = BrowserInfo),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 502, description = "The browser did not start (not a desktop sandbox, it crashed)", body = ApiErrorBody),
    ))]
pub(crate) async fn browser(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<DisplayQuery>,
    headers: HeaderMap,
) -> Result<Json<BrowserInfo>, ApiError> {
    let m = &*st.manager;
    let mut info = m
        .sandbox(&who, &id)?
        .start_browser(q.display.as_deref())
        .await?;
    let host = crate::ports::plain_host(&headers).unwrap_or("127.0.0.1:3000");
    let base = format!("{host}/v1/sandboxes/{id}/ports/{}", info.port);
    info.cdp_url = format!("http://{base}");
    info.ws_url = format!("ws://{base}{}", info.ws_path);
    Ok(Json(info))
}
