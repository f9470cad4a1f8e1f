//! The MCP server, driven as its users drive it: the official MCP Python SDK (PyPI `mcp`)
//! over stdio (`rampart mcp`, against the daemon with a key, and on its Unix socket with
//! none) and over Streamable HTTP (`/mcp` with the API key; without one, no session), every
//! tool, its failures as tool errors, and an agent framework (the OpenAI Agents SDK's MCP
//! clients, no model) loading the tools and calling `run_command`. The record names the MCP
//! client beside the key of each action.
//!
//! `scripts/test` makes the venv (`target/mcp-venv`, `scripts/mcp-sdks.sh`); without it, or
//! without root and the kernel features, the test prints `skipped: <reason>`.

mod support;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use support::workspace;

fn python() -> PathBuf {
    support::venv_python("RAMPART_MCP_VENV", "mcp-venv")
}

fn skip() -> Option<String> {
    if let Some(why) = support::skip_reason() {
        return Some(why);
    }
    let ok = Command::new(python())
        .args(["-c", "import mcp, agents"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!ok).then(|| {
        format!(
            "no Python venv with mcp and openai-agents at {} (scripts/mcp-sdks.sh makes it; needs PyPI)",
            python().display()
        )
    })
}

/// Runs one of `tests/mcp/*.py` with `envs`: (passed, failed, stdout).
fn script(
    name: &str,
    args: &[&str],
    envs: &[(&str, String)],
) -> (Vec<String>, Vec<String>, String) {
    let out = Command::new(python())
        .arg(workspace().join("tests/mcp").join(name))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(
            "HOME",
            std::env::var_os("HOME").unwrap_or_else(|| "/root".into()),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("RAMPART_BIN", env!("CARGO_BIN_EXE_rampart"))
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .output()
        .expect("run the MCP script");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- {name} {args:?} ---\n{stdout}{stderr}");
    let passed = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("PASS "))
        .map(str::to_owned)
        .collect();
    let mut failed: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with("FAIL "))
        .map(str::to_owned)
        .collect();
    if !stdout.contains("SUMMARY ") {
        failed.push(format!("{name} {args:?} did not finish: {}", out.status));
    }
    (passed, failed, stdout)
}

/// The caller of each `exec` in a sandbox's record.
fn exec_callers(url: &str, id: &str) -> Vec<String> {
    let v: Value = support::client()
        .get(format!("{url}/v1/sandboxes/{id}/audit?limit=1000"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["body"]["type"] == "exec")
        .map(|e| e["body"]["caller"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn mcp_sessions_over_stdio_and_http_and_an_agent_framework() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("mcp");
    let key = support::admin_key().to_owned();
    let url = d.url.clone();
    let mut failed = Vec::new();

    // No key, no session: `/mcp` is behind the API's guard.
    let bare = reqwest::blocking::Client::new();
    let anon = bare
        .post(format!("{url}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}"#)
        .send()
        .unwrap();
    assert_eq!(anon.status().as_u16(), 401, "/mcp without a key");

    // run_code needs the code interpreter's kernel from the host's /usr (setup-host.sh).
    let kernel = Command::new("/usr/bin/python3")
        .args(["-c", "import ipykernel, jupyter_client, matplotlib"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let no_interpreter = (!kernel).then(|| {
        "the host's /usr/bin/python3 lacks ipykernel, jupyter_client or matplotlib".to_owned()
    });
    for (transport, mut envs) in [
        (
            "stdio",
            vec![
                ("RAMPART_HOST", url.clone()),
                ("RAMPART_API_KEY", key.clone()),
            ],
        ),
        (
            "stdio",
            vec![(
                "RAMPART_SOCKET",
                d.data.join("rampart.sock").to_string_lossy().into_owned(),
            )],
        ),
        (
            "http",
            vec![
                ("RAMPART_URL", url.clone()),
                ("RAMPART_API_KEY", key.clone()),
            ],
        ),
    ] {
        if let Some(why) = &no_interpreter {
            envs.push(("RAMPART_NO_INTERPRETER", why.clone()));
        }
        let (passed, f, out) = script("session.py", &[transport], &envs);
        assert!(
            passed.len() >= 30,
            "{transport}: only {} passed",
            passed.len()
        );
        failed.extend(f);
        // The record names the MCP client (the SDK calls itself `mcp`) beside the principal.
        let id = out
            .lines()
            .find_map(|l| l.strip_prefix("SANDBOX "))
            .expect("the script names its sandbox");
        let callers = exec_callers(&url, id.trim());
        assert!(!callers.is_empty());
        for c in &callers {
            assert!(c.contains("via mcp:"), "{transport}: exec caller {c:?}");
            if envs.iter().any(|(k, _)| *k == "RAMPART_API_KEY") {
                assert!(c.starts_with("key:"), "{transport}: exec caller {c:?}");
            } else {
                assert!(
                    c.starts_with("socket uid 0"),
                    "{transport}: exec caller {c:?}"
                );
            }
        }
    }

    let (passed, f, _) = script(
        "agent.py",
        &[],
        &[
            ("RAMPART_URL", url.clone()),
            ("RAMPART_API_KEY", key.clone()),
        ],
    );
    assert_eq!(passed.len(), 4, "the agent framework's checks");
    failed.extend(f);
    assert!(failed.is_empty(), "failed:\n{}", failed.join("\n"));
}
