//! The gemini door's MCP endpoint for one editor: Streamable HTTP on a loopback port.
//! `POST /mcp` carries one JSON-RPC message (a request is answered in the response body as
//! `application/json`; `initialize` mints the `Mcp-Session-Id`), `GET /mcp` is the session's
//! server-to-client event stream, `DELETE /mcp` ends the session.
//!
//! Every request is checked before anything else: no `Origin` (a browser page), a `Host` of
//! this port on loopback only (DNS rebinding), the bearer token (constant time); bodies are
//! bounded, and a connection holds a handshake place until its first request has arrived.

use super::session::{Command, McpSession};
use crate::frontdoor::mcp_http::{
    busy, empty, json_text, plain, read_body, rpc_response, too_large, Body, Unread,
};
use crate::protocol::era;
use crate::protocol::handshake::{self, InitializeResult};
use crate::registry::limits::HandshakeSlot;
use crate::registry::Registry;
use crate::sys::secret::Token;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The session header of Streamable HTTP.
pub(super) const SESSION_HEADER: &str = "mcp-session-id";
/// `closeDiff` waits at most this long for its session's adapter.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// One editor's endpoint: its port, token and live MCP sessions.
pub(super) struct Endpoint {
    reg: Arc<Registry>,
    editor: String,
    port: u16,
    token: Token,
    stop: CancellationToken,
    sessions: Mutex<HashMap<String, Arc<McpSession>>>,
}

impl Endpoint {
    /// An endpoint for `editor` on `port`, serving until `stop`.
    pub(super) fn new(
        reg: Arc<Registry>,
        editor: String,
        port: u16,
        token: Token,
        stop: CancellationToken,
    ) -> Self {
        Endpoint {
            reg,
            editor,
            port,
            token,
            stop,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    #[allow(clippy::result_large_err)] // the refusal is the response itself
    fn session(&self, req: &Request<Incoming>) -> Result<Arc<McpSession>, Response<Body>> {
        let Some(id) = req
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
        else {
            return Err(plain(
                StatusCode::BAD_REQUEST,
                "Mcp-Session-Id header required (initialize first)",
            ));
        };
        let found = crate::platform::sync::lock(&self.sessions).get(id).cloned();
        match found {
            Some(s) if !s.ended.is_cancelled() => Ok(s),
            _ => Err(plain(
                StatusCode::NOT_FOUND,
                "unknown or ended session; initialize again",
            )),
        }
    }
}

/// Accepts connections until the endpoint stops.
pub(super) async fn accept_loop(ep: Arc<Endpoint>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            _ = ep.stop.cancelled() => return,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "gemini accept failed; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let slot = ep.reg.limits.handshake("gemini").await;
        let _ = stream.set_nodelay(true);
        ep.reg.tracker.spawn(connection(ep.clone(), stream, slot));
    }
}

/// One HTTP connection: its handshake place is given back once a request with the token is in
/// (until then it is closed at the handshake deadline, as any connection is).
async fn connection(ep: Arc<Endpoint>, stream: TcpStream, slot: HandshakeSlot) {
    let closer = slot.closer();
    let heard = slot.heard();
    let place = Arc::new(Mutex::new(Some(slot)));
    let cancel = ep.reg.cancel.clone();
    let editor = ep.editor.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (ep, place) = (ep.clone(), place.clone());
        async move {
            let answer = match check(&ep, &req) {
                Err(refused) => refused,
                Ok(()) => {
                    // A client with the token is no flood: its place goes back, and its
                    // keep-alive connection may idle between requests.
                    crate::platform::sync::lock(&place).take();
                    route(&ep, req).await
                }
            };
            Ok::<_, Infallible>(answer)
        }
    });
    let conn = crate::frontdoor::serve_http(stream, &heard, svc);
    tokio::select! {
        r = conn => if let Err(e) = r { tracing::debug!(editor = %editor, error = %e, "gemini connection ended") },
        why = closer => tracing::debug!(editor = %editor, reason = why, "gemini connection closed in its handshake"),
        _ = cancel.cancelled() => {}
    }
}

