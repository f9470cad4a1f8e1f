//! The sandbox's seccomp filter: a policy (plain data) compiled by a pure function into a
//! classic BPF program, tested here by running the program in a small BPF interpreter.
//!
//! The policy is an **allowlist** (default deny), at least as strict as Docker's default
//! profile (moby `profiles/seccomp/default.json`) for a container with the capabilities a
//! sandbox keeps ([`crate::jailer::KEPT_CAPS`]):
//!
//! - every system call the policy does not name answers `ENOSYS`, so a program built for a
//!   newer kernel falls back as it would on an older one, and a new kernel never widens the
//!   surface by itself;
//! - system calls named as dangerous (mount, modules, bpf, keyrings, namespaces, cross-process
//!   memory and descriptor access, NUMA page moves, io_uring, mount introspection, ...) answer
//!   `EPERM`, as Docker's profile does;
//! - a few are allowed only with safe arguments: `clone` without namespace flags, `unshare`
//!   without namespace flags, `socket` of any family but `AF_VSOCK` (which reaches the
//!   hypervisor past every network namespace), `personality` with the values Docker allows,
//!   and `ioctl` except `TIOCSTI` and `TIOCLINUX` (which push input into a terminal).
//!
//! The filter never kills. Syscalls of a foreign architecture (including the x32 ABI on
//! x86_64) fail with `EPERM`, so a filter written for one ABI cannot be bypassed through
//! another.
//!
//! `ptrace` (and `process_vm_readv`/`writev`, as Docker allows on kernels >= 4.8) is allowed:
//! the sandbox has its own pid namespace, so only its own processes can be traced (debuggers
//! and `strace` work); host processes are not even visible.
//!
//! The program dispatches on the syscall number with a binary search (so any syscall costs
//! about log2(N) comparisons), and allowed syscalls without argument checks return `ALLOW`
//! without reading an argument, so the kernel's per-syscall action cache skips the filter for
//! them entirely.

use crate::JailError;
use std::collections::BTreeMap;

/// What the filter does with a matching syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Let it run.
    Allow,
    /// Fail it with this errno.
    Errno(u16),
}

impl Action {
    fn ret(self) -> u32 {
        match self {
            Action::Allow => libc::SECCOMP_RET_ALLOW,
            Action::Errno(e) => libc::SECCOMP_RET_ERRNO | u32::from(e),
        }
    }
}

/// When a rule applies, besides the syscall number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cond {
    /// Always.
    Always,
    /// The low 32 bits of argument `arg` have any bit of `mask` set.
    AnyBit {
        /// Argument index (0-5).
        arg: u8,
        /// Bits tested.
        mask: u32,
    },
    /// The low 32 bits of argument `arg` are one of `values`.
    In {
        /// Argument index (0-5).
        arg: u8,
        /// Matching values.
        values: Vec<u32>,
    },
    /// The low 32 bits of argument `arg` are none of `values`.
    NotIn {
        /// Argument index (0-5).
        arg: u8,
        /// Allowed values.
        values: Vec<u32>,
    },
}

/// One rule of a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Syscall name (for reports and tests).
    pub name: &'static str,
    /// Syscall number on the native architecture.
    pub nr: i64,
    /// When it applies.
    pub cond: Cond,
    /// What happens then.
    pub action: Action,
}

/// A seccomp policy: the rules of a syscall are checked in order and the first that matches
/// decides; a syscall none of whose rules matches (or that has none) gets `default`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The rules.
    pub rules: Vec<Rule>,
    /// Action for syscalls that match no rule.
    pub default: Action,
    /// Action for syscalls made through a foreign architecture or ABI.
    pub foreign_arch: Action,
}

/// All namespace-creating clone/unshare flags.
pub const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | 0x80/* CLONE_NEWTIME */) as u32;

/// `AF_VSOCK`: sockets to the hypervisor.
pub const AF_VSOCK: u32 = 40;
/// `TIOCSTI`: push a byte into a terminal's input queue.
pub const TIOCSTI: u32 = 0x5412;
/// `TIOCLINUX`: virtual console requests (one of which pastes the selection as input).
pub const TIOCLINUX: u32 = 0x541C;

/// A syscall of the policy's table: its name as `libc` spells it (for reports and tests) and
/// its number on the build target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Syscall {
    /// Name, e.g. `SYS_mount`.
    pub name: &'static str,
    /// Number on the native architecture.
    pub nr: i64,
}

/// `syscalls![SYS_a, SYS_b]`: the [`Syscall`]s `libc` names so, as a `const` slice.
macro_rules! syscalls {
    ($($name:ident),+ $(,)?) => {
        &[$(Syscall {
            name: stringify!($name),
            nr: libc::$name as i64,
        }),+]
    };
}

/// [`Cond`] as a table holds it (`const`: its value lists are static slices).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// [`Cond::Always`].
    Always,
    /// [`Cond::AnyBit`].
    AnyBit {
        /// Argument index (0-5).
        arg: u8,
        /// Bits tested.
        mask: u32,
    },
    /// [`Cond::In`].
    In {
        /// Argument index (0-5).
        arg: u8,
        /// Matching values.
        values: &'static [u32],
    },
    /// [`Cond::NotIn`].
    NotIn {
        /// Argument index (0-5).
        arg: u8,
        /// Allowed values.
        values: &'static [u32],
    },
}

