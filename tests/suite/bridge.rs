//! Issue: pi-family sessions on Claude-family editors (and back), through the real doors.

use crate::common::*;
use pi_ide_broker::protocol::family::Family;
use pi_ide_broker::testkit::fake_editor::next_tool_call;
use pi_ide_broker::testkit::pi_client::PiClient;
use pi_ide_broker::testkit::text;
use pi_ide_broker::testkit::{eventually, within};
use serde_json::{json, Value};

fn claude_opts(folders: &[&str]) -> Options {
    let mut o = Options::pi(folders);
    o.family = Family::Claude;
    o.ide_name = "Visual Studio Code".into();
    o
}

async fn claude_editor(b: &TestBroker, folder: &str) -> (FakeEditor, String) {
    let fe = FakeEditor::start_in(&b.claude_dir, claude_opts(&[folder]))
        .await
        .unwrap();
    let id = b.wait_editor(fe.port, "ready").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    (fe, id)
}

async fn pi_client_for(b: &TestBroker, cwd: &str) -> PiClient {
    let cand = compat_entry(&b.dir.path().join("compat"), cwd).await;
    PiClient::connect(&cand).await.unwrap()
}

#[tokio::test]
async fn a_pi_client_uses_a_claude_family_editor() {
    let b = TestBroker::start().await;
    let (fe, _) = claude_editor(&b, "/vs").await;
    let mut ev = fe.events();
    let mut c = pi_client_for(&b, "/vs/src").await;
    let st = b.status().await;
    assert_eq!(st["sessions"][0]["dialect"], "pi");
    assert_eq!(st["sessions"][0]["bridged"], true);

    // Diagnostics in the pi map shape, Info → Information; a file not open → {uri: []}.
    let diags = c.diagnostics().await.unwrap();
    assert_eq!(diags["file:///x.rs"][1]["severity"], "Information");
    let one = c
        .tool("getDiagnostics", json!({"uri": "file:///closed.rs"}))
        .await
        .unwrap();
    assert_eq!(text(&one), "{\"file:///closed.rs\":[]}");
    // Open tabs in the pi shape under the pi name.
    let tabs = c.tool("getOpenEditorTabs", json!({})).await.unwrap();
    let tabs: Value = serde_json::from_str(text(&tabs)).unwrap();
    assert_eq!(
        tabs,
        json!([{"uri": "file:///x.rs", "isActive": true, "isDirty": true, "languageId": "rust"}])
    );
    // A tool neither dialect maps: -32601 naming the editor.
    let missing = c.tool("getWorkspaceFolders", json!({})).await.unwrap();
    assert_eq!(missing["error"]["code"], -32601);
    assert!(
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("visualstudiocode-"),
        "{missing}"
    );

    // Accept: the editor sees a marked tab name, and the broker closes the accepted diff.
    let w = tokio::spawn(async move {
        let r = c.write_file("/vs/a.ts", "let a = 1;\n", "acc").await;
        (r, c)
    });
    let args = next_tool_call(&mut ev, "openDiff").await;
    let marked = args["tab_name"].as_str().unwrap().to_string();
    assert!(
        marked.contains('✻') && marked.contains('⧉') && marked.contains("pi-write:acc"),
        "{marked}"
    );
    assert!(fe.accept_diff(&marked, "let a = 2;\n"));
    let (r, mut c) = within("accept", w).await.unwrap();
    assert_eq!(r.unwrap().as_deref(), Some("let a = 2;\n"));
    eventually("accepted diff closed in the editor", || {
        fe.open_accepted().is_empty().then_some(())
    })
    .await;

    // Reject: the session gets its own tab name back, not the marked one.
    let w = tokio::spawn(async move {
        let r = c.open_diff_raw("/vs/b.ts", "pi-write:rej").await;
        (r, c)
    });
    let tab = eventually("diff pending", || fe.pending_diffs().first().cloned()).await;
    assert!(fe.reject_diff(&tab));
    let (r, mut c) = within("reject", w).await.unwrap();
    let v = r.unwrap();
    assert_eq!(text(&v), "DIFF_REJECTED");
    assert_eq!(v["result"]["content"][1]["text"], "pi-write:rej");

    // Another session's close_tab with the same plain name cannot close this session's diff:
    // each session's marked names carry its own session id.
    let w = tokio::spawn(async move {
        let r = c.open_diff_raw("/vs/c.ts", "pi-write:cancel").await;
        (r, c)
    });
    let pending = eventually("diff pending", || fe.pending_diffs().first().cloned()).await;
    let mut other = Agent::open(&b.socket, "/vs", None).await;
    other
        .call_tool(
            json!(1),
            "close_tab",
            json!({"tab_name": "pi-write:cancel"}),
        )
        .await;
    other.answer(&json!(1)).await;
    assert_eq!(
        fe.pending_diffs(),
        vec![pending.clone()],
        "another session closed this diff"
    );
    assert!(fe.reject_diff(&pending));
    let (r, _c) = within("cancelled diff", w).await.unwrap();
    assert_eq!(
        r.unwrap()["result"]["content"][1]["text"],
        "pi-write:cancel"
    );
    b.stop().await;
}

