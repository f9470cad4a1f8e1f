//! `rampart-jailer`: prepares one sandbox and starts its agent as PID 1. Spawned by the
//! daemon (`Jail::launch`), which writes a [`rampart_jail::JailerSpec`] as JSON to its stdin;
//! it answers with one JSON line on stdout: `{"pid":N}` or `{"error":"..."}`.
use rampart_jail::{jailer, JailerResult, JailerSpec};
use std::io::{Read, Write};

fn main() {
    let res = (|| {
        let mut input = String::new();
        std::io::stdin()
            .read_to_string(&mut input)
            .map_err(|e| format!("read spec: {e}"))?;
        let spec: JailerSpec =
            serde_json::from_str(&input).map_err(|e| format!("bad jailer spec: {e}"))?;
        jailer::run(&spec).map_err(|e| e.to_string())
    })();
    let out = match res {
        Ok(pid) => JailerResult {
            pid: Some(pid),
            error: None,
        },
        Err(e) => JailerResult {
            pid: None,
            error: Some(e),
        },
    };
    let line = serde_json::to_string(&out).unwrap_or_else(|_| "{\"error\":\"encode\"}".into());
    let mut so = std::io::stdout().lock();
    let _ = writeln!(so, "{line}");
    let _ = so.flush();
    std::process::exit(if out.pid.is_some() { 0 } else { 1 });
}
