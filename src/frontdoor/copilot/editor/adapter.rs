//! One Copilot Chat server as a Claude-family editor: a loopback WebSocket listener (a fresh
//! token, checked in constant time before the upgrade; browsers refused) speaking the editor
//! protocol the broker's links speak, each call translated (`map`) to the server's tools
//! through one MCP session of the broker's own (`client`), and its `selection_changed`
//! pushes passed on as a Claude-family editor sends them.

use super::client::{Upstream, SHORT};
use super::found::Found;
use super::map;
use crate::protocol::family::Family;
use crate::protocol::jsonrpc::{self, Incoming};
use crate::sys::secret::Token;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The upgrade must be done within this long.
const UPGRADE_WITHIN: Duration = Duration::from_secs(10);

/// The adapter of one Copilot Chat server.
pub(super) struct Adapter {
    /// The server's lockfile, as read.
    pub found: Found,
    /// The broker's session with the server.
    pub up: Arc<Upstream>,
    /// The token the broker's link presents (written in the adapter's Claude lockfile).
    pub token: Token,
    /// Tabs of the diffs open through it (for `closeAllDiffTabs`).
    diffs: Mutex<HashSet<String>>,
    /// The server's latest `selection_changed`, as sent to a link (replayed to a new one).
    selection: Mutex<Option<String>>,
    /// Notifications for every connected link.
    pushes: broadcast::Sender<String>,
    tracker: TaskTracker,
    /// Ends the listener, its connections and the session.
    pub stop: CancellationToken,
}

impl Adapter {
    /// An adapter for `found`, talking to it through `up`.
    pub(super) fn new(
        found: Found,
        up: Arc<Upstream>,
        tracker: TaskTracker,
        stop: CancellationToken,
    ) -> std::io::Result<Self> {
        Ok(Adapter {
            found,
            up,
            token: Token::generate()?,
            diffs: Mutex::new(HashSet::new()),
            selection: Mutex::new(None),
            pushes: broadcast::channel(64).0,
            tracker,
            stop,
        })
    }

    /// A message of the server's event stream: a selection is passed on; the rest (its
    /// `diagnostics_changed`, which no Claude-family editor sends) is dropped.
    pub(super) fn pushed(&self, msg: &Value) {
        if msg.get("method").and_then(Value::as_str) != Some("selection_changed") {
            return;
        }
        let text = jsonrpc::notification("selection_changed", map::selection_push(&msg["params"]));
        *crate::platform::sync::lock(&self.selection) = Some(text.clone());
        let _ = self.pushes.send(text);
    }

    /// Accepts the broker's links until stopped.
    pub(super) async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        loop {
            let accepted = tokio::select! {
                _ = self.stop.cancelled() => return,
                r = listener.accept() => r,
            };
            match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    self.tracker.spawn(self.clone().connection(stream));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "copilot chat adapter: accept failed; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// The upgrade's check: no `Origin` (a browser), the token in the Claude family's header.
    #[allow(clippy::result_large_err)] // the callback signature is tungstenite's
    fn check(&self, req: &Request, mut resp: Response) -> Result<Response, ErrorResponse> {
        let refuse = |why: &str| {
            let mut r = ErrorResponse::new(Some(format!("Bad WebSocket upgrade request: {why}")));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            r
        };
        let h = req.headers();
        if h.contains_key("origin") {
            tracing::warn!(
                "copilot chat adapter: refused a connection with an Origin header (browser?)"
            );
            return Err(refuse("requests with an Origin header are refused"));
        }
        let presented = h.get(Family::Claude.auth_header()).map(|v| v.as_bytes());
        if !presented.is_some_and(|p| self.token.matches(p)) {
            tracing::info!("copilot chat adapter: refused a connection without the right token");
            return Err(refuse("Invalid authentication token"));
        }
        if crate::frontdoor::offers_mcp(
            h.get("sec-websocket-protocol")
                .and_then(|v| v.to_str().ok()),
        ) {
            resp.headers_mut().insert(
                "sec-websocket-protocol",
                "mcp".parse().map_err(|_| refuse("subprotocol"))?,
            );
        }
        Ok(resp)
    }

    /// One link: requests answered as they complete (a diff waits for the user without
    /// holding up the rest), pushes passed on.
    #[allow(clippy::result_large_err)] // the callback signature is tungstenite's
    async fn connection(self: Arc<Self>, stream: TcpStream) {
        let me = self.clone();
        let upgrade = tokio_tungstenite::accept_hdr_async(stream, move |req: &Request, resp| {
            me.check(req, resp)
        });
        let ws = match tokio::time::timeout(UPGRADE_WITHIN, upgrade).await {
            Ok(Ok(ws)) => ws,
            _ => return,
        };
        let (mut sink, mut source) = ws.split();
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let mut pushes = self.pushes.subscribe();
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => {
                    let _ = sink.send(Message::Close(None)).await;
                    break;
                }
                Some(out) = rx.recv() => if sink.send(Message::text(out)).await.is_err() { break },
                p = pushes.recv() => match p {
                    Ok(text) => if sink.send(Message::text(text)).await.is_err() { break },
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                m = source.next() => match m {
                    Some(Ok(Message::Text(t))) => self.on_text(t.as_str(), &tx),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                },
            }
        }
    }

