//! `rampart bench --pool`: creates served by a warm pool against cold creates, in the same
//! run on the same private daemon (pools `base` and `base@open`, its own network table),
//! next to bwrap; the E2B SDK's create + run + kill and create+destroy throughput with the
//! pool, each with the share of creates the pool served (from the daemon's metrics).

use super::{measure_peers, start_private_daemon_with, wait_healthy, Api, BenchArgs, Samples};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Pool hits and misses so far, from `/metrics`.
fn claims(api: &Api) -> Result<(u64, u64)> {
    let text = api
        .client
        .get(format!("{}/metrics", api.url))
        .send()?
        .text()?;
    let of = |result: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "rampart_pool_claims_total{{result=\"{result}\"}} "
                ))
            })
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    Ok((of("hit"), of("miss")))
}

/// Ready sandboxes in each pool, and whether every pool is full.
fn full(api: &Api) -> Result<bool> {
    let v: Value = api
        .client
        .get(format!("{}/v1/pools", api.url))
        .send()?
        .json()?;
    let pools = v.as_array().context("GET /v1/pools: not a list")?;
    Ok(!pools.is_empty()
        && pools
            .iter()
            .all(|p| p["ready"].as_u64() >= p["size"].as_u64()))
}

/// Waits (polling the pools, 2 ms apart, at most a minute) until every pool is full.
fn refilled(api: &Api) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !full(api)? {
        if Instant::now() > deadline {
            bail!("the warm pools did not fill within a minute");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Runs the measurement (see the module's text).
pub(super) fn run(args: &BenchArgs) -> Result<()> {
    let client = super::http_builder()
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(args.concurrency.max(1))
        .build()?;
    let size = args.pool_size.max(1);
    let tag = (std::process::id() + 7) % 250;
    let table = format!("rampart_benchp_{}", std::process::id());
    let config = format!(
        "[network]\npool = \"10.253.{tag}.0/24\"\nlink_prefix = \"rb{tag}p\"\n\
         table = \"{table}\"\ndns_port = 0\nproxy_port = 0\n\n\
         [warm]\nbase = {size}\n\"base@open\" = {size}\n"
    );
    eprintln!("bench: peers ({} iterations each)...", args.iterations);
    let peers = measure_peers(args.iterations)?;
    let (url, daemon) = start_private_daemon_with("pool", Some(&config))?;
    let key_file = daemon.data_dir.join("api-key");
    let res = (|| -> Result<Report> {
        wait_healthy(&client, &url)?;
        let api = Api { client, url };
        refilled(&api)?;
        // Warm-up of both paths.
        for body in [json!({}), json!({"env": {"BENCH": "cold"}})] {
            let id = api.create_with(&body)?;
            api.exec_true(&id)?;
            api.destroy(&id)?;
        }
        let mut warm = Samples::new("rampart create from a warm pool + first exec result");
        let mut cold = Samples::new("rampart cold create + first exec result (same daemon)");
        eprintln!(
            "bench: warm-pool create against cold create, + first exec ({} each, alternating)...",
            args.iterations
        );
        let (h0, m0) = claims(&api)?;
        for _ in 0..args.iterations {
            refilled(&api)?;
            let t = Instant::now();
            let id = api.create_with(&json!({}))?;
            api.exec_true(&id)?;
            warm.push(t.elapsed());
            api.destroy(&id)?;
            // An environment is fixed at launch: no pool serves it.
            let t = Instant::now();
            let id = api.create_with(&json!({"env": {"BENCH": "cold"}}))?;
            api.exec_true(&id)?;
            cold.push(t.elapsed());
            api.destroy(&id)?;
        }
        let (h1, m1) = claims(&api)?;
        if h1 - h0 != args.iterations as u64 || m1 != m0 {
            bail!(
                "the pool served {} of {} warm creates (misses {}): the figures would mix",
                h1 - h0,
                args.iterations,
                m1 - m0
            );
        }
        refilled(&api)?;
        let e2b = super::measure_e2b_sdk(&api.url, Some(&key_file), args.iterations.min(30));
        let (h2, m2) = claims(&api)?;
        refilled(&api)?;
        let through = super::measure_throughput(&api, args.cycles, args.concurrency, None)?;
        let (h3, m3) = claims(&api)?;
        Ok(Report {
            warm,
            cold,
            e2b: e2b.map(|mut rows| (rows.swap_remove(0), (h2 - h1, m2 - m1))),
            rate: (through.rate, (h3 - h2, m3 - m2)),
        })
    })();
    drop(daemon);
    // (Gone already when the daemon removed it at its stop.)
    let _ = std::process::Command::new("nft")
        .args(["delete", "table", "inet", &table])
        .stderr(std::process::Stdio::null())
        .status();
    let r = res?;
    print(&r, &peers, args, size);
    Ok(())
}

struct Report {
    warm: Samples,
    cold: Samples,
    /// The SDK's create + run + kill, and the pool's (hits, misses) meanwhile.
    e2b: Option<(Samples, (u64, u64))>,
    /// create+destroy per second, and the pool's (hits, misses) meanwhile.
    rate: (f64, (u64, u64)),
}

fn share((hits, misses): (u64, u64)) -> String {
    let all = hits + misses;
    if all == 0 {
        return "no creates asked a pool".into();
    }
    format!(
        "{hits} of {all} creates served by the pool ({:.0}%)",
        100.0 * hits as f64 / all as f64
    )
}

fn print(r: &Report, peers: &[Samples], args: &BenchArgs, size: usize) {
    let bwrap = peers
        .iter()
        .find(|s| s.name.starts_with("bwrap"))
        .map(|s| s.pct(50.0));
    println!(
        "\n## Warm pools (ms), {} iterations, pools of {size} (`base`, `base@open`)\n",
        r.warm.ms.len()
    );
    println!("| what | p50 | p99 | p50 / bwrap p50 |");
    println!("|---|---:|---:|---:|");
    let ratio = |s: &Samples| bwrap.map_or("-".into(), |b| format!("{:.2}x", s.pct(50.0) / b));
    for s in peers.iter().chain([&r.warm, &r.cold]) {
        println!(
            "| {} | {:.3} | {:.3} | {} |",
            s.name,
            s.pct(50.0),
            s.pct(99.0),
            ratio(s)
        );
    }
    if let Some((s, hits)) = &r.e2b {
        println!(
            "| {} ({}) | {:.3} | {:.3} | {} |",
            s.name,
            share(*hits),
            s.pct(50.0),
            s.pct(99.0),
            ratio(s)
        );
    }
    let w = r.warm.pct(50.0);
    println!(
        "\n- warm create + first exec p50 {w:.3} ms, {:.2}x the cold create's in the same run",
        w / r.cold.pct(50.0)
    );
    if let Some(b) = bwrap {
        println!(
            "- goal <= 2 ms and <= 0.3x bwrap: {} ({w:.3} ms, {:.2}x)",
            super::pass(w <= 2.0 && w / b <= 0.3),
            w / b
        );
    }
    if let Some((s, _)) = &r.e2b {
        let p = s.pct(50.0);
        println!(
            "- E2B SDK create + run + kill p50 {p:.1} ms; goal <= 25 ms: {}",
            super::pass(p <= 25.0)
        );
    }
    println!(
        "- create+destroy per second at concurrency {}: {:.1} ({}); goal >= 300: {}",
        args.concurrency,
        r.rate.0,
        share(r.rate.1),
        super::pass(r.rate.0 >= 300.0)
    );
}
