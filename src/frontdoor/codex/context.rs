//! An editor's state as Codex's `ideContext`: the active file and its selection from the
//! editor's last `selection_changed`, the open tabs from its open-editors tool.
//!
//! Both editor families send the same `selection_changed` (`filePath` absolute once the link
//! has seen it, `text`, `selection{start, end}` 0-based); their open tabs differ per family
//! (pi-ide's `getOpenEditorTabs` array of `{uri}`, Claude's `getOpenEditors` `{tabs:[{uri,
//! fileName}]}`, JetBrains' `get_all_opened_file_paths` one path a line). Codex prints `path`
//! ("## Active file: src/lib.rs"), so a file inside the workspace root is named relative to it,
//! as VS Code's `asRelativePath` does; `fsPath` is always absolute.

use serde_json::{json, Map, Value};
use std::path::Path;

/// The open-tabs tools, per family, in the order they are tried.
pub(super) const TAB_TOOLS: [&str; 3] = [
    "getOpenEditorTabs",
    "getOpenEditors",
    "get_all_opened_file_paths",
];

/// The `ideContext` for a request from `workspace_root`: the active file from the editor's
/// last `selection_changed` frame (`None`: it sent none), and `tabs` (absolute paths).
pub(super) fn ide_context(workspace_root: &str, selection: Option<&str>, tabs: &[String]) -> Value {
    let active = selection.and_then(|s| active_file(workspace_root, s));
    let open_tabs: Vec<Value> = tabs.iter().map(|t| descriptor(workspace_root, t)).collect();
    json!({"activeFile": active, "openTabs": open_tabs})
}

/// The context Codex reads as "nothing to add": no active file, no tabs.
pub(super) fn empty() -> Value {
    json!({"activeFile": null, "openTabs": []})
}

/// `activeFile` from a `selection_changed` frame, or `None` when it names no file.
fn active_file(root: &str, frame: &str) -> Option<Value> {
    let msg: Value = serde_json::from_str(frame).ok()?;
    let params = msg.get("params")?;
    let path = params.get("filePath")?.as_str().filter(|p| !p.is_empty())?;
    let text = params.get("text").and_then(Value::as_str).unwrap_or("");
    let sel = params.get("selection");
    let range = json!({
        "start": position(sel.and_then(|s| s.get("start"))),
        "end": position(sel.and_then(|s| s.get("end"))),
    });
    let empty = range["start"] == range["end"];
    let mut file = descriptor(root, path);
    if let Value::Object(f) = &mut file {
        f.insert("selection".into(), range.clone());
        f.insert("activeSelectionContent".into(), Value::String(text.into()));
        let selections = if empty { vec![] } else { vec![range] };
        f.insert("selections".into(), Value::Array(selections));
    }
    Some(file)
}

/// `{line, character}` as Codex reads it (unsigned; anything else is 0).
fn position(p: Option<&Value>) -> Value {
    let field = |k: &str| {
        p.and_then(|p| p.get(k))
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0)
    };
    json!({"line": field("line"), "character": field("character")})
}

/// `{label, path, fsPath}` for the file at `fs_path`: `path` relative to `root` when inside it.
fn descriptor(root: &str, fs_path: &str) -> Value {
    let p = Path::new(fs_path);
    let label = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| fs_path.to_string());
    let relative = p
        .strip_prefix(root)
        .ok()
        .filter(|r| !r.as_os_str().is_empty())
        .map(|r| r.to_string_lossy().into_owned());
    json!({"label": label, "path": relative.as_deref().unwrap_or(fs_path), "fsPath": fs_path})
}

