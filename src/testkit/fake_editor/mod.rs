//! A fake editor server answering as the real editors were recorded, either family.
//!
//! Loopback WS, token checked before the upgrade (HTTP 400 otherwise),
//! `initialize`/`tools/list`/`tools/call`, blocking `openDiff`, `close_tab`,
//! `selection_changed` broadcasts, editor-initiated `getSuggestions`, server pings, and a
//! switch that freezes it (stops reading, so pings go unanswered).

mod answers;

use crate::platform::sync::lock;
use crate::protocol::family::Family;
use crate::protocol::jsonrpc::{self};
pub use answers::burn;
use answers::handle;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

/// What the fake editor saw, for tests to await.
#[derive(Clone, Debug)]
pub enum Event {
    /// A client completed the upgrade.
    Connected {
        /// Connection number.
        conn: u64,
    },
    /// A handshake was refused with 400.
    Refused,
    /// A request arrived.
    Call {
        /// Connection number.
        conn: u64,
        /// The JSON-RPC method.
        method: String,
        /// `params.name` for tools/call.
        tool: Option<String>,
        /// The id as received.
        id: Value,
        /// `params.arguments` (or params).
        args: Value,
    },
    /// A notification arrived.
    Notified {
        /// The method.
        method: String,
    },
    /// A client answered an editor-initiated request.
    Answered {
        /// The whole answer.
        msg: Value,
    },
    /// A client disconnected.
    Disconnected {
        /// Connection number.
        conn: u64,
    },
}

/// How to build a fake editor.
#[derive(Clone, Debug)]
pub struct Options {
    /// Dialect (decides the accepted header and tool shapes).
    pub family: Family,
    /// Written as `ideName`.
    pub ide_name: String,
    /// Written as `workspaceFolders`.
    pub folders: Vec<String>,
    /// The token (random when `None`).
    pub token: Option<String>,
    /// Server → client ping interval (the real editors use 30 s).
    pub ping_interval: Option<Duration>,
    /// Pin to a port (0 = any).
    pub port: u16,
    /// Accept every diff at once with the proposed contents (for demos and transcripts).
    pub auto_accept: bool,
    /// With `auto_accept`: a diff whose `new_file_path` contains this is rejected at once
    /// instead (a process test decides both ways without a hand on the editor).
    pub reject_named: Option<String>,
    /// CPU each `echo` answer burns first, like a real editor's main loop (a Lua editor spends
    /// about 150 µs on a getDiagnostics): for the bench's realistic scenario.
    pub burn_us: u64,
    /// Emacs's claude-code-ide.el: no `authToken` in the lockfile, and the upgrade is taken
    /// without an auth header (a header, if sent, is ignored as that server ignores it).
    pub no_token: bool,
    /// The Claude Code VS Code extension: one client at a time; a client that completes the
    /// upgrade makes the editor close every older one (a close frame without a code).
    pub one_client: bool,
    /// JetBrains' Claude Code plugin: the upgrade must offer this subprotocol (refused without
    /// it) and is answered with it.
    pub require_subprotocol: Option<&'static str>,
    /// JetBrains: a JSON-RPC `ping` request every `.0`; a client that has not answered one
    /// within `.1` is dropped.
    pub rpc_ping: Option<(Duration, Duration)>,
    /// JetBrains' tools: `get_all_opened_file_paths` for the open files (one path a line),
    /// `getDiagnostics` severities `ERROR`/`WARNING`/`WEAK_WARNING`/`INFO`, a rejected diff
    /// answered `["DIFF_REJECTED"]` alone, `close_tab` by any name.
    pub jetbrains: bool,
    /// How long it takes to answer `tools/list` (reading nothing else meanwhile): a slow
    /// handshake, during which a one-client editor's other client may come back.
    pub tools_list_delay: Duration,
}

impl Options {
    /// pi-ide.nvim-like defaults for `folders`.
    pub fn pi(folders: &[&str]) -> Self {
        Options {
            family: Family::Pi,
            ide_name: "Neovim".into(),
            folders: folders.iter().map(|s| s.to_string()).collect(),
            token: None,
            ping_interval: None,
            port: 0,
            auto_accept: false,
            reject_named: None,
            burn_us: 0,
            no_token: false,
            one_client: false,
            require_subprotocol: None,
            rpc_ping: None,
            jetbrains: false,
            tools_list_delay: Duration::ZERO,
        }
    }

