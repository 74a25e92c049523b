//! Issue: the stdio door — `pi-ide-broker mcp` driven through real pipes of a child process.

use crate::common::process::{broker_bin, isolate, write_config};
use crate::common::*;
use pi_ide_broker::testkit::fake_editor::next_tool_call;
use pi_ide_broker::testkit::text;
use pi_ide_broker::testkit::{eventually, within};
use serde_json::{json, Value};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// `pi-ide-broker mcp` as a child, driven line by line (also the upgrade suite's).
pub(crate) struct Mcp {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Lines<BufReader<ChildStdout>>,
    /// Calls made with `call`, for their ids.
    calls: u64,
}

impl Mcp {
    pub(crate) fn spawn(cmd: &mut Command) -> Mcp {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn mcp");
        crate::common::process::capture_stderr(&mut child, "mcp");
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Mcp {
            child,
            stdin,
            out,
            calls: 0,
        }
    }

    pub(crate) async fn send(&mut self, v: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        within("mcp write", stdin.write_all(format!("{v}\n").as_bytes()))
            .await
            .expect("write");
    }

    async fn next(&mut self) -> Value {
        let line = within("mcp line", self.out.next_line())
            .await
            .expect("read")
            .expect("a line before EOF");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Calls `tool` with `args` (an id of its own) and returns the answer.
    pub(crate) async fn call(&mut self, tool: &str, args: Value) -> Value {
        self.calls += 1;
        let id = json!(1_000_000 + self.calls);
        self.request(id, "tools/call", json!({"name": tool, "arguments": args}))
            .await
    }

    pub(crate) async fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let v = self.next().await;
            if v["id"] == id && v.get("method").is_none() {
                return v;
            }
        }
    }
}

/// Runs `cmd` to its end, asserts that it failed, and returns its stderr.
async fn stderr_of_failure(what: &str, cmd: &mut Command) -> String {
    let out = within(what, cmd.output()).await.unwrap();
    assert!(!out.status.success(), "{what} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn tool_names(v: &Value) -> Vec<String> {
    v["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn an_mcp_client_through_real_pipes() {
    let b = TestBroker::start().await;
    let (fe, id) = b.editor(&["/srv/app"]).await;
    fe.select("/srv/app/main.rs", "fn main() {}", 9);
    // The selection must have reached the broker before the client asks for it.
    let reg = b.handle.registry().clone();
    eventually("selection cached", || {
        reg.editor(&id).and_then(|e| e.last_selection())
    })
    .await;
    let mut ev = fe.events();
    let mut cmd = Command::new(broker_bin());
    cmd.args([
        "mcp",
        "--cwd",
        "/srv/app/src",
        "--session",
        "claude-1",
        "--no-spawn",
    ])
    .env("PI_IDE_BROKER_SOCKET", &b.socket);
    isolate(&mut cmd, b.dir.path());
    let mut m = Mcp::spawn(&mut cmd);
    let init = m.request(json!(1), "initialize", json!({"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}})).await;
    assert_eq!(init["result"]["serverInfo"]["name"], "pi-ide-broker");
    assert_eq!(init["result"]["protocolVersion"], "2025-03-26");
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let tools = tool_names(&m.request(json!(2), "tools/list", json!({})).await);
    for t in [
        "openDiff",
        "getDiagnostics",
        "list_editors",
        "editor_context",
    ] {
        assert!(tools.contains(&t.to_string()), "{t} missing from {tools:?}");
    }
    let ctx = m.call("editor_context", json!({})).await;
    let context = text(&ctx).to_string();
    assert!(
        context.contains("Editor: Neovim")
            && context.contains("File: /srv/app/main.rs")
            && context.contains("line 10")
            && context.contains("fn main() {}"),
        "{context}"
    );
    let list = m.call("list_editors", json!({})).await;
    let listed: Value = serde_json::from_str(text(&list)).unwrap();
    assert_eq!(listed["editors"][0]["workspace_folders"][0], "/srv/app");
    // A diff, accepted.
    m.send(json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "openDiff", "arguments": {"old_file_path": "/srv/app/a", "new_file_path": "/srv/app/a", "new_file_contents": "A", "tab_name": "t-accept"}}})).await;
    eventually("diff pending", || fe.pending_diffs().first().cloned()).await;
    assert!(fe.accept_diff("t-accept", "A\n"));
    let ans = loop {
        let v = m.next().await;
        if v["id"] == 5 {
            break v;
        }
    };
    assert_eq!(text(&ans), "FILE_SAVED");
    assert_eq!(ans["result"]["content"][1]["text"], "A\n");
    assert_eq!(b.status().await["sessions"][0]["door"], "stdio");
    // A pending diff, then EOF: exit 0 and the editor gets close_tab for it.
    m.send(json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "openDiff", "arguments": {"old_file_path": "/srv/app/b", "new_file_path": "/srv/app/b", "new_file_contents": "B", "tab_name": "t-left"}}})).await;
    eventually("second diff", || fe.pending_diffs().first().cloned()).await;
    drop(m.stdin.take());
    let status = within("mcp exit", m.child.wait()).await.unwrap();
    assert!(status.success(), "{status:?}");
    let args = next_tool_call(&mut ev, "close_tab").await;
    assert_eq!(args["tab_name"], "t-left");
    b.stop().await;
}

