//! Issue: many agent sessions, one link per editor — routing, sticky targets, multiplexing.

use crate::common::*;
use pi_ide_broker::testkit::fake_editor::{next_answer, next_tool_call, wait_for, Event};
use pi_ide_broker::testkit::text;
use pi_ide_broker::testkit::within;
use serde_json::{json, Value};

fn text1(v: &Value) -> &str {
    v["result"]["content"][1]["text"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test]
async fn initialize_and_tools_list_come_from_the_editor_cache() {
    let b = TestBroker::start().await;
    let (fe, id) = b.editor(&["/p"]).await;
    let mut ev = fe.events();
    let mut a = Agent::open(&b.socket, "/p/src", Some("k1")).await;
    let att = a.attached().await;
    assert_eq!(att["params"]["editor"], id);
    let init = a
        .request(
            json!(0),
            "initialize",
            json!({"protocolVersion": "2024-11-05", "capabilities": {}}),
        )
        .await;
    assert_eq!(init["result"]["serverInfo"]["name"], "pi-ide-neovim");
    let tools = a.request(json!(1), "tools/list", json!({})).await;
    assert!(tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "openDiff"));
    // Neither reached the editor again: the next call it sees is the echo.
    a.call_tool(json!(2), "echo", json!({"x": 1})).await;
    let first = wait_for(&mut ev, "a call", |e| matches!(e, Event::Call { .. })).await;
    assert!(
        matches!(first, Event::Call { ref tool, .. } if tool.as_deref() == Some("echo")),
        "{first:?}"
    );
    b.stop().await;
}

#[tokio::test]
async fn colliding_ids_from_90_sessions_on_3_editors_each_reach_their_caller() {
    let b = TestBroker::start().await;
    let mut editors = Vec::new();
    for p in ["/a", "/b", "/c"] {
        editors.push(b.editor(&[p]).await);
    }
    let mut tasks = Vec::new();
    for s in 0..90usize {
        let socket = b.socket.clone();
        let proj = ["/a", "/b", "/c"][s % 3];
        let want_editor = editors[s % 3].1.clone();
        tasks.push(tokio::spawn(async move {
            let mut a = Agent::open(&socket, &format!("{proj}/s{s}"), None).await;
            let att = a.attached().await;
            assert_eq!(att["params"]["editor"], want_editor.as_str());
            let ids = [
                json!(1),
                json!("1"),
                json!(format!("uuid-{s}-9f1c")),
                json!(1.5),
                Value::Null,
                json!(0),
                json!(-3),
                json!(1.0),
                serde_json::from_str::<Value>("18446744073709551616").unwrap(),
            ];
            // Interleave: send all, then read all (answers may come in any order).
            for (i, id) in ids.iter().enumerate() {
                a.call_tool(id.clone(), "echo", json!({"session": s, "call": i}))
                    .await;
            }
            let mut got = 0;
            while got < ids.len() {
                let v = a.next().await.expect("answer");
                if v.get("method").is_some() {
                    continue;
                }
                let echoed: Value = serde_json::from_str(text(&v)).expect("echo payload");
                assert_eq!(echoed["session"], s, "an answer meant for another session");
                let i = echoed["call"].as_u64().unwrap() as usize;
                assert_eq!(
                    v["id"], ids[i],
                    "id must come back with its exact type and value"
                );
                assert_eq!(v["id"].to_string(), ids[i].to_string());
                got += 1;
            }
            a.close().await;
        }));
    }
    for t in tasks {
        within("session task", t)
            .await
            .expect("session task failed");
    }
    for (fe, _) in &editors {
        assert_eq!(fe.clients(), 1, "one upstream link per editor");
    }
    b.stop().await;
}

