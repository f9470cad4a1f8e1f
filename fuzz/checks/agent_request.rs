//! What the `agent_request` fuzz target checks, on the agent's own decoders of wire bytes.
//! Shared (by `#[path]`) with `crates/rampart-agent/tests/fuzz_corpus.rs`, which replays the
//! committed corpus through it under plain `cargo test`.
//!
//! The first byte picks what the rest is:
//! - 0: a unary request body (or a message the host-side client decodes), by message type
//!   (second byte): `connect::decode_json`, and a decoded message must re-encode to the same
//!   message.
//! - 1: the body of a server-streaming request: `connect::decode_stream_request`.
//! - 2: a client-stream body (`StreamInput`), fed to `connect::take_envelope` in chunks of a
//!   size the second byte picks: the same envelopes as when it arrives whole.
//! - 3: request headers (`Authorization`, `connect-timeout-ms`, `keepalive-ping-interval`,
//!   newline-separated): `server::ctx_of_headers`.
//! - 4: a `/files` query string: `server::files::parse_query`, against a reference decoder.
//! - 5: a `/tunnel/{port}` path rest and a `/proc/net/tcp` table.

use bytes::BytesMut;
use rampart_agent::connect::{self, EnvelopeError};
use rampart_agent::proto::*;
use rampart_agent::server;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// Runs every check that applies to `data`; panics on a violation.
pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 6 {
        0 => {
            let Some((&ty, body)) = rest.split_first() else {
                return;
            };
            message(ty, body);
        }
        1 => stream_request(rest),
        2 => client_stream(rest),
        3 => headers(rest),
        4 => query(rest),
        _ => tunnel(rest),
    }
}

/// Decode `body` as `T` like the server does; a message that decodes re-encodes (protojson,
/// as the agent answers) to bytes that decode to the same message.
fn roundtrip<T>(body: &[u8]) -> Option<T>
where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    let v = connect::decode_json::<T>(body).ok()?;
    let enc = serde_json::to_vec(&v).expect("a decoded message serializes");
    let again = connect::decode_json::<T>(&enc).unwrap_or_else(|e| {
        panic!(
            "{v:?} encodes to {:?}, which does not decode: {e}",
            String::from_utf8_lossy(&enc)
        )
    });
    assert_eq!(
        v,
        again,
        "re-encoded as {:?}",
        String::from_utf8_lossy(&enc)
    );
    Some(v)
}

fn message(ty: u8, body: &[u8]) {
    match ty % 20 {
        // Requests (unary and streaming).
        0 => {
            roundtrip::<StartRequest>(body);
        }
        1 => {
            roundtrip::<SelectorRequest>(body);
        }
        2 => {
            roundtrip::<SendInputRequest>(body);
        }
        3 => {
            roundtrip::<SendSignalRequest>(body);
        }
        4 => {
            roundtrip::<UpdateRequest>(body);
        }
        5 => {
            roundtrip::<StreamInputRequest>(body);
        }
        6 => {
            roundtrip::<PathRequest>(body);
        }
        7 => {
            roundtrip::<MoveRequest>(body);
        }
        8 => {
            roundtrip::<ListDirRequest>(body);
        }
        9 => {
            roundtrip::<WatchRequest>(body);
        }
        10 => {
            roundtrip::<WatcherId>(body);
        }
        // What the host-side client decodes from the agent (a sandbox can forge these).
        11 => {
            roundtrip::<ProcessEventResponse>(body);
        }
        12 => {
            roundtrip::<ListResponse>(body);
        }
        13 => {
            roundtrip::<EntryResponse>(body);
        }
        14 => {
            roundtrip::<ListDirResponse>(body);
        }
        15 => {
            roundtrip::<WatchDirResponse>(body);
        }
        16 => {
            roundtrip::<WatcherEvents>(body);
        }
        17 => {
            roundtrip::<Vec<WrittenEntry>>(body);
        }
        18 => {
            roundtrip::<AgentInfo>(body);
        }
        _ => {
            roundtrip::<Empty>(body);
        }
    }
}

fn stream_request(body: &[u8]) {
    let start = connect::decode_stream_request::<StartRequest>(body);
    let _ = connect::decode_stream_request::<SelectorRequest>(body);
    let _ = connect::decode_stream_request::<WatchRequest>(body);
    // It is exactly "the payload of the first envelope, if that is a message".
    let mut buf = BytesMut::from(body);
    let first = connect::take_envelope(&mut buf);
    let expect_ok = match &first {
        Ok(Some((flags, payload))) if flags & connect::FLAG_END_STREAM == 0 => {
            connect::decode_json::<StartRequest>(payload).is_ok()
        }
        _ => false,
    };
    assert_eq!(start.is_ok(), expect_ok, "first envelope {first:?}");
    if let Ok(m) = start {
        let enc = connect::message_envelope(&m);
        let again = connect::decode_stream_request::<StartRequest>(&enc)
            .expect("a re-encoded stream request decodes");
        assert_eq!(m, again);
    }
}

