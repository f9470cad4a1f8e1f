//! The per-sandbox network log: a bounded ring of [`NetLogEntry`], a broadcast for followers
//! and the daemon-wide event hook.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rampart_types::network::{NetEventKind, NetLogEntry, PackageFetch, Verdict};
use tokio::sync::{broadcast, mpsc};

/// A network log entry with the sandbox it belongs to (the event hook's item).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetEvent {
    /// The sandbox id given to `attach`.
    pub sandbox: String,
    /// The entry (as `log` returns it).
    pub entry: NetLogEntry,
}

/// The fields of an entry before it gets its sequence number and time.
#[derive(Debug, Clone)]
pub(crate) struct Draft {
    pub kind: NetEventKind,
    pub name: Option<String>,
    pub qtype: Option<String>,
    pub addrs: Vec<String>,
    pub port: Option<u16>,
    pub verdict: Verdict,
    pub rule: String,
    pub bytes_out: Option<u64>,
    pub bytes_in: Option<u64>,
    pub secret: Option<String>,
    pub package: Option<PackageFetch>,
}

impl Draft {
    pub fn new(kind: NetEventKind, verdict: Verdict, rule: impl Into<String>) -> Self {
        Draft {
            kind,
            name: None,
            qtype: None,
            addrs: Vec::new(),
            port: None,
            verdict,
            rule: rule.into(),
            bytes_out: None,
            bytes_in: None,
            secret: None,
            package: None,
        }
    }
}

/// One sandbox's log.
#[derive(Debug)]
pub(crate) struct NetLog {
    pub id: String,
    cap: usize,
    seq: AtomicU64,
    ring: Mutex<VecDeque<NetLogEntry>>,
    tx: broadcast::Sender<NetLogEntry>,
    events: Option<mpsc::Sender<NetEvent>>,
    dropped_events: AtomicU64,
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

impl NetLog {
    pub fn new(id: &str, cap: usize, events: Option<mpsc::Sender<NetEvent>>) -> Self {
        let (tx, _) = broadcast::channel(1024);
        NetLog {
            id: id.to_string(),
            cap: cap.max(1),
            seq: AtomicU64::new(0),
            ring: Mutex::new(VecDeque::new()),
            tx,
            events,
            dropped_events: AtomicU64::new(0),
        }
    }

    /// Records an entry; returns it with its sequence number.
    pub fn push(&self, d: Draft) -> NetLogEntry {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let e = NetLogEntry {
            seq,
            time: now_rfc3339(),
            kind: d.kind,
            name: d.name,
            qtype: d.qtype,
            addrs: d.addrs,
            port: d.port,
            verdict: d.verdict,
            rule: d.rule,
            bytes_out: d.bytes_out,
            bytes_in: d.bytes_in,
            secret: d.secret,
            package: d.package,
        };
        if ring.len() >= self.cap {
            ring.pop_front();
        }
        ring.push_back(e.clone());
        drop(ring);
        let _ = self.tx.send(e.clone());
        if let Some(ev) = &self.events {
            let item = NetEvent {
                sandbox: self.id.clone(),
                entry: e.clone(),
            };
            if ev.try_send(item).is_err() {
                self.dropped_events.fetch_add(1, Ordering::Relaxed);
            }
        }
        e
    }

    /// Entries with `seq > after`, at most `limit`.
    pub fn read(&self, after: u64, limit: usize) -> Vec<NetLogEntry> {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.iter()
            .filter(|e| e.seq > after)
            .take(limit)
            .cloned()
            .collect()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<NetLogEntry> {
        self.tx.subscribe()
    }

    /// How many entries the event hook could not take (its channel was full).
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events.load(Ordering::Relaxed)
    }
}
