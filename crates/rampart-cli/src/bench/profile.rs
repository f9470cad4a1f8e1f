//! `rampart bench --profile`: where a cold create's time goes, step by step, as the daemon
//! itself measures it (`rampart_sandbox_create_step_seconds{step}` in `/metrics`), next to
//! the whole create and the create + first exec the client sees, on a private daemon.

use super::{start_private_daemon, wait_healthy, Api, BenchArgs, Samples};
use anyhow::Result;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The steps in the order a create takes them.
const STEPS: &[(&str, &str)] = &[
    (
        "plan",
        "plan: the request checked, limits, template, network, token",
    ),
    (
        "admit",
        "admit: disk admission (free space beside what is promised)",
    ),
    (
        "insert",
        "insert: one store transaction (capacity, uid slot, quotas, access)",
    ),
    (
        "launch",
        "launch: the tier (cgroup, disk, jailer, namespaces, mounts, agent exec)",
    ),
    (
        "health",
        "health: the agent's first answer (and the network wired meanwhile)",
    ),
    (
        "start",
        "start: the template's servers (none for base), digest",
    ),
    (
        "record",
        "record: `running` and the `created` event in one transaction",
    ),
];

/// `(sum, count)` of each series of `metric` in `/metrics`, by its label text.
fn sums(api: &Api, metric: &str) -> Result<BTreeMap<String, (f64, f64)>> {
    let text = api
        .client
        .get(format!("{}/metrics", api.url))
        .send()?
        .text()?;
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        for (suffix, is_sum) in [("_sum", true), ("_count", false)] {
            let Some(rest) = line.strip_prefix(&format!("{metric}{suffix}")) else {
                continue;
            };
            let (labels, value) = match rest.rsplit_once(' ') {
                Some((l, v)) => (l.to_owned(), v),
                None => continue,
            };
            let Ok(v) = value.trim().parse::<f64>() else {
                continue;
            };
            let e = out.entry(labels).or_default();
            if is_sum {
                e.0 = v;
            } else {
                e.1 = v;
            }
        }
    }
    Ok(out)
}

/// Mean ms of each series between two readings of [`sums`].
fn means(
    before: &BTreeMap<String, (f64, f64)>,
    after: &BTreeMap<String, (f64, f64)>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(k, (s, c))| {
            let (s0, c0) = before.get(k).copied().unwrap_or_default();
            let n = c - c0;
            (n > 0.0).then(|| (k.clone(), (s - s0) / n * 1000.0))
        })
        .collect()
}

/// Runs the measurement (see the module's text).
pub(super) fn run(args: &BenchArgs) -> Result<()> {
    let client = super::http_builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let (url, daemon) = start_private_daemon()?;
    wait_healthy(&client, &url)?;
    let api = Api { client, url };
    // Warm-up: the first create makes the cached disk image of its size.
    let id = api.create()?;
    api.exec_true(&id)?;
    api.destroy(&id)?;
    eprintln!(
        "bench: {} creates, each step as the daemon measures it...",
        args.iterations
    );
    let steps0 = sums(&api, "rampart_sandbox_create_step_seconds")?;
    let whole0 = sums(&api, "rampart_sandbox_create_seconds")?;
    let mut seen = Samples::new("create + first exec result, as the client sees it");
    let mut created = Samples::new("create alone, as the client sees it");
    let mut first = Samples::new("first exec alone, as the client sees it");
    for _ in 0..args.iterations {
        let t = Instant::now();
        let id = api.create()?;
        let c = t.elapsed();
        api.exec_true(&id)?;
        let all = t.elapsed();
        seen.push(all);
        created.push(c);
        first.push(all - c);
        api.destroy(&id)?;
    }
    let steps = means(&steps0, &sums(&api, "rampart_sandbox_create_step_seconds")?);
    let whole = means(&whole0, &sums(&api, "rampart_sandbox_create_seconds")?);
    drop(api);
    drop(daemon);
    println!(
        "\n## Where a create's time goes (mean ms), {} creates\n",
        args.iterations
    );
    println!("| step | mean ms |");
    println!("|---|---:|");
    let mut accounted = 0.0;
    for (key, what) in STEPS {
        if let Some(ms) = steps.get(&format!("{{step=\"{key}\"}}")) {
            accounted += ms;
            println!("| {what} | {ms:.3} |");
        }
    }
    let total = whole.values().next().copied().unwrap_or(f64::NAN);
    println!("| the whole create, in the daemon | {total:.3} |");
    println!(
        "| not in a step (locks, tasks, the claim check) | {:.3} |",
        total - accounted
    );
    for s in [&created, &first, &seen] {
        println!("| {} (p50) | {:.3} |", s.name, s.pct(50.0));
    }
    Ok(())
}
