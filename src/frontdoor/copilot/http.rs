//! The copilot door's MCP endpoint for one editor: Streamable HTTP on a private Unix socket.
//!
//! `POST /mcp` carries one JSON-RPC message (answered as `application/json`; `initialize`
//! mints the `mcp-session-id`; `server/discover` is answered -32601, so Copilot CLI takes the
//! session flow with an event stream), `GET /mcp` is the session's event stream, `DELETE /mcp`
//! ends the session. Only the user's own processes are served (the peer's uid from the
//! kernel); every request is checked before anything else: no `Origin`, `Host: localhost`,
//! the lockfile's nonce (constant time); bodies are bounded by `max_frame_bytes`.

use super::session::{Answer, Command, McpSession};
use super::tools;
use crate::frontdoor::mcp_http::{
    busy, empty, plain, read_body, rpc_response, too_large, Body, Unread,
};
use crate::protocol::handshake::{InitializeResult, INITIALIZE};
use crate::protocol::jsonrpc;
use crate::registry::Registry;
use crate::sys::secret::Token;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The session header of Streamable HTTP.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// A comment on an idle event stream this often.
const KEEP_ALIVE: Duration = Duration::from_secs(20);
/// A short tool (diagnostics, `close_diff`) waits at most this long (Copilot CLI gives 60 s).
const SHORT_WAIT: Duration = Duration::from_secs(55);

/// One editor's endpoint: its nonce and live MCP sessions.
pub struct Endpoint {
    reg: Arc<Registry>,
    editor: String,
    nonce: Token,
    stop: CancellationToken,
    sessions: Mutex<HashMap<String, Arc<McpSession>>>,
}