impl When {
    fn cond(self) -> Cond {
        match self {
            When::Always => Cond::Always,
            When::AnyBit { arg, mask } => Cond::AnyBit { arg, mask },
            When::In { arg, values } => Cond::In {
                arg,
                values: values.to_vec(),
            },
            When::NotIn { arg, values } => Cond::NotIn {
                arg,
                values: values.to_vec(),
            },
        }
    }
}

/// Lines of a policy's table: each of `syscalls`, when `when` holds, gets `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// The syscalls, in order.
    pub syscalls: &'static [Syscall],
    /// When the rule applies.
    pub when: When,
    /// What happens then.
    pub action: Action,
}

impl Group {
    /// Each of `syscalls`, always, gets `action`.
    const fn each(syscalls: &'static [Syscall], action: Action) -> Group {
        Group {
            syscalls,
            when: When::Always,
            action,
        }
    }
    /// One syscall, when `when` holds, gets `action`.
    const fn one(syscall: &'static [Syscall; 1], when: When, action: Action) -> Group {
        Group {
            syscalls: syscall,
            when,
            action,
        }
    }
}

/// The rules a table stands for: one [`Rule`] per syscall of each group, in table order (a
/// pure function: the table is all it reads).
pub fn rules_of(table: &[Group]) -> Vec<Rule> {
    table
        .iter()
        .flat_map(|g| {
            g.syscalls.iter().map(move |s| Rule {
                name: s.name,
                nr: s.nr,
                cond: g.when.cond(),
                action: g.action,
            })
        })
        .collect()
}

/// Syscall numbers this `libc` does not name yet (the same on every architecture since the
/// tables were unified at 424).
mod nr {
    pub const FCHMODAT2: i64 = 452;
    pub const MAP_SHADOW_STACK: i64 = 453;
    pub const FUTEX_WAKE: i64 = 454;
    pub const FUTEX_WAIT: i64 = 455;
    pub const FUTEX_REQUEUE: i64 = 456;
    pub const STATMOUNT: i64 = 457;
    pub const LISTMOUNT: i64 = 458;
    pub const LSM_SET_SELF_ATTR: i64 = 460;
    pub const OPEN_TREE_ATTR: i64 = 467;
}

const ALLOW: Action = Action::Allow;
const EPERM: Action = Action::Errno(libc::EPERM as u16);
const ENOSYS: Action = Action::Errno(libc::ENOSYS as u16);

/// Refused outright, as Docker's profile refuses them for a container without
/// CAP_SYS_ADMIN, CAP_SYS_MODULE, CAP_SYS_PTRACE, CAP_SYS_NICE, CAP_SYS_TIME, ...: the
/// mount API, modules, kexec, bpf, perf, keyrings, namespaces (setns), cross-process
/// descriptor and memory access (kcmp, pidfd_getfd, process_madvise), NUMA page moves,
/// handles, io_uring (Docker allows it; its history of kernel bugs is why we do not),
/// the clock, swap, quotas, the host and domain name.
const REFUSED: &[Syscall] = syscalls![
    SYS_mount,
    SYS_umount2,
    SYS_pivot_root,
    SYS_kexec_load,
    SYS_kexec_file_load,
    SYS_init_module,
    SYS_finit_module,
    SYS_delete_module,
    SYS_bpf,
    SYS_perf_event_open,
    SYS_keyctl,
    SYS_add_key,
    SYS_request_key,
    SYS_userfaultfd,
    SYS_open_by_handle_at,
    SYS_name_to_handle_at,
    SYS_acct,
    SYS_swapon,
    SYS_swapoff,
    SYS_reboot,
    SYS_settimeofday,
    SYS_clock_settime,
    SYS_clock_adjtime,
    SYS_adjtimex,
    SYS_quotactl,
    SYS_quotactl_fd,
    SYS_syslog,
    SYS_vhangup,
    SYS_setns,
    SYS_fsopen,
    SYS_fsmount,
    SYS_fsconfig,
    SYS_fspick,
    SYS_move_mount,
    SYS_open_tree,
    SYS_mount_setattr,
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
    SYS_nfsservctl,
    SYS_kcmp,
    SYS_pidfd_getfd,
    SYS_process_madvise,
    SYS_migrate_pages,
    SYS_move_pages,
    SYS_mbind,
    SYS_get_mempolicy,
    SYS_set_mempolicy,
    SYS_set_mempolicy_home_node,
    SYS_sethostname,
    SYS_setdomainname,
    SYS_fanotify_init,
];

/// Refused outright, on x86_64 only (the calls do not exist elsewhere).
#[cfg(target_arch = "x86_64")]
const REFUSED_ARCH: &[Syscall] = syscalls![
    SYS_iopl,
    SYS_ioperm,
    SYS_uselib,
    SYS__sysctl,
    SYS_lookup_dcookie,
];
/// Refused outright, on x86_64 only (the calls do not exist elsewhere).
#[cfg(not(target_arch = "x86_64"))]
const REFUSED_ARCH: &[Syscall] = &[];

