//! Editor identity with real editor processes: ids that hold across broker restarts whatever
//! the listing order, successors recognised however fast the restart, siblings never swapped.

use crate::common::process::{start_editor, Proc};
use crate::common::*;
use rustix::process::Signal;
use serde_json::{json, Value};
use std::path::Path;

/// The editor's status entry by port, once it is ready.
async fn ready(b: &TestBroker, port: u16) -> Value {
    b.wait_editor(port, "ready").await
}

fn id_of(e: &Value) -> String {
    e["id"].as_str().unwrap_or_default().to_string()
}

/// Rewrites every lockfile in `dir` (same content, new inode) in a shuffled order, so the
/// next listing of the dir comes in a different order.
fn reshuffle_lockfiles(dir: &Path, seed: u64) {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "lock"))
        .collect();
    files.sort();
    if seed % 2 == 1 {
        files.reverse();
    }
    let n = files.len().max(1);
    files.rotate_left((seed as usize / 2) % n);
    for f in files {
        let text = std::fs::read(&f).unwrap();
        let tmp = f.with_extension("lock.tmp.shuffle");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &f).unwrap();
    }
}

async fn attached(a: &mut Agent) -> String {
    a.attached().await["params"]["editor"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A broker whose grace period is far longer than any test: only the identity rules can move
/// a session.
async fn patient_broker() -> TestBroker {
    TestBroker::start_with(|c| c.editor_grace_ms = 120_000).await
}

async fn editor_proc(b: &TestBroker, folder: &str) -> (Proc, u16) {
    start_editor(&b.pi_dir, &["--folder", folder, "--name", "Neovim"]).await
}

#[tokio::test]
async fn two_editors_on_one_folder_keep_their_ids_across_twenty_broker_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let proj = dir.path().join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    let proj_s = proj.display().to_string();
    let mut b = TestBroker::start_in(dir, |_| {}).await;
    let (ea, pa) = editor_proc(&b, &proj_s).await;
    let (eb, pb) = editor_proc(&b, &proj_s).await;
    let (ida, idb) = (id_of(&ready(&b, pa).await), id_of(&ready(&b, pb).await));
    assert_ne!(ida, idb);
    // The second editor becomes the sticky target of session key "k".
    let mut a = Agent::open(&b.socket, &proj_s, Some("k")).await;
    let r = a
        .request(json!(1), "broker/attach", json!({"editor": idb}))
        .await;
    assert_eq!(r["result"]["editor"], idb.as_str(), "{r}");
    a.close().await;
    let seed0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    for round in 0..20u64 {
        let pi_dir = b.pi_dir.clone();
        let kept = b.stop_keep_dir().await;
        reshuffle_lockfiles(&pi_dir, seed0.wrapping_add(round * 7919));
        b = TestBroker::start_in(kept, |_| {}).await;
        let (ea2, eb2) = (ready(&b, pa).await, ready(&b, pb).await);
        assert_eq!(id_of(&ea2), ida, "round {round}: editor A changed id");
        assert_eq!(id_of(&eb2), idb, "round {round}: editor B changed id");
        assert_eq!(ea2["pid"], ea.child.id().unwrap_or(0));
        assert_eq!(eb2["pid"], eb.child.id().unwrap_or(0));
        let mut a = Agent::open(&b.socket, &proj_s, Some("k")).await;
        assert_eq!(attached(&mut a).await, idb, "round {round}: sticky moved");
        a.close().await;
    }
    drop((ea, eb));
    b.stop().await;
}

#[tokio::test]
async fn a_killed_editor_restarted_fast_or_slow_is_its_own_successor_and_a_later_one_is_not() {
    let b = patient_broker().await;
    let proj = "/ident/proj";
    let (mut ea, pa) = editor_proc(&b, proj).await;
    let ida = id_of(&ready(&b, pa).await);
    let (_eb, pb) = editor_proc(&b, proj).await;
    let idb = id_of(&ready(&b, pb).await);
    let mut on_a = Agent::open(&b.socket, proj, Some("on-a")).await;
    on_a.request(json!(1), "broker/attach", json!({"editor": ida}))
        .await;
    let mut on_b = Agent::open(&b.socket, proj, Some("on-b")).await;
    on_b.request(json!(1), "broker/attach", json!({"editor": idb}))
        .await;

    for (round, pause_ms) in [(1u32, 0u64), (2, 5000)] {
        let old_pid = ea.child.id().unwrap_or(0);
        ea.signal(Signal::KILL);
        ea.wait_exit().await;
        // The stale lockfile stays, as after a real crash. Restart at once, then after 5 s.
        if pause_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
        }
        let (e2, p2) = editor_proc(&b, proj).await;
        let st = ready(&b, p2).await;
        assert_eq!(
            id_of(&st),
            ida,
            "round {round}: the restart must inherit the id"
        );
        assert_eq!(st["previous_pid"], old_pid, "round {round}: {st}");
        assert_eq!(st["restarts"], round);
        // The sibling kept its id and its session.
        let sib = editor_by_port(&b.status().await, pb).cloned().unwrap();
        assert_eq!(id_of(&sib), idb);
        // The session follows without reconnecting; its calls reach the new process.
        let r = on_a
            .request(
                json!(format!("after-{round}")),
                "tools/call",
                json!({"name": "getDiagnostics", "arguments": {}}),
            )
            .await;
        assert!(r.get("result").is_some(), "round {round}: {r}");
        ea = e2;
        let _ = p2;
    }
    // A third, unrelated editor opened later on the same folder takes nobody's session.
    let (_ec, pc) = editor_proc(&b, proj).await;
    let idc = id_of(&ready(&b, pc).await);
    assert!(idc != ida && idc != idb, "{idc}");
    let st = b.status().await;
    let session_editors: Vec<String> = st["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["editor"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        !session_editors.contains(&idc),
        "a session moved to the newcomer: {st}"
    );
    let mut again = Agent::open(&b.socket, proj, Some("on-a")).await;
    assert_eq!(attached(&mut again).await, ida);
    drop(ea);
    b.stop().await;
}

