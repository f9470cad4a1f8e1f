//! The resolver sandboxes see: answers only names their policy allows, by forwarding the
//! query upstream; NXDOMAIN for everything else. A query for a name that is not allowed is
//! never sent anywhere, so DNS tunnelling to such a name carries nothing out.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::RData;
use rampart_types::network::{NetEventKind, Verdict};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

use crate::netlog::Draft;
use crate::policy::normalize_name;
use crate::Inner;

const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
const TCP_IDLE: Duration = Duration::from_secs(10);
/// At most this many queries in flight on the UDP listener.
const MAX_INFLIGHT: usize = 512;

pub(crate) async fn serve_udp(sock: Arc<UdpSocket>, inner: Arc<Inner>, stop: CancellationToken) {
    let sem = Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT));
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            r = sock.recv_from(&mut buf) => match r {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        let Ok(permit) = sem.clone().try_acquire_owned() else {
            continue; // overloaded: drop, the client retries
        };
        // One sandbox cannot take every slot: a query over its own limit is dropped.
        let own = match inner.by_ip(peer.ip()) {
            Some(sb) => match sb.dns_inflight.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => continue,
            },
            None => None,
        };
        let q = buf[..n].to_vec();
        let sock = sock.clone();
        let inner = inner.clone();
        tokio::spawn(async move {
            if let Some(resp) = answer(&inner, peer.ip(), &q, true).await {
                let _ = sock.send_to(&resp, peer).await;
            }
            drop(own);
            drop(permit);
        });
    }
}

