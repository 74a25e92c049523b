//! What the hub answers: one frame in, at most one frame out.
//!
//! Messages are `{type, requestId, sourceClientId, version, method, params}`. The hub answers
//! `request`s: `initialize` (the newer Codex sends it first and takes `result.clientId`) and
//! `ide-context` (the editor `params.workspaceRoot` routes to, as every session is routed;
//! no editor: an empty context, at once). A `client-discovery-request` (a hub asks its
//! clients whether one handles a request) is answered as a provider would. Other versions and
//! methods are refused with `resultType: "error"` and one log line; broadcasts and responses
//! need no answer.

use super::context;
use crate::registry::explain::RouteDecision;
use crate::registry::Registry;
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The only protocol version Codex 0.171 (and the repository's newer code) sends.
pub(super) const VERSION: u64 = 0;

/// The id the hub answers as (`handledByClientId`) and calls itself in logs.
pub(super) const HUB_ID: &str = "pi-ide-broker";

/// How long an editor may take to list its open tabs before the context goes without them
/// (Codex waits 6 s for the whole answer).
pub(super) const TABS_WAIT: Duration = Duration::from_millis(1000);

/// Client ids handed out by `initialize`, unique in this daemon.
static CLIENTS: AtomicU64 = AtomicU64::new(1);

/// The answer to one frame, `None` when it needs none (a broadcast, a response, garbage).
pub(super) async fn answer(reg: &Registry, frame: &[u8]) -> Option<Value> {
    let msg: Map<String, Value> = match serde_json::from_slice(frame) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, bytes = frame.len(), "codex hub: a frame that is not a JSON object; ignored");
            return None;
        }
    };
    match msg.get("type").and_then(Value::as_str) {
        Some("request") => request(reg, &msg).await,
        Some("client-discovery-request") => Some(discovery(&msg)),
        Some("broadcast" | "response" | "client-discovery-response") => None,
        other => {
            tracing::warn!(r#type = ?other, "codex hub: a message of no type the hub knows; ignored");
            None
        }
    }
}

async fn request(reg: &Registry, msg: &Map<String, Value>) -> Option<Value> {
    let Some(id) = msg.get("requestId").filter(|v| !v.is_null()).cloned() else {
        tracing::warn!("codex hub: a request without a requestId; ignored");
        return None;
    };
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    let version = msg.get("version").and_then(Value::as_u64);
    if version != Some(VERSION) {
        tracing::warn!(method, version = ?msg.get("version"), "codex hub: a request of a protocol version this broker does not speak (it speaks 0); refused");
        return Some(error(&id, method, "unsupported-version"));
    }
    match method {
        "initialize" => {
            let n = CLIENTS.fetch_add(1, Ordering::Relaxed);
            let client = format!("{HUB_ID}-client-{}-{n}", std::process::id());
            Some(success(&id, method, json!({"clientId": client})))
        }
        "ide-context" => {
            let Some(root) = msg
                .get("params")
                .and_then(|p| p.get("workspaceRoot"))
                .and_then(Value::as_str)
            else {
                tracing::warn!("codex hub: ide-context without params.workspaceRoot; refused");
                return Some(error(&id, method, "invalid-params"));
            };
            let started = Instant::now();
            let ctx = ide_context(reg, root).await;
            tracing::debug!(
                workspace = root,
                took_us = started.elapsed().as_micros() as u64,
                "codex hub: ide-context answered"
            );
            Some(success(&id, method, json!({"ideContext": ctx})))
        }
        other => {
            tracing::warn!(method = other, "codex hub: a method the broker does not serve (it serves initialize and ide-context); refused");
            Some(error(&id, other, "no-client-found"))
        }
    }
}

