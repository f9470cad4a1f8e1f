//! Templates as the API lists them (`GET /v1/templates`).

use serde::{Deserialize, Serialize};

/// A template a sandbox can be created from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TemplateInfo {
    /// Its name (`template` of `POST /v1/sandboxes`).
    pub name: String,
    /// `builtin` (`base`, `code-interpreter-v1`) or `built` (`rampart template build`).
    pub kind: String,
    /// Built templates: the id (SHA-256 of the manifest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Built templates: number of layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<usize>,
    /// Built templates: bytes of file content in the layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Built templates: RFC 3339 time of the build that set the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// Default user of execs and file operations (`user` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Default working directory of execs (the user's home when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Names of the environment variables the template sets (never values).
    #[serde(default)]
    pub env_names: Vec<String>,
    /// The command started at every create, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Vec<String>>,
}
