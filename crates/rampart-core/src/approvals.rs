//! Approvals: a sandbox's approval policy (`approvals` at create, kept with its create
//! request, so a restarted daemon still applies it) holds every exec whose command line
//! matches one of its patterns, on every road into the sandbox (the native API's waited,
//! streamed, WebSocket and background execs, and the E2B envd proxy), until a key with the
//! `approve` scope decides or the policy's timeout passes.
//!
//! The record has each step: `approval_requested` (the command line, the rule, the digest of
//! the request, who asked) before anyone is told, `approval_decided` (who, why, the same
//! digest) before the exec runs or is refused, and the `exec` that follows names its
//! approval. What is held is the request itself, in memory: the exec that runs is exactly
//! the one approved. A held request whose client leaves is withdrawn.

use crate::util::lock;
use crate::CoreError;
use rampart_types::{ApprovalInfo, ApprovalPolicy, Decision, ExecRequest, SandboxId};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// The default and the most a held request waits.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
const MAX_TIMEOUT_SECS: u64 = 86_400;
/// Patterns a policy may have, and the length of one.
const MAX_PATTERNS: usize = 64;
const MAX_PATTERN_LEN: usize = 1024;
/// Requests of one sandbox held at once: a sandbox that asks about host after host (or a
/// caller that sends command after command) is refused beyond it, not queued without end
/// in front of the people who decide.
pub const MAX_PENDING_PER_SANDBOX: usize = 32;
/// Decided ids remembered (so a second decision is a conflict, not "unknown").
const DECIDED_KEPT: usize = 4096;

/// A checked policy.
#[derive(Debug)]
pub(crate) struct Compiled {
    /// The policy as given (the record's `created.spec.approvals`).
    pub(crate) source: ApprovalPolicy,
    patterns: Vec<(String, regex::Regex)>,
    /// Hosts asked about (network rule syntax, checked by the egress tier).
    pub(crate) hosts: Vec<String>,
    timeout: Duration,
    allow_self: bool,
}

/// Checks `p` (400 naming the bad pattern).
pub(crate) fn compile(p: &ApprovalPolicy) -> Result<Compiled, CoreError> {
    let bad = |message: String| CoreError::BadRequest {
        field: "approvals".into(),
        message,
    };
    if p.commands.len() > MAX_PATTERNS {
        return Err(bad(format!("at most {MAX_PATTERNS} command patterns")));
    }
    let mut patterns = Vec::with_capacity(p.commands.len());
    for (i, c) in p.commands.iter().enumerate() {
        if c.is_empty() || c.len() > MAX_PATTERN_LEN {
            return Err(bad(format!(
                "commands[{i}]: a pattern is 1 to {MAX_PATTERN_LEN} bytes"
            )));
        }
        let re = regex::RegexBuilder::new(c)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| {
                bad(format!(
                    "commands[{i}]: {c:?} is not a regular expression: {e}"
                ))
            })?;
        patterns.push((c.clone(), re));
    }
    if p.hosts.len() > MAX_PATTERNS {
        return Err(bad(format!("at most {MAX_PATTERNS} host patterns")));
    }
    if let Err(e) = rampart_egress::ask::compile(&p.hosts) {
        let i = p.hosts.iter().position(|h| *h == e.rule).unwrap_or(0);
        return Err(bad(format!("hosts[{i}]: {e}")));
    }
    let timeout = match p.timeout_secs {
        None => DEFAULT_TIMEOUT,
        Some(0) => return Err(bad("timeout_secs: must be at least 1".into())),
        Some(s) if s > MAX_TIMEOUT_SECS => {
            return Err(bad(format!("timeout_secs: at most {MAX_TIMEOUT_SECS}")))
        }
        Some(s) => Duration::from_secs(s),
    };
    Ok(Compiled {
        source: p.clone(),
        patterns,
        hosts: p.hosts.clone(),
        timeout,
        allow_self: p.allow_self_approval,
    })
}

