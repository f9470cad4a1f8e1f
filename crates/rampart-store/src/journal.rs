//! The audit journal: events that change no sandbox state (`exec`, `exit`, `file`,
//! `fs_diff`) are acknowledged once appended to `<data>/audit.journal` with one `write(2)`,
//! and moved into the store in batches, off the request's path.
//!
//! Why: an SQLite commit costs tens of microseconds of CPU on these machines (locks on the
//! WAL index, the frame writes, the B-tree), and an exec pays two (its `exec` before the
//! process starts, its `exit` before the result is sent): about 8% of an exec's round
//! trip. An append to a file costs one system call.
//!
//! What an acknowledged event survives is unchanged: like an SQLite commit in WAL mode with
//! `synchronous=NORMAL`, the append is in the kernel's page cache when it returns (no
//! `fsync`), so it survives the daemon's death (`kill -9`) and may not survive a power loss.
//! At start the daemon moves every complete record of the journal into the store (records
//! already stored are skipped) before anything reads a chain; a torn last record (a crash
//! inside `write`, which the caller was never told had succeeded) is dropped.
//!
//! Readers never see the difference: every read of events, and every event written with a
//! state change, first moves what is pending into the store (in chain order).
//!
//! Format: one JSON object per line, `{"sandbox","seq","time","hash","prev","json","blobs"}`
//! (`blobs`: `[[digest hex, standard base64], ...]`).

use crate::{NewEvent, SandboxStore, StoreError};
use base64::Engine as _;
use rampart_types::SandboxId;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use tracing::{debug, warn};

/// Pending events moved to the store after this long, at most.
const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// Or as soon as this many are pending.
const FLUSH_AT: usize = 256;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every step under these locks leaves the state consistent: a poisoned lock (a panic
    // elsewhere) is taken over rather than spreading the panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Serialize, Deserialize)]
struct Record {
    sandbox: SandboxId,
    seq: u64,
    time: String,
    hash: String,
    prev: String,
    json: String,
    blobs: Vec<(String, String)>,
}

impl Record {
    fn of(e: &NewEvent) -> Record {
        Record {
            sandbox: e.sandbox.clone(),
            seq: e.seq,
            time: e.time.clone(),
            hash: e.hash.clone(),
            prev: e.prev.clone(),
            json: e.json.clone(),
            blobs: e
                .blobs
                .iter()
                .map(|(d, b)| {
                    (
                        d.clone(),
                        base64::engine::general_purpose::STANDARD.encode(b),
                    )
                })
                .collect(),
        }
    }

    fn into_event(self) -> Option<NewEvent> {
        let mut blobs = Vec::with_capacity(self.blobs.len());
        for (d, b) in self.blobs {
            blobs.push((d, base64::engine::general_purpose::STANDARD.decode(b).ok()?));
        }
        Some(NewEvent {
            sandbox: self.sandbox,
            seq: self.seq,
            time: self.time,
            hash: self.hash,
            prev: self.prev,
            json: self.json,
            blobs,
        })
    }
}

#[derive(Debug)]
struct State {
    file: File,
    pending: Vec<NewEvent>,
    stop: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    store: Arc<dyn SandboxStore>,
    /// The journal's path; `<path>.1` holds the batch being moved into the store.
    path: PathBuf,
    /// One flush at a time (a reader's flush waits for the batch in flight).
    flushing: Mutex<()>,
}

/// Opens `path` for appending, creating it with mode 0600 (the journal holds what ran in
/// sandboxes, with the digests and blobs of their input and output: private to the daemon
/// from its first byte, whatever the umask); `truncate` empties it.
fn open_private(path: &Path, truncate: bool) -> std::io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.create(true).mode(0o600);
    if truncate {
        o.write(true).truncate(true);
    } else {
        o.append(true);
    }
    o.open(path)
}

/// `<path>.1`.
fn moving_path(path: &Path) -> PathBuf {
    suffixed(path, ".1")
}

