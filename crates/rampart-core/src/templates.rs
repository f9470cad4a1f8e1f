//! Built templates (`rampart-image`'s store under `<data>/images/`) at create: name
//! resolution (the store is read at each create, so a template built while the daemon runs
//! is usable at once), the launch environment and agent arguments from the template's
//! metadata (user, workdir, env), and its start command with its readiness check.

use crate::CoreError;
use futures::StreamExt as _;
use rampart_agent::client::{AgentClient, ClientError, ProcessEvent, StartOptions};
use rampart_image::spec::Ready;
use rampart_image::{ImageError, Store, TemplateConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The tag of a template's start process (`commands.list()` shows it).
pub const START_TAG: &str = "template-start";
/// Most bytes of the start command's output kept to explain a failed start.
const OUTPUT_TAIL: usize = 4096;

/// A built template, resolved for a launch.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The template id (manifest digest).
    pub id: String,
    /// Host directories of its layers, bottom first.
    pub layers: Vec<PathBuf>,
    /// Their keys.
    pub keys: Vec<String>,
    /// Its metadata.
    pub config: TemplateConfig,
    /// The built-in template its layers stack on (`base`), if any.
    pub on_base: Option<String>,
}

/// Whether `name` is a built template in `data`'s store.
pub(crate) fn is_built(data: &Path, name: &str) -> bool {
    Store::open_existing(data).is_some_and(|s| s.name(name).is_some())
}

/// The isolation tier a built template's sandboxes run on unless their create names one
/// (`None` for a built-in template or one whose spec names none).
pub(crate) fn isolation_of(
    data: &Path,
    name: &str,
) -> Result<Option<rampart_types::Tier>, CoreError> {
    if crate::validate::TEMPLATES.contains(&name) {
        return Ok(None);
    }
    // Only the manifest is needed (not its layers' paths), as for `runs_interpreter`.
    let Some(store) = Store::open_existing(data) else {
        return Ok(None);
    };
    match store.resolve(name) {
        Ok((_, m)) => Ok(m.config.isolation),
        Err(ImageError::UnknownTemplate(_)) => Ok(None),
        Err(e) => Err(CoreError::failed(format!("template {name}"))(e)),
    }
}

/// Resolves a built template (`None` when `name` is not one).
pub(crate) fn resolve(data: &Path, name: &str) -> Result<Option<Resolved>, CoreError> {
    let Some(store) = Store::open_existing(data) else {
        return Ok(None);
    };
    let (id, m) = match store.resolve(name) {
        Ok(r) => r,
        Err(ImageError::UnknownTemplate(_)) => return Ok(None),
        Err(e) => return Err(CoreError::failed(format!("template {name}"))(e)),
    };
    let layers = store
        .layer_paths(&m)
        .map_err(CoreError::failed(format!("template {name}")))?;
    Ok(Some(Resolved {
        id,
        layers,
        keys: m.layers,
        config: m.config,
        on_base: m.base,
    }))
}

/// Keeps `rampart template gc` from removing layers between a create's [`resolve`] and the
/// moment its [`pin`] counts (its sandbox's directory exists): hold it from the resolve to
/// the end of the launch (None when there is no template store).
pub(crate) fn pin_guard(data: &Path) -> Result<Option<rampart_image::StoreLock>, CoreError> {
    let Some(store) = Store::open_existing(data) else {
        return Ok(None);
    };
    store
        .pin_guard()
        .map(Some)
        .map_err(CoreError::failed("template store"))
}

/// Pins a sandbox's layers against `rampart template gc` while its directory exists.
pub(crate) fn pin(
    data: &Path,
    id: &str,
    sandbox_dir: &Path,
    t: &Resolved,
) -> Result<(), CoreError> {
    let store = Store::open_existing(data)
        .ok_or_else(|| CoreError::Internal("the template store vanished".into()))?;
    store
        .pin(id, sandbox_dir, &t.keys)
        .map_err(CoreError::failed("pinning the template's layers"))
}

/// `builder` able to stack on the built-in templates in `templates_dir` (`base`, and the
/// code interpreter's `code-interpreter-v1`: base with the interpreter's server, which a
/// sandbox of a template built on it starts as one of `code-interpreter-v1` does).
pub fn with_builtins<'a>(
    builder: rampart_image::build::Builder<'a>,
    templates_dir: &Path,
) -> rampart_image::build::Builder<'a> {
    crate::validate::TEMPLATES
        .iter()
        .fold(builder, |b, t| b.with_builtin(t, templates_dir.join(t)))
}

