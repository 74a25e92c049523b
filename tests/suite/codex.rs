//! Issue 66: Codex's `/ide` served by the broker (the codex door, `frontdoor::codex`).
//!
//! The hub on a real socket (frames, two workspaces routed to their own editors, no editor
//! answered at once, another uid refused, a squatted dir refused, an official hub left alone
//! and taken over only once it is gone), then the real Codex in a pty (`script`), offline
//! against a fake Responses API, with real editors: a Neovim running claudecode.nvim (`/ide on`,
//! a prompt with no editor, one with the editor's selection, one after a broker restart), a
//! second Codex in another folder held by a Neovim running pi-ide.nvim (its own editor's
//! context, none of the first's), and VS Code with the Claude Code extension.

pub(crate) mod real;

use crate::common::broker::TestBroker;
use crate::common::*;
use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// Where `test_config` puts the hub socket.
fn hub(b: &TestBroker) -> PathBuf {
    b.dir.path().join("codex-ipc").join("ipc.sock")
}

async fn send(s: &mut UnixStream, v: &Value) {
    let body = v.to_string();
    let mut buf = (body.len() as u32).to_le_bytes().to_vec();
    buf.extend_from_slice(body.as_bytes());
    s.write_all(&buf).await.expect("write a frame");
}

/// The next frame, `None` when the hub closed the connection.
async fn recv(s: &mut UnixStream) -> Option<Value> {
    within("a hub frame", async {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.ok()?;
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut body).await.ok()?;
        serde_json::from_slice(&body).ok()
    })
    .await
}

/// Codex 0.171's request for the context of `root`.
fn ide_context(id: &str, root: &str) -> Value {
    json!({"type": "request", "requestId": id, "sourceClientId": "codex-tui", "version": 0,
           "method": "ide-context", "params": {"workspaceRoot": root}})
}

/// One request on a connection of its own, as Codex makes it.
async fn ask(socket: &Path, req: Value) -> Value {
    let mut s = UnixStream::connect(socket)
        .await
        .expect("connect to the hub");
    send(&mut s, &req).await;
    recv(&mut s).await.expect("an answer")
}

/// A project folder under the broker's dir, canonical, holding `file`.
fn folder(b: &TestBroker, name: &str, file: &str) -> (String, String) {
    let dir = b.dir.path().join(name);
    std::fs::create_dir_all(dir.join("src")).expect("mkdir");
    let dir = std::fs::canonicalize(dir).expect("canonical");
    let path = dir.join("src").join(file);
    std::fs::write(&path, "fn focus() {}\n").expect("write");
    (dir.display().to_string(), path.display().to_string())
}

