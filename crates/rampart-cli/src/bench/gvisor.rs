//! `rampart bench --gvisor`: both tiers side by side, with `runsc do` and the namespace
//! peers (bwrap, unshare, runc) in the same run, on a private daemon: create + first exec,
//! exec round trip, pause to disk with memory and its resume by memory held (10 and 100
//! MiB written by a process), fork of a running sandbox holding 100 MiB, wake on access
//! of a sandbox asleep for its idleness, and the memory an idle sandbox holds.

use super::{
    measure_peers, start_private_daemon_with, time_cmd, wait_healthy, which, Api, BenchArgs,
    Samples,
};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

/// A small disk for every sandbox of the run (sparse).
const DISK: u64 = 256 << 20;
/// How many times each slow figure (a checkpoint, a fork, a wake) is taken.
const SLOW: usize = 5;

/// Runs `script` in `id` with `sh -c`; its stdout.
fn sh(api: &Api, id: &str, script: &str) -> Result<String> {
    let r = api
        .client
        .post(format!("{}/v1/sandboxes/{id}/exec", api.url))
        .json(&json!({"cmd": ["sh", "-c", script]}))
        .send()?;
    let status = r.status();
    let v: Value = r.json()?;
    if !status.is_success() || v["exit_code"] != json!(0) {
        bail!("exec {script:?}: {status}: {v}");
    }
    Ok(v["stdout"].as_str().unwrap_or_default().to_owned())
}

fn body(tier: &str, memory_mib: u64) -> Value {
    json!({"isolation": tier, "timeout_secs": 3600,
           "limits": {"disk_bytes": DISK, "memory_bytes": (memory_mib + 256) << 20}})
}

