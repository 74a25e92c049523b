//! The copilot door's MCP endpoint for one editor: Streamable HTTP on a private Unix socket.
//!
//! `POST /mcp` carries one JSON-RPC message (answered as `application/json`; `initialize`
//! mints the `mcp-session-id`; `server/discover` is answered -32601, so Copilot CLI takes the
//! session flow with an event stream), `GET /mcp` is the session's event stream, `DELETE /mcp`
//! ends the session. Both MCP eras are served, as the stdio door serves them: a request with
//! an `mcp-session-id` belongs to that 2025-era session whatever its `_meta` says (Copilot
//! CLI's model calls in a legacy session carry a 2026-07-28 version); one without, whose
//! `_meta` names 2026-07-28 (`protocol::era`), is stateless: `tools/list` is answered as is,
//! `tools/call` on a stateless session of that caller (its `X-Copilot-Session-Id`, pid and
//! realm) pinned to the editor, which ends when idle; answers are modern-shaped. Only the user's own processes are served (the peer's uid from the
//! kernel), each connection's rights decided once at accept (`rights::decide`): one in another
//! namespace (a container) is an agent, its sessions carry its realm and its connections
//! count against the agent budget. Every request is checked before anything else: no
//! `Origin`, `Host: localhost`, the lockfile's nonce (constant time); bodies are bounded by
//! `max_frame_bytes`.

use super::session::{Answer, Command, McpSession};
use super::tools;
use crate::frontdoor::mcp_http::json_text;
use crate::frontdoor::mcp_http::{
    busy, empty, plain, read_body, rpc_response, too_large, Body, Unread,
};
use crate::protocol::era;
use crate::protocol::handshake::{InitializeResult, INITIALIZE};
use crate::protocol::jsonrpc;
use crate::registry::Registry;
use crate::sys::secret::Token;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The session header of Streamable HTTP.
pub(super) const SESSION_HEADER: &str = "mcp-session-id";
/// The header naming Copilot CLI's own session (on every request, both eras).
const COPILOT_SESSION_HEADER: &str = "x-copilot-session-id";
/// A short tool (diagnostics, `close_diff`) waits at most this long (Copilot CLI gives 60 s).
const SHORT_WAIT: Duration = Duration::from_secs(55);

/// One editor's endpoint: its nonce and live MCP sessions.
pub(super) struct Endpoint {
    reg: Arc<Registry>,
    editor: String,
    nonce: Token,
    stop: CancellationToken,
    sessions: Mutex<HashMap<String, Arc<McpSession>>>,
    /// The stateless (2026-07-28) sessions, by caller.
    stateless: Mutex<HashMap<String, Arc<McpSession>>>,
}

