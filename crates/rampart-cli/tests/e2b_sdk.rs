//! Compatibility (tier 4): the unmodified E2B SDKs from PyPI (`e2b==2.63.0`,
//! `e2b-code-interpreter==2.11.5`) and npm (`e2b`, `@e2b/code-interpreter`) against a real
//! daemon, configured only by `E2B_API_KEY`, `E2B_API_URL` and `E2B_SANDBOX_URL`.
//!
//! `scripts/test` makes the Python virtual environment (`target/e2b-venv`) and the npm
//! directory (`target/e2b-node`); without them (no registry access) this prints
//! `skipped: <reason>`. `RAMPART_E2B_VENV` / `RAMPART_E2B_NODE` point elsewhere. The scripts
//! are in `tests/e2b/`; each prints `PASS name` / `FAIL name: why` per test.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use support::{client, start_tidy, Tidy};

use support::{target_dir, workspace};

fn venv_python() -> PathBuf {
    support::venv_python("RAMPART_E2B_VENV", "e2b-venv")
}

fn node_dir() -> PathBuf {
    std::env::var_os("RAMPART_E2B_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("e2b-node"))
}

fn skip_reason() -> Option<String> {
    if let Some(why) = support::skip_reason() {
        return Some(why);
    }
    support::venv_lacks(
        &venv_python(),
        "e2b, httpx",
        "scripts/test makes it with `pip install e2b==2.63.0`",
    )
}

/// Runs a script with only the three E2B variables (plus PATH/HOME) set; returns
/// `(passed names, failed lines)`.
fn run_script(
    d: &Tidy,
    key: &str,
    program: &Path,
    script: &Path,
    cwd: &Path,
) -> (Vec<String>, Vec<String>) {
    let out = Command::new(program)
        .arg(script)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(
            "HOME",
            std::env::var_os("HOME").unwrap_or_else(|| "/root".into()),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("E2B_API_KEY", key)
        .env("E2B_API_URL", &d.url)
        .env("E2B_SANDBOX_URL", &d.url)
        .stdin(Stdio::null())
        .output()
        .expect("run the SDK script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- {} ---\n{stdout}{stderr}", script.display());
    let passed = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("PASS "))
        .map(str::to_owned)
        .collect::<Vec<_>>();
    let mut failed = stdout
        .lines()
        .filter(|l| l.starts_with("FAIL "))
        .map(str::to_owned)
        .collect::<Vec<_>>();
    if !stdout.contains("SUMMARY ") {
        failed.push(format!(
            "{} did not finish: {}",
            script.display(),
            out.status
        ));
    }
    (passed, failed)
}

/// Why the code-interpreter template cannot run here, if it cannot: its kernels are the
/// host's (every sandbox sees its /usr), installed by scripts/setup-host.sh.
fn kernel_missing() -> Option<String> {
    let ok = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    let kernels = Path::new("/usr/local/lib/rampart-kernels");
    let deno = std::fs::read_dir(kernels.join("node/node_modules/@deno"))
        .map(|rd| rd.flatten().any(|e| e.path().join("deno").is_file()))
        .unwrap_or(false);
    let missing: Vec<&str> = [
        (
            ok(
                "/usr/bin/python3",
                &["-c", "import ipykernel, jupyter_client, matplotlib, pandas"],
            ),
            "python3-ipykernel, -jupyter-client, -matplotlib or -pandas",
        ),
        (
            ok("/usr/bin/Rscript", &["-e", "library(IRkernel)"]),
            "r-base-core or r-cran-irkernel",
        ),
        (
            ok("jshell", &["--version"]),
            "default-jdk-headless (jshell)",
        ),
        (
            kernels.join("python/bash_kernel").is_dir(),
            "bash_kernel in /usr/local/lib/rampart-kernels/python",
        ),
        (deno, "deno in /usr/local/lib/rampart-kernels/node"),
    ]
    .into_iter()
    .filter(|(present, _)| !present)
    .map(|(_, what)| what)
    .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "the code interpreter's kernels are missing on this host: {} \
             (scripts/setup-host.sh installs them)",
            missing.join(", ")
        )
    })
}