#[tokio::test]
async fn a_departed_session_gets_only_its_own_diff_closed() {
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/p"]).await;
    let mut ev = fe.events();
    let mut keep = Agent::open(&b.socket, "/p", None).await;
    let mut gone = Agent::open(&b.socket, "/p", None).await;
    for (a, tab) in [(&mut keep, "pi-write:keep"), (&mut gone, "pi-write:gone")] {
        a.call_tool(
            json!(1),
            "openDiff",
            pi_ide_broker::testkit::diff_args("/p/f", "x", tab),
        )
        .await;
    }
    pi_ide_broker::testkit::eventually("both diffs pending", || {
        (fe.pending_diffs().len() == 2).then_some(())
    })
    .await;
    let st = b.status().await;
    let flights: Vec<&Value> = st["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["in_flight"].as_array().unwrap())
        .collect();
    assert_eq!(flights.len(), 2);
    assert!(flights.iter().all(|f| f["tool"] == "openDiff"));
    drop(gone);
    let args = next_tool_call(&mut ev, "close_tab").await;
    assert_eq!(args["tab_name"], "pi-write:gone");
    assert_eq!(fe.pending_diffs(), vec!["pi-write:keep".to_string()]);
    // The survivor's diff still completes normally.
    assert!(fe.accept_diff("pi-write:keep", "final text\n"));
    let ans = keep.answer(&json!(1)).await;
    assert_eq!(text(&ans), "FILE_SAVED");
    assert_eq!(text1(&ans), "final text\n");
    b.stop().await;
}

/// A real editor (pi-ide.nvim) killed with three sessions' diffs open: each is answered
/// DIFF_REJECTED with its own tab name, never an error.
#[tokio::test]
async fn an_editor_lost_mid_diff_answers_diff_rejected_with_the_sessions_tab() {
    use crate::common::nvim_editor::{NvimEditor, Plugin};
    let b = TestBroker::start().await;
    let p = std::fs::canonicalize(b.dir.path())
        .expect("canonical")
        .join("p");
    std::fs::create_dir_all(&p).expect("mkdir p");
    let Some(ed) = NvimEditor::start(&b, Plugin::PiIde, &p, "nvim").await else {
        return;
    };
    b.wait_editor(ed.port, "ready").await;
    let cwd = p.display().to_string();
    let mut agents = Vec::new();
    for i in 0..3 {
        let mut a = Agent::open(&b.socket, &cwd, None).await;
        let file = p.join(format!("f{i}"));
        a.call_tool(
            json!(format!("d{i}")),
            "openDiff",
            pi_ide_broker::testkit::diff_args(
                &file.display().to_string(),
                "x",
                &format!("pi-edit:{i}"),
            ),
        )
        .await;
        agents.push(a);
    }
    ed.pending_until("3 diffs open in Neovim", |s| s.split(',').count() == 3)
        .await;
    ed.kill().await;
    for (i, a) in agents.iter_mut().enumerate() {
        let ans = a.answer(&json!(format!("d{i}"))).await;
        assert!(
            ans.get("error").is_none(),
            "never an error (pi would apply the edit unreviewed): {ans}"
        );
        assert_eq!(text(&ans), "DIFF_REJECTED");
        assert_eq!(text1(&ans), format!("pi-edit:{i}"));
    }
    b.stop().await;
}

#[tokio::test]
async fn suggestions_go_to_the_most_recently_active_session_and_cancels_follow() {
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/p"]).await;
    let mut ev = fe.events();
    let mut old = Agent::open(&b.socket, "/p", None).await;
    old.attached().await;
    let mut recent = Agent::open(&b.socket, "/p", None).await;
    recent.attached().await;
    // `old` becomes the most recently active by sending a request.
    let _ = old.call("echo", json!({})).await;
    let out_id = fe.request_suggestions().expect("a client");
    let req = old
        .until("getSuggestions", |v| v["method"] == "getSuggestions")
        .await;
    let sid = req["id"].clone();
    assert!(sid.is_string());
    // The editor cancels it: the same session hears it, with the id it saw.
    fe.cancel_request(&out_id);
    let c = old
        .until("request_cancelled", |v| v["method"] == "request_cancelled")
        .await;
    assert_eq!(c["params"]["id"], sid);
    // A second request is answered; the answer reaches the editor with the editor's own id.
    let out2 = fe.request_suggestions().expect("a client");
    let req2 = old
        .until("getSuggestions", |v| v["method"] == "getSuggestions")
        .await;
    old.send_text(
        &json!({"jsonrpc": "2.0", "id": req2["id"], "result": {"suggestions": ["a"]}}).to_string(),
    )
    .await;
    let msg = next_answer(&mut ev, "the answer").await;
    assert_eq!(msg["id"], out2.as_str());
    assert_eq!(msg["result"]["suggestions"][0], "a");
    // The other session never saw any of it.
    recent.send_request(json!("probe"), "ping", json!({})).await;
    let seen = recent
        .until("probe", |v| {
            v["id"] == "probe" || v["method"] == "getSuggestions"
        })
        .await;
    assert_eq!(seen["id"], "probe", "suggestions leaked to another session");
    // The later-opened session becomes the most recent: the next request is its own (a rule
    // "the first session wins" would still send it to `old`).
    let _ = recent.call("echo", json!({})).await;
    fe.request_suggestions().expect("a client");
    let req3 = recent
        .until("getSuggestions", |v| v["method"] == "getSuggestions")
        .await;
    assert!(req3["id"].is_string(), "{req3:#}");
    b.stop().await;
}

/// The session's answer to an editor-initiated request can come back on another worker thread
/// before the link task has finished handing the request over; the editor must know of the
/// delegation by then, or the answer is dropped as one to a cancelled request. Answered at
/// once, many times over, every answer reaches the editor.
#[tokio::test]
async fn an_editor_request_answered_at_once_always_reaches_the_editor() {
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/p"]).await;
    let mut ev = fe.events();
    let mut a = Agent::open(&b.socket, "/p", None).await;
    a.attached().await;
    for n in 0..200 {
        let out = fe.request_suggestions().expect("the broker link");
        let req = a
            .until("getSuggestions", |v| v["method"] == "getSuggestions")
            .await;
        a.send_text(
            &json!({"jsonrpc": "2.0", "id": req["id"], "result": {"suggestions": [n]}}).to_string(),
        )
        .await;
        let msg = next_answer(&mut ev, "the answer").await;
        assert_eq!(msg["id"], out.as_str(), "answer {n}");
        assert_eq!(msg["result"]["suggestions"][0], n);
    }
    b.stop().await;
}

#[tokio::test]
async fn an_editor_request_with_no_session_gets_an_error() {
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/p"]).await;
    let mut ev = fe.events();
    fe.request_suggestions().expect("the broker link");
    let msg = next_answer(&mut ev, "error answer").await;
    assert_eq!(msg["id"], "out_1");
    assert!(msg["error"]["code"].is_i64());
    b.stop().await;
}

#[tokio::test]
async fn a_session_that_stops_reading_does_not_slow_the_others() {
    let b = TestBroker::start().await;
    let (fe, id) = b.editor(&["/p"]).await;
    let mut stuck = Agent::open(&b.socket, "/p", None).await; // reads nothing after attaching
    stuck.attached().await;
    let mut readers = Vec::new();
    for _ in 0..10 {
        let mut a = Agent::open(&b.socket, "/p", None).await;
        a.attached().await;
        readers.push(tokio::spawn(async move {
            let (mut mentions, mut selections) = (0, 0);
            a.until("the last selection", |v| {
                mentions += usize::from(v["method"] == "at_mentioned");
                selections += usize::from(v["method"] == "selection_changed");
                v["method"] == "selection_changed" && v["params"]["text"] == "sel 2999"
            })
            .await;
            (mentions, selections, a)
        }));
    }
    // Selection floods coalesce; at_mentioned floods (~6 MB in all) are bounded per session.
    let pad = "f".repeat(4096);
    for i in 0..3000u64 {
        fe.select("/p/f.rs", &format!("sel {i}"), i);
        if i % 2 == 0 {
            fe.broadcast(&pi_ide_broker::protocol::jsonrpc::notification(
                "at_mentioned",
                json!({"filePath": pad, "lineStart": i}),
            ));
            tokio::task::yield_now().await;
        }
    }
    let mut alive = Vec::new();
    let mut most_selections = 0;
    for r in readers {
        let (mentions, selections, a) = within("reader", r).await.expect("reader");
        assert_eq!(mentions, 1500, "a reading session loses nothing");
        most_selections = most_selections.max(selections);
        alive.push(a);
    }
    // 3,000 selections were sent: a session is handed the latest, not each one (a queue per
    // selection would deliver all 3,000 to a session that reads them all).
    assert!(
        most_selections < 3000,
        "selections were queued, not coalesced: {most_selections}"
    );
    // The stuck one was dropped once its bounded queue filled: memory stays bounded.
    b.wait_status("the stuck session dropped", |st| {
        editor_by_id(st, &id).is_some_and(|e| e["sessions"] == 10)
    })
    .await;
    drop((stuck, alive));
    b.stop().await;
}

/// The selection a real editor (pi-ide.nvim) told before any session came is replayed to the
/// session that attaches.
#[tokio::test]
async fn selection_is_replayed_on_attach() {
    use crate::common::nvim_editor::{NvimEditor, Plugin};
    let b = TestBroker::start().await;
    let p = std::fs::canonicalize(b.dir.path())
        .expect("canonical")
        .join("p");
    std::fs::create_dir_all(&p).expect("mkdir p");
    let lib = p.join("lib.rs");
    std::fs::write(&lib, "fn a() {}\nlet x = 1;\n").expect("write lib.rs");
    let Some(ed) = NvimEditor::start(&b, Plugin::PiIde, &p, "nvim").await else {
        return;
    };
    let id = b.wait_editor(ed.port, "ready").await["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ed.select(&lib, 2).await;
    let reg = b.handle.registry().clone();
    pi_ide_broker::testkit::eventually("cached", || {
        reg.editor(&id).and_then(|e| e.last_selection())
    })
    .await;
    let mut a = Agent::open(&b.socket, &p.display().to_string(), None).await;
    let sel = a
        .until("replayed selection", |v| v["method"] == "selection_changed")
        .await;
    assert_eq!(sel["params"]["filePath"], lib.display().to_string());
    assert_eq!(sel["params"]["selection"]["start"]["line"], 1, "{sel}");
    b.stop().await;
}

#[tokio::test]
async fn short_tools_time_out_but_diffs_never_do() {
    let b = TestBroker::start_with(|c| c.timeouts.short_tool_ms = 200).await;
    let (fe, _) = b.editor(&["/p"]).await;
    let mut a = Agent::open(&b.socket, "/p", None).await;
    a.call_tool(
        json!("diff"),
        "openDiff",
        pi_ide_broker::testkit::diff_args("/p/f", "x", "t1"),
    )
    .await;
    a.call_tool(json!("slow"), "slow", json!({})).await;
    let ans = a.answer(&json!("slow")).await;
    assert_eq!(
        ans["error"]["code"],
        pi_ide_broker::protocol::jsonrpc::TIMEOUT
    );
    assert!(ans["error"]["message"]
        .as_str()
        .unwrap()
        .contains("did not answer"));
    // The diff is still pending, well past the short timeout.
    a.send_request(json!("p1"), "ping", json!({})).await;
    a.answer(&json!("p1")).await;
    assert_eq!(fe.pending_diffs(), vec!["t1".to_string()]);
    assert!(fe.reject_diff("t1"));
    let d = a.answer(&json!("diff")).await;
    assert_eq!(text(&d), "DIFF_REJECTED");
    b.stop().await;
}

#[tokio::test]
async fn garbage_gets_json_rpc_errors_and_the_session_lives_on() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/p"]).await;
    let mut a = Agent::open(&b.socket, "/p", None).await;
    a.send_text("{oops").await;
    assert_eq!(
        a.until("parse error", |v| v.get("error").is_some()).await["error"]["code"],
        -32700
    );
    a.send_text("[1,2]").await;
    assert_eq!(
        a.until("invalid", |v| v.get("error").is_some()).await["error"]["code"],
        -32600
    );
    a.send_text(r#"{"jsonrpc":"2.0","id":{"x":1},"method":"m"}"#)
        .await;
    assert_eq!(
        a.until("invalid id", |v| v.get("error").is_some()).await["error"]["code"],
        -32600
    );
    let ok = a.call("echo", json!({"still": "alive"})).await;
    assert!(text(&ok).contains("alive"));
    b.stop().await;
}

#[tokio::test]
async fn no_editor_gives_a_clear_error_then_auto_attaches_when_one_appears() {
    let b = TestBroker::start().await;
    let mut a = Agent::open(&b.socket, "/late/project", None).await;
    let e = a.call("getDiagnostics", json!({})).await;
    assert_eq!(
        e["error"]["code"],
        pi_ide_broker::protocol::jsonrpc::NO_EDITOR
    );
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/late/project"));
    let (_fe, id) = b.editor(&["/late"]).await;
    let att = a.attached().await;
    assert_eq!(att["params"]["editor"], id);
    let ok = a.call("echo", json!({})).await;
    assert!(ok.get("result").is_some());
    b.stop().await;
}

#[tokio::test]
async fn routing_nested_symlinked_and_ambiguous() {
    let b = TestBroker::start().await;
    let root = b.dir.path().join("w");
    std::fs::create_dir_all(root.join("repo/sub/deep")).unwrap();
    std::os::unix::fs::symlink(root.join("repo"), root.join("link")).unwrap();
    let repo = root.join("repo").display().to_string();
    let sub = root.join("repo/sub").display().to_string();
    let (_outer, outer_id) = b.editor(&[&repo]).await;
    let (_inner, inner_id) = b.editor(&[&sub]).await;
    // Deepest folder wins, through a symlink and a trailing slash.
    let cwd = format!("{}/link/sub/deep/", root.display());
    let mut a = Agent::open(&b.socket, &cwd, None).await;
    assert_eq!(a.attached().await["params"]["editor"], inner_id);
    let list = a.request(json!(1), "broker/editors", json!({})).await;
    let ids: Vec<&str> = list["result"]["editors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec![inner_id.as_str(), outer_id.as_str()],
        "best first"
    );
    // Two editors on the same folder, neither touched: ambiguity, no guess.
    let same = root.join("twin").display().to_string();
    std::fs::create_dir_all(&same).unwrap();
    let mut o1 = Options::pi(&[&same]);
    o1.ide_name = "Neovim".into();
    let t1 = FakeEditor::start_in(&b.pi_dir, o1.clone()).await.unwrap();
    let t2 = FakeEditor::start_in(&b.pi_dir, o1).await.unwrap();
    let id1 = b.wait_editor(t1.port, "ready").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    b.wait_editor(t2.port, "ready").await;
    let mut amb = Agent::open(&b.socket, &same, None).await;
    let e = amb.call("echo", json!({})).await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("several editors"),
        "{e}"
    );
    let r = amb
        .request(json!(2), "broker/attach", json!({"editor": id1}))
        .await;
    assert_eq!(r["result"]["editor"], id1.as_str());
    let ok = amb.call("echo", json!({})).await;
    assert!(ok.get("result").is_some());
    let bad = amb
        .request(json!(4), "broker/attach", json!({"editor": "nope"}))
        .await;
    assert_eq!(bad["error"]["code"], -32602);
    // The most recently focused one wins a tie.
    t2.select(&format!("{same}/f"), "", 0);
    let id2 = b
        .wait_status("t2 focused", |st| editor_by_port(st, t2.port).is_some())
        .await;
    let id2 = editor_by_port(&id2, t2.port).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let reg = b.handle.registry().clone();
    let id2c = id2.clone();
    pi_ide_broker::testkit::eventually("focus recorded", || {
        reg.editor(&id2c).and_then(|e| e.focus_stamp()).map(|_| ())
    })
    .await;
    let mut tie = Agent::open(&b.socket, &same, None).await;
    assert_eq!(tie.attached().await["params"]["editor"], id2);
    b.stop().await;
}

#[tokio::test]
async fn sticky_targets_survive_editor_and_broker_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let proj = dir.path().join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    let proj_s = proj.display().to_string();
    let b = TestBroker::start_in(dir, |_| {}).await;
    let e1 = FakeEditor::start_in(&b.pi_dir, Options::pi(&[&proj_s]))
        .await
        .unwrap();
    let mut o2 = Options::pi(&[&proj_s]);
    o2.ide_name = "Other".into();
    let e2 = FakeEditor::start_in(&b.pi_dir, o2.clone()).await.unwrap();
    b.wait_editor(e1.port, "ready").await;
    let id2 = b.wait_editor(e2.port, "ready").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Choose e2 explicitly: it becomes sticky for key "pi-123".
    let mut a = Agent::open(&b.socket, &proj_s, Some("pi-123")).await;
    a.request(json!(1), "broker/attach", json!({"editor": id2}))
        .await;
    a.close().await;
    // pi's /new: same key, new connection → back on e2 without a question.
    let mut a = Agent::open(&b.socket, &proj_s, Some("pi-123")).await;
    assert_eq!(a.attached().await["params"]["editor"], id2);
    // e2 restarts on a new port: the attached session follows it without reconnecting.
    e2.remove_lockfile();
    e2.crash().await;
    b.wait_editor_gone(e2.port).await;
    let e2b = FakeEditor::start_in(&b.pi_dir, o2.clone()).await.unwrap();
    b.wait_editor(e2b.port, "ready").await;
    let ok = a.call("echo", json!({"after": "restart"})).await;
    assert!(text(&ok).contains("restart"), "{ok}");
    assert_eq!(e2b.clients(), 1);
    a.close().await;
    // Broker restart: the state file brings the sticky target back.
    let state_file = b.state_dir.join("state.json");
    let tempdir = b.stop_keep_dir().await;
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(&state_file).unwrap()).unwrap();
    assert_eq!(saved["sticky"]["pi-123"]["editor"], id2.as_str());
    let root = tempdir.path().to_path_buf();
    let b2 = TestBroker::start_in(tempdir, |_| {}).await;
    assert_eq!(b2.dir.path(), root);
    b2.wait_editor(e1.port, "ready").await;
    b2.wait_editor(e2b.port, "ready").await;
    let mut a = Agent::open(&b2.socket, &proj_s, Some("pi-123")).await;
    assert_eq!(a.attached().await["params"]["editor"], id2);
    b2.stop().await;
}

