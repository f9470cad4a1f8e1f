//! Who a request is served for: the [`Principal`] the API server authenticated, given
//! explicitly to every entry point of core ([`crate::Manager::sandbox`] and the methods of
//! `Manager` that act for someone); inside core, the entry point scopes the work it starts
//! on it (the record names it: `created.caller` and the other callers of events).
//!
//! A tenant's principal is confined to its tenant. A tenant sees only its own sandboxes (another tenant's id is not found,
//! exactly as an id that does not exist), and its snapshots, volumes and stored secrets are
//! kept under `<tenant>:<name>` ([`qualify`]), so two tenants may use the same name and
//! neither sees the other's. Work the daemon does for itself (the reaper, recovery, a call
//! outside any request) has no principal: it is the node's, which sees everything.

/// The caller a request is served for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Principal {
    /// How the record names it (`key:<id>:<name> (scopes) tenant acme from 10.0.0.5:4000`,
    /// `socket uid 0`, `e2b-key:<id>:<name> ...`).
    pub caller: String,
    /// The tenant it acts for; none: the node (its administrator, or the daemon itself).
    pub tenant: Option<String>,
    /// The id of the key it authenticated with, if any.
    pub key_id: Option<String>,
}

tokio::task_local! {
    static PRINCIPAL: Principal;
}

impl Principal {
    /// A principal of the node (no tenant): its administrator, or the daemon itself.
    pub fn node(caller: impl Into<String>) -> Self {
        Principal {
            caller: caller.into(),
            ..Principal::default()
        }
    }
}

/// Runs `f` on behalf of `p`: the record names it. Set only by core's entry points
/// (`Manager`'s methods and the [`crate::Sandbox`] handle), from the caller they are given.
pub(crate) async fn scope<F: std::future::Future>(p: Principal, f: F) -> F::Output {
    PRINCIPAL.scope(p, f).await
}

/// [`scope`] for a function that does not wait.
pub(crate) fn sync_scope<T>(p: Principal, f: impl FnOnce() -> T) -> T {
    PRINCIPAL.sync_scope(p, f)
}

/// The caller of the request being served, else `local` (a call made in the daemon's own
/// process, or by a server that does not say).
pub(crate) fn current_caller() -> String {
    caller().unwrap_or_else(|| "local".into())
}

/// The caller of the request being served, if a server set one (without cloning the rest
/// of the principal: asked for every recorded event).
pub(crate) fn caller() -> Option<String> {
    PRINCIPAL.try_with(|p| p.caller.clone()).ok()
}

/// The tenant of the request being served (none: the node's).
pub(crate) fn current_tenant() -> Option<String> {
    PRINCIPAL.try_with(|p| p.tenant.clone()).ok().flatten()
}

/// The principal of the request being served, if an entry point set one.
pub(crate) fn current() -> Option<Principal> {
    PRINCIPAL.try_with(Clone::clone).ok()
}

/// The stored name of object `name` (snapshot, volume, stored secret) of the current
/// tenant: `<tenant>:<name>`; the node's names are stored as given (an administrator names
/// a tenant's object `<tenant>:<name>`).
pub(crate) fn qualify(name: &str) -> String {
    match current_tenant() {
        Some(t) => format!("{t}:{name}"),
        None => name.to_owned(),
    }
}

/// The name the current tenant knows a stored object by, or None when it is not the
/// tenant's (the node sees every name as stored).
pub(crate) fn unqualify(stored: &str) -> Option<String> {
    match current_tenant() {
        Some(t) => stored
            .strip_prefix(t.as_str())
            .and_then(|r| r.strip_prefix(':'))
            .map(str::to_owned),
        None => Some(stored.to_owned()),
    }
}

/// Whether the current principal may see an object of `owner` (none: the node's): the
/// node sees everything, a tenant its own.
pub(crate) fn may_see(owner: Option<&str>) -> bool {
    match current_tenant() {
        None => true,
        Some(t) => owner == Some(t.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tenants_see_their_own_names_and_the_node_sees_all() {
        assert_eq!(current_caller(), "local");
        assert_eq!(qualify("snap"), "snap");
        assert!(may_see(Some("acme")) && may_see(None));
        let acme = Principal {
            caller: "key:1".into(),
            tenant: Some("acme".into()),
            key_id: Some("1".into()),
        };
        scope(acme, async {
            assert_eq!(current_caller(), "key:1");
            assert_eq!(qualify("snap"), "acme:snap");
            assert_eq!(unqualify("acme:snap").as_deref(), Some("snap"));
            assert_eq!(unqualify("acme2:snap"), None);
            assert_eq!(unqualify("other:snap"), None);
            assert_eq!(unqualify("snap"), None);
            assert!(may_see(Some("acme")));
            assert!(!may_see(Some("other")) && !may_see(None));
        })
        .await;
        scope(Principal::node("socket uid 0"), async {
            assert_eq!(unqualify("acme:snap").as_deref(), Some("acme:snap"));
            assert!(may_see(Some("acme")));
        })
        .await;
    }
}
