//! The jailer: a fresh single-threaded host-root process that builds one sandbox and starts
//! its PID 1. Every mount it makes lives in a private mount namespace (never the host's), so
//! nothing can leak into the host mount table; the mounts vanish with the sandbox.

use crate::{seccomp, sys, JailError, JailerSpec, AGENT_FD_ENV};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Capabilities root inside a sandbox keeps (the container default set, without NET_RAW).
pub const KEPT_CAPS: [u32; 13] = [
    0,  // CHOWN
    1,  // DAC_OVERRIDE
    3,  // FOWNER
    4,  // FSETID
    5,  // KILL
    6,  // SETGID
    7,  // SETUID
    8,  // SETPCAP
    10, // NET_BIND_SERVICE
    18, // SYS_CHROOT
    27, // MKNOD
    29, // AUDIT_WRITE
    31, // SETFCAP
];

fn io(step: String) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Sys { step, source }
}

fn mkdir(p: &Path, mode: u32) -> Result<(), JailError> {
    match std::fs::create_dir(p) {
        Ok(()) => std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
            .map_err(io(format!("chmod {}", p.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io(format!("mkdir {}", p.display()))(e)),
    }
}

fn chown(p: &Path, uid: u32, gid: u32) -> Result<(), JailError> {
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).map_err(io(format!("chown {}", p.display())))
}

fn pipe() -> Result<(OwnedFd, OwnedFd), JailError> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid 2-element array.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    sys::check(rc.into(), || "pipe2".into())?;
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The fixed layout of a sandbox directory.
#[derive(Debug)]
pub struct Layout {
    /// Mount point of the sandbox's ext4 disk.
    pub disk_mnt: PathBuf,
    /// Mount point of the idmapped template rootfs.
    pub lower_root: PathBuf,
    /// Mount point of the idmapped host /usr.
    pub lower_usr: PathBuf,
    /// The sandbox's root (the overlay).
    pub root: PathBuf,
}

impl Layout {
    /// The layout under `dir`.
    pub fn new(dir: &Path) -> Layout {
        Layout {
            disk_mnt: dir.join("mnt"),
            lower_root: dir.join("lower"),
            lower_usr: dir.join("lowerusr"),
            root: dir.join("root"),
        }
    }
}

/// Steps a and b of a launch, which need no spec: enters a private mount namespace and
/// mounts the disk image `disk_image` under `dir` (see [`Layout`]), with the directories of
/// the writable layers. A pool member does this ahead of time; the daemon then renames `dir`
/// to the sandbox's directory (the mounts follow) before sending the spec.
/// Before anything else, the jailer moves itself into the cgroup whose `cgroup.procs` files
/// are `join` (see [`sys::join_cgroup_self`]), so that PID 1 is born there.
pub fn prepare(dir: &Path, disk_image: &Path, join: &[PathBuf]) -> Result<(), JailError> {
    sys::join_cgroup_self(join)?;
    let lay = Layout::new(dir);
    // a. A private mount namespace: nothing from here on reaches the host.
    // SAFETY: plain syscall.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNS) };
    sys::check(rc.into(), || "unshare mount namespace".into())?;
    sys::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;

    // b. The disk.
    for d in [&lay.disk_mnt, &lay.lower_root, &lay.lower_usr, &lay.root] {
        mkdir(d, 0o700)?;
    }
    // The sandbox's init walks from this directory into `root` as the sandbox's root uid
    // (see `child_setup`): it may search it, nothing more. Nothing above it needs to be
    // reachable by that uid (the data directory can be 0700).
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
        .map_err(io(format!("chmod {}", dir.display())))?;
    let (dev, loopfd) = sys::loop_attach(disk_image)?;
    sys::mount(
        Some(&dev),
        &lay.disk_mnt,
        Some("ext4"),
        libc::MS_NOATIME,
        Some("noinit_itable,errors=remount-ro"),
    )?;
    drop(loopfd);
    for n in ["upper", "work", "usr-upper", "usr-work"] {
        mkdir(&lay.disk_mnt.join(n), 0o755)?;
    }
    Ok(())
}

/// The root of a template whose layers stack on `base` (see
/// [`crate::LaunchSpec::layers_on_base`]): `/` is an overlay of the layers over the base's
/// rootfs, `/usr` an overlay of the layers' `usr/` directories over the host's `/usr`, every
/// lower idmapped. A layer whose `usr` is opaque (or not a directory) hides what is below it.
fn mount_on_base(
    spec: &JailerSpec,
    lay: &Layout,
    userns: &std::fs::File,
    rel: &dyn Fn(&Path) -> PathBuf,
    up: &dyn Fn(&str) -> PathBuf,
) -> Result<(), JailError> {
    let mut lowers = Vec::with_capacity(spec.layers.len() + 1);
    let mut usr_lowers = Vec::new();
    let mut usr_hidden = false;
    for (i, l) in spec.layers.iter().enumerate() {
        let at = spec.sandbox_dir.join(format!("l{i}"));
        mkdir(&at, 0o700)?;
        sys::idmapped_bind(l, &at, userns.as_raw_fd())?;
    }
    for (i, l) in spec.layers.iter().enumerate().rev() {
        lowers.push(format!("l{i}"));
        if usr_hidden {
            continue;
        }
        match std::fs::symlink_metadata(l.join("usr")) {
            Ok(md) if md.is_dir() => {
                usr_lowers.push(format!("l{i}/usr"));
                usr_hidden = sys::is_opaque(&l.join("usr"));
            }
            Ok(_) => usr_hidden = true,
            Err(_) => {}
        }
    }
    sys::idmapped_bind(&spec.rootfs, &lay.lower_root, userns.as_raw_fd())?;
    lowers.push(rel(&lay.lower_root).display().to_string());
    if !usr_hidden {
        sys::idmapped_bind(&spec.usr_source, &lay.lower_usr, userns.as_raw_fd())?;
        usr_lowers.push(rel(&lay.lower_usr).display().to_string());
    }
    if usr_lowers.is_empty() {
        return Err(JailError::Template(
            "the template's layers remove /usr".into(),
        ));
    }
    let ((upper, work), (usr_upper, usr_work)) = match &spec.build {
        Some(b) => {
            let (Some(uu), Some(uw)) = (&b.usr_upper, &b.usr_work) else {
                return Err(JailError::Init(
                    "a build step on base needs the /usr overlay's directories".into(),
                ));
            };
            for (link, to) in [
                ("build-upper", &b.upper),
                ("build-work", &b.work),
                ("build-usr-upper", uu),
                ("build-usr-work", uw),
            ] {
                let _ = std::fs::remove_file(link);
                std::os::unix::fs::symlink(to, link).map_err(io(format!("symlink {link}")))?;
            }
            (
                (PathBuf::from("build-upper"), PathBuf::from("build-work")),
                (
                    PathBuf::from("build-usr-upper"),
                    PathBuf::from("build-usr-work"),
                ),
            )
        }
        None => (
            (rel(&up("upper")), rel(&up("work"))),
            (rel(&up("usr-upper")), rel(&up("usr-work"))),
        ),
    };
    let opts = |lowers: &[String], u: &Path, w: &Path| {
        format!(
            "lowerdir={},upperdir={},workdir={},index=off,metacopy=off,redirect_dir=off,xino=off",
            lowers.join(":"),
            u.display(),
            w.display()
        )
    };
    sys::mount(
        Some("overlay"),
        &lay.root,
        Some("overlay"),
        0,
        Some(&opts(&lowers, &upper, &work)),
    )?;
    let usr = lay.root.join("usr");
    if !usr.is_dir() {
        return Err(JailError::Template(
            "the template's root has no usr/ directory".into(),
        ));
    }
    sys::mount(
        Some("overlay"),
        &usr,
        Some("overlay"),
        0,
        Some(&opts(&usr_lowers, &usr_upper, &usr_work)),
    )
}

/// Builds the sandbox described by `spec` and returns the host pid of its PID 1. With
/// `prepared`, [`prepare`] already ran (for the directory now at `spec.sandbox_dir`).
/// Must run in a single-threaded process (it forks without exec).
///
/// The phases, in this order: the disk ([`prepare`], [`make_upper_dirs`],
/// [`prepare_disk`]), what PID 1 inherits ([`open_inherited`]), PID 1 itself
/// ([`spawn_init`]), its uid/gid maps ([`map_ids`]), its root ([`mount_root`]) and volumes
/// ([`mount_spec_volumes`]), the go ([`release_init`]) and the exec ([`await_exec`]). From
/// the clone on, a failure kills PID 1 before it is returned.
pub fn run(spec: &JailerSpec, prepared: bool) -> Result<i32, JailError> {
    let lay = Layout::new(&spec.sandbox_dir);
    if !prepared {
        prepare(&spec.sandbox_dir, &spec.disk_image, &spec.cgroup_procs)?;
    }
    make_upper_dirs(spec, &lay)?;
    let disk_root = prepare_disk(spec, &lay)?;
    let inherited = open_inherited(spec, disk_root)?;
    let Spawned { pid, go, err } = spawn_init(spec, &inherited)?;
    // PID 1 reaches the sandbox directory by its descriptor; the jailer needs it no more.
    drop(inherited.sandbox_dir);
    map_ids(pid, spec.uid_base, spec.uid_base).map_err(|e| kill_child(pid, e))?;
    mount_root(spec, &lay, pid).map_err(|e| kill_child(pid, e))?;
    if !spec.volumes.is_empty() {
        mount_spec_volumes(spec, &lay, pid).map_err(|e| kill_child(pid, e))?;
    }
    release_init(&go).map_err(|e| kill_child(pid, e))?;
    drop(go);
    await_exec(pid, err)?;
    Ok(pid)
}

/// Phase 1 (after [`prepare`]; the disk is mounted at `lay.disk_mnt`): the writable layers'
/// directories, each owned by the sandbox's root uid where the sandbox writes: a build
/// step's host directories (which become the new layer) and the disk's own.
fn make_upper_dirs(spec: &JailerSpec, lay: &Layout) -> Result<(), JailError> {
    let (ub, gb) = (spec.uid_base, spec.uid_base);
    let up = |n: &str| lay.disk_mnt.join(n);
    if let Some(b) = &spec.build {
        // A build step: the upper layer is a host directory that becomes the new layer.
        mkdir(&b.upper, 0o755)?;
        chown(&b.upper, ub, gb)?;
        mkdir(&b.work, 0o700)?;
        if let (Some(u), Some(w)) = (&b.usr_upper, &b.usr_work) {
            mkdir(u, 0o755)?;
            chown(u, ub, gb)?;
            mkdir(w, 0o700)?;
        }
    }
    for (n, owner) in [
        ("upper", ub),
        ("work", 0),
        ("usr-upper", ub),
        ("usr-work", 0),
    ] {
        mkdir(&up(n), 0o755)?;
        if owner != 0 {
            chown(&up(n), owner, gb)?;
        }
    }
    Ok(())
}

/// Phase 2 (after [`make_upper_dirs`]): the disk's files for this sandbox (a disk cloned
/// from another sandbox moves to this sandbox's uid range; a sandbox that is not a build
/// step gets its machine id). Returns the disk's root, which PID 1 keeps for the host (see
/// `persist`; close-on-exec here, cleared in the child just before it execs the agent).
fn prepare_disk(spec: &JailerSpec, lay: &Layout) -> Result<std::fs::File, JailError> {
    let ub = spec.uid_base;
    // A disk cloned from another sandbox: its files move to this sandbox's uid range.
    if let Some(from) = spec.shift_uids_from {
        crate::persist::shift_uids(&lay.disk_mnt, from, ub)?;
    }
    if spec.build.is_none() {
        crate::persist::write_machine_id(&lay.disk_mnt, ub)?;
    }
    std::fs::File::open(&lay.disk_mnt).map_err(io(format!("open {}", lay.disk_mnt.display())))
}

/// What PID 1 inherits from the jailer (all close-on-exec in the jailer; the child clears
/// the flag on what the agent keeps). Opened in this order by [`open_inherited`], so the
/// descriptor numbers the agent is told are the same from launch to launch.
struct Inherited {
    /// The disk's root (see [`prepare_disk`]).
    disk_root: std::fs::File,
    /// The agent binary, exec'd by descriptor.
    agent: std::fs::File,
    /// The agent's listening socket.
    listener: std::os::unix::net::UnixListener,
    /// `/dev/null`, for PID 1's stdin, stdout and stderr.
    devnull: std::fs::File,
    /// The compiled seccomp filter.
    filter: Vec<libc::sock_filter>,
    /// The sandbox directory, which PID 1 enters by descriptor (not by its host path).
    sandbox_dir: std::fs::File,
    /// Build sandboxes: the resolver configuration, read here (PID 1 need not reach it).
    resolv_conf: Option<Vec<u8>>,
}

/// Phase 3 (e, before the clone, so the child inherits them): opens the agent binary,
/// binds its socket (mode 0600), opens `/dev/null`, sets the rlimits (here, as host root may
/// raise the hard limit), compiles the seccomp filter, opens the sandbox directory and reads
/// a build's resolver configuration.
fn open_inherited(spec: &JailerSpec, disk_root: std::fs::File) -> Result<Inherited, JailError> {
    let agent = std::fs::File::open(&spec.agent_bin)
        .map_err(io(format!("open agent {}", spec.agent_bin.display())))?;
    let _ = std::fs::remove_file(&spec.agent_socket);
    let listener = rampart_types::sockpath::SocketPath::new(&spec.agent_socket)
        .and_then(|at| std::os::unix::net::UnixListener::bind(at.path()))
        .map_err(io(format!("bind {}", spec.agent_socket.display())))?;
    std::fs::set_permissions(&spec.agent_socket, std::fs::Permissions::from_mode(0o600))
        .map_err(io("chmod agent socket".into()))?;
    let devnull = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(io("open /dev/null".into()))?;
    set_rlimit(libc::RLIMIT_NOFILE, spec.open_files)?;
    set_rlimit(libc::RLIMIT_CORE, 0)?;
    let filter = seccomp::compile(&seccomp::default_policy())?;
    let sandbox_dir = std::fs::File::open(&spec.sandbox_dir)
        .map_err(io(format!("open {}", spec.sandbox_dir.display())))?;
    let resolv_conf = match spec.build.as_ref().and_then(|b| b.resolv_conf.as_ref()) {
        Some(p) => Some(std::fs::read(p).map_err(io(format!("read {}", p.display())))?),
        None => None,
    };
    Ok(Inherited {
        disk_root,
        agent,
        listener,
        devnull,
        filter,
        sandbox_dir,
        resolv_conf,
    })
}

/// PID 1 as the jailer holds it after [`spawn_init`].
struct Spawned {
    /// Its host pid.
    pid: i32,
    /// The go pipe's write end (see [`release_init`]).
    go: OwnedFd,
    /// The error pipe's read end (see [`await_exec`]).
    err: OwnedFd,
}

/// Phase 4 (c, after [`open_inherited`]): clones the sandbox's PID 1 in new user, pid, net,
/// ipc and uts namespaces (every sandbox, build steps included, has a network namespace of
/// its own); on cgroup v2 it is born in the sandbox's cgroup (no migration). The child waits
/// for the go, then runs [`child_setup`] and never returns here. On error no child exists.
fn spawn_init(spec: &JailerSpec, inh: &Inherited) -> Result<Spawned, JailError> {
    let (go_rd, go_wr) = pipe()?;
    let (err_rd, err_wr) = pipe()?;
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    let cgroup_dir = match &spec.clone_into_cgroup {
        Some(d) => {
            Some(std::fs::File::open(d).map_err(io(format!("open cgroup {}", d.display())))?)
        }
        None => None,
    };
    let pid = match &cgroup_dir {
        // SAFETY: a fork-like clone3 (no new stack) of this single-threaded process; `args`
        // is a valid clone_args of the size passed; the child only runs `child`.
        Some(cg) => unsafe {
            let args = sys::CloneArgs {
                flags: flags as u64 | sys::CLONE_INTO_CGROUP,
                exit_signal: libc::SIGCHLD as u64,
                cgroup: cg.as_raw_fd() as u64,
                ..Default::default()
            };
            libc::syscall(
                libc::SYS_clone3,
                &args as *const sys::CloneArgs,
                std::mem::size_of::<sys::CloneArgs>(),
            )
        },
        // SAFETY: a fork-like clone (no new stack) of this single-threaded process; the child
        // only runs `child` and never returns from it.
        None => unsafe {
            libc::syscall(
                libc::SYS_clone,
                (flags | libc::SIGCHLD) as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        },
    };
    drop(cgroup_dir);
    let pid = sys::check(pid, || "clone sandbox init".into())? as i32;
    if pid == 0 {
        drop(go_wr);
        drop(err_rd);
        let ctx = Child {
            spec,
            dir: inh.sandbox_dir.as_raw_fd(),
            resolv_conf: inh.resolv_conf.as_deref(),
            agent: inh.agent.as_raw_fd(),
            sock: inh.listener.as_raw_fd(),
            devnull: inh.devnull.as_raw_fd(),
            go: go_rd.as_raw_fd(),
            err: err_wr.as_raw_fd(),
            filter: &inh.filter,
            disk: inh.disk_root.as_raw_fd(),
        };
        child(ctx, go_rd, err_wr);
    }
    drop(go_rd);
    drop(err_wr);
    Ok(Spawned {
        pid,
        go: go_wr,
        err: err_rd,
    })
}

/// Kills and reaps PID 1 (our own child, `pid`) after `e` stopped the launch; returns `e`.
fn kill_child(pid: i32, e: JailError) -> JailError {
    // SAFETY: `pid` is our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    e
}

/// Phase 5 (first after the clone: PID 1 needs its ids before it can act as root in its
/// user namespace): maps its uids and gids 0-65535 to the host's `ub`/`gb` upwards.
fn map_ids(pid: i32, ub: u32, gb: u32) -> Result<(), JailError> {
    let map = format!("0 {ub} 65536\n");
    sys::write_file(Path::new(&format!("/proc/{pid}/uid_map")), &map)?;
    sys::write_file(
        Path::new(&format!("/proc/{pid}/gid_map")),
        &format!("0 {gb} 65536\n"),
    )?;
    Ok(())
}

/// A path under the sandbox directory, relative to it (the jailer's working directory from
/// [`mount_root`] on); any other path as it is.
fn rel_to(spec: &JailerSpec, p: &Path) -> PathBuf {
    p.strip_prefix(&spec.sandbox_dir)
        .map(Path::to_path_buf)
        .unwrap_or_else(|_| p.to_path_buf())
}

/// Phase 6 (d, after [`map_ids`]: the lower layers are idmapped through PID 1's user
/// namespace): the sandbox's root at `lay.root`, as an overlay of the template's layers
/// ([`mount_on_base`], [`mount_layered`] or [`mount_plain`]). From here on the jailer's
/// working directory is the sandbox directory, and the overlays' options name their layers
/// relative to it: the kernel shows those options in the sandbox's mountinfo, and no host
/// path or sandbox id may appear there.
fn mount_root(spec: &JailerSpec, lay: &Layout, pid: i32) -> Result<(), JailError> {
    std::env::set_current_dir(&spec.sandbox_dir)
        .map_err(io(format!("chdir {}", spec.sandbox_dir.display())))?;
    let rel = |p: &Path| rel_to(spec, p);
    let up = |n: &str| lay.disk_mnt.join(n);
    let userns = std::fs::File::open(format!("/proc/{pid}/ns/user"))
        .map_err(io("open child user namespace".into()))?;
    if spec.layers_on_base {
        return mount_on_base(spec, lay, &userns, &rel, &up);
    }
    if !spec.layers.is_empty() {
        return mount_layered(spec, lay, &userns, &rel, &up);
    }
    mount_plain(spec, lay, &userns, &rel, &up)
}

/// The root of a layered template (see [`mount_root`]): every layer idmapped, stacked (top
/// first in lowerdir); no host /usr.
fn mount_layered(
    spec: &JailerSpec,
    lay: &Layout,
    userns: &std::fs::File,
    rel: &dyn Fn(&Path) -> PathBuf,
    up: &dyn Fn(&str) -> PathBuf,
) -> Result<(), JailError> {
    let mut lowers = Vec::with_capacity(spec.layers.len());
    for (i, l) in spec.layers.iter().enumerate() {
        let at = spec.sandbox_dir.join(format!("l{i}"));
        mkdir(&at, 0o700)?;
        sys::idmapped_bind(l, &at, userns.as_raw_fd())?;
        lowers.push(format!("l{i}"));
    }
    lowers.reverse();
    let (upper, work) = match &spec.build {
        // Named through links in the sandbox directory, so the host paths of the
        // build's layer are not in the options either.
        Some(b) => {
            for (link, to) in [("build-upper", &b.upper), ("build-work", &b.work)] {
                let _ = std::fs::remove_file(link);
                std::os::unix::fs::symlink(to, link).map_err(io(format!("symlink {link}")))?;
            }
            (PathBuf::from("build-upper"), PathBuf::from("build-work"))
        }
        None => (up("upper"), up("work")),
    };
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},index=off,metacopy=off,redirect_dir=off,xino=off",
        lowers.join(":"),
        rel(&upper).display(),
        rel(&work).display()
    );
    sys::mount(Some("overlay"), &lay.root, Some("overlay"), 0, Some(&opts))
}

