//! Editors that differ from pi-ide.nvim in what the broker must respect: Emacs's
//! claude-code-ide.el writes no token, and the Claude Code VS Code extension keeps one client
//! at a time (`taken`). Both against the fake editor in the recorded shapes.

use crate::common::*;
use pi_ide_broker::testkit::text;
use serde_json::json;

#[tokio::test]
async fn an_emacs_lockfile_without_a_token_links_without_the_header_and_serves_calls() {
    let b = TestBroker::start().await;
    let fe = FakeEditor::start_in(&b.claude_dir, Options::emacs(&["/emacs-proj"]))
        .await
        .unwrap();
    let lock = std::fs::read_to_string(b.claude_dir.join(format!("{}.lock", fe.port))).unwrap();
    assert!(!lock.contains("authToken"), "the recorded shape: {lock}");
    let e = b.wait_editor(fe.port, "ready").await;
    assert_eq!(e["ide_name"], "Emacs");
    assert_eq!(e["family"], "claude");
    assert_eq!(e["no_token"], true, "{e:#}");
    assert_eq!(fe.auth_headers_seen(), 0, "dialled without an auth header");
    let mut a = Agent::connect(&b.socket, "cwd=/emacs-proj&dialect=claude")
        .await
        .unwrap();
    let r = a.call("getDiagnostics", json!({})).await;
    assert!(text(&r).contains("boom"), "{r:#}");
    assert!(b.status().await["lockfiles_rejected"]
        .as_array()
        .is_some_and(|r| r.is_empty()));
    // A tokened editor beside it still gets its header and is not marked.
    let (nv, _) = b.editor(&["/nv"]).await;
    assert!(nv.auth_headers_seen() >= 1);
    let st = b.status().await;
    assert_eq!(editor_by_port(&st, nv.port).unwrap()["no_token"], false);
    a.close().await;
    b.stop().await;
}

/// How long the idle broker must leave a single-client editor's other client alone: each
/// test's window is 30 probes of the `taken` check, and 6 of the take policy's first backoffs
/// (the fight it would have).
const WINDOW: std::time::Duration = std::time::Duration::from_millis(1500);

/// A broker whose `taken` probe runs every 50 ms, beside a one-client fake editor with an
/// attached Claude-dialect agent; `policy` is `[editors] single_client`.
async fn one_client_setup(
    policy: pi_ide_broker::sys::config::SingleClient,
) -> (TestBroker, FakeEditor, Agent) {
    let b = TestBroker::start_with(|c| {
        c.editors.single_client = policy;
        c.editors.taken_probe_ms = 50;
    })
    .await;
    let (fe, _) = b.start_editor(Options::vscode(&["/vsc"])).await;
    let mut a = Agent::connect(&b.socket, "cwd=/vsc&dialect=claude")
        .await
        .unwrap();
    a.attached().await;
    (b, fe, a)
}

async fn echo_works(a: &mut Agent) -> bool {
    let r = a.call("echo", json!({"x": "hi"})).await;
    text(&r).contains("hi")
}

#[tokio::test]
async fn an_idle_broker_yields_a_single_client_editor_and_takes_it_back_when_the_other_leaves() {
    use pi_ide_broker::testkit::rival::Rival;
    let (b, fe, mut a) = one_client_setup(Default::default()).await;
    let header = pi_ide_broker::protocol::family::Family::Claude.auth_header();
    // The user's Claude Code, which reconnects whenever it is closed.
    let mut rival = Rival::start(fe.port, header, Some(fe.token().into()), true).await;
    rival.wait_connected().await;
    let e = b.wait_editor(fe.port, "taken").await;
    assert!(
        e["state_reason"]
            .as_str()
            .is_some_and(|r| r.contains("another client")),
        "{e:#}"
    );
    let note = a
        .until("the taken notice", |m| m["method"] == "broker/editor_state")
        .await;
    assert_eq!(note["params"]["state"], "taken", "{note:#}");
    let routes = a.request(json!("ed"), "broker/editors", json!({})).await;
    assert_eq!(
        routes["result"]["editors"][0]["state"], "taken",
        "{routes:#}"
    );
    assert!(routes["result"]["editors"][0]["reason"].is_string());
    let st = b.status().await;
    assert_eq!(
        st["sessions"][0]["editor"], e["id"],
        "the session stays attached"
    );
    // The broker's session is idle: nothing may evict the other client.
    tokio::time::sleep(WINDOW).await;
    assert_eq!(rival.evictions(), 0, "the other client was never closed");
    assert!(rival.is_connected());
    assert_eq!(fe.evictions(), 1, "only the broker's first link was closed");
    assert_eq!(
        editor_by_port(&b.status().await, fe.port).unwrap()["state"],
        "taken"
    );
    // The other client leaves: the broker connects again by itself, and the next call works.
    rival.leave().await;
    b.wait_editor(fe.port, "ready").await;
    let back = a
        .until("the ready notice", |m| m["method"] == "broker/editor_state")
        .await;
    assert_eq!(back["params"]["state"], "ready", "{back:#}");
    assert!(echo_works(&mut a).await);
    assert_eq!(fe.evictions(), 1);
    a.close().await;
    b.stop().await;
}

