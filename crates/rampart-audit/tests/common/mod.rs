//! A small node and a realistic sandbox session, for the integration tests.
#![allow(dead_code)]

use rampart_audit::hash::content_digest;
use rampart_audit::*;
use rampart_types::audit::*;
use rampart_types::SandboxId;
use serde_json::{json, Value};

/// A node: its key and its Merkle log of chain heads.
pub struct Node {
    pub key: NodeKey,
    pub log: MerkleLog,
    clock: u64,
}

impl Node {
    pub fn new(seed: u8) -> Node {
        let mut log = MerkleLog::new();
        // Other sandboxes' heads published before ours.
        for i in 0..5u8 {
            let other = SandboxId::parse(&format!("other{seed}x{i}")).unwrap();
            log.push(Chain::new(other).leaf().hash());
        }
        Node {
            key: NodeKey::from_seed(&[seed; 32]),
            log,
            clock: 0,
        }
    }

    /// A deterministic, increasing audit time.
    pub fn tick(&mut self) -> String {
        self.clock += 1;
        let s = self.clock;
        format!(
            "2026-05-01T{:02}:{:02}:{:02}.{:03}Z",
            (s / 3_600_000) % 24,
            (s / 60_000) % 60,
            (s / 1000) % 60,
            s % 1000
        )
    }

    /// Publishes `leaf`, signs a tree head, and returns (leaf index, inclusion proof, sth).
    pub fn publish(&mut self, leaf: &HeadLeaf) -> (u64, Vec<Hash>, SignedTreeHead) {
        let index = self.log.push(leaf.hash());
        // Something else published after ours, so the proof is not trivial.
        let filler = SandboxId::parse(&format!("later{}", self.log.size())).unwrap();
        self.log.push(Chain::new(filler).leaf().hash());
        let t = self.tick();
        let sth = self.key.sign_tree_head(self.log.size(), self.log.root(), t);
        let proof = self.log.inclusion_proof(index, sth.tree_size).unwrap();
        (index, proof, sth)
    }

    /// Publishes the chain's head and assembles the bundle.
    pub fn export(&mut self, chain: &Chain, events: Vec<Event>, blobs: Vec<Vec<u8>>) -> Bundle {
        let (index, proof, sth) = self.publish(&chain.leaf());
        let wanted = referenced_blobs(&events);
        let blobs = blobs
            .into_iter()
            .filter(|b| wanted.contains(&content_digest(b)));
        Bundle::assemble(
            chain.sandbox().clone(),
            events,
            blobs,
            index,
            proof,
            sth,
            self.key.public_key(),
        )
    }
}

pub struct Session {
    pub chain: Chain,
    pub events: Vec<Event>,
    pub blobs: Vec<Vec<u8>>,
}

impl Session {
    fn push(&mut self, node: &mut Node, body: EventBody) {
        let t = node.tick();
        let e = self.chain.append(body, t).unwrap();
        self.events.push(e);
    }
}

/// Output cap of the sample sessions.
pub const CAP: usize = 64;

/// A realistic session of sandbox `id` with `execs` commands (each `exec` + `exit`), a file
/// write, network decisions, a secret, a snapshot, an fs diff and the destroy.
pub fn session(node: &mut Node, id: &str, execs: usize) -> Session {
    let sandbox = SandboxId::parse(id).unwrap();
    let mut s = Session {
        chain: Chain::new(sandbox),
        events: Vec::new(),
        blobs: Vec::new(),
    };
    s.push(
        node,
        EventBody::Created(Created {
            spec: json!({"template": "base", "limits": {"cpus": 0.5, "memory_bytes": 268435456u64}, "env": {"A": "1"}}),
            template: "base".into(),
            template_digest: format!("sha256:{}", content_digest(b"template base")),
            policy: json!({"allow": ["pypi.org"], "deny_all": true}),
            caller: "key:test".into(),
        }),
    );
    for i in 0..execs {
        let input = if i % 3 == 0 {
            let (r, kept) = ContentHasher::record(format!("input {i}\n").as_bytes(), CAP);
            s.blobs.extend(kept);
            Some(r)
        } else {
            None
        };
        let exec_id = format!("x{i}");
        s.push(
            node,
            EventBody::Exec(Exec {
                exec_id: exec_id.clone(),
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    format!("echo marker-{i}; ls /tmp"),
                ],
                cwd: Some("/home/user".into()),
                user: "user".into(),
                env_names: vec!["PATH".into(), "TOKEN".into()],
                stdin: input.is_some(),
                pty: false,
                input,
                caller: Some("key:0123456789ab:ci (exec) tenant acme".into()),
                approval: None,
            }),
        );
        // Every 4th command floods stdout past the cap: blob is a prefix, marked truncated.
        let out = if i % 4 == 1 {
            "y\n".repeat(100)
        } else {
            format!("marker-{i}\nfile-a\n")
        };
        let (stdout, kept) = ContentHasher::record(out.as_bytes(), CAP);
        s.blobs.extend(kept);
        let (stderr, kept) = ContentHasher::record(b"", CAP);
        s.blobs.extend(kept);
        s.push(
            node,
            EventBody::Exit(Exit {
                exec_id,
                exit_code: Some((i % 2) as i32),
                signal: None,
                timed_out: false,
                wall_ms: 12 + i as u64,
                cpu_ms: Some(3),
                peak_memory_bytes: Some(1 << 20),
                stdout,
                stderr,
                streamed_input: None,
            }),
        );
        if i == 1 {
            s.push(
                node,
                EventBody::File(FileChange {
                    op: FileOp::Write,
                    path: "/home/user/main.py".into(),
                    to: None,
                    size: Some(12),
                    digest: Some(content_digest(b"print('hi')\n")),
                    caller: None,
                }),
            );
            s.push(
                node,
                EventBody::Network(Network {
                    kind: "connect".into(),
                    host: "pypi.org".into(),
                    port: Some(443),
                    verdict: "allowed".into(),
                    detail: json!({"rule": "allow pypi.org", "addrs": ["151.101.0.223"], "rtt": 0.25}),
                }),
            );
            s.push(
                node,
                EventBody::SecretUsed(SecretUsed {
                    name: "PYPI_TOKEN".into(),
                    host: "pypi.org".into(),
                }),
            );
            s.push(
                node,
                EventBody::Network(Network {
                    kind: "dns".into(),
                    host: "evil.example".into(),
                    port: None,
                    verdict: "denied".into(),
                    detail: Value::Null,
                }),
            );
        }
    }
    s.push(
        node,
        EventBody::Snapshot(Snapshot {
            name: "snap1".into(),
            ..Default::default()
        }),
    );
    s.push(
        node,
        EventBody::FsDiff(FsDiff {
            reason: "destroy".into(),
            added: vec![FsEntry {
                path: "/home/user/main.py".into(),
                size: 12,
                digest: Some(content_digest(b"print('hi')\n")),
            }],
            changed: vec![],
            removed: vec![FsEntry {
                path: "/etc/motd".into(),
                size: 5,
                digest: Some(content_digest(b"motd\n")),
            }],
            truncated: false,
        }),
    );
    // The daemon's manifest_digest: the hash of the fs_diff record made at the destroy.
    let manifest = s.events.last().map(|e| e.hash);
    s.push(
        node,
        EventBody::Destroyed(Destroyed {
            reason: "api".into(),
            manifest_digest: manifest,
            artifacts: None,
        }),
    );
    s
}
