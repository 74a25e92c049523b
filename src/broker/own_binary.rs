//! The daemon's own binary, watched: replaced, it hands over to the new one; removed, it stops.
//!
//! Replaced on disk (an upgrade), the daemon hands its socket over to the binary installed
//! now; removed (an uninstall), it stops.
//!
//! `pi install npm:pi-ide-broker` of a newer version writes a new file over the path the
//! daemon runs from; `pi remove` deletes it. Either way the running daemon is a binary no
//! install names any more. It is told by the path's (device, inode), looked at when `notify`
//! reports a change to the file (its link count drops when it is unlinked or a new file is
//! renamed over it) or to its dir (a new file arriving): nothing runs while nothing changes.
//!
//! Replaced, once no call is pending: under a service manager that restarts the daemon
//! (systemd), it exits with [`EXIT_REPLACED`] and the manager starts the new binary; otherwise
//! it starts the new binary with its own arguments, hands it the listening socket
//! (`platform::handover`), and steps down once the successor says it runs. Removed, and no new
//! file there within [`REMOVED_GRACE`]: it stops, and the next client starts whatever binary
//! is installed then.

use crate::broker::Handle;
use crate::sys::fswatch::FsEvents;
use notify::Watcher as _;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a removed binary's path is given to hold a new file (an install that deletes
/// first, then writes) before the daemon stops for good.
pub(crate) const REMOVED_GRACE: Duration = Duration::from_secs(3);
/// While calls are pending after a change, how often they are counted again.
const PENDING_RECHECK: Duration = Duration::from_millis(500);
/// A change is acted on once the path has been quiet this long (an installer still writing
/// or `chmod`ing the new file is let finish), or after [`SETTLE_AT_MOST`] of changes.
const QUIET: Duration = Duration::from_millis(300);
/// The longest a change waits for the path to be quiet.
const SETTLE_AT_MOST: Duration = Duration::from_secs(5);

/// The exit status of a daemon that stopped because its binary went (EX_TEMPFAIL): not a
/// success, so a service manager that restarts on failure (the systemd unit's
/// `Restart=on-failure`) starts the binary installed now.
pub(crate) const EXIT_REPLACED: u8 = 75;

/// Set once this process stops because its binary went.
static GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// True when this process stopped (or is stopping) because its binary went.
pub(crate) fn stopped_for_it() -> bool {
    GONE.load(std::sync::atomic::Ordering::Acquire)
}

/// What happened to the binary's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing is there.
    Removed,
    /// Another file is there.
    Replaced,
}

/// The binary this process runs, as it was on disk at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnBinary {
    /// Its path.
    pub path: PathBuf,
    /// (device, inode) of the file the daemon runs.
    id: (u64, u64),
    /// What the path held when a successor could not take over from it: only a further
    /// change (a new file, or this one written again or made executable) is tried.
    failed: Option<Stamp>,
}

/// What a file at a path is, as far as trying it again goes: its identity, size, modification
/// time and exec bit.
type Stamp = ((u64, u64), u64, Option<std::time::SystemTime>, bool);

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((
        crate::platform::user::file_identity(&m)?,
        m.len(),
        m.modified().ok(),
        crate::platform::user::is_executable(&m),
    ))
}

impl OwnBinary {
    /// This process's binary, if its path can be known and read; `None` on Windows, which
    /// removes or replaces no running `.exe` (an uninstall or upgrade must stop it first).
    pub(crate) fn current() -> Option<OwnBinary> {
        if cfg!(windows) {
            return None;
        }
        let path = crate::platform::process::own_exe()?;
        let id = identity(&path)?;
        Some(OwnBinary {
            path,
            id,
            failed: None,
        })
    }

    /// What happened to the path since, if it no longer holds the running binary.
    pub(crate) fn gone(&self) -> Option<Change> {
        match identity(&self.path) {
            None => Some(Change::Removed),
            Some(id) if id == self.id => None,
            Some(_) if self.failed.is_some() && self.failed == stamp(&self.path) => None,
            Some(_) => Some(Change::Replaced),
        }
    }

    /// Why the daemon steps down, for the log.
    fn why(&self, change: Change) -> String {
        match change {
            Change::Removed => format!("its binary {} was removed", self.path.display()),
            Change::Replaced => format!(
                "its binary {} was replaced (an upgrade?)",
                self.path.display()
            ),
        }
    }
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    let m = std::fs::metadata(path).ok()?;
    crate::platform::user::file_identity(&m)
}

