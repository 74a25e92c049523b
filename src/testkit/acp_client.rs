//! A fake ACP client (an editor such as Zed) that spawns an ACP agent and drives it on stdio.
//!
//! Written from the Agent Client Protocol v1 spec (agentclientprotocol/agent-client-protocol,
//! `docs/protocol/*.mdx`: initialization, session-setup, prompt-turn, tool-calls,
//! file-system): newline-delimited JSON-RPC 2.0, `initialize` with `protocolVersion: 1` and
//! the client's `fs` capabilities, `session/new {cwd, mcpServers}`, `session/prompt` answered
//! with `{stopReason}` after streamed `session/update`s, `session/cancel` as a notification,
//! and `session/request_permission` requests it answers `selected` or `cancelled`. Like
//! CodeCompanion, it records every update, in turn or not, so a test can tell which came
//! while a prompt was open.

use serde_json::{json, Value};
use std::collections::{HashSet, VecDeque};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A message the agent sent, as the client saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The message.
    pub msg: Value,
    /// A prompt of this client was open when it came.
    pub in_turn: bool,
    /// When its line was read from the agent's stdout (a task reads it as it comes).
    pub at: Instant,
}

/// The client, with the agent it spawned.
pub struct AcpClient {
    child: Child,
    stdin: ChildStdin,
    /// The agent's stdout lines, each stamped when it was read.
    stdout: mpsc::UnboundedReceiver<(String, Instant)>,
    next_id: u64,
    /// Prompts sent and not yet answered (their ids).
    open_prompts: Vec<Value>,
    /// The ids of the requests the agent answered: a second answer to one is a bug of the
    /// agent (a turn answered twice), and fails the test where it is read.
    answered: HashSet<String>,
    /// Messages read but not yet taken by a wait.
    backlog: VecDeque<Seen>,
    /// Every `session/update` seen, in order.
    pub updates: Vec<Seen>,
}

