//! Issue 61 item 6: long messages in flight share one budget across connections
//! (`max_frames_in_flight_bytes`, `wire::budget`). Several sessions each sending a frame just
//! under `max_frame_bytes` at once: those past the budget get a JSON-RPC error (busy, with
//! their id) instead of the daemon's memory, and every session goes on.

use crate::common::gemini::{one_discovery, raw_status};
use crate::common::*;
use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

/// `max_frame_bytes` here.
const FRAME: usize = 1 << 20;
/// The budget: two such frames.
const BUDGET: usize = 2 << 20;
/// Sessions sending one at once.
const SESSIONS: usize = 4;
/// What each sends of its frame before the others have sent theirs: the header and this
/// much of the payload.
const FIRST: usize = 4096;

/// A `ping` of about `len` bytes (its params padded) with its id last, as the MCP SDKs
/// write a request, masked into one text frame as a client sends it.
fn long_ping(id: &str, len: usize) -> Vec<u8> {
    let text = format!(
        r#"{{"method":"ping","params":{{"pad":"{}"}},"jsonrpc":"2.0","id":"{id}"}}"#,
        "x".repeat(len)
    );
    let key = [0x3c, 0xa5, 0x11, 0x7e];
    let mut f = vec![0x81u8, 0x80 | 127];
    f.extend_from_slice(&(text.len() as u64).to_be_bytes());
    f.extend_from_slice(&key);
    f.extend(text.bytes().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

#[tokio::test]
async fn long_frames_past_the_budget_are_refused_and_every_session_goes_on() {
    let b = TestBroker::start_with(|c| {
        c.max_frame_bytes = FRAME;
        c.max_frames_in_flight_bytes = Some(BUDGET);
    })
    .await;
    let (_fe, _) = b.editor(&["/w"]).await;
    let frames = b.handle.registry().frames.clone();
    let mut refusals = frames.refusals();
    let mut agents = Vec::new();
    for _ in 0..SESSIONS {
        let mut a = Agent::open(&b.socket, "/w", None).await;
        a.attached().await;
        agents.push(a);
    }
    let pings: Vec<Vec<u8>> = (0..SESSIONS)
        .map(|i| long_ping(&format!("long-{i}"), FRAME - 200))
        .collect();
    // Every session starts its frame: each reader claims its frame from the header, before
    // the payload is read, so two fit and the rest are refused as their headers come.
    for (a, f) in agents.iter_mut().zip(&pings) {
        a.raw_mut().get_mut().write_all(&f[..FIRST]).await.unwrap();
    }
    within(
        "the frames past the budget refused",
        refusals.wait_for(|n| *n >= (SESSIONS - 2) as u64),
    )
    .await
    .unwrap();
    assert_eq!(
        *refusals.borrow(),
        (SESSIONS - 2) as u64,
        "exactly the frames the budget had no room for"
    );
    let held = frames.held();
    assert!(
        (2 * (FRAME - 300)..=BUDGET).contains(&held),
        "two frames claimed: {held}"
    );

    // The Gemini door's bodies draw on the same budget: one announced now is refused before
    // it is read (busy, and the connection closed: its body was not read past).
    let d = one_discovery(&b.dir.path().join("gemini"), "/w").await;
    let gemini_post = |len: usize| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {len}\r\n\r\n",
            d.port, d.token
        )
    };
    assert_eq!(raw_status(d.port, &gemini_post(64 * 1024)).await, 503);
    let refused = *refusals.borrow_and_update();
    assert_eq!(
        refused,
        (SESSIONS - 2 + 1) as u64,
        "counted with the frames"
    );

    // The frames go on to their end: the refused ones are read past and answered with the
    // busy error and their id (it came last), the others are read whole and answered.
    for (a, f) in agents.iter_mut().zip(&pings) {
        a.raw_mut().get_mut().write_all(&f[FIRST..]).await.unwrap();
    }
    let mut busy = 0;
    for (i, a) in agents.iter_mut().enumerate() {
        let id = format!("long-{i}");
        let v = a.until("the long ping's answer", |v| v["id"] == id).await;
        if v.get("result").is_some() {
            continue;
        }
        assert_eq!(v["error"]["code"], -32003, "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("max_frames_in_flight_bytes"), "{v}");
        busy += 1;
    }
    assert_eq!(busy, SESSIONS - 2, "those past the budget, and only they");

    // Every session is still usable, and so is the daemon.
    for a in &mut agents {
        let r = a.call("echo", json!({"after": true})).await;
        assert!(r.get("result").is_some(), "{r}");
    }
    assert!(b.status().await["sessions"].is_array());
    // Each reader gave its claim back before it read the call after its long frame.
    assert_eq!(frames.held(), 0, "the budget is whole again");

    // With the budget whole again, long frames are read on the same connections.
    for (i, a) in agents.iter_mut().take(2).enumerate() {
        let id = format!("again-{i}");
        a.raw_mut()
            .get_mut()
            .write_all(&long_ping(&id, FRAME - 200))
            .await
            .unwrap();
        let v = a
            .until("the second long ping's answer", |v| v["id"] == id)
            .await;
        assert!(v.get("result").is_some(), "{v}");
    }
    assert_eq!(*refusals.borrow(), refused, "none refused since");
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    let padded = format!("{init}{}", " ".repeat(64 * 1024));
    let request = format!("{}{padded}", gemini_post(padded.len()));
    assert_eq!(
        raw_status(d.port, &request).await,
        200,
        "the Gemini door's long body is read once the budget has room"
    );
    assert_eq!(frames.held(), 0);
    let _: Value = b.status().await;
    b.stop().await;
}

/// Starts `f` on `a`: its first [`FIRST`] bytes.
async fn start(a: &mut Agent, f: &[u8]) {
    a.raw_mut().get_mut().write_all(&f[..FIRST]).await.unwrap();
}

/// Sends the rest of `f` on `a` and returns the answer to it: true for a result, false for
/// the busy error.
async fn finish(a: &mut Agent, f: &[u8], id: &str) -> bool {
    a.raw_mut().get_mut().write_all(&f[FIRST..]).await.unwrap();
    let v = a.until("the long ping's answer", |v| v["id"] == id).await;
    if v.get("result").is_some() {
        return true;
    }
    assert_eq!(v["error"]["code"], -32003, "{v}");
    false
}

#[tokio::test]
async fn an_agent_realm_holds_a_quarter_agents_half_and_the_owner_keeps_the_rest() {
    use pi_ide_broker::protocol::pathmap::RemoteConfig;
    let dir = tempfile::tempdir().unwrap();
    let host = std::fs::canonicalize(dir.path()).unwrap().join("app");
    std::fs::create_dir_all(&host).unwrap();
    let host_s = host.display().to_string();
    let h = host_s.clone();
    // Four of the frames: one realm may hold one, agents together two.
    let b = TestBroker::start_in(dir, move |c| {
        c.max_frame_bytes = FRAME;
        c.max_frames_in_flight_bytes = Some(4 * FRAME);
        c.remote = ["box1", "box2", "box3"]
            .map(|name| RemoteConfig {
                name: name.into(),
                agent: "/workspaces/app".into(),
                host: h.clone().into(),
            })
            .to_vec();
    })
    .await;
    let (_fe, _) = b.editor(&[&host_s]).await;
    let mut refusals = b.handle.registry().frames.refusals();
    let remote = |name: &str| pi_ide_broker::sys::config::Config::remote_socket(&b.socket, name);
    let mut agents = Vec::new();
    for (i, name) in ["box1", "box1", "box2", "box3"].iter().enumerate() {
        let query = format!("cwd=/workspaces/app&session=s{i}");
        let mut a = Agent::connect(&remote(name), &query).await.unwrap();
        a.attached().await;
        agents.push(a);
    }
    let mut owner = Vec::new();
    for _ in 0..2 {
        let mut a = Agent::open(&b.socket, &host_s, None).await;
        a.attached().await;
        owner.push(a);
    }
    let frames: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| {
            let id = format!("long-{i}");
            let f = long_ping(&id, FRAME - 200);
            (id, f)
        })
        .collect();
    // One realm: its second frame is refused though the budget is three quarters free.
    start(&mut agents[0], &frames[0].1).await;
    start(&mut agents[1], &frames[1].1).await;
    within(
        "one of box1's frames refused",
        refusals.wait_for(|n| *n >= 1),
    )
    .await
    .unwrap();
    // Two more realms: agents together hold half at most.
    start(&mut agents[2], &frames[2].1).await;
    start(&mut agents[3], &frames[3].1).await;
    within(
        "box2's or box3's frame refused",
        refusals.wait_for(|n| *n >= 2),
    )
    .await
    .unwrap();
    // The owner's half is there whatever the agents hold.
    start(&mut owner[0], &frames[4].1).await;
    start(&mut owner[1], &frames[5].1).await;
    for (a, (id, f)) in owner.iter_mut().zip(&frames[4..]) {
        assert!(finish(a, f, id).await, "the owner's frame is read");
    }
    let mut read = Vec::new();
    for (a, (id, f)) in agents.iter_mut().zip(&frames) {
        read.push(finish(a, f, id).await);
    }
    assert_eq!(
        read[..2].iter().filter(|r| **r).count(),
        1,
        "box1: {read:?}"
    );
    assert_eq!(
        read[2..].iter().filter(|r| **r).count(),
        1,
        "box2, box3: {read:?}"
    );
    assert_eq!(*refusals.borrow(), 2);
    for a in agents.iter_mut().chain(owner.iter_mut()) {
        let r = a.call("echo", json!({})).await;
        assert!(r.get("result").is_some(), "{r}");
    }
    assert_eq!(b.handle.registry().frames.held(), 0);
    b.stop().await;
}
