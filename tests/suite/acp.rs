//! The ACP door (`pi-ide-broker acp`, issue 43) between the fake ACP client of the test kit
//! and a pi session. Here the pi session is a native client that speaks the follow methods as
//! the pi extension does (protocol 2, `docs/protocol.md` "Following a session"); `acp_pi.rs`
//! runs the real pi and `acp_nvim.rs` a real ACP client.

use crate::common::process::{broker_bin, isolate};
use crate::common::TestBroker;
use pi_ide_broker::testkit::acp_client::AcpClient;
use pi_ide_broker::testkit::agent::Agent;
use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use tokio::process::Command;

/// The sticky key of the fake pi session (pi's session id).
const KEY: &str = "pi-session-1";

/// A pi session as the extension opens it: protocol 2, its session id as key.
async fn pi_session(b: &TestBroker, cwd: &str, key: &str) -> Agent {
    let q = format!(
        "cwd={}&session={key}&client=pi-ide-broker-pi&client_version=0.1.0&protocol=2",
        pi_ide_broker::protocol::percent::encode_query(cwd)
    );
    within("the pi session's connect", Agent::connect(&b.socket, &q))
        .await
        .expect("pi session")
}

/// `pi-ide-broker acp` dialling this broker, initialized.
async fn acp(b: &TestBroker) -> AcpClient {
    let mut cmd = Command::new(broker_bin());
    cmd.arg("acp").env("PI_IDE_BROKER_SOCKET", &b.socket);
    isolate(&mut cmd, b.dir.path());
    let mut c = AcpClient::spawn(&mut cmd);
    let init = c.initialize(true, false).await;
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    assert_eq!(init["result"]["agentCapabilities"]["loadSession"], true);
    c
}

/// The next `broker/followers` the pi session gets.
async fn followers(pi: &mut Agent) -> Value {
    pi.until("broker/followers", |m| m["method"] == "broker/followers")
        .await["params"]
        .clone()
}

/// The next request of `method` the pi session gets (from a follower, through the broker).
async fn asked(pi: &mut Agent, method: &str) -> Value {
    pi.until(method, |m| m["method"] == method && m.get("id").is_some())
        .await
}

async fn reply(pi: &mut Agent, id: &Value, result: Value) {
    pi.send_text(&json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string())
        .await;
}

async fn update(pi: &mut Agent, update: Value) {
    pi.send_text(
        &json!({"jsonrpc": "2.0", "method": "pi/update", "params": {"update": update}}).to_string(),
    )
    .await;
}

fn chunk(kind: &str, text: &str) -> Value {
    json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}})
}