#[tokio::test]
async fn the_owner_cancels_with_its_own_tab_name() {
    let b = TestBroker::start().await;
    let (fe, _) = claude_editor(&b, "/vs").await;
    // A native pi-dialect session (the default dialect).
    let mut a = Agent::open(&b.socket, "/vs", None).await;
    a.call_tool(
        json!("d"),
        "openDiff",
        pi_ide_broker::testkit::diff_args("/vs/f", "x", "pi-edit:7"),
    )
    .await;
    eventually("diff pending", || fe.pending_diffs().first().cloned()).await;
    a.call_tool(json!("c"), "close_tab", json!({"tab_name": "pi-edit:7"}))
        .await;
    let closed = a.answer(&json!("c")).await;
    assert_eq!(text(&closed), "TAB_CLOSED");
    let d = a.answer(&json!("d")).await;
    assert_eq!(text(&d), "DIFF_REJECTED");
    assert_eq!(d["result"]["content"][1]["text"], "pi-edit:7");
    assert!(fe.pending_diffs().is_empty());
    b.stop().await;
}

#[tokio::test]
async fn two_pi_sessions_with_the_same_tab_name_never_collide() {
    let b = TestBroker::start().await;
    let (fe, _) = claude_editor(&b, "/vs").await;
    let mut a1 = Agent::open(&b.socket, "/vs", None).await;
    let mut a2 = Agent::open(&b.socket, "/vs", None).await;
    for a in [&mut a1, &mut a2] {
        a.call_tool(
            json!(1),
            "openDiff",
            pi_ide_broker::testkit::diff_args("/vs/f", "x", "pi-write:same"),
        )
        .await;
    }
    let tabs = eventually("two distinct editor tabs", || {
        let t = fe.pending_diffs();
        (t.len() == 2).then_some(t)
    })
    .await;
    assert_ne!(tabs[0], tabs[1]);
    assert!(fe.accept_diff(&tabs[0], "first\n"));
    assert!(fe.reject_diff(&tabs[1]));
    let r1 = a1.answer(&json!(1)).await;
    let r2 = a2.answer(&json!(1)).await;
    let mut verdicts = vec![text(&r1).to_string(), text(&r2).to_string()];
    verdicts.sort();
    assert_eq!(
        verdicts,
        vec!["DIFF_REJECTED", "FILE_SAVED"],
        "each session got its own verdict"
    );
    for r in [&r1, &r2] {
        if text(r) == "DIFF_REJECTED" {
            assert_eq!(r["result"]["content"][1]["text"], "pi-write:same");
        }
    }
    b.stop().await;
}

