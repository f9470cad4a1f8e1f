//! Sandbox networks in the manager: the wiring (`rampart-net`: veth, addresses, the nftables
//! table) and the enforcement (`rampart-egress`: DNS resolver, egress proxy, network log).
//!
//! Create with `network.mode != none`: the sandbox is attached to the egress proxy (its
//! address is a function of its uid slot, so this happens before launch and the secrets'
//! placeholders and the CA variables go into its environment), launched, wired (veth into
//! its PID 1's network namespace) and, once its agent answers, given `/etc/resolv.conf`
//! (nameserver: its gateway), `/etc/hosts` and, when it has secrets, the egress CA in its
//! trust store. Any failure tears all of it down with the rest of the sandbox. Destroy
//! detaches and unwires before the sandbox is killed. A restart re-attaches the live ones
//! (re-wiring a link that went missing) and removes links and egress state of the others.
//!
//! The network of a daemon is unavailable (creates with a network answer 503, the rest
//! works) when it is disabled, when another daemon on the host holds the same table, or when
//! the proxy, the resolver or the table cannot be set up; the reason is logged and returned.

use crate::isolation::InitFile;
use crate::CoreError;
use futures::StreamExt as _;
use rampart_agent::client::AgentClient;
use rampart_egress::{Attachment, Egress, EgressConfig};
use rampart_net::{Net, NetConfig, NetHandle};
use rampart_store::{SandboxRecord, SandboxStore, StoredNetwork};
use rampart_types::network::NetworkInfo;
use rampart_types::{NetworkMode, NetworkPolicy, SandboxId, SecretSpec};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use tracing::{debug, info, warn};

/// Where the sandbox's trust store is.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The egress CA alone, inside the sandbox.
const CA_FILE: &str = "/usr/local/share/ca-certificates/rampart-egress.crt";

/// Network configuration of the daemon.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// Whether sandboxes may have a network at all.
    pub enabled: bool,
    /// The sandbox address block (`10.201.0.0/16`), handed out as /31 pairs by uid slot.
    pub pool: String,
    /// Prefix of the host-side link names (`rsv`).
    pub link_prefix: String,
    /// The nftables table (`inet rampart`).
    pub table: String,
    /// Port of the DNS resolver (15053; 0: any free port).
    pub dns_port: u16,
    /// Port of the egress proxy (15001; 0: any free port).
    pub proxy_port: u16,
    /// Upstream DNS servers (empty: the host's `/etc/resolv.conf`).
    pub upstream_dns: Vec<SocketAddr>,
    /// Extra PEM roots the proxy trusts upstream (tests).
    pub extra_upstream_roots: Vec<String>,
    /// Ranges a sandbox's upstream SOCKS5 proxy may be in besides public addresses.
    pub upstream_proxy_allow: Vec<ipnet::IpNet>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            enabled: true,
            pool: rampart_net::DEFAULT_POOL.into(),
            link_prefix: rampart_net::DEFAULT_LINK_PREFIX.into(),
            table: rampart_net::DEFAULT_TABLE.into(),
            dns_port: rampart_net::DEFAULT_DNS_PORT,
            proxy_port: rampart_net::DEFAULT_PROXY_PORT,
            upstream_dns: Vec::new(),
            extra_upstream_roots: Vec::new(),
            upstream_proxy_allow: Vec::new(),
        }
    }
}

/// The daemon's network side.
#[derive(Debug)]
pub(crate) struct Network {
    /// The wiring, when this daemon owns its table and link prefix (held lock).
    net: Option<Net>,
    /// The enforcement, when it started.
    egress: Option<Egress>,
    /// Why creates with a network are refused, if they are.
    unavailable: Option<String>,
    egress_dir: PathBuf,
    _lock: Option<std::os::unix::net::UnixListener>,
}

/// What a create with a network has set up before launch.
#[derive(Debug)]
pub(crate) struct Prepared {
    handle: NetHandle,
    attachment: Attachment,
}

impl Prepared {
    /// The egress CA (PEM), made only for a sandbox attached with secrets or with a policy
    /// that allows a package registry.
    pub(crate) fn ca_pem(&self) -> Option<&str> {
        self.attachment.ca_cert_pem.as_deref()
    }

