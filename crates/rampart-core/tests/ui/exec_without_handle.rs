// A sandbox's verbs take no id on the manager: running a command needs the handle that
// `Manager::sandbox(&principal, &id)` gives after checking that the caller may see it.
use rampart_core::Manager;
use rampart_types::{ExecRequest, SandboxId};

async fn run(manager: &Manager, id: SandboxId) {
    let req = ExecRequest {
        cmd: vec!["id".to_owned()],
        ..ExecRequest::default()
    };
    let _ = manager.exec(&id, req, false).await;
}

fn main() {
    let _ = run;
}
