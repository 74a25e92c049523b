//! The real thing: code-server (VS Code 1.139) with the Claude Code extension from
//! `@anthropic-ai/claude-code@1.0.30`'s vsix, its workbench in headless Chromium
//! (`common::vscode`). Skipped without the tools, failed under CI without them.

use crate::common::vscode::{find_vscode, VsCode, VSCODE_WAIT};
use crate::common::*;
use pi_ide_broker::config::LockDirConfig;
use pi_ide_broker::family::Family;
use pi_ide_broker::testkit::rival::Rival;
use serde_json::{json, Value};
use std::time::Duration;

const BAD_JSON: &str = "{\n  \"a\": 1,,\n  \"b\": 2\n}\n";

/// A broker watching only the extension's lock dir, its editor ready; a Claude-dialect agent
/// attached to it.
async fn broker_on(
    vsc: &VsCode,
    tweak: impl FnOnce(&mut pi_ide_broker::config::Config),
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
            pi_ide_broker::percent::encode_query(&cwd)
        ),
    )
    .await
    .expect("agent");
    a.attached().await;
    (b, e, a)
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
async fn call(a: &mut Agent, id: i64, tool: &str, args: Value) -> Value {
    a.call_tool(json!(id), tool, args).await;
    tokio::time::timeout(VSCODE_WAIT, async {
        loop {
            match a.next_unbounded().await {
                Some(v) if v["id"] == id => return v,
                Some(_) => {}
                None => panic!("the session closed before answering {tool}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no answer to {tool}"))
}

fn text_of(v: &Value) -> String {
    v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_links_to_the_extension_lists_its_tools_and_relays_a_real_diagnostic_and_selection(
) {
    let Some(install) = find_vscode() else { return };
    let root = tempfile::tempdir().unwrap();
    let vsc = VsCode::start(&install, root.path(), &[("bad.json", BAD_JSON)]).await;
    let (b, e, mut a) = broker_on(&vsc, |_| {}).await;
    assert_eq!(e["ide_name"], "code-server", "{e:#}");
    assert_eq!(e["no_token"], false);
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
    // Open the file through the broker, selecting a line: VS Code's JSON server validates it,
    // and the selection reaches the session.
    let bad = vsc.workspace.join("bad.json");
    let opened = call(&mut a, 1, "openFile", json!({"filePath": bad, "preview": false, "startText": "\"b\"", "endText": "2", "makeFrontmost": true})).await;
    assert!(opened.get("result").is_some(), "{opened:#}");
    let sel = tokio::time::timeout(
        VSCODE_WAIT,
        a.until("selection_changed", |m| m["method"] == "selection_changed"),
    )
    .await;
    let sel = sel.expect("a selection_changed");
    assert!(
        sel["params"]["filePath"]
            .as_str()
            .is_some_and(|p| p.ends_with("bad.json")),
        "{sel:#}"
    );
    let uri = format!("file://{}", bad.display());
    let t0 = std::time::Instant::now();
    let diagnostics = loop {
        let last = call(&mut a, 2, "getDiagnostics", json!({"uri": uri})).await;
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
            break d;
        }
        assert!(
            t0.elapsed() < VSCODE_WAIT,
            "no diagnostic for {uri}: {last:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // VS Code's own JSON language server, on the line of the double comma (0-based line 1).
    assert!(
        diagnostics.iter().any(|d| d["source"] == "json"
            && d["severity"] == "Error"
            && d["range"]["start"]["line"] == 1),
        "{diagnostics:?}"
    );
    eprintln!("VS Code diagnostics for bad.json: {diagnostics:?}");
    a.close().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diff_accepted_and_one_rejected_in_vs_code_reach_the_session() {
    let Some(install) = find_vscode() else { return };
    let root = tempfile::tempdir().unwrap();
    let mut vsc = VsCode::start(&install, root.path(), &[("notes.txt", "old line\n")]).await;
    let (b, _e, mut a) = broker_on(&vsc, |_| {}).await;
    let path = vsc.workspace.join("notes.txt").display().to_string();
    for (n, verdict) in [(1, "accept"), (2, "reject")] {
        let tab = format!("✻ [Claude Code] notes.txt ({n}) ⧉");
        a.call_tool(json!(n), "openDiff", json!({"old_file_path": path, "new_file_path": path, "new_file_contents": format!("new line {n}\n"), "tab_name": tab})).await;
        let label = if verdict == "accept" {
            "Claude Code: Accept Proposed Changes"
        } else {
            "Claude Code: Reject Proposed Changes"
        };
        // The button shows once the diff editor is open.
        let t0 = std::time::Instant::now();
        loop {
            match vsc.drive(json!({"cmd": "click", "label": label})).await {
                Ok(()) => break,
                Err(e) if t0.elapsed() < VSCODE_WAIT => eprintln!("not yet: {e}"),
                Err(e) => panic!("could not {verdict} the diff: {e}\n{}", vsc.log()),
            }
        }
        let r = tokio::time::timeout(VSCODE_WAIT, a.until("the diff's verdict", |m| m["id"] == n))
            .await
            .expect("a verdict");
        let first = r["result"]["content"][0]["text"].clone();
        if verdict == "accept" {
            assert_eq!(first, "FILE_SAVED", "{r:#}");
            assert_eq!(r["result"]["content"][1]["text"], format!("new line {n}\n"));
        } else {
            assert_eq!(first, "DIFF_REJECTED", "{r:#}");
            assert!(
                r["result"]["_meta"].is_null(),
                "the user's own verdict: {r:#}"
            );
        }
    }
    a.close().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    // As Claude Code's CLI: the token header, and a reconnect whenever it is closed.
    let mut rival = Rival::start(port, Family::Claude.auth_header(), token, true).await;
    rival.wait_connected().await;
    let e = b.wait_editor(port, "taken").await;
    eprintln!("taken: {}", e["state_reason"]);
    tokio::time::sleep(idle).await;
    assert_eq!(
        rival.evictions(),
        0,
        "the user's client was closed while the broker was idle"
    );
    assert!(rival.is_connected());
    assert_eq!(rival.connections(), 1);
    assert_eq!(
        editor_by_port(&b.status().await, port).unwrap()["state"],
        "taken"
    );
    rival.leave().await;
    b.wait_editor(port, "ready").await;
    let r = call(&mut a, 1, "getWorkspaceFolders", json!({})).await;
    assert!(
        text_of(&r).contains(&vsc.workspace.display().to_string()),
        "{r:#}"
    );
    a.close().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    let st = b
        .wait_status("the session on the reloaded window", |st| {
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