#[allow(dead_code)]
fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("pi_ide_broker=debug")
        .with_test_writer()
        .try_init();
}

/// A Lua editor's schemas (`"properties": []`, `"required": {}`, `[]`, no `type`) reach every
/// client as JSON-Schema objects; nothing else in them changes.
#[tokio::test]
async fn tool_schemas_reach_clients_as_valid_json_schema() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/schemas"]).await;
    let mut a = Agent::open(&b.socket, "/schemas", None).await;
    a.attached().await;
    let list = a.request(json!(1), "tools/list", json!({})).await;
    let tools = list["result"]["tools"].as_array().expect("tools").clone();
    let schema = |name: &str| {
        tools
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["inputSchema"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        schema("getOpenEditorTabs"),
        json!({"type": "object", "properties": {}})
    );
    assert_eq!(
        schema("echo"),
        json!({"type": "object", "properties": {"x": {"type": "string"}}, "required": []})
    );
    assert_eq!(schema("slow"), json!({"type": "object"}));
    for t in &tools {
        let s = &t["inputSchema"];
        assert!(s.is_object() && s["type"] == "object", "{t}");
        assert!(s.get("properties").is_none_or(Value::is_object), "{t}");
        assert!(s.get("required").is_none_or(Value::is_array), "{t}");
    }
    b.stop().await;
}

