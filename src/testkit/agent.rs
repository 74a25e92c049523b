//! A fake agent client for the native door.
//!
//! Dials the Unix socket, upgrades at `/v1/session`, and speaks JSON-RPC with full control of
//! ids.

use crate::platform::local::Stream;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::path::Path;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// One agent session on the native socket.
pub struct Agent {
    ws: WebSocketStream<Stream>,
    /// Calls made with [`Agent::call`], for their ids.
    calls: u64,
}

impl Agent {
    /// Connects with a query string such as `cwd=/p&session=k`.
    pub async fn connect(socket: &Path, query: &str) -> Result<Agent, String> {
        let mut a = Agent::connect_raw(socket, query).await?;
        // As an MCP client does: the broker holds its notices until this is answered.
        a.send_request(
            json!("agent-init"),
            "initialize",
            json!({"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "test-agent"}}),
        )
        .await;
        // Nothing may come before its answer (the broker holds every notice until then).
        match a.next().await {
            Some(v) if v["id"] == "agent-init" && v.get("result").is_some() => Ok(a),
            other => Err(format!(
                "expected the initialize answer first, got {other:?}"
            )),
        }
    }

    /// Connects without sending `initialize` (a raw client).
    pub async fn connect_raw(socket: &Path, query: &str) -> Result<Agent, String> {
        let stream = crate::platform::local::connect(socket)
            .await
            .map_err(|e| e.to_string())?;
        let url = format!("ws://localhost/v1/session?{query}");
        let (ws, _) = tokio_tungstenite::client_async(url, stream)
            .await
            .map_err(|e| crate::frontdoor::client::upgrade_refusal(&e))?;
        Ok(Agent { ws, calls: 0 })
    }

    /// Connects with `cwd` and optional `session` key.
    pub async fn open(socket: &Path, cwd: &str, key: Option<&str>) -> Agent {
        let mut q = format!("cwd={}", crate::protocol::percent::encode_query(cwd));
        if let Some(k) = key {
            q.push_str(&format!(
                "&session={}",
                crate::protocol::percent::encode_query(k)
            ));
        }
        super::within("agent connect", Agent::connect(socket, &q))
            .await
            .unwrap_or_else(|e| panic!("agent connect: {e}"))
    }

    /// Sends raw text.
    pub async fn send_text(&mut self, text: &str) {
        super::within("agent send", self.ws.send(Message::text(text.to_string())))
            .await
            .unwrap_or_else(|e| panic!("send: {e}"));
    }

    /// Sends several texts in one write (a client that pipelines its requests).
    pub async fn send_texts(&mut self, texts: &[&str]) {
        super::within("agent send", async {
            for t in texts {
                self.ws.feed(Message::text(t.to_string())).await?;
            }
            self.ws.flush().await
        })
        .await
        .unwrap_or_else(|e| panic!("send: {e}"));
    }

    /// Sends a request with this exact id.
    pub async fn send_request(&mut self, id: Value, method: &str, params: Value) {
        self.send_text(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        )
        .await;
    }

    /// Sends a `tools/call`.
    pub async fn call_tool(&mut self, id: Value, tool: &str, args: Value) {
        self.send_request(id, "tools/call", json!({"name": tool, "arguments": args}))
            .await;
    }

    /// The next JSON message (bounded wait); `None` when the connection closed.
    pub async fn next(&mut self) -> Option<Value> {
        super::within("agent receive", async {
            loop {
                match self.ws.next().await {
                    None | Some(Err(_)) => return None,
                    Some(Ok(Message::Text(t))) => return serde_json::from_str(t.as_str()).ok(),
                    Some(Ok(Message::Close(_))) => return None,
                    Some(Ok(_)) => {}
                }
            }
        })
        .await
    }

    /// The next JSON message, however long it takes (`None` when the connection ends).
    pub async fn next_unbounded(&mut self) -> Option<Value> {
        loop {
            match self.ws.next().await? {
                Ok(Message::Text(t)) => return serde_json::from_str(t.as_str()).ok(),
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Messages until one matches `pred` (others are dropped); panics if the socket closes.
    pub async fn until(&mut self, what: &str, mut pred: impl FnMut(&Value) -> bool) -> Value {
        loop {
            match self.next().await {
                Some(v) if pred(&v) => return v,
                Some(_) => {}
                None => panic!("connection closed while waiting for {what}"),
            }
        }
    }

    /// The broker's `broker/attached` notice, once it comes (earlier messages are dropped).
    pub async fn attached(&mut self) -> Value {
        self.until("broker/attached", |v| v["method"] == "broker/attached")
            .await
    }

    /// The answer to request `id` (matched by exact JSON value).
    pub async fn answer(&mut self, id: &Value) -> Value {
        let id = id.clone();
        self.until("an answer", move |v| {
            v.get("id") == Some(&id) && v.get("method").is_none()
        })
        .await
    }

    /// Calls `tool` with `args` and returns the answer (an id of the agent's own, unique per
    /// agent: a test that checks ids names its own with [`Agent::request`]).
    pub async fn call(&mut self, tool: &str, args: Value) -> Value {
        self.calls += 1;
        let id = json!(1_000_000 + self.calls);
        self.request(id, "tools/call", json!({"name": tool, "arguments": args}))
            .await
    }

    /// A request and its answer.
    pub async fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send_request(id.clone(), method, params).await;
        self.answer(&id).await
    }

    /// The WebSocket itself, for tests that send frames of their own.
    pub fn raw_mut(&mut self) -> &mut WebSocketStream<Stream> {
        &mut self.ws
    }

    /// Closes the connection.
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}
