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

/// The client's answer to permission request `permission`: the option `option_id` chosen.
fn choose(a: &mut Agent, permission: &Value, option_id: &str) -> Vec<Out> {
    a.on_client_line(&line(json!({"jsonrpc": "2.0", "id": permission, "result": {"outcome": {"outcome": "selected", "optionId": option_id}}})))
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

/// The requests the client is told to drop in `out` (`$/cancel_request`): their ids.
fn withdrawn(out: &[Out]) -> Vec<Value> {
    to_client(out)
        .into_iter()
        .filter(|m| m["method"] == "$/cancel_request")
        .map(|m| m["params"]["requestId"].clone())
        .collect()
}

/// `out` first tells the client to drop `permission`, whose late answer `option_id` then
/// reaches no broker.
fn withdrawn_first_and_for_good(a: &mut Agent, out: &[Out], permission: &Value, option_id: &str) {
    let told = to_client(out);
    assert_eq!(told[0]["method"], "$/cancel_request", "{told:?}");
    assert_eq!(told[0]["params"]["requestId"], *permission);
    let late = choose(a, permission, option_id);
    assert!(
        late.is_empty(),
        "a late answer reached the broker: {late:?}"
    );
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
    withdrawn_first_and_for_good(&mut a, &out, &permission, "allow");
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
    assert_eq!(to_client(&out).len(), 1);
    withdrawn_first_and_for_good(&mut a, &out, &permission, "allow");
}

#[test]
fn an_answered_permission_is_the_diffs_verdict() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("follow")]));
    let permission = reviewed(&mut a, "review-1");
    let out = choose(&mut a, &permission, "allow");
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
    let out = choose(&mut a, &permission, "reject");
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
    // A prompt the client cancelled, its answer lost with the old broker: still `cancelled`.
    prompt(&mut a, 5, json!([text("long job")]));
    cancel(&mut a);
    let out = a.relinked("k");
    let end = to_client(&out).into_iter().find(|m| m["id"] == 5);
    assert_eq!(
        end.map(|m| m["result"]["stopReason"].clone()),
        Some(json!("cancelled"))
    );
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
    withdrawn_first_and_for_good(&mut a, &out, &permission, "reject");
}

/// The I/O loop reads the follow notifications as JSON-RPC, not as substrings: a transcript
/// update quoting `follow/ended` ends nothing, a prompt quoting `follow/review` is no
/// readiness to replay.
#[test]
fn a_method_name_quoted_in_a_frame_is_not_that_notification() {
    use crate::frontdoor::acp::is_notification;
    let quoted = json!({"jsonrpc": "2.0", "method": follow::UPDATE, "params": {"update": {"content": {"text": "follow/ended"}}}}).to_string();
    assert!(!is_notification(&quoted, follow::ENDED));
    let ended =
        json!({"jsonrpc": "2.0", "method": follow::ENDED, "params": {"reason": "x"}}).to_string();
    assert!(is_notification(&ended, follow::ENDED));
    let prompt = json!({"jsonrpc": "2.0", "id": "p-1", "method": follow::PROMPT, "params": {"text": "say follow/review"}}).to_string();
    assert!(!is_notification(&prompt, follow::READY));
}

fn cancel(a: &mut Agent) -> Vec<Out> {
    a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "k"}}),
    ))
}

fn close(a: &mut Agent, id: u64) -> Vec<Out> {
    a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": id, "method": "session/close", "params": {"sessionId": "k"}}),
    ))
}

/// The `pi/prompt` frame sent to the broker in `out`.
fn asked_pi(out: &[Out]) -> Value {
    to_broker(out, "k")
        .into_iter()
        .find(|f| f["method"] == follow::PROMPT)
        .expect("a pi/prompt")
}

fn link(path: &str) -> Value {
    json!({"type": "resource_link", "uri": format!("file://{path}"), "name": path})
}

