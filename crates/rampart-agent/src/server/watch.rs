//! Directory watches over inotify: `WatchDir` (streaming) and the polling watchers.

use super::creds::{self, Creds};
use super::fs::{entry_info, io_err, user_path};
use super::users::{Names, User};
use super::{spawn_stream, Body, Ctx, State};
use crate::connect::{self, Code, RpcError};
use crate::proto::{
    Empty, EventType, FilesystemEvent, WatchDirResponse, WatchRequest, WatcherEvents, WatcherId,
};
use hyper::Response;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use std::collections::{HashMap, HashSet};
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

/// Most paths remembered as reported by a scan (see [`Tree::scanned`]).
const MAX_SCANNED: usize = 65_536;

/// What a watch knows about the tree it watches.
#[derive(Debug)]
struct Tree {
    root: PathBuf,
    wds: HashMap<WatchDescriptor, PathBuf>,
    recursive: bool,
    include_entry: bool,
    /// Paths reported as created by the scan of a new directory: a file created between the
    /// directory's watch and its scan is seen by both, so its inotify create event is dropped.
    scanned: HashSet<PathBuf>,
    /// Non-empty files found by such a scan, with their size then: they were written before
    /// their directory's watch was in place, so the scan reports their write too, and the
    /// inotify modify event of that same write (same size), if the watch did see it, is
    /// dropped.
    scanned_written: HashMap<PathBuf, u64>,
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

impl Tree {
    fn event(&self, rel: &Path, kind: EventType, names: Option<&Names>) -> FilesystemEvent {
        FilesystemEvent {
            name: rel.to_string_lossy().into_owned(),
            event_type: kind,
            entry: names.and_then(|n| entry_info(&self.root.join(rel), n).ok()),
        }
    }

    /// Watch `abs` (known as `rel` under the root) and, if recursive, its subdirectories.
    /// With `out`, every entry already inside is reported as created (a directory that just
    /// appeared may have been filled before its watch was in place).
    fn add(
        &mut self,
        ino: &Inotify,
        abs: &Path,
        rel: &Path,
        mut out: Option<&mut Vec<FilesystemEvent>>,
        names: Option<&Names>,
    ) -> nix::Result<()> {
        let wd = ino.add_watch(abs, mask())?;
        self.wds.insert(wd, rel.to_path_buf());
        if !self.recursive {
            return Ok(());
        }
        let Ok(rd) = std::fs::read_dir(abs) else {
            return Ok(());
        };
        let mut children: Vec<(std::ffi::OsString, bool)> = rd
            .flatten()
            .map(|e| (e.file_name(), e.file_type().is_ok_and(|t| t.is_dir())))
            .collect();
        children.sort();
        for (name, is_dir) in children {
            let crel = rel.join(&name);
            if let Some(o) = out.as_deref_mut() {
                o.push(self.event(&crel, EventType::Create, names));
                if self.scanned.len() >= MAX_SCANNED {
                    self.scanned.clear();
                }
                self.scanned.insert(crel.clone());
                let written = std::fs::symlink_metadata(abs.join(&name))
                    .ok()
                    .filter(|m| m.is_file() && m.len() > 0);
                if let Some(m) = written {
                    o.push(self.event(&crel, EventType::Write, names));
                    if self.scanned_written.len() >= MAX_SCANNED {
                        self.scanned_written.clear();
                    }
                    self.scanned_written.insert(crel.clone(), m.len());
                }
            }
            if is_dir {
                // A subdirectory that vanished or is unreadable is skipped.
                let _ = self.add(ino, &abs.join(&name), &crel, out.as_deref_mut(), names);
            }
        }
        Ok(())
    }

    /// Turn a batch of inotify events into watch events.
    fn process(
        &mut self,
        ino: &Inotify,
        events: Vec<InotifyEvent>,
        names: Option<&Names>,
    ) -> Vec<FilesystemEvent> {
        let mut out = Vec::new();
        for ev in events {
            if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                self.wds.remove(&ev.wd);
                continue;
            }
            let (Some(name), Some(dir)) = (ev.name.as_ref(), self.wds.get(&ev.wd).cloned()) else {
                continue;
            };
            let rel = dir.join(name);
            let m = ev.mask;
            // Any event after the scan that reported `rel` means no duplicate can follow.
            let was_scanned = !self.scanned.is_empty() && self.scanned.remove(&rel);
            if m.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
                if was_scanned {
                    continue; // already reported (and watched) by the scan
                }
                out.push(self.event(&rel, EventType::Create, names));
                if self.recursive && m.contains(AddWatchFlags::IN_ISDIR) {
                    let abs = self.root.join(&rel);
                    let _ = self.add(ino, &abs, &rel, Some(&mut out), names);
                }
                continue;
            }
            if let Some(size) = self.scanned_written.remove(&rel) {
                // The write the scan reported, seen by the watch too.
                let now = std::fs::symlink_metadata(self.root.join(&rel)).map(|m| m.len());
                if m.contains(AddWatchFlags::IN_MODIFY) && now.is_ok_and(|n| n == size) {
                    continue;
                }
            }
            let kind = if m.contains(AddWatchFlags::IN_MODIFY) {
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
            out.push(self.event(&rel, kind, names));
        }
        out
    }
}

