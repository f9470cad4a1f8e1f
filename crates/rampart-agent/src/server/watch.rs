//! Directory watches over inotify: `WatchDir` (streaming) and the polling watchers.

use super::fs::{entry_info, io_err, user_path};
use super::users::Names;
use super::{spawn_stream, Body, Ctx, State};
use crate::connect::{self, Code, RpcError};
use crate::proto::{
    Empty, EventType, FilesystemEvent, WatchDirResponse, WatchRequest, WatcherEvents, WatcherId,
};
use hyper::Response;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::io::unix::AsyncFd;

/// Most events a polling watcher keeps between two polls.
const MAX_PENDING: usize = 100_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An inotify instance usable with [`AsyncFd`].
struct InoFd(Inotify);

impl std::os::fd::AsRawFd for InoFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd as _;
        self.0.as_fd().as_raw_fd()
    }
}

/// A live inotify watch of a directory (and its subdirectories when recursive).
struct Watch {
    fd: AsyncFd<InoFd>,
    root: PathBuf,
    wds: HashMap<WatchDescriptor, PathBuf>,
    recursive: bool,
    include_entry: bool,
}

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DONT_FOLLOW
        | AddWatchFlags::IN_ONLYDIR
}

impl Watch {
    fn new(root: PathBuf, recursive: bool, include_entry: bool) -> Result<Watch, RpcError> {
        let m = std::fs::metadata(&root).map_err(|e| io_err(&e, "watch", &root))?;
        if !m.is_dir() {
            return Err(RpcError::new(
                Code::InvalidArgument,
                format!("path {} is not a directory", root.display()),
            ));
        }
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| RpcError::new(Code::Internal, format!("inotify: {e}")))?;
        // SAFETY: the AsyncFd owns the Inotify, whose fd stays open and the same until dropped.
        let fd = unsafe { AsyncFd::register(InoFd(ino)) }
            .map_err(|e| RpcError::new(Code::Internal, format!("inotify: {}", e)))?;
        let mut w = Watch {
            fd,
            root: root.clone(),
            wds: HashMap::new(),
            recursive,
            include_entry,
        };
        w.add(&root, Path::new("")).map_err(|e| {
            RpcError::new(Code::Internal, format!("watching {}: {e}", root.display()))
        })?;
        Ok(w)
    }

    /// Watch `abs` (known as `rel` under the root) and, if recursive, its subdirectories.
    fn add(&mut self, abs: &Path, rel: &Path) -> nix::Result<()> {
        let wd = self.fd.get_ref().0.add_watch(abs, mask())?;
        self.wds.insert(wd, rel.to_path_buf());
        if self.recursive {
            if let Ok(rd) = std::fs::read_dir(abs) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        // A subdirectory that vanished or is unreadable is skipped.
                        let _ = self.add(&abs.join(e.file_name()), &rel.join(e.file_name()));
                    }
                }
            }
        }
        Ok(())
    }

    /// Wait for the next batch of events.
    async fn next(&mut self) -> std::io::Result<Vec<FilesystemEvent>> {
        loop {
            let mut guard = self.fd.readable().await?;
            let events = match guard.try_io(|inner| {
                inner
                    .get_ref()
                    .0
                    .read_events()
                    .map_err(std::io::Error::from)
            }) {
                Ok(r) => r?,
                Err(_would_block) => continue,
            };
            drop(guard);
            let mut out = Vec::new();
            let names = if self.include_entry {
                Some(Names::load())
            } else {
                None
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    self.wds.remove(&ev.wd);
                    continue;
                }
                let (Some(name), Some(dir)) = (ev.name.as_ref(), self.wds.get(&ev.wd).cloned())
                else {
                    continue;
                };
                let rel = dir.join(name);
                let m = ev.mask;
                let kind = if m.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
                    if self.recursive && m.contains(AddWatchFlags::IN_ISDIR) {
                        let _ = self.add(&self.root.join(&rel), &rel);
                    }
                    EventType::Create
                } else if m.contains(AddWatchFlags::IN_MODIFY) {
                    EventType::Write
                } else if m.contains(AddWatchFlags::IN_DELETE) {
                    EventType::Remove
                } else if m.contains(AddWatchFlags::IN_MOVED_FROM) {
                    EventType::Rename
                } else if m.contains(AddWatchFlags::IN_ATTRIB) {
                    EventType::Chmod
                } else {
                    continue;
                };
                let entry = names
                    .as_ref()
                    .and_then(|n| entry_info(&self.root.join(&rel), n).ok());
                out.push(FilesystemEvent {
                    name: rel.to_string_lossy().into_owned(),
                    event_type: kind,
                    entry,
                });
            }
            if !out.is_empty() {
                return Ok(out);
            }
        }
    }
}

