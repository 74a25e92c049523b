//! The real thing: code-server (VS Code 1.139) with the Claude Code extension from
//! `@anthropic-ai/claude-code@1.0.30`'s vsix, its workbench in headless Chromium
//! (`common::vscode`). Skipped without the tools, failed under CI without them.

use crate::common::vscode::{find_vscode, VsCode, VSCODE_WAIT};
use crate::common::*;
use pi_ide_broker::protocol::family::Family;
use pi_ide_broker::sys::config::LockDirConfig;
use pi_ide_broker::testkit::rival::Rival;
use pi_ide_broker::testkit::text;
use serde_json::{json, Value};
use std::time::Duration;

const BAD_JSON: &str = "{\n  \"a\": 1,,\n  \"b\": 2\n}\n";

/// A broker watching only the extension's lock dir, its editor ready; a Claude-dialect agent
/// attached to it.
async fn broker_on(
    vsc: &VsCode,
    tweak: impl FnOnce(&mut pi_ide_broker::sys::config::Config),
) -> (TestBroker, Value, Agent) {
    let dir = vsc.lock_dir.clone();
    let b = TestBroker::start_with(|c| {
        c.lock_dirs = Some(vec![LockDirConfig {
            path: dir,
            family: Family::Claude,
        }]);
        tweak(c);
    })
    .await;
    let (_, lock) = vsc.wait_lockfile(None).await;
    let port = lock_port(&vsc.lock_dir, &lock);
    let e = b.wait_editor(port, "ready").await;
    let cwd = vsc.workspace.display().to_string();
    let mut a = Agent::connect(
        &b.socket,
        &format!(
            "cwd={}&dialect=claude",
            pi_ide_broker::protocol::percent::encode_query(&cwd)
        ),
    )
    .await
    .expect("agent");
    a.attached().await;
    (b, e, a)
}

/// Waits until a session of `dialect` is attached to editor `e`.
async fn wait_attached(b: &TestBroker, e: &Value, dialect: &str) {
    let id = e["id"].as_str().unwrap_or_default().to_string();
    b.wait_status(&format!("a {dialect} session on {id}"), |st| {
        st["sessions"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["editor"] == id.as_str() && s["dialect"] == dialect)
        })
    })
    .await;
}

/// The port of the (only) lockfile in `dir` whose JSON is `lock`.
fn lock_port(dir: &std::path::Path, lock: &Value) -> u16 {
    std::fs::read_dir(dir)
        .expect("lock dir")
        .flatten()
        .find(|e| {
            std::fs::read_to_string(e.path())
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .as_ref()
                == Some(lock)
        })
        .and_then(|e| e.path().file_stem()?.to_str()?.parse().ok())
        .expect("a lockfile port")
}

/// Calls `tool` and returns the answer (bounded by the VS Code wait).
pub(crate) async fn call(a: &mut Agent, id: i64, tool: &str, args: Value) -> Value {
    a.call_tool(json!(id), tool, args).await;
    next_with_id(a, id).await
}

