//! A second client of a single-client editor, as the user's own Claude Code CLI is one: it
//! connects to the editor's port with the token header, counts the times the editor closes it
//! (evictions), and, like Claude Code 2.1, reconnects whenever it is closed if asked to.

use futures_util::{SinkExt, StreamExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

/// A running rival client; [`Rival::leave`] closes it for good.
pub struct Rival {
    evictions: Arc<AtomicU64>,
    connections: Arc<AtomicU64>,
    connected: watch::Receiver<bool>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Rival {
    /// Connects to `127.0.0.1:port` presenting `token` in `header` (none when `None`);
    /// reconnects 200 ms after each eviction when `reconnect`.
    pub async fn start(
        port: u16,
        header: &'static str,
        token: Option<String>,
        reconnect: bool,
    ) -> Rival {
        let evictions = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let (up, connected) = watch::channel(false);
        let stop = CancellationToken::new();
        let (e, c, s) = (evictions.clone(), connections.clone(), stop.clone());
        let task = tokio::spawn(async move {
            loop {
                let mut req = match format!("ws://127.0.0.1:{port}/").into_client_request() {
                    Ok(r) => r,
                    Err(_) => return,
                };
                if let Some(Ok(v)) = token.as_deref().map(|t| t.parse()) {
                    req.headers_mut().insert(header, v);
                }
                let dialled = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                    Ok(tcp) => tokio_tungstenite::client_async(req, tcp).await.ok(),
                    Err(_) => None,
                };
                let Some((ws, _)) = dialled else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                c.fetch_add(1, Ordering::Relaxed);
                up.send_replace(true);
                let (mut sink, mut stream) = ws.split();
                let left = tokio::select! {
                    _ = s.cancelled() => true,
                    _ = async { while let Some(Ok(m)) = stream.next().await { if m.is_close() { break } } } => false,
                };
                up.send_replace(false);
                if left {
                    let _ = sink.send(Message::Close(None)).await;
                    return;
                }
                e.fetch_add(1, Ordering::Relaxed);
                if !reconnect {
                    return;
                }
                // Claude Code redials about 200 ms after losing its IDE connection.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Rival {
            evictions,
            connections,
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
        self.evictions.load(Ordering::Relaxed)
    }

    /// How many connections it made.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Closes its connection and stops reconnecting; waits until it is gone.
    pub async fn leave(self) {
        self.stop.cancel();
        let _ = super::within("the rival client to leave", self.task).await;
    }
}
