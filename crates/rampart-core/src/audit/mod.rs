//! The daemon's side of the proof: per-sandbox event chains recorded in the store, the
//! node's Merkle log of published chain heads and its signed tree heads, bundle export.
//!
//! Every event is written in one store transaction, together with the state change it
//! records when there is one (`created` with `running`, `destroyed` with `destroyed`,
//! `timeout_changed` with the new deadline). The in-memory chain moves only after the commit.

pub(crate) mod fsdiff;
pub(crate) mod manifest;
pub(crate) mod netaudit;

use crate::isolation::{CounterFiles, CpuFormat};
use crate::util::lock;
use crate::CoreError;
use rampart_audit::{
    now, referenced_blobs, Bundle, Chain, ContentHasher, Event, EventBody, Hash, HeadLeaf,
    MerkleLog, NodeKey, SignedTreeHead,
};
use rampart_store::{LeafRow, NewEvent, SandboxStore, StoreError, TreeHeadRow};
use rampart_types::SandboxId;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bounds of the network audit events of one sandbox: a token bucket. An entry beyond the
/// budget is not recorded one by one but counted; the counts are recorded as one `network`
/// event of kind `suppressed` once the budget has a token again, or at destroy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetEventBudget {
    /// Events recorded in a burst (the bucket's size, at least 1).
    pub burst: u32,
    /// Events per second recorded in the long run (the refill rate, above 0).
    pub per_sec: f64,
}

impl Default for NetEventBudget {
    /// A burst of 1000, 50 per second.
    fn default() -> Self {
        NetEventBudget {
            burst: 1000,
            per_sec: 50.0,
        }
    }
}

/// Audit settings of the daemon.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// Record events at all (`false` only for measurements: nothing is recorded then).
    pub enabled: bool,
    /// Bytes of each output stream (and of input) kept as a blob; beyond, digest only.
    pub blob_cap: usize,
    /// How often live sandboxes' chain heads are published to the node log (if they moved).
    pub publish_interval: Duration,
    /// Record `fs_diff` (the writable layer against the template) at destroy.
    pub fs_diff: bool,
    /// Bounds of an `fs_diff` manifest (entries, bytes hashed).
    pub fs_diff_limits: fsdiff::DiffLimits,
    /// Budget of each sandbox's `network` / `secret_used` events (beyond it, counted).
    pub network_events: NetEventBudget,
}

impl Default for AuditConfig {
    /// Enabled, 1 MiB per stream, publish every 60 s, `fs_diff` on with the default bounds.
    fn default() -> Self {
        AuditConfig {
            enabled: true,
            blob_cap: 1 << 20,
            publish_interval: Duration::from_secs(60),
            fs_diff: true,
            fs_diff_limits: fsdiff::DiffLimits::default(),
            network_events: NetEventBudget::default(),
        }
    }
}

fn enc<E: Into<Box<dyn std::error::Error + Send + Sync>>>(e: E) -> CoreError {
    CoreError::failed("audit record")(e)
}

/// The node log in memory and what it last published per sandbox.
#[derive(Debug)]
struct NodeLog {
    log: MerkleLog,
    /// Chain length last published, per sandbox seen since start.
    published: HashMap<SandboxId, u64>,
}

/// A sandbox's chain and the policy its record puts in force (named by each event).
#[derive(Debug)]
struct Chained {
    chain: Chain,
    policy: rampart_audit::authority::PolicyState,
}

/// The principal an event is recorded for: the request's, `sandbox` for what the sandbox's
/// processes did on their own (network traffic), `node` for the daemon's own work.
fn principal_of(body: &EventBody) -> String {
    if matches!(
        body,
        EventBody::Network(_) | EventBody::SecretUsed(_) | EventBody::Package(_)
    ) {
        return "sandbox".into();
    }
    crate::principal::caller().unwrap_or_else(|| "node".into())
}

