//! Verification speed on a 100,000-event bundle. Not a timed test: run it in release and
//! read the numbers.
//!
//! `cargo test -p rampart-audit --release --test verify_speed -- --ignored --nocapture`

mod common;

use common::{session, Node};
use rampart_audit::verify_bundle;
use std::time::Instant;

#[test]
#[ignore = "benchmark: run in release with --ignored --nocapture"]
fn verify_100k_events() {
    let mut node = Node::new(7);
    let t = Instant::now();
    // Each command is an exec and an exit; the session adds 11 more records.
    let s = session(&mut node, "bench0000", 50_000 - 6);
    let built = t.elapsed();
    let n = s.events.len();
    let bundle = node.export(&s.chain, s.events, s.blobs).to_bytes();
    let key = node.key.public_key();
    println!(
        "built {n} events in {:.2?} ({:.0} events/s appended); bundle {} MB",
        built,
        n as f64 / built.as_secs_f64(),
        bundle.len() / 1_000_000
    );
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let report = verify_bundle(&bundle, Some(&key)).expect("verifies");
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(report.events, n as u64);
        best = best.min(secs);
    }
    println!(
        "verify_bundle: {n} events in {best:.3} s = {:.0} events/s (target >= 100000)",
        n as f64 / best
    );
}