/// Watches the binary until it changes, then hands over or stops the daemon (`shutdown`) once
/// no call is pending. Ends with the broker (`reg.cancel`).
pub(crate) async fn watch(handle: Handle, mut own: OwnBinary, shutdown: CancellationToken) {
    let reg = handle.registry().clone();
    let (mut watcher, mut events) = match crate::sys::fswatch::watcher() {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the daemon's own binary: after an upgrade, stop it (`pi-ide-broker stop`) so the new one starts");
            return;
        }
    };
    loop {
        watch_paths(&mut watcher, &own.path);
        let change = tokio::select! {
            _ = reg.cancel.cancelled() => return,
            change = changed(&own, &mut events) => change,
        };
        let Some(change) = change else { return };
        let change = match change {
            Change::Removed => {
                watch_paths(&mut watcher, &own.path);
                tokio::select! {
                    _ = reg.cancel.cancelled() => return,
                    c = settled(&own, &mut events) => c,
                }
            }
            Change::Replaced => {
                tokio::select! {
                    _ = reg.cancel.cancelled() => return,
                    _ = quiet(&mut events) => {}
                }
                match own.gone() {
                    Some(c) => c,
                    None => continue,
                }
            }
        };
        let why = own.why(change);
        let next = match change {
            Change::Removed => "stopping",
            Change::Replaced => "handing over to it",
        };
        tracing::warn!("{why}: {next} once no call is pending");
        tokio::select! {
            _ = reg.cancel.cancelled() => return,
            _ = no_call_pending(&reg) => {}
        }
        if step_down(&handle, &own, change, &why).await {
            shutdown.cancel();
            return;
        }
        // The new file could not take over: only a further change is tried again.
        own.failed = stamp(&own.path);
    }
}

/// The file and its dir, watched (again: a dir made anew needs a new watch). Failures are
/// left to the next change: the dir may not be there yet.
fn watch_paths(watcher: &mut notify::RecommendedWatcher, path: &Path) {
    for p in [Some(path), path.parent()].into_iter().flatten() {
        let _ = watcher.watch(p, notify::RecursiveMode::NonRecursive);
    }
}

/// The next change of the binary's path that leaves it not the running binary; `None` when
/// the watcher ends.
async fn changed(own: &OwnBinary, events: &mut FsEvents) -> Option<Change> {
    loop {
        let _ = events.recv().await?;
        while events.try_recv().is_ok() {}
        if let Some(change) = own.gone() {
            return Some(change);
        }
    }
}

/// Resolves once no event has come for [`QUIET`], or after [`SETTLE_AT_MOST`].
async fn quiet(events: &mut FsEvents) {
    let until = tokio::time::Instant::now() + SETTLE_AT_MOST;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return,
            _ = tokio::time::sleep(QUIET) => return,
            ev = events.recv() => if ev.is_none() { return },
        }
    }
}

/// A removed binary's path given [`REMOVED_GRACE`] to hold a new file: `Replaced` as soon as
/// one is there, `Removed` if none came.
async fn settled(own: &OwnBinary, events: &mut FsEvents) -> Change {
    let until = tokio::time::Instant::now() + REMOVED_GRACE;
    loop {
        if own.gone() == Some(Change::Replaced) {
            quiet(events).await;
            return own.gone().unwrap_or(Change::Replaced);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return own.gone().unwrap_or(Change::Replaced),
            ev = events.recv() => if ev.is_none() { return Change::Removed },
        }
    }
}

/// Resolves once the daemon owes no answer (a diff under review is left to its reviewer).
async fn no_call_pending(reg: &crate::registry::Registry) {
    loop {
        let pending = reg.calls_pending();
        if pending == 0 {
            return;
        }
        tracing::debug!(pending, "waiting for pending calls before stepping down");
        tokio::time::sleep(PENDING_RECHECK).await;
    }
}

/// Hands over to the binary at the path, or stops for the service manager or the next client
/// to start it; false when the successor could not take over (this daemon serves on).
async fn step_down(handle: &Handle, own: &OwnBinary, change: Change, why: &str) -> bool {
    if change == Change::Removed || crate::platform::notify::restarts_us() {
        let next = if change == Change::Removed {
            "the next session starts the binary installed then"
        } else {
            "the service manager starts the new binary"
        };
        tracing::info!("{why}: stopping; {next}");
        GONE.store(true, std::sync::atomic::Ordering::Release);
        return true;
    }
    match handle.hand_over(&own.path).await {
        Ok(pid) => {
            tracing::info!(
                successor = pid,
                "{why}: the new binary runs and takes the socket over; stepping down"
            );
            true
        }
        Err(e) => {
            tracing::error!("{why}, but the new binary cannot take over: {e}; serving on with this one (once the install is fixed, `pi-ide-broker stop` and the next session starts it)");
            false
        }
    }
}

#[cfg(all(test, unix))] // Windows replaces no running binary
mod tests {
    use super::*;

    #[test]
    fn a_removed_or_replaced_binary_is_gone_and_one_in_place_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bin");
        std::fs::write(&path, b"one").expect("write");
        let mut own = OwnBinary {
            id: identity(&path).expect("id"),
            path: path.clone(),
            failed: None,
        };
        assert_eq!(own.gone(), None);
        // Written over in place (same inode): still the file we run.
        std::fs::write(&path, b"two").expect("rewrite");
        assert_eq!(own.gone(), None);
        // An upgrade renames a new file over the path.
        let next = dir.path().join("bin.new");
        std::fs::write(&next, b"three").expect("write new");
        std::fs::rename(&next, &path).expect("rename");
        assert_eq!(own.gone(), Some(Change::Replaced));
        // A new file that could not take over is not tried again as it is...
        own.failed = stamp(&path);
        assert_eq!(own.gone(), None);
        // ...but once it changes (written again, made executable), it is.
        std::fs::write(&path, b"three, whole").expect("rewrite the new one");
        assert_eq!(own.gone(), Some(Change::Replaced));
        std::fs::remove_file(&path).expect("remove");
        assert_eq!(own.gone(), Some(Change::Removed));
        assert!(OwnBinary::current().is_some());
    }
}