/// A live inotify watch of a directory (and its subdirectories when recursive).
struct Watch {
    fd: AsyncFd<InoFd>,
    tree: Tree,
    /// The user whose permissions new subdirectories are watched and described with.
    creds: Option<Creds>,
}

fn watch_err(e: nix::errno::Errno, root: &Path) -> RpcError {
    if e == nix::errno::Errno::ENOSPC {
        return RpcError::new(
            Code::ResourceExhausted,
            format!(
                "watching {}: the limit of inotify watches is reached",
                root.display()
            ),
        );
    }
    let e = std::io::Error::from(e);
    let r = io_err(&e, "watch", root);
    if r.code == Code::Internal {
        return RpcError::new(Code::Internal, format!("watching {}: {e}", root.display()));
    }
    r
}

impl Watch {
    async fn new(
        root: PathBuf,
        recursive: bool,
        include_entry: bool,
        user: &User,
    ) -> Result<Watch, RpcError> {
        let creds = Creds::of(user);
        let (ino, tree) = creds::run(creds.clone(), move || {
            let m = std::fs::metadata(&root).map_err(|e| io_err(&e, "watch", &root))?;
            if !m.is_dir() {
                return Err(RpcError::new(
                    Code::InvalidArgument,
                    format!("path {} is not a directory", root.display()),
                ));
            }
            let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
                .map_err(|e| RpcError::new(Code::Internal, format!("inotify: {e}")))?;
            let mut tree = Tree {
                root: root.clone(),
                wds: HashMap::new(),
                recursive,
                include_entry,
                scanned: HashSet::new(),
                scanned_written: HashMap::new(),
            };
            tree.add(&ino, &root, Path::new(""), None, None)
                .map_err(|e| watch_err(e, &root))?;
            Ok((ino, tree))
        })
        .await??;
        // SAFETY: the AsyncFd owns the Inotify, whose fd stays open and the same until dropped.
        let fd = unsafe { AsyncFd::register(InoFd(ino)) }
            .map_err(|e| RpcError::new(Code::Internal, format!("inotify: {}", e)))?;
        Ok(Watch { fd, tree, creds })
    }

    /// Wait for the next batch of events. Cancel-safe: nothing is awaited once events are read.
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
            let names = self.tree.include_entry.then(Names::load);
            // Describing entries and watching new directories act as the user.
            let touches_fs = self.tree.include_entry
                || (self.tree.recursive
                    && events.iter().any(|e| {
                        e.mask.contains(AddWatchFlags::IN_ISDIR)
                            && e.mask
                                .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                    }));
            let creds = if touches_fs {
                self.creds.as_ref()
            } else {
                None
            };
            let ino = &self.fd.get_ref().0;
            let tree = &mut self.tree;
            let out = creds::run_blocking(creds, || tree.process(ino, events, names.as_ref()))
                .map_err(|e| std::io::Error::other(e.message))?;
            if !out.is_empty() {
                return Ok(out);
            }
        }
    }
}

/// `WatchDir` (server streaming).
pub async fn watch_dir(
    state: &Arc<State>,
    ctx: &Ctx,
    req: WatchRequest,
) -> Result<Response<Body>, RpcError> {
    let (user, root) = user_path(state, ctx, &req.path)?;
    let mut w = Watch::new(root, req.recursive, req.include_entry, &user).await?;
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
pub async fn create_watcher(
    state: &Arc<State>,
    ctx: &Ctx,
    req: WatchRequest,
) -> Result<WatcherId, RpcError> {
    let (user, root) = user_path(state, ctx, &req.path)?;
    let mut w = Watch::new(root, req.recursive, req.include_entry, &user).await?;
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