#[test]
fn e2b_sdks_run_unmodified_against_rampart() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = start_tidy("e2b-sdk");
    let data = d.data.clone();

    // The daemon made a first key at start, in a 0600 file.
    let first = data.join("api-key");
    let meta = std::fs::metadata(&first).expect("the daemon writes <data>/api-key");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let first_key = std::fs::read_to_string(&first).unwrap().trim().to_owned();
    assert!(
        first_key.starts_with("e2b_") && first_key.len() == 44,
        "{first_key}"
    );

    // `rampart keys create --json` makes another.
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args([
            "keys",
            "create",
            "--json",
            "--name",
            "sdk-test",
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let key = v["key"].as_str().unwrap().to_owned();
    let key_id = v["id"].as_str().unwrap().to_owned();

    // Control plane: wrong and missing keys are refused with E2B's error shape.
    let c = client();
    let r = c.get(format!("{}/v2/sandboxes", d.url)).send().unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let body: Value = r.json().unwrap();
    assert_eq!(body["code"], 401);
    assert!(body["message"].is_string());
    let r = c
        .get(format!("{}/v2/sandboxes", d.url))
        .header("x-api-key", "e2b_0000000000000000000000000000000000000000")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .get(format!("{}/v2/sandboxes", d.url))
        .header("x-api-key", &first_key)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    let tests = workspace().join("tests/e2b");
    let py = venv_python();
    let mut passed = Vec::new();
    let mut failed = Vec::new();
    for script in ["sdk_sync.py", "sdk_async.py"] {
        let (p, f) = run_script(&d, &key, &py, &tests.join(script), &tests);
        passed.extend(p);
        failed.extend(f);
    }
    // An older SDK release (scripts/e2b-sdks.sh pins it): the older routes.
    let old = support::venv_python("RAMPART_E2B_VENV_OLD", "e2b-venv-old");
    if old.exists() {
        let (p, f) = run_script(&d, &key, &old, &tests.join("sdk_old.py"), &tests);
        passed.extend(p);
        failed.extend(f);
    } else {
        eprintln!(
            "older SDK skipped: no {} (scripts/e2b-sdks.sh installs it)",
            old.display()
        );
    }
    // The code interpreter (`e2b-code-interpreter`, template code-interpreter-v1) needs the
    // host's IPython kernel, which every sandbox sees in its /usr (scripts/setup-host.sh).
    let kernels = kernel_missing();
    match &kernels {
        None => {
            let script = tests.join("code_interpreter.py");
            let (p, f) = run_script(&d, &key, &py, &script, &tests);
            passed.extend(p);
            failed.extend(f);
        }
        Some(why) => eprintln!("code interpreter skipped: {why}"),
    }
    let node_modules = node_dir().join("node_modules/e2b");
    if node_modules.is_dir() {
        // ESM resolves `e2b` from the script's own directory: run a copy placed there.
        let script = node_dir().join("rampart-sdk-test.mjs");
        std::fs::copy(tests.join("sdk.mjs"), &script).unwrap();
        let (p, f) = run_script(&d, &key, Path::new("node"), &script, &node_dir());
        passed.extend(p);
        failed.extend(f);
    } else {
        eprintln!(
            "JS SDK skipped: no {} (scripts/test runs `npm install e2b`)",
            node_modules.display()
        );
    }
    // The code interpreter's JS SDK (`@e2b/code-interpreter`), every language.
    let ci_modules = node_dir().join("node_modules/@e2b/code-interpreter");
    match (&kernels, ci_modules.is_dir()) {
        (None, true) => {
            let script = node_dir().join("rampart-code-interpreter-test.mjs");
            std::fs::copy(tests.join("code_interpreter.mjs"), &script).unwrap();
            let (p, f) = run_script(&d, &key, Path::new("node"), &script, &node_dir());
            passed.extend(p);
            failed.extend(f);
        }
        (Some(why), _) => eprintln!("code interpreter JS SDK skipped: {why}"),
        (None, false) => eprintln!(
            "code interpreter JS SDK skipped: no {} (scripts/e2b-sdks.sh installs it)",
            ci_modules.display()
        ),
    }

    // `rampart keys rm` revokes at once.
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["keys", "rm", &key_id, "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success());
    let r = c
        .get(format!("{}/v2/sandboxes", d.url))
        .header("x-api-key", &key)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);

    eprintln!("passed ({}): {passed:?}", passed.len());
    assert!(
        failed.is_empty(),
        "SDK tests failed:\n{}",
        failed.join("\n")
    );
    assert!(!passed.is_empty());
}
