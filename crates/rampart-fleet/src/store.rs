//! What the fleet keeps in etcd, and the only code that reads or writes it.
//!
//! Every key is under one prefix (`/rampart/` by default):
//!
//! | key | value | life |
//! |---|---|---|
//! | `token` | the fleet's token: gateways present it to nodes | made once, by whoever starts first |
//! | `nodes/<name>` | [`NodeRecord`]: address, tiers, free capacity | under the node's lease |
//! | `sandboxes/<id>` | [`CatalogEntry`]: the node it runs on, its tenant | written at create, removed at destroy |
//! | `owners/<tenant>/<id>` | empty: the tenant's sandboxes, counted for its quota | beside the catalog entry |
//! | `owners/<tenant>/~<n>` | a create's reservation, under a gateway's lease | until the create answers |
//! | `tenants/<name>` | [`TenantDef`]: the tenant and its quotas | `POST /v1/tenants` on a gateway |
//! | `keys/<sha256 of the key>` | [`NodeKey`]: its id, tenant, scopes | `POST /v1/keys` on a gateway |

use crate::model::{CatalogEntry, NodeRecord, TenantDef};
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use rampart_store::node_keys::NodeKey;
use std::time::Duration;

/// The prefix of every key, unless configured.
pub const DEFAULT_PREFIX: &str = "/rampart/";

/// Why the fleet's store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// etcd refused or could not be reached.
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// A value that is not what this version writes.
    #[error("etcd holds a value at {key} that is not a {what}: {source}")]
    Corrupt {
        /// The key.
        key: String,
        /// What was expected there.
        what: &'static str,
        /// Why it did not parse.
        source: serde_json::Error,
    },
    /// A tenant's `max_sandboxes` is reached across the fleet.
    #[error("tenant {tenant} has {count} sandboxes across the fleet and its quota is {max}")]
    Quota {
        /// The tenant.
        tenant: String,
        /// Its sandboxes (and reservations) now.
        count: u64,
        /// Its `max_sandboxes`.
        max: u64,
    },
    /// Something already exists under that name.
    #[error("{0} already exists")]
    Exists(String),
    /// A lease expired before it was renewed.
    #[error("the lease expired before it was renewed")]
    Expired,
    /// Another writer kept changing what a transaction depends on.
    #[error("etcd: {0} kept changing under a transaction; try again")]
    Contended(&'static str),
}

/// The fleet's store: an etcd client and the key prefix.
#[derive(Clone)]
pub struct Store {
    client: Client,
    prefix: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A key a watcher cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// `nodes/<name>`.
    Node(String),
    /// `sandboxes/<id>`.
    Sandbox(String),
    /// `tenants/<name>`.
    Tenant(String),
    /// `keys/<digest>`.
    Key(String),
    /// `drain/<node>`: no new sandbox is placed on the node.
    Drain(String),
}

/// What a gateway follows, read at one revision.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The revision it was read at.
    pub revision: i64,
    /// The live nodes.
    pub nodes: Vec<NodeRecord>,
    /// The catalog.
    pub catalog: Vec<(String, CatalogEntry)>,
    /// The tenants.
    pub tenants: Vec<TenantDef>,
    /// The keys, by the digest of their text.
    pub keys: Vec<(String, NodeKey)>,
    /// The nodes being drained.
    pub drained: Vec<String>,
}

/// Renews a lease.
pub struct Keeper {
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper").finish_non_exhaustive()
    }
}

impl Keeper {
    /// Renews the lease once: its TTL now. Err [`StoreError::Expired`]: it had already
    /// expired (what was under it is gone).
    pub async fn renew(&mut self) -> Result<i64, StoreError> {
        self.keeper.keep_alive().await?;
        match self.stream.message().await? {
            Some(r) if r.ttl() > 0 => Ok(r.ttl()),
            _ => Err(StoreError::Expired),
        }
    }
}

/// A create's (or a fork's) holds on its tenant's sandboxes, each until [`Store::record`]
/// turns one into a sandbox or [`Store::release`] lets the rest go.
#[derive(Debug, Default)]
pub struct Reservation {
    keys: Vec<String>,
}

impl Reservation {
    /// No hold (a sandbox already running, recorded as it is found; a caller without quota).
    pub fn none() -> Reservation {
        Reservation::default()
    }
}

