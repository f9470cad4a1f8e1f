//! The Python SDK (`sdk/python`, installed by `scripts/python-sdk.sh` into
//! `target/sdk-venv`) against a real daemon: its pytest suite (`sdk/python/tests`) with
//! `RAMPART_HOST` and `RAMPART_API_KEY`, including the README's example as written.
//! Without the venv, or without root and the kernel features, it prints `skipped: <reason>`.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use support::workspace;

fn python() -> PathBuf {
    support::venv_python("RAMPART_SDK_VENV", "sdk-venv")
}

#[test]
fn the_python_sdk_against_a_daemon() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let ready = Command::new(python())
        .args(["-c", "import httpx, pytest, websockets"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        eprintln!(
            "skipped: no venv with httpx, websockets and pytest at {} (scripts/python-sdk.sh makes it; needs PyPI)",
            python().display()
        );
        return;
    }
    // The SDK itself must import: a broken one fails here, it is not skipped.
    let import = Command::new(python())
        .args(["-c", "import rampart"])
        .output()
        .unwrap();
    assert!(
        import.status.success(),
        "the SDK does not import (scripts/python-sdk.sh installs it from sdk/python): {}",
        String::from_utf8_lossy(&import.stderr)
    );
    let d = support::start_tidy("python-sdk");
    let out = Command::new(python())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(workspace().join("sdk/python/tests"))
        .current_dir(std::env::temp_dir())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(
            "HOME",
            std::env::var_os("HOME").unwrap_or_else(|| "/root".into()),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("RAMPART_HOST", &d.url)
        .env("RAMPART_API_KEY", support::admin_key())
        .stdin(Stdio::null())
        .output()
        .expect("run pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "the SDK's tests failed:\n{text}");
    assert!(text.contains("16 passed"), "{text}");
}