/// A hub asks whether this provider handles `request`: only `ide-context` of version 0.
fn discovery(msg: &Map<String, Value>) -> Value {
    let req = msg.get("request");
    let can = req.and_then(|r| r.get("method")).and_then(Value::as_str) == Some("ide-context")
        && req.and_then(|r| r.get("version")).and_then(Value::as_u64) == Some(VERSION);
    json!({
        "type": "client-discovery-response",
        "requestId": msg.get("requestId").cloned().unwrap_or(Value::Null),
        "response": {"canHandle": can},
    })
}

fn success(id: &Value, method: &str, result: Value) -> Value {
    json!({"type": "response", "requestId": id, "resultType": "success", "method": method,
           "handledByClientId": HUB_ID, "result": result})
}

fn error(id: &Value, method: &str, code: &str) -> Value {
    json!({"type": "response", "requestId": id, "resultType": "error", "method": method,
           "error": code})
}

/// The context of the editor `workspace_root` routes to (the same rules as a session's, with
/// no sticky key: Codex sends none); an empty one when none is chosen.
pub async fn ide_context(reg: &Registry, workspace_root: &str) -> Value {
    let id = match reg.explain_route(workspace_root, None).decision {
        RouteDecision::Editor(id) => id,
        RouteDecision::None(_) => return context::empty(),
        RouteDecision::Ambiguous(ids) => {
            tracing::info!(workspace = workspace_root, editors = ?ids, "codex hub: several editors match equally; no context until you move the cursor in one");
            return context::empty();
        }
    };
    let Some(editor) = reg.editor(&id) else {
        return context::empty();
    };
    let tabs = open_tabs(&editor).await;
    context::ide_context(workspace_root, editor.last_selection().as_deref(), &tabs)
}

