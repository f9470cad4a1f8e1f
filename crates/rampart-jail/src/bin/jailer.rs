//! `rampart-jailer`: prepares one sandbox and execs its agent. Spawned by the daemon.
fn main() {
    unimplemented!()
}
