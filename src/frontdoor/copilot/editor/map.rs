//! What a Claude-family editor answers, made of what Copilot Chat's server answers: the
//! tools it lists, selection, diagnostics, a diff's verdict, the workspace folders, and the
//! refusal of what it cannot do. Pure functions (the I/O is `adapter`'s).

use crate::protocol::bridge::with_severities;
use crate::protocol::family::KNOWN_TOOLS;
use serde_json::{json, Value};

/// The Claude-family tools the adapter serves (the editors' tools but the [`UNSUPPORTED`]),
/// each mapped onto Copilot Chat's: `getCurrentSelection`/`getLatestSelection` ↔
/// `get_selection`, `getDiagnostics` ↔ `get_diagnostics`, `openDiff` ↔ `open_diff`,
/// `close_tab`/`closeAllDiffTabs` ↔ `close_diff`, `getWorkspaceFolders` from the lockfile.
pub(super) fn tools() -> impl Iterator<Item = &'static str> {
    KNOWN_TOOLS.into_iter().filter(|t| !UNSUPPORTED.contains(t))
}

/// Claude-family tools Copilot Chat's server has nothing for.
pub(super) const UNSUPPORTED: [&str; 6] = [
    "openFile",
    "saveDocument",
    "checkDocumentDirty",
    "getOpenEditors",
    "executeCode",
    "getOpenEditorTabs",
];

/// The `tools/list` result: only what works.
pub(super) fn tools_list() -> Value {
    let schema = |tool: &str| match tool {
        "openDiff" => json!({"type": "object", "properties": {
            "old_file_path": {"type": "string"}, "new_file_path": {"type": "string"},
            "new_file_contents": {"type": "string"}, "tab_name": {"type": "string"}},
            "required": ["old_file_path", "new_file_path", "new_file_contents", "tab_name"]}),
        "close_tab" => json!({"type": "object", "properties": {"tab_name": {"type": "string"}},
            "required": ["tab_name"]}),
        "getDiagnostics" => json!({"type": "object", "properties": {"uri": {"type": "string"}}}),
        _ => json!({"type": "object", "properties": {}}),
    };
    let tools: Vec<Value> = tools()
        .map(|t| json!({"name": t, "description": describe(t), "inputSchema": schema(t)}))
        .collect();
    json!({"tools": tools})
}

fn describe(tool: &str) -> &'static str {
    match tool {
        "openDiff" => {
            "Show a diff in VS Code (Copilot Chat) with Accept and Reject, and wait for the verdict"
        }
        "close_tab" => "Close a diff opened with openDiff",
        "closeAllDiffTabs" => "Close every diff opened with openDiff",
        "getDiagnostics" => "Diagnostics of a file (uri) or of all files",
        "getCurrentSelection" => "The selection in the active editor",
        "getLatestSelection" => "The latest selection, even if the editor is no longer active",
        _ => "The workspace folders",
    }
}

/// The JSON-RPC error message for a tool Copilot Chat's server does not offer.
pub(super) fn unsupported(tool: &str) -> String {
    format!(
        "Copilot Chat's VS Code server does not offer {tool}: it has selection, diagnostics and diffs only (Accept/Reject)"
    )
}

/// A text tool result.
pub(super) fn text(text: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": text.into()}]})
}

/// The JSON text of a Copilot Chat tool result (its first text block, parsed).
pub(super) fn copilot_json(result: &Value) -> Result<Value, String> {
    let t = result["content"][0]["text"].as_str().unwrap_or("");
    if result["isError"] == json!(true) {
        return Err(if t.is_empty() { "tool error" } else { t }.to_string());
    }
    serde_json::from_str(t).map_err(|e| format!("not JSON: {e}"))
}

/// `get_selection`'s answer as `getCurrentSelection` (`current` only) or
/// `getLatestSelection` answers it.
pub(super) fn selection(result: &Value, current_only: bool) -> Result<Value, String> {
    let sel = copilot_json(result)?;
    let stale = current_only && sel.get("current") == Some(&json!(false));
    if sel.is_null() || stale {
        let none = json!({"success": false, "message": "No active editor found"});
        return Ok(text(none.to_string()));
    }
    let answer = json!({
        "success": true,
        "text": sel["text"],
        "filePath": sel["filePath"],
        "fileUrl": sel["fileUrl"],
        "selection": sel["selection"],
    });
    Ok(text(answer.to_string()))
}

/// A `selection_changed` push's params as a Claude-family editor sends them.
pub(super) fn selection_push(params: &Value) -> Value {
    json!({
        "text": params["text"],
        "filePath": params["filePath"],
        "fileUrl": params["fileUrl"],
        "selection": params["selection"],
    })
}

/// A severity as the Claude family names it (Copilot Chat writes `vscode`'s lowercase names).
fn severity(s: &Value) -> Value {
    match s.as_str() {
        Some("error") => json!("Error"),
        Some("warning") => json!("Warning"),
        Some("information" | "info") => json!("Info"),
        Some("hint") => json!("Hint"),
        _ => s.clone(),
    }
}

