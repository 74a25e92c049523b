//! The server-to-client half of one MCP session over Streamable HTTP: its notifications,
//! streamed as server-sent events on the open `GET /mcp` or held until one opens, and the
//! session's end when its client has had no stream open for [`ABANDONED_AFTER`].
//!
//! Gemini CLI and Copilot CLI send no `DELETE` when they exit or lose the lockfile: their
//! event stream's connection closing is the only sign, so a stream's guard lives as long as
//! the response body hyper holds for that connection.

use super::Body;
use crate::platform::sync::lock;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::Response;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A session with no event stream open this long is over.
pub(crate) const ABANDONED_AFTER: Duration = Duration::from_secs(3);

/// A comment on an idle event stream this often, so no client or proxy times it out.
const KEEP_ALIVE: Duration = Duration::from_secs(20);

/// What a session holds while no stream is open.
#[derive(Clone, Copy)]
pub(crate) struct Backlog {
    /// At most this many notifications (the oldest goes first); a stream that falls four
    /// times this far behind is a client that stopped reading, and its session ends.
    pub max: usize,
    /// Methods of which only the newest held notification matters (a selection, a context
    /// update): a newer one replaces an older one.
    pub latest_only: &'static [&'static str],
}

/// Notifications for one session's client, and what ends the session when it has no stream.
pub(crate) struct Events {
    /// Who the client is, for log lines ("Copilot CLI").
    agent: &'static str,
    backlog: Backlog,
    state: Mutex<State>,
    ended: CancellationToken,
    tracker: TaskTracker,
}

#[derive(Default)]
struct State {
    stream: Option<mpsc::Sender<String>>,
    /// Each held notification with its method.
    held: VecDeque<(&'static str, String)>,
    /// Counts the streams opened, so a closed stream's guard knows whether it was the last.
    generation: u64,
}

/// Held by an open event stream's body: its drop (the client's connection closed) starts the
/// [`ABANDONED_AFTER`] clock.
struct StreamGuard {
    events: Arc<Events>,
    generation: u64,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut s = lock(&self.events.state);
        if s.generation == self.generation {
            s.stream = None;
            drop(s);
            self.events.end_if_abandoned();
        }
    }
}

impl Events {
    /// The events of a session that `ended` ends; its timers run on `tracker`.
    pub(crate) fn new(
        agent: &'static str,
        backlog: Backlog,
        ended: CancellationToken,
        tracker: TaskTracker,
    ) -> Arc<Events> {
        Arc::new(Events {
            agent,
            backlog,
            state: Mutex::new(State::default()),
            ended,
            tracker,
        })
    }

    /// Ends the session [`ABANDONED_AFTER`] from now unless an event stream is open by then
    /// (called at the start of a session that must open one).
    pub(crate) fn end_if_abandoned(self: &Arc<Self>) {
        let events = self.clone();
        let generation = lock(&self.state).generation;
        self.tracker.spawn(async move {
            tokio::select! {
                _ = events.ended.cancelled() => return,
                _ = tokio::time::sleep(ABANDONED_AFTER) => {}
            }
            let s = lock(&events.state);
            if s.stream.is_none() && s.generation == generation {
                drop(s);
                tracing::info!(
                    "a {} session has had no event stream for {ABANDONED_AFTER:?} (the client exited?); ending it",
                    events.agent
                );
                events.ended.cancel();
            }
        });
    }

