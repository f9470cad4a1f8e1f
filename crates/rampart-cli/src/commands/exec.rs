//! `exec` and `shell`: run a command in a sandbox, streaming its output, and exit with its code.
//!
//! The plain case posts a streamed exec (NDJSON events). `--stdin` and `--tty` (and `shell`)
//! use the exec WebSocket: local stdin is forwarded, the terminal goes raw under `--tty` and
//! window resizes follow.

use super::parse_pairs;
use crate::client::{ApiFailure, Client, Lines};
use crate::term;
use anyhow::{anyhow, Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use clap::Args;
use futures::{SinkExt, StreamExt};
use rampart_types::{ApiErrorBody, ExecEvent, ExecInput, ExecRequest};
use reqwest::header::ACCEPT;
use reqwest::Method;
use std::io::Write;
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;

/// How a command is run (`exec` and `run`).
#[derive(Debug, Clone, Args)]
pub struct ExecFlags {
    /// User to run as (`user` by default, or `root`).
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Working directory (the user's home by default).
    #[arg(long, short = 'w')]
    pub cwd: Option<String>,
    /// Environment variable for this command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Forward this terminal's stdin to the command.
    #[arg(long, short = 'i')]
    pub stdin: bool,
    /// Run under a pseudo-terminal (raw local terminal, resizes forwarded).
    #[arg(long, short = 't')]
    pub tty: bool,
    /// Kill the command after SECS seconds (exit code 124).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
}

impl ExecFlags {
    /// The exec request for `cmd`.
    pub fn request(&self, cmd: Vec<String>) -> Result<ExecRequest> {
        Ok(ExecRequest {
            cmd,
            env: parse_pairs("--env", &self.env)?,
            cwd: self.cwd.clone(),
            user: self.user.clone(),
            timeout_secs: self.timeout,
            ..Default::default()
        })
    }
}

/// `rampart exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Sandbox id.
    id: String,
    #[command(flatten)]
    flags: ExecFlags,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
}

/// `rampart exec`.
pub async fn exec(host: &crate::client::Endpoint, a: ExecArgs) -> Result<u8> {
    let client = Client::new(host)?;
    run_command(&client, &a.id, &a.flags, a.cmd).await
}

/// Runs `cmd` in sandbox `id` as the flags say; returns the exit code to exit with.
pub async fn run_command(
    client: &Client,
    id: &str,
    flags: &ExecFlags,
    cmd: Vec<String>,
) -> Result<u8> {
    let req = flags.request(cmd)?;
    if flags.stdin || flags.tty {
        run_interactive(client, id, req, flags.tty, flags.stdin || flags.tty).await
    } else {
        run_streamed(client, id, req).await
    }
}

/// `rampart shell`.
#[derive(Debug, Args)]
pub struct ShellArgs {
    /// Sandbox id.
    id: String,
    /// User to log in as.
    #[arg(long, short = 'u')]
    user: Option<String>,
    /// Shell to run (as a login shell).
    #[arg(long, default_value = "bash")]
    shell: String,
}

/// `rampart shell`.
pub async fn shell(host: &crate::client::Endpoint, a: ShellArgs) -> Result<u8> {
    let client = Client::new(host)?;
    let mut env = std::collections::BTreeMap::new();
    env.insert(
        "TERM".to_owned(),
        std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".to_owned()),
    );
    let req = ExecRequest {
        cmd: vec![a.shell, "-l".into()],
        env,
        user: a.user,
        ..Default::default()
    };
    run_interactive(&client, &a.id, req, true, true).await
}

/// The exit code a finished command maps to: its own, 128+signal, 124 on timeout.
pub fn exit_status(exit_code: Option<i32>, signal: Option<i32>, timed_out: bool) -> u8 {
    if timed_out {
        return 124;
    }
    if let Some(s) = signal {
        return u8::try_from(128 + s.clamp(0, 127)).unwrap_or(255);
    }
    match exit_code {
        Some(c) => (c & 0xff) as u8,
        None => 255,
    }
}

/// What to do after one event.
enum Next {
    Continue,
    Exit(u8),
}

/// Writes one event's output; `Exit` at the end.
fn handle_event(ev: ExecEvent) -> Result<Next> {
    let write = |to_stderr: bool, data: &rampart_types::OutputBytes| -> Result<()> {
        let bytes = data.as_bytes();
        let r = if to_stderr {
            let mut e = std::io::stderr().lock();
            e.write_all(bytes).and_then(|_| e.flush())
        } else {
            let mut o = std::io::stdout().lock();
            o.write_all(bytes).and_then(|_| o.flush())
        };
        r.context("cannot write the command's output")
    };
    match ev {
        ExecEvent::Start { .. } => {}
        ExecEvent::Stdout { data } | ExecEvent::Pty { data } => write(false, &data)?,
        ExecEvent::Stderr { data } => write(true, &data)?,
        ExecEvent::Exit {
            exit_code,
            signal,
            timed_out,
            ..
        } => {
            if timed_out {
                eprintln!("rampart: the command timed out and was killed");
            }
            return Ok(Next::Exit(exit_status(exit_code, signal, timed_out)));
        }
        ExecEvent::Error { message } => return Err(anyhow!("the command failed: {message}")),
        ExecEvent::PendingApproval {
            approval_id,
            request,
        } => eprintln!(
            "rampart: the sandbox's policy holds `{request}` for approval {approval_id}; \
             waiting (rampart approve {approval_id} / rampart deny {approval_id})"
        ),
        ExecEvent::Denied { reason, .. } => {
            return Err(anyhow!("the command was not run: {reason}"))
        }
    }
    Ok(Next::Continue)
}

/// Streamed exec over HTTP (NDJSON).
async fn run_streamed(client: &Client, id: &str, mut req: ExecRequest) -> Result<u8> {
    req.stream = true;
    let resp = client
        .send(
            client
                .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .header(ACCEPT, "application/x-ndjson")
                .json(&req),
        )
        .await?;
    let mut lines = Lines::new(resp.bytes_stream());
    while let Some(line) = lines.next().await {
        let line = line.map_err(|e| client.transport_error(e))?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let ev: ExecEvent = serde_json::from_slice(&line)
            .context("the daemon sent an event this client does not understand")?;
        if let Next::Exit(code) = handle_event(ev)? {
            return Ok(code);
        }
    }
    Err(anyhow!(
        "the connection ended before the command's exit status arrived"
    ))
}

fn input_message(input: &ExecInput) -> Message {
    Message::text(serde_json::to_string(input).unwrap_or_default())
}

/// Interactive exec over the WebSocket.
async fn run_interactive(
    client: &Client,
    id: &str,
    mut req: ExecRequest,
    tty: bool,
    forward_stdin: bool,
) -> Result<u8> {
    use tokio_tungstenite::tungstenite::Error as WsError;
    let url = format!("/v1/sandboxes/{id}/exec/ws");
    let ws = match client.websocket(&url).await {
        Ok(ok) => ok,
        Err(WsError::Http(resp)) => {
            let status = resp.status().as_u16();
            let body = resp.body().clone().unwrap_or_default();
            return Err(match serde_json::from_slice::<ApiErrorBody>(&body) {
                Ok(b) => ApiFailure {
                    code: b.error.code,
                    message: b.error.message,
                }
                .into(),
                Err(_) => anyhow!("the daemon refused the exec WebSocket ({status})"),
            });
        }
        Err(WsError::Io(e)) => {
            return Err(anyhow!(
                "cannot reach the Rampart daemon at {}: {e}: is it running? start it with \
                 `rampart serve` (or point --host / RAMPART_HOST, or --socket / \
                 RAMPART_SOCKET, at it)",
                client.place()
            ))
        }
        Err(e) => return Err(anyhow!("exec WebSocket to {url} failed: {e}")),
    };
    let (mut tx, mut rx) = ws.split();

    if tty {
        let (cols, rows) = term::size().unwrap_or((80, 24));
        req.tty = Some([cols, rows]);
    }
    tx.send(Message::text(serde_json::to_string(&req)?))
        .await
        .context("exec WebSocket")?;
    // Raw mode only once the request is sent; restored when this function returns.
    let _raw = if tty { term::RawMode::enter() } else { None };

    // Local stdin, read on its own task.
    let (in_tx, mut in_rx) = tokio::sync::mpsc::channel::<Option<Bytes>>(8);
    if forward_stdin {
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = in_tx.send(None).await;
                        break;
                    }
                    Ok(n) => {
                        if in_tx
                            .send(Some(Bytes::copy_from_slice(&buf[..n])))
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
        });
    } else {
        drop(in_tx);
    }
    let mut stdin_open = forward_stdin;
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        .context("cannot watch terminal resizes")?;
    // One stream for the whole session, so no interrupt is lost between loop iterations.
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("cannot watch interrupts")?;
    let mut interrupts = 0u32;

    loop {
        tokio::select! {
            msg = rx.next() => {
                let text = match msg {
                    Some(Ok(Message::Text(t))) => t.to_string(),
                    Some(Ok(Message::Binary(b))) => String::from_utf8_lossy(&b).into_owned(),
                    Some(Ok(Message::Close(_))) | None => {
                        return Err(anyhow!("the daemon closed the session before the command's exit status arrived"));
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(anyhow!("exec WebSocket failed: {e}")),
                };
                let ev: ExecEvent = serde_json::from_str(&text)
                    .context("the daemon sent an event this client does not understand")?;
                if let Next::Exit(code) = handle_event(ev)? {
                    let _ = tx.send(Message::Close(None)).await;
                    return Ok(code);
                }
            }
            chunk = in_rx.recv(), if stdin_open => {
                let input = match chunk {
                    Some(Some(data)) => ExecInput::Stdin { data: B64.encode(&data) },
                    Some(None) | None => {
                        stdin_open = false;
                        ExecInput::CloseStdin
                    }
                };
                tx.send(input_message(&input)).await.context("exec WebSocket")?;
            }
            _ = winch.recv(), if tty => {
                if let Some((cols, rows)) = term::size() {
                    tx.send(input_message(&ExecInput::Resize { cols, rows })).await.context("exec WebSocket")?;
                }
            }
            _ = sigint.recv() => {
                // SIGTERM first, SIGKILL on the second interrupt.
                interrupts += 1;
                let kill = interrupts > 1;
                tx.send(input_message(&ExecInput::Signal { kill })).await.context("exec WebSocket")?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses() {
        assert_eq!(exit_status(Some(0), None, false), 0);
        assert_eq!(exit_status(Some(3), None, false), 3);
        assert_eq!(exit_status(Some(256 + 7), None, false), 7);
        assert_eq!(exit_status(None, Some(9), false), 137);
        assert_eq!(exit_status(None, Some(9), true), 124);
    }
}
