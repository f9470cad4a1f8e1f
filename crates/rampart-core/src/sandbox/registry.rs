//! The registry: the sole owner of what core keeps in memory about live sandboxes (their
//! agent client, init pid, deadline, whether they are stopping or paused, the watcher of
//! their init, the execs the envd proxy records in them) and of the per-sandbox operation
//! locks. Everything else reads the store. What a sandbox's entry holds goes with it: at the
//! start of its destroy (whatever the cause) it is stopping and its recorded execs go, and
//! the entry itself goes when the destroy is done.
//!
//! Every method takes its std lock for one await-free step; none is held across an await.

use crate::exec::background::{self, Process};
use crate::exec::inputs::{ExecRef, ExecTicket, Inputs};
use crate::exec::InputSink;
use crate::util::lock;
use rampart_agent::client::AgentClient;
use rampart_types::{OnTimeout, SandboxId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// What the registry keeps about a running (or paused) sandbox.
#[derive(Debug)]
struct Live {
    client: AgentClient,
    pid: i32,
    deadline: Option<Instant>,
    stopping: bool,
    /// Frozen (or being frozen): its agent cannot answer, so nothing talks to it.
    paused: bool,
    /// What expiry does.
    on_timeout: OnTimeout,
    /// Its tenant (none: the node's).
    tenant: Option<String>,
    watcher: Option<AbortHandle>,
    /// The execs the envd proxy started and records (a paused sandbox keeps them: its
    /// processes resume with it).
    inputs: Inputs<InputSink>,
    /// Its background processes (running, or finished and kept a while), oldest first.
    processes: Vec<Arc<Process>>,
    /// Its idle sleep, when it has one.
    idle: Option<Idle>,
}

/// What a live sandbox is kept under.
#[derive(Debug, Clone)]
pub(crate) struct Terms {
    /// When its deadline falls.
    pub(crate) deadline: Instant,
    /// Frozen already.
    pub(crate) paused: bool,
    /// What expiry does.
    pub(crate) on_timeout: OnTimeout,
    /// Its tenant (none: the node's).
    pub(crate) tenant: Option<String>,
    /// Its idle sleep: how long it may go without a request, and (on a tier that keeps a
    /// sleeping sandbox's memory in RAM) how long it sleeps frozen before it is paused to
    /// its filesystem.
    pub(crate) idle: Option<(Duration, Option<Duration>)>,
}

/// A sandbox's idle sleep.
#[derive(Debug)]
struct Idle {
    /// How long it may go without a request.
    after: Duration,
    /// How long it sleeps frozen before it is paused to its filesystem (None: never).
    cold_after: Option<Duration>,
    /// When its last request ended (or it started, or woke).
    last: Instant,
    /// Requests in flight.
    busy: u32,
    /// Since when it sleeps (its pause for idleness began then).
    asleep_at: Option<Instant>,
    /// Its frozen sleep was handed on as a pause to its filesystem.
    chilled: bool,
}

impl Idle {
    /// When it falls asleep (running, nothing in flight), or when its frozen sleep turns
    /// into a pause to its filesystem (paused).
    fn due(&self, paused: bool) -> Option<Instant> {
        match (paused, self.asleep_at) {
            (false, None) if self.busy == 0 => Some(self.last + self.after),
            (true, Some(at)) if !self.chilled => self.cold_after.map(|c| at + c),
            _ => None,
        }
    }
}

/// How a sandbox stands for a request ([`Registry::enter`]).
#[derive(Debug)]
pub(crate) enum Entered {
    /// Running: its agent's client; `counted`: the request is counted in flight (it has an
    /// idle sleep) until [`Registry::leave`].
    Running { client: AgentClient, counted: bool },
    /// Paused (frozen); `wakes`: it has an idle sleep, so a request wakes it.
    Paused { wakes: bool },
    /// Not live here, or being destroyed.
    Gone,
}

/// Why a background process was not kept.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AddProcess {
    /// Kept.
    Added,
    /// The sandbox is not up.
    NotUp,
    /// It has [`background::MAX_PER_SANDBOX`] running already.
    Full,
}