/// The root of a plain template (see [`mount_root`]): the idmapped rootfs under an overlay,
/// and on its `/usr` the idmapped host `/usr` under another.
fn mount_plain(
    spec: &JailerSpec,
    lay: &Layout,
    userns: &std::fs::File,
    rel: &dyn Fn(&Path) -> PathBuf,
    up: &dyn Fn(&str) -> PathBuf,
) -> Result<(), JailError> {
    let ovl = |lower: &Path, upper: &str, work: &str, at: &Path| {
        let opts = format!(
            "lowerdir={},upperdir={},workdir={},index=off,metacopy=off,redirect_dir=off,xino=off",
            rel(lower).display(),
            rel(&up(upper)).display(),
            rel(&up(work)).display()
        );
        sys::mount(Some("overlay"), at, Some("overlay"), 0, Some(&opts))
    };
    sys::idmapped_bind(&spec.rootfs, &lay.lower_root, userns.as_raw_fd())?;
    sys::idmapped_bind(&spec.usr_source, &lay.lower_usr, userns.as_raw_fd())?;
    ovl(&lay.lower_root, "upper", "work", &lay.root)?;
    let usr = lay.root.join("usr");
    if !usr.is_dir() {
        return Err(JailError::Template(format!(
            "{} has no usr/ directory",
            spec.rootfs.display()
        )));
    }
    ovl(&lay.lower_usr, "usr-upper", "usr-work", &usr)?;
    // The layers' own mounts (lower, lowerusr, mnt) are not unmounted: PID 1 leaves
    // them behind with its old root at pivot_root, and this namespace (the only other
    // place they exist) dies with the jailer. Unmounting them here would only wait for
    // RCU grace periods on the launch path.
    Ok(())
}

