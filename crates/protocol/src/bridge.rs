//! Dialect bridging: a session of one family on an editor of the other.
//!
//! A pi-family session on a Claude-family editor (claudecode.nvim, VS Code, JetBrains) or the
//! reverse. Requests are rewritten on the way out, answers on the way back, so each session
//! sees its own family's tool names and result shapes. Same-family traffic never comes here.

use crate::family::Family;
use crate::jsonrpc;
use serde_json::{json, Map, Value};

/// How an editor's answer must be rewritten for the session that asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bridge {
    /// Claude array diagnostics → pi map; "file not open" (-32001) → `{uri: []}`.
    DiagnosticsToPi {
        /// The `uri` asked about, if any.
        uri: Option<String>,
    },
    /// pi map diagnostics → Claude array.
    DiagnosticsToClaude,
    /// Claude `getOpenEditors` `{tabs}` → pi `getOpenEditorTabs` array.
    TabsToPi,
    /// JetBrains `get_all_opened_file_paths` (one path a line) → pi `getOpenEditorTabs` array.
    PathsToPi,
    /// pi `getOpenEditorTabs` array → Claude `getOpenEditors` `{tabs}`.
    TabsToClaude,
    /// An `openDiff` on a Claude editor under a marked tab name (any session whose own name
    /// lacks the markers: claudecode's `close_tab` can close nothing else).
    DiffOnClaude {
        /// The session's own tab name (echoed back on rejection).
        session_tab: String,
        /// The marked name the editor knows.
        editor_tab: String,
        /// Close it once accepted (a pi session never sends `close_tab` for a saved diff the
        /// way Claude Code does after writing the file).
        close_on_accept: bool,
    },
}

/// What the broker must do after rewriting an answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Followup {
    /// Close this tab in the editor (an accepted diff on a Claude editor stays open otherwise).
    CloseTab(String),
}

/// The marked tab name a Claude-family editor's `close_tab` accepts (✻ … ⧉), unique per
/// session and diff, derived so that a later `close_tab` can be translated without a table.
pub fn marked_tab(session: u64, tab: &str) -> String {
    format!("✻ [pi s{session}] {tab} ⧉")
}

/// JetBrains' name for the open files, where VS Code has `getOpenEditors`.
const JETBRAINS_OPEN_FILES: &str = "get_all_opened_file_paths";

/// The tools of one family, and what the other family calls them (on a Claude-family editor,
/// the open tabs are `getOpenEditors`, or JetBrains' `get_all_opened_file_paths` where that is
/// what it lists).
fn translate_tool<'a>(
    name: &'a str,
    from: Family,
    to: Family,
    editor_tools: Option<&[String]>,
) -> &'a str {
    let has = |t: &str| editor_tools.is_some_and(|tools| tools.iter().any(|x| x == t));
    match (from, to, name) {
        (Family::Pi, Family::Claude, "getOpenEditorTabs")
            if !has("getOpenEditors") && has(JETBRAINS_OPEN_FILES) =>
        {
            JETBRAINS_OPEN_FILES
        }
        (Family::Pi, Family::Claude, "getOpenEditorTabs") => "getOpenEditors",
        (Family::Claude, Family::Pi, "getOpenEditors") => "getOpenEditorTabs",
        _ => name,
    }
}

