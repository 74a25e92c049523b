//! What a client sends: the hot path (no JSON tree) and the slow path, each to its editor.
//!
//! The hot path (`fast_forward`: a `tools/call` spliced upstream without a JSON tree), the slow
//! path (`on_client_text`: validated, bridged, path-mapped), and the calls' pending entries and
//! refusals.

use crate::editor::family::rules;
use crate::editor::{Editor, Owner, Pending};
use crate::platform::sync::lock;
use crate::protocol::handshake;
use crate::protocol::jsonrpc::{self, ClientId, Incoming};
use crate::registry::Registry;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use super::{cancel_request, Session};
use crate::registry::session::Progress;

/// The hot path: a well-formed `tools/call` of a local session to an editor of its own family
/// goes upstream with the client's params bytes spliced in, without building a JSON tree (a
/// multi-megabyte `openDiff` included). `false` when the slow path must handle it (anything
/// unusual: it validates, bridges, maps and answers errors).
pub(super) fn fast_forward(reg: &Arc<Registry>, s: &Arc<Session>, text: &str) -> bool {
    let Some(call) = FastCall::read(text) else {
        return false;
    };
    // A diff an ACP follower reviews takes the slow path (`forward`).
    if s.map().is_some()
        || (call.tool == "openDiff" && s.reviewers.load(std::sync::atomic::Ordering::Acquire) > 0)
    {
        return false;
    }
    let Some(editor) = current_editor(reg, s) else {
        return false;
    };
    if editor.family != s.family || rules(editor.family).rewrites_call(call.tool) {
        return false;
    }
    let (Some(tab_name), Some(id)) = (call.tab_name(), call.id()) else {
        return false;
    };
    s.touch(reg.stamp());
    // The id moves into the pending entry; the rare refusal below reads it again.
    let label = Some(crate::protocol::family::tool_label(call.tool));
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
pub(super) struct FastCall<'t> {
    id_text: &'t str,
    raw_params: &'t str,
    tool: &'t str,
    arguments: &'t str,
    meta: Option<&'t str>,
}

impl<'t> FastCall<'t> {
    fn read(text: &'t str) -> Option<Self> {
        use crate::wire::jsonscan::{members_in, plain_str};
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
        use crate::wire::jsonscan::{members, plain_str};
        if self.tool != "openDiff" {
            return Some(None);
        }
        let [t] = members(self.arguments, ["tab_name"])?;
        plain_str(t?).map(|t| Some(t.to_string()))
    }

    /// The client's id; the common ones without a parser: a plain string, or a plain integer
    /// (kept without an allocation).
    fn id(&self) -> Option<ClientId> {
        use crate::wire::jsonscan::{plain_str, plain_u64};
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
            .and_then(|m| crate::wire::jsonscan::members(m, ["progressToken"]))
            .and_then(|[t]| serde_json::from_str::<Value>(t?).ok())
            .filter(is_progress_token)
    }
}

