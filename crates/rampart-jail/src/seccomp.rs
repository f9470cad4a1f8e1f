//! The sandbox's seccomp filter: a policy (plain data) compiled by a pure function into a
//! classic BPF program, tested here by running the program in a small BPF interpreter.
//!
//! The policy is a deny list at least as strict as the common container default. It returns
//! `EPERM` for what is denied (`ENOSYS` for `clone3`, so libc falls back to `clone`, whose
//! flags can be checked) and never kills. Syscalls of a foreign architecture (including the
//! x32 ABI on x86_64) fail with `EPERM`, so a filter written for one ABI cannot be bypassed
//! through another.
//!
//! `ptrace` is allowed: the sandbox has its own pid namespace, so only its own processes can
//! be traced (debuggers and `strace` work); host processes are not even visible.

use crate::JailError;

/// What the filter does with a matching syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// A seccomp policy: rules checked in order; the first that matches decides.
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

macro_rules! deny {
    ($v:ident, $($name:ident),+ $(,)?) => {
        $( $v.push(Rule {
            name: stringify!($name),
            nr: libc::$name as i64,
            cond: Cond::Always,
            action: Action::Errno(libc::EPERM as u16),
        }); )+
    };
}

/// The policy every sandbox runs under.
#[allow(clippy::vec_init_then_push)]
pub fn default_policy() -> Policy {
    let mut r: Vec<Rule> = Vec::new();
    deny!(
        r,
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
        SYS_lookup_dcookie,
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
    );
    #[cfg(target_arch = "x86_64")]
    deny!(r, SYS_iopl, SYS_ioperm, SYS_uselib, SYS__sysctl);
    let eperm = Action::Errno(libc::EPERM as u16);
    r.push(Rule {
        name: "SYS_clone3",
        nr: libc::SYS_clone3,
        cond: Cond::Always,
        action: Action::Errno(libc::ENOSYS as u16),
    });
    r.push(Rule {
        name: "SYS_clone",
        nr: libc::SYS_clone,
        cond: Cond::AnyBit {
            arg: 0,
            mask: NAMESPACE_FLAGS,
        },
        action: eperm,
    });
    r.push(Rule {
        name: "SYS_unshare",
        nr: libc::SYS_unshare,
        cond: Cond::AnyBit {
            arg: 0,
            mask: NAMESPACE_FLAGS,
        },
        action: eperm,
    });
    r.push(Rule {
        name: "SYS_personality",
        nr: libc::SYS_personality,
        cond: Cond::NotIn {
            arg: 0,
            values: vec![0, 0x0008, 0x20000, 0x20008, 0xffff_ffff],
        },
        action: eperm,
    });
    Policy {
        rules: r,
        default: Action::Allow,
        foreign_arch: eperm,
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

/// Compiles a policy into a classic BPF program for `SECCOMP_SET_MODE_FILTER`.
pub fn compile(p: &Policy) -> Result<Vec<libc::sock_filter>, JailError> {
    let bad = |why: String| JailError::Init(format!("seccomp policy: {why}"));
    let mut f = vec![
        ins(LD_W_ABS, 0, 0, OFF_ARCH),
        ins(JEQ_K, 1, 0, NATIVE_ARCH),
        ins(RET_K, 0, 0, p.foreign_arch.ret()),
        ins(LD_W_ABS, 0, 0, OFF_NR),
    ];
    if cfg!(target_arch = "x86_64") {
        f.push(ins(JGE_K, 0, 1, X32_SYSCALL_BIT));
        f.push(ins(RET_K, 0, 0, p.foreign_arch.ret()));
    }
    for r in &p.rules {
        if r.nr < 0 {
            continue;
        }
        let nr = u32::try_from(r.nr).map_err(|_| bad(format!("{} has no number", r.name)))?;
        match &r.cond {
            Cond::Always => {
                f.push(ins(LD_W_ABS, 0, 0, OFF_NR));
                f.push(ins(JEQ_K, 0, 1, nr));
                f.push(ins(RET_K, 0, 0, r.action.ret()));
            }
            Cond::AnyBit { arg, mask } => {
                if *arg > 5 {
                    return Err(bad(format!("{}: argument {arg}", r.name)));
                }
                f.push(ins(LD_W_ABS, 0, 0, OFF_NR));
                f.push(ins(JEQ_K, 0, 3, nr));
                f.push(ins(LD_W_ABS, 0, 0, off_arg_lo(*arg)));
                f.push(ins(JSET_K, 0, 1, *mask));
                f.push(ins(RET_K, 0, 0, r.action.ret()));
            }
            Cond::NotIn { arg, values } => {
                if *arg > 5 || values.len() > 200 {
                    return Err(bad(format!(
                        "{}: argument {arg} or too many values",
                        r.name
                    )));
                }
                let n = values.len() as u8;
                f.push(ins(LD_W_ABS, 0, 0, OFF_NR));
                f.push(ins(JEQ_K, 0, n + 2, nr));
                f.push(ins(LD_W_ABS, 0, 0, off_arg_lo(*arg)));
                for (i, v) in values.iter().enumerate() {
                    // On a match skip the remaining comparisons and the return.
                    f.push(ins(JEQ_K, n - i as u8, 0, *v));
                }
                f.push(ins(RET_K, 0, 0, r.action.ret()));
            }
        }
    }
    f.push(ins(RET_K, 0, 0, p.default.ret()));
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
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    while pc < prog.len() {
        let i = &prog[pc];
        pc += 1;
        match i.code {
            LD_W_ABS => {
                let o = i.k as usize;
                acc = u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn run(nr: i64, args: [u64; 6]) -> u32 {
        let prog = compile(&default_policy()).unwrap();
        evaluate(&prog, NATIVE_ARCH, nr as u32, args).unwrap()
    }
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;

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
        ] {
            assert_eq!(run(nr, [0; 6]), EPERM, "syscall {nr}");
        }
    }

    #[test]
    fn ordinary_syscalls_are_allowed() {
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_ptrace,
        ] {
            assert_eq!(run(nr, [0; 6]), libc::SECCOMP_RET_ALLOW, "syscall {nr}");
        }
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
        assert_eq!(
            run(libc::SYS_clone3, [0; 6]),
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
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
}
