//! What several handlers of the control plane share: reading a request's JSON body, and the
//! `Sandbox` answer (of create, connect, resume and fork).

use super::{E2bError, ENVD_VERSION};
use axum::body::Bytes;
use rampart_store::access::E2bSandbox;
use rampart_types::SandboxInfo;
use serde::Deserialize;
use serde_json::{json, Value};

/// E2B's own name for the "client" that runs a sandbox; constant on one host.
pub(super) const CLIENT_ID: &str = "rampart";

/// A request's JSON body; an empty (or all white space) body is `T::default()`.
pub(super) fn parse_body<T: for<'de> Deserialize<'de> + Default>(
    body: &Bytes,
) -> Result<T, E2bError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| E2bError::bad_request(format!("invalid body: {e}")))
}

/// The `Sandbox` answer of create and connect. `domain` is the daemon's domain of host-name
/// routing: the SDKs build `{port}-{id}.<domain>` from it (`get_host`, and envd's URL when
/// `E2B_SANDBOX_URL` is not set).
pub(super) fn sandbox_json(info: &SandboxInfo, facts: &E2bSandbox, domain: &str) -> Value {
    json!({
        "templateID": facts.template,
        "alias": facts.template,
        "sandboxID": info.id.as_str(),
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": facts.access_token,
        // The code-interpreter SDK sends this on its calls to port 49999; the same token.
        "trafficAccessToken": facts.access_token,
        "domain": domain,
    })
}
