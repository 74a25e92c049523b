//! The ACP door: an ACP agent on stdio that lets an ACP editor follow a running pi session.
//!
//! The editor (Zed, CodeCompanion.nvim, agentic.nvim…) spawns `pi-ide-broker acp` and speaks
//! the Agent Client Protocol v1 on its stdin/stdout (newline-delimited JSON-RPC). Each ACP
//! session follows one pi session through the daemon's `/v1/follow` (`session::follow`): the
//! pi transcript streams into the editor's thread, a prompt typed there is sent to pi, and
//! pi's writes are offered there as permission requests while a turn is open. `agent` holds
//! the state; this module does the I/O.

mod agent;
mod messages;
mod prompt;

pub use agent::{Agent, Out, Purpose, Unfollowed};

use crate::frontdoor::client::ClientError;
use crate::frontdoor::lines::{CappedLines, Line};
use crate::platform::local::Stream;
use crate::protocol::follow::{PiSession, PiSessions};
use crate::protocol::jsonrpc::{self, follow};
use crate::protocol::percent::encode_query;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// How `pi-ide-broker acp` was asked to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The broker socket.
    pub socket: PathBuf,
    /// The longest line read from stdin; longer ones are refused with an error.
    pub max_line: usize,
}

/// How long a follow connection may take to open (dial, upgrade, `follow/attached`).
const CONNECT_WAIT: Duration = Duration::from_secs(5);
/// How long a dropped follow connection is redialled (a broker restart) before the ACP
/// session is told its pi session is gone.
const REDIAL_FOR: Duration = Duration::from_secs(15);

/// What the I/O tasks tell the main loop.
enum Event {
    /// A frame on a follow connection.
    Frame(String, u64, String),
    /// A follow connection opened (its frames go to the sender) or could not.
    Connected {
        key: String,
        generation: u64,
        request: Value,
        load: bool,
        result: Result<mpsc::UnboundedSender<String>, Unfollowed>,
    },
    /// A follow connection ended for good, and why.
    Closed(String, u64, String),
    /// A follow connection was dialled again after the broker dropped it (a restart).
    Relinked(String, u64),
    /// A session list is in.
    Listed(Purpose, Result<Vec<PiSession>, String>),
}

/// A live follow connection: its frames' sender and its generation (events of an older
/// connection of the same key are ignored).
struct Conn {
    generation: u64,
    tx: Option<mpsc::UnboundedSender<String>>,
    /// Frames for it before it opened.
    queued: Vec<String>,
}

/// Runs the agent until stdin ends.
pub async fn run<R, W>(opts: Options, stdin: R, mut stdout: W) -> std::io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut lines = CappedLines::new(stdin, opts.max_line);
    let mut agent = Agent::default();
    let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
    let mut conns: HashMap<String, Conn> = HashMap::new();
    let mut generation = 0u64;
    loop {
        let outs = tokio::select! {
            line = lines.next_line() => match line? {
                None => return Ok(()),
                Some(Line::TooLong) => vec![Out::Client(jsonrpc::error(&Value::Null, jsonrpc::INVALID_REQUEST, &format!("line longer than {} bytes refused", opts.max_line)))],
                Some(Line::Text(l)) if l.trim().is_empty() => continue,
                Some(Line::Text(l)) => agent.on_client_line(&l),
            },
            Some(ev) = events.recv() => on_event(&mut agent, &mut conns, ev),
        };
        for out in outs {
            match out {
                Out::Client(text) => {
                    stdout.write_all(text.as_bytes()).await?;
                    stdout.write_all(b"\n").await?;
                    stdout.flush().await?;
                }
                Out::Broker(key, text) => match conns.get_mut(&key) {
                    Some(Conn { tx: Some(tx), .. }) => _ = tx.send(text),
                    Some(c) => c.queued.push(text),
                    None => tracing::debug!(session = %key, "no follow connection for a frame"),
                },
                Out::List { cwd, purpose } => {
                    let (socket, tx) = (opts.socket.clone(), events_tx.clone());
                    tokio::spawn(async move {
                        let found = list(&socket, &cwd).await;
                        let _ = tx.send(Event::Listed(purpose, found));
                    });
                }
                Out::Connect { key, request, load } => {
                    generation += 1;
                    conns.insert(
                        key.clone(),
                        Conn {
                            generation,
                            tx: None,
                            queued: Vec::new(),
                        },
                    );
                    let name = agent.client_name.clone();
                    let target = Dial {
                        socket: opts.socket.clone(),
                        key,
                        client: name,
                        buffers: agent.reads_buffers(),
                    };
                    tokio::spawn(follow_task(
                        target,
                        generation,
                        request,
                        load,
                        events_tx.clone(),
                    ));
                }
                Out::Disconnect(key) => _ = conns.remove(&key),
            }
        }
    }
}

