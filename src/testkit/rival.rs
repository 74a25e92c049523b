//! A second client of a single-client editor, as the user's own Claude Code is one.
//!
//! It connects to the editor's port with the token header, counts the times the editor closes
//! it (evictions), and, like Claude Code 2.1, reconnects whenever it is closed if asked to.
//! Asked to call, it also does what Claude Code does on each connection (`initialize`,
//! `notifications/initialized`) and then calls a tool at an interval, sending a call cut by an
//! eviction again once it is back, and counts the calls answered.

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

/// A running rival client; [`Rival::leave`] closes it for good.
pub struct Rival {
    counts: Arc<Counts>,
    connected: watch::Receiver<bool>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// What the rival counts.
#[derive(Default)]
struct Counts {
    evictions: AtomicU64,
    connections: AtomicU64,
    calls_sent: AtomicU64,
    calls_answered: AtomicU64,
}

/// A tool the rival calls, and how often.
#[derive(Clone)]
pub struct Calling {
    /// The tool's name (`getWorkspaceFolders` in VS Code, `echo` in the fake editor).
    pub tool: String,
    /// The interval between calls.
    pub every: Duration,
}

/// How long after an eviction [`Rival::start`] reconnects.
const CLAUDE_CODE_REDIAL: Duration = Duration::from_millis(200);

/// How the rival dials.
struct Dial {
    port: u16,
    header: &'static str,
    token: Option<String>,
}

impl Rival {
    /// Connects to `127.0.0.1:port` presenting `token` in `header` (none when `None`);
    /// reconnects 200 ms after each eviction when `reconnect` (as Claude Code 2.1 was first
    /// seen to; see [`Rival::start_with`] for another delay).
    pub async fn start(
        port: u16,
        header: &'static str,
        token: Option<String>,
        reconnect: bool,
    ) -> Rival {
        Self::start_calling(port, header, token, reconnect, None).await
    }

    /// [`Rival::start`], calling `calling.tool` every `calling.every` while connected.
    pub async fn start_calling(
        port: u16,
        header: &'static str,
        token: Option<String>,
        reconnect: bool,
        calling: Option<Calling>,
    ) -> Rival {
        let after = reconnect.then_some(CLAUDE_CODE_REDIAL);
        Self::start_with(port, header, token, after, calling).await
    }

    /// [`Rival::start_calling`], reconnecting `reconnect` after each eviction (`None`: never).
    /// The real Claude Code CLI (2.1.332) beside VS Code was measured back 2–13 ms after the
    /// extension closed it.
    pub async fn start_with(
        port: u16,
        header: &'static str,
        token: Option<String>,
        reconnect: Option<Duration>,
        calling: Option<Calling>,
    ) -> Rival {
        let counts = Arc::new(Counts::default());
        let (up, connected) = watch::channel(false);
        let stop = CancellationToken::new();
        let dial = Dial {
            port,
            header,
            token,
        };
        let task = tokio::spawn(run(
            dial,
            reconnect,
            calling,
            counts.clone(),
            up,
            stop.clone(),
        ));
        Rival {
            counts,
            connected,
            stop,
            task,
        }
    }

    /// Waits until it is connected (bounded by [`super::WAIT`]).
    pub async fn wait_connected(&mut self) {
        super::within("the rival client to connect", async {
            let _ = self.connected.wait_for(|c| *c).await;
        })
        .await;
    }

    /// True while it holds a connection.
    pub fn is_connected(&self) -> bool {
        *self.connected.borrow()
    }

    /// How many times the editor closed it.
    pub fn evictions(&self) -> u64 {
        self.counts.evictions.load(Ordering::Relaxed)
    }

    /// How many connections it made.
    pub fn connections(&self) -> u64 {
        self.counts.connections.load(Ordering::Relaxed)
    }

    /// How many distinct calls it made (a call sent again after an eviction counts once).
    pub fn calls_sent(&self) -> u64 {
        self.counts.calls_sent.load(Ordering::Relaxed)
    }

    /// How many of its calls were answered.
    pub fn calls_answered(&self) -> u64 {
        self.counts.calls_answered.load(Ordering::Relaxed)
    }

    /// Closes its connection and stops reconnecting; waits until it is gone.
    pub async fn leave(self) {
        self.stop.cancel();
        let _ = super::within("the rival client to leave", self.task).await;
    }
}

/// The rival's life: connect, hold (and call), count the evictions, reconnect.
async fn run(
    dial: Dial,
    reconnect: Option<Duration>,
    calling: Option<Calling>,
    counts: Arc<Counts>,
    up: watch::Sender<bool>,
    stop: CancellationToken,
) {
    // The call in flight when an eviction cut it: sent again on the next connection.
    let mut owed: Option<u64> = None;
    loop {
        let Some(ws) = connect(&dial).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        counts.connections.fetch_add(1, Ordering::Relaxed);
        up.send_replace(true);
        let left = hold(ws, calling.as_ref(), &counts, &mut owed, &stop).await;
        up.send_replace(false);
        if left {
            return;
        }
        counts.evictions.fetch_add(1, Ordering::Relaxed);
        let Some(after) = reconnect else {
            return;
        };
        tokio::time::sleep(after).await;
    }
}

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn connect(dial: &Dial) -> Option<Ws> {
    let mut req = format!("ws://127.0.0.1:{}/", dial.port)
        .into_client_request()
        .ok()?;
    if let Some(Ok(v)) = dial.token.as_deref().map(|t| t.parse()) {
        req.headers_mut().insert(dial.header, v);
    }
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", dial.port))
        .await
        .ok()?;
    tokio_tungstenite::client_async(req, tcp)
        .await
        .ok()
        .map(|(ws, _)| ws)
}

/// Holds one connection until the editor closes it (false) or the rival leaves (true).
async fn hold(
    ws: Ws,
    calling: Option<&Calling>,
    counts: &Counts,
    owed: &mut Option<u64>,
    stop: &CancellationToken,
) -> bool {
    let (mut sink, mut stream) = ws.split();
    let mut tick = calling.map(|c| tokio::time::interval(c.every));
    if calling.is_some() {
        let init = json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "rival", "version": "0"}}});
        let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        for m in [init, done] {
            if sink.send(Message::text(m.to_string())).await.is_err() {
                return false;
            }
        }
    }
    loop {
        let due = async {
            match tick.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => {
                let _ = sink.send(Message::Close(None)).await;
                return true;
            }
            _ = due => {
                let id = match *owed {
                    Some(id) => id,
                    None => {
                        let id = counts.calls_sent.fetch_add(1, Ordering::Relaxed) + 1;
                        *owed = Some(id);
                        id
                    }
                };
                let tool = calling.map(|c| c.tool.as_str()).unwrap_or_default();
                let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": {}}});
                if sink.send(Message::text(call.to_string())).await.is_err() {
                    return false;
                }
            }
            m = stream.next() => match m {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                    if v.get("result").is_some() && owed.is_some_and(|id| v["id"] == id) {
                        counts.calls_answered.fetch_add(1, Ordering::Relaxed);
                        *owed = None;
                    }
                }
                Some(Ok(m)) if m.is_close() => return false,
                Some(Ok(_)) => {}
                None | Some(Err(_)) => return false,
            },
        }
    }
}
