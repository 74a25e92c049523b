//! One Gemini CLI MCP session as a broker session: a `session::run` (door `gemini`, pinned to
//! its editor, pi family) on one end of an in-process WebSocket, and this adapter on the
//! other, translating Gemini's companion protocol to the broker's and back:
//! `openDiff` → the editor's blocking `openDiff` under the session's own tab name, its verdict
//! → `ide/diffAccepted`/`ide/diffRejected` (to this session only); `closeDiff` → `close_tab`;
//! `selection_changed` → `ide/contextUpdate`.
//!
//! Everything the broker does for a session comes with it: the successor of a restarted editor
//! is followed, a diff whose editor goes is answered `DIFF_REJECTED` at once, the selection is
//! replayed when the session starts, editor-initiated requests are never routed here.

use crate::frontdoor::mcp_http::events::{Backlog, Events};
use crate::frontdoor::mcp_http::Body;
use crate::frontdoor::plugin::{SessionAdapter, SessionLink};
use crate::protocol::family::Family;
use crate::protocol::handshake::{InitializeParams, INITIALIZE};
use crate::protocol::jsonrpc;
use crate::registry::Registry;
use crate::session::Intro;
use hyper::Response;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

/// Gemini CLI keeps 16 KiB of a selection; more is never sent.
pub(super) const MAX_SELECTED_TEXT: usize = 16 * 1024;
/// Gemini CLI keeps 10 open files.
const MAX_OPEN_FILES: usize = 10;
/// Notifications held for a session whose event stream is not open (yet, or again): only the
/// newest context update matters, every verdict is kept.
const BACKLOG: Backlog = Backlog {
    max: 1024,
    latest_only: &[CONTEXT_UPDATE],
};

/// What the HTTP side asks of a session.
pub(super) enum Command {
    /// Open a diff of `path` with `content` proposed (the verdict comes as a notification).
    OpenDiff { path: String, content: String },
    /// Close the diff of `path`; answered with the text proposed for it, if one was open.
    CloseDiff {
        path: String,
        suppress: bool,
        reply: oneshot::Sender<Option<String>>,
    },
}

/// A live Gemini MCP session, as the HTTP side holds it.
pub(super) struct McpSession {
    /// The `Mcp-Session-Id`.
    pub id: String,
    cmds: mpsc::UnboundedSender<Command>,
    events: Arc<Events>,
    /// Fires when the session is over (client's DELETE, editor gone, broker stopping; its event
    /// stream gone for `events::ABANDONED_AFTER`: Gemini CLI sends no `DELETE` when it exits).
    pub ended: CancellationToken,
}

impl McpSession {
    /// Starts a broker session pinned to `editor` and its adapter; `place` (the session cap)
    /// is held for its life.
    pub(super) fn start(
        reg: &Arc<Registry>,
        editor: &str,
        place: OwnedSemaphorePermit,
    ) -> std::io::Result<Arc<McpSession>> {
        let id = crate::sys::secret::Token::generate()?.expose().to_string();
        let (cmds, cmd_rx) = mpsc::unbounded_channel();
        let ended = reg.cancel.child_token();
        let events = Events::new("Gemini CLI", BACKLOG, ended.clone(), reg.tracker.clone());
        events.end_if_abandoned();
        let session = Arc::new(McpSession {
            id,
            cmds,
            events,
            ended,
        });
        let link = crate::frontdoor::plugin::open_session(reg, intro(reg, editor));
        let adapter = Adapter {
            session: session.clone(),
            diffs: HashMap::new(),
            next: 0,
            files: Vec::new(),
        };
        reg.tracker.spawn(adapter.run(link, cmd_rx, place));
        Ok(session)
    }

    /// Hands a command to the adapter; false when the session is over.
    pub(super) fn command(&self, c: Command) -> bool {
        self.cmds.send(c).is_ok()
    }

    /// `GET /mcp`: the event stream (replacing an older one), what was held first.
    pub(super) fn stream(&self) -> Response<Body> {
        self.events.stream()
    }
}

/// The editor's selection and open files, as Gemini CLI takes them.
const CONTEXT_UPDATE: &str = "ide/contextUpdate";

/// What the session starts with: pinned to `editor`, speaking the pi family (the bridge
/// translates for Claude-family editors), its cwd the editor's first folder.
fn intro(reg: &Registry, editor: &str) -> Intro {
    let cwd = reg
        .editor(editor)
        .and_then(|e| e.folders.first().map(|f| f.display().to_string()))
        .unwrap_or_else(|| "/".into());
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
        realm: None,
    }
}

/// A diff this session has open in the editor, by the id of its `openDiff` call.
struct Diff {
    path: String,
    tab: String,
    proposed: String,
    /// Its verdict is not told (a newer diff of the path replaced it, or `closeDiff` asked so).
    suppress: bool,
}

struct Adapter {
    session: Arc<McpSession>,
    diffs: HashMap<String, Diff>,
    next: u64,
    /// Recently focused files, oldest first: (path, Unix ms).
    files: Vec<(String, u64)>,
}

impl Adapter {
    async fn run(
        mut self,
        link: SessionLink,
        cmds: mpsc::UnboundedReceiver<Command>,
        place: OwnedSemaphorePermit,
    ) {
        let hello =
            InitializeParams::broker("gemini-cli (pi-ide-broker gemini door)", "2025-03-26");
        let hello = jsonrpc::request(&json!("init"), INITIALIZE, hello.to_value());
        let ended = self.session.ended.clone();
        link.drive(&mut self, hello, cmds, &ended, "gemini").await;
        self.finish(place)
    }

    fn finish(self, place: OwnedSemaphorePermit) {
        self.session.ended.cancel();
        drop(place);
        tracing::debug!("gemini session adapter ended");
    }