/// Phase 7 (after [`mount_root`]; only when the spec has volumes): the spec's volumes in the
/// sandbox's root, idmapped through PID 1's user namespace.
fn mount_spec_volumes(spec: &JailerSpec, lay: &Layout, pid: i32) -> Result<(), JailError> {
    let userns = std::fs::File::open(format!("/proc/{pid}/ns/user"))
        .map_err(io("open child user namespace".into()))?;
    crate::persist::mount_volumes(spec, &lay.root, userns.as_raw_fd())
}

/// Phase 8 (f, after every mount PID 1 needs exists): the go (`g`), then the cgroup
/// confirmation (`c`): the child was born in the sandbox's cgroup (the jailer joined it
/// before the clone, or cloned it into it); the second byte lets it go on to exec.
fn release_init(go: &OwnedFd) -> Result<(), JailError> {
    // SAFETY: writing one byte from a valid buffer to our pipe.
    let n = unsafe { libc::write(go.as_raw_fd(), b"g".as_ptr().cast(), 1) };
    if n != 1 {
        return Err(sys::last("signal sandbox init"));
    }
    // SAFETY: as above.
    let n = unsafe { libc::write(go.as_raw_fd(), b"c".as_ptr().cast(), 1) };
    if n != 1 {
        return Err(sys::last("signal sandbox init"));
    }
    Ok(())
}

