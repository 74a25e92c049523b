//! Issue 65: the copilot door — GitHub Copilot CLI's IDE protocol (a `<uuid>.lock` per editor
//! naming a private Unix socket, MCP over Streamable HTTP there), driven as Copilot CLI 1.0.102
//! drives it: `Authorization: Nonce`, `Host: localhost`, `server/discover` first (offered the
//! 2025 versions), then `initialize`, the event stream, the tools. `real`: the real Copilot CLI in a pty.

mod real;
mod real_crash;
mod real_editors;
mod trust;

use crate::common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use pi_ide_broker::testkit::{eventually, within};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A broker with the copilot door on.
async fn broker() -> TestBroker {
    TestBroker::start_with(|c| {
        c.edit_section(|s: &mut pi_ide_broker::frontdoor::copilot::CopilotConfig| s.enabled = true);
        c.editor_grace_ms = 200;
    })
    .await
}

fn copilot_dir(b: &TestBroker) -> PathBuf {
    b.dir.path().join("copilot-ide")
}

/// The lockfiles in `dir`: path and JSON.
fn lockfiles(dir: &Path) -> Vec<(PathBuf, Value)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".lock"))
        .filter_map(|e| {
            let v = serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok()?;
            Some((e.path(), v))
        })
        .collect()
}

/// The one lockfile listing `folder` (waits for it).
async fn lockfile(dir: &Path, folder: &str) -> (PathBuf, Value) {
    eventually(&format!("a copilot lockfile for {folder}"), || {
        lockfiles(dir).into_iter().find(|(_, v)| {
            v["workspaceFolders"]
                .as_array()
                .is_some_and(|f| f.contains(&json!(folder)))
        })
    })
    .await
}

/// Copilot CLI's side of one lockfile.
struct Copilot {
    socket: PathBuf,
    auth: String,
    session: Option<String>,
}

impl Copilot {
    fn new(lock: &Value) -> Copilot {
        Copilot {
            socket: PathBuf::from(lock["socketPath"].as_str().expect("socketPath")),
            auth: lock["headers"]["Authorization"]
                .as_str()
                .expect("Authorization")
                .to_string(),
            session: None,
        }
    }