/// Rewrites a bridged `tools/call` for the editor. Returns the bridge for its answer, or the
/// JSON-RPC error to send back (a tool the editor does not have).
pub fn outbound(
    dialect: Family,
    family: Family,
    session: u64,
    editor_id: &str,
    editor_tools: Option<&[String]>,
    msg: &mut Map<String, Value>,
) -> Result<Option<Bridge>, (i64, String)> {
    let Some(params) = msg.get_mut("params").and_then(Value::as_object_mut) else {
        return Ok(None);
    };
    let Some(tool) = params.get("name").and_then(Value::as_str).map(String::from) else {
        return Ok(None);
    };
    let target = translate_tool(&tool, dialect, family, editor_tools).to_string();
    // claudecode's close_tab is callable though not listed.
    let available = target == "close_tab" || editor_tools.is_none_or(|t| t.contains(&target));
    if !available {
        return Err((
            jsonrpc::METHOD_NOT_FOUND,
            format!("Tool not found: {tool} (editor {editor_id} is a {family}-family editor and has no such tool)"),
        ));
    }
    params.insert("name".into(), Value::String(target.clone()));
    let args = params.entry("arguments").or_insert_with(|| json!({}));
    let arg = |k: &str| args.get(k).and_then(Value::as_str).map(String::from);
    Ok(match (dialect, family, target.as_str()) {
        (Family::Pi, Family::Claude, "getDiagnostics") => {
            Some(Bridge::DiagnosticsToPi { uri: arg("uri") })
        }
        (Family::Claude, Family::Pi, "getDiagnostics") => Some(Bridge::DiagnosticsToClaude),
        (Family::Pi, Family::Claude, "getOpenEditors") => Some(Bridge::TabsToPi),
        (Family::Pi, Family::Claude, JETBRAINS_OPEN_FILES) => Some(Bridge::PathsToPi),
        (Family::Claude, Family::Pi, "getOpenEditorTabs") => Some(Bridge::TabsToClaude),
        (Family::Pi, Family::Claude, "openDiff") => {
            let session_tab = arg("tab_name").unwrap_or_default();
            let editor_tab = marked_tab(session, &session_tab);
            if let Some(a) = args.as_object_mut() {
                a.insert("tab_name".into(), Value::String(editor_tab.clone()));
            }
            Some(Bridge::DiffOnClaude {
                session_tab,
                editor_tab,
                close_on_accept: true,
            })
        }
        (Family::Pi, Family::Claude, "close_tab") => {
            let tab = arg("tab_name").unwrap_or_default();
            if let Some(a) = args.as_object_mut() {
                a.insert("tab_name".into(), Value::String(marked_tab(session, &tab)));
            }
            None
        }
        _ => None,
    })
}

/// True for a tab name claudecode's `close_tab` accepts (it carries ✻ and ⧉).
pub fn is_marked(tab: &str) -> bool {
    tab.contains('✻') && tab.contains('⧉')
}

/// A Claude-family session's `openDiff` / `close_tab` on a Claude-family editor with a plain
/// tab name: the diff is opened under a marked name so that `close_tab` (the session's own,
/// or the broker's when the session leaves or cancels) can close it; the session keeps seeing
/// its own name.
pub fn mark_claude_tab(session: u64, msg: &mut Map<String, Value>) -> Option<Bridge> {
    let params = msg.get_mut("params")?.as_object_mut()?;
    let tool = params.get("name")?.as_str()?.to_string();
    let args = params.get_mut("arguments")?.as_object_mut()?;
    let tab = args.get("tab_name")?.as_str()?.to_string();
    if is_marked(&tab) {
        return None;
    }
    let marked = marked_tab(session, &tab);
    args.insert("tab_name".into(), Value::String(marked.clone()));
    (tool == "openDiff").then_some(Bridge::DiffOnClaude {
        session_tab: tab,
        editor_tab: marked,
        close_on_accept: false,
    })
}

/// Extra tools a bridged session sees in `tools/list` (its family's names for what the
/// editor has under the other name).
pub fn extra_tools(dialect: Family, family: Family, editor_tools: &[String]) -> Vec<Value> {
    let has = |n: &str| editor_tools.iter().any(|t| t == n);
    let mut out = Vec::new();
    match (dialect, family) {
        (Family::Pi, Family::Claude)
            if (has("getOpenEditors") || has(JETBRAINS_OPEN_FILES))
                && !has("getOpenEditorTabs") =>
        {
            out.push(json!({"name": "getOpenEditorTabs", "description": "List the editor's open tabs (bridged from getOpenEditors or get_all_opened_file_paths)", "inputSchema": {"type": "object", "properties": {}}}));
        }
        (Family::Claude, Family::Pi) => {
            if has("getOpenEditorTabs") && !has("getOpenEditors") {
                out.push(json!({"name": "getOpenEditors", "description": "List the editor's open tabs (bridged from getOpenEditorTabs)", "inputSchema": {"type": "object", "properties": {}}}));
            }
            for (name, what) in ANSWERED_BY_BROKER {
                if !has(name) {
                    out.push(json!({"name": name, "description": what, "inputSchema": {"type": "object", "properties": {}}}));
                }
            }
        }
        _ => {}
    }
    out
}

