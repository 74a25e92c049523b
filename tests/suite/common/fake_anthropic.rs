//! A fake Anthropic Messages API on 127.0.0.1 for driving the real Claude Code offline:
//! `POST /v1/messages` answered from a script of replies (`scripted_http`), streamed as the API
//! streams (`message_start`, one content block, `message_delta` with its stop reason,
//! `message_stop`; docs.anthropic.com "Streaming Messages"), or whole when `stream` is false.

pub use super::scripted_http::Reply;
use super::scripted_http::{Scripted, Seen};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

/// Tool use ids, unique in the test process.
static USES: AtomicU64 = AtomicU64::new(1);

/// The running server.
pub struct FakeAnthropic {
    pub port: u16,
    http: Scripted,
}

impl FakeAnthropic {
    pub async fn start() -> FakeAnthropic {
        let http = Scripted::start(answer).await;
        FakeAnthropic {
            port: http.port,
            http,
        }
    }

    /// Queues answers for the next message requests that offer tools (after the script: "ok").
    pub fn push(&self, reply: Reply) {
        self.http.push(reply);
    }

    /// Every message request received so far and not yet taken, without waiting.
    pub fn received(&mut self) -> Vec<Value> {
        self.http
            .received()
            .into_iter()
            .filter(|s| s.path.starts_with("/v1/messages") && !s.path.contains("count_tokens"))
            .map(|s| s.body)
            .collect()
    }

    /// The `tool_result` contents (as JSON text) of every message request received so far and
    /// not yet taken, in order: what the model was told of each tool call.
    pub fn tool_results(&mut self) -> Vec<String> {
        self.received()
            .iter()
            .flat_map(|body| body["messages"].as_array().cloned().unwrap_or_default())
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .filter(|c| c["type"] == "tool_result")
            .map(|c| c["content"].to_string())
            .collect()
    }
}

/// Every text block of a message request's `system` and `messages` (any role), in order:
/// what the model read. Claude Code 2.1.332 sends its per-turn context (an IDE selection's
/// "The user selected the lines …" among it) as a `system`-role message after the user's.
pub fn prompt_text(body: &Value) -> String {
    let blocks = |v: &Value| -> Vec<String> {
        match v {
            Value::String(t) => vec![t.clone()],
            Value::Array(a) => a
                .iter()
                .filter_map(|b| b["text"].as_str().map(String::from))
                .collect(),
            _ => Vec::new(),
        }
    };
    let mut out = blocks(&body["system"]);
    for m in body["messages"].as_array().into_iter().flatten() {
        out.extend(blocks(&m["content"]));
    }
    out.join("\n")
}

/// The Messages dialect: a request offering no tools (a title, a summary) gets text, and a
/// scripted tool use waits for one that does.
fn answer(seen: &Seen, script: &mut VecDeque<Reply>) -> (&'static str, String) {
    if seen.path.contains("count_tokens") {
        return ("application/json", json!({"input_tokens": 1}).to_string());
    }
    let body = &seen.body;
    let offers_tools = body["tools"].as_array().is_some_and(|t| !t.is_empty());
    let reply = match script.front() {
        Some(Reply::Tool { .. }) if !offers_tools => Reply::Text("A title".into()),
        _ if !offers_tools => Reply::Text("A title".into()),
        _ => script.pop_front().unwrap_or(Reply::Text("ok".into())),
    };
    let (block, delta, stop) = match reply {
        Reply::Text(t) => (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": t}),
            "end_turn",
        ),
        Reply::Tool { name, args } => (
            json!({"type": "tool_use", "id": format!("toolu_{}", USES.fetch_add(1, Ordering::Relaxed)), "name": name, "input": {}}),
            json!({"type": "input_json_delta", "partial_json": args.to_string()}),
            "tool_use",
        ),
    };
    let usage = json!({"input_tokens": 1, "output_tokens": 1});
    let message = |content: Value, stop: Value| {
        json!({"id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"],
               "content": content, "stop_reason": stop, "stop_sequence": null, "usage": usage})
    };
    if body["stream"] != true {
        let mut whole = block.clone();
        match (&delta["text"], &delta["partial_json"]) {
            (Value::String(t), _) => whole["text"] = json!(t),
            (_, Value::String(j)) => {
                whole["input"] = serde_json::from_str(j).unwrap_or_else(|_| json!({}))
            }
            _ => {}
        }
        return (
            "application/json",
            message(json!([whole]), json!(stop)).to_string(),
        );
    }
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut sse = event(
        "message_start",
        json!({"type": "message_start", "message": message(json!([]), Value::Null)}),
    );
    sse += &event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": block}),
    );
    sse += &event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0, "delta": delta}),
    );
    sse += &event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    );
    sse += &event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 1}}),
    );
    sse += &event("message_stop", json!({"type": "message_stop"}));
    ("text/event-stream", sse)
}