/// A call to a taken editor is answered on its first try: the broker links for it (one
/// eviction of the other client), and once the other client has gone for good the broker,
/// finding the editor free after its hand-back, keeps it.
#[tokio::test]
async fn a_call_to_a_taken_editor_is_answered_on_the_first_try() {
    use pi_ide_broker::testkit::rival::Rival;
    let (b, fe, mut a) = one_client_setup(Default::default()).await;
    let header = pi_ide_broker::protocol::family::Family::Claude.auth_header();
    // A plain second client that does not come back once closed.
    let mut rival = Rival::start(fe.port, header, Some(fe.token().into()), false).await;
    rival.wait_connected().await;
    b.wait_editor(fe.port, "taken").await;
    assert!(echo_works(&mut a).await, "the first call is answered");
    assert_eq!(rival.evictions(), 1);
    let e = editor_by_port(&b.status().await, fe.port).cloned().unwrap();
    assert!(
        e["state_reason"]
            .as_str()
            .is_some_and(|r| r.contains("handed back")),
        "linked for the call: {e:#}"
    );
    // Handed back when idle; nobody comes back, so the broker keeps the free editor.
    b.wait_status("the broker to keep the free editor", |st| {
        editor_by_port(st, fe.port)
            .is_some_and(|e| e["state"] == "ready" && e["state_reason"].is_null())
    })
    .await;
    assert!(echo_works(&mut a).await);
    rival.leave().await;
    a.close().await;
    b.stop().await;
}

/// Issue 39: a session that starts while the user's own client holds the editor is attached to
/// it and told it is taken; each of its calls is answered on the first try (one eviction of the
/// other client per call window), the editor is handed back between them, and the other
/// client, which reconnects whenever closed, is left alone while the broker is idle.
#[tokio::test]
async fn a_session_started_while_the_editor_is_taken_is_attached_and_answered() {
    use pi_ide_broker::testkit::rival::Rival;
    let b = TestBroker::start_with(|c| c.editors.taken_probe_ms = 50).await;
    let (fe, _) = b.start_editor(Options::vscode(&["/vsc"])).await;
    let header = pi_ide_broker::protocol::family::Family::Claude.auth_header();
    let mut rival = Rival::start(fe.port, header, Some(fe.token().into()), true).await;
    rival.wait_connected().await;
    let e = b.wait_editor(fe.port, "taken").await;
    let mut a = Agent::connect(&b.socket, "cwd=/vsc&dialect=claude")
        .await
        .unwrap();
    let att = a.attached().await;
    assert_eq!(att["params"]["editor"], e["id"], "{att:#}");
    let note = a
        .until("the taken notice", |m| m["method"] == "broker/editor_state")
        .await;
    assert_eq!(note["params"]["state"], "taken", "{note:#}");
    assert!(note["params"]["reason"].is_string(), "{note:#}");
    let st = b.status().await;
    assert_eq!(st["sessions"][0]["editor"], e["id"], "{st:#}");
    for round in 1..=2u64 {
        assert!(echo_works(&mut a).await, "round {round}: answered");
        assert_eq!(rival.evictions(), round, "one eviction per call window");
        // Handed back once idle: the other client reconnects and holds it again.
        b.wait_status("the editor handed back", |st| {
            editor_by_port(st, fe.port).is_some_and(|e| e["state"] == "taken")
        })
        .await;
        rival.wait_connected().await;
    }
    // Idle: the other client keeps the editor.
    tokio::time::sleep(WINDOW).await;
    assert_eq!(
        rival.evictions(),
        2,
        "nothing evicted while the broker is idle"
    );
    rival.leave().await;
    a.close().await;
    b.stop().await;
}

