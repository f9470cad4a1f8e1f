//! Warm pools: per template and tier, sandboxes launched ahead of any create, healthy and
//! nobody's, so that a create which matches one is a claim (one store transaction) instead
//! of a launch.
//!
//! A pooled sandbox is launched exactly as a create would launch it (the same plan, with
//! no request), recorded in the store as `pooled` (counted against the host's capacity,
//! never against a tenant, never listed) and kept here with its agent's client. A create
//! whose plan a pooled sandbox can serve (same template, tier and limits; no environment,
//! network, snapshot or volumes, which are fixed at launch) claims one: its owner, labels,
//! deadline, access token, approval policy, redactions and its record's `created` event
//! (which says `"pool": true`) are applied in the claim, and nothing of another request
//! ever reached it. Anything else makes a cold create.
//!
//! Refills run one launch at a time in the background; a template built again drains its
//! pools (see [`Sandboxes::drain_pools`]); the daemon's stop destroys them, and a start
//! after a crash destroys what an earlier daemon left pooled ([`Sandboxes::recover`]).

use super::*;
use crate::config::WarmPool;
use rampart_store::Claim;
use rampart_types::{Limits, NetworkPolicy, PoolInfo, Tier};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};

/// What a pool holds: its template, tier and network (its limits are the template's
/// defaults).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    template: String,
    isolation: Tier,
    /// The policy its sandboxes are wired with, [`normal`]; none: no network.
    network: Option<NetworkKey>,
}

/// A network policy as a pool compares it.
type NetworkKey = String;

/// `policy` as pools compare it: without a precedence where no rule makes it matter.
fn normal(policy: &NetworkPolicy) -> NetworkKey {
    let mut p = policy.clone();
    if p.allow.is_empty() && p.deny.is_empty() {
        p.precedence = Default::default();
    }
    serde_json::to_string(&p).unwrap_or_default()
}

/// A pooled sandbox, launched and healthy.
struct Ready {
    id: SandboxId,
    limits: Limits,
    /// Its uid slot (its network's addresses).
    slot: u32,
    pid: i32,
    client: AgentClient,
    /// Its init's watcher ([`watch_init`]), handed to the registry at its claim.
    watcher: AbortHandle,
    /// The pool's generation it was launched in: a drain makes older ones stale.
    generation: u64,
}

#[derive(Default)]
struct Pool {
    /// The network policy its sandboxes are launched with (none: no network).
    network: Option<NetworkPolicy>,
    /// How many it keeps ready.
    size: usize,
    ready: VecDeque<Ready>,
    /// Launches under way.
    filling: usize,
    generation: u64,
}

/// The node's warm pools, by template and tier.
#[derive(Default)]
pub(crate) struct Pools {
    pools: Mutex<HashMap<PoolKey, Pool>>,
    /// Wakes the refiller: a claim, a drain, a start.
    kick: tokio::sync::Notify,
}

impl std::fmt::Debug for Pools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.list()).finish()
    }
}

impl Pools {
    fn take(&self, key: &PoolKey, limits: &Limits) -> Option<Ready> {
        let mut pools = lock(&self.pools);
        let pool = pools.get_mut(key)?;
        let at = pool.ready.iter().position(|r| &r.limits == limits)?;
        let r = pool.ready.remove(at);
        drop(pools);
        self.kick.notify_one();
        r
    }

    fn is_pooled(&self, id: &SandboxId) -> bool {
        lock(&self.pools)
            .values()
            .any(|p| p.ready.iter().any(|r| &r.id == id))
    }

    /// Takes `id` out of its pool, if it is in one.
    fn remove(&self, id: &SandboxId) -> Option<Ready> {
        let mut pools = lock(&self.pools);
        for p in pools.values_mut() {
            if let Some(at) = p.ready.iter().position(|r| &r.id == id) {
                return p.ready.remove(at);
            }
        }
        None
    }

