//! `rampart bench --desktop --daemon URL`: a desktop sandbox as a computer-use agent drives
//! it, on a daemon that has the `desktop` template (`rampart template build -f
//! templates/desktop.toml`): create -> desktop up (Xvfb and Xfce, `rampart-desktop`) ->
//! first screenshot through the API; the screenshot round trip on a warm desktop; the
//! memory of an idle desktop sandbox. Next to it, when the host has Xvfb and scrot, the
//! same screenshot taken directly on the host (no sandbox, no API): the floor.

use super::{Api, BenchArgs, Samples};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn create(api: &Api) -> Result<String> {
    let r = api
        .client
        .post(format!("{}/v1/sandboxes", api.url))
        .json(&json!({"template": "desktop", "timeout_secs": 600}))
        .send()?;
    let status = r.status();
    let v: Value = r.json()?;
    if !status.is_success() {
        bail!(
            "create from the `desktop` template: {status}: {v} (build it on that daemon: \
             rampart template build -f templates/desktop.toml)"
        );
    }
    Ok(v["id"].as_str().context("create: no id")?.to_owned())
}

fn exec(api: &Api, id: &str, cmd: &[&str]) -> Result<Value> {
    let r = api
        .client
        .post(format!("{}/v1/sandboxes/{id}/exec", api.url))
        .json(&json!({ "cmd": cmd, "env": {"DISPLAY": ":0"} }))
        .send()?;
    let status = r.status();
    let v: Value = r.json()?;
    if !status.is_success() || v["exit_code"] != json!(0) {
        bail!("exec {cmd:?}: {status}: {v}");
    }
    Ok(v)
}

fn screenshot(api: &Api, id: &str) -> Result<usize> {
    let r = api
        .client
        .post(format!("{}/v1/sandboxes/{id}/desktop/screenshot", api.url))
        .send()?;
    let status = r.status();
    let b = r.bytes()?;
    if !status.is_success() || !b.starts_with(b"\x89PNG") {
        bail!("screenshot: {status}: {}", String::from_utf8_lossy(&b));
    }
    Ok(b.len())
}

/// The host's own Xvfb on a free display, and scrot against it: the floor of a screenshot.
fn host_floor(iterations: usize) -> Option<Samples> {
    let have = |p: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !have("Xvfb") || !have("scrot") {
        return None;
    }
    let display = format!(":{}", 200 + std::process::id() % 500);
    let mut x = Command::new("Xvfb")
        .args([&display, "-screen", "0", "1024x768x24", "-nolisten", "tcp"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let shot = std::env::temp_dir().join(format!("rampart-bench-{}.png", std::process::id()));
    let take = || {
        Command::new("scrot")
            .args(["--overwrite", "--pointer"])
            .arg(&shot)
            .env("DISPLAY", &display)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !take() {
        if Instant::now() > deadline {
            let _ = x.kill();
            let _ = x.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut s = Samples::new("screenshot on the host (Xvfb + scrot, no sandbox)");
    for _ in 0..iterations {
        let t = Instant::now();
        take();
        s.push(t.elapsed());
    }
    let _ = x.kill();
    let _ = x.wait();
    let _ = std::fs::remove_file(&shot);
    Some(s)
}

pub(super) fn run(args: &BenchArgs, api: &Api) -> Result<()> {
    let n = args.iterations.clamp(1, 20);
    eprintln!("bench: desktop: create -> desktop -> first screenshot ({n} times)...");
    let mut first = Samples::new("create -> desktop up -> first screenshot");
    let mut up = Samples::new("of which create -> desktop up (rampart-desktop)");
    let mut kept = None;
    for i in 0..n {
        let t = Instant::now();
        let id = create(api)?;
        exec(api, &id, &["rampart-desktop"])?;
        up.push(t.elapsed());
        screenshot(api, &id)?;
        first.push(t.elapsed());
        if i + 1 == n {
            kept = Some(id);
        } else {
            api.destroy(&id)?;
        }
    }
    let id = kept.context("no sandbox")?;
    let res = (|| -> Result<(Samples, u64, usize)> {
        let m = (args.iterations * 2).clamp(10, 100);
        eprintln!("bench: desktop: screenshot round trip ({m} times)...");
        let mut rt = Samples::new("screenshot round trip (API: scrot, read, record)");
        let mut size = 0;
        for _ in 0..m {
            let t = Instant::now();
            size = screenshot(api, &id)?;
            rt.push(t.elapsed());
        }
        // Idle: let the desktop settle, then read its cgroup's memory.
        std::thread::sleep(Duration::from_secs(3));
        let st: Value = api
            .client
            .get(format!("{}/v1/sandboxes/{id}/stats", api.url))
            .send()?
            .json()?;
        let mem = st["memory_bytes"].as_u64().unwrap_or(0);
        Ok((rt, mem, size))
    })();
    api.destroy(&id)?;
    let (rt, mem, size) = res?;
    let floor = host_floor(rt.ms.len());
    println!(
        "\n## Desktop (ms; {n} creates, {} screenshots)\n",
        rt.ms.len()
    );
    println!("| what | p50 | p99 |");
    println!("|---|---:|---:|");
    for s in [&first, &up, &rt].into_iter().chain(floor.as_ref()) {
        println!("| {} | {:.1} | {:.1} |", s.name, s.pct(50.0), s.pct(99.0));
    }
    println!(
        "\n- first screenshot p50 {:.0} ms; goal < 1500 ms: {}",
        first.pct(50.0),
        super::pass(first.pct(50.0) < 1500.0)
    );
    if let Some(f) = &floor {
        println!(
            "- screenshot round trip against the host's own: {:.2}x",
            rt.pct(50.0) / f.pct(50.0)
        );
    }
    println!(
        "- idle desktop sandbox memory (cgroup): {:.1} MiB; a screenshot is {:.0} KiB",
        mem as f64 / (1024.0 * 1024.0),
        size as f64 / 1024.0
    );
    Ok(())
}
