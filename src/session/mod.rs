//! One connected agent session's task, whatever door it came through.
//!
//! The task (here) reads the client's frames and the broker's notices: id rewriting both ways,
//! the diffs and editor requests it owns, selection replay, notification fan-in; `calls` sends
//! the client's requests on; `registry::session` is the session as everyone else sees it (below the
//! registry). Uses `registry`, `editor` and everything below them.

use crate::platform::sync::lock;
use crate::protocol::jsonrpc::{self};
use crate::protocol::native::{self, Notice as _};
use crate::registry::Registry;
use crate::wire::outbox::SessionSink;
use crate::wire::outbox::{Outbox, OUTBOX_FRAMES};
use crate::wire::wsframe::{Frame, FrameReader};
use serde_json::{json, Map, Value};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncRead;
use tokio::sync::{mpsc, watch};

pub use crate::registry::session::{Control, Door, Follower, Intro, Session};

mod calls;
use calls::{current_editor, on_client_text};
pub mod follow;

/// Runs a session on an upgraded WebSocket (its two halves) until either side closes or the
/// broker stops.
pub async fn run<R>(reg: Arc<Registry>, reader: FrameReader<R>, sink: SessionSink, intro: Intro)
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let id = reg.next_session_id();
    // At debug level, as an editor link's span is (`editor::span` says why): the session's
    // info lines and above name it themselves.
    let span = tracing::debug_span!("session", id, door = ?intro.door);
    tracing::Instrument::instrument(serve(reg, reader, sink, intro, id), span).await
}

async fn serve<R>(
    reg: Arc<Registry>,
    mut reader: FrameReader<R>,
    sink: SessionSink,
    intro: Intro,
    id: u64,
) where
    R: AsyncRead + Unpin + Send + 'static,
{
    let kill = reg.cancel.child_token();
    let (control, mut ctl_rx) = mpsc::unbounded_channel();
    let outbox = Outbox::new(id, sink, kill.clone(), &reg.tracker);
    let session = open(&reg, &intro, id, outbox, control);
    let mut selection = SelectionFeed::default();
    // Handshake first: until the client's first request (`initialize`, for an MCP client) has
    // been answered, attachment notices (each with its selection replay) wait here; then they
    // follow the answer, in order. A pi-ide client that attaches its message handler only
    // after the upgrade would otherwise lose them.
    let mut held: Option<Vec<String>> = Some(skew_notice(&intro, id).into_iter().collect());
    let mut progress = ProgressClock::new(&reg);
    // Made once (a fresh future per turn would register with and leave the token each time),
    // polled only once they have woken the task: a drop comes once, notices seldom.
    let killed = kill.cancelled();
    tokio::pin!(killed);
    let mut killed = crate::wire::woken::WhenWoken::new(killed);
    let mut controls =
        crate::wire::woken::WhenWoken::new(std::future::poll_fn(|cx| ctl_rx.poll_recv(cx)));
    let write_failed = session.outbox.broken().failed();
    tokio::pin!(write_failed);
    let mut write_failed = crate::wire::woken::WhenWoken::new(write_failed);
    let reason = loop {
        let wants_progress = progress.arm(&session);
        // Biased: a drop first; then the client's frames, so a wake-up for a frame polls
        // nothing else first and a client that writes without pause delays only its own
        // notices. Writes never wait: a client that stops reading fills its outbox, is dropped.
        tokio::select! {
            biased;
            _ = &mut killed => break "dropped or shutting down",
            frame = reader.next() => {
                if let Some(why) = on_frame(&reg, &session, frame, &mut held) {
                    break why;
                }
            }
            Some(c) = &mut controls => on_control(&reg, &session, c, &mut selection, &mut held),
            why = &mut write_failed => {
                tracing::info!(session = id, error = %why, "session write failed");
                break "write failed";
            }
            _ = progress.tick.tick(), if wants_progress => keep_alive(&reg, &session),
            changed = selection.changed(), if held.is_none() => match changed {
                Some(text) => _ = session.outbox.deliver(session.to_agent(&text)),
                None => selection.follow(session.editor_id().and_then(|e| subscribe(&reg, &e[..]))),
            },
        }
    };
    drop(controls);
    close(&reg, &session, &mut ctl_rx, reason).await;
}

