//! The port tunnel: raw bytes both ways to a port on the agent's loopback.

mod common;

use common::*;
use hyper_util::rt::TokioIo;
use rampart_agent::client::ClientError;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A free port on 127.0.0.1 (bound, then released).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[tokio::test]
async fn bytes_flow_both_ways_and_eof_passes() {
    let a = Agent::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    // An echo server that upper-cases, then says bye after the client's EOF.
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            s.write_all(&buf[..n].to_ascii_uppercase())
                .await
                .expect("write");
        }
        s.write_all(b"bye").await.expect("bye");
        got
    });
    let up = a.client.tunnel(port).await.expect("tunnel");
    let mut io = TokioIo::new(up);
    io.write_all(b"hello").await.expect("write");
    let mut buf = [0u8; 5];
    io.read_exact(&mut buf).await.expect("read");
    assert_eq!(&buf, b"HELLO");
    // A big transfer, then a half-close: the server still answers after our EOF.
    let big = vec![b'x'; 1 << 20];
    let (mut r, mut w) = tokio::io::split(io);
    let writer = tokio::spawn(async move {
        w.write_all(&big).await.expect("write big");
        w.shutdown().await.expect("shutdown");
    });
    let mut back = Vec::new();
    r.read_to_end(&mut back).await.expect("read to end");
    writer.await.expect("writer");
    assert_eq!(back.len(), (1 << 20) + 3);
    assert!(back[..1 << 20].iter().all(|&b| b == b'X'));
    assert_eq!(&back[1 << 20..], b"bye");
    let got = server.await.expect("server");
    assert_eq!(got.len(), 5 + (1 << 20));
}

#[tokio::test]
async fn closed_port_is_502_and_bad_ports_are_refused() {
    let a = Agent::start().await;
    let port = free_port();
    match a.client.tunnel(port).await {
        Err(ClientError::Rpc { message, .. }) => assert_eq!(message, "port is not open"),
        other => panic!("expected port is not open, got {:?}", other.map(|_| ())),
    }
    let up = [("connection", "upgrade"), ("upgrade", "rampart-tunnel")];
    let r = raw(&a.sock(), "GET", &format!("/tunnel/{port}"), &up, vec![]).await;
    assert_eq!(r.status, 502);
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(v["message"], "port is not open");
    for bad in ["0", "65536", "abc", ""] {
        let r = raw(&a.sock(), "GET", &format!("/tunnel/{bad}"), &up, vec![]).await;
        assert_eq!(r.status, 400, "port {bad:?}");
    }
    // Without the upgrade headers: refused, not tunnelled.
    let r = raw(&a.sock(), "GET", &format!("/tunnel/{port}"), &[], vec![]).await;
    assert_eq!(r.status, 400);
    let r = raw(&a.sock(), "POST", "/tunnel/80", &up, vec![]).await;
    assert_eq!(r.status, 405);
    // The agent still serves ordinary requests afterwards.
    a.client.health().await.expect("health");
}

#[tokio::test]
async fn http_runs_over_the_tunnel() {
    let a = Agent::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let body = format!("{} {}", req.method(), req.uri().path());
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from(body)),
                        ))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    for i in 0..3 {
        let up = a.client.tunnel(port).await.expect("tunnel");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(up)
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .uri(format!("/x/{i}"))
            .header("host", "localhost")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("req");
        let resp = sender.send_request(req).await.expect("send");
        assert_eq!(resp.status(), 200);
        use http_body_util::BodyExt as _;
        let b = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&b[..], format!("GET /x/{i}").as_bytes());
    }
}
