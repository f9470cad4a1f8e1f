//! Compile-fail tests: programs that misuse `rampart_core`'s API must not compile.
//!
//! Each case in `tests/ui/` is a small program with the compiler error it must fail with in
//! the `.stderr` beside it. They pin down that a sandbox's verbs are reachable only through a
//! [`rampart_core::Sandbox`] handle from `Manager::sandbox` (which checks that the caller may
//! see the sandbox), and that such a handle cannot be made by hand.
//!
//! When a compiler upgrade rewords a message: `TRYBUILD=overwrite cargo test -p rampart-core
//! --test compile_fail`, then read each changed `.stderr` to check that the case still fails
//! for its reason (see CONTRIBUTING.md).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
