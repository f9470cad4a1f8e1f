//! The `code-interpreter-v1` template: the `base` template plus E2B's code-interpreter API,
//! served by `templates/code-interpreter/server.py` (embedded here, with the files it loads)
//! over Jupyter kernels.
//!
//! The template's rootfs is `base`'s with the server and its files in [`SERVER_DIR`]
//! ([`FILES`]); the kernels come from the host's `/usr`, which every sandbox sees
//! (`scripts/setup-host.sh` installs them): IPython with matplotlib and pandas, R's IRkernel,
//! the JDK's JShell (under the Java kernel shipped here), and in `/usr/local/lib/rampart-kernels`
//! Deno (JavaScript, TypeScript) and bash_kernel. At create, core starts the server through the
//! agent as root (as E2B runs its kernels) in `/home/user`, tagged [`TAG`], and answers only
//! once it listens on [`PORT`] (it listens after its default Python kernel is ready).

use crate::CoreError;
use futures::StreamExt as _;
use rampart_agent::client::{AgentClient, ClientError, ProcessEvent, StartOptions};
use std::path::Path;
use std::time::{Duration, Instant};

/// The template's name.
pub const TEMPLATE: &str = "code-interpreter-v1";
/// The port the server listens on inside the sandbox (E2B's `JUPYTER_PORT`).
pub const PORT: u16 = 49999;
/// The tag of the server's process (`commands.list()` shows it).
pub const TAG: &str = "code-interpreter";
/// Where the server and its files are inside the sandbox.
pub const SERVER_DIR: &str = "/opt/rampart/code-interpreter";
/// Where the server is inside the sandbox.
pub const SERVER_PATH: &str = "/opt/rampart/code-interpreter/server.py";
/// The server's source.
const SERVER: &str = include_str!("../templates/code-interpreter/server.py");
/// The files installed in [`SERVER_DIR`]: the server, what it loads into IPython kernels
/// (strings as text, DataFrames' `data`, matplotlib charts), the Java kernel over JShell and
/// the bash kernel that keeps stderr apart.
pub const FILES: &[(&str, &str)] = &[
    ("server.py", SERVER),
    (
        "rampart_ipython.py",
        include_str!("../templates/code-interpreter/rampart_ipython.py"),
    ),
    (
        "java_kernel.py",
        include_str!("../templates/code-interpreter/java_kernel.py"),
    ),
    (
        "JShellBridge.java",
        include_str!("../templates/code-interpreter/JShellBridge.java"),
    ),
    (
        "rampart_bash_kernel.py",
        include_str!("../templates/code-interpreter/rampart_bash_kernel.py"),
    ),
];
/// The memory a sandbox of the template gets when its create asks for none (the daemon's
/// default, 512 MiB, otherwise): each context is a kernel of its own, and one of every
/// language (Python with matplotlib, Deno for JavaScript and another for TypeScript, R, the
/// two JVMs of Java, bash) takes about 1 GiB. Never above the daemon's maximum.
pub const DEFAULT_MEMORY_BYTES: u64 = 2 << 30;

/// The default limits of a create of `template`: the daemon's, with at least
/// [`DEFAULT_MEMORY_BYTES`] (capped by `max`) for this template.
pub(crate) fn default_limits(
    interpreter: bool,
    defaults: &rampart_types::Limits,
    max: &rampart_types::Limits,
) -> rampart_types::Limits {
    let mut l = defaults.clone();
    if interpreter {
        l.memory_bytes = l
            .memory_bytes
            .max(DEFAULT_MEMORY_BYTES.min(max.memory_bytes));
    }
    l
}

/// How long a create waits for the server (and its first kernel) to listen.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// Most bytes of the server's output kept to explain a failed start.
const OUTPUT_TAIL: usize = 4096;

/// Puts the current server and its [`FILES`] into the template at `template_dir` (built from
/// `base`), each if it is not there already or differs (a newer daemon):
/// `rootfs/opt/rampart/code-interpreter/*`, owned by root, mode 0644. Blocking.
pub(crate) fn install(template_dir: &Path) -> std::io::Result<()> {
    install_from(template_dir, Path::new("/etc"))
}