/// A sandbox of `tier` in which a process holds `mib` MiB it wrote (random bytes, so its
/// checkpoint cannot be compressed away), and waits.
fn holding(api: &Api, tier: &str, mib: u64) -> Result<String> {
    let id = api.create_with(&body(tier, mib))?;
    sh(
        api,
        &id,
        &format!(
            "nohup python3 -c 'import os,time; b=os.urandom({mib}<<20); open(\"/tmp/ready\",\"w\").write(\"1\"); time.sleep(1e9)' >/dev/null 2>&1 &"
        ),
    )?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while sh(api, &id, "cat /tmp/ready 2>/dev/null || true")?.trim() != "1" {
        if Instant::now() > deadline {
            bail!("the process of {id} did not write its {mib} MiB within 2 minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(id)
}

/// The figures of one tier.
struct Tier {
    cycle: Samples,
    exec: Samples,
}

fn measure_tier(api: &Api, tier: &str, n: usize) -> Result<Tier> {
    let mut t = Tier {
        cycle: Samples::new(&format!("rampart create + first exec ({tier})")),
        exec: Samples::new(&format!("rampart exec round trip ({tier})")),
    };
    for _ in 0..n {
        let start = Instant::now();
        let id = api.create_with(&body(tier, 256))?;
        api.exec_true(&id)?;
        t.cycle.push(start.elapsed());
        api.destroy(&id)?;
    }
    let id = api.create_with(&body(tier, 256))?;
    for _ in 0..n.max(20) {
        let start = Instant::now();
        api.exec_true(&id)?;
        t.exec.push(start.elapsed());
    }
    api.destroy(&id)?;
    Ok(t)
}

/// Pause to disk with memory and resume of a gVisor sandbox holding `mib` MiB.
fn measure_checkpoint(api: &Api, mib: u64) -> Result<(Samples, Samples)> {
    let mut save = Samples::new(&format!("gvisor pause to disk with memory, {mib} MiB held"));
    let mut restore = Samples::new(&format!("gvisor resume (restore), {mib} MiB held"));
    let id = holding(api, "gvisor", mib)?;
    let res = (|| -> Result<()> {
        for _ in 0..SLOW {
            let t = Instant::now();
            api.pause_with(&id, false, Some(json!({"disk": true})))?;
            save.push(t.elapsed());
            let t = Instant::now();
            api.pause(&id, true)?;
            api.exec_true(&id)?;
            restore.push(t.elapsed());
        }
        Ok(())
    })();
    api.destroy(&id)?;
    res.map(|()| (save, restore))
}

/// A fork of a running gVisor sandbox holding 100 MiB, until the fork answers an exec.
fn measure_fork(api: &Api) -> Result<Samples> {
    let mut s =
        Samples::new("gvisor fork of a running sandbox (100 MiB held), to the fork's first exec");
    let id = holding(api, "gvisor", 100)?;
    let res = (|| -> Result<()> {
        for _ in 0..SLOW {
            let t = Instant::now();
            let r = api
                .client
                .post(format!("{}/v1/sandboxes/{id}/fork", api.url))
                .json(&json!({"count": 1}))
                .send()?;
            let status = r.status();
            let v: Value = r.json()?;
            let fork = v["sandboxes"][0]["id"]
                .as_str()
                .with_context(|| format!("fork: {status}: {v}"))?
                .to_owned();
            api.exec_true(&fork)?;
            s.push(t.elapsed());
            api.destroy(&fork)?;
        }
        Ok(())
    })();
    api.destroy(&id)?;
    res.map(|()| s)
}

/// An exec of a sandbox of `tier` asleep for its idleness (idle_pause_secs 1).
fn measure_wake(api: &Api, tier: &str) -> Result<Samples> {
    let mut s = Samples::new(&format!(
        "wake on access: exec true of a sleeping sandbox ({tier})"
    ));
    let mut b = body(tier, 256);
    b["idle_pause_secs"] = json!(1);
    let id = api.create_with(&b)?;
    let res = (|| -> Result<()> {
        for _ in 0..SLOW {
            api.wait_state(&id, "paused", Duration::from_secs(60))?;
            let t = Instant::now();
            api.exec_true(&id)?;
            s.push(t.elapsed());
        }
        Ok(())
    })();
    api.destroy(&id)?;
    res.map(|()| s)
}

/// Memory charged to the cgroups of `count` idle sandboxes of `tier`, per sandbox (MiB).
fn idle_memory_mib(api: &Api, tier: &str, count: usize) -> Result<f64> {
    let mut ids = Vec::new();
    let res = (|| -> Result<f64> {
        for _ in 0..count {
            ids.push(api.create_with(&body(tier, 256))?);
        }
        let mut total = 0u64;
        for id in &ids {
            let v: Value = api
                .client
                .get(format!("{}/v1/sandboxes/{id}/stats", api.url))
                .send()?
                .json()?;
            total += v["memory_bytes"].as_u64().unwrap_or(0);
        }
        Ok(total as f64 / count.max(1) as f64 / f64::from(1 << 20))
    })();
    for id in &ids {
        let _ = api.destroy(id);
    }
    res
}

/// Runs the measurement (see the module's text).
pub(super) fn run(args: &BenchArgs) -> Result<()> {
    let runsc = which("runsc").context("runsc (gVisor) is not installed: apt-get install runsc")?;
    let n = args.iterations.clamp(3, 30);
    eprintln!("bench: peers ({n} iterations each)...");
    let mut peers = measure_peers(n)?;
    let state = std::env::temp_dir().join(format!("rampart-bench-runsc-{}", std::process::id()));
    std::fs::create_dir_all(&state)?;
    let mut runsc_do = Samples::new("runsc do /bin/true (ptrace, no network)");
    for _ in 0..n {
        runsc_do.push(time_cmd(
            Command::new(&runsc).arg("--root").arg(&state).args([
                "--platform",
                "ptrace",
                "--network",
                "none",
                "do",
                "/bin/true",
            ]),
        )?);
    }
    let _ = std::fs::remove_dir_all(&state);
    let client = super::http_builder()
        .timeout(Duration::from_secs(300))
        .build()?;
    let (url, daemon) = start_private_daemon_with("gvisor", None)?;
    let res = (|| -> Result<Vec<Samples>> {
        wait_healthy(&client, &url)?;
        let api = Api { client, url };
        let mut rows = Vec::new();
        for tier in ["namespace", "gvisor"] {
            eprintln!("bench: create and exec ({tier})...");
            let t = measure_tier(&api, tier, n)?;
            rows.extend([t.cycle, t.exec]);
        }
        for mib in [10, 100] {
            eprintln!("bench: checkpoint and restore with {mib} MiB held...");
            let (save, restore) = measure_checkpoint(&api, mib)?;
            rows.extend([save, restore]);
        }
        eprintln!("bench: fork...");
        rows.push(measure_fork(&api)?);
        for tier in ["namespace", "gvisor"] {
            eprintln!("bench: wake on access ({tier})...");
            rows.push(measure_wake(&api, tier)?);
        }
        let idle = args.idle.clamp(1, 20);
        for tier in ["namespace", "gvisor"] {
            let mib = idle_memory_mib(&api, tier, idle)?;
            println!("- memory per idle sandbox ({tier}, {idle} alive, its cgroup): {mib:.1} MiB");
        }
        Ok(rows)
    })();
    drop(daemon);
    let rows = res?;
    peers.push(runsc_do);
    println!("\n## The two tiers (ms), {n} iterations (slow figures: {SLOW})\n");
    println!("| what | p50 | p99 |");
    println!("|---|---:|---:|");
    for s in peers.iter().chain(&rows) {
        println!("| {} | {:.2} | {:.2} |", s.name, s.pct(50.0), s.pct(99.0));
    }
    let find = |prefix: &str| {
        rows.iter()
            .chain(&peers)
            .find(|s| s.name.starts_with(prefix))
    };
    if let (Some(g), Some(r)) = (
        find("rampart create + first exec (gvisor)"),
        find("runsc do"),
    ) {
        let ratio = g.pct(50.0) / r.pct(50.0);
        println!(
            "\n- gvisor create + first exec is {ratio:.2}x runsc do (p50; goal 1.3x: {})",
            if ratio <= 1.3 { "met" } else { "NOT met" }
        );
    }
    if let Some(r) = find("gvisor resume (restore), 100 MiB") {
        let p = r.pct(50.0);
        println!(
            "- restore of a sandbox holding 100 MiB: {p:.0} ms p50 (goal < 600 ms: {})",
            if p < 600.0 { "met" } else { "NOT met" }
        );
    }
    Ok(())
}
