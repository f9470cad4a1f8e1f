//! `rampart bench --net`: the extra create latency of a sandbox with a network (veth wired
//! over netlink, egress attach, resolv.conf) against one without, in the same run.

use super::{start_private_daemon_with, wait_healthy, Api, BenchArgs, Samples};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn create(api: &Api, network: &Value) -> Result<String> {
    let r = api
        .client
        .post(format!("{}/v1/sandboxes", api.url))
        .json(&json!({ "network": network }))
        .send()?;
    let status = r.status();
    let v: Value = r.json()?;
    if !status.is_success() {
        bail!("create: {status}: {v}");
    }
    Ok(v["id"].as_str().context("create: no id")?.to_owned())
}

/// Runs the measurement on a private daemon with its own network table, pool and ports.
pub(super) fn run(args: &BenchArgs) -> Result<()> {
    let client = super::http_builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let tag = std::process::id() % 250;
    let table = format!("rampart_bench_{}", std::process::id());
    let config = format!(
        "[network]\npool = \"10.254.{tag}.0/24\"\nlink_prefix = \"rb{tag}x\"\n\
         table = \"{table}\"\ndns_port = 0\nproxy_port = 0\n"
    );
    let (url, daemon) = start_private_daemon_with("net", Some(&config))?;
    let res = (|| -> Result<(Samples, Samples)> {
        wait_healthy(&client, &url)?;
        let api = Api { client, url };
        let none = json!({"mode": "none"});
        let net = json!({"mode": "allowlist", "allow": ["pypi.org"]});
        // Warm-up of both paths.
        for n in [&none, &net] {
            let id = create(&api, n)?;
            api.exec_true(&id)?;
            api.destroy(&id)?;
        }
        let mut a = Samples::new("create + first exec, network none");
        let mut b = Samples::new("create + first exec, network allowlist");
        eprintln!(
            "bench: create + first exec, network none vs allowlist ({} each, alternating)...",
            args.iterations
        );
        for _ in 0..args.iterations {
            for (n, s) in [(&none, &mut a), (&net, &mut b)] {
                let t = Instant::now();
                let id = create(&api, n)?;
                api.exec_true(&id)?;
                s.push(t.elapsed());
                api.destroy(&id)?;
            }
        }
        Ok((a, b))
    })();
    drop(daemon);
    let _ = std::process::Command::new("nft")
        .args(["delete", "table", "inet", &table])
        .status();
    let (a, b) = res?;
    println!(
        "\n## Sandbox network: extra create latency (ms), {} iterations\n",
        a.ms.len()
    );
    println!("| what | p50 | p99 |");
    println!("|---|---:|---:|");
    for s in [&a, &b] {
        println!("| {} | {:.3} | {:.3} |", s.name, s.pct(50.0), s.pct(99.0));
    }
    let extra = b.pct(50.0) - a.pct(50.0);
    println!(
        "\n- extra p50 of a networked create: {extra:.3} ms (ratio {:.2}x); target < 5 ms: {}",
        b.pct(50.0) / a.pct(50.0),
        super::pass(extra < 5.0)
    );
    Ok(())
}