    /// One request on a fresh connection, with the lockfile's headers (and `extra`).
    async fn send(
        &self,
        method: &str,
        body: Option<Value>,
        extra: &[(&'static str, &str)],
    ) -> hyper::Response<Incoming> {
        let stream = within("connect", tokio::net::UnixStream::connect(&self.socket))
            .await
            .expect("connect");
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri("/mcp")
            .header("host", "localhost")
            .header("authorization", &self.auth)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("x-copilot-session-id", "copilot-test-session")
            .header("x-copilot-pid", std::process::id().to_string());
        if let Some(s) = &self.session {
            req = req.header("mcp-session-id", s);
        }
        if let Some(h) = req.headers_mut() {
            for (k, v) in extra {
                h.insert(*k, v.parse().expect("header value"));
            }
        }
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let req = req.body(Full::new(Bytes::from(bytes))).expect("request");
        within(method, send.send_request(req))
            .await
            .expect("answer")
    }

    /// A JSON-RPC request: HTTP status and the JSON answer.
    async fn rpc(&self, id: u64, method: &str, params: Value) -> (u16, Value) {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let r = self.send("POST", Some(msg), &[]).await;
        let status = r.status().as_u16();
        let body = within("body", r.into_body().collect())
            .await
            .expect("body")
            .to_bytes();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// A tool's answer: the JSON its text content holds.
    async fn tool(&self, id: u64, name: &str, args: Value) -> Value {
        let (status, v) = self
            .rpc(id, "tools/call", json!({"name": name, "arguments": args}))
            .await;
        assert_eq!(status, 200, "{v}");
        let text = v["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("text content: {v}"));
        serde_json::from_str(text).unwrap_or_else(|_| json!({ "text": text }))
    }

    /// `initialize` (2025-11-25, as Copilot CLI sends it) and `notifications/initialized`.
    async fn initialize(&mut self) {
        let r = self
            .send("POST", Some(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "copilot-cli", "version": "1.0.102"}}})), &[])
            .await;
        assert_eq!(r.status(), 200);
        let id = r
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .expect("mcp-session-id")
            .to_string();
        let body = within("body", r.into_body().collect())
            .await
            .expect("body")
            .to_bytes();
        let v: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(v["result"]["protocolVersion"], "2025-11-25", "{v}");
        self.session = Some(id);
        let r = self
            .send(
                "POST",
                Some(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
                &[],
            )
            .await;
        assert_eq!(r.status(), 202);
    }

    /// Opens the event stream.
    async fn stream(&self) -> Events {
        let r = self
            .send("GET", None, &[("accept", "text/event-stream")])
            .await;
        assert_eq!(r.status(), 200);
        Events {
            body: r.into_body(),
            buf: String::new(),
        }
    }
}

/// A session's event stream.
struct Events {
    body: Incoming,
    buf: String,
}

impl Events {
    /// The params of the next `method` notification (others are passed over).
    async fn next(&mut self, method: &str) -> Value {
        within(&format!("a {method} event"), async {
            loop {
                while let Some(at) = self.buf.find("\n\n") {
                    let event: String = self.buf.drain(..at + 2).collect();
                    let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) else {
                        continue;
                    };
                    let v: Value = serde_json::from_str(data).expect("event JSON");
                    if v["method"] == method {
                        return v["params"].clone();
                    }
                }
                let frame = self
                    .body
                    .frame()
                    .await
                    .expect("the stream stays open")
                    .expect("frame");
                if let Ok(d) = frame.into_data() {
                    self.buf.push_str(&String::from_utf8_lossy(&d));
                }
            }
        })
        .await
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777
}

#[tokio::test]
async fn a_lockfile_names_a_private_socket_and_goes_with_its_editor_and_the_broker() {
    let b = broker().await;
    let dir = copilot_dir(&b);
    let (fe, id) = b.editor(&["/c/one"]).await;
    let (path, lock) = lockfile(&dir, "/c/one").await;
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    assert_eq!(name.len(), 36 + 5, "<uuid>.lock: {name}");
    assert_eq!(lock["scheme"], "unix");
    assert_eq!(lock["pid"], std::process::id(), "the broker's pid");
    assert_eq!(lock["ideName"], "Neovim (via pi-ide-broker)");
    assert_eq!(lock["workspaceFolders"], json!(["/c/one"]));
    assert!(lock["timestamp"].as_u64().is_some());
    assert_eq!(lock["piIdeBroker"]["editor"], id.as_str());
    let nonce = lock["headers"]["Authorization"].as_str().unwrap();
    assert!(
        nonce.starts_with("Nonce ") && nonce.len() > 6 + 16,
        "{nonce}"
    );
    assert!(
        !nonce.contains(fe.token()),
        "the broker's own nonce, not the editor's token"
    );
    assert!(
        lock.get("isTrusted").is_none(),
        "no folder trust is granted"
    );
    let socket = PathBuf::from(lock["socketPath"].as_str().unwrap());
    assert_eq!((mode(&path), mode(&socket)), (0o600, 0o600));
    assert_eq!(mode(socket.parent().unwrap()), 0o700);
    assert!(
        socket.starts_with(b.socket.parent().unwrap()),
        "beside the broker's socket"
    );

    // The editor goes for good: its lockfile and socket go.
    fe.remove_lockfile();
    fe.crash().await;
    eventually("the lockfile removed", || {
        (!path.exists() && !socket.exists()).then_some(())
    })
    .await;

    // The broker stops: every lockfile goes; a foreign one stays.
    let foreign = dir.join("foreign.lock");
    std::fs::write(&foreign, r#"{"pid":1}"#).unwrap();
    let (_fe2, _) = b.editor(&["/c/two"]).await;
    let (path2, _) = lockfile(&dir, "/c/two").await;
    let _kept = b.stop_keep_dir().await;
    assert!(!path2.exists(), "removed on shutdown");
    assert!(
        foreign.exists(),
        "a file without our marker is never touched"
    );
}

#[tokio::test]
async fn a_wrong_nonce_a_foreign_host_and_an_origin_are_refused_and_discover_offers_the_2025_versions(
) {
    let b = broker().await;
    let (_fe, _) = b.editor(&["/c/auth"]).await;
    let (_, lock) = lockfile(&copilot_dir(&b), "/c/auth").await;
    let good = Copilot::new(&lock);
    let wrong = Copilot {
        auth: "Nonce 0000".into(),
        ..Copilot::new(&lock)
    };
    let discover = json!({"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {}});
    assert_eq!(
        wrong
            .send("POST", Some(discover.clone()), &[])
            .await
            .status(),
        401
    );
    let none = Copilot {
        auth: String::new(),
        ..Copilot::new(&lock)
    };
    assert_eq!(
        none.send("POST", Some(discover.clone()), &[])
            .await
            .status(),
        401
    );
    assert_eq!(
        good.send("POST", Some(discover.clone()), &[("host", "evil.example")])
            .await
            .status(),
        403
    );
    assert_eq!(
        good.send(
            "POST",
            Some(discover.clone()),
            &[("origin", "http://evil.example")]
        )
        .await
        .status(),
        403
    );

    // server/discover offers the 2025 versions only: Copilot CLI then takes the session flow
    // (initialize, stream), the one with selection pushes.
    let (status, v) = good.rpc(0, "server/discover", json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["result"]["supportedVersions"],
        json!(["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]),
        "{v}"
    );
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    // Without a session, only initialize is served.
    let (status, _) = good.rpc(2, "tools/list", json!({})).await;
    assert_eq!(status, 400);
    b.stop().await;
}

#[tokio::test]
async fn a_copilot_session_sees_the_selection_and_diagnostics_and_its_diffs_are_reviewed_in_the_editor(
) {
    let b = broker().await;
    let (fe, _) = b.editor(&["/c/work"]).await;
    let (_, lock) = lockfile(&copilot_dir(&b), "/c/work").await;
    let mut c = Copilot::new(&lock);
    c.initialize().await;
    let mut events = c.stream().await;

    let (_, v) = c.rpc(2, "tools/list", json!({})).await;
    let names: Vec<&str> = v["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "get_selection",
            "get_diagnostics",
            "open_diff",
            "close_diff",
            "update_session_name"
        ]
    );

    // The editor's selection is pushed, and get_selection answers it.
    fe.select("/c/work/a.rs", "hello", 2);
    let pushed = events.next("selection_changed").await;
    assert_eq!(pushed["filePath"], "/c/work/a.rs");
    assert_eq!(pushed["fileUrl"], "file:///c/work/a.rs");
    assert_eq!(pushed["selection"]["start"]["line"], 2);
    let s = c.tool(3, "get_selection", json!({})).await;
    assert_eq!(
        (&s["text"], &s["current"]),
        (&json!("hello"), &json!(true)),
        "{s}"
    );

    let d = c.tool(4, "get_diagnostics", json!({})).await;
    assert_eq!(d[0]["filePath"], "/x.rs", "{d}");
    assert_eq!(d[0]["diagnostics"][0]["severity"], "Error");

    // open_diff accepted in the editor → SAVED; rejected → REJECTED.
    for (n, accept, want) in [(5, true, "SAVED"), (6, false, "REJECTED")] {
        let tab = format!("[Copilot CLI] - a.rs ({n})");
        let call = c.tool(n, "open_diff", json!({"original_file_path": "/c/work/a.rs", "new_file_contents": "new\n", "tab_name": tab}));
        let verdict = async {
            let pending = eventually("a diff pending in the editor", || {
                let p = fe.pending_diffs();
                (p.len() == 1).then(|| p[0].clone())
            })
            .await;
            assert!(if accept {
                fe.accept_diff(&pending, "new\n")
            } else {
                fe.reject_diff(&pending)
            });
        };
        let (v, ()) = tokio::join!(call, verdict);
        assert_eq!(
            (&v["result"], &v["success"]),
            (&json!(want), &json!(true)),
            "{v}"
        );
    }

    // close_diff (the user answered in the terminal) answers the pending open_diff REJECTED.
    let tab = "[Copilot CLI] - a.rs (7)";
    let call = c.tool(
        7,
        "open_diff",
        json!({"original_file_path": "/c/work/a.rs", "new_file_contents": "x\n", "tab_name": tab}),
    );
    let close = async {
        eventually("a diff pending", || {
            (fe.pending_diffs().len() == 1).then_some(())
        })
        .await;
        c.tool(8, "close_diff", json!({"tab_name": tab})).await
    };
    let (v, closed) = tokio::join!(call, close);
    assert_eq!(
        (&v["result"], &v["trigger"]),
        (&json!("REJECTED"), &json!("closed_via_tool")),
        "{v}"
    );
    assert_eq!(closed["already_closed"], false, "{closed}");
    eventually("the diff closed in the editor", || {
        fe.pending_diffs().is_empty().then_some(())
    })
    .await;
    assert_eq!(
        c.tool(9, "update_session_name", json!({"name": "x"})).await["success"],
        true
    );

    // DELETE ends the session.
    assert_eq!(c.send("DELETE", None, &[]).await.status(), 200);
    let (status, _) = c.rpc(10, "tools/list", json!({})).await;
    assert_eq!(status, 404);
    b.stop().await;
}

/// Another uid cannot use the socket: even opened to it (dirs 0711, socket 0666), the broker
/// checks the peer's uid from the kernel and closes without an answer.
#[tokio::test]
async fn another_uid_is_refused_by_the_copilot_socket() {
    if !crate::common::process::other_uid_or_skip(
        "copilot::another_uid_is_refused_by_the_copilot_socket",
    )
    .await
    {
        return;
    }
    let b = broker().await;
    let (_fe, _) = b.editor(&["/c/uid"]).await;
    let (_, lock) = lockfile(&copilot_dir(&b), "/c/uid").await;
    let socket = PathBuf::from(lock["socketPath"].as_str().unwrap());
    crate::common::process::expose_socket(&socket, b.dir.path(), true);
    let probe = crate::common::process::example_bin("connect_probe");
    let own = within(
        "the user's own probe",
        tokio::process::Command::new(probe).arg(&socket).output(),
    )
    .await
    .expect("run the probe");
    let own = String::from_utf8_lossy(&own.stdout).trim().to_string();
    assert!(own.starts_with("answered"), "the user's own probe: {own}");
    let other = crate::common::process::probe_as_nobody(&socket).await;
    assert_eq!(other.as_deref(), Some("dropped"));
    crate::common::process::expose_socket(&socket, b.dir.path(), false);
    b.stop().await;
}

/// A body over `max_frame_bytes` is refused unread (413), and a session whose event stream
/// closes (Copilot CLI killed: no DELETE comes) is over soon after.
#[tokio::test]
async fn a_body_too_large_is_refused_and_a_session_ends_with_its_event_stream() {
    let b = TestBroker::start_with(|c| {
        c.edit_section(|s: &mut pi_ide_broker::frontdoor::copilot::CopilotConfig| s.enabled = true);
        c.max_frame_bytes = 64 * 1024;
    })
    .await;
    let (_fe, _) = b.editor(&["/c/ends"]).await;
    let (_, lock) = lockfile(&copilot_dir(&b), "/c/ends").await;
    let mut c = Copilot::new(&lock);
    c.initialize().await;
    let big = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "open_diff", "arguments": {"new_file_contents": "x".repeat(100 * 1024)}}});
    assert_eq!(c.send("POST", Some(big), &[]).await.status(), 413);

    let events = c.stream().await;
    let (status, _) = c.rpc(3, "tools/list", json!({})).await;
    assert_eq!(status, 200);
    drop(events);
    // Polled (the end is a clock, no event to await): each look is one request.
    within("the session ended with its stream", async {
        for n in 4.. {
            if c.rpc(n, "tools/list", json!({})).await.0 == 404 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    b.stop().await;
}

/// Both MCP eras on one socket, as the stdio door serves them: a 2026-07-28 request with no
/// `mcp-session-id` (what Copilot CLI sends after a `server/discover` result) is answered
/// modern-shaped: `tools/list` with its cache hints, `tools/call` on a stateless session
/// pinned to the editor (its selection, its diagnostics), a removed method and an unknown
/// version refused as the revision says. The 2025-era flow is unchanged: a sessionless
/// legacy request is still refused, and a session's call carrying a 2026-07-28 `_meta` (as
/// Copilot CLI's model calls do) gets a plain answer.
#[tokio::test]
async fn a_stateless_2026_request_is_answered_modern_and_the_legacy_flow_is_unchanged() {
    let b = broker().await;
    let (fe, _) = b.editor(&["/c/era"]).await;
    let (_, lock) = lockfile(&copilot_dir(&b), "/c/era").await;
    let mut legacy = Copilot::new(&lock);
    legacy.initialize().await;
    let mut events = legacy.stream().await;
    fe.select("/c/era/a.rs", "hello", 2);
    events.next("selection_changed").await;

    let modern = |extra: Value| {
        let mut p = json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "copilot-cli", "version": "1.0.102"}}});
        if let (Some(p), Value::Object(extra)) = (p.as_object_mut(), extra) {
            p.extend(extra);
        }
        p
    };
    let stateless = Copilot::new(&lock);
    let r = stateless
        .send(
            "POST",
            Some(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": modern(json!({}))})),
            &[],
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers().get("mcp-session-id").is_none(),
        "no session minted"
    );
    let body = within("body", r.into_body().collect())
        .await
        .expect("body")
        .to_bytes();
    let v: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert!(v["result"]["ttlMs"].is_u64(), "{v}");
    assert_eq!(v["result"]["tools"][0]["name"], "get_selection", "{v}");

    let (status, v) = stateless
        .rpc(
            2,
            "tools/call",
            modern(json!({"name": "get_selection", "arguments": {}})),
        )
        .await;
    assert_eq!(
        (status, &v["result"]["resultType"]),
        (200, &json!("complete")),
        "{v}"
    );
    let sel: Value =
        serde_json::from_str(v["result"]["content"][0]["text"].as_str().expect("text"))
            .expect("selection JSON");
    assert_eq!(
        (&sel["filePath"], &sel["text"]),
        (&json!("/c/era/a.rs"), &json!("hello")),
        "{sel}"
    );
    let (_, v) = stateless
        .rpc(
            3,
            "tools/call",
            modern(json!({"name": "get_diagnostics", "arguments": {}})),
        )
        .await;
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("/x.rs")),
        "{v}"
    );

