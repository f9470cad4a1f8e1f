//! The background tasks: the reaper (deadlines), the watcher of each sandbox's init, the
//! publisher of chain heads.

use super::*;

/// Sleeps until the earliest deadline (or a change of deadlines) and destroys what expired.
pub(super) async fn reaper(inner: Arc<Sandboxes>) {
    loop {
        let changed = inner.registry.deadlines_changed();
        let next = inner.registry.next_deadline();
        match next {
            Some(t) => {
                tokio::select! {
                    () = tokio::time::sleep_until(t) => {}
                    () = changed => {}
                }
            }
            None => changed.await,
        }
        if inner.stopped.load(Ordering::SeqCst) {
            return;
        }
        for (id, what) in inner.registry.take_expired() {
            let inner2 = inner.clone();
            tokio::spawn(async move {
                match what {
                    Expiry::Sleep => return inner2.sleep(&id).await,
                    Expiry::SleepCold => return inner2.sleep_cold(&id).await,
                    _ => {}
                }
                if what == Expiry::PauseFilesystem {
                    info!(id = %id, "deadline passed; pausing to the filesystem");
                    match inner2.pause_to_disk(&id, false).await {
                        Ok(_) => return,
                        Err(e) => warn!(id = %id, "reaper: pausing failed ({e}); destroying"),
                    }
                } else if what == Expiry::Pause {
                    info!(id = %id, "deadline passed; pausing (on_timeout: pause)");
                    match inner2.pause(&id).await {
                        Ok(_) => return,
                        Err(e) => warn!(id = %id, "reaper: pausing failed ({e}); destroying"),
                    }
                } else {
                    info!(id = %id, "deadline passed; destroying");
                }
                if let Err(e) = inner2.destroy(&id, EndReason::Expired).await {
                    warn!(id = %id, "reaper: {e}");
                }
            });
        }
    }
}

/// Removes the artifacts whose retention passed: at start, then every quarter of the
/// retention (between 1 s and 10 min).
pub(super) async fn artifact_pruner(inner: Arc<Sandboxes>) {
    let every = (inner.artifacts.config().retention / 4)
        .clamp(Duration::from_secs(1), Duration::from_secs(600));
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let store = inner.artifacts.clone();
        match tokio::task::spawn_blocking(move || store.prune()).await {
            Ok(n) if n > 0 => debug!(count = n, "removed expired artifacts"),
            Ok(_) => {}
            Err(e) => warn!("removing expired artifacts: task failed: {e}"),
        }
        // Lifecycle events past their retention go at the same pace.
        let events = inner.events.clone();
        let _ = tokio::task::spawn_blocking(move || events.prune()).await;
    }
}

/// Publishes the chain heads of live sandboxes that moved, at the configured interval.
pub(super) async fn publisher(audit: Arc<Audit>) {
    let every = audit.publish_interval().max(Duration::from_secs(1));
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    loop {
        tick.tick().await;
        let a = audit.clone();
        match tokio::task::spawn_blocking(move || a.publish_live()).await {
            Ok(Ok(Some(size))) => debug!(tree_size = size, "published audit chain heads"),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => warn!("publishing audit chain heads: {e}"),
            Err(e) => warn!("publishing audit chain heads: task failed: {e}"),
        }
    }
}

/// Waits for a sandbox's init to exit, reaps it, and destroys the sandbox unless that exit
/// was ours.
pub(super) async fn watch_init(inner: Arc<Sandboxes>, id: SandboxId, pid: i32, pidfd: OwnedFd) {
    let how = match proc::wait_exit(pidfd).await {
        Ok(Some(ExitStatus::Code(c))) => format!("exit status {c}"),
        Ok(Some(ExitStatus::Signal(s))) => format!("killed by signal {s}"),
        Ok(None) => "status unknown".to_owned(),
        Err(e) => {
            warn!(id = %id, "cannot watch the sandbox's init: {e}");
            return;
        }
    };
    if inner.stopped.load(Ordering::SeqCst) {
        return;
    }
    // Only the init it watches: a sandbox booted again from its disk has another.
    if inner.is_pooled(&id) {
        inner.pooled_died(&id, &how).await;
    } else if inner.registry.pid_if_up(&id) == Some(pid) {
        warn!(id = %id, pid, how, "the sandbox's init exited by itself; destroying the sandbox");
        let inner2 = inner.clone();
        tokio::spawn(async move {
            if let Err(e) = inner2.destroy(&id, EndReason::Died(how)).await {
                warn!(id = %id, "cleaning up a dead sandbox: {e}");
            }
        });
    }
}