pub(crate) async fn serve_tcp(l: TcpListener, inner: Arc<Inner>, stop: CancellationToken) {
    loop {
        let (s, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            r = l.accept() => match r {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        // Only sandboxes, and a few connections each.
        let Some(sb) = inner.by_ip(peer.ip()) else {
            continue;
        };
        if sb.dns_tcp.fetch_add(1, Ordering::Relaxed) >= crate::DNS_TCP_PER_SANDBOX {
            sb.dns_tcp.fetch_sub(1, Ordering::Relaxed);
            continue;
        }
        let inner = inner.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = sb.gone.cancelled() => {}
                _ = serve_tcp_conn(s, peer, inner) => {}
            }
            sb.dns_tcp.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

async fn serve_tcp_conn(mut s: TcpStream, peer: SocketAddr, inner: Arc<Inner>) {
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, s.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let n = u16::from_be_bytes(len) as usize;
        let mut q = vec![0u8; n];
        match tokio::time::timeout(TCP_IDLE, s.read_exact(&mut q)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let Some(resp) = answer(&inner, peer.ip(), &q, false).await else {
            return;
        };
        let mut out = Vec::with_capacity(resp.len() + 2);
        out.extend_from_slice(&(resp.len() as u16).to_be_bytes());
        out.extend_from_slice(&resp);
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}

fn reply_to(q: &Message, code: ResponseCode) -> Message {
    let mut m = Message::new();
    m.set_id(q.id())
        .set_message_type(MessageType::Response)
        .set_op_code(q.op_code())
        .set_recursion_desired(q.recursion_desired())
        .set_recursion_available(true)
        .set_response_code(code);
    for query in q.queries() {
        m.add_query(query.clone());
    }
    if q.extensions().is_some() {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        m.set_edns(e);
    }
    m
}

/// The response bytes for a query from `peer` (`None`: send nothing).
async fn answer(inner: &Inner, peer: IpAddr, bytes: &[u8], udp: bool) -> Option<Vec<u8>> {
    let q = match Message::from_vec(bytes) {
        Ok(q) => q,
        Err(_) => {
            if bytes.len() < 2 {
                return None;
            }
            let id = u16::from_be_bytes([bytes[0], bytes[1]]);
            return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
                .to_vec()
                .ok();
        }
    };
    if q.message_type() != MessageType::Query {
        return None;
    }
    if q.op_code() != OpCode::Query {
        return reply_to(&q, ResponseCode::NotImp).to_vec().ok();
    }
    if q.queries().len() != 1 {
        return reply_to(&q, ResponseCode::FormErr).to_vec().ok();
    }
    let query = &q.queries()[0];
    let Some(sb) = inner.by_ip(peer) else {
        return reply_to(&q, ResponseCode::NXDomain).to_vec().ok();
    };
    let qtype = query.query_type();
    let raw_name = query.name().to_ascii();
    let name = normalize_name(&raw_name);
    let decision = match &name {
        Some(n) => sb.policy().decide_dns(n),
        None => crate::Decision {
            verdict: Verdict::Deny,
            rule: "invalid-name".into(),
        },
    };
    let mut draft = Draft::new(NetEventKind::Dns, decision.verdict, decision.rule.clone());
    draft.name = Some(name.clone().unwrap_or_else(|| truncate(&raw_name)));
    draft.qtype = Some(qtype.to_string());
    if !decision.allowed() {
        sb.log.push(draft);
        return reply_to(&q, ResponseCode::NXDomain).to_vec().ok();
    }
    let up = match forward(inner, query).await {
        Some(up) => up,
        None => {
            draft.rule = format!("{} (upstream failed)", decision.rule);
            sb.log.push(draft);
            return reply_to(&q, ResponseCode::ServFail).to_vec().ok();
        }
    };
    let mut resp = reply_to(&q, up.response_code());
    let mut addrs = Vec::new();
    let mut min_ttl = u32::MAX;
    for r in up.answers() {
        let ip = match r.data() {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        };
        if let Some(ip) = ip {
            addrs.push(ip);
            min_ttl = min_ttl.min(r.ttl());
        }
    }
    if let Some(n) = &name {
        if !addrs.is_empty() {
            sb.pin(n, &addrs, min_ttl);
        }
    }
    resp.add_answers(up.answers().iter().cloned());
    resp.add_name_servers(up.name_servers().iter().cloned());
    let mut out = resp.to_vec().ok()?;
    let limit = if udp {
        q.extensions()
            .as_ref()
            .map(|e| e.max_payload().clamp(512, 1232) as usize)
            .unwrap_or(512)
    } else {
        65535
    };
    if out.len() > limit {
        let mut t = reply_to(&q, up.response_code());
        t.set_truncated(true);
        out = t.to_vec().ok()?;
    }
    draft.addrs = addrs.iter().map(|a| a.to_string()).collect();
    sb.log.push(draft);
    Some(out)
}

fn truncate(s: &str) -> String {
    s.chars().take(255).collect()
}

/// Asks the upstream resolvers (UDP, then TCP if truncated). Only called for allowed names.
async fn forward(inner: &Inner, query: &Query) -> Option<Message> {
    let mut m = Message::new();
    let id: u16 = rand::random();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(query.clone());
    let mut e = Edns::new();
    e.set_max_payload(1232);
    m.set_edns(e);
    let bytes = m.to_vec().ok()?;
    for up in &inner.upstream_dns {
        let r = tokio::time::timeout(UPSTREAM_TIMEOUT, forward_udp(*up, &bytes, id, query)).await;
        match r {
            Ok(Some(resp)) if !resp.truncated() => return Some(resp),
            Ok(Some(_)) => {
                let r = tokio::time::timeout(UPSTREAM_TIMEOUT, forward_tcp(*up, &bytes, id, query))
                    .await;
                if let Ok(Some(resp)) = r {
                    return Some(resp);
                }
            }
            _ => {}
        }
    }
    None
}

fn matches(resp: &Message, id: u16, query: &Query) -> bool {
    resp.id() == id
        && resp.message_type() == MessageType::Response
        && resp.queries().len() == 1
        && resp.queries()[0].query_type() == query.query_type()
        && resp.queries()[0]
            .name()
            .to_ascii()
            .eq_ignore_ascii_case(&query.name().to_ascii())
}

async fn forward_udp(up: SocketAddr, bytes: &[u8], id: u16, query: &Query) -> Option<Message> {
    let bind: SocketAddr = if up.is_ipv4() {
        "0.0.0.0:0".parse().ok()?
    } else {
        "[::]:0".parse().ok()?
    };
    let s = UdpSocket::bind(bind).await.ok()?;
    s.connect(up).await.ok()?;
    s.send(bytes).await.ok()?;
    let mut buf = vec![0u8; 4096];
    loop {
        let n = s.recv(&mut buf).await.ok()?;
        if let Ok(resp) = Message::from_vec(&buf[..n]) {
            if matches(&resp, id, query) {
                return Some(resp);
            }
        }
    }
}

async fn forward_tcp(up: SocketAddr, bytes: &[u8], id: u16, query: &Query) -> Option<Message> {
    let mut s = TcpStream::connect(up).await.ok()?;
    let mut out = (bytes.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(bytes);
    s.write_all(&out).await.ok()?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.ok()?;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).await.ok()?;
    let resp = Message::from_vec(&buf).ok()?;
    matches(&resp, id, query).then_some(resp)
}
