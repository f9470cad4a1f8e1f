//! Where the CPU goes: CPU time read from `/proc` and the sandboxes' cgroups around a
//! measured loop, so that a latency the machine cannot shorten is told from work Rampart
//! does. Instruction-level profilers do not fit here (`perf` has no counters on this kind of
//! VM; valgrind has no `pidfd_open`, which the daemon needs), and CPU time is what a rate on
//! two cores is bounded by.

use std::time::Duration;

/// CPU time of one process, split the way `/proc/<pid>/stat` splits it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ProcCpu {
    /// User time of the process itself.
    pub user: Duration,
    /// System time of the process itself.
    pub sys: Duration,
    /// User + system time of its waited-for children (the jailers a daemon reaps).
    pub children: Duration,
}

fn ticks(t: u64) -> Duration {
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(t.saturating_mul(1_000_000_000) / hz)
}

/// `/proc/<pid>/stat`'s utime, stime, cutime + cstime.
pub(super) fn proc_cpu(pid: u32) -> Option<ProcCpu> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at the state, field 3.
    let rest = text.rsplit_once(')')?.1;
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // From ppid (field 4) on: utime (field 14) is index 10.
    let get = |i: usize| f.get(i).copied().unwrap_or(0);
    Some(ProcCpu {
        user: ticks(get(10)),
        sys: ticks(get(11)),
        children: ticks(get(12) + get(13)),
    })
}

/// Busy CPU time of the whole machine (every state but idle and iowait), from `/proc/stat`.
pub(super) fn machine_busy() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some(ticks(total.saturating_sub(idle)))
}

/// CPU time used so far by one sandbox's cgroup (its agent and every process it ran), on
/// cgroup v1 (`cpuacct`) or v2 (`cpu.stat`).
pub(super) fn sandbox_cpu(id: &str) -> Option<Duration> {
    let v1 = format!("/sys/fs/cgroup/cpuacct/rampart/{id}/cpuacct.usage");
    if let Ok(t) = std::fs::read_to_string(v1) {
        return t.trim().parse().ok().map(Duration::from_nanos);
    }
    let v2 = std::fs::read_to_string(format!("/sys/fs/cgroup/rampart/{id}/cpu.stat")).ok()?;
    v2.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|u| u.trim().parse().ok())
        .map(Duration::from_micros)
}

/// CPU time of this process's waited-for children (the commands it ran and waited for).
pub(super) fn own_children() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Milliseconds per operation.
pub(super) fn per_op_ms(d: Duration, ops: usize) -> f64 {
    d.as_secs_f64() * 1000.0 / ops.max(1) as f64
}
