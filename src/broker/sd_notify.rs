//! The broker under a service manager: sd-notify READY, STATUS, WATCHDOG, RELOADING, STOPPING.
//!
//! The daemon under a service manager, at run time: sd-notify (READY, STATUS, WATCHDOG,
//! RELOADING, STOPPING), told by the `daemon` command alone ([`crate::cli::daemon`]).

use crate::platform::notify::{self, Notice};
use crate::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

/// Tells the service manager the daemon is ready, and keeps it told (see [`run`]). Only the
/// `daemon` command does, never a broker a library user runs (such as a test's, which may
/// inherit a manager's `NOTIFY_SOCKET`).
pub(crate) fn announce_ready(reg: &Arc<Registry>) {
    let line = status_line(reg);
    notify::send(&[Notice::Ready, Notice::Status(&line)]);
    reg.tracker.spawn(run(reg.clone()));
}

/// Tells the service manager the daemon is stopping.
pub(crate) fn announce_stopping() {
    notify::send(&[Notice::Stopping, Notice::Status("stopping")]);
}

/// "4 editors ready, 9 sessions"
pub(crate) fn status_line(reg: &Registry) -> String {
    let editors = reg.editors();
    let ready = editors
        .iter()
        .filter(|e| e.state() == crate::editor::LinkState::Ready)
        .count();
    let total = editors.len();
    let sessions = reg.sessions().len();
    let mut s = format!("{ready} editor{} ready", if ready == 1 { "" } else { "s" });
    if total > ready {
        s.push_str(&format!(" ({} not ready)", total - ready));
    }
    s.push_str(&format!(
        ", {sessions} session{}",
        if sessions == 1 { "" } else { "s" }
    ));
    s
}

/// Keeps `STATUS=` current (at most one update every 500 ms) and pings the watchdog from the
/// runtime when `WATCHDOG_USEC` asks for it: a stuck runtime stops the pings.
pub(crate) async fn run(reg: Arc<Registry>) {
    if !notify::listening() {
        return;
    }
    let watchdog = watchdog_interval();
    let mut changes = reg.subscribe_changes();
    let mut last = String::new();
    let mut tick = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
    loop {
        tokio::select! {
            _ = reg.cancel.cancelled() => return,
            _ = tick.tick() => {
                if watchdog.is_some() {
                    notify::send(&[Notice::Watchdog]);
                }
            }
            r = changes.changed() => {
                if r.is_err() { return }
                tokio::time::sleep(Duration::from_millis(500)).await;
                changes.borrow_and_update();
                let line = status_line(&reg);
                if line != last {
                    notify::send(&[Notice::Status(&line)]);
                    last = line;
                }
            }
        }
    }
}

/// Half of `WATCHDOG_USEC`, when the watchdog is on for us: as in libsystemd, a
/// `WATCHDOG_PID` that names another process turns it off, a missing one does not.
fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2).max(Duration::from_millis(10)))
}

/// Tells the service manager the daemon is reloading its config.
pub(crate) fn notify_reloading() {
    notify::send(&[Notice::Reloading]);
}

/// Tells the service manager the reload is done, with the status line.
pub(crate) fn announce_reloaded(reg: &Registry) {
    let line = status_line(reg);
    notify::send(&[Notice::Ready, Notice::Status(&line)]);
}