fn parse<T: serde::de::DeserializeOwned>(
    key: &[u8],
    value: &[u8],
    what: &'static str,
) -> Result<T, StoreError> {
    serde_json::from_slice(value).map_err(|source| StoreError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        what,
        source,
    })
}

fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("fleet records serialize")
}

impl Store {
    /// Connects to etcd at `endpoints` (`http://host:2379`; the client balances over them
    /// and moves on when one fails). Each request gives up after 2 s, and is tried again
    /// while etcd's failure passes (see `retry`).
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<Store, StoreError> {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(2))
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3));
        let client = Client::connect(endpoints, Some(opts)).await?;
        let mut prefix = prefix.to_owned();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Ok(Store { client, prefix })
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    fn c(&self) -> Client {
        self.client.clone()
    }

    /// Runs `op` again while etcd answers with a passing failure (no leader during an
    /// election, a member gone, a timeout): for up to about 6 s. Every write the fleet makes
    /// is safe to repeat (a put of the same value, a transaction guarded by its compare).
    async fn retry<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut delay = Duration::from_millis(50);
        let mut attempt = 0;
        loop {
            match op(self.c()).await {
                Ok(v) => return Ok(v),
                Err(e) if attempt < 7 && transient(&e) => {
                    tracing::debug!("etcd: {e}; trying again in {delay:?}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                    attempt += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn get(
        &self,
        key: impl Into<Vec<u8>>,
        opts: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse, StoreError> {
        let key = key.into();
        self.retry(|mut c| {
            let (key, opts) = (key.clone(), opts.clone());
            async move { c.get(key, opts).await }
        })
        .await
    }

    async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        opts: Option<PutOptions>,
    ) -> Result<etcd_client::PutResponse, StoreError> {
        let (key, value) = (key.into(), value.into());
        self.retry(|mut c| {
            let (key, value, opts) = (key.clone(), value.clone(), opts.clone());
            async move { c.put(key, value, opts).await }
        })
        .await
    }

    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, StoreError> {
        self.retry(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    async fn delete(
        &self,
        key: impl Into<Vec<u8>>,
        opts: Option<etcd_client::DeleteOptions>,
    ) -> Result<etcd_client::DeleteResponse, StoreError> {
        let key = key.into();
        self.retry(|mut c| {
            let (key, opts) = (key.clone(), opts.clone());
            async move { c.delete(key, opts).await }
        })
        .await
    }

    /// Every value under `rest` (a prefix), parsed, with its key's last part.
    async fn list<T: serde::de::DeserializeOwned>(
        &self,
        rest: &str,
        what: &'static str,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let prefix = self.key(rest);
        let resp = self
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await?;
        resp.kvs()
            .iter()
            .map(|kv| {
                let name = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
                Ok((name, parse(kv.key(), kv.value(), what)?))
            })
            .collect()
    }

    async fn one<T: serde::de::DeserializeOwned>(
        &self,
        rest: &str,
        what: &'static str,
    ) -> Result<Option<T>, StoreError> {
        let resp = self.get(self.key(rest), None).await?;
        resp.kvs()
            .first()
            .map(|kv| parse(kv.key(), kv.value(), what))
            .transpose()
    }

    /// The fleet's token; the first caller makes it (every later one reads the same).
    pub async fn token(&self) -> Result<String, StoreError> {
        let key = self.key("token");
        let made = rampart_store::node_keys::generate();
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), made.clone(), None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = self.txn(txn).await?;
        if resp.succeeded() {
            return Ok(made);
        }
        for r in resp.op_responses() {
            if let etcd_client::TxnOpResponse::Get(g) = r {
                if let Some(kv) = g.kvs().first() {
                    return Ok(String::from_utf8_lossy(kv.value()).into_owned());
                }
            }
        }
        Err(StoreError::Contended("the fleet's token"))
    }

    /// A lease of `ttl` seconds: what is written under it goes when it is not kept alive.
    pub async fn grant(&self, ttl: i64) -> Result<i64, StoreError> {
        self.retry(|mut c| async move { c.lease_grant(ttl, None).await })
            .await
            .map(|r| r.id())
    }

    /// A keeper of lease `id`: each [`Keeper::renew`] renews it once.
    pub async fn keeper(&self, id: i64) -> Result<Keeper, StoreError> {
        let (keeper, stream) = self.c().lease_keep_alive(id).await?;
        Ok(Keeper { keeper, stream })
    }

    /// Gives lease `id` up: what was written under it goes now.
    pub async fn revoke(&self, id: i64) -> Result<(), StoreError> {
        self.c().lease_revoke(id).await?;
        Ok(())
    }

    /// Writes node `n`'s record under lease `lease`.
    pub async fn put_node(&self, n: &NodeRecord, lease: i64) -> Result<(), StoreError> {
        self.put(
            self.key(&format!("nodes/{}", n.name)),
            json(n),
            Some(PutOptions::new().with_lease(lease)),
        )
        .await?;
        Ok(())
    }

    /// Records that snapshot `name` of `owner` (a tenant; None: the fleet's administrator)
    /// is kept on node `node`: a create from it must go there.
    pub async fn put_snapshot(
        &self,
        owner: Option<&str>,
        name: &str,
        node: &str,
    ) -> Result<(), StoreError> {
        let key = self.key(&format!("snapshots/{}/{name}", owner.unwrap_or("_")));
        self.put(key, node.as_bytes().to_vec(), None).await?;
        Ok(())
    }

    /// The node keeping snapshot `name` of `owner`, if the fleet knows it.
    pub async fn snapshot_node(
        &self,
        owner: Option<&str>,
        name: &str,
    ) -> Result<Option<String>, StoreError> {
        let key = self.key(&format!("snapshots/{}/{name}", owner.unwrap_or("_")));
        let resp = self.get(key, None).await?;
        Ok(resp
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    /// Forgets snapshot `name` of `owner` (deleted).
    pub async fn forget_snapshot(&self, owner: Option<&str>, name: &str) -> Result<(), StoreError> {
        let key = self.key(&format!("snapshots/{}/{name}", owner.unwrap_or("_")));
        self.delete(key, None).await?;
        Ok(())
    }

    /// Marks node `node` drained (`true`: no new sandbox goes there) or not; kept until
    /// undone, across the node's restarts.
    pub async fn set_drain(&self, node: &str, drained: bool) -> Result<(), StoreError> {
        let key = self.key(&format!("drain/{node}"));
        if drained {
            self.put(key, Vec::new(), None).await?;
        } else {
            self.delete(key, None).await?;
        }
        Ok(())
    }

    /// Whether node `node` is drained.
    pub async fn drained(&self, node: &str) -> Result<bool, StoreError> {
        let resp = self.get(self.key(&format!("drain/{node}")), None).await?;
        Ok(!resp.kvs().is_empty())
    }

    /// Keeps node `node`'s audit key for good (its records verify after it is gone).
    pub async fn put_audit_key(&self, node: &str, key: &str) -> Result<(), StoreError> {
        self.put(
            self.key(&format!("audit-keys/{node}")),
            key.as_bytes().to_vec(),
            None,
        )
        .await?;
        Ok(())
    }

    /// Every node's audit key the fleet has kept: (node, `ed25519:<hex>`).
    pub async fn audit_keys(&self) -> Result<Vec<(String, String)>, StoreError> {
        let prefix = self.key("audit-keys/");
        let resp = self
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned(),
                    String::from_utf8_lossy(kv.value()).into_owned(),
                )
            })
            .collect())
    }

    /// The nodes whose lease is alive.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        Ok(self
            .list::<NodeRecord>("nodes/", "node record")
            .await?
            .into_iter()
            .map(|(_, n)| n)
            .collect())
    }

    /// Where sandbox `id` runs.
    pub async fn lookup(&self, id: &str) -> Result<Option<CatalogEntry>, StoreError> {
        self.one(&format!("sandboxes/{id}"), "catalog entry").await
    }

    /// Everything a gateway follows, as of one revision (a watch from the next one misses
    /// nothing).
    pub async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let resp = self
            .get(self.prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await?;
        let mut snap = Snapshot {
            revision: resp.header().map(|h| h.revision()).unwrap_or(0),
            ..Snapshot::default()
        };
        for kv in resp.kvs() {
            let (k, v) = (kv.key(), kv.value());
            match self.classify(k) {
                Some(Entry::Node(_)) => snap.nodes.push(parse(k, v, "node record")?),
                Some(Entry::Sandbox(id)) => snap.catalog.push((id, parse(k, v, "catalog entry")?)),
                Some(Entry::Tenant(_)) => snap.tenants.push(parse(k, v, "tenant")?),
                Some(Entry::Key(digest)) => snap.keys.push((digest, parse(k, v, "key")?)),
                Some(Entry::Drain(node)) => snap.drained.push(node),
                None => {}
            }
        }
        Ok(snap)
    }

    /// What a key of the fleet is, for a watcher: a node's record or a catalog entry.
    pub fn classify(&self, key: &[u8]) -> Option<Entry> {
        let rest = key.strip_prefix(self.prefix.as_bytes())?;
        let rest = std::str::from_utf8(rest).ok()?;
        let (kind, name) = rest.split_once('/')?;
        let name = name.to_owned();
        match kind {
            "nodes" => Some(Entry::Node(name)),
            "sandboxes" => Some(Entry::Sandbox(name)),
            "tenants" => Some(Entry::Tenant(name)),
            "keys" => Some(Entry::Key(name)),
            "drain" => Some(Entry::Drain(name)),
            _ => None,
        }
    }

    /// Every change to the fleet's keys from revision `from` on.
    pub async fn watch(&self, from: i64) -> Result<etcd_client::WatchStream, StoreError> {
        Ok(self
            .c()
            .watch(
                self.prefix.clone(),
                Some(
                    etcd_client::WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(from),
                ),
            )
            .await?)
    }

    /// The whole catalog: every sandbox and where it runs.
    pub async fn catalog(&self) -> Result<Vec<(String, CatalogEntry)>, StoreError> {
        self.list("sandboxes/", "catalog entry").await
    }

    /// Holds one of `tenant`'s sandboxes under `lease` if its `max` allows one more across
    /// the fleet. The count and the hold are one transaction: two gateways cannot both take
    /// the last one.
    pub async fn reserve(
        &self,
        tenant: Option<&str>,
        max: Option<u64>,
        n: u64,
        lease: i64,
    ) -> Result<Reservation, StoreError> {
        let (Some(tenant), Some(max)) = (tenant, max) else {
            return Ok(Reservation::none());
        };
        let prefix = self.key(&format!("owners/{tenant}/"));
        let end = prefix_end(&prefix);
        for _ in 0..8 {
            let resp = self
                .get(
                    prefix.clone(),
                    Some(GetOptions::new().with_prefix().with_count_only()),
                )
                .await?;
            let count = resp.count() as u64;
            if count + n > max {
                return Err(StoreError::Quota {
                    tenant: tenant.to_owned(),
                    count,
                    max,
                });
            }
            let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            let keys: Vec<String> = (0..n)
                .map(|_| format!("{prefix}~{:016x}", rand::random::<u64>()))
                .collect();
            let puts: Vec<TxnOp> = keys
                .iter()
                .map(|k| {
                    TxnOp::put(
                        k.clone(),
                        Vec::new(),
                        Some(PutOptions::new().with_lease(lease)),
                    )
                })
                .collect();
            // Nothing under the prefix was written since the count was read.
            let txn = Txn::new()
                .when([
                    Compare::create_revision(prefix.clone(), CompareOp::Less, rev + 1)
                        .with_range(end.clone()),
                ])
                .and_then(puts);
            if self.txn(txn).await?.succeeded() {
                return Ok(Reservation { keys });
            }
        }
        Err(StoreError::Contended("a tenant's sandboxes"))
    }

    /// Records sandbox `id` on its node, in place of one of `held`'s holds (taken from it
    /// only once the transaction went through).
    pub async fn record(
        &self,
        id: &str,
        entry: &CatalogEntry,
        held: &mut Reservation,
    ) -> Result<(), StoreError> {
        let mut ops = vec![TxnOp::put(
            self.key(&format!("sandboxes/{id}")),
            json(entry),
            None,
        )];
        if let Some(t) = &entry.tenant {
            ops.push(TxnOp::put(
                self.key(&format!("owners/{t}/{id}")),
                Vec::new(),
                None,
            ));
        }
        if let Some(k) = held.keys.last() {
            ops.push(TxnOp::delete(k.clone(), None));
        }
        self.txn(Txn::new().and_then(ops)).await?;
        held.keys.pop();
        Ok(())
    }

    /// Lets what is left of a reservation go (its create failed, or a fork made fewer).
    pub async fn release(&self, held: Reservation) -> Result<(), StoreError> {
        if held.keys.is_empty() {
            return Ok(());
        }
        let ops: Vec<TxnOp> = held
            .keys
            .into_iter()
            .map(|k| TxnOp::delete(k, None))
            .collect();
        self.txn(Txn::new().and_then(ops)).await?;
        Ok(())
    }

    /// Removes sandbox `id` from the catalog (it was destroyed).
    pub async fn forget(&self, id: &str, tenant: Option<&str>) -> Result<(), StoreError> {
        let mut ops = vec![TxnOp::delete(self.key(&format!("sandboxes/{id}")), None)];
        if let Some(t) = tenant {
            ops.push(TxnOp::delete(self.key(&format!("owners/{t}/{id}")), None));
        }
        self.txn(Txn::new().and_then(ops)).await?;
        Ok(())
    }

    /// The key made from `text`'s digest, if the fleet has it.
    pub async fn key_by_digest(&self, digest: &str) -> Result<Option<NodeKey>, StoreError> {
        self.one(&format!("keys/{digest}"), "key").await
    }

    /// Stores key `k` whose text has digest `digest`; refused if that key is already there.
    pub async fn put_key(&self, digest: &str, k: &NodeKey) -> Result<(), StoreError> {
        let key = self.key(&format!("keys/{digest}"));
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, json(k), None)]);
        if self.txn(txn).await?.succeeded() {
            Ok(())
        } else {
            Err(StoreError::Exists(format!("key {}", k.id)))
        }
    }

    /// Every key the fleet holds (revoked ones too).
    pub async fn keys(&self) -> Result<Vec<(String, NodeKey)>, StoreError> {
        self.list("keys/", "key").await
    }

    /// Marks key `id` revoked; false if there is none.
    pub async fn revoke_key(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        for (digest, mut k) in self.keys().await? {
            if k.id == id {
                k.revoked_at_ms.get_or_insert(now_ms);
                self.put(self.key(&format!("keys/{digest}")), json(&k), None)
                    .await?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Tenant `name`.
    pub async fn tenant(&self, name: &str) -> Result<Option<TenantDef>, StoreError> {
        self.one(&format!("tenants/{name}"), "tenant").await
    }

    /// Every tenant.
    pub async fn tenants(&self) -> Result<Vec<TenantDef>, StoreError> {
        Ok(self
            .list::<TenantDef>("tenants/", "tenant")
            .await?
            .into_iter()
            .map(|(_, t)| t)
            .collect())
    }

    /// Makes tenant `t`; refused if it exists.
    pub async fn create_tenant(&self, t: &TenantDef) -> Result<(), StoreError> {
        let key = self.key(&format!("tenants/{}", t.name));
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, json(t), None)]);
        if self.txn(txn).await?.succeeded() {
            Ok(())
        } else {
            Err(StoreError::Exists(format!("tenant {}", t.name)))
        }
    }

    /// Replaces tenant `t` (its quotas).
    pub async fn put_tenant(&self, t: &TenantDef) -> Result<(), StoreError> {
        self.put(self.key(&format!("tenants/{}", t.name)), json(t), None)
            .await?;
        Ok(())
    }

    /// Removes tenant `name` (its keys stop working: their tenant is gone); false if there
    /// was none.
    pub async fn delete_tenant(&self, name: &str) -> Result<bool, StoreError> {
        let r = self
            .delete(self.key(&format!("tenants/{name}")), None)
            .await?;
        Ok(r.deleted() > 0)
    }

    /// How many sandboxes tenant `name` has across the fleet (reservations included).
    pub async fn tenant_count(&self, name: &str) -> Result<u64, StoreError> {
        let resp = self
            .get(
                self.key(&format!("owners/{name}/")),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await?;
        Ok(resp.count() as u64)
    }
}

/// Whether etcd's error passes with time (an election, a member down, a slow answer).
fn transient(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => matches!(
            s.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Unknown
                | Code::Aborted
                | Code::Cancelled
        ),
        _ => false,
    }
}

/// The first key after every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(
            prefix_end("/rampart/owners/a/"),
            b"/rampart/owners/a0".to_vec()
        );
        assert_eq!(prefix_end("a"), b"b".to_vec());
    }
}