/// The clock of a session's `notifications/progress`: it runs only while a call waits with a
/// progress token, so a thousand idle sessions cost no wake-ups, and it starts a full period
/// after such a call arrives.
struct ProgressClock {
    tick: tokio::time::Interval,
    armed: bool,
}

impl ProgressClock {
    fn new(reg: &Registry) -> Self {
        let every = Duration::from_millis(reg.config().timeouts.progress_ms.max(10));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ProgressClock { tick, armed: false }
    }

    /// Whether a call of `session` waits with a progress token (the clock restarted when one
    /// starts waiting).
    fn arm(&mut self, session: &Session) -> bool {
        let wants = !lock(&session.progress).is_empty();
        if wants && !self.armed {
            self.tick.reset();
        }
        self.armed = wants;
        wants
    }
}

/// The session made, registered, given the sticky target it inherits, and placed.
pub(crate) fn open(
    reg: &Arc<Registry>,
    intro: &Intro,
    id: u64,
    outbox: Outbox,
    control: mpsc::UnboundedSender<Control>,
) -> Arc<Session> {
    let map = intro
        .remote
        .as_deref()
        .and_then(|r| crate::protocol::pathmap::PathMap::for_remote(&reg.config().remote, r));
    let session = Arc::new(Session::new(id, intro, outbox, control, reg.stamp(), map));
    tracing::info!(session = id, door = ?intro.door, cwd = %intro.cwd, key = intro.key.as_deref().unwrap_or("-"), "session connected");
    reg.add_session(session.clone());
    if let (Some(key), Some(from)) = (intro.key.as_deref(), intro.inherit.as_deref()) {
        reg.inherit_sticky(key, from);
    }
    reg.place_new_session(&session, intro.editor.as_deref());
    session
}

/// A protocol revision other than ours: told once, first thing after the handshake.
fn skew_notice(intro: &Intro, id: u64) -> Option<String> {
    let note = intro
        .client
        .as_ref()
        .and_then(crate::protocol::version::skew_notice)?;
    tracing::info!(session = id, notice = %note, "protocol revisions differ");
    let notice = native::UserNotice {
        level: "warning",
        message: note,
    };
    Some(notice.frame())
}

/// One frame from the client (or the end of its stream, or a framing error); the reason the
/// session ends, if it does.
fn on_frame(
    reg: &Arc<Registry>,
    session: &Arc<Session>,
    frame: Result<Option<Frame<'_>>, crate::wire::Error>,
    held: &mut Option<Vec<String>>,
) -> Option<&'static str> {
    let text = |t: &str, held: &mut Option<Vec<String>>| {
        if on_client_text(reg, session, t) {
            release(session, held);
        }
    };
    match frame {
        Ok(None) => return Some("closed by client"),
        // Read past, never held: the client is told (with the message's id, picked out as it
        // passed) and the session reads on.
        Err(crate::wire::Error::OverBudget { size, id }) => {
            tracing::debug!(
                session = session.id,
                size,
                "a long message refused: the budget for messages in flight is taken"
            );
            session.outbox.deliver(jsonrpc::error(
                id.as_ref().unwrap_or(&Value::Null),
                jsonrpc::BUSY,
                &format!("the broker is reading too many long messages at once (max_frames_in_flight_bytes): this one of {size} bytes was dropped unread; send it again"),
            ));
        }
        Err(e) => {
            tracing::info!(session = session.id, error = %e, "session connection error");
            if let Some(code) = e.close_code() {
                session.outbox.close_with(code);
            }
            return Some("connection error");
        }
        Ok(Some(Frame::Text(t))) => text(t, held),
        Ok(Some(Frame::Binary(b))) => match std::str::from_utf8(b) {
            Ok(t) => text(t, held),
            Err(_) => {
                session.outbox.deliver(jsonrpc::error(
                    &Value::Null,
                    jsonrpc::PARSE_ERROR,
                    "Parse error: binary frame is not UTF-8",
                ));
            }
        },
        Ok(Some(Frame::Ping(p))) => session.outbox.pong(p),
        Ok(Some(Frame::Close(code))) => {
            // The closing handshake: the client's code echoed (RFC 6455 §5.5.1).
            session.outbox.close_with(code.unwrap_or(1000));
            return Some("closed by client");
        }
        Ok(Some(Frame::Pong(_))) => {}
    }
    None
}

