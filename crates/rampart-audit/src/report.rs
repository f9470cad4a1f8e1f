//! What a verified log says the sandbox did, readable.

use crate::key::PublicKey;
use rampart_types::audit::{Event, EventBody, FileOp, Hash};
use rampart_types::SandboxId;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// A command and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRecord {
    /// Seq of its `exec` record.
    pub seq: u64,
    /// When it started.
    pub time: String,
    /// The daemon's exec id.
    pub exec_id: String,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// The user it ran as.
    pub user: String,
    /// Seq of its `exit` record, `None` if it had not ended.
    pub exit_seq: Option<u64>,
    /// Exit code.
    pub exit_code: Option<i32>,
    /// Signal that ended it.
    pub signal: Option<i32>,
    /// Whether its timeout killed it.
    pub timed_out: bool,
    /// Wall time in ms.
    pub wall_ms: Option<u64>,
    /// Who asked for it (absent in older records).
    pub caller: Option<String>,
    /// The approval it ran under, if the sandbox's policy held it.
    pub approval: Option<String>,
}

/// A change to a file: through the API (`write`, `move`, `remove`, `mkdir`) or seen in an
/// `fs_diff` (`added`, `changed`, `removed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRecord {
    /// Seq of the record.
    pub seq: u64,
    /// What happened.
    pub op: &'static str,
    /// The path.
    pub path: String,
    /// The destination of a move.
    pub to: Option<String>,
}

/// A host the sandbox reached or tried to reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostRecord {
    /// Decisions that allowed it.
    pub allowed: u64,
    /// Decisions that denied it.
    pub denied: u64,
    /// Secrets sent to it (names).
    pub secrets: Vec<String>,
}

/// A package fetched (or refused) through the egress proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageRecord {
    /// Seq of its `package` record.
    pub seq: u64,
    /// `pypi`, `npm`, `debian`, `crates`.
    pub ecosystem: String,
    /// Name.
    pub name: String,
    /// Version.
    pub version: String,
    /// Registry host.
    pub registry: String,
    /// SHA-256 of what was fetched (`None`: refused).
    pub sha256: Option<Hash>,
    /// `allowed` or `denied`.
    pub verdict: String,
    /// The rule that decided.
    pub rule: String,
}

/// An action on the desktop, or a screenshot of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesktopRecord {
    /// Seq of its `desktop` record.
    pub seq: u64,
    /// Its time.
    pub time: String,
    /// The exec that carried it.
    pub exec_id: String,
    /// What it did, in words (`click left at 100,200`, `screenshot 1024x768`...).
    pub text: String,
    /// A screenshot's image: digest of its blob.
    pub image: Option<Hash>,
}

/// One line of the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineEntry {
    /// Seq of the record.
    pub seq: u64,
    /// Its time.
    pub time: String,
    /// What happened, in words (control characters escaped).
    pub text: String,
}

/// What a log says the sandbox did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activity {
    /// Commands run, in order.
    pub commands: Vec<CommandRecord>,
    /// Files changed, in order.
    pub files: Vec<FileRecord>,
    /// Hosts contacted, by name.
    pub hosts: BTreeMap<String, HostRecord>,
    /// Packages fetched or refused, in order.
    pub packages: Vec<PackageRecord>,
    /// Desktop actions and screenshots, in order (what the agent did and saw).
    pub desktop: Vec<DesktopRecord>,
    /// Network log entries the node's budget left out of the record (counted in `network`
    /// records of kind `suppressed`, not recorded one by one).
    pub suppressed: u64,
    /// The files kept as artifacts when the sandbox ended (`destroyed.artifacts`).
    pub artifacts: Option<rampart_types::audit::Artifacts>,
    /// Every record, in words.
    pub timeline: Vec<TimelineEntry>,
    /// Commands without an exit yet: exec id -> index in `commands`.
    open: HashMap<String, usize>,
}