/// One request whose token was checked ([`check`]), routed.
async fn route(ep: &Arc<Endpoint>, req: Request<Incoming>) -> Response<Body> {
    if req.uri().path() != "/mcp" {
        return plain(StatusCode::NOT_FOUND, "the MCP endpoint is /mcp");
    }
    match *req.method() {
        Method::POST => post(ep, req).await,
        Method::GET => get_stream(ep, &req),
        Method::DELETE => match ep.session(&req) {
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

/// Refuses browsers (any `Origin`), foreign `Host`s and a missing or wrong token.
#[allow(clippy::result_large_err)] // the refusal is the response itself
fn check(ep: &Endpoint, req: &Request<Incoming>) -> Result<(), Response<Body>> {
    let h = req.headers();
    if h.contains_key(header::ORIGIN) {
        tracing::warn!(editor = %ep.editor, "refused a gemini request carrying an Origin header (browser?)");
        return Err(plain(
            StatusCode::FORBIDDEN,
            "requests with an Origin header are refused",
        ));
    }
    let host = h
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let port = ep.port.to_string();
    let host_ok = host.rsplit_once(':').is_some_and(|(name, p)| {
        p == port && (name == "127.0.0.1" || name.eq_ignore_ascii_case("localhost"))
    });
    if !host_ok {
        tracing::warn!(editor = %ep.editor, host, "refused a gemini request for a foreign Host (DNS rebinding?)");
        return Err(plain(
            StatusCode::FORBIDDEN,
            "Host must be 127.0.0.1:<port> or localhost:<port>",
        ));
    }
    let presented = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(t) if ep.token.matches(t.as_bytes()) => Ok(()),
        Some(_) => {
            tracing::info!(editor = %ep.editor, "refused a gemini request with a wrong token");
            Err(plain(StatusCode::UNAUTHORIZED, "invalid token"))
        }
        None => {
            tracing::info!(editor = %ep.editor, "refused a gemini request without a bearer token");
            Err(plain(
                StatusCode::UNAUTHORIZED,
                "Authorization: Bearer <token> required (the token is in the discovery file)",
            ))
        }
    }
}

/// `POST /mcp`: one JSON-RPC message.
async fn post(ep: &Arc<Endpoint>, req: Request<Incoming>) -> Response<Body> {
    let json_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_type {
        return plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
        );
    }
    let session = if has_no_session(&req) {
        None
    } else {
        match ep.session(&req) {
            Ok(s) => Some(s),
            Err(r) => return r,
        }
    };
    let max = ep.reg.config().max_frame_bytes;
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > max as u64) {
        return too_large(max);
    }
    // The body's memory is claimed from the budget for messages in flight (the owner's share:
    // the token is in a 0600 file), and given back, with the body, once it is parsed.
    let msg: Value = {
        let mut claim = ep.reg.frames.share(None).claim();
        let body = match read_body(req.into_body(), max, announced, &mut claim).await {
            Ok(b) => b,
            Err(Unread::TooLarge) => return too_large(max),
            Err(Unread::Busy) => return busy(),
        };
        match serde_json::from_slice(&body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                return rpc_error_response(
                    &Value::Null,
                    crate::protocol::jsonrpc::INVALID_REQUEST,
                    "one JSON-RPC message per request (no batches)",
                )
            }
            Err(e) => {
                return rpc_error_response(
                    &Value::Null,
                    crate::protocol::jsonrpc::PARSE_ERROR,
                    &format!("Parse error: {e}"),
                )
            }
        }
    };
    let method = msg.get("method").and_then(Value::as_str);
    let id = msg.get("id").unwrap_or(&Value::Null);
    if let (Some(m), false) = (method, id.is_null()) {
        if let Some(answered) = stateless(&session, m, id, &msg).await {
            return answered;
        }
    }
    match (session, method) {
        (None, Some(handshake::INITIALIZE)) if !id.is_null() => {
            initialize(ep, id, msg.get("params"))
        }
        (None, _) => plain(
            StatusCode::BAD_REQUEST,
            "Mcp-Session-Id header required (initialize first)",
        ),
        // A notification or an answer: nothing to say back.
        (Some(_), None) | (Some(_), Some(_)) if id.is_null() => empty(StatusCode::ACCEPTED),
        (Some(_), None) => empty(StatusCode::ACCEPTED),
        (Some(s), Some(m)) => rpc_response(id, request(&s, m, msg.get("params")).await),
    }
}