/// `<path><suffix>`.
fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// The journal. Dropping it stops its thread after a last flush.
#[derive(Debug)]
pub struct Journal {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Errors of the journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The file failed.
    #[error("audit journal {path}: {err}")]
    Io {
        /// The journal's path.
        path: PathBuf,
        /// What failed.
        #[source]
        err: std::io::Error,
    },
    /// The store refused the events.
    #[error("moving journal events into the store: {0}")]
    Store(#[from] StoreError),
}

/// Events of the journal file at `path` (complete records only).
fn read_records(path: &Path) -> Vec<NewEvent> {
    let Ok(text) = std::fs::read(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Record>(line)
            .ok()
            .and_then(Record::into_event)
        {
            Some(e) => out.push(e),
            // A torn record ends the journal (it can only be the last one).
            None => break,
        }
    }
    out
}

impl Journal {
    /// Opens `path`, moves what it holds into `store`, empties it, and starts the thread
    /// that moves new events.
    pub fn open(path: &Path, store: Arc<dyn SandboxStore>) -> Result<Journal, JournalError> {
        let io = |err| JournalError::Io {
            path: path.to_path_buf(),
            err,
        };
        let moving = moving_path(path);
        let mut old = read_records(&moving);
        old.extend(read_records(path));
        if !old.is_empty() {
            debug!(
                events = old.len(),
                "audit journal: replaying into the store"
            );
            store.append_events_once(&old)?;
        }
        let file = open_private(path, false).map_err(io)?;
        file.set_len(0).map_err(io)?;
        // A journal left readable by an older daemon: its records name what ran and what
        // went in and out.
        let md = file.metadata().map_err(io)?;
        if md.permissions().mode() & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(io)?;
        }
        for p in [moving, suffixed(path, ".joined")] {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(e)),
            }
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                file,
                pending: Vec::new(),
                stop: false,
            }),
            wake: Condvar::new(),
            store,
            path: path.to_path_buf(),
            flushing: Mutex::new(()),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rampart-audit-journal".into())
            .spawn(move || run(&sh))
            .map_err(io)?;
        Ok(Journal {
            shared,
            thread: Some(thread),
        })
    }

    /// Appends `e` (acknowledged when this returns Ok).
    pub fn append(&self, e: &NewEvent) -> Result<(), JournalError> {
        let mut line = serde_json::to_vec(&Record::of(e)).map_err(|err| JournalError::Io {
            path: PathBuf::from("audit.journal"),
            err: std::io::Error::other(err),
        })?;
        line.push(b'\n');
        let mut st = lock(&self.shared.state);
        // One write of the whole record (O_APPEND): a record is never interleaved.
        write_record(&mut st.file, &line).map_err(|err| JournalError::Io {
            path: PathBuf::from("audit.journal"),
            err,
        })?;
        st.pending.push(e.clone());
        if st.pending.len() >= FLUSH_AT {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Moves every pending event into the store now.
    pub fn flush(&self) -> Result<(), JournalError> {
        flush(&self.shared)
    }
}

/// Appends `line` to `file`; on failure (a full disk) takes back what it wrote, so that no
/// torn record is left in the middle of the journal: the next record would be glued to it
/// and both lost at a replay (which stops at the first bad record).
fn write_record(file: &mut File, line: &[u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < line.len() {
        let err = match file.write(&line[done..]) {
            Ok(0) => std::io::Error::from(std::io::ErrorKind::WriteZero),
            Ok(n) => {
                done += n;
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => e,
        };
        if done > 0 {
            let len = file.metadata()?.len();
            file.set_len(len.saturating_sub(done as u64))?;
        }
        return Err(err);
    }
    Ok(())
}

/// Moves the pending events into the store. Appends go on meanwhile: the batch's file is
/// renamed to `<path>.1` and a fresh file takes new records (a short hold of the state);
/// the batch's file is removed once the store has the batch.
fn flush(sh: &Shared) -> Result<(), JournalError> {
    let io = |err| JournalError::Io {
        path: sh.path.clone(),
        err,
    };
    let _one = lock(&sh.flushing);
    let moving = moving_path(&sh.path);
    let batch = {
        let mut st = lock(&sh.state);
        if st.pending.is_empty() {
            return Ok(());
        }
        std::fs::rename(&sh.path, &moving).map_err(io)?;
        st.file = open_private(&sh.path, false).map_err(io)?;
        std::mem::take(&mut st.pending)
    };
    if let Err(e) = sh.store.append_events_once(&batch) {
        // Keep the batch: back in the pending list and in the current file, in order.
        let mut st = lock(&sh.state);
        let newer = std::mem::replace(&mut st.pending, batch);
        st.pending.extend(newer);
        // Both files stay whole at every point a kill -9 may hit: the joined text goes to a
        // new file that replaces the journal at once, then the batch's file goes (a replay
        // in between reads the batch twice: stored events are skipped).
        let mut text = std::fs::read(&moving).map_err(io)?;
        text.extend(std::fs::read(&sh.path).map_err(io)?);
        let joined = suffixed(&sh.path, ".joined");
        open_private(&joined, true)
            .and_then(|mut f| f.write_all(&text))
            .map_err(io)?;
        std::fs::rename(&joined, &sh.path).map_err(io)?;
        std::fs::remove_file(&moving).map_err(io)?;
        st.file = std::fs::OpenOptions::new()
            .append(true)
            .open(&sh.path)
            .map_err(io)?;
        return Err(e.into());
    }
    std::fs::remove_file(&moving).map_err(io)?;
    Ok(())
}

fn run(sh: &Shared) {
    loop {
        if let Err(e) = flush(sh) {
            warn!("audit journal: {e}");
        }
        let st = lock(&sh.state);
        if st.stop {
            drop(st);
            if let Err(e) = flush(sh) {
                warn!("audit journal: {e}");
            }
            return;
        }
        if st.pending.len() < FLUSH_AT {
            drop(
                sh.wake
                    .wait_timeout(st, FLUSH_EVERY)
                    .unwrap_or_else(|p| p.into_inner()),
            );
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        lock(&self.shared.state).stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SqliteStore;
    use std::os::unix::ffi::OsStrExt;

    fn ev(id: &SandboxId, seq: u64) -> NewEvent {
        NewEvent {
            sandbox: id.clone(),
            seq,
            time: "2026-01-01T00:00:00.000Z".into(),
            hash: format!("h{seq}"),
            prev: format!("p{seq}"),
            json: format!("{{\"seq\":{seq}}}"),
            blobs: vec![(format!("d{seq}"), vec![seq as u8, 0, 1])],
        }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// A record cut short by a full disk is taken back: the next acknowledged record is
    /// whole and replays (glued to a torn one, both were lost at a replay).
    #[test]
    fn a_write_that_fails_midway_leaves_no_torn_record() {
        let d = tempfile::tempdir().unwrap();
        let fs = d.path().join("small");
        std::fs::create_dir(&fs).unwrap();
        let c = std::ffi::CString::new(fs.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C strings; a 64 KiB tmpfs of this test's own, unmounted below.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                c.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                c"size=64k".as_ptr().cast(),
            )
        };
        if rc != 0 {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        let r = std::panic::catch_unwind(|| {
            let store: Arc<dyn SandboxStore> =
                Arc::new(SqliteStore::open(&d.path().join("state.db")).unwrap());
            let id = SandboxId::parse("a1").unwrap();
            let path = fs.join("audit.journal");
            let j = Journal::open(&path, store).unwrap();
            // Fill the file system but for one page, and keep the thread from moving
            // the journal while we look at it.
            let filler = fs.join("filler");
            let _ = std::fs::write(&filler, vec![0u8; 64 * 1024 - 4096 - 1000]);
            let _hold = lock(&j.shared.flushing);
            let mut acked = Vec::new();
            let mut failed = false;
            for seq in 0..100 {
                let mut e = ev(&id, seq);
                e.json = "x".repeat(300);
                match j.append(&e) {
                    Ok(()) => acked.push(seq),
                    Err(_) => {
                        failed = true;
                        std::fs::remove_file(&filler).unwrap();
                        j.append(&e).unwrap();
                        acked.push(seq);
                        break;
                    }
                }
            }
            assert!(failed, "the file system never filled");
            let replayed: Vec<u64> = read_records(&path).iter().map(|e| e.seq).collect();
            assert_eq!(replayed, acked, "every acknowledged record replays");
        });
        // SAFETY: valid C string; our own mount.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
    }

    /// A batch the store refused is put back in front of the newer records, in one whole
    /// journal (no `.1` or `.joined` left), and replays in order.
    #[test]
    fn a_refused_batch_stays_whole_in_the_journal() {
        let d = tempfile::tempdir().unwrap();
        let store: Arc<dyn SandboxStore> =
            Arc::new(SqliteStore::open(&d.path().join("state.db")).unwrap());
        let id = SandboxId::parse("a1").unwrap();
        let path = d.path().join("audit.journal");
        let j = Journal::open(&path, store.clone()).unwrap();
        let hold = lock(&j.shared.flushing);
        j.append(&ev(&id, 0)).unwrap();
        // A seq no chain can hold: the store refuses the batch.
        j.append(&ev(&id, 1 << 33)).unwrap();
        drop(hold);
        assert!(j.flush().is_err());
        let _hold = lock(&j.shared.flushing);
        let seqs: Vec<u64> = read_records(&path).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![0, 1 << 33]);
        assert_eq!(mode(&path), 0o600, "the joined journal");
        assert!(!moving_path(&path).exists());
        assert!(!suffixed(&path, ".joined").exists());
    }

    #[test]
    fn events_reach_the_store_and_a_journal_left_behind_is_replayed() {
        let d = tempfile::tempdir().unwrap();
        let store: Arc<dyn SandboxStore> =
            Arc::new(SqliteStore::open(&d.path().join("state.db")).unwrap());
        let id = SandboxId::parse("a1").unwrap();
        let path = d.path().join("audit.journal");
        let j = Journal::open(&path, store.clone()).unwrap();
        // Private from its first byte, whatever the umask (022 in tests as a rule).
        assert_eq!(mode(&path), 0o600);
        j.append(&ev(&id, 0)).unwrap();
        j.append(&ev(&id, 1)).unwrap();
        j.flush().unwrap();
        assert_eq!(mode(&path), 0o600, "the fresh journal after a flush");
        assert_eq!(store.last_event(&id).unwrap(), Some((1, "h1".into())));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        drop(j);

        // A daemon killed with events still in its journal, some in a batch being moved.
        let line = |seq| {
            let mut l = serde_json::to_vec(&Record::of(&ev(&id, seq))).unwrap();
            l.push(b'\n');
            l
        };
        let mut moving = line(1);
        moving.extend(line(2));
        std::fs::write(moving_path(&path), &moving).unwrap();
        let mut text = line(3);
        text.extend_from_slice(b"{\"sandbox\":\"a1\",\"seq\":4,\"ti");
        std::fs::write(&path, &text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let j = Journal::open(&path, store.clone()).unwrap();
        // A journal left readable by others is made private.
        assert_eq!(mode(&path), 0o600);
        // 1 was stored already (skipped), 2 and 3 are replayed, the torn 4 is dropped.
        assert_eq!(store.last_event(&id).unwrap(), Some((3, "h3".into())));
        assert_eq!(store.events(&id, None, 10).unwrap().len(), 4);
        assert_eq!(store.blob("d3").unwrap(), Some(vec![3, 0, 1]));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        assert!(!moving_path(&path).exists());
        // The thread moves events on its own.
        j.append(&ev(&id, 4)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.last_event(&id).unwrap() != Some((4, "h4".into())) {
            assert!(std::time::Instant::now() < deadline, "not flushed");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
