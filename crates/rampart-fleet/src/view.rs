//! A gateway's copy of the fleet's nodes and catalog, kept by an etcd watch: routing a call
//! reads memory, not etcd, and never asks every node where a sandbox is.

use crate::model::{CatalogEntry, NodeRecord};
use crate::store::{Entry, Store, StoreError};
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
        let (rev, nodes, catalog) = store.snapshot().await?;
        let mut watch = store.watch(rev + 1).await?;
        {
            let mut g = self.inner.write().expect("view lock");
            g.nodes = nodes.into_iter().map(|n| (n.name.clone(), n)).collect();
            g.catalog = catalog.into_iter().collect();
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
                match store.classify(kv.key()) {
                    Some(Entry::Node(name)) => {
                        match put.then(|| serde_json::from_slice(kv.value())) {
                            Some(Ok(n)) => {
                                g.nodes.insert(name, n);
                            }
                            Some(Err(e)) => tracing::warn!("node record {name}: {e}"),
                            None => {
                                g.nodes.remove(&name);
                            }
                        }
                    }
                    Some(Entry::Sandbox(id)) => {
                        match put.then(|| serde_json::from_slice(kv.value())) {
                            Some(Ok(e)) => {
                                g.catalog.insert(id, e);
                            }
                            Some(Err(e)) => tracing::warn!("catalog entry {id}: {e}"),
                            None => {
                                g.catalog.remove(&id);
                            }
                        }
                    }
                    None => {}
                }
            }
        }
        Err(StoreError::Contended("the watch (its stream ended)"))
    }

    /// Whether the copy follows etcd now.
    pub fn live(&self) -> bool {
        self.inner.read().expect("view lock").live
    }

    /// The live nodes.
    pub fn nodes(&self) -> Vec<NodeRecord> {
        let mut v: Vec<_> = self
            .inner
            .read()
            .expect("view lock")
            .nodes
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Node `name`, if it is alive.
    pub fn node(&self, name: &str) -> Option<NodeRecord> {
        self.inner
            .read()
            .expect("view lock")
            .nodes
            .get(name)
            .cloned()
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
