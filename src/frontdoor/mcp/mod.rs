//! The stdio MCP door: MCP on a process's stdin/stdout, dialling the daemon's socket like any agent.
//!
//! The stdio door, `pi-ide-broker mcp`: MCP over stdin/stdout (newline-delimited JSON-RPC)
//! for any MCP client. It dials the native socket as a session (so it ends in the same session
//! code), offers the attached editor's tools plus `list_editors` and `editor_context`, and
//! starts the daemon when none answers.

mod door;

use crate::frontdoor::client::ClientError;
use crate::frontdoor::lines::{CappedLines, Line};
use crate::platform::local::Stream;
use crate::protocol::percent::encode_query;
use crate::protocol::{handshake, jsonrpc};
use door::{from_broker, from_client, is_response, Door, Intercept, Out};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// How `pi-ide-broker mcp` was asked to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The broker socket.
    pub socket: PathBuf,
    /// The session's working directory (absolute).
    pub cwd: String,
    /// The sticky key (default: the parent process id).
    pub key: Option<String>,
    /// `pi` or `claude`.
    pub dialect: String,
    /// Start the daemon when none answers.
    pub spawn: bool,
    /// Passed to a spawned daemon.
    pub config: Option<PathBuf>,
    /// Where a spawned daemon logs (`daemon.log`).
    pub log_dir: PathBuf,
    /// The longest line read from stdin (`max_frame_bytes`); longer ones are discarded up to
    /// their newline and answered with an error, so memory stays bounded.
    pub max_line: usize,
    /// The `[[remote]]` this client runs on (its paths are mapped), if elsewhere.
    pub remote: Option<String>,
}

/// Why the stdio door could not run.
#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    /// No daemon, and none could be started.
    #[error("cannot reach pi-ide-broker on {socket}: {why}")]
    Unreachable {
        /// The socket.
        socket: String,
        /// What went wrong, and what to do.
        why: String,
    },
    /// stdin/stdout failed.
    #[error("stdio: {0}")]
    Io(#[from] std::io::Error),
    /// No daemon and autostart off: said on stderr at once, and every request was answered
    /// with a JSON-RPC error until stdin ended.
    #[error("pi-ide-broker is not running (reported above)")]
    Reported,
}

/// Connects to the broker as a session, spawning the daemon first if `spawn` and needed.
pub async fn connect(opts: &Options, spawn: bool) -> Result<WebSocketStream<Stream>, StdioError> {
    let query = format!(
        "cwd={}&dialect={}&door=stdio{}{}",
        encode_query(&opts.cwd),
        encode_query(&opts.dialect),
        opts.key
            .as_deref()
            .map(|k| format!("&session={}", encode_query(k)))
            .unwrap_or_default(),
        opts.remote
            .as_deref()
            .map(|r| format!("&remote={}", encode_query(r)))
            .unwrap_or_default()
    );
    let path = format!("/v1/session?{query}");
    let mut spawned = false;
    let mut delay = Duration::from_millis(25);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    loop {
        match crate::frontdoor::client::upgrade(&opts.socket, &path).await {
            Ok(ws) => return Ok(ws),
            Err(
                ClientError::Refused(why)
                | ClientError::Protocol(why)
                | ClientError::Shape { why, .. },
            ) => {
                return Err(StdioError::Unreachable {
                    socket: opts.socket.display().to_string(),
                    why: format!("session upgrade failed: {why}"),
                });
            }
            // Not the user's broker: never a daemon started beside it, nothing sent.
            Err(ClientError::Untrusted(why)) => {
                return Err(StdioError::Unreachable {
                    socket: opts.socket.display().to_string(),
                    why,
                });
            }
            Err(ClientError::NotRunning(e)) => {
                if !spawn {
                    return Err(StdioError::Unreachable {
                        socket: opts.socket.display().to_string(),
                        why: format!(
                            "{e}; start it with `pi-ide-broker daemon` (autostart is off)"
                        ),
                    });
                }
                if !spawned {
                    spawn_daemon(opts)?;
                    spawned = true;
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(StdioError::Unreachable {
                        socket: opts.socket.display().to_string(),
                        why: format!(
                            "the daemon did not come up; see {}",
                            opts.log_dir.join("daemon.log").display()
                        ),
                    });
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(400));
            }
        }
    }
}