    /// Variables the sandbox starts with: secret placeholders and, with a CA, where the
    /// trust store is.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let mut env = self.attachment.env.clone();
        if self.ca_pem().is_some() {
            // pip (`PIP_CERT`) and cargo (`CARGO_HTTP_CAINFO`) read their own settings
            // before the system store: point them at the bundle with the CA too.
            for k in [
                "SSL_CERT_FILE",
                "REQUESTS_CA_BUNDLE",
                "CURL_CA_BUNDLE",
                "PIP_CERT",
                "CARGO_HTTP_CAINFO",
            ] {
                env.push((k.into(), CA_BUNDLE.into()));
            }
            env.push(("NODE_EXTRA_CA_CERTS".into(), CA_FILE.into()));
        }
        env
    }
}

/// Holds the host-wide claim on `table`: an abstract Unix socket named after it, released
/// by the kernel when the daemon exits however it exits (no file is left behind).
fn takes_lock(table: &str) -> Result<std::os::unix::net::UnixListener, String> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("rampart-net-{table}");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| format!("lock name {name:?}: {e}"))?;
    std::os::unix::net::UnixListener::bind_addr(&addr).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            format!(
                "another daemon on this host uses the network table {table:?} (it holds the \
                 abstract socket @{name}); give this one its own table, link prefix and pool"
            )
        } else {
            format!("taking the lock @{name}: {e}")
        }
    })
}

impl Network {
    /// Sets up what it can; never fails (the reason goes into `unavailable`).
    pub(crate) async fn start(cfg: &NetworkConfig, data_dir: &Path) -> Network {
        let mut n = Network {
            net: None,
            egress: None,
            unavailable: None,
            egress_dir: data_dir.join("egress"),
            _lock: None,
        };
        if !cfg.enabled {
            n.unavailable = Some("networking is disabled in the daemon's configuration".into());
            return n;
        }
        if let Err(e) = n.try_start(cfg).await {
            warn!("sandbox networks are unavailable: {e}");
            n.unavailable = Some(e);
        }
        n
    }

    async fn try_start(&mut self, cfg: &NetworkConfig) -> Result<(), String> {
        let pool = rampart_net::AddressPool::parse(&cfg.pool).map_err(|e| e.to_string())?;
        let mut net_cfg = NetConfig {
            pool,
            link_prefix: cfg.link_prefix.clone(),
            table: cfg.table.clone(),
            dns_port: cfg.dns_port.max(1),
            proxy_port: cfg.proxy_port.max(2),
        };
        Net::new(net_cfg.clone()).map_err(|e| e.to_string())?;
        self._lock = Some(takes_lock(&cfg.table)?);
        let egress = Egress::start(EgressConfig {
            proxy_port: cfg.proxy_port,
            dns_port: cfg.dns_port,
            upstream_dns: cfg.upstream_dns.clone(),
            extra_upstream_roots: cfg.extra_upstream_roots.clone(),
            upstream_proxy_allow: cfg.upstream_proxy_allow.clone(),
            state_dir: self.egress_dir.clone(),
            blocked: vec![pool.to_string()],
            ..EgressConfig::default()
        })
        .await;
        let egress = match egress {
            Ok(e) => e,
            Err(e) => {
                // The links of this table are still ours to clean up.
                self.net = Net::new(net_cfg).ok();
                return Err(format!("starting the egress proxy: {e}"));
            }
        };
        net_cfg.dns_port = egress.dns_port();
        net_cfg.proxy_port = egress.proxy_port();
        let net = Net::new(net_cfg).map_err(|e| e.to_string())?;
        let n2 = net.clone();
        let installed = tokio::task::spawn_blocking(move || n2.install_firewall())
            .await
            .map_err(|e| format!("installing the firewall: {e}"))?;
        self.net = Some(net);
        installed.map_err(|e| e.to_string())?;
        info!(
            pool = %cfg.pool,
            table = %cfg.table,
            proxy_port = egress.proxy_port(),
            dns_port = egress.dns_port(),
            "sandbox networks ready"
        );
        self.egress = Some(egress);
        Ok(())
    }

    /// The egress tier's event hook, for the audit record (once; None without egress).
    pub(crate) fn take_events(
        &self,
    ) -> Option<tokio::sync::mpsc::Receiver<rampart_egress::NetEvent>> {
        self.egress.as_ref()?.take_events()
    }

    /// Whether creates with a network work.
    pub(crate) fn available(&self) -> bool {
        self.unavailable.is_none()
    }