/// Whether sandboxes of `template` run the code interpreter's server: the built-in one, or
/// a template built on it. A built-in name is answered without reading the store (the
/// create of a `base` sandbox does no template I/O here).
pub(crate) fn runs_interpreter(data: &Path, template: &str) -> bool {
    if crate::validate::TEMPLATES.contains(&template) {
        return template == crate::interpreter::TEMPLATE;
    }
    // Only the manifest's `base` is needed (not its layers' paths).
    Store::open_existing(data)
        .and_then(|s| s.resolve(template).ok())
        .and_then(|(_, m)| m.base)
        .as_deref()
        == Some(crate::interpreter::TEMPLATE)
}

/// The request's environment over the template's (the daemon's base under both).
pub(crate) fn merged_env(
    t: Option<&Resolved>,
    req: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = t.map(|t| t.config.env.clone()).unwrap_or_default();
    env.extend(req.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Agent arguments for the template's default user and working directory.
pub(crate) fn agent_args(t: Option<&Resolved>) -> Vec<String> {
    let mut a = Vec::new();
    if let Some(t) = t {
        a.extend([
            "--default-user".to_owned(),
            t.config.user.clone().unwrap_or_else(|| "root".into()),
        ]);
        if let Some(w) = &t.config.workdir {
            a.extend(["--default-cwd".to_owned(), w.clone()]);
        }
    }
    a
}

fn keep_tail(buf: &mut Vec<u8>, b: &[u8]) {
    buf.extend_from_slice(b);
    if buf.len() > OUTPUT_TAIL {
        buf.drain(..buf.len() - OUTPUT_TAIL);
    }
}

/// Runs `cmd` (shell) to its end as `user`, for at most until `deadline` (a check may take
/// time, as E2B's `wait_for_timeout` does); whether it exited 0.
async fn probe_cmd(
    client: &AgentClient,
    cmd: &str,
    user: Option<String>,
    cwd: Option<String>,
    deadline: Instant,
) -> Result<bool, CoreError> {
    let left = deadline.saturating_duration_since(Instant::now());
    let opts = StartOptions {
        cmd: "/bin/sh".into(),
        args: vec!["-c".into(), cmd.to_owned()],
        user,
        cwd,
        timeout: Some(left.max(Duration::from_secs(1))),
        ..Default::default()
    };
    let mut ev = client.start(opts).await?;
    while let Some(e) = ev.next().await {
        if let Ok(ProcessEvent::End { exit_code, .. }) = e {
            return Ok(exit_code == 0);
        }
    }
    Ok(false)
}

/// Starts the template's start command (if any) as its user in its workdir, and waits for
/// its readiness check: a TCP port that accepts (through the agent's port tunnel) or a
/// command that exits 0, polled until the template's timeout. Fails with the command's
/// output if it exits first or is not ready in time. A readiness check without a start
/// command (E2B's `set_ready_cmd` alone) is awaited the same way.
pub(crate) async fn start(client: &AgentClient, t: &Resolved) -> Result<(), CoreError> {
    let Some(s) = &t.config.start else {
        return Ok(());
    };
    let mut events = match s.cmd.split_first() {
        Some((cmd, args)) => {
            let opts = StartOptions {
                cmd: cmd.clone(),
                args: args.to_vec(),
                user: t.config.user.clone(),
                cwd: t.config.workdir.clone(),
                tag: Some(START_TAG.into()),
                ..Default::default()
            };
            Some(client.start(opts).await?)
        }
        None => None,
    };
    let Some(ready) = &s.ready else {
        return Ok(());
    };
    let deadline = Instant::now() + Duration::from_secs(s.timeout_secs);
    let mut output = Vec::new();
    let mut delay = Duration::from_millis(20);
    loop {
        let ok = match ready {
            Ready::Port(p) => match client.tunnel(*p).await {
                Ok(_) => true,
                Err(ClientError::Rpc { .. }) => false,
                Err(e) => return Err(e.into()),
            },
            Ready::Cmd(c) => {
                probe_cmd(
                    client,
                    c,
                    t.config.user.clone(),
                    t.config.workdir.clone(),
                    deadline,
                )
                .await?
            }
        };
        if ok {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CoreError::Internal(format!(
                "the template's start command was not ready within {} s: {}",
                s.timeout_secs,
                String::from_utf8_lossy(&output).trim()
            )));
        }
        let pause = tokio::time::sleep(delay);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                ev = async {
                    match events.as_mut() {
                        Some(e) => e.next().await,
                        None => std::future::pending().await,
                    }
                } => match ev {
                    Some(Ok(ProcessEvent::Stdout(b) | ProcessEvent::Stderr(b))) => keep_tail(&mut output, &b),
                    Some(Ok(ProcessEvent::End { status, .. })) => {
                        return Err(CoreError::Internal(format!(
                            "the template's start command exited ({status}) before it was ready: {}",
                            String::from_utf8_lossy(&output).trim()
                        )));
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.into()),
                    None => {
                        // Output ended; keep polling the check until the deadline.
                        (&mut pause).await;
                        break;
                    }
                }
            }
        }
        delay = (delay * 2).min(Duration::from_millis(200));
    }
}