/// A request the broker answers by its era (MCP 2026-07-28, `protocol::era`): discovery, a
/// version it does not speak (HTTP 400, as the revision says), a removed method, and a modern
/// request, with or without a session. `None`: a 2025-era request, served as before.
async fn stateless(
    session: &Option<Arc<McpSession>>,
    method: &str,
    id: &Value,
    msg: &Value,
) -> Option<Response<Body>> {
    let era = match msg {
        Value::Object(m) => era::of(m),
        _ => era::Era::Legacy,
    };
    if let era::Era::Unsupported(v) = &era {
        return Some(json_text(StatusCode::BAD_REQUEST, era::unsupported(id, v)));
    }
    if method == "server/discover" {
        let text = era::discover(id, "pi-ide-broker", "Gemini CLI's IDE companion for the editor this endpoint stands for: openDiff and closeDiff, with the outcome as ide/diffAccepted or ide/diffRejected on the session's stream (initialize for a session).");
        return Some(json_text(StatusCode::OK, text));
    }
    if era != era::Era::Modern {
        return None;
    }
    if era::REMOVED.contains(&method) {
        return Some(json_text(StatusCode::OK, era::removed(id, method)));
    }
    let outcome = match (session, method) {
        (_, "tools/list") => Ok(json!({"tools": tools()})),
        (Some(s), m) => request(s, m, msg.get("params")).await,
        // A diff's outcome comes on the session's event stream: there is none without one.
        (None, _) => Err((
            crate::protocol::jsonrpc::INVALID_REQUEST,
            "this door's tools report on a session's event stream: initialize first (Mcp-Session-Id)".to_string(),
        )),
    };
    let body = match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    };
    let text = era::modernize(&body.to_string(), method == "tools/list");
    Some(json_text(StatusCode::OK, text))
}

/// True for a request without a session header (which must be `initialize`).
fn has_no_session(req: &Request<Incoming>) -> bool {
    !req.headers().contains_key(SESSION_HEADER)
}

/// `initialize`: a new session (a broker session on this endpoint's editor).
fn initialize(ep: &Arc<Endpoint>, id: &Value, params: Option<&Value>) -> Response<Body> {
    let Some(place) = ep.reg.limits.session("gemini") else {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many sessions (max_sessions)",
        );
    };
    let session = match McpSession::start(&ep.reg, &ep.editor, place) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(editor = %ep.editor, error = %e, "cannot start a gemini session");
            return plain(StatusCode::INTERNAL_SERVER_ERROR, "cannot start a session");
        }
    };
    crate::platform::sync::lock(&ep.sessions).insert(session.id.clone(), session.clone());
    forget_when_ended(ep, &session);
    let mut r = rpc_response(id, Ok(initialize_result(params)));
    if let Ok(v) = HeaderValue::from_str(&session.id) {
        r.headers_mut().insert(SESSION_HEADER, v);
    }
    r
}

/// `initialize`'s result: the client's version when it names one (a date), and tools whose
/// list never changes (the two of [`tools`], whatever the editor: no `list_changed` is ever
/// sent, so none is promised).
fn initialize_result(params: Option<&Value>) -> Value {
    let version = params
        .and_then(|p| p.get("protocolVersion"))
        .and_then(Value::as_str)
        .filter(|v| {
            v.len() == 10
                && v.as_bytes()
                    .iter()
                    .all(|b| b.is_ascii_digit() || *b == b'-')
        })
        .unwrap_or("2025-06-18");
    InitializeResult::broker(version, false).to_value()
}

/// Drops the endpoint's record of `session` once it is over.
fn forget_when_ended(ep: &Arc<Endpoint>, session: &Arc<McpSession>) {
    let (ep, s) = (ep.clone(), session.clone());
    ep.reg.clone().tracker.spawn(async move {
        s.ended.cancelled().await;
        crate::platform::sync::lock(&ep.sessions).remove(&s.id);
    });
}

/// A request of a live session: its result, or a JSON-RPC error (code, message).
async fn request(
    s: &McpSession,
    method: &str,
    params: Option<&Value>,
) -> Result<Value, (i64, String)> {
    match method {
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools()})),
        "tools/call" => {
            let name = params
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let args = params.and_then(|p| p.get("arguments"));
            Ok(call(s, name, args).await)
        }
        m => Err((
            crate::protocol::jsonrpc::METHOD_NOT_FOUND,
            format!("Method not found: {m}"),
        )),
    }
}