/// Types `text` at the end of the proposed line `line` of the open diff (its modified side),
/// retrying until the diff editor is there.
async fn edit_proposal(vsc: &mut VsCode, line: &str, text: &str) {
    let selector = format!(".editor.modified .view-line:has-text(\"{line}\")");
    let t0 = std::time::Instant::now();
    loop {
        match vsc
            .drive(json!({"cmd": "click", "selector": selector}))
            .await
        {
            Ok(()) => break,
            Err(e) if t0.elapsed() < VSCODE_WAIT => {
                eprintln!("no diff editor yet: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("no diff editor: {e}\n{}", vsc.log()),
        }
    }
    // The extension swallows typing into a new diff for its first second (its own timer, a
    // guard against keystrokes meant for the previous editor): wait it out.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    vsc.drive(json!({"cmd": "press", "key": "End"}))
        .await
        .expect("go to the end of the line");
    vsc.drive(json!({"cmd": "type", "text": text}))
        .await
        .expect("type");
    screenshot(vsc, "after-edit").await;
}

fn text_of(v: &Value) -> String {
    text(v).to_string()
}

/// The extension's tools, in the editor's status and in a session's `tools/list`.
async fn assert_lists_the_extensions_tools(e: &Value, a: &mut Agent) {
    let tools: Vec<&str> = e["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for t in [
        "openDiff",
        "getDiagnostics",
        "close_tab",
        "openFile",
        "getOpenEditors",
        "getWorkspaceFolders",
    ] {
        assert!(tools.contains(&t), "{t} missing from {tools:?}");
    }
    let list = a.request(json!("tl"), "tools/list", json!({})).await;
    assert_eq!(
        list["result"]["tools"].as_array().map(Vec::len),
        Some(tools.len())
    );
}

/// `getDiagnostics` for `uri`, asked again until VS Code's language server has reported some
/// (it validates a document only once it is open); returns them.
async fn first_diagnostics(a: &mut Agent, uri: &str) -> Vec<Value> {
    let t0 = std::time::Instant::now();
    loop {
        let last = call(a, 2, "getDiagnostics", json!({"uri": uri})).await;
        let parsed: Value = serde_json::from_str(&text_of(&last)).unwrap_or(Value::Null);
        let found = parsed.as_array().and_then(|files| {
            files.iter().find_map(|f| {
                f["diagnostics"]
                    .as_array()
                    .filter(|d| !d.is_empty())
                    .cloned()
            })
        });
        if let Some(d) = found {
            return d;
        }
        assert!(
            t0.elapsed() < VSCODE_WAIT,
            "no diagnostic for {uri}: {last:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn the_broker_links_to_the_extension_lists_its_tools_and_relays_a_real_diagnostic_and_selection(
) {
    let Some(install) = find_vscode() else { return };
    let root = tempfile::tempdir().unwrap();
    let mut vsc = VsCode::start(&install, root.path(), &[("bad.json", BAD_JSON)]).await;
    let (b, e, mut a) = broker_on(&vsc, |_| {}).await;
    assert_eq!(e["ide_name"], "code-server", "{e:#}");
    assert_eq!(e["no_token"], false);
    assert_lists_the_extensions_tools(&e, &mut a).await;
    // Open the file through the broker, selecting a line: VS Code's JSON server validates it,
    // and the selection reaches the session.
    let bad = vsc.workspace.join("bad.json");
    let opened = call(&mut a, 1, "openFile", json!({"filePath": bad, "preview": false, "startText": "\"b\"", "endText": "2", "makeFrontmost": true})).await;
    assert!(opened.get("result").is_some(), "{opened:#}");
    // The selection reaches a session whether it came before it attached (replayed) or after;
    // this one is pi-dialect (bridged).
    let cwd = pi_ide_broker::protocol::percent::encode_query(&vsc.workspace.display().to_string());
    let mut p = Agent::connect(&b.socket, &format!("cwd={cwd}"))
        .await
        .expect("pi agent");
    let sel = next_matching(&mut p, "a selection_changed for bad.json", |m| {
        m["method"] == "selection_changed"
            && m["params"]["filePath"]
                .as_str()
                .is_some_and(|f| f.ends_with("bad.json"))
    })
    .await;
    assert_eq!(sel["params"]["text"], "\"b\": 2", "{sel:#}");
    let uri = format!("file://{}", bad.display());
    let diagnostics = first_diagnostics(&mut a, &uri).await;
    // VS Code's own JSON language server, on the line of the double comma (0-based line 1).
    assert!(
        diagnostics.iter().any(|d| d["source"] == "json"
            && d["severity"] == "Error"
            && d["range"]["start"]["line"] == 1),
        "{diagnostics:?}"
    );
    eprintln!("VS Code diagnostics for bad.json: {diagnostics:?}");
    // The same through the bridge, for a pi-dialect session: a map of arrays by path.
    let bridged = call(&mut p, 3, "getDiagnostics", json!({"uri": uri})).await;
    let map: Value = serde_json::from_str(&text_of(&bridged)).unwrap_or(Value::Null);
    let diags = map
        .as_object()
        .and_then(|m| m.values().next())
        .and_then(Value::as_array);
    assert!(
        diags.is_some_and(|d| d.iter().any(|d| d["message"] == "Property expected")),
        "{bridged:#}"
    );
    assert!(b.status().await["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["bridged"] == true));
    // An @-mention from the editor (its own command, on the selection) reaches the sessions.
    vsc.drive(json!({"cmd": "command", "title": "Claude Code: Insert At-Mentioned"}))
        .await
        .expect("at-mention");
    let m = next_matching(&mut a, "an at_mentioned", |m| m["method"] == "at_mentioned").await;
    assert!(
        m["params"]["filePath"]
            .as_str()
            .is_some_and(|f| f.ends_with("bad.json")),
        "{m:#}"
    );
    // And for a Claude-dialect MCP client on the stdio door (`mcp --dialect claude`).
    let stdio = mcp_call(&b, &vsc, "getDiagnostics", json!({"uri": uri})).await;
    assert!(text_of(&stdio).contains("Property expected"), "{stdio:#}");
    p.close().await;
    a.close().await;
    b.stop().await;
}

/// One tool call through `pi-ide-broker mcp --dialect claude` (a child on real pipes, its own
/// config, the broker's socket), after the MCP handshake; returns the answer.
async fn mcp_call(b: &TestBroker, vsc: &VsCode, tool: &str, args: Value) -> Value {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let cfg = crate::common::process::write_config(b.dir.path(), "");
    let mut child = tokio::process::Command::new(crate::common::process::broker_bin())
        .arg("--config")
        .arg(&cfg)
        .args(["mcp", "--dialect", "claude", "--no-spawn", "--cwd"])
        .arg(&vsc.workspace)
        .env("PI_IDE_BROKER_SOCKET", &b.socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn mcp");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let frames = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "test"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": args}}),
    ];
    for f in frames {
        stdin
            .write_all(format!("{f}\n").as_bytes())
            .await
            .expect("write to mcp");
    }
    tokio::time::timeout(VSCODE_WAIT, async {
        while let Ok(Some(line)) = out.next_line().await {
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["id"] == 2 {
                return v;
            }
        }
        panic!("mcp ended before answering {tool}");
    })
    .await
    .unwrap_or_else(|_| panic!("mcp did not answer {tool}"))
}

#[tokio::test]
async fn diffs_accepted_edited_and_rejected_in_vs_code_reach_the_session() {
    let Some(install) = find_vscode() else { return };
    let root = tempfile::tempdir().unwrap();
    let mut vsc = VsCode::start(&install, root.path(), &[("notes.txt", "old line\n")]).await;
    let (b, _e, mut a) = broker_on(&vsc, |_| {}).await;
    let path = vsc.workspace.join("notes.txt").display().to_string();
    // Accepted with the title bar's button, edited in the diff's right side then accepted (the
    // edited text comes back), rejected with the button.
    for (n, verdict) in [(1, "accept"), (2, "edit"), (3, "reject")] {
        let tab = format!("✻ [Claude Code] notes.txt ({n}) ⧉");
        a.call_tool(json!(n), "openDiff", json!({"old_file_path": path, "new_file_path": path, "new_file_contents": format!("new line {n}\n"), "tab_name": tab})).await;
        match verdict {
            "edit" => {
                edit_proposal(&mut vsc, &format!("new line {n}"), " (edited)").await;
                click_when_shown(&mut vsc, "Claude Code: Accept Proposed Changes").await;
            }
            "accept" => click_when_shown(&mut vsc, "Claude Code: Accept Proposed Changes").await,
            _ => click_when_shown(&mut vsc, "Claude Code: Reject Proposed Changes").await,
        }
        let r = next_with_id(&mut a, n).await;
        let content = &r["result"]["content"];
        match verdict {
            "accept" => {
                assert_eq!(content[0]["text"], "FILE_SAVED", "{r:#}");
                assert_eq!(content[1]["text"], format!("new line {n}\n"));
            }
            "edit" => {
                assert_eq!(content[0]["text"], "FILE_SAVED", "{r:#}");
                assert_eq!(content[1]["text"], format!("new line {n} (edited)\n"));
            }
            _ => {
                assert_eq!(content[0]["text"], "DIFF_REJECTED", "{r:#}");
                assert!(
                    r["result"]["_meta"].is_null(),
                    "the user's own verdict: {r:#}"
                );
            }
        }
        // Claude Code closes an accepted diff's tab itself; so does the session here.
        if verdict != "reject" {
            let _ = call(&mut a, 100 + n, "close_tab", json!({"tab_name": tab})).await;
        }
    }
    a.close().await;
    b.stop().await;
}

/// A screenshot of the workbench into `$PI_IDE_BROKER_VSCODE_SCREENSHOTS/<name>.png`, when
/// that is set (to see what a failing step saw).
async fn screenshot(vsc: &mut VsCode, name: &str) {
    if let Ok(dir) = std::env::var("PI_IDE_BROKER_VSCODE_SCREENSHOTS") {
        let path = format!("{dir}/{name}.png");
        if let Err(e) = vsc.drive(json!({"cmd": "screenshot", "path": path})).await {
            eprintln!("no screenshot {path}: {e}");
        }
    }
}

/// Clicks the element labelled `label` once the diff editor shows it.
pub(crate) async fn click_when_shown(vsc: &mut VsCode, label: &str) {
    let t0 = std::time::Instant::now();
    loop {
        match vsc.drive(json!({"cmd": "click", "label": label})).await {
            Ok(()) => return,
            Err(e) if t0.elapsed() < VSCODE_WAIT => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("could not click {label}: {e}\n{}", vsc.log()),
        }
    }
}

/// The next message with `id` (others skipped), bounded by the VS Code wait.
async fn next_with_id(a: &mut Agent, id: i64) -> Value {
    next_matching(a, &format!("the answer to {id}"), |v| v["id"] == id).await
}

/// The next message for which `pred` holds (others skipped), bounded by the VS Code wait.
async fn next_matching(a: &mut Agent, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    tokio::time::timeout(VSCODE_WAIT, async {
        loop {
            match a.next_unbounded().await {
                Some(v) if pred(&v) => return v,
                Some(_) => {}
                None => panic!("the session closed before {what}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {what}"))
}

#[tokio::test]
async fn the_users_own_claude_code_keeps_the_extension_while_the_broker_is_idle() {
    let Some(install) = find_vscode() else { return };
    let idle = Duration::from_secs(
        std::env::var("PI_IDE_BROKER_VSCODE_IDLE_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    let root = tempfile::tempdir().unwrap();
    let vsc = VsCode::start(&install, root.path(), &[("a.txt", "a\n")]).await;
    let (b, e, mut a) = broker_on(&vsc, |c| c.editors.taken_probe_ms = 500).await;
    let port = e["port"].as_u64().unwrap() as u16;
    let (_, lock) = vsc.wait_lockfile(None).await;
    let token = lock["authToken"].as_str().map(String::from);
    // As Claude Code's CLI, with its token header: first a client that stays away once closed,
    // then one that reconnects whenever it is closed (Claude Code 2.1).
    for (n, reconnect) in [(1, false), (2, true)] {
        let mut rival =
            Rival::start(port, Family::Claude.auth_header(), token.clone(), reconnect).await;
        rival.wait_connected().await;
        let e = b.wait_editor(port, "taken").await;
        eprintln!(
            "taken (reconnecting rival: {reconnect}): {}",
            e["state_reason"]
        );
        tokio::time::sleep(idle).await;
        assert_eq!(
            rival.evictions(),
            0,
            "the user's client was closed while the broker was idle"
        );
        assert!(rival.is_connected());
        assert_eq!(rival.connections(), 1);
        let st = b.status().await;
        assert_eq!(editor_by_port(&st, port).unwrap()["state"], "taken");
        eprintln!(
            "the user's client kept the extension for {} s, 0 evictions",
            idle.as_secs()
        );
        rival.leave().await;
        b.wait_editor(port, "ready").await;
        let r = call(&mut a, n, "getWorkspaceFolders", json!({})).await;
        assert!(
            text_of(&r).contains(&vsc.workspace.display().to_string()),
            "{r:#}"
        );
    }
    a.close().await;
    b.stop().await;
}

#[tokio::test]
async fn a_reloaded_window_is_followed_by_the_session() {
    let Some(install) = find_vscode() else { return };
    let root = tempfile::tempdir().unwrap();
    let mut vsc = VsCode::start(&install, root.path(), &[("a.txt", "a\n")]).await;
    let (b, e, mut a) = broker_on(&vsc, |_| {}).await;
    let old_port = e["port"].as_u64().unwrap();
    let (old_path, _) = vsc.wait_lockfile(None).await;
    vsc.drive(json!({"cmd": "reload"})).await.expect("reload");
    let (_new_path, lock) = vsc.wait_lockfile(Some(&old_path)).await;
    let new_port = u64::from(lock_port(&vsc.lock_dir, &lock));
    assert_ne!(new_port, old_port);
    // The old extension host may serve on after the new one wrote its lockfile (seen in CI
    // under load): the new window is then a second one, and the session, sticky, moves when
    // the old goes, on VS Code's own time.
    let st = b
        .wait_status_for(VSCODE_WAIT, "the session on the reloaded window", |st| {
            let Some(ne) = editor_by_port(st, new_port as u16) else {
                return false;
            };
            ne["state"] == "ready" && st["sessions"][0]["editor"] == ne["id"]
        })
        .await;
    eprintln!(
        "after reload: {}",
        serde_json::to_string(&st["editors"]).unwrap_or_default()
    );
    let r = call(&mut a, 1, "getWorkspaceFolders", json!({})).await;
    assert!(
        text_of(&r).contains(&vsc.workspace.display().to_string()),
        "{r:#}"
    );
    a.close().await;
    b.stop().await;
}

#[tokio::test]
async fn a_pi_session_gets_vs_codes_selection_and_its_writes_are_reviewed_in_vs_code() {
    use crate::common::fake_model::{all_text, FakeModel, Reply};
    use crate::common::pi::{find_pi, pi_home, Pi};
    let (Some(install), Some(pi_install)) = (find_vscode(), find_pi()) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut vsc = VsCode::start(
        &install,
        root.path(),
        &[("src/main.rs", "fn main() {\n    let x = 1;\n}\n")],
    )
    .await;
    // The broker, and a Claude-dialect helper session that makes VS Code select a line.
    let (b, e, mut helper) = broker_on(&vsc, |_| {}).await;
    let model = FakeModel::start().await;
    let home = pi_home(root.path(), &model.models_json());
    let mut pi = Pi::start(&pi_install, &home, &vsc.workspace, &b.socket, &[]).await;
    pi.toast(0, "Auto-connected to code-server").await;
    wait_attached(&b, &e, "pi").await;
    let main = vsc.workspace.join("src/main.rs");
    let opened = call(&mut helper, 1, "openFile", json!({"filePath": main, "preview": false, "startText": "let x", "endText": "1;", "makeFrontmost": true})).await;
    assert!(opened.get("result").is_some(), "{opened:#}");
    pi.until("the widget", 0, |v| {
        v["method"] == "setWidget"
            && v["widgetLines"][0]
                .as_str()
                .is_some_and(|l| l.contains("main.rs"))
    })
    .await;
    pi.prompt("hello").await;
    let mut model = model;
    let text = all_text(&model.next_chat().await);
    assert!(
        text.contains("<editor>") && text.contains("src/main.rs") && text.contains("let x = 1;"),
        "{text}"
    );

    // A write accepted with an edit in VS Code's diff editor writes the edited text.
    let target = vsc.workspace.join("a.txt");
    let write = |path: &str, content: &str| Reply::Tool {
        name: "write".into(),
        args: json!({"path": path, "content": content}),
    };
    model.push(write("a.txt", "proposed\n"));
    let review = async {
        edit_proposal(&mut vsc, "proposed", " and edited").await;
        click_when_shown(&mut vsc, "Claude Code: Accept Proposed Changes").await;
    };
    tokio::join!(pi.prompt_reviewed("write it"), review);
    assert_eq!(
        std::fs::read_to_string(&target).ok().as_deref(),
        Some("proposed and edited\n")
    );
    // A write rejected there leaves the file alone.
    model.push(write("a.txt", "never\n"));
    let from = pi.mark();
    tokio::join!(
        pi.prompt_reviewed("write again"),
        click_when_shown(&mut vsc, "Claude Code: Reject Proposed Changes")
    );
    assert_eq!(
        std::fs::read_to_string(&target).ok().as_deref(),
        Some("proposed and edited\n")
    );
    let results = pi.tool_results(from);
    assert!(
        results
            .first()
            .is_some_and(|r| r.1 && r.2.contains("rejected")),
        "{results:?}"
    );
    pi.quit().await;
    helper.close().await;
    b.stop().await;
}

/// Issue 39's acceptance with the real extension: the user's own Claude Code (the rival, with
/// its token, reconnecting whenever closed, calling a tool every 3 s) holds VS Code; a session
/// that starts then in its folder is attached (`taken`, with the reason) and its first
/// `getDiagnostics` is answered on the first try; over a 60 s window the session calls every
/// 10 s. Every call of the session is answered, every call of the rival is answered (one cut by
/// an eviction is sent again, as a client does), and the rival is closed at most once per
/// session call, never while the session is idle.
#[tokio::test]
async fn the_users_claude_code_and_a_broker_session_share_vs_code() {
    use pi_ide_broker::testkit::rival::Calling;
    let Some(install) = find_vscode() else { return };
    let root = tempfile::tempdir().unwrap();
    let vsc = VsCode::start(&install, root.path(), &[("a.txt", "a\n")]).await;
    let (b, e, a) = broker_on(&vsc, |c| c.editors.taken_probe_ms = 500).await;
    a.close().await;
    let port = e["port"].as_u64().unwrap() as u16;
    let (_, lock) = vsc.wait_lockfile(None).await;
    let token = lock["authToken"].as_str().map(String::from);
    let calling = Calling {
        tool: "getWorkspaceFolders".into(),
        every: Duration::from_secs(3),
    };
    let mut rival = Rival::start_calling(
        port,
        Family::Claude.auth_header(),
        token,
        true,
        Some(calling),
    )
    .await;
    rival.wait_connected().await;
    let taken = b.wait_editor(port, "taken").await;
    let cwd = vsc.workspace.display().to_string();
    let query = format!(
        "cwd={}&dialect=claude",
        pi_ide_broker::protocol::percent::encode_query(&cwd)
    );
    let mut s = Agent::connect(&b.socket, &query).await.expect("agent");
    let att = s.attached().await;
    assert_eq!(att["params"]["editor"], taken["id"], "{att:#}");
    let st = b.status().await;
    let ed = editor_by_port(&st, port).unwrap();
    assert_eq!(ed["state"], "taken", "{ed:#}");
    assert!(ed["state_reason"].is_string(), "{ed:#}");
    let window = Duration::from_secs(60);
    let every = Duration::from_secs(10);
    let start = tokio::time::Instant::now();
    let mut calls = 0i64;
    while start.elapsed() < window {
        calls += 1;
        let tool = if calls == 1 {
            "getDiagnostics"
        } else {
            "getWorkspaceFolders"
        };
        let r = call(&mut s, calls, tool, json!({})).await;
        assert!(
            r.get("result").is_some(),
            "call {calls} ({tool}) answered on its first try: {r:#}"
        );
        tokio::time::sleep_until(start + every * calls as u32).await;
    }
    let closes = rival.evictions();
    eprintln!(
        "shared VS Code for {} s: {calls} session calls answered, the rival closed {closes} times, its calls {} sent / {} answered",
        window.as_secs(),
        rival.calls_sent(),
        rival.calls_answered()
    );
    assert!(
        closes <= calls as u64,
        "at most one close per session call: {closes} for {calls}"
    );
    // Idle now: after the hand-back the rival holds the editor and is left alone.
    b.wait_editor(port, "taken").await;
    rival.wait_connected().await;
    let before = rival.evictions();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        rival.evictions(),
        before,
        "the rival was closed while the session was idle"
    );
    // Every call of the rival is answered (the one in flight now, within its next turn).
    let sent = rival.calls_sent();
    pi_ide_broker::testkit::eventually("the rival's calls answered", || {
        (rival.calls_answered() >= sent).then_some(())
    })
    .await;
    rival.leave().await;
    s.close().await;
    b.stop().await;
}

/// An agent in a "container" (its `[[remote]]`'s own socket, its project at
/// `/workspaces/app`): routed to VS Code by its mapped cwd, the extension's tools listed, a
/// real diagnostic relayed with the agent's paths, and a diff it proposes accepted in VS Code.
#[tokio::test]
async fn a_remote_agents_diff_is_accepted_in_vs_code() {
    let Some(install) = find_vscode() else { return };
    let root = tempfile::tempdir().unwrap();
    let mut vsc = VsCode::start(
        &install,
        root.path(),
        &[("notes.txt", "old line\n"), ("bad.json", BAD_JSON)],
    )
    .await;
    let dir = vsc.lock_dir.clone();
    let host = vsc.workspace.clone();
    let b = TestBroker::start_with(|c| {
        c.lock_dirs = Some(vec![LockDirConfig {
            path: dir,
            family: Family::Claude,
        }]);
        c.remote = vec![pi_ide_broker::protocol::pathmap::RemoteConfig {
            name: "box".into(),
            agent: "/workspaces/app".into(),
            host,
        }];
    })
    .await;
    let (_, lock) = vsc.wait_lockfile(None).await;
    let e = b
        .wait_editor(lock_port(&vsc.lock_dir, &lock), "ready")
        .await;
    let remote = pi_ide_broker::sys::config::Config::remote_socket(&b.socket, "box");
    let mut a = Agent::connect(&remote, "cwd=/workspaces/app&dialect=claude")
        .await
        .expect("a session on the remote's socket");
    let att = a.attached().await;
    assert_eq!(att["params"]["editor"], e["id"], "{att:#}");
    assert_lists_the_extensions_tools(&e, &mut a).await;
    // The agent names its own paths; VS Code opens and validates the host's file.
    let opened = call(
        &mut a,
        1,
        "openFile",
        json!({"filePath": "/workspaces/app/bad.json", "preview": false, "startText": "\"b\"", "endText": "2", "makeFrontmost": true}),
    )
    .await;
    assert!(opened.get("result").is_some(), "{opened:#}");
    let diagnostics = first_diagnostics(&mut a, "file:///workspaces/app/bad.json").await;
    assert!(
        diagnostics.iter().any(|d| d["source"] == "json"),
        "{diagnostics:?}"
    );
    let tab = "✻ [Claude Code] notes.txt (r) ⧉";
    a.call_tool(
        json!(5),
        "openDiff",
        json!({"old_file_path": "/workspaces/app/notes.txt", "new_file_path": "/workspaces/app/notes.txt",
               "new_file_contents": "from the container\n", "tab_name": tab}),
    )
    .await;
    click_when_shown(&mut vsc, "Claude Code: Accept Proposed Changes").await;
    let r = next_with_id(&mut a, 5).await;
    assert_eq!(r["result"]["content"][0]["text"], "FILE_SAVED", "{r:#}");
    assert_eq!(r["result"]["content"][1]["text"], "from the container\n");
    let _ = call(&mut a, 6, "close_tab", json!({"tab_name": tab})).await;
    // What the remote sees of the host: its own session only.
    let st = pi_ide_broker::frontdoor::client::get_json(&remote, "/v1/status")
        .await
        .expect("status");
    assert_eq!(st["connection"]["rights"], "agent");
    assert_eq!(st["sessions"].as_array().map(Vec::len), Some(1), "{st:#}");
    a.close().await;
    b.stop().await;
}
