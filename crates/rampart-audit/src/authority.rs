//! The policy in force along a sandbox's record, as the record itself defines it: the
//! approval policy of its create request (`created.spec.approvals`) and its network policy
//! (`created.policy`, then each `policy_changed.policy`). The daemon names its digest in
//! each event's `auth`; a verifier recomputes it event by event and, with the approval
//! policy's patterns, tells which commands needed an approval.

use crate::canonical::{normalize_numbers, to_canonical};
use crate::hash::sha256;
use rampart_types::audit::{EventBody, Hash};
use serde_json::Value;

/// The policy in force at one point of a record.
#[derive(Debug, Clone)]
pub struct PolicyState {
    approvals: Value,
    network: Value,
    digest: Hash,
    /// The approval policy's command patterns (a pattern that does not compile holds
    /// every command, as the daemon does).
    commands: Vec<(String, Option<regex::Regex>)>,
}

impl Default for PolicyState {
    fn default() -> Self {
        Self::new()
    }
}

/// SHA-256 of the canonical JSON of `{"approvals": approvals, "network": network}` (free
/// numbers normalized as event bodies' are).
pub fn policy_digest(approvals: &Value, network: &Value) -> Hash {
    let mut v = serde_json::json!({ "approvals": approvals, "network": network });
    normalize_numbers(&mut v);
    // A map of plain JSON values always encodes (numbers were just normalized).
    sha256(&to_canonical(&v).unwrap_or_default())
}

impl PolicyState {
    /// Before the record's first event: no approval policy, no network policy.
    pub fn new() -> Self {
        PolicyState {
            approvals: Value::Null,
            network: Value::Null,
            digest: policy_digest(&Value::Null, &Value::Null),
            commands: Vec::new(),
        }
    }

    /// The digest of the policy in force.
    pub fn digest(&self) -> Hash {
        self.digest
    }

    /// Moves past `body` (normalized as recorded): a `created` sets both policies, a
    /// `policy_changed` the network one.
    pub fn observe(&mut self, body: &EventBody) {
        match body {
            EventBody::Created(c) => {
                self.approvals = c.spec.get("approvals").cloned().unwrap_or(Value::Null);
                self.network = c.policy.clone();
                self.commands = self
                    .approvals
                    .get("commands")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(|p| (p.to_owned(), regex::Regex::new(p).ok()))
                            .collect()
                    })
                    .unwrap_or_default();
            }
            EventBody::PolicyChanged(p) => self.network = p.policy.clone(),
            _ => return,
        }
        self.digest = policy_digest(&self.approvals, &self.network);
    }

    /// The command pattern `argv` matches, if the approval policy holds it.
    pub fn holds(&self, argv: &[String]) -> Option<&str> {
        let lines = rampart_types::approval::command_lines(argv);
        self.commands
            .iter()
            .find(|(_, re)| match re {
                Some(re) => lines.iter().any(|l| re.is_match(l)),
                None => true,
            })
            .map(|(p, _)| p.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_types::audit::{Created, PolicyChanged};

    fn created(approvals: Value, policy: Value) -> EventBody {
        EventBody::Created(Created {
            spec: serde_json::json!({ "approvals": approvals }),
            template: "base".into(),
            template_digest: "x".into(),
            policy,
            caller: "local".into(),
        })
    }

    #[test]
    fn the_digest_follows_the_record() {
        let mut s = PolicyState::new();
        let empty = s.digest();
        s.observe(&created(
            serde_json::json!({"commands": ["^rm( |$)"]}),
            serde_json::json!({"mode": "allowlist", "allow": ["a.com"]}),
        ));
        let first = s.digest();
        assert_ne!(first, empty);
        assert_eq!(
            first,
            policy_digest(
                &serde_json::json!({"commands": ["^rm( |$)"]}),
                &serde_json::json!({"allow": ["a.com"], "mode": "allowlist"})
            ),
            "canonical: member order does not matter"
        );
        s.observe(&EventBody::Paused(Default::default()));
        assert_eq!(s.digest(), first);
        s.observe(&EventBody::PolicyChanged(PolicyChanged {
            policy: serde_json::json!({"mode": "none"}),
        }));
        assert_ne!(s.digest(), first);
        let argv = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(s.holds(&argv(&["rm", "-rf", "x"])), Some("^rm( |$)"));
        assert_eq!(s.holds(&argv(&["sh", "-c", "rm x"])), Some("^rm( |$)"));
        assert_eq!(s.holds(&argv(&["rmdir", "x"])), None);
    }
}
