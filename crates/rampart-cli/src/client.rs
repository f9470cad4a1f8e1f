//! The HTTP client of the daemon's API, with errors that say what to do.

use anyhow::{anyhow, Context, Result};
use rampart_types::ApiErrorBody;
use reqwest::{Method, RequestBuilder, Response};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// An error answer of the daemon.
#[derive(Debug, Clone)]
pub struct ApiFailure {
    /// The API's error code.
    pub code: String,
    /// The daemon's message.
    pub message: String,
}

impl fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        let hint = match self.code.as_str() {
            "not_found" => Some("list sandboxes with `rampart ls`"),
            "conflict" => Some("check its state with `rampart info ID`"),
            "limit_exceeded" => {
                Some("ask for less, or raise the maximum in the daemon's config file")
            }
            "capacity" => Some("destroy sandboxes with `rampart rm ID...`, or try again later"),
            "too_large" => Some("send less data per request"),
            "agent_unreachable" | "agent_error" => {
                Some("the sandbox may have died; see `rampart info ID` and the daemon's log")
            }
            "internal" => Some("see the daemon's log"),
            "unauthorized" => Some(
                "on the daemon's host use its socket (as root or the `rampart` group), or set \
                 RAMPART_API_KEY (the admin key is in <data>/admin-key; see `rampart keys`)",
            ),
            "misdirected_request" => {
                Some("reach the daemon by a name it serves, or add it to its allowed_hosts")
            }
            _ => None,
        };
        if let Some(h) = hint {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiFailure {}

/// The default TCP address of the daemon.
pub const DEFAULT_HOST: &str = "http://127.0.0.1:3000";

/// How the client reaches the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Over TCP at `base` (`http://127.0.0.1:3000`), with an API key when one is given.
    Tcp {
        /// The daemon's base URL.
        base: String,
        /// Sent as `Authorization: Bearer`.
        key: Option<String>,
    },
    /// Over the daemon's Unix socket: the node's administrator, no key.
    Unix {
        /// The socket.
        path: PathBuf,
    },
}

/// Where a daemon started with `--socket /run/rampart/rampart.sock` (the group-reachable
/// place) listens; the client tries it after the default data directory's socket.
pub const RUN_SOCKET: &str = "/run/rampart/rampart.sock";

impl Endpoint {
    /// Where the client commands go: the socket given (`--socket`, `RAMPART_SOCKET`); else
    /// the host given (`--host`, `RAMPART_HOST`) with `key` (`RAMPART_API_KEY`); else the
    /// socket of the default data directory when it can be connected to; else TCP at
    /// [`DEFAULT_HOST`] with `key`.
    pub fn resolve(host: Option<String>, socket: Option<PathBuf>, key: Option<String>) -> Self {
        let key = key.map(|k| k.trim().to_owned()).filter(|k| !k.is_empty());
        if let Some(path) = socket {
            return Endpoint::Unix { path };
        }
        if let Some(base) = host {
            return Endpoint::Tcp { base, key };
        }
        let mut candidates = Vec::new();
        if let Ok(dir) = crate::data_dir::default_data_dir() {
            candidates.push(dir.join(rampart_server::SOCKET_FILE));
        }
        candidates.push(PathBuf::from(RUN_SOCKET));
        for path in candidates {
            let reachable = rampart_types::sockpath::SocketPath::new(&path)
                .and_then(|at| std::os::unix::net::UnixStream::connect(at.path()));
            if reachable.is_ok() {
                return Endpoint::Unix { path };
            }
        }
        Endpoint::Tcp {
            base: DEFAULT_HOST.into(),
            key,
        }
    }
}

/// A byte stream to the daemon (TCP or the Unix socket), for WebSockets.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    endpoint: Endpoint,
    /// Holds the socket's directory open while `http` connects through it (long paths).
    _socket: Option<std::sync::Arc<rampart_types::sockpath::SocketPath>>,
}

impl Client {
    /// A client of the daemon at `endpoint`.
    pub fn new(endpoint: &Endpoint) -> Result<Self> {
        let builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
        let mut socket = None;
        let (base, builder) = match endpoint {
            Endpoint::Tcp { base, key } => {
                let base = base.trim_end_matches('/').to_owned();
                if !(base.starts_with("http://") || base.starts_with("https://")) {
                    return Err(anyhow!("--host must be an http:// URL, got {base:?}"));
                }
                let mut headers = reqwest::header::HeaderMap::new();
                if let Some(k) = key {
                    let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {k}"))
                        .map_err(|_| anyhow!("RAMPART_API_KEY is not a valid header value"))?;
                    v.set_sensitive(true);
                    headers.insert(reqwest::header::AUTHORIZATION, v);
                }
                (base, builder.default_headers(headers))
            }
            // The Host the daemon sees (and builds URLs from) is its default address.
            Endpoint::Unix { path } => {
                let at = rampart_types::sockpath::SocketPath::new(path)
                    .with_context(|| format!("cannot reach {}", path.display()))?;
                let builder = builder.unix_socket(at.path());
                socket = Some(std::sync::Arc::new(at));
                (DEFAULT_HOST.to_owned(), builder)
            }
        };
        let http = builder.build().context("cannot build the HTTP client")?;
        Ok(Client {
            base,
            http,
            endpoint: endpoint.clone(),
            _socket: socket,
        })
    }

    /// Where the daemon is, for messages: its URL or its socket.
    pub fn place(&self) -> String {
        match &self.endpoint {
            Endpoint::Tcp { base, .. } => base.clone(),
            Endpoint::Unix { path } => path.display().to_string(),
        }
    }