impl AcpClient {
    /// Spawns the agent `cmd` runs (e.g. `pi-ide-broker acp`), on piped stdio.
    pub fn spawn(cmd: &mut Command) -> AcpClient {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the ACP agent: {e}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let (tx, stdout) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send((line, Instant::now())).is_err() {
                    break;
                }
            }
        });
        AcpClient {
            child,
            stdin,
            stdout,
            next_id: 0,
            open_prompts: Vec::new(),
            answered: HashSet::new(),
            backlog: VecDeque::new(),
            updates: Vec::new(),
        }
    }

    /// Writes one message.
    pub async fn send(&mut self, msg: Value) {
        let mut line = msg.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write to the agent");
        self.stdin.flush().await.expect("flush to the agent");
    }

    /// Sends a request; returns its id.
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = json!(self.next_id);
        if method == "session/prompt" {
            self.open_prompts.push(id.clone());
        }
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    /// The next message from the agent (bounded wait), `None` at its end.
    async fn read(&mut self) -> Option<Seen> {
        if let Some(s) = self.backlog.pop_front() {
            return Some(s);
        }
        let (line, at) = super::within("a line from the ACP agent", self.stdout.recv()).await?;
        let msg: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the agent wrote a line that is not JSON ({e}): {line}"));
        let in_turn = !self.open_prompts.is_empty();
        if msg.get("id").is_some() && msg.get("method").is_none() {
            let id = &msg["id"];
            assert!(
                self.answered.insert(id.to_string()),
                "the ACP agent answered request {id} a second time: {line}"
            );
            self.open_prompts.retain(|p| p != id);
        }
        let seen = Seen { msg, in_turn, at };
        if seen.msg["method"] == "session/update" {
            self.updates.push(seen.clone());
        }
        Some(seen)
    }

    /// Reads until a message matches `pred` (bounded); the others wait in order for later
    /// waits, updates are recorded either way.
    pub async fn until(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Seen {
        let mut skipped = Vec::new();
        let found = loop {
            match self.read().await {
                Some(s) if pred(&s.msg) => break s,
                Some(s) => skipped.push(s),
                None => panic!("the ACP agent ended before {what}; skipped: {skipped:?}"),
            }
        };
        for s in skipped.into_iter().rev() {
            self.backlog.push_front(s);
        }
        found
    }

    /// The answer to request `id`.
    pub async fn answer(&mut self, id: &Value) -> Value {
        let id = id.clone();
        self.until(&format!("the answer to {id}"), move |m| {
            m.get("method").is_none() && m["id"] == id
        })
        .await
        .msg
    }

    /// `initialize` with these `fs` capabilities; returns the result.
    pub async fn initialize(&mut self, read: bool, write: bool) -> Value {
        let id = self
            .request(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": read, "writeTextFile": write}, "terminal": false}, "clientInfo": {"name": "fake-acp-client", "version": "1"}}),
            )
            .await;
        self.answer(&id).await
    }

    /// `session/new {cwd}`: the answer (a `sessionId`, or an error).
    pub async fn new_session(&mut self, cwd: &str) -> Value {
        let id = self
            .request("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        self.answer(&id).await
    }

    /// `session/prompt` with one text block; returns the request id (answered at turn end).
    pub async fn prompt(&mut self, session: &str, text: &str) -> Value {
        self.request(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        )
        .await
    }

    /// `session/cancel`.
    pub async fn cancel(&mut self, session: &str) {
        self.send(
            json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}),
        )
        .await;
    }

    /// `$/cancel_request` for a request of this client (ACP v1's per-request cancel).
    pub async fn cancel_request(&mut self, request: &Value) {
        self.send(json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request}}))
            .await;
    }

    /// `session/close`; returns the request id.
    pub async fn close_session(&mut self, session: &str) -> Value {
        self.request("session/close", json!({"sessionId": session}))
            .await
    }

    /// Reads what the agent wrote until it answers request `id`, the answer included, and
    /// returns those messages; they stay for later waits. Something the agent should not
    /// have said by then (a second answer to a request, a line it should not write) is in it.
    pub async fn through_answer(&mut self, id: &Value) -> Vec<Value> {
        let mut seen = Vec::new();
        let found = loop {
            match self.read().await {
                Some(s) if s.msg.get("method").is_none() && s.msg["id"] == *id => break s,
                Some(s) => seen.push(s),
                None => panic!("the ACP agent ended before it answered {id}"),
            }
        };
        seen.push(found);
        let msgs = seen.iter().map(|s| s.msg.clone()).collect();
        for s in seen.into_iter().rev() {
            self.backlog.push_front(s);
        }
        msgs
    }

    /// The next `session/request_permission`.
    pub async fn permission(&mut self) -> Seen {
        self.until("a permission request", |m| {
            m["method"] == "session/request_permission"
        })
        .await
    }

    /// Answers a permission request with an option (`Some(id)`) or as cancelled (`None`).
    pub async fn decide(&mut self, request: &Value, option: Option<&str>) {
        let outcome = match option {
            Some(o) => json!({"outcome": "selected", "optionId": o}),
            None => json!({"outcome": "cancelled"}),
        };
        self.send(json!({"jsonrpc": "2.0", "id": request["id"], "result": {"outcome": outcome}}))
            .await;
    }

    /// Waits for a `session/update` whose `update` matches `pred`.
    pub async fn update(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Seen {
        self.until(what, move |m| {
            m["method"] == "session/update" && pred(&m["params"]["update"])
        })
        .await
    }

    /// The agent message text streamed so far (every `agent_message_chunk`, joined).
    pub fn agent_text(&self) -> String {
        self.updates
            .iter()
            .filter(|s| s.msg["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|s| s.msg["params"]["update"]["content"]["text"].as_str())
            .collect()
    }

    /// Reads until the agent message text streamed so far contains `needle` (bounded); other
    /// messages wait for later waits.
    pub async fn until_agent_text(&mut self, needle: &str) {
        let mut skipped = Vec::new();
        while !self.agent_text().contains(needle) {
            match self.read().await {
                Some(s) if s.msg["method"] == "session/update" => {}
                Some(s) => skipped.push(s),
                None => panic!("the ACP agent ended before it streamed {needle:?}"),
            }
        }
        for s in skipped.into_iter().rev() {
            self.backlog.push_front(s);
        }
    }

    /// Ends the agent: stdin closed, then its exit awaited (bounded).
    pub async fn close(mut self) {
        drop(self.stdin);
        let _ = super::within("the ACP agent's exit", self.child.wait()).await;
    }
}
