//! Issue 28: the gemini door — Gemini CLI's IDE companion protocol (discovery files, MCP over
//! Streamable HTTP) served for every editor, with a real SDK client (`common::gemini`).

use crate::common::gemini::*;
use crate::common::*;
use pi_ide_broker::testkit::fake_editor::next_answer;
use pi_ide_broker::testkit::text;
use pi_ide_broker::testkit::{eventually, within};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

fn gemini_dir(b: &TestBroker) -> PathBuf {
    b.dir.path().join("gemini")
}

/// A broker, an editor on `folder`, its discovery file, and a connected SDK client.
async fn setup(g: &GeminiInstall, folder: &str) -> (TestBroker, FakeEditor, Discovery, McpClient) {
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&[folder]).await;
    let d = one_discovery(&gemini_dir(&b), folder).await;
    let c = connected(g, &d).await;
    (b, fe, d, c)
}

async fn connected(g: &GeminiInstall, d: &Discovery) -> McpClient {
    let (c, first) = McpClient::connect(g, d.port, Some(&d.token)).await;
    assert_eq!(first["ev"], "connected", "{first}");
    c
}

/// The one diff pending in `fe` (waits for it).
async fn pending_tab(fe: &FakeEditor) -> String {
    eventually("a diff pending in the editor", || {
        let p = fe.pending_diffs();
        (p.len() == 1).then(|| p[0].clone())
    })
    .await
}

/// Moves the editor's cursor to `file` and waits until `c` hears of it: every notification
/// sent to `c` before it has then arrived (one stream, in order) and is in `c.notes`.
async fn barrier(fe: &FakeEditor, c: &mut McpClient, file: &str) {
    fe.select(file, "", 0);
    loop {
        let p = c.notification("ide/contextUpdate").await;
        if p["workspaceState"]["openFiles"][0]["path"] == file {
            return;
        }
    }
}

fn diff_notes(c: &McpClient) -> Vec<&Value> {
    c.notes
        .iter()
        .filter(|n| {
            n["method"]
                .as_str()
                .is_some_and(|m| m.starts_with("ide/diff"))
        })
        .collect()
}

