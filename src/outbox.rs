//! A session's outgoing frame queue, the one thing an editor link touches of a session:
//! delivery never blocks, so a session that stops reading cannot slow an editor or others.

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How many frames may wait for a session that is not reading before it is dropped.
pub const OUTBOX_FRAMES: usize = 1024;

/// Frames for one session. Senders never block: a session whose queue is full is dropped,
/// so a client that stops reading cannot slow an editor or other sessions.
#[derive(Clone)]
pub struct Outbox {
    /// The session id, for log lines.
    id: u64,
    /// The queue the session task drains.
    tx: mpsc::Sender<String>,
    /// Cancelled to drop the session.
    kill: CancellationToken,
}

impl Outbox {
    /// Queues a frame; returns false if the session is gone or was just dropped as hopeless.
    pub fn deliver(&self, text: String) -> bool {
        match self.tx.try_send(text) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                if !self.kill.is_cancelled() {
                    tracing::warn!(
                        session = self.id,
                        queued = OUTBOX_FRAMES,
                        "session is not reading its socket; dropping it"
                    );
                    self.kill.cancel();
                }
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

impl Outbox {
    /// An outbox for session `id` feeding `tx`; `kill` ends the session when it overflows.
    pub fn new(id: u64, tx: mpsc::Sender<String>, kill: CancellationToken) -> Self {
        Outbox { id, tx, kill }
    }

    /// Ends the session (its task closes the connection and cleans up).
    pub fn drop_session(&self) {
        self.kill.cancel();
    }
}