#[tokio::test]
async fn same_dialect_passes_through_untouched() {
    let b = TestBroker::start().await;
    let (_fe, _) = claude_editor(&b, "/vs").await;
    // Claude dialect on a Claude editor: the array shape and "Info" stay exactly as sent.
    let mut a = Agent::connect(&b.socket, "cwd=/vs&dialect=claude")
        .await
        .unwrap();
    let r = a.call("getDiagnostics", json!({})).await;
    assert_eq!(text(&r),
        json!([{"uri": "file:///x.rs", "diagnostics": [{"severity": "Error", "message": "boom"}, {"severity": "Info", "message": "fyi"}]}]).to_string()
    );
    let e = a
        .call("getDiagnostics", json!({"uri": "file:///nope"}))
        .await;
    assert_eq!(
        e["error"]["code"], -32001,
        "the editor's own error, unbridged"
    );
    let st = b.status().await;
    assert_eq!(st["sessions"][0]["bridged"], false);
    assert_eq!(st["sessions"][0]["dialect"], "claude");
    b.stop().await;
}

#[tokio::test]
async fn a_claude_session_on_a_pi_editor_gets_the_claude_shapes() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/nv"]).await;
    let mut a = Agent::connect(&b.socket, "cwd=/nv&dialect=claude")
        .await
        .unwrap();
    let tools = a.request(json!(0), "tools/list", json!({})).await;
    assert!(tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "getOpenEditors"));
    let r = a.call("getDiagnostics", json!({})).await;
    let arr: Value = serde_json::from_str(text(&r)).unwrap();
    assert_eq!(arr[0]["uri"], "file:///x.rs");
    assert_eq!(arr[0]["diagnostics"][1]["severity"], "Info");
    let t = a.call("getOpenEditors", json!({})).await;
    let tabs: Value = serde_json::from_str(text(&t)).unwrap();
    assert_eq!(tabs["tabs"][0]["label"], "x.rs");
    b.stop().await;
}

/// A pi session's write on a real Claude-family editor (claudecode.nvim): Neovim killed with
/// the diff open answers the write rejected as undelivered, never saved.
#[tokio::test]
async fn a_bridged_diff_is_rejected_never_saved_when_the_editor_dies() {
    use crate::common::nvim_editor::{NvimEditor, Plugin};
    let b = TestBroker::start().await;
    let vs = std::fs::canonicalize(b.dir.path()).unwrap().join("vs");
    std::fs::create_dir_all(&vs).unwrap();
    let Some(ed) = NvimEditor::start(&b, Plugin::ClaudeCode, &vs, "nvim").await else {
        return;
    };
    b.wait_editor(ed.port, "ready").await;
    let mut c = pi_client_for(&b, &vs.display().to_string()).await;
    let z = vs.join("z").display().to_string();
    let w = tokio::spawn(async move { c.write_verdict(&z, "z", "dies").await });
    ed.pending_until("the diff open in Neovim", |s| s.contains("dies"))
        .await;
    ed.kill().await;
    let r = within("answer", w).await.unwrap();
    assert!(
        matches!(
            &r,
            Ok(pi_ide_broker::testkit::pi_client::WriteVerdict::Rejected {
                undelivered: Some(_)
            })
        ),
        "rejected as undelivered, never saved: {r:?}"
    );
    assert!(!vs.join("z").exists(), "the file was written");
    b.stop().await;
}