/// Checks a policy as create would (for a tenant's default, checked when it is set).
pub fn check(p: &ApprovalPolicy) -> Result<(), CoreError> {
    compile(p).map(|_| ())
}

/// A sandbox's policy under its tenant's default: the tenant's patterns and hosts are
/// always held, the sandbox's add to them; the sandbox's timeout when it gives one; self
/// approval only when both allow it.
pub fn floor(tenant: &ApprovalPolicy, own: Option<ApprovalPolicy>) -> ApprovalPolicy {
    let Some(own) = own else {
        return tenant.clone();
    };
    let union = |a: &[String], b: Vec<String>| {
        let mut out = a.to_vec();
        for x in b {
            if !out.contains(&x) {
                out.push(x);
            }
        }
        out
    };
    ApprovalPolicy {
        commands: union(&tenant.commands, own.commands),
        hosts: union(&tenant.hosts, own.hosts),
        timeout_secs: own.timeout_secs.or(tenant.timeout_secs),
        allow_self_approval: tenant.allow_self_approval && own.allow_self_approval,
    }
}

pub use rampart_types::approval::{command_lines, shell_join};

impl Compiled {
    /// The pattern `argv` matches first, if any.
    fn matches(&self, argv: &[String]) -> Option<&str> {
        let lines = command_lines(argv);
        self.patterns
            .iter()
            .find(|(_, re)| lines.iter().any(|l| re.is_match(l)))
            .map(|(p, _)| p.as_str())
    }
}

/// What a held request is, as the API describes it, and what deciding it needs.
struct Held {
    info: ApprovalInfo,
    key_id: Option<String>,
    caller: String,
    allow_self: bool,
    tx: oneshot::Sender<Decision>,
}

/// The approvals of the node.
#[derive(Default)]
pub(crate) struct Approvals {
    pending: Mutex<HashMap<String, Held>>,
    decided: Mutex<VecDeque<String>>,
    policies: Mutex<HashMap<SandboxId, Option<Arc<Compiled>>>>,
    /// The approvals webhook, when the config names one.
    pub(crate) webhook: std::sync::OnceLock<crate::webhook::Notifier>,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("pending", &lock(&self.pending).len())
            .finish_non_exhaustive()
    }
}

tokio::task_local! {
    static ON_HOLD: tokio::sync::mpsc::UnboundedSender<ApprovalInfo>;
}

/// Runs `f`; a request it makes that a policy holds is told to `tx` (a streamed exec says
/// `pending_approval` before it waits).
pub async fn on_hold<F: std::future::Future>(
    tx: tokio::sync::mpsc::UnboundedSender<ApprovalInfo>,
    f: F,
) -> F::Output {
    ON_HOLD.scope(tx, f).await
}

/// The digest an approval is bound to: SHA-256 of the request as made (argv, cwd, user,
/// environment, stdin, PTY).
pub(crate) fn request_digest(req: &ExecRequest) -> String {
    let v = serde_json::json!({
        "argv": req.cmd,
        "cwd": req.cwd,
        "user": req.user,
        "env": req.env,
        "stdin": req.stdin,
        "stdin_base64": req.stdin_base64,
        "tty": req.tty,
    });
    rampart_audit::content_digest(&serde_json::to_vec(&v).unwrap_or_default()).to_hex()
}

/// The digest a host approval is bound to: SHA-256 of `{"host","port"}`.
pub(crate) fn host_digest(host: &str, port: u16) -> String {
    let v = serde_json::json!({ "host": host, "port": port });
    rampart_audit::content_digest(&serde_json::to_vec(&v).unwrap_or_default()).to_hex()
}

/// A request to hold, before it has an id.
struct Request {
    kind: &'static str,
    request: String,
    digest: String,
    rule: String,
    caller: String,
    key_id: Option<String>,
}

/// Removes a pending entry when the wait for it ends, however it ends.
struct Pending<'a> {
    approvals: &'a Approvals,
    id: String,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        lock(&self.approvals.pending).remove(&self.id);
    }
}