    /// claudecode.nvim-like: Claude family, `ideName` "Neovim".
    pub fn claudecode(folders: &[&str]) -> Self {
        Options {
            family: Family::Claude,
            ..Options::pi(folders)
        }
    }

    /// The Claude Code VS Code extension (as code-server runs it): Claude family, ideName
    /// "code-server", one client at a time.
    pub fn vscode(folders: &[&str]) -> Self {
        Options {
            family: Family::Claude,
            ide_name: "code-server".into(),
            one_client: true,
            ..Options::pi(folders)
        }
    }

    /// A JetBrains IDE with the Claude Code plugin, from its documented behaviour
    /// (hlibkoval/vault-code `docs/CLAUDE_CODE_IDE_PROTOCOL.md`, anthropics/claude-code
    /// #62012, #54048): Claude family, `ideName` "IntelliJ IDEA", the `mcp` subprotocol
    /// required, a JSON-RPC `ping` every 5 s answered within 3 s or the client is dropped.
    pub fn jetbrains(folders: &[&str]) -> Self {
        Options {
            family: Family::Claude,
            ide_name: "IntelliJ IDEA".into(),
            require_subprotocol: Some("mcp"),
            rpc_ping: Some((Duration::from_secs(5), Duration::from_secs(3))),
            jetbrains: true,
            ..Options::pi(folders)
        }
    }

    /// claude-code-ide.el-like (Emacs): Claude family, `ideName` "Emacs", no token.
    pub fn emacs(folders: &[&str]) -> Self {
        Options {
            family: Family::Claude,
            ide_name: "Emacs".into(),
            no_token: true,
            ..Options::pi(folders)
        }
    }
}

struct Shared {
    opts: Options,
    token: String,
    clients: Mutex<HashMap<u64, mpsc::UnboundedSender<Message>>>,
    /// tab_name → (conn, request id)
    diffs: Mutex<HashMap<String, (u64, Value)>>,
    /// Claude family: accepted diffs stay open until `close_tab`.
    open_after_accept: Mutex<Vec<String>>,
    events: broadcast::Sender<Event>,
    frozen: watch::Sender<bool>,
    next_conn: AtomicU64,
    next_out: AtomicU64,
    last_selection: Mutex<Option<String>>,
    /// Upgrades that carried an auth header (either family's), counted for `no_token` tests.
    auth_headers_seen: AtomicU64,
    /// Clients closed because another connected (`one_client`).
    evictions: AtomicU64,
    /// JSON-RPC pings of ours answered by clients.
    rpc_pings_answered: AtomicU64,
    /// How many of the next connections are closed right after their `initialize` answer.
    close_after_initialize: AtomicU64,
}

/// A running fake editor. Dropping it stops it (like a crash: the lockfile stays).
pub struct FakeEditor {
    shared: Arc<Shared>,
    /// The port it listens on.
    pub port: u16,
    stop: CancellationToken,
    /// The accept loop, which owns the listener: done once the port is closed.
    accepting: Mutex<Option<tokio::task::JoinHandle<()>>>,
    lockfile: Mutex<Option<PathBuf>>,
}

