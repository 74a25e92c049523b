//! The ACP agent's state machine, without I/O: client lines and broker frames in, [`Out`]s
//! checked. Each test guards a rule a real client tripped on (issue 53).

use super::*;

/// The client lines of `out`, parsed.
fn to_client(out: &[Out]) -> Vec<Value> {
    out.iter()
        .filter_map(|o| match o {
            Out::Client(l) => serde_json::from_str(l).ok(),
            _ => None,
        })
        .collect()
}

/// The broker frames of `out` for session `key`, parsed.
fn to_broker(out: &[Out], key: &str) -> Vec<Value> {
    out.iter()
        .filter_map(|o| match o {
            Out::Broker(k, f) if k == key => serde_json::from_str(f).ok(),
            _ => None,
        })
        .collect()
}

fn line(v: Value) -> String {
    v.to_string()
}

/// An agent whose ACP session `k` follows pi session `k`.
fn followed() -> Agent {
    let mut a = Agent::default();
    a.on_client_line(&line(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": true}}}})));
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/p"}}),
    ));
    let Some(Out::List { purpose, .. }) = out.into_iter().next() else {
        panic!("session/new lists the folder's sessions");
    };
    let out = a.listed(
        purpose,
        Ok(vec![crate::protocol::follow::PiSession {
            session: Some("k".into()),
            cwd: "/p".into(),
            since: 1,
            editor: None,
            followers: 0,
        }]),
    );
    assert!(matches!(&out[..], [Out::Connect { key, load: false, .. }] if key == "k"));
    let out = a.connected("k", json!(2), false, Ok(()));
    assert_eq!(to_client(&out)[0]["result"]["sessionId"], "k");
    a
}

fn prompt(a: &mut Agent, id: u64, blocks: Value) -> Vec<Out> {
    a.on_client_line(&line(json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {"sessionId": "k", "prompt": blocks}})))
}

fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

/// The `pi/prompt` text sent to the broker in `out`.
fn sent_text(out: &[Out]) -> Option<String> {
    to_broker(out, "k")
        .into_iter()
        .find(|f| f["method"] == follow::PROMPT)
        .and_then(|f| f["params"]["text"].as_str().map(str::to_owned))
}

/// The broker's `pi/review` on `k`, answered by the agent with a permission request: its id.
fn reviewed(a: &mut Agent, broker_id: &str) -> Value {
    let out = a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "id": broker_id, "method": follow::REVIEW, "params": {"arguments": {"new_file_path": "/p/a.txt", "new_file_contents": "new\n", "tab_name": "pi-write:t1"}}})),
    );
    let asks = to_client(&out);
    assert_eq!(asks[0]["method"], "session/request_permission");
    assert_eq!(asks[0]["params"]["toolCall"]["toolCallId"], "t1");
    asks[0]["id"].clone()
}

#[test]
fn a_prompt_goes_to_pi_and_its_answer_ends_the_turn() {
    let mut a = followed();
    let out = prompt(&mut a, 3, json!([text("hello")]));
    assert_eq!(sent_text(&out).as_deref(), Some("hello"));
    let asked = to_broker(&out, "k")
        .into_iter()
        .find(|f| f["method"] == follow::PROMPT)
        .expect("pi/prompt");
    let out = a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"stopReason": "end_turn"}})),
    );
    let end = to_client(&out);
    assert_eq!(end[0]["id"], 3);
    assert_eq!(end[0]["result"]["stopReason"], "end_turn");
    assert_eq!(to_broker(&out, "k")[0]["params"]["ready"], false);
    // pi's own word on how the turn ended is the client's (here: stopped in pi's terminal).
    let out = prompt(&mut a, 4, json!([text("again")]));
    let asked = to_broker(&out, "k")
        .into_iter()
        .find(|f| f["method"] == follow::PROMPT)
        .expect("pi/prompt");
    let out = a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"stopReason": "cancelled"}})),
    );
    assert_eq!(to_client(&out)[0]["result"]["stopReason"], "cancelled");
}

