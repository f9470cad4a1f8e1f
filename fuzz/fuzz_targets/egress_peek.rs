//! `cargo fuzz run egress_peek`: see fuzz/README.md. The checks live in fuzz/checks/egress_peek.rs, shared
//! with the corpus replay test under plain `cargo test`.
#![no_main]

#[path = "../checks/egress_peek.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
