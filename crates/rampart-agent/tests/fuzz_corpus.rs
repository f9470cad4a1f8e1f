//! Replays the committed fuzz corpora (`fuzz/corpus/agent_request/`, `fuzz/corpus/agent_path/`)
//! and the crash inputs kept as regressions (`fuzz/artifacts-found/agent_*`) through the same
//! checks the fuzz targets run (`fuzz/checks/*.rs`), under plain `cargo test`.

#[path = "../../../fuzz/checks/agent_request.rs"]
mod agent_request;

#[path = "../../../fuzz/checks/agent_path.rs"]
mod agent_path;

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// Every file of `fuzz/corpus/<target>/` and every `fuzz/artifacts-found/<target>-*`.
fn inputs(target: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(fuzz_dir().join("corpus").join(target))
        .unwrap_or_else(|e| panic!("fuzz/corpus/{target}: {e}"))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    if let Ok(rd) = std::fs::read_dir(fuzz_dir().join("artifacts-found")) {
        out.extend(rd.map(|e| e.expect("artifact entry").path()).filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{target}-")))
        }));
    }
    out.sort();
    out
}

fn replay(target: &str, check: fn(&[u8])) {
    let files = inputs(target);
    assert!(
        files.len() >= 10,
        "only {} inputs for {target}",
        files.len()
    );
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        // Shown with the panic message if this input fails the checks.
        eprintln!("{target}: {}", f.display());
        check(&data);
    }
}

#[test]
fn agent_request_corpus() {
    replay("agent_request", agent_request::check);
}

#[test]
fn agent_path_corpus() {
    replay("agent_path", agent_path::check);
    agent_path::cleanup();
}
