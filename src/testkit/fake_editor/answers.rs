//! What the fake editor answers: its tool list (each family's names and schemas) and each
//! request and tool call, as the real editors were recorded answering (tests/fixtures/recorded_editors.json).

use crate::platform::sync::lock;
use crate::protocol::family::Family;
use crate::protocol::jsonrpc::{self, Incoming};

use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

use super::{Event, Options, Shared};

pub(super) fn tools(opts: &Options) -> Value {
    let family = opts.family;
    let mut names = vec!["openDiff", "close_tab", "getDiagnostics", "echo", "slow"];
    names.extend(match family {
        Family::Claude if opts.jetbrains => &[
            "openFile",
            "open_files",
            "get_all_opened_file_paths",
            "reformat_file",
        ][..],
        Family::Pi => &["getOpenEditorTabs"],
        Family::Claude => &["getOpenEditors"],
    });
    json!({"tools": names.iter().map(|n| json!({"name": n, "description": n, "inputSchema": schema_of(family, n)})).collect::<Vec<_>>()})
}

/// Input schemas as the real editors write them: pi-ide.nvim is Lua, where an empty table
/// serialises as `[]` (its `getOpenEditorTabs` really has `"properties": []`).
pub(super) fn schema_of(family: Family, tool: &str) -> Value {
    match (family, tool) {
        (Family::Pi, "getOpenEditorTabs") => json!({"type": "object", "properties": []}),
        (Family::Pi, "echo") => json!({"properties": {"x": {"type": "string"}}, "required": {}}),
        (Family::Pi, "slow") => json!([]),
        _ => json!({"type": "object"}),
    }
}

/// Spins for `us` microseconds (CPU time, as real work would take).
pub fn burn(us: u64) {
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_micros(us) {
        std::hint::spin_loop();
    }
}

pub(super) fn text_result(text: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": text.into()}]})
}

pub(super) fn handle(shared: &Shared, conn: u64, text: &str) -> Option<String> {
    let (id, method, msg) = match jsonrpc::classify(text) {
        Ok(Incoming::Request { id, method, msg }) => (id, method, msg),
        Ok(Incoming::Notification { method, .. }) => {
            let _ = shared.events.send(Event::Notified { method });
            return None;
        }
        Ok(Incoming::Response { msg, .. }) => {
            let _ = shared.events.send(Event::Answered {
                msg: Value::Object(msg),
            });
            return None;
        }
        // As recorded: a parse error has no `id` at all, and says "Invalid JSON".
        Err(r) if r.code == jsonrpc::PARSE_ERROR => {
            let error = json!({"code": r.code, "message": "Parse error", "data": "Invalid JSON"});
            return Some(json!({"jsonrpc": "2.0", "error": error}).to_string());
        }
        Err(r) if r.code == jsonrpc::INVALID_REQUEST => {
            let error = json!({"code": r.code, "message": "Invalid Request"});
            return Some(json!({"jsonrpc": "2.0", "id": r.id, "error": error}).to_string());
        }
        Err(r) => return Some(jsonrpc::rejection(&r)),
    };
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    let tool = params.get("name").and_then(Value::as_str).map(String::from);
    let args = params.get("arguments").cloned().unwrap_or(Value::Null);
    // Reported after the call took effect (a diff is registered before anyone hears of it).
    let event = Event::Call {
        conn,
        method: method.clone(),
        tool: tool.clone(),
        id: id.clone(),
        args: if method == "tools/call" {
            args.clone()
        } else {
            params.clone()
        },
    };
    let reply = answer(shared, conn, &id, &method, tool.as_deref(), &args);
    let _ = shared.events.send(event);
    reply
}

pub(super) fn answer(
    shared: &Shared,
    conn: u64,
    id: &Value,
    method: &str,
    tool: Option<&str>,
    args: &Value,
) -> Option<String> {
    let server = match shared.opts.family {
        Family::Pi => "pi-ide-neovim",
        Family::Claude => "claudecode-neovim",
    };
    // As recorded (tests/fixtures/recorded_editors.json, held by tests/suite/fakes.rs).
    let claude = shared.opts.family == Family::Claude;
    let result = match method {
        "initialize" if claude => json!({
            "protocolVersion": "2024-11-05",
            "capabilities": {"logging": {}, "tools": {"listChanged": true}, "prompts": {"listChanged": true}},
            "serverInfo": {"name": server, "version": "0.2.0"},
        }),
        "initialize" => json!({
            "protocolVersion": "2024-11-05",
            "capabilities": {"logging": {}, "tools": {"listChanged": true}},
            "serverInfo": {"name": server, "version": "0.1.0"},
        }),
        "prompts/list" if claude => json!({"prompts": []}),
        "tools/list" => tools(&shared.opts),
        "tools/call" => return call_tool(shared, conn, id, tool.unwrap_or(""), args),
        other => {
            let error = json!({"code": jsonrpc::METHOD_NOT_FOUND, "message": "Method not found", "data": format!("Unknown method: {other}")});
            return Some(json!({"jsonrpc": "2.0", "id": id, "error": error}).to_string());
        }
    };
    Some(jsonrpc::result(id, result))
}