/// claudecode's `close_tab` closes only marked names (✻ … ⧉): a Claude-dialect session that
/// opens a diff under a plain name still gets it closed when it leaves or cancels, and still
/// sees its own name in a rejection.
#[tokio::test]
async fn plain_named_diffs_on_a_claude_editor_can_always_be_closed() {
    let b = TestBroker::start().await;
    let (fe, _) = claude_editor(&b, "/cc").await;
    let mut ev = fe.events();
    // Rejected by the user: the session's own plain name comes back.
    let mut a = Agent::connect(&b.socket, "cwd=/cc&dialect=claude")
        .await
        .unwrap();
    a.attached().await;
    a.call_tool(
        json!(1),
        "openDiff",
        pi_ide_broker::testkit::diff_args("/cc/f", "x", "plain-1"),
    )
    .await;
    let sent = next_tool_call(&mut ev, "openDiff").await;
    let marked = sent["tab_name"].as_str().unwrap_or_default().to_string();
    assert!(
        marked.contains('✻') && marked.contains('⧉') && marked.contains("plain-1"),
        "{marked}"
    );
    assert!(fe.reject_diff(&marked));
    let r = a.answer(&json!(1)).await;
    assert_eq!(text(&r), "DIFF_REJECTED");
    assert_eq!(r["result"]["content"][1]["text"], "plain-1", "{r}");
    // Left while pending: closed in the editor under the marked name.
    a.call_tool(
        json!(2),
        "openDiff",
        pi_ide_broker::testkit::diff_args("/cc/f", "x", "plain-2"),
    )
    .await;
    let sent = next_tool_call(&mut ev, "openDiff").await;
    let marked = sent["tab_name"].as_str().unwrap_or_default().to_string();
    a.close().await;
    let closed = next_tool_call(&mut ev, "close_tab").await;
    assert_eq!(closed["tab_name"], marked.as_str());
    eventually("the diff closed in the editor", || {
        fe.pending_diffs().is_empty().then_some(())
    })
    .await;
    // Its own close_tab with the plain name closes it too.
    let mut c = Agent::connect(&b.socket, "cwd=/cc&dialect=claude")
        .await
        .unwrap();
    c.attached().await;
    c.call_tool(
        json!(3),
        "openDiff",
        pi_ide_broker::testkit::diff_args("/cc/f", "x", "plain-3"),
    )
    .await;
    next_tool_call(&mut ev, "openDiff").await;
    let r = c.call("close_tab", json!({"tab_name": "plain-3"})).await;
    assert!(r.get("result").is_some(), "{r}");
    assert!(fe.pending_diffs().is_empty(), "{:?}", fe.pending_diffs());
    b.stop().await;
}

/// A Claude-dialect session on a pi-family editor gets Claude Code's selection and folder
/// tools, answered by the broker in Claude Code's shapes.
#[tokio::test]
async fn claude_sessions_on_a_pi_editor_get_selection_and_folder_tools() {
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/pi-ed/proj"]).await;
    let mut a = Agent::connect(&b.socket, "cwd=/pi-ed/proj&dialect=claude")
        .await
        .unwrap();
    a.attached().await;
    let list = a.request(json!(1), "tools/list", json!({})).await;
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for t in [
        "getCurrentSelection",
        "getLatestSelection",
        "getWorkspaceFolders",
    ] {
        assert!(names.contains(&t), "{t} missing from {names:?}");
    }
    let call = |_id: i64, name: &str| json!({"name": name, "arguments": {}});
    let body = |r: &Value| -> Value {
        serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap_or("null")).unwrap()
    };
    let r = a
        .request(json!(2), "tools/call", call(2, "getCurrentSelection"))
        .await;
    assert_eq!(
        body(&r),
        json!({"success": false, "message": "No active editor found"})
    );
    let r = a
        .request(json!(3), "tools/call", call(3, "getLatestSelection"))
        .await;
    assert_eq!(
        body(&r),
        json!({"success": false, "message": "No selection available"})
    );
    fe.select("/pi-ed/proj/src/a.rs", "let a = 1;", 4);
    a.until("selection", |v| v["method"] == "selection_changed")
        .await;
    let r = a
        .request(json!(4), "tools/call", call(4, "getCurrentSelection"))
        .await;
    let sel = body(&r);
    assert_eq!(sel["success"], true, "{sel}");
    assert_eq!(sel["filePath"], "/pi-ed/proj/src/a.rs");
    assert_eq!(sel["fileUrl"], "file:///pi-ed/proj/src/a.rs");
    assert_eq!(sel["text"], "let a = 1;");
    assert_eq!(sel["selection"]["start"]["line"], 4);
    let r = a
        .request(json!(5), "tools/call", call(5, "getWorkspaceFolders"))
        .await;
    assert_eq!(
        body(&r),
        json!({"success": true, "rootPath": "/pi-ed/proj",
               "folders": [{"name": "proj", "uri": "file:///pi-ed/proj", "path": "/pi-ed/proj"}]})
    );
    b.stop().await;
}

