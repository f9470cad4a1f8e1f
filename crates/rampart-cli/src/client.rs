//! The HTTP client of the daemon's API, with errors that say what to do.

use anyhow::{anyhow, Context, Result};
use rampart_types::ApiErrorBody;
use reqwest::{Method, RequestBuilder, Response};
use std::fmt;
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
            _ => None,
        };
        if let Some(h) = hint {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiFailure {}

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// A client of the daemon at `host` (`http://127.0.0.1:3000`).
    pub fn new(host: &str) -> Result<Self> {
        let base = host.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(anyhow!("--host must be an http:// URL, got {host:?}"));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Client { base, http })
    }

    /// The daemon's base URL.
    pub fn base(&self) -> &str {
        &self.base
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
                 `rampart serve` (or point --host / RAMPART_HOST at it)",
                self.base
            )
        } else {
            anyhow!("request to the Rampart daemon at {} failed: {e}", self.base)
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