#[tokio::test]
async fn without_an_editor_it_still_answers_and_says_why() {
    let b = TestBroker::start().await;
    let mut cmd = Command::new(broker_bin());
    cmd.args(["mcp", "--cwd", "/nowhere", "--no-spawn"])
        .env("PI_IDE_BROKER_SOCKET", &b.socket);
    isolate(&mut cmd, b.dir.path());
    let mut m = Mcp::spawn(&mut cmd);
    m.request(json!(1), "initialize", json!({})).await;
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let tools = tool_names(&m.request(json!(2), "tools/list", json!({})).await);
    assert_eq!(tools, vec!["list_editors", "editor_context"]);
    let ctx = m.call("editor_context", json!({})).await;
    assert!(text(&ctx).contains("No editor is attached"));
    // An editor appears: the client is told to list tools again.
    let (_fe, _) = b.editor(&["/nowhere"]).await;
    loop {
        let v = m.next().await;
        if v["method"] == "notifications/tools/list_changed" {
            break;
        }
    }
    let tools = tool_names(&m.request(json!(4), "tools/list", json!({})).await);
    assert!(tools.contains(&"openDiff".to_string()));
    b.stop().await;
}

#[tokio::test]
async fn no_daemon_and_no_spawn_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "");
    let err = stderr_of_failure(
        "mcp",
        Command::new(broker_bin())
            .args(["--config", cfg.to_str().unwrap(), "mcp", "--no-spawn"])
            .env_remove("PI_IDE_BROKER_SOCKET")
            .stdin(Stdio::null()),
    )
    .await;
    assert!(
        err.contains("cannot reach pi-ide-broker") && err.contains("pi-ide-broker daemon"),
        "{err}"
    );
}

#[tokio::test]
async fn two_clients_starting_at_once_share_one_autostarted_daemon() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("pi-ide")).unwrap();
    let cfg = write_config(dir.path(), "");
    // The daemon the clients start is no child of ours: killed at the end, passed or failed.
    let _reaper = crate::common::process::DaemonReaper(dir.path().join("state"));
    let spawn = || {
        let mut cmd = Command::new(broker_bin());
        cmd.args(["--config", cfg.to_str().unwrap(), "mcp", "--cwd", "/x"])
            .env_remove("PI_IDE_BROKER_SOCKET")
            .env_remove("PI_IDE_BROKER_NO_SPAWN");
        isolate(&mut cmd, dir.path());
        Mcp::spawn(&mut cmd)
    };
    let (mut a, mut b) = (spawn(), spawn());
    let (ra, rb) = tokio::join!(
        a.request(json!(1), "tools/list", json!({})),
        b.request(json!(1), "tools/list", json!({}))
    );
    assert!(ra.get("result").is_some() && rb.get("result").is_some());
    let socket = dir.path().join("run/sock");
    let st = within(
        "status",
        pi_ide_broker::frontdoor::client::get_json(&socket, "/v1/status"),
    )
    .await
    .unwrap();
    assert_eq!(
        st["sessions"].as_array().unwrap().len(),
        2,
        "both clients on the same daemon"
    );
    let pid = st["broker"]["pid"].as_u64().unwrap() as i32;
    // Exactly one daemon holds the claim; the log says a second start (if any) was refused.
    drop((a, b));
    let p = rustix::process::Pid::from_raw(pid).unwrap();
    rustix::process::kill_process(p, rustix::process::Signal::TERM).unwrap();
    eventually("daemon exit", || (!socket.exists()).then_some(())).await;
    let log = std::fs::read_to_string(dir.path().join("state/daemon.log")).unwrap_or_default();
    assert_eq!(
        log.matches("pi-ide-broker ready").count(),
        1,
        "one daemon became ready:\n{log}"
    );
}

/// MCP lifecycle on stdio: before the client's `notifications/initialized`, nothing but
/// answers reaches stdout; the `list_changed` of an editor attached meanwhile follows it.
#[tokio::test]
async fn nothing_but_answers_before_the_client_is_initialized() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/early"]).await;
    let mut cmd = Command::new(broker_bin());
    cmd.args(["mcp", "--cwd", "/early", "--no-spawn"])
        .env("PI_IDE_BROKER_SOCKET", &b.socket);
    isolate(&mut cmd, b.dir.path());
    let mut m = Mcp::spawn(&mut cmd);
    m.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
        .await;
    let init = m.next().await;
    assert!(init["id"] == 1 && init.get("result").is_some(), "{init}");
    // The session is attached by now (the broker saw the stdio door's own initialize).
    b.wait_status("the stdio session attached", |st| {
        st["sessions"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["door"] == "stdio" && s["editor"].is_string())
        })
    })
    .await;
    // A ping answered now proves nothing else was written before it.
    m.send(json!({"jsonrpc": "2.0", "id": "p", "method": "ping", "params": {}}))
        .await;
    let pong = m.next().await;
    assert_eq!(
        pong["id"], "p",
        "nothing may come before this answer: {pong}"
    );
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let note = m.next().await;
    assert_eq!(note["method"], "notifications/tools/list_changed", "{note}");
    b.stop().await;
}