/// Issue 63 fault 1: a cancel in a watching turn (`follow`) with a permission pending (pi's
/// terminal turn asked to write) answers the diff rejected and withdraws the permission, as a
/// prompt turn's cancel does: pi's write never waits for a permission nobody will answer.
#[test]
fn a_cancel_in_a_watching_turn_withdraws_its_permissions() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("follow")]));
    let permission = reviewed(&mut a, "review-7");
    let out = cancel(&mut a);
    let frames = to_broker(&out, "k");
    let verdict = frames
        .iter()
        .find(|f| f["id"] == "review-7")
        .unwrap_or_else(|| panic!("the diff was not answered: {frames:?}"));
    assert_eq!(verdict["result"]["content"][0]["text"], "DIFF_REJECTED");
    assert!(
        frames.iter().all(|f| f["method"] != follow::CANCEL),
        "a watching turn stops nothing in pi: {frames:?}"
    );
    assert!(withdrawn(&out).contains(&permission), "{out:?}");
    let told = to_client(&out);
    assert!(told
        .iter()
        .any(|m| m["id"] == 3 && m["result"]["stopReason"] == "cancelled"));
    // Outside any turn, a cancel still takes back a permission that came late.
    let late = reviewed(&mut a, "review-8");
    let out = cancel(&mut a);
    assert_eq!(to_broker(&out, "k")[0]["id"], "review-8");
    assert_eq!(to_client(&out)[0]["params"]["requestId"], late);
}

/// A cancelled watching turn is answered once: neither the next prompt nor another cancel
/// answers its id again.
#[test]
fn a_cancelled_watching_turn_is_answered_once() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("follow")]));
    let out = cancel(&mut a);
    assert_eq!(to_client(&out).iter().filter(|m| m["id"] == 3).count(), 1);
    assert!(to_client(&cancel(&mut a)).is_empty(), "cancelled twice");
    let out = prompt(&mut a, 4, json!([text("hello")]));
    let again: Vec<Value> = to_client(&out)
        .into_iter()
        .filter(|m| m["id"] == 3)
        .collect();
    assert!(
        again.is_empty(),
        "the old turn was answered again: {again:?}"
    );
}

/// Issue 63 fault 2: the re-send filter drops only a cancelled prompt sent again whole, ahead
/// of a message of its own (CodeCompanion); text and mentions meant again go to pi.
#[test]
fn the_resend_filter_drops_only_a_cancelled_prompt_sent_again() {
    let mut a = followed();
    let answer = |a: &mut Agent, out: &[Out]| {
        let asked = asked_pi(out);
        a.on_broker_frame(
            "k",
            &line(
                json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"stopReason": "end_turn"}}),
            ),
        );
    };
    // Zed: the same words with another file; then the file first, mentioned before.
    let out = prompt(&mut a, 3, json!([text("explain "), link("/p/a.rs")]));
    assert_eq!(sent_text(&out).as_deref(), Some("explain  @/p/a.rs"));
    answer(&mut a, &out);
    let out = prompt(&mut a, 4, json!([text("explain "), link("/p/b.rs")]));
    assert_eq!(sent_text(&out).as_deref(), Some("explain  @/p/b.rs"));
    answer(&mut a, &out);
    let out = prompt(&mut a, 5, json!([link("/p/a.rs"), text("now fix it")]));
    assert_eq!(sent_text(&out).as_deref(), Some("@/p/a.rs now fix it"));
    answer(&mut a, &out);
    // A message answered is not re-sent: the same words again are meant again.
    let out = prompt(&mut a, 6, json!([text("now fix it"), text("and test it")]));
    assert_eq!(sent_text(&out).as_deref(), Some("now fix it and test it"));
    answer(&mut a, &out);
    // Zed after a cancel: the prompt asked again, longer, starts as the cancelled one did.
    prompt(&mut a, 7, json!([text("explain "), link("/p/a.rs")]));
    cancel(&mut a);
    let out = prompt(
        &mut a,
        8,
        json!([text("explain "), link("/p/a.rs"), text(" in detail")]),
    );
    assert_eq!(
        sent_text(&out).as_deref(),
        Some("explain  @/p/a.rs  in detail")
    );
    // CodeCompanion after a cancel: the cancelled message, whole, then the new one.
    cancel(&mut a);
    let out = prompt(
        &mut a,
        9,
        json!([
            text("explain "),
            link("/p/a.rs"),
            text(" in detail"),
            text("shorter")
        ]),
    );
    assert_eq!(sent_text(&out).as_deref(), Some("shorter"));
    answer(&mut a, &out);
    // Only the last cancelled prompt, and only until the next one: not a part of it.
    prompt(&mut a, 10, json!([text("one"), text("two")]));
    cancel(&mut a);
    let out = prompt(&mut a, 11, json!([text("one"), text("three")]));
    assert_eq!(sent_text(&out).as_deref(), Some("one three"));
}

