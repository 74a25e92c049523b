//! One Copilot CLI MCP session as a broker session: `session::run` (door `copilot`, pinned to
//! its editor, pi dialect) on one end of an in-process WebSocket, this adapter on the other.
//!
//! A tool call of the HTTP side is one `tools/call` to the session (`openDiff`,
//! `getDiagnostics`, `close_tab`), its answer handed back; the editor's `selection_changed`
//! is kept (for `get_selection`) and pushed on the session's event stream. `close_diff`
//! answers the pending `open_diff` itself (`REJECTED`, `closed_via_tool`): Copilot CLI never
//! cancels it.

use super::tools;
use crate::frontdoor::plugin::SessionLink;
use crate::platform::sync::lock;
use crate::protocol::family::Family;
use crate::protocol::handshake::{InitializeParams, INITIALIZE};
use crate::protocol::jsonrpc;
use crate::registry::Registry;
use crate::session::Intro;
use crate::wire::wsframe::{Frame, Out};
use futures_util::SinkExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

/// Notifications held for a session whose event stream is not open (only the last
/// selection matters: older ones are dropped).
const MAX_BACKLOG: usize = 64;

/// A session with no event stream open this long is over: Copilot CLI sends no `DELETE`
/// when it dies or loses the lockfile, its stream closing is the only sign.
pub const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(3);

/// How the editor answered a call made for the HTTP side.
pub enum Answer {
    /// The editor's JSON-RPC answer (`result` or `error`).
    Editor(Value),
    /// `close_diff` closed the diff before the editor answered.
    Closed,
}

/// What the HTTP side asks of a session.
pub enum Command {
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

#[derive(Default)]
struct Notices {
    stream: Option<mpsc::Sender<String>>,
    backlog: Vec<String>,
    generation: u64,
}

/// A live Copilot MCP session, as the HTTP side holds it.
pub struct McpSession {
    /// The `mcp-session-id`.
    pub id: String,
    cmds: mpsc::UnboundedSender<Command>,
    notices: Mutex<Notices>,
    selection: Mutex<Option<Value>>,
    /// Fires when the session is over (DELETE, stream gone, editor gone, broker stopping).
    pub ended: CancellationToken,
    tracker: tokio_util::task::TaskTracker,
}

/// Held by an open event stream's body: its drop starts the [`ABANDONED_AFTER`] clock.
pub struct StreamGuard {
    session: Arc<McpSession>,
    generation: u64,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut n = lock(&self.session.notices);
        if n.generation == self.generation {
            n.stream = None;
            drop(n);
            self.session.end_if_abandoned();
        }
    }
}

impl McpSession {
    /// Starts a broker session pinned to `editor` (its cwd `cwd`) and its adapter; `place`
    /// (the session cap) is held for its life; `stop` (the endpoint's) ends it.
    pub fn start(
        reg: &Arc<Registry>,
        editor: &str,
        cwd: String,
        place: OwnedSemaphorePermit,
        stop: &CancellationToken,
    ) -> std::io::Result<Arc<McpSession>> {
        let id = crate::sys::secret::Token::generate()?.expose().to_string();
        let (cmds, cmd_rx) = mpsc::unbounded_channel();
        let session = Arc::new(McpSession {
            id,
            cmds,
            notices: Mutex::new(Notices::default()),
            selection: Mutex::new(None),
            ended: stop.child_token(),
            tracker: reg.tracker.clone(),
        });
        session.end_if_abandoned();
        let link = crate::frontdoor::plugin::open_session(reg, intro(editor, cwd));
        let adapter = Adapter {
            session: session.clone(),
            pending: HashMap::new(),
            next: 0,
        };
        reg.tracker.spawn(adapter.run(link, cmd_rx, place));
        Ok(session)
    }

    /// Hands a command to the adapter; false when the session is over.
    pub fn command(&self, c: Command) -> bool {
        self.cmds.send(c).is_ok()
    }

    /// The editor's last selection, in Copilot's shape.
    pub fn selection(&self) -> Option<Value> {
        lock(&self.selection).clone()
    }

