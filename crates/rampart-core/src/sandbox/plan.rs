//! A create request made into a plan: secrets by name resolved to their values, the
//! snapshot and volumes staged, limits, timeout and template validated against the config,
//! the network policy and public ports checked, the access token (and, for the E2B API, the
//! E2B facts) made. Nothing is written; a plan that is dropped leaves nothing.

use super::Sandboxes;
use crate::persist::Staged;
use crate::{validate, CoreError};
use rampart_store::access::{new_token, E2bSandbox, NewAccess};
use rampart_store::{now_ms, NewSandbox};
use rampart_types::{CreateSandbox, SandboxId, Tier};

/// What a front end asks of a create beyond the request itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateOptions {
    /// Made through the E2B API, which named this template: the sandbox gets E2B facts (an
    /// envd access token and this name), recorded and forgotten with it (see
    /// [`rampart_store::access`]).
    pub e2b_template: Option<String>,
    /// With `e2b_template`: the E2B options to record with the facts (JSON, see
    /// [`rampart_store::access::E2bSandbox::options`]).
    pub e2b_options: Option<String>,
}

/// What a create will make.
pub(super) struct Plan {
    /// The store's row of the new sandbox.
    pub(super) new: NewSandbox,
    /// Its disk source and volumes (snapshot, fork point).
    pub(super) staged: Staged,
}

impl Sandboxes {
    /// Validates `req` into a [`Plan`] (the error says what is wrong, with its field).
    pub(super) fn plan(
        &self,
        mut req: CreateSandbox,
        opts: CreateOptions,
    ) -> Result<Plan, CoreError> {
        let cfg = &self.cfg;
        // The approval policy first: a bad pattern is refused before anything is staged.
        if let Some(a) = &req.approvals {
            crate::approvals::compile(a)?;
        }
        // Secrets by name (`/v1/secrets`) become secrets with their stored value, before the
        // request is kept for fork (a fork binds the same values).
        req.secrets = self.secrets.resolve(&req.secrets)?;
        // The tier: asked for, else its template's, else the node's default; a tier this
        // node lacks is refused by name, never replaced by another.
        // A snapshot (or a fork's point) was taken on a tier: what is made from it runs
        // there.
        let taken_on = req
            .snapshot
            .as_deref()
            .and_then(|n| self.persist.snapshot_tier(n));
        let tier = match (req.isolation, taken_on) {
            (Some(t), Some(s)) if t != s => {
                return Err(CoreError::BadRequest {
                    field: "isolation".into(),
                    message: format!(
                        "snapshot {:?} was taken on the {s} tier; a sandbox made from it runs there (leave isolation out)",
                        req.snapshot.as_deref().unwrap_or_default()
                    ),
                })
            }
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => crate::templates::isolation_of(
                &cfg.data_dir,
                req.template.as_deref().unwrap_or("base"),
            )?
            .unwrap_or(cfg.default_isolation),
        };
        if let Some(why) = self.iso.missing(tier) {
            return Err(CoreError::BadRequest {
                field: "isolation".into(),
                message: why,
            });
        }
        if tier == Tier::Gvisor {
            refuse_on_gvisor(&req)?;
        }
        // Snapshot and volumes (fills the template from the snapshot).
        let staged = self.persist.prepare_create(self.iso.as_ref(), &mut req)?;
        // A code-interpreter sandbox runs a kernel per context: more memory unless asked.
        let interp = req
            .template
            .as_deref()
            .is_some_and(|t| crate::templates::runs_interpreter(&cfg.data_dir, t));
        let defaults =
            crate::interpreter::default_limits(interp, &cfg.default_limits, &cfg.max_limits);
        let v = validate::check_create_with(
            &req,
            &defaults,
            &cfg.max_limits,
            cfg.default_timeout_secs,
            cfg.max_timeout_secs,
            &|n| crate::templates::is_built(&cfg.data_dir, n),
        )?;
        let net = self.network.check(req.network.as_ref(), &req.secrets)?;
        if let Some(secs) = req.idle_pause_secs {
            validate::check_timeout("idle_pause_secs", secs, cfg.max_timeout_secs)?;
        }
        // The token that opens its ports (and the E2B facts), recorded with it (forgotten
        // when it ends).
        let access = NewAccess {
            token: new_token(),
            public_ports: validate::check_public_ports(&req.public_ports)?,
            e2b: opts.e2b_template.map(|template| E2bSandbox {
                access_token: new_token(),
                template,
                options: opts.e2b_options.unwrap_or_default(),
            }),
        };
        let created = now_ms();
        let new = NewSandbox {
            id: SandboxId::generate(),
            template: v.template,
            limits: v.limits,
            env: req.env,
            metadata: req.metadata,
            created_at_ms: created,
            expires_at_ms: created.saturating_add((v.timeout_secs as i64).saturating_mul(1000)),
            access: Some(access),
            on_timeout: req.on_timeout.unwrap_or_default(),
            network: net,
            request: Some(staged.request().to_owned()),
            tenant: crate::principal::current_tenant(),
            isolation: tier,
            idle_pause_secs: req.idle_pause_secs,
            pooled: false,
        };
        Ok(Plan { new, staged })
    }
}

/// What a sandbox on the gVisor tier cannot have yet, refused before anything is made.
fn refuse_on_gvisor(req: &CreateSandbox) -> Result<(), CoreError> {
    let lacks = if !req.volumes.is_empty() {
        Some("volumes")
    } else if !req.artifacts.is_empty() {
        Some("artifacts")
    } else if req
        .network
        .as_ref()
        .is_some_and(|n| n.mode != rampart_types::NetworkMode::None)
        || !req.secrets.is_empty()
    {
        Some("network")
    } else {
        None
    };
    match lacks {
        Some(field) => Err(CoreError::BadRequest {
            field: "isolation".into(),
            message: format!(
                "a sandbox on the gvisor tier cannot have {field} yet; leave out {field:?} or use the namespace tier"
            ),
        }),
        None => Ok(()),
    }
}
