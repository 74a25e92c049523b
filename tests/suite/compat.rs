//! Issue: the compat door — the unmodified pi-ide extension through virtual lockfiles.

use crate::common::*;
use pi_ide_broker::testkit::pi_client::WriteVerdict;
use pi_ide_broker::testkit::pi_client::{find_candidates, PiClient};
use pi_ide_broker::testkit::text;
use pi_ide_broker::testkit::{eventually, within};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;

fn compat_dir(b: &TestBroker) -> std::path::PathBuf {
    b.dir.path().join("compat")
}

/// Waits until the pi-ide-like scan finds exactly one candidate for `cwd`.
async fn one_candidate(b: &TestBroker, cwd: &str) -> pi_ide_broker::testkit::pi_client::Candidate {
    let dir = compat_dir(b);
    within("one compat candidate", async {
        loop {
            let c = find_candidates(&dir, cwd).await;
            if c.len() == 1 {
                return c[0].clone();
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
}

#[tokio::test]
async fn a_pi_ide_client_accepts_and_rejects_diffs_through_the_broker() {
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/home/u/proj"]).await;
    let cand = one_candidate(&b, "/home/u/proj/src").await;
    assert_eq!(cand.pid, std::process::id(), "the broker's own pid");
    assert_eq!(cand.ide_name, "Neovim");
    let mut c = PiClient::connect(&cand).await.unwrap();
    let diags = c.diagnostics().await.unwrap();
    assert!(diags.contains_key("file:///x.rs"));
    let st = b.status().await;
    assert_eq!(st["sessions"][0]["door"], "compat");

    // Accept.
    let writer = tokio::spawn(async move {
        let r = c
            .write_file("/home/u/proj/a.rs", "fn a() {}\n", "call1")
            .await;
        (r, c)
    });
    eventually("diff pending", || {
        fe.pending_diffs()
            .contains(&"pi-write:call1".to_string())
            .then_some(())
    })
    .await;
    assert!(fe.accept_diff("pi-write:call1", "fn a() {} // edited\n"));
    let (r, mut c) = within("writer", writer).await.unwrap();
    assert_eq!(r.unwrap().as_deref(), Some("fn a() {} // edited\n"));

    // Reject: the echoed tab name is the client's own.
    let writer = tokio::spawn(async move {
        let r = c.open_diff_raw("/home/u/proj/b.rs", "pi-write:call2").await;
        (r, c)
    });
    eventually("diff pending", || {
        fe.pending_diffs()
            .contains(&"pi-write:call2".to_string())
            .then_some(())
    })
    .await;
    assert!(fe.reject_diff("pi-write:call2"));
    let (r, c) = within("writer", writer).await.unwrap();
    let v = r.unwrap();
    assert_eq!(text(&v), "DIFF_REJECTED");
    assert_eq!(v["result"]["content"][1]["text"], "pi-write:call2");
    c.close().await;
    b.stop().await;
}

#[tokio::test]
async fn the_connection_survives_an_editor_restart_on_a_new_port() {
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/w"]).await;
    let cand = one_candidate(&b, "/w").await;
    let mut c = PiClient::connect(&cand).await.unwrap();
    c.diagnostics().await.unwrap();
    fe.remove_lockfile();
    fe.crash().await;
    b.wait_editor_gone(fe.port).await;
    let (fe2, _) = b.start_editor(Options::pi(&["/w"])).await;
    // Same virtual entry (port and token), same connection.
    assert_eq!(one_candidate(&b, "/w").await.port, cand.port);
    let writer = tokio::spawn(async move {
        let r = c.write_file("/w/f", "x", "after").await;
        (r, c)
    });
    eventually("diff on the new editor", || {
        fe2.pending_diffs().first().cloned()
    })
    .await;
    assert!(fe2.accept_diff("pi-write:after", "x\n"));
    let (r, _c) = within("writer", writer).await.unwrap();
    assert_eq!(r.unwrap().as_deref(), Some("x\n"));
    b.stop().await;
}

#[tokio::test]
async fn an_editor_killed_mid_diff_gives_diff_rejected_not_a_closed_socket() {
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/w"]).await;
    let cand = one_candidate(&b, "/w").await;
    let mut c = PiClient::connect(&cand).await.unwrap();
    let writer = tokio::spawn(async move {
        let r = c.write_verdict("/w/f", "x", "k").await;
        (r, c)
    });
    eventually("diff pending", || fe.pending_diffs().first().cloned()).await;
    fe.crash().await;
    let (r, mut c) = within("writer", writer).await.unwrap();
    // A rejection marked undelivered (blocks the write as "not reviewed"), never an error
    // (pi-ide would write unreviewed) and never the user's own "no".
    assert!(
        matches!(
            &r,
            Ok(WriteVerdict::Rejected {
                undelivered: Some(_)
            })
        ),
        "{r:?}"
    );
    // The socket is still open: a diff while the editor is down is undelivered too.
    let again = c.write_verdict("/w/f", "x", "k2").await;
    assert!(
        matches!(
            &again,
            Ok(WriteVerdict::Rejected {
                undelivered: Some(_)
            })
        ),
        "{again:?}"
    );
    b.stop().await;
}

#[tokio::test]
async fn bad_tokens_origins_and_probes_are_refused_and_harmless() {
    let b = TestBroker::start().await;
    let (_a, _) = b.editor(&["/a"]).await;
    let (_b2, _) = b.editor(&["/b"]).await;
    let ca = one_candidate(&b, "/a").await;
    let cb = one_candidate(&b, "/b").await;
    // pi-ide probes the port with a bare connect-and-close.
    drop(
        tokio::net::TcpStream::connect(("127.0.0.1", ca.port))
            .await
            .unwrap(),
    );
    let wrong =
        PiClient::connect_with(ca.port, "x-pi-ide-authorization", "not-the-token-123", None).await;
    assert_eq!(
        wrong.err().as_deref(),
        Some("Unexpected server response: 400")
    );
    let other_entry =
        PiClient::connect_with(ca.port, "x-pi-ide-authorization", &cb.token, None).await;
    assert_eq!(
        other_entry.err().as_deref(),
        Some("Unexpected server response: 400")
    );
    let missing = PiClient::connect_with(ca.port, "x-something", &ca.token, None).await;
    assert_eq!(
        missing.err().as_deref(),
        Some("Unexpected server response: 400")
    );
    let browser = PiClient::connect_with(
        ca.port,
        "x-pi-ide-authorization",
        &ca.token,
        Some("https://evil.example"),
    )
    .await;
    assert_eq!(
        browser.err().as_deref(),
        Some("Unexpected server response: 403")
    );
    // The Claude header works too (Claude Code's dialect).
    let mut claude =
        PiClient::connect_with(ca.port, "x-claude-code-ide-authorization", &ca.token, None)
            .await
            .unwrap();
    assert!(claude
        .tool("echo", json!({"ok": 1}))
        .await
        .unwrap()
        .get("result")
        .is_some());
    let st = b.status().await;
    assert_eq!(
        st["sessions"].as_array().unwrap().len(),
        1,
        "only the good connection became a session"
    );
    assert_eq!(st["sessions"][0]["dialect"], "claude");
    b.stop().await;
}

#[tokio::test]
async fn virtual_lockfiles_follow_editors_and_are_private_and_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let compat = dir.path().join("compat");
    std::fs::create_dir_all(&compat).unwrap();
    std::fs::set_permissions(&compat, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A leftover of a broker that was killed (our marker, a dead pid) and a foreign file.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    std::fs::write(
        compat.join("1111.lock"),
        json!({"pid": dead, "authToken": "0123456789ab", "piIdeBroker": {"editor": "x"}})
            .to_string(),
    )
    .unwrap();
    std::fs::write(
        compat.join("2222.lock"),
        json!({"pid": dead, "authToken": "0123456789ab"}).to_string(),
    )
    .unwrap();
    let b = TestBroker::start_in(dir, |c| c.editor_grace_ms = 100).await;
    eventually("leftover cleaned", || {
        (!compat.join("1111.lock").exists()).then_some(())
    })
    .await;
    assert!(
        compat.join("2222.lock").exists(),
        "a foreign file is never touched"
    );

    let (fe, _) = b.editor(&["/v"]).await;
    let cand = one_candidate(&b, "/v").await;
    let path = compat.join(format!("{}.lock", cand.port));
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(&compat).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["transport"], "ws");
    assert_ne!(
        v["authToken"],
        fe.token(),
        "the broker's own token, not the editor's"
    );
    // Gone for good (after the grace) → withdrawn.
    fe.remove_lockfile();
    fe.crash().await;
    eventually("entry withdrawn", || (!path.exists()).then_some(())).await;
    // Shutdown removes every entry.
    let (_fe2, _) = b.editor(&["/v2"]).await;
    let c2 = one_candidate(&b, "/v2").await;
    let p2 = compat.join(format!("{}.lock", c2.port));
    assert!(p2.exists());
    let _keep = b.stop_keep_dir().await;
    assert!(!p2.exists(), "entries are removed on shutdown");
    assert!(compat.join("2222.lock").exists());
}

#[tokio::test]
async fn symlinked_workspaces_are_published_in_both_forms() {
    let b = TestBroker::start().await;
    let real = b.dir.path().join("real");
    std::fs::create_dir_all(&real).unwrap();
    let link = b.dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let (_fe, _) = b.editor(&[link.to_str().unwrap()]).await;
    let real_s = std::fs::canonicalize(&real).unwrap().display().to_string();
    // pi-ide compares plain prefixes: a cwd under either form finds the editor.
    one_candidate(&b, &format!("{}/x", link.display())).await;
    one_candidate(&b, &format!("{real_s}/x")).await;
    b.stop().await;
}

/// pi-ide attaches its message listener only after the upgrade's `open` resolves: frames that
/// arrive with the upgrade are lost to it. Modelled here as a client whose listener starts
/// 5 ms after the upgrade and loses whatever came before. The broker must hold the attach
/// notice and the selection replay until the client's `initialize` is answered.
#[tokio::test]
async fn a_late_listener_gets_the_replayed_selection_200_times_in_a_row() {
    use futures_util::{FutureExt, SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/late"]).await;
    fe.select("/late/main.rs", "", 3);
    let cand = one_candidate(&b, "/late").await;
    let mut lost_frames = 0;
    let mut delivered = 0;
    for round in 0..200 {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", cand.port))
            .await
            .unwrap();
        let mut req = format!("ws://127.0.0.1:{}/", cand.port)
            .into_client_request()
            .unwrap();
        req.headers_mut()
            .insert("x-pi-ide-authorization", cand.token.parse().unwrap());
        let (mut ws, _) = within("upgrade", tokio_tungstenite::client_async(req, stream))
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        while let Some(Some(Ok(_))) = ws.next().now_or_never() {
            lost_frames += 1;
        }
        let init = json!({"jsonrpc": "2.0", "id": "i", "method": "initialize",
                          "params": {"protocolVersion": "2024-11-05", "capabilities": {}}});
        ws.send(Message::text(init.to_string())).await.unwrap();
        let mut answered = false;
        let got = within("the replayed selection", async {
            while let Some(Ok(m)) = ws.next().await {
                let Message::Text(t) = m else { continue };
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                if v["id"] == "i" {
                    answered = true;
                } else if v["method"] == "selection_changed" {
                    assert!(
                        answered,
                        "round {round}: selection before the initialize answer"
                    );
                    return v;
                }
            }
            panic!("round {round}: closed before the selection");
        })
        .await;
        assert_eq!(got["params"]["filePath"], "/late/main.rs");
        delivered += 1;
        let _ = ws.close(None).await;
    }
    eprintln!("replayed selection delivered {delivered}/200; frames lost before the listener: {lost_frames}");
    assert_eq!(lost_frames, 0, "the broker sent frames before initialize");
    b.stop().await;
}

/// A call and its answer of 5 MB cross the compat door whole: more than loopback TCP's send
/// buffer (4 MiB at most) takes at once, so each side writes in turns, woken by the socket.
#[tokio::test]
async fn a_multi_megabyte_echo_crosses_the_compat_door_whole() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/home/u/big"]).await;
    let cand = one_candidate(&b, "/home/u/big").await;
    let mut c = PiClient::connect(&cand).await.unwrap();
    let pad = "é\"x".repeat(1_000_000);
    let r = within("a multi-megabyte echo", c.tool("echo", json!({"pad": pad})))
        .await
        .unwrap();
    let text = text(&r);
    let echoed: Value = serde_json::from_str(text).expect("echo payload");
    assert!(echoed["pad"] == pad.as_str(), "the payload changed");
}

/// When an editor becomes ready, the sessions waiting for its folder are placed before the
/// compat door hears of it (agents first, the door's file work after): the registry's `Ready`
/// event, which the door waits for, finds every waiting session already on the editor, and so
/// does the door's entry once it is there.
#[tokio::test]
async fn waiting_sessions_are_placed_before_the_compat_door_hears_of_the_editor() {
    use pi_ide_broker::registry::EditorEvent;
    let b = TestBroker::start().await;
    const WAITING: usize = 250;
    let mut waiting = Vec::new();
    for i in 0..WAITING {
        waiting.push(Agent::open(&b.socket, &format!("/late/{i}"), None).await);
    }
    let reg = b.handle.registry().clone();
    eventually("the sessions registered", || {
        (reg.sessions().len() == WAITING).then_some(())
    })
    .await;
    let unplaced = |reg: &pi_ide_broker::registry::Registry| {
        reg.sessions()
            .iter()
            .filter(|s| s.editor_id().is_none())
            .count()
    };
    assert_eq!(unplaced(&reg), WAITING);
    // As the compat door does: told of the editor by the registry's events.
    let mut events = reg.subscribe_editors();
    let _fe = FakeEditor::start_in(&b.pi_dir, Options::pi(&["/late"]))
        .await
        .expect("fake editor");
    let at_ready = within("the editor's Ready event", async {
        loop {
            match events.recv().await {
                Some(EditorEvent::Ready(_)) => return unplaced(&reg),
                Some(_) => continue,
                None => panic!("the registry's events ended"),
            }
        }
    })
    .await;
    assert_eq!(at_ready, 0, "Ready was told with sessions still waiting");
    compat_entry(&b.dir.path().join("compat"), "/late").await;
    assert_eq!(unplaced(&reg), 0);
    drop(waiting);
    b.stop().await;
}