/// What the reaper does with an expired sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    Destroy,
    Pause,
    /// Pause to the filesystem.
    PauseFilesystem,
    /// Went its idle time without a request: put it to sleep.
    Sleep,
    /// Slept frozen long enough: pause it to its filesystem.
    SleepCold,
}

/// How a sandbox stands in memory.
#[derive(Debug)]
pub(crate) enum Standing {
    /// Running: its agent answers.
    Running(AgentClient),
    /// Paused (frozen).
    Paused,
    /// Not live here, or being destroyed: the store says what it is.
    Gone,
}

/// The first step of a pause.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PauseStart {
    /// It was paused already.
    AlreadyPaused,
    /// Marked paused: new requests get 409 from now on.
    Started,
    /// Not live here, or stopping.
    NotRunning,
    /// Not put to sleep: a request came in since it was found idle.
    Busy,
}

/// Live sandboxes and operation locks.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    live: Mutex<HashMap<SandboxId, Live>>,
    locks: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
    /// Told whenever a deadline changes (the reaper sleeps on it).
    deadlines_changed: Notify,
}

impl Registry {
    /// The lock that serializes lifecycle operations (create, destroy, pause, resume,
    /// snapshot, network changes) of one sandbox.
    pub(crate) fn op_lock(&self, id: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.locks).entry(id.clone()).or_default().clone()
    }

    /// Forgets a sandbox's operation lock (its create failed or it ended).
    pub(crate) fn forget_lock(&self, id: &SandboxId) {
        lock(&self.locks).remove(id);
    }

    /// Keeps a running (or paused) sandbox; `watch` starts the watcher of its init, after
    /// the insert (an init that died at once still finds its entry).
    pub(crate) fn insert(
        &self,
        id: &SandboxId,
        client: AgentClient,
        pid: i32,
        terms: Terms,
        watch: impl FnOnce() -> AbortHandle,
    ) {
        let mut live = lock(&self.live);
        live.insert(
            id.clone(),
            Live {
                client,
                pid,
                deadline: Some(terms.deadline),
                stopping: false,
                paused: terms.paused,
                on_timeout: terms.on_timeout,
                tenant: terms.tenant,
                watcher: None,
                inputs: Inputs::default(),
                processes: Vec::new(),
                idle: terms.idle.map(|(after, cold_after)| Idle {
                    after,
                    cold_after,
                    last: Instant::now(),
                    busy: 0,
                    asleep_at: None,
                    chilled: false,
                }),
            },
        );
        let watcher = watch();
        if let Some(l) = live.get_mut(id) {
            l.watcher = Some(watcher);
        }
        drop(live);
        self.deadlines_changed.notify_one();
    }

    /// The tenant of a live sandbox (`Some(None)`: the node's); None when it is not live.
    pub(crate) fn tenant(&self, id: &SandboxId) -> Option<Option<String>> {
        lock(&self.live).get(id).map(|l| l.tenant.clone())
    }

    /// Whether `id` is live here (running, paused or stopping).
    pub(crate) fn contains(&self, id: &SandboxId) -> bool {
        lock(&self.live).contains_key(id)
    }

    /// How `id` stands.
    pub(crate) fn standing(&self, id: &SandboxId) -> Standing {
        match lock(&self.live).get(id) {
            Some(l) if !l.stopping && !l.paused => Standing::Running(l.client.clone()),
            Some(l) if !l.stopping => Standing::Paused,
            _ => Standing::Gone,
        }
    }

    /// How `id` stands for a request that needs its agent: when it runs and has an idle
    /// sleep, the request is counted in flight (it keeps the sandbox awake) until
    /// [`Registry::leave`].
    pub(crate) fn enter(&self, id: &SandboxId) -> Entered {
        match lock(&self.live).get_mut(id) {
            Some(l) if !l.stopping && !l.paused => {
                let counted = match &mut l.idle {
                    Some(i) => {
                        i.busy += 1;
                        true
                    }
                    None => false,
                };
                Entered::Running {
                    client: l.client.clone(),
                    counted,
                }
            }
            Some(l) if !l.stopping => Entered::Paused {
                wakes: l.idle.is_some(),
            },
            _ => Entered::Gone,
        }
    }

    /// A request [`Registry::enter`] counted is done: the sandbox's idle time counts from
    /// now.
    pub(crate) fn leave(&self, id: &SandboxId) {
        let idle = match lock(&self.live).get_mut(id).and_then(|l| l.idle.as_mut()) {
            Some(i) => {
                i.busy = i.busy.saturating_sub(1);
                i.last = Instant::now();
                i.busy == 0
            }
            None => false,
        };
        if idle {
            // Its sleep is due again (the reaper may be sleeping past it).
            self.deadlines_changed.notify_one();
        }
    }

    /// Whether `id` is asleep (paused for its idleness).
    #[cfg(test)]
    pub(crate) fn asleep(&self, id: &SandboxId) -> bool {
        lock(&self.live)
            .get(id)
            .and_then(|l| l.idle.as_ref())
            .is_some_and(|i| i.asleep_at.is_some())
    }

    /// Gives up putting `id` to sleep (its pause failed): its idle time counts from now.
    pub(crate) fn stay_awake(&self, id: &SandboxId) {
        if let Some(i) = lock(&self.live).get_mut(id).and_then(|l| l.idle.as_mut()) {
            i.asleep_at = None;
            i.last = Instant::now();
        }
        self.deadlines_changed.notify_one();
    }

    /// Whether `id` is live and not stopping (running or paused).
    pub(crate) fn is_up(&self, id: &SandboxId) -> bool {
        lock(&self.live).get(id).is_some_and(|l| !l.stopping)
    }

    /// Marks `id` as being destroyed: no request reaches it, the reaper leaves it alone, its
    /// recorded execs take no more input.
    pub(crate) fn begin_stop(&self, id: &SandboxId) {
        if let Some(l) = lock(&self.live).get_mut(id) {
            l.stopping = true;
            l.deadline = None;
            l.inputs = Inputs::default();
            l.processes.clear();
        }
    }

    /// Keeps background process `p` of `id` (the oldest finished one goes when it has
    /// [`background::MAX_PER_SANDBOX`]).
    pub(crate) fn add_process(&self, id: &SandboxId, p: Arc<Process>) -> AddProcess {
        let mut live = lock(&self.live);
        let Some(l) = live.get_mut(id).filter(|l| !l.stopping) else {
            return AddProcess::NotUp;
        };
        if l.processes.len() >= background::MAX_PER_SANDBOX {
            match l.processes.iter().position(|p| p.ended()) {
                Some(i) => {
                    l.processes.remove(i);
                }
                None => return AddProcess::Full,
            }
        }
        l.processes.push(p);
        AddProcess::Added
    }

    /// Background process `pid` of `id`, if it is up and has it.
    pub(crate) fn process(&self, id: &SandboxId, pid: u32) -> Option<Arc<Process>> {
        lock(&self.live)
            .get(id)
            .filter(|l| !l.stopping)
            .and_then(|l| l.processes.iter().find(|p| p.pid() == pid).cloned())
    }

    /// The background processes of `id`, oldest first (none when it is not up).
    pub(crate) fn processes(&self, id: &SandboxId) -> Vec<Arc<Process>> {
        lock(&self.live)
            .get(id)
            .filter(|l| !l.stopping)
            .map(|l| l.processes.clone())
            .unwrap_or_default()
    }

    /// Forgets finished background process `pid` of `id`.
    pub(crate) fn remove_process(&self, id: &SandboxId, pid: u32) {
        if let Some(l) = lock(&self.live).get_mut(id) {
            l.processes.retain(|p| p.pid() != pid || !p.ended());
        }
    }

    /// Registers an exec recorded by another road (started as `pid`, with `tag`) in a
    /// sandbox that is up; None when it is not (its end took its execs).
    pub(crate) fn add_input(
        &self,
        id: &SandboxId,
        pid: u32,
        tag: Option<&str>,
        sink: InputSink,
    ) -> Option<ExecTicket> {
        lock(&self.live)
            .get_mut(id)
            .filter(|l| !l.stopping)
            .map(|l| l.inputs.add(pid, tag, sink))
    }

    /// The input sink of the recorded exec `which` names in `id`, if it is up.
    pub(crate) fn input(&self, id: &SandboxId, which: ExecRef<'_>) -> Option<InputSink> {
        lock(&self.live)
            .get(id)
            .filter(|l| !l.stopping)
            .and_then(|l| l.inputs.get(which))
    }

    /// Removes what `ticket` registered in `id` (nothing when the sandbox is gone).
    pub(crate) fn remove_input(&self, id: &SandboxId, ticket: &ExecTicket) {
        if let Some(l) = lock(&self.live).get_mut(id) {
            l.inputs.remove(ticket);
        }
    }

    /// Has the reaper try `id` again at `at` (a destroy that failed).
    pub(crate) fn retry_at(&self, id: &SandboxId, at: Instant) {
        if let Some(l) = lock(&self.live).get_mut(id) {
            l.deadline = Some(at);
        }
        self.deadlines_changed.notify_one();
    }

    /// Forgets `id` (its destroy is done).
    pub(crate) fn remove(&self, id: &SandboxId) {
        lock(&self.live).remove(id);
    }

    /// Moves the deadline of a sandbox that is up; false when it is not.
    pub(crate) fn set_deadline(&self, id: &SandboxId, at: Instant) -> bool {
        let set = match lock(&self.live).get_mut(id) {
            Some(l) if !l.stopping => {
                l.deadline = Some(at);
                true
            }
            _ => false,
        };
        if set {
            self.deadlines_changed.notify_one();
        }
        set
    }

    /// Marks a running sandbox paused (first step of a pause).
    pub(crate) fn begin_pause(&self, id: &SandboxId) -> PauseStart {
        match lock(&self.live).get_mut(id) {
            Some(l) if !l.stopping && l.paused => PauseStart::AlreadyPaused,
            Some(l) if !l.stopping => {
                l.paused = true;
                PauseStart::Started
            }
            _ => PauseStart::NotRunning,
        }
    }

    /// Marks a sandbox found idle paused (first step of its sleep), unless a request came
    /// in since ([`PauseStart::Busy`]).
    pub(crate) fn begin_sleep(&self, id: &SandboxId) -> PauseStart {
        let start = match lock(&self.live).get_mut(id) {
            Some(l) if !l.stopping && l.paused => PauseStart::AlreadyPaused,
            Some(l) if !l.stopping => match &l.idle {
                Some(i) if i.busy == 0 && i.asleep_at.is_some() => {
                    l.paused = true;
                    PauseStart::Started
                }
                _ => PauseStart::Busy,
            },
            _ => PauseStart::NotRunning,
        };
        if start == PauseStart::Started {
            // Its frozen sleep's end (a pause to its filesystem) is due from now.
            self.deadlines_changed.notify_one();
        }
        start
    }

    /// Marks `id` running again (a pause that failed, or a resume that succeeded); true when
    /// its deadline had passed while it was paused (it was paused by its expiry).
    pub(crate) fn unpause(&self, id: &SandboxId) -> bool {
        match lock(&self.live).get_mut(id) {
            Some(l) => {
                l.paused = false;
                if let Some(i) = &mut l.idle {
                    i.asleep_at = None;
                    i.chilled = false;
                    i.last = Instant::now();
                }
                l.deadline.is_none()
            }
            None => false,
        }
    }

    /// The pid of `id`'s init if it is up (an exit of that init is unexpected).
    pub(crate) fn pid_if_up(&self, id: &SandboxId) -> Option<i32> {
        lock(&self.live)
            .get(id)
            .filter(|l| !l.stopping)
            .map(|l| l.pid)
    }

    /// The earliest deadline or idle sleep.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        lock(&self.live)
            .values()
            .filter(|l| !l.stopping)
            .flat_map(|l| {
                let idle = l.idle.as_ref().and_then(|i| i.due(l.paused));
                [l.deadline, idle]
            })
            .flatten()
            .min()
    }

    /// Resolves when a deadline changes (take it before reading [`Registry::next_deadline`]).
    pub(crate) fn deadlines_changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.deadlines_changed.notified()
    }

    /// The sandboxes whose deadline passed (their deadlines are disarmed) and what to do:
    /// destroy, or pause a running one created with `on_timeout: pause` (a paused one of
    /// those just stays paused, without a deadline, until resumed or destroyed). Then
    /// those whose idle time passed: put to sleep (marked asleep from now), or, asleep
    /// frozen long enough, paused to their filesystem.
    pub(crate) fn take_expired(&self) -> Vec<(SandboxId, Expiry)> {
        let now = Instant::now();
        let mut out = Vec::new();
        for (id, l) in lock(&self.live).iter_mut() {
            if l.stopping {
                continue;
            }
            let paused = l.paused;
            if let Some(i) = l
                .idle
                .as_mut()
                .filter(|i| i.due(paused).is_some_and(|d| d <= now))
            {
                if paused {
                    // Once: its frozen sleep becomes a pause to its filesystem.
                    i.chilled = true;
                    out.push((id.clone(), Expiry::SleepCold));
                } else {
                    i.asleep_at = Some(now);
                    out.push((id.clone(), Expiry::Sleep));
                }
                continue;
            }
            if l.deadline.is_some_and(|d| d <= now) {
                l.deadline = None;
                match (l.on_timeout, l.paused) {
                    (OnTimeout::Destroy, _) => out.push((id.clone(), Expiry::Destroy)),
                    (OnTimeout::Pause, false) => out.push((id.clone(), Expiry::Pause)),
                    (OnTimeout::PauseFilesystem, false) => {
                        out.push((id.clone(), Expiry::PauseFilesystem))
                    }
                    (OnTimeout::Pause | OnTimeout::PauseFilesystem, true) => {}
                }
            }
        }
        out
    }

    /// Stops watching every init (the daemon stops; the sandboxes keep running).
    pub(crate) fn stop_watchers(&self) {
        for l in lock(&self.live).values_mut() {
            if let Some(w) = l.watcher.take() {
                w.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    fn client() -> AgentClient {
        AgentClient::new(PathBuf::from("/nonexistent/agent.sock"))
    }

    fn terms(deadline: Instant, paused: bool, on_timeout: OnTimeout) -> Terms {
        Terms {
            deadline,
            paused,
            on_timeout,
            tenant: None,
            idle: None,
        }
    }

    fn dummy_task() -> AbortHandle {
        tokio::spawn(async {}).abort_handle()
    }

    #[tokio::test]
    async fn idle_sleep_waits_for_requests_in_flight_then_goes_cold_once() {
        let r = Registry::default();
        let id = SandboxId::generate();
        let later = Instant::now() + Duration::from_secs(600);
        let mut t = terms(later, false, OnTimeout::Destroy);
        t.idle = Some((Duration::ZERO, Some(Duration::ZERO)));
        r.insert(&id, client(), 1, t, dummy_task);
        // A request in flight keeps it awake: only the deadline is due.
        assert!(matches!(
            r.enter(&id),
            Entered::Running { counted: true, .. }
        ));
        assert_eq!(r.next_deadline(), Some(later));
        assert!(r.take_expired().is_empty());
        r.leave(&id);
        assert!(r.next_deadline().is_some_and(|d| d < later));
        assert_eq!(r.take_expired(), vec![(id.clone(), Expiry::Sleep)]);
        assert!(r.asleep(&id));
        assert!(r.take_expired().is_empty(), "asleep, not yet frozen");
        assert_eq!(r.begin_pause(&id), PauseStart::Started);
        assert!(matches!(r.enter(&id), Entered::Paused { wakes: true }));
        assert_eq!(r.take_expired(), vec![(id.clone(), Expiry::SleepCold)]);
        assert!(r.take_expired().is_empty(), "handed on once");
        // Woken: awake again, its idle time counting anew.
        r.unpause(&id);
        assert!(!r.asleep(&id));
        assert_eq!(r.take_expired(), vec![(id.clone(), Expiry::Sleep)]);
        r.stay_awake(&id);
        assert!(!r.asleep(&id));
        // Without an idle sleep nothing is counted and a paused sandbox does not wake.
        let plain = SandboxId::generate();
        r.insert(
            &plain,
            client(),
            2,
            terms(later, false, OnTimeout::Destroy),
            dummy_task,
        );
        assert!(matches!(
            r.enter(&plain),
            Entered::Running { counted: false, .. }
        ));
        r.begin_pause(&plain);
        assert!(matches!(r.enter(&plain), Entered::Paused { wakes: false }));
    }

    #[tokio::test]
    async fn standings_follow_pause_stop_and_remove() {
        let r = Registry::default();
        let id = SandboxId::generate();
        assert!(matches!(r.standing(&id), Standing::Gone));
        let later = Instant::now() + Duration::from_secs(60);
        r.insert(
            &id,
            client(),
            42,
            terms(later, false, OnTimeout::Destroy),
            dummy_task,
        );
        assert!(matches!(r.standing(&id), Standing::Running(_)));
        assert_eq!(r.begin_pause(&id), PauseStart::Started);
        assert!(matches!(r.standing(&id), Standing::Paused));
        assert_eq!(r.begin_pause(&id), PauseStart::AlreadyPaused);
        assert!(!r.unpause(&id), "its deadline is still armed");
        assert_eq!(r.pid_if_up(&id), Some(42));
        r.begin_stop(&id);
        assert!(matches!(r.standing(&id), Standing::Gone));
        assert_eq!(r.pid_if_up(&id), None);
        assert!(
            !r.set_deadline(&id, later),
            "a stopping sandbox keeps no deadline"
        );
        assert!(r.contains(&id));
        r.remove(&id);
        assert!(!r.contains(&id));
    }

    #[tokio::test]
    async fn recorded_execs_stay_while_up_and_go_with_the_sandbox() {
        let r = Registry::default();
        let (id, other) = (SandboxId::generate(), SandboxId::generate());
        let sink = InputSink::unrecorded;
        assert!(r.add_input(&id, 7, None, sink()).is_none(), "not live");
        let later = Instant::now() + Duration::from_secs(60);
        r.insert(
            &id,
            client(),
            1,
            terms(later, false, OnTimeout::Destroy),
            dummy_task,
        );
        let t = r.add_input(&id, 7, Some("t"), sink()).expect("running");
        assert!(r.input(&id, ExecRef::Pid(7)).is_some());
        assert!(r.input(&id, ExecRef::Tag("t")).is_some());
        assert!(
            r.input(&other, ExecRef::Pid(7)).is_none(),
            "another sandbox's"
        );
        r.remove_input(&id, &t);
        assert!(r.input(&id, ExecRef::Pid(7)).is_none());
        // Paused: kept (its processes resume with it).
        r.add_input(&id, 8, None, sink()).unwrap();
        assert_eq!(r.begin_pause(&id), PauseStart::Started);
        assert!(r.input(&id, ExecRef::Pid(8)).is_some());
        r.unpause(&id);
        // Its end (the destroy starts): gone, and none is taken any more.
        r.begin_stop(&id);
        assert!(r.input(&id, ExecRef::Pid(8)).is_none());
        assert!(r.add_input(&id, 9, None, sink()).is_none());
        r.remove(&id);
        assert!(r.add_input(&id, 9, None, sink()).is_none());
        // The ticket of a sandbox that is gone removes nothing and does not fail.
        r.remove_input(&id, &t);
    }

    #[tokio::test]
    async fn expiry_disarms_and_paused_pause_on_timeout_stays() {
        let r = Registry::default();
        let (a, b, c) = (
            SandboxId::generate(),
            SandboxId::generate(),
            SandboxId::generate(),
        );
        let past = Instant::now() - Duration::from_millis(1);
        r.insert(
            &a,
            client(),
            1,
            terms(past, false, OnTimeout::Destroy),
            dummy_task,
        );
        r.insert(
            &b,
            client(),
            2,
            terms(past, false, OnTimeout::Pause),
            dummy_task,
        );
        r.insert(
            &c,
            client(),
            3,
            terms(past, true, OnTimeout::Pause),
            dummy_task,
        );
        let mut got = r.take_expired();
        got.sort_by_key(|(id, _)| id.to_string());
        let mut want = vec![(a.clone(), Expiry::Destroy), (b.clone(), Expiry::Pause)];
        want.sort_by_key(|(id, _)| id.to_string());
        assert_eq!(got, want);
        assert!(r.take_expired().is_empty(), "deadlines are disarmed");
        assert_eq!(r.next_deadline(), None);
        assert!(r.unpause(&c), "its deadline passed while paused");
    }
}
