//! One connected agent session, whatever door it came through: id rewriting both ways,
//! the diffs and editor requests it owns, selection replay, notification fan-in.

use crate::editor::{Editor, Owner, Pending};
use crate::family::Family;
use crate::jsonrpc::{self, ClientId, Incoming};
use crate::outbox::SessionSink;
use crate::outbox::{Outbox, OUTBOX_FRAMES};
use crate::registry::Registry;
use crate::sync::lock;
use crate::wsframe::{Frame, FrameReader};
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncRead;
use tokio::sync::{mpsc, watch};

use handle::Progress;
pub use handle::{Control, Door, Intro, Session};

pub mod handle;

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
    let mut killed = crate::woken::WhenWoken::new(killed);
    let mut controls =
        crate::woken::WhenWoken::new(std::future::poll_fn(|cx| ctl_rx.poll_recv(cx)));
    let write_failed = session.outbox.broken().failed();
    tokio::pin!(write_failed);
    let mut write_failed = crate::woken::WhenWoken::new(write_failed);
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
        .and_then(|r| crate::pathmap::PathMap::for_remote(&reg.config().remote, r));
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
        .and_then(crate::version::skew_notice)?;
    tracing::info!(session = id, notice = %note, "protocol revisions differ");
    Some(jsonrpc::notification(
        jsonrpc::broker::NOTICE,
        json!({"level": "warning", "message": note}),
    ))
}

/// One frame from the client (or the end of its stream, or a framing error); the reason the
/// session ends, if it does.
fn on_frame(
    reg: &Arc<Registry>,
    session: &Arc<Session>,
    frame: Result<Option<Frame<'_>>, crate::wsframe::WsError>,
    held: &mut Option<Vec<String>>,
) -> Option<&'static str> {
    let text = |t: &str, held: &mut Option<Vec<String>>| {
        if on_client_text(reg, session, t) {
            release(session, held);
        }
    };
    match frame {
        Ok(None) => return Some("closed by client"),
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
            let notice = jsonrpc::notification(jsonrpc::broker::ATTACHED, attached_params(reg, &e));
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
                    jsonrpc::notification(
                        jsonrpc::broker::EDITOR_STATE,
                        json!({"editor": e, "state": "taken", "reason": ed.link_info().reason}),
                    )
                });
            std::iter::once(notice).chain(taken).chain(replay).collect()
        }
        Control::Detached(r) => {
            selection.follow(None);
            vec![jsonrpc::notification(
                jsonrpc::broker::DETACHED,
                json!({"reason": r}),
            )]
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
            session.outbox.deliver(jsonrpc::notification(
                jsonrpc::broker::DETACHED,
                json!({"reason": r}),
            ));
        }
    }
    session.outbox.finish(Duration::from_secs(1)).await;
    tracing::debug!(session = id, "flushed");
    reg.end_session(session);
    tracing::info!(session = id, reason, "session closed");
}