    fn ready(&self) -> Result<(&Net, &Egress), CoreError> {
        match (&self.net, &self.egress, &self.unavailable) {
            (Some(n), Some(e), None) => Ok((n, e)),
            (_, _, why) => Err(CoreError::Unsupported(format!(
                "sandbox networks are unavailable on this daemon: {}",
                why.as_deref().unwrap_or("not started")
            ))),
        }
    }

    /// The egress service (None when networks are unavailable).
    pub(crate) fn egress(&self) -> Option<&Egress> {
        self.egress.as_ref().filter(|_| self.unavailable.is_none())
    }

    /// The handle of a slot, when the wiring is configured.
    pub(crate) fn handle(&self, slot: u32) -> Option<NetHandle> {
        self.net.as_ref()?.handle(slot).ok()
    }

    /// Checks a create's network fields. None: the sandbox gets no network.
    pub(crate) fn check(
        &self,
        policy: Option<&NetworkPolicy>,
        secrets: &[SecretSpec],
    ) -> Result<Option<StoredNetwork>, CoreError> {
        let policy = policy.cloned().unwrap_or_default();
        if policy.mode == NetworkMode::None {
            if !secrets.is_empty() {
                return Err(bad(
                    "secrets",
                    "secrets need a network: set network.mode to allowlist or open",
                ));
            }
            if !policy.allow.is_empty() || !policy.deny.is_empty() {
                return Err(bad(
                    "network",
                    "allow and deny rules need network.mode allowlist or open",
                ));
            }
            if !policy.packages.is_empty() {
                return Err(bad(
                    "network",
                    "packages rules need network.mode allowlist or open",
                ));
            }
            return Ok(None);
        }
        rampart_egress::validate_policy(&policy).map_err(|e| bad("network", &e.to_string()))?;
        if let Some(u) = &policy.upstream_proxy {
            u.validate()
                .map_err(|e| bad("network.upstream_proxy", &e.to_string()))?;
        }
        rampart_egress::validate_secrets(secrets).map_err(|e| bad("secrets", &e.to_string()))?;
        self.ready()?;
        Ok(Some(StoredNetwork {
            policy,
            secrets: secrets.to_vec(),
        }))
    }

    /// Checks that a policy's upstream proxy resolves to addresses the daemon may dial for a
    /// caller (public ones, or in `[network] upstream_proxy_allow`): a create or a change
    /// naming another is refused before anything is made.
    pub(crate) async fn check_proxy(
        &self,
        policy: Option<&NetworkPolicy>,
    ) -> Result<(), CoreError> {
        let Some(u) = policy.and_then(|p| p.upstream_proxy.as_ref()) else {
            return Ok(());
        };
        let (_, egress) = self.ready()?;
        egress
            .check_upstream_proxy(u)
            .await
            .map_err(|e| bad("network.upstream_proxy", &e.to_string()))
    }

    /// Attaches a sandbox to the egress proxy (before launch: its address is its slot's).
    pub(crate) fn prepare(
        &self,
        id: &SandboxId,
        slot: u32,
        net: &StoredNetwork,
        ask: &[String],
    ) -> Result<Prepared, CoreError> {
        self.prepare_as(id, slot, net, false, ask)
    }

    /// [`Network::prepare`] of a sandbox attached before this daemon started (`again`: see
    /// `Egress::reattach`) or a new one.
    fn prepare_as(
        &self,
        id: &SandboxId,
        slot: u32,
        net: &StoredNetwork,
        again: bool,
        ask: &[String],
    ) -> Result<Prepared, CoreError> {
        let (wiring, egress) = self.ready()?;
        let t0 = std::time::Instant::now();
        let handle = wiring
            .handle(slot)
            .map_err(|e| CoreError::Capacity(e.to_string()))?;
        let attach = if again {
            Egress::reattach
        } else {
            Egress::attach
        };
        let attachment = attach(
            egress,
            id.as_str(),
            IpAddr::V4(handle.address),
            IpAddr::V4(handle.gateway),
            net.policy.clone(),
            net.secrets.clone(),
        )
        .map_err(CoreError::failed("attaching to the egress proxy"))?;
        if !ask.is_empty() {
            // Checked at create; a pattern this build refuses leaves the host refused.
            if let Err(e) = egress.set_ask_hosts(id.as_str(), ask) {
                warn!(id = %id, "the approval policy's hosts: {e}; they are refused, not asked about");
            }
        }
        debug!(id = %id, attach_us = t0.elapsed().as_micros() as u64, "attached to the egress proxy");
        // (The egress makes the CA only for a sandbox with secrets or a registry allowed.)
        Ok(Prepared { handle, attachment })
    }

