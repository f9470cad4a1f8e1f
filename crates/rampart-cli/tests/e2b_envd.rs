//! The envd proxy fails closed (tier 2): a real daemon, a sandbox made through the E2B API,
//! raw envd requests carrying its access token.
//!
//! - `process.Process/Start` requests the proxy cannot parse (wrong content type, a broken
//!   or compressed envelope, an empty message) and unknown procedures are refused with 400
//!   and Connect's error body naming what could not be parsed; none is recorded, none ran
//!   (each would have made a marker file, and none exists);
//! - input for a process the proxy is not recording is refused (404 `not_found`);
//! - a well-formed session still works end to end: `cat` started through envd, input by
//!   `SendInput` and `StreamInput`, stdin closed; its `exit` counts exactly that input.
//!
//! Needs root and the `rampart-jailer` / `rampart-agent` binaries next to `rampart`; otherwise
//! it prints `skipped: <reason>`.

mod support;

use base64::Engine as _;
use serde_json::{json, Value};
use std::io::Read as _;
use support::{client, skip_reason, start_tidy};

fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn sha(b: &[u8]) -> String {
    rampart_audit::content_digest(b).to_hex()
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Takes the complete envelopes at the front of `buf`: `(flags, payload)`.
fn take_envelopes(buf: &mut Vec<u8>) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while buf.len() >= 5 {
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if buf.len() < 5 + len {
            break;
        }
        let flags = buf[0];
        let v = serde_json::from_slice(&buf[5..5 + len]).unwrap();
        buf.drain(..5 + len);
        out.push((flags, v));
    }
    out
}