/// The recorder. One per daemon.
#[derive(Debug)]
pub(crate) struct Audit {
    cfg: AuditConfig,
    store: Arc<dyn SandboxStore>,
    key: NodeKey,
    chains: Mutex<HashMap<SandboxId, Arc<Mutex<Chained>>>>,
    node: Mutex<NodeLog>,
    templates: Mutex<HashMap<String, String>>,
    appended: tokio::sync::watch::Sender<u64>,
    /// Open counter files per sandbox (None: the tier has none, or they did not open).
    meters: Mutex<HashMap<SandboxId, Option<Arc<Meter>>>>,
    /// Where events without a state change are acknowledged (None: straight to the store).
    journal: Option<rampart_store::journal::Journal>,
    /// Sandboxes whose `destroyed` was recorded by this daemon (the latest [`ENDED_KEPT`]):
    /// late events (a network log entry, the end of a process killed by the destroy) are
    /// not appended after it.
    ended: Mutex<(
        std::collections::HashSet<SandboxId>,
        std::collections::VecDeque<SandboxId>,
    )>,
    /// The hash of each sandbox's `fs_diff` at destroy, until its `destroyed` takes it.
    manifests: Mutex<HashMap<SandboxId, Hash>>,
    /// Values each sandbox declared sensitive (`secret_env`), redacted from what is kept.
    secrets: Mutex<HashMap<SandboxId, rampart_audit::redact::Secrets>>,
}

/// How many ended sandboxes [`Audit`] remembers.
const ENDED_KEPT: usize = 65_536;

/// A sandbox's CPU time and peak memory counters, kept open and re-read with `pread` at
/// offset 0 (which makes a cgroup file produce its current value again): one system call per
/// value, instead of a path walk, an open, a stat, two reads and a close.
#[derive(Debug)]
pub(crate) struct Meter {
    cpu: File,
    cpu_format: CpuFormat,
    peak_memory: Option<File>,
}

impl Meter {
    fn open(files: &CounterFiles) -> std::io::Result<Meter> {
        Ok(Meter {
            cpu: File::open(&files.cpu)?,
            cpu_format: files.cpu_format,
            peak_memory: files.peak_memory.as_ref().and_then(|p| File::open(p).ok()),
        })
    }

    /// The first bytes of `f`, as text.
    fn read(f: &File, buf: &mut [u8]) -> Option<usize> {
        f.read_at(buf, 0).ok()
    }

    /// CPU time so far, microseconds.
    pub(crate) fn cpu_usec(&self) -> Option<u64> {
        let mut buf = [0u8; 512];
        let n = Self::read(&self.cpu, &mut buf)?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        match self.cpu_format {
            CpuFormat::Nanoseconds => text.trim().parse::<u64>().ok().map(|ns| ns / 1000),
            CpuFormat::StatUsageUsec => text
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse().ok()),
        }
    }

    /// Peak memory, bytes (None when unknown or zero).
    pub(crate) fn peak_memory_bytes(&self) -> Option<u64> {
        let mut buf = [0u8; 64];
        let n = Self::read(self.peak_memory.as_ref()?, &mut buf)?;
        std::str::from_utf8(&buf[..n])
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&p| p > 0)
    }
}

impl Audit {
    /// Loads (or makes, at first start) the node key `<data>/node.key` and the node log.
    pub(crate) fn open(
        cfg: AuditConfig,
        store: Arc<dyn SandboxStore>,
        data_dir: &Path,
    ) -> Result<Audit, CoreError> {
        let key_path = data_dir.join("node.key");
        let key = NodeKey::load_or_create(&key_path).map_err(CoreError::failed(format!(
            "node key {}",
            key_path.display()
        )))?;
        // Events a killed daemon acknowledged from its journal are moved into the store
        // before any chain is resumed.
        let journal = if cfg.enabled {
            Some(rampart_store::journal::Journal::open(
                &data_dir.join("audit.journal"),
                store.clone(),
            )?)
        } else {
            None
        };
        let mut leaves = Vec::new();
        for h in store.leaf_hashes().map_err(CoreError::from)? {
            leaves.push(Hash::parse(&h).map_err(|e| enc(format!("stored leaf {h:?}: {e}")))?);
        }
        let (appended, _) = tokio::sync::watch::channel(0);
        Ok(Audit {
            cfg,
            store,
            key,
            chains: Mutex::new(HashMap::new()),
            node: Mutex::new(NodeLog {
                log: MerkleLog::from_leaves(leaves),
                published: HashMap::new(),
            }),
            templates: Mutex::new(HashMap::new()),
            appended,
            meters: Mutex::new(HashMap::new()),
            journal,
            ended: Mutex::new(Default::default()),
            manifests: Mutex::new(HashMap::new()),
            secrets: Mutex::new(HashMap::new()),
        })
    }

