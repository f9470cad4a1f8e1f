//! The tools. Each is one or two calls of the native API; a failing call is a tool error
//! (`isError: true`) whose text says what the API said, never a protocol error.

use crate::api::{Api, ApiRequest, CLIENT_HEADER};
use base64::Engine as _;
use futures::StreamExt as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ProgressNotificationParam, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The most of each of stdout and stderr a `run_command` result carries.
const OUTPUT_CAP: usize = 64 * 1024;
/// The most of a file `read_file` returns.
const READ_CAP: usize = 1 << 20;
/// The code interpreter's template and port (`rampart_core::interpreter`).
const CODE_TEMPLATE: &str = "code-interpreter-v1";
const CODE_PORT: u16 = 49999;
/// The most of an API answer read whole (a bundle can be large).
const ANSWER_CAP: usize = 64 << 20;

/// The MCP server of one session.
#[derive(Clone)]
pub struct RampartMcp {
    api: Arc<dyn Api>,
    tool_router: ToolRouter<Self>,
}

impl std::fmt::Debug for RampartMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RampartMcp").finish_non_exhaustive()
    }
}

/// A tool's failure: its text goes back to the model.
type ToolResult = Result<CallToolResult, rmcp::ErrorData>;

fn fail(message: impl std::fmt::Display) -> ToolResult {
    Ok(CallToolResult::error(vec![ContentBlock::text(
        message.to_string(),
    )]))
}