/// A new ACP thread follows the pi session of its folder (and says so clearly where none
/// runs); pi's transcript streams into it; a prompt typed there reaches pi and ends when pi's
/// turn does; `follow` only watches, and `session/cancel` ends it.
#[tokio::test(flavor = "current_thread")]
async fn a_thread_follows_the_pi_session_of_its_folder() {
    let b = TestBroker::start().await;
    let root = b.dir.path().join("proj");
    let cwd = root.to_str().unwrap();
    let mut c = acp(&b).await;
    let none = c.new_session(cwd).await;
    // ACP's "resource not found"; never -32000, which ACP clients take for "log in first".
    assert_eq!(none["error"]["code"], -32002, "{none}");
    assert!(
        none["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("no pi session runs in this folder"),
        "{none}"
    );
    // Two pi sessions there; the more recently active one is followed.
    let mut pi = pi_session(&b, &format!("{cwd}/src"), KEY).await;
    let _older = pi_session(&b, cwd, "older").await;
    update(&mut pi, chunk("agent_message_chunk", "warming up")).await;
    let new = c.new_session(cwd).await;
    assert_eq!(new["result"]["sessionId"], KEY, "{new}");
    assert_eq!(
        followers(&mut pi).await,
        json!({"count": 1, "reviewer": null, "buffers": true})
    );

    // Out of any turn: streamed all the same (Zed shows it).
    update(&mut pi, chunk("agent_message_chunk", "hello from pi")).await;
    let u = c
        .update("pi's chunk", |u| u["content"]["text"] == "hello from pi")
        .await;
    assert!(!u.in_turn);

    // A prompt: it reaches pi; while it is open this client reviews; pi's turn streams; its
    // end ends the prompt.
    let p = c.prompt(KEY, "fix the bug").await;
    assert_eq!(followers(&mut pi).await["reviewer"], "fake-acp-client");
    let asked_prompt = asked(&mut pi, "pi/prompt").await;
    assert_eq!(asked_prompt["params"]["text"], "fix the bug");
    update(&mut pi, chunk("agent_message_chunk", "on it")).await;
    let u = c
        .update("the turn's chunk", |u| u["content"]["text"] == "on it")
        .await;
    assert!(u.in_turn, "a turn's update comes while the prompt is open");
    reply(
        &mut pi,
        &asked_prompt["id"],
        json!({"stopReason": "end_turn"}),
    )
    .await;
    assert_eq!(c.answer(&p).await["result"]["stopReason"], "end_turn");
    assert_eq!(followers(&mut pi).await["reviewer"], Value::Null);

    // `follow`: nothing goes to pi; cancel ends the turn.
    let f = c.prompt(KEY, "follow").await;
    assert_eq!(followers(&mut pi).await["reviewer"], "fake-acp-client");
    update(
        &mut pi,
        chunk("user_message_chunk", "typed in the terminal"),
    )
    .await;
    assert!(
        c.update("a terminal prompt", |u| u["sessionUpdate"]
            == "user_message_chunk")
            .await
            .in_turn
    );
    c.cancel(KEY).await;
    assert_eq!(c.answer(&f).await["result"]["stopReason"], "cancelled");
    assert_eq!(followers(&mut pi).await["reviewer"], Value::Null);

    // A prompt turn cancelled: pi is asked to abort; its answer ends the prompt `cancelled`.
    let p = c.prompt(KEY, "long job").await;
    followers(&mut pi).await;
    let job = asked(&mut pi, "pi/prompt").await;
    c.cancel(KEY).await;
    let abort = asked(&mut pi, "pi/cancel").await;
    reply(&mut pi, &abort["id"], json!({})).await;
    reply(&mut pi, &job["id"], json!({"stopReason": "end_turn"})).await;
    assert_eq!(c.answer(&p).await["result"]["stopReason"], "cancelled");

    // The pi session ends: an open turn ends with a word, not a hang.
    let p = c.prompt(KEY, "follow").await;
    pi.until("the follow turn open", |m| {
        m["method"] == "broker/followers" && m["params"]["reviewer"] == "fake-acp-client"
    })
    .await;
    pi.close().await;
    let end = c.answer(&p).await;
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    assert!(
        c.agent_text().contains("the pi session is gone"),
        "{}",
        c.agent_text()
    );
    c.close().await;
}

/// A diff pi proposes while the thread's turn is open is a permission request with the diff:
/// allowed → FILE_SAVED with the text, rejected or cancelled → DIFF_REJECTED; a follower that
/// leaves mid-review leaves a DIFF_REJECTED marked undelivered, never an unreviewed write.
#[tokio::test(flavor = "current_thread")]
async fn diffs_are_reviewed_in_the_thread_while_its_turn_is_open() {
    let b = TestBroker::start().await;
    let root = b.dir.path().join("proj");
    std::fs::create_dir_all(&root).unwrap();
    let file = root.join("a.txt");
    std::fs::write(&file, "old\n").unwrap();
    let (cwd, path) = (root.to_str().unwrap(), file.to_str().unwrap());
    // The session is attached to an editor too: the reviewing thread wins over it.
    let (editor, _) = b.editor(&[cwd]).await;
    let mut editor_events = editor.events();
    let mut pi = pi_session(&b, cwd, KEY).await;
    pi.attached().await;
    let mut c = acp(&b).await;
    assert_eq!(c.new_session(cwd).await["result"]["sessionId"], KEY);
    followers(&mut pi).await;
    let turn = c.prompt(KEY, "follow").await;
    assert_eq!(followers(&mut pi).await["reviewer"], "fake-acp-client");

    for (n, decision, want) in [
        (1, Some("allow"), "FILE_SAVED"),
        (2, Some("reject"), "DIFF_REJECTED"),
        (3, None, "DIFF_REJECTED"),
    ] {
        let tab = format!("pi-write:call_{n}");
        pi.send_request(
            json!(n),
            "tools/call",
            json!({"name": "openDiff", "arguments": pi_ide_broker::testkit::diff_args(path, "new\n", &tab)}),
        )
        .await;
        let ask = c.permission().await;
        assert!(ask.in_turn);
        let call = &ask.msg["params"]["toolCall"];
        assert_eq!(call["toolCallId"], format!("call_{n}"));
        assert_eq!(
            call["content"][0],
            json!({"type": "diff", "path": path, "oldText": "old\n", "newText": "new\n"})
        );
        c.decide(&ask.msg, decision).await;
        let answer = pi.answer(&json!(n)).await;
        assert_eq!(pi_ide_broker::testkit::text(&answer), want, "{answer}");
        if want == "FILE_SAVED" {
            assert_eq!(answer["result"]["content"][1]["text"], "new\n");
        }
        assert!(
            answer["result"].get("_meta").is_none(),
            "reviewed: {answer}"
        );
    }

    // The follower goes away with a diff in its hands.
    pi.send_request(
        json!(9),
        "tools/call",
        json!({"name": "openDiff", "arguments": pi_ide_broker::testkit::diff_args(path, "x\n", "pi-edit:call_9")}),
    )
    .await;
    c.permission().await;
    c.close().await;
    let answer = pi.answer(&json!(9)).await;
    assert_eq!(pi_ide_broker::testkit::text(&answer), "DIFF_REJECTED");
    assert!(
        answer["result"]["_meta"]["pi-ide-broker/undelivered"].is_string(),
        "{answer}"
    );
    let _ = turn;
    assert_eq!(
        followers(&mut pi).await,
        json!({"count": 0, "reviewer": null, "buffers": false})
    );
    // None of those reached the editor; without a reviewer the next one does, as always.
    use pi_ide_broker::testkit::fake_editor::{wait_for, Event};
    let is_diff = |e: &Event| matches!(e, Event::Call { tool: Some(t), .. } if t == "openDiff");
    assert!(
        !std::iter::from_fn(|| editor_events.try_recv().ok()).any(|e| is_diff(&e)),
        "a diff the thread reviewed also reached the editor"
    );
    pi.call_tool(
        json!(10),
        "openDiff",
        pi_ide_broker::testkit::diff_args(path, "y\n", "pi-write:call_10"),
    )
    .await;
    wait_for(&mut editor_events, "the diff at the editor", is_diff).await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "old\n");
}