impl Endpoint {
    /// An endpoint for `editor`, serving until `stop`.
    pub(super) fn new(
        reg: Arc<Registry>,
        editor: String,
        nonce: Token,
        stop: CancellationToken,
    ) -> Self {
        Endpoint {
            reg,
            editor,
            nonce,
            stop,
            sessions: Mutex::new(HashMap::new()),
            stateless: Mutex::new(HashMap::new()),
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

/// Who is on a connection, as decided at accept: its pid (the kernel's) and, for an agent, its
/// realm.
#[derive(Clone, Debug)]
pub(super) struct Caller {
    /// The peer's pid, where the kernel gives one.
    pub(super) pid: Option<u32>,
    /// An agent's realm (`container:mnt:[…]`, …); `None` for the user's own local process.
    pub(super) realm: Option<String>,
}

/// Accepts connections until the endpoint stops. Each peer's rights are decided here, once
/// (`admit`); an agent's connection holds a place of its realm's budget for its life.
pub(super) async fn accept_loop(ep: Arc<Endpoint>, listener: crate::platform::local::Listener) {
    loop {
        let accepted = tokio::select! {
            _ = ep.stop.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok(stream) => {
                let Some(caller) = admit(&ep.editor, &stream) else {
                    continue;
                };
                let budget = match caller.realm.as_deref() {
                    None => None,
                    Some(realm) => match ep.reg.limits.agent_connection(realm) {
                        Ok(slot) => Some(slot),
                        Err(why) => {
                            tracing::warn!(editor = %ep.editor, origin = realm, "copilot door: refused a connection: {why}");
                            continue;
                        }
                    },
                };
                let slot = ep.reg.limits.handshake("copilot").await;
                let ep2 = ep.clone();
                ep.reg.tracker.spawn(async move {
                    connection(ep2, stream, slot, caller).await;
                    drop(budget);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "copilot accept failed; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The rights of the peer on `stream` (`rights::decide`, from the kernel's facts), or `None`
/// (logged; the connection is closed unanswered) for another uid: the socket is the user's
/// alone, whatever `allow_uids` and `owner_uids` grant on the main one.
fn admit(editor: &str, stream: &crate::platform::local::Stream) -> Option<Caller> {
    use crate::frontdoor::rights::{decide, Grants, Socket};
    let facts = match crate::platform::peer::of_stream(stream) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(editor, error = %e, "copilot door: refused a connection whose credentials could not be read");
            return None;
        }
    };
    let none = Grants {
        allow_uids: &[],
        owner_uids: &[],
    };
    let me = crate::platform::user::uid();
    match decide(
        &Socket::Main,
        &facts,
        me,
        crate::platform::peer::own_place(),
        none,
    ) {
        Ok(peer) => {
            let realm = peer.realm();
            if realm.is_some() {
                tracing::debug!(editor, origin = ?realm, "copilot door: a connection with an agent's rights only: {}", peer.why());
            }
            Some(Caller {
                pid: facts.pid,
                realm,
            })
        }
        Err(_) => {
            tracing::warn!(editor, uid = facts.uid, pid = ?facts.pid, "copilot door: refused a connection of another user");
            None
        }
    }
}

/// One admitted connection, served over HTTP/1.1.
async fn connection(
    ep: Arc<Endpoint>,
    stream: crate::platform::local::Stream,
    slot: crate::registry::limits::HandshakeSlot,
    caller: Caller,
) {
    let caller = Arc::new(caller);
    let closer = slot.closer();
    let heard = slot.heard();
    let place = Arc::new(Mutex::new(Some(slot)));
    let cancel = ep.stop.clone();
    let editor = ep.editor.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (ep, place, caller) = (ep.clone(), place.clone(), caller.clone());
        async move {
            let answer = match check(&ep.nonce, req.headers()) {
                Err((status, why)) => {
                    tracing::warn!(editor = %ep.editor, "copilot door: refused a request: {why}");
                    plain(status, why)
                }
                Ok(()) => {
                    crate::platform::sync::lock(&place).take();
                    route(&ep, req, &caller).await
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
pub(super) fn check(nonce: &Token, h: &HeaderMap) -> Result<(), (StatusCode, &'static str)> {
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

/// One request that passed [`check`], routed; `caller` is who the kernel says is asking.
async fn route(ep: &Arc<Endpoint>, req: Request<Incoming>, caller: &Caller) -> Response<Body> {
    if req.uri().path() != "/mcp" {
        return plain(StatusCode::NOT_FOUND, "the MCP endpoint is /mcp");
    }
    match *req.method() {
        Method::POST => post(ep, req, caller).await,
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
async fn post(ep: &Arc<Endpoint>, req: Request<Incoming>, caller: &Caller) -> Response<Body> {
    let h = req.headers().clone();
    let msg = match read_message(ep, req, caller.realm.as_deref()).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let method = msg.get("method").and_then(Value::as_str);
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    if method == Some("server/discover") {
        // Offering 2026-07-28 would put Copilot CLI in its stateless mode: no event stream.
        return json_text(StatusCode::OK, discover(&id));
    }
    if !h.contains_key(SESSION_HEADER) {
        let era = msg.as_object().map_or(era::Era::Legacy, era::of);
        return match (method, era) {
            (Some(INITIALIZE), _) if !id.is_null() => {
                initialize(ep, &id, msg.get("params"), caller)
            }
            (_, era::Era::Modern) => {
                stateless(ep, &id, method, msg.get("params"), caller, &h).await
            }
            (Some(_), era::Era::Unsupported(v)) if !id.is_null() => {
                json_text(StatusCode::OK, era::unsupported(&id, &v))
            }
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

/// The answer to `server/discover`: the 2025 versions only, without 2026-07-28. Copilot CLI
/// 1.0.102 then falls back to `initialize` (2025-11-25) and the session flow with an event
/// stream, the only one that carries the editor's selection pushes; offered 2026-07-28, it
/// would go stateless and see no selection until it asked. A stateless request is still
/// served (`stateless`), for a client that sends one anyway.
fn discover(id: &Value) -> String {
    let versions: Vec<&str> = era::SUPPORTED
        .into_iter()
        .filter(|v| *v != era::MODERN)
        .collect();
    era::discover_offering(id, "pi-ide-broker", INSTRUCTIONS, &versions)
}

/// What the door's tools are for, said in `initialize` and `server/discover`.
const INSTRUCTIONS: &str =
    "The tools of the editor this lockfile names, through pi-ide-broker: its selection, diagnostics and diffs reviewed there.";

/// The body of a POST as one JSON-RPC message (read under `realm`'s share of the budget for
/// messages in flight), or the answer refusing it.
async fn read_message(
    ep: &Endpoint,
    req: Request<Incoming>,
    realm: Option<&str>,
) -> Result<Value, Response<Body>> {
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
    let mut claim = ep.reg.frames.share(realm).claim();
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

/// `initialize`: a new session, a broker session pinned to this endpoint's editor, carrying
/// the caller's realm.
fn initialize(
    ep: &Arc<Endpoint>,
    id: &Value,
    params: Option<&Value>,
    caller: &Caller,
) -> Response<Body> {
    let session = match new_session(ep, caller, false) {
        Ok(s) => s,
        Err(r) => return r,
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

/// A broker session pinned to this endpoint's editor for `caller` (its cwd, its realm), or
/// the answer refusing it.
#[allow(clippy::result_large_err)] // the refusal is the response itself
fn new_session(
    ep: &Endpoint,
    caller: &Caller,
    stateless: bool,
) -> Result<Arc<McpSession>, Response<Body>> {
    let Some(place) = ep.reg.limits.session("copilot") else {
        return Err(plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many sessions (max_sessions)",
        ));
    };
    let cwd = super::cwd_of(&ep.reg, &ep.editor, caller.pid);
    let who = (cwd, caller.realm.clone());
    McpSession::start(&ep.reg, &ep.editor, who, place, (&ep.stop, stateless)).map_err(|e| {
        tracing::warn!(editor = %ep.editor, error = %e, "cannot start a copilot session");
        plain(StatusCode::INTERNAL_SERVER_ERROR, "cannot start a session")
    })
}

/// A stateless (2026-07-28) request: `tools/list` answered here, `tools/call` on the caller's
/// stateless session; every answer modern-shaped (`protocol::era::modernize`).
async fn stateless(
    ep: &Arc<Endpoint>,
    id: &Value,
    method: Option<&str>,
    params: Option<&Value>,
    caller: &Caller,
    h: &HeaderMap,
) -> Response<Body> {
    let Some(method) = method.filter(|_| !id.is_null()) else {
        return empty(StatusCode::ACCEPTED); // a notification or an answer
    };
    if era::REMOVED.contains(&method) {
        return json_text(StatusCode::OK, era::removed(id, method));
    }
    let outcome = match method {
        "tools/call" => {
            let session = match stateless_session(ep, caller, h) {
                Ok(s) => s,
                Err(r) => return r,
            };
            let _in_use = session.hold();
            // Attached, the editor's selection replayed: what `get_selection` reads.
            tokio::select! {
                _ = session.ready.cancelled() => {}
                _ = session.ended.cancelled() => {}
                _ = tokio::time::sleep(SHORT_WAIT) => {}
            }
            request(&session, method, params).await
        }
        "tools/list" => Ok(json!({"tools": tools::list()})),
        m => Err((jsonrpc::METHOD_NOT_FOUND, format!("Method not found: {m}"))),
    };
    let text = match outcome {
        Ok(v) => jsonrpc::result(id, v),
        Err((code, message)) => jsonrpc::error(id, code, &message),
    };
    json_text(
        StatusCode::OK,
        era::modernize(&text, method == "tools/list"),
    )
}

/// The stateless session of `caller` (by Copilot CLI's session id, the peer's pid and realm),
/// started on its first call.
#[allow(clippy::result_large_err)] // the refusal is the response itself
fn stateless_session(
    ep: &Arc<Endpoint>,
    caller: &Caller,
    h: &HeaderMap,
) -> Result<Arc<McpSession>, Response<Body>> {
    let copilot = h
        .get(COPILOT_SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let key = format!("{copilot}\n{:?}\n{:?}", caller.pid, caller.realm);
    let mut all = crate::platform::sync::lock(&ep.stateless);
    if let Some(s) = all.get(&key).filter(|s| !s.ended.is_cancelled()) {
        return Ok(s.clone());
    }
    let session = new_session(ep, caller, true)?;
    tracing::info!(editor = %ep.editor, "copilot door: a stateless (MCP 2026-07-28) session");
    all.insert(key.clone(), session.clone());
    let (ep2, s) = (ep.clone(), session.clone());
    ep.reg.tracker.spawn(async move {
        s.ended.cancelled().await;
        let mut all = crate::platform::sync::lock(&ep2.stateless);
        if all.get(&key).is_some_and(|x| Arc::ptr_eq(x, &s)) {
            all.remove(&key);
        }
    });
    Ok(session)
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
    session.stream()
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
