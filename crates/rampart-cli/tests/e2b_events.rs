//! E2B lifecycle events and webhooks (`tests/e2b/events.py`): the lifecycle driven with the
//! unmodified `e2b==2.63.0` SDK, the events API and webhook CRUD over HTTP as E2B documents
//! them, deliveries received on 127.0.0.1 by the script itself (the daemon's config allows
//! that one address; public addresses only otherwise), both signatures checked, retries,
//! and a tenant's isolation from the node's and other tenants' events.

mod support;

use support::{start_tidy_with, workspace};

fn skip() -> Option<String> {
    if let Some(r) = support::skip_reason() {
        return Some(r);
    }
    support::venv_lacks(
        &support::venv_python("RAMPART_E2B_VENV", "e2b-venv"),
        "e2b, httpx",
        "scripts/test makes it",
    )
}

#[test]
fn lifecycle_events_and_webhooks_as_e2b_serves_them() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let conf = support::config_file("[events]\nwebhook_allow_cidrs = [\"127.0.0.1/32\"]\n");
    let d = start_tidy_with("e2b-events", &[("RAMPART_CONFIG", conf.path.as_str())]);
    let key = std::fs::read_to_string(d.data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();

    // Tenant `acme`, and an E2B key of it.
    let made = support::client()
        .post(format!("{}/v1/tenants", d.daemon.url))
        .header("Authorization", format!("Bearer {}", support::admin_key()))
        .json(&serde_json::json!({"name": "acme"}))
        .send()
        .unwrap();
    assert!(made.status().is_success(), "tenant: {}", made.status());
    let tenant_key = support::make_key(&d.data, &["--e2b", "--tenant", "acme"]);

    let tests = workspace().join("tests/e2b");
    let url = d.daemon.url.as_str();
    let r = support::run_sdk_script(
        &support::venv_python("RAMPART_E2B_VENV", "e2b-venv"),
        &tests.join("events.py"),
        &tests,
        &[
            ("E2B_API_KEY", &key),
            ("E2B_TENANT_KEY", &tenant_key),
            ("E2B_API_URL", url),
            ("E2B_SANDBOX_URL", url),
        ],
    );
    assert!(r.failed.is_empty(), "failed:\n{}", r.failed.join("\n"));
    assert_eq!(r.passed.len(), 5, "passed: {:?}", r.passed);
}