/// The absolute paths of the open tabs in an editor's answer to `tool` (one of [`TAB_TOOLS`]);
/// empty for an error or a shape the family does not send.
pub(super) fn tab_paths(tool: &str, answer: &Map<String, Value>) -> Vec<String> {
    let Some(text) = answer
        .get("result")
        .and_then(|r| r.get("content"))
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("text"))
        .and_then(Value::as_str)
    else {
        return Vec::new();
    };
    let from_entry = |t: &Value| -> Option<String> {
        if let Some(f) = t.get("fileName").and_then(Value::as_str) {
            return Some(f.to_string());
        }
        let uri = t.get("uri")?.as_str()?;
        Some(crate::protocol::percent::decode_path(
            uri.strip_prefix("file://")?,
        ))
    };
    let mut paths: Vec<String> = match tool {
        "get_all_opened_file_paths" => text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect(),
        _ => {
            let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            let list = v.get("tabs").unwrap_or(&v);
            list.as_array()
                .map(|a| a.iter().filter_map(from_entry).collect())
                .unwrap_or_default()
        }
    };
    paths.retain(|p| crate::protocol::winpath::is_absolute(p));
    paths.dedup();
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    const PI_SELECTION: &str = r#"{"jsonrpc":"2.0","method":"selection_changed","params":{"text":"fn focus","filePath":"/repo/src/lib.rs","selection":{"start":{"line":3,"character":0},"end":{"line":3,"character":8},"isEmpty":false}}}"#;

    /// What Codex renders as "## Active file: src/lib.rs" and "## Active selection of the
    /// file:": `path` relative to the workspace root, the text as the selection's content.
    #[test]
    fn a_selection_becomes_the_active_file_relative_to_the_workspace() {
        let c = ide_context("/repo", Some(PI_SELECTION), &["/repo/README.md".into()]);
        let f = &c["activeFile"];
        assert_eq!(f["label"], "lib.rs");
        assert_eq!(f["path"], "src/lib.rs");
        assert_eq!(f["fsPath"], "/repo/src/lib.rs");
        assert_eq!(f["activeSelectionContent"], "fn focus");
        assert_eq!(f["selection"]["start"], json!({"line": 3, "character": 0}));
        assert_eq!(f["selection"]["end"], json!({"line": 3, "character": 8}));
        assert_eq!(f["selections"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            c["openTabs"],
            json!([{"label": "README.md", "path": "README.md", "fsPath": "/repo/README.md"}])
        );
    }

    /// A file outside the root keeps its absolute path; a cursor (no selection) has none.
    #[test]
    fn outside_the_root_the_path_stays_absolute_and_a_cursor_selects_nothing() {
        let frame = r#"{"method":"selection_changed","params":{"text":"","filePath":"/elsewhere/a.rs","selection":{"start":{"line":1,"character":2},"end":{"line":1,"character":2},"isEmpty":true}}}"#;
        let f = &ide_context("/repo", Some(frame), &[])["activeFile"];
        assert_eq!(f["path"], "/elsewhere/a.rs");
        assert_eq!(f["selections"], json!([]));
        assert_eq!(f["activeSelectionContent"], "");
        // "/repository/x" is not inside "/repo".
        let other = descriptor("/repo", "/repository/x.rs");
        assert_eq!(other["path"], "/repository/x.rs");
    }

    /// No selection, a frame without a file or a broken frame: no active file, never a panic.
    #[test]
    fn no_usable_selection_is_no_active_file() {
        for frame in [
            None,
            Some(r#"{"method":"selection_changed","params":{"filePath":""}}"#),
            Some("not json"),
            Some(r#"{"params":{"filePath":"/a","selection":{"start":{"line":-1}}}}"#),
        ] {
            let c = ide_context("/repo", frame, &[]);
            if frame.is_some_and(|f| f.contains("\"/a\"")) {
                assert_eq!(c["activeFile"]["selection"]["start"]["line"], 0);
            } else {
                assert!(c["activeFile"].is_null(), "{frame:?}: {c}");
            }
        }
        assert_eq!(empty(), json!({"activeFile": null, "openTabs": []}));
    }

    fn answer(text: &str) -> Map<String, Value> {
        let v = json!({"id": 1, "result": {"content": [{"type": "text", "text": text}]}});
        v.as_object().cloned().unwrap_or_default()
    }

    /// Each family's open-tabs answer, as the editors send it (docs/protocol.md §3.3).
    #[test]
    fn each_familys_open_tabs_are_read() {
        let pi =
            answer(r#"[{"uri":"file:///repo/a%20b.rs","isActive":true},{"uri":"untitled:1"}]"#);
        assert_eq!(tab_paths("getOpenEditorTabs", &pi), vec!["/repo/a b.rs"]);
        let claude = answer(
            r#"{"tabs":[{"uri":"file:///repo/x.rs","fileName":"/repo/x.rs","label":"x.rs"}]}"#,
        );
        assert_eq!(tab_paths("getOpenEditors", &claude), vec!["/repo/x.rs"]);
        let jetbrains = answer("/repo/a.kt\n\n/repo/b.kt\n");
        assert_eq!(
            tab_paths("get_all_opened_file_paths", &jetbrains),
            vec!["/repo/a.kt", "/repo/b.kt"]
        );
        let error = json!({"id": 1, "error": {"code": -32000, "message": "x"}});
        assert!(tab_paths("getOpenEditors", error.as_object().unwrap()).is_empty());
        assert!(tab_paths("getOpenEditors", &answer("{garbage")).is_empty());
    }
}
