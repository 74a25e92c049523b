//! Issue: faults with real processes and real signals — editors killed and frozen, sessions
//! churning, lockfiles flapping, the broker itself killed under load.

use crate::common::process::*;
use crate::common::*;
use pi_ide_broker::testkit::pi_client::find_candidates;
use pi_ide_broker::testkit::text;
use pi_ide_broker::testkit::{eventually, within};
use rustix::process::Signal;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

async fn status(root: &Path) -> Value {
    within(
        "status",
        pi_ide_broker::frontdoor::client::get_json(&root.join("run/sock"), "/v1/status"),
    )
    .await
    .unwrap()
}

/// Linux only (the tests that use it are ignored elsewhere): a missing `/proc` fails the
/// test instead of reading as 0 and passing vacuously.
fn proc_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .expect("/proc/PID/fd")
}

fn proc_rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

fn diff_args(tab: &str) -> Value {
    pi_ide_broker::testkit::diff_args("/k/f", "x", tab)
}

#[tokio::test]
async fn an_editor_killed_with_three_pending_diffs_then_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon(&cfg).await;
    let (mut ed, port) = start_editor(&root.join("pi-ide"), &["--folder", "/k"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={port}")])
        .await;
    let mut sessions = Vec::new();
    for i in 0..3 {
        let mut a = Agent::open(&root.join("run/sock"), "/k", Some(&format!("s{i}"))).await;
        a.attached().await;
        a.call_tool(json!(i), "openDiff", diff_args(&format!("tab-{i}")))
            .await;
        sessions.push(a);
    }
    let st = eventually_status(root, |st| {
        st["sessions"].as_array().is_some_and(|s| {
            s.iter()
                .all(|s| s["in_flight"].as_array().is_some_and(|f| f.len() == 1))
        })
    })
    .await;
    assert_eq!(st["sessions"].as_array().unwrap().len(), 3);
    ed.signal(Signal::KILL);
    ed.wait_exit().await;
    for (i, a) in sessions.iter_mut().enumerate() {
        let ans = a.answer(&json!(i)).await;
        assert_eq!(text(&ans), "DIFF_REJECTED");
        assert_eq!(ans["result"]["content"][1]["text"], format!("tab-{i}"));
    }
    // The stale lockfile stays; the editor restarts on another port; sessions go on.
    let (_ed2, port2) = start_editor(&root.join("pi-ide"), &["--folder", "/k"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={port2}")])
        .await;
    for a in sessions.iter_mut() {
        let r = a.call("echo", json!({})).await;
        assert!(r.get("result").is_some(), "{r}");
    }
    daemon.signal(Signal::TERM);
    assert!(daemon.wait_exit().await.success());
}

async fn eventually_status(root: &Path, pred: impl Fn(&Value) -> bool) -> Value {
    within("status condition", async {
        loop {
            let st = status(root).await;
            if pred(&st) {
                return st;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

#[tokio::test]
async fn a_frozen_editor_turns_unhealthy_short_tools_fail_fast_and_it_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(
        root,
        "[health]\ninterval_ms = 200\ntimeout_ms = 300\n[timeouts]\nshort_tool_ms = 500\n",
    );
    let mut daemon = start_daemon(&cfg).await;
    let (ed, port) = start_editor(&root.join("pi-ide"), &["--folder", "/z"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={port}")])
        .await;
    let mut a = Agent::open(&root.join("run/sock"), "/z", None).await;
    a.attached().await;
    a.call_tool(json!("diff"), "openDiff", diff_args("frozen-tab"))
        .await;
    eventually_status(root, |st| {
        st["sessions"][0]["in_flight"]
            .as_array()
            .is_some_and(|f| !f.is_empty())
    })
    .await;
    ed.signal(Signal::STOP);
    let frozen_at = Instant::now();
    daemon.wait_line(&["editor unhealthy"]).await;
    let took = frozen_at.elapsed();
    assert!(
        // One interval and one timeout, five times over for a busy machine.
        took < Duration::from_millis(5 * (200 + 300)),
        "unhealthy after {took:?}"
    );
    let t = Instant::now();
    let r = a.call("getDiagnostics", json!({})).await;
    assert_eq!(
        r["error"]["code"],
        pi_ide_broker::protocol::jsonrpc::TIMEOUT,
        "{r}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "bounded: {:?}",
        t.elapsed()
    );
    ed.signal(Signal::CONT);
    daemon.wait_line(&["editor healthy again"]).await;
    let st = status(root).await;
    assert_eq!(editor_by_port(&st, port).unwrap()["state"], "ready");
    let flights = st["sessions"][0]["in_flight"].as_array().unwrap();
    assert_eq!(flights.len(), 1, "the diff is still pending");
    assert_eq!(flights[0]["tool"], "openDiff");
    daemon.signal(Signal::TERM);
    assert!(daemon.wait_exit().await.success());
}

#[tokio::test]
#[cfg_attr(not(target_os = "linux"), ignore = "reads /proc")]
async fn churning_sessions_leak_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon(&cfg).await;
    let pid = daemon.child.id().unwrap();
    let (_ed, port) = start_editor(&root.join("pi-ide"), &["--folder", "/c"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={port}")])
        .await;
    let sock = root.join("run/sock");
    // Warm up (allocator arenas, lazily created buffers), then measure.
    for _ in 0..20 {
        let mut a = Agent::open(&sock, "/c", None).await;
        a.request(json!(1), "ping", json!({})).await;
    }
    eventually_status(root, |st| {
        st["sessions"].as_array().is_some_and(|s| s.is_empty())
    })
    .await;
    let (fds0, rss0) = (proc_fds(pid), proc_rss_kb(pid));
    for round in 0..5 {
        let mut batch = Vec::new();
        for i in 0..100 {
            let mut a = Agent::open(&sock, "/c", None).await;
            a.attached().await;
            if i % 2 == 0 {
                a.call_tool(
                    json!(i),
                    "openDiff",
                    diff_args(&format!("churn-{round}-{i}")),
                )
                .await;
            } else {
                a.call("echo", json!({})).await;
            }
            batch.push(a);
        }
        drop(batch); // vanish mid-diff
    }
    let st = eventually_status(root, |st| {
        st["sessions"].as_array().is_some_and(|s| s.is_empty())
    })
    .await;
    assert!(editor_by_port(&st, port).is_some());
    // A session leaves the status a moment before its task has dropped its socket: wait
    // (bounded) for the fds to come back rather than reading them once.
    let settled = tokio::time::timeout(WAIT, async {
        while proc_fds(pid) > fds0 + 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let (fds1, rss1) = (proc_fds(pid), proc_rss_kb(pid));
    eprintln!("churn: fds {fds0} -> {fds1}, RSS {rss0} KiB -> {rss1} KiB");
    assert!(
        settled.is_ok() && fds1 <= fds0 + 2,
        "fds leaked: {fds0} -> {fds1}"
    );
    assert!(
        rss1 < rss0 + 16 * 1024,
        "memory grew by {} KiB over 500 sessions",
        rss1.saturating_sub(rss0)
    );
    daemon.signal(Signal::TERM);
    assert!(daemon.wait_exit().await.success());
}

#[tokio::test]
async fn lockfile_flapping_does_not_disturb_working_sessions() {
    let b = TestBroker::start_with(|c| c.editor_grace_ms = 50).await;
    let (_stable, _) = b.editor(&["/stable"]).await;
    let (flap, _) = b.start_editor(Options::pi(&["/flap"])).await;
    let lock = b.pi_dir.join(format!("{}.lock", flap.port));
    let body = std::fs::read(&lock).unwrap();
    let mut a = Agent::open(&b.socket, "/stable", None).await;
    a.attached().await;
    let worker = tokio::spawn(async move {
        for i in 0..300 {
            let r = a.call("echo", json!({"i": i})).await;
            assert!(
                r.get("result").is_some(),
                "call {i} failed during flapping: {r}"
            );
        }
    });
    for _ in 0..1000 {
        std::fs::remove_file(&lock).unwrap();
        pi_ide_broker::registry::state::write_atomic(&lock, &body).unwrap();
    }
    within("worker", worker).await.unwrap();
    b.wait_editor(flap.port, "ready").await;
    eventually("one link to the flapping editor", || {
        (flap.clients() == 1).then_some(())
    })
    .await;
    b.stop().await;
}

#[tokio::test]
async fn the_broker_killed_under_load_restarts_with_sticky_targets_and_compat_entries() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon(&cfg).await;
    let (_e1, p1) = start_editor(&root.join("pi-ide"), &["--folder", "/r", "--name", "One"]).await;
    let (_e2, p2) = start_editor(&root.join("pi-ide"), &["--folder", "/r", "--name", "Two"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={p1}")])
        .await;
    daemon
        .wait_line(&["editor ready", &format!("port={p2}")])
        .await;
    let st = status(root).await;
    let id2 = editor_by_port(&st, p2).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let sock = root.join("run/sock");
    let mut a = Agent::open(&sock, "/r", Some("pi-42")).await;
    a.request(json!(1), "broker/attach", json!({"editor": id2}))
        .await;
    let state_file = root.join("state/state.json");
    eventually("sticky saved", || {
        std::fs::read_to_string(&state_file)
            .ok()
            .filter(|t| t.contains("pi-42"))
            .map(|_| ())
    })
    .await;
    let old_compat: Vec<String> = eventually("both compat entries", || {
        let names: Vec<String> = std::fs::read_dir(root.join("compat"))
            .ok()?
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".lock"))
            .collect();
        (names.len() == 2).then_some(names)
    })
    .await;
    // Load: calls in flight while the broker dies.
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = answered.clone();
    let load = tokio::spawn(async move {
        for i in 0..10_000 {
            let req = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "echo", "arguments": {}}});
            let sent = futures_util::SinkExt::send(
                a.raw_mut(),
                tokio_tungstenite::tungstenite::Message::text(req.to_string()),
            )
            .await;
            if sent.is_err() || a.next().await.is_none() {
                return i;
            }
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        10_000
    });
    // The load is running (answers are coming) when the broker dies.
    pi_ide_broker::testkit::eventually("the first answers of the load", || {
        (answered.load(std::sync::atomic::Ordering::Relaxed) >= 10).then_some(())
    })
    .await;
    daemon.signal(Signal::KILL);
    daemon.wait_exit().await;
    let done = within("load ends with the broker", load).await.unwrap();
    assert!(
        (10..10_000).contains(&done),
        "calls were answered, then the connection dropped: {done}"
    );
    // The leftovers: a stale socket and two virtual lockfiles of a dead broker.
    let mut daemon = start_daemon(&cfg).await;
    daemon
        .wait_line(&["editor ready", &format!("port={p2}")])
        .await;
    daemon
        .wait_line(&["editor ready", &format!("port={p1}")])
        .await;
    eventually("compat entries reclaimed", || {
        let names: Vec<String> = std::fs::read_dir(root.join("compat"))
            .ok()?
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".lock"))
            .collect();
        (names.len() == 2 && names.iter().all(|n| !old_compat.contains(n))).then_some(())
    })
    .await;
    // A session that reconnects with its key lands where it was.
    let mut a = Agent::open(&sock, "/r", Some("pi-42")).await;
    let att = a.attached().await;
    assert_eq!(
        att["params"]["editor"],
        id2.as_str(),
        "state: {}\nlog:\n{}",
        std::fs::read_to_string(&state_file).unwrap_or_default(),
        daemon.seen.join("\n")
    );
    assert_eq!(find_candidates(&root.join("compat"), "/r").await.len(), 2);
    daemon.signal(Signal::TERM);
    assert!(daemon.wait_exit().await.success());
}

/// A frozen editor stops reading. The broker's writes fill the socket, the rest waits in the
/// link's queue, and nothing is lost or reordered: once the editor thaws it receives every call
/// in the order the session sent them, and every call is answered.
#[tokio::test]
async fn calls_to_a_frozen_editor_wait_in_order_and_all_arrive_when_it_thaws() {
    let b = TestBroker::start_with(|c| {
        c.timeouts.short_tool_ms = 120_000;
        c.health.drop_after_ms = 120_000;
    })
    .await;
    let (fe, _) = b.editor(&["/q"]).await;
    let mut a = Agent::open(&b.socket, "/q", None).await;
    a.attached().await;
    let mut ev = fe.events();
    fe.freeze(true);
    // 24 MiB, more than loopback's socket buffers hold between the broker and the editor.
    const CALLS: u64 = 24;
    let pad = "x".repeat(1 << 20);
    for i in 0..CALLS {
        a.call_tool(json!(i), "echo", json!({"i": i, "pad": pad}))
            .await;
    }
    fe.freeze(false);
    let mut received = Vec::new();
    while received.len() < CALLS as usize {
        let args = fake_editor::wait_for(
            &mut ev,
            "the next call",
            |e| matches!(e, fake_editor::Event::Call { tool: Some(t), .. } if t == "echo"),
        )
        .await;
        if let fake_editor::Event::Call { args, .. } = args {
            received.push(args["i"].as_u64().unwrap_or(u64::MAX));
        }
    }
    assert_eq!(received, (0..CALLS).collect::<Vec<_>>(), "order kept");
    let mut answered = Vec::new();
    while answered.len() < CALLS as usize {
        let r = a.until("an answer", |v| v.get("id").is_some()).await;
        assert!(
            r.get("result").is_some(),
            "call {} failed: {}",
            r["id"],
            r.get("error").unwrap_or(&Value::Null)
        );
        answered.push(r["id"].as_u64().unwrap_or(u64::MAX));
    }
    answered.sort_unstable();
    assert_eq!(
        answered,
        (0..CALLS).collect::<Vec<_>>(),
        "every call answered once"
    );
    b.stop().await;
}
