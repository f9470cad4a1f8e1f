//! HTTPS on the daemon's TCP listener, with the operator's certificate (`rampart serve
//! --tls-cert F --tls-key K`): typically a wildcard certificate for `*.<domain>`, so that
//! `https://{port}-{id}.<domain>` reaches a sandbox's port by the `Host` header as the E2B
//! SDKs expect. The certificate and key are read and checked once, at start: a file that
//! cannot be read, PEM that holds no certificate or no key, or a key that is not the
//! certificate's fails `serve` with the reason.
//!
//! Connections speak HTTP/1.1 (ALPN `http/1.1`): every client of the daemon (the SDKs, the
//! CLI, browsers) speaks it, and the port proxy relays upgrades (WebSocket) over it. The
//! handshake runs on a task of its own per connection, bounded in time, so a client that
//! stalls it holds up no other.

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const ACCEPT_QUEUE: usize = 64;

/// Why the certificate or key cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file cannot be read.
    #[error("cannot read the TLS certificate {}: {source}", path.display())]
    ReadCert {
        /// The file.
        path: PathBuf,
        /// What reading said.
        source: std::io::Error,
    },
    /// The key file cannot be read.
    #[error("cannot read the TLS key {}: {source}", path.display())]
    ReadKey {
        /// The file.
        path: PathBuf,
        /// What reading said.
        source: std::io::Error,
    },
    /// The certificate file is not PEM certificates.
    #[error("the TLS certificate {} is not a PEM certificate chain: {reason}", path.display())]
    BadCert {
        /// The file.
        path: PathBuf,
        /// What parsing said.
        reason: String,
    },
    /// The key file is not a PEM private key.
    #[error(
        "the TLS key {} is not a PEM private key (PKCS#8, PKCS#1 or SEC1): {reason}",
        path.display()
    )]
    BadKey {
        /// The file.
        path: PathBuf,
        /// What parsing said.
        reason: String,
    },
    /// The key does not go with the certificate, or rustls refuses the pair.
    #[error("the TLS key {} cannot serve the certificate {}: {source}", key.display(), cert.display())]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said (e.g. the key does not match the certificate).
        source: rustls::Error,
    },
}

/// The daemon's TLS configuration: the operator's certificate chain and key, checked.
#[derive(Clone)]
pub struct TlsConfig {
    config: Arc<rustls::ServerConfig>,
    /// The end-entity certificate (DER), to say which names it covers.
    leaf: CertificateDer<'static>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig").finish_non_exhaustive()
    }
}

impl PartialEq for TlsConfig {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config)
    }
}

impl Eq for TlsConfig {}

impl TlsConfig {
    /// Reads the PEM certificate chain at `cert` (the server's certificate first, then its
    /// intermediates) and the PEM private key at `key`, and checks that the key is the
    /// certificate's.
    pub fn load(cert: &Path, key: &Path) -> Result<TlsConfig, TlsError> {
        let cert_pem = std::fs::read(cert).map_err(|source| TlsError::ReadCert {
            path: cert.to_owned(),
            source,
        })?;
        let key_pem = std::fs::read(key).map_err(|source| TlsError::ReadKey {
            path: key.to_owned(),
            source,
        })?;
        let bad_cert = |reason: String| TlsError::BadCert {
            path: cert.to_owned(),
            reason,
        };
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad_cert(e.to_string()))?;
        let Some(leaf) = chain.first().cloned() else {
            return Err(bad_cert("no CERTIFICATE section in it".into()));
        };
        // Parsed now, so that a truncated or garbled certificate is named at start.
        webpki::EndEntityCert::try_from(&leaf).map_err(|e| bad_cert(e.to_string()))?;
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::BadKey {
            path: key.to_owned(),
            reason: match e {
                rustls::pki_types::pem::Error::NoItemsFound => {
                    "no PRIVATE KEY section in it".into()
                }
                e => e.to_string(),
            },
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let pair = |source| TlsError::Pair {
            cert: cert.to_owned(),
            key: key.to_owned(),
            source,
        };
        // `with_single_cert` checks that the key's public key is the certificate's.
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(rustls::DEFAULT_VERSIONS)
            .map_err(pair)?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(pair)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsConfig {
            config: Arc::new(config),
            leaf,
        })
    }

    /// Whether the certificate is valid for the DNS name `name` (its subject alternative
    /// names, wildcards included); not whether it is trusted or current.
    pub fn covers(&self, name: &str) -> bool {
        let Ok(name) = ServerName::try_from(name) else {
            return false;
        };
        webpki::EndEntityCert::try_from(&self.leaf)
            .is_ok_and(|c| c.verify_is_valid_for_subject_name(&name).is_ok())
    }
}

/// A TCP listener whose connections are TLS: an accept loop of its own hands every
/// connection to a task that runs the handshake (bounded by [`HANDSHAKE_TIMEOUT`]); the
/// finished ones wait here for the server. Dropping it stops the accept loop.
pub(crate) struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: std::io::Result<SocketAddr>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsListener {
    /// Serves TLS with `tls` on `listener`; `tap` runs on every accepted TCP stream (e.g.
    /// to set `TCP_NODELAY`).
    pub(crate) fn new(listener: TcpListener, tls: &TlsConfig, tap: fn(&mut TcpStream)) -> Self {
        let local = listener.local_addr();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(ACCEPT_QUEUE);
        let task = tokio::spawn(async move {
            loop {
                let (mut tcp, peer) = match listener.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        // As axum's own accept loop: out of descriptors and the like pass.
                        tracing::debug!(error = %e, "accepting a TCP connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                tap(&mut tcp);
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener { rx, local, task }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept loop ended (it only ends when this listener is dropped).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        match &self.local {
            Ok(a) => Ok(*a),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}