/// A client whose own timeout (1 s) is far shorter than the diff (3 s) keeps waiting:
/// `notifications/progress` for its token (every 100 ms) arrive ten times as often as that.
#[tokio::test]
async fn progress_keeps_a_long_diff_alive_past_the_client_timeout() {
    let b = TestBroker::start_with(|c| c.timeouts.progress_ms = 100).await;
    let (fe, _) = b.editor(&["/prog"]).await;
    let mut a = Agent::open(&b.socket, "/prog", None).await;
    a.attached().await;
    let mut args = pi_ide_broker::testkit::diff_args("/prog/f", "x", "long-tab");
    args = json!({"name": "openDiff", "arguments": args, "_meta": {"progressToken": "tok-1"}});
    let mut ev = fe.events();
    a.send_request(json!(9), "tools/call", args).await;
    next_tool_call(&mut ev, "openDiff").await;
    let started = std::time::Instant::now();
    let user = tokio::spawn(async move {
        // The user reads the diff for three seconds, then accepts it.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        assert!(fe.accept_diff("long-tab", "y"));
        fe
    });
    let client_timeout = std::time::Duration::from_secs(1);
    let mut last = 0;
    let answer = loop {
        let m = tokio::time::timeout(client_timeout, a.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the client would have timed out after {:?}",
                    started.elapsed()
                )
            })
            .expect("session open");
        if m["method"] == "notifications/progress" {
            assert_eq!(m["params"]["progressToken"], "tok-1", "{m}");
            let p = m["params"]["progress"].as_u64().unwrap_or(0);
            assert!(p > last, "progress must increase: {m}");
            last = p;
        } else if m["id"] == 9 {
            break m;
        }
    };
    assert!(started.elapsed() >= std::time::Duration::from_secs(3));
    assert_eq!(text(&answer), "FILE_SAVED", "{answer}");
    // 30 are due; 5 is what a much slower ticker (or a busy machine) still gives.
    assert!(
        last >= 5,
        "only {last} progress notifications in three seconds"
    );
    let _fe = within("user", user).await.unwrap();
    b.stop().await;
}