/// The editor's open tabs, asked of its open-editors tool when its link is up (a `taken`
/// editor is not dialled for them), within [`TABS_WAIT`]; none otherwise.
async fn open_tabs(editor: &crate::editor::Editor) -> Vec<String> {
    if !editor.usable() {
        return Vec::new();
    }
    let names = editor.tool_names().unwrap_or_default();
    let Some(tool) = context::TAB_TOOLS
        .iter()
        .find(|t| names.iter().any(|n| n == *t))
    else {
        return Vec::new();
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut msg = Map::new();
    msg.insert("jsonrpc".into(), "2.0".into());
    msg.insert("method".into(), "tools/call".into());
    msg.insert("params".into(), json!({"name": tool, "arguments": {}}));
    let pending = crate::editor::Pending {
        owner: crate::editor::Owner::Internal(tx),
        method: "tools/call".into(),
        tool: Some(crate::protocol::family::tool_label(tool)),
        tab_name: None,
        started: Instant::now(),
        deadline: None,
        bridge: None,
        map: None,
    };
    let Ok(uid) = editor.send_request(msg, pending) else {
        return Vec::new();
    };
    match tokio::time::timeout(TABS_WAIT, rx).await {
        Ok(Ok(answer)) => context::tab_paths(tool, &answer),
        _ => {
            editor.forget_pending(uid);
            tracing::info!(editor = %editor.id, tool, "codex hub: the editor did not list its open tabs in time; the context goes without them");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> std::sync::Arc<Registry> {
        let dir = tempfile::tempdir().unwrap();
        let config = std::sync::Arc::new(crate::sys::config::Config::default());
        let state = crate::registry::state::StateStore::load(&dir.path().join("state"));
        Registry::new(
            config,
            state,
            dir.path().join("sock"),
            tokio_util::sync::CancellationToken::new(),
        )
    }

    async fn ask(reg: &Registry, v: Value) -> Option<Value> {
        answer(reg, v.to_string().as_bytes()).await
    }

    /// Codex 0.171's request with no editor open: a success with an empty context, which
    /// Codex renders as no prefix at all.
    #[tokio::test]
    async fn ide_context_with_no_editor_is_an_empty_success() {
        let reg = registry();
        let a = ask(
            &reg,
            json!({"type": "request", "requestId": "r1", "sourceClientId": "codex-tui",
            "version": 0, "method": "ide-context", "params": {"workspaceRoot": "/repo"}}),
        )
        .await
        .unwrap();
        assert_eq!(a["type"], "response");
        assert_eq!(a["requestId"], "r1");
        assert_eq!(a["resultType"], "success");
        assert_eq!(a["result"]["ideContext"], context::empty());
    }

    /// The newer Codex's `initialize`: a success carrying `result.clientId`, fresh each time.
    #[tokio::test]
    async fn initialize_hands_out_a_client_id() {
        let reg = registry();
        let init = json!({"type": "request", "requestId": "i", "sourceClientId": "initializing-client",
            "version": 0, "method": "initialize", "params": {"clientType": "desktop"}});
        let a = ask(&reg, init.clone()).await.unwrap();
        let b = ask(&reg, init).await.unwrap();
        assert_eq!(a["resultType"], "success");
        assert!(a["result"]["clientId"]
            .as_str()
            .is_some_and(|c| !c.is_empty()));
        assert_ne!(a["result"]["clientId"], b["result"]["clientId"]);
    }

    /// Another version, another method, a missing root: refused in the protocol's error shape
    /// (`resultType: "error"`, `error` a string), with the request's id.
    #[tokio::test]
    async fn unknown_versions_and_methods_are_refused_in_the_error_shape() {
        let reg = registry();
        let cases = [
            (
                json!({"type": "request", "requestId": 7, "version": 1, "method": "ide-context", "params": {"workspaceRoot": "/"}}),
                "unsupported-version",
            ),
            (
                json!({"type": "request", "requestId": 7, "version": 0, "method": "thread-follower-start-turn"}),
                "no-client-found",
            ),
            (
                json!({"type": "request", "requestId": 7, "method": "ide-context"}),
                "unsupported-version",
            ),
            (
                json!({"type": "request", "requestId": 7, "version": 0, "method": "ide-context", "params": {}}),
                "invalid-params",
            ),
        ];
        for (req, code) in cases {
            let a = ask(&reg, req.clone()).await.unwrap();
            assert_eq!(a["resultType"], "error", "{req}");
            assert_eq!(a["error"], code, "{req}");
            assert_eq!(a["requestId"], 7);
        }
    }

    /// Garbage, a request without an id, broadcasts and responses: no answer, no panic.
    #[tokio::test]
    async fn garbage_and_one_way_messages_get_no_answer() {
        let reg = registry();
        for frame in [
            &b"not json"[..],
            b"[1,2]",
            b"{}",
            b"{\"type\":\"request\",\"method\":\"ide-context\",\"version\":0}",
            b"{\"type\":\"broadcast\",\"method\":\"client-status-changed\"}",
            b"{\"type\":\"response\",\"requestId\":\"x\"}",
            b"{\"type\":42}",
        ] {
            assert!(
                answer(&reg, frame).await.is_none(),
                "{}",
                String::from_utf8_lossy(frame)
            );
        }
    }

    /// A hub's discovery question is answered as a provider: yes for ide-context v0 only.
    #[tokio::test]
    async fn discovery_says_which_requests_the_broker_handles() {
        let reg = registry();
        let ask_for = |method: &str, version: u64| {
            json!({"type": "client-discovery-request", "requestId": "d",
                   "request": {"type": "request", "method": method, "version": version}})
        };
        let yes = ask(&reg, ask_for("ide-context", 0)).await.unwrap();
        assert_eq!(
            yes,
            json!({"type": "client-discovery-response", "requestId": "d", "response": {"canHandle": true}})
        );
        let no = ask(&reg, ask_for("thread-follower-start-turn", 0))
            .await
            .unwrap();
        assert_eq!(no["response"]["canHandle"], false);
        let later = ask(&reg, ask_for("ide-context", 1)).await.unwrap();
        assert_eq!(later["response"]["canHandle"], false);
    }
}
