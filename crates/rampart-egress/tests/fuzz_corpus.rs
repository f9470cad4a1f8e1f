//! Replays the committed fuzz corpus (`fuzz/corpus/egress_peek/`) and any inputs kept as
//! regressions (`fuzz/artifacts-found/egress_peek-*`) through the same checks the fuzz target
//! runs (`fuzz/checks/egress_peek.rs`), under plain `cargo test`.

#[path = "../../../fuzz/checks/egress_peek.rs"]
mod egress_peek;

use std::path::{Path, PathBuf};

fn inputs() -> Vec<PathBuf> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut out: Vec<PathBuf> = std::fs::read_dir(fuzz.join("corpus/egress_peek"))
        .unwrap_or_else(|e| panic!("fuzz/corpus/egress_peek: {e}"))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    if let Ok(rd) = std::fs::read_dir(fuzz.join("artifacts-found")) {
        out.extend(rd.map(|e| e.expect("artifact entry").path()).filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("egress_peek-"))
        }));
    }
    out.sort();
    out
}

#[test]
fn egress_peek_corpus() {
    let files = inputs();
    assert!(files.len() >= 10, "only {} inputs", files.len());
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        // Shown with the panic message if this input fails the checks.
        eprintln!("egress_peek: {}", f.display());
        egress_peek::check(&data);
    }
}
