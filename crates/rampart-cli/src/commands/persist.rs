//! `snapshot`, `fork`, `volume` (see docs/persistence.md).

use crate::client::Client;
use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use rampart_types::{
    CreateSnapshot, CreateVolume, ForkResult, ForkSandbox, SnapshotInfo, VolumeInfo, VolumeMount,
};
use reqwest::Method;

/// `rampart snapshot ID [--name N] [--memory] [--stop]`, `rampart snapshot ls`, `rampart
/// snapshot rm NAME...`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// A sandbox id (take a snapshot of it), or `ls`, or `rm NAME...`.
    #[arg(required = true)]
    args: Vec<String>,
    /// Name of the new snapshot (generated when absent).
    #[arg(long)]
    name: Option<String>,
    /// Destroy the sandbox once the snapshot is taken ("pause to disk").
    #[arg(long)]
    stop: bool,
    /// Keep its processes and memory too (the gvisor tier): a sandbox made from the
    /// snapshot (`rampart create --snapshot N`) continues them.
    #[arg(long)]
    memory: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `rampart fork ID [-n N]`.
#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The sandbox to fork.
    id: String,
    /// How many sandboxes to make.
    #[arg(short = 'n', long = "count", default_value_t = 1)]
    count: u32,
    /// Seconds until each fork expires (the source's timeout when absent).
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `rampart volume create|ls|rm`.
#[derive(Debug, Args)]
pub struct VolumeArgs {
    #[command(subcommand)]
    cmd: VolumeCmd,
}

#[derive(Debug, Subcommand)]
enum VolumeCmd {
    /// Make a volume.
    Create {
        /// Its name.
        name: String,
        /// Size quota, e.g. 512M, 10G.
        #[arg(long, default_value = "1G")]
        size: String,
    },
    /// List volumes.
    #[command(alias = "list")]
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove volumes and their data (refused while mounted).
    Rm {
        /// Names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// Parses `NAME:/path[:ro]` (`--volume` of `create` and `run`).
pub fn parse_volume(s: &str) -> Result<VolumeMount> {
    let (name, rest) = s
        .split_once(':')
        .ok_or_else(|| anyhow!("--volume: expected NAME:/path[:ro], got {s:?}"))?;
    let (path, read_only) = match rest.rsplit_once(':') {
        Some((p, "ro")) => (p, true),
        Some((p, "rw")) => (p, false),
        _ => (rest, false),
    };
    if name.is_empty() || !path.starts_with('/') {
        return Err(anyhow!("--volume: expected NAME:/path[:ro], got {s:?}"));
    }
    Ok(VolumeMount {
        name: name.to_owned(),
        path: path.to_owned(),
        read_only,
    })
}

async fn delete(client: &Client, path: &str) -> Result<()> {
    client.send(client.request(Method::DELETE, path)).await?;
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

/// Takes a snapshot through the API.
pub async fn take_snapshot(
    client: &Client,
    id: &str,
    req: &CreateSnapshot,
) -> Result<SnapshotInfo> {
    client
        .json(
            client
                .request(Method::POST, &format!("/v1/sandboxes/{id}/snapshots"))
                .json(req),
        )
        .await
}

/// Forks a sandbox through the API.
pub async fn fork_sandbox(client: &Client, id: &str, req: &ForkSandbox) -> Result<ForkResult> {
    client
        .json(
            client
                .request(Method::POST, &format!("/v1/sandboxes/{id}/fork"))
                .json(req),
        )
        .await
}

/// `rampart snapshot`.
pub async fn snapshot(host: &crate::client::Endpoint, a: SnapshotArgs) -> Result<u8> {
    let client = Client::new(host)?;
    match a.args[0].as_str() {
        "ls" | "list" => {
            let list: Vec<SnapshotInfo> = client
                .json(client.request(Method::GET, "/v1/snapshots"))
                .await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!(
                    "{:<32} {:<14} {:<20} {:>12}  CREATED",
                    "NAME", "SOURCE", "TEMPLATE", "SIZE"
                );
                for s in list {
                    println!(
                        "{:<32} {:<14} {:<20} {:>12}  {}",
                        s.name,
                        s.source,
                        s.template,
                        mib(s.size_bytes),
                        s.created_at
                    );
                }
            }
            Ok(0)
        }
        "rm" | "delete" => {
            let mut code = 0;
            for n in &a.args[1..] {
                match delete(&client, &format!("/v1/snapshots/{n}")).await {
                    Ok(()) => println!("{n}"),
                    Err(e) => {
                        eprintln!("rampart: {n}: {e:#}");
                        code = 1;
                    }
                }
            }
            Ok(code)
        }
        id => {
            if a.args.len() > 1 {
                return Err(anyhow!("snapshot takes one sandbox id"));
            }
            let req = CreateSnapshot {
                name: a.name.clone(),
                memory: a.memory,
                stop: a.stop,
            };
            let s = take_snapshot(&client, id, &req).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("{}", s.name);
            }
            Ok(0)
        }
    }
}

/// `rampart fork`.
pub async fn fork(host: &crate::client::Endpoint, a: ForkArgs) -> Result<u8> {
    let client = Client::new(host)?;
    let r = fork_sandbox(
        &client,
        &a.id,
        &ForkSandbox {
            count: a.count,
            timeout_secs: a.timeout,
        },
    )
    .await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        for s in r.sandboxes {
            println!("{}", s.id);
        }
    }
    Ok(0)
}

/// `rampart volume`.
pub async fn volume(host: &crate::client::Endpoint, a: VolumeArgs) -> Result<u8> {
    let client = Client::new(host)?;
    match a.cmd {
        VolumeCmd::Create { name, size } => {
            let bytes = rampart_types::limits::parse_size(&size)
                .ok_or_else(|| anyhow!("--size: cannot read {size:?} as a size"))?;
            let v: VolumeInfo = client
                .json(
                    client
                        .request(Method::POST, "/v1/volumes")
                        .json(&CreateVolume {
                            name,
                            size_mib: bytes.div_ceil(1 << 20),
                        }),
                )
                .await?;
            println!("{}", v.name);
            Ok(0)
        }
        VolumeCmd::Ls { json } => {
            let list: Vec<VolumeInfo> = client
                .json(client.request(Method::GET, "/v1/volumes"))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("{:<32} {:>10} {:>12}  CREATED", "NAME", "SIZE", "USED");
                for v in list {
                    println!(
                        "{:<32} {:>10} {:>12}  {}",
                        v.name,
                        format!("{} MiB", v.size_mib),
                        mib(v.used_bytes),
                        v.created_at
                    );
                }
            }
            Ok(0)
        }
        VolumeCmd::Rm { names } => {
            let mut code = 0;
            for n in &names {
                match delete(&client, &format!("/v1/volumes/{n}")).await {
                    Ok(()) => println!("{n}"),
                    Err(e) => {
                        eprintln!("rampart: {n}: {e:#}");
                        code = 1;
                    }
                }
            }
            Ok(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_flags_parse() {
        let v = parse_volume("data:/home/user/data:ro").unwrap();
        assert_eq!(
            (v.name.as_str(), v.path.as_str(), v.read_only),
            ("data", "/home/user/data", true)
        );
        let v = parse_volume("data:/mnt").unwrap();
        assert!(!v.read_only);
        assert!(parse_volume("data").is_err());
        assert!(parse_volume("data:relative").is_err());
    }
}