/// Phase 9, the last (g, after [`release_init`] and the go pipe is closed): waits for the
/// error pipe `err`: EOF = exec succeeded (close-on-exec); anything else is the child's
/// error, and the child is killed. A child that exited at once is an error too.
fn await_exec(pid: i32, err: OwnedFd) -> Result<(), JailError> {
    let mut msg = Vec::new();
    let mut f = std::fs::File::from(err);
    let _ = std::io::Read::read_to_end(&mut f, &mut msg);
    if !msg.is_empty() {
        return Err(kill_child(
            pid,
            JailError::Init(String::from_utf8_lossy(&msg).into_owned()),
        ));
    }
    let mut status = 0;
    // SAFETY: non-blocking check on our own child.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    if r == pid {
        return Err(JailError::Init(format!(
            "sandbox init exited at start (status {status:#x})"
        )));
    }
    Ok(())
}

fn set_rlimit(res: libc::__rlimit_resource_t, v: u64) -> Result<(), JailError> {
    let l = libc::rlimit {
        rlim_cur: v,
        rlim_max: v,
    };
    // SAFETY: valid rlimit struct.
    let rc = unsafe { libc::setrlimit(res, &l) };
    sys::check(rc.into(), || format!("setrlimit {res} {v}"))?;
    Ok(())
}