/// Issue 63 fault 3: `session/close` during a running prompt cancels it as `session/cancel`
/// does (pi is told to stop that prompt), answers it `cancelled` (pi's answer will not reach a
/// closed connection) and says nothing false about pi.
#[test]
fn close_during_a_prompt_cancels_it_as_session_cancel_would() {
    let mut a = followed();
    let out = prompt(&mut a, 3, json!([text("run sleep 20")]));
    let asked = asked_pi(&out);
    let out = close(&mut a, 9);
    let frames = to_broker(&out, "k");
    let stop = frames
        .iter()
        .find(|f| f["method"] == follow::CANCEL)
        .unwrap_or_else(|| panic!("pi was not told to stop: {frames:?}"));
    assert_eq!(stop["params"]["prompt"], asked["id"], "it names the prompt");
    let stop_at = out
        .iter()
        .position(|o| matches!(o, Out::Broker(_, f) if f.contains(follow::CANCEL)));
    let gone_at = out.iter().position(|o| *o == Out::Disconnect("k".into()));
    assert!(stop_at < gone_at && gone_at.is_some(), "{out:?}");
    let told = to_client(&out);
    let ends: Vec<&Value> = told.iter().filter(|m| m["id"] == 3).collect();
    assert_eq!(ends.len(), 1, "{told:?}");
    assert_eq!(ends[0]["result"]["stopReason"], "cancelled");
    assert!(
        !format!("{told:?}").contains("gone"),
        "a false word about pi: {told:?}"
    );
    assert_eq!(told.last().map(|m| &m["result"]), Some(&json!({})));
}

/// Issue 63 fault 6: `session/close` with no turn open drops the follow connection too.
#[test]
fn close_without_a_turn_drops_the_follow_connection() {
    let mut a = followed();
    let out = close(&mut a, 9);
    assert!(out.contains(&Out::Disconnect("k".into())), "{out:?}");
    assert_eq!(
        to_client(&out),
        vec![json!({"jsonrpc": "2.0", "id": 9, "result": {}})]
    );
}

/// Issue 63 fault 5: the client's `$/cancel_request` for its open prompt is that prompt's
/// `session/cancel`; one for another id cancels nothing.
#[test]
fn a_cancel_request_for_an_open_prompt_cancels_it() {
    let mut a = followed();
    let out = prompt(&mut a, 3, json!([text("long job")]));
    let asked = asked_pi(&out);
    let other = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 99}}),
    ));
    assert!(other.is_empty(), "{other:?}");
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 3}}),
    ));
    let stop = &to_broker(&out, "k")[0];
    assert_eq!(stop["method"], follow::CANCEL);
    assert_eq!(stop["params"]["prompt"], asked["id"]);
    // Asked again (its session/cancel too): pi was told once.
    let again = cancel(&mut a);
    assert!(to_broker(&again, "k").is_empty(), "{again:?}");
    let out = a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"stopReason": "end_turn"}})),
    );
    assert_eq!(to_client(&out)[0]["result"]["stopReason"], "cancelled");
    // A watching turn's id ends it at once.
    prompt(&mut a, 4, json!([text("follow")]));
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 4}}),
    ));
    assert_eq!(to_client(&out)[0]["result"]["stopReason"], "cancelled");
}

