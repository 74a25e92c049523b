//! One Copilot CLI MCP session as a broker session: `session::run` (door `copilot`, pinned to
//! its editor, pi family) on one end of an in-process WebSocket, this adapter on the other.
//!
//! A tool call of the HTTP side is one `tools/call` to the session (`openDiff`,
//! `getDiagnostics`, `close_tab`), its answer handed back; the editor's `selection_changed`
//! is kept (for `get_selection`) and pushed on the session's event stream. `close_diff`
//! answers the pending `open_diff` itself (`REJECTED`, `closed_via_tool`): Copilot CLI never
//! cancels it.

use super::tools;
use crate::frontdoor::mcp_http::events::{Backlog, Events};
use crate::frontdoor::mcp_http::Body;
use crate::frontdoor::plugin::{SessionAdapter, SessionLink};
use crate::platform::sync::lock;
use crate::protocol::family::Family;
use crate::protocol::handshake::{InitializeParams, INITIALIZE};
use crate::protocol::jsonrpc;
use crate::registry::Registry;
use crate::session::Intro;
use hyper::Response;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

/// Notifications held for a session whose event stream is not open: only the last selection
/// matters (the only notification Copilot CLI is sent).
const BACKLOG: Backlog = Backlog {
    max: 64,
    latest_only: &[SELECTION_CHANGED],
};

/// The editor's selection, pushed to Copilot CLI under its own name.
const SELECTION_CHANGED: &str = "selection_changed";

/// A stateless (2026-07-28) session, which has no event stream and no `DELETE`, ends after
/// this long with no request in flight.
pub(super) const STATELESS_IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// The id of the `ping` the adapter sends once attached: its answer comes behind the
/// editor's selection replayed at attach, so the session is [`McpSession::ready`] then.
const READY_ID: &str = "ready";

/// How the editor answered a call made for the HTTP side.
pub(super) enum Answer {
    /// The editor's JSON-RPC answer (`result` or `error`).
    Editor(Value),
    /// `close_diff` closed the diff before the editor answered.
    Closed,
}

/// What the HTTP side asks of a session.
pub(super) enum Command {
    /// Call the editor's `tool` with `args`; `tab` names a diff `close_diff` may close.
    Call {
        tool: &'static str,
        args: Value,
        tab: Option<String>,
        reply: oneshot::Sender<Answer>,
    },
    /// Close the diff `tab`; answered whether it was already closed.
    CloseDiff {
        tab: String,
        reply: oneshot::Sender<bool>,
    },
}

/// A live Copilot MCP session, as the HTTP side holds it.
pub(super) struct McpSession {
    /// The `mcp-session-id`.
    pub id: String,
    cmds: mpsc::UnboundedSender<Command>,
    events: Arc<Events>,
    selection: Mutex<Option<Value>>,
    /// Fires when the session is over (DELETE, stream gone, editor gone, broker stopping).
    pub ended: CancellationToken,
    /// Fires once attached to its editor with the editor's selection replayed.
    pub ready: CancellationToken,
    /// Requests in flight, and when the last one ended (a stateless session's idle clock).
    uses: Mutex<(usize, std::time::Instant)>,
    tracker: tokio_util::task::TaskTracker,
}

/// A request in flight on a session (see [`McpSession::hold`]).
pub(super) struct InUse(Arc<McpSession>);

impl Drop for InUse {
    fn drop(&mut self) {
        let mut u = lock(&self.0.uses);
        u.0 = u.0.saturating_sub(1);
        u.1 = std::time::Instant::now();
    }
}

impl McpSession {
    /// Starts a broker session pinned to `editor` (its cwd and, for an agent, its realm:
    /// `who`) and its adapter; `place` (the session cap) is held for its life; `stop` (the
    /// endpoint's) ends it. A 2025-era session ends when it has no event stream for
    /// `events::ABANDONED_AFTER`; a `stateless` one (2026-07-28: no stream) after [`STATELESS_IDLE`]
    /// with no request in flight.
    pub(super) fn start(
        reg: &Arc<Registry>,
        editor: &str,
        who: (String, Option<String>),
        place: OwnedSemaphorePermit,
        (stop, stateless): (&CancellationToken, bool),
    ) -> std::io::Result<Arc<McpSession>> {
        let id = crate::sys::secret::Token::generate()?.expose().to_string();
        let (cmds, cmd_rx) = mpsc::unbounded_channel();
        let ended = stop.child_token();
        let events = Events::new("Copilot CLI", BACKLOG, ended.clone(), reg.tracker.clone());
        let session = Arc::new(McpSession {
            id,
            cmds,
            events,
            selection: Mutex::new(None),
            ended,
            ready: CancellationToken::new(),
            uses: Mutex::new((0, std::time::Instant::now())),
            tracker: reg.tracker.clone(),
        });
        if stateless {
            session.end_when_idle();
        } else {
            session.events.end_if_abandoned();
        }
        let link = crate::frontdoor::plugin::open_session(reg, intro(editor, who));
        let adapter = Adapter {
            session: session.clone(),
            pending: HashMap::new(),
            next: 0,
        };
        reg.tracker.spawn(adapter.run(link, cmd_rx, place));
        Ok(session)
    }

    /// Hands a command to the adapter; false when the session is over.
    pub(super) fn command(&self, c: Command) -> bool {
        self.cmds.send(c).is_ok()
    }