/// pi proposes diff `n` of `path`; `thread` must be the one asked, and decides; pi's answer.
async fn reviewed_by(
    pi: &mut Agent,
    thread: &mut AcpClient,
    path: &str,
    n: u64,
    decision: Option<&str>,
) -> Value {
    let args = pi_ide_broker::testkit::diff_args(path, "new\n", &format!("pi-write:call_{n}"));
    pi.send_request(
        json!(n),
        "tools/call",
        json!({"name": "openDiff", "arguments": args}),
    )
    .await;
    let ask = thread.permission().await;
    assert_eq!(
        ask.msg["params"]["toolCall"]["toolCallId"],
        format!("call_{n}")
    );
    thread.decide(&ask.msg, decision).await;
    pi.answer(&json!(n)).await
}

/// Two threads follow one session: the one whose turn opened last reviews, whichever followed
/// first; when its turn ends, the other's turn (still open) reviews again; with neither open,
/// nobody does (docs/protocol.md, "Who reviews a diff").
#[tokio::test(flavor = "current_thread")]
async fn of_two_threads_the_latest_turn_reviews() {
    let b = TestBroker::start().await;
    let root = b.dir.path().join("proj");
    std::fs::create_dir_all(&root).unwrap();
    let file = root.join("a.txt");
    std::fs::write(&file, "old\n").unwrap();
    let (cwd, path) = (root.to_str().unwrap(), file.to_str().unwrap());
    let mut pi = pi_session(&b, cwd, KEY).await;
    let mut first = acp(&b).await;
    assert_eq!(first.new_session(cwd).await["result"]["sessionId"], KEY);
    assert_eq!(followers(&mut pi).await["count"], 1);
    let mut second = acp(&b).await;
    assert_eq!(second.new_session(cwd).await["result"]["sessionId"], KEY);
    assert_eq!(followers(&mut pi).await["count"], 2);

    // The second thread opens its turn, then the first: the first is the latest.
    let _second_turn = second.prompt(KEY, "follow").await;
    assert_eq!(followers(&mut pi).await["reviewer"], "fake-acp-client");
    let first_turn = first.prompt(KEY, "follow").await;
    assert_eq!(followers(&mut pi).await["reviewer"], "fake-acp-client");
    let answer = reviewed_by(&mut pi, &mut first, path, 1, Some("allow")).await;
    assert_eq!(
        pi_ide_broker::testkit::text(&answer),
        "FILE_SAVED",
        "{answer}"
    );

    // The first thread's turn ends: the second's is open still, and reviews the next diff.
    first.cancel(KEY).await;
    assert_eq!(
        first.answer(&first_turn).await["result"]["stopReason"],
        "cancelled"
    );
    assert_eq!(followers(&mut pi).await["reviewer"], "fake-acp-client");
    let answer = reviewed_by(&mut pi, &mut second, path, 2, Some("reject")).await;
    assert_eq!(
        pi_ide_broker::testkit::text(&answer),
        "DIFF_REJECTED",
        "{answer}"
    );

    second.cancel(KEY).await;
    assert_eq!(followers(&mut pi).await["reviewer"], Value::Null);
    first.close().await;
    second.close().await;
}