fn builtin_info(name: &str) -> rampart_types::TemplateInfo {
    rampart_types::TemplateInfo {
        name: name.to_owned(),
        kind: "builtin".into(),
        id: None,
        layers: None,
        size_bytes: None,
        created_at: None,
        user: Some("user".into()),
        workdir: None,
        env_names: Vec::new(),
        start: None,
    }
}

fn built_info(t: rampart_image::store::TemplateEntry) -> rampart_types::TemplateInfo {
    rampart_types::TemplateInfo {
        name: t.name,
        kind: "built".into(),
        id: Some(t.id),
        layers: Some(t.layers.len()),
        size_bytes: Some(t.size_bytes),
        created_at: Some(t.created_at),
        user: t.config.user,
        workdir: t.config.workdir,
        env_names: t.config.env.into_keys().collect(),
        start: t.config.start.map(|s| s.cmd),
    }
}

/// Every template a caller of `tenant` sees ([`visible_name`]): the built-in ones, then
/// the built ones by name (a tenant's own under the name it gave, hiding an operator's
/// template of the same name, which its own replaces for it).
pub(crate) fn list(data: &Path, tenant: Option<&str>) -> Vec<rampart_types::TemplateInfo> {
    let mut out: Vec<_> = crate::validate::TEMPLATES
        .iter()
        .map(|n| builtin_info(n))
        .collect();
    if let Some(s) = Store::open_existing(data) {
        let mut own = Vec::new();
        let mut published = Vec::new();
        for t in s.list() {
            let Some(shown) = visible_name(tenant, &t.name) else {
                continue;
            };
            let mine = tenant.is_some() && matches!(owner_of_stored(&t.name).0, Owner::Tenant(_));
            let mut info = built_info(t);
            info.name = shown;
            if mine {
                own.push(info);
            } else {
                published.push(info);
            }
        }
        // A tenant's own template (any tag) replaces the operator's of the same name.
        let own_names: std::collections::BTreeSet<String> = own
            .iter()
            .map(|t| t.name.split(':').next().unwrap_or_default().to_owned())
            .collect();
        published.retain(|t| !own_names.contains(t.name.split(':').next().unwrap_or_default()));
        out.extend(published);
        out.extend(own);
        out.sort_by(|a, b| (a.kind != "builtin", &a.name).cmp(&(b.kind != "builtin", &b.name)));
    }
    out
}

/// One template by name, as a caller of `tenant` sees it ([`lookup`]).
pub(crate) fn get(
    data: &Path,
    tenant: Option<&str>,
    name: &str,
) -> Result<rampart_types::TemplateInfo, CoreError> {
    let r = lookup(data, tenant, name, Access::Read)?;
    let stored = r.stored_ref();
    let shown = match &r.tag {
        Some(t) if t != rampart_image::DEFAULT_TAG => format!("{}:{t}", r.name),
        _ => r.name.clone(),
    };
    let mut all: Vec<_> = crate::validate::TEMPLATES
        .iter()
        .map(|n| builtin_info(n))
        .collect();
    if let Some(s) = Store::open_existing(data) {
        all.extend(s.list().into_iter().map(built_info));
    }
    let mut t = all
        .into_iter()
        .find(|t| t.name == stored)
        .ok_or_else(|| no_template(name))?;
    t.name = shown;
    Ok(t)
}