impl Drop for FakeEditor {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FakeEditor {
    /// Starts listening on 127.0.0.1 (no lockfile yet).
    pub async fn start(opts: Options) -> std::io::Result<FakeEditor> {
        let listener = TcpListener::bind(("127.0.0.1", opts.port)).await?;
        let port = listener.local_addr()?.port();
        let token = match &opts.token {
            Some(t) => t.clone(),
            None => crate::sys::secret::Token::generate()?.expose().to_string(),
        };
        let (events, _) = broadcast::channel(65536);
        let shared = Arc::new(Shared {
            opts,
            token,
            clients: Mutex::new(HashMap::new()),
            diffs: Mutex::new(HashMap::new()),
            open_after_accept: Mutex::new(Vec::new()),
            events,
            frozen: watch::Sender::new(false),
            next_conn: AtomicU64::new(1),
            next_out: AtomicU64::new(1),
            last_selection: Mutex::new(None),
            auth_headers_seen: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            rpc_pings_answered: AtomicU64::new(0),
            close_after_initialize: AtomicU64::new(0),
        });
        let stop = CancellationToken::new();
        let s2 = shared.clone();
        let stop2 = stop.clone();
        let accepting = tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = stop2.cancelled() => return,
                    r = listener.accept() => {
                        let Ok((stream, _)) = r else { continue };
                        tokio::spawn(serve_conn(s2.clone(), stream, stop2.clone()));
                    }
                }
            }
        });
        Ok(FakeEditor {
            shared,
            port,
            stop,
            accepting: Mutex::new(Some(accepting)),
            lockfile: Mutex::new(None),
        })
    }

    /// Starts and writes its lockfile into `dir` (atomically, 0600).
    pub async fn start_in(dir: &Path, opts: Options) -> std::io::Result<FakeEditor> {
        let e = FakeEditor::start(opts).await?;
        e.write_lockfile(dir)?;
        Ok(e)
    }

    /// The token clients must present.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The lockfile JSON this editor announces itself with (without `authToken` when
    /// `no_token`, as claude-code-ide.el writes it).
    pub fn lockfile_json(&self) -> String {
        let mut v = json!({
            "pid": std::process::id(),
            "workspaceFolders": self.shared.opts.folders,
            "ideName": self.shared.opts.ide_name,
            "transport": "ws",
        });
        if !self.shared.opts.no_token {
            v["authToken"] = json!(self.shared.token);
        }
        if cfg!(windows) {
            // As Claude Code's IDE extensions write it on Windows.
            v["runningInWindows"] = json!(true);
        }
        v.to_string()
    }

    /// Writes `<dir>/<port>.lock` atomically (temp + rename), mode 0600.
    pub fn write_lockfile(&self, dir: &Path) -> std::io::Result<PathBuf> {
        use std::io::Write;
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{}.lock", self.port));
        // As the editors write theirs: whole, then renamed into place, and never synced (an
        // fsync here would put this disk's latency into every discovery the bench times).
        let tmp = dir.join(format!(".{}.lock.tmp", self.port));
        crate::platform::user::private_file_options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?
            .write_all(self.lockfile_json().as_bytes())?;
        std::fs::rename(&tmp, &path)?;
        *lock(&self.lockfile) = Some(path.clone());
        Ok(path)
    }

    /// Removes the lockfile (a clean editor exit does this first).
    pub fn remove_lockfile(&self) {
        if let Some(p) = lock(&self.lockfile).take() {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Subscribes to what it sees from now on.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// How many upgrades so far carried an auth header.
    pub fn auth_headers_seen(&self) -> u64 {
        self.shared.auth_headers_seen.load(Ordering::Relaxed)
    }

    /// How many clients it closed because another connected (`one_client`).
    pub fn evictions(&self) -> u64 {
        self.shared.evictions.load(Ordering::Relaxed)
    }

    /// How many of its JSON-RPC `ping` requests (`rpc_ping`) clients answered.
    pub fn rpc_pings_answered(&self) -> u64 {
        self.shared.rpc_pings_answered.load(Ordering::Relaxed)
    }

    /// Number of connected clients.
    pub fn clients(&self) -> usize {
        lock(&self.shared.clients).len()
    }

    /// The next `n` connections to send `initialize` get its answer and, in the same write, a
    /// Close (no code), as the Claude Code extension closes a client when its other client
    /// comes back mid-handshake; then nothing of theirs is answered, and the connection is
    /// dropped [`CLOSE_LINGER`] after the client answered the Close.
    pub fn close_after_initialize(&self, n: u64) {
        self.shared
            .close_after_initialize
            .store(n, Ordering::Relaxed);
    }

    /// Stops reading every connection (pongs stop) while `true`.
    pub fn freeze(&self, frozen: bool) {
        self.shared.frozen.send_replace(frozen);
    }

    /// Broadcasts a `selection_changed` for `file` with `text` selected on `line` (0-based).
    pub fn select(&self, file: &str, text: &str, line: u64) {
        let mut params = json!({
            "text": text,
            "filePath": file,
            "selection": {"start": {"line": line, "character": 0}, "end": {"line": line, "character": text.len()}, "isEmpty": text.is_empty()},
        });
        if self.shared.opts.family == Family::Claude {
            params["fileUrl"] = json!(format!("file://{file}"));
        }
        let n = jsonrpc::notification("selection_changed", params);
        *lock(&self.shared.last_selection) = Some(n.clone());
        self.broadcast(&n);
    }

    /// Sends a notification to every client.
    pub fn broadcast(&self, text: &str) {
        for tx in lock(&self.shared.clients).values() {
            let _ = tx.send(Message::text(text.to_string()));
        }
    }

    /// Sends `getSuggestions` (id `out_<n>`) to one connected client; returns the id.
    pub fn request_suggestions(&self) -> Option<String> {
        let n = self.shared.next_out.fetch_add(1, Ordering::Relaxed);
        let id = format!("out_{n}");
        let msg = jsonrpc::request(
            &json!(id),
            "getSuggestions",
            json!({"filePath": "/x.rs", "suggestionCount": 3}),
        );
        let clients = lock(&self.shared.clients);
        let tx = clients.values().next()?;
        tx.send(Message::text(msg)).ok()?;
        Some(id)
    }

    /// Sends `request_cancelled {id}` to every client.
    pub fn cancel_request(&self, id: &str) {
        self.broadcast(&jsonrpc::notification(
            "request_cancelled",
            json!({"id": id}),
        ));
    }

    /// Accepts a pending diff as the user would (`FILE_SAVED` + contents). A Claude-family
    /// editor keeps the diff open until `close_tab`.
    pub fn accept_diff(&self, tab: &str, contents: &str) -> bool {
        let claude = self.shared.opts.family == Family::Claude;
        if claude {
            // Open before the answer leaves, so a prompt close_tab finds it.
            lock(&self.shared.open_after_accept).push(tab.to_string());
        }
        let ok = self.resolve_diff(
            tab,
            json!({"content": [{"type": "text", "text": "FILE_SAVED"}, {"type": "text", "text": contents}]}),
        );
        if !ok && claude {
            lock(&self.shared.open_after_accept).retain(|t| t != tab);
        }
        ok
    }

    /// Claude family: accepted diffs still open (waiting for `close_tab`).
    pub fn open_accepted(&self) -> Vec<String> {
        lock(&self.shared.open_after_accept).clone()
    }

    /// Rejects a pending diff (`DIFF_REJECTED` + tab name).
    pub fn reject_diff(&self, tab: &str) -> bool {
        let verdict = if self.shared.opts.jetbrains {
            json!({"content": [{"type": "text", "text": "DIFF_REJECTED"}]})
        } else {
            jsonrpc::diff_rejected(tab)
        };
        self.resolve_diff(tab, verdict)
    }

    /// Tab names of the diffs pending now.
    pub fn pending_diffs(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.shared.diffs).keys().cloned().collect();
        v.sort();
        v
    }

    fn resolve_diff(&self, tab: &str, result: Value) -> bool {
        let Some((conn, id)) = lock(&self.shared.diffs).remove(tab) else {
            return false;
        };
        let clients = lock(&self.shared.clients);
        match clients.get(&conn) {
            Some(tx) => tx.send(Message::text(jsonrpc::result(&id, result))).is_ok(),
            None => false,
        }
    }

    /// Closes every connection and the listener at once (a crash, as seen by peers).
    /// Returns once the port is closed: no peer can connect to it again, and another socket
    /// can bind it.
    pub async fn crash(&self) {
        self.stop.cancel();
        let accepting = lock(&self.accepting).take();
        if let Some(task) = accepting {
            let _ = task.await;
        }
    }
}