/// `broker/attached` params: the editor id, and its name and folders as its lockfile says.
fn attached_params(reg: &Registry, editor: &str) -> Value {
    match reg.editor(editor) {
        Some(e) => {
            let l = e.lockfile();
            json!({"editor": editor, "ide_name": l.ide_name, "workspace_folders": l.workspace_folders, "family": e.family, "broker": crate::version::broker_info()})
        }
        None => json!({"editor": editor, "broker": crate::version::broker_info()}),
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
    next: Option<crate::woken::WhenWoken<NextSelection>>,
}

type SelectionRx = watch::Receiver<Option<Arc<str>>>;

/// The wait for the next selection; gives the receiver back with it.
type NextSelection = Pin<Box<dyn Future<Output = (SelectionRx, Option<Arc<str>>)> + Send>>;

impl SelectionFeed {
    /// Follows `rx` from now on (nothing when `None`).
    fn follow(&mut self, rx: Option<SelectionRx>) {
        self.next = rx.map(|rx| crate::woken::WhenWoken::new(Box::pin(next_selection(rx)) as _));
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
/// as MCP says); a cancelled diff is closed in the editor; the editor is told, under the id
/// the broker used.
fn cancel_request(reg: &Registry, s: &Session, msg: &Map<String, Value>) {
    let Some(request) = msg.get("params").and_then(|p| p.get("requestId")) else {
        return;
    };
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
    let _ = editor.send_raw(jsonrpc::notification("notifications/cancelled", params));
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

/// The hot path: a well-formed `tools/call` of a local session to an editor of its own dialect
/// goes upstream with the client's params bytes spliced in, without building a JSON tree (a
/// multi-megabyte `openDiff` included). `false` when the slow path must handle it (anything
/// unusual: it validates, bridges, maps and answers errors).
fn fast_forward(reg: &Arc<Registry>, s: &Arc<Session>, text: &str) -> bool {
    let Some(call) = FastCall::read(text) else {
        return false;
    };
    if s.map().is_some() {
        return false;
    }
    let Some(editor) = current_editor(reg, s) else {
        return false;
    };
    if editor.family != s.dialect
        || (editor.family == Family::Claude && matches!(call.tool, "openDiff" | "close_tab"))
    {
        return false;
    }
    let (Some(tab_name), Some(id)) = (call.tab_name(), call.id()) else {
        return false;
    };
    s.touch(reg.stamp());
    // The id moves into the pending entry; the rare refusal below reads it again.
    let label = Some(crate::family::tool_label(call.tool));
    let pending = call_pending(
        reg,
        s,
        id,
        "tools/call".into(),
        label,
        tab_name.clone(),
        None,
    );
    let sent = editor.send_built(|uid| call_frame(uid, call.raw_params), pending);
    settle_call(
        s,
        &editor,
        sent,
        call.progress_token(),
        tab_name.as_deref(),
        || call.id().map_or(Value::Null, ClientId::into_value),
    );
    true
}

/// A `tools/call` read in one borrowed pass, well-formed enough for the hot path: JSON-RPC 2.0,
/// an id that is a string or a number, a plain tool name and an object of arguments.
struct FastCall<'t> {
    id_text: &'t str,
    raw_params: &'t str,
    tool: &'t str,
    arguments: &'t str,
    meta: Option<&'t str>,
}

impl<'t> FastCall<'t> {
    fn read(text: &'t str) -> Option<Self> {
        use crate::jsonscan::{members_in, plain_str};
        // One pass: the call's members, and the members of its params.
        let ([Some(jsonrpc), Some(method), Some(id_text), Some(raw_params)], Some(params)) =
            members_in(
                text,
                ["jsonrpc", "method", "id", "params"],
                3,
                ["name", "arguments", "_meta"],
            )?
        else {
            return None;
        };
        let id_ok = id_text.starts_with('"')
            || id_text.starts_with(|c: char| c == '-' || c.is_ascii_digit());
        if jsonrpc != "\"2.0\"" || method != "\"tools/call\"" || !id_ok {
            return None;
        }
        let [Some(name), Some(arguments), meta] = params else {
            return None;
        };
        let tool = plain_str(name)?;
        arguments.starts_with('{').then_some(FastCall {
            id_text,
            raw_params,
            tool,
            arguments,
            meta,
        })
    }

    /// `openDiff`'s `tab_name` (`Some(None)` for other tools); `None` when it is not plain.
    fn tab_name(&self) -> Option<Option<String>> {
        use crate::jsonscan::{members, plain_str};
        if self.tool != "openDiff" {
            return Some(None);
        }
        let [t] = members(self.arguments, ["tab_name"])?;
        plain_str(t?).map(|t| Some(t.to_string()))
    }

    /// The client's id; the common ones without a parser: a plain string, or a plain integer
    /// (kept without an allocation).
    fn id(&self) -> Option<ClientId> {
        use crate::jsonscan::{plain_str, plain_u64};
        match (plain_str(self.id_text), plain_u64(self.id_text)) {
            (Some(text), _) => Some(ClientId::Json(Value::String(text.to_string()))),
            (_, Some(n)) => Some(ClientId::Plain(n)),
            _ => serde_json::from_str::<Value>(self.id_text)
                .ok()
                .map(ClientId::Json),
        }
    }

    /// `_meta.progressToken`, when it is one MCP allows.
    fn progress_token(&self) -> Option<Value> {
        self.meta
            .and_then(|m| crate::jsonscan::members(m, ["progressToken"]))
            .and_then(|[t]| serde_json::from_str::<Value>(t?).ok())
            .filter(is_progress_token)
    }
}

/// The call as the editor gets it: our id, the client's params bytes spliced in. Allocated
/// once at its exact size: a `String` whose length is its capacity becomes the frame's bytes
/// without another allocation.
fn call_frame(uid: u64, raw_params: &str) -> String {
    const HEAD: &str = "{\"jsonrpc\":\"2.0\",\"id\":";
    const MID: &str = ",\"method\":\"tools/call\",\"params\":";
    let mut digits = itoa::Buffer::new();
    let uid = digits.format(uid);
    let len = HEAD.len() + uid.len() + MID.len() + raw_params.len() + 1;
    let mut out = String::with_capacity(len);
    out.push_str(HEAD);
    out.push_str(uid);
    out.push_str(MID);
    out.push_str(raw_params);
    out.push('}');
    debug_assert_eq!(out.len(), len);
    out
}

/// A progress token as MCP defines one (a string or a number); anything else is ignored.
fn is_progress_token(token: &Value) -> bool {
    token.is_string() || token.is_number()
}

/// The `Pending` of a session's call: its answer goes back under `id`; a short tool gets the
/// short-tool deadline (a diff waits for the user as long as it takes); a remote session's
/// answer has its paths mapped back.
fn call_pending(
    reg: &Registry,
    s: &Session,
    id: ClientId,
    method: Cow<'static, str>,
    tool: Option<Cow<'static, str>>,
    tab_name: Option<String>,
    bridge: Option<crate::bridge::Bridge>,
) -> Pending {
    let is_diff = tab_name.is_some();
    // One clock read for both.
    let now = tokio::time::Instant::now();
    Pending {
        owner: Owner::Session {
            session: s.id,
            outbox: s.outbox.clone(),
            id,
        },
        method,
        tool,
        tab_name,
        started: now.into_std(),
        deadline: (!is_diff)
            .then(|| now + Duration::from_millis(reg.config().timeouts.short_tool_ms)),
        bridge,
        map: s.remote.as_ref().map(|(_, m)| m.clone()),
    }
}

/// After a session's call was handed to its editor: kept alive with progress when the client
/// asked for it, or refused when it could not be sent.
fn settle_call(
    s: &Session,
    editor: &Editor,
    sent: Result<u64, crate::editor::SendError>,
    progress_token: Option<Value>,
    tab_name: Option<&str>,
    id: impl FnOnce() -> Value,
) {
    match sent {
        Ok(uid) => {
            if let Some(token) = progress_token {
                lock(&s.progress).push(Progress {
                    editor: editor.id.clone(),
                    upstream: uid,
                    token,
                    sent: 0,
                });
            }
        }
        Err(e) => refuse_call(s, &id(), tab_name, e.to_string()),
    }
}

/// A call that cannot reach an editor: a diff is a rejection (never an error: on an error pi
/// applies the edit unreviewed), anything else an error.
fn refuse_call(s: &Session, id: &Value, tab_name: Option<&str>, why: String) {
    let text = match tab_name {
        Some(tab) => {
            tracing::info!(session = s.id, reason = %why, "openDiff answered DIFF_REJECTED");
            jsonrpc::result(id, jsonrpc::diff_undelivered(tab, &why))
        }
        None => jsonrpc::error(id, jsonrpc::NO_EDITOR, &why),
    };
    s.outbox.deliver(text);
}

/// Handles one frame from the client; true when it was a request (answered or forwarded, so
/// the handshake is over).
fn on_client_text(reg: &Arc<Registry>, s: &Arc<Session>, text: &str) -> bool {
    if fast_forward(reg, s, text) {
        return true;
    }
    match jsonrpc::classify(text) {
        Err(r) => {
            tracing::info!(session = s.id, error = %r.message, "invalid message from session");
            s.outbox.deliver(jsonrpc::rejection(&r));
            false
        }
        Ok(Incoming::Request { id, method, msg }) => {
            on_request(reg, s, id, method, msg);
            true
        }
        Ok(Incoming::Notification { method, msg }) => {
            match method.as_str() {
                "notifications/initialized" => {}
                "notifications/cancelled" => cancel_request(reg, s, &msg),
                _ => {
                    if let Some(e) = current_editor(reg, s) {
                        let _ = e.send_raw(Value::Object(msg).to_string());
                    }
                }
            }
            false
        }
        Ok(Incoming::Response { id, msg }) => {
            reg.answer_delegated(s, id, msg);
            false
        }
    }
}

fn current_editor(reg: &Registry, s: &Session) -> Option<Arc<Editor>> {
    let id = s.editor_id()?;
    reg.editor(&id)
}

fn on_request(
    reg: &Arc<Registry>,
    s: &Arc<Session>,
    id: Value,
    method: String,
    msg: Map<String, Value>,
) {
    let reply = |text: String| {
        s.outbox.deliver(text);
    };
    // Borrowed, not cloned: an openDiff's params can be megabytes and go straight upstream.
    let param = |k: &str| msg.get("params").and_then(|p| p.get(k));
    match method.as_str() {
        "initialize" => {
            let cached = current_editor(reg, s).and_then(|e| e.link_info().initialize);
            let result = cached.unwrap_or_else(|| {
                json!({
                    "protocolVersion": param("protocolVersion").cloned().unwrap_or(json!(crate::editor::PROTOCOL_VERSION)),
                    "capabilities": {"tools": {"listChanged": true}},
                    "serverInfo": {"name": "pi-ide-broker", "version": env!("CARGO_PKG_VERSION")},
                })
            });
            reply(jsonrpc::result(&id, result));
        }
        "tools/list" => {
            let editor = current_editor(reg, s);
            let mut tools = editor.as_ref().and_then(|e| e.link_info().tools);
            if let (Some(e), Some(Value::Array(list))) =
                (&editor, tools.as_mut().and_then(|t| t.get_mut("tools")))
            {
                if e.family != s.dialect {
                    let names = e.tool_names().unwrap_or_default();
                    list.extend(crate::bridge::extra_tools(s.dialect, e.family, &names));
                }
            }
            reply(jsonrpc::result(
                &id,
                tools.unwrap_or_else(|| json!({"tools": []})),
            ));
        }
        "ping" => reply(jsonrpc::result(&id, json!({}))),
        jsonrpc::broker::EDITORS => reply(jsonrpc::result(&id, reg.editors_for(s))),
        jsonrpc::broker::ATTACH => {
            let Some(want) = param("editor").and_then(Value::as_str) else {
                return reply(jsonrpc::error(
                    &id,
                    jsonrpc::INVALID_PARAMS,
                    "broker/attach needs params {\"editor\": \"<id>\"}; see broker/editors",
                ));
            };
            match reg.attach_explicit(s, want) {
                Ok(()) => reply(jsonrpc::result(&id, json!({"editor": want}))),
                Err(e) => reply(jsonrpc::error(&id, jsonrpc::INVALID_PARAMS, &e)),
            }
        }
        jsonrpc::broker::DETACH => {
            reg.detach(s, "detached by client", true);
            reply(jsonrpc::result(&id, json!({})));
        }
        _ => forward(reg, s, id, method, msg),
    }
}

fn forward(
    reg: &Arc<Registry>,
    s: &Arc<Session>,
    id: Value,
    method: String,
    msg: Map<String, Value>,
) {
    let tool = jsonrpc::tool_name(&msg).map(crate::family::tool_label);
    let tab_name = jsonrpc::diff_tab(&msg);
    let Some(editor) = current_editor(reg, s) else {
        refuse_call(s, &id, tab_name.as_deref(), reg.unattached_reason(s));
        return;
    };
    s.touch(reg.stamp());
    let mut msg = msg;
    let bridge = if method == "tools/call" {
        match bridge_call(s, &editor, &id, tool.as_deref(), &mut msg) {
            Ok(b) => b,
            Err(answer) => {
                s.outbox.deliver(answer);
                return;
            }
        }
    } else {
        None
    };
    let progress_token = msg
        .get("params")
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get("progressToken"))
        .filter(|t| is_progress_token(t))
        .cloned();
    map_paths(s, &mut msg);
    let id_moved = ClientId::Json(id.clone());
    let pending = call_pending(
        reg,
        s,
        id_moved,
        method.into(),
        tool,
        tab_name.clone(),
        bridge,
    );
    let sent = editor.send_request(msg, pending);
    settle_call(s, &editor, sent, progress_token, tab_name.as_deref(), || id);
}

/// A `tools/call` across dialects: answered here when the editor's own state answers it (a
/// Claude client's selection or workspace call on a pi-ide editor), else rewritten for the
/// editor with the bridge that turns its answer back; the error when it cannot be. A Claude
/// editor's diff tab is marked as the session's. `Err` holds the answer to send the client
/// (a result or an error, with its `id`) instead of a call to the editor.
fn bridge_call(
    s: &Session,
    editor: &Arc<Editor>,
    id: &Value,
    tool: Option<&str>,
    msg: &mut Map<String, Value>,
) -> Result<Option<crate::bridge::Bridge>, String> {
    if let (Family::Claude, Family::Pi, Some(t)) = (s.dialect, editor.family, tool) {
        let selection = editor.last_selection();
        let folders = editor.lockfile().workspace_folders;
        let names = editor.tool_names().unwrap_or_default();
        if let Some(result) =
            crate::bridge::answer_locally(t, &names, selection.as_deref(), &folders)
        {
            return Err(jsonrpc::result(id, result));
        }
    }
    if editor.family != s.dialect {
        let tools = editor.tool_names();
        let d = (s.dialect, editor.family);
        return crate::bridge::outbound(d.0, d.1, s.id, &editor.id, tools.as_deref(), msg)
            .map_err(|(code, message)| jsonrpc::error(id, code, &message));
    }
    if editor.family == Family::Claude {
        return Ok(crate::bridge::mark_claude_tab(s.id, msg));
    }
    Ok(None)
}

/// A remote session's paths in the call's arguments, mapped to the host's (a path outside
/// every prefix passes unchanged, logged once per session).
fn map_paths(s: &Session, msg: &mut Map<String, Value>) {
    let Some(map) = s.map() else {
        return;
    };
    let Some(args) = msg.get_mut("params").and_then(|p| p.get_mut("arguments")) else {
        return;
    };
    map.map_json(args, true);
    if let Some(p) = map.first_unmapped(args, true) {
        if !s
            .unmapped_said
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!(session = s.id, path = %p, "a path outside every [[remote]] prefix passes through unchanged (logged once per session)");
        }
    }
}