/// Refused outright: mount introspection and LSM attributes, by number (see [`nr`]).
const REFUSED_BY_NUMBER: &[Syscall] = &[
    Syscall {
        name: "mount introspection / lsm",
        nr: nr::STATMOUNT,
    },
    Syscall {
        name: "mount introspection / lsm",
        nr: nr::LISTMOUNT,
    },
    Syscall {
        name: "mount introspection / lsm",
        nr: nr::OPEN_TREE_ATTR,
    },
    Syscall {
        name: "mount introspection / lsm",
        nr: nr::LSM_SET_SELF_ATTR,
    },
];

/// Allowed: Docker's default list for the native ABI, less what is refused above.
const ALLOWED: &[Syscall] = syscalls![
    SYS_accept,
    SYS_accept4,
    SYS_bind,
    SYS_brk,
    SYS_capget,
    SYS_capset,
    SYS_chdir,
    SYS_chroot,
    SYS_clock_getres,
    SYS_clock_gettime,
    SYS_clock_nanosleep,
    SYS_close,
    SYS_close_range,
    SYS_connect,
    SYS_copy_file_range,
    SYS_dup,
    SYS_dup3,
    SYS_epoll_create1,
    SYS_epoll_ctl,
    SYS_epoll_pwait,
    SYS_epoll_pwait2,
    SYS_eventfd2,
    SYS_execve,
    SYS_execveat,
    SYS_exit,
    SYS_exit_group,
    SYS_faccessat,
    SYS_faccessat2,
    SYS_fadvise64,
    SYS_fallocate,
    SYS_fanotify_mark,
    SYS_fchdir,
    SYS_fchmod,
    SYS_fchmodat,
    SYS_fchown,
    SYS_fchownat,
    SYS_fcntl,
    SYS_fdatasync,
    SYS_fgetxattr,
    SYS_flistxattr,
    SYS_flock,
    SYS_fremovexattr,
    SYS_fsetxattr,
    SYS_fstat,
    SYS_fstatfs,
    SYS_fsync,
    SYS_ftruncate,
    SYS_futex,
    SYS_futex_waitv,
    SYS_getcpu,
    SYS_getcwd,
    SYS_getdents64,
    SYS_getegid,
    SYS_geteuid,
    SYS_getgid,
    SYS_getgroups,
    SYS_getitimer,
    SYS_getpeername,
    SYS_getpgid,
    SYS_getpid,
    SYS_getppid,
    SYS_getpriority,
    SYS_getrandom,
    SYS_getresgid,
    SYS_getresuid,
    SYS_get_robust_list,
    SYS_getrusage,
    SYS_getsid,
    SYS_getsockname,
    SYS_getsockopt,
    SYS_gettid,
    SYS_gettimeofday,
    SYS_getuid,
    SYS_getxattr,
    SYS_inotify_add_watch,
    SYS_inotify_init1,
    SYS_inotify_rm_watch,
    SYS_io_cancel,
    SYS_io_destroy,
    SYS_io_getevents,
    SYS_ioprio_get,
    SYS_ioprio_set,
    SYS_io_setup,
    SYS_io_submit,
    SYS_kill,
    SYS_landlock_add_rule,
    SYS_landlock_create_ruleset,
    SYS_landlock_restrict_self,
    SYS_lgetxattr,
    SYS_linkat,
    SYS_listen,
    SYS_listxattr,
    SYS_llistxattr,
    SYS_lremovexattr,
    SYS_lseek,
    SYS_lsetxattr,
    SYS_madvise,
    SYS_membarrier,
    SYS_memfd_create,
    SYS_memfd_secret,
    SYS_mincore,
    SYS_mkdirat,
    SYS_mknodat,
    SYS_mlock,
    SYS_mlock2,
    SYS_mlockall,
    SYS_mmap,
    SYS_mprotect,
    SYS_mq_getsetattr,
    SYS_mq_notify,
    SYS_mq_open,
    SYS_mq_timedreceive,
    SYS_mq_timedsend,
    SYS_mq_unlink,
    SYS_mremap,
    SYS_msgctl,
    SYS_msgget,
    SYS_msgrcv,
    SYS_msgsnd,
    SYS_mseal,
    SYS_msync,
    SYS_munlock,
    SYS_munlockall,
    SYS_munmap,
    SYS_nanosleep,
    SYS_newfstatat,
    SYS_openat,
    SYS_openat2,
    SYS_pidfd_open,
    SYS_pidfd_send_signal,
    SYS_pipe2,
    SYS_pkey_alloc,
    SYS_pkey_free,
    SYS_pkey_mprotect,
    SYS_ppoll,
    SYS_prctl,
    SYS_pread64,
    SYS_preadv,
    SYS_preadv2,
    SYS_prlimit64,
    SYS_process_mrelease,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_pselect6,
    SYS_ptrace,
    SYS_pwrite64,
    SYS_pwritev,
    SYS_pwritev2,
    SYS_read,
    SYS_readahead,
    SYS_readlinkat,
    SYS_readv,
    SYS_recvfrom,
    SYS_recvmmsg,
    SYS_recvmsg,
    SYS_remap_file_pages,
    SYS_removexattr,
    SYS_renameat2,
    SYS_restart_syscall,
    SYS_rseq,
    SYS_rt_sigaction,
    SYS_rt_sigpending,
    SYS_rt_sigprocmask,
    SYS_rt_sigqueueinfo,
    SYS_rt_sigreturn,
    SYS_rt_sigsuspend,
    SYS_rt_sigtimedwait,
    SYS_rt_tgsigqueueinfo,
    SYS_sched_getaffinity,
    SYS_sched_getattr,
    SYS_sched_getparam,
    SYS_sched_get_priority_max,
    SYS_sched_get_priority_min,
    SYS_sched_getscheduler,
    SYS_sched_rr_get_interval,
    SYS_sched_setaffinity,
    SYS_sched_setattr,
    SYS_sched_setparam,
    SYS_sched_setscheduler,
    SYS_sched_yield,
    SYS_seccomp,
    SYS_semctl,
    SYS_semget,
    SYS_semop,
    SYS_semtimedop,
    SYS_sendfile,
    SYS_sendmmsg,
    SYS_sendmsg,
    SYS_sendto,
    SYS_setfsgid,
    SYS_setfsuid,
    SYS_setgid,
    SYS_setgroups,
    SYS_setitimer,
    SYS_setpgid,
    SYS_setpriority,
    SYS_setregid,
    SYS_setresgid,
    SYS_setresuid,
    SYS_setreuid,
    SYS_set_robust_list,
    SYS_setsid,
    SYS_setsockopt,
    SYS_set_tid_address,
    SYS_setuid,
    SYS_setxattr,
    SYS_shmat,
    SYS_shmctl,
    SYS_shmdt,
    SYS_shmget,
    SYS_shutdown,
    SYS_sigaltstack,
    SYS_signalfd4,
    SYS_socketpair,
    SYS_splice,
    SYS_statfs,
    SYS_statx,
    SYS_symlinkat,
    SYS_sync,
    SYS_syncfs,
    SYS_sysinfo,
    SYS_tee,
    SYS_tgkill,
    SYS_timer_create,
    SYS_timer_delete,
    SYS_timer_getoverrun,
    SYS_timer_gettime,
    SYS_timer_settime,
    SYS_timerfd_create,
    SYS_timerfd_gettime,
    SYS_timerfd_settime,
    SYS_times,
    SYS_tkill,
    SYS_truncate,
    SYS_umask,
    SYS_uname,
    SYS_unlinkat,
    SYS_utimensat,
    SYS_vmsplice,
    SYS_wait4,
    SYS_waitid,
    SYS_write,
    SYS_writev,
];

