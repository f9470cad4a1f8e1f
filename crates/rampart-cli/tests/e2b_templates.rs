//! Compatibility (tier 4): E2B's template builds (`Template().build()`, the layer cache seen
//! through the build logs, tags, `Template.exists`, list, delete, sandboxes of the built
//! templates) with the unmodified SDK (`e2b==2.63.0`, `tests/e2b/template_build.py`) against
//! a real daemon. The builds stack on the built-in `base` (no network needed);
//! `sdk_builds_from_a_debian_dockerfile` builds `FROM debian:bookworm` through mmdebstrap
//! (skipped, with the reason, without mmdebstrap or deb.debian.org);
//! `sdk_builds_from_a_registry_image` pulls `python:3` from a registry the script serves on
//! loopback (HTTPS with a test CA, a token service, redirected blobs, a private repository),
//! which the daemon knows as its mirror of docker.io.
//!
//! Skips with the reason when not root, without the binaries or without the SDK's venv
//! (`scripts/test` makes `target/e2b-venv`).

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::{start_tidy, workspace, Tidy};

fn venv_python() -> PathBuf {
    support::venv_python("RAMPART_E2B_VENV", "e2b-venv")
}

fn skip_reason() -> Option<String> {
    if let Some(why) = support::skip_reason() {
        return Some(why);
    }
    support::venv_lacks(&venv_python(), "e2b", "scripts/test makes it")
}

/// Runs `tests/e2b/template_build.py` (with `args`) with only the E2B variables set; returns
/// the passed test names, failing if any test failed or the script did not finish.
fn run_script(d: &Tidy, args: &[&str]) -> Vec<String> {
    run_script_with(d, args, &[])
}

/// [`run_script`] with more environment for the script.
fn run_script_with(d: &Tidy, args: &[&str], envs: &[(&str, String)]) -> Vec<String> {
    let key = std::fs::read_to_string(d.data.join("api-key"))
        .expect("the daemon writes <data>/api-key")
        .trim()
        .to_owned();
    let tests = workspace().join("tests/e2b");
    let out = Command::new(venv_python())
        .arg(tests.join("template_build.py"))
        .args(args)
        .current_dir(&tests)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(
            "HOME",
            std::env::var_os("HOME").unwrap_or_else(|| "/root".into()),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("E2B_API_KEY", &key)
        .env("E2B_API_URL", &d.url)
        .env("E2B_SANDBOX_URL", &d.url)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .output()
        .expect("run tests/e2b/template_build.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- template_build.py {args:?} ---\n{stdout}{stderr}");
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert!(
        stdout.contains("SUMMARY "),
        "the script did not finish ({})",
        out.status
    );
    assert!(
        failed.is_empty(),
        "SDK template tests failed:\n{}",
        failed.join("\n")
    );
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("PASS "))
        .map(str::to_owned)
        .collect()
}

/// Nothing of the builds is left running: no build sandbox, no temp layer.
fn assert_no_build_leftovers(d: &Tidy) {
    let images = d.data.join("images");
    for sub in ["build", "tmp"] {
        let p = images.join(sub);
        let left: Vec<_> = std::fs::read_dir(&p)
            .map(|r| r.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{} holds {left:?}", p.display());
    }
}

#[test]
fn sdk_builds_caches_tags_and_runs_templates() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = start_tidy("e2b-templates");
    let passed = run_script(&d, &[]);
    for t in [
        "build_from_base",
        "second_build_is_served_from_the_cache",
        "exists_and_aliases",
        "tags_assign_list_remove",
        "sandbox_of_the_template_has_every_step",
        "sandbox_of_a_tagged_child_template",
        "ready_checks_of_the_sdk",
        "async_build_exists_and_sandbox",
        "failures_are_reported",
        "list_and_delete",
    ] {
        assert!(
            passed.iter().any(|p| p == t),
            "{t} did not pass: {passed:?}"
        );
    }
    // Uploads are kept by hash for the next build; no half-made upload remains.
    let uploads: Vec<String> = std::fs::read_dir(d.data.join("images/uploads"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(uploads.len() >= 4, "{uploads:?}");
    assert!(
        uploads.iter().all(|u| u.len() == 68 && u.ends_with(".tar")),
        "{uploads:?}"
    );
    assert_no_build_leftovers(&d);
}

fn debian_reachable() -> Result<(), String> {
    use std::net::ToSocketAddrs;
    let addrs = ("deb.debian.org", 80)
        .to_socket_addrs()
        .map_err(|e| format!("deb.debian.org does not resolve: {e}"))?;
    for a in addrs {
        if std::net::TcpStream::connect_timeout(&a, Duration::from_secs(5)).is_ok() {
            return Ok(());
        }
    }
    Err("deb.debian.org:80 is unreachable".into())
}

#[test]
fn sdk_builds_from_a_debian_dockerfile() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    if Command::new("mmdebstrap")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: mmdebstrap is not installed (scripts/setup-host.sh installs it)");
        return;
    }
    if let Err(why) = debian_reachable() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = start_tidy("e2b-templates-debian");
    let passed = run_script(&d, &["debian_dockerfile"]);
    assert_eq!(passed, ["debian_dockerfile"]);
    assert_no_build_leftovers(&d);
}

