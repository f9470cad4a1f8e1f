//! Resource exhaustion: fork bomb, memory bomb, disk and tmpfs fills, output floods, CPU
//! spin; each stays within the sandbox's limits and leaves the host and other sandboxes fine.

use super::*;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Resident memory of a process in bytes.
fn rss_bytes(pid: i32, field: &str) -> u64 {
    status_field(pid, field)
        .and_then(|v| {
            v.split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Bytes available to root on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let out = Command::new("df")
        .arg("-B1")
        .arg("--output=avail")
        .arg(dir)
        .output()
        .expect("run df");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("cannot parse df output: {:?}", out))
}

/// Bytes allocated under `dir` on its own filesystem (mounts under it are not crossed).
fn allocated_bytes(dir: &Path) -> u64 {
    let out = Command::new("du")
        .arg("-x")
        .arg("-s")
        .arg("-B1")
        .arg(dir)
        .output()
        .expect("run du");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot parse du output: {:?}", out))
}

/// The cgroup directory of a sandbox for a v1 controller, or the v2 directory.
fn cgroup_dir(controller: &str, id: &str) -> Option<PathBuf> {
    let cands = [
        PathBuf::from(format!("/sys/fs/cgroup/{controller}/rampart/{id}")),
        PathBuf::from(format!("/sys/fs/cgroup/unified/rampart/{id}")),
        PathBuf::from(format!("/sys/fs/cgroup/rampart/{id}")),
    ];
    cands.into_iter().find(|p| p.is_dir())
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// CPU time used by the sandbox's cgroup, nanoseconds.
fn cg_cpu_ns(id: &str) -> Option<u64> {
    let d = cgroup_dir("cpuacct", id)?;
    if let Some(v) = read_u64(&d.join("cpuacct.usage")) {
        return Some(v);
    }
    let stat = std::fs::read_to_string(d.join("cpu.stat")).ok()?;
    stat.lines()
        .find_map(|l| {
            l.strip_prefix("usage_usec ")
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .map(|us| us * 1000)
}

#[test]
fn sandbox_blocks_fork_bomb() {
    let Some(d) = daemon() else { return };
    let limit = 64u64;
    let sb = sandbox_with(
        d,
        LimitsRequest {
            pids: Some(limit),
            cpus: Some(0.5),
            ..Default::default()
        },
    );
    let cg = cgroup_dir("pids", &sb.id);
    if cg.is_none() {
        eprintln!("note: no pids cgroup found for {} (looked under /sys/fs/cgroup/pids/rampart and the v2 tree); the host-side count is skipped", sb.id);
    }
    // Detached from the exec's stdout so the exec returns while the bomb runs.
    let r = sb.bash(
        "user",
        "bomb() { bomb | bomb & }; bomb >/dev/null 2>&1 </dev/null & echo started",
        30,
    );
    eprintln!("fork bomb exec: {}", show(&r));
    let mut max_seen = 0u64;
    let mut hit_limit = false;
    if let Some(cg) = &cg {
        // Watch until the limit has been hit (pids.events counts refused forks), with a deadline.
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            max_seen = max_seen.max(read_u64(&cg.join("pids.current")).unwrap_or(0));
            let events = std::fs::read_to_string(cg.join("pids.events")).unwrap_or_default();
            let refused: u64 = events
                .split_whitespace()
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if refused > 0 {
                hit_limit = true;
                // A few more samples while the bomb pushes against the limit.
                for _ in 0..20 {
                    max_seen = max_seen.max(read_u64(&cg.join("pids.current")).unwrap_or(0));
                    std::thread::sleep(Duration::from_millis(10));
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!(
            "fork bomb: max pids.current seen {max_seen} (limit {limit}), limit hit: {hit_limit}"
        );
        assert!(
            max_seen <= limit,
            "the sandbox ran {max_seen} processes, above its pids limit {limit}"
        );
        assert!(
            hit_limit,
            "the fork bomb never hit the pids limit in 20 s (max seen {max_seen}); did it run?\n{}",
            show(&r)
        );
    }
    // While the bomb is still going: the host and other sandboxes are fine.
    assert_host_healthy(d);
    // Asserts the destroy succeeded (the message shows the answer and the daemon's log).
    sb.destroy();
    if let Some(cg) = &cg {
        let gone = wait_for(30, || (!cg.exists()).then_some(()));
        assert!(
            gone.is_some(),
            "the cgroup {} still exists after destroy",
            cg.display()
        );
    }
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_memory_bomb() {
    let Some(d) = daemon() else { return };
    let sb = sandbox_with(
        d,
        LimitsRequest {
            memory_bytes: Some(64 * MIB),
            ..Default::default()
        },
    );
    let r = sb.run(&ExecRequest {
        cmd: vec![
            "python3".into(),
            "-c".into(),
            "b = b'x' * (512 << 20); print('allocated', len(b))".into(),
        ],
        timeout_secs: Some(120),
        ..Default::default()
    });
    assert!(
        !r.stdout.contains("allocated"),
        "512 MiB was allocated under a 64 MiB limit:\n{}",
        show(&r)
    );
    assert!(
        !r.timed_out,
        "the memory bomb was not stopped before the exec timeout (swapping?):\n{}",
        show(&r)
    );
    assert!(
        r.signal == Some(9) || r.exit_code == Some(137),
        "the memory bomb was not OOM-killed (signal 9 / exit 137):\n{}",
        show(&r)
    );
    if let Some(cg) = cgroup_dir("memory", &sb.id) {
        let peak = read_u64(&cg.join("memory.max_usage_in_bytes"))
            .or_else(|| read_u64(&cg.join("memory.peak")));
        let oom = std::fs::read_to_string(cg.join("memory.oom_control"))
            .or_else(|_| std::fs::read_to_string(cg.join("memory.events")));
        eprintln!(
            "memory bomb: cgroup peak {peak:?}; {}",
            oom.unwrap_or_default().replace('\n', ", ")
        );
        if let Some(p) = peak {
            assert!(
                p <= 64 * MIB + MIB,
                "the sandbox's memory peaked at {p} bytes, above its 64 MiB limit"
            );
        }
    }
    let after = sb.bash("user", "echo alive", 30);
    eprintln!("the same sandbox after the OOM kill: {}", show(&after));
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_disk_fill() {
    let Some(d) = daemon() else { return };
    let quota = 64 * MIB;
    let sb = sandbox_with(
        d,
        LimitsRequest {
            disk_bytes: Some(quota),
            ..Default::default()
        },
    );
    let free_before = free_bytes(&d.data_dir);
    let alloc_before = allocated_bytes(&d.data_dir);
    let r = sb.bash("user", "dd if=/dev/zero of=/home/user/fill bs=1M count=200 2>&1; echo \"dd=$?\"; sync; stat -c 'size=%s' /home/user/fill", 120);
    let free_after = free_bytes(&d.data_dir);
    let alloc_after = allocated_bytes(&d.data_dir);
    assert!(
        !r.stdout.contains("dd=0"),
        "dd of 200 MiB succeeded under a 64 MiB disk:\n{}",
        show(&r)
    );
    assert!(
        r.stdout.contains("No space left on device"),
        "dd did not fail with ENOSPC:\n{}",
        show(&r)
    );
    let size: u64 = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("size=").and_then(|n| n.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no size line:\n{}", show(&r)));
    assert!(
        size <= quota,
        "the file inside grew to {size} bytes, past the {quota} byte disk"
    );
    let freed = free_before.saturating_sub(free_after);
    let grown = alloc_after.saturating_sub(alloc_before);
    eprintln!(
        "disk fill: file inside {} MiB; host free {} -> {} MiB (-{} MiB); data dir allocation +{} MiB",
        size / MIB,
        free_before / MIB,
        free_after / MIB,
        freed / MIB,
        grown / MIB
    );
    assert!(
        grown <= quota + 48 * MIB,
        "the daemon's data dir grew by {grown} bytes for a {quota} byte disk"
    );
    // Other work shares this disk (builds, other tests): allow the quota plus a margin.
    assert!(
        freed <= quota + 128 * MIB,
        "the host lost {freed} bytes of free disk for a {quota} byte sandbox disk"
    );

    // The file API cannot write past the quota either.
    let put = sb.files("PUT", "", "/home/user/fill2", Body::Zeros(100 * MIB));
    assert!(
        !put.ok(),
        "a 100 MiB PUT succeeded on a full 64 MiB disk: {} {}",
        put.status,
        put.text()
    );
    eprintln!("PUT on a full disk: {} {}", put.status, put.text());
    // The sandbox recovers once the file is gone.
    let r = sb.bash("user", "rm -f /home/user/fill /home/user/fill2 && echo ok > /home/user/after && cat /home/user/after", 60);
    assert_eq!(
        r.stdout,
        "ok\n",
        "the sandbox did not recover after removing the fill:\n{}",
        show(&r)
    );
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_tmpfs_fill() {
    let Some(d) = daemon() else { return };
    let sb = sandbox_with(
        d,
        LimitsRequest {
            memory_bytes: Some(128 * MIB),
            ..Default::default()
        },
    );
    // Every writable memory-backed mount inside (tmpfs, ramfs), as root.
    let script = r#"
awk '($3 == "tmpfs" || $3 == "ramfs") && $4 ~ /(^|,)rw(,|$)/ {print $2}' /proc/self/mounts | sort -u > /tmp/memfs
echo "memfs: $(tr '\n' ' ' < /tmp/memfs)"
while read -r m; do
  case "$m" in /proc*|/sys*) continue;; esac
  [ -d "$m" ] || continue
  dd if=/dev/zero of="$m/rampart-fill" bs=1M count=400 2>&1 | tail -1
  echo "fill $m=${PIPESTATUS[0]}"
  rm -f "$m/rampart-fill"
done < /tmp/memfs
echo end
"#;
    let r = sb.bash("root", script, 120);
    eprintln!("tmpfs fill:\n{}", show(&r));
    assert!(
        r.stdout.contains("end") || r.signal.is_some(),
        "the tmpfs probe did not finish:\n{}",
        show(&r)
    );
    let filled: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("fill ") && l.ends_with("=0"))
        .collect();
    assert!(
        filled.is_empty(),
        "400 MiB was written to memory-backed mounts {filled:?} under a 128 MiB memory limit:\n{}",
        show(&r)
    );
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_output_flood() {
    let Some(d) = daemon() else { return };
    let sb = sandbox(d);
    let cap = MIB;
    let rss_before = rss_bytes(d.pid, "VmRSS");
    let r = sb.run(&ExecRequest {
        cmd: vec![
            "bash".into(),
            "-c".into(),
            // 64x the cap on each stream: a daemon that buffered it would grow by 128 MiB, past
            // the 100 MiB allowed below (and it drains in seconds even on a loaded machine).
            "yes | head -c 64M; yes e | head -c 64M >&2; echo done >&2".into(),
        ],
        timeout_secs: Some(120),
        max_output_bytes: Some(cap),
        ..Default::default()
    });
    let rss_after = rss_bytes(d.pid, "VmRSS");
    eprintln!(
        "output flood: stdout {} bytes (truncated {}), stderr {} bytes (truncated {}), {} ms, exit {:?}; daemon VmRSS {} -> {} MiB, VmHWM {} MiB",
        r.stdout.len(),
        r.stdout_truncated,
        r.stderr.len(),
        r.stderr_truncated,
        r.duration_ms,
        r.exit_code,
        rss_before / MIB,
        rss_after / MIB,
        rss_bytes(d.pid, "VmHWM") / MIB
    );
    assert!(
        r.stdout.len() as u64 <= cap,
        "stdout of {} bytes exceeds the {cap} byte cap",
        r.stdout.len()
    );
    assert!(
        r.stderr.len() as u64 <= cap,
        "stderr of {} bytes exceeds the {cap} byte cap",
        r.stderr.len()
    );
    assert!(
        r.stdout_truncated && r.stderr_truncated,
        "the flood was not reported as truncated: {}",
        show(&r)
    );
    assert!(
        r.stdout.len() as u64 >= cap / 2,
        "stdout holds only {} bytes, expected about the cap",
        r.stdout.len()
    );
    assert!(
        r.stdout.starts_with("y\ny\n"),
        "stdout does not hold the command's output"
    );
    assert!(
        rss_after <= rss_before + 100 * MIB,
        "the daemon's RSS grew from {} to {} MiB during a 128 MiB output flood",
        rss_before / MIB,
        rss_after / MIB
    );

    // A streamed exec whose client stops reading: the daemon must not buffer the flood.
    let req = ExecRequest {
        cmd: vec!["cat".into(), "/dev/zero".into()],
        timeout_secs: Some(30),
        stream: true,
        ..Default::default()
    };
    let body = serde_json::to_vec(&req).expect("json");
    let mut s = TcpStream::connect(&d.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let head = format!(
        "POST /v1/sandboxes/{}/exec HTTP/1.1\r\nHost: {}\r\n{}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        sb.id,
        d.addr,
        support::auth_header(),
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(&body))
        .expect("send streamed exec");
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let mut first = Vec::new();
    while got < 4 * MIB as usize {
        let n = s.read(&mut buf).expect("read stream");
        if n == 0 {
            break;
        }
        if first.len() < 512 {
            first.extend_from_slice(&buf[..n.min(512)]);
        }
        got += n;
    }
    assert!(
        got >= 4 * MIB as usize,
        "the stream ended after {got} bytes: {}",
        String::from_utf8_lossy(&first)
    );
    let base = rss_bytes(d.pid, "VmRSS");
    let mut peak = base;
    // Stop reading for a while: sample the daemon's memory meanwhile (a measurement window).
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(100));
        peak = peak.max(rss_bytes(d.pid, "VmRSS"));
    }
    drop(s);
    eprintln!(
        "stalled stream reader: daemon VmRSS {} MiB at the stall, peak {} MiB over 4 s",
        base / MIB,
        peak / MIB
    );
    assert!(
        peak <= base + 100 * MIB,
        "the daemon's RSS grew from {} to {} MiB while a stream client stopped reading an endless output",
        base / MIB,
        peak / MIB
    );
    let r = sb.bash("user", "echo alive", 30);
    assert_eq!(
        r.stdout,
        "alive\n",
        "the sandbox is unusable after the flood:\n{}",
        show(&r)
    );
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_cpu_spin() {
    let Some(d) = daemon() else { return };
    let a = sandbox_with(
        d,
        LimitsRequest {
            cpus: Some(0.5),
            ..Default::default()
        },
    );
    let b = sandbox(d);
    let spin =
        "for i in 1 2 3 4; do timeout 15 sh -c 'while :; do :; done' & done; wait; echo spun";
    std::thread::scope(|scope| {
        let ar = &a;
        let spinner = scope.spawn(move || ar.bash("user", spin, 60));
        let usage0 = cg_cpu_ns(&a.id);
        if usage0.is_none() {
            eprintln!(
                "note: no cpuacct.usage or cpu.stat for {}; the CPU cap sub-check is skipped",
                a.id
            );
        }
        // Wait until the spinners are burning CPU.
        if let Some(u0) = usage0 {
            let busy = wait_for(30, || cg_cpu_ns(&a.id).filter(|u| *u > u0 + 100_000_000));
            assert!(busy.is_some(), "the spinners in sandbox A never used CPU");
        }
        let t0 = Instant::now();
        let u_start = cg_cpu_ns(&a.id);
        let mut lat = Vec::new();
        for i in 0..20 {
            let t = Instant::now();
            let r = b.bash("user", "true", 30);
            lat.push(t.elapsed());
            assert_eq!(
                r.exit_code,
                Some(0),
                "exec {i} in sandbox B failed while A spins:\n{}",
                show(&r)
            );
        }
        // Make the measurement window at least 2 s.
        while t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let window = t0.elapsed();
        let u_end = cg_cpu_ns(&a.id);
        lat.sort();
        eprintln!(
            "cpu spin: sandbox B exec latency p50 {:?}, max {:?} (not asserted)",
            lat[lat.len() / 2],
            lat[lat.len() - 1]
        );
        if let (Some(u0), Some(u1)) = (u_start, u_end) {
            let cpus = (u1 - u0) as f64 / window.as_nanos() as f64;
            eprintln!("cpu spin: sandbox A used {cpus:.3} cpus over {window:?} (limit 0.5)");
            assert!(
                cpus <= 0.75,
                "sandbox A used {cpus:.3} cpus with a 0.5 cpu limit (4 spinners)"
            );
        }
        let r = spinner.join().expect("spinner thread");
        assert!(
            r.stdout.contains("spun"),
            "the spinner exec did not finish normally:\n{}",
            show(&r)
        );
    });
    assert_host_healthy(d);
}