pub(super) fn call_tool(
    shared: &Shared,
    conn: u64,
    id: &Value,
    tool: &str,
    args: &Value,
) -> Option<String> {
    let arg = |k: &str| {
        args.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let rejected_by_name = shared
        .opts
        .reject_named
        .as_deref()
        .is_some_and(|n| arg("new_file_path").contains(n));
    let result = match tool {
        "openDiff" if shared.opts.auto_accept && rejected_by_name => {
            jsonrpc::diff_rejected(&arg("tab_name"))
        }
        "openDiff" if shared.opts.auto_accept => json!({"content": [
            {"type": "text", "text": "FILE_SAVED"},
            {"type": "text", "text": arg("new_file_contents")},
        ]}),
        "openDiff" => {
            let tab = arg("tab_name");
            let prev = lock(&shared.diffs).insert(tab.clone(), (conn, id.clone()));
            if let Some((c, old)) = prev {
                if let Some(tx) = lock(&shared.clients).get(&c) {
                    let _ = tx.send(Message::text(jsonrpc::result(&old, jsonrpc::diff_rejected(&tab))));
                }
            }
            return None;
        }
        "close_tab" => {
            let tab = arg("tab_name");
            let claudecode = shared.opts.family == Family::Claude && !shared.opts.jetbrains;
            if claudecode && !(tab.contains('✻') && tab.contains('⧉')) {
                // claudecode looks an unmarked name up as a buffer and answers a result object
                // shaped like an error; the diff stays open.
                return Some(jsonrpc::result(id, json!({"code": -32000, "message": "Buffer operation error", "data": format!("no buffer {tab}")})));
            }
            lock(&shared.open_after_accept).retain(|t| *t != tab);
            if let Some((c, old)) = lock(&shared.diffs).remove(&tab) {
                if let Some(tx) = lock(&shared.clients).get(&c) {
                    let _ = tx.send(Message::text(jsonrpc::result(&old, jsonrpc::diff_rejected(&tab))));
                }
            }
            text_result("TAB_CLOSED")
        }
        "getDiagnostics" => {
            let uri = args.get("uri").and_then(Value::as_str);
            let open = "file:///x.rs";
            match (shared.opts.family, uri) {
                (Family::Claude, _) if shared.opts.jetbrains => text_result(json!([{"uri": open, "diagnostics": [{"severity": "ERROR", "message": "boom"}, {"severity": "WEAK_WARNING", "message": "meh"}, {"severity": "INFO", "message": "fyi"}]}]).to_string()),
                (Family::Claude, Some(u)) if u != open => {
                    return Some(jsonrpc::error(id, -32001, "File not open"));
                }
                (Family::Pi, Some(u)) if u != open => text_result(json!({ u: [] }).to_string()),
                (Family::Pi, _) => text_result(json!({open: [{"severity": "Error", "message": "boom", "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}}}, {"severity": "Information", "message": "fyi"}]}).to_string()),
                (Family::Claude, _) => text_result(json!([{"uri": open, "diagnostics": [{"severity": "Error", "message": "boom"}, {"severity": "Info", "message": "fyi"}]}]).to_string()),
            }
        }
        "echo" => {
            burn(shared.opts.burn_us);
            text_result(args.to_string())
        }
        "slow" => return None,
        "getOpenEditorTabs" => text_result(json!([{"uri": "file:///x.rs", "isActive": true, "isDirty": false, "languageId": "rust"}]).to_string()),
        "get_all_opened_file_paths" if shared.opts.jetbrains => text_result(String::from("/x.rs\n/y.rs")),
        "getOpenEditors" => text_result(json!({"tabs": [{"uri": "file:///x.rs", "isActive": true, "isPinned": false, "isPreview": false, "isDirty": true, "label": "x.rs", "groupIndex": 0, "viewColumn": 1, "isGroupActive": true, "fileName": "/x.rs", "languageId": "rust", "lineCount": 3, "isUntitled": false}]}).to_string()),
        other => return Some(jsonrpc::error(id, jsonrpc::METHOD_NOT_FOUND, &format!("Tool not found: {other}"))),
    };
    Some(jsonrpc::result(id, result))
}
