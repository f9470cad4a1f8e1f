//! The OpenAPI document, generated from the handlers' annotations.

use axum::Json;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Rampart",
        description = "Rampart's native API: sandboxes for AI agents. Every error is \
            `{\"error\": {\"code\", \"message\"}}`. JSON bodies need \
            `Content-Type: application/json`. Over TCP every request but `/health` needs an \
            API key, `Authorization: Bearer rampart_...` (or `X-API-Key`), and a `Host` that \
            names the daemon; on the daemon's Unix socket the node's administrator needs none.",
    ),
    paths(
        crate::health,
        crate::metrics::serve_metrics,
        crate::sandboxes::create,
        crate::sandboxes::list,
        crate::sandboxes::get_one,
        crate::sandboxes::stats,
        crate::sandboxes::pools,
        crate::audit::dsse,
        crate::audit::checkpoint,
        crate::approvals::list,
        crate::approvals::get_one,
        crate::approvals::approve,
        crate::approvals::deny,
        crate::processes::start,
        crate::processes::list,
        crate::processes::get_one,
        crate::processes::events,
        crate::processes::input,
        crate::processes::kill,
        crate::sandboxes::destroy,
        crate::sandboxes::set_timeout,
        crate::sandboxes::pause,
        crate::sandboxes::resume,
        crate::persist::snapshot,
        crate::persist::list_snapshots,
        crate::persist::get_snapshot,
        crate::persist::delete_snapshot,
        crate::persist::fork,
        crate::persist::create_volume,
        crate::persist::list_volumes,
        crate::persist::delete_volume,
        crate::exec::exec,
        crate::exec::exec_ws,
        crate::files::read,
        crate::files::write,
        crate::files::remove,
        crate::files::stat,
        crate::files::list,
        crate::files::mkdir,
        crate::files::rename,
        crate::files::watch,
        crate::network::get,
        crate::network::put,
        crate::network::log,
        crate::secrets::set,
        crate::secrets::list,
        crate::secrets::delete,
        crate::artifacts::get,
        crate::desktop::screenshot,
        crate::desktop::action,
        crate::desktop::browser,
        crate::audit::events,
        crate::audit::bundle,
        crate::audit::packages,
        crate::audit::key,
        crate::ports::list,
        crate::ports::make_public,
        crate::ports::make_private,
        crate::ports::proxy,
        crate::templates::list,
        crate::templates::get_one,
    ),
    components(schemas(
        rampart_types::ApiErrorBody,
        rampart_types::ApiError,
        rampart_types::CreateSandbox,
        rampart_types::SandboxInfo,
        rampart_types::SandboxStats,
        rampart_types::PoolInfo,
        rampart_types::ArtifactList,
        rampart_types::desktop::DesktopAction,
        rampart_types::desktop::BrowserInfo,
        rampart_types::desktop::Button,
        rampart_types::desktop::ScrollDirection,
        rampart_types::ApprovalInfo,
        rampart_types::ApprovalPolicy,
        rampart_types::Decide,
        rampart_types::Decision,
        rampart_types::ProcessInfo,
        rampart_types::TemplateInfo,
        rampart_types::SandboxState,
        rampart_types::OnTimeout,
        rampart_types::SetTimeout,
        rampart_types::PauseSandbox,
        rampart_types::ResumeSandbox,
        rampart_types::CreateSnapshot,
        rampart_types::SnapshotInfo,
        rampart_types::ForkSandbox,
        rampart_types::ForkResult,
        rampart_types::CreateVolume,
        rampart_types::VolumeInfo,
        rampart_types::VolumeMount,
        rampart_types::Limits,
        rampart_types::LimitsRequest,
        rampart_types::ExecRequest,
        rampart_types::ExecResult,
        rampart_types::ExecEvent,
        rampart_types::ExecInput,
        rampart_types::FileEntry,
        rampart_types::FileType,
        rampart_types::FileList,
        rampart_types::MakeDir,
        rampart_types::MoveFile,
        rampart_types::FileWatchEvent,
        rampart_types::Health,
        rampart_types::PortInfo,
        rampart_types::PortList,
        rampart_types::NetworkPolicy,
        rampart_types::NetworkMode,
        rampart_types::NetworkLimits,
        rampart_types::NetLogEntry,
        rampart_types::NetEventKind,
        rampart_types::Verdict,
        rampart_types::network::NetworkInfo,
        rampart_types::network::NetLogPage,
        rampart_types::network::PackageEntry,
        rampart_types::network::PackagePolicy,
        rampart_types::network::PackageFetch,
        rampart_types::SecretSpec,
        rampart_types::SecretInjection,
        rampart_types::network::StoredSecretInfo,
        crate::audit::AuditPage,
        crate::audit::AuditKey,
    )),
    tags(
        (name = "sandboxes", description = "Create, list, inspect, destroy sandboxes"),
        (name = "exec", description = "Run commands in a sandbox"),
        (name = "files", description = "Move files in and out of a sandbox"),
        (name = "network", description = "A sandbox's network policy and log (docs/network.md)"),
        (name = "secrets", description = "Named secrets held by the daemon (docs/network.md)"),
        (name = "audit", description = "The signed record of what ran (docs/proof.md)"),
        (name = "ports", description = "Servers inside a sandbox, reached through the daemon"),
        (name = "desktop", description = "Screenshots, clicks, keys and a browser in a desktop sandbox (docs/desktop.md)"),
        (name = "persistence", description = "Snapshots, fork, volumes (docs/persistence.md)"),
        (name = "daemon", description = "Health and metrics"),
    ),
    modifiers(&Security),
    security(("bearer" = []), ("api_key" = [])),
)]
struct ApiDoc;

/// The two ways a TCP caller gives its key (docs/api.md, Authentication); `/health` needs
/// neither, and the daemon's Unix socket identifies its caller instead.
struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme,
        };
        let c = doc.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("rampart_ and 40 lowercase hex digits")
                    .build(),
            ),
        );
        c.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

/// The OpenAPI document of the API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// `GET /v1/openapi.json`.
pub(crate) async fn serve_openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(openapi())
}