/// A notice from the registry: the session's editor changed (the selection feed follows it)
/// and the agent is told, after the handshake if it is not done yet.
fn on_control(
    reg: &Arc<Registry>,
    session: &Arc<Session>,
    c: Control,
    selection: &mut SelectionFeed,
    held: &mut Option<Vec<String>>,
) {
    let notes = match c {
        Control::Attached(e) => {
            let mut feed = subscribe(reg, &e);
            let notice = attached_notice(reg, &e).frame();
            // The editor's selection goes out right behind the notice, in the same delivery:
            // a client that acts on `broker/attached` finds the replay ahead of every answer
            // it asks for (the pi extension reads the selection once its next call returns).
            let replay = feed
                .as_mut()
                .and_then(|rx| rx.borrow_and_update().clone())
                .map(|text| session.to_agent(&text));
            selection.follow(feed);
            // Attached to an editor another client holds: said at once, with the reason (its
            // calls are still answered: the broker links for them).
            let taken = reg
                .editor(&e)
                .filter(|ed| ed.state() == crate::editor::LinkState::Taken)
                .map(|ed| {
                    native::EditorState {
                        editor: e.to_string(),
                        state: "taken",
                        reason: ed.link_info().reason,
                    }
                    .frame()
                });
            std::iter::once(notice).chain(taken).chain(replay).collect()
        }
        Control::Detached(r) => {
            selection.follow(None);
            vec![native::Detached { reason: r }.frame()]
        }
        Control::Rebind => {
            selection.follow(session.editor_id().and_then(|e| subscribe(reg, &e[..])));
            Vec::new()
        }
        Control::Notice(text) => vec![text],
    };
    match held.as_mut() {
        _ if notes.is_empty() => {}
        Some(h) if h.len() + notes.len() <= OUTBOX_FRAMES => h.extend(notes),
        // A client that never finishes its handshake holds no more than a full outbox would.
        Some(_) => {
            tracing::warn!(
                session = session.id,
                held = OUTBOX_FRAMES,
                "session has not finished its handshake and its held notices are full; dropping it"
            );
            session.outbox.drop_session();
        }
        None => {
            session.outbox.deliver_all(notes);
        }
    }
}

/// The session's end: what is still queued (a DIFF_REJECTED on shutdown, a detach notice)
/// gets a bounded last chance to reach the client, then the registry forgets it.
async fn close(
    reg: &Arc<Registry>,
    session: &Arc<Session>,
    ctl_rx: &mut mpsc::UnboundedReceiver<Control>,
    reason: &str,
) {
    let id = session.id;
    tracing::debug!(session = id, reason, "session loop ended; flushing");
    while let Ok(c) = ctl_rx.try_recv() {
        if let Control::Detached(r) = c {
            session
                .outbox
                .deliver(native::Detached { reason: r }.frame());
        }
    }
    session.outbox.finish(Duration::from_secs(1)).await;
    tracing::debug!(session = id, "flushed");
    reg.end_session(session);
    tracing::info!(session = id, reason, "session closed");
}

/// `broker/attached`: the editor id, and its name and folders as its lockfile says.
fn attached_notice(reg: &Registry, editor: &str) -> native::Attached {
    let e = reg.editor(editor);
    let l = e.as_ref().map(|e| e.lockfile());
    native::Attached {
        editor: editor.to_string(),
        ide_name: l.as_ref().map(|l| l.ide_name.clone()),
        workspace_folders: l.map(|l| l.workspace_folders),
        family: e.as_ref().map(|e| e.family),
        broker: crate::protocol::version::broker_info(),
    }
}

/// A receiver of the editor's selection, marked changed so the current one is replayed.
fn subscribe(reg: &Registry, editor: &str) -> Option<watch::Receiver<Option<Arc<str>>>> {
    Some(reg.editor(editor)?.subscribe_selection())
}

/// The editor's selection as a session follows it. The wait for the next one is one future
/// kept across turns of the session loop: a fresh `changed()` per turn would join and leave
/// the watch's waiters on every frame the session handles. It is polled only after it woke
/// the task (`WhenWoken`): a selection changes seldom, frames come often.
#[derive(Default)]
struct SelectionFeed {
    next: Option<crate::wire::woken::WhenWoken<NextSelection>>,
}