/// The two tools Gemini CLI needs listed to turn its IDE diffs on.
fn tools() -> Value {
    json!([
        {"name": "openDiff", "description": "Open a diff of a file with new content proposed, for the user to review in the editor; the outcome comes as ide/diffAccepted or ide/diffRejected.",
         "inputSchema": {"type": "object", "properties": {"filePath": {"type": "string"}, "newContent": {"type": "string"}}, "required": ["filePath", "newContent"]}},
        {"name": "closeDiff", "description": "Close the diff of a file; answers the content proposed for it.",
         "inputSchema": {"type": "object", "properties": {"filePath": {"type": "string"}, "suppressNotification": {"type": "boolean"}}, "required": ["filePath"]}},
    ])
}

/// A `tools/call`: its `CallToolResult` (errors as `isError`, as MCP tools report them).
async fn call(s: &McpSession, name: &str, args: Option<&Value>) -> Value {
    let path = args.and_then(|a| a.get("filePath")).and_then(Value::as_str);
    let Some(path) = path.filter(|p| crate::protocol::winpath::is_absolute(p)) else {
        return tool_error(&format!("{name}: filePath (an absolute path) is required"));
    };
    match name {
        "openDiff" => {
            let Some(content) = args
                .and_then(|a| a.get("newContent"))
                .and_then(Value::as_str)
            else {
                return tool_error("openDiff: newContent (a string) is required");
            };
            let cmd = Command::OpenDiff {
                path: path.into(),
                content: content.into(),
            };
            if s.command(cmd) {
                json!({"content": []})
            } else {
                tool_error("the editor's session is over")
            }
        }
        "closeDiff" => {
            let suppress = args
                .and_then(|a| a.get("suppressNotification"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let (reply, answer) = tokio::sync::oneshot::channel();
            if !s.command(Command::CloseDiff {
                path: path.into(),
                suppress,
                reply,
            }) {
                return tool_error("the editor's session is over");
            }
            let text = tokio::time::timeout(CLOSE_WAIT, answer)
                .await
                .ok()
                .and_then(Result::ok)
                .flatten();
            json!({"content": [{"type": "text", "text": json!({"content": text}).to_string()}]})
        }
        other => tool_error(&format!(
            "unknown tool {other:?}; the tools are openDiff and closeDiff"
        )),
    }
}

fn tool_error(text: &str) -> Value {
    json!({"isError": true, "content": [{"type": "text", "text": text}]})
}

/// `GET /mcp`: the session's event stream (server-sent events), replacing an older one.
fn get_stream(ep: &Endpoint, req: &Request<Incoming>) -> Response<Body> {
    let accepts = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !accepts {
        return plain(
            StatusCode::NOT_ACCEPTABLE,
            "Accept: text/event-stream required",
        );
    }
    let session = match ep.session(req) {
        Ok(s) => s,
        Err(r) => return r,
    };
    session.stream()
}

fn rpc_error_response(id: &Value, code: i64, message: &str) -> Response<Body> {
    let mut r = rpc_response(id, Err((code, message.to_string())));
    *r.status_mut() = StatusCode::BAD_REQUEST;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemini CLI is told the door's tool list is fixed (`listChanged: false`, issue 63: nothing
    /// read it), in the version it asked for when that is a date.
    #[test]
    fn initialize_promises_a_fixed_tool_list_in_the_clients_version() {
        let r = initialize_result(Some(&json!({"protocolVersion": "2025-03-26"})));
        assert_eq!(r["capabilities"]["tools"]["listChanged"], false, "{r}");
        assert_eq!(r["protocolVersion"], "2025-03-26");
        assert_eq!(r["serverInfo"]["name"], "pi-ide-broker");
        for odd in [
            json!({"protocolVersion": "latest"}),
            json!({"protocolVersion": 7}),
            json!({}),
        ] {
            let r = initialize_result(Some(&odd));
            assert_eq!(r["protocolVersion"], "2025-06-18", "{odd}");
        }
        assert_eq!(initialize_result(None)["protocolVersion"], "2025-06-18");
        let names: Vec<Value> = tools()
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| t["name"].clone())
            .collect();
        assert_eq!(names, vec![json!("openDiff"), json!("closeDiff")]);
    }
}
