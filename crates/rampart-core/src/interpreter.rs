//! The `code-interpreter-v1` template: the `base` template plus E2B's code-interpreter API,
//! served by `templates/code-interpreter/server.py` (embedded here, with the files it loads)
//! over Jupyter kernels.
//!
//! The template's rootfs is `base`'s with the server and its files in [`SERVER_DIR`]
//! ([`FILES`]); the kernels come from the host's `/usr`, which every sandbox sees
//! (`scripts/setup-host.sh` installs them): IPython with matplotlib and pandas, R's IRkernel,
//! the JDK's JShell (under the Java kernel shipped here), and in `/usr/local/lib/rampart-kernels`
//! Deno (JavaScript, TypeScript) and bash_kernel. At create, core starts the server through the
//! agent as `user`, tagged [`TAG`], and answers only once it listens on [`PORT`] (it listens
//! after its default Python kernel is ready).

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
/// (strings as text, DataFrames' `data`, matplotlib charts), and the Java kernel over JShell.
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
];
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

/// Host `/etc` files the kernel's libraries need that `base` does not copy: Debian's
/// matplotlib reads its defaults only from `/etc/matplotlibrc`.
const ETC_FILES: &[&str] = &["matplotlibrc"];

/// [`install`] with the host's `/etc` given (for tests).
///
/// Sandboxes read what this writes through their idmapped mounts, as `user`: every mode is
/// set explicitly (directories 0755, files 0644), never left to the daemon's umask (0077).
fn install_from(template_dir: &Path, host_etc: &Path) -> std::io::Result<()> {
    let rootfs = template_dir.join("rootfs");
    for name in ETC_FILES {
        let Ok(want) = std::fs::read(host_etc.join(name)) else {
            continue;
        };
        let dest = rootfs.join("etc").join(name);
        if std::fs::read(&dest).is_ok_and(|b| b == want) {
            continue;
        }
        make_dirs(&rootfs, Path::new("etc"))?;
        let tmp = dest.with_extension("tmp");
        write_public(&tmp, &want)?;
        std::fs::rename(&tmp, &dest)?;
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
        user: Some("user".into()),
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
    fn install_writes_the_server_once() {
        let d = tempfile::tempdir().unwrap();
        let etc = tempfile::tempdir().unwrap();
        std::fs::write(etc.path().join("matplotlibrc"), "backend: agg\n").unwrap();
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
            ("rootfs/opt", 0o755),
            ("rootfs/opt/rampart", 0o755),
            ("rootfs/opt/rampart/code-interpreter", 0o755),
            ("rootfs/opt/rampart/code-interpreter/server.py", 0o644),
            ("rootfs/opt/rampart/code-interpreter/rampart_ipython.py", 0o644),
            ("rootfs/opt/rampart/code-interpreter/java_kernel.py", 0o644),
            ("rootfs/opt/rampart/code-interpreter/JShellBridge.java", 0o644),
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
    }
}