/// How a held request ended.
pub(crate) enum Outcome {
    /// Approved: run it under this approval.
    Approved(String),
    /// Refused, with the decision.
    Refused(Decision),
}

impl Approvals {
    /// Forgets the policy of a sandbox that ended.
    pub(crate) fn forget(&self, id: &SandboxId) {
        lock(&self.policies).remove(id);
    }

    /// Keeps the policy of a sandbox just created (checked by its plan).
    pub(crate) fn keep(&self, id: &SandboxId, p: Option<ApprovalPolicy>) {
        let compiled = p.map(|p| Arc::new(Self::compiled_or_hold_all(id, &p)));
        lock(&self.policies).insert(id.clone(), compiled);
    }

    /// `p` compiled; a policy that no longer compiles (a pattern this build refuses) holds
    /// every command rather than none.
    fn compiled_or_hold_all(id: &SandboxId, p: &ApprovalPolicy) -> Compiled {
        compile(p).unwrap_or_else(|e| {
            tracing::error!(id = %id, "the sandbox's approval policy does not compile ({e}); every command is held");
            Compiled {
                source: p.clone(),
                patterns: vec![(".*".into(), regex::Regex::new(".*").expect("a valid pattern"))],
                hosts: Vec::new(),
                timeout: DEFAULT_TIMEOUT,
                allow_self: false,
            }
        })
    }

    /// The policy of `id`: kept, else read from its create request (`load`; an error there
    /// refuses the request rather than run it ungoverned).
    pub(crate) fn policy(
        &self,
        id: &SandboxId,
        load: impl FnOnce() -> Result<Option<ApprovalPolicy>, CoreError>,
    ) -> Result<Option<Arc<Compiled>>, CoreError> {
        if let Some(p) = lock(&self.policies).get(id) {
            return Ok(p.clone());
        }
        let p = load()?.map(|p| Arc::new(Self::compiled_or_hold_all(id, &p)));
        lock(&self.policies).insert(id.clone(), p.clone());
        Ok(p)
    }

    /// Holds `req` (of sandbox `id`, tenant `tenant`) if `policy` says so. `record` commits an
    /// event to the sandbox's record (requested, then decided). None: not held.
    pub(crate) async fn hold(
        &self,
        id: &SandboxId,
        tenant: Option<String>,
        policy: &Compiled,
        req: &ExecRequest,
        record: impl Fn(rampart_types::audit::EventBody) -> Result<(), CoreError>,
    ) -> Result<Option<Outcome>, CoreError> {
        let Some(rule) = policy.matches(&req.cmd) else {
            return Ok(None);
        };
        let held = Request {
            kind: "command",
            request: shell_join(&req.cmd),
            digest: request_digest(req),
            rule: rule.to_owned(),
            caller: crate::principal::current_caller(),
            key_id: crate::principal::current().and_then(|p| p.key_id),
        };
        self.wait(id, tenant, policy, held, record).await.map(Some)
    }

    /// Holds a connection of sandbox `id` that an ask pattern of its policy names. The
    /// sandbox asked (a process inside it), not an API caller: any key with the `approve`
    /// scope may decide.
    pub(crate) async fn hold_host(
        &self,
        id: &SandboxId,
        tenant: Option<String>,
        policy: &Compiled,
        ask: &rampart_egress::ask::Ask,
        record: impl Fn(rampart_types::audit::EventBody) -> Result<(), CoreError>,
    ) -> Result<Outcome, CoreError> {
        let held = Request {
            kind: "host",
            request: format!("{}:{}", ask.host, ask.port),
            digest: host_digest(&ask.host, ask.port),
            rule: ask.rule.clone(),
            caller: format!("sandbox {id}"),
            key_id: None,
        };
        self.wait(id, tenant, policy, held, record).await
    }