#[test]
fn sdk_builds_from_a_registry_image() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = std::env::temp_dir().join(format!("rampart-registry-{}", support::token()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (cert, key) = (tmp.join("cert.pem"), tmp.join("key.pem"));
    let ca = tmp.join("ca.pem");
    std::fs::write(
        tmp.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    // A test CA, and the registry's certificate signed by it.
    let openssl = |args: &[&str]| {
        Command::new("openssl")
            .args(args)
            .current_dir(&tmp)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let made = openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=rampart-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]) && openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "key.pem",
        "-out",
        "leaf.csr",
    ]) && openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "leaf.ext",
        "-out",
        "cert.pem",
    ]);
    if !made {
        eprintln!("skipped: openssl cannot make a test CA and certificate");
        let _ = std::fs::remove_dir_all(&tmp);
        return;
    }
    // The image the registry serves, of two layers: host programs with the libraries of the
    // agent (the build's and the sandbox's PID 1, on the image's libraries), then bash (which
    // the SDK's commands run).
    let agent = PathBuf::from(env!("CARGO_BIN_EXE_rampart")).with_file_name("rampart-agent");
    let layout = tmp.join("image");
    rampart_image::sample::write_host_image_with(&layout, &[agent], &["/usr/bin/bash".into()])
        .unwrap();
    let port = support::free_port();
    let d = support::start_tidy_with(
        "e2b-templates-registry",
        &[
            (
                "RAMPART_REGISTRY_MIRRORS",
                &format!(
                    "docker.io=https://127.0.0.1:{port},\
                     123456789012.dkr.ecr.us-east-1.amazonaws.com=https://127.0.0.1:{port}"
                ),
            ),
            (
                "RAMPART_ECR_ENDPOINT",
                &format!("https://127.0.0.1:{port}/ecr-api/"),
            ),
            ("RAMPART_REGISTRY_CA", ca.to_str().unwrap()),
        ],
    );
    let passed = run_script_with(
        &d,
        &["registry"],
        &[
            ("REGISTRY_PORT", port.to_string()),
            ("REGISTRY_CERT", cert.display().to_string()),
            ("REGISTRY_KEY", key.display().to_string()),
            ("REGISTRY_LAYOUT", layout.display().to_string()),
        ],
    );
    for t in [
        "registry_image_builds_and_runs",
        "registry_second_pull_is_cached",
        "registry_private_image_needs_its_login",
        "registry_ecr_image_with_an_access_key",
        "registry_failures_are_reported",
    ] {
        assert!(
            passed.iter().any(|p| p == t),
            "{t} did not pass: {passed:?}"
        );
    }
    assert_no_build_leftovers(&d);
    native_build_logs_in_as_docker_login_did(&d, &tmp, port, &ca, &cert, &key, &layout);
    drop(d);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `rampart template build` of `from = "image:private/app:1"` (the private repository of
/// the script's registry, served by `template_build.py serve-registry`), logging in with the
/// `auths` entry `docker login` would have written; a sandbox of the template runs.
fn native_build_logs_in_as_docker_login_did(
    d: &Tidy,
    tmp: &std::path::Path,
    port: u16,
    ca: &std::path::Path,
    cert: &std::path::Path,
    key: &std::path::Path,
    layout: &std::path::Path,
) {
    use std::io::BufRead as _;
    let tests = workspace().join("tests/e2b");
    let mut server = Command::new(venv_python())
        .arg(tests.join("template_build.py"))
        .arg("serve-registry")
        .current_dir(&tests)
        .env("REGISTRY_PORT", port.to_string())
        .env("REGISTRY_CERT", cert)
        .env("REGISTRY_KEY", key)
        .env("REGISTRY_LAYOUT", layout)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the registry");
    let mut ready = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "READY", "the registry did not start");
    let docker = tmp.join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    // base64("puller:s3cret"), as `docker login` writes it.
    std::fs::write(
        docker.join("config.json"),
        r#"{"auths": {"https://index.docker.io/v1/": {"auth": "cHVsbGVyOnMzY3JldA=="}}}"#,
    )
    .unwrap();
    let spec = tmp.join("native.toml");
    std::fs::write(
        &spec,
        "from = \"image:private/app:1\"\n[[steps]]\nrun = \"echo native > /marker\"\n",
    )
    .unwrap();
    let build = |docker_config: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_rampart"))
            .args([
                "template",
                "build",
                "--json",
                "--name",
                "native-reg",
                "--data-dir",
            ])
            .arg(&d.data)
            .arg("-f")
            .arg(&spec)
            .env("DOCKER_CONFIG", docker_config)
            .env(
                "RAMPART_REGISTRY_MIRRORS",
                format!("docker.io=https://127.0.0.1:{port}"),
            )
            .env("RAMPART_REGISTRY_CA", ca)
            .output()
            .expect("run rampart template build")
    };
    // Without the login: refused, saying so.
    let o = build(&tmp.join("no-docker-config"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "an anonymous pull of a private image built"
    );
    assert!(err.contains("refused an anonymous pull"), "{err}");
    let o = build(&docker);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "rampart template build: {err}");
    assert!(err.contains("pulled docker.io/private/app:1"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    drop(server.stdin.take());
    let _ = server.wait();
    let sbx = support::Sandbox::create(
        d.url.as_str(),
        serde_json::json!({"template": "native-reg"}),
    );
    let r = sbx.sh("cat /marker; ls /usr/bin/dash");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "native\n/usr/bin/dash\n", "{r}");
    sbx.destroy();
}