    /// Opens the event stream (replacing an older one): what was held comes first.
    pub fn open_stream(self: &Arc<Self>) -> (mpsc::Receiver<String>, StreamGuard) {
        let (tx, rx) = mpsc::channel(MAX_BACKLOG * 4);
        let mut n = lock(&self.notices);
        for text in n.backlog.drain(..) {
            let _ = tx.try_send(text);
        }
        n.stream = Some(tx);
        n.generation += 1;
        let guard = StreamGuard {
            session: self.clone(),
            generation: n.generation,
        };
        (rx, guard)
    }

    /// Ends the session [`ABANDONED_AFTER`] from now unless an event stream is open by then.
    fn end_if_abandoned(self: &Arc<Self>) {
        let session = self.clone();
        let generation = lock(&self.notices).generation;
        self.tracker.spawn(async move {
            tokio::select! {
                _ = session.ended.cancelled() => return,
                _ = tokio::time::sleep(ABANDONED_AFTER) => {}
            }
            let n = lock(&session.notices);
            if n.stream.is_none() && n.generation == generation {
                drop(n);
                tracing::info!("a Copilot CLI session has had no event stream for {ABANDONED_AFTER:?} (the CLI exited?); ending it");
                session.ended.cancel();
            }
        });
    }

    /// Sends a notification on the event stream (held while none is open).
    fn notify(&self, method: &str, params: Value) {
        let text = json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string();
        let mut n = lock(&self.notices);
        if let Some(tx) = &n.stream {
            match tx.try_send(text) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(
                        "a Copilot CLI session stopped reading its event stream; ending it"
                    );
                    self.ended.cancel();
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(text)) => {
                    n.stream = None;
                    hold(&mut n.backlog, text);
                    return;
                }
            }
        }
        hold(&mut n.backlog, text);
    }
}

fn hold(backlog: &mut Vec<String>, text: String) {
    if backlog.len() >= MAX_BACKLOG {
        backlog.remove(0);
    }
    backlog.push(text);
}

/// Pinned to `editor`, speaking the pi dialect (the bridge translates for Claude-family
/// editors).
fn intro(editor: &str, cwd: String) -> Intro {
    Intro {
        door: super::DOOR_ID,
        cwd,
        key: None,
        editor: Some(editor.to_string()),
        inherit: None,
        pinned: true,
        remote: None,
        dialect: Family::Pi,
        client: None,
        realm: None,
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
        mut link: SessionLink,
        mut cmds: mpsc::UnboundedReceiver<Command>,
        place: OwnedSemaphorePermit,
    ) {
        let hello =
            InitializeParams::broker("copilot-cli (pi-ide-broker copilot door)", "2025-03-26");
        let mut out = vec![jsonrpc::request(
            &json!("init"),
            INITIALIZE,
            hello.to_value(),
        )];
        let mut pong: Option<Vec<u8>> = None;
        let ended = self.session.ended.clone();
        loop {
            let frames = pong
                .take()
                .map(Out::Pong)
                .into_iter()
                .chain(out.drain(..).map(Out::Text));
            for frame in frames.collect::<Vec<_>>() {
                if link.writer.send(frame).await.is_err() {
                    return self.finish(place);
                }
            }
            tokio::select! {
                biased;
                _ = ended.cancelled() => break,
                frame = link.reader.next() => match frame {
                    Ok(Some(Frame::Text(t))) => match serde_json::from_str::<Value>(t) {
                        Ok(v) => self.on_broker(v, &mut out),
                        Err(e) => tracing::warn!(error = %e, "copilot door: unreadable frame from its session"),
                    },
                    Ok(Some(Frame::Ping(p))) => pong = Some(p.to_vec()),
                    Ok(Some(Frame::Binary(_) | Frame::Pong(_))) => {}
                    Ok(Some(Frame::Close(_)) | None) | Err(_) => break,
                },
                Some(cmd) = cmds.recv() => self.on_command(cmd, &mut out),
            }
        }
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
    fn on_broker(&mut self, v: Value, out: &mut Vec<String>) {
        let method = v.get("method").and_then(Value::as_str);
        match (method, v.get("id")) {
            (None, Some(id)) => {
                if let Some(p) = id.as_str().and_then(|id| self.pending.remove(id)) {
                    let _ = p.reply.send(Answer::Editor(v));
                }
            }
            (Some("selection_changed"), None) => {
                let Some(s) = v.get("params").and_then(tools::selection) else {
                    return;
                };
                *lock(&self.session.selection) = Some(s.clone());
                self.session.notify("selection_changed", s);
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