/// Allowed, on x86_64 only (the legacy calls other architectures never had).
#[cfg(target_arch = "x86_64")]
const ALLOWED_ARCH: &[Syscall] = syscalls![
    SYS_access,
    SYS_alarm,
    SYS_arch_prctl,
    SYS_chmod,
    SYS_chown,
    SYS_creat,
    SYS_dup2,
    SYS_epoll_create,
    SYS_epoll_ctl_old,
    SYS_epoll_wait,
    SYS_epoll_wait_old,
    SYS_eventfd,
    SYS_fork,
    SYS_futimesat,
    SYS_getdents,
    SYS_getpgrp,
    SYS_inotify_init,
    SYS_lchown,
    SYS_link,
    SYS_lstat,
    SYS_mkdir,
    SYS_mknod,
    SYS_modify_ldt,
    SYS_open,
    SYS_pause,
    SYS_pipe,
    SYS_poll,
    SYS_readlink,
    SYS_rename,
    SYS_renameat,
    SYS_rmdir,
    SYS_select,
    SYS_set_thread_area,
    SYS_get_thread_area,
    SYS_signalfd,
    SYS_stat,
    SYS_symlink,
    SYS_sync_file_range,
    SYS_time,
    SYS_unlink,
    SYS_utime,
    SYS_utimes,
    SYS_vfork,
    SYS_getrlimit,
    SYS_setrlimit,
];
/// Allowed, on x86_64 only (the legacy calls other architectures never had).
#[cfg(not(target_arch = "x86_64"))]
const ALLOWED_ARCH: &[Syscall] = &[];

/// Allowed: newer equivalents of allowed calls, by number (see [`nr`]).
const ALLOWED_BY_NUMBER: &[Syscall] = &[
    Syscall {
        name: "newer equivalent of an allowed call",
        nr: nr::FCHMODAT2,
    },
    Syscall {
        name: "newer equivalent of an allowed call",
        nr: nr::MAP_SHADOW_STACK,
    },
    Syscall {
        name: "newer equivalent of an allowed call",
        nr: nr::FUTEX_WAKE,
    },
    Syscall {
        name: "newer equivalent of an allowed call",
        nr: nr::FUTEX_WAIT,
    },
    Syscall {
        name: "newer equivalent of an allowed call",
        nr: nr::FUTEX_REQUEUE,
    },
];