/// A desktop record in words (every text from the record made printable).
fn desktop_text(d: &rampart_types::audit::Desktop) -> String {
    let mut t = printable(&d.action).replace('_', " ");
    if let Some(b) = &d.button {
        t.push_str(&format!(" {}", printable(b)));
    }
    if let (Some(x), Some(y)) = (d.x, d.y) {
        t.push_str(&format!(" at {x},{y}"));
    }
    if let Some(r) = d.repeat.filter(|&r| r != 1) {
        t.push_str(&format!(" x{r}"));
    }
    if let Some(k) = &d.keys {
        let k: Vec<String> = k.iter().map(|k| printable(k)).collect();
        t.push_str(&format!(" {}", k.join(" ")));
    }
    if let Some(x) = &d.text {
        t.push_str(&format!(
            " {} chars (sha256 {})",
            x.chars,
            x.digest.to_hex()
        ));
    }
    if let (Some(w), Some(h)) = (d.width, d.height) {
        t.push_str(&format!(" {w}x{h}"));
    }
    if let Some(i) = &d.image {
        t.push_str(&format!(", {} B", i.size));
    }
    if let Some(m) = &d.missing {
        t.push_str(&format!(" (no image: {})", printable(m)));
    }
    t
}

/// Makes text safe to print on a terminal: control characters (escape sequences included)
/// are shown escaped, so a recorded argv cannot rewrite the verifier's output.
pub fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let p = printable(a);
            if !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                p
            } else {
                format!("'{}'", p.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn ended(code: Option<i32>, signal: Option<i32>, timed_out: bool) -> String {
    let mut s = match (code, signal) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => "no status".to_owned(),
    };
    if timed_out {
        s.push_str(" (timed out)");
    }
    s
}

fn opt_hash(h: &Option<Hash>) -> String {
    h.map(|h| h.short()).unwrap_or_else(|| "-".into())
}

impl Activity {
    /// The activity of typed events (e.g. for `rampart audit show`).
    pub fn from_events(events: &[Event]) -> Activity {
        Activity::from_bodies(events.iter().map(|e| (e.seq, e.time.as_str(), &e.body)))
    }

    /// The activity of `(seq, time, body)` records in order.
    pub fn from_bodies<'a>(
        records: impl IntoIterator<Item = (u64, &'a str, &'a EventBody)>,
    ) -> Activity {
        let mut a = Activity::default();
        for (seq, time, body) in records {
            a.push(seq, time, body);
        }
        a
    }

    /// Adds the next record.
    pub fn push(&mut self, seq: u64, time: &str, body: &EventBody) {
        let a = self;
        let text = match body {
            EventBody::Created(c) => format!(
                "created from template {} ({}) by {}",
                printable(&c.template),
                printable(&c.template_digest),
                printable(&c.caller)
            ),
            EventBody::Exec(x) => {
                a.open.insert(x.exec_id.clone(), a.commands.len());
                a.commands.push(CommandRecord {
                    seq,
                    time: time.to_owned(),
                    exec_id: x.exec_id.clone(),
                    argv: x.argv.clone(),
                    user: x.user.clone(),
                    exit_seq: None,
                    exit_code: None,
                    signal: None,
                    timed_out: false,
                    wall_ms: None,
                    caller: x.caller.clone(),
                    approval: x.approval.clone(),
                });
                let input = x.input.as_ref().map(|r| format!(", input {} B", r.size));
                format!(
                    "exec [{}] as {}: {}{}{}{}",
                    printable(&x.exec_id),
                    printable(&x.user),
                    shell_words(&x.argv),
                    if x.pty { " (pty)" } else { "" },
                    input.unwrap_or_default(),
                    x.approval
                        .as_deref()
                        .map(|a| format!(", approved [{}]", printable(a)))
                        .unwrap_or_default()
                )
            }
            EventBody::Exit(x) => {
                let open = a.open.remove(&x.exec_id);
                if let Some(c) = open.and_then(|i| a.commands.get_mut(i)) {
                    c.exit_seq = Some(seq);
                    c.exit_code = x.exit_code;
                    c.signal = x.signal;
                    c.timed_out = x.timed_out;
                    c.wall_ms = Some(x.wall_ms);
                }
                format!(
                    "exit [{}]: {} after {} ms; stdout {} B ({}), stderr {} B ({})",
                    printable(&x.exec_id),
                    ended(x.exit_code, x.signal, x.timed_out),
                    x.wall_ms,
                    x.stdout.size,
                    x.stdout.digest.short(),
                    x.stderr.size,
                    x.stderr.digest.short()
                )
            }
            EventBody::File(f) => {
                let op = match f.op {
                    FileOp::Write => "write",
                    FileOp::Move => "move",
                    FileOp::Remove => "remove",
                    FileOp::Mkdir => "mkdir",
                };
                a.files.push(FileRecord {
                    seq,
                    op,
                    path: f.path.clone(),
                    to: f.to.clone(),
                });
                let to = f.to.as_deref().map(|t| format!(" -> {}", printable(t)));
                let size = f.size.map(|s| format!(" ({s} B, {})", opt_hash(&f.digest)));
                format!(
                    "file {op} {}{}{}",
                    printable(&f.path),
                    to.unwrap_or_default(),
                    size.unwrap_or_default()
                )
            }
            EventBody::FsDiff(d) => {
                for (op, list) in [
                    ("added", &d.added),
                    ("changed", &d.changed),
                    ("removed", &d.removed),
                ] {
                    for e in list {
                        a.files.push(FileRecord {
                            seq,
                            op,
                            path: e.path.clone(),
                            to: None,
                        });
                    }
                }
                format!(
                    "filesystem at {}: {} added, {} changed, {} removed",
                    printable(&d.reason),
                    d.added.len(),
                    d.changed.len(),
                    d.removed.len()
                )
            }
            EventBody::Network(n) if n.kind == "suppressed" => {
                let total = n.detail["total"].as_u64().unwrap_or(0);
                a.suppressed = a.suppressed.saturating_add(total);
                let mut parts = Vec::new();
                if let Some(counts) = n.detail["counts"].as_object() {
                    for (kind, by) in counts {
                        for (verdict, c) in by.as_object().into_iter().flatten() {
                            parts.push(format!("{} {} {}", printable(kind), printable(verdict), c));
                        }
                    }
                }
                for u in n.detail["secrets"].as_array().into_iter().flatten() {
                    let (name, host) = (
                        u["name"].as_str().unwrap_or_default(),
                        u["host"].as_str().unwrap_or_default(),
                    );
                    let h = a.hosts.entry(host.to_owned()).or_default();
                    if !h.secrets.iter().any(|s| s == name) {
                        h.secrets.push(name.to_owned());
                    }
                    parts.push(format!(
                        "secret {} to {} {}",
                        printable(name),
                        printable(host),
                        u["count"]
                    ));
                }
                format!(
                    "network: {total} log entries left out of the record ({}) from {} to {}",
                    parts.join(", "),
                    printable(n.detail["first"].as_str().unwrap_or("?")),
                    printable(n.detail["last"].as_str().unwrap_or("?"))
                )
            }
            EventBody::Network(n) => {
                let h = a.hosts.entry(n.host.clone()).or_default();
                if n.verdict == "allowed" {
                    h.allowed += 1;
                } else {
                    h.denied += 1;
                }
                let port = n.port.map(|p| format!(":{p}")).unwrap_or_default();
                format!(
                    "network {} {}{}: {}",
                    printable(&n.kind),
                    printable(&n.host),
                    port,
                    printable(&n.verdict)
                )
            }
            EventBody::SecretUsed(s) => {
                let h = a.hosts.entry(s.host.clone()).or_default();
                if !h.secrets.contains(&s.name) {
                    h.secrets.push(s.name.clone());
                }
                format!(
                    "secret {} sent to {}",
                    printable(&s.name),
                    printable(&s.host)
                )
            }
            EventBody::Package(p) => {
                a.packages.push(PackageRecord {
                    seq,
                    ecosystem: p.ecosystem.clone(),
                    name: p.name.clone(),
                    version: p.version.clone(),
                    registry: p.registry.clone(),
                    sha256: p.sha256,
                    verdict: p.verdict.clone(),
                    rule: p.rule.clone(),
                });
                format!(
                    "package {} {} {} from {}: {} ({}){}",
                    printable(&p.ecosystem),
                    printable(&p.name),
                    printable(&p.version),
                    printable(&p.registry),
                    printable(&p.verdict),
                    printable(&p.rule),
                    p.sha256
                        .map(|h| format!(", sha256 {}, {} B", h.to_hex(), p.size.unwrap_or(0)))
                        .unwrap_or_default()
                )
            }
            EventBody::Desktop(d) => {
                let text = desktop_text(d);
                a.desktop.push(DesktopRecord {
                    seq,
                    time: time.to_owned(),
                    exec_id: d.exec_id.clone(),
                    text: text.clone(),
                    image: d.image.as_ref().map(|i| i.digest),
                });
                format!("desktop ({}): {text}", printable(&d.exec_id))
            }
            EventBody::PolicyChanged(_) => "network policy changed".to_owned(),
            EventBody::TimeoutChanged(t) => {
                format!("deadline set to {}", printable(&t.expires_at))
            }
            EventBody::Paused(p) if p.memory == Some(false) => {
                "paused to its filesystem (processes ended, disk kept)".to_owned()
            }
            EventBody::Paused(_) => "paused".to_owned(),
            EventBody::Resumed(r) if r.reboot == Some(true) => {
                "resumed: booted again from its disk".to_owned()
            }
            EventBody::Resumed(_) => "resumed".to_owned(),
            EventBody::Snapshot(s) => format!("snapshot {}", printable(&s.name)),
            EventBody::ApprovalRequested(r) => format!(
                "approval requested [{}]: {} {} (rule {}) by {}",
                printable(&r.approval_id),
                printable(&r.kind),
                printable(&r.request),
                printable(&r.rule),
                printable(&r.caller)
            ),
            EventBody::ApprovalDecided(d) => format!(
                "approval {} {} by {}{}",
                printable(&d.approval_id),
                printable(&d.decision),
                printable(&d.by),
                d.reason
                    .as_deref()
                    .map(|r| format!(": {}", printable(r)))
                    .unwrap_or_default()
            ),
            EventBody::Redacted(r) => format!(
                "{} of {} edited: {} value(s) of {} redacted",
                printable(&r.field),
                printable(&r.exec_id),
                r.count,
                printable(&r.names.join(", "))
            ),
            EventBody::Destroyed(d) => {
                a.artifacts.clone_from(&d.artifacts);
                format!(
                    "destroyed ({}), final manifest {}{}",
                    printable(&d.reason),
                    opt_hash(&d.manifest_digest),
                    d.artifacts
                        .as_ref()
                        .map(|x| format!(", {} artifact file(s) kept", x.files.len()))
                        .unwrap_or_default()
                )
            }
        };
        a.timeline.push(TimelineEntry {
            seq,
            time: time.to_owned(),
            text,
        });
    }
}