#[allow(clippy::result_large_err)]
fn refuse(reason: &str) -> ErrorResponse {
    let mut r = ErrorResponse::new(Some(format!("Bad WebSocket upgrade request: {reason}")));
    *r.status_mut() = StatusCode::BAD_REQUEST;
    r
}

#[allow(clippy::result_large_err)] // the callback signature is tungstenite's
async fn serve_conn(shared: Arc<Shared>, stream: tokio::net::TcpStream, stop: CancellationToken) {
    let s = shared.clone();
    let callback = move |req: &Request, mut resp: Response| -> Result<Response, ErrorResponse> {
        let h = req.headers();
        if let Some(want) = s.opts.require_subprotocol {
            let offered = h
                .get("sec-websocket-protocol")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.split(',').any(|p| p.trim() == want));
            if !offered {
                return Err(refuse(&format!("Invalid subprotocol, expected {want}")));
            }
            resp.headers_mut()
                .insert("sec-websocket-protocol", want.parse().expect("a token"));
        }
        if h.contains_key("x-pi-ide-authorization")
            || h.contains_key("x-claude-code-ide-authorization")
        {
            s.auth_headers_seen.fetch_add(1, Ordering::Relaxed);
        }
        if s.opts.no_token {
            return Ok(resp);
        }
        let presented = match s.opts.family {
            Family::Pi => h
                .get("x-pi-ide-authorization")
                .or_else(|| h.get("x-claude-code-ide-authorization")),
            Family::Claude => h.get("x-claude-code-ide-authorization"),
        };
        match presented.and_then(|v| v.to_str().ok()) {
            None => Err(refuse("Missing authentication header")),
            Some(t) if t == s.token => Ok(resp),
            Some(_) => Err(refuse("Invalid authentication token")),
        }
    };
    let ws = match tokio_tungstenite::accept_hdr_async(stream, callback).await {
        Ok(ws) => ws,
        Err(_) => {
            let _ = shared.events.send(Event::Refused);
            return;
        }
    };
    let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
    register_client(&shared, conn, tx);
    let _ = shared.events.send(Event::Connected { conn });
    let (mut sink, mut stream) = ws.split();
    let mut frozen = shared.frozen.subscribe();
    let mut ping = shared.opts.ping_interval.map(tokio::time::interval);
    let mut rpc = RpcPing::new(shared.opts.rpc_ping);
    loop {
        let ping_tick = async {
            match ping.as_mut() {
                Some(p) => {
                    p.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            Some(m) = rx.recv() => {
                let close = matches!(m, Message::Close(_));
                if sink.send(m).await.is_err() || close { break }
            }
            _ = ping_tick => { if sink.send(Message::Ping(b"ping".to_vec().into())).await.is_err() { break } }
            due = rpc.next() => match due {
                Some(request) => if sink.send(Message::text(request)).await.is_err() { break },
                None => break, // unanswered within its time: the client is dropped
            },
            _ = async { frozen.wait_for(|f| *f).await.map(|_| ()) } => {
                // Frozen: read nothing (so no pongs) until thawed.
                let mut thaw = shared.frozen.subscribe();
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = async { thaw.wait_for(|f| !*f).await.map(|_| ()) } => {}
                }
            }
            frame = stream.next() => {
                let Some(Ok(frame)) = frame else { break };
                let text = match frame {
                    Message::Text(t) => t.as_str().to_owned(),
                    Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
                    Message::Close(_) => break,
                    _ => continue,
                };
                if rpc.answered(&text) {
                    shared.rpc_pings_answered.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let method = quirk_method(&shared, &text);
                if method == Some("tools/list") && !shared.opts.tools_list_delay.is_zero() {
                    tokio::time::sleep(shared.opts.tools_list_delay).await;
                }
                if let Some(reply) = handle(&shared, conn, &text) {
                    let close = method == Some("initialize")
                        && shared
                            .close_after_initialize
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                            .is_ok();
                    if close {
                        // Answer and Close in one write; then wait for the client's Close.
                        let _ = sink.feed(Message::text(reply)).await;
                        let _ = sink.feed(Message::Close(None)).await;
                        let _ = sink.flush().await;
                        lock(&shared.clients).remove(&conn);
                        while let Some(Ok(m)) = stream.next().await {
                            if m.is_close() {
                                // A slow close: the connection lingers a while.
                                tokio::time::sleep(CLOSE_LINGER).await;
                                break;
                            }
                        }
                        break;
                    }
                    if sink.send(Message::text(reply)).await.is_err() { break }
                }
            }
        }
    }
    lock(&shared.clients).remove(&conn);
    let _ = shared.events.send(Event::Disconnected { conn });
}

/// How long a connection closed by `close_after_initialize` lingers after the client's Close.
pub const CLOSE_LINGER: Duration = Duration::from_millis(300);

/// The method of a client's request, when a quirk (`tools_list_delay`,
/// `close_after_initialize`) may apply to it; `None` otherwise (no parse on the hot path).
fn quirk_method(shared: &Shared, text: &str) -> Option<&'static str> {
    let delay = !shared.opts.tools_list_delay.is_zero() && text.contains("tools/list");
    let close =
        shared.close_after_initialize.load(Ordering::Relaxed) > 0 && text.contains("initialize");
    if !delay && !close {
        return None;
    }
    let v: Value = serde_json::from_str(text).ok()?;
    match v.get("method")?.as_str()? {
        "tools/list" => Some("tools/list"),
        "initialize" => Some("initialize"),
        _ => None,
    }
}