type SelectionRx = watch::Receiver<Option<Arc<str>>>;

/// The wait for the next selection; gives the receiver back with it.
type NextSelection = Pin<Box<dyn Future<Output = (SelectionRx, Option<Arc<str>>)> + Send>>;

impl SelectionFeed {
    /// Follows `rx` from now on (nothing when `None`).
    fn follow(&mut self, rx: Option<SelectionRx>) {
        self.next =
            rx.map(|rx| crate::wire::woken::WhenWoken::new(Box::pin(next_selection(rx)) as _));
    }

    /// The next selection frame; `None` when the editor's handle is gone (resubscribe).
    /// Pending forever while nothing is followed.
    async fn changed(&mut self) -> Option<Arc<str>> {
        let Some(next) = self.next.as_mut() else {
            return std::future::pending().await;
        };
        let (rx, text) = next.await;
        if text.is_some() {
            self.follow(Some(rx));
        } else {
            self.next = None;
        }
        text
    }
}

async fn next_selection(mut rx: SelectionRx) -> (SelectionRx, Option<Arc<str>>) {
    loop {
        if rx.changed().await.is_err() {
            return (rx, None);
        }
        let latest = rx.borrow_and_update().clone();
        if latest.is_some() {
            return (rx, latest);
        }
    }
}

/// Sends `notifications/progress` for every call of this session still waiting on its editor,
/// and forgets those that were answered.
fn keep_alive(reg: &Registry, s: &Session) {
    let mut list = lock(&s.progress);
    list.retain_mut(|p| {
        let waiting = reg
            .editor(&p.editor)
            .is_some_and(|e| e.is_pending(p.upstream));
        if waiting {
            p.sent += 1;
            s.outbox.deliver(jsonrpc::notification(
                "notifications/progress",
                json!({"progressToken": p.token, "progress": p.sent, "message": "waiting for the editor"}),
            ));
        }
        waiting
    });
}

/// A client's `notifications/cancelled {requestId}`: the call is forgotten (no answer is sent,
/// as MCP says); a diff a follower reviews is withdrawn from it; a cancelled diff is closed in
/// the editor; the editor is told, under the id the broker used.
pub(super) fn cancel_request(reg: &Registry, s: &Session, msg: &Map<String, Value>) {
    let Some(request) = msg.get("params").and_then(|p| p.get("requestId")) else {
        return;
    };
    if follow::withdraw(s, request) {
        return;
    }
    let Some(editor) = current_editor(reg, s) else {
        return;
    };
    let Some(upstream) = editor.pending_of(s.id, request) else {
        tracing::debug!(session = s.id, %request, "cancellation of no pending call");
        return;
    };
    let Some(p) = editor.forget_pending(upstream) else {
        return;
    };
    lock(&s.progress).retain(|x| x.upstream != upstream);
    if let Some(tab) = p.editor_tab() {
        tracing::info!(session = s.id, editor = %editor.id, "client cancelled a diff; closing it");
        if let Err(e) = editor.close_tab(tab) {
            tracing::warn!(editor = %editor.id, error = %e, "could not close a cancelled diff");
        }
    }
    let mut params = msg.get("params").cloned().unwrap_or_else(|| json!({}));
    params["requestId"] = json!(upstream);
    let _ = editor.send_raw(jsonrpc::notification(jsonrpc::CANCELLED, params));
}

/// Ends the handshake hold: the notices held so far are queued behind the answer just queued;
/// an editor's notifications go straight to the outbox from now on (one that saw the hold
/// still on reaches `on_control` after this, and is delivered behind these). On the default
/// current-thread runtime the link task cannot broadcast again until this task yields, which
/// it does only once it has also handled its queued notices (unless tokio's budget runs out
/// first). With worker threads (`PI_IDE_BROKER_THREADS`), a notification sent at this very
/// moment may overtake one still queued.
fn release(s: &Session, held: &mut Option<Vec<String>>) {
    if let Some(notes) = held.take() {
        s.outbox.deliver_all(notes);
        s.greeted.store(true, std::sync::atomic::Ordering::Release);
    }
}