impl fmt::Display for Activity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Commands ({}):", self.commands.len())?;
        for c in &self.commands {
            let status = match c.exit_seq {
                Some(_) => ended(c.exit_code, c.signal, c.timed_out),
                None => "did not end".to_owned(),
            };
            writeln!(f, "  #{:<5} {:<16} {}", c.seq, status, shell_words(&c.argv))?;
            // Who authorized it: the principal that asked and, where the policy held it,
            // the approval it ran under (the verifier checked that approval was given).
            if c.caller.is_some() || c.approval.is_some() {
                writeln!(
                    f,
                    "         asked by {}{}",
                    printable(c.caller.as_deref().unwrap_or("(not recorded)")),
                    c.approval
                        .as_deref()
                        .map(|a| format!(", approved [{}]", printable(a)))
                        .unwrap_or_default()
                )?;
            }
        }
        writeln!(f, "Files changed ({}):", self.files.len())?;
        for r in &self.files {
            let to =
                r.to.as_deref()
                    .map(|t| format!(" -> {}", printable(t)))
                    .unwrap_or_default();
            writeln!(
                f,
                "  #{:<5} {:<8} {}{}",
                r.seq,
                r.op,
                printable(&r.path),
                to
            )?;
        }
        if let Some(a) = &self.artifacts {
            writeln!(
                f,
                "Artifacts kept ({}{}{}):",
                a.files.len(),
                if a.skipped > 0 {
                    format!(", {} not regular files, not kept", a.skipped)
                } else {
                    String::new()
                },
                if a.truncated {
                    ", cut short by the node's bounds"
                } else {
                    ""
                }
            )?;
            for x in &a.files {
                writeln!(
                    f,
                    "  {} {:>10} {:o} {}",
                    x.digest.short(),
                    x.size,
                    x.mode,
                    printable(&x.path)
                )?;
            }
        }
        writeln!(f, "Hosts contacted ({}):", self.hosts.len())?;
        for (host, h) in &self.hosts {
            let secrets = if h.secrets.is_empty() {
                String::new()
            } else {
                format!(
                    ", secrets: {}",
                    h.secrets
                        .iter()
                        .map(|s| printable(s))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            writeln!(
                f,
                "  {} (allowed {}, denied {}{})",
                printable(host),
                h.allowed,
                h.denied,
                secrets
            )?;
        }
        if self.suppressed > 0 {
            writeln!(
                f,
                "  (and {} network log entries left out of the record by the node's budget, \
                 counted in its `suppressed` records)",
                self.suppressed
            )?;
        }
        writeln!(f, "Packages ({}):", self.packages.len())?;
        for p in &self.packages {
            let what = match p.sha256 {
                Some(h) => format!("sha256 {}", h.to_hex()),
                None => format!("{} ({})", printable(&p.verdict), printable(&p.rule)),
            };
            writeln!(
                f,
                "  #{:<5} {:<7} {}=={} from {}  {}",
                p.seq,
                printable(&p.ecosystem),
                printable(&p.name),
                printable(&p.version),
                printable(&p.registry),
                what
            )?;
        }
        writeln!(f, "Desktop ({}):", self.desktop.len())?;
        for d in &self.desktop {
            writeln!(
                f,
                "  #{:<5} {}  {}{}",
                d.seq,
                printable(&d.time),
                d.text,
                d.image
                    .map(|h| format!("  blob {}", h.to_hex()))
                    .unwrap_or_default()
            )?;
        }
        writeln!(f, "Timeline:")?;
        for t in &self.timeline {
            writeln!(f, "  #{:<5} {}  {}", t.seq, printable(&t.time), t.text)?;
        }
        Ok(())
    }
}

