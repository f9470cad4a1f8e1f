//! The web console at `/console`: a single page (HTML, CSS, JavaScript built into the
//! binary) that calls the `/v1` API from the browser with the key the user logs in with. The
//! key lives in the tab's `sessionStorage`, never in a URL or a cookie; every API call carries
//! it as `Authorization: Bearer`, the terminal's WebSocket as the subprotocol
//! `rampart.key.<key>`. The pages themselves hold nothing secret and need no key.
//!
//! Each answer forbids framing and loads nothing from elsewhere (`Content-Security-Policy`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

include!(concat!(env!("OUT_DIR"), "/vendor_present.rs"));

/// The console's own policy: scripts and styles from the daemon only (xterm.js sets styles
/// from script, hence `'unsafe-inline'` for styles), API calls and the terminal's WebSocket
/// to the daemon only, never framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data: blob:; font-src 'self'; connect-src 'self'; frame-ancestors 'none'; \
     base-uri 'none'; form-action 'none'";

struct Asset {
    path: &'static str,
    mime: &'static str,
    body: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset {
        path: "",
        mime: "text/html; charset=utf-8",
        body: include_bytes!("../console/index.html"),
    },
    Asset {
        path: "console.css",
        mime: "text/css; charset=utf-8",
        body: include_bytes!("../console/console.css"),
    },
    Asset {
        path: "console.js",
        mime: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/console.js"),
    },
    Asset {
        path: "verify.js",
        mime: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/verify.js"),
    },
    Asset {
        path: "vendor/xterm.js",
        mime: "text/javascript; charset=utf-8",
        body: include_bytes!(concat!(env!("OUT_DIR"), "/xterm.js")),
    },
    Asset {
        path: "vendor/xterm.css",
        mime: "text/css; charset=utf-8",
        body: include_bytes!(concat!(env!("OUT_DIR"), "/xterm.css")),
    },
    Asset {
        path: "vendor/addon-fit.js",
        mime: "text/javascript; charset=utf-8",
        body: include_bytes!(concat!(env!("OUT_DIR"), "/addon-fit.js")),
    },
];

/// The console's routes: `/console` (redirected to `/console/`) and its files.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/console", get(|| async { Redirect::permanent("/console/") }))
        .route("/console/", get(|| async { serve("") }))
        .route(
            "/console/{*file}",
            get(|axum::extract::Path(file): axum::extract::Path<String>| async move {
                serve(&file)
            }),
        )
}

fn serve(path: &str) -> Response {
    let Some(a) = ASSETS.iter().find(|a| a.path == path) else {
        return (StatusCode::NOT_FOUND, "no such file in the console").into_response();
    };
    let mut resp = a.body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(a.mime));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if path.is_empty() && !VENDOR_PRESENT {
        h.insert("x-rampart-console", HeaderValue::from_static("no-terminal"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_forbids_framing_and_foreign_code() {
        for a in ASSETS {
            let r = serve(a.path);
            assert_eq!(r.status(), StatusCode::OK, "{}", a.path);
            let h = r.headers();
            assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
            let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
            assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"));
        }
        assert_eq!(serve("../Cargo.toml").status(), StatusCode::NOT_FOUND);
        assert_eq!(serve("nope.js").status(), StatusCode::NOT_FOUND);
    }
}
