//! `rampart run`: create, run one command, destroy (always), exit with the command's code.

use super::exec::{run_command, ExecFlags};
use super::sandbox::{create_sandbox, destroy_sandbox, CreateFlags};
use crate::client::Client;
use anyhow::{Context, Result};
use clap::Args;

/// `rampart run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    create: CreateFlags,
    /// User to run as (`user` by default, or `root`).
    #[arg(long, short = 'u')]
    user: Option<String>,
    /// Working directory (the user's home by default).
    #[arg(long, short = 'w')]
    cwd: Option<String>,
    /// Forward this terminal's stdin to the command.
    #[arg(long, short = 'i')]
    stdin: bool,
    /// Run under a pseudo-terminal.
    #[arg(long)]
    tty: bool,
    /// Kill the command after SECS seconds (exit code 124); the sandbox's own timeout is
    /// `--timeout`.
    #[arg(long, value_name = "SECS")]
    exec_timeout: Option<u64>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
}

/// `rampart run`.
pub async fn run(host: &crate::client::Endpoint, a: RunArgs) -> Result<u8> {
    let client = Client::new(host)?;
    let req = a.create.request()?;
    let flags = ExecFlags {
        user: a.user,
        cwd: a.cwd,
        // `--env` of run applies to the sandbox (and so to the command).
        env: Vec::new(),
        stdin: a.stdin,
        tty: a.tty,
        timeout: a.exec_timeout,
    };
    // Watch SIGINT and SIGTERM before the sandbox exists: one that arrives during the create
    // is acted on right after it, so the sandbox is still destroyed.
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt()).context("cannot watch interrupts")?;
    let mut sigterm = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let info = create_sandbox(&client, &req).await?;
    let id = info.id.to_string();
    let outcome = tokio::select! {
        r = run_command(&client, &id, &flags, a.cmd) => r,
        _ = sigint.recv() => {
            eprintln!("rampart: interrupted; destroying sandbox {id}");
            Ok(130)
        }
        _ = sigterm.recv() => {
            eprintln!("rampart: terminated; destroying sandbox {id}");
            Ok(143)
        }
    };
    if let Err(e) = destroy_sandbox(&client, &id).await {
        eprintln!("rampart: could not destroy sandbox {id}: {e:#}\n  hint: remove it with `rampart rm {id}`");
    }
    outcome
}