    /// Wires the sandbox's network namespace (its PID 1 is `pid`).
    pub(crate) async fn wire(&self, slot: u32, pid: i32) -> Result<NetHandle, CoreError> {
        let (wiring, _) = self.ready()?;
        let w = wiring.clone();
        let t0 = std::time::Instant::now();
        let h = tokio::task::spawn_blocking(move || w.wire(pid, slot))
            .await
            .map_err(CoreError::task("wiring the network"))?
            .map_err(CoreError::failed("wiring the network"))?;
        debug!(link = %h.host_if, wire_us = t0.elapsed().as_micros() as u64, "wired");
        Ok(h)
    }

    /// Files the sandbox starts with (written by the tier before its agent starts):
    /// resolv.conf naming its gateway (pure: the slot's address pair) and, for a sandbox
    /// attached with secrets (`ca`: the egress CA), the CA alone and in the trust store.
    /// (`/etc/hosts` stays the template's; the sandbox's own name is answered by
    /// nss-myhostname, see `docs/network.md`.)
    pub(crate) fn init_files(
        &self,
        slot: u32,
        ca: Option<&str>,
        template_dir: &Path,
    ) -> Result<Vec<InitFile>, CoreError> {
        let (wiring, _) = self.ready()?;
        let handle = wiring
            .handle(slot)
            .map_err(|e| CoreError::Capacity(e.to_string()))?;
        let file = |path: &str, text: String| InitFile {
            path: path.to_owned(),
            text,
            mode: 0o644,
        };
        let mut files = vec![file(
            "/etc/resolv.conf",
            format!("nameserver {}\noptions edns0\n", handle.gateway),
        )];
        // A CA made later (secrets given to a running sandbox) is written by
        // `Network::ca_files` then. The host's bundle is read only when the template has none.
        if let Some(ca) = ca {
            files.extend(self.ca_files(ca, template_dir));
        }
        Ok(files)
    }

    /// Writes `files` into a running sandbox through its agent, as root (a sandbox given a
    /// network after it started: its [`Network::init_files`]).
    pub(crate) async fn write_inside(
        client: &AgentClient,
        files: Vec<InitFile>,
    ) -> Result<(), CoreError> {
        let writes = files.into_iter().map(|f| {
            let client = client.clone();
            async move {
                let data = bytes::Bytes::from(f.text.into_bytes());
                let body = futures::stream::once(async move { Ok(data) }).boxed();
                client
                    .write_file(&f.path, Some("root"), body)
                    .await
                    .map_err(CoreError::failed(format!(
                        "writing {} in the sandbox",
                        f.path
                    )))
            }
        });
        for r in futures::future::join_all(writes).await {
            r?;
        }
        Ok(())
    }

    /// Detaches a sandbox from the egress proxy and removes its link. Idempotent.
    pub(crate) async fn teardown(&self, id: &SandboxId, slot: u32) {
        if let Some(e) = &self.egress {
            e.detach(id.as_str());
        }
        let Some(net) = self.net.clone() else {
            return;
        };
        match tokio::task::spawn_blocking(move || net.unwire(slot)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(id = %id, "removing the sandbox's link: {e}"),
            Err(e) => warn!(id = %id, "removing the sandbox's link: task failed: {e}"),
        }
    }
}

fn bad(field: &str, message: &str) -> CoreError {
    CoreError::BadRequest {
        field: field.into(),
        message: message.into(),
    }
}

pub(crate) fn networked(net: &Option<StoredNetwork>) -> bool {
    net.as_ref()
        .is_some_and(|n| n.policy.mode != NetworkMode::None)
}

impl Network {
    /// Gives a wired sandbox's egress a new policy (live connections it denies are cut).
    pub(crate) fn set_policy(
        &self,
        id: &SandboxId,
        policy: NetworkPolicy,
    ) -> Result<(), CoreError> {
        let (_, egress) = self.ready()?;
        egress
            .set_policy(id.as_str(), policy)
            .map_err(CoreError::failed("egress policy"))
    }

