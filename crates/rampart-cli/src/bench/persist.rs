//! `rampart bench --persist`: snapshot and fork latency against the size of the writable
//! layer (1 MiB, 100 MiB, 1 GiB), next to a plain `cp --sparse=always --reflink=never` of
//! the same disk image in the same run (the cost a store without reflinks would pay).

use super::{Api, Samples};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const SIZES_MIB: [u64; 3] = [1, 100, 1024];

fn post(api: &Api, path: &str, body: Value) -> Result<Value> {
    let r = api
        .client
        .post(format!("{}{path}", api.url))
        .json(&body)
        .send()?;
    let status = r.status();
    let v: Value = r.json().unwrap_or(Value::Null);
    if !status.is_success() {
        bail!("POST {path}: {status}: {v}");
    }
    Ok(v)
}

fn delete(api: &Api, path: &str) -> Result<()> {
    let r = api.client.delete(format!("{}{path}", api.url)).send()?;
    if !r.status().is_success() {
        bail!("DELETE {path}: {}", r.status());
    }
    Ok(())
}

/// Where a sandbox's disk image is under `data` (the store's or the plain layout).
fn disk_image(data: &Path, id: &str) -> PathBuf {
    let store = data
        .join("store")
        .join("sandboxes")
        .join(id)
        .join("disk.img");
    if store.exists() {
        store
    } else {
        data.join("sandboxes").join(id).join("disk.img")
    }
}

fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0)
}

/// One row of the report.
struct Row {
    mib: u64,
    first_snapshot_ms: f64,
    snapshot: Samples,
    fork: Samples,
    copy_ms: Option<f64>,
    store_growth_per_fork: Option<u64>,
}

/// Runs the measurement; `data` is the daemon's data directory when known (for the copy
/// baseline and the store's growth).
pub(super) fn run(api: &Api, data: Option<&Path>, iterations: usize) -> Result<()> {
    let n = iterations.clamp(3, 20);
    let mut rows = Vec::new();
    for mib in SIZES_MIB {
        eprintln!("bench: snapshot / fork with {mib} MiB written...");
        let v = post(
            api,
            "/v1/sandboxes",
            json!({"timeout_secs": 1800, "limits": {"disk_bytes": 3u64 << 30}}),
        )?;
        let id = v["id"].as_str().context("create: no id")?.to_owned();
        let res = measure(api, data, &id, mib, n);
        let _ = delete(api, &format!("/v1/sandboxes/{id}"));
        rows.push(res?);
    }
    print(&rows, n);
    Ok(())
}

fn measure(api: &Api, data: Option<&Path>, id: &str, mib: u64, n: usize) -> Result<Row> {
    let v = post(
        api,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"cmd": ["bash", "-c", format!("head -c {}M /dev/urandom > ~/blob && sync", mib)],
               "user": "user", "timeout_secs": 600}),
    )?;
    if v["exit_code"] != json!(0) {
        bail!("writing {mib} MiB: {v}");
    }
    // The first snapshot after writing also flushes what the sandbox's filesystem still had
    // in memory; shown apart.
    let t = Instant::now();
    post(
        api,
        &format!("/v1/sandboxes/{id}/snapshots"),
        json!({"name": format!("bench-{mib}-first")}),
    )?;
    let first_snapshot_ms = t.elapsed().as_secs_f64() * 1000.0;
    delete(api, &format!("/v1/snapshots/bench-{mib}-first"))?;
    let mut snapshot = Samples::new(&format!("snapshot, {mib} MiB written"));
    for i in 0..n {
        let name = format!("bench-{mib}-{i}");
        let t = Instant::now();
        post(
            api,
            &format!("/v1/sandboxes/{id}/snapshots"),
            json!({"name": name}),
        )?;
        snapshot.push(t.elapsed());
        delete(api, &format!("/v1/snapshots/{name}"))?;
    }
    let store_img = data.map(|d| d.join("store.img")).filter(|p| p.exists());
    let before = store_img.as_deref().map(allocated);
    let mut fork = Samples::new(&format!("fork (count 1), {mib} MiB written"));
    let mut forks = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let v = post(
            api,
            &format!("/v1/sandboxes/{id}/fork"),
            json!({"count": 1}),
        )?;
        fork.push(t.elapsed());
        if let Some(f) = v["sandboxes"][0]["id"].as_str() {
            forks.push(f.to_owned());
        }
    }
    let store_growth_per_fork = match (before, store_img.as_deref().map(allocated)) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) / n as u64),
        _ => None,
    };
    for f in forks {
        let _ = delete(api, &format!("/v1/sandboxes/{f}"));
    }
    let copy_ms = match data {
        Some(d) => {
            let img = disk_image(d, id);
            let dst = img.with_file_name("bench-copy.img");
            let t = Instant::now();
            let ok = Command::new("cp")
                .args(["--sparse=always", "--reflink=never"])
                .arg(&img)
                .arg(&dst)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            let _ = std::fs::remove_file(&dst);
            ok.then_some(ms)
        }
        None => None,
    };
    Ok(Row {
        mib,
        first_snapshot_ms,
        snapshot,
        fork,
        copy_ms,
        store_growth_per_fork,
    })
}

fn print(rows: &[Row], n: usize) {
    println!("\n## Snapshot and fork against the writable layer's size (ms), {n} iterations\n");
    println!("| written | first snapshot (incl. flush) | snapshot p50 | fork p50 | fork p99 | `cp --sparse` of the image | cp / fork | store growth per fork |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let copy = r.copy_ms.map_or("-".to_owned(), |c| format!("{c:.1}"));
        let ratio = r
            .copy_ms
            .map_or("-".to_owned(), |c| format!("{:.1}x", c / r.fork.pct(50.0)));
        let growth = r.store_growth_per_fork.map_or("-".to_owned(), |g| {
            format!("{:.1} MiB", g as f64 / 1048576.0)
        });
        println!(
            "| {} MiB | {:.1} | {:.1} | {:.1} | {:.1} | {copy} | {ratio} | {growth} |",
            r.mib,
            r.first_snapshot_ms,
            r.snapshot.pct(50.0),
            r.fork.pct(50.0),
            r.fork.pct(99.0),
        );
    }
    if let Some(big) = rows.iter().find(|r| r.mib == 1024) {
        println!(
            "\n- fork p50 < 100 ms at 1 GiB: {:.1} ms ({})",
            big.fork.pct(50.0),
            super::pass(big.fork.pct(50.0) < 100.0)
        );
    }
}