/// claudecode's `at_mentioned` paths are relative to its cwd: sessions get them absolute.
#[tokio::test]
async fn at_mentioned_paths_reach_sessions_absolute() {
    let b = TestBroker::start().await;
    let (fe, _) = claude_editor(&b, "/cc-root").await;
    let mut a = Agent::connect(&b.socket, "cwd=/cc-root/sub&dialect=claude")
        .await
        .unwrap();
    a.attached().await;
    fe.broadcast(
        &json!({"jsonrpc": "2.0", "method": "at_mentioned", "params": {"filePath": "src/lib.rs", "lineStart": 2, "lineEnd": 4}})
            .to_string(),
    );
    let m = a
        .until("at_mentioned", |v| v["method"] == "at_mentioned")
        .await;
    assert_eq!(m["params"]["filePath"], "/cc-root/src/lib.rs", "{m}");
    assert_eq!(m["params"]["lineStart"], 2);
    fe.broadcast(
        &json!({"jsonrpc": "2.0", "method": "at_mentioned", "params": {"filePath": "docs/"}})
            .to_string(),
    );
    let m = a
        .until("at_mentioned dir", |v| v["method"] == "at_mentioned")
        .await;
    assert_eq!(m["params"]["filePath"], "/cc-root/docs/", "{m}");
    b.stop().await;
}

/// Issue 39: a pi-family session on a JetBrains IDE (the test kit's editor from the plugin's
/// documented tools, the recorded editors): diagnostics in pi's map with its severities renamed,
/// the open files from `get_all_opened_file_paths`, and a write reviewed through its
/// `openDiff` (accepted: the editor's text; rejected: `DIFF_REJECTED` with the session's tab).
#[tokio::test]
async fn a_pi_client_uses_a_jetbrains_editor() {
    let b = TestBroker::start().await;
    let (fe, _) = b.start_editor(Options::jetbrains(&["/jb"])).await;
    let mut ev = fe.events();
    let mut c = pi_client_for(&b, "/jb").await;
    let diags = c.diagnostics().await.unwrap();
    let severities: Vec<&str> = diags["file:///x.rs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["severity"].as_str())
        .collect();
    assert_eq!(severities, ["Error", "Hint", "Information"], "{diags:?}");
    let tabs = c.tool("getOpenEditorTabs", json!({})).await.unwrap();
    let tabs: Value = serde_json::from_str(text(&tabs)).unwrap();
    let uris: Vec<&str> = tabs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["uri"].as_str())
        .collect();
    assert_eq!(uris, ["file:///x.rs", "file:///y.rs"], "{tabs}");
    let w = tokio::spawn(async move {
        let r = c.write_file("/jb/a.kt", "val a = 1\n", "acc").await;
        (r, c)
    });
    let args = next_tool_call(&mut ev, "openDiff").await;
    assert_eq!(args["old_file_path"], "/jb/a.kt", "{args}");
    assert_eq!(args["new_file_contents"], "val a = 1\n", "{args}");
    let tab = args["tab_name"].as_str().unwrap().to_string();
    assert!(fe.accept_diff(&tab, "val a = 2\n"));
    let (r, mut c) = within("accept", w).await.unwrap();
    assert_eq!(r.unwrap().as_deref(), Some("val a = 2\n"));
    let w = tokio::spawn(async move { c.open_diff_raw("/jb/b.kt", "pi-write:rej").await });
    let tab = eventually("diff pending", || fe.pending_diffs().first().cloned()).await;
    assert!(fe.reject_diff(&tab));
    let v = within("reject", w).await.unwrap().unwrap();
    assert_eq!(text(&v), "DIFF_REJECTED");
    assert_eq!(v["result"]["content"][1]["text"], "pi-write:rej");
    b.stop().await;
}