type Drained = (Vec<(u8, bytes::Bytes)>, Option<String>, usize);

/// Take envelopes off `buf` until it needs more bytes or fails.
fn drain(buf: &mut BytesMut, out: &mut Vec<(u8, bytes::Bytes)>) -> Result<(), EnvelopeError> {
    while let Some(e) = connect::take_envelope(buf)? {
        out.push(e);
    }
    Ok(())
}

fn client_stream(rest: &[u8]) {
    let Some((&step, body)) = rest.split_first() else {
        return;
    };
    // Whole.
    let whole: Drained = {
        let mut buf = BytesMut::from(body);
        let mut out = Vec::new();
        let err = drain(&mut buf, &mut out).err().map(|e| e.to_string());
        (out, err, buf.len())
    };
    // In chunks, as hyper hands the body over.
    let step = usize::from(step % 64) + 1;
    let chunked: Drained = {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut err = None;
        for c in body.chunks(step) {
            buf.extend_from_slice(c);
            if let Err(e) = drain(&mut buf, &mut out) {
                err = Some(e.to_string());
                break;
            }
        }
        (out, err, buf.len())
    };
    assert_eq!(
        (&whole.0, &whole.1),
        (&chunked.0, &chunked.1),
        "envelopes differ when the body arrives in chunks of {step}"
    );
    if whole.1.is_none() {
        assert_eq!(whole.2, chunked.2, "leftover bytes differ");
        let used: usize = whole.0.iter().map(|(_, p)| 5 + p.len()).sum();
        assert_eq!(used + whole.2, body.len(), "bytes lost or invented");
    }
    for (flags, payload) in &whole.0 {
        assert_eq!(flags & connect::FLAG_COMPRESSED, 0);
        assert!(payload.len() <= connect::MAX_ENVELOPE);
        let enc = connect::envelope(*flags, payload);
        let mut b = BytesMut::from(&enc[..]);
        let back = connect::take_envelope(&mut b)
            .expect("a re-encoded envelope is valid")
            .expect("and complete");
        assert_eq!((*flags, payload.clone()), back);
        assert!(b.is_empty());
        if flags & connect::FLAG_END_STREAM == 0 {
            roundtrip::<StreamInputRequest>(payload);
        }
    }
}

fn headers(rest: &[u8]) {
    use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
    let mut parts = rest.splitn(3, |b| *b == b'\n');
    let mut h = HeaderMap::new();
    let names = [
        AUTHORIZATION,
        HeaderName::from_static("connect-timeout-ms"),
        HeaderName::from_static("keepalive-ping-interval"),
    ];
    for name in names {
        if let Some(v) = parts.next() {
            if let Ok(v) = HeaderValue::from_bytes(v) {
                h.insert(name, v);
            }
        }
    }
    if let Ok(ctx) = server::ctx_of_headers(&h) {
        if let Some(u) = &ctx.user {
            assert!(!u.contains(':'), "user {u:?}");
        }
        assert!(!ctx.keepalive.is_zero());
        assert!(ctx.timeout.is_none_or(|t| !t.is_zero()));
    }
}

/// The `application/x-www-form-urlencoded` decoding of one key or value: `+` is a space,
/// `%` and two hex digits a byte, anything else itself.
fn reference_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len()
                && b[i + 1].is_ascii_hexdigit()
                && b[i + 2].is_ascii_hexdigit() =>
            {
                let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                out.push((hex(b[i + 1]) << 4) | hex(b[i + 2]));
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(rest: &[u8]) {
    let q = String::from_utf8_lossy(rest);
    let got = server::files::parse_query(&q);
    let want: Vec<(String, String)> = q
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (reference_decode(k), reference_decode(v))
        })
        .collect();
    assert_eq!(got, want, "query {q:?}");
}

fn tunnel(rest: &[u8]) {
    let s = String::from_utf8_lossy(rest);
    let (port, table) = s.split_once('\n').unwrap_or((&s, ""));
    let want = (!port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()))
        .then(|| port.parse::<u16>().ok())
        .flatten()
        .filter(|&p| p != 0);
    assert_eq!(server::tunnel::parse_port(port), want, "port {port:?}");
    let _ = server::tunnel::parse_listening(table);
}
