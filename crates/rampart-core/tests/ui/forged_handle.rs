// A handle cannot be made by hand: its fields are private, so a struct literal is refused
// (the only way to one is `Manager::sandbox`, which checks that the caller may see it).
use rampart_core::{Principal, Sandbox};
use rampart_types::SandboxId;

fn forge(who: Principal, id: SandboxId) -> Sandbox<'static> {
    Sandbox { who, id }
}

fn main() {
    let _ = forge;
}
