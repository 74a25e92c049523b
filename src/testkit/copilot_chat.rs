//! A fake Copilot Chat VS Code server: its lockfile, and MCP over HTTP on a Unix socket.
//!
//! VS Code's Copilot Chat extension as Copilot CLI's editor.
//! Built from the public source, microsoft/vscode-copilot-chat at commit
//! 31acd00a86424e2ee6e980e54919cf31fbf88030, `src/extension/chatSessions/copilotcli/vscode-node/`:
//! `lockFile.ts` (`<uuid>.lock`, 0600, in a 0700 dir: `{socketPath, scheme: "unix", headers:
//! {Authorization: "Nonce <uuid>"}, pid, ideName, timestamp, workspaceFolders, isTrusted}`),
//! `inProcHttpServer.ts` (the socket in a `mcp-*` dir of its own, 0700; 401 on a wrong nonce;
//! the session id from `mcp-session-id` or `x-copilot-session-id`, 400 without one, 409 on a
//! second `initialize`, 400 for a sessionless request that is not `initialize`; `Host` must be
//! exactly `localhost`; answers as server-sent events; GET and DELETE need a known session),
//! `contribution.ts` and `tools/{getVscodeInfo,getSelection,getDiagnostics,openDiff,closeDiff,
//! updateSessionName}.ts`, `tools/push/{selectionChanged,diagnosticsChanged}.ts`. That snapshot
//! has no `show_notification` tool, so neither has the fake. A diff waits for the test's
//! Accept or Reject (`accept`, `reject`), as the real one waits for its buttons.

use crate::platform::sync::lock;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

type Body = BoxBody<Bytes, Infallible>;

/// How the fake starts.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The workspace folders its lockfile lists.
    pub folders: Vec<String>,
    /// The nonce its lockfile states, when it differs from the one the server checks (a
    /// lockfile that lies, or a stale one).
    pub lockfile_nonce: Option<String>,
}

/// What the test hears of the fake.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A tool was called (`open_diff` is told when its diff is open).
    Call {
        /// The tool.
        tool: String,
        /// Its arguments.
        args: Value,
    },
    /// A request was refused with this status.
    Refused(u16),
}

#[derive(Default)]
struct Shared {
    nonce: String,
    /// Live sessions: their event streams' senders (none until a GET).
    sessions: Mutex<HashMap<String, Vec<mpsc::UnboundedSender<String>>>>,
    selection: Mutex<Value>,
    diagnostics: Mutex<Value>,
    diffs: Mutex<HashMap<String, oneshot::Sender<&'static str>>>,
    events: Mutex<Option<mpsc::UnboundedSender<Event>>>,
}

impl Shared {
    fn tell(&self, e: Event) {
        if let Some(tx) = lock(&self.events).as_ref() {
            let _ = tx.send(e);
        }
    }

    fn push(&self, method: &str, params: Value) {
        let msg = json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string();
        for senders in lock(&self.sessions).values_mut() {
            senders.retain(|s| s.send(msg.clone()).is_ok());
        }
    }
}

/// A running fake Copilot Chat server.
pub struct FakeCopilotChat {
    /// Its lockfile.
    pub lockfile: PathBuf,
    /// Its socket.
    pub socket: PathBuf,
    shared: Arc<Shared>,
    events: mpsc::UnboundedReceiver<Event>,
    stop: CancellationToken,
}

