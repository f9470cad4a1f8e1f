//! `rampart bench --fleet`: what the fleet's gateway adds. A fleet on this machine (`rampart
//! fleet up --nodes 3`: a 3-member etcd, three nodes each in its own network namespace, a
//! gateway); every call made alternately through the gateway and straight to the node (with
//! the fleet's token, as a gateway calls it), pair by pair: exec round trip, create + first
//! exec + destroy; then create+destroy per second through the gateway.

use super::{Api, BenchArgs, Samples};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A fleet `rampart fleet up` started; `fleet down` when dropped.
struct Up {
    dir: std::path::PathBuf,
    file: Value,
}

impl Drop for Up {
    fn drop(&mut self) {
        let me = std::env::current_exe().unwrap_or_else(|_| "rampart".into());
        let _ = std::process::Command::new(me)
            .args(["fleet", "down", "--dir"])
            .arg(&self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn up(nodes: usize) -> Result<Up> {
    let dir = std::env::temp_dir().join(format!("rampart-bench-fleet-{}", std::process::id()));
    let me = std::env::current_exe()?;
    let out = std::process::Command::new(me)
        .args(["fleet", "up", "--nodes", &nodes.to_string(), "--dir"])
        .arg(&dir)
        .output()?;
    if !out.status.success() {
        bail!(
            "rampart fleet up: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let file = serde_json::from_slice(&out.stdout).context("fleet up's output")?;
    Ok(Up { dir, file })
}

fn client_with(headers: &[(&str, String)]) -> Result<reqwest::blocking::Client> {
    let mut h = reqwest::header::HeaderMap::new();
    for (k, v) in headers {
        h.insert(
            reqwest::header::HeaderName::from_bytes(k.as_bytes())?,
            v.parse()?,
        );
    }
    Ok(reqwest::blocking::Client::builder()
        .default_headers(h)
        .timeout(Duration::from_secs(120))
        .build()?)
}

/// Runs the measurement (see the module's text).
pub(super) fn run(args: &BenchArgs) -> Result<()> {
    let fleet = up(3)?;
    let gateway = fleet.file["gateway"]
        .as_str()
        .context("fleet.json: gateway")?
        .to_owned();
    let admin = fleet.file["admin_key"]
        .as_str()
        .context("fleet.json: admin_key")?
        .to_owned();
    let endpoints: Vec<String> = fleet.file["etcd"]
        .as_array()
        .context("fleet.json: etcd")?
        .iter()
        .filter_map(|e| e["endpoint"].as_str().map(str::to_owned))
        .collect();
    // The fleet's token and the admin key's listing, as a gateway sends them to a node.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (token, key) = rt.block_on(async {
        let store =
            rampart_fleet::Store::connect(&endpoints, rampart_fleet::DEFAULT_PREFIX).await?;
        let token = store.token().await?;
        let digest = rampart_store::keys::sha256_hex(admin.as_bytes());
        let key = store
            .key_by_digest(&digest)
            .await?
            .ok_or_else(|| anyhow!("the fleet has no admin key"))?;
        Ok::<_, anyhow::Error>((token, key))
    })?;
    let principal = rampart_store::node_keys::GatewayPrincipal {
        gateway: "bench".into(),
        peer: None,
        key,
        quotas: None,
        e2b: false,
    };
    let via = Api {
        client: client_with(&[("authorization", format!("Bearer {admin}"))])?,
        url: gateway.clone(),
    };
    // One sandbox to find a node; the direct client talks to that node.
    let probe: Value = via
        .client
        .post(format!("{gateway}/v1/sandboxes"))
        .json(&json!({}))
        .send()?
        .json()?;
    let id = probe["id"].as_str().context("create: no id")?.to_owned();
    let node = probe["node"]
        .as_str()
        .context("create: no node")?
        .to_owned();
    let node_url = fleet.file["nodes"]
        .as_array()
        .context("fleet.json: nodes")?
        .iter()
        .find(|n| n["name"] == json!(node))
        .and_then(|n| n["url"].as_str())
        .context("fleet.json: the node's url")?
        .to_owned();
    let direct = Api {
        client: client_with(&[
            ("authorization", format!("Bearer {token}")),
            (
                rampart_store::node_keys::GATEWAY_PRINCIPAL_HEADER,
                principal.encode(),
            ),
        ])?,
        url: node_url,
    };
    for _ in 0..5 {
        via.exec_true(&id)?;
        direct.exec_true(&id)?;
    }
    eprintln!(
        "bench: exec round trip, gateway and node alternately ({} each)...",
        args.iterations
    );
    let (mut ex_via, mut ex_direct) = (Samples::new("via"), Samples::new("direct"));
    for _ in 0..args.iterations {
        let t = Instant::now();
        via.exec_true(&id)?;
        ex_via.push(t.elapsed());
        let t = Instant::now();
        direct.exec_true(&id)?;
        ex_direct.push(t.elapsed());
    }
    eprintln!("bench: create + first exec + destroy, alternately...");
    let (rec0, fgt0) = etcd_totals(&via, &gateway)?;
    let rounds = (args.iterations / 2).max(5);
    let (mut cr_via, mut cr_direct) = (Samples::new("via"), Samples::new("direct"));
    for _ in 0..rounds {
        for (api, s) in [(&via, &mut cr_via), (&direct, &mut cr_direct)] {
            let t = Instant::now();
            let sid = api.create()?;
            api.exec_true(&sid)?;
            s.push(t.elapsed());
            api.destroy(&sid)?;
        }
    }
    via.destroy(&id)?;
    let (rec1, fgt1) = etcd_totals(&via, &gateway)?;
    let cycles = args.cycles;
    let conc = args.concurrency.max(1);
    eprintln!("bench: {cycles} create+destroy through the gateway at concurrency {conc}...");
    let per = cycles.div_ceil(conc);
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..conc)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    for _ in 0..per {
                        let sid = via.create()?;
                        via.destroy(&sid)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| anyhow!("bench worker panicked"))??;
        }
        Ok(())
    })?;
    let rate = (per * conc) as f64 / t.elapsed().as_secs_f64();
    let (rec2, fgt2) = etcd_totals(&via, &gateway)?;
    let during = |(s0, n0): (f64, f64), (s1, n1): (f64, f64)| {
        if n1 > n0 {
            (s1 - s0) / (n1 - n0) * 1000.0
        } else {
            f64::NAN
        }
    };
    let (record_ms, forget_ms) = (during(rec0, rec1), during(fgt0, fgt1));
    let (record_busy_ms, forget_busy_ms) = (during(rec1, rec2), during(fgt1, fgt2));
    println!("fleet: 3 nodes (each in its own network namespace), 3 etcd members, 1 gateway; p50 (p90) ms");
    println!(
        "{:<34} {:>16} {:>16} {:>10}",
        "", "via gateway", "node directly", "added p50"
    );
    for (what, a, b) in [
        ("exec round trip (true)", &ex_via, &ex_direct),
        ("create + first exec", &cr_via, &cr_direct),
    ] {
        println!(
            "{:<34} {:>9.2} ({:>5.2}) {:>9.2} ({:>5.2}) {:>+10.2}",
            what,
            a.pct(50.0),
            a.pct(90.0),
            b.pct(50.0),
            b.pct(90.0),
            a.pct(50.0) - b.pct(50.0)
        );
    }
    println!("create+destroy through the gateway, {conc} clients: {rate:.1}/s");
    println!(
        "the gateway's etcd transactions, mean: catalog entry at create {record_ms:.2} ms one at a time, {record_busy_ms:.2} ms with {conc} clients; its removal at destroy {forget_ms:.2} / {forget_busy_ms:.2} ms"
    );
    if let Some(path) = &args.json {
        let v = json!({
            "fleet": {
                "nodes": 3,
                "exec_ms": {"via_p50": ex_via.pct(50.0), "direct_p50": ex_direct.pct(50.0),
                            "via_p90": ex_via.pct(90.0), "direct_p90": ex_direct.pct(90.0)},
                "create_first_exec_ms": {"via_p50": cr_via.pct(50.0), "direct_p50": cr_direct.pct(50.0)},
                "create_destroy_per_s": rate,
                "etcd_record_mean_ms": record_ms,
                "etcd_forget_mean_ms": forget_ms,
                "etcd_record_mean_ms_under_load": record_busy_ms,
                "etcd_forget_mean_ms_under_load": forget_busy_ms,
                "concurrency": conc,
            }
        });
        std::fs::write(path, serde_json::to_vec_pretty(&v)?)?;
    }
    drop(fleet);
    Ok(())
}

/// The gateway's etcd histograms so far: ((sum, count) of `record`, (sum, count) of
/// `forget`), in seconds, from its `/metrics`.
fn etcd_totals(via: &Api, gateway: &str) -> Result<((f64, f64), (f64, f64))> {
    let text = via
        .client
        .get(format!("{gateway}/metrics"))
        .send()?
        .text()?;
    let of = |op: &str, suffix: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "rampart_gateway_etcd_seconds_{suffix}{{op=\"{op}\"}} "
                ))
            })
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((
        (of("record", "sum"), of("record", "count")),
        (of("forget", "sum"), of("forget", "count")),
    ))
}
