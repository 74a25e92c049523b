//! A fake OpenAI-compatible model server on 127.0.0.1 for driving the real pi CLI offline:
//! `POST /v1/chat/completions` answered with a streamed (SSE) reply taken from a script, every
//! request body kept for the test to inspect.

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Tool call ids, unique in the test process.
static CALLS: AtomicU64 = AtomicU64::new(1);
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Plain assistant text.
    Text(String),
    /// One tool call with these arguments.
    Tool { name: String, args: Value },
}

/// The running server.
pub struct FakeModel {
    pub port: u16,
    script: Arc<Mutex<VecDeque<Reply>>>,
    requests: mpsc::UnboundedReceiver<Value>,
}

impl FakeModel {
    pub async fn start() -> FakeModel {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let script = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, requests) = mpsc::unbounded_channel();
        let s = script.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (s, tx) = (s.clone(), tx.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, s, tx).await;
                });
            }
        });
        FakeModel {
            port,
            script,
            requests,
        }
    }

    /// Queues answers for the next chat requests (after the script: "ok").
    pub fn push(&self, reply: Reply) {
        self.script.lock().expect("script").push_back(reply);
    }

    /// The next chat request body (bounded wait).
    pub async fn next_request(&mut self) -> Value {
        pi_ide_broker::testkit::within("a model request", self.requests.recv())
            .await
            .expect("model server gone")
    }

    /// Every request received so far and not yet taken, without waiting.
    pub fn received(&mut self) -> Vec<Value> {
        std::iter::from_fn(|| self.requests.try_recv().ok()).collect()
    }

    /// The next request that is not a suggestion completion (those are answered apart).
    pub async fn next_chat(&mut self) -> Value {
        loop {
            let r = self.next_request().await;
            if !is_suggestion(&r) {
                return r;
            }
        }
    }

    /// `models.json` content naming this server as provider `fake`, model `fake-model`.
    pub fn models_json(&self) -> String {
        json!({"providers": {"fake": {
            "baseUrl": format!("http://127.0.0.1:{}/v1", self.port),
            "api": "openai-completions",
            "apiKey": "test-key",
            "models": [{"id": "fake-model", "name": "Fake", "contextWindow": 32000, "maxTokens": 2048,
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}]
        }}})
        .to_string()
    }
}

/// True for the extension's inline-suggestion completion call.
pub fn is_suggestion(body: &Value) -> bool {
    body.to_string().contains("You complete code at a cursor")
}

/// Every text the model was sent, joined (system, user, custom context messages).
pub fn all_text(body: &Value) -> String {
    let mut out = String::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        match &m["content"] {
            Value::String(s) => out.push_str(s),
            Value::Array(parts) => {
                for p in parts {
                    if let Some(t) = p["text"].as_str() {
                        out.push_str(t);
                    }
                }
            }
            _ => {}
        }
        out.push('\n');
    }
    out
}

async fn serve(
    mut stream: TcpStream,
    script: Arc<Mutex<VecDeque<Reply>>>,
    tx: mpsc::UnboundedSender<Value>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let header_end = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < header_end + len {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body: Value = serde_json::from_slice(&buf[header_end..]).unwrap_or(Value::Null);
    let offers_tools = body["tools"].as_array().is_some_and(|t| !t.is_empty());
    let reply = if is_suggestion(&body) {
        Reply::Text("<SUGGESTION>suggested()</SUGGESTION>".into())
    } else {
        let mut script = script.lock().expect("script");
        match script.front() {
            // A request offering no tools (a client's title or summary call) cannot be answered
            // with a tool call: it gets text and the scripted call waits for the next turn.
            Some(Reply::Tool { .. }) if !offers_tools => Reply::Text("A title".into()),
            _ => script.pop_front().unwrap_or(Reply::Text("ok".into())),
        }
    };
    let _ = tx.send(body);
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut sse = String::new();
    match reply {
        Reply::Text(t) => {
            sse.push_str(&chunk(
                json!({"role": "assistant", "content": t}),
                Value::Null,
            ));
            sse.push_str(&chunk(json!({}), json!("stop")));
        }
        Reply::Tool { name, args } => {
            let id = format!("call_{}", CALLS.fetch_add(1, Ordering::Relaxed));
            let call = json!([{"index": 0, "id": format!("{id}_{name}"), "type": "function",
                               "function": {"name": name, "arguments": args.to_string()}}]);
            sse.push_str(&chunk(
                json!({"role": "assistant", "tool_calls": call}),
                Value::Null,
            ));
            sse.push_str(&chunk(json!({}), json!("tool_calls")));
        }
    }
    sse.push_str("data: [DONE]\n\n");
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        sse.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(sse.as_bytes()).await?;
    stream.shutdown().await
}