    /// A message of the link: a request is answered (on its own task), a notification read.
    fn on_text(self: &Arc<Self>, text: &str, tx: &mpsc::UnboundedSender<String>) {
        match jsonrpc::classify(text) {
            Ok(Incoming::Request { id, method, msg }) => {
                let me = self.clone();
                let tx = tx.clone();
                self.tracker.spawn(async move {
                    let params = msg.get("params").cloned().unwrap_or(Value::Null);
                    let out = match me.request(&method, &params).await {
                        Ok(result) => jsonrpc::result(&id, result),
                        Err((code, message)) => jsonrpc::error(&id, code, &message),
                    };
                    let _ = tx.send(out);
                });
            }
            Ok(Incoming::Notification { method, .. }) if method == "notifications/initialized" => {
                // A new link hears the latest selection at once, as a fresh editor tells it.
                if let Some(sel) = crate::platform::sync::lock(&self.selection).clone() {
                    let _ = tx.send(sel);
                }
            }
            Ok(_) => {}
            Err(r) => {
                let _ = tx.send(jsonrpc::rejection(&r));
            }
        }
    }

    /// A request of the link: its result, or a JSON-RPC error.
    async fn request(&self, method: &str, params: &Value) -> Result<Value, (i64, String)> {
        match method {
            "initialize" => Ok(json!({
                "protocolVersion": "2024-11-05",
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": "pi-ide-broker copilot-chat adapter", "version": env!("CARGO_PKG_VERSION")},
            })),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(map::tools_list()),
            "prompts/list" => Ok(json!({"prompts": []})),
            "resources/list" => Ok(json!({"resources": []})),
            "tools/call" => {
                let name = params.get("name").and_then(Value::as_str).unwrap_or("");
                let args = params.get("arguments").cloned().unwrap_or(json!({}));
                self.call(name, &args).await
            }
            m => Err((jsonrpc::METHOD_NOT_FOUND, format!("Method not found: {m}"))),
        }
    }

    /// A `tools/call`, translated.
    async fn call(&self, tool: &str, args: &Value) -> Result<Value, (i64, String)> {
        let arg = |k: &str| args.get(k).and_then(Value::as_str);
        let failed = |e: String| (-32000, e);
        match tool {
            "getCurrentSelection" | "getLatestSelection" => {
                let r = self.short("get_selection", json!({})).await?;
                map::selection(&r, tool == "getCurrentSelection").map_err(failed)
            }
            "getDiagnostics" => {
                let a = arg("uri").map_or(json!({}), |u| json!({"uri": u}));
                let r = self.short("get_diagnostics", a).await?;
                map::diagnostics(&r).map_err(failed)
            }
            "getWorkspaceFolders" => Ok(map::workspace_folders(&self.found.folders)),
            "openDiff" => self.open_diff(args).await,
            "close_tab" => {
                let tab = arg("tab_name").ok_or((
                    jsonrpc::INVALID_PARAMS,
                    "close_tab: tab_name (a string) is required".to_string(),
                ))?;
                self.short("close_diff", json!({"tab_name": tab})).await?;
                crate::platform::sync::lock(&self.diffs).remove(tab);
                Ok(map::text("TAB_CLOSED"))
            }
            "closeAllDiffTabs" => {
                let tabs: Vec<String> = crate::platform::sync::lock(&self.diffs).drain().collect();
                for tab in &tabs {
                    let _ = self.short("close_diff", json!({"tab_name": tab})).await;
                }
                Ok(map::text(format!("CLOSED_{}_DIFF_TABS", tabs.len())))
            }
            t if map::UNSUPPORTED.contains(&t) => {
                Err((jsonrpc::METHOD_NOT_FOUND, map::unsupported(t)))
            }
            t => Err((jsonrpc::METHOD_NOT_FOUND, format!("Tool not found: {t}"))),
        }
    }

    /// `openDiff` → `open_diff`, waiting (without a deadline) for Accept or Reject.
    async fn open_diff(&self, args: &Value) -> Result<Value, (i64, String)> {
        let arg = |k: &str| args.get(k).and_then(Value::as_str);
        let (Some(path), Some(contents), Some(tab)) = (
            arg("old_file_path").or(arg("new_file_path")),
            arg("new_file_contents"),
            arg("tab_name"),
        ) else {
            let why =
                "openDiff: old_file_path, new_file_contents and tab_name (strings) are required";
            return Err((jsonrpc::INVALID_PARAMS, why.into()));
        };
        crate::platform::sync::lock(&self.diffs).insert(tab.to_string());
        let a = json!({"original_file_path": path, "new_file_contents": contents, "tab_name": tab});
        let r = self.up.call_tool("open_diff", a).await;
        crate::platform::sync::lock(&self.diffs).remove(tab);
        let r = r.map_err(|e| (-32000, format!("Copilot Chat could not show the diff: {e}")))?;
        map::verdict(&r, contents, tab).map_err(|e| (-32000, e))
    }

    /// A call of the server's that is not a diff, bounded.
    async fn short(&self, tool: &str, args: Value) -> Result<Value, (i64, String)> {
        match tokio::time::timeout(SHORT, self.up.call_tool(tool, args)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err((-32000, format!("Copilot Chat: {e}"))),
            Err(_) => Err((
                -32000,
                format!("Copilot Chat did not answer {tool} in {}s", SHORT.as_secs()),
            )),
        }
    }
}