/// The default policy as a table, in the order its rules are checked: for each syscall the
/// first of its lines whose condition matches decides (see [`Policy`]).
pub const DEFAULT_TABLE: &[Group] = &[
    Group::each(REFUSED, EPERM),
    Group::each(REFUSED_ARCH, EPERM),
    Group::each(REFUSED_BY_NUMBER, EPERM),
    // Allowed with safe arguments only. clone3 passes its flags in memory, which the filter
    // cannot read: it answers ENOSYS and the C library falls back to clone.
    Group::one(syscalls![SYS_clone3], When::Always, ENOSYS),
    Group::one(
        syscalls![SYS_clone],
        When::AnyBit {
            arg: 0,
            mask: NAMESPACE_FLAGS,
        },
        EPERM,
    ),
    Group::one(syscalls![SYS_clone], When::Always, ALLOW),
    Group::one(
        syscalls![SYS_unshare],
        When::AnyBit {
            arg: 0,
            mask: NAMESPACE_FLAGS,
        },
        EPERM,
    ),
    Group::one(syscalls![SYS_unshare], When::Always, ALLOW),
    Group::one(
        syscalls![SYS_socket],
        When::In {
            arg: 0,
            values: &[AF_VSOCK],
        },
        Action::Errno(libc::EAFNOSUPPORT as u16),
    ),
    Group::one(
        syscalls![SYS_ioctl],
        When::In {
            arg: 1,
            values: &[TIOCSTI, TIOCLINUX],
        },
        EPERM,
    ),
    Group::one(
        syscalls![SYS_personality],
        When::NotIn {
            arg: 0,
            values: &[0, 0x0008, 0x20000, 0x20008, 0xffff_ffff],
        },
        EPERM,
    ),
    Group::each(syscalls![SYS_socket, SYS_ioctl, SYS_personality], ALLOW),
    Group::each(ALLOWED, ALLOW),
    Group::each(ALLOWED_ARCH, ALLOW),
    Group::each(ALLOWED_BY_NUMBER, ALLOW),
];

/// The policy every sandbox runs under (see the module docs): [`DEFAULT_TABLE`]; anything
/// else answers `ENOSYS`, a foreign architecture `EPERM`.
pub fn default_policy() -> Policy {
    Policy {
        rules: rules_of(DEFAULT_TABLE),
        default: ENOSYS,
        foreign_arch: EPERM,
    }
}

/// The audit architecture of the build target.
#[cfg(target_arch = "x86_64")]
pub const NATIVE_ARCH: u32 = 0xC000_003E;
/// The audit architecture of the build target.
#[cfg(target_arch = "aarch64")]
pub const NATIVE_ARCH: u32 = 0xC000_00B7;

const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
fn off_arg_lo(arg: u8) -> u32 {
    // seccomp_data: nr(4) arch(4) ip(8) args[6](8 each); little-endian low word first.
    16 + 8 * u32::from(arg)
}

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// One instruction before jump targets are known: `Ja(label)` jumps to a label, everything
/// else is final (its conditional jumps only skip a fixed number of following instructions).
enum Asm {
    Op(libc::sock_filter),
    Ja(usize),
    Label(usize),
}

struct Assembler {
    code: Vec<Asm>,
    labels: usize,
}

impl Assembler {
    fn label(&mut self) -> usize {
        self.labels += 1;
        self.labels - 1
    }
    fn op(&mut self, code: u16, jt: u8, jf: u8, k: u32) {
        self.code.push(Asm::Op(ins(code, jt, jf, k)));
    }
    fn ja(&mut self, l: usize) {
        self.code.push(Asm::Ja(l));
    }
    fn place(&mut self, l: usize) {
        self.code.push(Asm::Label(l));
    }
    fn finish(self) -> Vec<libc::sock_filter> {
        let mut at = vec![0usize; self.labels];
        let mut pc = 0;
        for a in &self.code {
            match a {
                Asm::Label(l) => at[*l] = pc,
                _ => pc += 1,
            }
        }
        let mut out = Vec::with_capacity(pc);
        for a in self.code {
            match a {
                Asm::Op(i) => out.push(i),
                // Labels are only placed after the jumps to them: offsets are forward.
                Asm::Ja(l) => {
                    let here = out.len();
                    out.push(ins(JA, 0, 0, (at[l] - here - 1) as u32));
                }
                Asm::Label(_) => {}
            }
        }
        out
    }
}

/// Emits the binary search over `keys` (the accumulator holds the syscall number): each key
/// jumps to its label in `targets`, anything else to `miss`.
fn search(a: &mut Assembler, keys: &[(u32, usize)], miss: usize) {
    if keys.len() <= 4 {
        for (nr, target) in keys {
            a.op(JEQ_K, 0, 1, *nr);
            a.ja(*target);
        }
        a.ja(miss);
        return;
    }
    let mid = keys.len() / 2;
    let right = a.label();
    a.op(JGE_K, 0, 1, keys[mid].0);
    a.ja(right);
    search(a, &keys[..mid], miss);
    a.place(right);
    search(a, &keys[mid..], miss);
}

