//! `cargo fuzz run agent_path`: see fuzz/README.md. The checks live in fuzz/checks/agent_path.rs, shared
//! with the corpus replay test under plain `cargo test`.
#![no_main]

#[path = "../checks/agent_path.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