/// The result of [`crate::verify_bundle`]: what was proven, and what the sandbox did.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// Number of events.
    pub events: u64,
    /// The last event's hash.
    pub chain_head: Hash,
    /// Time of the first event.
    pub first_time: Option<String>,
    /// Time of the last event.
    pub last_time: Option<String>,
    /// Index of the chain head's leaf in the node log.
    pub leaf_index: u64,
    /// Size of the signed tree.
    pub tree_size: u64,
    /// Root of the signed tree.
    pub tree_root: Hash,
    /// When the tree head was signed.
    pub signed_at: String,
    /// The key that signed it.
    pub key: PublicKey,
    /// Whether that key was the trusted key given to the verifier.
    pub key_pinned: bool,
    /// Number of blobs checked against their digests.
    pub blobs_verified: u64,
    /// Things worth knowing that do not make the bundle invalid.
    pub warnings: Vec<String>,
    /// What the sandbox did.
    pub activity: Activity,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "VERIFIED: audit log of sandbox {}", self.sandbox)?;
        writeln!(
            f,
            "  {} events, {} .. {}",
            self.events,
            self.first_time
                .as_deref()
                .map(printable)
                .unwrap_or_else(|| "-".into()),
            self.last_time
                .as_deref()
                .map(printable)
                .unwrap_or_else(|| "-".into())
        )?;
        writeln!(
            f,
            "  chain head {} (leaf {} of {})",
            self.chain_head, self.leaf_index, self.tree_size
        )?;
        writeln!(
            f,
            "  tree root  {} signed at {}",
            self.tree_root,
            printable(&self.signed_at)
        )?;
        writeln!(
            f,
            "  node key   {} (id {}){}",
            self.key,
            self.key.key_id().short(),
            if self.key_pinned {
                ", pinned"
            } else {
                ", NOT PINNED"
            }
        )?;
        writeln!(f, "  {} blob(s) verified", self.blobs_verified)?;
        for w in &self.warnings {
            writeln!(f, "WARNING: {w}")?;
        }
        write!(f, "{}", self.activity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suppressed_network_records_are_counted_and_shown() {
        use rampart_types::audit::Network;
        let body = EventBody::Network(Network {
            kind: "suppressed".into(),
            host: String::new(),
            port: None,
            verdict: "suppressed".into(),
            detail: serde_json::json!({"total": 12, "first": "a", "last": "b",
                "counts": {"dns": {"denied": 10}},
                "secrets": [{"name": "TOKEN", "host": "api.example.com", "count": 2}]}),
        });
        let mut a = Activity::default();
        a.push(3, "t", &body);
        assert_eq!(a.suppressed, 12);
        assert_eq!(a.hosts.len(), 1, "{:?}", a.hosts);
        assert_eq!(a.hosts["api.example.com"].secrets, vec!["TOKEN".to_owned()]);
        let text = a.to_string();
        assert!(text.contains("12 log entries left out"), "{text}");
        assert!(text.contains("dns denied 10"), "{text}");
        assert!(text.contains("12 network log entries left out"), "{text}");
    }

    #[test]
    fn printable_escapes_terminal_controls() {
        assert_eq!(printable("ls"), "ls");
        assert_eq!(printable("a\x1b[2Jb\n"), "a\\u{1b}[2Jb\\n");
        assert_eq!(
            shell_words(&["echo".into(), "a b".into(), "it's".into()]),
            "echo 'a b' 'it'\\''s'"
        );
    }
}
