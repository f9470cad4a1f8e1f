//! The per-sandbox CA, leaf certificates for intercepted names, and the TLS configurations of
//! both sides of an intercepted connection.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::{EgressError, TlsCause};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(what: &'static str, e: impl Into<TlsCause>) -> EgressError {
    EgressError::Tls {
        what,
        source: e.into(),
    }
}

/// How long a leaf certificate is used before a new one is issued (it is valid for 30 days).
const LEAF_REISSUE: Duration = Duration::from_secs(7 * 24 * 3600);

/// A sandbox's certificate authority, made only for a sandbox with secrets. The private key
/// stays in the daemon (memory, and the state directory with mode 0600 so a restarted daemon
/// keeps the same CA).
pub(crate) struct SandboxCa {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: rcgen::Certificate,
    key: KeyPair,
    leaves: Mutex<HashMap<String, (Instant, Arc<rustls::ServerConfig>)>>,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa").finish_non_exhaustive()
    }
}

fn ca_params(id: &str) -> Result<CertificateParams, EgressError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_err("CA", e))?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("Rampart sandbox {id} egress CA"),
    );
    dn.push(DnType::OrganizationName, "Rampart");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::days(1);
    p.not_after = now + time::Duration::days(3650);
    Ok(p)
}

impl SandboxCa {
    /// Whether `dir` holds a CA that [`SandboxCa::load_or_create`] would load.
    pub fn stored(dir: &Path) -> bool {
        dir.join("ca.crt").is_file() && dir.join("ca.key").is_file()
    }

    /// Loads the CA of `id` from `dir` (`ca.crt`, `ca.key`) or makes and stores a new one.
    ///
    /// The files are written whole (temporary file, then rename) but not synced: they only
    /// matter to a daemon restarted while the sandbox lives, and a daemon that dies (even by
    /// kill -9) leaves them in the page cache for its successor. Only a host crash or power
    /// loss could lose them, and that also ends the sandbox (its processes and mounts do not
    /// survive a reboot; the restarted daemon removes the state of sandboxes that are gone).
    /// Were a sandbox ever to outlive its CA files, a new CA would be made here and the
    /// sandbox's trust store (which has the old one) would refuse the intercepted hosts'
    /// certificates: its HTTPS to secret-bound hosts fails closed, nothing leaks. Skipping
    /// the two `fsync`s takes milliseconds off each create with secrets.
    pub fn load_or_create(id: &str, dir: &Path) -> Result<SandboxCa, EgressError> {
        let crt = dir.join("ca.crt");
        let keyf = dir.join("ca.key");
        if let (Ok(cert_pem), Ok(key_pem)) = (
            std::fs::read_to_string(&crt),
            std::fs::read_to_string(&keyf),
        ) {
            if let Ok(key) = KeyPair::from_pem(&key_pem) {
                // The issuer used for signing has the stored CA's name and key, which is
                // all a verifier matches a leaf against.
                let issuer = ca_params(id)?
                    .self_signed(&key)
                    .map_err(|e| tls_err("CA", e))?;
                let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
                    .map_err(|e| tls_err("stored CA", e))?;
                return Ok(SandboxCa {
                    cert_pem,
                    cert_der,
                    issuer,
                    key,
                    leaves: Mutex::new(HashMap::new()),
                });
            }
        }
        let key = KeyPair::generate().map_err(|e| tls_err("CA key", e))?;
        let issuer = ca_params(id)?
            .self_signed(&key)
            .map_err(|e| tls_err("CA", e))?;
        let cert_pem = issuer.pem();
        std::fs::create_dir_all(dir).map_err(|e| EgressError::io("state dir", e))?;
        write_private(&keyf, key.serialize_pem().as_bytes())?;
        write_private(&crt, cert_pem.as_bytes())?;
        Ok(SandboxCa {
            cert_der: issuer.der().clone(),
            cert_pem,
            issuer,
            key,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate (PEM) for the sandbox's trust store.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A server configuration presenting a leaf for `name` signed by this CA (cached).
    pub fn server_config(&self, name: &str) -> Result<Arc<rustls::ServerConfig>, EgressError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, cfg)) = leaves.get(name) {
            if at.elapsed() < LEAF_REISSUE {
                return Ok(cfg.clone());
            }
        }
        let mut p =
            CertificateParams::new(vec![name.to_string()]).map_err(|e| tls_err("leaf", e))?;
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::hours(1);
        p.not_after = now + time::Duration::days(30);
        let leaf_key = KeyPair::generate().map_err(|e| tls_err("leaf key", e))?;
        let leaf = p
            .signed_by(&leaf_key, &self.issuer, &self.key)
            .map_err(|e| tls_err("leaf", e))?;
        let chain = vec![leaf.der().clone(), self.cert_der.clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("server config", e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| tls_err("server config", e))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        if leaves.len() > 1024 {
            leaves.clear();
        }
        leaves.insert(name.to_string(), (Instant::now(), cfg.clone()));
        Ok(cfg)
    }
}

fn write_private(path: &Path, data: &[u8]) -> Result<(), EgressError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| EgressError::io("write CA", e))?;
    // Not synced: see `SandboxCa::load_or_create`.
    f.write_all(data)
        .map_err(|e| EgressError::io("write CA", e))?;
    std::fs::rename(&tmp, path).map_err(|e| EgressError::io("write CA", e))
}

/// The client configuration for upstream connections of intercepted traffic: the host's CA
/// bundle (or the built-in Mozilla roots when the host has none) plus `extra` PEM roots.
pub(crate) fn upstream_client_config(
    extra: &[String],
) -> Result<Arc<rustls::ClientConfig>, EgressError> {
    let mut roots = rustls::RootCertStore::empty();
    let mut host = 0;
    for path in [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ] {
        if let Ok(data) = std::fs::read(path) {
            for c in CertificateDer::pem_slice_iter(&data).flatten() {
                if roots.add(c).is_ok() {
                    host += 1;
                }
            }
            if host > 0 {
                break;
            }
        }
    }
    if host == 0 {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    for pem in extra {
        let mut n = 0;
        for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let c = c.map_err(|e| tls_err("extra upstream root", e))?;
            roots
                .add(c)
                .map_err(|e| tls_err("extra upstream root", e))?;
            n += 1;
        }
        if n == 0 {
            return Err(EgressError::NoRootInPem);
        }
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err("client config", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