    /// Records `held` as requested, waits for its decision (or the policy's timeout),
    /// records the decision.
    async fn wait(
        &self,
        id: &SandboxId,
        tenant: Option<String>,
        policy: &Compiled,
        held: Request,
        record: impl Fn(rampart_types::audit::EventBody) -> Result<(), CoreError>,
    ) -> Result<Outcome, CoreError> {
        use rampart_types::audit::{ApprovalDecided, ApprovalRequested, EventBody};
        let waiting = lock(&self.pending)
            .values()
            .filter(|h| h.info.sandbox_id == id.as_str())
            .count();
        if waiting >= MAX_PENDING_PER_SANDBOX {
            return Err(CoreError::Conflict(format!(
                "sandbox {id} has {waiting} requests waiting for approval, the most it may; \
                 decide some first"
            )));
        }
        let approval_id = format!("ap_{}", &rampart_store::access::new_token()[..24]);
        let now = rampart_store::now_ms();
        let Request {
            kind,
            request,
            digest,
            rule,
            caller,
            key_id,
        } = held;
        let info = ApprovalInfo {
            id: approval_id.clone(),
            sandbox_id: id.to_string(),
            kind: kind.into(),
            request,
            digest: digest.clone(),
            rule,
            requested_by: caller.clone(),
            requested_at: crate::util::rfc3339(now),
            expires_at: crate::util::rfc3339(now + policy.timeout.as_millis() as i64),
            tenant,
        };
        record(EventBody::ApprovalRequested(ApprovalRequested {
            approval_id: approval_id.clone(),
            kind: info.kind.clone(),
            request: info.request.clone(),
            digest: digest.clone(),
            rule: info.rule.clone(),
            caller: caller.clone(),
        }))?;
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(
            approval_id.clone(),
            Held {
                info: info.clone(),
                key_id,
                caller,
                allow_self: policy.allow_self,
                tx,
            },
        );
        let mut guard = Some(Pending {
            approvals: self,
            id: approval_id.clone(),
        });
        let _ = ON_HOLD.try_with(|t| t.send(info.clone()).is_ok());
        self.notify(&info);
        // Withdrawn if the asker leaves: recorded by the guard's owner below when it can.
        let withdrawn = WithdrawOnDrop {
            record: &record,
            approval_id: &approval_id,
            digest: &digest,
            armed: true,
        };
        let decision = match tokio::time::timeout(policy.timeout, rx).await {
            Ok(Ok(d)) => d,
            Ok(Err(_)) | Err(_) => Decision {
                id: approval_id.clone(),
                decision: "timed_out".into(),
                by: "node".into(),
                reason: Some(format!("no decision within {} s", policy.timeout.as_secs())),
            },
        };
        let mut withdrawn = withdrawn;
        withdrawn.armed = false;
        drop(withdrawn);
        drop(guard.take());
        self.remember(&approval_id);
        record(EventBody::ApprovalDecided(ApprovalDecided {
            approval_id: approval_id.clone(),
            decision: decision.decision.clone(),
            by: decision.by.clone(),
            reason: decision.reason.clone(),
            digest: digest.clone(),
        }))?;
        if let Some(w) = self.webhook.get() {
            w.send(
                info.tenant.as_deref(),
                crate::webhook::Notice::Decided {
                    sandbox_id: id.to_string(),
                    decision: decision.clone(),
                },
            );
        }
        Ok(if decision.decision == "approved" {
            Outcome::Approved(approval_id.clone())
        } else {
            Outcome::Refused(decision)
        })
    }

    /// Tells the webhook (if any) of a held request.
    fn notify(&self, info: &ApprovalInfo) {
        if let Some(w) = self.webhook.get() {
            w.send(
                info.tenant.as_deref(),
                crate::webhook::Notice::Requested {
                    approval: info.clone(),
                },
            );
        }
    }

    fn remember(&self, id: &str) {
        let mut d = lock(&self.decided);
        d.push_back(id.to_owned());
        while d.len() > DECIDED_KEPT {
            d.pop_front();
        }
    }

