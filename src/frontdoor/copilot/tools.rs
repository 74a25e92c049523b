//! Copilot CLI's IDE tools and notifications mapped onto the editor's (pi family) and back.
//!
//! Results are MCP text content holding JSON, as Copilot CLI parses them: `get_selection` the
//! editor's last `selection_changed` (`{text, filePath, fileUrl, selection, current}` or
//! `null`), `get_diagnostics` `[{uri, filePath, diagnostics}]` (capitalised severities, which
//! its summary counts), `open_diff` the verdict `{success, result: "SAVED"|"REJECTED",
//! trigger, tab_name, message}`, `close_diff` `{success, already_closed, tab_name, message}`.

use serde_json::{json, Value};

/// The tools the door lists (Copilot CLI shows the model `get_selection` and
/// `get_diagnostics`; it calls the others itself).
pub(super) fn list() -> Value {
    let none = json!({"type": "object", "properties": {}});
    json!([
        {"name": "get_selection", "description": "The text selected in the editor now (or last), with its file and range; null when nothing was ever selected.", "inputSchema": none},
        {"name": "get_diagnostics", "description": "The editor's diagnostics (errors, warnings) for one file (uri) or all files.",
         "inputSchema": {"type": "object", "properties": {"uri": {"type": "string", "description": "A file URI; absent means all files."}}}},
        {"name": "open_diff", "description": "Shows a proposed change of a file in the editor for the user to accept or reject; answers when they do.",
         "inputSchema": {"type": "object", "properties": {"original_file_path": {"type": "string"}, "new_file_contents": {"type": "string"}, "tab_name": {"type": "string"}},
                         "required": ["original_file_path", "new_file_contents", "tab_name"]}},
        {"name": "close_diff", "description": "Closes a diff opened by open_diff (its answer is then REJECTED).",
         "inputSchema": {"type": "object", "properties": {"tab_name": {"type": "string"}}, "required": ["tab_name"]}},
        {"name": "update_session_name", "description": "Names the session (accepted; the editor shows no name).",
         "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    ])
}

/// A tool result whose one text content is `v` as JSON.
pub(super) fn text(v: &Value) -> Value {
    let t = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    json!({"content": [{"type": "text", "text": t}]})
}

/// A tool error (the CLI keeps its own prompt when an `open_diff` answers one).
pub(super) fn error(message: &str) -> Value {
    json!({"isError": true, "content": [{"type": "text", "text": message}]})
}

/// Copilot's `selection_changed` params for the editor's, or `None` for a virtual buffer
/// (a diff's proposed side) or a shape that is not a selection.
pub(super) fn selection(p: &Value) -> Option<Value> {
    let path = p.get("filePath").and_then(Value::as_str)?;
    if !crate::protocol::winpath::is_absolute(path)
        || path.ends_with(" (proposed)")
        || path.ends_with(" [pi-proposed]")
    {
        return None;
    }
    let pos = |k: &str| {
        let at = p.pointer(&format!("/selection/{k}"));
        let n = |f: &str| {
            at.and_then(|a| a.get(f))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        json!({"line": n("line"), "character": n("character")})
    };
    let text = p.get("text").and_then(Value::as_str).unwrap_or("");
    let empty = p
        .pointer("/selection/isEmpty")
        .and_then(Value::as_bool)
        .unwrap_or(text.is_empty());
    let url = p
        .get("fileUrl")
        .and_then(Value::as_str)
        .map(String::from)
        .unwrap_or_else(|| file_url(path));
    Some(json!({"text": text, "filePath": path, "fileUrl": url,
        "selection": {"start": pos("start"), "end": pos("end"), "isEmpty": empty}}))
}

/// `file://` + the path (a Windows path gets its leading slash, backslashes turned).
fn file_url(path: &str) -> String {
    let p = path.replace('\\', "/");
    if p.starts_with('/') {
        format!("file://{p}")
    } else {
        format!("file:///{p}")
    }
}

/// The answer to `get_selection`: the last selection, marked `current`, or `null`.
pub(super) fn get_selection(last: Option<&Value>) -> Value {
    match last {
        Some(s) => {
            let mut s = s.clone();
            s["current"] = Value::Bool(true);
            text(&s)
        }
        None => text(&Value::Null),
    }
}

/// `get_diagnostics`' answer from the editor's `getDiagnostics` result (pi family: text
/// JSON `{uri: [diagnostic]}`); files without diagnostics are left out.
pub(super) fn diagnostics(result: &Value) -> Value {
    let parsed = result
        .pointer("/content/0/text")
        .and_then(Value::as_str)
        .and_then(|t| serde_json::from_str::<Value>(t).ok());
    let Some(Value::Object(by_uri)) = parsed else {
        return text(&json!([]));
    };
    let files: Vec<Value> = by_uri
        .iter()
        .filter_map(|(uri, ds)| {
            let ds: Vec<Value> = ds.as_array()?.iter().map(diagnostic).collect();
            if ds.is_empty() {
                return None;
            }
            let path = uri.strip_prefix("file://").unwrap_or(uri);
            Some(json!({"uri": uri, "filePath": path, "diagnostics": ds}))
        })
        .collect();
    text(&Value::Array(files))
}

/// One diagnostic, its severity as Copilot CLI counts them (`Error|Warning|Information|Hint`).
fn diagnostic(d: &Value) -> Value {
    let mut d = d.clone();
    let sev = d.get("severity").and_then(Value::as_str).unwrap_or("");
    let named = match sev.to_ascii_lowercase().as_str() {
        "error" | "1" => "Error",
        "warning" | "warn" | "2" => "Warning",
        "hint" | "4" => "Hint",
        _ => "Information",
    };
    d["severity"] = Value::String(named.into());
    d
}

/// `open_diff`'s answer from the editor's `openDiff` result: `FILE_SAVED` is `SAVED`,
/// anything else `REJECTED`.
pub(super) fn verdict(result: &Value, path: &str, tab: &str) -> Value {
    let saved = result.pointer("/content/0/text").and_then(Value::as_str) == Some("FILE_SAVED");
    let (word, trigger, how) = if saved {
        ("SAVED", "accepted_via_button", "accepted")
    } else {
        ("REJECTED", "rejected_via_button", "rejected")
    };
    text(
        &json!({"success": true, "result": word, "trigger": trigger, "tab_name": tab,
        "message": format!("User {how} changes for {path}")}),
    )
}

/// `open_diff`'s answer when `close_diff` closed it first.
pub(super) fn closed(path: &str, tab: &str) -> Value {
    text(
        &json!({"success": true, "result": "REJECTED", "trigger": "closed_via_tool",
        "tab_name": tab, "message": format!("User rejected changes for {path}")}),
    )
}

/// `close_diff`'s answer.
pub(super) fn close_answer(tab: &str, already_closed: bool) -> Value {
    let message = if already_closed {
        format!("Diff {tab} was already closed")
    } else {
        format!("Closed diff {tab}")
    };
    text(
        &json!({"success": true, "already_closed": already_closed, "tab_name": tab, "message": message}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(result: &Value) -> Value {
        let t = result["content"][0]["text"].as_str().unwrap();
        serde_json::from_str(t).unwrap()
    }

    #[test]
    fn the_editors_selection_becomes_copilots() {
        let p = json!({"text": "hi", "filePath": "/w/a.rs",
            "selection": {"start": {"line": 2, "character": 0}, "end": {"line": 2, "character": 2}, "isEmpty": false}});
        let s = selection(&p).unwrap();
        assert_eq!(s["fileUrl"], "file:///w/a.rs");
        assert_eq!(s["selection"]["end"], json!({"line": 2, "character": 2}));
        let answered = parsed(&get_selection(Some(&s)));
        assert_eq!(answered["current"], true);
        assert_eq!(answered["text"], "hi");
        assert_eq!(parsed(&get_selection(None)), Value::Null);
        assert!(selection(&json!({"filePath": "/w/a.rs (proposed)"})).is_none());
        assert!(selection(&json!({"filePath": "relative"})).is_none());
    }

    #[test]
    fn diagnostics_are_a_list_of_files_with_capitalised_severities() {
        let editor = json!({"content": [{"type": "text", "text": json!({
            "file:///x.rs": [{"severity": "error", "message": "boom"}, {"severity": "Information", "message": "fyi"}],
            "file:///y.rs": []}).to_string()}]});
        let d = parsed(&diagnostics(&editor));
        assert_eq!(d.as_array().unwrap().len(), 1, "{d}");
        assert_eq!(d[0]["filePath"], "/x.rs");
        assert_eq!(d[0]["diagnostics"][0]["severity"], "Error");
        assert_eq!(d[0]["diagnostics"][1]["severity"], "Information");
        assert_eq!(parsed(&diagnostics(&json!({}))), json!([]));
    }

    #[test]
    fn a_verdict_is_saved_or_rejected() {
        let saved = json!({"content": [{"type": "text", "text": "FILE_SAVED"}, {"type": "text", "text": "x"}]});
        let v = parsed(&verdict(&saved, "/w/a", "t"));
        assert_eq!(
            (v["result"].as_str(), v["success"].as_bool()),
            (Some("SAVED"), Some(true))
        );
        assert_eq!(v["trigger"], "accepted_via_button");
        let rejected = json!({"content": [{"type": "text", "text": "DIFF_REJECTED"}]});
        assert_eq!(
            parsed(&verdict(&rejected, "/w/a", "t"))["result"],
            "REJECTED"
        );
        let c = parsed(&closed("/w/a", "t"));
        assert_eq!(
            (c["result"].as_str(), c["trigger"].as_str()),
            (Some("REJECTED"), Some("closed_via_tool"))
        );
        assert_eq!(parsed(&close_answer("t", true))["already_closed"], true);
        let tools = list();
        let names: Vec<&str> = tools
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(
            names,
            [
                "get_selection",
                "get_diagnostics",
                "open_diff",
                "close_diff",
                "update_session_name"
            ]
        );
    }
}