    /// Replaces a wired sandbox's secrets (a secret that keeps its name keeps its
    /// placeholder). Returns the sandbox's egress CA (PEM) when this made it (the sandbox had
    /// none: its trust store must be given it now).
    pub(crate) fn set_secrets(
        &self,
        id: &SandboxId,
        secrets: Vec<SecretSpec>,
    ) -> Result<Option<String>, CoreError> {
        let (_, egress) = self.ready()?;
        let had = egress.ca_cert_pem(id.as_str()).is_some();
        egress
            .set_secrets(id.as_str(), secrets)
            .map_err(CoreError::failed("egress secrets"))?;
        Ok(if had {
            None
        } else {
            egress.ca_cert_pem(id.as_str())
        })
    }

    /// The trust-store files that give a running sandbox its egress CA `ca` (the bundle of
    /// its template with the CA appended, and the CA alone).
    pub(crate) fn ca_files(&self, ca: &str, template_dir: &Path) -> Vec<InitFile> {
        let tmpl = template_dir.join("rootfs/etc/ssl/certs/ca-certificates.crt");
        let mut bundle = std::fs::read_to_string(&tmpl)
            .or_else(|_| std::fs::read_to_string(CA_BUNDLE))
            .unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(ca);
        vec![
            InitFile {
                path: CA_BUNDLE.to_owned(),
                text: bundle,
                mode: 0o644,
            },
            InitFile {
                path: CA_FILE.to_owned(),
                text: ca.to_owned(),
                mode: 0o644,
            },
        ]
    }

    /// Tears down the network of a sandbox that has one (by its stored policy).
    pub(crate) async fn teardown_stored(
        &self,
        store: &dyn SandboxStore,
        id: &SandboxId,
        slot: u32,
    ) {
        match store.network(id) {
            Ok(n) if networked(&n) => self.teardown(id, slot).await,
            Ok(_) => {}
            Err(e) => {
                warn!(id = %id, "reading the sandbox's network settings: {e}; tearing down anyway");
                self.teardown(id, slot).await;
            }
        }
    }

    /// After a restart: attaches a re-attached sandbox to the egress proxy again and re-wires
    /// its link if it went missing.
    pub(crate) async fn reattach(
        &self,
        store: &dyn SandboxStore,
        rec: &SandboxRecord,
        ask: &[String],
    ) {
        let net = match store.network(&rec.id) {
            Ok(n) if networked(&n) => n,
            Ok(_) => return,
            Err(e) => {
                warn!(id = %rec.id, "reading the sandbox's network settings: {e}");
                return;
            }
        };
        let Some(net) = net else { return };
        let prepared = match self.prepare_as(&rec.id, rec.uid_slot, &net, true, ask) {
            Ok(p) => p,
            Err(e) => {
                warn!(id = %rec.id, "re-attaching to the egress proxy: {e}; its connections are refused");
                return;
            }
        };
        let link = std::path::Path::new("/sys/class/net").join(&prepared.handle.host_if);
        if !link.exists() {
            if let Some(pid) = rec.pid {
                match self.wire(rec.uid_slot, pid).await {
                    Ok(_) => info!(id = %rec.id, "re-wired a sandbox whose link was missing"),
                    Err(e) => warn!(id = %rec.id, "re-wiring the sandbox: {e}"),
                }
            }
        }
    }

    /// After a restart: removes links and egress state of sandboxes that are not alive.
    pub(crate) async fn clean_leftovers(&self, store: &dyn SandboxStore) {
        let alive: Vec<SandboxRecord> = match store.alive() {
            Ok(a) => a,
            Err(e) => {
                warn!("listing alive sandboxes for network cleanup: {e}");
                return;
            }
        };
        let slots: Vec<u32> = alive.iter().map(|r| r.uid_slot).collect();
        if let Some(net) = self.net.clone() {
            let removed = tokio::task::spawn_blocking(move || -> Vec<String> {
                let mut done = Vec::new();
                match net.leftovers(&slots) {
                    Ok(links) => {
                        for l in links {
                            match net.remove_link(&l) {
                                Ok(()) => done.push(l),
                                Err(e) => warn!(link = %l, "removing a leftover link: {e}"),
                            }
                        }
                    }
                    Err(e) => warn!("listing leftover links: {e}"),
                }
                done
            })
            .await
            .unwrap_or_default();
            for l in removed {
                info!(link = %l, "removed a leftover sandbox link");
            }
        }
        if let (Some(e), Ok(rd)) = (&self.egress, std::fs::read_dir(&self.egress_dir)) {
            for ent in rd.flatten() {
                let name = ent.file_name().to_string_lossy().into_owned();
                if !alive.iter().any(|r| r.id.as_str() == name) {
                    e.detach(&name);
                }
            }
        }
    }