    pub(crate) fn list(&self) -> Vec<PoolInfo> {
        let pools = lock(&self.pools);
        let mut out: Vec<PoolInfo> = pools
            .iter()
            .map(|(k, p)| PoolInfo {
                template: k.template.clone(),
                isolation: k.isolation,
                network: p.network.as_ref().map(|n| n.mode.as_str().to_owned()),
                size: p.size,
                ready: p.ready.len(),
                filling: p.filling,
                ids: p.ready.iter().map(|r| r.id.to_string()).collect(),
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.template, a.isolation.as_str()).cmp(&(&b.template, b.isolation.as_str()))
        });
        out
    }

    /// The pool that lacks the most, marked as filling one more, with its generation and
    /// network policy.
    fn next_to_fill(&self) -> Option<(PoolKey, u64, Option<NetworkPolicy>)> {
        let mut pools = lock(&self.pools);
        let (key, pool) = pools
            .iter_mut()
            .filter(|(_, p)| p.ready.len() + p.filling < p.size)
            .max_by_key(|(_, p)| p.size - p.ready.len() - p.filling)?;
        pool.filling += 1;
        Some((key.clone(), pool.generation, pool.network.clone()))
    }

    /// Ends a launch for `key`: its sandbox is ready, unless the pool was drained since.
    fn filled(&self, key: &PoolKey, ready: Option<Ready>) -> Result<usize, Ready> {
        let mut pools = lock(&self.pools);
        let Some(pool) = pools.get_mut(key) else {
            return ready.map_or(Ok(0), Err);
        };
        pool.filling = pool.filling.saturating_sub(1);
        match ready {
            Some(r) if r.generation == pool.generation => {
                pool.ready.push_back(r);
                Ok(pool.ready.len())
            }
            Some(r) => Err(r),
            None => Ok(pool.ready.len()),
        }
    }

    fn ready_len(&self, key: &PoolKey) -> usize {
        lock(&self.pools).get(key).map_or(0, |p| p.ready.len())
    }
}

