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
/// The resolver's shared capacity: queries in flight (UDP and TCP, all sandboxes) beyond
/// each sandbox's reserved ones.
pub(crate) const MAX_INFLIGHT: usize = 512;
/// Queries in flight every sandbox may always have, whatever the others do.
pub(crate) const RESERVED_PER_SANDBOX: usize = 4;

/// Fair admission of queries to the resolver. Each source (sandbox) may have
/// [`RESERVED_PER_SANDBOX`] queries in flight whatever the others do; beyond them it takes
/// from the shared capacity ([`MAX_INFLIGHT`]) only up to its fair share (the capacity
/// divided by the number of sources with queries in flight, itself counted) and never more
/// than [`crate::DNS_INFLIGHT_PER_SANDBOX`]. So sandboxes that flood with names that never
/// answer fill at most the shared capacity, and a sandbox with few queries still gets its
/// slots at once.
#[derive(Debug, Default)]
pub(crate) struct DnsGate {
    state: std::sync::Mutex<GateState>,
}

#[derive(Debug, Default)]
struct GateState {
    /// Queries in flight per source (only sources with some).
    per: std::collections::HashMap<IpAddr, usize>,
}

/// A query's slot; released on drop.
#[derive(Debug)]
pub(crate) struct DnsPermit {
    gate: Arc<DnsGate>,
    ip: IpAddr,
}

impl DnsGate {
    /// A slot for a query from `ip`, if it may have one now.
    pub fn try_admit(self: &Arc<Self>, ip: IpAddr) -> Option<DnsPermit> {
        let ip = crate::policy::canonical(ip);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mine = s.per.get(&ip).copied().unwrap_or(0);
        if mine >= crate::DNS_INFLIGHT_PER_SANDBOX {
            return None;
        }
        if mine >= RESERVED_PER_SANDBOX {
            // Past the reserved slots: only within the shared capacity and a fair share.
            let active = s.per.len().max(1);
            let share = (MAX_INFLIGHT / active).max(RESERVED_PER_SANDBOX);
            let shared_used: usize = s
                .per
                .values()
                .map(|n| n.saturating_sub(RESERVED_PER_SANDBOX))
                .sum();
            if mine >= share || shared_used >= MAX_INFLIGHT {
                return None;
            }
        }
        *s.per.entry(ip).or_default() += 1;
        Some(DnsPermit {
            gate: self.clone(),
            ip,
        })
    }

    #[cfg(test)]
    fn in_flight(&self, ip: IpAddr) -> usize {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.per.get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for DnsPermit {
    fn drop(&mut self) {
        let mut s = self.gate.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = s.per.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                s.per.remove(&self.ip);
            }
        }
    }
}

pub(crate) async fn serve_udp(sock: Arc<UdpSocket>, inner: Arc<Inner>, stop: CancellationToken) {
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            r = sock.recv_from(&mut buf) => match r {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        // Over its fair share: dropped (the client retries).
        let Some(permit) = inner.dns_gate.try_admit(peer.ip()) else {
            continue;
        };
        let q = buf[..n].to_vec();
        let sock = sock.clone();
        let inner = inner.clone();
        tokio::spawn(async move {
            if let Some(resp) = answer(&inner, peer.ip(), &q, true).await {
                let _ = sock.send_to(&resp, peer).await;
            }
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
        // Answers are small writes on a kept-alive connection: no Nagle wait.
        let _ = s.set_nodelay(true);
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
        // The same fair share as UDP; over it, SERVFAIL (the client may ask again).
        let resp = match inner.dns_gate.try_admit(peer.ip()) {
            Some(_permit) => answer(&inner, peer.ip(), &q, false).await,
            None => servfail(&q),
        };
        let Some(resp) = resp else {
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

/// SERVFAIL for the query in `bytes` (`None` if it is no query).
fn servfail(bytes: &[u8]) -> Option<Vec<u8>> {
    let q = Message::from_vec(bytes).ok()?;
    (q.message_type() == MessageType::Query)
        .then(|| reply_to(&q, ResponseCode::ServFail).to_vec().ok())
        .flatten()
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
        Some(n) => {
            let d = sb.policy().decide_dns(n);
            // A host the approval policy asks about resolves: its connections are held.
            match sb.asks_about(n) {
                Some(rule) if d.rule == "default" => crate::Decision {
                    verdict: Verdict::Allow,
                    rule: format!("ask:{rule}"),
                },
                _ => d,
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(i: u8) -> IpAddr {
        IpAddr::from([10, 201, 0, i])
    }

    #[test]
    fn flooding_sources_cannot_take_a_quiet_one_s_slots() {
        let gate = Arc::new(DnsGate::default());
        let mut held = Vec::new();
        // Eight sources take all they can.
        for i in 1..=8 {
            while let Some(p) = gate.try_admit(ip(i)) {
                held.push(p);
            }
        }
        for i in 1..=8 {
            let n = gate.in_flight(ip(i));
            assert!(n <= crate::DNS_INFLIGHT_PER_SANDBOX, "{n}");
        }
        // A ninth still gets its reserved slots at once...
        let quiet: Vec<_> = (0..RESERVED_PER_SANDBOX)
            .map(|_| gate.try_admit(ip(9)).expect("reserved slot"))
            .collect();
        // ... and no source ever holds more than its share of the shared capacity.
        let total: usize = (1..=9).map(|i| gate.in_flight(ip(i))).sum();
        assert!(total <= MAX_INFLIGHT + 9 * RESERVED_PER_SANDBOX, "{total}");
        drop(quiet);
        assert_eq!(gate.in_flight(ip(9)), 0);
        // With many active sources the share shrinks: a source that frees a slot cannot
        // take more than capacity / sources again.
        held.clear();
        let many = 40u8;
        for i in 1..=many {
            while let Some(p) = gate.try_admit(ip(i)) {
                held.push(p);
            }
        }
        let most = (1..=many).map(|i| gate.in_flight(ip(i))).max().unwrap();
        assert!(most <= crate::DNS_INFLIGHT_PER_SANDBOX);
        assert!(gate.try_admit(ip(200)).is_some(), "a new source is starved");
        held.clear();
        assert!(gate.state.lock().unwrap().per.is_empty());
    }
}
