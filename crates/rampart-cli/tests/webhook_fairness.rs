//! Webhook delivery is fair between tenants (issue 33): a tenant whose receivers accept
//! and never answer holds up only its own deliveries, and a tenant registers at most
//! `MAX_WEBHOOKS_PER_OWNER` webhooks. Real daemon, real sandboxes, receivers on loopback
//! (allowed by the test's `[events] webhook_allow_cidrs`).

mod support;

use reqwest::Method;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

/// A receiver that accepts every connection and never answers (each held open).
fn black_hole() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hole", l.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming().flatten() {
            held.push(c);
        }
    });
    url
}

/// A receiver that answers 204 and reports each request's body.
fn receiver() -> (String, mpsc::Receiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = vec![0u8; 64 << 10];
            let mut got = Vec::new();
            // One request: headers, then the body by its length.
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).into_owned();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if body.len() >= len {
                        let _ =
                            c.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n");
                        let _ = tx.send(body.to_owned());
                        break;
                    }
                }
            }
        }
    });
    (url, rx)
}

fn hook(url: &str, key: &str, target: &str) -> support::Answer {
    support::e2b_call(
        url,
        key,
        Method::POST,
        "/events/webhooks",
        Some(json!({
            "name": "h",
            "url": target,
            "events": ["sandbox.lifecycle.created"],
            "signatureSecret": "s3cret",
        })),
    )
}

#[test]
fn sandbox_blocks_a_tenant_silencing_anothers_webhooks() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let conf = support::config_file("[events]\nwebhook_allow_cidrs = [\"127.0.0.1/32\"]\n");
    let d = support::start_tidy_with(
        "webhook-fairness",
        &[("RAMPART_CONFIG", conf.path.as_str())],
    );
    let url = d.url.as_str();
    support::make_tenants(url, &["acme", "rival"]);
    let a = support::make_key(&d.data, &["--e2b", "--tenant", "acme"]);
    let b = support::make_key(&d.data, &["--e2b", "--tenant", "rival"]);

    // B registers as many webhooks as it may, each to a receiver that never answers; one
    // more is refused with the reason.
    let hole = black_hole();
    for i in 0..16 {
        let r = hook(url, &b, &hole);
        assert_eq!(r.status, 201, "webhook {i}: {:?}", r.body);
    }
    let r = hook(url, &b, &hole);
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert!(
        r.body.to_string().contains("the most it may"),
        "{:?}",
        r.body
    );

    // A's one webhook to a receiver that answers.
    let (a_target, a_got) = receiver();
    assert_eq!(hook(url, &a, &a_target).status, 201);

    // B makes three sandboxes: 48 deliveries to receivers that hold every connection.
    let mut made = Vec::new();
    for _ in 0..3 {
        let r = support::e2b_call(
            url,
            &b,
            Method::POST,
            "/sandboxes",
            Some(json!({"templateID": "base", "timeout": 60})),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
        made.push(r.body["sandboxID"].as_str().unwrap().to_owned());
    }
    // Then A makes one: its `created` reaches its receiver while B's are all held (each
    // of B's held deliveries waits up to its 10 s timeout, three times).
    let r = support::e2b_call(
        url,
        &a,
        Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base", "timeout": 60})),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let a_id = r.body["sandboxID"].as_str().unwrap().to_owned();
    let body = a_got
        .recv_timeout(Duration::from_secs(15))
        .expect("A's webhook was not delivered while B's receivers held theirs");
    assert!(body.contains(&a_id), "{body}");
    assert!(
        !made.iter().any(|b_id| body.contains(b_id.as_str())),
        "{body}"
    );
}