/// Issue 63 fault 5: `session/list {cwd}` lists the sessions of that folder, not those below
/// it, each with its `updatedAt`; a cursor (none is ever handed out) is an error.
#[test]
fn session_list_filters_by_the_exact_cwd_and_dates_each_session() {
    let mut a = followed();
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 5, "method": "session/list", "params": {"cwd": "/p"}}),
    ));
    let Some(Out::List { purpose, cwd }) = out.into_iter().next() else {
        panic!("session/list lists");
    };
    assert_eq!(cwd, "/p");
    let session = |key: &str, cwd: &str, since: u64| crate::protocol::follow::PiSession {
        session: Some(key.into()),
        cwd: cwd.into(),
        since,
        editor: None,
        followers: 0,
    };
    let out = a.listed(
        purpose,
        Ok(vec![
            session("sub", "/p/sub", 1_000),
            session("here", "/p/", 2_000_000_000),
        ]),
    );
    let list = &to_client(&out)[0]["result"]["sessions"];
    assert_eq!(
        list,
        &json!([{"sessionId": "here", "cwd": "/p/", "title": "pi in /p/", "updatedAt": "2033-05-18T03:33:20Z"}])
    );
    // Without a cwd: every session.
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 6, "method": "session/list", "params": {}}),
    ));
    let Some(Out::List { purpose, .. }) = out.into_iter().next() else {
        panic!("session/list lists");
    };
    let out = a.listed(purpose, Ok(vec![session("sub", "/p/sub", 1_000)]));
    assert_eq!(
        to_client(&out)[0]["result"]["sessions"][0]["updatedAt"],
        "1970-01-01T00:16:40Z"
    );
    // A session this door relays is as recent as its last update.
    a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "method": follow::UPDATE, "params": {"update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}}})),
    );
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 8, "method": "session/list", "params": {}}),
    ));
    let Some(Out::List { purpose, .. }) = out.into_iter().next() else {
        panic!("session/list lists");
    };
    let out = a.listed(purpose, Ok(vec![session("k", "/p", 1_000)]));
    let at = to_client(&out)[0]["result"]["sessions"][0]["updatedAt"].clone();
    assert!(at.as_str().is_some_and(|t| t > "2025"), "{at}");
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 7, "method": "session/list", "params": {"cursor": "bogus"}}),
    ));
    assert_eq!(to_client(&out)[0]["error"]["code"], jsonrpc::INVALID_PARAMS);
}

/// Issue 63 fault 5: `session/resume` (or load) of a session the broker does not know is
/// ACP's "resource not found", not an internal error quoting HTTP.
#[test]
fn resuming_an_unknown_session_is_resource_not_found() {
    use crate::frontdoor::client::ClientError;
    let mut a = Agent::default();
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 2, "method": "session/resume", "params": {"sessionId": "nobody", "cwd": "/p"}}),
    ));
    assert!(matches!(&out[..], [Out::Connect { .. }]));
    let why = crate::frontdoor::acp::unfollowed(ClientError::Refused(
        "HTTP 404 Not Found: no pi session \"nobody\" runs".into(),
    ));
    assert_eq!(
        why,
        Unfollowed::NotFound("no pi session \"nobody\" runs".into())
    );
    let err = &to_client(&a.connected("nobody", json!(2), false, Err(why)))[0]["error"];
    assert_eq!(err["code"], RESOURCE_NOT_FOUND, "{err}");
    let refused =
        crate::frontdoor::acp::unfollowed(ClientError::Refused("HTTP 403 Forbidden: no".into()));
    assert_eq!(refused, Unfollowed::Failed("HTTP 403 Forbidden: no".into()));
    let err = &to_client(&a.connected("x", json!(3), false, Err(refused)))[0]["error"];
    assert_eq!(err["code"], INTERNAL_ERROR);
}