/// `notifications/cancelled` from the client: the diff is closed in the editor, gone from
/// the pending table and from status, and never answered.
/// A diff the client cancels is closed in the real editor (pi-ide.nvim, whose `close_tab`
/// answers the diff rejected as it closes it) and never answered to the client.
#[tokio::test]
async fn a_cancelled_diff_is_closed_and_never_answered() {
    use crate::common::nvim_editor::{NvimEditor, Plugin};
    let b = TestBroker::start().await;
    let dir = std::fs::canonicalize(b.dir.path())
        .expect("canonical")
        .join("cancel");
    std::fs::create_dir_all(&dir).expect("mkdir cancel");
    let Some(ed) = NvimEditor::start(&b, Plugin::PiIde, &dir, "nvim").await else {
        return;
    };
    b.wait_editor(ed.port, "ready").await;
    let mut a = Agent::open(&b.socket, &dir.display().to_string(), None).await;
    a.attached().await;
    let f = dir.join("f");
    a.call_tool(
        json!(7),
        "openDiff",
        pi_ide_broker::testkit::diff_args(&f.display().to_string(), "x", "c-tab"),
    )
    .await;
    ed.pending_until("the diff open in Neovim", |s| !s.is_empty())
        .await;
    b.wait_status("the diff in flight", |st| {
        st["sessions"][0]["in_flight"]
            .as_array()
            .is_some_and(|f| f.len() == 1)
    })
    .await;
    a.send_text(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "timeout"}})
            .to_string(),
    )
    .await;
    ed.pending_until("the diff closed in Neovim", str::is_empty)
        .await;
    b.wait_status("nothing in flight", |st| {
        st["sessions"][0]["in_flight"]
            .as_array()
            .is_some_and(|f| f.is_empty())
    })
    .await;
    // Whatever reached the client before the answer to a later ping: no answer for id 7.
    a.send_request(json!("after"), "ping", json!({})).await;
    loop {
        let m = a.next().await.expect("open");
        assert_ne!(m["id"], 7, "a cancelled request was answered: {m}");
        if m["id"] == "after" {
            break;
        }
    }
    b.stop().await;
}