/// F3: a cancel with a permission unanswered (agentic.nvim's cancel) answers the review as
/// rejected before pi is told to stop, withdraws the permission from the client, and a late
/// answer to it is ignored.
#[test]
fn a_cancel_withdraws_an_unanswered_permission_and_rejects_the_diff() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("write a.txt")]));
    let permission = reviewed(&mut a, "review-9");
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "k"}}),
    ));
    let frames = to_broker(&out, "k");
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frames[0]["id"], "review-9");
    assert_eq!(frames[0]["result"]["content"][0]["text"], "DIFF_REJECTED");
    assert_eq!(
        frames[1]["method"],
        follow::CANCEL,
        "pi is stopped after the verdict"
    );
    let told = to_client(&out);
    assert_eq!(told[0]["method"], "$/cancel_request");
    assert_eq!(told[0]["params"]["requestId"], permission);
    let late = a.on_client_line(&line(json!({"jsonrpc": "2.0", "id": permission, "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}})));
    assert!(late.is_empty(), "a late Allow reached the broker: {late:?}");
}

/// F3: the broker takes a review back (pi aborted): the client's permission is withdrawn and
/// its late answer goes nowhere.
#[test]
fn a_review_the_broker_takes_back_is_withdrawn_from_the_client() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("follow")]));
    let permission = reviewed(&mut a, "review-4");
    let other = a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "method": jsonrpc::CANCELLED, "params": {"requestId": "review-5"}})),
    );
    assert!(other.is_empty(), "another review's cancel touched this one");
    let out = a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "method": jsonrpc::CANCELLED, "params": {"requestId": "review-4"}})),
    );
    let told = to_client(&out);
    assert_eq!(told.len(), 1);
    assert_eq!(told[0]["method"], "$/cancel_request");
    assert_eq!(told[0]["params"]["requestId"], permission);
    let late = a.on_client_line(&line(json!({"jsonrpc": "2.0", "id": permission, "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}})));
    assert!(late.is_empty(), "{late:?}");
}

#[test]
fn an_answered_permission_is_the_diffs_verdict() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("follow")]));
    let permission = reviewed(&mut a, "review-1");
    let out = a.on_client_line(&line(json!({"jsonrpc": "2.0", "id": permission, "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}})));
    let frames = to_broker(&out, "k");
    assert_eq!(frames[0]["id"], "review-1");
    assert_eq!(frames[0]["result"]["content"][0]["text"], "FILE_SAVED");
    assert_eq!(frames[0]["result"]["content"][1]["text"], "new\n");
    let permission = reviewed(&mut a, "review-2");
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": permission, "result": {"outcome": {"outcome": "cancelled"}}}),
    ));
    assert_eq!(
        to_broker(&out, "k")[0]["result"]["content"][0]["text"],
        "DIFF_REJECTED"
    );
    let permission = reviewed(&mut a, "review-3");
    let out = a.on_client_line(&line(json!({"jsonrpc": "2.0", "id": permission, "result": {"outcome": {"outcome": "selected", "optionId": "reject"}}})));
    assert_eq!(
        to_broker(&out, "k")[0]["result"]["content"][0]["text"],
        "DIFF_REJECTED",
        "Reject is no Allow"
    );
}

/// A watching turn ends at once on cancel: nothing was sent to pi, so nothing is stopped.
#[test]
fn a_watching_turn_ends_on_cancel_without_stopping_pi() {
    let mut a = followed();
    let out = prompt(&mut a, 3, json!([text(" Follow ")]));
    assert_eq!(sent_text(&out), None, "the follow word went to pi");
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "k"}}),
    ));
    assert!(to_broker(&out, "k")
        .iter()
        .all(|f| f["method"] != follow::CANCEL));
    assert_eq!(to_client(&out)[0]["result"]["stopReason"], "cancelled");
}