/// Claude Code's tools that a pi-family editor lacks and the broker answers from what it
/// knows (the last `selection_changed`, the lockfile's folders).
const ANSWERED_BY_BROKER: [(&str, &str); 3] = [
    ("getCurrentSelection", "The current selection in the editor (answered by pi-ide-broker from the editor's last selection_changed)"),
    ("getLatestSelection", "The most recent selection in the editor (answered by pi-ide-broker from the editor's last selection_changed)"),
    ("getWorkspaceFolders", "The editor's workspace folders (answered by pi-ide-broker from its lockfile)"),
];

/// Whether a session of family `session` on an editor of family `editor` may have calls
/// answered by the broker itself ([`answer_locally`]): a Claude-family session on a pi-family
/// editor, whose tools lack the Claude family's selection and workspace calls.
pub fn answers_locally(session: Family, editor: Family) -> bool {
    matches!((session, editor), (Family::Claude, Family::Pi))
}

/// A Claude-family call the broker answers itself on a pi-family editor that lacks the tool:
/// the result in Claude Code's shape (one text item holding JSON), or `None` to forward it.
/// `selection` is the editor's last `selection_changed` frame, `folders` its lockfile folders.
pub fn answer_locally(
    tool: &str,
    editor_tools: &[String],
    selection: Option<&str>,
    folders: &[String],
) -> Option<Value> {
    if editor_tools.iter().any(|t| t == tool) {
        return None;
    }
    let sel = selection
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|v| v.get("params").cloned())
        .filter(|p| p.get("filePath").is_some_and(Value::is_string));
    let body = match tool {
        "getCurrentSelection" | "getLatestSelection" => match sel {
            Some(mut p) => {
                if let Some(path) = p["filePath"].as_str().map(String::from) {
                    p["fileUrl"] = json!(format!("file://{path}"));
                }
                if tool == "getCurrentSelection" {
                    p["success"] = json!(true);
                }
                p
            }
            None if tool == "getCurrentSelection" => {
                json!({"success": false, "message": "No active editor found"})
            }
            None => json!({"success": false, "message": "No selection available"}),
        },
        "getWorkspaceFolders" => workspace_folders(folders),
        _ => return None,
    };
    Some(text_result(body.to_string()))
}

/// A Claude-family editor's `getWorkspaceFolders` answer (the JSON its text result carries)
/// for the lockfile's `folders`.
pub fn workspace_folders(folders: &[String]) -> Value {
    let list: Vec<Value> = folders
        .iter()
        .map(|f| {
            let name = std::path::Path::new(f)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| f.clone());
            json!({"name": name, "uri": format!("file://{f}"), "path": f})
        })
        .collect();
    json!({"success": true, "folders": list, "rootPath": folders.first()})
}

fn text_result(text: String) -> Value {
    json!({"content": [{"type": "text", "text": text}]})
}

fn first_text(result: &Value) -> Option<Value> {
    serde_json::from_str(result.get("content")?.get(0)?.get("text")?.as_str()?).ok()
}

/// A Claude-family severity in pi-ide's (LSP) names: VS Code's `Info`, and JetBrains'
/// `ERROR`, `WARNING`, `WEAK_WARNING`, `INFO`.
fn severity_to_pi(s: &Value) -> Value {
    match s.as_str() {
        Some("Info" | "INFO") => json!("Information"),
        Some("ERROR") => json!("Error"),
        Some("WARNING") => json!("Warning"),
        Some("WEAK_WARNING") => json!("Hint"),
        _ => s.clone(),
    }
}