/// The call as the editor gets it: our id, the client's params bytes spliced in. Allocated
/// once at its exact size: a `String` whose length is its capacity becomes the frame's bytes
/// without another allocation.
pub(super) fn call_frame(uid: u64, raw_params: &str) -> String {
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
pub(super) fn is_progress_token(token: &Value) -> bool {
    token.is_string() || token.is_number()
}

/// The `Pending` of a session's call: its answer goes back under `id`; a short tool gets the
/// short-tool deadline (a diff waits for the user as long as it takes); a remote session's
/// answer has its paths mapped back.
pub(super) fn call_pending(
    reg: &Registry,
    s: &Session,
    id: ClientId,
    method: Cow<'static, str>,
    tool: Option<Cow<'static, str>>,
    tab_name: Option<String>,
    bridge: Option<crate::protocol::bridge::Bridge>,
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
pub(super) fn settle_call(
    s: &Session,
    editor: &Editor,
    sent: Result<u64, crate::editor::Error>,
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
pub(super) fn refuse_call(s: &Session, id: &Value, tab_name: Option<&str>, why: String) {
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
pub(super) fn on_client_text(reg: &Arc<Registry>, s: &Arc<Session>, text: &str) -> bool {
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
                handshake::INITIALIZED => {}
                jsonrpc::CANCELLED => cancel_request(reg, s, &msg),
                jsonrpc::follow::UPDATE => {
                    s.touch(reg.stamp());
                    super::follow::fan_out(s, text);
                }
                _ => {
                    if let Some(e) = current_editor(reg, s) {
                        let _ = e.send_raw(Value::Object(msg).to_string());
                    }
                }
            }
            false
        }
        Ok(Incoming::Response { id, msg }) => {
            if super::follow::is_forwarded(&id) {
                super::follow::answer_forwarded(s, &id, msg);
            } else {
                reg.answer_delegated(s, id, msg);
            }
            false
        }
    }
}

pub(super) fn current_editor(reg: &Registry, s: &Session) -> Option<Arc<Editor>> {
    let id = s.editor_id()?;
    reg.editor(&id)
}

pub(super) fn on_request(
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
        handshake::INITIALIZE => {
            let cached = current_editor(reg, s).and_then(|e| e.link_info().initialize);
            let result = cached.unwrap_or_else(|| {
                let asked = handshake::InitializeParams::read(msg.get("params"));
                let version = asked.protocol_version.as_deref();
                handshake::InitializeResult::broker(
                    version.unwrap_or(handshake::PROTOCOL_VERSION),
                    true,
                )
                .to_value()
            });
            reply(jsonrpc::result(&id, result));
        }
        "tools/list" => {
            let editor = current_editor(reg, s);
            let mut tools = editor.as_ref().and_then(|e| e.link_info().tools);
            if let (Some(e), Some(Value::Array(list))) =
                (&editor, tools.as_mut().and_then(|t| t.get_mut("tools")))
            {
                if e.family != s.family {
                    let names = e.tool_names().unwrap_or_default();
                    list.extend(crate::protocol::bridge::extra_tools(
                        s.family, e.family, &names,
                    ));
                }
            }
            reply(jsonrpc::result(
                &id,
                tools.unwrap_or_else(|| json!({"tools": []})),
            ));
        }
        "ping" => reply(jsonrpc::result(&id, json!({}))),
        jsonrpc::broker::EDITORS => reply(jsonrpc::result(
            &id,
            serde_json::to_value(reg.editors_for(s)).unwrap_or(Value::Null),
        )),
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
                Err(e) => reply(jsonrpc::error(&id, jsonrpc::INVALID_PARAMS, &e.to_string())),
            }
        }
        jsonrpc::follow::READ => super::follow::read(s, id, msg.get("params")),
        jsonrpc::broker::DETACH => {
            reg.detach(s, "detached by client", true);
            reply(jsonrpc::result(&id, json!({})));
        }
        _ => forward(reg, s, id, method, msg),
    }
}

pub(super) fn forward(
    reg: &Arc<Registry>,
    s: &Arc<Session>,
    id: Value,
    method: String,
    msg: Map<String, Value>,
) {
    let tool = jsonrpc::tool_name(&msg).map(crate::protocol::family::tool_label);
    let tab_name = jsonrpc::diff_tab(&msg);
    if let (Some(tab), Some(f)) = (&tab_name, s.reviewer()) {
        s.touch(reg.stamp());
        super::follow::review(s, &f, id, tab.clone(), msg.get("params"));
        return;
    }
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

/// A `tools/call` across families: answered here when the editor's own state answers it (a
/// Claude client's selection or workspace call on a pi-ide editor), else rewritten for the
/// editor with the bridge that turns its answer back; the error when it cannot be. A Claude
/// editor's diff tab is marked as the session's. `Err` holds the answer to send the client
/// (a result or an error, with its `id`) instead of a call to the editor.
pub(super) fn bridge_call(
    s: &Session,
    editor: &Arc<Editor>,
    id: &Value,
    tool: Option<&str>,
    msg: &mut Map<String, Value>,
) -> Result<Option<crate::protocol::bridge::Bridge>, String> {
    let local = crate::protocol::bridge::answers_locally(s.family, editor.family);
    if let (true, Some(t)) = (local, tool) {
        let selection = editor.last_selection();
        let folders = editor.lockfile().workspace_folders;
        let names = editor.tool_names().unwrap_or_default();
        if let Some(result) =
            crate::protocol::bridge::answer_locally(t, &names, selection.as_deref(), &folders)
        {
            return Err(jsonrpc::result(id, result));
        }
    }
    if editor.family != s.family {
        let tools = editor.tool_names();
        let d = (s.family, editor.family);
        return crate::protocol::bridge::outbound(
            d.0,
            d.1,
            s.id,
            &editor.id,
            tools.as_deref(),
            msg,
        )
        .map_err(|(code, message)| jsonrpc::error(id, code, &message));
    }
    Ok(rules(editor.family).rewrite_call(s.id, msg))
}

/// A remote session's paths in the call's arguments, mapped to the host's (a path outside
/// every prefix passes unchanged, logged once per session).
pub(super) fn map_paths(s: &Session, msg: &mut Map<String, Value>) {
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