/// F5: CodeCompanion re-sends unfinished messages with the next one; the door sends pi only
/// what is new, and a `follow` word never rides along.
#[test]
fn resent_blocks_and_follow_words_are_not_sent_again() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("follow")]));
    a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "k"}}),
    ));
    let out = prompt(&mut a, 4, json!([text("follow"), text("run sleep 30")]));
    assert_eq!(sent_text(&out).as_deref(), Some("run sleep 30"));
    a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "k"}}),
    ));
    let out = prompt(
        &mut a,
        5,
        json!([
            text("follow"),
            text("run sleep 30"),
            text("create the file")
        ]),
    );
    assert_eq!(sent_text(&out).as_deref(), Some("create the file"));
    // The last part always goes, even a repeat: the user asked again on purpose.
    let out = prompt(&mut a, 6, json!([text("create the file")]));
    assert_eq!(sent_text(&out).as_deref(), Some("create the file"));
    // A mention between text blocks (Zed) is one prompt.
    let out = prompt(
        &mut a,
        7,
        json!([text("look at"), {"type": "resource_link", "uri": "file:///p/a.rs", "name": "a.rs"}, text("please")]),
    );
    assert_eq!(sent_text(&out).as_deref(), Some("look at @/p/a.rs please"));
}

/// An image is not carried: a prompt of only an image says so (not "empty prompt"); with
/// text, the text goes and the thread is told what was left out.
#[test]
fn an_image_is_refused_by_name_and_text_beside_it_still_goes() {
    let mut a = followed();
    let image = json!({"type": "image", "data": "AAAA", "mimeType": "image/png"});
    let out = prompt(&mut a, 3, json!([image]));
    let err = &to_client(&out)[0]["error"];
    assert_eq!(err["code"], jsonrpc::INVALID_PARAMS);
    assert!(
        err["message"].as_str().is_some_and(|m| m.contains("image")),
        "{err}"
    );
    let out = prompt(&mut a, 4, json!([text("what is this"), image]));
    assert_eq!(sent_text(&out).as_deref(), Some("what is this"));
    let note = to_client(&out)
        .into_iter()
        .find(|m| m["method"] == "session/update")
        .expect("a note in the thread");
    assert!(note["params"]["update"]["content"]["text"]
        .as_str()
        .is_some_and(|t| t.contains("image")));
    let out = prompt(&mut a, 5, json!([text("  ")]));
    assert!(to_client(&out)[0]["error"]["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("empty prompt")));
}

/// A broker restart ends an open prompt turn (its answer went with the old broker) but keeps
/// a watching turn.
#[test]
fn a_relink_ends_a_prompt_turn_and_keeps_a_watching_one() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("hello")]));
    let out = a.relinked("k");
    let ends: Vec<Value> = to_client(&out)
        .into_iter()
        .filter(|m| m["id"] == 3)
        .collect();
    assert_eq!(ends[0]["result"]["stopReason"], "end_turn");
    prompt(&mut a, 4, json!([text("follow")]));
    assert!(to_client(&a.relinked("k")).is_empty());
}

/// A buffer read goes to the client as `fs/read_text_file` and its answer back under the
/// broker's id.
#[test]
fn a_buffer_read_is_asked_of_the_client_and_answered_to_the_broker() {
    let mut a = followed();
    assert!(a.reads_buffers());
    let out = a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "id": "read-3", "method": follow::READ_BUFFER, "params": {"path": "/p/a.txt"}})),
    );
    let ask = &to_client(&out)[0];
    assert_eq!(ask["method"], "fs/read_text_file");
    assert_eq!(ask["params"], json!({"sessionId": "k", "path": "/p/a.txt"}));
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"content": "unsaved"}}),
    ));
    let back = &to_broker(&out, "k")[0];
    assert_eq!(back["id"], "read-3");
    assert_eq!(back["result"]["content"], "unsaved");
}

/// pi mirrors a follower's prompt to every follower; the thread that sent it drops the echo
/// (once, while its turn is open), and shows a later identical prompt typed in pi's terminal.
#[test]
fn the_echo_of_the_threads_own_prompt_is_dropped_once() {
    let mut a = followed();
    let out = prompt(&mut a, 3, json!([text("hello")]));
    let asked = to_broker(&out, "k")
        .into_iter()
        .find(|f| f["method"] == follow::PROMPT)
        .expect("pi/prompt");
    let echo = line(
        json!({"jsonrpc": "2.0", "method": follow::UPDATE, "params": {"update": {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "hello"}}}}),
    );
    assert!(
        a.on_broker_frame("k", &echo).is_empty(),
        "the echo was shown"
    );
    a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"stopReason": "end_turn"}})),
    );
    let again = to_client(&a.on_broker_frame("k", &echo));
    assert_eq!(again[0]["params"]["update"]["content"]["text"], "hello");
}

