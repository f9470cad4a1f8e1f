//! Keeping a commit cheap.
//!
//! Durability as configured (`journal_mode=WAL`, `synchronous=NORMAL`): a commit returns once
//! its pages are written (`pwrite`) to the write-ahead log, without an `fsync`. The operating
//! system holds those pages, so a committed transaction survives the daemon being killed
//! (`kill -9`, a panic, an OOM kill): SQLite replays the log at the next open. It may not
//! survive a power loss or a kernel crash, which can take the last commits since the log was
//! last synced (at each checkpoint) but never corrupts the database.
//!
//! What made a commit expensive was not the commit but the checkpoint SQLite runs inside the
//! commit that pushes the log past `wal_autocheckpoint` pages: it syncs the log, copies every
//! page it holds into the database file and syncs that, tens of milliseconds on this kind of
//! disk, paid by whichever caller committed then. [`Checkpointer`] moves that work to a thread
//! of its own, with its own connection: the writing connection has automatic checkpoints off
//! (`wal_autocheckpoint=0`), and the thread checkpoints every [`CHECKPOINT_EVERY`] commits, or
//! after [`IDLE_CHECKPOINT`] without one: `PASSIVE` checkpoints (which never block writers) do
//! the copying, a last short one holds this process's writer off so that the log can restart
//! (see [`checkpoint`]). What stays on a commit's path, once per checkpoint cycle: waiting for
//! that last pass (a few pages and two syncs) if it commits then, and the first commit after
//! it restarting the log from its beginning and syncing its header (SQLite's rule for
//! `NORMAL`). The checkpoint does not change what a commit guarantees.
//!
//! [`write_txn`] runs a write transaction with cached `BEGIN IMMEDIATE` / `COMMIT` statements
//! (rusqlite's `Transaction` parses them anew each time).