/// `get_diagnostics`'s answer (`[{uri, filePath, diagnostics}]`) as `getDiagnostics`'s.
pub(super) fn diagnostics(result: &Value) -> Result<Value, String> {
    let files = copilot_json(result)?;
    let Some(files) = files.as_array() else {
        return Err("get_diagnostics: not a list".into());
    };
    let out: Vec<Value> = files
        .iter()
        .map(|f| {
            let diags = with_severities(f.get("diagnostics"), severity);
            json!({"uri": f["uri"], "diagnostics": diags})
        })
        .collect();
    Ok(text(Value::Array(out).to_string()))
}

/// `open_diff`'s verdict as `openDiff`'s: `SAVED` → `FILE_SAVED` and the accepted text
/// (Copilot Chat's diff is read-only: what was proposed); `REJECTED` → `DIFF_REJECTED` and
/// the tab, as Claude-family editors answer.
pub(super) fn verdict(result: &Value, contents: &str, tab: &str) -> Result<Value, String> {
    let v = copilot_json(result)?;
    match v["result"].as_str() {
        Some("SAVED") => Ok(json!({"content": [
            {"type": "text", "text": "FILE_SAVED"},
            {"type": "text", "text": contents},
        ]})),
        Some("REJECTED") => Ok(crate::protocol::jsonrpc::diff_rejected(tab)),
        other => Err(format!("open_diff: an unknown verdict {other:?}")),
    }
}

/// `getWorkspaceFolders`, from the lockfile's folders.
pub(super) fn workspace_folders(folders: &[String]) -> Value {
    text(crate::protocol::bridge::workspace_folders(folders).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copilot(v: Value) -> Value {
        text(serde_json::to_string_pretty(&v).unwrap())
    }

    #[test]
    fn the_verdict_is_the_claude_familys() {
        let saved =
            copilot(json!({"success": true, "result": "SAVED", "trigger": "accepted_via_button"}));
        let v = verdict(&saved, "new text", "t").unwrap();
        assert_eq!(v["content"][0]["text"], "FILE_SAVED");
        assert_eq!(v["content"][1]["text"], "new text");
        let rejected = copilot(json!({"success": true, "result": "REJECTED"}));
        let v = verdict(&rejected, "new text", "t").unwrap();
        assert_eq!(v["content"][0]["text"], "DIFF_REJECTED");
        assert_eq!(v["content"][1]["text"], "t");
        let failed = json!({"content": [{"type": "text", "text": "Failed to open diff: x"}], "isError": true});
        assert_eq!(
            verdict(&failed, "", "t").unwrap_err(),
            "Failed to open diff: x"
        );
        assert!(verdict(&copilot(json!({"result": "MAYBE"})), "", "t").is_err());
    }

    #[test]
    fn selection_and_diagnostics_are_reshaped() {
        let sel = json!({"text": "x", "filePath": "/w/a.rs", "fileUrl": "file:///w/a.rs",
            "selection": {"start": {"line": 1, "character": 0}, "end": {"line": 1, "character": 1}, "isEmpty": false},
            "current": false});
        let latest: Value = serde_json::from_str(
            selection(&copilot(sel.clone()), false).unwrap()["content"][0]["text"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(latest["success"], true);
        assert_eq!(latest["filePath"], "/w/a.rs");
        assert_eq!(latest["selection"]["start"]["line"], 1);
        let current: Value = serde_json::from_str(
            selection(&copilot(sel), true).unwrap()["content"][0]["text"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            current["success"], false,
            "a cached selection is not the current one"
        );
        let none: Value = serde_json::from_str(
            selection(&text("null"), false).unwrap()["content"][0]["text"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(none["success"], false);
        let d = copilot(
            json!([{"uri": "file:///w/a.rs", "filePath": "/w/a.rs", "diagnostics": [
            {"message": "boom", "severity": "error", "range": {}}, {"message": "fyi", "severity": "information"}]}]),
        );
        let out: Value = serde_json::from_str(
            diagnostics(&d).unwrap()["content"][0]["text"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(out[0]["uri"], "file:///w/a.rs");
        assert_eq!(out[0]["diagnostics"][0]["severity"], "Error");
        assert_eq!(out[0]["diagnostics"][1]["severity"], "Info");
        assert!(out[0].get("filePath").is_none());
    }

    #[test]
    fn only_what_works_is_listed_and_the_rest_is_refused_clearly() {
        let list = tools_list();
        let names: Vec<&str> = list["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, tools().collect::<Vec<_>>());
        assert_eq!(names.len(), 7, "{names:?}");
        assert!(names.contains(&"openDiff") && names.contains(&"getWorkspaceFolders"));
        for t in UNSUPPORTED {
            assert!(!names.contains(&t));
            assert!(unsupported(t).contains("does not offer") && unsupported(t).contains(t));
        }
        let f: Value = serde_json::from_str(
            workspace_folders(&["/w/app".into()])["content"][0]["text"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(f["folders"][0]["name"], "app");
        assert_eq!(f["rootPath"], "/w/app");
    }
}