#[test]
fn the_envd_proxy_refuses_what_it_cannot_record() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = start_tidy("e2b-envd");
    let api_key = std::fs::read_to_string(d.data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();
    let c = client();
    let r = c
        .post(format!("{}/sandboxes", d.url))
        .header("x-api-key", &api_key)
        .json(&json!({"templateID": "base", "timeout": 300}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let v: Value = r.json().unwrap();
    let id = v["sandboxID"].as_str().unwrap().to_owned();
    let token = v["envdAccessToken"].as_str().unwrap().to_owned();
    let envd = |path: &str, content_type: &str| {
        c.post(format!("{}{path}", d.url))
            .header("e2b-sandbox-id", &id)
            .header("x-access-token", &token)
            .header("content-type", content_type)
    };
    let touch = |marker: &str| {
        serde_json::to_vec(&json!({"process": {"cmd": "/bin/sh",
            "args": ["-c", format!("touch /tmp/{marker}")]}, "stdin": false}))
        .unwrap()
    };
    let connect = "application/connect+json";

    // Starts the proxy cannot parse, each of which would make a marker if it ran.
    let mut compressed = envelope(0, &touch("compressed"));
    compressed[0] = 1;
    let cases: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        (
            "plain JSON",
            "application/json",
            touch("plain"),
            "content-type \"application/json\"",
        ),
        (
            "a broken message",
            connect,
            envelope(
                0,
                br#"{"process": {"cmd": "/bin/sh", "args": ["-c", "touch /tmp/broken"#,
            ),
            "invalid request",
        ),
        ("a compressed envelope", connect, compressed, "compressed"),
        (
            "an empty message",
            connect,
            envelope(0, b" "),
            "process.cmd is required",
        ),
        (
            "a truncated envelope",
            connect,
            envelope(0, &touch("truncated"))[..20].to_vec(),
            "no message envelope",
        ),
    ];
    for (what, ct, body, why) in cases {
        let r = envd("/process.Process/Start", ct)
            .body(body)
            .send()
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().unwrap();
        assert_eq!(status, 400, "{what}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["code"], "invalid_argument", "{what}: {text}");
        let m = v["message"].as_str().unwrap();
        assert!(
            m.contains("process.Process/Start: the envd proxy cannot parse") && m.contains(why),
            "{what}: {m}"
        );
    }
    // A procedure the proxy does not know is not forwarded either.
    let r = envd("/process.Process/Exec", "application/json")
        .body(touch("unknown"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().unwrap();
    assert!(v["message"]
        .as_str()
        .unwrap()
        .contains("unknown procedure process.Process/Exec"));
    // Input for a process the proxy did not start.
    let r = envd("/process.Process/SendInput", "application/json")
        .json(&json!({"process": {"pid": 99999}, "input": {"stdin": b64(b"x")}}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(r.json::<Value>().unwrap()["code"], "not_found");

    // Nothing of that is in the record, and nothing ran.
    let audit = |c: &reqwest::blocking::Client| -> Vec<Value> {
        let evs: Value = c
            .get(format!("{}/v1/sandboxes/{id}/audit", d.url))
            .send()
            .unwrap()
            .json()
            .unwrap();
        evs["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["body"].clone())
            .collect()
    };
    let bodies = audit(&c);
    assert!(
        !bodies.iter().any(|b| b["type"] == "exec"),
        "an exec was recorded: {bodies:?}"
    );
    for marker in ["plain", "broken", "compressed", "truncated", "unknown"] {
        let r = c
            .get(format!("{}/files?path=/tmp/{marker}", d.url))
            .header("e2b-sandbox-id", &id)
            .header("x-access-token", &token)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 404, "/tmp/{marker} exists");
    }

    // A well-formed session: `cat`, with input by SendInput and by StreamInput.
    let start = serde_json::to_vec(&json!({"process": {"cmd": "cat"}, "stdin": true})).unwrap();
    let mut answer = envd("/process.Process/Start", connect)
        .body(envelope(0, &start))
        .send()
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    let mut buf = Vec::new();
    let mut events = Vec::new();
    let mut chunk = [0u8; 4096];
    let pid = loop {
        if let Some(p) = events
            .iter()
            .find_map(|(_, e): &(u8, Value)| e["event"]["start"]["pid"].as_u64())
        {
            break p;
        }
        let n = answer.read(&mut chunk).unwrap();
        assert!(n > 0, "the stream ended before the start event");
        buf.extend_from_slice(&chunk[..n]);
        events.extend(take_envelopes(&mut buf));
    };
    let r = envd("/process.Process/SendInput", "application/json")
        .json(&json!({"process": {"pid": pid}, "input": {"stdin": b64(b"one\n")}}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().unwrap());
    let mut stream = envelope(
        0,
        &serde_json::to_vec(&json!({"start": {"process": {"pid": pid}}})).unwrap(),
    );
    stream.extend(envelope(
        0,
        &serde_json::to_vec(&json!({"data": {"input": {"stdin": b64(b"two\n")}}})).unwrap(),
    ));
    stream.extend(envelope(2, b"{}"));
    let r = envd("/process.Process/StreamInput", connect)
        .body(stream)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut rest = r.bytes().unwrap().to_vec();
    let msgs = take_envelopes(&mut rest);
    assert!(
        msgs.iter().all(|(_, m)| m.get("error").is_none()),
        "{msgs:?}"
    );
    // A StreamInput whose later message cannot be parsed is broken off with the refusal.
    let mut stream = envelope(
        0,
        &serde_json::to_vec(&json!({"start": {"process": {"pid": pid}}})).unwrap(),
    );
    stream.extend(envelope(0, b"{\"data\": 7}"));
    let r = envd("/process.Process/StreamInput", connect)
        .body(stream)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().unwrap();
    assert!(v["message"]
        .as_str()
        .unwrap()
        .contains("process.Process/StreamInput: the envd proxy cannot parse"));
    let r = envd("/process.Process/CloseStdin", "application/json")
        .json(&json!({"process": {"pid": pid}}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut tail = Vec::new();
    answer.read_to_end(&mut tail).unwrap();
    buf.extend_from_slice(&tail);
    events.extend(take_envelopes(&mut buf));
    let out: Vec<u8> = events
        .iter()
        .filter_map(|(_, e)| e["event"]["data"]["stdout"].as_str())
        .flat_map(|s| base64::engine::general_purpose::STANDARD.decode(s).unwrap())
        .collect();
    assert_eq!(out, b"one\ntwo\n");
    // The exec is over: input for it is refused now.
    let r = envd("/process.Process/SendInput", "application/json")
        .json(&json!({"process": {"pid": pid}, "input": {"stdin": b64(b"x")}}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    let bodies = audit(&c);
    let execs: Vec<&Value> = bodies.iter().filter(|b| b["type"] == "exec").collect();
    assert_eq!(execs.len(), 1, "{bodies:?}");
    assert_eq!(execs[0]["argv"], json!(["cat"]));
    let exit = bodies.iter().find(|b| b["type"] == "exit").unwrap();
    assert_eq!(exit["exec_id"], execs[0]["exec_id"]);
    assert_eq!(exit["exit_code"], 0);
    assert_eq!(exit["stdout"]["digest"], sha(b"one\ntwo\n"));
    assert_eq!(exit["streamed_input"]["digest"], sha(b"one\ntwo\n"));
    assert_eq!(exit["streamed_input"]["size"], 8);
}