/// Why a tool's call of the API failed. Its text goes back to the model.
#[derive(Debug, thiserror::Error)]
enum ToolError {
    /// The `sandbox_id` argument is not a sandbox id.
    #[error("sandbox_id {id:?} is not a sandbox id: {source}")]
    BadId {
        /// The argument.
        id: String,
        /// Why.
        #[source]
        source: rampart_types::IdError,
    },
    /// The API could not be reached. The text is the [`Api`] implementation's own: its
    /// `call` returns its errors as text.
    #[error("{message}")]
    Unreachable {
        /// What the implementation said.
        message: String,
    },
    /// The answer's body could not be read whole.
    #[error(transparent)]
    Body(#[from] crate::api::BodyError),
    /// The API answered with an error status. `message` is the daemon's own error text
    /// (see [`api_error`]).
    #[error("{message}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The status with the API's error code and message, or its body.
        message: String,
    },
    /// A successful answer that is not JSON.
    #[error("bad answer from the API: {0}")]
    BadAnswer(#[from] serde_json::Error),
}

fn ok_json(v: &Value) -> ToolResult {
    Ok(CallToolResult::success(vec![ContentBlock::text(
        serde_json::to_string_pretty(v).unwrap_or_default(),
    )]))
}

fn enc(pairs: &[(&str, &str)]) -> String {
    serde_urlencoded::to_string(pairs).unwrap_or_default()
}

/// Checks an id before it goes into a path (a model may pass anything).
fn check_id(id: &str) -> Result<(), ToolError> {
    rampart_types::SandboxId::parse(id)
        .map(|_| ())
        .map_err(|source| ToolError::BadId {
            id: id.into(),
            source,
        })
}

/// The message of an API error answer.
fn api_error(status: u16, body: &[u8]) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) if v["error"]["message"].is_string() => format!(
            "{status} {}: {}",
            v["error"]["code"].as_str().unwrap_or("error"),
            v["error"]["message"].as_str().unwrap_or_default()
        ),
        _ => format!("{status}: {}", String::from_utf8_lossy(body)),
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateArgs {
    /// The template to start from (default `base`, a Debian userland with bash and python3;
    /// list them with the API's /v1/templates).
    #[serde(default)]
    pub template: Option<String>,
    /// The isolation tier: "namespace" (the default, the host's kernel behind namespaces
    /// and a syscall filter) or "gvisor" (a kernel in user space between the sandbox and the
    /// host's; slower to start, a smaller host surface).
    #[serde(default)]
    pub isolation: Option<String>,
    /// Seconds without a request after which the sandbox sleeps (is paused, using no CPU);
    /// the next call that needs it wakes it. Default: it never sleeps.
    #[serde(default)]
    pub idle_pause_secs: Option<u64>,
    /// Seconds until the sandbox is destroyed (default: the daemon's, 300).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// vCPUs (e.g. 0.5, 1, 2).
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Memory limit in MiB.
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Disk (writable layer) size in MiB.
    #[serde(default)]
    pub disk_mib: Option<u64>,
    /// Network policy: {"mode": "none"} (the default: no network), or {"mode":
    /// "allowlist", "allow": ["pypi.org", "*.github.com"]}, or {"mode": "open"}.
    #[serde(default)]
    pub network: Option<Value>,
    /// Environment variables of every process in the sandbox.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Labels, to find the sandbox again with list_sandboxes.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SandboxArg {
    /// The sandbox's id (from create_sandbox or list_sandboxes).
    pub sandbox_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The command line, run with `bash -lc` (pipes, redirections and `&&` work).
    pub command: String,
    /// Working directory (default: the user's home, /home/user).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables for this command.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// `user` (the default) or `root`.
    #[serde(default)]
    pub user: Option<String>,
    /// Kill the command after this many seconds (default 60).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct PathArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// An absolute path inside the sandbox (or relative to the user's home).
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WriteArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// An absolute path inside the sandbox; missing parent directories are made.
    pub path: String,
    /// The content.
    pub content: String,
    /// Whether `content` is base64 (for binary files); default false (UTF-8 text).
    #[serde(default)]
    pub base64: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SnapshotArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// A name for the snapshot (letters, digits, '.', '_', '-'); default: made up.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ForkArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// How many copies (1 to 20, default 1).
    #[serde(default)]
    pub count: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct PolicyArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The new policy: {"mode": "none"}, {"mode": "allowlist", "allow": ["pypi.org"],
    /// "deny": [...]}, or {"mode": "open"}. New connections obey it at once.
    pub policy: Value,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CodeArgs {
    /// The sandbox's id (of the `code-interpreter-v1` template).
    pub sandbox_id: String,
    /// The code to run, in a stateful kernel (variables stay between calls).
    pub code: String,
    /// `python` (the default).
    #[serde(default)]
    pub language: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct PortArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The port a server inside listens on.
    pub port: u16,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListArgs {
    /// Only sandboxes carrying all these labels.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Who is calling, for the API calls a tool makes.
struct Caller {
    origin: Option<http::request::Parts>,
    client: Option<String>,
}

impl Caller {
    fn of(ctx: &RequestContext<RoleServer>) -> Caller {
        Caller {
            origin: ctx.extensions.get::<http::request::Parts>().cloned(),
            client: ctx
                .peer
                .peer_info()
                .map(|i| i.client_info.name.clone())
                .filter(|n| !n.is_empty()),
        }
    }
}

impl RampartMcp {
    /// The tools over `api`.
    pub fn new(api: Arc<dyn Api>) -> RampartMcp {
        RampartMcp {
            api,
            tool_router: Self::tool_router(),
        }
    }

    fn request(&self, who: &Caller, method: http::Method, path: String) -> ApiRequest {
        ApiRequest {
            method,
            path,
            json: None,
            body: None,
            accept: None,
            token: None,
            origin: who.origin.clone(),
            client: who.client.clone(),
        }
    }

    /// One call; the body of a 2xx answer, else the API's error as text.
    async fn send(&self, req: ApiRequest) -> Result<bytes::Bytes, ToolError> {
        let resp = self
            .api
            .call(req)
            .await
            .map_err(|message| ToolError::Unreachable { message })?;
        let status = resp.status;
        let body = resp.bytes(ANSWER_CAP).await?;
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            Err(ToolError::Api {
                status,
                message: api_error(status, &body),
            })
        }
    }

    async fn json(
        &self,
        who: &Caller,
        method: http::Method,
        path: String,
        body: Option<Value>,
    ) -> Result<Value, ToolError> {
        let mut req = self.request(who, method, path);
        req.json = body;
        let bytes = self.send(req).await?;
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        Ok(serde_json::from_slice(&bytes)?)
    }
}

fn done(r: Result<Value, ToolError>) -> ToolResult {
    match r {
        Ok(v) => ok_json(&v),
        Err(e) => fail(e),
    }
}

/// Keeps at most `cap` bytes of `text`, saying how much was cut.
fn truncated(bytes: &[u8], cap: usize) -> String {
    if bytes.len() <= cap {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let mut end = cap;
    while end > 0 && (bytes[end] & 0xC0) == 0x80 {
        end -= 1;
    }
    format!(
        "{}\n[... {} more bytes not shown; redirect to a file and read_file it]",
        String::from_utf8_lossy(&bytes[..end]),
        bytes.len() - end
    )
}

#[tool_router]
impl RampartMcp {
    #[tool(
        description = "Create an isolated sandbox (a Linux machine of its own, no network unless the policy allows it). Returns JSON with its `id`, which every other tool takes as sandbox_id. Destroy it with kill_sandbox when done."
    )]
    async fn create_sandbox(
        &self,
        Parameters(a): Parameters<CreateArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let who = Caller::of(&ctx);
        let mut body = json!({});
        if let Some(t) = a.template {
            body["template"] = t.into();
        }
        if let Some(i) = a.isolation {
            body["isolation"] = i.into();
        }
        if let Some(t) = a.timeout_secs {
            body["timeout_secs"] = t.into();
        }
        if let Some(s) = a.idle_pause_secs {
            body["idle_pause_secs"] = s.into();
        }
        let mut limits = json!({});
        if let Some(c) = a.cpus {
            limits["cpus"] = c.into();
        }
        if let Some(m) = a.memory_mib {
            limits["memory_bytes"] = (m.saturating_mul(1 << 20)).into();
        }
        if let Some(d) = a.disk_mib {
            limits["disk_bytes"] = (d.saturating_mul(1 << 20)).into();
        }
        if limits.as_object().is_some_and(|o| !o.is_empty()) {
            body["limits"] = limits;
        }
        if let Some(n) = a.network {
            body["network"] = n;
        }
        if let Some(e) = a.env {
            body["env"] = json!(e);
        }
        if let Some(m) = a.metadata {
            body["metadata"] = json!(m);
        }
        let r = self
            .json(&who, http::Method::POST, "/v1/sandboxes".into(), Some(body))
            .await
            .map(|mut v| {
                // The port token is the caller's; a model does not need it in its context.
                if let Some(o) = v.as_object_mut() {
                    o.remove("access_token");
                }
                v
            });
        done(r)
    }

    #[tool(
        description = "List the sandboxes that are alive (id, template, state, limits, labels, deadline)."
    )]
    async fn list_sandboxes(
        &self,
        Parameters(a): Parameters<ListArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let who = Caller::of(&ctx);
        let mut path = "/v1/sandboxes".to_owned();
        if let Some(m) = a.metadata.filter(|m| !m.is_empty()) {
            let q: Vec<(String, String)> = m
                .into_iter()
                .map(|(k, v)| ("metadata".to_owned(), format!("{k}={v}")))
                .collect();
            path = format!(
                "{path}?{}",
                serde_urlencoded::to_string(q).unwrap_or_default()
            );
        }
        done(self.json(&who, http::Method::GET, path, None).await)
    }

    #[tool(description = "Destroy a sandbox and everything in it (its record stays).")]
    async fn kill_sandbox(
        &self,
        Parameters(a): Parameters<SandboxArg>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let who = Caller::of(&ctx);
        let r = self
            .json(
                &who,
                http::Method::DELETE,
                format!("/v1/sandboxes/{}", a.sandbox_id),
                None,
            )
            .await
            .map(|v| json!({"id": v["id"], "state": v["state"]}));
        done(r)
    }

    #[tool(
        description = "Run a shell command in a sandbox with `bash -lc` and wait for it. Returns JSON with stdout, stderr, exit_code (null if a signal ended it) and timed_out. Output beyond 64 KiB per stream is cut (with a note). Sends progress notifications while it runs (at most four a second)."
    )]
    async fn run_command(
        &self,
        Parameters(a): Parameters<RunArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let who = Caller::of(&ctx);
        let mut body = json!({
            "cmd": ["bash", "-lc", a.command],
            "timeout_secs": a.timeout_secs.unwrap_or(60),
        });
        if let Some(c) = a.cwd {
            body["cwd"] = c.into();
        }
        if let Some(u) = a.user {
            body["user"] = u.into();
        }
        if let Some(e) = a.env {
            body["env"] = json!(e);
        }
        let mut req = self.request(
            &who,
            http::Method::POST,
            format!("/v1/sandboxes/{}/exec", a.sandbox_id),
        );
        req.json = Some(body);
        req.accept = Some("application/x-ndjson");
        let resp = match self.api.call(req).await {
            Ok(r) => r,
            Err(e) => return fail(e),
        };
        if !(200..300).contains(&resp.status) {
            let status = resp.status;
            let body = resp.bytes(ANSWER_CAP).await.unwrap_or_default();
            return fail(api_error(status, &body));
        }
        let progress = ctx.meta.get_progress_token();
        let mut stream = resp.body;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut line = Vec::new();
        let mut result = json!({});
        let mut events = 0u32;
        let mut last_progress = None;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => return fail(format!("the command's output stream broke: {e}")),
            };
            for b in chunk {
                if b != b'\n' {
                    line.push(b);
                    continue;
                }
                let ev: Value = match serde_json::from_slice(&line) {
                    Ok(v) => v,
                    Err(_) => {
                        line.clear();
                        continue;
                    }
                };
                line.clear();
                let data = || {
                    ev["data"]
                        .as_str()
                        .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
                        .unwrap_or_default()
                };
                match ev["type"].as_str() {
                    Some("stdout") | Some("pty") => out.extend(data()),
                    Some("stderr") => err.extend(data()),
                    Some("exit") => result = ev.clone(),
                    Some("error") => {
                        return fail(format!(
                            "the command failed: {}",
                            ev["message"].as_str().unwrap_or_default()
                        ))
                    }
                    Some("denied") => {
                        return fail(format!(
                            "the command was not run: {}",
                            ev["reason"].as_str().unwrap_or_default()
                        ))
                    }
                    Some("pending_approval") => {
                        // Held by the sandbox's approval policy: say so at once.
                        if let Some(token) = &progress {
                            let _ = ctx
                                .peer
                                .notify_progress(
                                    ProgressNotificationParam::new(token.clone(), 0.0)
                                        .with_message(format!(
                                            "waiting for a person to approve {} (approval {})",
                                            ev["request"].as_str().unwrap_or_default(),
                                            ev["approval_id"].as_str().unwrap_or_default()
                                        )),
                                )
                                .await;
                        }
                        continue;
                    }
                    _ => {}
                }
                events += 1;
                // At most four a second (a chatty command must not flood the client).
                let due = last_progress.is_none_or(|t: std::time::Instant| {
                    t.elapsed() >= std::time::Duration::from_millis(250)
                });
                if let (Some(token), true) = (&progress, due) {
                    last_progress = Some(std::time::Instant::now());
                    let _ = ctx
                        .peer
                        .notify_progress(
                            ProgressNotificationParam::new(token.clone(), f64::from(events))
                                .with_message(format!(
                                    "{} bytes of output so far",
                                    out.len() + err.len()
                                )),
                        )
                        .await;
                }
            }
        }
        if result["type"] != "exit" {
            return fail("the command's output ended before its exit status");
        }
        ok_json(&json!({
            "stdout": truncated(&out, OUTPUT_CAP),
            "stderr": truncated(&err, OUTPUT_CAP),
            "exit_code": result["exit_code"],
            "signal": result.get("signal").cloned().unwrap_or(Value::Null),
            "timed_out": result.get("timed_out").cloned().unwrap_or(false.into()),
        }))
    }

    #[tool(
        description = "Run code in a sandbox of the `code-interpreter-v1` template (create_sandbox with template \"code-interpreter-v1\"): a stateful Python kernel (variables and imports stay between calls), with numpy and matplotlib. Returns stdout, stderr, the results' text and any error; charts and images come back as images."
    )]
    async fn run_code(
        &self,
        Parameters(a): Parameters<CodeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let who = Caller::of(&ctx);
        let path = format!("/v1/sandboxes/{}", a.sandbox_id);
        let info = match self.json(&who, http::Method::GET, path, None).await {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        if info["template"] != CODE_TEMPLATE {
            return fail(format!(
                "sandbox {} is of template {}; run_code needs one of template {CODE_TEMPLATE} (create_sandbox with that template)",
                a.sandbox_id, info["template"]
            ));
        }
        let Some(token) = info["access_token"].as_str().map(str::to_owned) else {
            return fail(format!("sandbox {} is not running", a.sandbox_id));
        };
        let mut req = self.request(
            &who,
            http::Method::POST,
            format!("/v1/sandboxes/{}/ports/{CODE_PORT}/execute", a.sandbox_id),
        );
        req.json = Some(json!({
            "code": a.code,
            "language": a.language.unwrap_or_else(|| "python".into()),
        }));
        req.token = Some(token);
        let body = match self.send(req).await {
            Ok(b) => b,
            Err(e) => return fail(e),
        };
        let (mut stdout, mut stderr, mut texts) = (String::new(), String::new(), Vec::new());
        let mut images = Vec::new();
        let mut error = Value::Null;
        for line in body.split(|b| *b == b'\n') {
            let Ok(ev) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            match ev["type"].as_str() {
                Some("stdout") => stdout.push_str(ev["text"].as_str().unwrap_or_default()),
                Some("stderr") => stderr.push_str(ev["text"].as_str().unwrap_or_default()),
                Some("result") => {
                    if let Some(png) = ev["png"].as_str() {
                        images.push(ContentBlock::image(png, "image/png"));
                    } else if let Some(jpeg) = ev["jpeg"].as_str() {
                        images.push(ContentBlock::image(jpeg, "image/jpeg"));
                    }
                    if let Some(t) = ev["text"].as_str() {
                        texts.push(Value::from(t));
                    }
                }
                Some("error") => {
                    error = json!({
                        "name": ev["name"],
                        "value": ev["value"],
                        "traceback": ev["traceback"],
                    })
                }
                _ => {}
            }
        }
        let failed = !error.is_null();
        let summary = json!({
            "stdout": truncated(stdout.as_bytes(), OUTPUT_CAP),
            "stderr": truncated(stderr.as_bytes(), OUTPUT_CAP),
            "results": texts,
            "error": error,
        });
        let mut content = vec![ContentBlock::text(
            serde_json::to_string_pretty(&summary).unwrap_or_default(),
        )];
        content.extend(images);
        Ok(if failed {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        })
    }

    #[tool(
        description = "Read a file from a sandbox. Text comes back as text; a binary file as base64 (up to 1 MiB)."
    )]
    async fn read_file(
        &self,
        Parameters(a): Parameters<PathArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let who = Caller::of(&ctx);
        let req = self.request(
            &who,
            http::Method::GET,
            format!(
                "/v1/sandboxes/{}/files?{}",
                a.sandbox_id,
                enc(&[("path", &a.path)])
            ),
        );
        let resp = match self.api.call(req).await {
            Ok(r) => r,
            Err(e) => return fail(e),
        };
        let status = resp.status;
        let bytes = match resp.bytes(READ_CAP).await {
            Ok(b) => b,
            Err(e) => return fail(format!("{}: {e}", a.path)),
        };
        if !(200..300).contains(&status) {
            return fail(api_error(status, &bytes));
        }
        match std::str::from_utf8(&bytes) {
            Ok(t) => Ok(CallToolResult::success(vec![ContentBlock::text(t)])),
            Err(_) => ok_json(&json!({
                "path": a.path,
                "size": bytes.len(),
                "base64": base64::engine::general_purpose::STANDARD.encode(&bytes),
            })),
        }
    }

    #[tool(
        description = "Write a file in a sandbox (replacing it). Returns the absolute path written and its size."
    )]
    async fn write_file(
        &self,
        Parameters(a): Parameters<WriteArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let bytes = if a.base64 {
            match base64::engine::general_purpose::STANDARD.decode(a.content.as_bytes()) {
                Ok(b) => b,
                Err(e) => return fail(format!("content is not base64: {e}")),
            }
        } else {
            a.content.into_bytes()
        };
        let who = Caller::of(&ctx);
        let size = bytes.len();
        let mut req = self.request(
            &who,
            http::Method::PUT,
            format!(
                "/v1/sandboxes/{}/files?{}",
                a.sandbox_id,
                enc(&[("path", &a.path)])
            ),
        );
        req.body = Some(bytes.into());
        match self.send(req).await {
            Ok(b) => {
                let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
                ok_json(
                    &json!({"path": v.get("path").cloned().unwrap_or(a.path.into()), "size": size}),
                )
            }
            Err(e) => fail(e),
        }
    }

    #[tool(description = "List a directory in a sandbox: names, types, sizes, modes.")]
    async fn list_files(
        &self,
        Parameters(a): Parameters<PathArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let who = Caller::of(&ctx);
        let path = format!(
            "/v1/sandboxes/{}/files/list?{}",
            a.sandbox_id,
            enc(&[("path", &a.path)])
        );
        done(self.json(&who, http::Method::GET, path, None).await)
    }

    #[tool(
        description = "Snapshot a sandbox's filesystem under a name; create_sandbox can start from it later (via the API's `snapshot` field)."
    )]
    async fn snapshot_sandbox(
        &self,
        Parameters(a): Parameters<SnapshotArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let who = Caller::of(&ctx);
        let body = match a.name {
            Some(n) => json!({"name": n}),
            None => json!({}),
        };
        let path = format!("/v1/sandboxes/{}/snapshots", a.sandbox_id);
        done(self.json(&who, http::Method::POST, path, Some(body)).await)
    }

    #[tool(
        description = "Fork a sandbox: make `count` new sandboxes from one consistent point of its filesystem (to try several approaches from the same state). Returns their ids."
    )]
    async fn fork_sandbox(
        &self,
        Parameters(a): Parameters<ForkArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let who = Caller::of(&ctx);
        let path = format!("/v1/sandboxes/{}/fork", a.sandbox_id);
        let r = self
            .json(
                &who,
                http::Method::POST,
                path,
                Some(json!({"count": a.count.unwrap_or(1)})),
            )
            .await
            .map(|v| {
                let ids: Vec<Value> = v["sandboxes"]
                    .as_array()
                    .map(|a| a.iter().map(|s| s["id"].clone()).collect())
                    .unwrap_or_default();
                json!({"ids": ids})
            });
        done(r)
    }

    #[tool(
        description = "Get a sandbox's network policy (what it may connect to) and its addresses."
    )]
    async fn get_network_policy(
        &self,
        Parameters(a): Parameters<SandboxArg>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let who = Caller::of(&ctx);
        let path = format!("/v1/sandboxes/{}/network", a.sandbox_id);
        done(self.json(&who, http::Method::GET, path, None).await)
    }

    #[tool(
        description = "Replace a sandbox's network policy. New connections obey it at once; open connections it denies are cut."
    )]
    async fn set_network_policy(
        &self,
        Parameters(a): Parameters<PolicyArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let who = Caller::of(&ctx);
        let path = format!("/v1/sandboxes/{}/network", a.sandbox_id);
        done(
            self.json(&who, http::Method::PUT, path, Some(a.policy))
                .await,
        )
    }

    #[tool(
        description = "The URLs of a port a server in the sandbox listens on. Unless made public, a request needs the sandbox's token (header X-Rampart-Token), which the API gives its creator."
    )]
    async fn get_port_url(
        &self,
        Parameters(a): Parameters<PortArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let who = Caller::of(&ctx);
        let path = format!("/v1/sandboxes/{}/ports", a.sandbox_id);
        let list = match self.json(&who, http::Method::GET, path, None).await {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        let found = list["ports"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["port"] == a.port).cloned());
        match found {
            Some(p) => ok_json(&p),
            None => fail(format!(
                "nothing listens on port {} in sandbox {} yet (start the server first; listening ports: {})",
                a.port,
                a.sandbox_id,
                list["ports"]
                    .as_array()
                    .map(|ps| ps.iter().map(|p| p["port"].to_string()).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            )),
        }
    }

    #[tool(
        description = "Export a sandbox's signed record (every command, file operation and network decision, hash-chained and signed by the node) and verify it. Returns whether it verifies, a summary, and the bundle."
    )]
    async fn export_audit(
        &self,
        Parameters(a): Parameters<SandboxArg>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if let Err(e) = check_id(&a.sandbox_id) {
            return fail(e);
        }
        let who = Caller::of(&ctx);
        let key = match self
            .json(&who, http::Method::GET, "/v1/audit/key".into(), None)
            .await
        {
            Ok(k) => k,
            Err(e) => return fail(e),
        };
        let bundle = match self
            .send(self.request(
                &who,
                http::Method::GET,
                format!("/v1/sandboxes/{}/audit/bundle", a.sandbox_id),
            ))
            .await
        {
            Ok(b) => b,
            Err(e) => return fail(e),
        };
        let pinned = key["public_key"]
            .as_str()
            .and_then(|k| rampart_audit::PublicKey::parse(k).ok());
        let summary = match rampart_audit::verify_bundle(&bundle, pinned.as_ref()) {
            Ok(report) => {
                json!({"verified": true, "key": key["public_key"], "report": report.to_string()})
            }
            Err(e) => json!({"verified": false, "key": key["public_key"], "error": e.to_string()}),
        };
        Ok(CallToolResult::success(vec![
            ContentBlock::text(serde_json::to_string_pretty(&summary).unwrap_or_default()),
            ContentBlock::text(String::from_utf8_lossy(&bundle).into_owned()),
        ]))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for RampartMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("rampart", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Rampart sandboxes: isolated Linux machines for running untrusted commands and \
                 code. create_sandbox, then run_command / write_file / read_file in it, \
                 kill_sandbox when done. Everything done is recorded in a signed record \
                 (export_audit).",
            )
    }
}

/// An MCP client's name as the record keeps it: printable ASCII, at most 64 characters.
pub fn client_name(raw: &str) -> String {
    raw.chars()
        .filter(|ch| ch.is_ascii_graphic() || *ch == ' ')
        .take(64)
        .collect()
}

/// Marks the request as made by this MCP client (see [`CLIENT_HEADER`]).
pub fn client_header(client: &Option<String>) -> Option<(&'static str, String)> {
    client.as_ref().map(|c| (CLIENT_HEADER, client_name(c)))
}