/// pi's error on `pi/prompt` (no model, say) is the prompt's error, not a turn that ended.
#[test]
fn pis_error_on_a_prompt_is_the_prompts_error() {
    let mut a = followed();
    let out = prompt(&mut a, 3, json!([text("hello")]));
    let asked = asked_pi(&out);
    let out = a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "id": asked["id"], "error": {"code": -32603, "message": "no model selected"}})),
    );
    let told = to_client(&out);
    let answer = told.iter().find(|m| m["id"] == 3).expect("an answer");
    assert_eq!(answer["error"]["code"], INTERNAL_ERROR, "{answer}");
    assert_eq!(answer["error"]["message"], "no model selected");
    assert!(answer.get("result").is_none());
}

/// The echo of the thread's own prompt is dropped once: the same words typed in pi's
/// terminal during the turn show.
#[test]
fn the_same_words_typed_in_pis_terminal_during_the_turn_show() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("hello")]));
    let said = |t: &str| {
        line(
            json!({"jsonrpc": "2.0", "method": follow::UPDATE, "params": {"update": {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": t}}}}),
        )
    };
    let agent = line(
        json!({"jsonrpc": "2.0", "method": follow::UPDATE, "params": {"update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}}}),
    );
    assert_eq!(to_client(&a.on_broker_frame("k", &agent)).len(), 1);
    assert_eq!(to_client(&a.on_broker_frame("k", &said("other"))).len(), 1);
    assert!(
        a.on_broker_frame("k", &said("hello")).is_empty(),
        "the echo"
    );
    let typed = to_client(&a.on_broker_frame("k", &said("hello")));
    assert_eq!(
        typed[0]["params"]["update"]["content"]["text"], "hello",
        "the terminal's own words were dropped"
    );
}

/// The setup requests a client may send: `authenticate` is answered (there is nothing to log
/// into), `session/new` needs an absolute folder, and the error codes are ACP's own.
#[test]
fn setup_requests_and_error_codes_are_acps() {
    let mut a = Agent::default();
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 1, "method": "authenticate", "params": {"methodId": "x"}}),
    ));
    assert_eq!(to_client(&out)[0]["result"], json!({}));
    for cwd in [json!("relative/dir"), json!(""), Value::Null] {
        let out = a.on_client_line(&line(
            json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": cwd}}),
        ));
        assert_eq!(
            to_client(&out)[0]["error"]["code"],
            jsonrpc::INVALID_PARAMS,
            "{cwd}"
        );
    }
    // -32000 is ACP's "authentication required": never used for these.
    assert_eq!((INTERNAL_ERROR, RESOURCE_NOT_FOUND), (-32603, -32002));
}

/// Two permissions pending at once are two requests to the client, each answered and each
/// withdrawn on its own.
#[test]
fn two_pending_permissions_are_asked_and_withdrawn_apart() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("follow")]));
    let first = reviewed(&mut a, "review-1");
    let second = reviewed(&mut a, "review-2");
    assert_ne!(first, second);
    let out = choose(&mut a, &first, "allow");
    assert_eq!(to_broker(&out, "k")[0]["id"], "review-1");
    let out = cancel(&mut a);
    let verdicts: Vec<Value> = to_broker(&out, "k")
        .into_iter()
        .filter(|f| f.get("result").is_some())
        .map(|f| f["id"].clone())
        .collect();
    assert_eq!(verdicts, vec![json!("review-2")]);
    assert_eq!(withdrawn(&out), vec![second]);
}

