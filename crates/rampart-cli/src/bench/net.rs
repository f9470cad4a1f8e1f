//! `rampart bench --net`: the extra create latency of a sandbox with a network (veth wired
//! over netlink, egress attach, resolv.conf) against one without, in the same run; and of
//! one whose policy allows a package registry (its own CA made and put in its trust store,
//! attached before the launch instead of during it) against one that allows another host.

use super::{start_private_daemon_with, wait_healthy, Api, BenchArgs, Samples};
use anyhow::Result;
use serde_json::json;
use std::time::{Duration, Instant};

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
    let res = (|| -> Result<Vec<Samples>> {
        wait_healthy(&client, &url)?;
        let api = Api { client, url };
        let modes = [
            ("none", json!({"mode": "none"})),
            (
                "allowlist example.com",
                json!({"mode": "allowlist", "allow": ["example.com"]}),
            ),
            (
                "allowlist pypi.org (a registry: CA)",
                json!({"mode": "allowlist", "allow": ["pypi.org"]}),
            ),
        ];
        // Warm-up of every path.
        for (_, n) in &modes {
            let id = api.create_with(&json!({ "network": n }))?;
            api.exec_true(&id)?;
            api.destroy(&id)?;
        }
        let mut samples: Vec<Samples> = modes
            .iter()
            .map(|(name, _)| Samples::new(&format!("create + first exec, network {name}")))
            .collect();
        eprintln!(
            "bench: create + first exec, network none vs allowlist vs a registry ({} each, \
             alternating)...",
            args.iterations
        );
        for _ in 0..args.iterations {
            for ((_, n), s) in modes.iter().zip(samples.iter_mut()) {
                let t = Instant::now();
                let id = api.create_with(&json!({ "network": n }))?;
                api.exec_true(&id)?;
                s.push(t.elapsed());
                api.destroy(&id)?;
            }
        }
        Ok(samples)
    })();
    drop(daemon);
    let _ = std::process::Command::new("nft")
        .args(["delete", "table", "inet", &table])
        .status();
    let s = res?;
    println!(
        "\n## Sandbox network: extra create latency (ms), {} iterations\n",
        s[0].ms.len()
    );
    println!("| what | p50 | p99 |");
    println!("|---|---:|---:|");
    for x in &s {
        println!("| {} | {:.3} | {:.3} |", x.name, x.pct(50.0), x.pct(99.0));
    }
    let extra = s[1].pct(50.0) - s[0].pct(50.0);
    println!(
        "\n- extra p50 of a networked create: {extra:.3} ms (ratio {:.2}x); target < 5 ms: {}",
        s[1].pct(50.0) / s[0].pct(50.0),
        super::pass(extra < 5.0)
    );
    println!(
        "- extra p50 of a registry's CA and interception: {:.3} ms (ratio {:.2}x against the \
         allowlist without a registry)",
        s[2].pct(50.0) - s[1].pct(50.0),
        s[2].pct(50.0) / s[1].pct(50.0)
    );
    Ok(())
}
