//! A session's outgoing frames, the one thing an editor link touches of a session.
//!
//! Why not a channel per session: an answer delivered by the link's own task and written from
//! its parts costs no wake-up and two allocations fewer per call, 15.7 k to 14.1 k
//! instructions (`benches/README.md`, "An answer written from its parts").
//!
//! Delivery never blocks. When nothing is queued, the delivering task writes the frame to the
//! session's socket itself, so an editor's answer reaches the agent without waking the session
//! task. Otherwise the frame is queued for the socket's writer task (see `shared_writer`: the
//! editor link writes the same way). A session whose queue is full is dropped, so a client
//! that stops reading cannot slow an editor or other sessions.

use crate::shared_writer::{Broken, Refused, SharedWriter};
use crate::wsframe::{FrameWriter, Out};
use std::pin::Pin;
use std::time::Duration;
use tokio::io::AsyncWrite;
use tokio_util::sync::CancellationToken;

/// How many frames may wait for a session that is not reading before it is dropped.
pub const OUTBOX_FRAMES: usize = 1024;

/// The write half of a session's WebSocket, whatever door (and socket kind) it came through.
pub type SessionSink = FrameWriter<Pin<Box<dyn AsyncWrite + Send>>>;

/// Frames for one session. Senders never block: a session whose queue is full is dropped.
#[derive(Clone)]
pub struct Outbox {
    /// The session id, for log lines.
    id: u64,
    /// The session's socket and its queue; empty once the session has closed it.
    out: SharedWriter<SessionSink, Out>,
    /// Told when a write to the socket fails.
    broken: Broken,
    /// Cancelled to drop the session.
    kill: CancellationToken,
}

impl Outbox {
    /// An outbox for session `id` writing to `sink`, its writer task on `tracker`; `kill`
    /// ends the session when it overflows.
    pub fn new(
        id: u64,
        sink: SessionSink,
        kill: CancellationToken,
        tracker: &tokio_util::task::TaskTracker,
    ) -> Self {
        let out = SharedWriter::default();
        let broken = out.install(sink, OUTBOX_FRAMES, tracker);
        Outbox {
            id,
            out,
            broken,
            kill,
        }
    }

    /// Sends a frame: written now if nothing is queued, else queued for the session task.
    /// Returns false if the session is gone, was just dropped as hopeless, or its socket
    /// failed.
    pub fn deliver(&self, text: String) -> bool {
        self.deliver_frame(Out::Text(text))
    }

    /// [`deliver`](Self::deliver) for several text frames, in order and together: no frame
    /// of another sender (an editor's answer) comes between them.
    pub fn deliver_all(&self, texts: Vec<String>) -> bool {
        self.delivered(self.out.send_all(texts.into_iter().map(Out::Text)))
    }

    /// [`deliver`](Self::deliver) for a text frame given as parts: written from them when
    /// nothing is queued (an answer spliced from the editor's frame is never assembled), else
    /// assembled and queued.
    pub fn deliver_parts(&self, parts: &[&str]) -> bool {
        let sent = self.out.send_parts(parts, || Out::Text(parts.concat()));
        self.delivered(sent)
    }

    /// Answers the client's ping (RFC 6455: a pong echoes its payload).
    pub fn pong(&self, payload: &[u8]) {
        self.deliver_frame(Out::Pong(payload.to_vec()));
    }

    /// Sends a close frame with `code`, the last frame of the session.
    pub fn close_with(&self, code: u16) {
        self.deliver_frame(Out::Close(code));
    }

    fn deliver_frame(&self, frame: Out) -> bool {
        self.delivered(self.out.send(frame))
    }

    /// What became of a delivery: true if taken; a full queue drops the session.
    fn delivered(&self, sent: Result<(), Refused>) -> bool {
        match sent {
            Ok(()) => true,
            Err(Refused::Full) => {
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
            // Broken: the session task hears of it from its own turn at the queue.
            Err(Refused::Broken | Refused::Gone) => false,
        }
    }

    /// Ends the session (its task closes the connection and cleans up).
    pub fn drop_session(&self) {
        self.kill.cancel();
    }

    /// Told when a write to the session's socket fails (the session task ends on it).
    pub fn broken(&self) -> &Broken {
        &self.broken
    }

    /// The session's last writes: what is queued gets `limit` to reach the client, then the
    /// socket is closed; later deliveries are refused.
    pub async fn finish(&self, limit: Duration) {
        self.out.finish(None, limit).await;
    }
}
