//! Identity and privileges as seen from the host: capabilities, seccomp and no-new-privs
//! inside; unprivileged host uids, own namespaces and uid maps outside.

use super::*;

/// Capabilities a container's root may keep (Docker's default set without CAP_NET_RAW):
/// CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE,
/// SYS_CHROOT, MKNOD, AUDIT_WRITE, SETFCAP.
const ALLOWED_CAPS: [u32; 13] = [0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 27, 29, 31];

const CAP_NAMES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// Host pids of the processes whose cmdline contains `marker`.
fn host_pids_with_cmdline(marker: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&c)
                .replace('\0', " ")
                .contains(marker)
            {
                out.push(pid);
            }
        }
    }
    out
}

fn decode_caps(hex: &str) -> Vec<u32> {
    let v = u64::from_str_radix(hex.trim(), 16).unwrap_or(u64::MAX);
    (0..64).filter(|b| v & (1u64 << b) != 0).collect()
}

fn cap_names(caps: &[u32]) -> Vec<String> {
    caps.iter()
        .map(|c| {
            CAP_NAMES
                .get(*c as usize)
                .map(|n| n.to_string())
                .unwrap_or_else(|| format!("cap{c}"))
        })
        .collect()
}

#[test]
fn sandbox_blocks_host_privileges() {
    let Some(d) = daemon() else { return };
    let sb = sandbox(d);
    let marker = format!("600.{}", digits());
    let r = sb.bash("root", &format!("sleep {marker} >/dev/null 2>&1 </dev/null & id -u; grep -E '^(Cap|Seccomp|NoNewPrivs)' /proc/self/status"), 30);
    assert_eq!(
        r.stdout.lines().next(),
        Some("0"),
        "root inside is not uid 0:\n{}",
        show(&r)
    );
    let r2 = sb.bash(
        "user",
        "id -u; sudo -n id -u; sudo grep -E '^(Cap|Seccomp|NoNewPrivs)' /proc/self/status",
        30,
    );
    assert!(
        r2.stdout.starts_with("1000\n0\n"),
        "`user` is not uid 1000 or sudo does not give uid 0:\n{}",
        show(&r2)
    );

    for (who, out) in [("exec as root", &r.stdout), ("sudo", &r2.stdout)] {
        let field = |k: &str| {
            out.lines()
                .find_map(|l| {
                    l.strip_prefix(&format!("{k}:"))
                        .map(|v| v.trim().to_string())
                })
                .unwrap_or_else(|| panic!("no {k} line in /proc/self/status ({who}):\n{out}"))
        };
        let bnd = decode_caps(&field("CapBnd"));
        let eff = decode_caps(&field("CapEff"));
        let extra: Vec<u32> = bnd
            .iter()
            .copied()
            .filter(|c| !ALLOWED_CAPS.contains(c))
            .collect();
        eprintln!(
            "{who}: CapBnd {:?}; CapEff {:?}; Seccomp {}; NoNewPrivs {}",
            cap_names(&bnd),
            cap_names(&eff),
            field("Seccomp"),
            field("NoNewPrivs")
        );
        assert!(
            extra.is_empty(),
            "root's bounding set inside ({who}) holds {:?} beyond a container's default",
            cap_names(&extra)
        );
        for must_not in [12u32, 13, 16, 17, 19, 21, 22, 25] {
            assert!(
                !bnd.contains(&must_not),
                "the bounding set ({who}) holds CAP_{}",
                CAP_NAMES[must_not as usize]
            );
        }
        assert_eq!(
            field("Seccomp"),
            "2",
            "processes inside ({who}) run without a seccomp filter"
        );
    }

    // From the host: the sandbox's processes run as unprivileged host uids in their own
    // namespaces.
    let pids = wait_for(10, || {
        Some(host_pids_with_cmdline(&format!("sleep {marker}"))).filter(|p| !p.is_empty())
    })
    .unwrap_or_else(|| panic!("cannot find the sandbox's `sleep {marker}` among host processes"));
    let mut chain = vec![pids[0]];
    // Walk up to the sandbox's PID 1 (NSpid ends in 1).
    loop {
        let p = *chain.last().expect("chain");
        let nspid = status_field(p, "NSpid").unwrap_or_default();
        if nspid.split_whitespace().last() == Some("1") || chain.len() > 10 {
            break;
        }
        let Some(pp) = status_field(p, "PPid").and_then(|v| v.parse::<i32>().ok()) else {
            break;
        };
        chain.push(pp);
    }
    for p in &chain {
        let uid = status_field(*p, "Uid").unwrap_or_default();
        let gid = status_field(*p, "Gid").unwrap_or_default();
        let nspid = status_field(*p, "NSpid").unwrap_or_default();
        let cmd = std::fs::read(format!("/proc/{p}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .unwrap_or_default();
        eprintln!("host pid {p} ({cmd}): Uid {uid}; Gid {gid}; NSpid {nspid}");
        for (what, ids) in [("Uid", &uid), ("Gid", &gid)] {
            for id in ids.split_whitespace() {
                let n: u64 = id.parse().unwrap_or(0);
                assert!(n >= 65536, "host pid {p} ({cmd}) runs with host {what} {n}: root inside must be an unprivileged uid outside");
            }
        }
        assert!(
            nspid.split_whitespace().count() >= 2,
            "host pid {p} ({cmd}) is not in a child pid namespace: NSpid {nspid}"
        );
        for ns in ["user", "pid", "mnt", "net", "ipc", "uts", "cgroup"] {
            let theirs = std::fs::read_link(format!("/proc/{p}/ns/{ns}")).ok();
            let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).ok();
            assert!(
                theirs.is_some() && theirs != ours,
                "host pid {p} ({cmd}) shares the host's {ns} namespace ({theirs:?})"
            );
        }
        let map = std::fs::read_to_string(format!("/proc/{p}/uid_map")).unwrap_or_default();
        for line in map.lines() {
            let f: Vec<u64> = line
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            assert!(
                f.len() == 3 && f[1] >= 65536,
                "host pid {p}'s uid_map maps to a privileged host range: {map}"
            );
        }
    }
    assert!(
        status_field(*chain.last().expect("chain"), "NSpid")
            .unwrap_or_default()
            .split_whitespace()
            .last()
            == Some("1"),
        "did not reach the sandbox's PID 1 from its `sleep` (chain {chain:?})"
    );
    assert_host_healthy(d);
}