/// Two folders, each with its own editor (one of each family) and its own selection: each
/// workspace gets its editor's active file, selection and open tabs; a folder no editor has
/// gets the empty context at once (never Codex's 6 s timeout). One connection carries
/// `initialize`, garbage and requests in turn.
#[tokio::test]
async fn each_workspace_gets_its_own_editors_context_and_none_gets_an_empty_one_at_once() {
    let b = TestBroker::start().await;
    let socket = hub(&b);
    let (a_root, a_file) = folder(&b, "alpha", "a.rs");
    let (z_root, z_file) = folder(&b, "zeta", "z.rs");
    let (fa, _) = b.start_editor(Options::pi(&[&a_root])).await;
    let (fz, _) = b.start_editor(Options::claudecode(&[&z_root])).await;
    fa.select(&a_file, "fn focus", 0);
    fz.select(&z_file, "focus()", 0);
    let reg = b.handle.registry();
    pi_ide_broker::testkit::eventually("both selections at the broker", || {
        reg.editors()
            .iter()
            .all(|e| e.last_selection().is_some())
            .then_some(())
    })
    .await;

    let a = ask(&socket, ide_context("a", &a_root)).await;
    assert_eq!(a["resultType"], "success", "{a}");
    let af = &a["result"]["ideContext"]["activeFile"];
    assert_eq!(af["fsPath"], a_file.as_str(), "{a}");
    assert_eq!(af["path"], "src/a.rs");
    assert_eq!(af["activeSelectionContent"], "fn focus");
    // The pi editor's getOpenEditorTabs answer (file:///x.rs), outside the root: absolute.
    assert_eq!(
        a["result"]["ideContext"]["openTabs"][0]["fsPath"], "/x.rs",
        "{a}"
    );

    let z = ask(&socket, ide_context("z", &format!("{z_root}/src"))).await;
    let zf = &z["result"]["ideContext"]["activeFile"];
    assert_eq!(zf["fsPath"], z_file.as_str(), "{z}");
    assert_eq!(
        zf["path"], "z.rs",
        "relative to the workspace root Codex sent"
    );
    assert_eq!(zf["activeSelectionContent"], "focus()");

    let started = Instant::now();
    let none = ask(&socket, ide_context("n", "/nowhere/at/all")).await;
    let took = started.elapsed();
    println!("no-editor answer in {took:?}");
    assert_eq!(none["resultType"], "success");
    assert_eq!(
        none["result"]["ideContext"],
        json!({"activeFile": null, "openTabs": []})
    );
    assert!(
        took < Duration::from_secs(3),
        "Codex gives up at 6 s: {took:?}"
    );

    // initialize, then garbage, then a request: one connection, answered in turn.
    let mut s = UnixStream::connect(&socket).await.expect("connect");
    send(
        &mut s,
        &json!({"type": "request", "requestId": "i", "sourceClientId": "initializing-client",
        "version": 0, "method": "initialize", "params": {"clientType": "desktop"}}),
    )
    .await;
    let init = recv(&mut s).await.expect("initialize answered");
    let client = init["result"]["clientId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!client.is_empty(), "{init}");
    s.write_all(&5u32.to_le_bytes()).await.expect("write");
    s.write_all(b"}{!!!").await.expect("write");
    let mut again = ide_context("after-garbage", &a_root);
    again["sourceClientId"] = json!(client);
    send(&mut s, &again).await;
    let after = recv(&mut s).await.expect("still served after garbage");
    assert_eq!(after["requestId"], "after-garbage");
    assert_eq!(
        after["result"]["ideContext"]["activeFile"]["path"],
        "src/a.rs"
    );
    // A frame longer than max_frame_bytes closes that connection (and no other).
    s.write_all(&u32::MAX.to_le_bytes()).await.expect("write");
    assert!(
        recv(&mut s).await.is_none(),
        "an oversized frame ends the connection"
    );
    assert_eq!(
        ask(&socket, ide_context("x", &a_root)).await["resultType"],
        "success"
    );
    b.stop().await;
}

/// `python3 -c` that sends one ide-context frame to argv[1] and prints `answered <bytes>`,
/// `dropped` or `connect-failed <errno>`.
const PROBE: &str = r#"
import socket, struct, sys, json
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect-failed", e.errno); sys.exit(0)
b = json.dumps({"type": "request", "requestId": "p", "version": 0, "method": "ide-context", "params": {"workspaceRoot": "/"}}).encode()
got = b""
try:
    s.sendall(struct.pack("<I", len(b)) + b)
    while True:
        d = s.recv(65536)
        if not d: break
        got += d
        if len(got) >= 4 and len(got) >= 4 + struct.unpack("<I", got[:4])[0]: break
except OSError:
    pass
print("answered", len(got) if got else "") if got else print("dropped")
"#;

/// The probe as `uid` (`None`: this test's own), with the system's python (a path every uid
/// may run).
async fn probe(socket: &Path, uid: Option<u32>) -> String {
    let mut cmd = match uid {
        Some(u) => {
            let mut c = tokio::process::Command::new("setpriv");
            c.arg(format!("--reuid={u}"))
                .arg(format!("--regid={u}"))
                .arg("--clear-groups")
                .arg("/usr/bin/python3");
            c
        }
        None => tokio::process::Command::new("/usr/bin/python3"),
    };
    cmd.arg("-c").arg(PROBE).arg(socket).kill_on_drop(true);
    let out = within("the hub probe", cmd.output())
        .await
        .expect("run the probe");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Another uid cannot use the hub: even with the socket opened to it (dirs 0711, socket
/// 0666, as a mistake would leave them) the broker checks the peer's uid from the kernel and
/// closes without an answer, while the user's own probe is answered.
#[tokio::test]
async fn another_uid_is_refused_by_the_hub() {
    if !crate::common::process::other_uid_or_skip("codex::another_uid_is_refused_by_the_hub").await
        || !Path::new("/usr/bin/python3").exists()
    {
        return;
    }
    let b = TestBroker::start().await;
    let socket = hub(&b);
    b.wait_status("the hub served", |st| st["codex_hub"]["owner"] == "broker")
        .await;
    crate::common::process::expose_socket(&socket, b.dir.path(), true);
    assert!(
        probe(&socket, None).await.starts_with("answered"),
        "the user's own probe"
    );
    assert_eq!(probe(&socket, Some(65534)).await, "dropped");
    crate::common::process::expose_socket(&socket, b.dir.path(), false);
    b.stop().await;
}

/// A `codex-ipc` dir others may write to, or another user's, is refused: nothing is bound
/// there, and status (and doctor, from it) says why.
#[tokio::test]
async fn a_squatted_codex_ipc_dir_is_refused_and_status_says_why() {
    use std::os::unix::fs::PermissionsExt;
    for (what, squat) in [
        ("writable by group or others", None),
        ("belongs to uid 65534", Some(65534)),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let ipc = dir.path().join("codex-ipc");
        std::fs::create_dir(&ipc).expect("mkdir");
        match squat {
            None => std::fs::set_permissions(&ipc, std::fs::Permissions::from_mode(0o777)),
            Some(uid) => std::os::unix::fs::chown(&ipc, Some(uid), Some(uid)),
        }
        .expect("squat the dir");
        let b = TestBroker::start_in(dir, |_| {}).await;
        let st = b
            .wait_status("the hub refused", |st| {
                st["codex_hub"]["owner"] == "refused"
            })
            .await;
        let detail = st["codex_hub"]["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(what), "{what}: {detail}");
        assert!(!hub(&b).exists(), "nothing bound in a squatted dir");
        let (health, message, fix) = pi_ide_broker::frontdoor::codex::diagnose(
            true,
            &hub(&b),
            serde_json::from_value(st["codex_hub"].clone())
                .ok()
                .as_ref(),
        );
        assert_eq!(health, pi_ide_broker::frontdoor::codex::Health::Fail);
        assert!(message.contains(what) && fix.is_some(), "{message}");
        b.stop().await;
    }
}

/// An official hub (the Codex app) holds the socket: the broker does not bind or delete it,
/// status names the hub's process, and Codex's requests reach the official hub. When that hub
/// goes, the broker takes the (dead) path over and serves.
#[tokio::test]
async fn an_official_hub_keeps_its_socket_and_the_broker_takes_over_when_it_goes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ipc = dir.path().join("codex-ipc");
    std::fs::create_dir(&ipc).expect("mkdir");
    let socket = ipc.join("ipc.sock");
    let official = tokio::net::UnixListener::bind(&socket).expect("the official hub binds");
    let served = tokio::spawn(async move {
        // Serves every connection (the broker's watcher among them) until dropped.
        let mut conns = Vec::new();
        loop {
            let (mut s, _) = official.accept().await.expect("accept");
            let peek = tokio::time::timeout(Duration::from_millis(200), recv(&mut s)).await;
            if let Ok(Some(req)) = peek {
                let ans = json!({"type": "response", "requestId": req["requestId"], "resultType": "success",
                    "result": {"ideContext": {"activeFile": null, "openTabs": [{"label": "official", "path": "o", "fsPath": "/o"}]}}});
                send(&mut s, &ans).await;
            }
            conns.push(s);
        }
    });
    let b = TestBroker::start_in(dir, |_| {}).await;
    let st = b
        .wait_status("the official hub seen", |st| {
            st["codex_hub"]["owner"] == "other"
        })
        .await;
    let detail = st["codex_hub"]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(&format!("pid {}", std::process::id())),
        "{detail}"
    );
    let a = ask(&socket, ide_context("o", "/")).await;
    assert_eq!(
        a["result"]["ideContext"]["openTabs"][0]["label"], "official",
        "the official hub answered"
    );

    // The official hub quits (its socket file stays, dead): the broker takes the path over.
    served.abort();
    let _ = served.await;
    b.wait_status("the broker serving", |st| {
        st["codex_hub"]["owner"] == "broker"
    })
    .await;
    let a = ask(&socket, ide_context("b", "/")).await;
    assert_eq!(
        a["result"]["ideContext"]["openTabs"],
        json!([]),
        "now the broker answers"
    );
    b.stop().await;
    assert!(!socket.exists(), "the broker removes the socket it bound");
}