/// Host `/etc` entries the kernels need that `base` does not copy: Debian's matplotlib reads
/// its defaults only from `/etc/matplotlibrc`; R reads `/etc/R` (`Renviron`, `ldpaths`, where
/// `/usr/lib/R/etc` points); the JDK's `conf` and `jvm.cfg` point into `/etc/java-*-openjdk`
/// (every such directory, see [`etc_entries`]). Files and directories, copied whole.
const ETC_FILES: &[&str] = &["matplotlibrc", "R"];

/// [`ETC_FILES`] and the JDKs' `/etc/java-N-openjdk` directories present in `host_etc`.
fn etc_entries(host_etc: &Path) -> Vec<String> {
    let mut names: Vec<String> = ETC_FILES.iter().map(|s| (*s).to_owned()).collect();
    if let Ok(rd) = std::fs::read_dir(host_etc) {
        let mut jdks: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("java-") && n.ends_with("-openjdk"))
            .collect();
        jdks.sort();
        names.extend(jdks);
    }
    names
}

/// [`install`] with the host's `/etc` given (for tests).
///
/// Sandboxes read what this writes through their idmapped mounts, as `user`: every mode is
/// set explicitly (directories 0755, files 0644), never left to the daemon's umask (0077).
fn install_from(template_dir: &Path, host_etc: &Path) -> std::io::Result<()> {
    let rootfs = template_dir.join("rootfs");
    for name in etc_entries(host_etc) {
        let src = host_etc.join(&name);
        let Ok(meta) = std::fs::symlink_metadata(&src) else {
            continue;
        };
        make_dirs(&rootfs, Path::new("etc"))?;
        copy_entry(&src, &rootfs.join("etc").join(&name), &meta)?;
    }
    let dir = Path::new(SERVER_DIR.trim_start_matches('/'));
    for (name, text) in FILES {
        let dest = rootfs.join(dir).join(name);
        if std::fs::read(&dest).is_ok_and(|b| b == text.as_bytes()) {
            continue;
        }
        make_dirs(&rootfs, dir)?;
        // Written aside and renamed over: a sandbox starting meanwhile sees one or the other.
        let tmp = rootfs.join(dir).join(format!(".{name}.tmp"));
        write_public(&tmp, text.as_bytes())?;
        std::fs::rename(&tmp, &dest)?;
    }
    Ok(())
}

/// Copies a host file, symlink or directory tree to `dest` (files 0644, or 0755 when
/// executable; directories 0755), replacing only what differs.
fn copy_entry(src: &Path, dest: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = std::fs::read_link(src)?;
        if std::fs::read_link(dest).is_ok_and(|t| t == target) {
            return Ok(());
        }
        if std::fs::symlink_metadata(dest).is_ok() {
            remove_any(dest)?;
        }
        return std::os::unix::fs::symlink(&target, dest);
    }
    if ft.is_dir() {
        if std::fs::symlink_metadata(dest).is_ok_and(|m| !m.is_dir()) {
            remove_any(dest)?;
        }
        std::fs::create_dir_all(dest)?;
        std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))?;
        for entry in std::fs::read_dir(src)? {
            let entry = entry?;
            let m = std::fs::symlink_metadata(entry.path())?;
            copy_entry(&entry.path(), &dest.join(entry.file_name()), &m)?;
        }
        return Ok(());
    }
    if !ft.is_file() || meta.permissions().mode() & 0o004 == 0 {
        // Sockets, fifos, devices: nothing a kernel reads. A file the host keeps from other
        // users stays out (it would be readable by everyone here).
        return Ok(());
    }
    let want = std::fs::read(src)?;
    let mode = if meta.permissions().mode() & 0o111 != 0 {
        0o755
    } else {
        0o644
    };
    if std::fs::read(dest).is_ok_and(|b| b == want)
        && std::fs::metadata(dest).is_ok_and(|m| m.permissions().mode() & 0o7777 == mode)
    {
        return Ok(());
    }
    if std::fs::symlink_metadata(dest).is_ok_and(|m| !m.is_file()) {
        remove_any(dest)?;
    }
    let name = dest
        .file_name()
        .ok_or_else(|| std::io::Error::other("a destination without a name"))?;
    let tmp = dest.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    write_public(&tmp, &want)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&tmp, dest)
}