    let (_, v) = stateless.rpc(4, "ping", modern(json!({}))).await;
    assert_eq!(
        v["error"]["code"], -32601,
        "ping was removed in 2026-07-28: {v}"
    );
    let (_, v) = stateless
        .rpc(
            5,
            "tools/list",
            json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01"}}),
        )
        .await;
    assert_eq!(v["error"]["code"], -32022, "{v}");

    let (status, _) = stateless.rpc(6, "tools/list", json!({})).await;
    assert_eq!(
        status, 400,
        "a sessionless 2025-era request: initialize first"
    );
    let (status, v) = legacy
        .rpc(
            7,
            "tools/call",
            modern(json!({"name": "get_selection", "arguments": {}})),
        )
        .await;
    assert_eq!(status, 200);
    assert!(
        v["result"].get("resultType").is_none(),
        "the session's era rules: {v}"
    );
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("hello")),
        "{v}"
    );
    b.stop().await;
}

/// On by default, the door creates no Copilot home for a user who never ran Copilot CLI: while
/// `$COPILOT_HOME` (here the ide dir's parent) is missing it publishes nothing and `status`
/// says why; once the home appears it publishes the live editors' lockfiles (no restart),
/// having created only the `ide` dir inside it (0700).
#[tokio::test]
async fn without_copilots_home_nothing_is_published_until_it_appears() {
    let root = tempfile::tempdir().expect("tempdir");
    let home = root.path().join("copilot-home");
    let dir = home.join("ide");
    let b = TestBroker::start_in(root, |c| {
        assert!(
            pi_ide_broker::frontdoor::copilot::CopilotConfig::of(c).enabled,
            "on by default"
        );
        let d = dir.clone();
        c.edit_section(|s: &mut pi_ide_broker::frontdoor::copilot::CopilotConfig| s.dir = Some(d));
    })
    .await;
    let (_fe, _) = b.editor(&["/c/home"]).await;
    let st = b
        .wait_status("the copilot door waiting for Copilot's home", |st| {
            st["copilot_home_missing"] == json!(home.display().to_string())
        })
        .await;
    assert_eq!(st["copilot_lockfiles"], json!([]), "{st:#}");
    assert!(!home.exists(), "the door never creates Copilot's home");

    std::fs::create_dir(&home).expect("Copilot CLI's first run makes its home");
    let (path, _) = lockfile(&dir, "/c/home").await;
    assert_eq!(mode(&dir), 0o700, "only the ide dir is made, private");
    let st = b
        .wait_status("the lockfile in status", |st| {
            st["copilot_lockfiles"][0]["path"] == json!(path)
        })
        .await;
    assert!(st.get("copilot_home_missing").is_none(), "{st:#}");
    b.stop().await;
}