/// What an I/O task's event makes the agent do.
fn on_event(agent: &mut Agent, conns: &mut HashMap<String, Conn>, ev: Event) -> Vec<Out> {
    let current = |conns: &HashMap<String, Conn>, key: &str, g: u64| {
        conns.get(key).is_some_and(|c| c.generation == g)
    };
    match ev {
        Event::Listed(purpose, found) => agent.listed(purpose, found),
        Event::Frame(key, g, text) if current(conns, &key, g) => agent.on_broker_frame(&key, &text),
        Event::Closed(key, g, why) if current(conns, &key, g) => {
            conns.remove(&key);
            agent.ended(&key, &why)
        }
        Event::Relinked(key, g) if current(conns, &key, g) => agent.relinked(&key),
        Event::Connected {
            key,
            generation,
            request,
            load,
            result,
        } if current(conns, &key, generation) => match result {
            Ok(tx) => {
                if let Some(c) = conns.get_mut(&key) {
                    for text in c.queued.drain(..) {
                        let _ = tx.send(text);
                    }
                    c.tx = Some(tx);
                }
                agent.connected(&key, request, load, Ok(()))
            }
            Err(why) => {
                conns.remove(&key);
                agent.connected(&key, request, load, Err(why))
            }
        },
        // An event of a connection replaced since.
        _ => Vec::new(),
    }
}

/// `GET /v1/pi-sessions?cwd=`: the pi sessions an editor in `cwd` can follow, best first.
async fn list(socket: &std::path::Path, cwd: &str) -> Result<Vec<PiSession>, String> {
    let path = format!("/v1/pi-sessions?cwd={}", encode_query(cwd));
    use crate::frontdoor::client::{get, ClientError};
    match get::<PiSessions>(socket, &path).await {
        Ok(list) => Ok(list.sessions),
        Err(ClientError::Refused(why)) => Err(why),
        Err(e @ ClientError::Shape { .. }) => Err(e.to_string()),
        Err(e) => Err(format!("{e}; pi starts it when a pi session with the pi-ide-broker extension runs (`pi-ide-broker setup`)")),
    }
}

type Ws = tokio_tungstenite::WebSocketStream<Stream>;

/// Where a follow connection goes: the daemon's socket, the pi session's key, and what the
/// client says of itself.
struct Dial {
    socket: PathBuf,
    key: String,
    client: Option<String>,
    /// The client offers `fs.readTextFile`.
    buffers: bool,
}

impl Dial {
    /// Dials `/v1/follow?session=<key>` and waits for `follow/attached`.
    async fn open(&self) -> Result<Ws, Unfollowed> {
        dial(
            &self.socket,
            &self.key,
            self.client.as_deref(),
            self.buffers,
        )
        .await
    }
}

async fn dial(
    socket: &std::path::Path,
    key: &str,
    client: Option<&str>,
    buffers: bool,
) -> Result<Ws, Unfollowed> {
    let path = format!(
        "/v1/follow?session={}&client={}{}",
        encode_query(key),
        encode_query(client.unwrap_or("an ACP editor")),
        if buffers { "&buffers=1" } else { "" }
    );
    let open = async {
        let mut ws = crate::frontdoor::client::upgrade(socket, &path)
            .await
            .map_err(unfollowed)?;
        while let Some(frame) = ws.next().await {
            if let Ok(Message::Text(t)) = frame {
                if is_notification(t.as_str(), follow::ATTACHED) {
                    return Ok(ws);
                }
            }
        }
        Err(Unfollowed::Failed(
            "the broker closed the follow connection".to_string(),
        ))
    };
    tokio::time::timeout(CONNECT_WAIT, open)
        .await
        .map_err(|_| {
            Unfollowed::Failed(format!(
                "the broker did not open the follow connection within {} s",
                CONNECT_WAIT.as_secs()
            ))
        })?
}

