//! A fake Gemini API on 127.0.0.1 for driving the real Gemini CLI offline
//! (`GOOGLE_GEMINI_BASE_URL`): `…:streamGenerateContent` (the chat) answered from a script as
//! server-sent events, `…:generateContent` (the CLI's side questions) and `…:countTokens`
//! with fixed answers; every request kept for the test to inspect.

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// One scripted chat answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Plain model text.
    Text(String),
    /// One function call.
    Call { name: String, args: Value },
}

/// One request the CLI made.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The request path (model and method).
    pub path: String,
    /// Its JSON body.
    pub body: Value,
}

/// The running server.
pub struct FakeGemini {
    pub port: u16,
    script: Arc<Mutex<VecDeque<Reply>>>,
    requests: mpsc::UnboundedReceiver<Seen>,
}

impl FakeGemini {
    pub async fn start() -> FakeGemini {
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
        FakeGemini {
            port,
            script,
            requests,
        }
    }

    /// Queues answers for the next chat requests (after the script: "ok").
    pub fn push(&self, reply: Reply) {
        self.script.lock().expect("script").push_back(reply);
    }

    /// The next chat (`streamGenerateContent`) request's body, the others skipped.
    /// `None` after 30 s: the CLI answers its user's Enter in its own time, and a Node CLI on a
    /// busy two-core machine takes more than the broker's 10 s steps.
    pub async fn next_chat(&mut self) -> Option<Value> {
        let chat = async {
            loop {
                let s = self.requests.recv().await.expect("fake API gone");
                if s.path.contains(":streamGenerateContent") {
                    return s.body;
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), chat)
            .await
            .ok()
    }
}

/// Every text part of every message in a chat request, joined.
pub fn all_text(body: &Value) -> String {
    let mut out = String::new();
    for c in body["contents"].as_array().into_iter().flatten() {
        for p in c["parts"].as_array().into_iter().flatten() {
            if let Some(t) = p["text"].as_str() {
                out.push_str(t);
                out.push('\n');
            }
        }
    }
    out
}

async fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<(String, Value)>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let header_end = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
    let lower = head.to_ascii_lowercase();
    let len: usize = lower
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
    let body = serde_json::from_slice(&buf[header_end..]).unwrap_or(Value::Null);
    Ok(Some((path, body)))
}

fn response(parts: Value) -> Value {
    json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "gemini-fake",
    })
}

async fn serve(
    mut stream: TcpStream,
    script: Arc<Mutex<VecDeque<Reply>>>,
    tx: mpsc::UnboundedSender<Seen>,
) -> std::io::Result<()> {
    let Some((path, body)) = read_request(&mut stream).await? else {
        return Ok(());
    };
    let _ = tx.send(Seen {
        path: path.clone(),
        body,
    });
    let (ctype, text) = if path.contains(":streamGenerateContent") {
        let reply = script
            .lock()
            .expect("script")
            .pop_front()
            .unwrap_or(Reply::Text("ok".into()));
        let parts = match reply {
            Reply::Text(t) => json!([{"text": t}]),
            Reply::Call { name, args } => json!([{"functionCall": {"name": name, "args": args}}]),
        };
        (
            "text/event-stream",
            format!("data: {}\r\n\r\n", response(parts)),
        )
    } else if path.contains(":countTokens") {
        ("application/json", json!({"totalTokens": 10}).to_string())
    } else {
        // Side questions (next speaker, routing, summaries) want JSON text.
        let t = json!({"reasoning": "fake", "next_speaker": "user", "model_choice": "flash"});
        (
            "application/json",
            response(json!([{"text": t.to_string()}])).to_string(),
        )
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        text.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(text.as_bytes()).await?;
    stream.shutdown().await
}