/// The `[copilot]` section of a config file for broker dir `root` (`write_config`'s `extra`),
/// the door on with the test broker's dir.
fn copilot_section(root: &Path) -> String {
    format!(
        "[copilot]\nenabled = true\ndir = \"{d}\"\neditor_dirs = [\"{d}\"]\n",
        d = root.join("copilot-ide").display()
    )
}

/// `pi-ide-broker ARGS` with the config of broker dir `root`: its stdout.
async fn cli(root: &Path, args: &[&str]) -> String {
    let cfg = crate::common::process::write_config(root, &copilot_section(root));
    let out = within(
        "the CLI",
        tokio::process::Command::new(crate::common::process::broker_bin())
            .arg("--config")
            .arg(&cfg)
            .args(args)
            .env_remove("PI_IDE_BROKER_SOCKET")
            .output(),
    )
    .await
    .expect("run the CLI");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 65: `status` (JSON and text) and `doctor` say which editor Copilot CLI sees through
/// which lockfile, on which folders, and which Copilot CLI sessions are on it (door
/// `copilot`); `doctor` warns of a lockfile a dead broker left, saying what to do.
#[tokio::test]
async fn status_and_doctor_show_the_copilot_lockfile_and_its_sessions() {
    let b = broker().await;
    let root = b.dir.path().to_path_buf();
    let (_fe, id) = b.editor(&["/c/st"]).await;
    let (path, lock) = lockfile(&copilot_dir(&b), "/c/st").await;
    let mut c = Copilot::new(&lock);
    c.initialize().await;
    let _events = c.stream().await;
    let st = b
        .wait_status("the copilot session on its editor", |st| {
            st["sessions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["door"] == "copilot" && s["editor"] == id.as_str())
        })
        .await;
    let sid = st["sessions"]
        .as_array()
        .and_then(|l| l.iter().find(|s| s["door"] == "copilot"))
        .and_then(|s| s["id"].as_u64())
        .expect("the session's id");

    let json: Value = serde_json::from_str(&cli(&root, &["status", "--json"]).await)
        .expect("status --json prints JSON");
    assert_eq!(
        json["copilot_lockfiles"],
        json!([{"path": path, "editor": id, "folders": ["/c/st"], "subfolders": [], "sessions": [sid]}]),
        "{json:#}"
    );
    let text = cli(&root, &["status"]).await;
    let door = format!(
        "Copilot CLI sees these editors through the copilot door's lockfiles:\n  {id} → {}\n    folders /c/st\n    Copilot CLI session {sid}\n",
        path.display()
    );
    assert!(text.contains(&door), "{text}");
    assert!(
        text.contains(&format!("└ session {sid} · copilot · ")),
        "the session under its editor, with its door: {text}"
    );

    // A lockfile a killed broker left (ours by marker, its pid dead).
    let stale = copilot_dir(&b).join("0e0e0e0e-0000-4000-8000-000000000000.lock");
    let dead =
        json!({"pid": u32::MAX - 1, "piIdeBroker": {"pid": u32::MAX - 1, "editor": "gone-1"}});
    std::fs::write(&stale, dead.to_string()).expect("write the stale lockfile");
    let (_, report) = crate::doctor::doctor(&root, "/c/st", &copilot_section(&root)).await;
    let door = crate::doctor::check(&report, "copilot");
    let said = door["message"].as_str().unwrap_or_default();
    assert!(
        said.contains(&copilot_dir(&b).display().to_string())
            && said.contains("holds 2 lockfiles of the copilot door")
            && said.contains(
                "the daemon publishes 1 (one per editor), 1 Copilot CLI session connected"
            ),
        "{report:#}"
    );
    let warned = crate::doctor::check(&report, &stale.display().to_string());
    assert_eq!(warned["level"], "warn", "{warned}");
    assert!(
        warned["fix"]
            .as_str()
            .is_some_and(|f| f.contains("start the broker")),
        "{warned}"
    );
    b.stop().await;
}