fn severity_to_claude(s: &Value) -> Value {
    match s.as_str() {
        Some("Information") => json!("Info"),
        _ => s.clone(),
    }
}

/// A diagnostics list (anything else is an empty one) with each severity renamed.
pub fn with_severities(diags: Option<&Value>, rename: fn(&Value) -> Value) -> Vec<Value> {
    let Some(list) = diags.and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .map(|d| {
            let mut d = d.clone();
            if let Some(s) = d.get("severity").cloned() {
                d["severity"] = rename(&s);
            }
            d
        })
        .collect()
}

/// An `openDiff` answer is usable only if it says FILE_SAVED (with the text) or DIFF_REJECTED.
fn is_diff_verdict(result: &Value) -> bool {
    let c = &result["content"];
    matches!(
        c[0]["text"].as_str(),
        Some("FILE_SAVED") | Some("DIFF_REJECTED")
    ) && c[1]["text"].is_string()
}

/// Rewrites the editor's answer `msg` (a whole response object) for the session.
pub fn inbound(bridge: &Bridge, msg: &mut Map<String, Value>) -> Option<Followup> {
    match bridge {
        Bridge::DiagnosticsToPi { uri } => diagnostics_to_pi(uri.as_deref(), msg),
        Bridge::DiagnosticsToClaude => {
            let result = msg.get_mut("result")?;
            let items: Vec<Value> = match first_text(result) {
                Some(Value::Object(m)) => m
                    .into_iter()
                    .map(|(u, d)| {
                        let diags = with_severities(Some(&d), severity_to_claude);
                        json!({"uri": u, "diagnostics": diags})
                    })
                    .collect(),
                _ => Vec::new(),
            };
            *result = text_result(Value::Array(items).to_string());
        }
        Bridge::TabsToPi => {
            let result = msg.get_mut("result")?;
            let tabs: Vec<Value> = first_text(result)
                .and_then(|v| v.get("tabs").and_then(Value::as_array).cloned())
                .unwrap_or_default()
                .into_iter()
                .map(|t| json!({"uri": t["uri"], "isActive": t["isActive"].as_bool().unwrap_or(false), "isDirty": t["isDirty"].as_bool().unwrap_or(false), "languageId": t["languageId"]}))
                .collect();
            *result = text_result(Value::Array(tabs).to_string());
        }
        Bridge::PathsToPi => {
            let result = msg.get_mut("result")?;
            let text = result["content"][0]["text"].as_str().unwrap_or_default();
            let tabs: Vec<Value> = text
                .lines()
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| json!({"uri": format!("file://{p}"), "isActive": false, "isDirty": false, "languageId": null}))
                .collect();
            *result = text_result(Value::Array(tabs).to_string());
        }
        Bridge::TabsToClaude => tabs_to_claude(msg),
        Bridge::DiffOnClaude {
            session_tab,
            editor_tab,
            close_on_accept,
        } => {
            let accepted = msg
                .get("result")
                .is_some_and(|r| r["content"][0]["text"] == "FILE_SAVED" && is_diff_verdict(r));
            if accepted {
                // claudecode keeps an accepted diff open until close_tab.
                return close_on_accept.then(|| Followup::CloseTab(editor_tab.clone()));
            }
            // Anything but a clean FILE_SAVED is a rejection carrying the session's own tab
            // name: never an error (pi would write unreviewed), never an error-shaped result.
            msg.remove("error");
            msg.insert("result".into(), jsonrpc::diff_rejected(session_tab));
        }
    }
    None
}