    /// At a clean shutdown: removes the nftables table when no sandbox with a network is
    /// alive (otherwise it stays, to keep them confined while the daemon is down).
    pub(crate) async fn shutdown(&self, store: &dyn SandboxStore) {
        let Some(net) = self.net.clone() else {
            return;
        };
        let alive = match store.alive() {
            Ok(a) => a,
            Err(e) => {
                warn!("keeping the network table: listing alive sandboxes: {e}");
                return;
            }
        };
        let networked = alive
            .iter()
            .any(|r| networked(&store.network(&r.id).unwrap_or(None)));
        if networked || !net.links().map(|l| l.is_empty()).unwrap_or(false) {
            info!("keeping the network table: sandboxes with a network are alive");
            return;
        }
        match tokio::task::spawn_blocking(move || net.firewall().remove()).await {
            Ok(Ok(())) => info!("removed the network table (no sandbox with a network is alive)"),
            Ok(Err(e)) => warn!("removing the network table: {e}"),
            Err(e) => warn!("removing the network table: task failed: {e}"),
        }
    }

    /// `GET /v1/sandboxes/{id}/network`.
    pub(crate) fn info(
        &self,
        store: &dyn SandboxStore,
        id: &SandboxId,
    ) -> Result<NetworkInfo, CoreError> {
        let rec = store
            .get(id)
            .map_err(CoreError::from)?
            .ok_or_else(|| CoreError::NotFound(id.to_string()))?;
        let stored = store.network(id).map_err(CoreError::from)?;
        // The proxy's password is write-only.
        let policy = stored
            .as_ref()
            .map(|n| n.policy.public())
            .unwrap_or_default();
        let handle = (rec.state.is_alive() && policy.mode != NetworkMode::None)
            .then(|| self.handle(rec.uid_slot))
            .flatten();
        Ok(NetworkInfo {
            policy,
            address: handle.as_ref().map(|h| h.address.to_string()),
            gateway: handle.as_ref().map(|h| h.gateway.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_types::SecretInjection;

    fn policy(mode: NetworkMode, allow: &[&str]) -> NetworkPolicy {
        NetworkPolicy {
            mode,
            allow: allow.iter().map(|s| (*s).to_owned()).collect(),
            ..NetworkPolicy::default()
        }
    }

    #[test]
    fn one_daemon_per_table() {
        let table = format!("lock_test_{}", std::process::id());
        let first = takes_lock(&table).unwrap();
        let second = takes_lock(&table).unwrap_err();
        assert!(second.contains("another daemon"), "{second}");
        drop(first);
        takes_lock(&table).unwrap();
    }

    #[tokio::test]
    async fn create_fields_are_checked_before_anything_is_set_up() {
        let dir = std::env::temp_dir().join(format!("rampart-net-check-{}", std::process::id()));
        let n = Network::start(
            &NetworkConfig {
                enabled: false,
                ..NetworkConfig::default()
            },
            &dir,
        )
        .await;
        assert!(!n.available());
        // No network asked: nothing to do.
        assert!(n.check(None, &[]).unwrap().is_none());
        assert!(n
            .check(Some(&policy(NetworkMode::None, &[])), &[])
            .unwrap()
            .is_none());
        // Rules without a mode that uses them, secrets without a network: refused.
        assert!(matches!(
            n.check(Some(&policy(NetworkMode::None, &["pypi.org"])), &[]),
            Err(CoreError::BadRequest { .. })
        ));
        let secret = SecretSpec {
            name: "tok".into(),
            value: "v".into(),
            hosts: vec!["api.example.com".into()],
            inject: SecretInjection::Placeholder,
            env: None,
        };
        assert!(matches!(
            n.check(None, std::slice::from_ref(&secret)),
            Err(CoreError::BadRequest { .. })
        ));
        // A bad rule is the caller's error even where networks are unavailable.
        assert!(matches!(
            n.check(
                Some(&policy(NetworkMode::Allowlist, &["no such rule!"])),
                &[]
            ),
            Err(CoreError::BadRequest { .. })
        ));
        // A good policy on a daemon without networks: unavailable, with the reason.
        match n.check(Some(&policy(NetworkMode::Allowlist, &["pypi.org"])), &[]) {
            Err(CoreError::Unsupported(m)) => assert!(m.contains("disabled"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