/// An editor SIGKILLed whose parent does not reap it (a container without an init, a stuck
/// terminal): a zombie is dead, so its restart is its successor at once, and its session
/// follows. Before process facts read the process state, `kill(pid, 0)` found the zombie
/// alive, the restart got a fresh id and the session stayed on the dead editor.
#[tokio::test]
#[cfg_attr(not(target_os = "linux"), ignore = "reads /proc to see the zombie")]
async fn a_killed_editor_left_unreaped_is_dead_and_its_restart_is_its_successor() {
    let b = patient_broker().await;
    let proj = "/ident/zombie";
    let (ea, pa) = editor_proc(&b, proj).await;
    let ida = id_of(&ready(&b, pa).await);
    let (_eb, pb) = editor_proc(&b, proj).await;
    let idb = id_of(&ready(&b, pb).await);
    let mut on_a = Agent::open(&b.socket, proj, Some("zombie-a")).await;
    on_a.request(json!(1), "broker/attach", json!({"editor": ida}))
        .await;
    let old_pid = ea.child.id().unwrap_or(0);
    ea.signal(Signal::KILL);
    // Not reaped: the child handle is kept and never waited on, so the process stays a
    // zombie (its parent is this test) until the end of the test.
    pi_ide_broker::testkit::eventually("the killed editor to be a zombie", || {
        let stat = std::fs::read_to_string(format!("/proc/{old_pid}/stat")).ok()?;
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'))
            .then_some(())
    })
    .await;
    assert!(
        !pi_ide_broker::platform::process::alive(old_pid),
        "a zombie counts as dead"
    );
    let (e2, p2) = editor_proc(&b, proj).await;
    let st = ready(&b, p2).await;
    assert_eq!(id_of(&st), ida, "the restart inherits the id: {st}");
    assert_eq!(st["previous_pid"], old_pid, "{st}");
    let sib = editor_by_port(&b.status().await, pb).cloned().unwrap();
    assert_eq!(id_of(&sib), idb, "the sibling keeps its id");
    let r = on_a.call("getDiagnostics", json!({})).await;
    assert!(r.get("result").is_some(), "the session follows: {r}");
    drop((ea, e2));
    b.stop().await;
}

/// Issue 38's sequence: A killed (its lockfile left) and restarted at once as A2, then a second
/// window C opened on the same folder. A2 keeps A's id and its session; C is a new editor and
/// takes nothing. Before the fix, retiring the dead A after its id had passed to A2 marked
/// A2's record lost, and C "succeeded" the running A2: A2 vanished from status and its session
/// moved to C.
#[tokio::test]
async fn a_fast_restart_keeps_its_id_when_a_second_window_opens_later() {
    let b = patient_broker().await;
    let proj = "/ident/second-window";
    let (mut a, pa) = editor_proc(&b, proj).await;
    let ida = id_of(&ready(&b, pa).await);
    let mut on_a = Agent::open(&b.socket, proj, Some("second-window")).await;
    assert_eq!(attached(&mut on_a).await, ida);
    a.signal(Signal::KILL);
    a.wait_exit().await;
    let (a2, pa2) = editor_proc(&b, proj).await;
    let st = ready(&b, pa2).await;
    assert_eq!(id_of(&st), ida, "the restart inherits the id: {st}");
    let (_c, pc) = editor_proc(&b, proj).await;
    let idc = id_of(&ready(&b, pc).await);
    assert_ne!(idc, ida, "the second window got the running editor's id");
    let st = b.status().await;
    let a2_now =
        editor_by_port(&st, pa2).unwrap_or_else(|| panic!("A2 was retired while running: {st}"));
    assert_eq!(id_of(a2_now), ida, "{st}");
    assert_eq!(a2_now["restarts"], 1, "{st}");
    let c_now = editor_by_port(&st, pc).unwrap_or_else(|| panic!("C missing: {st}"));
    assert_eq!(
        c_now["restarts"], 0,
        "C is a new editor, not a successor: {st}"
    );
    // The session is still on A2, and its calls reach A2's process.
    let r = on_a.call("getDiagnostics", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
    let st = b.status().await;
    let editors: Vec<&str> = st["sessions"]
        .as_array()
        .map(|v| v.iter().filter_map(|s| s["editor"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(editors, vec![ida.as_str()], "{st}");
    drop(a2);
    b.stop().await;
}