struct Child<'a> {
    spec: &'a JailerSpec,
    /// The sandbox directory (its `root` holds the overlay).
    dir: RawFd,
    /// Build sandboxes: what `/etc/resolv.conf` says.
    resolv_conf: Option<&'a [u8]>,
    agent: RawFd,
    sock: RawFd,
    devnull: RawFd,
    go: RawFd,
    /// The pipe this process reports a failure on (close-on-exec).
    err: RawFd,
    filter: &'a [libc::sock_filter],
    /// The disk's root, kept by the agent (see `persist`).
    disk: RawFd,
}

fn child(ctx: Child<'_>, go: OwnedFd, err: OwnedFd) -> ! {
    let mut b = [0u8; 1];
    // SAFETY: reading one byte into a valid buffer.
    let n = unsafe { libc::read(go.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
    if n != 1 {
        // The jailer gave up (or died): leave quietly.
        // SAFETY: _exit never returns.
        unsafe { libc::_exit(1) };
    }
    let e = match child_setup(&ctx) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    let m = e.to_string();
    // SAFETY: writing our message to our pipe, then exiting without running destructors.
    unsafe {
        libc::write(err.as_raw_fd(), m.as_ptr().cast(), m.len());
        libc::_exit(1)
    }
}

enum Never {}

fn c(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

/// `MS_NOSUID | MS_NODEV | MS_NOEXEC`: the flags of every special mount of the sandbox.
const NSNE: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;

/// The sandbox's PID 1 from the jailer's go (`g`) to the exec of the agent, in this order:
/// identity ([`become_session_root`]), its own mount namespace and root
/// ([`enter_private_root`]), the daemon's files ([`write_init_files`]), `/proc`, `/dev`
/// ([`mount_dev`]), `/sys` ([`mount_sys`]), `/proc`'s masks ([`mask_proc`]), the sandbox's
/// boot id ([`bind_boot_id`]), host name and
/// loopback, a build's resolver ([`bind_resolv_conf`]), the pivot ([`pivot_into_root`]),
/// capabilities ([`drop_bounding_caps`]), descriptors ([`hand_over_descriptors`]), the
/// cgroup namespace ([`enter_cgroup_namespace`]) and the exec ([`exec_agent`]). Each step's
/// own doc says what it needs before it. Returns only on failure (the error is reported on
/// the error pipe, as its text: the messages are the jailer's answer to the daemon).
fn child_setup(ctx: &Child<'_>) -> Result<Never, JailError> {
    become_session_root()?;
    enter_private_root(ctx.dir)?;
    // What the daemon knew before launch (resolver, CA), written while nothing of the
    // sandbox runs yet and before /proc, /dev or /sys exist in its root.
    write_init_files(&ctx.spec.files)?;
    let r = Path::new(".");
    sys::mount(Some("proc"), &r.join("proc"), Some("proc"), NSNE, None)?;
    let dev = mount_dev(r)?;
    mount_sys(r)?;
    mask_proc(r)?;
    bind_boot_id(r, &dev)?;
    set_hostname(&ctx.spec.hostname)?;
    loopback_up()?;
    if let Some(rc) = ctx.resolv_conf {
        bind_resolv_conf(r, &dev, rc)?;
    }
    pivot_into_root()?;
    drop_bounding_caps()?;
    hand_over_descriptors(ctx)?;
    let (argv, env) = agent_command(ctx);
    enter_cgroup_namespace(ctx.go)?;
    exec_agent(ctx, &argv, &env)
}

/// Step 1 (first, before any other step): a session of our own, without a controlling
/// terminal, then root (uid and gid 0, no supplementary groups) of the new user namespace.
/// Nothing in the sandbox can open the terminal the daemon was started from (`/dev/tty`
/// answers ENXIO), nor signal its process group. Needs the jailer's uid/gid maps, written
/// before it sent the go.
fn become_session_root() -> Result<(), JailError> {
    // SAFETY: plain syscall; this process was cloned, so it is not a process group leader.
    sys::check(unsafe { libc::setsid() }.into(), || "setsid".into())?;
    // Root of the new user namespace.
    // SAFETY: plain syscalls on our own credentials.
    unsafe {
        sys::check(libc::setresgid(0, 0, 0).into(), || "setresgid".into())?;
        sys::check(libc::setgroups(0, std::ptr::null()).into(), || {
            "setgroups".into()
        })?;
        sys::check(libc::setresuid(0, 0, 0).into(), || "setresuid".into())?;
    }
    Ok(())
}

/// Step 2 (after [`become_session_root`]): into the sandbox directory `dir` by descriptor
/// (the host path above it, the data directory, need not be reachable by the sandbox's
/// uids), then into a mount namespace of this process's own, where the sandbox's root (the
/// overlay at `root`) is bound on itself (the copied mounts are locked: pivot_root needs a
/// mount of our own). On success the working directory is that root, and every later step's
/// relative path is inside it.
fn enter_private_root(dir: RawFd) -> Result<(), JailError> {
    // The working directory follows into the new mount namespace.
    // SAFETY: fchdir on a descriptor we hold.
    sys::check(unsafe { libc::fchdir(dir) }.into(), || {
        "enter the sandbox directory".into()
    })?;
    // SAFETY: plain syscall.
    sys::check(unsafe { libc::unshare(libc::CLONE_NEWNS) }.into(), || {
        "unshare mount namespace".into()
    })?;
    // A lookup of `root` crosses to the new mount on top.
    sys::mount(
        Some("root"),
        Path::new("root"),
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
    )?;
    std::env::set_current_dir("root").map_err(io("chdir root".into()))
}

/// Step 4 (after `/proc` is mounted, before [`mount_sys`]): the sandbox's `/dev` under the
/// root `r`: a small tmpfs with the host's harmless character devices bound in (null, zero,
/// full, random, urandom, tty), a private devpts instance, a `shm` tmpfs and the usual
/// links. Returns the path of `/dev` (relative to the root).
fn mount_dev(r: &Path) -> Result<PathBuf, JailError> {
    let dev = r.join("dev");
    sys::mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=755,size=1m,nr_inodes=1024"),
    )?;
    for n in ["null", "zero", "full", "random", "urandom", "tty"] {
        let p = dev.join(n);
        std::fs::File::create(&p).map_err(io(format!("create {}", p.display())))?;
        sys::mount(Some(&format!("/dev/{n}")), &p, None, libc::MS_BIND, None)?;
    }
    let pts = dev.join("pts");
    mkdir(&pts, 0o755)?;
    sys::mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
    )?;
    let shm = dev.join("shm");
    mkdir(&shm, 0o1777)?;
    sys::mount(
        Some("shm"),
        &shm,
        Some("tmpfs"),
        NSNE,
        Some("mode=1777,size=65536k"),
    )?;
    for (l, t) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(t, dev.join(l)).map_err(io(format!("symlink /dev/{l}")))?;
    }
    Ok(dev)
}