use crate::StoreError;
use rusqlite::Connection;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Commits between two background checkpoints (about 2 to 3 log pages each). A larger cycle
/// spreads the log restart's header sync over more commits, but lets the log's pages go cold
/// between two rewrites: a host that reclaims cold page cache (DAMON `pageout`, as on these
/// VMs) then makes each rewrite allocate and fault in fresh pages, which costs more than the
/// sync saves. 250 commits keep the log near 3 MB.
pub(crate) const CHECKPOINT_EVERY: u64 = 250;
/// A checkpoint also runs after this long without reaching [`CHECKPOINT_EVERY`], if anything
/// was committed (keeps the log short while the daemon is quiet).
pub(crate) const IDLE_CHECKPOINT: Duration = Duration::from_secs(2);
/// Passive checkpoints tried before the last one runs with this process's writer held off.
const FREE_PASSES: usize = 2;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` in a write transaction (`BEGIN IMMEDIATE`) on `conn`, committing if it succeeds
/// and rolling back if it (or the commit) fails.
pub(crate) fn write_txn<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    let out = f(conn).and_then(|v| {
        conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(v)
    });
    if out.is_err() && !conn.is_autocommit() {
        // The error being returned is the one that matters; a failed rollback leaves the
        // transaction to be rolled back by the next BEGIN's failure or at close.
        let _ = conn
            .prepare_cached("ROLLBACK")
            .and_then(|mut s| s.execute([]));
    }
    out
}

#[derive(Debug, Default)]
struct State {
    /// Commits since the last checkpoint.
    commits: u64,
    /// The store is going away.
    stop: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// The background checkpointer of a file database (see the module documentation).
#[derive(Debug)]
pub(crate) struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Turns automatic checkpoints off on `writer` and starts the thread, with a connection
    /// of its own to `path`. On failure automatic checkpoints stay on.
    pub(crate) fn start(
        path: &Path,
        writer: Arc<Mutex<Connection>>,
    ) -> Result<Checkpointer, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let shared = Arc::new(Shared::default());
        let (sh, w) = (shared.clone(), writer.clone());
        let thread = std::thread::Builder::new()
            .name("rampart-store-checkpoint".into())
            .spawn(move || run(&sh, &conn, &w))
            .map_err(StoreError::Thread)?;
        let ck = Checkpointer {
            shared,
            thread: Some(thread),
        };
        // (On failure `ck` is dropped, which stops the thread.)
        lock(&writer).pragma_update(None, "wal_autocheckpoint", 0)?;
        Ok(ck)
    }

    /// Counts a commit; wakes the thread every [`CHECKPOINT_EVERY`] commits.
    pub(crate) fn committed(&self) {
        let mut st = lock(&self.shared.state);
        st.commits += 1;
        if st.commits == CHECKPOINT_EVERY {
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        lock(&self.shared.state).stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `(log pages, pages checkpointed)` after a passive checkpoint.
fn passive(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get(1)?, r.get(2)?))
    })
}

/// Checkpoints the whole log. The log restarts from its beginning (and keeps its size, its
/// pages cached) only if, when the next write transaction begins, every page of it has been
/// copied. A passive checkpoint copies the pages committed before it began, not those
/// committed while it ran (and reports the former as all there is), so under a steady stream
/// of commits the log would never restart and would grow for as long as commits keep coming,
/// each new page costing the kernel more than a rewritten one. So [`FREE_PASSES`] passes do
/// the bulk of the copying, and a last one holds this process's writer off while it copies
/// what was committed meanwhile (nothing, when the daemon is quiet; else a few pages and two
/// syncs).
fn checkpoint(conn: &Connection, writer: &Mutex<Connection>) -> rusqlite::Result<()> {
    for _ in 0..FREE_PASSES {
        passive(conn)?;
    }
    let _held = lock(writer);
    passive(conn)?;
    Ok(())
}

fn run(shared: &Shared, conn: &Connection, writer: &Mutex<Connection>) {
    loop {
        {
            let mut st = lock(&shared.state);
            loop {
                if st.stop {
                    return;
                }
                if st.commits >= CHECKPOINT_EVERY {
                    break;
                }
                let (g, timeout) = shared
                    .wake
                    .wait_timeout(st, IDLE_CHECKPOINT)
                    .unwrap_or_else(|p| p.into_inner());
                st = g;
                if timeout.timed_out() && st.commits > 0 && !st.stop {
                    break;
                }
            }
            st.commits = 0;
        }
        let res = checkpoint(conn, writer);
        if res.is_err() {
            // Cannot checkpoint from here (the database went away, or is broken): give the
            // job back to SQLite, which checkpoints inside commits, and stop.
            let _ = lock(writer).pragma_update(None, "wal_autocheckpoint", 1000);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(c: &Connection) -> (i64, i64) {
        c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(1)?, r.get(2)?))
        })
        .unwrap()
    }

    #[test]
    fn write_txn_commits_or_rolls_back() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE t (v INTEGER PRIMARY KEY)")
            .unwrap();
        write_txn(&c, |c| Ok(c.execute("INSERT INTO t VALUES (1)", [])?)).unwrap();
        let err = write_txn(&c, |c| {
            c.execute("INSERT INTO t VALUES (2)", [])?;
            c.execute("INSERT INTO t VALUES (1)", [])?;
            Ok(())
        });
        assert!(err.is_err());
        assert!(c.is_autocommit());
        let n: i64 = c
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
        // And the connection still takes transactions.
        write_txn(&c, |c| Ok(c.execute("INSERT INTO t VALUES (3)", [])?)).unwrap();
    }

    #[test]
    fn the_thread_checkpoints_and_the_log_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let c = Connection::open(&path).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.pragma_update(None, "synchronous", "NORMAL").unwrap();
        c.execute_batch("CREATE TABLE t (v BLOB)").unwrap();
        let writer = Arc::new(Mutex::new(c));
        let ck = Checkpointer::start(&path, writer.clone()).unwrap();
        for _ in 0..CHECKPOINT_EVERY {
            let w = lock(&writer);
            write_txn(&w, |c| {
                Ok(c.execute("INSERT INTO t VALUES (zeroblob(1000))", [])?)
            })
            .unwrap();
            drop(w);
            ck.committed();
        }
        // Nothing else checkpoints (the writer's automatic checkpoints are off): the
        // database file grows once the thread has copied the pages into it.
        let size = || std::fs::metadata(&path).unwrap().len();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while size() < 20 * 4096 {
            assert!(std::time::Instant::now() < deadline, "no checkpoint");
            std::thread::sleep(Duration::from_millis(10));
        }
        let probe = Connection::open(&path).unwrap();
        let count: i64 = probe
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(count, CHECKPOINT_EVERY as i64);
        // The next commit restarts the log at its beginning.
        let w = lock(&writer);
        write_txn(&w, |c| Ok(c.execute("INSERT INTO t VALUES (1)", [])?)).unwrap();
        drop(w);
        let (log, _) = frames(&probe);
        assert!(log < 10, "log did not restart: {log} pages");
        drop(ck);
    }
}