/// Why the broker did not let a follow connection open: its 404 (no such pi session) is
/// ACP's "resource not found", anything else a failure said in words.
pub(crate) fn unfollowed(e: ClientError) -> Unfollowed {
    match e {
        // `client::upgrade_refusal` writes the status first: `HTTP 404 Not Found: <why>`.
        ClientError::Refused(why) if why.starts_with("HTTP 404 ") => Unfollowed::NotFound(
            why.split_once(": ")
                .map_or(why.as_str(), |(_, w)| w)
                .to_string(),
        ),
        ClientError::Refused(why) => Unfollowed::Failed(why),
        other => Unfollowed::Failed(other.to_string()),
    }
}

/// Whether a frame is the notification `method` (read as JSON-RPC, never by a substring: a
/// transcript update or a prompt may quote a method's name). Only a frame that names the
/// method at all is parsed: the pump sees every transcript update, which the agent parses
/// once more anyway.
pub(crate) fn is_notification(text: &str, method: &str) -> bool {
    text.contains(method)
        && matches!(
            jsonrpc::classify(text),
            Ok(jsonrpc::Incoming::Notification { method: m, .. }) if m == method
        )
}

/// One follow connection: opened, pumped both ways, redialled for a while when the broker
/// drops it without saying the session ended (a broker restart).
async fn follow_task(
    target: Dial,
    generation: u64,
    request: Value,
    load: bool,
    events: mpsc::UnboundedSender<Event>,
) {
    let key = target.key.clone();
    let mut ws = match target.open().await {
        Ok(ws) => ws,
        Err(why) => {
            let _ = events.send(Event::Connected {
                key,
                generation,
                request,
                load,
                result: Err(why),
            });
            return;
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    if events
        .send(Event::Connected {
            key: key.clone(),
            generation,
            request,
            load,
            result: Ok(tx),
        })
        .is_err()
    {
        return;
    }
    // The last readiness said, said again to a restarted broker.
    let mut last_ready: Option<String> = None;
    let why = loop {
        match pump(&mut ws, &mut rx, &events, &key, generation, &mut last_ready).await {
            Pumped::Ended(why) => break why,
            Pumped::AgentGone => return,
            Pumped::Dropped => {}
        }
        let until = tokio::time::Instant::now() + REDIAL_FOR;
        let mut delay = Duration::from_millis(100);
        let redialled = loop {
            if let Ok(w) = target.open().await {
                break Some(w);
            }
            if tokio::time::Instant::now() + delay > until {
                break None;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        };
        let Some(w) = redialled else {
            break "the broker connection was lost and the pi session did not come back"
                .to_string();
        };
        ws = w;
        if let Some(r) = &last_ready {
            let _ = ws.send(Message::text(r.clone())).await;
        }
        if events
            .send(Event::Relinked(key.clone(), generation))
            .is_err()
        {
            return;
        }
    };
    let _ = events.send(Event::Closed(key, generation, why));
}

enum Pumped {
    /// The broker said the session ended (or the connection cannot be kept).
    Ended(String),
    /// The connection dropped without a word: redial.
    Dropped,
    /// The agent let the connection go.
    AgentGone,
}

async fn pump(
    ws: &mut Ws,
    rx: &mut mpsc::UnboundedReceiver<String>,
    events: &mpsc::UnboundedSender<Event>,
    key: &str,
    generation: u64,
    last_ready: &mut Option<String>,
) -> Pumped {
    loop {
        tokio::select! {
            out = rx.recv() => {
                let Some(text) = out else {
                    let _ = ws.close(None).await;
                    return Pumped::AgentGone;
                };
                if is_notification(&text, follow::READY) {
                    *last_ready = Some(text.clone());
                }
                if ws.send(Message::text(text)).await.is_err() {
                    return Pumped::Dropped;
                }
            }
            frame = ws.next() => match frame {
                Some(Ok(Message::Text(t))) => {
                    let text = t.as_str().to_owned();
                    let ended = is_notification(&text, follow::ENDED);
                    if events.send(Event::Frame(key.to_string(), generation, text)).is_err() {
                        return Pumped::AgentGone;
                    }
                    if ended {
                        return Pumped::Ended("the pi session ended".into());
                    }
                }
                Some(Ok(Message::Ping(p))) => _ = ws.send(Message::Pong(p)).await,
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return Pumped::Dropped,
            },
        }
    }
}
