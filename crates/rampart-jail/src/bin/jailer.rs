//! `rampart-jailer`: prepares one sandbox and starts its agent as PID 1. Spawned by the
//! daemon (`Jail::launch`), which writes a [`rampart_jail::JailerSpec`] as JSON to its stdin;
//! it answers with one JSON line on stdout: `{"pid":N}` or `{"error":"..."}`.
//!
//! A pool member first gets a [`rampart_jail::JailerPrepare`] line, prepares, answers
//! `{"ready":true}` and then waits for its spec.
use rampart_jail::{jailer, JailerPrepare, JailerResult, JailerSpec};
use std::io::{BufRead, Read, Write};

fn main() {
    // Whatever the daemon inherited and did not mark close-on-exec (its parent's files, pipes,
    // directories) ends here: the jailer holds only its three pipes to the daemon.
    if let Err(e) = rampart_jail::sys::close_fds_except(&[]) {
        eprintln!("rampart-jailer: {e}");
        std::process::exit(1);
    }
    // What the jailer creates is the sandbox's (its /dev, its disk's directories, files the
    // sandbox's users read): the daemon's private umask (0077) is not for them. Everything
    // that must be private is created with an explicit mode.
    // SAFETY: umask(2) has no preconditions.
    unsafe { libc::umask(0o022) };
    let res = (|| {
        let mut stdin = std::io::stdin().lock();
        let mut input = String::new();
        stdin
            .read_line(&mut input)
            .map_err(|e| format!("read spec: {e}"))?;
        let mut prepared = false;
        if let Ok(p) = serde_json::from_str::<JailerPrepare>(input.trim()) {
            jailer::prepare(&p.prepare_dir, &p.prepare_disk, &p.prepare_cgroup)
                .map_err(|e| e.to_string())?;
            let ready = JailerResult {
                ready: Some(true),
                ..JailerResult::default()
            };
            let line = serde_json::to_string(&ready).map_err(|e| e.to_string())?;
            let mut so = std::io::stdout().lock();
            writeln!(so, "{line}")
                .and_then(|()| so.flush())
                .map_err(|e| format!("answer ready: {e}"))?;
            prepared = true;
            input.clear();
        }
        stdin
            .read_to_string(&mut input)
            .map_err(|e| format!("read spec: {e}"))?;
        let spec: JailerSpec =
            serde_json::from_str(&input).map_err(|e| format!("bad jailer spec: {e}"))?;
        jailer::run(&spec, prepared).map_err(|e| e.to_string())
    })();
    let out = match res {
        Ok(pid) => JailerResult {
            pid: Some(pid),
            ..JailerResult::default()
        },
        Err(e) => JailerResult {
            error: Some(e),
            ..JailerResult::default()
        },
    };
    let line = serde_json::to_string(&out).unwrap_or_else(|_| "{\"error\":\"encode\"}".into());
    let mut so = std::io::stdout().lock();
    let _ = writeln!(so, "{line}");
    let _ = so.flush();
    std::process::exit(if out.pid.is_some() { 0 } else { 1 });
}