#[tokio::test]
async fn a_discovery_file_appears_and_vanishes_with_its_editor_and_the_broker() {
    let b = TestBroker::start_with(|c| c.editor_grace_ms = 200).await;
    let dir = gemini_dir(&b);
    let (fe, _) = b.editor(&["/g/one"]).await;
    let d = one_discovery(&dir, "/g/one").await;
    assert_eq!(d.pid, std::process::id(), "named with the editor's pid");
    assert_eq!(d.body["port"], d.port);
    assert_eq!(d.body["ideInfo"]["name"], "neovim");
    assert_eq!(d.body["ideInfo"]["displayName"], "Neovim");
    assert_eq!(d.token.len(), 32);
    assert_ne!(
        d.token,
        fe.token(),
        "the broker's own token, not the editor's"
    );
    let mode = std::fs::metadata(&d.path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let dmode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(dmode, 0o700);
    // Qwen Code's lock file for the same endpoint (it deletes one whose ppid is dead).
    let qwen = b
        .dir
        .path()
        .join("qwen-ide")
        .join(format!("{}.lock", d.port));
    // Written after the discovery file: waited for, not assumed.
    let q: Value = eventually("Qwen Code's lock file", || {
        serde_json::from_str(&std::fs::read_to_string(&qwen).ok()?).ok()
    })
    .await;
    assert_eq!(q["ppid"], std::process::id());
    assert_eq!(
        (&q["port"], &q["authToken"]),
        (&d.body["port"], &d.body["authToken"])
    );
    assert_eq!(q["workspacePath"], "/g/one");
    assert_eq!(q["ideName"], "Neovim");
    assert_eq!(
        std::fs::metadata(&qwen).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // The editor goes for good: its file goes.
    fe.remove_lockfile();
    fe.crash().await;
    within("the discovery files removed", async {
        while d.path.exists() || qwen.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    // The broker stops: every file goes; a foreign file stays.
    let foreign = dir.join("gemini-ide-server-1-1.json");
    std::fs::write(&foreign, r#"{"port":1}"#).unwrap();
    let (_fe2, _) = b.editor(&["/g/two"]).await;
    let d2 = one_discovery(&dir, "/g/two").await;
    let _kept = b.stop_keep_dir().await;
    assert!(!d2.path.exists(), "removed on shutdown");
    assert!(
        foreign.exists(),
        "a file without our marker is never touched"
    );
}

#[tokio::test]
async fn a_missing_or_wrong_token_a_browser_origin_and_a_foreign_host_are_refused() {
    let Some(g) = find_gemini() else { return };
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/g/auth"]).await;
    let d = one_discovery(&gemini_dir(&b), "/g/auth").await;

    // The SDK client, as Gemini CLI makes it, without a token and with a wrong one.
    let (_c, first) = McpClient::connect(&g, d.port, None).await;
    assert_eq!(first["ev"], "connect-failed", "{first}");
    let (_c, first) =
        McpClient::connect(&g, d.port, Some("0123456789abcdef0123456789abcdef")).await;
    assert_eq!(first["ev"], "connect-failed", "{first}");

    let host = format!("127.0.0.1:{}", d.port);
    let auth = format!("Authorization: Bearer {}\r\n", d.token);
    // The same request passes with nothing wrong in it...
    assert_eq!(
        raw_status(d.port, &initialize_request(d.port, &host, &auth)).await,
        200
    );
    let localhost = format!("localhost:{}", d.port);
    assert_eq!(
        raw_status(d.port, &initialize_request(d.port, &localhost, &auth)).await,
        200
    );
    // ...and is refused with a browser's Origin, or a Host that is not this port on loopback
    // (DNS rebinding: evil.example resolving to 127.0.0.1).
    let origin = format!("{auth}Origin: http://evil.example\r\n");
    assert_eq!(
        raw_status(d.port, &initialize_request(d.port, &host, &origin)).await,
        403
    );
    let rebinding = format!("evil.example:{}", d.port);
    assert_eq!(
        raw_status(d.port, &initialize_request(d.port, &rebinding, &auth)).await,
        403
    );
    assert_eq!(
        raw_status(d.port, &initialize_request(d.port, "127.0.0.1:1", &auth)).await,
        403
    );
    assert_eq!(
        raw_status(d.port, &initialize_request(d.port, &host, "")).await,
        401
    );
    // A body over max_frame_bytes is refused from its length.
    let big = format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        1u64 << 40
    );
    assert_eq!(raw_status(d.port, &big).await, 413);
    // Only the two sessions initialized above may exist (refused requests made none).
    let st = b.status().await;
    let gemini = st["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["door"] == "gemini")
        .count();
    // (A session without an event stream ends after ABANDONED_AFTER: at most, never more.)
    assert!(gemini <= 2, "{st}");
    b.stop().await;
}

#[tokio::test]
async fn an_accepted_diff_reaches_only_its_session_with_the_editors_text() {
    let Some(g) = find_gemini() else { return };
    let (b, fe, d, mut a) = setup(&g, "/g/w").await;
    let mut other = connected(&g, &d).await;
    let tools = a.list_tools().await;
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"openDiff") && names.contains(&"closeDiff"),
        "{tools}"
    );
    let st = b.status().await;
    assert!(
        st["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["door"] == "gemini"),
        "{st}"
    );
    assert_eq!(
        st["gemini_files"][0]["path"],
        d.path.display().to_string(),
        "{st}"
    );
    assert_eq!(
        st["gemini_files"][0]["editor"], st["editors"][0]["id"],
        "{st}"
    );

    let r = a
        .call(
            "openDiff",
            json!({"filePath": "/g/w/a.rs", "newContent": "fn a() {}\n"}),
        )
        .await;
    assert_eq!(r["result"]["content"], json!([]), "answered at once: {r}");
    let tab = pending_tab(&fe).await;
    assert!(fe.accept_diff(&tab, "fn a() {} // edited\n"));
    let n = a.notification("ide/diffAccepted").await;
    assert_eq!(
        n,
        json!({"filePath": "/g/w/a.rs", "content": "fn a() {} // edited\n"})
    );

    // The other session on the same editor heard nothing of it.
    barrier(&fe, &mut other, "/g/w/after.rs").await;
    assert!(diff_notes(&other).is_empty(), "{:?}", other.notes);

    // A rejection.
    a.call(
        "openDiff",
        json!({"filePath": "/g/w/b.rs", "newContent": "b\n"}),
    )
    .await;
    let tab = pending_tab(&fe).await;
    assert!(fe.reject_diff(&tab));
    let n = a.notification("ide/diffRejected").await;
    assert_eq!(n, json!({"filePath": "/g/w/b.rs"}));
    a.close().await;
    other.close().await;
    b.stop().await;
}

#[tokio::test]
async fn close_diff_closes_the_tab_and_answers_the_proposed_text() {
    let Some(g) = find_gemini() else { return };
    let (b, fe, _d, mut a) = setup(&g, "/g/c").await;
    a.call(
        "openDiff",
        json!({"filePath": "/g/c/x.rs", "newContent": "x\n"}),
    )
    .await;
    pending_tab(&fe).await;
    let r = a
        .call(
            "closeDiff",
            json!({"filePath": "/g/c/x.rs", "suppressNotification": true}),
        )
        .await;
    let v: Value = serde_json::from_str(text(&r)).unwrap_or_default();
    assert_eq!(v, json!({"content": "x\n"}), "{r}");
    eventually("the diff closed in the editor", || {
        fe.pending_diffs().is_empty().then_some(())
    })
    .await;
    barrier(&fe, &mut a, "/g/c/y.rs").await;
    assert!(diff_notes(&a).is_empty(), "suppressed: {:?}", a.notes);
    // Nothing open for that path now.
    let r = a.call("closeDiff", json!({"filePath": "/g/c/x.rs"})).await;
    assert_eq!(text(&r), r#"{"content":null}"#, "{r}");
    a.close().await;
    b.stop().await;
}

#[tokio::test]
async fn a_selection_becomes_context_and_a_new_session_gets_it_at_once() {
    let Some(g) = find_gemini() else { return };
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/g/s"]).await;
    let d = one_discovery(&gemini_dir(&b), "/g/s").await;
    let mut agent = Agent::open(&b.socket, "/g/s", None).await;
    agent.attached().await;
    fe.select("/g/s/main.rs", "fn main", 4);
    // Once a native session has it, the broker has it (both come from its one link).
    agent
        .until("selection", |v| v["method"] == "selection_changed")
        .await;
    let mut c = connected(&g, &d).await;
    let n = c.notification("ide/contextUpdate").await;
    let f = &n["workspaceState"]["openFiles"][0];
    assert_eq!(f["path"], "/g/s/main.rs");
    assert_eq!(f["isActive"], true);
    assert_eq!(f["cursor"], json!({"line": 5, "character": 8}), "1-based");
    assert_eq!(f["selectedText"], "fn main");

    // A huge selection is capped at 16 KiB; the previous file stays listed, inactive.
    fe.select("/g/s/big.rs", &"x".repeat(40_000), 0);
    let n = c.notification("ide/contextUpdate").await;
    let files = n["workspaceState"]["openFiles"].as_array().unwrap();
    assert_eq!(files[0]["path"], "/g/s/big.rs");
    assert_eq!(files[0]["selectedText"].as_str().unwrap().len(), 16 * 1024);
    assert_eq!(files[1]["path"], "/g/s/main.rs");
    assert!(files[1].get("isActive").is_none() && files[1].get("cursor").is_none());
    // A diff's proposed side is not a file.
    fe.select("/g/s/big.rs [pi-proposed]", "", 0);
    barrier(&fe, &mut c, "/g/s/last.rs").await;
    assert!(c.notes.is_empty(), "{:?}", c.notes);
    c.close().await;
    b.stop().await;
}

#[tokio::test]
async fn a_killed_editor_rejects_the_pending_diff_at_once_and_its_restart_is_followed() {
    let Some(g) = find_gemini() else { return };
    let (b, fe, d, mut c) = setup(&g, "/g/k").await;
    c.call(
        "openDiff",
        json!({"filePath": "/g/k/f.rs", "newContent": "f\n"}),
    )
    .await;
    pending_tab(&fe).await;
    fe.remove_lockfile();
    let killed = std::time::Instant::now();
    fe.crash().await;
    let n = tokio::time::timeout(Duration::from_secs(1), c.notification("ide/diffRejected"))
        .await
        .expect("ide/diffRejected within 1 s of the editor's death");
    assert_eq!(n, json!({"filePath": "/g/k/f.rs"}));
    eprintln!(
        "ide/diffRejected {:?} after the editor's death",
        killed.elapsed()
    );
    b.wait_editor_gone(fe.port).await;

    // Its restart (a new process on a new port, same folder) is followed by the same session,
    // and the same discovery file (port and token) stands for it.
    let (fe2, _) = b.start_editor(Options::pi(&["/g/k"])).await;
    let again = one_discovery(&gemini_dir(&b), "/g/k").await;
    assert_eq!(
        (again.port, again.token.as_str()),
        (d.port, d.token.as_str())
    );
    let mut ok = false;
    for _ in 0..50 {
        // Until the session is rebound to the successor, a diff is rejected as undeliverable.
        c.call(
            "openDiff",
            json!({"filePath": "/g/k/g.rs", "newContent": "g\n"}),
        )
        .await;
        let pending = within("a diff on the successor, or a rejection", async {
            loop {
                if !fe2.pending_diffs().is_empty() {
                    return true;
                }
                if let Some(i) = c
                    .notes
                    .iter()
                    .position(|n| n["method"] == "ide/diffRejected")
                {
                    c.notes.remove(i);
                    return false;
                }
                // The next notification, or another look at the editor in 20 ms: a diff that
                // reaches the successor comes with no notification at all.
                let next = c.until("a notification", |v| v["ev"] == "notification");
                if let Ok(n) = tokio::time::timeout(Duration::from_millis(20), next).await {
                    c.notes.push(n);
                }
            }
        });
        if pending.await {
            ok = true;
            break;
        }
    }
    assert!(ok, "the session never reached the restarted editor");
    let tab = pending_tab(&fe2).await;
    assert!(fe2.accept_diff(&tab, "g edited\n"));
    let n = c.notification("ide/diffAccepted").await;
    assert_eq!(n["content"], "g edited\n");
    c.close().await;
    b.stop().await;
}

#[tokio::test]
async fn editor_requests_never_go_to_a_gemini_session() {
    let Some(g) = find_gemini() else { return };
    let (b, fe, _d, mut c) = setup(&g, "/g/r").await;
    let mut agent = Agent::open(&b.socket, "/g/r", None).await;
    agent.attached().await;
    // The gemini session is the most recently active one: its diff went to the editor last.
    c.call(
        "openDiff",
        json!({"filePath": "/g/r/x.rs", "newContent": "x\n"}),
    )
    .await;
    let tab = pending_tab(&fe).await;
    assert!(fe.reject_diff(&tab));
    c.notification("ide/diffRejected").await;
    let mut ev = fe.events();
    fe.request_suggestions().expect("a client");
    let req = agent
        .until("getSuggestions", |v| v["method"] == "getSuggestions")
        .await;
    agent
        .send_text(
            &json!({"jsonrpc": "2.0", "id": req["id"], "result": {"suggestions": []}}).to_string(),
        )
        .await;
    let answer = next_answer(&mut ev, "the agent's answer").await;
    assert!(answer.get("result").is_some(), "{answer}");
    agent.close().await;
    // With only the gemini session left, the editor's request gets its usual error.
    let mut ev = fe.events();
    b.wait_status("only the gemini session left", |st| {
        st["sessions"].as_array().is_some_and(|s| s.len() == 1)
    })
    .await;
    fe.request_suggestions().expect("a client");
    let answer = next_answer(&mut ev, "an error answer").await;
    assert!(answer.get("error").is_some(), "{answer}");
    c.close().await;
    b.stop().await;
}

#[tokio::test]
async fn a_claude_family_editor_gets_a_marked_tab_and_its_accepted_diff_closed() {
    let Some(g) = find_gemini() else { return };
    let b = TestBroker::start().await;
    let mut opts = Options::pi(&["/g/cl"]);
    opts.family = pi_ide_broker::protocol::family::Family::Claude;
    opts.ide_name = "VS Code".into();
    let fe = FakeEditor::start_in(&b.claude_dir, opts).await.unwrap();
    b.wait_editor(fe.port, "ready").await;
    let d = one_discovery(&gemini_dir(&b), "/g/cl").await;
    assert_eq!(
        d.body["ideInfo"],
        json!({"name": "vscode", "displayName": "VS Code"})
    );
    let mut c = connected(&g, &d).await;
    c.call(
        "openDiff",
        json!({"filePath": "/g/cl/m.ts", "newContent": "m\n"}),
    )
    .await;
    let tab = pending_tab(&fe).await;
    assert!(
        tab.contains('✻') && tab.contains('⧉'),
        "claudecode closes only marked tabs: {tab}"
    );
    assert!(fe.accept_diff(&tab, "m // kept\n"));
    let n = c.notification("ide/diffAccepted").await;
    assert_eq!(
        n,
        json!({"filePath": "/g/cl/m.ts", "content": "m // kept\n"})
    );
    eventually("the accepted diff closed", || {
        fe.open_accepted().is_empty().then_some(())
    })
    .await;
    c.close().await;
    b.stop().await;
}

#[tokio::test]
async fn a_client_that_exits_without_ending_its_session_leaves_no_broker_session() {
    let Some(g) = find_gemini() else { return };
    let (b, _fe, d, gone) = setup(&g, "/g/x").await;
    let mut stays = connected(&g, &d).await;
    let count = |st: &Value| {
        st["sessions"]
            .as_array()
            .map(|s| s.iter().filter(|x| x["door"] == "gemini").count())
            .unwrap_or(0)
    };
    b.wait_status("two gemini sessions", |st| count(st) == 2)
        .await;
    gone.kill().await;
    b.wait_status("the exited client's session ended", |st| count(st) == 1)
        .await;
    // The one whose event stream stayed open is still served.
    let tools = stays.list_tools().await;
    assert!(
        tools["result"]["tools"]
            .as_array()
            .is_some_and(|t| t.len() == 2),
        "{tools}"
    );
    assert_eq!(count(&b.status().await), 1);
    stays.close().await;
    b.wait_status("the closed session ended", |st| count(st) == 0)
        .await;
    b.stop().await;
}

/// A raw POST of `body` on session `sid`: (status, body).
async fn raw_post(d: &Discovery, sid: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", d.port))
        .await
        .unwrap();
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\nMcp-Session-Id: {sid}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        d.port, d.token, body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    within("an HTTP answer", s.read_to_end(&mut out))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn bad_messages_get_clear_errors_and_the_session_keeps_working() {
    let Some(g) = find_gemini() else { return };
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/g/bad"]).await;
    let d = one_discovery(&gemini_dir(&b), "/g/bad").await;
    let (mut c, first) = McpClient::connect(&g, d.port, Some(&d.token)).await;
    let sid = first["sessionId"]
        .as_str()
        .expect("a session id")
        .to_string();
    let (status, body) = raw_post(&d, &sid, "{not json").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("-32700"), "{body}");
    let (status, body) = raw_post(&d, &sid, "[1, 2]").await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = raw_post(
        &d,
        "no-such-session",
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = raw_post(
        &d,
        &sid,
        r#"{"jsonrpc":"2.0","id":2,"method":"resources/list"}"#,
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("-32601"), "{body}");
    let r = c
        .call(
            "openDiff",
            json!({"filePath": "relative.rs", "newContent": "x"}),
        )
        .await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    let r = c.call("openDiff", json!({"filePath": "/g/bad/a.rs"})).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    let r = c
        .call("deleteEverything", json!({"filePath": "/g/bad/a.rs"}))
        .await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    // The session is as it was.
    let tools = c.list_tools().await;
    assert_eq!(
        tools["result"]["tools"].as_array().map(Vec::len),
        Some(2),
        "{tools}"
    );
    c.close().await;
    b.stop().await;
}

#[tokio::test]
async fn a_restarted_editor_process_gets_the_same_endpoint_under_its_new_pid() {
    use crate::common::process::start_editor;
    let b = TestBroker::start().await;
    let dir = gemini_dir(&b);
    let (mut first, port) = start_editor(&b.pi_dir, &["--folder", "/g/proc"]).await;
    b.wait_editor(port, "ready").await;
    let d = one_discovery(&dir, "/g/proc").await;
    assert_eq!(
        Some(d.pid),
        first.child.id(),
        "named with the editor process's pid"
    );
    first.child.kill().await.expect("kill the editor");
    let (second, port2) = start_editor(&b.pi_dir, &["--folder", "/g/proc"]).await;
    b.wait_editor(port2, "ready").await;
    let again = within("the file renamed for the new pid", async {
        loop {
            let found = discovery_files(&dir, "/g/proc");
            if let [one] = found.as_slice() {
                if Some(one.pid) == second.child.id() {
                    return one.clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(
        (again.port, again.token.as_str()),
        (d.port, d.token.as_str())
    );
    assert!(!d.path.exists(), "the old name is gone");
    // Qwen Code's lock file (written just after) names the new process too.
    let qwen = b
        .dir
        .path()
        .join("qwen-ide")
        .join(format!("{}.lock", d.port));
    let new_pid = second.child.id().map(u64::from);
    eventually("Qwen Code's ppid follows", || {
        let q: Value = serde_json::from_str(&std::fs::read_to_string(&qwen).ok()?).ok()?;
        (q["ppid"].as_u64() == new_pid).then_some(())
    })
    .await;
    b.stop().await;
}

/// One HTTP/1.1 request on `s` (kept alive); the answer's status line and body.
async fn keep_alive_request(
    s: &mut tokio::io::BufReader<tokio::net::TcpStream>,
    d: &Discovery,
    body: &str,
) -> (String, String) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\n\r\n{body}",
        d.port,
        d.token,
        body.len()
    );
    s.get_mut().write_all(req.as_bytes()).await.expect("send");
    within("the answer on the kept-alive connection", async {
        let mut status = String::new();
        s.read_line(&mut status).await.expect("status line");
        let mut length = 0;
        loop {
            let mut line = String::new();
            s.read_line(&mut line).await.expect("header");
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        s.read_exact(&mut body).await.expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    })
    .await
}

/// A client with the token may leave its keep-alive connection idle between requests (Node's
/// HTTP clients keep theirs 4 s): the next request on it, 3 s later, is answered. The door
/// used to close every connection 2 s after its last request, so a request sent as that close
/// came failed in the client, which then counted the IDE as disconnected.
#[tokio::test]
async fn a_kept_alive_connection_may_idle_between_requests() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/idle"]).await;
    let d = one_discovery(&gemini_dir(&b), "/idle").await;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", d.port))
        .await
        .unwrap();
    let mut s = tokio::io::BufReader::new(tcp);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let (status, body) = keep_alive_request(&mut s, &d, init).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status} {body}");
    // The user reads for a while (longer than the 2 s handshake deadline).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, body) = keep_alive_request(&mut s, &d, init).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status} {body}");
    assert!(body.contains("protocolVersion"), "{body}");
    b.stop().await;
}

/// A HOME that never had Qwen Code (no `~/.qwen`) gets no `~/.qwen/ide` from the broker: the
/// gemini door serves, and writes no Qwen lock file (issue 52).
#[tokio::test]
async fn no_qwen_dir_is_made_where_qwen_code_never_ran() {
    let b = TestBroker::start_with(|c| {
        let home = c.home.clone().expect("test home");
        c.edit_section(|s: &mut pi_ide_broker::frontdoor::gemini::GeminiConfig| {
            s.qwen_dir = Some(home.join(".qwen").join("ide"))
        });
    })
    .await;
    let dir = gemini_dir(&b);
    let (_fe, _) = b.editor(&["/g/q"]).await;
    one_discovery(&dir, "/g/q").await;
    let qwen_home = b.dir.path().join("home").join(".qwen");
    assert!(
        !qwen_home.exists(),
        "the broker made {}",
        qwen_home.display()
    );
    b.stop().await;
}

/// One raw POST of `body` to the gemini door: (status, the JSON answer).
async fn post_raw(port: u16, token: &str, body: &Value) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nAuthorization: Bearer {token}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = String::new();
    within("an HTTP answer", s.read_to_string(&mut out))
        .await
        .expect("read");
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let json = out.split("\r\n\r\n").nth(1).unwrap_or_default();
    (
        status,
        serde_json::from_str(json.trim()).unwrap_or(Value::Null),
    )
}

/// MCP 2026-07-28 on the gemini door (issue 54): with no session, `server/discover` and
/// `tools/list` are answered by their era (`resultType`, cache hints); a version the broker
/// does not speak is HTTP 400 with the error that names the versions; a tool call, whose
/// outcome needs a session's stream, says to initialize.
#[tokio::test]
async fn stateless_requests_are_answered_by_their_era() {
    use pi_ide_broker::protocol::era;
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/g/modern"]).await;
    let d = one_discovery(&gemini_dir(&b), "/g/modern").await;
    let meta =
        json!({era::VERSION_KEY: era::MODERN, "io.modelcontextprotocol/clientCapabilities": {}});
    let req = |id: u64, method: &str, params: Value| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let (status, v) = post_raw(
        d.port,
        &d.token,
        &req(1, "server/discover", json!({"_meta": meta})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert_eq!(v["result"]["supportedVersions"][0], era::MODERN);
    let (status, v) = post_raw(
        d.port,
        &d.token,
        &req(2, "tools/list", json!({"_meta": meta})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert!(v["result"]["ttlMs"].is_u64(), "{v}");
    assert_eq!(v["result"]["tools"][0]["name"], "openDiff");
    let mut future = meta.clone();
    future[era::VERSION_KEY] = json!("2099-01-01");
    let (status, v) = post_raw(
        d.port,
        &d.token,
        &req(3, "tools/list", json!({"_meta": future})),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], era::UNSUPPORTED_VERSION, "{v}");
    assert_eq!(v["error"]["data"]["requested"], "2099-01-01");
    let (_, v) = post_raw(
        d.port,
        &d.token,
        &req(4, "tools/call", json!({"name": "openDiff", "arguments": {"filePath": "/g/modern/a", "newContent": "x"}, "_meta": meta})),
    )
    .await;
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("initialize")),
        "{v}"
    );
    // The 2025 era on the same endpoint is as before: no session, no answer but the refusal.
    let (status, _) = post_raw(d.port, &d.token, &req(5, "tools/list", json!({}))).await;
    assert_eq!(status, 400);
    b.stop().await;
}