    /// The editor's last selection, in Copilot's shape.
    pub(super) fn selection(&self) -> Option<Value> {
        lock(&self.selection).clone()
    }

    /// `GET /mcp`: the event stream (replacing an older one), what was held first.
    pub(super) fn stream(&self) -> Response<Body> {
        self.events.stream()
    }

    /// Counts a request in flight until the guard drops (a stateless session never ends under
    /// one: an `open_diff` may wait for the user for long).
    pub(super) fn hold(self: &Arc<Self>) -> InUse {
        lock(&self.uses).0 += 1;
        InUse(self.clone())
    }

    /// Ends the session once it has had no request in flight for [`STATELESS_IDLE`].
    fn end_when_idle(self: &Arc<Self>) {
        let session = self.clone();
        self.tracker.spawn(async move {
            loop {
                let wait = {
                    let u = lock(&session.uses);
                    match u.0 {
                        0 => STATELESS_IDLE.saturating_sub(u.1.elapsed()),
                        _ => STATELESS_IDLE,
                    }
                };
                if wait.is_zero() {
                    tracing::info!("a stateless Copilot CLI session has been idle for {STATELESS_IDLE:?}; ending it");
                    session.ended.cancel();
                    return;
                }
                tokio::select! {
                    _ = session.ended.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        });
    }
}

/// Pinned to `editor`, speaking the pi family (the bridge translates for Claude-family
/// editors); an agent's session carries its realm (`status` shows it as its origin).
fn intro(editor: &str, (cwd, realm): (String, Option<String>)) -> Intro {
    Intro {
        door: super::DOOR_ID,
        cwd,
        key: None,
        editor: Some(editor.to_string()),
        inherit: None,
        pinned: true,
        remote: None,
        family: Family::Pi,
        client: None,
        realm,
    }
}

/// A call in flight to the editor: who waits for it, and the diff it opened.
struct Pending {
    reply: oneshot::Sender<Answer>,
    tab: Option<String>,
}

struct Adapter {
    session: Arc<McpSession>,
    pending: HashMap<String, Pending>,
    next: u64,
}

impl Adapter {
    async fn run(
        mut self,
        link: SessionLink,
        cmds: mpsc::UnboundedReceiver<Command>,
        place: OwnedSemaphorePermit,
    ) {
        let hello =
            InitializeParams::broker("copilot-cli (pi-ide-broker copilot door)", "2025-03-26");
        let hello = jsonrpc::request(&json!("init"), INITIALIZE, hello.to_value());
        let ended = self.session.ended.clone();
        link.drive(&mut self, hello, cmds, &ended, "copilot").await;
        self.finish(place)
    }

    fn finish(self, place: OwnedSemaphorePermit) {
        self.session.ended.cancel();
        drop(place);
        tracing::debug!("copilot session adapter ended");
    }

    fn call(&mut self, tool: &str, args: Value) -> (String, String) {
        self.next += 1;
        let id = format!("c{}", self.next);
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": args}});
        (id, msg.to_string())
    }
}

impl SessionAdapter for Adapter {
    type Command = Command;

    fn on_command(&mut self, cmd: Command, out: &mut Vec<String>) {
        match cmd {
            Command::Call {
                tool,
                args,
                tab,
                reply,
            } => {
                let (id, msg) = self.call(tool, args);
                out.push(msg);
                self.pending.insert(id, Pending { reply, tab });
            }
            Command::CloseDiff { tab, reply } => {
                let open = self
                    .pending
                    .iter()
                    .find(|(_, p)| p.tab.as_deref() == Some(tab.as_str()))
                    .map(|(id, _)| id.clone());
                let already_closed = open.is_none();
                if let Some(p) = open.and_then(|id| self.pending.remove(&id)) {
                    let _ = p.reply.send(Answer::Closed);
                }
                let (_, msg) = self.call("close_tab", json!({"tab_name": tab}));
                out.push(msg);
                let _ = reply.send(already_closed);
            }
        }
    }

    /// A frame from the broker session: an answer, a notification, or an editor's request.
    fn on_session(&mut self, v: Value, out: &mut Vec<String>) {
        let method = v.get("method").and_then(Value::as_str);
        match (method, v.get("id")) {
            (None, Some(id)) if id == READY_ID => self.session.ready.cancel(),
            (Some(jsonrpc::broker::ATTACHED), None) => {
                out.push(jsonrpc::request(&json!(READY_ID), "ping", json!({})));
            }
            (None, Some(id)) => {
                if let Some(p) = id.as_str().and_then(|id| self.pending.remove(id)) {
                    let _ = p.reply.send(Answer::Editor(v));
                }
            }
            (Some(SELECTION_CHANGED), None) => {
                let Some(s) = v.get("params").and_then(tools::selection) else {
                    return;
                };
                *lock(&self.session.selection) = Some(s.clone());
                self.session.events.notify(SELECTION_CHANGED, s);
            }
            (Some(m), Some(id)) => {
                // Never routed here (the registry skips this door's sessions); answered if it comes.
                out.push(jsonrpc::error(
                    id,
                    jsonrpc::METHOD_NOT_FOUND,
                    &format!("Copilot CLI cannot answer {m}"),
                ));
            }
            _ => {} // broker/attached, broker/detached, progress
        }
    }
}