/// Step 5 (after [`mount_dev`]): `/sys` under the root `r`, read-only, with firmware tables,
/// power capping (RAPL energy counters are a side channel) and every block device (a loop
/// device's `backing_file` names a neighbour's disk and the host's data directory) hidden.
/// When the kernel refuses sysfs, `/sys` stays an empty directory: not an error.
fn mount_sys(r: &Path) -> Result<(), JailError> {
    let sysd = r.join("sys");
    if sysd.is_dir()
        && sys::mount(
            Some("sysfs"),
            &sysd,
            Some("sysfs"),
            NSNE | libc::MS_RDONLY,
            None,
        )
        .is_ok()
    {
        for d in [
            "firmware",
            "devices/virtual/powercap",
            "devices/virtual/block",
            "block",
            "class/block",
            "dev/block",
            "fs/ext4",
        ] {
            mask_dir(&sysd.join(d))?;
        }
    }
    Ok(())
}

/// Step 6 (after [`mount_sys`]; `/proc` is mounted): masks sensitive `/proc` paths under the
/// root `r` as container runtimes do: files under `/dev/null`, directories under an empty
/// tmpfs, and the kernel's tunables (`sys`, `sysrq-trigger`, `irq`, `bus`, `fs`) read-only.
fn mask_proc(r: &Path) -> Result<(), JailError> {
    let proc_ = r.join("proc");
    for f in [
        "kcore",
        "keys",
        "interrupts",
        "timer_list",
        "sched_debug",
        "latency_stats",
        "timer_stats",
        "kallsyms",
    ] {
        let p = proc_.join(f);
        if p.exists() && !p.is_dir() {
            sys::mount(Some("/dev/null"), &p, None, libc::MS_BIND, None)?;
        }
    }
    for d in ["acpi", "scsi", "asound", "driver"] {
        mask_dir(&proc_.join(d))?;
    }
    for d in ["sys", "sysrq-trigger", "irq", "bus", "fs"] {
        let p = proc_.join(d);
        if p.exists() {
            let s = p.to_string_lossy().into_owned();
            sys::mount(Some(&s), &p, None, libc::MS_BIND | libc::MS_REC, None)?;
            sys::mount(
                None,
                &p,
                None,
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | NSNE,
                None,
            )?;
        }
    }
    Ok(())
}

/// Step 6b (after [`mask_proc`]): a boot id of this boot's own, read-only at
/// `/proc/sys/kernel/random/boot_id` under the root `r` (each launch is a boot: a create, a
/// resume from the disk, a fork), so no sandbox reads the host's, nor its own of an earlier
/// boot. A fresh random UUID (version 4) is written to `/dev`'s tmpfs (`dev`), bound over the
/// file, and its name there removed: one small file and one bind mount. Nothing happens when
/// the kernel has no such file.
fn bind_boot_id(r: &Path, dev: &Path) -> Result<(), JailError> {
    let t = r.join("proc/sys/kernel/random/boot_id");
    if !t.is_file() {
        return Ok(());
    }
    let mut raw = [0u8; 16];
    // SAFETY: a valid buffer of the given length (up to 256 bytes come whole, uninterrupted).
    let n = unsafe { libc::getrandom(raw.as_mut_ptr().cast(), raw.len(), 0) };
    if n != raw.len() as isize {
        return Err(sys::last("getrandom for the boot id"));
    }
    let src = dev.join(".boot_id");
    std::fs::write(&src, format_boot_id(raw)).map_err(io(format!("write {}", src.display())))?;
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o444))
        .map_err(io(format!("chmod {}", src.display())))?;
    sys::mount(Some(&src.to_string_lossy()), &t, None, libc::MS_BIND, None)?;
    std::fs::remove_file(&src).map_err(io(format!("remove {}", src.display())))?;
    sys::mount(
        None,
        &t,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | NSNE,
        None,
    )
}