/// Starts `pi-ide-broker daemon` detached (own process group, output to the state dir).
/// If another client started one at the same moment, the loser exits with "already running".
fn spawn_daemon(opts: &Options) -> Result<(), StdioError> {
    std::fs::create_dir_all(&opts.log_dir)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(opts.log_dir.join("daemon.log"))?;
    // The binary installed at our path now (an upgrade may have replaced the one we run).
    let exe = crate::platform::process::own_exe().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "cannot find this binary's path",
        )
    })?;
    let mut cmd = std::process::Command::new(exe);
    if let Some(c) = &opts.config {
        cmd.arg("--config").arg(c);
    }
    cmd.arg("daemon")
        .env("PI_IDE_BROKER_SOCKET", &opts.socket)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    crate::platform::control::detach(&mut cmd);
    let child = cmd.spawn()?;
    tracing::info!(pid = child.id(), "started pi-ide-broker daemon");
    Ok(())
}

/// How long a request that arrives while the broker is away waits for it to come back.
const RECONNECT_WAIT: Duration = Duration::from_secs(10);
/// After a reconnect, how long queued requests wait for the session to be attached again.
const REATTACH_WAIT: Duration = Duration::from_secs(3);

/// Why one connection to the broker ended.
enum Ended {
    /// stdin closed: the client is done.
    Stdin,
    /// The broker went away (restart, crash): reconnect.
    Broker,
}

/// Pumps messages between stdio and the broker until stdin ends (exit 0). When the broker
/// goes (an upgrade, a restart), requests in flight are answered (a diff `DIFF_REJECTED`, the
/// rest an error), the door reconnects (starting a daemon unless spawning is off), and requests
/// that arrive meanwhile wait for it (at most [`RECONNECT_WAIT`]).
pub async fn run<R, W>(opts: Options, stdin: R, mut stdout: W) -> Result<(), StdioError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut ws = match connect(&opts, opts.spawn).await {
        Ok(ws) => ws,
        Err(e @ StdioError::Unreachable { .. }) if !opts.spawn => {
            // Said now, not at exit: the client may keep stdin open for its whole session.
            eprintln!("error: {e}");
            refuse_all(stdin, &mut stdout, &e.to_string(), opts.max_line).await?;
            return Err(StdioError::Reported);
        }
        Err(e) => return Err(e),
    };
    let mut lines = CappedLines::new(stdin, opts.max_line);
    let mut door = Door::default();
    // MCP lifecycle: until the client has sent `notifications/initialized`, it gets nothing
    // but answers; our notifications (list_changed) wait here, in order.
    let mut held: Option<Vec<String>> = Some(Vec::new());
    // Client lines read while the broker was away, with when they came.
    let mut queued: Vec<(String, tokio::time::Instant)> = Vec::new();
    loop {
        let link = Link {
            opts: &opts,
            door: &mut door,
            held: &mut held,
        };
        match link.pump(ws, &mut lines, &mut queued, &mut stdout).await? {
            Ended::Stdin => return Ok(()),
            Ended::Broker => {}
        }
        tracing::warn!("the broker connection was lost; reconnecting");
        for answer in door.fail_in_flight() {
            write_line(&mut stdout, &answer).await?;
        }
        ws = match reconnect(&opts, &mut lines, &mut queued, &mut stdout).await? {
            Some(ws) => ws,
            None => return Ok(()),
        };
        tracing::info!("reconnected to the broker");
    }
}

/// One connection's worth of pumping.
struct Link<'a> {
    opts: &'a Options,
    door: &'a mut Door,
    held: &'a mut Option<Vec<String>>,
}