/// Frames far larger than a socket's buffer (a diff's file contents, say) cross both ways
/// whole, for several sessions at once: each side writes what the socket takes and is woken
/// for the rest.
#[tokio::test]
async fn megabyte_calls_and_answers_arrive_whole_for_every_session() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/big"]).await;
    let mut tasks = Vec::new();
    for s in 0..3usize {
        let socket = b.socket.clone();
        tasks.push(tokio::spawn(async move {
            let mut a = Agent::open(&socket, &format!("/big/s{s}"), None).await;
            a.attached().await;
            // Plain bytes, then escapes, quotes, control escapes and multi-byte characters.
            let pads = ["x".repeat(1 << 20), "é\"\\\n😀\tq".repeat(40_000)];
            for (i, pad) in pads.iter().enumerate() {
                let r = a.call("echo", json!({"session": s, "pad": pad})).await;
                let echoed: Value = serde_json::from_str(text(&r)).expect("echo payload");
                assert_eq!(echoed["session"], s);
                assert!(
                    echoed["pad"] == pad.as_str(),
                    "session {s} call {i}: the payload changed"
                );
            }
            a.close().await;
        }));
    }
    for t in tasks {
        within("large calls", t).await.expect("session task failed");
    }
}

/// The editor's selection reaches a session right behind `broker/attached`, nothing between:
/// the pi extension reads its selection once the call it makes after the attach returns, and
/// an answer that slipped in first left the model without the `<editor>` block. (Found with
/// pi-web under load: a fork's first prompt carried the diagnostics but no selection; the
/// broker ran on worker threads and the replay went out one session turn after the notice.)
/// Here the client pipelines `initialize` and a request the broker answers itself, so with
/// the replay a turn behind the notice that answer comes between them.
#[tokio::test]
async fn the_selection_replay_follows_the_attach_notice_with_nothing_between() {
    let b = TestBroker::start().await;
    let (fe, id) = b.editor(&["/rp"]).await;
    fe.select("/rp/src/lib.rs", "", 7);
    let reg = b.handle.registry().clone();
    pi_ide_broker::testkit::eventually("the editor's selection recorded", || {
        reg.editor(&id)?.last_selection().map(|_| ())
    })
    .await;
    let mut raw = within(
        "connect",
        Agent::connect_raw(&b.socket, "cwd=/rp&dialect=pi"),
    )
    .await
    .unwrap();
    pi_ide_broker::testkit::eventually("the session placed on the editor", || {
        reg.sessions()
            .iter()
            .any(|s| s.editor_id().is_some())
            .then_some(())
    })
    .await;
    let init = json!({"jsonrpc": "2.0", "id": "init", "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}}});
    let editors = json!({"jsonrpc": "2.0", "id": "ed", "method": "broker/editors", "params": {}});
    raw.send_texts(&[&init.to_string(), &editors.to_string()])
        .await;
    let mut seen: Vec<String> = Vec::new();
    while seen.len() < 4 {
        let v = raw.next().await.expect("the session's frames");
        seen.push(match (&v["method"], &v["id"]) {
            (Value::String(m), _) => m.clone(),
            (_, Value::String(i)) => format!("answer {i}"),
            _ => v.to_string(),
        });
    }
    let at = seen.iter().position(|m| m == "broker/attached");
    assert_eq!(seen[0], "answer init", "{seen:?}");
    assert!(
        at.is_some_and(|i| seen.get(i + 1).map(String::as_str) == Some("selection_changed")),
        "the replay must follow the attach notice directly: {seen:?}"
    );
    assert!(seen.contains(&"answer ed".to_string()), "{seen:?}");
}

/// An editor on `folder` with two sessions placed on it: a witness past its handshake, and
/// one connected raw, which has not sent its first request.
async fn a_witness_and_one_in_its_handshake(
    b: &TestBroker,
    folder: &str,
) -> (
    pi_ide_broker::testkit::fake_editor::FakeEditor,
    Agent,
    Agent,
) {
    let (fe, _) = b.editor(&[folder]).await;
    let mut witness = Agent::open(&b.socket, folder, None).await;
    witness.attached().await;
    let raw = within(
        "connect",
        Agent::connect_raw(&b.socket, &format!("cwd={folder}")),
    )
    .await
    .unwrap();
    let reg = b.handle.registry().clone();
    pi_ide_broker::testkit::eventually("both sessions placed on the editor", || {
        let placed = reg
            .sessions()
            .iter()
            .filter(|s| s.editor_id().is_some())
            .count();
        (placed == 2).then_some(())
    })
    .await;
    (fe, witness, raw)
}

/// An editor's notification that comes while a session's handshake is not done waits behind
/// the `initialize` answer, and is not lost: an MCP client gets that answer first. (Found with
/// real VS Code: its extension sends `diagnostics_changed` as soon as a file opens, and a
/// session that had connected a moment before got it ahead of its `initialize` answer.)
/// Editor-initiated requests skip such a session: it cannot answer them yet.
#[tokio::test]
async fn an_editor_notification_during_the_handshake_follows_the_initialize_answer() {
    let b = TestBroker::start().await;
    let (fe, mut witness, mut late) = a_witness_and_one_in_its_handshake(&b, "/hs").await;
    let note =
        r#"{"jsonrpc":"2.0","method":"diagnostics_changed","params":{"uris":["file:///hs/a.rs"]}}"#;
    fe.broadcast(note);
    // The broker handled it for every session once the witness has it.
    witness
        .until("the notification", |v| v["method"] == "diagnostics_changed")
        .await;
    // The newest session is the most recently active, yet a request goes to the one that
    // can answer it.
    let asked = fe
        .request_suggestions()
        .expect("a client of the fake editor");
    let delegated = witness
        .until("getSuggestions", |v| v["method"] == "getSuggestions")
        .await;
    assert!(delegated["id"].is_string(), "{delegated}");
    late.send_request(
        json!("init"),
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}}),
    )
    .await;
    let first = within("the first frame", late.next())
        .await
        .expect("a frame");
    assert_eq!(first["id"], "init", "the answer comes first: {first}");
    late.until("the held notification", |v| {
        v["method"] == "diagnostics_changed"
    })
    .await;
    drop(asked);
    b.stop().await;
}

