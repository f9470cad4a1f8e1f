//! The E2B drop-in's last mile (issue 31, items 1-7), through the unmodified SDKs (`e2b==2.63.0`
//! and `e2b-code-interpreter==2.11.5` from PyPI, `e2b` and `@e2b/code-interpreter` from npm)
//! against a real daemon, configured only by `E2B_API_KEY`, `E2B_API_URL` and
//! `E2B_SANDBOX_URL`:
//!
//! - `tests/e2b/last_mile.py` / `last_mile.mjs`: files the kernel makes (procfs, size 0) read
//!   to their end; a boot id per boot (create, a resume from the disk, a fork), never the
//!   host's; `Template.exists` of the built-in templates by E2B's names; the SDK's "killed or
//!   reached its end of life" error for a sandbox killed while a command streams; a write
//!   that makes its missing parent directories.
//! - `tests/e2b/last_mile_ci.py` / `last_mile_ci.mjs`: the code interpreter's default
//!   contexts (Python and JavaScript), a context in `/root`, Java's environment and printed
//!   lines, chart details, PIL's show() and save().
//!
//! Needs root, the binaries and the SDKs `scripts/test` installs (`target/e2b-venv`,
//! `target/e2b-node`); the code interpreter's part needs its kernels on the host
//! (`scripts/setup-host.sh`). What is missing prints `skipped: <reason>`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use support::{start_tidy, target_dir, workspace, Tidy};

fn venv_python() -> PathBuf {
    support::venv_python("RAMPART_E2B_VENV", "e2b-venv")
}

fn node_dir() -> PathBuf {
    std::env::var_os("RAMPART_E2B_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("e2b-node"))
}

/// Why the code interpreter's part cannot run here, if it cannot: its kernels (Python with
/// matplotlib and PIL, JShell for Java, Deno for the default JavaScript context) come from
/// the host's `/usr`.
fn kernels_missing() -> Option<String> {
    let ok = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let deno = std::fs::read_dir("/usr/local/lib/rampart-kernels/node/node_modules/@deno")
        .map(|rd| rd.flatten().any(|e| e.path().join("deno").is_file()))
        .unwrap_or(false);
    let missing: Vec<&str> = [
        (
            ok(
                "/usr/bin/python3",
                &[
                    "-c",
                    "import ipykernel, jupyter_client, matplotlib, numpy, PIL",
                ],
            ),
            "python3-ipykernel, -jupyter-client, -matplotlib, -numpy or -pil",
        ),
        (
            ok("jshell", &["--version"]),
            "default-jdk-headless (jshell)",
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

/// Runs one SDK script against `d` with `key`; returns `(passed, failed)` lines.
fn run_script(
    d: &Tidy,
    key: &str,
    program: &Path,
    script: &Path,
    cwd: &Path,
) -> (Vec<String>, Vec<String>) {
    let r = support::run_sdk_script(
        program,
        script,
        cwd,
        &[
            ("E2B_API_KEY", key),
            ("E2B_API_URL", &d.url),
            ("E2B_SANDBOX_URL", &d.url),
        ],
    );
    (r.passed, r.failed)
}

/// Runs a JS script from the npm directory (ESM resolves the SDKs from the script's own
/// directory: a copy is placed there, under a name of this test's own).
fn run_js(d: &Tidy, key: &str, name: &str) -> (Vec<String>, Vec<String>) {
    let script = node_dir().join(format!("rampart-last-mile-{name}"));
    std::fs::copy(workspace().join("tests/e2b").join(name), &script).unwrap();
    let r = run_script(d, key, Path::new("node"), &script, &node_dir());
    let _ = std::fs::remove_file(&script);
    r
}

#[test]
fn e2b_last_mile() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    if let Some(why) = support::venv_lacks(
        &venv_python(),
        "e2b, e2b_code_interpreter",
        "scripts/test makes it with `pip install e2b==2.63.0 e2b-code-interpreter==2.11.5`",
    ) {
        eprintln!("skipped: {why}");
        return;
    }
    let d = start_tidy("e2b-last-mile");
    let key = std::fs::read_to_string(d.data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();
    let tests = workspace().join("tests/e2b");
    let py = venv_python();
    let kernels = kernels_missing();
    let js_sdk = node_dir().join("node_modules/e2b").is_dir();
    let js_ci = node_dir()
        .join("node_modules/@e2b/code-interpreter")
        .is_dir();

    let (mut passed, mut failed) = run_script(&d, &key, &py, &tests.join("last_mile.py"), &tests);
    let mut more = |(p, f): (Vec<String>, Vec<String>)| {
        passed.extend(p);
        failed.extend(f);
    };
    match &kernels {
        None => more(run_script(
            &d,
            &key,
            &py,
            &tests.join("last_mile_ci.py"),
            &tests,
        )),
        Some(why) => eprintln!("code interpreter part skipped: {why}"),
    }
    if js_sdk {
        more(run_js(&d, &key, "last_mile.mjs"));
    } else {
        eprintln!(
            "JS SDK skipped: no {}/node_modules/e2b (scripts/e2b-sdks.sh installs it)",
            node_dir().display()
        );
    }
    match (&kernels, js_ci) {
        (None, true) => more(run_js(&d, &key, "last_mile_ci.mjs")),
        (Some(why), _) => eprintln!("code interpreter JS SDK skipped: {why}"),
        (None, false) => eprintln!(
            "code interpreter JS SDK skipped: no {}/node_modules/@e2b/code-interpreter \
             (scripts/e2b-sdks.sh installs it)",
            node_dir().display()
        ),
    }

    eprintln!("passed ({}): {passed:?}", passed.len());
    assert!(
        failed.is_empty(),
        "SDK tests failed:\n{}",
        failed.join("\n")
    );
    assert!(!passed.is_empty());
}
