//! A gateway's copy of the fleet's nodes and catalog, kept by an etcd watch: routing a call
//! reads memory, not etcd, and never asks every node where a sandbox is.

use crate::model::{CatalogEntry, NodeRecord, TenantDef};
use crate::store::{Entry, Store, StoreError};
use rampart_store::node_keys::NodeKey;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The nodes alive now and where each sandbox runs.
#[derive(Debug, Default)]
pub struct View {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    nodes: HashMap<String, NodeRecord>,
    catalog: HashMap<String, CatalogEntry>,
    tenants: HashMap<String, TenantDef>,
    /// By the digest of the key's text.
    keys: HashMap<String, NodeKey>,
    /// Nodes being drained.
    drained: std::collections::HashSet<String>,
    /// Whether the watch is running (false: answers may be stale; callers ask etcd).
    live: bool,
}

impl View {
    /// Keeps a view of `store` in a background task: a snapshot, then its changes; after a
    /// broken watch, a new snapshot.
    pub fn follow(store: Store) -> Arc<View> {
        let view = Arc::new(View::default());
        let v = view.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = v.run(&store).await {
                    tracing::warn!("gateway: the fleet's watch broke: {e}; reading it again");
                }
                v.inner.write().expect("view lock").live = false;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        view
    }

    async fn run(&self, store: &Store) -> Result<(), StoreError> {
        let snap = store.snapshot().await?;
        let mut watch = store.watch(snap.revision + 1).await?;
        {
            let mut g = self.inner.write().expect("view lock");
            g.nodes = snap
                .nodes
                .into_iter()
                .map(|n| (n.name.clone(), n))
                .collect();
            g.catalog = snap.catalog.into_iter().collect();
            g.tenants = snap
                .tenants
                .into_iter()
                .map(|t| (t.name.clone(), t))
                .collect();
            g.keys = snap.keys.into_iter().collect();
            g.drained = snap.drained.into_iter().collect();
            g.live = true;
        }
        while let Some(resp) = watch.message().await? {
            if resp.canceled() || resp.compact_revision() > 0 {
                return Err(StoreError::Contended("the watch (cancelled or compacted)"));
            }
            let mut g = self.inner.write().expect("view lock");
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let put = ev.event_type() == etcd_client::EventType::Put;
                let Some(entry) = store.classify(kv.key()) else {
                    continue;
                };
                apply(&mut g, entry, put.then(|| kv.value()));
            }
        }
        Err(StoreError::Contended("the watch (its stream ended)"))
    }

    /// The key whose text has digest `digest`, if the copy is live (None: ask etcd).
    pub fn key(&self, digest: &str) -> Option<Option<NodeKey>> {
        let g = self.inner.read().expect("view lock");
        g.live.then(|| g.keys.get(digest).cloned())
    }

    /// Tenant `name`, if the copy is live (None: ask etcd).
    pub fn tenant(&self, name: &str) -> Option<Option<TenantDef>> {
        let g = self.inner.read().expect("view lock");
        g.live.then(|| g.tenants.get(name).cloned())
    }

    /// Whether the copy follows etcd now.
    pub fn live(&self) -> bool {
        self.inner.read().expect("view lock").live
    }

    /// The live nodes (a drained one is not schedulable, whatever its record says).
    pub fn nodes(&self) -> Vec<NodeRecord> {
        let g = self.inner.read().expect("view lock");
        let mut v: Vec<_> = g
            .nodes
            .values()
            .cloned()
            .map(|mut n| {
                if g.drained.contains(&n.name) {
                    n.schedulable = false;
                }
                n
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Node `name`, if it is alive.
    pub fn node(&self, name: &str) -> Option<NodeRecord> {
        let g = self.inner.read().expect("view lock");
        g.nodes.get(name).cloned().map(|mut n| {
            if g.drained.contains(&n.name) {
                n.schedulable = false;
            }
            n
        })
    }

    /// Notes a drain the gateway itself just wrote (the watch brings it too, later).
    pub fn note_drain(&self, node: &str, drained: bool) {
        let mut g = self.inner.write().expect("view lock");
        if drained {
            g.drained.insert(node.to_owned());
        } else {
            g.drained.remove(node);
        }
    }

    /// Where sandbox `id` runs, as the copy has it.
    pub fn lookup(&self, id: &str) -> Option<CatalogEntry> {
        self.inner
            .read()
            .expect("view lock")
            .catalog
            .get(id)
            .cloned()
    }

    /// Notes an entry the gateway itself just wrote (the watch brings it too, later).
    pub fn note(&self, id: &str, entry: CatalogEntry) {
        self.inner
            .write()
            .expect("view lock")
            .catalog
            .insert(id.to_owned(), entry);
    }

    /// Forgets an entry the gateway itself just removed.
    pub fn drop_entry(&self, id: &str) {
        self.inner.write().expect("view lock").catalog.remove(id);
    }

    /// The catalog's entries on nodes that are not alive: their sandboxes are lost.
    pub fn lost(&self) -> Vec<(String, CatalogEntry)> {
        let g = self.inner.read().expect("view lock");
        let mut v: Vec<_> = g
            .catalog
            .iter()
            .filter(|(_, e)| !g.nodes.contains_key(&e.node))
            .map(|(id, e)| (id.clone(), e.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// How many sandboxes the catalog places on each node.
    pub fn per_node(&self) -> HashMap<String, u64> {
        let g = self.inner.read().expect("view lock");
        let mut m = HashMap::new();
        for e in g.catalog.values() {
            *m.entry(e.node.clone()).or_insert(0) += 1;
        }
        m
    }
}

/// One change from the watch: `value` None is a delete.
fn apply(g: &mut Inner, entry: Entry, value: Option<&[u8]>) {
    fn set<T: serde::de::DeserializeOwned>(
        map: &mut HashMap<String, T>,
        name: String,
        value: Option<&[u8]>,
    ) {
        match value.map(serde_json::from_slice::<T>) {
            Some(Ok(v)) => {
                map.insert(name, v);
            }
            Some(Err(e)) => tracing::warn!("the fleet's record {name}: {e}"),
            None => {
                map.remove(&name);
            }
        }
    }
    match entry {
        Entry::Node(n) => set(&mut g.nodes, n, value),
        Entry::Sandbox(id) => set(&mut g.catalog, id, value),
        Entry::Tenant(t) => set(&mut g.tenants, t, value),
        Entry::Key(d) => set(&mut g.keys, d, value),
        Entry::Drain(n) => {
            if value.is_some() {
                g.drained.insert(n);
            } else {
                g.drained.remove(&n);
            }
        }
    }
}