/// `session/load` replays the pi session's history before its answer; `session/list` lists
/// the sessions of a folder; a session that is not followable (an old extension, protocol 1)
/// is neither listed nor followed.
#[tokio::test(flavor = "current_thread")]
async fn load_replays_history_and_old_clients_are_not_followed() {
    let b = TestBroker::start().await;
    let root = b.dir.path().join("proj");
    let cwd = root.to_str().unwrap();
    let mut pi = pi_session(&b, cwd, KEY).await;
    let _old = Agent::connect(
        &b.socket,
        &format!("cwd={cwd}&session=old&client=pi-ide-broker-pi&protocol=1"),
    )
    .await
    .expect("old client");
    let mut c = acp(&b).await;
    let list = c.request("session/list", json!({"cwd": cwd})).await;
    let list = c.answer(&list).await;
    let ids: Vec<&str> = list["result"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["sessionId"].as_str())
        .collect();
    assert_eq!(ids, vec![KEY], "{list}");

    let load = c
        .request(
            "session/load",
            json!({"sessionId": KEY, "cwd": cwd, "mcpServers": []}),
        )
        .await;
    let h = asked(&mut pi, "pi/history").await;
    reply(
        &mut pi,
        &h["id"],
        json!({"updates": [chunk("user_message_chunk", "earlier question"), chunk("agent_message_chunk", "earlier answer")]}),
    )
    .await;
    let done = c.answer(&load).await;
    assert!(done.get("result").is_some(), "{done}");
    let texts: Vec<&str> = c
        .updates
        .iter()
        .filter_map(|s| s.msg["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(texts, vec!["earlier question", "earlier answer"]);

    let old = c
        .request(
            "session/load",
            json!({"sessionId": "old", "cwd": cwd, "mcpServers": []}),
        )
        .await;
    let refused = c.answer(&old).await;
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("protocol 2"),
        "{refused}"
    );
    c.close().await;
}

/// A broker restart: the thread's follow connection is dialled again once the pi session is
/// back; an open prompt turn ends saying so (its answer went with the old broker); the next
/// prompt reaches pi.
#[tokio::test(flavor = "current_thread")]
async fn a_broker_restart_is_followed_through() {
    let b = TestBroker::start().await;
    let root = b.dir.path().join("proj");
    let cwd = root.to_str().unwrap().to_string();
    let mut pi = pi_session(&b, &cwd, KEY).await;
    let mut c = acp(&b).await;
    assert_eq!(c.new_session(&cwd).await["result"]["sessionId"], KEY);
    followers(&mut pi).await;
    let p = c.prompt(KEY, "long job").await;
    asked(&mut pi, "pi/prompt").await;

    let dir = b.stop_keep_dir().await;
    let b = TestBroker::start_in(dir, |_| {}).await;
    let mut pi = pi_session(&b, &cwd, KEY).await;
    let end = c.answer(&p).await;
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    assert!(c.agent_text().contains("restarted"), "{}", c.agent_text());
    assert_eq!(followers(&mut pi).await["count"], 1);

    let p = c.prompt(KEY, "after the restart").await;
    let again = asked(&mut pi, "pi/prompt").await;
    assert_eq!(again["params"]["text"], "after the restart");
    reply(&mut pi, &again["id"], json!({"stopReason": "end_turn"})).await;
    assert_eq!(c.answer(&p).await["result"]["stopReason"], "end_turn");
    c.close().await;
}

/// Issue 63 faults 1 and 6, and a turn answered twice: a cancel in a watching turn with a
/// permission pending answers pi's diff (rejected) and withdraws the permission; the next
/// prompt is answered once, and the cancelled turn never again (the test client fails on a
/// second answer); `session/close` with no turn open lets the follow connection go.
#[tokio::test(flavor = "current_thread")]
async fn a_watching_turns_cancel_settles_its_permission_and_close_lets_go() {
    let b = TestBroker::start().await;
    let root = b.dir.path().join("proj");
    std::fs::create_dir_all(&root).unwrap();
    let file = root.join("a.txt");
    let (cwd, path) = (root.to_str().unwrap(), file.to_str().unwrap());
    let mut pi = pi_session(&b, cwd, KEY).await;
    let mut c = acp(&b).await;
    assert_eq!(c.new_session(cwd).await["result"]["sessionId"], KEY);
    followers(&mut pi).await;
    let watch = c.prompt(KEY, "follow").await;
    assert_eq!(followers(&mut pi).await["reviewer"], "fake-acp-client");
    pi.send_request(
        json!(1),
        "tools/call",
        json!({"name": "openDiff", "arguments": pi_ide_broker::testkit::diff_args(path, "new\n", "pi-write:call_1")}),
    )
    .await;
    let ask = c.permission().await;
    c.cancel(KEY).await;
    let verdict = pi.answer(&json!(1)).await;
    assert_eq!(
        pi_ide_broker::testkit::text(&verdict),
        "DIFF_REJECTED",
        "{verdict}"
    );
    let withdrawn = c
        .until("$/cancel_request", |m| m["method"] == "$/cancel_request")
        .await;
    assert_eq!(withdrawn.msg["params"]["requestId"], ask.msg["id"]);
    assert_eq!(c.answer(&watch).await["result"]["stopReason"], "cancelled");
    assert_eq!(followers(&mut pi).await["reviewer"], Value::Null);

    let p = c.prompt(KEY, "hello").await;
    let asked_prompt = asked(&mut pi, "pi/prompt").await;
    reply(
        &mut pi,
        &asked_prompt["id"],
        json!({"stopReason": "end_turn"}),
    )
    .await;
    assert_eq!(c.answer(&p).await["result"]["stopReason"], "end_turn");

    let close = c.close_session(KEY).await;
    assert_eq!(c.answer(&close).await["result"], json!({}));
    pi.until("the follower gone", |m| {
        m["method"] == "broker/followers" && m["params"]["count"] == 0
    })
    .await;
    c.close().await;
}

/// Issue 63 fault 3: `session/close` during a running prompt stops that prompt in pi (as
/// `session/cancel` would), answers it `cancelled` without a false word about pi, then lets
/// the follow connection go.
#[tokio::test(flavor = "current_thread")]
async fn close_during_a_prompt_stops_it_and_lets_go() {
    let b = TestBroker::start().await;
    let root = b.dir.path().join("proj");
    let cwd = root.to_str().unwrap();
    let mut pi = pi_session(&b, cwd, KEY).await;
    let mut c = acp(&b).await;
    assert_eq!(c.new_session(cwd).await["result"]["sessionId"], KEY);
    followers(&mut pi).await;
    let p = c.prompt(KEY, "run sleep 20").await;
    let job = asked(&mut pi, "pi/prompt").await;
    assert_eq!(job["params"]["prompt"], job["id"], "{job}");
    let close = c.close_session(KEY).await;
    let told = c.through_answer(&close).await;
    let ended = told
        .iter()
        .find(|m| m["id"] == p)
        .unwrap_or_else(|| panic!("the prompt was not answered before the close: {told:?}"));
    assert_eq!(ended["result"]["stopReason"], "cancelled", "{ended}");
    assert!(!c.agent_text().contains("gone"), "{}", c.agent_text());
    let stop = asked(&mut pi, "pi/cancel").await;
    assert_eq!(stop["params"]["prompt"], job["id"], "{stop}");
    pi.until("the follower gone", |m| {
        m["method"] == "broker/followers" && m["params"]["count"] == 0
    })
    .await;
    c.close().await;
}

/// Issue 63 fault 5: `session/list {cwd}` is exact and dates each session; a cursor is an
/// error; the client's `$/cancel_request` for its prompt cancels it; resuming a session the
/// broker does not know is ACP's "resource not found".
#[tokio::test(flavor = "current_thread")]
async fn list_cancel_request_and_not_found_as_acp_says() {
    let b = TestBroker::start().await;
    let root = b.dir.path().join("proj");
    let cwd = root.to_str().unwrap();
    // The session below the folder is there first: the folder's own is the one to follow.
    let _sub = pi_session(&b, &format!("{cwd}/sub"), "in-sub").await;
    let mut pi = pi_session(&b, cwd, KEY).await;
    let mut c = acp(&b).await;
    let list = c.request("session/list", json!({"cwd": cwd})).await;
    let list = c.answer(&list).await;
    let sessions = list["result"]["sessions"].as_array().expect("sessions");
    assert_eq!(sessions.len(), 1, "{list}");
    assert_eq!(sessions[0]["sessionId"], KEY);
    let at = sessions[0]["updatedAt"].as_str().unwrap_or_default();
    assert!(at.len() == 20 && at.ends_with('Z'), "{list}");
    let bogus = c
        .request("session/list", json!({"cwd": cwd, "cursor": "bogus"}))
        .await;
    assert_eq!(c.answer(&bogus).await["error"]["code"], -32602);

    let resume = c
        .request(
            "session/resume",
            json!({"sessionId": "nobody", "cwd": cwd, "mcpServers": []}),
        )
        .await;
    let refused = c.answer(&resume).await;
    assert_eq!(refused["error"]["code"], -32002, "{refused}");

    assert_eq!(c.new_session(cwd).await["result"]["sessionId"], KEY);
    followers(&mut pi).await;
    let p = c.prompt(KEY, "long job").await;
    let job = asked(&mut pi, "pi/prompt").await;
    c.cancel_request(&p).await;
    let stop = asked(&mut pi, "pi/cancel").await;
    assert_eq!(stop["params"]["prompt"], job["id"]);
    reply(&mut pi, &stop["id"], json!({})).await;
    reply(&mut pi, &job["id"], json!({"stopReason": "cancelled"})).await;
    assert_eq!(c.answer(&p).await["result"]["stopReason"], "cancelled");
    c.close().await;
}
