//! A fake Gemini API on 127.0.0.1 for driving the real Gemini CLI offline
//! (`GOOGLE_GEMINI_BASE_URL`): `…:streamGenerateContent` (the chat) answered from a script as
//! server-sent events, `…:generateContent` (the CLI's side questions) and `…:countTokens`
//! with fixed answers; every request kept for the test to inspect (`scripted_http`).

use super::scripted_http::Scripted;
pub use super::scripted_http::{Reply, Seen};
use serde_json::{json, Value};
use std::collections::VecDeque;

/// The running server.
pub struct FakeGemini {
    pub port: u16,
    http: Scripted,
}

impl FakeGemini {
    pub async fn start() -> FakeGemini {
        let http = Scripted::start(answer).await;
        FakeGemini {
            port: http.port,
            http,
        }
    }

    /// Queues answers for the next chat requests (after the script: "ok").
    pub fn push(&self, reply: Reply) {
        self.http.push(reply);
    }

    /// The next chat (`streamGenerateContent`) request's body, the others skipped.
    /// `None` after 30 s: the CLI answers its user's Enter in its own time, and a Node CLI on a
    /// busy two-core machine takes more than the broker's 10 s steps.
    pub async fn next_chat(&mut self) -> Option<Value> {
        let chat = async {
            loop {
                let s = self.http.next_seen().await.expect("fake API gone");
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

fn response(parts: Value) -> Value {
    json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "gemini-fake",
    })
}

/// The Gemini API dialect: the chat streamed from the script, token counts and side questions
/// answered with fixed JSON.
fn answer(seen: &Seen, script: &mut VecDeque<Reply>) -> (&'static str, String) {
    let path = &seen.path;
    if path.contains(":streamGenerateContent") {
        let parts = match script.pop_front().unwrap_or(Reply::Text("ok".into())) {
            Reply::Text(t) => json!([{"text": t}]),
            Reply::Tool { name, args } => json!([{"functionCall": {"name": name, "args": args}}]),
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
    }
}