/// ACP v1's `session/close` ends the follow (an open turn ends, a pending permission is
/// rejected and withdrawn) and is answered; an unknown session is not found.
#[test]
fn close_ends_the_follow_and_withdraws_what_waits() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("follow")]));
    reviewed(&mut a, "review-1");
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 9, "method": "session/close", "params": {"sessionId": "k"}}),
    ));
    assert_eq!(
        to_broker(&out, "k")[0]["result"]["content"][0]["text"],
        "DIFF_REJECTED"
    );
    assert!(out.contains(&Out::Disconnect("k".into())));
    let told = to_client(&out);
    assert!(told.iter().any(|m| m["id"] == 3), "the open turn ended");
    assert_eq!(told.last().map(|m| &m["result"]), Some(&json!({})));
    let again = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 10, "method": "session/close", "params": {"sessionId": "k"}}),
    ));
    assert_eq!(to_client(&again)[0]["error"]["code"], RESOURCE_NOT_FOUND);
}

/// `session_info_update`: the title (the folder) once followed, the last activity at each turn's
/// end; the capabilities say resume and close.
#[test]
fn the_session_info_names_the_folder_and_the_last_activity() {
    let mut a = Agent::default();
    let init = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}),
    ));
    let caps = &to_client(&init)[0]["result"]["agentCapabilities"]["sessionCapabilities"];
    assert_eq!(caps, &json!({"list": {}, "resume": {}, "close": {}}));
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 2, "method": "session/resume", "params": {"sessionId": "k", "cwd": "/p", "mcpServers": []}}),
    ));
    assert!(matches!(&out[..], [Out::Connect { load: false, .. }]));
    let out = a.connected("k", json!(2), false, Ok(()));
    let info = &to_client(&out)[1]["params"]["update"];
    assert_eq!(info["sessionUpdate"], "session_info_update");
    assert_eq!(info["title"], "pi in /p");
    let at = info["updatedAt"].as_str().unwrap_or_default();
    assert!(at.len() == 20 && at.ends_with('Z'), "{at}");
}

/// A broker restart takes the permissions it asked with it: they are withdrawn from the
/// client, and a late answer goes to no broker.
#[test]
fn a_relink_withdraws_the_old_brokers_permissions() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("follow")]));
    let permission = reviewed(&mut a, "review-1");
    let out = a.relinked("k");
    let told = to_client(&out);
    assert_eq!(told[0]["method"], "$/cancel_request", "{told:?}");
    assert_eq!(told[0]["params"]["requestId"], permission);
    let late = a.on_client_line(&line(json!({"jsonrpc": "2.0", "id": permission, "result": {"outcome": {"outcome": "selected", "optionId": "reject"}}})));
    assert!(late.is_empty(), "{late:?}");
}

/// The I/O loop reads the follow notifications as JSON-RPC, not as substrings: a transcript
/// update quoting `follow/ended` ends nothing, a prompt quoting `follow/review` is no
/// readiness to replay.
#[test]
fn a_method_name_quoted_in_a_frame_is_not_that_notification() {
    use crate::cli::acp::is_notification;
    let quoted = json!({"jsonrpc": "2.0", "method": follow::UPDATE, "params": {"update": {"content": {"text": "follow/ended"}}}}).to_string();
    assert!(!is_notification(&quoted, follow::ENDED));
    let ended =
        json!({"jsonrpc": "2.0", "method": follow::ENDED, "params": {"reason": "x"}}).to_string();
    assert!(is_notification(&ended, follow::ENDED));
    let prompt = json!({"jsonrpc": "2.0", "id": "p-1", "method": follow::PROMPT, "params": {"text": "say follow/review"}}).to_string();
    assert!(!is_notification(&prompt, follow::READY));
}
