//! What an editor sends: answers to their owners, notifications, editor-initiated requests.
//!
//! Answers delivered to their owners (the hot path borrows the result bytes), notifications to
//! sessions, editor-initiated requests to one session.

use super::handle::*;
use super::Editor;
use super::LinkHost;
use crate::protocol::jsonrpc::{self, Incoming};

use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A frame from the editor with its paths as the broker keeps them: a Windows editor seen
/// from WSL has them mapped before anything reads the frame; any other's is borrowed as is.
fn from_wire<'t>(editor: &Editor, text: &'t str) -> Cow<'t, str> {
    match &editor.wsl {
        Some(w) => Cow::Owned(w.frame(text, true)),
        None => Cow::Borrowed(text),
    }
}

/// Routes one frame from the editor: answers to their owners, notifications to sessions,
/// editor-initiated requests to one session.
pub fn handle_editor_frame(editor: &Arc<Editor>, host: &dyn LinkHost, text: &str) {
    let text = from_wire(editor, text);
    let text = text.as_ref();
    if fast_reply(editor, text).is_some() {
        return;
    }
    let incoming = match jsonrpc::classify(text) {
        Ok(i) => i,
        Err(r) => {
            tracing::warn!(editor = %editor.id, error = %r.message, "editor sent an invalid message; ignored");
            return;
        }
    };
    match incoming {
        Incoming::Response { id, msg } => deliver_answer(editor, &id, msg),
        Incoming::Notification { method, mut msg } => match method.as_str() {
            "selection_changed" => {
                editor.focus.store(host.stamp(), Ordering::Relaxed);
                let text = absolute_paths(editor, &mut msg).unwrap_or_else(|| text.to_string());
                editor.selection.send_replace(Some(Arc::from(text)));
            }
            "at_mentioned" => {
                let text = absolute_paths(editor, &mut msg).unwrap_or_else(|| text.to_string());
                host.broadcast(editor, &text);
            }
            "request_cancelled" => {
                let key = msg
                    .get("params")
                    .and_then(|p| p.get("id"))
                    .map(Value::to_string);
                if let Some((_, d)) = key.and_then(|k| editor.delegated.remove(&k)) {
                    host.cancel_delegated(editor, &d);
                }
            }
            _ => host.broadcast(editor, text),
        },
        // The editor's own liveness check (JetBrains pings every 5 s and drops a client that
        // has not answered within 3 s): answered here by the link, never handed to a session.
        Incoming::Request { id, method, .. } if method == "ping" => {
            let _ = editor.send_raw(jsonrpc::result(&id, json!({})));
        }
        Incoming::Request { id, method, msg } => {
            if !host.delegate(editor, &id, msg) {
                tracing::info!(editor = %editor.id, %method, "editor request with no session attached; answered with an error");
                let _ = editor.send_raw(jsonrpc::error(
                    &id,
                    jsonrpc::SERVER_ERROR,
                    "No agent session is attached to this editor",
                ));
            }
        }
    }
}

/// An answer to a request of ours: bridged back to the session's family, its paths mapped
/// back for a remote session, and handed to its owner; an answer nobody waits for is dropped.
fn deliver_answer(editor: &Editor, id: &Value, mut msg: Map<String, Value>) {
    let Some(p) = id
        .as_u64()
        .and_then(|uid| editor.pending.remove(&uid))
        .map(|(_, p)| p)
    else {
        tracing::debug!(editor = %editor.id, %id, "answer to no pending request (late or cancelled)");
        return;
    };
    if p.is_diff() {
        editor.diff_answered(&p);
    }
    if let Some(b) = &p.bridge {
        if let Some(crate::protocol::bridge::Followup::CloseTab(tab)) =
            crate::protocol::bridge::inbound(b, &mut msg)
        {
            let _ = editor.close_tab(&tab);
        }
    }
    if let (Some(m), Some(result)) = (&p.map, msg.get_mut("result")) {
        m.map_result_texts(result, false);
    }
    match p.owner {
        Owner::Session { outbox, id, .. } => {
            msg.insert("id".into(), id.into_value());
            outbox.deliver(Value::Object(msg).to_string());
        }
        Owner::Internal(tx) => {
            let _ = tx.send(msg);
        }
        Owner::Discard => {}
    }
}

/// claudecode sends `at_mentioned` (and could send selections) with `filePath` relative to
/// its cwd, its first workspace folder: made absolute, since a session's cwd differs. Returns
/// the rewritten frame, or `None` when the path was absolute already.
fn absolute_paths(editor: &Editor, msg: &mut Map<String, Value>) -> Option<String> {
    let params = msg.get_mut("params")?.as_object_mut()?;
    let path = params.get("filePath")?.as_str()?;
    if path.is_empty() || crate::protocol::winpath::is_absolute(path) {
        return None;
    }
    let base = editor.lockfile().workspace_folders.first()?.clone();
    let mut abs = std::path::PathBuf::from(base)
        .join(path)
        .display()
        .to_string();
    if path.ends_with('/') && !abs.ends_with('/') {
        abs.push('/'); // a directory keeps its trailing slash
    }
    params.insert("filePath".into(), Value::String(abs));
    Some(Value::Object(std::mem::take(msg)).to_string())
}

/// The hot path: an answer for a session of the editor's own family goes back with the
/// session's id and the editor's `result`/`error` bytes untouched, without building a tree.
/// `Some(())` when handled, `None` when the slow path must look at it.
fn fast_reply(editor: &Editor, text: &str) -> Option<()> {
    let [id, method, result, error] =
        crate::wire::jsonscan::members(text, ["id", "method", "result", "error"])?;
    if method.is_some() {
        return None;
    }
    let uid = crate::wire::jsonscan::plain_u64(id?)?;
    let (key, body) = match (result, error) {
        (Some(r), None) => ("result", r),
        (None, Some(e)) => ("error", e),
        _ => return None,
    };
    let (_, p) = editor.pending.remove_if(&uid, |_, p| {
        matches!(p.owner, Owner::Session { .. }) && p.bridge.is_none() && p.map.is_none()
    })?;
    if p.is_diff() {
        editor.diff_answered(&p);
    }
    if let Owner::Session { outbox, id, .. } = p.owner {
        // The id's JSON text, borrowed where it can be: the answer is written from its parts
        // (the editor's result bytes among them) without being assembled.
        let plain = |s: &str| !s.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20);
        let mut digits = itoa::Buffer::new();
        let (quote, id_text) = match &id {
            jsonrpc::ClientId::Plain(n) => ("", Cow::Borrowed(digits.format(*n))),
            jsonrpc::ClientId::Json(Value::Number(n)) => ("", Cow::Borrowed(n.as_str())),
            jsonrpc::ClientId::Json(Value::String(s)) if plain(s) => {
                ("\"", Cow::Borrowed(s.as_str()))
            }
            jsonrpc::ClientId::Json(other) => ("", Cow::Owned(other.to_string())),
        };
        const HEAD: &str = "{\"jsonrpc\":\"2.0\",\"id\":";
        outbox.deliver_parts(&[HEAD, quote, &id_text, quote, ",\"", key, "\":", body, "}"]);
    }
    Some(())
}