/// Compiles a policy into a classic BPF program for `SECCOMP_SET_MODE_FILTER`.
pub fn compile(p: &Policy) -> Result<Vec<libc::sock_filter>, JailError> {
    let bad = |why: String| JailError::Init(format!("seccomp policy: {why}"));
    // The rules of each syscall, in policy order.
    let mut by_nr: BTreeMap<u32, Vec<&Rule>> = BTreeMap::new();
    for r in &p.rules {
        if r.nr < 0 {
            continue;
        }
        let nr = u32::try_from(r.nr).map_err(|_| bad(format!("{} has no number", r.name)))?;
        let arg = match &r.cond {
            Cond::Always => 0,
            Cond::AnyBit { arg, .. } => *arg,
            Cond::In { arg, values } | Cond::NotIn { arg, values } => {
                if values.is_empty() || values.len() > 200 {
                    return Err(bad(format!("{}: {} values", r.name, values.len())));
                }
                *arg
            }
        };
        if arg > 5 {
            return Err(bad(format!("{}: argument {arg}", r.name)));
        }
        by_nr.entry(nr).or_default().push(r);
    }
    let mut a = Assembler {
        code: Vec::new(),
        labels: 0,
    };
    // One shared return per action: a syscall decided without looking at its arguments
    // jumps straight there.
    let mut rets: BTreeMap<Action, usize> = BTreeMap::new();
    for act in p
        .rules
        .iter()
        .map(|r| r.action)
        .chain([p.default, p.foreign_arch])
    {
        rets.entry(act).or_insert_with(|| a.label());
    }
    let mut keys = Vec::with_capacity(by_nr.len());
    let mut bodies = Vec::new();
    for (nr, rules) in &by_nr {
        match rules.first() {
            Some(r) if r.cond == Cond::Always => keys.push((*nr, rets[&r.action])),
            _ => {
                let l = a.label();
                keys.push((*nr, l));
                bodies.push((l, rules));
            }
        }
    }
    let foreign = rets[&p.foreign_arch];
    let default = rets[&p.default];
    a.op(LD_W_ABS, 0, 0, OFF_ARCH);
    a.op(JEQ_K, 1, 0, NATIVE_ARCH);
    a.ja(foreign);
    a.op(LD_W_ABS, 0, 0, OFF_NR);
    if cfg!(target_arch = "x86_64") {
        a.op(JGE_K, 0, 1, X32_SYSCALL_BIT);
        a.ja(foreign);
    }
    search(&mut a, &keys, default);
    // The bodies of syscalls with argument checks: each rule in order, then the default.
    for (l, rules) in bodies {
        a.place(l);
        for r in rules {
            let hit = rets[&r.action];
            match &r.cond {
                Cond::Always => {
                    a.ja(hit);
                    break;
                }
                Cond::AnyBit { arg, mask } => {
                    a.op(LD_W_ABS, 0, 0, off_arg_lo(*arg));
                    a.op(JSET_K, 0, 1, *mask);
                    a.ja(hit);
                }
                Cond::In { arg, values } => {
                    a.op(LD_W_ABS, 0, 0, off_arg_lo(*arg));
                    for v in values {
                        a.op(JEQ_K, 0, 1, *v);
                        a.ja(hit);
                    }
                }
                Cond::NotIn { arg, values } => {
                    a.op(LD_W_ABS, 0, 0, off_arg_lo(*arg));
                    let n = values.len();
                    for (i, v) in values.iter().enumerate() {
                        // A match skips the remaining comparisons and the jump to `hit`.
                        a.op(JEQ_K, (n - i) as u8, 0, *v);
                    }
                    a.ja(hit);
                }
            }
        }
        a.ja(default);
    }
    for (act, l) in rets {
        a.place(l);
        a.op(RET_K, 0, 0, act.ret());
    }
    let f = a.finish();
    if f.len() > 4096 {
        return Err(bad(format!(
            "{} instructions is over the kernel's limit",
            f.len()
        )));
    }
    Ok(f)
}

/// Installs a compiled filter on the calling thread. Does not set `no_new_privs`: the caller
/// must hold `CAP_SYS_ADMIN` in its user namespace (so setuid tools keep working inside).
pub fn install(prog: &[libc::sock_filter]) -> Result<(), JailError> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut _,
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &fprog as *const libc::sock_fprog,
        )
    };
    crate::sys::check(rc, || "install seccomp filter".into())?;
    Ok(())
}