/// claudecode's diagnostics (an array of `{uri, diagnostics}`, -32001 for a file not open)
/// in pi-ide.nvim's shape (a map of uri to diagnostics, empty for a file not open).
fn diagnostics_to_pi(uri: Option<&str>, msg: &mut Map<String, Value>) {
    if let Some(err) = msg.get("error") {
        if err["code"] == -32001 {
            // A file that is not open: the pi shape says "no diagnostics" for it.
            let key = uri.unwrap_or_default().to_string();
            msg.remove("error");
            msg.insert("result".into(), text_result(json!({ key: [] }).to_string()));
        }
        return;
    }
    let Some(result) = msg.get_mut("result") else {
        return;
    };
    let mut map = Map::new();
    if let Some(Value::Array(items)) = first_text(result) {
        for item in items {
            let Some(u) = item.get("uri").and_then(Value::as_str) else {
                continue;
            };
            let diags = with_severities(item.get("diagnostics"), severity_to_pi);
            if let Some(a) = map
                .entry(u.to_string())
                .or_insert_with(|| json!([]))
                .as_array_mut()
            {
                a.extend(diags);
            }
        }
    }
    *result = text_result(Value::Object(map).to_string());
}

/// pi-ide.nvim's open tabs (an array) in claudecode's `getOpenEditors` shape.
fn tabs_to_claude(msg: &mut Map<String, Value>) {
    let Some(result) = msg.get_mut("result") else {
        return;
    };
    let tabs: Vec<Value> = match first_text(result) {
        Some(Value::Array(a)) => a
            .into_iter()
            .map(|t| {
                let uri = t["uri"].as_str().unwrap_or_default().to_string();
                let path = uri.strip_prefix("file://").unwrap_or(&uri).to_string();
                let label = path.rsplit('/').next().unwrap_or_default().to_string();
                json!({"uri": uri, "isActive": t["isActive"], "isDirty": t["isDirty"], "languageId": t["languageId"], "label": label, "fileName": path, "isUntitled": false})
            })
            .collect(),
        _ => Vec::new(),
    };
    *result = text_result(json!({ "tabs": tabs }).to_string());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn resp(result: Value) -> Map<String, Value> {
        json!({"jsonrpc": "2.0", "id": 1, "result": result})
            .as_object()
            .cloned()
            .unwrap_or_default()
    }

    /// What the pi-ide client does with getDiagnostics: a map of arrays, or it throws.
    fn pi_parses_diagnostics(msg: &Map<String, Value>) -> bool {
        let Some(text) = msg["result"]["content"][0]["text"].as_str() else {
            return false;
        };
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m.values().all(|v| {
                v.as_array()
                    .is_some_and(|a| a.iter().all(|d| d["severity"] != "Info"))
            }),
            _ => false,
        }
    }

    /// What the pi-ide client does with openDiff: FILE_SAVED + text, or anything else = reject;
    /// an error means "write unreviewed", which a bridge must never produce.
    fn pi_reads_diff(msg: &Map<String, Value>) -> Option<&'static str> {
        if msg.contains_key("error") {
            return None;
        }
        match msg["result"]["content"][0]["text"].as_str() {
            Some("FILE_SAVED") if msg["result"]["content"][1]["text"].is_string() => Some("saved"),
            Some("DIFF_REJECTED") => Some("rejected"),
            _ => None,
        }
    }

    #[test]
    fn claude_diagnostics_become_a_pi_map() {
        let b = Bridge::DiagnosticsToPi { uri: None };
        let mut m = resp(text_result(
            json!([{"uri": "file:///a", "diagnostics": [{"severity": "Info", "message": "m"}]}])
                .to_string(),
        ));
        inbound(&b, &mut m);
        let map: Value =
            serde_json::from_str(m["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(
            map,
            json!({"file:///a": [{"severity": "Information", "message": "m"}]})
        );
        let mut not_open = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "File not open"}}).as_object().cloned().unwrap();
        inbound(
            &Bridge::DiagnosticsToPi {
                uri: Some("file:///b".into()),
            },
            &mut not_open,
        );
        assert_eq!(
            not_open["result"]["content"][0]["text"],
            "{\"file:///b\":[]}"
        );
    }

    #[test]
    fn diffs_on_claude_editors_use_marked_names_and_map_back() {
        let mut msg = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "openDiff", "arguments": {"tab_name": "pi-write:1"}}}).as_object().cloned().unwrap();
        let b = outbound(Family::Pi, Family::Claude, 7, "e", None, &mut msg)
            .unwrap()
            .unwrap();
        let sent = msg["params"]["arguments"]["tab_name"].as_str().unwrap();
        assert!(sent.contains('✻') && sent.contains('⧉'));
        let mut rejected = resp(jsonrpc::diff_rejected(sent));
        assert_eq!(inbound(&b, &mut rejected), None);
        assert_eq!(rejected["result"]["content"][1]["text"], "pi-write:1");
        let mut saved = resp(
            json!({"content": [{"type": "text", "text": "FILE_SAVED"}, {"type": "text", "text": "x"}]}),
        );
        assert_eq!(
            inbound(&b, &mut saved),
            Some(Followup::CloseTab(sent.to_string()))
        );
        let mut error_shaped = resp(json!({"code": -32000, "message": "Buffer operation error"}));
        inbound(&b, &mut error_shaped);
        assert_eq!(pi_reads_diff(&error_shaped), Some("rejected"));
    }

    #[test]
    fn missing_tools_are_refused_by_name() {
        let mut msg = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "getOpenEditorTabs"}}).as_object().cloned().unwrap();
        let tools = vec!["openDiff".to_string()];
        let e = outbound(
            Family::Pi,
            Family::Claude,
            1,
            "code-1",
            Some(&tools),
            &mut msg,
        )
        .unwrap_err();
        assert_eq!(e.0, -32601);
        assert!(e.1.contains("code-1"));
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-zA-Z ]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::hash_map("[a-z]{1,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn every_bridged_diagnostics_answer_parses_as_pi_parses_it(
            items in proptest::collection::vec(("[a-z:/]{1,12}", proptest::collection::vec(("Error|Warning|Info|Hint", "[a-z ]{0,10}"), 0..4)), 0..5),
            garbage in arb_json(),
        ) {
            let arr: Vec<Value> = items.iter().map(|(u, ds)| json!({"uri": u, "diagnostics": ds.iter().map(|(s, m)| json!({"severity": s, "message": m})).collect::<Vec<_>>()})).collect();
            let mut m = resp(text_result(Value::Array(arr).to_string()));
            inbound(&Bridge::DiagnosticsToPi { uri: None }, &mut m);
            prop_assert!(pi_parses_diagnostics(&m));
            // Whatever an editor sends as text, the pi side still gets a map.
            let mut g = resp(text_result(garbage.to_string()));
            inbound(&Bridge::DiagnosticsToPi { uri: None }, &mut g);
            prop_assert!(pi_parses_diagnostics(&g));
            let mut g2 = resp(garbage.clone());
            inbound(&Bridge::DiagnosticsToPi { uri: None }, &mut g2);
            prop_assert!(pi_parses_diagnostics(&g2));
        }

        #[test]
        fn every_bridged_diff_answer_is_saved_or_rejected_never_an_error(result in arb_json(), is_error in any::<bool>(), saved_text in "[a-z]{0,5}") {
            let b = Bridge::DiffOnClaude { session_tab: "pi-edit:1".into(), editor_tab: marked_tab(1, "pi-edit:1"), close_on_accept: true };
            let mut m = if is_error {
                json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "x", "data": result}}).as_object().cloned().unwrap()
            } else {
                resp(result)
            };
            inbound(&b, &mut m);
            let verdict = pi_reads_diff(&m);
            prop_assert!(verdict.is_some(), "{:?}", m);
            if verdict == Some("rejected") {
                prop_assert_eq!(&m["result"]["content"][1]["text"], "pi-edit:1");
            }
            let mut ok = resp(json!({"content": [{"type": "text", "text": "FILE_SAVED"}, {"type": "text", "text": saved_text}]}));
            prop_assert!(inbound(&b, &mut ok).is_some());
            prop_assert_eq!(pi_reads_diff(&ok), Some("saved"));
        }

        #[test]
        fn every_bridged_tabs_answer_is_a_pi_array(result in arb_json()) {
            let mut m = resp(text_result(json!({"tabs": [result.clone()]}).to_string()));
            inbound(&Bridge::TabsToPi, &mut m);
            let v: Value = serde_json::from_str(m["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
            prop_assert!(v.is_array());
        }
    }
}
