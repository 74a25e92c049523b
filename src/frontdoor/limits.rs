//! Connection caps for every accept loop: a bounded number of connections may sit in the
//! handshake (per door: a flood of the loopback compat ports, open to every local user, cannot
//! starve the owner's native socket), and a bounded number of sessions may live at once. A connection over either cap
//! is closed at once; refusals are logged at most once per 10 s, with their count, so a flood
//! cannot flood the log either.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often a refusal is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The caps shared by every door.
pub struct Limits {
    /// Native-socket connections between accept and a completed upgrade.
    native: Arc<Semaphore>,
    /// Compat connections between accept and a completed upgrade.
    compat: Arc<Semaphore>,
    /// Live sessions (any door).
    sessions: Arc<Semaphore>,
    /// Refusals not yet logged.
    refused: AtomicU64,
    /// When a refusal was last logged.
    last_log: Mutex<Option<Instant>>,
}

impl Limits {
    /// Caps of `max_handshakes` connections in the handshake and `max_sessions` sessions.
    pub fn new(max_handshakes: usize, max_sessions: usize) -> Self {
        Limits {
            native: Arc::new(Semaphore::new(max_handshakes.max(1))),
            compat: Arc::new(Semaphore::new(max_handshakes.max(1))),
            sessions: Arc::new(Semaphore::new(max_sessions.max(1))),
            refused: AtomicU64::new(0),
            last_log: Mutex::new(None),
        }
    }

    /// A place in the handshake for a new connection on `door` (`"native"` or `"compat"`),
    /// or `None` (close it now).
    pub fn handshake(&self, door: &str) -> Option<OwnedSemaphorePermit> {
        let sem = if door == "native" {
            &self.native
        } else {
            &self.compat
        };
        self.take(sem, door, "connections in the handshake")
    }

    /// A place for a new session on `door`, or `None` (refuse it).
    pub fn session(&self, door: &str) -> Option<OwnedSemaphorePermit> {
        self.take(&self.sessions, door, "sessions")
    }

    fn take(&self, sem: &Arc<Semaphore>, door: &str, what: &str) -> Option<OwnedSemaphorePermit> {
        if let Ok(p) = sem.clone().try_acquire_owned() {
            return Some(p);
        }
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = crate::sync::lock(&self.last_log);
        if last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            *last = Some(Instant::now());
            self.refused.store(0, Ordering::Relaxed);
            tracing::warn!(door, refused = n, "too many {what}; closing new connections at once (see max_handshakes / max_sessions)");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_come_back_when_dropped() {
        let l = Limits::new(2, 1);
        let a = l.handshake("t");
        let b = l.handshake("t");
        assert!(a.is_some() && b.is_some());
        assert!(l.handshake("t").is_none());
        drop(a);
        assert!(l.handshake("t").is_some());
        let s = l.session("t");
        assert!(s.is_some() && l.session("t").is_none());
    }
}
