//! `rampart-agent`: PID 1 of a sandbox.
fn main() {
    unimplemented!()
}