impl Sandboxes {
    /// Sets up the pools asked for in the config (a pool larger than the host's capacity
    /// is refused with the reason) and starts their refiller.
    pub(super) fn start_pools(self: &Arc<Self>, wanted: &[WarmPool]) -> Result<(), CoreError> {
        if wanted.is_empty() {
            return Ok(());
        }
        let total: usize = wanted.iter().map(|w| w.size).sum();
        if total > self.cfg.max_sandboxes {
            return Err(CoreError::BadRequest {
                field: "warm".into(),
                message: format!(
                    "warm pools of {total} sandboxes in all do not fit in this node's \
                     capacity of {} (max_sandboxes); make them smaller",
                    self.cfg.max_sandboxes
                ),
            });
        }
        {
            let mut pools = lock(&self.pools.pools);
            for w in wanted {
                // The plan a create of this template would make (tier included) is the pool's.
                let req = CreateSandbox {
                    template: Some(w.template.clone()),
                    isolation: w.isolation,
                    network: w.network.map(|mode| NetworkPolicy {
                        mode,
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                if w.network.is_some() && !self.network.available() {
                    return Err(CoreError::BadRequest {
                        field: "warm".into(),
                        message: format!(
                            "the warm pool of {} asks for a network and this node has no \
                             sandbox networks",
                            w.template
                        ),
                    });
                }
                let plan = self.plan(req, CreateOptions::default())?;
                let network = plan.new.network.map(|n| n.policy);
                let key = PoolKey {
                    template: plan.new.template,
                    isolation: plan.new.isolation,
                    network: network.as_ref().map(normal),
                };
                let pool = pools.entry(key).or_default();
                pool.size += w.size;
                pool.network = network;
            }
        }
        let t = tokio::spawn(refill(self.clone()));
        lock(&self.tasks).push(t.abort_handle());
        Ok(())
    }

    /// The pools and what they hold.
    pub(crate) fn pools(&self) -> Vec<PoolInfo> {
        self.pools.list()
    }

    /// Whether `id` is a pooled sandbox (its init's watcher asks).
    pub(super) fn is_pooled(&self, id: &SandboxId) -> bool {
        self.pools.is_pooled(id)
    }

    /// Launches one sandbox for `key`'s pool, wired with `network`.
    async fn launch_pooled(
        self: &Arc<Self>,
        key: &PoolKey,
        generation: u64,
        network: Option<NetworkPolicy>,
    ) -> Result<Ready, CoreError> {
        let req = CreateSandbox {
            template: Some(key.template.clone()),
            isolation: Some(key.isolation),
            network,
            ..Default::default()
        };
        let mut new = self.plan(req, CreateOptions::default())?.new;
        new.pooled = true;
        new.access = None;
        new.request = None;
        new.tenant = None;
        let admitted = self
            .admit_disk("a warm sandbox", new.limits.disk_bytes)
            .await?;
        let slot = self
            .store
            .insert_creating(&new, self.cfg.max_sandboxes, self.cfg.uid_slots)
            .map_err(|e| match e {
                e @ (StoreError::Full { .. } | StoreError::NoFreeSlot { .. }) => {
                    CoreError::Capacity(e.to_string())
                }
                e => CoreError::from(e),
            })?;
        drop(admitted);
        let booted = match self
            .boot(&new, slot, new.network.as_ref(), Default::default(), false)
            .await
            .and_then(|b| {
                self.store
                    .set_running(&new.id, b.pid, b.start, &b.sock)
                    .map_err(CoreError::from)?;
                Ok(b)
            }) {
            Ok(b) => b,
            Err(e) => {
                self.discard(&new.id, slot, "its launch failed").await;
                return Err(e);
            }
        };
        let me = self.clone();
        let (id, pid) = (new.id.clone(), booted.pid);
        let watcher = tokio::spawn(watch_init(me, id, pid, booted.pidfd)).abort_handle();
        Ok(Ready {
            id: new.id,
            limits: new.limits,
            slot,
            pid: booted.pid,
            client: booted.client,
            watcher,
            generation,
        })
    }

    /// Ends a pooled sandbox that nobody has claimed (no record: it never had one).
    pub(super) async fn discard(&self, id: &SandboxId, slot: u32, why: &str) {
        self.network
            .teardown_stored(self.store.as_ref(), id, slot)
            .await;
        if let Err(e) = self.iso_destroy(id).await {
            warn!(id = %id, "removing a warm sandbox: {e}");
            return;
        }
        let reason = format!("warm pool: {why}");
        if let Err(e) =
            self.store
                .set_state(id, SandboxState::Destroyed, Some(now_ms()), Some(&reason))
        {
            warn!(id = %id, "recording the end of a warm sandbox: {e}");
        }
    }

    /// Destroys the pooled sandbox `id` whose init exited by itself (its watcher calls).
    pub(super) async fn pooled_died(&self, id: &SandboxId, how: &str) {
        if let Some(r) = self.pools.remove(id) {
            warn!(id = %id, how, "a warm sandbox's init exited; replacing it");
            self.discard(&r.id, r.slot, &format!("its init exited ({how})"))
                .await;
            self.pools.kick.notify_one();
        }
    }

    /// Destroys every ready sandbox of `template`'s pools (it was built again): the pools
    /// refill from the new build. Launches under way are discarded when they end.
    pub(crate) async fn drain_pools(&self, template: &str) {
        let (keys, drained): (Vec<PoolKey>, Vec<Vec<Ready>>) = {
            let mut pools = lock(&self.pools.pools);
            pools
                .iter_mut()
                .filter(|(k, _)| k.template == template)
                .map(|(k, p)| {
                    p.generation += 1;
                    (k.clone(), p.ready.drain(..).collect::<Vec<_>>())
                })
                .unzip()
        };
        for k in &keys {
            self.set_pool_gauge(k);
        }
        let drained = drained.into_iter().flatten();
        for r in drained {
            // (Its watcher reaps its init and finds it in no pool.)
            self.discard(&r.id, r.slot, "its template was built again")
                .await;
        }
        self.pools.kick.notify_one();
    }

    /// Destroys one ready sandbox of the fullest pool, so that a create no pool serves finds
    /// a place on a node at its capacity. False when every pool is empty.
    pub(super) async fn evict_pooled(&self) -> bool {
        let evicted = {
            let mut pools = lock(&self.pools.pools);
            pools
                .iter_mut()
                .max_by_key(|(_, p)| p.ready.len())
                .and_then(|(k, p)| Some((k.clone(), p.ready.pop_back()?)))
        };
        let Some((key, r)) = evicted else {
            return false;
        };
        self.set_pool_gauge(&key);
        self.discard(
            &r.id,
            r.slot,
            "its place went to a create at the node's capacity",
        )
        .await;
        true
    }

    /// Destroys every pooled sandbox (the daemon stops).
    pub(crate) async fn drain_all_pools(&self) {
        let drained: Vec<Ready> = {
            let mut pools = lock(&self.pools.pools);
            pools
                .values_mut()
                .flat_map(|p| {
                    p.size = 0;
                    p.generation += 1;
                    p.ready.drain(..).collect::<Vec<_>>()
                })
                .collect()
        };
        for r in drained {
            self.discard(&r.id, r.slot, "the daemon stopped").await;
        }
    }

    /// A create that a warm sandbox can serve: claims one and applies the create's plan to
    /// it. `Ok(None)` when none can (the caller launches one).
    pub(super) async fn claim(
        self: &Arc<Self>,
        plan: &NewSandbox,
        plain: bool,
        approvals: &Option<rampart_types::approval::ApprovalPolicy>,
        secrets: &[(String, Vec<u8>)],
    ) -> Result<Option<SandboxInfo>, CoreError> {
        // A node without pools pays one uncontended lock here.
        if lock(&self.pools.pools).is_empty() {
            return Ok(None);
        }
        // What is fixed at launch must be as the pool launched it: no environment, disk
        // source or volumes; a network without secrets whose hosts nobody approves.
        let asks_hosts = approvals.as_ref().is_some_and(|a| !a.hosts.is_empty());
        if !plain
            || !plan.env.is_empty()
            || plan
                .network
                .as_ref()
                .is_some_and(|n| !n.secrets.is_empty() || asks_hosts)
        {
            return Ok(None);
        }
        let key = PoolKey {
            template: plan.template.clone(),
            isolation: plan.isolation,
            network: plan.network.as_ref().map(|n| normal(&n.policy)),
        };
        if !lock(&self.pools.pools).contains_key(&key) {
            return Ok(None);
        }
        let ready = loop {
            let Some(r) = self.pools.take(&key, &plan.limits) else {
                self.metrics.pool_claims.with_label_values(&["miss"]).inc();
                return Ok(None);
            };
            // Its init may have ended just now (its watcher then finds it gone).
            if proc::proc_stat(r.pid).is_some_and(|s| !matches!(s.state, 'Z' | 'X' | 'x')) {
                break r;
            }
            self.discard(&r.id, r.slot, "its init exited before a claim")
                .await;
        };
        self.set_pool_gauge(&key);
        let id = ready.id.clone();
        let mut new = plan.clone();
        new.id = id.clone();
        self.approvals.keep(&id, approvals.clone());
        self.audit.set_secrets(&id, secrets.to_vec());
        let mut created = self.created_body(&new);
        if let EventBody::Created(c) = &mut created {
            c.spec["pool"] = Value::Bool(true);
            if let Some(n) = &new.network {
                c.policy = serde_json::to_value(n.policy.public()).unwrap_or_default();
            }
            if let Ok(Some(p)) = self
                .approvals
                .policy(&id, || self.persist.approval_policy(&id))
            {
                c.spec["approvals"] = serde_json::to_value(&p.source).unwrap_or_default();
            }
        }
        let claim = Claim {
            id: id.clone(),
            tenant: new.tenant.clone(),
            metadata: new.metadata.clone(),
            created_at_ms: new.created_at_ms,
            expires_at_ms: new.expires_at_ms,
            on_timeout: new.on_timeout,
            idle_pause_secs: new.idle_pause_secs,
            access: new.access.clone(),
            request: new.request.clone(),
            network: new.network.clone(),
        };
        let store = &self.store;
        let claimed = match &new.network {
            // The create's own words for the pool's policy (a precedence no rule uses).
            Some(n) => self.network.set_policy(&id, n.policy.clone()),
            None => Ok(()),
        }
        .and_then(|()| {
            self.audit.record(
                &id,
                false,
                |_| created,
                Vec::new(),
                |e| store.claim_audited(&claim, e),
            )
        });
        if let Err(e) = claimed {
            // Refused (a tenant's quota): nothing was applied; it goes back to its pool.
            self.approvals.forget(&id);
            self.audit.set_secrets(&id, Vec::new());
            if let Some(p) = lock(&self.pools.pools).get_mut(&key) {
                p.ready.push_front(ready);
            }
            self.set_pool_gauge(&key);
            return Err(e);
        }
        self.metrics.pool_claims.with_label_values(&["hit"]).inc();
        let watcher = ready.watcher;
        let terms = self.terms(
            &id,
            new.expires_at_ms,
            false,
            new.on_timeout,
            new.tenant.clone(),
            new.idle_pause_secs,
        );
        self.registry
            .insert(&id, ready.client, ready.pid, terms, || watcher);
        Ok(Some(running_info(&new)))
    }

    fn set_pool_gauge(&self, key: &PoolKey) {
        self.metrics
            .pool_ready
            .with_label_values(&[&key.template, key.isolation.as_str()])
            .set(self.pools.ready_len(key) as i64);
    }
}

/// A running sandbox as its create answers.
pub(super) fn running_info(new: &NewSandbox) -> SandboxInfo {
    SandboxInfo {
        id: new.id.clone(),
        template: new.template.clone(),
        isolation: new.isolation,
        state: SandboxState::Running,
        limits: new.limits.clone(),
        metadata: new.metadata.clone(),
        env_names: new.env.keys().cloned().collect(),
        created_at: rfc3339(new.created_at_ms),
        expires_at: rfc3339(new.expires_at_ms),
        ended_at: None,
        reason: None,
        access_token: new.access.as_ref().map(|a| a.token.clone()),
        tenant: new.tenant.clone(),
        idle_pause_secs: new.idle_pause_secs,
    }
}

/// Keeps the pools full, one launch at a time; after a failed launch it waits (longer each
/// time, at most a minute) or until kicked.
async fn refill(me: Arc<Sandboxes>) {
    let mut backoff = Duration::ZERO;
    loop {
        if me.is_stopped() {
            return;
        }
        let Some((key, generation, network)) = me.pools.next_to_fill() else {
            me.pools.kick.notified().await;
            continue;
        };
        let t0 = Instant::now();
        let launched = me.launch_pooled(&key, generation, network).await;
        let ok = launched.is_ok();
        let at_capacity = matches!(launched, Err(CoreError::Capacity(_)));
        let failure = launched.as_ref().err().map(|e| e.to_string());
        match me.pools.filled(&key, launched.ok()) {
            Ok(_) => {}
            Err(stale) => {
                me.discard(&stale.id, stale.slot, "its template was built again")
                    .await;
            }
        }
        me.set_pool_gauge(&key);
        if ok {
            me.metrics
                .pool_refill_seconds
                .observe(t0.elapsed().as_secs_f64());
            backoff = Duration::ZERO;
        } else {
            backoff = (backoff * 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
            // At the node's capacity the pools wait for room, quietly.
            if at_capacity {
                debug!(template = %key.template, "no room for a warm sandbox");
                let _ = tokio::time::timeout(backoff, me.pools.kick.notified()).await;
                continue;
            }
            warn!(
                template = %key.template,
                isolation = %key.isolation.as_str(),
                "a warm sandbox's launch failed (next try in {}s): {}",
                backoff.as_secs(),
                failure.unwrap_or_default()
            );
            // Waits for a kick (a claim, a drain) or the backoff, whichever comes first.
            let _ = tokio::time::timeout(backoff, me.pools.kick.notified()).await;
        }
    }
}