impl Endpoint {
    /// An endpoint for `editor`, serving until `stop`.
    pub fn new(reg: Arc<Registry>, editor: String, nonce: Token, stop: CancellationToken) -> Self {
        Endpoint {
            reg,
            editor,
            nonce,
            stop,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    #[allow(clippy::result_large_err)] // the refusal is the response itself
    fn session(&self, h: &HeaderMap) -> Result<Arc<McpSession>, Response<Body>> {
        let Some(id) = h.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) else {
            tracing::info!(editor = %self.editor, "copilot door: a request without mcp-session-id; refused");
            return Err(plain(
                StatusCode::BAD_REQUEST,
                "mcp-session-id header required (initialize first)",
            ));
        };
        let found = crate::platform::sync::lock(&self.sessions).get(id).cloned();
        match found {
            Some(s) if !s.ended.is_cancelled() => Ok(s),
            _ => {
                tracing::info!(editor = %self.editor, "copilot door: a request of an unknown or ended session; refused (initialize again)");
                Err(plain(
                    StatusCode::NOT_FOUND,
                    "unknown or ended session; initialize again",
                ))
            }
        }
    }
}

/// Accepts connections until the endpoint stops.
pub async fn accept_loop(ep: Arc<Endpoint>, listener: crate::platform::local::Listener) {
    loop {
        let accepted = tokio::select! {
            _ = ep.stop.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok(stream) => {
                let slot = ep.reg.limits.handshake("copilot").await;
                ep.reg.tracker.spawn(connection(ep.clone(), stream, slot));
            }
            Err(e) => {
                tracing::warn!(error = %e, "copilot accept failed; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One connection of the user's own (another uid is closed at once), served over HTTP/1.1.
async fn connection(
    ep: Arc<Endpoint>,
    stream: crate::platform::local::Stream,
    slot: crate::registry::limits::HandshakeSlot,
) {
    let me = crate::platform::user::uid();
    let pid = match crate::platform::peer::of_stream(&stream) {
        Ok(f) if f.uid == me => f.pid,
        Ok(f) => {
            tracing::warn!(editor = %ep.editor, uid = f.uid, pid = ?f.pid, "copilot door: refused a connection of another user");
            return;
        }
        Err(e) => {
            tracing::warn!(editor = %ep.editor, error = %e, "copilot door: refused a connection whose credentials could not be read");
            return;
        }
    };
    let closer = slot.closer();
    let heard = slot.heard();
    let place = Arc::new(Mutex::new(Some(slot)));
    let cancel = ep.stop.clone();
    let editor = ep.editor.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (ep, place) = (ep.clone(), place.clone());
        async move {
            let answer = match check(&ep.nonce, req.headers()) {
                Err((status, why)) => {
                    tracing::warn!(editor = %ep.editor, "copilot door: refused a request: {why}");
                    plain(status, why)
                }
                Ok(()) => {
                    crate::platform::sync::lock(&place).take();
                    route(&ep, req, pid).await
                }
            };
            Ok::<_, Infallible>(answer)
        }
    });
    let conn = crate::frontdoor::serve_http(stream, &heard, svc);
    tokio::select! {
        r = conn => if let Err(e) = r { tracing::debug!(editor = %editor, error = %e, "copilot connection ended") },
        why = closer => tracing::debug!(editor = %editor, reason = why, "copilot connection closed in its handshake"),
        _ = cancel.cancelled() => {}
    }
}

/// Refuses a browser (any `Origin`), a `Host` other than `localhost` (DNS rebinding), and a
/// missing or wrong nonce (compared in constant time).
pub fn check(nonce: &Token, h: &HeaderMap) -> Result<(), (StatusCode, &'static str)> {
    if h.contains_key(header::ORIGIN) {
        return Err((
            StatusCode::FORBIDDEN,
            "requests with an Origin header are refused",
        ));
    }
    let mut hosts = h.get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(v), None) => v.to_str().unwrap_or(""),
        _ => "",
    };
    let name = host.rsplit_once(':').map_or(host, |(n, _)| n);
    if !name.eq_ignore_ascii_case("localhost") {
        return Err((StatusCode::FORBIDDEN, "Host must be localhost"));
    }
    let presented = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Nonce "));
    match presented {
        Some(n) if nonce.matches(n.as_bytes()) => Ok(()),
        Some(_) => Err((StatusCode::UNAUTHORIZED, "Unauthorized: wrong nonce")),
        None => Err((
            StatusCode::UNAUTHORIZED,
            "Unauthorized: Authorization: Nonce <nonce> required (it is in the lockfile)",
        )),
    }
}

/// One request that passed [`check`], routed; `pid` is the peer's, as the kernel says.
async fn route(ep: &Arc<Endpoint>, req: Request<Incoming>, pid: Option<u32>) -> Response<Body> {
    if req.uri().path() != "/mcp" {
        return plain(StatusCode::NOT_FOUND, "the MCP endpoint is /mcp");
    }
    match *req.method() {
        Method::POST => post(ep, req, pid).await,
        Method::GET => get_stream(ep, req.headers()),
        Method::DELETE => match ep.session(req.headers()) {
            Ok(s) => {
                crate::platform::sync::lock(&ep.sessions).remove(&s.id);
                s.ended.cancel();
                plain(StatusCode::OK, "session ended")
            }
            Err(r) => r,
        },
        _ => {
            let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "use POST, GET or DELETE");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            r
        }
    }
}

/// `POST /mcp`: one JSON-RPC message.
async fn post(ep: &Arc<Endpoint>, req: Request<Incoming>, pid: Option<u32>) -> Response<Body> {
    let h = req.headers().clone();
    let msg = match read_message(ep, req).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let method = msg.get("method").and_then(Value::as_str);
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    if method == Some("server/discover") {
        // Answered, it would put Copilot CLI in its stateless mode: no event stream.
        return rpc_response(
            &id,
            Err((
                jsonrpc::METHOD_NOT_FOUND,
                "Method not found: server/discover".into(),
            )),
        );
    }
    if !h.contains_key(SESSION_HEADER) {
        return match method {
            Some(INITIALIZE) if !id.is_null() => initialize(ep, &id, msg.get("params"), pid),
            _ => {
                tracing::info!(editor = %ep.editor, method = ?method, "copilot door: a request without a session that is not initialize; refused");
                plain(
                    StatusCode::BAD_REQUEST,
                    "Bad Request: No valid session ID provided (initialize first)",
                )
            }
        };
    }
    let session = match ep.session(&h) {
        Ok(s) => s,
        Err(r) => return r,
    };
    match method {
        _ if id.is_null() => empty(StatusCode::ACCEPTED), // a notification or an answer
        None => empty(StatusCode::ACCEPTED),
        Some(m) => rpc_response(&id, request(&session, m, msg.get("params")).await),
    }
}

/// The body of a POST as one JSON-RPC message, or the answer refusing it.
async fn read_message(ep: &Endpoint, req: Request<Incoming>) -> Result<Value, Response<Body>> {
    let json_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_type {
        tracing::warn!(editor = %ep.editor, "copilot door: a POST that is not application/json; refused");
        return Err(plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
        ));
    }
    let max = ep.reg.config().max_frame_bytes;
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > max as u64) {
        tracing::warn!(editor = %ep.editor, max, "copilot door: a body over max_frame_bytes announced; refused unread");
        return Err(too_large(max));
    }
    let mut claim = ep.reg.frames.share(None).claim();
    let body = match read_body(req.into_body(), max, announced, &mut claim).await {
        Ok(b) => b,
        Err(Unread::TooLarge) => {
            tracing::warn!(editor = %ep.editor, max, "copilot door: a body over max_frame_bytes (or cut short); refused");
            return Err(too_large(max));
        }
        Err(Unread::Busy) => return Err(busy()),
    };
    match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(bad_rpc(
            jsonrpc::INVALID_REQUEST,
            "one JSON-RPC message per request (no batches)".into(),
        )),
        Err(e) => {
            tracing::warn!(editor = %ep.editor, error = %e, "copilot door: a POST body that is not JSON");
            Err(bad_rpc(jsonrpc::PARSE_ERROR, format!("Parse error: {e}")))
        }
    }
}