impl Link<'_> {
    async fn pump<R, W>(
        self,
        ws: WebSocketStream<Stream>,
        lines: &mut CappedLines<R>,
        queued: &mut Vec<(String, tokio::time::Instant)>,
        stdout: &mut W,
    ) -> Result<Ended, StdioError>
    where
        R: AsyncBufRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let Link { opts, door, held } = self;
        let (mut sink, mut stream) = ws.split();
        // Our own MCP handshake with the broker, so it sends attachment news at once.
        let iid = door.internal_id();
        door.intercepts.insert(iid.to_string(), Intercept::Ignore);
        let hello = jsonrpc::request(
            &iid,
            handshake::INITIALIZE,
            handshake::InitializeParams::broker("pi-ide-broker-stdio", handshake::PROTOCOL_VERSION)
                .to_value(),
        );
        if sink.send(Message::text(hello)).await.is_err() {
            return Ok(Ended::Broker);
        }
        // What the client sent while we were away goes first, in order, once the broker has
        // attached the session again (or after a bounded wait, if no editor covers the cwd).
        let mut flush_at =
            (!queued.is_empty()).then(|| tokio::time::Instant::now() + REATTACH_WAIT);
        loop {
            if flush_at.is_some_and(|t| tokio::time::Instant::now() >= t) {
                flush_at = None;
                for (line, _) in std::mem::take(queued) {
                    if !to_broker(door, &mut sink, stdout, held, &line).await? {
                        return Ok(Ended::Broker);
                    }
                }
            }
            tokio::select! {
                _ = sleep_until_opt(flush_at) => {}
                line = lines.next_line() => {
                    let line = match line? {
                        None => {
                            // EOF: a proper close; the broker closes the diffs it still owns.
                            close_broker(sink, stream).await;
                            return Ok(Ended::Stdin);
                        }
                        Some(Line::Text(l)) => l,
                        Some(Line::TooLong) => {
                            write_line(stdout, &too_long(opts.max_line)).await?;
                            continue;
                        }
                    };
                    if line.trim().is_empty() {
                        continue;
                    }
                    if !to_broker(door, &mut sink, stdout, held, &line).await? {
                        // Not sent: it goes again once the broker is back.
                        queued.push((line.clone(), tokio::time::Instant::now()));
                        door.forget_sent(&line);
                        return Ok(Ended::Broker);
                    }
                }
                frame = stream.next() => {
                    let text = match frame {
                        Some(Ok(Message::Text(t))) => t.as_str().to_owned(),
                        Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return Ok(Ended::Broker),
                        Some(Ok(_)) => continue,
                    };
                    if flush_at.is_some() && text.contains(&format!("\"{}\"", jsonrpc::broker::ATTACHED)) {
                        flush_at = Some(tokio::time::Instant::now());
                    }
                    to_client(door, &mut sink, stdout, held, &text).await?;
                }
            }
        }
    }
}

/// The broker's half of the link's WebSocket.
type BrokerSink = futures_util::stream::SplitSink<WebSocketStream<Stream>, Message>;

/// What the client's `line` makes: frames for the broker, lines for the client, or the release
/// of what was held for it. `Ok(false)` when the broker's socket failed (the line was not
/// sent).
async fn to_broker<W: AsyncWrite + Unpin>(
    door: &mut Door,
    sink: &mut BrokerSink,
    stdout: &mut W,
    held: &mut Option<Vec<String>>,
    line: &str,
) -> Result<bool, StdioError> {
    for out in from_client(door, line) {
        match out {
            Out::Broker(t) => {
                if sink.send(Message::text(t)).await.is_err() {
                    return Ok(false);
                }
            }
            Out::Client(t) | Out::ClientNow(t) => write_line(stdout, &t).await?,
            Out::ClientReady => release(held, stdout).await?,
        }
    }
    Ok(true)
}

/// What the broker's `text` makes: lines for the client (held, but for answers, until the
/// client is initialized) or frames back to the broker.
async fn to_client<W: AsyncWrite + Unpin>(
    door: &mut Door,
    sink: &mut BrokerSink,
    stdout: &mut W,
    held: &mut Option<Vec<String>>,
    text: &str,
) -> Result<(), StdioError> {
    for out in from_broker(door, text) {
        match out {
            Out::Broker(t) => {
                let _ = sink.send(Message::text(t)).await;
            }
            Out::Client(t) => match held.as_mut() {
                Some(h) if !is_response(&t) => h.push(t),
                _ => write_line(stdout, &t).await?,
            },
            Out::ClientNow(t) => write_line(stdout, &t).await?,
            Out::ClientReady => {}
        }
    }
    Ok(())
}

/// A proper close of the broker's socket, waiting (1 s at most) for the broker's end.
async fn close_broker(
    mut sink: BrokerSink,
    mut stream: futures_util::stream::SplitStream<WebSocketStream<Stream>>,
) {
    let _ = sink.close().await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
}

/// The client is initialized: what was held goes out.
async fn release<W: AsyncWrite + Unpin>(
    held: &mut Option<Vec<String>>,
    stdout: &mut W,
) -> std::io::Result<()> {
    for t in held.take().unwrap_or_default() {
        write_line(stdout, &t).await?;
    }
    Ok(())
}