/// JetBrains' liveness check of a client: a `ping` request every interval, each to be answered
/// within its timeout.
struct RpcPing {
    every: Option<(tokio::time::Interval, Duration)>,
    /// The id of the ping awaiting its answer, and when it is due.
    owed: Option<(String, tokio::time::Instant)>,
    sent: u64,
}

impl RpcPing {
    fn new(cfg: Option<(Duration, Duration)>) -> Self {
        let every = cfg.map(|(every, within)| {
            let start = tokio::time::Instant::now() + every;
            (tokio::time::interval_at(start, every), within)
        });
        RpcPing {
            every,
            owed: None,
            sent: 0,
        }
    }

    /// The next ping request to send (`Some`), or `None` once one went unanswered in time.
    async fn next(&mut self) -> Option<String> {
        let Some((interval, within)) = self.every.as_mut() else {
            return std::future::pending().await;
        };
        match &self.owed {
            Some((_, due)) => {
                let due = *due;
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => return None,
                    _ = interval.tick() => {}
                }
            }
            None => {
                interval.tick().await;
            }
        }
        if self.owed.is_some() {
            return None; // a new ping is due while the last is still owed
        }
        self.sent += 1;
        let id = format!("jb-ping-{}", self.sent);
        self.owed = Some((id.clone(), tokio::time::Instant::now() + *within));
        Some(json!({"jsonrpc": "2.0", "id": id, "method": "ping"}).to_string())
    }

    /// True when `text` answers the ping owed (which is then settled).
    fn answered(&mut self, text: &str) -> bool {
        let Some((id, _)) = &self.owed else {
            return false;
        };
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return false;
        };
        let ok = v["id"] == id.as_str() && v.get("result").is_some();
        if ok {
            self.owed = None;
        }
        ok
    }
}