    /// Moves the journal's pending events into the store (before reading events, or writing
    /// one in the store directly, so that the store holds every chain in order).
    fn flush(&self) -> Result<(), CoreError> {
        match &self.journal {
            Some(j) => Ok(j.flush()?),
            None => Ok(()),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    pub(crate) fn blob_cap(&self) -> usize {
        self.cfg.blob_cap
    }

    pub(crate) fn config(&self) -> &AuditConfig {
        &self.cfg
    }

    pub(crate) fn publish_interval(&self) -> Duration {
        self.cfg.publish_interval
    }

    /// The node's public key (`ed25519:<hex>`) and key id.
    /// Seals a usage report of `records` with the node key (`rampart_audit::usage`).
    pub(crate) fn seal_usage(
        &self,
        tenant: Option<String>,
        from: String,
        to: String,
        records: Vec<rampart_types::tenant::SandboxUsage>,
    ) -> Result<rampart_types::tenant::UsageReport, CoreError> {
        rampart_audit::usage::seal(tenant, from, to, rampart_audit::now(), records, &self.key)
            .map_err(CoreError::failed("sealing a usage report"))
    }

    pub(crate) fn key(&self) -> (String, String) {
        (
            self.key.public_key().to_string(),
            self.key.key_id().to_hex(),
        )
    }

    /// The node log's latest signed tree head as a C2SP checkpoint (a signed note), and the
    /// note verifier key.
    pub(crate) fn checkpoint(&self) -> (String, String) {
        let (size, root) = {
            let node = lock(&self.node);
            (node.log.size(), node.log.root())
        };
        (
            rampart_audit::checkpoint::signed(&self.key, size, &root),
            rampart_audit::checkpoint::verifier_key(&self.key.public_key()),
        )
    }

    /// Remembers a template's content digest.
    pub(crate) fn set_template_digest(&self, name: &str, digest: String) {
        lock(&self.templates).insert(name.to_owned(), digest);
    }

    /// A template's content digest, as computed at start.
    pub(crate) fn template_digest(&self, name: &str) -> String {
        lock(&self.templates)
            .get(name)
            .cloned()
            .unwrap_or_else(|| "unknown".into())
    }

    /// A receiver that changes whenever an event is appended (to any sandbox).
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.appended.subscribe()
    }

    /// The chain of a sandbox: in memory, or resumed from its last stored event.
    fn chain(&self, id: &SandboxId) -> Result<Arc<Mutex<Chained>>, CoreError> {
        if let Some(c) = lock(&self.chains).get(id) {
            return Ok(c.clone());
        }
        self.flush()?;
        let (chain, policy) = match self.store.last_event(id).map_err(CoreError::from)? {
            Some((seq, hash)) => (
                Chain::resume(
                    id.clone(),
                    seq + 1,
                    Hash::parse(&hash).map_err(|e| enc(format!("stored hash {hash:?}: {e}")))?,
                ),
                self.stored_policy(id)?,
            ),
            None => (Chain::new(id.clone()), Default::default()),
        };
        Ok(lock(&self.chains)
            .entry(id.clone())
            .or_insert_with(|| Arc::new(Mutex::new(Chained { chain, policy })))
            .clone())
    }

    /// The policy a sandbox's stored record puts in force (after a restart): its `created`
    /// and every `policy_changed`, read back.
    fn stored_policy(
        &self,
        id: &SandboxId,
    ) -> Result<rampart_audit::authority::PolicyState, CoreError> {
        let mut policy = rampart_audit::authority::PolicyState::new();
        let mut after = None;
        loop {
            let page = self
                .store
                .events(id, after, 1000)
                .map_err(CoreError::from)?;
            let Some(last) = page.last() else { break };
            after = Some(last.seq);
            for e in &page {
                if !(e.json.contains("\"type\":\"created\"")
                    || e.json.contains("\"type\":\"policy_changed\""))
                {
                    continue;
                }
                let ev: rampart_types::audit::Event = serde_json::from_str(&e.json)
                    .map_err(|err| enc(format!("stored event {} of {id}: {err}", e.seq)))?;
                policy.observe(&ev.body);
            }
        }
        Ok(policy)
    }

    /// Records an event made by `body` (given the event's seq) with `blobs`, inside the store
    /// write `write` (which gets `None` when auditing is off, or when `only_if_started` and
    /// the sandbox has no event yet). The chain moves only once `write` succeeded.
    pub(crate) fn record<T>(
        &self,
        id: &SandboxId,
        only_if_started: bool,
        body: impl FnOnce(u64) -> EventBody,
        blobs: Vec<Vec<u8>>,
        write: impl FnOnce(Option<&NewEvent>) -> Result<T, StoreError>,
    ) -> Result<T, CoreError> {
        self.record_via(id, only_if_started, false, body, blobs, |e| {
            if e.is_some() {
                // The chain's earlier events reach the store first.
                self.flush()?;
            }
            write(e).map_err(CoreError::from)
        })
    }

    /// [`Audit::record`] with any write.
    fn record_via<T>(
        &self,
        id: &SandboxId,
        only_if_started: bool,
        unless_ended: bool,
        body: impl FnOnce(u64) -> EventBody,
        blobs: Vec<Vec<u8>>,
        write: impl FnOnce(Option<&NewEvent>) -> Result<T, CoreError>,
    ) -> Result<T, CoreError> {
        if !self.cfg.enabled || (unless_ended && self.is_ended(id)) {
            // (Checked again under the chain's lock; checked here so that a late event does
            // not bring a forgotten chain back into memory.)
            return write(None);
        }
        let chain = self.chain(id)?;
        let mut chain = lock(&chain);
        if (only_if_started && chain.chain.is_empty()) || (unless_ended && self.is_ended(id)) {
            drop(chain);
            return write(None);
        }
        let body = body(chain.chain.len());
        // Marked under the chain's lock: an append waiting for it sees the end.
        let ending = matches!(body, EventBody::Destroyed(_));
        if ending {
            self.set_ended(id, true);
        }
        // Who it is for, and the policy in force (a `created` or `policy_changed` puts its
        // own in force: kept once the event is written).
        let next_policy = match body {
            EventBody::Created(_) | EventBody::PolicyChanged(_) => {
                let mut p = chain.policy.clone();
                p.observe(&body);
                Some(p)
            }
            _ => None,
        };
        let auth = rampart_types::audit::Authority {
            principal: principal_of(&body),
            policy: next_policy.as_ref().unwrap_or(&chain.policy).digest(),
        };
        // One encoding of the body gives both the hash and the stored canonical JSON.
        let (event, json) = match chain.chain.next_event_json(body, now(), Some(auth)) {
            Ok(x) => x,
            Err(e) => {
                if ending {
                    self.set_ended(id, false);
                }
                return Err(enc(e));
            }
        };
        let ne = NewEvent {
            sandbox: id.clone(),
            seq: event.seq,
            time: event.time.clone(),
            hash: event.hash.to_hex(),
            prev: event.prev.to_hex(),
            json,
            blobs: blobs
                .into_iter()
                .map(|b| (rampart_audit::content_digest(&b).to_hex(), b))
                .collect(),
        };
        let out = match write(Some(&ne)) {
            Ok(out) => out,
            Err(e) => {
                if ending {
                    self.set_ended(id, false);
                }
                return Err(e);
            }
        };
        // The event was made by `next_event` on this chain under this lock: moving past it
        // needs no second hash computation (what `advance` would check).
        chain.chain = Chain::resume(id.clone(), event.seq + 1, event.hash);
        if let Some(p) = next_policy {
            chain.policy = p;
        }
        drop(chain);
        self.appended.send_modify(|n| *n = n.wrapping_add(1));
        Ok(out)
    }

    /// Records an event that has no state change of its own: acknowledged once in the
    /// journal (see [`crate::journal`]).
    pub(crate) fn append(
        &self,
        id: &SandboxId,
        body: impl FnOnce(u64) -> EventBody,
        blobs: Vec<Vec<u8>>,
    ) -> Result<(), CoreError> {
        self.record_via(id, false, true, body, blobs, |e| match (e, &self.journal) {
            (Some(e), Some(j)) => Ok(j.append(e)?),
            (Some(e), None) => self.store.append_event(e).map_err(CoreError::from),
            (None, _) => Ok(()),
        })
    }

    /// Records an event with no state change of its own, only if the sandbox's log has
    /// started (events observed around a sandbox, like its network traffic).
    pub(crate) fn append_if_started(
        &self,
        id: &SandboxId,
        body: EventBody,
    ) -> Result<(), CoreError> {
        self.record_via(
            id,
            true,
            true,
            |_| body,
            Vec::new(),
            |e| match (e, &self.journal) {
                (Some(e), Some(j)) => Ok(j.append(e)?),
                (Some(e), None) => self.store.append_event(e).map_err(CoreError::from),
                (None, _) => Ok(()),
            },
        )
    }

    /// The head of a sandbox's chain: its last event's sequence number and hash (None: no
    /// event yet, or the record is off).
    pub(crate) fn head(&self, id: &SandboxId) -> Result<Option<(u64, String)>, CoreError> {
        if !self.cfg.enabled {
            return Ok(None);
        }
        self.flush()?;
        self.store.last_event(id).map_err(CoreError::from)
    }

    /// Remembers the hash of a sandbox's `fs_diff` at destroy for its `destroyed`.
    pub(crate) fn set_manifest(&self, id: &SandboxId, hash: Hash) {
        lock(&self.manifests).insert(id.clone(), hash);
    }

    /// The hash of the `fs_diff` recorded at this destroy, if one was (taken once).
    pub(crate) fn take_manifest(&self, id: &SandboxId) -> Option<Hash> {
        lock(&self.manifests).remove(id)
    }

    fn is_ended(&self, id: &SandboxId) -> bool {
        lock(&self.ended).0.contains(id)
    }

    fn set_ended(&self, id: &SandboxId, ended: bool) {
        let mut e = lock(&self.ended);
        if !ended {
            e.0.remove(id);
            return;
        }
        if e.0.insert(id.clone()) {
            e.1.push_back(id.clone());
            while e.1.len() > ENDED_KEPT {
                if let Some(old) = e.1.pop_front() {
                    e.0.remove(&old);
                }
            }
        }
    }

    /// Forgets a sandbox's chain (it is destroyed; its events stay in the store) and closes
    /// its counter files.
    pub(crate) fn forget(&self, id: &SandboxId) {
        lock(&self.chains).remove(id);
        lock(&self.meters).remove(id);
        lock(&self.manifests).remove(id);
        lock(&self.secrets).remove(id);
    }

    /// Sets the values sandbox `id` declared sensitive (its `secret_env` entries of `env`):
    /// from now on every exec's input and output is kept with them redacted.
    pub(crate) fn set_secrets(&self, id: &SandboxId, values: Vec<(String, Vec<u8>)>) {
        let mut m = lock(&self.secrets);
        if values.is_empty() {
            m.remove(id);
        } else {
            m.insert(id.clone(), values.into());
        }
    }

    /// The values a create request declares sensitive (its `secret_env` entries of `env`).
    pub(crate) fn secret_values(req: &rampart_types::CreateSandbox) -> Vec<(String, Vec<u8>)> {
        req.secret_env
            .iter()
            .filter_map(|n| req.env.get(n).map(|v| (n.clone(), v.clone().into_bytes())))
            .collect()
    }

    /// The values sandbox `id` declared sensitive, if any.
    pub(crate) fn secrets(&self, id: &SandboxId) -> Option<rampart_audit::redact::Secrets> {
        lock(&self.secrets).get(id).cloned()
    }

    /// The counter files of a sandbox, opened at its first exec from `files` (None when it
    /// has none or they cannot be opened: the caller reads the tier's usage instead).
    pub(crate) fn meter(
        &self,
        id: &SandboxId,
        files: impl FnOnce() -> Option<CounterFiles>,
    ) -> Option<Arc<Meter>> {
        if let Some(m) = lock(&self.meters).get(id) {
            return m.clone();
        }
        let m = files().and_then(|f| Meter::open(&f).ok()).map(Arc::new);
        lock(&self.meters).insert(id.clone(), m.clone());
        m
    }

    /// The current (length, head) of a sandbox's chain.
    fn current(&self, id: &SandboxId) -> Result<(u64, Hash), CoreError> {
        let c = self.chain(id)?;
        let c = lock(&c);
        Ok((c.chain.len(), c.chain.head()))
    }

    /// Publishes the heads of `ids` that moved since their last publication, and signs a
    /// tree head. Returns the new tree size, if anything was published.
    pub(crate) fn publish(&self, ids: &[SandboxId]) -> Result<Option<u64>, CoreError> {
        if !self.cfg.enabled {
            return Ok(None);
        }
        let mut heads = Vec::new();
        for id in ids {
            let (len, head) = self.current(id)?;
            if len > 0 {
                heads.push((id.clone(), len, head));
            }
        }
        let mut node = lock(&self.node);
        let mut leaves = Vec::new();
        let mut log = node.log.clone();
        for (id, len, head) in heads {
            let last = match node.published.get(&id) {
                Some(l) => Some(*l),
                None => self
                    .store
                    .last_leaf(&id)
                    .map_err(CoreError::from)?
                    .map(|l| l.length),
            };
            if last == Some(len) {
                node.published.insert(id, len);
                continue;
            }
            let leaf = HeadLeaf {
                sandbox: id.clone(),
                length: len,
                head,
            };
            let h = leaf.hash();
            let index = log.push(h);
            leaves.push(LeafRow {
                index,
                leaf_hash: h.to_hex(),
                sandbox: id,
                length: len,
                head: head.to_hex(),
            });
        }
        if leaves.is_empty() {
            return Ok(None);
        }
        let sth = self.key.sign_tree_head(log.size(), log.root(), now());
        let row = tree_head_row(&sth)?;
        self.store.publish(&leaves, &row).map_err(CoreError::from)?;
        for l in &leaves {
            node.published.insert(l.sandbox.clone(), l.length);
        }
        node.log = log;
        Ok(Some(sth.tree_size))
    }

    /// Publishes every live chain that moved (the periodic task).
    pub(crate) fn publish_live(&self) -> Result<Option<u64>, CoreError> {
        let ids: Vec<SandboxId> = lock(&self.chains).keys().cloned().collect();
        self.publish(&ids)
    }

    /// Stored events of a sandbox, `seq > after`, at most `limit`.
    pub(crate) fn events(
        &self,
        id: &SandboxId,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Event>, CoreError> {
        self.flush()?;
        let rows = self
            .store
            .events(id, after, limit)
            .map_err(CoreError::from)?;
        rows.iter()
            .map(|r| {
                serde_json::from_str::<Event>(&r.json)
                    .map_err(|e| enc(format!("stored event {} of {id}: {e}", r.seq)))
            })
            .collect()
    }

    /// The record of sandbox `id` as a DSSE envelope around an in-toto Statement (see
    /// [`rampart_audit::dsse`]), signed with the node's key; made from its bundle, which is
    /// verified first.
    pub(crate) fn attestation(
        &self,
        id: &SandboxId,
        more: &dyn Fn(&Hash) -> Option<Vec<u8>>,
    ) -> Result<Vec<u8>, CoreError> {
        let bundle = self.bundle_with(id, more)?;
        let st = rampart_audit::dsse::statement(&bundle, &self.key.public_key()).map_err(
            CoreError::failed(format!("the record of sandbox {id} does not verify")),
        )?;
        serde_json::to_vec_pretty(&rampart_audit::dsse::envelope(&self.key, &st))
            .map_err(CoreError::failed("encoding the envelope"))
    }

    /// The bundle of a sandbox's whole log, publishing its head first if it moved; the
    /// blobs the store does not hold (artifacts) are looked up in `more`.
    pub(crate) fn bundle_with(
        &self,
        id: &SandboxId,
        more: &dyn Fn(&Hash) -> Option<Vec<u8>>,
    ) -> Result<Vec<u8>, CoreError> {
        let events = self.events(id, None, usize::MAX)?;
        let Some(last) = events.last() else {
            return Err(CoreError::BadRequest {
                field: "id".into(),
                message: format!("no audit event was recorded for sandbox {id}"),
            });
        };
        let (len, head) = (events.len() as u64, last.hash);
        let leaf = HeadLeaf {
            sandbox: id.clone(),
            length: len,
            head,
        };
        let mut node = lock(&self.node);
        let stored = self.store.last_leaf(id).map_err(CoreError::from)?;
        let (index, sth) = match stored {
            Some(l) if l.length == len && l.head == head.to_hex() => {
                let th = self
                    .store
                    .latest_tree_head()
                    .map_err(CoreError::from)?
                    .ok_or_else(|| enc("a leaf is stored but no tree head"))?;
                let sth: SignedTreeHead = serde_json::from_str(&th.json).map_err(enc)?;
                (l.index, sth)
            }
            _ => {
                let mut log = node.log.clone();
                let h = leaf.hash();
                let index = log.push(h);
                let sth = self.key.sign_tree_head(log.size(), log.root(), now());
                let row = LeafRow {
                    index,
                    leaf_hash: h.to_hex(),
                    sandbox: id.clone(),
                    length: len,
                    head: head.to_hex(),
                };
                self.store
                    .publish(&[row], &tree_head_row(&sth)?)
                    .map_err(CoreError::from)?;
                node.log = log;
                node.published.insert(id.clone(), len);
                (index, sth)
            }
        };
        let proof = node
            .log
            .inclusion_proof(index, sth.tree_size)
            .map_err(enc)?;
        drop(node);
        let mut blobs = Vec::new();
        for digest in referenced_blobs(&events) {
            if let Some(b) = self.store.blob(&digest.to_hex()).map_err(CoreError::from)? {
                blobs.push(b);
            } else if let Some(b) = more(&digest) {
                blobs.push(b);
            }
        }
        let bundle = Bundle::assemble(
            id.clone(),
            events,
            blobs,
            index,
            proof,
            sth,
            self.key.public_key(),
        );
        Ok(bundle.to_bytes())
    }
}

fn tree_head_row(sth: &SignedTreeHead) -> Result<TreeHeadRow, CoreError> {
    Ok(TreeHeadRow {
        tree_size: sth.tree_size,
        root: sth.root_hash.to_hex(),
        timestamp: sth.timestamp.clone(),
        json: serde_json::to_string(sth).map_err(enc)?,
    })
}

/// A content digest of a template: SHA-256 over a manifest of its directory (every path,
/// kind, mode, size, a regular file's SHA-256, a symlink's target; sorted; mount points and
/// other file systems not entered) and of the host's package database
/// (`/var/lib/dpkg/status`), which stands for the host `/usr` the sandboxes see.
/// Spelled `sha256:<hex>`.
pub(crate) fn template_digest(dir: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let mut manifest = Vec::new();
    let root_dev = std::fs::symlink_metadata(dir)?.dev();
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    let mut entries = Vec::new();
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let p = e.path();
            let md = std::fs::symlink_metadata(&p)?;
            entries.push((p.clone(), md.clone()));
            if md.is_dir() && md.dev() == root_dev {
                stack.push(p);
            }
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (p, md) in entries {
        let rel = p.strip_prefix(dir).unwrap_or(&p);
        let ft = md.file_type();
        let detail = if ft.is_file() {
            let mut h = ContentHasher::new(0);
            let mut f = std::fs::File::open(&p)?;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = std::io::Read::read(&mut f, &mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            format!("f {} {}", md.len(), h.finish().0.digest)
        } else if ft.is_symlink() {
            format!("l {}", std::fs::read_link(&p)?.display())
        } else if ft.is_dir() {
            "d".into()
        } else {
            "o".into()
        };
        manifest.extend_from_slice(
            format!("{} {:o} {detail}\n", rel.display(), md.mode() & 0o7777).as_bytes(),
        );
    }
    let dpkg = std::fs::read("/var/lib/dpkg/status").unwrap_or_default();
    manifest.extend_from_slice(
        format!(
            "host-dpkg-status {}\n",
            rampart_audit::content_digest(&dpkg)
        )
        .as_bytes(),
    );
    Ok(format!(
        "sha256:{}",
        rampart_audit::content_digest(&manifest)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meter_rereads_its_files_from_the_start() {
        let d = tempfile::tempdir().unwrap();
        let (cpu, peak) = (d.path().join("cpu"), d.path().join("peak"));
        std::fs::write(&cpu, "2500000\n").unwrap();
        std::fs::write(&peak, "4096\n").unwrap();
        let m = Meter::open(&CounterFiles {
            cpu: cpu.clone(),
            cpu_format: CpuFormat::Nanoseconds,
            peak_memory: Some(peak.clone()),
        })
        .unwrap();
        assert_eq!(m.cpu_usec(), Some(2500));
        assert_eq!(m.cpu_usec(), Some(2500));
        assert_eq!(m.peak_memory_bytes(), Some(4096));
        std::fs::write(&cpu, "7000000\n").unwrap();
        std::fs::write(&peak, "0\n").unwrap();
        assert_eq!(m.cpu_usec(), Some(7000));
        assert_eq!(m.peak_memory_bytes(), None);

        std::fs::write(&cpu, "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n").unwrap();
        let m = Meter::open(&CounterFiles {
            cpu,
            cpu_format: CpuFormat::StatUsageUsec,
            peak_memory: Some(d.path().join("missing")),
        })
        .unwrap();
        assert_eq!(m.cpu_usec(), Some(1234));
        assert_eq!(m.peak_memory_bytes(), None);
    }

    #[test]
    fn nothing_is_appended_after_destroyed() {
        use rampart_types::audit::Destroyed;
        let d = tempfile::tempdir().unwrap();
        let store: Arc<dyn SandboxStore> =
            Arc::new(rampart_store::SqliteStore::open(&d.path().join("state.db")).unwrap());
        let a = Audit::open(AuditConfig::default(), store.clone(), d.path()).unwrap();
        let id = SandboxId::parse("z9").unwrap();
        a.append(&id, |_| EventBody::Paused(Default::default()), Vec::new())
            .unwrap();
        let s2 = store.clone();
        a.record(
            &id,
            true,
            |_| {
                EventBody::Destroyed(Destroyed {
                    reason: "api: test".into(),
                    manifest_digest: None,
                    artifacts: None,
                })
            },
            Vec::new(),
            |e| match e {
                Some(e) => s2.append_event(e),
                None => Ok(()),
            },
        )
        .unwrap();
        a.forget(&id);
        // A late event (a network entry, an exit of a killed process) is not appended.
        a.append(&id, |_| EventBody::Resumed(Default::default()), Vec::new())
            .unwrap();
        a.append_if_started(&id, EventBody::Resumed(Default::default()))
            .unwrap();
        let evs = a.events(&id, None, 100).unwrap();
        assert_eq!(evs.len(), 2);
        assert!(matches!(evs[1].body, EventBody::Destroyed(_)));
        assert!(lock(&a.chains).is_empty(), "the chain stays forgotten");
    }

    #[test]
    fn template_digest_follows_content() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("etc")).unwrap();
        std::fs::write(d.path().join("etc/hosts"), "a").unwrap();
        let a = template_digest(d.path()).unwrap();
        assert!(a.starts_with("sha256:"));
        assert_eq!(a, template_digest(d.path()).unwrap());
        std::fs::write(d.path().join("etc/hosts"), "b").unwrap();
        assert_ne!(a, template_digest(d.path()).unwrap());
    }
}