    /// What is pending, oldest first, that `visible` lets the caller see.
    pub(crate) fn list(&self, visible: impl Fn(&ApprovalInfo) -> bool) -> Vec<ApprovalInfo> {
        let mut out: Vec<ApprovalInfo> = lock(&self.pending)
            .values()
            .map(|h| h.info.clone())
            .filter(|i| visible(i))
            .collect();
        out.sort_by(|a, b| a.requested_at.cmp(&b.requested_at).then(a.id.cmp(&b.id)));
        out
    }

    /// The pending approval `id`, if `visible`.
    pub(crate) fn get(
        &self,
        id: &str,
        visible: impl Fn(&ApprovalInfo) -> bool,
    ) -> Result<ApprovalInfo, CoreError> {
        match lock(&self.pending).get(id) {
            Some(h) if visible(&h.info) => Ok(h.info.clone()),
            _ => Err(self.missing(id)),
        }
    }

    fn missing(&self, id: &str) -> CoreError {
        if lock(&self.decided).iter().any(|d| d == id) {
            CoreError::Conflict(format!("approval {id} is already decided"))
        } else {
            CoreError::NoApproval(id.to_owned())
        }
    }

    /// Decides `id` for the current principal: `approve`, with `reason`.
    pub(crate) fn decide(
        &self,
        id: &str,
        approve: bool,
        reason: Option<String>,
        visible: impl Fn(&ApprovalInfo) -> bool,
    ) -> Result<Decision, CoreError> {
        let me = crate::principal::current();
        let caller = crate::principal::current_caller();
        let mut pending = lock(&self.pending);
        let Some(h) = pending.get(id).filter(|h| visible(&h.info)) else {
            drop(pending);
            return Err(self.missing(id));
        };
        let same_key = match (&h.key_id, me.as_ref().and_then(|p| p.key_id.as_ref())) {
            (Some(a), Some(b)) => a == b,
            // Without keys (the socket): the same caller is the same person.
            (None, None) => h.caller == caller,
            _ => false,
        };
        if same_key && !h.allow_self {
            return Err(CoreError::Forbidden(format!(
                "approval {id}: a caller may not decide its own request (the sandbox's policy \
                 has allow_self_approval false); ask another key with the approve scope"
            )));
        }
        let h = pending.remove(id).expect("looked up above");
        drop(pending);
        let d = Decision {
            id: id.to_owned(),
            decision: if approve { "approved" } else { "denied" }.into(),
            by: caller,
            reason,
        };
        self.remember(id);
        // The asker left (withdrawn) if it cannot hear; the decision is then moot.
        let _ = h.tx.send(d.clone());
        Ok(d)
    }
}

/// Records `withdrawn` when the wait for a decision is dropped (its client left).
struct WithdrawOnDrop<'a, R: Fn(rampart_types::audit::EventBody) -> Result<(), CoreError>> {
    record: &'a R,
    approval_id: &'a str,
    digest: &'a str,
    armed: bool,
}