/// Removes what a template build killed with SIGKILL left (its build sandbox: processes,
/// cgroup, directory; its temp layers), unless a build is running (it holds the store's
/// lock), and the links and nftables tables of build network slots no process holds
/// (builds of any data directory on this host). Blocking; called at daemon start.
pub(crate) fn clean_build_leftovers(cfg: &crate::CoreConfig) {
    rampart_image::build::clean_network_leftovers();
    let Some(store) = Store::open_existing(&cfg.data_dir) else {
        return;
    };
    let build = store.root().join("build");
    let has_sandboxes = std::fs::read_dir(&build).is_ok_and(|mut r| r.next().is_some());
    let has_tmp = std::fs::read_dir(store.root().join("tmp")).is_ok_and(|mut r| r.next().is_some());
    if !has_sandboxes && !has_tmp {
        return;
    }
    let Ok(_lock) = store.lock() else {
        return; // a build is running
    };
    store.clean_tmp();
    if has_sandboxes {
        // Setting the build tier up removes its leftovers.
        match rampart_image::build::JailRunner::new(
            &cfg.data_dir,
            cfg.jailer_bin.clone(),
            cfg.agent_bin.clone(),
            rampart_image::build::DEFAULT_BUILD_UID_BASE,
        ) {
            Ok(_) => tracing::info!("removed the leftovers of an interrupted template build"),
            Err(e) => tracing::warn!("removing template build leftovers: {e}"),
        }
    }
}

/// Who a template belongs to (see `docs/tenants.md`, "Templates").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A built-in template (`base`, `code-interpreter-v1`): everyone's; nobody rebuilds,
    /// retags or deletes it.
    BuiltIn,
    /// Built by the operator (the node: the admin key, the local socket, `rampart template
    /// build`): published to every tenant, changed only by the operator.
    Operator,
    /// A tenant's own: only that tenant sees, uses or changes it.
    Tenant(String),
}

/// What the caller is about to do with a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// See it, use it (create a sandbox of it, build on it), read its tags.
    Read,
    /// Build it, tag it, delete it, upload its files.
    Write,
}

/// A template name resolved for the caller of the request being served ([`lookup`]): the
/// only way the daemon turns a name a client gave into the store's name, so every road
/// (create, the E2B create, builds, their logs, tags, delete, files, lists) sees the same
/// owner check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRef {
    /// The name the caller knows it by (no tag).
    pub name: String,
    /// The tag asked for (None: the default one).
    pub tag: Option<String>,
    /// The store's name of the template: `<tenant>~<name>` for a tenant's, else `name`.
    pub stored: String,
    /// Whose it is.
    pub owner: Owner,
}

impl TemplateRef {
    /// The store's reference of the tag asked for (`stored[:tag]`).
    pub fn stored_ref(&self) -> String {
        self.stored_tag(self.tag.as_deref())
    }

    /// The store's reference of tag `tag` of this template (None: the default one).
    pub fn stored_tag(&self, tag: Option<&str>) -> String {
        match tag {
            Some(t) if t != rampart_image::DEFAULT_TAG => format!("{}:{t}", self.stored),
            _ => self.stored.clone(),
        }
    }

    /// The tenant that owns it (None: a built-in's or the operator's).
    pub fn tenant(&self) -> Option<&str> {
        match &self.owner {
            Owner::Tenant(t) => Some(t),
            _ => None,
        }
    }
}

fn no_template(name: &str) -> CoreError {
    CoreError::NoTemplate(name.to_owned())
}

/// The name a tenant's template is stored under.
fn stored_for(tenant: &str, name: &str) -> String {
    format!("{tenant}{}{name}", rampart_image::OWNER_SEP)
}

/// Who owns the template stored as `stored` and the name its owner knows it by.
pub(crate) fn owner_of_stored(stored: &str) -> (Owner, &str) {
    if crate::validate::TEMPLATES.contains(&stored) {
        return (Owner::BuiltIn, stored);
    }
    match stored.split_once(rampart_image::OWNER_SEP) {
        Some((t, n)) => (Owner::Tenant(t.to_owned()), n),
        None => (Owner::Operator, stored),
    }
}

