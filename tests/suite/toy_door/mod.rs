//! A door plugged in from outside the crate (`frontdoor::plugin`): this folder and one `mod`
//! line in the suite's main.rs are all it takes. Its agents are sessions like any other: an
//! agent in the editor's folder reaches that editor, one elsewhere reaches none, and `status`
//! names the door.

mod door;

use crate::common::broker::test_config;
use door::LineDoor;
use pi_ide_broker::testkit::fake_editor::{FakeEditor, Options};
use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// An agent of the line door.
struct Agent {
    lines: Lines<BufReader<OwnedReadHalf>>,
    wr: OwnedWriteHalf,
}

impl Agent {
    async fn connect(port: u16, cwd: &str) -> Agent {
        let stream = within("connect", TcpStream::connect(("127.0.0.1", port)))
            .await
            .expect("the line door accepts");
        let (rd, wr) = stream.into_split();
        let mut a = Agent {
            lines: BufReader::new(rd).lines(),
            wr,
        };
        a.send(json!({ "cwd": cwd })).await;
        a
    }

    async fn send(&mut self, v: Value) {
        let line = format!("{v}\n");
        self.wr.write_all(line.as_bytes()).await.expect("write");
    }

    /// Sends a request and waits for the answer with its id (notifications are passed over).
    async fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        within(method, async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .expect("read")
                    .expect("an answer");
                let v: Value = serde_json::from_str(&line).expect("JSON");
                if v["id"] == json!(id) {
                    return v;
                }
            }
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_door_plugged_in_from_outside_routes_its_agents_like_any_other() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut config = test_config(root.path());
    config.edit_section(|s: &mut pi_ide_broker::frontdoor::gemini::GeminiConfig| s.enabled = false);
    config.edit_section(|s: &mut pi_ide_broker::frontdoor::codex::CodexConfig| s.enabled = false);
    let pi_dir = root.path().join("pi-ide");
    std::fs::create_dir_all(&pi_dir).expect("mkdir");
    let folder = root.path().join("proj");
    std::fs::create_dir_all(&folder).expect("mkdir");
    let folder = folder.display().to_string();

    let (line, port) = LineDoor::new();
    let doors: Vec<Arc<dyn pi_ide_broker::frontdoor::plugin::AgentDoor>> = vec![Arc::new(line)];
    let shutdown = CancellationToken::new();
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let stop = shutdown.clone();
    let daemon = tokio::spawn(async move {
        pi_ide_broker::broker::serve_with(config, &doors, stop, move |_, handle| {
            let _ = ready_tx.send(handle);
        })
        .await
    });
    let handle = within("daemon ready", ready).await.expect("daemon started");
    let port = within("the line door's port", port)
        .await
        .expect("the door listens");
    let _editor = FakeEditor::start_in(&pi_dir, Options::pi(&[&folder]))
        .await
        .expect("fake editor");
    let reg = handle.registry();
    let mut changes = reg.subscribe_changes();
    within("the editor ready", async {
        loop {
            let st = serde_json::to_value(pi_ide_broker::frontdoor::status::status(reg))
                .unwrap_or_default();
            if st["editors"][0]["state"] == "ready" {
                return;
            }
            let _ = changes.changed().await;
        }
    })
    .await;

    // An agent in the editor's folder: its call is the editor's to answer.
    let mut inside = Agent::connect(port, &format!("{folder}/src")).await;
    let init = json!({"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "line", "version": "0"}});
    assert!(inside.call(1, "initialize", init.clone()).await["result"].is_object());
    let echo = inside
        .call(
            2,
            "tools/call",
            json!({"name": "echo", "arguments": {"x": "through the line door"}}),
        )
        .await;
    assert!(
        echo["result"].to_string().contains("through the line door"),
        "the editor's echo, routed by the agent's cwd: {echo}"
    );

    // `status` names the door, as it names the built-in ones.
    let st =
        serde_json::to_value(pi_ide_broker::frontdoor::status::status(reg)).unwrap_or_default();
    let doors: Vec<&str> = st["sessions"]
        .as_array()
        .map(|s| s.iter().filter_map(|s| s["door"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(doors, ["line"], "{st}");

    // An agent outside every editor's folder reaches no editor: a JSON-RPC error, not a hang.
    let mut outside = Agent::connect(port, "/nowhere/at/all").await;
    outside.call(1, "initialize", init).await;
    let refused = outside
        .call(
            2,
            "tools/call",
            json!({"name": "echo", "arguments": {"x": "lost"}}),
        )
        .await;
    assert!(
        refused["error"].is_object() || refused["result"]["isError"] == true,
        "no editor for that folder: {refused}"
    );

    shutdown.cancel();
    let served = within("daemon stop", daemon).await.expect("joined");
    assert!(served.is_ok(), "{served:?}");
}