/// `WatchDir` (server streaming).
pub fn watch_dir(
    state: &Arc<State>,
    ctx: &Ctx,
    req: WatchRequest,
) -> Result<Response<Body>, RpcError> {
    let (_, root) = user_path(state, ctx, &req.path)?;
    let mut w = Watch::new(root, req.recursive, req.include_entry)?;
    let keepalive = ctx.keepalive;
    let deadline = ctx
        .timeout
        .and_then(|t| tokio::time::Instant::now().checked_add(t));
    Ok(spawn_stream(move |tx| async move {
        let msg = |r: WatchDirResponse| connect::message_envelope(&r);
        if tx
            .send(msg(WatchDirResponse {
                start: Some(Empty {}),
                ..Default::default()
            }))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let until_deadline = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = w.next() => match r {
                    Ok(evs) => {
                        for e in evs {
                            if tx.send(msg(WatchDirResponse { filesystem: Some(e), ..Default::default() })).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let err = RpcError::new(Code::Internal, format!("watch failed: {e}"));
                        let _ = tx.send(connect::end_envelope(Some(&err))).await;
                        return;
                    }
                },
                _ = tokio::time::sleep(keepalive) => {
                    if tx.send(msg(WatchDirResponse { keepalive: Some(Empty {}), ..Default::default() })).await.is_err() {
                        return;
                    }
                }
                _ = until_deadline => {
                    let err = RpcError::new(Code::DeadlineExceeded, "watch deadline (connect-timeout-ms) elapsed");
                    let _ = tx.send(connect::end_envelope(Some(&err))).await;
                    return;
                }
                _ = tx.closed() => return,
            }
        }
    }))
}

/// The polling watchers (`CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher`).
#[derive(Debug, Default)]
pub struct Watchers {
    next: AtomicU64,
    map: Mutex<HashMap<String, PollWatcher>>,
}

#[derive(Debug)]
struct PollWatcher {
    events: Arc<Mutex<Vec<FilesystemEvent>>>,
    task: tokio::task::JoinHandle<()>,
}

/// `CreateWatcher`.
pub fn create_watcher(
    state: &Arc<State>,
    ctx: &Ctx,
    req: WatchRequest,
) -> Result<WatcherId, RpcError> {
    let (_, root) = user_path(state, ctx, &req.path)?;
    let mut w = Watch::new(root, req.recursive, req.include_entry)?;
    let events: Arc<Mutex<Vec<FilesystemEvent>>> = Arc::default();
    let sink = events.clone();
    let task = tokio::spawn(async move {
        while let Ok(evs) = w.next().await {
            let mut v = lock(&sink);
            for e in evs {
                if v.len() < MAX_PENDING {
                    v.push(e);
                }
            }
        }
    });
    let id = format!(
        "w{}",
        state.watchers.next.fetch_add(1, Ordering::Relaxed) + 1
    );
    lock(&state.watchers.map).insert(id.clone(), PollWatcher { events, task });
    Ok(WatcherId { watcher_id: id })
}

/// `GetWatcherEvents`: the events since the last call.
pub fn get_watcher_events(state: &Arc<State>, req: WatcherId) -> Result<WatcherEvents, RpcError> {
    let map = lock(&state.watchers.map);
    let w = map.get(&req.watcher_id).ok_or_else(|| {
        RpcError::new(
            Code::NotFound,
            format!("watcher '{}' not found", req.watcher_id),
        )
    })?;
    let events = std::mem::take(&mut *lock(&w.events));
    Ok(WatcherEvents { events })
}

/// `RemoveWatcher`.
pub fn remove_watcher(state: &Arc<State>, req: WatcherId) -> Result<Empty, RpcError> {
    let w = lock(&state.watchers.map)
        .remove(&req.watcher_id)
        .ok_or_else(|| {
            RpcError::new(
                Code::NotFound,
                format!("watcher '{}' not found", req.watcher_id),
            )
        })?;
    w.task.abort();
    Ok(Empty {})
}