impl FakeCopilotChat {
    /// Starts one: its socket in a fresh `mcp-*` dir under `sockets`, its lockfile in `ide_dir`.
    pub async fn start(ide_dir: &Path, sockets: &Path, opts: Options) -> FakeCopilotChat {
        let id = crate::frontdoor::copilot::editor::uuid().expect("random");
        let sock_dir = sockets.join(format!("mcp-{}", &id[..8]));
        std::fs::create_dir_all(&sock_dir).expect("socket dir");
        std::fs::set_permissions(&sock_dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let socket = sock_dir.join("mcp.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        let nonce = crate::frontdoor::copilot::editor::uuid().expect("random");
        let (tx, events) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            nonce: nonce.clone(),
            selection: Mutex::new(Value::Null),
            diagnostics: Mutex::new(json!([])),
            events: Mutex::new(Some(tx)),
            ..Shared::default()
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, shared.clone(), stop.clone()));
        std::fs::create_dir_all(ide_dir).expect("ide dir");
        std::fs::set_permissions(ide_dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let lockfile = ide_dir.join(format!("{id}.lock"));
        let stated = opts.lockfile_nonce.unwrap_or(nonce);
        let body = json!({
            "socketPath": socket, "scheme": "unix",
            "headers": {"Authorization": format!("Nonce {stated}")},
            "pid": std::process::id(), "ideName": "Visual Studio Code",
            "timestamp": 1_700_000_000_000u64, "workspaceFolders": opts.folders, "isTrusted": true,
        });
        std::fs::write(
            &lockfile,
            serde_json::to_string_pretty(&body).expect("json"),
        )
        .expect("lockfile");
        std::fs::set_permissions(&lockfile, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        FakeCopilotChat {
            lockfile,
            socket,
            shared,
            events,
            stop,
        }
    }

    /// Selects `text` at `line` (0-based) of `path` and pushes `selection_changed`.
    pub fn select(&self, path: &str, text: &str, line: u64) {
        let end = text.chars().count() as u64;
        let sel = json!({"text": text, "filePath": path, "fileUrl": format!("file://{path}"),
            "selection": {"start": {"line": line, "character": 0}, "end": {"line": line, "character": end}, "isEmpty": text.is_empty()}});
        let mut current = sel.clone();
        current["current"] = json!(true);
        *lock(&self.shared.selection) = current;
        self.shared.push("selection_changed", sel);
    }

    /// Sets one diagnostic (lowercase severity, as VS Code's names) on `path` and pushes
    /// `diagnostics_changed`.
    pub fn diagnose(&self, path: &str, severity: &str, message: &str) {
        let d = json!({"message": message, "severity": severity, "source": "fake",
            "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}}});
        let uri = format!("file://{path}");
        *lock(&self.shared.diagnostics) =
            json!([{"uri": uri, "filePath": path, "diagnostics": [d.clone()]}]);
        self.shared.push(
            "diagnostics_changed",
            json!({"uris": [{"uri": uri, "diagnostics": [d]}]}),
        );
    }

    /// The next event (at most [`super::WAIT`]).
    pub async fn next_event(&mut self) -> Event {
        super::within("a copilot chat event", self.events.recv())
            .await
            .expect("the fake runs")
    }

    /// Waits for an `open_diff` and returns its arguments.
    pub async fn next_diff(&mut self) -> Value {
        loop {
            if let Event::Call { tool, args } = self.next_event().await {
                if tool == "open_diff" {
                    return args;
                }
            }
        }
    }

    /// The Accept button of diff `tab`; false when it is not open.
    pub fn accept(&self, tab: &str) -> bool {
        lock(&self.shared.diffs)
            .remove(tab)
            .is_some_and(|d| d.send("SAVED").is_ok())
    }

    /// The Reject button of diff `tab`; false when it is not open.
    pub fn reject(&self, tab: &str) -> bool {
        lock(&self.shared.diffs)
            .remove(tab)
            .is_some_and(|d| d.send("REJECTED").is_ok())
    }

    /// Sessions open now.
    pub fn sessions(&self) -> usize {
        lock(&self.shared.sessions).len()
    }
}

impl Drop for FakeCopilotChat {
    /// As the extension's dispose: the lockfile and the socket dir go, the server stops.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.lockfile);
        if let Some(d) = self.socket.parent() {
            let _ = std::fs::remove_dir_all(d);
        }
        self.stop.cancel();
    }
}

async fn accept(listener: tokio::net::UnixListener, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r { Ok((s, _)) => s, Err(_) => return },
        };
        let (shared, stop) = (shared.clone(), stop.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(serve(&shared, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

fn full(status: StatusCode, ctype: &'static str, text: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(text)).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    r
}

fn rpc_error(status: StatusCode, message: &str) -> Response<Body> {
    let body = json!({"jsonrpc": "2.0", "error": {"code": -32000, "message": message}, "id": null});
    full(status, "application/json", body.to_string())
}

/// One request, in the order the real server checks: nonce, then the route.
async fn serve(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let h = req.headers();
    let header = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).map(str::to_string);
    if header("authorization").as_deref() != Some(format!("Nonce {}", shared.nonce).as_str()) {
        shared.tell(Event::Refused(401));
        return full(
            StatusCode::UNAUTHORIZED,
            "text/plain",
            "Unauthorized".into(),
        );
    }
    let session = header("mcp-session-id").or_else(|| header("x-copilot-session-id"));
    if header("host").as_deref() != Some("localhost") {
        shared.tell(Event::Refused(403));
        return rpc_error(StatusCode::FORBIDDEN, "Invalid Host header");
    }
    match *req.method() {
        Method::POST => post(shared, req, session).await,
        Method::GET | Method::DELETE => {
            let known = header("mcp-session-id").filter(|s| lock(&shared.sessions).contains_key(s));
            let Some(s) = known else {
                shared.tell(Event::Refused(400));
                return full(
                    StatusCode::BAD_REQUEST,
                    "text/plain",
                    "Invalid or missing session ID".into(),
                );
            };
            if req.method() == Method::DELETE {
                lock(&shared.sessions).remove(&s);
                return full(StatusCode::OK, "text/plain", String::new());
            }
            let (tx, rx) = mpsc::unbounded_channel::<String>();
            if let Some(v) = lock(&shared.sessions).get_mut(&s) {
                v.push(tx);
            }
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                let m = rx.recv().await?;
                Some((
                    Ok::<_, Infallible>(Frame::data(Bytes::from(format!(
                        "event: message\ndata: {m}\n\n"
                    )))),
                    rx,
                ))
            });
            let mut r = Response::new(StreamBody::new(stream).boxed());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/event-stream"),
            );
            r
        }
        _ => full(StatusCode::METHOD_NOT_ALLOWED, "text/plain", String::new()),
    }
}

/// `POST /mcp`: the session rules, then the message.
async fn post(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    session: Option<String>,
) -> Response<Body> {
    let Some(session) = session else {
        shared.tell(Event::Refused(400));
        return rpc_error(
            StatusCode::BAD_REQUEST,
            "Bad Request: Session ID must be a single, defined, string value",
        );
    };
    let accept = req
        .headers()
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !(accept.contains("application/json") && accept.contains("text/event-stream")) {
        return rpc_error(StatusCode::NOT_ACCEPTABLE, "Not Acceptable");
    }
    let Ok(body) = req.into_body().collect().await else {
        return rpc_error(StatusCode::BAD_REQUEST, "body");
    };
    let msg: Value = serde_json::from_slice(&body.to_bytes()).unwrap_or(Value::Null);
    let method = msg["method"].as_str().unwrap_or("").to_string();
    let known = lock(&shared.sessions).contains_key(&session);
    if method == "initialize" {
        if known {
            shared.tell(Event::Refused(409));
            return rpc_error(
                StatusCode::CONFLICT,
                "Conflict: A connection for this session already exists",
            );
        }
        lock(&shared.sessions).insert(session.clone(), Vec::new());
        let result = json!({"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "vscode-copilot-cli", "title": "VS Code Copilot CLI", "version": "0.0.1"}});
        let mut r = sse(&msg["id"], result);
        if let Ok(v) = hyper::header::HeaderValue::from_str(&session) {
            r.headers_mut().insert("mcp-session-id", v);
        }
        return r;
    }
    if !known {
        shared.tell(Event::Refused(400));
        return rpc_error(
            StatusCode::BAD_REQUEST,
            "Bad Request: No valid session ID provided",
        );
    }
    if msg.get("id").is_none() {
        return full(StatusCode::ACCEPTED, "text/plain", String::new());
    }
    let result = match method.as_str() {
        "tools/list" => {
            let names = [
                "get_vscode_info",
                "get_selection",
                "get_diagnostics",
                "open_diff",
                "close_diff",
                "update_session_name",
            ];
            let tools: Vec<Value> = names
                .iter()
                .map(|n| json!({"name": n, "inputSchema": {"type": "object"}}))
                .collect();
            json!({"tools": tools})
        }
        "tools/call" => tool(shared, &msg["params"]).await,
        _ => json!({}),
    };
    sse(&msg["id"], result)
}

/// An answer framed as the SDK frames it by default: one server-sent event.
fn sse(id: &Value, result: Value) -> Response<Body> {
    let msg = json!({"jsonrpc": "2.0", "id": id, "result": result});
    full(
        StatusCode::OK,
        "text/event-stream",
        format!("event: message\ndata: {msg}\n\n"),
    )
}

fn text(v: &Value) -> Value {
    json!({"content": [{"type": "text", "text": serde_json::to_string_pretty(v).unwrap_or_default()}]})
}

/// A tool, as `tools/*.ts` answer.
async fn tool(shared: &Arc<Shared>, params: &Value) -> Value {
    let name = params["name"].as_str().unwrap_or("").to_string();
    let args = params.get("arguments").cloned().unwrap_or(json!({}));
    let arg = |k: &str| args[k].as_str().unwrap_or("").to_string();
    let answer = match name.as_str() {
        "get_vscode_info" => text(&json!({"version": "1.99.0", "appName": "Visual Studio Code"})),
        "get_selection" => text(&lock(&shared.selection).clone()),
        "get_diagnostics" => {
            let all = lock(&shared.diagnostics).clone();
            let uri = args.get("uri").and_then(Value::as_str);
            let files: Vec<Value> = all
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|f| uri.is_none_or(|u| f["uri"] == u))
                .collect();
            text(&Value::Array(files))
        }
        "open_diff" => {
            let (tx, rx) = oneshot::channel();
            let tab = arg("tab_name");
            lock(&shared.diffs).insert(tab.clone(), tx);
            shared.tell(Event::Call {
                tool: name.clone(),
                args: args.clone(),
            });
            let (result, trigger) = match rx.await {
                Ok("SAVED") => ("SAVED", "accepted_via_button"),
                Ok("CLOSED") => ("REJECTED", "closed_via_tool"),
                Ok(_) => ("REJECTED", "rejected_via_button"),
                Err(_) => ("REJECTED", "closed_via_tool"),
            };
            let verb = if result == "SAVED" {
                "accepted"
            } else {
                "rejected"
            };
            return text(
                &json!({"success": true, "result": result, "trigger": trigger, "tab_name": tab,
                "message": format!("User {verb} changes for {}", arg("original_file_path"))}),
            );
        }
        "close_diff" => {
            let tab = arg("tab_name");
            let open = lock(&shared.diffs).remove(&tab);
            let already = open.is_none();
            if let Some(d) = open {
                let _ = d.send("CLOSED");
            }
            text(
                &json!({"success": true, "already_closed": already, "tab_name": tab, "message": "closed"}),
            )
        }
        "update_session_name" => text(&json!({"success": true})),
        _ => {
            json!({"content": [{"type": "text", "text": format!("Tool {name} not found")}], "isError": true})
        }
    };
    shared.tell(Event::Call { tool: name, args });
    answer
}