fn bad_rpc(code: i64, message: String) -> Response<Body> {
    let mut r = rpc_response(&Value::Null, Err((code, message)));
    *r.status_mut() = StatusCode::BAD_REQUEST;
    r
}

/// `initialize`: a new session, a broker session pinned to this endpoint's editor.
fn initialize(
    ep: &Arc<Endpoint>,
    id: &Value,
    params: Option<&Value>,
    pid: Option<u32>,
) -> Response<Body> {
    let Some(place) = ep.reg.limits.session("copilot") else {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many sessions (max_sessions)",
        );
    };
    let cwd = super::cwd_of(&ep.reg, &ep.editor, pid);
    let session = match McpSession::start(&ep.reg, &ep.editor, cwd, place, &ep.stop) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(editor = %ep.editor, error = %e, "cannot start a copilot session");
            return plain(StatusCode::INTERNAL_SERVER_ERROR, "cannot start a session");
        }
    };
    crate::platform::sync::lock(&ep.sessions).insert(session.id.clone(), session.clone());
    let (ep2, s) = (ep.clone(), session.clone());
    ep.reg.tracker.spawn(async move {
        s.ended.cancelled().await;
        crate::platform::sync::lock(&ep2.sessions).remove(&s.id);
    });
    let version = params
        .and_then(|p| p.get("protocolVersion"))
        .and_then(Value::as_str)
        .filter(|v| v.len() == 10 && v.bytes().all(|b| b.is_ascii_digit() || b == b'-'))
        .unwrap_or("2025-11-25");
    let mut r = rpc_response(id, Ok(InitializeResult::broker(version, false).to_value()));
    if let Ok(v) = HeaderValue::from_str(&session.id) {
        r.headers_mut().insert(SESSION_HEADER, v);
    }
    r
}

/// A request of a live session: its result, or a JSON-RPC error (code, message).
async fn request(
    s: &McpSession,
    method: &str,
    params: Option<&Value>,
) -> Result<Value, (i64, String)> {
    match method {
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools::list()})),
        "tools/call" => {
            let name = params
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let args = params
                .and_then(|p| p.get("arguments"))
                .cloned()
                .unwrap_or(json!({}));
            Ok(call(s, name, &args).await)
        }
        m => Err((jsonrpc::METHOD_NOT_FOUND, format!("Method not found: {m}"))),
    }
}

/// A `tools/call`: its `CallToolResult`.
async fn call(s: &McpSession, name: &str, args: &Value) -> Value {
    let arg = |k: &str| args.get(k).and_then(Value::as_str);
    match name {
        "get_selection" => tools::get_selection(s.selection().as_ref()),
        "get_diagnostics" => {
            let a = arg("uri").map_or(json!({}), |u| json!({"uri": u}));
            match ask(s, "getDiagnostics", a, None, Some(SHORT_WAIT)).await {
                Some(Answer::Editor(v)) if v.get("result").is_some() => {
                    tools::diagnostics(&v["result"])
                }
                _ => tools::error("the editor did not give its diagnostics"),
            }
        }
        "open_diff" => {
            let (Some(path), Some(contents), Some(tab)) = (
                arg("original_file_path"),
                arg("new_file_contents"),
                arg("tab_name"),
            ) else {
                return tools::error("open_diff: original_file_path, new_file_contents and tab_name (strings) are required");
            };
            if !crate::protocol::winpath::is_absolute(path) {
                return tools::error("open_diff: original_file_path must be absolute");
            }
            let a = json!({"old_file_path": path, "new_file_path": path, "new_file_contents": contents, "tab_name": tab});
            match ask(s, "openDiff", a, Some(tab.to_string()), None).await {
                Some(Answer::Editor(v)) if v.get("result").is_some() => {
                    tools::verdict(&v["result"], path, tab)
                }
                Some(Answer::Closed) => tools::closed(path, tab),
                _ => tools::error("the editor could not show the diff; answer in the terminal"),
            }
        }
        "close_diff" => {
            let Some(tab) = arg("tab_name") else {
                return tools::error("close_diff: tab_name (a string) is required");
            };
            let (reply, answer) = tokio::sync::oneshot::channel();
            if !s.command(Command::CloseDiff {
                tab: tab.to_string(),
                reply,
            }) {
                return tools::error("the editor's session is over");
            }
            let already = tokio::time::timeout(SHORT_WAIT, answer)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(true);
            tools::close_answer(tab, already)
        }
        "update_session_name" => tools::text(&json!({"success": true})),
        other => tools::error(&format!("unknown tool {other:?}")),
    }
}