#[tokio::test]
async fn with_the_take_policy_the_two_clients_fight_as_before() {
    // The contrast that shows the fake reproduces the fight the yield policy avoids.
    use pi_ide_broker::testkit::rival::Rival;
    let (b, fe, a) = one_client_setup(pi_ide_broker::sys::config::SingleClient::Take).await;
    let header = pi_ide_broker::protocol::family::Family::Claude.auth_header();
    let mut rival = Rival::start(fe.port, header, Some(fe.token().into()), true).await;
    rival.wait_connected().await;
    pi_ide_broker::testkit::eventually("the broker to evict the other client", || {
        (rival.evictions() >= 2).then_some(())
    })
    .await;
    assert!(fe.evictions() >= 3, "{}", fe.evictions());
    rival.leave().await;
    a.close().await;
    b.stop().await;
}

/// A broker (`taken` probe every 50 ms) beside a one-client fake editor made with `opts`,
/// ready, with an attached Claude-dialect agent.
async fn one_client_with(opts: Options) -> (TestBroker, FakeEditor, Agent) {
    let b = TestBroker::start_with(|c| c.editors.taken_probe_ms = 50).await;
    let fe = FakeEditor::start_in(&b.claude_dir, opts).await.unwrap();
    b.wait_editor(fe.port, "ready").await;
    let mut a = Agent::connect(&b.socket, "cwd=/vsc&dialect=claude")
        .await
        .unwrap();
    a.attached().await;
    (b, fe, a)
}

/// `getDiagnostics` from `a`: the fake editor's own answer (its "boom" diagnostic), or the
/// whole answer (an error: not answered on the first try).
async fn diagnostics(a: &mut Agent) -> Result<(), serde_json::Value> {
    let r = a.call("getDiagnostics", json!({})).await;
    let ok = text(&r).contains("boom");
    if ok {
        Ok(())
    } else {
        Err(r)
    }
}

/// The real Claude Code CLI (2.1.332) is back 2–13 ms after VS Code's extension closed it, and
/// the extension then closes the broker's link: a call to the taken editor has those few ms.
/// The broker writes `initialize`, `notifications/initialized` and the parked call back to back
/// right after the upgrade (the editor's tools are known from its first link), so the call is
/// answered on its first try before the other client is back, here from an editor whose
/// `tools/list` takes 10 ms (waiting for it, the call went out after the other client was
/// back and was cut: `link lost`).
#[tokio::test]
async fn a_call_to_a_taken_editor_whose_other_client_is_back_within_2_ms_is_answered_first_try() {
    use pi_ide_broker::testkit::rival::Rival;
    let mut opts = Options::vscode(&["/vsc"]);
    opts.tools_list_delay = std::time::Duration::from_millis(10);
    let (b, fe, mut a) = one_client_with(opts).await;
    let header = pi_ide_broker::protocol::family::Family::Claude.auth_header();
    let back = std::time::Duration::from_millis(2);
    let mut rival =
        Rival::start_with(fe.port, header, Some(fe.token().into()), Some(back), None).await;
    rival.wait_connected().await;
    b.wait_editor(fe.port, "taken").await;
    for round in 1..=3i64 {
        if let Err(r) = diagnostics(&mut a).await {
            panic!("round {round}: not answered on the first try: {r:#}");
        }
        // The other client is back at once and the editor closes the broker's link.
        b.wait_editor(fe.port, "taken").await;
        rival.wait_connected().await;
    }
    let st = b.status().await;
    let tools = editor_by_port(&st, fe.port).unwrap()["tools"].clone();
    assert!(
        tools.as_array().is_some_and(|t| !t.is_empty()),
        "the tools stay known: {tools:#}"
    );
    // One eviction per call, and at most one more for a call sent again.
    assert!(
        (3..=6).contains(&rival.evictions()),
        "{}",
        rival.evictions()
    );
    rival.leave().await;
    a.close().await;
    b.stop().await;
}

