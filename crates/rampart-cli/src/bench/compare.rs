//! `rampart bench --compare OTHER`: this build's daemon (A) against another build's (B),
//! measured by this build's client alternately, A B A B ..., in one sitting on one machine:
//! each figure's ratio B/A pair by pair, its median and its spread, next to the peers
//! (bwrap, unshare, runc) measured in every run, whose own ratios show how much the machine
//! drifted meanwhile.

use super::BenchArgs;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

/// The figures of one run's JSON (`rampart bench --json`), by name; lower is better unless
/// the name says per second.
fn figures(v: &Value) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for row in v["latency"].as_array().into_iter().flatten() {
        if let (Some(n), Some(p)) = (row["name"].as_str(), row["p50_ms"].as_f64()) {
            out.insert(format!("{n} (p50 ms)"), p);
        }
    }
    for row in v["e2b_sdk"].as_array().into_iter().flatten() {
        if let (Some(n), Some(p)) = (row["name"].as_str(), row["p50_ms"].as_f64()) {
            out.insert(format!("{n} (p50 ms)"), p);
        }
    }
    for (key, name) in [
        ("creates_per_second", "create+destroy per second"),
        ("bytes_per_idle_sandbox", "bytes per idle sandbox"),
        ("create_p50_ms_at_100_alive", "create p50 ms at 100 alive"),
        (
            "create_p50_ms_at_most_alive",
            "create p50 ms at the most alive",
        ),
    ] {
        if let Some(x) = v[key].as_f64() {
            out.insert(name.to_owned(), x);
        }
    }
    // A figure a run did not take (0, or not a number) has no ratio.
    out.retain(|_, x| x.is_finite() && *x > 0.0);
    out
}

/// One full run of this build's bench against `daemon` (a `rampart` binary), its JSON.
fn run_one(args: &BenchArgs, daemon: &Path, json_path: &Path) -> Result<Value> {
    let exe = std::env::current_exe()?;
    let status = Command::new(&exe)
        .arg("bench")
        .args(["--iterations", &args.iterations.to_string()])
        .args(["--idle", &args.idle.to_string()])
        .args(["--cycles", &args.cycles.to_string()])
        .args(["--concurrency", &args.concurrency.to_string()])
        .args(["--audit-execs", &args.audit_execs.to_string()])
        .args(["--verify-events", &args.verify_events.to_string()])
        .arg("--json")
        .arg(json_path)
        .env(super::BENCH_DAEMON_ENV, daemon)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .context("running the bench")?;
    if !status.success() {
        bail!("the bench against {} failed ({status})", daemon.display());
    }
    let text = std::fs::read(json_path)?;
    Ok(serde_json::from_slice(&text)?)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs the comparison (see the module's text).
pub(super) fn run(args: &BenchArgs, other: &Path) -> Result<()> {
    if !other.is_file() {
        bail!("--compare {}: no such file", other.display());
    }
    // A daemon starts the jailer and the agent beside its own binary (a build's target dir).
    for sibling in ["rampart-jailer", "rampart-agent"] {
        if !other.with_file_name(sibling).is_file() {
            bail!(
                "--compare {}: no {sibling} beside it; name the `rampart` of a build's target \
                 directory (e.g. other-checkout/target/release/rampart)",
                other.display()
            );
        }
    }
    let this = std::env::current_exe()?;
    let dir = std::env::temp_dir().join(format!("rampart-bench-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let pairs = args.pairs.max(1);
    let mut runs: Vec<(Value, Value)> = Vec::new();
    for i in 0..pairs {
        eprintln!(
            "bench --compare: pair {} of {pairs}: A (this build)...",
            i + 1
        );
        let a = run_one(args, &this, &dir.join(format!("a{i}.json")))?;
        eprintln!(
            "bench --compare: pair {} of {pairs}: B ({})...",
            i + 1,
            other.display()
        );
        let b = run_one(args, other, &dir.join(format!("b{i}.json")))?;
        runs.push((a, b));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut table: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (a, b) in &runs {
        let (fa, fb) = (figures(a), figures(b));
        for (name, x) in fa {
            if let Some(y) = fb.get(&name) {
                table.entry(name).or_default().push((x, *y));
            }
        }
    }
    println!(
        "\n## This build (A) against {} (B): {pairs} pairs, A B A B ...\n",
        other.display()
    );
    println!("| figure | A | B | B/A pair by pair | B/A median |");
    println!("|---|---|---|---|---:|");
    let mut rows = Vec::new();
    for (name, pairs) in &table {
        let fmt = |v: Vec<f64>| {
            v.iter()
                .map(|x| format!("{x:.3}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut ratios: Vec<f64> = pairs.iter().map(|(a, b)| b / a).collect();
        let shown = ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        let med = median(&mut ratios);
        println!(
            "| {name} | {} | {} | {shown} | {med:.2} |",
            fmt(pairs.iter().map(|p| p.0).collect()),
            fmt(pairs.iter().map(|p| p.1).collect()),
        );
        rows.push(json!({
            "figure": name,
            "a": pairs.iter().map(|p| p.0).collect::<Vec<_>>(),
            "b": pairs.iter().map(|p| p.1).collect::<Vec<_>>(),
            "ratio_b_over_a": pairs.iter().map(|(a, b)| b / a).collect::<Vec<_>>(),
            "median_ratio": med,
        }));
    }
    println!(
        "\nA peer's own B/A (bwrap, unshare, runc: the same program in both runs) is how far the \
         machine drifted between the runs of a pair; a figure whose ratios stay within that \
         spread cannot be told apart."
    );
    if let Some(path) = &args.json {
        let v = json!({
            "a": this.display().to_string(),
            "b": other.display().to_string(),
            "pairs": pairs,
            "figures": rows,
            "runs": runs.iter().map(|(a, b)| json!({"a": a, "b": b})).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_vec_pretty(&v)?)?;
    }
    Ok(())
}
