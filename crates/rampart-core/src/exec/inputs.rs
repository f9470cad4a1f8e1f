//! The execs another road into a sandbox (the E2B envd proxy) started and is recording, by
//! pid and by tag, each with the sink its input is counted in (`exit.streamed_input`).
//!
//! One table per live sandbox, kept in its registry entry: the sandbox's end (any cause)
//! drops it with the entry. An exec's registration is removed by its own [`ExecTicket`]
//! only: a later registration of the same pid or tag (the pid reused, the tag given again)
//! stays.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Tells one registration from any other (of any sandbox).
static NEXT: AtomicU64 = AtomicU64::new(1);

/// What [`Inputs::add`] registered, to remove it (and nothing registered later) again.
#[derive(Debug, PartialEq, Eq)]
pub struct ExecTicket {
    pid: u32,
    tag: Option<String>,
    n: u64,
}

/// How a request names a recorded exec: envd's process selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecRef<'a> {
    /// By its pid.
    Pid(u32),
    /// By the tag it was started with.
    Tag(&'a str),
}

/// The recorded execs of one sandbox: their sinks by pid, and the pids of the tagged ones.
#[derive(Debug)]
pub(crate) struct Inputs<S> {
    by_pid: HashMap<u32, (u64, S)>,
    tags: HashMap<String, (u64, u32)>,
}

impl<S> Default for Inputs<S> {
    fn default() -> Self {
        Inputs {
            by_pid: HashMap::new(),
            tags: HashMap::new(),
        }
    }
}

impl<S: Clone> Inputs<S> {
    /// The sink of the exec `which` names.
    pub(crate) fn get(&self, which: ExecRef<'_>) -> Option<S> {
        let pid = match which {
            ExecRef::Pid(p) => p,
            ExecRef::Tag(t) => self.tags.get(t)?.1,
        };
        self.by_pid.get(&pid).map(|(_, s)| s.clone())
    }

    /// Registers an exec that started as `pid` (with `tag`), replacing what held either.
    pub(crate) fn add(&mut self, pid: u32, tag: Option<&str>, sink: S) -> ExecTicket {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        self.by_pid.insert(pid, (n, sink));
        if let Some(t) = tag {
            self.tags.insert(t.to_owned(), (n, pid));
        }
        ExecTicket {
            pid,
            tag: tag.map(str::to_owned),
            n,
        }
    }

    /// Removes what `ticket` registered (not a later registration of its pid or tag).
    pub(crate) fn remove(&mut self, ticket: &ExecTicket) {
        if self
            .by_pid
            .get(&ticket.pid)
            .is_some_and(|(n, _)| *n == ticket.n)
        {
            self.by_pid.remove(&ticket.pid);
        }
        if let Some(tag) = &ticket.tag {
            if self.tags.get(tag).is_some_and(|(n, _)| *n == ticket.n) {
                self.tags.remove(tag);
            }
        }
    }

    /// Whether no exec is registered.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_pid.is_empty() && self.tags.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execs_are_found_by_pid_or_tag_and_removed_by_their_own_ticket() {
        // Sinks are numbers here (an input sink comes only from a recorded exec).
        let mut r = Inputs::<u8>::default();
        let t1 = r.add(7, Some("t"), 1);
        assert_eq!(r.get(ExecRef::Pid(7)), Some(1));
        assert_eq!(r.get(ExecRef::Tag("t")), Some(1));
        assert_eq!(r.get(ExecRef::Pid(8)), None);
        assert_eq!(r.get(ExecRef::Tag("u")), None);
        // The pid is taken again (the first registration is stale): removing the first
        // leaves the second.
        let t2 = r.add(7, None, 2);
        r.remove(&t1);
        assert_eq!(r.get(ExecRef::Pid(7)), Some(2));
        assert_eq!(r.get(ExecRef::Tag("t")), None);
        r.remove(&t2);
        assert!(r.is_empty());
        // The tag given again, to another pid: the first ticket leaves it.
        let t3 = r.add(1, Some("x"), 3);
        let t4 = r.add(2, Some("x"), 4);
        r.remove(&t3);
        assert_eq!(r.get(ExecRef::Tag("x")), Some(4));
        assert_eq!(r.get(ExecRef::Pid(1)), None);
        // A ticket removes once; again it changes nothing.
        r.remove(&t3);
        assert_eq!(r.get(ExecRef::Pid(2)), Some(4));
        r.remove(&t4);
        assert!(r.is_empty());
    }
}