    /// Opens a WebSocket to `path` (starting with `/`) of the daemon, with the client's
    /// credentials.
    pub async fn websocket(
        &self,
        path: &str,
    ) -> std::result::Result<
        tokio_tungstenite::WebSocketStream<Box<dyn Io>>,
        tokio_tungstenite::tungstenite::Error,
    > {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        use tokio_tungstenite::tungstenite::Error as WsError;
        let rest = self.base.strip_prefix("http://").ok_or(WsError::Url(
            tokio_tungstenite::tungstenite::error::UrlError::UnsupportedUrlScheme,
        ))?;
        let mut req = format!("ws://{rest}{path}").into_client_request()?;
        let io: Box<dyn Io> = match &self.endpoint {
            Endpoint::Unix { path } => {
                let at = rampart_types::sockpath::SocketPath::new(path)?;
                Box::new(tokio::net::UnixStream::connect(at.path()).await?)
            }
            Endpoint::Tcp { key, .. } => {
                if let Some(k) = key {
                    if let Ok(v) = format!("Bearer {k}").parse() {
                        req.headers_mut().insert(reqwest::header::AUTHORIZATION, v);
                    }
                }
                let authority = rest.split('/').next().unwrap_or(rest).to_owned();
                let tcp = tokio::net::TcpStream::connect(authority).await?;
                let _ = tcp.set_nodelay(true);
                Box::new(tcp)
            }
        };
        let (ws, _) = tokio_tungstenite::client_async(req, io).await?;
        Ok(ws)
    }

    /// A request to `path` (starting with `/`).
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base))
    }

    /// Sends a request and turns error answers and connection failures into useful errors.
    pub async fn send(&self, req: RequestBuilder) -> Result<Response> {
        let resp = req.send().await.map_err(|e| self.transport_error(e))?;
        check(resp).await
    }

    /// Sends a request and decodes its JSON answer.
    pub async fn json<T: serde::de::DeserializeOwned>(&self, req: RequestBuilder) -> Result<T> {
        let resp = self.send(req).await?;
        resp.json::<T>()
            .await
            .context("the daemon's answer could not be decoded")
    }

    /// Explains a transport error.
    pub fn transport_error(&self, e: reqwest::Error) -> anyhow::Error {
        if e.is_connect() {
            anyhow!(
                "cannot reach the Rampart daemon at {}: is it running? start it with \
                 `rampart serve` (or point --host / RAMPART_HOST, or --socket / \
                 RAMPART_SOCKET, at it)",
                self.place()
            )
        } else {
            anyhow!(
                "request to the Rampart daemon at {} failed: {e}",
                self.place()
            )
        }
    }
}

/// Turns a non-2xx answer into an [`ApiFailure`].
pub async fn check(resp: Response) -> Result<Response> {
    let status = resp.status();
    if status.is_success() || status.as_u16() == 101 {
        return Ok(resp);
    }
    let body = resp.bytes().await.unwrap_or_default();
    let failure = match serde_json::from_slice::<ApiErrorBody>(&body) {
        Ok(b) => ApiFailure {
            code: b.error.code,
            message: b.error.message,
        },
        Err(_) => ApiFailure {
            code: "http".into(),
            message: format!(
                "the daemon answered {status}: {}",
                String::from_utf8_lossy(&body)
            ),
        },
    };
    Err(failure.into())
}

/// The lines of an NDJSON body as they arrive, each with its `\n` (a last line without one is
/// dropped, as the daemon ends every line).
pub struct Lines<S> {
    body: S,
    buf: Vec<u8>,
}

impl<S, E> Lines<S>
where
    S: futures::Stream<Item = std::result::Result<bytes::Bytes, E>> + Unpin,
{
    /// Splits `body` (e.g. `Response::bytes_stream()`) into lines.
    pub fn new(body: S) -> Self {
        Lines {
            body,
            buf: Vec::new(),
        }
    }

    /// The next whole line; `None` at the end of the body; the body's error as it is.
    pub async fn next(&mut self) -> Option<std::result::Result<Vec<u8>, E>> {
        use futures::StreamExt;
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                return Some(Ok(self.buf.drain(..=nl).collect()));
            }
            match self.body.next().await? {
                Ok(chunk) => self.buf.extend_from_slice(&chunk),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_split_across_chunks() {
        let chunks: Vec<std::result::Result<bytes::Bytes, ()>> = vec![
            Ok("{\"a\":1}\n{\"b\"".into()),
            Ok(":2}\n".into()),
            Ok("\n{\"c\":3}".into()),
        ];
        let mut lines = Lines::new(futures::stream::iter(chunks));
        let mut got = Vec::new();
        while let Some(l) = lines.next().await {
            got.push(String::from_utf8(l.unwrap()).unwrap());
        }
        assert_eq!(got, ["{\"a\":1}\n", "{\"b\":2}\n", "\n"]);
    }

    #[tokio::test]
    async fn a_body_error_is_returned() {
        let chunks: Vec<std::result::Result<bytes::Bytes, &str>> =
            vec![Ok("x\n".into()), Err("cut")];
        let mut lines = Lines::new(futures::stream::iter(chunks));
        assert_eq!(lines.next().await, Some(Ok(b"x\n".to_vec())));
        assert_eq!(lines.next().await, Some(Err("cut")));
        assert_eq!(lines.next().await, None);
    }
}