    fn mint(&mut self, kind: &str) -> String {
        self.next += 1;
        format!("{kind}{}", self.next)
    }

    fn live_diff(&mut self, path: &str) -> Option<&mut Diff> {
        self.diffs
            .values_mut()
            .find(|d| d.path == path && !d.suppress)
    }

    fn close_tab(&mut self, tab: &str) -> String {
        let call = self.mint("close-");
        tool_call(&call, "close_tab", json!({"tab_name": tab}))
    }

    fn on_verdict(&mut self, diff: Diff, answer: &Value, out: &mut Vec<String>) {
        let content = answer.pointer("/result/content");
        let saved = content
            .and_then(|c| c.get(0))
            .and_then(|c| c.get("text"))
            .and_then(Value::as_str)
            == Some("FILE_SAVED");
        let text = content
            .and_then(|c| c.get(1))
            .and_then(|c| c.get("text"))
            .and_then(Value::as_str);
        out.push(self.close_tab(&diff.tab));
        if diff.suppress {
            return;
        }
        match (saved, text) {
            (true, Some(text)) => self.session.events.notify(
                "ide/diffAccepted",
                json!({"filePath": diff.path, "content": text}),
            ),
            _ => self
                .session
                .events
                .notify("ide/diffRejected", json!({"filePath": diff.path})),
        }
    }

    /// `ide/contextUpdate` params for a `selection_changed`, or `None` for a virtual buffer
    /// (a diff's proposed side, an unnamed buffer).
    fn context_update(&mut self, params: Option<&Value>) -> Option<Value> {
        let p = params?;
        let path = p.get("filePath").and_then(Value::as_str)?;
        if !crate::protocol::winpath::is_absolute(path)
            || path.ends_with(" (proposed)")
            || path.ends_with(" [pi-proposed]")
        {
            return None;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.files.retain(|(f, _)| f != path);
        self.files.push((path.to_string(), now));
        if self.files.len() > MAX_OPEN_FILES {
            self.files.remove(0);
        }
        let at = |k: &str| {
            p.pointer(&format!("/selection/end/{k}"))
                .and_then(Value::as_u64)
                .unwrap_or(0)
                + 1
        };
        let mut active = json!({"path": path, "timestamp": now, "isActive": true,
            "cursor": {"line": at("line"), "character": at("character")}});
        let text = p.get("text").and_then(Value::as_str).unwrap_or("");
        if !text.is_empty() {
            active["selectedText"] = Value::String(cap(text, MAX_SELECTED_TEXT).to_string());
        }
        let mut open: Vec<Value> = vec![active];
        for (f, ts) in self.files.iter().rev().skip(1) {
            open.push(json!({"path": f, "timestamp": ts}));
        }
        Some(json!({"workspaceState": {"openFiles": open}}))
    }
}

impl SessionAdapter for Adapter {
    type Command = Command;

    fn on_command(&mut self, cmd: Command, out: &mut Vec<String>) {
        match cmd {
            Command::OpenDiff { path, content } => {
                // One diff per path: an older one is closed, its verdict not told (the CLI
                // waits on the newer one under the same path).
                if let Some(old) = self.live_diff(&path) {
                    old.suppress = true;
                    let tab = old.tab.clone();
                    out.push(self.close_tab(&tab));
                }
                let call = self.mint("diff-");
                let tab = format!("gemini:{}:{}", basename(&path), self.next);
                out.push(tool_call(
                    &call,
                    "openDiff",
                    json!({
                    "old_file_path": path, "new_file_path": path,
                    "new_file_contents": content, "tab_name": tab}),
                ));
                self.diffs.insert(
                    call,
                    Diff {
                        path,
                        tab,
                        proposed: content,
                        suppress: false,
                    },
                );
            }
            Command::CloseDiff {
                path,
                suppress,
                reply,
            } => {
                let found = self.live_diff(&path).map(|d| {
                    d.suppress |= suppress;
                    (d.tab.clone(), d.proposed.clone())
                });
                let text = found.map(|(tab, proposed)| {
                    out.push(self.close_tab(&tab));
                    proposed
                });
                let _ = reply.send(text);
            }
        }
    }

    /// A frame from the broker session: an answer, a notification, or an editor's request.
    fn on_session(&mut self, v: Value, out: &mut Vec<String>) {
        let method = v.get("method").and_then(Value::as_str);
        match (method, v.get("id")) {
            (None, Some(id)) => {
                let Some(diff) = id.as_str().and_then(|id| self.diffs.remove(id)) else {
                    return; // initialize, close_tab: nothing to tell
                };
                self.on_verdict(diff, &v, out);
            }
            (Some("selection_changed"), None) => {
                if let Some(params) = self.context_update(v.get("params")) {
                    self.session.events.notify(CONTEXT_UPDATE, params);
                }
            }
            (Some(m), Some(id)) => {
                // Never routed here (the registry skips gemini sessions); answered if it comes.
                out.push(json!({"jsonrpc": "2.0", "id": id, "error": {"code": crate::protocol::jsonrpc::METHOD_NOT_FOUND,
                    "message": format!("Gemini CLI cannot answer {m}")}}).to_string());
            }
            _ => {} // broker/attached, broker/detached, progress
        }
    }
}

fn tool_call(id: &str, name: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}})
        .to_string()
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The longest prefix of `text` within `max` bytes that ends on a character boundary.
pub(super) fn cap(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_is_capped_on_a_character_boundary() {
        assert_eq!(cap("abc", 16), "abc");
        let s = "é".repeat(10); // 2 bytes each
        assert_eq!(cap(&s, 5), "éé");
    }
}