/// `--no-spawn` with no daemon: one clear line on stderr at once, and every request answered
/// with a JSON-RPC error that says why (not an empty tool list).
#[tokio::test]
async fn no_daemon_and_no_spawn_answers_every_request_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "");
    let mut cmd = Command::new(broker_bin());
    cmd.args(["--config", cfg.to_str().unwrap(), "mcp", "--no-spawn"])
        .env_remove("PI_IDE_BROKER_SOCKET");
    let mut m = Mcp::spawn(&mut cmd);
    for (id, method) in [(1, "initialize"), (2, "tools/list")] {
        m.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {}}))
            .await;
        let v = m.next().await;
        assert_eq!(v["id"], id, "{v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("cannot reach pi-ide-broker"), "{v}");
    }
    drop(m.stdin.take());
    let status = within("mcp exit", m.child.wait()).await.unwrap();
    assert!(!status.success());
}

/// A client that clears the environment (Codex does: no XDG_RUNTIME_DIR) still reaches the
/// daemon running on the default socket, through the daemon's record in its state dir; and a
/// second daemon for the same user refuses to start, whatever socket it would use.
#[tokio::test]
async fn a_stripped_environment_finds_the_running_daemon_and_never_starts_a_second() {
    use crate::common::process::{start_editor, Proc};
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let home = root.join("home");
    let runtime = root.join("xdg");
    std::fs::create_dir_all(home.join(".pi/ide")).unwrap();
    std::fs::create_dir_all(&runtime).unwrap();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut daemon_cmd = Command::new(broker_bin());
    daemon_cmd
        .arg("daemon")
        .env_clear()
        .env("HOME", &home)
        .env("PATH", &path)
        .env("XDG_RUNTIME_DIR", &runtime)
        // Its gemini door's discovery files go under here, not the machine's /tmp.
        .env("TMPDIR", &root)
        .env("RUST_LOG", "info");
    let mut daemon = Proc::spawn(&mut daemon_cmd);
    daemon.wait_line(&["pi-ide-broker ready"]).await;
    let (_ed, port) = start_editor(&home.join(".pi/ide"), &["--folder", "/envless"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={port}")])
        .await;

    let mut cmd = Command::new(broker_bin());
    cmd.args(["mcp", "--cwd", "/envless", "--no-spawn"])
        .env_clear()
        .env("HOME", &home)
        .env("PATH", &path);
    let mut m = Mcp::spawn(&mut cmd);
    let init = m.request(json!(1), "initialize", json!({})).await;
    assert!(init.get("result").is_some(), "{init}");
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let tools = tool_names(&m.request(json!(2), "tools/list", json!({})).await);
    assert!(tools.contains(&"openDiff".to_string()), "{tools:?}");

    // Another daemon of this user, started with yet another environment, does not start.
    let other_runtime = root.join("xdg2");
    std::fs::create_dir_all(&other_runtime).unwrap();
    let err = stderr_of_failure(
        "second daemon",
        Command::new(broker_bin())
            .arg("daemon")
            .env_clear()
            .env("HOME", &home)
            .env("PATH", &path)
            .env("XDG_RUNTIME_DIR", &other_runtime),
    )
    .await;
    assert!(
        err.contains("already running") && err.contains(&runtime.display().to_string()),
        "{err}"
    );
    assert!(!other_runtime.join("pi-ide-broker/sock").exists());
    drop(m);
    daemon.signal(rustix::process::Signal::TERM);
    assert!(daemon.wait_exit().await.success());
    assert!(!home
        .join(".local/state/pi-ide-broker/running.json")
        .exists());
}

fn vm_hwm_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("/proc/PID/status (Linux; the test is ignored elsewhere)")
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// 400 MiB on stdin without a newline: discarded as it arrives (peak RSS stays far below the
/// input), answered with -32600 once the line ends, and the next request works.
#[tokio::test]
#[cfg_attr(not(target_os = "linux"), ignore = "reads /proc")]
async fn an_endless_line_on_stdin_is_discarded_with_bounded_memory() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/long"]).await;
    let cfg = b.dir.path().join("cap.toml");
    std::fs::write(&cfg, "max_frame_bytes = 16777216\n").unwrap();
    let mut cmd = Command::new(broker_bin());
    cmd.args([
        "--config",
        cfg.to_str().unwrap(),
        "mcp",
        "--cwd",
        "/long",
        "--no-spawn",
    ])
    .env("PI_IDE_BROKER_SOCKET", &b.socket);
    let mut m = Mcp::spawn(&mut cmd);
    let pid = m.child.id().expect("pid");
    m.request(json!(1), "initialize", json!({})).await;
    let chunk = vec![b'a'; 1 << 20];
    {
        let stdin = m.stdin.as_mut().expect("stdin");
        for _ in 0..400 {
            within("write 1 MiB", stdin.write_all(&chunk))
                .await
                .unwrap();
        }
        within("newline", stdin.write_all(b"\n")).await.unwrap();
    }
    let err = m.next().await;
    assert_eq!(err["error"]["code"], -32600, "{err}");
    assert!(err["id"].is_null(), "{err}");
    let peak_mib = vm_hwm_kb(pid) / 1024;
    eprintln!("mcp peak RSS after 400 MiB without a newline: {peak_mib} MiB");
    // The line buffer stops at the 16 MiB cap (was: the next power of two, 74 MiB peak).
    assert!(peak_mib <= 48, "peak RSS {peak_mib} MiB");
    let tools = tool_names(&m.request(json!(2), "tools/list", json!({})).await);
    assert!(tools.contains(&"openDiff".to_string()), "{tools:?}");
    b.stop().await;
}

/// The daemon restarts under a running `mcp` (an upgrade, `systemctl --user restart`): the
/// diff in flight is answered DIFF_REJECTED with its tab, a request sent while the broker is
/// away waits and is answered once it is back, and stdout carries nothing but JSON-RPC.
#[tokio::test]
async fn the_stdio_door_survives_a_broker_restart() {
    use crate::common::process::{start_daemon, start_editor};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon(&cfg).await;
    let (_ed, port) = start_editor(&root.join("pi-ide"), &["--folder", "/restart"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={port}")])
        .await;
    let mut cmd = Command::new(broker_bin());
    cmd.args([
        "--config",
        cfg.to_str().unwrap(),
        "mcp",
        "--cwd",
        "/restart",
        "--no-spawn",
    ])
    .env_remove("PI_IDE_BROKER_SOCKET");
    let mut m = Mcp::spawn(&mut cmd);
    m.request(json!(1), "initialize", json!({})).await;
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let echo = |id: &str| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "echo", "arguments": {"who": id}}});
    m.send(echo("before")).await;
    let r = answer_to(&mut m, "before").await;
    assert!(text(&r).contains("before"), "{r}");
    m.send(json!({"jsonrpc": "2.0", "id": "diff", "method": "tools/call", "params": {"name": "openDiff", "arguments": pi_ide_broker::testkit::diff_args("/restart/f", "x", "r-tab")}}))
        .await;
    let sock = root.join("run/sock");
    within("the diff in flight", async {
        loop {
            if let Ok(st) = pi_ide_broker::frontdoor::client::get_json(&sock, "/v1/status").await {
                if st["sessions"][0]["in_flight"]
                    .as_array()
                    .is_some_and(|f| f.len() == 1)
                {
                    return;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    daemon.signal(rustix::process::Signal::TERM);
    assert!(daemon.wait_exit().await.success());
    let d = answer_to(&mut m, "diff").await;
    assert_eq!(text(&d), "DIFF_REJECTED", "{d}");
    assert_eq!(d["result"]["content"][1]["text"], "r-tab", "{d}");
    // Sent while no broker runs: it waits for the next one.
    m.send(echo("during")).await;
    let mut daemon = start_daemon(&cfg).await;
    let r = answer_to(&mut m, "during").await;
    assert!(text(&r).contains("during"), "{r}");
    m.send(echo("after")).await;
    let r = answer_to(&mut m, "after").await;
    assert!(r.get("result").is_some(), "{r}");
    daemon.signal(rustix::process::Signal::TERM);
    assert!(daemon.wait_exit().await.success());
}

/// Reads stdout up to the answer to `id`; every line on the way must be JSON-RPC.
async fn answer_to(m: &mut Mcp, id: &str) -> Value {
    loop {
        let v = m.next().await; // panics on a line that is not JSON
        assert_eq!(v["jsonrpc"], "2.0", "not JSON-RPC: {v}");
        if v["id"] == id {
            return v;
        }
    }
}

/// MCP 2026-07-28 through real pipes, beside the 2025 era on the same stream (issue 54):
/// `server/discover` answered by the broker (never the editor), stateless `tools/list` and
/// `tools/call` with no `initialize` answered with `resultType` (a list with its cache
/// hints), a long diff's progress reaching a client that never initialized, an unknown
/// version an error that names the versions (not -32601), the removed `ping` refused in the
/// modern era and answered in the legacy one.
#[tokio::test]
async fn a_stateless_2026_client_and_a_2025_handshake_share_the_door() {
    use pi_ide_broker::protocol::era;
    let b = TestBroker::start_with(|c| c.timeouts.progress_ms = 100).await;
    let (fe, _) = b.editor(&["/srv/modern"]).await;
    let mut ev = fe.events();
    let mut cmd = Command::new(broker_bin());
    cmd.args(["mcp", "--cwd", "/srv/modern", "--no-spawn"])
        .env("PI_IDE_BROKER_SOCKET", &b.socket);
    isolate(&mut cmd, b.dir.path());
    let mut m = Mcp::spawn(&mut cmd);
    let meta = json!({
        era::VERSION_KEY: era::MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "modern-test", "version": "1"},
    });
    let d = m
        .request(json!("d"), "server/discover", json!({"_meta": meta}))
        .await;
    let r = &d["result"];
    assert_eq!(r["resultType"], "complete", "{d}");
    let versions = r["supportedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        versions.contains(&json!("2026-07-28")) && versions.contains(&json!("2025-11-25")),
        "{d}"
    );
    assert_eq!(r["serverInfo"]["name"], "pi-ide-broker");
    assert!(r["capabilities"]["tools"].is_object(), "{d}");
    // No initialize: a tools/list and a tools/call, each saying its era.
    let list = m
        .request(json!(1), "tools/list", json!({"_meta": meta}))
        .await;
    assert_eq!(list["result"]["resultType"], "complete", "{list}");
    assert!(
        list["result"]["ttlMs"].is_u64() && list["result"]["cacheScope"] == "private",
        "{list}"
    );
    assert!(
        tool_names(&list).contains(&"getDiagnostics".to_string()),
        "{list}"
    );
    let diag = m
        .request(
            json!(2),
            "tools/call",
            json!({"name": "getDiagnostics", "arguments": {}, "_meta": meta}),
        )
        .await;
    assert_eq!(diag["result"]["resultType"], "complete", "{diag}");
    assert!(diag["result"]["content"].is_array(), "{diag}");
    let own = m
        .request(
            json!(3),
            "tools/call",
            json!({"name": "list_editors", "arguments": {}, "_meta": meta}),
        )
        .await;
    assert_eq!(own["result"]["resultType"], "complete", "{own}");
    // The editor never heard of server/discover.
    let mut editor_saw = Vec::new();
    while let Ok(e) = ev.try_recv() {
        editor_saw.push(format!("{e:?}"));
    }
    assert!(
        !editor_saw.iter().any(|e| e.contains("server/discover")),
        "{editor_saw:?}"
    );
    // A long diff: progress reaches the modern client, which never initialized.
    let mut with_token = meta.clone();
    with_token["progressToken"] = json!("p1");
    m.send(json!({"jsonrpc": "2.0", "id": "diff", "method": "tools/call", "params": {"name": "openDiff", "arguments": pi_ide_broker::testkit::diff_args("/srv/modern/a.rs", "x\n", "m-tab"), "_meta": with_token}}))
        .await;
    let p = loop {
        let v = m.next().await;
        if v["method"] == "notifications/progress" {
            break v;
        }
    };
    assert_eq!(p["params"]["progressToken"], "p1", "{p}");
    assert!(fe.accept_diff("m-tab", "x\n"));
    let ans = answer_to(&mut m, "diff").await;
    assert_eq!(text(&ans), "FILE_SAVED");
    assert_eq!(ans["result"]["resultType"], "complete", "{ans}");
    // An unknown version: the error names the versions.
    let mut future = meta.clone();
    future[era::VERSION_KEY] = json!("2099-01-01");
    let e = m
        .request(json!(4), "tools/list", json!({"_meta": future}))
        .await;
    assert_eq!(e["error"]["code"], era::UNSUPPORTED_VERSION, "{e}");
    assert_eq!(e["error"]["data"]["requested"], "2099-01-01");
    assert!(
        e["error"]["data"]["supported"]
            .as_array()
            .is_some_and(|s| s.contains(&json!("2026-07-28"))),
        "{e}"
    );
    // Removed in the modern era; the legacy one still has it.
    let ping = m.request(json!(5), "ping", json!({"_meta": meta})).await;
    assert_eq!(ping["error"]["code"], -32601, "{ping}");
    // The 2025 handshake on the same stream, unchanged: no resultType there.
    let init = m
        .request(
            json!(6),
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "legacy", "version": "1"}}),
        )
        .await;
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25");
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let legacy = m.request(json!(7), "tools/list", json!({})).await;
    assert!(legacy["result"].get("resultType").is_none(), "{legacy}");
    let pong = m.request(json!(8), "ping", json!({})).await;
    assert!(pong.get("result").is_some(), "{pong}");
    drop(m.stdin.take());
    b.stop().await;
}

/// Runs an SDK client script (`tests/suite/common/<script>`) with `program` against a broker
/// with an editor on `/srv/sdk`; its JSON lines, by step.
async fn sdk_client_steps(program: &std::path::Path, script: &std::path::Path) -> Vec<Value> {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/srv/sdk"]).await;
    let mut cmd = Command::new(program);
    cmd.arg(script)
        .arg(broker_bin())
        .arg("/srv/sdk")
        .arg(&b.socket);
    isolate(&mut cmd, b.dir.path());
    let out = tokio::time::timeout(pi_ide_broker::testkit::START, cmd.output())
        .await
        .expect("the SDK client within 60 s")
        .expect("run the SDK client");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    b.stop().await;
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The step `name` of an SDK client's run.
fn step(steps: &[Value], name: &str) -> Value {
    steps
        .iter()
        .find(|s| s["step"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no {name} step: {steps:?}"))
}

/// The official MCP TypeScript SDK's client (`@modelcontextprotocol/client` 2.4.0,
/// `PI_IDE_BROKER_MCP_TS`, pinned by `.ci/run`) with `versionNegotiation: {mode: 'auto'}`:
/// through the door it negotiates the modern era and lists and calls the editor's tools.
#[tokio::test]
async fn the_official_typescript_sdk_negotiates_the_modern_era_through_the_door() {
    let (Some(sdk), Some(node)) = (
        std::env::var_os("PI_IDE_BROKER_MCP_TS").map(std::path::PathBuf::from),
        std::env::var_os("PI_IDE_BROKER_PI_NODE").map(std::path::PathBuf::from),
    ) else {
        crate::common::cannot_run("the MCP TypeScript SDK: set PI_IDE_BROKER_MCP_TS and PI_IDE_BROKER_PI_NODE (bash .ci/run does)");
        return;
    };
    // The script resolves the SDK from a node_modules beside it.
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("mcp_ts_client.mjs");
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/suite/common/mcp_ts_client.mjs"),
        &script,
    )
    .expect("copy the script");
    std::os::unix::fs::symlink(sdk.join("node_modules"), dir.path().join("node_modules"))
        .expect("link node_modules");
    let steps = sdk_client_steps(&node, &script).await;
    let c = step(&steps, "connected");
    assert_eq!(
        (c["era"].clone(), c["version"].clone()),
        (json!("modern"), json!("2026-07-28")),
        "{c}"
    );
    let names = step(&steps, "tools")["names"].clone();
    assert!(
        names
            .as_array()
            .is_some_and(|l| l.contains(&json!("getDiagnostics"))),
        "{names}"
    );
    assert_eq!(step(&steps, "diagnostics")["is_error"], false);
}

/// The official MCP Python SDK (2.x, `PI_IDE_BROKER_MCP_PYTHON`, installed pinned by
/// `.ci/run`) in its default mode, which probes `server/discover` and adopts 2026-07-28 where
/// the server answers it: through the door it is modern (no `initialize`), lists the editor's
/// tools and the door's own, and calls both (issue 54).
#[tokio::test]
async fn the_official_python_sdk_adopts_the_modern_era_through_the_door() {
    let Some(python) = std::env::var_os("PI_IDE_BROKER_MCP_PYTHON").map(std::path::PathBuf::from)
    else {
        crate::common::cannot_run(
            "the MCP Python SDK: set PI_IDE_BROKER_MCP_PYTHON (bash .ci/run does)",
        );
        return;
    };
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/suite/common/mcp_sdk_client.py");
    let steps = sdk_client_steps(&python, &script).await;
    let c = step(&steps, "connected");
    assert_eq!(c["protocol"], "2026-07-28", "{c}");
    assert_eq!(
        (c["discovered"].clone(), c["initialized"].clone()),
        (json!(true), json!(false)),
        "{c}"
    );
    assert_eq!(c["server"], "pi-ide-broker");
    let tools = step(&steps, "tools")["names"].clone();
    for t in [
        "openDiff",
        "getDiagnostics",
        "list_editors",
        "editor_context",
    ] {
        assert!(
            tools.as_array().is_some_and(|l| l.contains(&json!(t))),
            "{t}: {tools}"
        );
    }
    assert_eq!(step(&steps, "diagnostics")["is_error"], false);
    assert!(
        step(&steps, "context")["text"]
            .as_str()
            .is_some_and(|t| t.contains("Editor: Neovim")),
        "{steps:?}"
    );
}

/// A real Claude Code from `var` (set by `.ci/run`), or `None` after saying it is missing.
pub(crate) fn claude_from(var: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os(var).map(std::path::PathBuf::from);
    if found.is_none() {
        crate::common::cannot_run(&format!("Claude Code: set {var} (bash .ci/run does)"));
    }
    found
}

/// `pi-ide-broker mcp` for `cwd`, as an MCP config's server command in `root`: the door
/// itself, or (with `tee` logs) a wrapper that copies what the client sends into `tee.0` and
/// what the door answers into `tee.1`.
pub(crate) fn door_config(
    root: &std::path::Path,
    cwd: &str,
    tee: Option<(&std::path::Path, &std::path::Path)>,
) -> std::path::PathBuf {
    let args = ["mcp", "--cwd", cwd, "--no-spawn", "--dialect", "claude"];
    let server = match tee {
        None => json!({"command": broker_bin(), "args": args}),
        Some((input, output)) => {
            let door = root.join("door.sh");
            std::fs::write(
                &door,
                format!(
                    "#!/bin/sh\ntee -a '{}' | '{}' {} | tee -a '{}'\n",
                    input.display(),
                    broker_bin().display(),
                    args.join(" "),
                    output.display()
                ),
            )
            .expect("write the door wrapper");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&door, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            json!({"command": door, "args": []})
        }
    };
    let config = root.join("mcp.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {"editor": server}}).to_string(),
    )
    .expect("write the MCP config");
    config
}

/// Claude Code headless (`-p prompt`) in a fresh HOME under `root`, with only the MCP servers
/// of `config`, its model at `127.0.0.1:model_port`, the broker at `socket`; `tools` allowed
/// without asking. Output is the caller's to wire.
pub(crate) fn claude_command(
    claude: &std::path::Path,
    root: &std::path::Path,
    prompt: &str,
    config: &std::path::Path,
    model_port: u16,
    socket: &std::path::Path,
    tools: &[&str],
) -> Command {
    let home = root.join("claude-home");
    std::fs::create_dir_all(&home).expect("mkdir");
    let mut cmd = Command::new(claude);
    cmd.args(["-p", prompt, "--strict-mcp-config", "--mcp-config"])
        .arg(config)
        .current_dir(root)
        .env("HOME", &home)
        .env_remove("CLAUDE_CONFIG_DIR")
        .env("ANTHROPIC_API_KEY", "sk-test-not-a-key")
        .env(
            "ANTHROPIC_BASE_URL",
            format!("http://127.0.0.1:{model_port}"),
        )
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("PI_IDE_BROKER_SOCKET", socket)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if !tools.is_empty() {
        cmd.args(["--output-format", "json", "--allowedTools"])
            .arg(tools.join(","));
    }
    cmd
}

/// The diff open in the fake editor, once there is exactly one (bounded wait).
async fn the_open_diff(fe: &FakeEditor, what: &str) -> String {
    pi_ide_broker::testkit::eventually(what, || {
        let open = fe.pending_diffs();
        (open.len() == 1).then(|| open[0].clone())
    })
    .await
}

/// Claude Code's run to its end: it succeeded, and its stdout.
pub(crate) async fn claude_finished(child: tokio::process::Child) -> String {
    let out =
        pi_ide_broker::testkit::within_start("Claude Code's answer", child.wait_with_output())
            .await
            .expect("Claude Code ran");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The real Claude Code (2.1.332, `PI_IDE_BROKER_CLAUDE`, pinned by `.ci/run`) starting with
/// `pi-ide-broker mcp` as its MCP server: its transcript (what crossed the door, teed) opens
/// with `server/discover` at 2026-07-28, is answered by the broker, and goes on in the modern
/// era: no `initialize` fallback, no -32601 (issue 54). Its model is unreachable on purpose:
/// Claude Code connects its MCP servers at start, before any model call.
#[tokio::test]
async fn claude_code_speaks_the_modern_era_through_the_door_with_no_fallback() {
    let Some(claude) = claude_from("PI_IDE_BROKER_CLAUDE") else {
        return;
    };
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/srv/cc"]).await;
    let root = b.dir.path().to_path_buf();
    let (input, output) = (root.join("door-in.log"), root.join("door-out.log"));
    let config = door_config(&root, "/srv/cc", Some((&input, &output)));
    let (_hold, port) = crate::common::ports::closed_port();
    let mut cmd = claude_command(&claude, &root, "hi", &config, port, &b.socket, &[]);
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = cmd.spawn().expect("start Claude Code");
    // Its tools/list answered (a whole line: tee writes as it reads) is the end of what this
    // test looks at.
    let whole_list = |text: &str| {
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["result"]["tools"].is_array())
    };
    let listed = tokio::time::timeout(pi_ide_broker::testkit::START, async {
        loop {
            if let Some(v) = whole_list(&std::fs::read_to_string(&output).unwrap_or_default()) {
                return v;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("Claude Code listed the door's tools within 60 s");
    let _ = child.kill().await;
    let sent = std::fs::read_to_string(&input).unwrap_or_default();
    let answers = std::fs::read_to_string(&output).unwrap_or_default();
    let first: Value = serde_json::from_str(sent.lines().next().unwrap_or_default()).expect("JSON");
    assert_eq!(first["method"], "server/discover", "{sent}");
    assert_eq!(
        first["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
        "2026-07-28"
    );
    assert!(
        !sent.contains("\"initialize\""),
        "Claude Code fell back:\n{sent}\n{answers}"
    );
    assert!(!answers.contains("-32601"), "{answers}");
    assert_eq!(listed["result"]["resultType"], "complete", "{listed}");
    b.stop().await;
}

/// The real Claude Code (2.1.332) with a model (the fake Messages API) and `pi-ide-broker mcp`
/// in the modern era: its model proposes an edit, Claude Code calls the editor's `openDiff`
/// through the door; the broker restarts while the user reads the diff (the call is answered
/// as not reviewed, and the door redials); the model tries again, the diff reaches the editor
/// through the new broker, the user accepts, and the model is given the accepted text (issue
/// 54: a diff reviewed, and a call after a daemon restart, by the newest client).
#[tokio::test]
async fn claude_code_with_a_model_reviews_a_diff_across_a_broker_restart() {
    use crate::common::fake_anthropic::{FakeAnthropic, Reply};
    let Some(claude) = claude_from("PI_IDE_BROKER_CLAUDE") else {
        return;
    };
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/srv/cc"]).await;
    let root = b.dir.path().to_path_buf();
    let config = door_config(&root, "/srv/cc", None);
    let mut model = FakeAnthropic::start().await;
    let diff = |tab: &str| Reply::Tool {
        name: "mcp__editor__openDiff".into(),
        args: json!({"old_file_path": "/srv/cc/a.txt", "new_file_path": "/srv/cc/a.txt", "new_file_contents": "proposed\n", "tab_name": tab}),
    };
    model.push(diff("first"));
    model.push(diff("second"));
    model.push(Reply::Text("the edit is in".into()));
    let tools = ["mcp__editor__openDiff"];
    let mut cmd = claude_command(
        &claude,
        &root,
        "edit a.txt",
        &config,
        model.port,
        &b.socket,
        &tools,
    );
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start Claude Code");
    let first = the_open_diff(&fe, "the first diff open in the editor").await;
    assert!(first.contains("first"), "{first}");
    let dir = b.stop_keep_dir().await;
    let b = TestBroker::start_in(dir, |_| {}).await;
    let second = the_open_diff(&fe, "the second diff, through the new broker").await;
    assert!(second.contains("second"), "{second}");
    assert!(fe.accept_diff(&second, "accepted by the user\n"));
    let stdout = claude_finished(child).await;
    assert!(stdout.contains("the edit is in"), "{stdout}");
    let results = model.tool_results();
    assert!(
        results.iter().any(|r| r.contains("accepted by the user")),
        "the model never got the accepted text: {results:?}"
    );
    // The first diff, cut by the restart, was never an accepted edit.
    assert!(
        results.first().is_some_and(|r| r.contains("DIFF_REJECTED")),
        "{results:?}"
    );
    b.stop().await;
}

/// A legacy client still passes (issue 54): the real Claude Code 2.1.197
/// (`PI_IDE_BROKER_CLAUDE_LEGACY`, from before MCP 2026-07-28) opens the door with the 2025-era
/// `initialize` handshake, never `server/discover`, and its model's edit is reviewed in the
/// editor and accepted through it.
#[tokio::test]
async fn legacy_claude_code_keeps_the_2025_handshake_and_reviews_a_diff() {
    use crate::common::fake_anthropic::{FakeAnthropic, Reply};
    let Some(claude) = claude_from("PI_IDE_BROKER_CLAUDE_LEGACY") else {
        return;
    };
    let b = TestBroker::start().await;
    let (fe, _) = b.editor(&["/srv/cc"]).await;
    let root = b.dir.path().to_path_buf();
    let (input, output) = (root.join("door-in.log"), root.join("door-out.log"));
    let config = door_config(&root, "/srv/cc", Some((&input, &output)));
    let mut model = FakeAnthropic::start().await;
    model.push(Reply::Tool {
        name: "mcp__editor__openDiff".into(),
        args: json!({"old_file_path": "/srv/cc/a.txt", "new_file_path": "/srv/cc/a.txt", "new_file_contents": "proposed\n", "tab_name": "legacy"}),
    });
    model.push(Reply::Text("the edit is in".into()));
    let tools = ["mcp__editor__openDiff"];
    let mut cmd = claude_command(
        &claude,
        &root,
        "edit a.txt",
        &config,
        model.port,
        &b.socket,
        &tools,
    );
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start Claude Code");
    let tab = the_open_diff(&fe, "the diff open in the editor").await;
    assert!(fe.accept_diff(&tab, "accepted by the user\n"));
    let stdout = claude_finished(child).await;
    assert!(stdout.contains("the edit is in"), "{stdout}");
    let sent = std::fs::read_to_string(&input).unwrap_or_default();
    let first: Value = serde_json::from_str(sent.lines().next().unwrap_or_default()).expect("JSON");
    assert_eq!(first["method"], "initialize", "{sent}");
    assert!(
        first["params"]["protocolVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("2025-")),
        "{first}"
    );
    assert!(!sent.contains("server/discover"), "{sent}");
    // The door answers it in the 2025 era: results as before, without the modern `resultType`.
    let answers = std::fs::read_to_string(&output).unwrap_or_default();
    let results: Vec<Value> = answers
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["result"].is_object())
        .collect();
    assert!(
        results.iter().any(|v| v["result"]["tools"].is_array()),
        "{answers}"
    );
    assert!(
        results
            .iter()
            .all(|v| v["result"].get("resultType").is_none()),
        "a 2025-era client got a modern result: {answers}"
    );
    let accepted = model.received().iter().any(|body| {
        body["messages"]
            .to_string()
            .contains("accepted by the user")
    });
    assert!(accepted, "the model never got the accepted text");
    b.stop().await;
}