fn remove_any(p: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(p)?.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
}

/// Makes `root` and `root/rel` (and every directory between) exist with mode 0755.
fn make_dirs(root: &Path, rel: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(root.join(rel))?;
    let mut d = root.to_path_buf();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
    for part in rel.components() {
        d.push(part);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// Writes `data` to `path` (replaced if there), mode 0644 whatever the umask.
fn write_public(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path)?;
    f.write_all(data)?;
    // The create's mode passed through the umask; an existing file kept its own.
    f.set_permissions(std::fs::Permissions::from_mode(0o644))
}

fn keep_tail(buf: &mut Vec<u8>, b: &[u8]) {
    buf.extend_from_slice(b);
    if buf.len() > OUTPUT_TAIL {
        buf.drain(..buf.len() - OUTPUT_TAIL);
    }
}

/// Starts the server in a sandbox whose agent answers, and waits until it listens (through
/// the agent's port tunnel). Fails with the server's output if it exits or does not listen
/// within a minute.
pub(crate) async fn start(client: &AgentClient) -> Result<(), CoreError> {
    let opts = StartOptions {
        cmd: "/usr/bin/python3".into(),
        args: vec![SERVER_PATH.into()],
        // As E2B's kernels: root inside the sandbox (an unprivileged uid outside), so any
        // directory root can enter is a context's cwd. The default contexts run in the
        // directory the server starts in.
        user: Some("root".into()),
        cwd: Some("/home/user".into()),
        tag: Some(TAG.into()),
        ..Default::default()
    };
    let mut events = client.start(opts).await?;
    let deadline = Instant::now() + READY_DEADLINE;
    let mut output = Vec::new();
    let mut delay = Duration::from_millis(20);
    loop {
        match client.tunnel(PORT).await {
            Ok(_) => return Ok(()),
            // Not listening yet.
            Err(ClientError::Rpc { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if Instant::now() >= deadline {
            return Err(CoreError::Internal(format!(
                "the code interpreter did not listen on port {PORT} within {} s: {}",
                READY_DEADLINE.as_secs(),
                String::from_utf8_lossy(&output).trim()
            )));
        }
        // Wait `delay`, meanwhile reading the server's output: its end means it failed.
        let pause = tokio::time::sleep(delay);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                ev = events.next() => match ev {
                    Some(Ok(ProcessEvent::Stdout(b) | ProcessEvent::Stderr(b))) => {
                        keep_tail(&mut output, &b);
                    }
                    Some(Ok(ProcessEvent::End { status, .. })) => {
                        return Err(CoreError::Internal(format!(
                            "the code interpreter exited ({status}): {}",
                            String::from_utf8_lossy(&output).trim()
                        )));
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.into()),
                    None => {
                        return Err(CoreError::Internal(format!(
                            "the code interpreter's output ended before it listened: {}",
                            String::from_utf8_lossy(&output).trim()
                        )));
                    }
                }
            }
        }
        delay = (delay * 2).min(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_gets_more_memory_by_default() {
        let d = rampart_types::Limits::default();
        let max = rampart_types::Limits {
            memory_bytes: 8 << 30,
            ..d.clone()
        };
        assert_eq!(
            default_limits(true, &d, &max).memory_bytes,
            DEFAULT_MEMORY_BYTES
        );
        assert_eq!(default_limits(false, &d, &max), d);
        assert_eq!(default_limits(false, &d, &max), d);
        // Never above the maximum, never below the daemon's own default.
        let small = rampart_types::Limits {
            memory_bytes: 1 << 30,
            ..d.clone()
        };
        assert_eq!(default_limits(true, &d, &small).memory_bytes, 1 << 30);
        let big = rampart_types::Limits {
            memory_bytes: 4 << 30,
            ..d.clone()
        };
        assert_eq!(default_limits(true, &big, &max).memory_bytes, 4 << 30);
    }

    #[test]
    fn install_writes_the_server_once() {
        let d = tempfile::tempdir().unwrap();
        let etc = tempfile::tempdir().unwrap();
        std::fs::write(etc.path().join("matplotlibrc"), "backend: agg\n").unwrap();
        std::fs::create_dir_all(etc.path().join("R")).unwrap();
        std::fs::write(etc.path().join("R/Renviron"), "R_HOME=x\n").unwrap();
        let jdk = etc.path().join("java-17-openjdk");
        std::fs::create_dir_all(jdk.join("security")).unwrap();
        std::fs::write(jdk.join("jvm-amd64.cfg"), "-server KNOWN\n").unwrap();
        std::fs::write(jdk.join("security/java.security"), "a=b\n").unwrap();
        std::os::unix::fs::symlink("jvm-amd64.cfg", jdk.join("link")).unwrap();
        // Not asked for: stays out.
        std::fs::write(etc.path().join("shadow"), "secret\n").unwrap();
        std::fs::create_dir_all(d.path().join("rootfs/opt")).unwrap();
        install_from(d.path(), etc.path()).unwrap();
        let mode = |p: &Path| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
        };
        for (rel, m) in [
            ("rootfs", 0o755),
            ("rootfs/etc", 0o755),
            ("rootfs/etc/matplotlibrc", 0o644),
            ("rootfs/etc/R", 0o755),
            ("rootfs/etc/R/Renviron", 0o644),
            ("rootfs/etc/java-17-openjdk/security", 0o755),
            ("rootfs/etc/java-17-openjdk/security/java.security", 0o644),
            ("rootfs/etc/java-17-openjdk/jvm-amd64.cfg", 0o644),
            ("rootfs/opt", 0o755),
            ("rootfs/opt/rampart", 0o755),
            ("rootfs/opt/rampart/code-interpreter", 0o755),
            ("rootfs/opt/rampart/code-interpreter/server.py", 0o644),
            (
                "rootfs/opt/rampart/code-interpreter/rampart_ipython.py",
                0o644,
            ),
            ("rootfs/opt/rampart/code-interpreter/java_kernel.py", 0o644),
            (
                "rootfs/opt/rampart/code-interpreter/JShellBridge.java",
                0o644,
            ),
            (
                "rootfs/opt/rampart/code-interpreter/rampart_bash_kernel.py",
                0o644,
            ),
        ] {
            assert_eq!(mode(&d.path().join(rel)), m, "{rel}");
        }
        let p = d
            .path()
            .join("rootfs")
            .join(SERVER_PATH.trim_start_matches('/'));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), SERVER);
        let rc = d.path().join("rootfs/etc/matplotlibrc");
        assert_eq!(std::fs::read_to_string(&rc).unwrap(), "backend: agg\n");
        // A stale copy is replaced.
        std::fs::write(&p, "old").unwrap();
        install_from(d.path(), etc.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), SERVER);
        assert!(SERVER.contains("/execute") && SERVER.contains("/contexts"));
        // Every file the server loads is installed next to it.
        for name in ["rampart_ipython.py", "java_kernel.py", "JShellBridge.java"] {
            let f = p.with_file_name(name);
            let want = FILES.iter().find(|(n, _)| *n == name).unwrap().1;
            assert_eq!(std::fs::read_to_string(&f).unwrap(), want, "{name}");
        }
        assert!(SERVER_PATH.starts_with(SERVER_DIR));
        let r = d.path().join("rootfs/etc");
        assert_eq!(
            std::fs::read_link(r.join("java-17-openjdk/link")).unwrap(),
            Path::new("jvm-amd64.cfg")
        );
        assert!(!r.join("shadow").exists());
        // A second install changes nothing and fails on nothing (links already there).
        install_from(d.path(), etc.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(r.join("R/Renviron")).unwrap(),
            "R_HOME=x\n"
        );
    }
}
