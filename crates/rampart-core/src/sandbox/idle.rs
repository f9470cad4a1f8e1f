//! Idle sleep and wake: a sandbox made with `idle_pause_secs` is put to sleep when it went
//! that long without a request (the reaper finds it, [`Sandboxes::sleep`]): on a tier that
//! can save its memory to disk (gVisor) it is paused to disk with its memory, otherwise it
//! is frozen, and paused to its filesystem once it has slept the node's `idle_cold_secs`.
//! The next request that needs its agent wakes it ([`Sandboxes::awake`]) and gets its
//! answer; the record says `paused {idle: true}` and `resumed {woken: true}`.
//!
//! A request counts from the moment it reaches the agent until its answer is done: an exec's
//! events, a file's stream, a watch, a port connection hold an [`Activity`] until they end,
//! so a command being waited for or streamed, or an open connection, keeps the sandbox
//! awake. Background processes with no client attached do not.

use super::registry::Entered;
use super::*;

/// A request in flight in a sandbox with an idle sleep: the sandbox stays awake until it
/// is dropped, and its idle time counts from then.
pub(crate) struct Activity {
    core: Arc<Sandboxes>,
    id: SandboxId,
}

impl std::fmt::Debug for Activity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Activity").field("id", &self.id).finish()
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.core.registry.leave(&self.id);
    }
}

/// A sandbox's agent, awake for a request: keep `activity` as long as the request runs.
pub(crate) struct Awake {
    pub(crate) client: AgentClient,
    /// Counted in flight (None: the sandbox has no idle sleep).
    pub(crate) activity: Option<Activity>,
}

impl Awake {
    /// `stream`, holding this request's activity until it ends or is dropped.
    pub(crate) fn hold<T: Send + 'static>(
        activity: Option<Activity>,
        stream: BoxStream<'static, T>,
    ) -> BoxStream<'static, T> {
        match activity {
            None => stream,
            Some(a) => stream
                .map(move |item| {
                    let _ = &a;
                    item
                })
                .boxed(),
        }
    }
}

impl Sandboxes {
    /// The agent of `id` for a request, waking it first when it sleeps (or is paused) and
    /// has an idle sleep. A paused sandbox without one is `WrongState` (409), as before.
    pub(crate) async fn awake(self: &Arc<Self>, id: &SandboxId) -> Result<Awake, CoreError> {
        let mut woke = false;
        loop {
            let wakes = match self.registry.enter(id) {
                Entered::Running { client, counted } => {
                    let activity = counted.then(|| Activity {
                        core: self.clone(),
                        id: id.clone(),
                    });
                    return Ok(Awake { client, activity });
                }
                Entered::Paused { wakes } => wakes,
                // Paused to its filesystem (asleep long enough), or not there.
                Entered::Gone => self.sleeps_on_disk(id)?,
            };
            if !wakes {
                return Err(self.agent(id).err().unwrap_or_else(|| self.not_running(id)));
            }
            if woke {
                // Woken, and paused again before this request reached it.
                return Err(self.not_running(id));
            }
            self.wake(id).await?;
            woke = true;
        }
    }

    /// Whether `id` is paused to disk (not live here) and has an idle sleep.
    fn sleeps_on_disk(&self, id: &SandboxId) -> Result<bool, CoreError> {
        Ok(self
            .store
            .get(id)
            .map_err(CoreError::from)?
            .is_some_and(|r| {
                r.state == SandboxState::Paused && r.pid.is_none() && r.idle_pause_secs.is_some()
            }))
    }

    /// Wakes a sleeping (or paused) sandbox for a request.
    async fn wake(self: &Arc<Self>, id: &SandboxId) -> Result<(), CoreError> {
        let t0 = Instant::now();
        let woken = if self.is_cold(id).await? {
            self.reboot(id, true).await
        } else {
            self.resume_for(id, true).await
        };
        match woken {
            Ok(_) => {
                self.metrics.wakes.inc();
                info!(id = %id, ms = t0.elapsed().as_millis() as u64, "woken by a request");
                Ok(())
            }
            // Another request woke it first.
            Err(CoreError::WrongState { .. } | CoreError::Conflict(_))
                if matches!(self.registry.standing(id), Standing::Running(_)) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Puts `id` to sleep (it went its idle time without a request): to disk with its
    /// memory on a tier that can save it, frozen otherwise. A request that came in since it
    /// was found idle keeps it awake.
    pub(super) async fn sleep(self: &Arc<Self>, id: &SandboxId) {
        let t0 = Instant::now();
        let to_disk = self.iso.cold().is_ok_and(|c| c.can_checkpoint(id));
        let slept = match to_disk {
            true => self.pause_to_disk_for(id, true, true).await,
            false => self.pause_for(id, true).await,
        };
        match slept {
            Ok(_) => {
                self.metrics.sleeps.inc();
                info!(id = %id, ms = t0.elapsed().as_millis() as u64, to_disk, "asleep (idle)");
            }
            Err(CoreError::Conflict(_)) => {
                debug!(id = %id, "a request came in: staying awake");
                self.registry.stay_awake(id);
            }
            Err(e) => {
                warn!(id = %id, "putting an idle sandbox to sleep failed: {e}");
                self.registry.stay_awake(id);
            }
        }
    }

    /// Pauses `id`, asleep frozen for the node's `idle_cold_secs`, to its filesystem: its
    /// memory and CPU are freed, its disk kept; the next request boots it from its disk.
    pub(super) async fn sleep_cold(self: &Arc<Self>, id: &SandboxId) {
        match self.pause_to_disk_for(id, false, true).await {
            Ok(_) => info!(id = %id, "asleep on its disk (idle)"),
            // A request woke it meanwhile, or it ended; a failure destroyed it, saying why.
            Err(e) => debug!(id = %id, "pausing a sleeping sandbox to its filesystem: {e}"),
        }
    }
}

/// A connection to a port inside a sandbox, through its agent's tunnel: the sandbox stays
/// awake while it is open.
pub struct Tunnel {
    io: hyper::upgrade::Upgraded,
    _activity: Option<Activity>,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel").finish_non_exhaustive()
    }
}

impl Tunnel {
    pub(crate) fn new(io: hyper::upgrade::Upgraded, activity: Option<Activity>) -> Self {
        Tunnel {
            io,
            _activity: activity,
        }
    }
}

impl hyper::rt::Read for Tunnel {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Tunnel {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}
