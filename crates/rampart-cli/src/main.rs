//! `rampart`: the Rampart daemon (`rampart serve`) and the client commands that talk to it.

mod bench;
mod client;
mod commands;
mod data_dir;
mod term;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Rampart: sandboxes for AI agents.
#[derive(Debug, Parser)]
#[command(name = "rampart", version, about, propagate_version = true)]
struct Cli {
    /// The daemon's address over TCP (client commands); then RAMPART_API_KEY is sent.
    /// Default: the daemon's Unix socket when it can be reached, else http://127.0.0.1:3000.
    #[arg(long, global = true, env = "RAMPART_HOST")]
    host: Option<String>,
    /// The daemon's Unix socket. For client commands: default `<data>/rampart.sock` of the
    /// default data directory, else `/run/rampart/rampart.sock`, used when it can be
    /// connected to and no --host is given. For `serve`: where it listens (default
    /// `<data>/rampart.sock`; a directory it makes is 0750, group `rampart`, so the group's
    /// members can reach it).
    #[arg(long, global = true, env = "RAMPART_SOCKET", value_name = "PATH")]
    socket: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon.
    Serve(commands::serve::ServeArgs),
    /// Serve a fleet's API: many nodes behind one endpoint (docs/fleet.md).
    Gateway(commands::fleet::GatewayArgs),
    /// A fleet on this machine: `up` starts etcd, nodes and a gateway; `down` stops them.
    Fleet(commands::fleet::FleetArgs),
    /// A fleet's nodes, through its gateway (RAMPART_HOST): ls, drain, undrain.
    Node(commands::fleet::NodeArgs),
    /// Create a sandbox and print its id.
    Create(commands::sandbox::CreateArgs),
    /// Run a command in a sandbox; exits with the command's exit code.
    Exec(commands::exec::ExecArgs),
    /// Create a sandbox, run a command in it, destroy it; exits with the command's exit code.
    Run(commands::run::RunArgs),
    /// List sandboxes.
    #[command(alias = "list")]
    Ls(commands::sandbox::LsArgs),
    /// Destroy sandboxes.
    #[command(alias = "destroy")]
    Rm(commands::sandbox::RmArgs),
    /// Show a sandbox.
    Info(commands::sandbox::InfoArgs),
    /// Copy a file into or out of a sandbox (`ID:/path` on one side, `-` for stdin/stdout).
    Cp(commands::cp::CpArgs),
    /// What an ended sandbox kept (`create --artifact`): list, or download one file.
    Artifacts(commands::artifacts::ArtifactsArgs),
    /// A desktop sandbox's screen, input and browser: screenshot, click, move, type, key,
    /// scroll, browser (docs/desktop.md).
    Desktop(commands::desktop::DesktopArgs),
    /// Open an interactive shell (bash -l under a PTY) in a sandbox.
    Shell(commands::exec::ShellArgs),
    /// Pause sandboxes: freeze every process (no CPU used, memory kept); `--filesystem`:
    /// end every process and keep the disk.
    Pause(commands::sandbox::PauseArgs),
    /// Resume paused sandboxes: every process continues where it was (a sandbox paused to
    /// its filesystem, or with `--reboot`, boots again from its disk).
    Resume(commands::sandbox::ResumeArgs),
    /// Snapshots of a sandbox's filesystem: `snapshot ID [--name N] [--stop]`, `snapshot ls`,
    /// `snapshot rm NAME...`.
    Snapshot(commands::persist::SnapshotArgs),
    /// Make N sandboxes from one consistent point of a sandbox.
    Fork(commands::persist::ForkArgs),
    /// Named volumes with a size quota: create, ls, rm.
    Volume(commands::persist::VolumeArgs),
    /// Set a sandbox's deadline to SECS seconds from now.
    Timeout(commands::sandbox::TimeoutArgs),
    /// Print the URLs of a port of a sandbox (path and host form); --public opens it to all.
    Port(commands::port::PortArgs),
    /// A sandbox's network: `net set ID --net-mode M --allow R --deny R`, `net show ID`,
    /// `net log ID [--follow]`.
    Net(commands::net::NetArgs),
    /// Named secrets held by the daemon: `secret set NAME --to HOST [--header 'H: T {value}' |
    /// --basic USER] [--env VAR]` (value on stdin or --value-file), `secret ls`, `secret rm`.
    Secret(commands::secret::SecretArgs),
    /// Manage API keys: of the native API (--native) and of the E2B-compatible API (on the
    /// daemon's host).
    Keys(commands::keys::KeysArgs),
    /// The MCP server on stdin/stdout: sandboxes as tools for agents (Claude Code, Codex,
    /// Cursor...), calling this daemon.
    Mcp(commands::mcp::McpArgs),
    /// Tenants and their quotas (the node administrator's): create, ls, show, set, rm.
    Tenant(commands::tenant::TenantArgs),
    /// Usage of sandboxes (a tenant's own, or any as the administrator), signed by the node;
    /// `usage verify FILE` checks a report offline.
    Usage(commands::tenant::UsageArgs),
    /// The requests sandboxes' approval policies hold (a key with the `approve` scope).
    Approvals(commands::approve::ApprovalsArgs),
    /// Approve a held request: it runs exactly as it was asked.
    Approve(commands::approve::DecideArgs),
    /// Deny a held request: it is refused (403 `denied`) and never starts.
    Deny(commands::approve::DecideArgs),
    /// The signed record of what ran in a sandbox: show, export, verify.
    Audit(commands::audit::AuditArgs),
    /// Run a recorded session (a bundle) again in a fresh sandbox and compare step by step.
    Replay(commands::replay::ReplayArgs),
    /// Templates: build from a spec, ls, inspect, rm, gc (on the daemon's data directory).
    Template(commands::template::TemplateArgs),
    /// Measure Rampart side by side with bwrap, runc and unshare on this machine.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    // Descriptors this process inherited beyond stdio (a parent's open files, directories,
    // pipes) reach no process it starts: the daemon spawns jailers, builders and tools.
    // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC only sets flags on our descriptors.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    let cli = Cli::parse();
    // The benchmark drives the API with blocking clients from plain threads, outside any
    // async runtime.
    if let Command::Bench(args) = cli.command {
        return match bench::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rampart bench: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    if let Command::Template(args) = cli.command {
        return match commands::template::run(args) {
            Ok(code) => ExitCode::from(code),
            Err(e) => {
                eprintln!("rampart template: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    if let Command::Fleet(args) = cli.command {
        return match commands::fleet::fleet(args) {
            Ok(code) => ExitCode::from(code),
            Err(e) => {
                eprintln!("rampart fleet: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    if let Command::Node(args) = cli.command {
        let key = std::env::var("RAMPART_API_KEY").ok();
        return match commands::fleet::node(args, cli.host.clone(), key) {
            Ok(code) => ExitCode::from(code),
            Err(e) => {
                eprintln!("rampart node: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    if let Command::Keys(args) = cli.command {
        let key = std::env::var("RAMPART_API_KEY").ok();
        return match commands::keys::run(args, cli.host.clone(), key) {
            Ok(code) => ExitCode::from(code),
            Err(e) => {
                eprintln!("rampart keys: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rampart: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let serve_socket = cli.socket.clone();
    let host =
        &client::Endpoint::resolve(cli.host, cli.socket, std::env::var("RAMPART_API_KEY").ok());
    // Like `docker run`: 125 when rampart itself fails, so it is not taken for the command's.
    let failure = match cli.command {
        Command::Exec(_) | Command::Run(_) | Command::Shell(_) => 125,
        _ => 1,
    };
    let result = rt.block_on(async move {
        match cli.command {
            Command::Serve(a) => commands::serve::run(a, serve_socket).await,
            Command::Gateway(a) => commands::fleet::gateway(a).await,
            Command::Create(a) => commands::sandbox::create(host, a).await,
            Command::Exec(a) => commands::exec::exec(host, a).await,
            Command::Run(a) => commands::run::run(host, a).await,
            Command::Ls(a) => commands::sandbox::ls(host, a).await,
            Command::Rm(a) => commands::sandbox::rm(host, a).await,
            Command::Info(a) => commands::sandbox::info(host, a).await,
            Command::Cp(a) => commands::cp::cp(host, a).await,
            Command::Artifacts(a) => commands::artifacts::artifacts(host, a).await,
            Command::Desktop(a) => commands::desktop::desktop(host, a).await,
            Command::Shell(a) => commands::exec::shell(host, a).await,
            Command::Timeout(a) => commands::sandbox::timeout(host, a).await,
            Command::Port(a) => commands::port::port(host, a).await,
            Command::Pause(a) => commands::sandbox::pause(host, &a.ids, false, a.kind()).await,
            Command::Resume(a) => {
                let kind = if a.reboot {
                    commands::sandbox::PauseKind::Filesystem
                } else {
                    commands::sandbox::PauseKind::Freeze
                };
                commands::sandbox::pause(host, &a.ids, true, kind).await
            }
            Command::Audit(a) => commands::audit::audit(host, a).await,
            Command::Snapshot(a) => commands::persist::snapshot(host, a).await,
            Command::Fork(a) => commands::persist::fork(host, a).await,
            Command::Volume(a) => commands::persist::volume(host, a).await,
            Command::Net(a) => commands::net::net(host, a).await,
            Command::Secret(a) => commands::secret::secret(host, a).await,
            Command::Replay(a) => commands::replay::replay(host, a).await,
            Command::Tenant(a) => commands::tenant::tenant(host, a).await,
            Command::Mcp(a) => commands::mcp::run(host, a).await,
            Command::Usage(a) => commands::tenant::usage(host, a).await,
            Command::Approvals(a) => commands::approve::list(host, a).await,
            Command::Approve(a) => commands::approve::decide(host, a, true).await,
            Command::Deny(a) => commands::approve::decide(host, a, false).await,
            Command::Bench(_)
            | Command::Keys(_)
            | Command::Template(_)
            | Command::Fleet(_)
            | Command::Node(_) => {
                unreachable!("bench and keys run before the runtime starts")
            }
        }
    });
    // Do not wait for tasks still blocked on stdin.
    rt.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("rampart: {e:#}");
            ExitCode::from(failure)
        }
    }
}
