// Destroying a sandbox takes no id on the manager either: only the handle from
// `Manager::sandbox(&principal, &id)` has `destroy`.
use rampart_core::Manager;
use rampart_types::SandboxId;

async fn run(manager: &Manager, id: SandboxId) {
    let _ = manager.destroy(&id).await;
}

fn main() {
    let _ = run;
}