/// Calls the editor's `tool` through the session and waits for its answer (`wait`, if any).
async fn ask(
    s: &McpSession,
    tool: &'static str,
    args: Value,
    tab: Option<String>,
    wait: Option<Duration>,
) -> Option<Answer> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    if !s.command(Command::Call {
        tool,
        args,
        tab,
        reply,
    }) {
        return None;
    }
    let ended = s.ended.clone();
    let waited = async {
        match wait {
            Some(w) => tokio::time::timeout(w, answer).await.ok()?.ok(),
            None => answer.await.ok(),
        }
    };
    tokio::select! {
        a = waited => a,
        _ = ended.cancelled() => None,
    }
}

/// `GET /mcp`: the session's event stream (server-sent events), replacing an older one.
fn get_stream(ep: &Endpoint, h: &HeaderMap) -> Response<Body> {
    let accepts = h
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !accepts {
        return plain(
            StatusCode::NOT_ACCEPTABLE,
            "Accept: text/event-stream required",
        );
    }
    let session = match ep.session(h) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let (rx, guard) = session.open_stream();
    let ended = session.ended.clone();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The guard lives as long as the body: hyper drops it when the client's connection goes.
    let state = (rx, ended, tick, guard);
    let stream =
        futures_util::stream::unfold(state, |(mut rx, ended, mut tick, guard)| async move {
            let bytes = tokio::select! {
                biased;
                m = rx.recv() => Bytes::from(format!("event: message\ndata: {}\n\n", m?)),
                _ = ended.cancelled() => return None,
                _ = tick.tick() => Bytes::from_static(b": keep-alive\n\n"),
            };
            Some((
                Ok::<_, Infallible>(hyper::body::Frame::data(bytes)),
                (rx, ended, tick, guard),
            ))
        });
    let mut r = Response::new(StreamBody::new(stream).boxed());
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_nonce_the_host_and_a_browser_are_checked() {
        let nonce = Token::generate().unwrap();
        let good = format!("Nonce {}", nonce.expose());
        assert!(check(
            &nonce,
            &headers(&[("host", "localhost"), ("authorization", &good)])
        )
        .is_ok());
        let wrong = check(
            &nonce,
            &headers(&[("host", "localhost"), ("authorization", "Nonce nope")]),
        );
        assert_eq!(wrong.unwrap_err().0, StatusCode::UNAUTHORIZED);
        let bearer = format!("Bearer {}", nonce.expose());
        let other = check(
            &nonce,
            &headers(&[("host", "localhost"), ("authorization", &bearer)]),
        );
        assert_eq!(other.unwrap_err().0, StatusCode::UNAUTHORIZED);
        assert_eq!(
            check(&nonce, &headers(&[("host", "localhost")]))
                .unwrap_err()
                .0,
            StatusCode::UNAUTHORIZED
        );
        let foreign = check(
            &nonce,
            &headers(&[("host", "evil.example"), ("authorization", &good)]),
        );
        assert_eq!(foreign.unwrap_err().0, StatusCode::FORBIDDEN);
        let mut two = headers(&[("host", "localhost"), ("authorization", &good)]);
        two.append("host", HeaderValue::from_static("evil.example"));
        assert_eq!(check(&nonce, &two).unwrap_err().0, StatusCode::FORBIDDEN);
        let browser = check(
            &nonce,
            &headers(&[
                ("host", "localhost"),
                ("origin", "http://x"),
                ("authorization", &good),
            ]),
        );
        assert_eq!(browser.unwrap_err().0, StatusCode::FORBIDDEN);
    }
}