fn too_long(max: usize) -> String {
    tracing::warn!(max, "discarded an over-long line from the client");
    jsonrpc::error(
        &Value::Null,
        jsonrpc::INVALID_REQUEST,
        &format!("Invalid Request: line longer than {max} bytes discarded"),
    )
}

/// Dials the broker again (with backoff, starting a daemon once unless spawning is off) while
/// still reading stdin: lines are queued, and requests that waited [`RECONNECT_WAIT`] are
/// answered with an error. `None` when stdin ends first.
async fn reconnect<R, W>(
    opts: &Options,
    lines: &mut CappedLines<R>,
    queued: &mut Vec<(String, tokio::time::Instant)>,
    stdout: &mut W,
) -> Result<Option<WebSocketStream<Stream>>, StdioError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    type Dial<'a> = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<WebSocketStream<Stream>, StdioError>> + 'a>,
    >;
    let mut attempt: Dial = Box::pin(connect(opts, opts.spawn));
    let mut said = false;
    loop {
        let expiry = queued
            .iter()
            .filter(|(l, _)| is_request(l))
            .map(|(_, at)| *at + RECONNECT_WAIT)
            .min();
        tokio::select! {
            r = &mut attempt => match r {
                Ok(ws) => return Ok(Some(ws)),
                Err(e) => {
                    if !std::mem::replace(&mut said, true) {
                        tracing::warn!(error = %e, "the broker is not back yet; still trying");
                    }
                    attempt = Box::pin(async {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        connect(opts, false).await
                    });
                }
            },
            line = lines.next_line() => match line? {
                None => return Ok(None),
                Some(Line::Text(l)) if !l.trim().is_empty() => queued.push((l, tokio::time::Instant::now())),
                Some(Line::Text(_)) => {}
                Some(Line::TooLong) => write_line(stdout, &too_long(opts.max_line)).await?,
            },
            _ = sleep_until_opt(expiry) => {
                let now = tokio::time::Instant::now();
                let (expired, keep): (Vec<_>, Vec<_>) = std::mem::take(queued)
                    .into_iter()
                    .partition(|(l, at)| is_request(l) && now >= *at + RECONNECT_WAIT);
                *queued = keep;
                for (line, _) in expired {
                    if let Ok(jsonrpc::Incoming::Request { id, .. }) = jsonrpc::classify(&line) {
                        let e = jsonrpc::error(&id, jsonrpc::SERVER_ERROR, &format!("pi-ide-broker restarted and is not back after {} s; retry later", RECONNECT_WAIT.as_secs()));
                        write_line(stdout, &e).await?;
                    }
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn is_request(line: &str) -> bool {
    matches!(
        jsonrpc::classify(line),
        Ok(jsonrpc::Incoming::Request { .. })
    )
}

/// Answers every request with a JSON-RPC error naming `why`, until stdin ends: a client sees
/// why it has no editor tools instead of an empty list.
async fn refuse_all<R, W>(
    stdin: R,
    stdout: &mut W,
    why: &str,
    max_line: usize,
) -> Result<(), StdioError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut lines = CappedLines::new(stdin, max_line);
    while let Some(line) = lines.next_line().await? {
        let Line::Text(line) = line else {
            let e = jsonrpc::error(
                &Value::Null,
                jsonrpc::INVALID_REQUEST,
                "Invalid Request: line too long",
            );
            write_line(stdout, &e).await?;
            continue;
        };
        match jsonrpc::classify(&line) {
            Ok(jsonrpc::Incoming::Request { id, .. }) => {
                write_line(stdout, &jsonrpc::error(&id, jsonrpc::SERVER_ERROR, why)).await?;
            }
            Err(r) if !line.trim().is_empty() => {
                write_line(stdout, &jsonrpc::rejection(&r)).await?;
            }
            _ => {}
        }
    }
    Ok(())
}

async fn write_line<W: AsyncWrite + Unpin>(w: &mut W, text: &str) -> std::io::Result<()> {
    w.write_all(text.as_bytes()).await?;
    w.write_all(b"\n").await?;
    w.flush().await
}

/// The default session key: the parent process id (stable across an MCP client's restarts
/// of this server within one agent process).
pub fn default_key() -> String {
    format!(
        "ppid-{}",
        crate::platform::process::parent_id().unwrap_or(0)
    )
}
