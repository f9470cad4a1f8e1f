// Nor by taking a handle to a sandbox the caller may see and swapping in another sandbox's
// id (functional update syntax needs the fields to be visible too).
use rampart_core::{CoreError, Manager, Principal, Sandbox};
use rampart_types::SandboxId;

fn forge<'m>(
    manager: &'m Manager,
    mine: &SandboxId,
    theirs: SandboxId,
) -> Result<Sandbox<'m>, CoreError> {
    let who = Principal::node("forger");
    let real = manager.sandbox(&who, mine)?;
    Ok(Sandbox { id: theirs, ..real })
}

fn main() {
    let _ = forge;
}
