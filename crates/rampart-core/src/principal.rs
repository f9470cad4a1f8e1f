//! Who a request is served for: the [`Principal`] the API server authenticated, set for
//! the request's task with [`with_principal`].
//!
//! Core reads it in two places only: the record names it (`created.caller` and the other
//! callers of events), and the [`crate::Manager`] facade confines a tenant's principal to
//! its tenant. A tenant sees only its own sandboxes (another tenant's id is not found,
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

/// Runs `f` on behalf of `p`: the record names it, and the facade confines it to its tenant.
pub async fn with_principal<F: std::future::Future>(p: Principal, f: F) -> F::Output {
    PRINCIPAL.scope(p, f).await
}

/// Runs `f` on behalf of `caller`, a principal of the node (no tenant).
pub async fn with_caller<F: std::future::Future>(caller: String, f: F) -> F::Output {
    with_principal(
        Principal {
            caller,
            ..Principal::default()
        },
        f,
    )
    .await
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

/// The principal of the request being served, if a server set one.
pub fn current() -> Option<Principal> {
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
        with_principal(acme, async {
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
        with_caller("socket uid 0".into(), async {
            assert_eq!(unqualify("acme:snap").as_deref(), Some("acme:snap"));
            assert!(may_see(Some("acme")));
        })
        .await;
    }
}