/// Runs a program on one syscall, as the kernel would (only the instructions [`compile`]
/// emits are supported). Returns the action word.
pub fn evaluate(prog: &[libc::sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> Option<u32> {
    let mut data = Vec::with_capacity(64);
    data.extend_from_slice(&nr.to_le_bytes());
    data.extend_from_slice(&arch.to_le_bytes());
    data.extend_from_slice(&0u64.to_le_bytes());
    for a in args {
        data.extend_from_slice(&a.to_le_bytes());
    }
    interpret(prog, |o| {
        let o = o as usize;
        Some(u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?))
    })
}

/// The interpreter behind [`evaluate`]: `load` answers each load from `seccomp_data` (by
/// offset), or stops the program with `None`.
fn interpret(prog: &[libc::sock_filter], mut load: impl FnMut(u32) -> Option<u32>) -> Option<u32> {
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    while pc < prog.len() {
        let i = &prog[pc];
        pc += 1;
        match i.code {
            LD_W_ABS => acc = load(i.k)?,
            JA => pc += i.k as usize,
            JEQ_K | JGE_K | JSET_K => {
                let taken = match i.code {
                    JEQ_K => acc == i.k,
                    JGE_K => acc >= i.k,
                    _ => acc & i.k != 0,
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            RET_K => return Some(i.k),
            _ => return None,
        }
    }
    None
}

/// What the policy does with each syscall number below 1024 with all-zero arguments, as
/// `(number, action word)`: for reports and the threat model's table.
pub fn table(p: &Policy) -> Result<Vec<(u32, u32)>, JailError> {
    let prog = compile(p)?;
    Ok((0..1024)
        .filter_map(|nr| evaluate(&prog, NATIVE_ARCH, nr, [0; 6]).map(|a| (nr, a)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(nr: i64, args: [u64; 6]) -> u32 {
        let prog = compile(&default_policy()).unwrap();
        evaluate(&prog, NATIVE_ARCH, nr as u32, args).unwrap()
    }
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

    #[test]
    fn denied_syscalls_get_eperm() {
        for nr in [
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_bpf,
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_kexec_load,
            libc::SYS_perf_event_open,
            libc::SYS_userfaultfd,
            libc::SYS_open_by_handle_at,
            libc::SYS_setns,
            libc::SYS_fsopen,
            libc::SYS_open_tree,
            libc::SYS_io_uring_setup,
            libc::SYS_kcmp,
            libc::SYS_pidfd_getfd,
            libc::SYS_process_madvise,
            libc::SYS_migrate_pages,
            libc::SYS_move_pages,
            libc::SYS_mbind,
            nr::STATMOUNT,
            nr::LISTMOUNT,
            nr::OPEN_TREE_ATTR,
        ] {
            assert_eq!(run(nr, [0; 6]), EPERM, "syscall {nr}");
        }
    }

    #[test]
    fn unknown_and_future_syscalls_get_enosys() {
        // Never assigned on x86_64 or aarch64, and far beyond today's tables.
        for nr in [335 + 1000, 470, 600, 1023] {
            assert_eq!(run(nr, [0; 6]), ENOSYS, "syscall {nr}");
        }
        assert_eq!(run(libc::SYS_clone3, [0; 6]), ENOSYS);
    }

    #[test]
    fn ordinary_syscalls_are_allowed() {
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_ptrace,
            libc::SYS_close_range,
            libc::SYS_setsid,
            libc::SYS_pidfd_open,
            libc::SYS_epoll_pwait,
            libc::SYS_futex,
            libc::SYS_rseq,
        ] {
            assert_eq!(run(nr, [0; 6]), libc::SECCOMP_RET_ALLOW, "syscall {nr}");
        }
    }

    #[test]
    fn every_rule_of_the_policy_decides_its_syscall() {
        // The first rule of each syscall without argument checks is what the program returns.
        let p = default_policy();
        let prog = compile(&p).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for r in &p.rules {
            if !seen.insert(r.nr) {
                continue;
            }
            if r.cond == Cond::Always {
                assert_eq!(
                    evaluate(&prog, NATIVE_ARCH, r.nr as u32, [0; 6]),
                    Some(r.action.ret()),
                    "{}",
                    r.name
                );
            }
        }
        // Every number below 1024 gets an answer (the program never runs off its end).
        assert_eq!(table(&p).unwrap().len(), 1024);
    }

    #[test]
    fn allowed_syscalls_never_read_an_argument() {
        // The kernel caches "always allow" per syscall only when the path reads nothing but
        // the number and the architecture: check the program keeps that property.
        let prog = compile(&default_policy()).unwrap();
        for nr in [libc::SYS_read, libc::SYS_write, libc::SYS_futex] {
            let r = interpret(&prog, |o| match o {
                OFF_NR => Some(nr as u32),
                OFF_ARCH => Some(NATIVE_ARCH),
                _ => None,
            });
            assert_eq!(
                r,
                Some(libc::SECCOMP_RET_ALLOW),
                "syscall {nr} reads an argument"
            );
        }
        // And one with an argument check does read it.
        let r = interpret(&prog, |o| match o {
            OFF_NR => Some(libc::SYS_ioctl as u32),
            OFF_ARCH => Some(NATIVE_ARCH),
            _ => None,
        });
        assert_eq!(r, None);
    }

    #[test]
    fn namespaces_cannot_be_created() {
        let fork_flags =
            (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD) as u64;
        assert_eq!(
            run(libc::SYS_clone, [fork_flags, 0, 0, 0, 0, 0]),
            libc::SECCOMP_RET_ALLOW
        );
        let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        assert_eq!(
            run(libc::SYS_clone, [thread, 0, 0, 0, 0, 0]),
            libc::SECCOMP_RET_ALLOW
        );
        for f in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWPID,
        ] {
            assert_eq!(
                run(libc::SYS_clone, [f as u64 | fork_flags, 0, 0, 0, 0, 0]),
                EPERM
            );
            assert_eq!(run(libc::SYS_unshare, [f as u64, 0, 0, 0, 0, 0]), EPERM);
        }
        assert_eq!(
            run(libc::SYS_unshare, [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]),
            libc::SECCOMP_RET_ALLOW
        );
    }

    #[test]
    fn vsock_sockets_are_refused_and_others_allowed() {
        let stream = libc::SOCK_STREAM as u64;
        assert_eq!(
            run(libc::SYS_socket, [u64::from(AF_VSOCK), stream, 0, 0, 0, 0]),
            libc::SECCOMP_RET_ERRNO | libc::EAFNOSUPPORT as u32
        );
        for fam in [
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_UNIX,
            libc::AF_NETLINK,
        ] {
            assert_eq!(
                run(libc::SYS_socket, [fam as u64, stream, 0, 0, 0, 0]),
                libc::SECCOMP_RET_ALLOW,
                "family {fam}"
            );
        }
    }

    #[test]
    fn terminal_injection_ioctls_are_refused() {
        for req in [TIOCSTI, TIOCLINUX] {
            assert_eq!(run(libc::SYS_ioctl, [0, u64::from(req), 0, 0, 0, 0]), EPERM);
            // The high half of the request is ignored by the kernel, and by the filter.
            assert_eq!(
                run(
                    libc::SYS_ioctl,
                    [0, (1u64 << 32) | u64::from(req), 0, 0, 0, 0]
                ),
                EPERM
            );
        }
        for req in [
            libc::TIOCGWINSZ,
            libc::TIOCSWINSZ,
            libc::TCGETS,
            libc::FIONREAD,
        ] {
            assert_eq!(
                run(libc::SYS_ioctl, [0, req, 0, 0, 0, 0]),
                libc::SECCOMP_RET_ALLOW
            );
        }
    }

    #[test]
    fn personality_only_safe_values() {
        assert_eq!(
            run(libc::SYS_personality, [0, 0, 0, 0, 0, 0]),
            libc::SECCOMP_RET_ALLOW
        );
        assert_eq!(
            run(libc::SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0]),
            libc::SECCOMP_RET_ALLOW
        );
        // ADDR_NO_RANDOMIZE
        assert_eq!(
            run(libc::SYS_personality, [0x0040000, 0, 0, 0, 0, 0]),
            EPERM
        );
    }

    #[test]
    fn foreign_architectures_are_refused() {
        let prog = compile(&default_policy()).unwrap();
        // i386 write
        assert_eq!(evaluate(&prog, 0x4000_0003, 4, [0; 6]), Some(EPERM));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            evaluate(&prog, NATIVE_ARCH, X32_SYSCALL_BIT | 1, [0; 6]),
            Some(EPERM)
        );
    }

    /// SHA-256 (FIPS 180-4), for the digest of a compiled program (no dependency for one test).
    fn sha256(data: &[u8]) -> String {
        const K: [u32; 64] = [
            0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
            0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
            0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
            0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
            0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
            0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
            0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
            0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
            0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
            0xc67178f2,
        ];
        let mut h: [u32; 8] = [
            0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
            0x5be0cd19,
        ];
        let mut m = data.to_vec();
        m.push(0x80);
        while m.len() % 64 != 56 {
            m.push(0);
        }
        m.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
        for block in m.chunks_exact(64) {
            let mut w = [0u32; 64];
            for (i, word) in block.chunks_exact(4).enumerate() {
                w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
            }
            for i in 16..64 {
                let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
                let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
                w[i] = w[i - 16]
                    .wrapping_add(s0)
                    .wrapping_add(w[i - 7])
                    .wrapping_add(s1);
            }
            let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
            for i in 0..64 {
                let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
                let ch = (e & f) ^ (!e & g);
                let t1 = hh
                    .wrapping_add(s1)
                    .wrapping_add(ch)
                    .wrapping_add(K[i])
                    .wrapping_add(w[i]);
                let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
                let maj = (a & b) ^ (a & c) ^ (b & c);
                let t2 = s0.wrapping_add(maj);
                hh = g;
                g = f;
                f = e;
                e = d.wrapping_add(t1);
                d = c;
                c = b;
                b = a;
                a = t1.wrapping_add(t2);
            }
            for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
                *x = x.wrapping_add(y);
            }
        }
        h.iter().map(|x| format!("{x:08x}")).collect()
    }

    #[test]
    fn sha256_matches_the_standard_vectors() {
        assert_eq!(
            sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        // Two blocks of padding.
        assert_eq!(
            sha256(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    /// The SHA-256 of the default policy's program as the kernel receives it: each
    /// instruction as `code` (u16), `jt`, `jf` (u8), `k` (u32), little-endian, 8 bytes.
    /// Recorded per architecture; a change to the policy or the compiler changes the filter
    /// every sandbox runs under, and must change this constant on purpose.
    const DEFAULT_PROGRAM_SHA256: &[(&str, usize, &str)] = &[(
        "x86_64",
        1143,
        "fc1cedf86b98fd7aa347fe556657057ba382c4e0eaae748e63396c92f9efe458",
    )];

    fn program_bytes(prog: &[libc::sock_filter]) -> Vec<u8> {
        let mut b = Vec::with_capacity(prog.len() * 8);
        for i in prog {
            b.extend_from_slice(&i.code.to_le_bytes());
            b.push(i.jt);
            b.push(i.jf);
            b.extend_from_slice(&i.k.to_le_bytes());
        }
        b
    }

    #[test]
    fn default_program_is_byte_for_byte_the_recorded_one() {
        let prog = compile(&default_policy()).unwrap();
        let digest = sha256(&program_bytes(&prog));
        let arch = std::env::consts::ARCH;
        match DEFAULT_PROGRAM_SHA256.iter().find(|(a, ..)| *a == arch) {
            Some((_, len, want)) => {
                assert_eq!(
                    (prog.len(), digest.as_str()),
                    (*len, *want),
                    "the default seccomp program changed on {arch}"
                );
            }
            // Not recorded (no build for this architecture where it was written): say what
            // to record rather than fail.
            None => eprintln!(
                "no recorded digest for {arch}: (\"{arch}\", {}, \"{digest}\")",
                prog.len()
            ),
        }
    }

    #[test]
    fn program_is_small() {
        let prog = compile(&default_policy()).unwrap();
        assert!(prog.len() < 1200, "{} instructions", prog.len());
    }
}
