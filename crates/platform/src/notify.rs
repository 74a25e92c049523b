//! Telling the service manager how the daemon is doing (systemd's `sd_notify`).
//!
//! Only systemd listens (`NOTIFY_SOCKET`); launchd and Windows' logon start have no such
//! channel, so there every notice is dropped.

/// One thing the service manager is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice<'a> {
    /// Started and serving.
    Ready,
    /// A status line for `systemctl status`.
    Status(&'a str),
    /// Reloading the config (with the monotonic time systemd asks for).
    Reloading,
    /// Stopping.
    Stopping,
    /// Alive (the watchdog ping).
    Watchdog,
}

/// True where a service manager listens (systemd's `NOTIFY_SOCKET` is set).
pub fn listening() -> bool {
    cfg!(unix) && std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// True when systemd started this very process (`SYSTEMD_EXEC_PID`, or a socket activation's
/// `LISTEN_PID`, names our pid; a child that inherited the variables has another pid): its
/// unit restarts it after a failure, so a daemon whose binary was replaced leaves the start
/// of the new one to it. A process merely started from a shell inside a systemd unit (a
/// terminal's) is not.
pub fn restarts_us() -> bool {
    let me = std::process::id().to_string();
    ["SYSTEMD_EXEC_PID", "LISTEN_PID"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|pid| pid == me))
}

/// Sends `notices` to the service manager; a no-op where none listens.
pub fn send(notices: &[Notice<'_>]) {
    if !listening() {
        return;
    }
    imp::send(notices);
}

#[cfg(unix)]
mod imp {
    use super::Notice;
    use sd_notify::NotifyState;

    pub(super) fn send(notices: &[Notice<'_>]) {
        let mut states = Vec::with_capacity(notices.len() + 1);
        for n in notices {
            match n {
                Notice::Ready => states.push(NotifyState::Ready),
                Notice::Status(s) => states.push(NotifyState::Status(s)),
                Notice::Stopping => states.push(NotifyState::Stopping),
                Notice::Watchdog => states.push(NotifyState::Watchdog),
                Notice::Reloading => {
                    states.push(NotifyState::Reloading);
                    if let Ok(now) = NotifyState::monotonic_usec_now() {
                        states.push(now);
                    }
                }
            }
        }
        if let Err(e) = sd_notify::notify(&states) {
            tracing::debug!(error = %e, "sd_notify failed");
        }
    }
}

#[cfg(not(unix))]
mod imp {
    pub(super) fn send(_: &[super::Notice<'_>]) {}
}
