//! A node's membership: its record under a lease, renewed; the catalog kept true to what it
//! runs; the fleet's tenants mirrored into its own store.

use crate::model::{CatalogEntry, NodeRecord, TenantDef};
use crate::store::{Reservation, Store, StoreError};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// How a node joins.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// etcd's client URLs.
    pub endpoints: Vec<String>,
    /// The prefix of the fleet's keys.
    pub prefix: String,
    /// The node's name.
    pub name: String,
    /// The URL gateways reach it at.
    pub url: String,
    /// Its lease's time to live: a node that stops renewing is gone after it.
    pub ttl: Duration,
}

/// What a node tells the fleet about itself, asked at every renewal.
pub trait NodeFacts: Send + Sync + 'static {
    /// Its audit key (`ed25519:<hex>`), kept by the fleet for good.
    fn audit_key(&self) -> String;
    /// Its record now, running `sandboxes` (name, url and times are filled in by the
    /// membership).
    fn record(&self, sandboxes: u64) -> NodeRecord;
    /// The sandboxes it runs (paused ones included): id and tenant.
    fn sandboxes(&self) -> Vec<(String, Option<String>)>;
    /// The fleet's tenants, to make or update in its own store.
    fn mirror_tenants(&self, tenants: &[TenantDef]);
}

/// Why a node could not join.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// etcd could not be reached or refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another live node has the name.
    #[error("a live node named {0} is already in the fleet (at {1}); choose another --node-name")]
    NameTaken(String, String),
}

/// A node in the fleet: the token gateways present to it, and the renewal running.
#[derive(Debug)]
pub struct Membership {
    /// The fleet's token.
    pub token: String,
    store: Store,
    lease: Arc<std::sync::atomic::AtomicI64>,
    task: tokio::task::JoinHandle<()>,
}

fn now_ms() -> i64 {
    rampart_store::now_ms()
}

impl Membership {
    /// Joins the fleet: reads (or makes) its token, writes the node's record under a new
    /// lease, and renews it every third of its TTL, refreshing the record, the catalog of
    /// its sandboxes and its copy of the tenants each time.
    pub async fn join(cfg: NodeConfig, facts: Arc<dyn NodeFacts>) -> Result<Membership, JoinError> {
        let store = Store::connect(&cfg.endpoints, &cfg.prefix).await?;
        let token = store.token().await?;
        if let Some(other) = store
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.name == cfg.name && n.url != cfg.url)
        {
            return Err(JoinError::NameTaken(other.name, other.url));
        }
        store.put_audit_key(&cfg.name, &facts.audit_key()).await?;
        let started_ms = now_ms();
        let ttl = cfg.ttl.as_secs().max(2) as i64;
        let lease = store.grant(ttl).await?;
        let mut keeper = store.keeper(lease).await?;
        let lease_id = Arc::new(std::sync::atomic::AtomicI64::new(lease));
        beat(&store, &cfg, &*facts, lease, started_ms).await?;
        tracing::info!(node = %cfg.name, url = %cfg.url, "joined the fleet (lease of {ttl} s)");
        let every = Duration::from_millis((cfg.ttl.as_millis() / 3).max(300) as u64);
        let (s, shared) = (store.clone(), lease_id.clone());
        let task = tokio::spawn(async move {
            let mut lease = lease;
            loop {
                tokio::time::sleep(every).await;
                let renewed = keeper.renew().await;
                if let Err(e) = renewed {
                    tracing::warn!(node = %cfg.name, "fleet lease: {e}; joining again");
                    match rejoin(&s, ttl).await {
                        Ok((l, k)) => {
                            lease = l;
                            keeper = k;
                            shared.store(l, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => {
                            tracing::warn!(node = %cfg.name, "fleet: cannot join again yet: {e}");
                            continue;
                        }
                    }
                }
                if let Err(e) = beat(&s, &cfg, &*facts, lease, started_ms).await {
                    tracing::warn!(node = %cfg.name, "fleet: refreshing the node's record: {e}");
                }
            }
        });
        Ok(Membership {
            token,
            store,
            lease: lease_id,
            task,
        })
    }

    /// Leaves the fleet: the record goes now rather than at the lease's end.
    pub async fn leave(self) {
        self.task.abort();
        let lease = self.lease.load(std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = self.store.revoke(lease).await {
            tracing::warn!("fleet: giving the lease up: {e}");
        }
    }
}

async fn rejoin(store: &Store, ttl: i64) -> Result<(i64, crate::store::Keeper), StoreError> {
    let lease = store.grant(ttl).await?;
    let keeper = store.keeper(lease).await?;
    Ok((lease, keeper))
}

/// One renewal's work: the record, the catalog of this node's sandboxes, the tenants.
async fn beat(
    store: &Store,
    cfg: &NodeConfig,
    facts: &dyn NodeFacts,
    lease: i64,
    started_ms: i64,
) -> Result<(), StoreError> {
    let listed_ms = now_ms();
    let mine: BTreeMap<String, Option<String>> = facts.sandboxes().into_iter().collect();
    let mut record = facts.record(mine.len() as u64);
    record.name = cfg.name.clone();
    record.url = cfg.url.clone();
    record.started_ms = started_ms;
    record.updated_ms = listed_ms;
    record.schedulable = !store.drained(&cfg.name).await?;
    store.put_node(&record, lease).await?;
    let catalog = store.catalog().await?;
    let known: BTreeSet<&str> = catalog
        .iter()
        .filter(|(_, e)| e.node == cfg.name)
        .map(|(id, _)| id.as_str())
        .collect();
    for (id, entry) in &catalog {
        // Gone from this node; an entry written after the list was taken is a create that
        // finished since, not a sandbox that ended.
        if entry.node == cfg.name && !mine.contains_key(id) && entry.recorded_ms < listed_ms {
            store.forget(id, entry.tenant.as_deref()).await?;
        }
    }
    for (id, tenant) in &mine {
        if !known.contains(id.as_str()) {
            let entry = CatalogEntry {
                node: cfg.name.clone(),
                tenant: tenant.clone(),
                recorded_ms: listed_ms,
            };
            store.record(id, &entry, &mut Reservation::none()).await?;
        }
    }
    facts.mirror_tenants(&store.tenants().await?);
    Ok(())
}
