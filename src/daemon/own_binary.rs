//! The daemon's own binary, watched for its removal or replacement on disk.
//!
//! Removed or replaced (an uninstall, an upgrade), the daemon stops once no call is pending,
//! so the next client starts the current binary.
//!
//! `pi remove npm:pi-ide-broker` deletes the platform package while the daemon runs from it,
//! and an upgrade writes a new file over the path: either way the running daemon is a binary
//! no install names any more. It is told by the path's (device, inode), looked at every
//! [`EVERY`]: a stat, no file descriptor held.

use crate::registry::Registry;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the binary's path is looked at.
pub const EVERY: Duration = Duration::from_secs(2);

/// The exit status of a daemon that stopped because its binary went (EX_TEMPFAIL): not a
/// success, so a service manager that restarts on failure (the systemd unit's
/// `Restart=on-failure`) starts the binary installed now.
pub const EXIT_REPLACED: u8 = 75;

/// Set once this process stops because its binary went.
static GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// True when this process stopped (or is stopping) because its binary went.
pub fn stopped_for_it() -> bool {
    GONE.load(std::sync::atomic::Ordering::Acquire)
}

/// The binary this process runs, as it was on disk at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnBinary {
    /// Its path.
    pub path: PathBuf,
    /// (device, inode) at start.
    id: (u64, u64),
}

impl OwnBinary {
    /// This process's binary, if its path can be known and read; `None` on Windows, which
    /// removes or replaces no running `.exe` (an uninstall or upgrade must stop it first).
    pub fn current() -> Option<OwnBinary> {
        if cfg!(windows) {
            return None;
        }
        let path = std::env::current_exe().ok()?;
        let id = identity(&path)?;
        Some(OwnBinary { path, id })
    }

    /// Why the path no longer holds the running binary, if it does not.
    pub fn gone(&self) -> Option<String> {
        match identity(&self.path) {
            None => Some(format!("its binary {} was removed", self.path.display())),
            Some(id) if id != self.id => Some(format!(
                "its binary {} was replaced (an upgrade?)",
                self.path.display()
            )),
            Some(_) => None,
        }
    }
}

fn identity(path: &std::path::Path) -> Option<(u64, u64)> {
    let m = std::fs::metadata(path).ok()?;
    crate::platform::user::file_identity(&m)
}

/// Stops the daemon (`shutdown`) once its binary is gone from disk and no call is pending.
/// Ends with the broker (`reg.cancel`).
pub async fn watch(reg: Arc<Registry>, own: OwnBinary, shutdown: CancellationToken) {
    let why = loop {
        tokio::select! {
            _ = reg.cancel.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
        if let Some(why) = own.gone() {
            break why;
        }
    };
    tracing::warn!(
        "{why}: stopping once no call is pending; the next session starts the binary installed now"
    );
    loop {
        let pending = reg.calls_pending();
        if pending == 0 {
            break;
        }
        tracing::debug!(pending, "waiting for pending calls before stopping");
        tokio::select! {
            _ = reg.cancel.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
    tracing::info!("{why}: stopping");
    GONE.store(true, std::sync::atomic::Ordering::Release);
    shutdown.cancel();
}

#[cfg(all(test, unix))] // Windows replaces no running binary
mod tests {
    use super::*;

    #[test]
    fn a_removed_or_replaced_binary_is_gone_and_one_in_place_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bin");
        std::fs::write(&path, b"one").expect("write");
        let own = OwnBinary {
            id: identity(&path).expect("id"),
            path: path.clone(),
        };
        assert_eq!(own.gone(), None);
        // Written over in place (same inode): still the file we run.
        std::fs::write(&path, b"two").expect("rewrite");
        assert_eq!(own.gone(), None);
        // An upgrade renames a new file over the path.
        let next = dir.path().join("bin.new");
        std::fs::write(&next, b"three").expect("write new");
        std::fs::rename(&next, &path).expect("rename");
        assert!(own.gone().is_some_and(|w| w.contains("replaced")));
        std::fs::remove_file(&path).expect("remove");
        assert!(own.gone().is_some_and(|w| w.contains("removed")));
        assert!(OwnBinary::current().is_some());
    }
}