/// A boot id as the kernel writes one: a random (version 4) UUID in lowercase, and a newline.
fn format_boot_id(mut raw: [u8; 16]) -> String {
    raw[6] = (raw[6] & 0x0f) | 0x40;
    raw[8] = (raw[8] & 0x3f) | 0x80;
    let h: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}\n",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Step 7 (after [`bind_boot_id`], then [`loopback_up`]): the sandbox's host name, in its own
/// uts namespace.
fn set_hostname(h: &str) -> Result<(), JailError> {
    // SAFETY: valid buffer and length.
    let rc = unsafe { libc::sethostname(h.as_ptr().cast(), h.len()) };
    sys::check(rc.into(), || "sethostname".into())?;
    Ok(())
}

/// Step 8, build sandboxes only (after [`loopback_up`], before [`pivot_into_root`]): the
/// build's resolver configuration `rc`, read-only at `/etc/resolv.conf` under the root `r`.
/// Its content was read by the jailer; it is written to `/dev`'s tmpfs (`dev`), bound over
/// the file, and its name there removed. Nothing happens when the template's
/// `/etc/resolv.conf` is not a regular file (or `/etc` is missing).
fn bind_resolv_conf(r: &Path, dev: &Path, rc: &[u8]) -> Result<(), JailError> {
    let t = r.join("etc/resolv.conf");
    let md = std::fs::symlink_metadata(&t);
    if md.as_ref().is_ok_and(|m| m.is_file()) || md.is_err() {
        if md.is_err() && r.join("etc").is_dir() {
            std::fs::File::create(&t).map_err(io(format!("create {}", t.display())))?;
        }
        if t.is_file() {
            let src = dev.join(".resolv.conf");
            std::fs::write(&src, rc).map_err(io(format!("write {}", src.display())))?;
            std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o644))
                .map_err(io(format!("chmod {}", src.display())))?;
            sys::mount(Some(&src.to_string_lossy()), &t, None, libc::MS_BIND, None)?;
            std::fs::remove_file(&src).map_err(io(format!("remove {}", src.display())))?;
            sys::mount(
                None,
                &t,
                None,
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | NSNE,
                None,
            )?;
        }
    }
    Ok(())
}

/// Step 9 (after every mount of the sandbox's root is made): into the new root (the working
/// directory); the old one is detached and gone, and the working directory is `/`.
fn pivot_into_root() -> Result<(), JailError> {
    let dot = c(".");
    // SAFETY: valid strings; pivot_root(".", ".") stacks the old root under the new one.
    let rc = unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) };
    sys::check(rc, || "pivot_root".into())?;
    sys::umount2(Path::new("."), libc::MNT_DETACH)?;
    std::env::set_current_dir("/").map_err(io("chdir /".into()))
}

/// Step 10 (after [`pivot_into_root`]: reads `/proc` of the new root): cuts the bounding set
/// to [`KEPT_CAPS`], which is what the agent keeps after exec.
fn drop_bounding_caps() -> Result<(), JailError> {
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    for cap in 0..=last {
        if !KEPT_CAPS.contains(&cap) {
            // SAFETY: plain prctl.
            let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            sys::check(rc.into(), || format!("drop capability {cap}"))?;
        }
    }
    Ok(())
}

/// Step 11 (after [`drop_bounding_caps`]): no ambient capabilities, umask 022, stdin, stdout
/// and stderr on `/dev/null`, and the two descriptors the agent inherits on purpose (its
/// listening socket and the disk's root) no longer close-on-exec.
fn hand_over_descriptors(ctx: &Child<'_>) -> Result<(), JailError> {
    // SAFETY: plain prctl / umask / fd calls on fds we hold.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        libc::umask(0o022);
        for t in 0..3 {
            sys::check(libc::dup2(ctx.devnull, t).into(), || {
                "dup2 /dev/null".into()
            })?;
        }
        sys::check(libc::fcntl(ctx.sock, libc::F_SETFD, 0).into(), || {
            "clear cloexec on agent socket".into()
        })?;
        sys::check(libc::fcntl(ctx.disk, libc::F_SETFD, 0).into(), || {
            "clear cloexec on the disk's root".into()
        })?;
    }
    Ok(())
}

/// The agent's argv and environment (no side effect; any time before [`exec_agent`]): the
/// spec's variables, less the ones Rampart sets and malformed names, then the descriptors of
/// the agent's socket and the disk's root.
fn agent_command(ctx: &Child<'_>) -> (Vec<CString>, Vec<CString>) {
    let mut env: Vec<CString> = ctx
        .spec
        .env
        .iter()
        .filter(|(k, _)| {
            k != AGENT_FD_ENV
                && k != crate::persist::DISK_FD_ENV
                && !k.contains('=')
                && !k.is_empty()
        })
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    env.push(c(&format!("{AGENT_FD_ENV}={}", ctx.sock)));
    env.push(c(&format!("{}={}", crate::persist::DISK_FD_ENV, ctx.disk)));
    let mut argv = vec![c("rampart-agent")];
    argv.extend(ctx.spec.agent_args.iter().map(|a| c(a)));
    (argv, env)
}

