//! Issue 62: a session outlives an upgrade. The daemon's binary replaced under it, the daemon
//! starts the new one, hands it the listening socket and steps down: no dial is refused in
//! between, an open diff is still answered by the reviewer, and sessions (a native one, the
//! `mcp` door) are attached again by the successor.

use crate::common::process::{broker_bin, isolate, write_config, DaemonReaper, Proc};
use crate::stdio::Mcp;
use pi_ide_broker::testkit::agent::Agent;
use pi_ide_broker::testkit::fake_editor::{FakeEditor, Options};
use pi_ide_broker::testkit::{eventually, text, within};
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Writes `from` over `to` as an installer does: a new file renamed over the path.
pub(crate) fn install_over(from: &Path, to: &Path) {
    let next = to.with_extension("new");
    std::fs::copy(from, &next).expect("copy the new binary");
    std::fs::rename(&next, to).expect("rename it over the old one");
}

/// (device, inode) of a file, or of the binary a pid runs.
fn identity(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).expect("stat");
    (m.dev(), m.ino())
}

/// The pid `running.json` in `state` names.
fn running_pid(state: &Path) -> Option<u32> {
    let record = std::fs::read_to_string(state.join("running.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&record).ok()?;
    u32::try_from(v["pid"].as_u64()?).ok()
}

/// Dials `socket` again and again until stopped, keeping every failure: a client arriving
/// during the handover must find a listener.
struct Dialler {
    stop: Arc<AtomicBool>,
    dials: Arc<AtomicUsize>,
    refused: Arc<Mutex<Vec<String>>>,
}

impl Dialler {
    fn start(socket: &Path) -> Dialler {
        let d = Dialler {
            stop: Arc::default(),
            dials: Arc::default(),
            refused: Arc::default(),
        };
        let (stop, dials, refused) = (d.stop.clone(), d.dials.clone(), d.refused.clone());
        let socket = socket.to_path_buf();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match tokio::net::UnixStream::connect(&socket).await {
                    Ok(s) => drop(s),
                    Err(e) => refused.lock().unwrap().push(e.to_string()),
                }
                dials.fetch_add(1, Ordering::Relaxed);
                // Pacing, not synchronisation: a dial every 2 ms over the whole handover.
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        });
        d
    }

    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let refused = self.refused.lock().unwrap().clone();
        (self.dials.load(Ordering::Relaxed), refused)
    }
}

/// The daemon runs from a copy of the binary; a new file is renamed over that path while a
/// diff is open: the daemon waits for the reviewer (the diff is answered FILE_SAVED by the
/// old daemon), then starts the new file, which takes the socket over. A client dialling all
/// along is never refused; the old daemon exits 0, the successor runs the new file, and the
/// native session (same key, same editor) and the `mcp` door are attached again at once.
/// Before the handover the daemon exited 75 and nobody listened until a new session started
/// one: the dialler saw ECONNREFUSED/ENOENT and no successor ran.
#[tokio::test]
async fn a_replaced_binary_hands_the_socket_to_the_new_one_and_sessions_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let cfg = write_config(&root, "");
    let state = root.join("state");
    let _reaper = DaemonReaper(state.clone());
    let bin_dir = root.join("pkg");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let installed = bin_dir.join("pi-ide-broker");
    std::fs::copy(broker_bin(), &installed).expect("copy the binary");
    let mut cmd = tokio::process::Command::new(&installed);
    cmd.arg("--config")
        .arg(&cfg)
        .arg("daemon")
        .env("RUST_LOG", "info")
        .env_remove("PI_IDE_BROKER_SOCKET");
    isolate(&mut cmd, &root);
    let mut d = Proc::spawn(&mut cmd);
    d.wait_line(&["pi-ide-broker ready"]).await;
    let old_pid = d.child.id().expect("pid");
    let socket = root.join("run/sock");
    let proj = root.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::create_dir_all(root.join("pi-ide")).unwrap();
    let folder = proj.display().to_string();
    let fe = FakeEditor::start_in(&root.join("pi-ide"), Options::pi(&[&folder]))
        .await
        .expect("editor");
    let mut a = Agent::open(&socket, &folder, Some("pi-1")).await;
    let first = a.attached().await;
    let mut mcp_cmd = tokio::process::Command::new(broker_bin());
    mcp_cmd.args(["--config"]).arg(&cfg).args([
        "mcp",
        "--cwd",
        &folder,
        "--session",
        "claude-1",
        "--no-spawn",
    ]);
    isolate(&mut mcp_cmd, &root);
    let mut m = Mcp::spawn(&mut mcp_cmd);
    let init = m.request(json!(1), "initialize", json!({"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}})).await;
    assert_eq!(init["result"]["serverInfo"]["name"], "pi-ide-broker");
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    assert!(m
        .call("getDiagnostics", json!({}))
        .await
        .get("result")
        .is_some());

    let file = proj.join("a.rs").display().to_string();
    a.call_tool(
        json!("d"),
        "openDiff",
        pi_ide_broker::testkit::diff_args(&file, "new\n", "t"),
    )
    .await;
    eventually("the diff open in the editor", || {
        fe.pending_diffs().contains(&"t".to_string()).then_some(())
    })
    .await;
    let dialler = Dialler::start(&socket);
    install_over(&broker_bin(), &installed);
    d.wait_line(&["was replaced", "once no call is pending"])
        .await;
    assert!(
        d.child.try_wait().expect("try_wait").is_none(),
        "it must wait for the open diff"
    );
    assert!(fe.accept_diff("t", "new\n"));
    assert_eq!(text(&a.answer(&json!("d")).await), "FILE_SAVED");
    let status = d.wait_exit().await;
    assert!(status.success(), "{status:?}\n{}", d.seen.join("\n"));
    let successor = eventually("the successor's running record", || {
        running_pid(&state).filter(|p| *p != old_pid)
    })
    .await;
    assert_eq!(
        identity(Path::new(&format!("/proc/{successor}/exe"))),
        identity(&installed),
        "the successor runs the file installed now"
    );
    // The old daemon told the session why it went, then closed it.
    let why = a
        .until("the detach notice", |v| v["method"] == "broker/detached")
        .await;
    assert!(
        why["params"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("shutting down") && r.contains("handing over")),
        "{why}"
    );
    // The same session key comes back to the same editor on the successor.
    let mut b = Agent::open(&socket, &folder, Some("pi-1")).await;
    let again = b.attached().await;
    assert_eq!(again["params"]["editor"], first["params"]["editor"]);
    // The mcp door reattached by itself: its next call is answered by the editor.
    let answer = within("the mcp door's call after the handover", async {
        loop {
            let r = m.call("getDiagnostics", json!({})).await;
            if r.get("result").is_some() {
                return r;
            }
        }
    })
    .await;
    assert!(answer.get("result").is_some(), "{answer}");
    let (dials, refused) = dialler.finish();
    assert!(dials > 10, "the dialler ran ({dials} dials)");
    assert!(
        refused.is_empty(),
        "{} of {dials} dials found nobody during the handover: {:?}",
        refused.len(),
        &refused[..refused.len().min(5)]
    );
    b.close().await;
}
