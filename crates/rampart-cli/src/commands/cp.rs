//! `rampart cp SRC DST`: copies a file into or out of a sandbox, streaming (never whole in
//! memory). One side is `ID:/path`; the other a local path or `-` (stdin/stdout).

use super::encode_query;
use crate::client::Client;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use futures::StreamExt;
use rampart_types::{FileEntry, FileType, SandboxId};
use reqwest::Method;
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;

/// `rampart cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// Source: a local path, `-` (stdin) or `ID:/path`.
    src: String,
    /// Destination: a local path, `-` (stdout) or `ID:/path`.
    dst: String,
}

/// One side of a copy.
#[derive(Debug, Clone, PartialEq)]
enum Location {
    Local(PathBuf),
    Std,
    Sandbox(String, String),
}

/// `ID:/path` when the part before the first `:` is a valid id; `-`; else a local path.
fn parse_location(s: &str) -> Location {
    if s == "-" {
        return Location::Std;
    }
    if let Some((id, path)) = s.split_once(':') {
        if SandboxId::parse(id).is_ok() && !path.is_empty() {
            return Location::Sandbox(id.to_owned(), path.to_owned());
        }
    }
    Location::Local(PathBuf::from(s))
}

async fn remote_stat(client: &Client, id: &str, path: &str) -> Result<Option<FileEntry>> {
    let resp = client
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/stat?path={}", encode_query(path)),
        )
        .send()
        .await
        .map_err(|e| client.transport_error(e))?;
    if resp.status().as_u16() == 404 {
        // Either the sandbox or the file: tell them apart by the sandbox.
        let sb = client
            .request(Method::GET, &format!("/v1/sandboxes/{id}"))
            .send()
            .await;
        if let Ok(r) = sb {
            crate::client::check(r).await?;
        }
        return Ok(None);
    }
    let resp = crate::client::check(resp).await?;
    Ok(Some(
        resp.json()
            .await
            .context("the daemon's answer could not be decoded")?,
    ))
}

fn base_name(p: &str) -> Option<&str> {
    p.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
}

/// `rampart cp`.
pub async fn cp(host: &crate::client::Endpoint, a: CpArgs) -> Result<u8> {
    let client = Client::new(host)?;
    match (parse_location(&a.src), parse_location(&a.dst)) {
        (Location::Sandbox(..), Location::Sandbox(..)) => {
            bail!("copying from one sandbox to another is not supported; copy through a local file")
        }
        (Location::Local(_) | Location::Std, Location::Local(_) | Location::Std) => {
            bail!("one side must be in a sandbox, written ID:/path")
        }
        (src, Location::Sandbox(id, path)) => upload(&client, src, &id, &path).await,
        (Location::Sandbox(id, path), dst) => download(&client, &id, &path, dst).await,
    }
}

async fn upload(client: &Client, src: Location, id: &str, path: &str) -> Result<u8> {
    let (body, name) = match &src {
        Location::Local(p) => {
            let meta = tokio::fs::metadata(p)
                .await
                .with_context(|| format!("{}", p.display()))?;
            if meta.is_dir() {
                bail!("{}: is a directory; only files can be copied", p.display());
            }
            let f = tokio::fs::File::open(p)
                .await
                .with_context(|| format!("{}", p.display()))?;
            let stream = tokio_util::io::ReaderStream::with_capacity(f, 256 * 1024);
            (
                reqwest::Body::wrap_stream(stream),
                p.file_name().map(|n| n.to_string_lossy().into_owned()),
            )
        }
        Location::Std => {
            let stream =
                tokio_util::io::ReaderStream::with_capacity(tokio::io::stdin(), 256 * 1024);
            (reqwest::Body::wrap_stream(stream), None)
        }
        Location::Sandbox(..) => unreachable_location()?,
    };
    // Into a directory (existing, or written with a trailing slash): keep the source's name.
    let mut target = path.to_owned();
    let into_dir = path.ends_with('/')
        || matches!(remote_stat(client, id, path).await?, Some(e) if e.file_type == FileType::Directory);
    if into_dir {
        let name =
            name.ok_or_else(|| anyhow!("{id}:{path} is a directory; name the file to write"))?;
        target = format!("{}/{name}", path.trim_end_matches('/'));
    }
    let entry: FileEntry = client
        .json(
            client
                .request(
                    Method::PUT,
                    &format!("/v1/sandboxes/{id}/files?path={}", encode_query(&target)),
                )
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .body(body),
        )
        .await?;
    eprintln!("{id}:{} ({} bytes)", entry.path, entry.size);
    Ok(0)
}

fn unreachable_location<T>() -> Result<T> {
    Err(anyhow!("one side must be local and the other in a sandbox"))
}

async fn download(client: &Client, id: &str, path: &str, dst: Location) -> Result<u8> {
    let resp = client
        .send(client.request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path={}", encode_query(path)),
        ))
        .await?;
    let mut body = resp.bytes_stream();
    match dst {
        Location::Std => {
            let mut out = tokio::io::stdout();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| client.transport_error(e))?;
                out.write_all(&chunk).await.context("stdout")?;
            }
            out.flush().await.context("stdout")?;
        }
        Location::Local(p) => {
            let target = local_target(&p, path)?;
            let mut written: u64 = 0;
            let mut f = tokio::fs::File::create(&target)
                .await
                .with_context(|| format!("{}", target.display()))?;
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| client.transport_error(e))?;
                f.write_all(&chunk)
                    .await
                    .with_context(|| format!("{}", target.display()))?;
                written += chunk.len() as u64;
            }
            f.flush()
                .await
                .with_context(|| format!("{}", target.display()))?;
            eprintln!("{} ({written} bytes)", target.display());
        }
        Location::Sandbox(..) => unreachable_location()?,
    }
    Ok(0)
}

/// The local file to write: `p` itself, or `p/<name>` when `p` is a directory.
fn local_target(p: &Path, remote: &str) -> Result<PathBuf> {
    if p.is_dir() {
        let name = base_name(remote).ok_or_else(|| anyhow!("{remote}: no file name to copy to"))?;
        Ok(p.join(name))
    } else {
        Ok(p.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse() {
        assert_eq!(parse_location("-"), Location::Std);
        assert_eq!(
            parse_location("abc123:/home/user/x"),
            Location::Sandbox("abc123".into(), "/home/user/x".into())
        );
        assert_eq!(parse_location("./a:b"), Location::Local("./a:b".into()));
        assert_eq!(parse_location("C:/x"), Location::Local("C:/x".into()));
        assert_eq!(parse_location("plain"), Location::Local("plain".into()));
    }

    #[test]
    fn base_names() {
        assert_eq!(base_name("/a/b.txt"), Some("b.txt"));
        assert_eq!(base_name("/a/dir/"), Some("dir"));
        assert_eq!(base_name("/"), None);
    }
}