/// Resolves `reference` (`name` or `name:tag`, as a client gave it) for a caller of
/// `tenant` (None: the node), for `access`:
/// - the node (operator, no tenant) names the store as it is: every template, a tenant's
///   as `<tenant>~<name>`; it may change any but the built-in ones;
/// - a tenant sees the built-in templates, the operator's (published to all) and its own;
///   its own name wins over the operator's. Another tenant's template is not found
///   ([`CoreError::NoTemplate`]), exactly as a name that does not exist. A tenant writes only
///   its own names: writing a built-in or an operator's template is
///   [`CoreError::Forbidden`]; writing a name it does not have yet is allowed (a build
///   makes it).
///
/// For [`Access::Read`] the template must exist (the given tag, or any tag when none is
/// given and the store has only tags); for [`Access::Write`] it need not.
pub fn lookup(
    data: &Path,
    tenant: Option<&str>,
    reference: &str,
    access: Access,
) -> Result<TemplateRef, CoreError> {
    let (name, tag) = match reference.split_once(':') {
        Some((n, t)) => (n, Some(t.to_owned())),
        None => (reference, None),
    };
    if name.is_empty() {
        return Err(no_template(reference));
    }
    let store = Store::open_existing(data);
    let exists = |stored: &str| {
        let probe = TemplateRef {
            name: String::new(),
            tag: tag.clone(),
            stored: stored.to_owned(),
            owner: Owner::Operator,
        };
        store.as_ref().is_some_and(|s| {
            if tag.is_some() {
                s.name(&probe.stored_ref()).is_some()
            } else {
                !s.tags(stored).is_empty()
            }
        })
    };
    // A built-in template: everyone's, as it is; nobody changes it.
    if crate::validate::TEMPLATES.contains(&name) {
        if access == Access::Write {
            return Err(CoreError::Forbidden(format!(
                "template \"{name}\" is built in and cannot be changed"
            )));
        }
        return Ok(TemplateRef {
            name: name.to_owned(),
            tag,
            stored: name.to_owned(),
            owner: Owner::BuiltIn,
        });
    }
    let Some(tenant) = tenant else {
        // The node: the store's names as they are.
        if let Err(e) = rampart_image::check_stored_name(name) {
            return Err(match access {
                Access::Read => no_template(reference),
                Access::Write => CoreError::BadRequest {
                    field: "name".into(),
                    message: e.to_string(),
                },
            });
        }
        if access == Access::Read && !exists(name) {
            return Err(no_template(reference));
        }
        let (owner, _) = owner_of_stored(name);
        return Ok(TemplateRef {
            name: name.to_owned(),
            tag,
            stored: name.to_owned(),
            owner,
        });
    };
    // A tenant: template names only (never `<tenant>~...`, never another's).
    if name.contains(rampart_image::OWNER_SEP) {
        return Err(no_template(reference));
    }
    if rampart_image::check_name(name).is_err() {
        return match access {
            Access::Read => Err(no_template(reference)),
            Access::Write => Err(CoreError::BadRequest {
                field: "name".into(),
                message: format!(
                    "template name {name:?}: 1 to 64 bytes of a-z, 0-9, '.', '_', '-', \
                     starting with a letter or a digit"
                ),
            }),
        };
    }
    let own = stored_for(tenant, name);
    let own_ref = TemplateRef {
        name: name.to_owned(),
        tag: tag.clone(),
        stored: own.clone(),
        owner: Owner::Tenant(tenant.to_owned()),
    };
    // Its own name wins (whatever the tag asked: a tag of its own template it lacks is not
    // looked up in the operator's).
    let has_own = store.as_ref().is_some_and(|s| !s.tags(&own).is_empty());
    if has_own {
        if access == Access::Read && !exists(&own) {
            return Err(no_template(reference));
        }
        return Ok(own_ref);
    }
    let published = store.as_ref().is_some_and(|s| !s.tags(name).is_empty());
    if published {
        if access == Access::Write {
            return Err(CoreError::Forbidden(format!(
                "template \"{name}\" is published by the operator; a tenant cannot change it \
                 (build under another name)"
            )));
        }
        if !exists(name) {
            return Err(no_template(reference));
        }
        return Ok(TemplateRef {
            name: name.to_owned(),
            tag,
            stored: name.to_owned(),
            owner: Owner::Operator,
        });
    }
    match access {
        Access::Read => Err(no_template(reference)),
        Access::Write => Ok(own_ref),
    }
}

