//! Issue 65: Copilot Chat's VS Code server as an editor. A fake of it (`testkit::copilot_chat`,
//! built from microsoft/vscode-copilot-chat's source) writes its lockfile and serves MCP over
//! Streamable HTTP on a Unix socket; the broker links it and every session uses it: a pi
//! session (compat door) and a Claude Code-style session (the stdio `mcp` door).

use crate::common::process::{broker_bin, isolate};
use crate::common::*;
use crate::stdio::Mcp;
use pi_ide_broker::testkit::copilot_chat::{Event, FakeCopilotChat, Options};
use pi_ide_broker::testkit::pi_client::{PiClient, WriteVerdict};
use pi_ide_broker::testkit::{eventually, text};
use serde_json::{json, Value};
use std::path::PathBuf;
use tokio::process::Command;

const IDE: &str = "Visual Studio Code (Copilot Chat)";

fn ide_dir(b: &TestBroker) -> PathBuf {
    b.dir.path().join("copilot-ide")
}

/// A fake Copilot Chat server for `folder`, its lockfile in the broker's watched dir.
async fn vscode(b: &TestBroker, folder: &str, opts: Options) -> FakeCopilotChat {
    let opts = Options {
        folders: vec![folder.to_string()],
        ..opts
    };
    FakeCopilotChat::start(&ide_dir(b), &b.dir.path().join("vscode-tmp"), opts).await
}

fn chat_editors(st: &Value) -> Vec<Value> {
    st["editors"]
        .as_array()
        .map(|a| a.iter().filter(|e| e["ide_name"] == IDE).cloned().collect())
        .unwrap_or_default()
}

/// Waits until the Copilot Chat editor for `folder` is ready; its id.
async fn linked(b: &TestBroker, folder: &str) -> String {
    let st = b
        .wait_status("the Copilot Chat editor to be ready", |st| {
            chat_editors(st)
                .iter()
                .any(|e| e["state"] == "ready" && e["workspace_folders"][0] == folder)
        })
        .await;
    let e = chat_editors(&st)
        .into_iter()
        .find(|e| e["workspace_folders"][0] == folder)
        .expect("linked");
    assert_eq!(e["family"], "claude");
    assert_eq!(
        e["pid"],
        std::process::id(),
        "the editor's pid is VS Code's"
    );
    e["id"].as_str().unwrap_or_default().to_string()
}

/// Selection and diagnostics set in the fake, cached by the broker.
async fn select_and_diagnose(b: &TestBroker, fake: &FakeCopilotChat, id: &str, file: &str) {
    fake.diagnose(file, "error", "boom");
    fake.select(file, "fn main() {}", 9);
    let reg = b.handle.registry().clone();
    eventually("the selection cached", || {
        reg.editor(id).and_then(|e| e.last_selection())
    })
    .await;
}

