//! Hosts a sandbox's approval policy asks about: a connection to a host that no allow rule
//! admits, but that an ask pattern names, is held (the client's first bytes read, nothing
//! sent upstream) while a [`HostAsker`] (the daemon's approvals) waits for a person's
//! decision, then let through or refused.
//!
//! A decision is kept for the sandbox's life: every later connection to the same host and
//! port gets it without asking again (a package install opens dozens of connections to one
//! registry); connections made while it is pending wait for the same decision. A request
//! nobody decided in time is not kept: the next connection asks again.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::net::TcpStream;

use crate::policy::{Blocklist, Decision, Rule, RuleError, Target};
use crate::Sandbox;

/// The answer to a held connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Let it through.
    pub approved: bool,
    /// The approval's id (named by the connection's log entry).
    pub approval: String,
    /// Whether the decision holds for later connections to the same host (a person
    /// decided); false for a timeout or when nobody could be asked.
    pub lasting: bool,
}

/// A held connection, as the asker is told of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The sandbox's id.
    pub sandbox: String,
    /// The host name the connection named (TLS SNI or HTTP Host), normalized.
    pub host: String,
    /// The destination port.
    pub port: u16,
    /// The ask pattern it matched.
    pub rule: String,
}

/// Decides held connections (the daemon's approvals).
pub trait HostAsker: Send + Sync + 'static {
    /// Waits for the decision on `ask`. Dropped (not polled to the end) when every
    /// connection waiting for it went away.
    fn ask(&self, ask: Ask) -> Pin<Box<dyn Future<Output = Answer> + Send + 'static>>;
}

/// Checks ask patterns (the syntax of network rules: `example.com`, `*.example.com`,
/// `example.com:443`; names only, an address cannot be asked about).
pub fn compile(hosts: &[String]) -> Result<Vec<Rule>, RuleError> {
    hosts
        .iter()
        .map(|h| {
            let r = Rule::parse(h)?;
            if matches!(r.target, Target::Net(_)) {
                return Err(RuleError {
                    rule: h.clone(),
                    reason: "an ask pattern names hosts (an address or CIDR cannot be asked \
                             about: give it an allow rule)",
                });
            }
            Ok(r)
        })
        .collect()
}

impl Sandbox {
    /// The ask pattern a refused connection falls under, if it should be asked about
    /// rather than refused: refused only for want of an allow rule (not by a deny rule,
    /// the blocklist or `none` mode), with a name an ask pattern matches that this
    /// sandbox's resolver answered with this address, which is not private.
    pub(crate) fn ask_rule(
        &self,
        d: &Decision,
        blocklist: &Blocklist,
        ip: IpAddr,
        port: u16,
        name: Option<&str>,
    ) -> Option<String> {
        if d.rule != "default" {
            return None;
        }
        let name = name?;
        let rules = self.ask.read().unwrap_or_else(|e| e.into_inner()).clone();
        let r = rules
            .iter()
            .find(|r| r.matches_name(name) && r.matches_port(Some(port)))?;
        // As an allow rule by name would: an address the resolver answered for the name,
        // not a private one (only an address rule reaches those).
        if !self.is_pinned(ip, name) || blocklist.private(ip).is_some() {
            return None;
        }
        Some(r.text.clone())
    }

    /// Whether the resolver should answer `name` for asking (no allow rule, an ask pattern).
    pub(crate) fn asks_about(&self, name: &str) -> Option<String> {
        self.ask
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|r| r.matches_name(name))
            .map(|r| r.text.clone())
    }

    /// Waits for the decision on a connection to `host:port` under ask pattern `rule`
    /// (joining one already pending). None: the client left first.
    pub(crate) async fn held(
        &self,
        asker: Option<Arc<dyn HostAsker>>,
        id: &str,
        client: &TcpStream,
        host: &str,
        port: u16,
        rule: &str,
    ) -> Option<Answer> {
        let key = format!("{host}:{port}");
        let cell = self
            .asked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let ask = Ask {
            sandbox: id.to_owned(),
            host: host.to_owned(),
            port,
            rule: rule.to_owned(),
        };
        let answer = tokio::select! {
            a = cell.get_or_init(|| async move {
                match asker {
                    Some(a) => a.ask(ask).await,
                    None => Answer { approved: false, approval: "none".into(), lasting: false },
                }
            }) => a.clone(),
            _ = client_left(client) => return None,
            _ = self.gone.cancelled() => return None,
        };
        if !answer.lasting {
            let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
            if asked.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                asked.remove(&key);
            }
        }
        Some(answer)
    }
}

/// Returns when the client closed its side without sending more; never when it sends more
/// (the bytes stay unread for the relay).
async fn client_left(client: &TcpStream) {
    let mut b = [0u8; 1];
    loop {
        if client.readable().await.is_err() {
            return;
        }
        match client.peek(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(_) => std::future::pending::<()>().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ask_patterns_are_names() {
        assert!(compile(&["*.example.com".into(), "pypi.org:443".into()]).is_ok());
        let e = compile(&["10.0.0.0/8".into()]).unwrap_err();
        assert!(e.to_string().contains("names hosts"), "{e}");
        assert!(compile(&["bad name!".into()]).is_err());
    }
}