/// The broker ends the follow (`follow/ended`): an open turn is answered, saying the pi
/// session is gone and why; its permission is withdrawn; the session is no longer followed.
#[test]
fn the_pi_session_ending_ends_the_turn_saying_so() {
    let mut a = followed();
    prompt(&mut a, 3, json!([text("follow")]));
    let permission = reviewed(&mut a, "review-1");
    let out = a.on_broker_frame(
        "k",
        &line(
            json!({"jsonrpc": "2.0", "method": follow::ENDED, "params": {"reason": "pi exited"}}),
        ),
    );
    assert!(withdrawn(&out).contains(&permission), "{out:?}");
    let told = to_client(&out);
    assert!(told.iter().any(|m| m["params"]["update"]["content"]["text"]
        .as_str()
        .is_some_and(|t| t.contains("gone: pi exited"))));
    let end = told.iter().find(|m| m["id"] == 3).expect("the turn ended");
    assert_eq!(end["result"]["stopReason"], "end_turn");
    let out = prompt(&mut a, 4, json!([text("hello")]));
    assert_eq!(to_client(&out)[0]["error"]["code"], jsonrpc::INVALID_PARAMS);
}

/// What the broker asks that the door does not offer is refused, never taken for a buffer
/// read; a client without `fs.readTextFile` reads no buffers; a client's error to a buffer
/// read reaches the broker as it said it.
#[test]
fn broker_requests_and_buffer_reads_go_where_they_belong() {
    let mut a = followed();
    let out = a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "id": "x-1", "method": "pi/unknown", "params": {"path": "/p/a"}})),
    );
    assert!(to_client(&out).is_empty(), "{out:?}");
    assert_eq!(
        to_broker(&out, "k")[0]["error"]["code"],
        jsonrpc::METHOD_NOT_FOUND
    );
    let out = a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "id": "read-1", "method": follow::READ_BUFFER, "params": {"path": "/p/a.txt"}})),
    );
    let ask = &to_client(&out)[0];
    let out = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": ask["id"], "error": {"code": -32002, "message": "no buffer for /p/a.txt"}}),
    ));
    let back = &to_broker(&out, "k")[0];
    assert_eq!(back["id"], "read-1");
    assert_eq!(back["error"]["message"], "no buffer for /p/a.txt");
    let mut plain = Agent::default();
    plain.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": false}}}}),
    ));
    assert!(!plain.reads_buffers());
}

/// A prompt the client cancelled is answered `cancelled`, even when pi answers its
/// `pi/prompt` with an error (pi stopped it before it ran).
#[test]
fn a_cancelled_prompt_is_cancelled_whatever_pi_answers() {
    let mut a = followed();
    let out = prompt(&mut a, 3, json!([text("hello")]));
    let asked = asked_pi(&out);
    cancel(&mut a);
    let out = a.on_broker_frame(
        "k",
        &line(json!({"jsonrpc": "2.0", "id": asked["id"], "error": {"code": -32603, "message": "aborted"}})),
    );
    let told = to_client(&out);
    let end = told.iter().find(|m| m["id"] == 3).expect("answered");
    assert_eq!(end["result"]["stopReason"], "cancelled", "{end}");
}

/// A buffer read the client has not answered goes with the follow: a close withdraws it
/// (`$/cancel_request`); after a broker restart its late answer goes to no broker.
#[test]
fn a_pending_buffer_read_goes_with_the_follow() {
    let read = |a: &mut Agent| {
        let out = a.on_broker_frame(
            "k",
            &line(json!({"jsonrpc": "2.0", "id": "read-1", "method": follow::READ_BUFFER, "params": {"path": "/p/a.txt"}})),
        );
        to_client(&out)[0]["id"].clone()
    };
    let mut a = followed();
    let asked = read(&mut a);
    let out = a.relinked("k");
    assert!(to_client(&out).is_empty(), "{out:?}");
    let late = a.on_client_line(&line(
        json!({"jsonrpc": "2.0", "id": asked, "result": {"content": "x"}}),
    ));
    assert!(
        late.is_empty(),
        "a read of the old broker reached the new: {late:?}"
    );
    let asked = read(&mut a);
    let out = close(&mut a, 9);
    assert_eq!(withdrawn(&out), vec![asked]);
}
