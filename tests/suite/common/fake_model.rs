//! A fake OpenAI-compatible model server on 127.0.0.1 for driving the real pi CLI (and
//! OpenCode) offline: `POST /v1/chat/completions` answered with a streamed (SSE) reply taken
//! from a script, every request body kept for the test to inspect (`scripted_http`).

pub use super::scripted_http::Reply;
use super::scripted_http::{Scripted, Seen};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

/// Tool call ids, unique in the test process.
static CALLS: AtomicU64 = AtomicU64::new(1);

/// The running server.
pub struct FakeModel {
    pub port: u16,
    http: Scripted,
}

impl FakeModel {
    pub async fn start() -> FakeModel {
        let http = Scripted::start(answer).await;
        FakeModel {
            port: http.port,
            http,
        }
    }

    /// Queues answers for the next chat requests (after the script: "ok").
    pub fn push(&self, reply: Reply) {
        self.http.push(reply);
    }

    /// Drops the replies not yet taken.
    pub fn clear(&self) {
        self.http.clear();
    }

    /// The next chat request body (bounded wait).
    pub async fn next_request(&mut self) -> Value {
        pi_ide_broker::testkit::within("a model request", self.http.next_seen())
            .await
            .expect("model server gone")
            .body
    }

    /// Every request received so far and not yet taken, without waiting.
    pub fn received(&mut self) -> Vec<Value> {
        self.http.received().into_iter().map(|s| s.body).collect()
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

    /// Waits for the request that carries a tool's outcome (its last message the tool's): a
    /// turn goes on with an edit's outcome, and a later scripted reply must not answer an
    /// earlier request of that turn.
    pub async fn next_tool_outcome(&mut self) -> Value {
        loop {
            let body = self.next_request().await;
            let last = body["messages"].as_array().and_then(|m| m.last());
            if last.is_some_and(|m| m["role"] == "tool") {
                return body;
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

/// The OpenAI chat-completions dialect: a suggestion completion gets a suggestion, a request
/// offering no tools never gets a scripted tool call, everything else the next reply.
fn answer(seen: &Seen, script: &mut VecDeque<Reply>) -> (&'static str, String) {
    let body = &seen.body;
    let offers_tools = body["tools"].as_array().is_some_and(|t| !t.is_empty());
    let reply = if is_suggestion(body) {
        Reply::Text("<SUGGESTION>suggested()</SUGGESTION>".into())
    } else {
        match script.front() {
            // A request offering no tools (a client's title or summary call) cannot be answered
            // with a tool call: it gets text and the scripted call waits for the next turn.
            Some(Reply::Tool { .. }) if !offers_tools => Reply::Text("A title".into()),
            _ => script.pop_front().unwrap_or(Reply::Text("ok".into())),
        }
    };
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
    ("text/event-stream", sse)
}