/// Whether a caller of `tenant` sees the template stored as `stored`, and the name it
/// knows it by (a tenant: its own without the prefix, the operator's and built-in ones as
/// they are; the node: every name as stored).
pub(crate) fn visible_name(tenant: Option<&str>, stored: &str) -> Option<String> {
    let Some(tenant) = tenant else {
        return Some(stored.to_owned());
    };
    match owner_of_stored(stored) {
        (Owner::BuiltIn | Owner::Operator, n) => Some(n.to_owned()),
        (Owner::Tenant(t), n) if t == tenant => Some(n.to_owned()),
        (Owner::Tenant(_), _) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_resolves_its_own_the_operators_and_never_anothers() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        let id = s
            .put_manifest(&rampart_image::store::Manifest {
                schema: rampart_image::store::SCHEMA,
                layers: Vec::new(),
                config: TemplateConfig::default(),
                base: None,
            })
            .unwrap();
        for n in [
            "shared",
            "published",
            "acme~shared",
            "acme~shared:v2",
            "rival~only",
        ] {
            s.tag(n, &id).unwrap();
        }
        let data = d.path();
        // The node: the store as it is.
        let r = lookup(data, None, "acme~shared", Access::Read).unwrap();
        assert_eq!(
            (r.stored.as_str(), r.tenant()),
            ("acme~shared", Some("acme"))
        );
        assert_eq!(
            lookup(data, None, "shared", Access::Write).unwrap().owner,
            Owner::Operator
        );
        assert!(matches!(
            lookup(data, None, "base", Access::Write),
            Err(CoreError::Forbidden(_))
        ));
        assert!(matches!(
            lookup(data, None, "Nope", Access::Read),
            Err(CoreError::NoTemplate(_))
        ));
        {
            let acme = Some("acme");
            // Its own wins over the operator's; tags are its own.
            let r = lookup(data, acme, "shared", Access::Read).unwrap();
            assert_eq!(r.stored, "acme~shared");
            assert_eq!(
                lookup(data, acme, "shared:v2", Access::Read)
                    .unwrap()
                    .stored_ref(),
                "acme~shared:v2"
            );
            assert_eq!(
                lookup(data, acme, "shared", Access::Write).unwrap().stored,
                "acme~shared"
            );
            // The operator's: seen, not changed.
            let p = lookup(data, acme, "published", Access::Read).unwrap();
            assert_eq!(
                (p.stored.as_str(), &p.owner),
                ("published", &Owner::Operator)
            );
            assert!(matches!(
                lookup(data, acme, "published", Access::Write),
                Err(CoreError::Forbidden(_))
            ));
            assert!(matches!(
                lookup(data, acme, "code-interpreter-v1", Access::Write),
                Err(CoreError::Forbidden(_))
            ));
            assert_eq!(
                lookup(data, acme, "base", Access::Read).unwrap().owner,
                Owner::BuiltIn
            );
            // Another tenant's: not found, by any spelling; writing the name makes its own.
            for n in ["only", "rival~only", "acme~shared", "only:default"] {
                assert!(
                    matches!(
                        lookup(data, acme, n, Access::Read),
                        Err(CoreError::NoTemplate(_))
                    ),
                    "{n}"
                );
            }
            assert_eq!(
                lookup(data, acme, "only", Access::Write).unwrap().stored,
                "acme~only"
            );
            assert_eq!(visible_name(acme, "acme~shared").as_deref(), Some("shared"));
            assert_eq!(
                visible_name(acme, "published").as_deref(),
                Some("published")
            );
            assert_eq!(visible_name(acme, "rival~only"), None);
            let names: Vec<String> = list(data, acme).into_iter().map(|t| t.name).collect();
            assert!(names.contains(&"shared".to_owned()), "{names:?}");
            assert!(names.contains(&"published".to_owned()), "{names:?}");
            assert!(!names.iter().any(|n| n.contains("only")), "{names:?}");
            assert_eq!(
                names.iter().filter(|n| *n == "shared").count(),
                1,
                "{names:?}"
            );
        }
    }
}