impl<R: Fn(rampart_types::audit::EventBody) -> Result<(), CoreError>> Drop
    for WithdrawOnDrop<'_, R>
{
    fn drop(&mut self) {
        if self.armed {
            let _ = (self.record)(rampart_types::audit::EventBody::ApprovalDecided(
                rampart_types::audit::ApprovalDecided {
                    approval_id: self.approval_id.to_owned(),
                    decision: "withdrawn".into(),
                    by: "node".into(),
                    reason: Some("the request's client left before a decision".into()),
                    digest: self.digest.to_owned(),
                },
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn patterns_match_the_command_line_and_a_shells_script() {
        let p = compile(&ApprovalPolicy {
            commands: vec!["^rm( |$)".into(), "^git push".into()],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(p.matches(&argv(&["rm", "-rf", "/tmp/x"])), Some("^rm( |$)"));
        assert_eq!(p.matches(&argv(&["bash", "-lc", "rm x"])), Some("^rm( |$)"));
        assert_eq!(
            p.matches(&argv(&["sh", "-c", "git push origin"])),
            Some("^git push")
        );
        assert_eq!(p.matches(&argv(&["rmdir", "x"])), None);
        assert_eq!(p.matches(&argv(&["echo", "rm"])), None);
    }

    #[test]
    fn bad_policies_are_refused_naming_the_pattern() {
        let e = compile(&ApprovalPolicy {
            commands: vec!["ok".into(), "(unclosed".into()],
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("commands[1]") && e.contains("(unclosed"), "{e}");
        for t in [0, 86_401] {
            let e = compile(&ApprovalPolicy {
                timeout_secs: Some(t),
                ..Default::default()
            });
            assert!(e.is_err(), "{t}");
        }
    }

    #[tokio::test]
    async fn a_sandbox_may_keep_only_so_many_requests_waiting() {
        let a = Approvals::default();
        let policy = compile(&ApprovalPolicy {
            hosts: vec!["*.example.com".into()],
            timeout_secs: Some(600),
            ..Default::default()
        })
        .unwrap();
        let id = SandboxId::parse("abc").unwrap();
        let other = SandboxId::parse("def").unwrap();
        let ask = |n: usize| rampart_egress::ask::Ask {
            sandbox: "abc".into(),
            host: format!("h{n}.example.com"),
            port: 443,
            rule: "*.example.com".into(),
        };
        let record = |_| Ok(());
        let asks: Vec<_> = (0..=MAX_PENDING_PER_SANDBOX).map(ask).collect();
        let mut held = Vec::new();
        for q in &asks[..MAX_PENDING_PER_SANDBOX] {
            let mut f = Box::pin(a.hold_host(&id, None, &policy, q, record));
            // Polled once: it records its request and waits.
            assert!(futures::poll!(&mut f).is_pending());
            held.push(f);
        }
        assert_eq!(a.list(|_| true).len(), MAX_PENDING_PER_SANDBOX);
        let e = a
            .hold_host(&id, None, &policy, &asks[MAX_PENDING_PER_SANDBOX], record)
            .await
            .err()
            .expect("refused beyond the bound");
        assert!(matches!(e, CoreError::Conflict(_)), "{e}");
        // Another sandbox is not held back by this one.
        let mut f = Box::pin(a.hold_host(&other, None, &policy, &asks[0], record));
        assert!(futures::poll!(&mut f).is_pending());
        drop(held);
        assert_eq!(a.list(|_| true).len(), 1, "dropped waits are withdrawn");
    }

    #[test]
    fn a_tenants_policy_is_a_floor() {
        let t = ApprovalPolicy {
            commands: vec!["^rm".into()],
            hosts: vec!["*.example.com".into()],
            timeout_secs: Some(60),
            allow_self_approval: false,
        };
        assert_eq!(floor(&t, None), t);
        let own = ApprovalPolicy {
            commands: vec!["^git push".into(), "^rm".into()],
            hosts: vec![],
            timeout_secs: None,
            allow_self_approval: true,
        };
        let f = floor(&t, Some(own));
        assert_eq!(f.commands, vec!["^rm".to_string(), "^git push".to_string()]);
        assert_eq!(f.hosts, t.hosts);
        assert_eq!(f.timeout_secs, Some(60));
        assert!(!f.allow_self_approval);
    }

    #[test]
    fn the_digest_binds_every_part_of_the_request() {
        let a = ExecRequest {
            cmd: argv(&["rm", "x"]),
            env: Default::default(),
            cwd: None,
            user: None,
            stdin: None,
            stdin_base64: None,
            tty: None,
            timeout_secs: None,
            stream: false,
            max_output_bytes: None,
        };
        let mut b = a.clone();
        b.cwd = Some("/".into());
        let mut c = a.clone();
        c.user = Some("root".into());
        assert_ne!(request_digest(&a), request_digest(&b));
        assert_ne!(request_digest(&a), request_digest(&c));
        assert_eq!(request_digest(&a), request_digest(&a.clone()));
    }
}