/// The extension's Close was seen in the same read as its `initialize` answer (the other
/// client back mid-handshake). The Close is answered and the link is not used: the call
/// parked for it, cut before any answer came, is sent once more by the next link and answered
/// on the first try (it was sent on a dead link and timed out after 5 s).
#[tokio::test]
async fn a_close_right_after_the_initialize_answer_does_not_lose_the_parked_call() {
    use pi_ide_broker::testkit::rival::Rival;
    let (b, fe, mut a) = one_client_with(Options::vscode(&["/vsc"])).await;
    let header = pi_ide_broker::protocol::family::Family::Claude.auth_header();
    let mut rival = Rival::start(fe.port, header, Some(fe.token().into()), false).await;
    rival.wait_connected().await;
    b.wait_editor(fe.port, "taken").await;
    fe.close_after_initialize(1);
    let t0 = std::time::Instant::now();
    if let Err(r) = diagnostics(&mut a).await {
        panic!("not answered on the first try: {r:#}");
    }
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        t0.elapsed()
    );
    let st = b.status().await;
    let tools = editor_by_port(&st, fe.port).unwrap()["tools"].clone();
    assert!(tools.as_array().is_some_and(|t| !t.is_empty()), "{tools:#}");
    rival.leave().await;
    a.close().await;
    b.stop().await;
}

/// A Close during the handshake fails the dial, even after `initialize` was answered: the link
/// is never declared ready on a `tools/list` that failed because the link died (it was, with
/// no tools, and left open and silent). The dial is answered with its Close and tried again
/// after the backoff; the editor is ready with its tools.
#[tokio::test]
async fn a_close_during_the_handshake_fails_the_dial_and_the_link_is_never_ready_without_tools() {
    use pi_ide_broker::registry::EditorEvent;
    let b = TestBroker::start().await;
    let mut news = b.handle.registry().subscribe_editors();
    let fe = FakeEditor::start(Options::vscode(&["/vsc"])).await.unwrap();
    fe.close_after_initialize(1);
    fe.write_lockfile(&b.claude_dir).unwrap();
    b.wait_status("the editor ready with its tools", |st| {
        editor_by_port(st, fe.port).is_some_and(|e| {
            e["state"] == "ready" && e["tools"].as_array().is_some_and(|t| !t.is_empty())
        })
    })
    .await;
    // Told to listeners just after the status changed.
    let first = pi_ide_broker::testkit::within("the ready news", news.recv()).await;
    assert!(matches!(first, Some(EditorEvent::Ready(_))), "{first:?}");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let mut readies = 1;
    while let Ok(ev) = news.try_recv() {
        readies += usize::from(matches!(ev, EditorEvent::Ready(_)));
    }
    assert_eq!(
        readies, 1,
        "declared ready once, by the dial that had its tools"
    );
    let mut a = Agent::connect(&b.socket, "cwd=/vsc&dialect=claude")
        .await
        .unwrap();
    a.attached().await;
    if let Err(r) = diagnostics(&mut a).await {
        panic!("{r:#}");
    }
    a.close().await;
    b.stop().await;
}

