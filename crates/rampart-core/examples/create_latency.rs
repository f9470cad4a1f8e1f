//! Measures create -> first exec result -> destroy through the manager (no HTTP).
//!
//! `cargo run --release -p rampart-core --example create_latency -- [N]` (root; needs
//! `rampart-jailer` and `rampart-agent` built in the same profile).

use futures::StreamExt;
use rampart_core::{CoreConfig, Manager};
use rampart_types::{CreateSandbox, ExecEvent, ExecRequest};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50);
    let exe = std::env::current_exe().expect("current exe");
    let bin_dir = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .to_path_buf();
    let dir = PathBuf::from(format!(
        "/var/tmp/rampart-create-latency-{}",
        std::process::id()
    ));
    let mut cfg = CoreConfig::with_defaults(
        dir.clone(),
        bin_dir.join("rampart-jailer"),
        bin_dir.join("rampart-agent"),
    );
    cfg.uid_range_start = 1_900_000_000;
    cfg.uid_slots = 16;
    let subtree = format!("rampart-latency-{}", std::process::id());
    let m = Manager::start_with_cgroup_subtree(cfg, &subtree)
        .await
        .expect("start");
    let (mut create, mut first, mut total, mut destroy, mut warm) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t0 = Instant::now();
        let s = m
            .create(&node(), CreateSandbox::default())
            .await
            .expect("create");
        let t1 = Instant::now();
        let run = |cmd: &str| ExecRequest {
            cmd: vec![cmd.to_owned()],
            ..Default::default()
        };
        let mut e = m
            .sandbox(&node(), &s.id)
            .unwrap()
            .exec(run("true"), false)
            .await
            .expect("exec");
        while let Some(ev) = e.events.next().await {
            if let ExecEvent::Exit { exit_code, .. } = ev {
                assert_eq!(exit_code, Some(0));
            }
        }
        let t2 = Instant::now();
        let t3 = Instant::now();
        let mut e = m
            .sandbox(&node(), &s.id)
            .unwrap()
            .exec(run("true"), false)
            .await
            .expect("exec");
        while e.events.next().await.is_some() {}
        warm.push(t3.elapsed());
        let t4 = Instant::now();
        m.sandbox(&node(), &s.id)
            .unwrap()
            .destroy()
            .await
            .expect("destroy");
        destroy.push(t4.elapsed());
        create.push(t1 - t0);
        first.push(t2 - t1);
        total.push(t2 - t0 + t4.elapsed());
    }
    for (name, v) in [
        ("create", &mut create),
        ("first exec", &mut first),
        ("warm exec", &mut warm),
        ("destroy", &mut destroy),
        ("create+first exec+destroy", &mut total),
    ] {
        println!(
            "{name:>26}: p50 {:>8.2?}  p99 {:>8.2?}",
            pct(v, 0.5),
            pct(v, 0.99)
        );
    }
    m.shutdown().await;
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
    if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
        for c in rd.flatten() {
            let _ = std::fs::remove_dir(c.path().join(&subtree));
        }
    }
}

/// The node, as the daemon acts for its administrator.
fn node() -> rampart_core::Principal {
    rampart_core::Principal::node("test")
}
