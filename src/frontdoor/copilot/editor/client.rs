//! The broker as one more MCP client of a Copilot Chat server: Streamable HTTP (hyper) over
//! its Unix socket, as Copilot CLI speaks it: `Host: localhost`, the lockfile's headers as they
//! are, `X-Copilot-Session-Id` (a fresh one of the broker's own), `initialize`, then calls
//! whose answers come as JSON or as server-sent events, an event stream (`GET`) for the
//! server's pushes, and `DELETE` at the end. The lockfile's header values (the nonce) are
//! only ever put in a request, never in a log line or an error.

use super::found::Found;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The session header of Streamable HTTP.
const SESSION: &str = "mcp-session-id";
/// The header Copilot Chat names its sessions by (and without which it answers 400).
const COPILOT_SESSION: &str = "x-copilot-session-id";
/// A request that is not a diff waits at most this long (Copilot CLI gives 60 s).
pub(super) const SHORT: Duration = Duration::from_secs(55);

/// One MCP session with a Copilot Chat server.
pub(super) struct Upstream {
    found: Found,
    /// `X-Copilot-Session-Id` (Copilot Chat makes it the `mcp-session-id` too).
    copilot_session: Mutex<String>,
    /// The `mcp-session-id` the server gave.
    session: Mutex<Option<String>>,
    next_id: AtomicU64,
    /// The largest answer read.
    max: usize,
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Upstream {
    /// A client of `found`'s server (nothing sent yet); its connections end on `stop`.
    pub(super) fn new(
        found: Found,
        max: usize,
        tracker: TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        Upstream {
            found,
            copilot_session: Mutex::new(String::new()),
            session: Mutex::new(None),
            next_id: AtomicU64::new(1),
            max,
            tracker,
            stop,
        }
    }

    /// `initialize` (a fresh session id) and `notifications/initialized`.
    pub(super) async fn initialize(&self) -> Result<Value, String> {
        *crate::platform::sync::lock(&self.copilot_session) =
            super::uuid().map_err(|e| e.to_string())?;
        *crate::platform::sync::lock(&self.session) = None;
        let params = json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "pi-ide-broker", "version": env!("CARGO_PKG_VERSION")},
        });
        let (result, session) = self.request_with("initialize", params).await?;
        let Some(session) = session else {
            return Err("the server gave no mcp-session-id".into());
        };
        *crate::platform::sync::lock(&self.session) = Some(session);
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let r = self.send(Method::POST, Some(note)).await?;
        if !r.status().is_success() {
            return Err(format!("notifications/initialized: HTTP {}", r.status()));
        }
        Ok(result)
    }

    /// A `tools/call`: the tool's `CallToolResult`, or why there is none.
    pub(super) async fn call_tool(&self, name: &str, args: Value) -> Result<Value, String> {
        let params = json!({"name": name, "arguments": args});
        self.request_with("tools/call", params)
            .await
            .map(|(r, _)| r)
    }

    /// One request: its result and the session header of the answer.
    async fn request_with(
        &self,
        method: &str,
        params: Value,
    ) -> Result<(Value, Option<String>), String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let r = self.send(Method::POST, Some(msg)).await?;
        let status = r.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(format!(
                "{method}: the server refused the lockfile's headers (HTTP {status})"
            ));
        }
        if !status.is_success() {
            return Err(format!("{method}: HTTP {status}"));
        }
        let session = r
            .headers()
            .get(SESSION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let answer = self.answer(r, id).await?;
        match (answer.get("result"), answer.get("error")) {
            (Some(result), _) => Ok((result.clone(), session)),
            (None, Some(e)) => Err(format!(
                "{method}: {}",
                e.get("message").and_then(Value::as_str).unwrap_or("error")
            )),
            _ => Err(format!("{method}: an answer with neither result nor error")),
        }
    }

    /// The JSON-RPC answer to `id` in a response: the JSON body, or the first matching
    /// message of its event stream.
    async fn answer(&self, r: Response<Incoming>, id: u64) -> Result<Value, String> {
        let sse = r
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut body = r.into_body();
        if !sse {
            let bytes = http_body_util::Limited::new(body, self.max)
                .collect()
                .await
                .map_err(|e| format!("answer: {e}"))?
                .to_bytes();
            return serde_json::from_slice(&bytes).map_err(|e| format!("answer: {e}"));
        }
        let mut events = Sse::new(self.max);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("answer: {e}"))?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            for msg in events.feed(data)? {
                if msg.get("id").and_then(Value::as_u64) == Some(id) && msg.get("method").is_none()
                {
                    return Ok(msg);
                }
            }
        }
        Err("the answer's event stream ended without it".into())
    }

    /// Follows the session's event stream, handing each message to `to` until it ends (the
    /// server went or dropped the session) or the client stops. `Err` when it could not be
    /// opened.
    pub(super) async fn events(&self, to: &mpsc::UnboundedSender<Value>) -> Result<(), String> {
        let r = self.send(Method::GET, None).await?;
        if !r.status().is_success() {
            return Err(format!("event stream: HTTP {}", r.status()));
        }
        let mut body = r.into_body();
        let mut events = Sse::new(self.max);
        loop {
            let frame = tokio::select! {
                _ = self.stop.cancelled() => return Ok(()),
                f = body.frame() => f,
            };
            let Some(frame) = frame else { return Ok(()) };
            let Some(data) = frame.map_err(|e| e.to_string())?.into_data().ok() else {
                continue;
            };
            for msg in events.feed(&data)? {
                if to.send(msg).is_err() {
                    return Ok(());
                }
            }
        }
    }

    /// Ends the session (`DELETE`), at most [`SHORT`] later.
    pub(super) async fn close(&self) {
        if crate::platform::sync::lock(&self.session).is_none() {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), self.send(Method::DELETE, None)).await;
    }

    /// One request on a fresh connection to the server's socket (proven the user's, as the
    /// broker's own socket is: `platform::local::connect`).
    async fn send(
        &self,
        method: Method,
        body: Option<Value>,
    ) -> Result<Response<Incoming>, String> {
        let stream = crate::platform::local::connect(&self.found.socket)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.found.socket.display()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        let stop = self.stop.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
        let req = self.request(method, body)?;
        let answer = sender.send_request(req);
        tokio::select! {
            r = answer => r.map_err(|e| format!("request: {e}")),
            _ = self.stop.cancelled() => Err("stopped".into()),
        }
    }

    /// The request, with the lockfile's headers (their values secret) and the broker's.
    fn request(&self, method: Method, body: Option<Value>) -> Result<Request<Full<Bytes>>, String> {
        let mut req = Request::builder()
            .method(method)
            .uri("/mcp")
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::ACCEPT, "application/json, text/event-stream")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header("x-copilot-pid", std::process::id().to_string());
        let copilot_session = crate::platform::sync::lock(&self.copilot_session).clone();
        req = req.header(COPILOT_SESSION, copilot_session);
        if let Some(s) = crate::platform::sync::lock(&self.session).clone() {
            req = req.header(SESSION, s);
        }
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let mut req = req
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| format!("request: {e}"))?;
        for (name, value) in &self.found.headers {
            // Checked when the lockfile was read; the value is never shown.
            let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value.expose()),
            ) else {
                return Err(format!("header {name:?} is not valid"));
            };
            req.headers_mut().insert(n, v);
        }
        Ok(req)
    }
}