/// Issue 39: a JetBrains IDE (the test kit's editor built from the plugin's documented
/// behaviour, the recorded editors) requires the `mcp` subprotocol Claude Code offers and drops a
/// client that leaves its JSON-RPC `ping` unanswered for 3 s (here 300 ms, pinging every
/// 400 ms). The broker dials as Claude Code does, answers every ping itself, and serves calls.
#[tokio::test]
async fn a_jetbrains_editor_is_dialled_with_the_mcp_subprotocol_and_its_pings_answered() {
    let b = TestBroker::start().await;
    let mut opts = Options::jetbrains(&["/jb"]);
    opts.rpc_ping = Some((
        std::time::Duration::from_millis(400),
        std::time::Duration::from_millis(300),
    ));
    let fe = FakeEditor::start_in(&b.claude_dir, opts).await.unwrap();
    let e = b.wait_editor(fe.port, "ready").await;
    assert_eq!(e["ide_name"], "IntelliJ IDEA", "{e:#}");
    let mut a = Agent::connect(&b.socket, "cwd=/jb&dialect=claude")
        .await
        .unwrap();
    a.attached().await;
    pi_ide_broker::testkit::eventually("four pings answered", || {
        (fe.rpc_pings_answered() >= 4).then_some(())
    })
    .await;
    assert_eq!(
        fe.clients(),
        1,
        "the link was never dropped for a late pong"
    );
    assert!(echo_works(&mut a).await);
    let st = b.status().await;
    assert_eq!(editor_by_port(&st, fe.port).unwrap()["state"], "ready");
    a.close().await;
    b.stop().await;
}

/// A broker whose `taken` probe never ticks within a test (10 min), beside a one-client fake
/// editor taken by the user's own client (reconnecting `back` after each eviction, or never),
/// with an attached Claude-dialect agent: what a call to a taken editor does can only come
/// from the call itself, never from a probe (issue 53: every taken test set a 50 ms probe,
/// which hid a call that waited for the next tick).
async fn taken_without_probes(
    back: Option<std::time::Duration>,
) -> (
    TestBroker,
    FakeEditor,
    pi_ide_broker::testkit::rival::Rival,
    Agent,
) {
    use pi_ide_broker::testkit::rival::Rival;
    let b = TestBroker::start_with(|c| c.editors.taken_probe_ms = 600_000).await;
    let (fe, _) = b.start_editor(Options::vscode(&["/vsc"])).await;
    let header = pi_ide_broker::protocol::family::Family::Claude.auth_header();
    let rival = Rival::start_with(fe.port, header, Some(fe.token().into()), back, None).await;
    b.wait_editor(fe.port, "taken").await;
    let mut a = Agent::connect(&b.socket, "cwd=/vsc&dialect=claude")
        .await
        .unwrap();
    a.attached().await;
    (b, fe, rival, a)
}

/// A call to a taken editor wakes the link at once: it is answered without any probe tick.
#[tokio::test]
async fn a_call_to_a_taken_editor_is_answered_without_waiting_for_a_probe() {
    let back = Some(std::time::Duration::from_millis(200));
    let (b, _fe, mut rival, mut a) = taken_without_probes(back).await;
    rival.wait_connected().await;
    assert!(echo_works(&mut a).await, "the call was answered");
    rival.leave().await;
    a.close().await;
    b.stop().await;
}

/// A diff the user is still reading in a taken editor is not cut by the hand-back: the link
/// taken back for it stays while the call is open past the idle hand-back time (3 s), and
/// the user's Accept reaches the agent. (The other client stays away meanwhile, as the real
/// VS Code's did in issue 53's run, where the diff was cut about 3 s in.)
#[tokio::test]
async fn a_diff_open_past_the_hand_back_time_in_a_taken_editor_is_still_answered() {
    let (b, fe, mut rival, mut a) = taken_without_probes(None).await;
    rival.wait_connected().await;
    let mut events = fe.events();
    a.call_tool(
        json!(7),
        "openDiff",
        json!({"old_file_path": "/vsc/a.txt", "new_file_path": "/vsc/a.txt", "new_file_contents": "new\n", "tab_name": "held"}),
    )
    .await;
    pi_ide_broker::testkit::fake_editor::next_tool_call(&mut events, "openDiff").await;
    // The user reads the diff for longer than the link's idle hand-back time.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    // The broker labels the tab (`✻ [pi s1] held ⧉`): the one diff open is it.
    let open = fe.pending_diffs();
    assert_eq!(
        open.len(),
        1,
        "the diff is still open in the editor: {open:?}"
    );
    assert!(fe.accept_diff(&open[0], "accepted\n"));
    let r = a.answer(&json!(7)).await;
    assert_eq!(r["result"]["content"][0]["text"], "FILE_SAVED", "{r:#}");
    assert_eq!(r["result"]["content"][1]["text"], "accepted\n", "{r:#}");
    rival.leave().await;
    a.close().await;
    b.stop().await;
}