/// Step 12 (after [`hand_over_descriptors`], before [`exec_agent`]): waits on `go` until the
/// jailer confirms (`c`) that this process is in the sandbox's cgroup, then makes that cgroup
/// the root of a new cgroup namespace.
fn enter_cgroup_namespace(go: RawFd) -> Result<(), JailError> {
    let mut b = [0u8; 1];
    // SAFETY: reading one byte into a valid buffer.
    let n = unsafe { libc::read(go, b.as_mut_ptr().cast(), 1) };
    if n != 1 || b[0] != b'c' {
        return Err(JailError::Init("jailer did not confirm the cgroup".into()));
    }
    // SAFETY: plain syscall.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWCGROUP) };
    sys::check(rc.into(), || "unshare cgroup namespace".into())?;
    Ok(())
}

/// Step 13, the last: nothing but what PID 1 is given on purpose crosses in (every other
/// descriptor, the daemon's, whatever started the daemon, the jailer's own, is closed; the
/// agent binary and the error pipe are close-on-exec, needed up to the exec), the seccomp
/// filter is installed (after every step that needs a syscall it refuses), and the agent is
/// exec'd. Returns only the error of a step that failed.
fn exec_agent(ctx: &Child<'_>, argv: &[CString], env: &[CString]) -> Result<Never, JailError> {
    sys::close_fds_except(&[ctx.sock, ctx.disk, ctx.agent, ctx.err])?;
    seccomp::install(ctx.filter)?;
    Err(sys::fexecve(ctx.agent, argv, env))
}

/// `openat2(dirfd, path, flags, mode)` resolved inside `dirfd` (`RESOLVE_IN_ROOT`: `..` and
/// absolute symlinks stop at it) and never through a magic link.
fn open_in_root(dirfd: RawFd, path: &str, flags: i32, mode: u32) -> Result<OwnedFd, JailError> {
    let p = CString::new(path).map_err(|_| JailError::Init(format!("path {path:?} has a NUL")))?;
    // SAFETY: `open_how` is plain integers; all zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = u64::from(mode);
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid descriptor, NUL-terminated path and a properly sized `open_how`.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            p.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    let fd = sys::check(fd, || format!("open {path} in the sandbox's root"))?;
    // SAFETY: openat2 just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Writes the spec's [`InitFile`]s into the root at the working directory (see there).
fn write_init_files(files: &[crate::InitFile]) -> Result<(), JailError> {
    if files.is_empty() {
        return Ok(());
    }
    let root = std::fs::File::open(".").map_err(io("open the sandbox's root".into()))?;
    let root = root.as_raw_fd();
    for f in files {
        let rel = f.path.trim_start_matches('/');
        let (parent, name) = match rel.rsplit_once('/') {
            Some((p, n)) => (p, n),
            None => ("", rel),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(JailError::Init(format!(
                "init file {:?}: not a file path",
                f.path
            )));
        }
        // Each missing directory of the parent is made, resolved from the root every time.
        let mut at = String::new();
        for comp in parent.split('/').filter(|c| !c.is_empty()) {
            let up = if at.is_empty() {
                ".".to_owned()
            } else {
                at.clone()
            };
            at = if at.is_empty() {
                comp.to_owned()
            } else {
                format!("{at}/{comp}")
            };
            if open_in_root(root, &at, libc::O_PATH | libc::O_DIRECTORY, 0).is_ok() {
                continue;
            }
            let upfd = open_in_root(root, &up, libc::O_PATH | libc::O_DIRECTORY, 0)?;
            let c = CString::new(comp).unwrap_or_default();
            // SAFETY: valid descriptor and NUL-terminated name.
            let rc = unsafe { libc::mkdirat(upfd.as_raw_fd(), c.as_ptr(), 0o755) };
            if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                return Err(JailError::Sys {
                    step: format!("mkdir /{at} in the sandbox"),
                    source: std::io::Error::last_os_error(),
                });
            }
        }
        // Non-blocking and no terminal: a FIFO or device there is refused below, not waited on.
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_NONBLOCK | libc::O_NOCTTY;
        let fd = open_in_root(root, rel, flags, 0o600)?;
        let mut file = std::fs::File::from(fd);
        let md = file.metadata().map_err(io(format!("stat {}", f.path)))?;
        if !md.file_type().is_file() {
            return Err(JailError::Init(format!(
                "{} in the template is not a regular file",
                f.path
            )));
        }
        let step = |what: &str| format!("{what} {} in the sandbox", f.path);
        file.set_len(0).map_err(io(step("truncate")))?;
        std::io::Write::write_all(&mut file, f.text.as_bytes()).map_err(io(step("write")))?;
        std::os::unix::fs::fchown(&file, Some(0), Some(0)).map_err(io(step("chown")))?;
        file.set_permissions(std::fs::Permissions::from_mode(f.mode))
            .map_err(io(step("chmod")))?;
    }
    Ok(())
}

/// Hides a directory (if it exists) under an empty read-only tmpfs.
fn mask_dir(p: &Path) -> Result<(), JailError> {
    if !p.is_dir() {
        return Ok(());
    }
    sys::mount(
        Some("tmpfs"),
        p,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY,
        Some("size=0"),
    )
}

fn loopback_up() -> Result<(), JailError> {
    // SAFETY: socket(2).
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    let s = sys::check(s.into(), || "socket for loopback".into())? as RawFd;
    // SAFETY: `s` is our new fd.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: an all-zero ifreq is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: valid ifreq for SIOCGIFFLAGS/SIOCSIFFLAGS.
    unsafe {
        sys::check(
            libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr).into(),
            || "SIOCGIFFLAGS lo".into(),
        )?;
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        sys::check(
            libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr).into(),
            || "SIOCSIFFLAGS lo".into(),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::format_boot_id;

    #[test]
    fn a_boot_id_is_a_version_4_uuid_as_the_kernel_writes_it() {
        let id = format_boot_id([0xff; 16]);
        assert_eq!(id, "ffffffff-ffff-4fff-bfff-ffffffffffff\n");
        let id = format_boot_id([0; 16]);
        assert_eq!(id, "00000000-0000-4000-8000-000000000000\n");
    }
}