/// Server-sent events, parsed as they come: each event's `data` lines, as one JSON message.
pub(super) struct Sse {
    buf: Vec<u8>,
    max: usize,
}

impl Sse {
    /// A parser that refuses an event over `max` bytes.
    pub(super) fn new(max: usize) -> Sse {
        Sse {
            buf: Vec::new(),
            max,
        }
    }

    /// The messages completed by `bytes` (events whose data is not JSON are skipped).
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Value>, String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            let text = &self.buf;
            let end = find_event_end(text);
            let Some((at, sep)) = end else { break };
            let event: Vec<u8> = self.buf.drain(..at + sep).collect();
            let event = String::from_utf8_lossy(&event[..at]).replace("\r\n", "\n");
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if data.is_empty() {
                continue;
            }
            if let Ok(v) = serde_json::from_str::<Value>(&data.join("\n")) {
                out.push(v);
            }
        }
        if self.buf.len() > self.max {
            return Err(format!("an event over {} bytes", self.max));
        }
        Ok(out)
    }
}

/// Where the first event in `buf` ends: its length and the separator's.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_parsed_across_chunks() {
        let mut s = Sse::new(1024);
        assert!(s
            .feed(b"event: message\ndata: {\"id\":")
            .unwrap()
            .is_empty());
        let got = s
            .feed(b"1}\n\n: keep-alive\n\ndata: nope\n\ndata: {\"a\":2}\r\n\r\n")
            .unwrap();
        assert_eq!(got, vec![json!({"id": 1}), json!({"a": 2})]);
        let mut small = Sse::new(8);
        assert!(small.feed(b"data: 0123456789").is_err());
    }
}