    /// Sends notification `method` to the client (held while no stream is open). `method` is
    /// one of the door's own names: a `&'static str`.
    pub(crate) fn notify(&self, method: &'static str, params: Value) {
        let mut text = json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string();
        let mut s = lock(&self.state);
        if let Some(tx) = &s.stream {
            match tx.try_send(text) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(
                        "a {} session stopped reading its event stream; ending it",
                        self.agent
                    );
                    self.ended.cancel();
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(back)) => {
                    s.stream = None;
                    text = back;
                }
            }
        }
        hold(&mut s.held, self.backlog, method, text);
    }

    /// `GET /mcp`'s answer: the event stream (what was held first), replacing an older one;
    /// it ends with the session.
    pub(crate) fn stream(self: &Arc<Self>) -> Response<Body> {
        let (tx, rx) = mpsc::channel(self.backlog.max * 4);
        let guard = {
            let mut s = lock(&self.state);
            for (_, text) in s.held.drain(..) {
                let _ = tx.try_send(text);
            }
            s.stream = Some(tx);
            s.generation += 1;
            StreamGuard {
                events: self.clone(),
                generation: s.generation,
            }
        };
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The guard lives as long as the body: hyper drops it when the client's connection goes.
        let state = (rx, self.ended.clone(), tick, guard);
        let stream =
            futures_util::stream::unfold(state, |(mut rx, ended, mut tick, guard)| async move {
                let bytes = tokio::select! {
                    biased;
                    m = rx.recv() => Bytes::from(format!("event: message\ndata: {}\n\n", m?)),
                    _ = ended.cancelled() => return None,
                    _ = tick.tick() => Bytes::from_static(b": keep-alive\n\n"),
                };
                Some((
                    Ok::<_, Infallible>(hyper::body::Frame::data(bytes)),
                    (rx, ended, tick, guard),
                ))
            });
        let mut r = Response::new(StreamBody::new(stream).boxed());
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    }
}

/// Holds `text` (a notification `method`) within `backlog`.
fn hold(
    held: &mut VecDeque<(&'static str, String)>,
    backlog: Backlog,
    method: &'static str,
    text: String,
) {
    if backlog.latest_only.contains(&method) {
        held.retain(|(m, _)| *m != method);
    }
    if held.len() >= backlog.max {
        held.pop_front();
    }
    held.push_back((method, text));
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPDATE: &str = "ide/contextUpdate";
    const POLICY: Backlog = Backlog {
        max: 3,
        latest_only: &[UPDATE],
    };

    fn held(h: &VecDeque<(&'static str, String)>) -> Vec<String> {
        h.iter().map(|(_, t)| t.clone()).collect()
    }

    #[test]
    fn a_newer_latest_only_notification_replaces_a_held_one_and_others_are_kept() {
        let mut h = VecDeque::new();
        hold(&mut h, POLICY, UPDATE, "u1".into());
        hold(&mut h, POLICY, "ide/diffRejected", "r1".into());
        hold(&mut h, POLICY, UPDATE, "u2".into());
        assert_eq!(held(&h), ["r1", "u2"]);
    }

    #[test]
    fn a_full_backlog_drops_its_oldest() {
        let mut h = VecDeque::new();
        for t in ["r1", "r2", "r3", "r4"] {
            hold(&mut h, POLICY, "ide/diffRejected", t.into());
        }
        assert_eq!(held(&h), ["r2", "r3", "r4"]);
    }

    /// What was held comes first on the stream, then what is sent while it is open; a session
    /// whose stream closes and stays closed ends.
    #[tokio::test]
    async fn held_notifications_come_first_and_a_session_without_a_stream_ends() {
        let ended = CancellationToken::new();
        let tracker = TaskTracker::new();
        let events = Events::new("test", POLICY, ended.clone(), tracker);
        events.notify("ide/diffRejected", json!({"n": 1}));
        let body = events.stream().into_body();
        events.notify("ide/diffRejected", json!({"n": 2}));
        let mut frames = body.into_data_stream();
        use futures_util::StreamExt;
        for n in [1, 2] {
            let data = tokio::time::timeout(Duration::from_secs(1), frames.next())
                .await
                .expect("a frame in time")
                .expect("the stream is open")
                .expect("a frame");
            let text = String::from_utf8_lossy(&data).to_string();
            assert!(text.starts_with("event: message\ndata: "), "{text}");
            assert!(text.contains(&format!("\"n\":{n}")), "{text}");
        }
        assert!(!ended.is_cancelled());
        drop(frames);
        tokio::time::timeout(ABANDONED_AFTER * 3, ended.cancelled())
            .await
            .expect("the session ends once its stream has been gone for ABANDONED_AFTER");
    }
}