/// The notices held for a session in its handshake are capped as its outbox is: a client that
/// never sends its first request while its editor keeps notifying is dropped once 1,024 wait,
/// and the editor's other sessions get every notification.
#[tokio::test]
async fn a_session_that_never_finishes_its_handshake_holds_a_capped_backlog() {
    let b = TestBroker::start().await;
    let (fe, mut witness, mut mute) = a_witness_and_one_in_its_handshake(&b, "/mute").await;
    let reg = b.handle.registry().clone();
    const SENT: usize = 1100;
    for i in 0..SENT {
        fe.broadcast(&format!(
            r#"{{"jsonrpc":"2.0","method":"diagnostics_changed","params":{{"uris":["file:///mute/{i}"]}}}}"#
        ));
    }
    for i in 0..SENT {
        let n = witness
            .until("a notification", |v| v["method"] == "diagnostics_changed")
            .await;
        assert_eq!(n["params"]["uris"][0], format!("file:///mute/{i}"));
    }
    // The mute session was dropped: its connection ends, with nothing sent before its close.
    let ended = within("the mute session's end", mute.next_unbounded()).await;
    assert!(
        ended.is_none(),
        "a frame reached a session in its handshake: {ended:?}"
    );
    pi_ide_broker::testkit::eventually("the mute session gone", || {
        (reg.sessions().len() == 1).then_some(())
    })
    .await;
    b.stop().await;
}
