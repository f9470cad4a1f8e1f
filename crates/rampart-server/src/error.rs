//! The API's error type: every failure becomes `{"error": {"code", "message"}}` with a status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rampart_core::{AgentError, CoreError};
use rampart_types::{ApiError as ApiErrorJson, ApiErrorBody, LimitError};

/// An error answer of the API: a status, a stable code and a message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine code (`bad_request`, `not_found`, ...).
    pub code: &'static str,
    /// Human message, naming the field when there is one.
    pub message: String,
    /// The quota passed (`quota_exceeded`, `rate_limited`).
    pub quota: Option<rampart_types::tenant::QuotaRefusal>,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            quota: None,
        }
    }
    /// 400 `bad_request`; the message should name the field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    /// 413 `too_large`.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }
    /// 500 `internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
    /// The JSON body.
    pub fn body(&self) -> ApiErrorBody {
        ApiErrorBody {
            error: ApiErrorJson {
                code: self.code.to_owned(),
                message: self.message.clone(),
                quota: self.quota.clone(),
            },
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(
                status = self.status.as_u16(),
                code = self.code,
                "{}",
                self.message
            );
        } else {
            tracing::debug!(
                status = self.status.as_u16(),
                code = self.code,
                "{}",
                self.message
            );
        }
        (self.status, Json(self.body())).into_response()
    }
}

/// Maps an agent's Connect error code to a status and an API code.
fn rpc_status(code: &str) -> (StatusCode, &'static str) {
    match code {
        "not_found" => (StatusCode::NOT_FOUND, "not_found"),
        "invalid_argument" | "out_of_range" => (StatusCode::BAD_REQUEST, "bad_request"),
        "already_exists" | "failed_precondition" | "aborted" => (StatusCode::CONFLICT, "conflict"),
        "permission_denied" => (StatusCode::FORBIDDEN, "permission_denied"),
        "resource_exhausted" => (StatusCode::INSUFFICIENT_STORAGE, "resource_exhausted"),
        "deadline_exceeded" => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
        "unimplemented" => (StatusCode::NOT_IMPLEMENTED, "unimplemented"),
        "internal" | "unknown" | "data_loss" => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        // unavailable, canceled, unauthenticated (the daemon's own credentials), anything new.
        _ => (StatusCode::BAD_GATEWAY, "agent_error"),
    }
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> Self {
        let message = e.to_string();
        match e {
            CoreError::NotFound(_)
            | CoreError::NoProcess { .. }
            | CoreError::NoWebhook(_)
            | CoreError::NoTemplate(_) => ApiError::not_found(message),
            CoreError::Denied { .. } => ApiError::new(StatusCode::FORBIDDEN, "denied", message),
            CoreError::NoApproval(_) => ApiError::not_found(message),
            CoreError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "conflict", message),
            CoreError::Forbidden(_) => ApiError::new(StatusCode::FORBIDDEN, "forbidden", message),
            CoreError::TooManyProcesses { .. } => {
                ApiError::new(StatusCode::CONFLICT, "conflict", message)
            }
            CoreError::BadRequest { .. } => ApiError::bad_request(message),
            CoreError::WrongState { .. } => {
                ApiError::new(StatusCode::CONFLICT, "conflict", message)
            }
            CoreError::Limit(LimitError::AboveMaximum { .. }) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "limit_exceeded", message)
            }
            CoreError::Limit(LimitError::TooSmall { .. }) => ApiError::bad_request(message),
            CoreError::Capacity(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "capacity", message)
            }
            CoreError::TooLarge(_) => ApiError::too_large(message),
            CoreError::Agent(a) => ApiError::from(a),
            CoreError::Desktop(_) => {
                ApiError::new(StatusCode::BAD_GATEWAY, "desktop_error", message)
            }
            CoreError::Unsupported(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unsupported", message)
            }
            CoreError::Store(rampart_store::StoreError::Quota(q)) => ApiError {
                quota: Some(q),
                ..ApiError::new(StatusCode::FORBIDDEN, "quota_exceeded", message)
            },
            CoreError::Store(rampart_store::StoreError::NoTenant(_)) => {
                ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
            }
            CoreError::Store(_)
            | CoreError::Isolation { .. }
            | CoreError::Io { .. }
            | CoreError::Task { .. }
            | CoreError::Failed { .. }
            | CoreError::Journal(_)
            | CoreError::Internal(_) => ApiError::internal(message),
        }
    }
}

impl From<AgentError> for ApiError {
    fn from(e: AgentError) -> Self {
        match e {
            AgentError::Unreachable(m) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "agent_unreachable",
                format!("the sandbox's agent is unreachable: {m}"),
            ),
            // The agent answers a user the sandbox does not have as envd does
            // (`unauthenticated`, "invalid user: 'x'"): through the native API that is the
            // caller's mistake in the `user` field, not the agent's failure.
            AgentError::Rpc { code, message }
                if code == "unauthenticated" && message.starts_with("invalid user") =>
            {
                ApiError::bad_request(format!("user: {message}"))
            }
            AgentError::Rpc { code, message } => {
                let (status, api_code) = rpc_status(&code);
                ApiError::new(status, api_code, message)
            }
            AgentError::Protocol(m) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "agent_error",
                format!("bad answer from the sandbox's agent: {m}"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_errors_map_to_statuses() {
        let cases: Vec<(CoreError, u16, &str)> = vec![
            (CoreError::NotFound("x".into()), 404, "not_found"),
            (
                CoreError::BadRequest {
                    field: "cmd".into(),
                    message: "empty".into(),
                },
                400,
                "bad_request",
            ),
            (
                CoreError::WrongState {
                    id: "x".into(),
                    state: "stopping".into(),
                },
                409,
                "conflict",
            ),
            (
                CoreError::Limit(LimitError::AboveMaximum {
                    field: "pids",
                    value: "9".into(),
                    max: "8".into(),
                }),
                422,
                "limit_exceeded",
            ),
            (CoreError::Capacity("full".into()), 503, "capacity"),
            (CoreError::TooLarge("big".into()), 413, "too_large"),
            (
                CoreError::Agent(AgentError::Unreachable("gone".into())),
                502,
                "agent_unreachable",
            ),
            (
                CoreError::Agent(AgentError::Rpc {
                    code: "not_found".into(),
                    message: "m".into(),
                }),
                404,
                "not_found",
            ),
            (
                CoreError::Agent(AgentError::Rpc {
                    code: "already_exists".into(),
                    message: "m".into(),
                }),
                409,
                "conflict",
            ),
            (
                CoreError::Agent(AgentError::Rpc {
                    code: "deadline_exceeded".into(),
                    message: "m".into(),
                }),
                504,
                "timeout",
            ),
            (
                CoreError::Agent(AgentError::Rpc {
                    code: "unauthenticated".into(),
                    message: "invalid user: 'nobody2'".into(),
                }),
                400,
                "bad_request",
            ),
            (CoreError::Internal("boom".into()), 500, "internal"),
            (
                CoreError::Failed {
                    what: "egress policy".into(),
                    source: "refused".into(),
                },
                500,
                "internal",
            ),
        ];
        for (e, status, code) in cases {
            let a = ApiError::from(e);
            assert_eq!((a.status.as_u16(), a.code), (status, code), "{a}");
        }
    }
}