#[tokio::test]
async fn a_pi_session_uses_copilot_chat_and_the_editor_goes_with_its_lockfile() {
    let b = TestBroker::start().await;
    let mut fake = vscode(&b, "/w/app", Options::default()).await;
    let id = linked(&b, "/w/app").await;
    let st = b.status().await;
    assert_eq!(chat_editors(&st).len(), 1, "status shows it: {st}");
    // And where it comes from: Copilot Chat's own lockfile and socket.
    assert_eq!(
        st["copilot_chat_editors"],
        json!([{"editor": id, "lockfile": fake.lockfile, "socket": fake.socket}]),
        "{st}"
    );
    select_and_diagnose(&b, &fake, &id, "/w/app/main.rs").await;

    let cand = compat_entry(&b.dir.path().join("compat"), "/w/app/src").await;
    let mut pi = PiClient::connect(&cand).await.expect("pi connects");
    let diags = pi.diagnostics().await.expect("diagnostics");
    assert_eq!(diags["file:///w/app/main.rs"][0]["message"], "boom");
    assert_eq!(diags["file:///w/app/main.rs"][0]["severity"], "Error");
    let sel = pi.selection.clone().expect("the selection was replayed");
    assert_eq!(sel["filePath"], "/w/app/main.rs");
    assert_eq!(sel["text"], "fn main() {}");

    let (verdict, accepted) = tokio::join!(pi.write_verdict("/w/app/a.rs", "NEW", "c1"), async {
        let d = fake.next_diff().await;
        assert_eq!(d["original_file_path"], "/w/app/a.rs");
        assert_eq!(d["new_file_contents"], "NEW");
        fake.accept(d["tab_name"].as_str().unwrap_or_default())
    });
    assert!(accepted);
    assert_eq!(verdict.unwrap(), WriteVerdict::Saved("NEW".into()));
    let (verdict, rejected) = tokio::join!(pi.write_verdict("/w/app/a.rs", "NEWER", "c2"), async {
        let d = fake.next_diff().await;
        fake.reject(d["tab_name"].as_str().unwrap_or_default())
    });
    assert!(rejected);
    assert_eq!(
        verdict.unwrap(),
        WriteVerdict::Rejected { undelivered: None }
    );

    // Copilot Chat goes (its lockfile removed, as its dispose does): so do the adapter and its
    // lockfile, and the editor.
    let private = b.dir.path().join("run").join("copilot-editors");
    drop(fake);
    b.wait_status("the Copilot Chat editor to go", |st| {
        chat_editors(st).is_empty()
    })
    .await;
    eventually("the adapter's lockfile removed", || {
        let n = std::fs::read_dir(&private).map(|d| d.count()).unwrap_or(0);
        (n == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_claude_code_session_through_the_mcp_door_uses_copilot_chat() {
    let b = TestBroker::start().await;
    let mut fake = vscode(&b, "/w/cc", Options::default()).await;
    let id = linked(&b, "/w/cc").await;
    select_and_diagnose(&b, &fake, &id, "/w/cc/lib.rs").await;
    let mut cmd = Command::new(broker_bin());
    cmd.args([
        "mcp",
        "--cwd",
        "/w/cc",
        "--session",
        "claude-cc",
        "--no-spawn",
    ])
    .env("PI_IDE_BROKER_SOCKET", &b.socket);
    isolate(&mut cmd, b.dir.path());
    let mut m = Mcp::spawn(&mut cmd);
    let init = json!({"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "claude-code", "version": "2"}});
    m.request(json!(1), "initialize", init).await;
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let diags = m.call("getDiagnostics", json!({})).await;
    // The stdio door answers in its own (pi) dialect: a map by uri.
    let diags: Value = serde_json::from_str(text(&diags)).expect("diagnostics");
    assert_eq!(
        diags["file:///w/cc/lib.rs"][0]["message"], "boom",
        "{diags}"
    );
    assert_eq!(diags["file:///w/cc/lib.rs"][0]["severity"], "Error");
    let sel = m.call("getLatestSelection", json!({})).await;
    let sel: Value = serde_json::from_str(text(&sel)).expect("a selection");
    assert_eq!(sel["success"], true);
    assert_eq!(sel["filePath"], "/w/cc/lib.rs");
    assert_eq!(sel["selection"]["start"]["line"], 9);

    let args = |tab: &str| json!({"old_file_path": "/w/cc/b.rs", "new_file_path": "/w/cc/b.rs", "new_file_contents": "X", "tab_name": tab});
    let (saved, _) = tokio::join!(m.call("openDiff", args("t1")), async {
        let d = fake.next_diff().await;
        assert!(fake.accept(d["tab_name"].as_str().unwrap_or_default()));
    });
    assert_eq!(
        saved["result"]["content"][0]["text"], "FILE_SAVED",
        "{saved}"
    );
    assert_eq!(saved["result"]["content"][1]["text"], "X");
    let (rejected, _) = tokio::join!(m.call("openDiff", args("t2")), async {
        let d = fake.next_diff().await;
        assert!(fake.reject(d["tab_name"].as_str().unwrap_or_default()));
    });
    assert_eq!(
        rejected["result"]["content"][0]["text"], "DIFF_REJECTED",
        "{rejected}"
    );
    assert_eq!(rejected["result"]["content"][1]["text"], "t2");
    // What Copilot Chat cannot do is an error that says so, never a silent success.
    let open = m.call("openFile", json!({"filePath": "/w/cc/b.rs"})).await;
    // (the broker answers it from the tools the adapter lists, which leave it out)
    assert_eq!(open["error"]["code"], -32601, "{open}");
    assert!(
        open["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("no such tool"),
        "{open}"
    );
}

/// Who may use an adapter's loopback port: only a client holding the token of its lockfile,
/// which is 0600 in the broker's 0700 private dir. No token, a wrong one, or a browser's
/// `Origin` with the right one are refused before the upgrade; the editor's link stays up.
#[tokio::test(flavor = "current_thread")]
async fn the_adapters_port_refuses_a_missing_or_wrong_token_and_a_browser() {
    use std::os::unix::fs::PermissionsExt;
    let b = TestBroker::start().await;
    let _fake = vscode(&b, "/w/guard", Options::default()).await;
    let id = linked(&b, "/w/guard").await;
    let private = b.dir.path().join("run").join("copilot-editors");
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(
        mode(&private),
        0o700,
        "the private lock dir is the user's alone"
    );
    let file = std::fs::read_dir(&private)
        .expect("private dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "lock"))
        .expect("the adapter's lockfile");
    assert_eq!(mode(&file), 0o600);
    let port: u16 = file
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .expect("<port>.lock");
    let lock: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("json");
    let token = lock["authToken"].as_str().expect("a token").to_string();
    let header = "x-claude-code-ide-authorization";
    let refused = Some("Unexpected server response: 400");
    let wrong = PiClient::connect_with(port, header, "not-the-token-123456", None).await;
    assert_eq!(wrong.err().as_deref(), refused, "a wrong token");
    let missing = PiClient::connect_with(port, "x-something", &token, None).await;
    assert_eq!(missing.err().as_deref(), refused, "no token header");
    let browser = PiClient::connect_with(port, header, &token, Some("https://evil.example")).await;
    assert_eq!(browser.err().as_deref(), refused, "a browser's Origin");
    assert!(
        PiClient::connect_with(port, header, &token, None)
            .await
            .is_ok(),
        "the token's holder is let in"
    );
    b.wait_status("the editor still ready", |st| {
        chat_editors(st)
            .iter()
            .any(|e| e["id"] == id.as_str() && e["state"] == "ready")
    })
    .await;
}

#[tokio::test]
async fn the_brokers_own_copilot_lockfiles_are_never_linked() {
    let b = TestBroker::start_with(|c| {
        c.edit_section(|s: &mut pi_ide_broker::frontdoor::copilot::CopilotConfig| s.enabled = true)
    })
    .await;
    let (_fe, _) = b.editor(&["/w/nvim"]).await;
    // The copilot door's lockfile for that editor, in the very dir Copilot Chat writes to.
    let ours = eventually("the copilot door's lockfile", || {
        std::fs::read_dir(ide_dir(&b))
            .ok()?
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(".lock"))
            .map(|e| e.path())
    })
    .await;
    // A real server's lockfile written after it: once that is linked, ours was read first.
    let _fake = vscode(&b, "/w/vs", Options::default()).await;
    linked(&b, "/w/vs").await;
    let st = b.status().await;
    let names: Vec<&str> = st["editors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["ide_name"].as_str())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        !names.iter().any(|n| n.contains("via pi-ide-broker")),
        "{names:?}"
    );
    let rejected = st["lockfiles_rejected"].to_string();
    assert!(
        !rejected.contains(&*ours.to_string_lossy()),
        "ours is skipped silently: {rejected}"
    );
}

#[tokio::test]
async fn bad_lockfiles_are_refused_once_and_others_keep_working() {
    let b = TestBroker::start().await;
    let dir = ide_dir(&b);
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.lock");
    std::fs::write(&garbage, "not json at all").unwrap();
    let dead = dir.join("dead.lock");
    let body = json!({"socketPath": "/nowhere/mcp.sock", "scheme": "unix", "headers": {}, "pid": i32::MAX - 1, "ideName": "Visual Studio Code", "timestamp": 1, "workspaceFolders": ["/w/dead"]});
    std::fs::write(&dead, body.to_string()).unwrap();
    let wrong = Options {
        lockfile_nonce: Some("00000000-0000-4000-8000-000000000000".into()),
        ..Options::default()
    };
    let mut liar = vscode(&b, "/w/liar", wrong).await;
    let _good = vscode(&b, "/w/good", Options::default()).await;
    linked(&b, "/w/good").await;
    assert_eq!(liar.next_event().await, Event::Refused(401));
    let st = b
        .wait_status("the three bad lockfiles listed as refused", |st| {
            let r = st["lockfiles_rejected"].to_string();
            [&garbage, &dead, &liar.lockfile]
                .iter()
                .all(|p| r.contains(&*p.to_string_lossy()))
        })
        .await;
    let reasons: Vec<String> = st["lockfiles_rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("not JSON")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("not running")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("refused the lockfile's headers")),
        "{reasons:?}"
    );
    assert!(
        !reasons.iter().any(
            |r| r.contains(&liar.lockfile.to_string_lossy().to_string()) && r.contains("Nonce")
        ),
        "the nonce never shows"
    );
    assert_eq!(chat_editors(&st).len(), 1, "only the good one is linked");
}

/// The real Claude Code (2.1.332, `PI_IDE_BROKER_CLAUDE`) with a model (the fake Messages API)
/// and `pi-ide-broker mcp --dialect claude` as its `editor` MCP server, the editor being
/// Copilot Chat's VS Code server: the model asks for the selection and the diagnostics, and is
/// given the fake's; it proposes an edit, the diff opens in Copilot Chat, the user accepts, and
/// the model is told FILE_SAVED.
#[tokio::test]
async fn real_claude_code_through_mcp_gets_the_selection_diagnostics_and_a_reviewed_diff() {
    use crate::common::fake_anthropic::{FakeAnthropic, Reply};
    use crate::stdio::{claude_command, claude_finished, claude_from, door_config};
    let Some(claude) = claude_from("PI_IDE_BROKER_CLAUDE") else {
        return;
    };
    let _heavy = crate::common::machine_heavy().await;
    let b = TestBroker::start().await;
    let mut fake = vscode(&b, "/w/real", Options::default()).await;
    let id = linked(&b, "/w/real").await;
    fake.diagnose("/w/real/lib.rs", "error", "boom: no such field");
    fake.select("/w/real/lib.rs", "let selected_here = 1;", 4);
    let reg = b.handle.registry().clone();
    eventually("the selection cached", || {
        reg.editor(&id).and_then(|e| e.last_selection())
    })
    .await;
    let root = b.dir.path().to_path_buf();
    let config = door_config(&root, "/w/real", None);
    let mut model = FakeAnthropic::start().await;
    let tool = |name: &str, args: Value| Reply::Tool {
        name: format!("mcp__editor__{name}"),
        args,
    };
    model.push(tool("getCurrentSelection", json!({})));
    model.push(tool("getDiagnostics", json!({})));
    model.push(tool(
        "openDiff",
        json!({"old_file_path": "/w/real/lib.rs", "new_file_path": "/w/real/lib.rs",
               "new_file_contents": "let fixed = 1;\n", "tab_name": "cc-review"}),
    ));
    model.push(Reply::Text("the fix is in".into()));
    let tools = [
        "mcp__editor__getCurrentSelection",
        "mcp__editor__getDiagnostics",
        "mcp__editor__openDiff",
    ];
    let mut cmd = claude_command(
        &claude,
        &root,
        "fix lib.rs",
        &config,
        model.port,
        &b.socket,
        &tools,
    );
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start Claude Code");
    let d = fake.next_diff().await;
    assert_eq!(d["original_file_path"], "/w/real/lib.rs", "{d}");
    assert_eq!(d["new_file_contents"], "let fixed = 1;\n", "{d}");
    assert!(fake.accept(d["tab_name"].as_str().unwrap_or_default()));
    let stdout = claude_finished(child).await;
    assert!(stdout.contains("the fix is in"), "{stdout}");
    let results = model.tool_results();
    assert!(
        results.iter().any(|r| r.contains("let selected_here = 1;")),
        "the model never got the selection: {results:?}"
    );
    assert!(
        results.iter().any(|r| r.contains("boom: no such field")),
        "the model never got the diagnostic: {results:?}"
    );
    // The request after the review carries the verdict: the last tool result is the diff's,
    // saved with the proposed text.
    assert!(
        results
            .last()
            .is_some_and(|r| r.contains("FILE_SAVED") && r.contains("let fixed = 1;")),
        "{results:?}"
    );
    b.stop().await;
}
