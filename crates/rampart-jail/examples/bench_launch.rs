//! Measures launch and destroy latency of the namespace tier (root only):
//! `cargo run -p rampart-jail --example bench_launch -- [N] [POOL]` (POOL: warm jailers kept,
//! default 0; launches are paced so that the pool can refill). Uses `test_agent` as PID 1.
use rampart_jail::{template, Jail, JailConfig, LaunchSpec};
use rampart_types::{Limits, SandboxId};
use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let pool: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let base = PathBuf::from(format!(
        "/var/tmp/rampart-jail-bench-{}",
        std::process::id()
    ));
    let t = base.join("templates/base");
    template::build_base(&t).expect("template");
    let jail = Jail::new(JailConfig {
        state_dir: base.join("sandboxes"),
        jailer_bin: std::env::var_os("RAMPART_JAILER")
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.join("../rampart-jailer")),
        agent_bin: dir.join("test_agent"),
        cgroup_subtree: format!("rampart-bench-{}", std::process::id()),
    })
    .and_then(|j| j.with_pool(pool, Limits::default().disk_bytes))
    .expect("jail");
    // SAFETY: plain prctl; adopt the sandbox inits as the daemon does.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for i in 0..n {
        if let Some(p) = jail.pool() {
            p.wait_full(std::time::Duration::from_secs(10));
        }
        let spec = LaunchSpec {
            id: SandboxId::generate(),
            tier: rampart_types::Tier::Namespace,
            template_dir: t.clone(),
            uid_base: 3_000_000 + i as u32 * 65536,
            limits: Limits::default(),
            hostname: "bench".into(),
            env: vec![],
            layers: vec![],
            layers_on_base: false,
            build: None,
            agent_args: vec![],
            files: vec![],
        };
        let t0 = Instant::now();
        let l = jail.launch(&spec).expect("launch");
        up.push(t0.elapsed().as_secs_f64() * 1e3);
        let t1 = Instant::now();
        jail.destroy(&spec.id).expect("destroy");
        down.push(t1.elapsed().as_secs_f64() * 1e3);
        // SAFETY: reap the adopted init.
        unsafe { libc::waitpid(l.pid, std::ptr::null_mut(), 0) };
    }
    let p = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * q) as usize]
    };
    println!(
        "launch  p50 {:.2} ms  p99 {:.2} ms",
        p(&mut up, 0.5),
        p(&mut up, 0.99)
    );
    println!(
        "destroy p50 {:.2} ms  p99 {:.2} ms",
        p(&mut down, 0.5),
        p(&mut down, 0.99)
    );
    jail.close_pool();
    jail.settle();
    for d in jail.cgroup_dirs(&SandboxId::parse("x").unwrap_or_else(|_| SandboxId::generate())) {
        let _ = std::fs::remove_dir(d.parent().unwrap_or(&d));
    }
    let _ = std::fs::remove_dir_all(&base);
}