/// Adds a client; a `one_client` editor first closes every older one (a close frame, no code).
fn register_client(shared: &Shared, conn: u64, tx: mpsc::UnboundedSender<Message>) {
    let mut clients = lock(&shared.clients);
    if shared.opts.one_client {
        for older in clients.values() {
            if older.send(Message::Close(None)).is_ok() {
                shared.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    clients.insert(conn, tx);
}

/// Waits for the first event matching `pred`.
pub async fn wait_for(
    rx: &mut broadcast::Receiver<Event>,
    what: &str,
    mut pred: impl FnMut(&Event) -> bool,
) -> Event {
    super::within(what, async {
        loop {
            match rx.recv().await {
                Ok(e) if pred(&e) => return e,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    })
    .await
}

/// Waits for the next `tools/call` of `tool` the editor receives; returns its arguments.
pub async fn next_tool_call(rx: &mut broadcast::Receiver<Event>, tool: &str) -> Value {
    let e = wait_for(
        rx,
        tool,
        |e| matches!(e, Event::Call { tool: Some(t), .. } if t == tool),
    )
    .await;
    match e {
        Event::Call { args, .. } => args,
        _ => Value::Null,
    }
}

/// Waits for the next answer the editor receives (to a request of its own); returns it.
pub async fn next_answer(rx: &mut broadcast::Receiver<Event>, what: &str) -> Value {
    match wait_for(rx, what, |e| matches!(e, Event::Answered { .. })).await {
        Event::Answered { msg } => msg,
        _ => Value::Null,
    }
}

/// The `params` of a message as a map (for tests).
pub fn params(msg: &Map<String, Value>) -> Value {
    msg.get("params").cloned().unwrap_or(Value::Null)
}
