//! The daemon's ways in; each hands a session to `session::run`, a follower to `session::follow::run`.
//!
//! The native socket and each remote's (`socket`, `native`, with the rights each peer gets:
//! `rights`), the compat door and the gemini door (both an endpoint per editor,
//! `per_editor`), the copilot door (a lockfile and private socket per editor), under the caps the registry holds (`registry::limits`), and the status
//! document (`status`). Every door hands its agent sessions to [`crate::session::run`] and its
//! followers to [`crate::session::follow::run`]; the stdio doors (`mcp`, `acp`) are CLI
//! processes that dial the socket (`crate::cli`). Uses `session`, `registry` and everything
//! below them.

use crate::registry::limits;

pub mod acp;
pub mod client;
pub mod codex;
pub mod compat;
pub mod copilot;
pub mod gemini;
pub(crate) mod lines;
pub mod mcp;
pub(crate) mod mcp_http;
pub(crate) mod native;
pub(crate) mod per_editor;
pub mod plugin;
pub(crate) mod rights;
pub mod status;

/// The config sections of the doors of [`DOORS`], for [`crate::sys::config::Config::load`].
pub fn sections() -> Vec<crate::sys::config::SectionCheck> {
    DOORS.iter().filter_map(|d| d.section()).collect()
}

/// `config` with the lock dirs of the doors it turns on (`AgentDoor::lock_dirs`): watched
/// with the user's, listed by `status` and `doctor`.
pub fn with_door_lock_dirs(mut config: crate::sys::config::Config) -> crate::sys::config::Config {
    config.door_lock_dirs = DOORS
        .iter()
        .filter(|d| d.enabled(&config))
        .flat_map(|d| d.lock_dirs(&config))
        .collect();
    config
}

/// The agent doors plugged into the daemon (`plugin`), in the order `status` and `doctor`
/// show them: one line a door. The native socket is the core's own and not listed.
pub static DOORS: &[&dyn plugin::AgentDoor] = &[
    &compat::CompatDoor,
    &gemini::GeminiDoor,
    &codex::CodexDoor,
    &copilot::CopilotDoor,
    &copilot::editor::CopilotEditors,
];

/// True when a `Sec-WebSocket-Protocol` value offers `mcp` (Claude Code asks for it, and its
/// `ws` client refuses a 101 that does not echo it).
pub fn offers_mcp(protocols: Option<&str>) -> bool {
    protocols.is_some_and(|v| v.split(',').any(|p| p.trim() == "mcp"))
}

/// A connection's socket after its upgrade: the two owned halves a session reads and writes
/// without a lock between them.
pub trait IntoHalves:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + Sized + 'static
{
    /// The read half.
    type Read: tokio::io::AsyncRead + Unpin + Send + 'static;
    /// The write half.
    type Write: tokio::io::AsyncWrite + Send + 'static;
    /// Splits the socket.
    fn into_halves(self) -> (Self::Read, Self::Write);
}

#[cfg(unix)]
impl IntoHalves for crate::platform::local::Stream {
    type Read = tokio::net::unix::OwnedReadHalf;
    type Write = tokio::net::unix::OwnedWriteHalf;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
}

/// A pipe has no owned halves of its own: tokio's split (a lock between the halves).
#[cfg(windows)]
impl IntoHalves for crate::platform::local::Stream {
    type Read = tokio::io::ReadHalf<Self>;
    type Write = tokio::io::WriteHalf<Self>;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        tokio::io::split(self)
    }
}

impl IntoHalves for tokio::net::TcpStream {
    type Read = tokio::net::tcp::OwnedReadHalf;
    type Write = tokio::net::tcp::OwnedWriteHalf;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
}

/// What an upgraded WebSocket on the native socket serves.
pub enum Upgraded {
    /// An agent session (`/v1/session`).
    Session(crate::session::Intro),
    /// A follower of this session, with its client's name and whether its editor's buffers
    /// can be read (`/v1/follow`).
    Follow(std::sync::Arc<crate::session::Session>, String, bool),
}

/// Runs what `target` names on a connection hyper has upgraded. It gets the socket itself
/// back (with any bytes the client sent behind its request), so its reads and writes do not
/// pass through hyper's upgrade layers.
pub async fn run_upgraded<S: IntoHalves>(
    reg: std::sync::Arc<crate::registry::Registry>,
    up: hyper::upgrade::Upgraded,
    target: Upgraded,
) {
    use crate::wire::wsframe::{FrameReader, FrameWriter, Role};
    use hyper_util::rt::TokioIo;
    let max = reg.config().max_frame_bytes;
    // Long messages share the budget for messages in flight: an agent's as its realm's, a
    // follower's (the owner only) and the owner's sessions' as the owner's.
    let realm = match &target {
        Upgraded::Session(intro) => intro.realm.as_deref(),
        Upgraded::Follow(..) => None,
    };
    let share = reg.frames.share(realm);
    match up.downcast::<TokioIo<S>>() {
        Ok(parts) => {
            let hyper::upgrade::Parts { io, read_buf, .. } = parts;
            let (rd, wr) = io.into_inner().into_halves();
            let reader = FrameReader::new(rd, Role::Server, max, &read_buf).with_budget(share);
            // Copied, and dropped before the session runs: `read_buf` keeps hyper's whole
            // read buffer alive (4 KiB a session).
            drop(read_buf);
            let writer = FrameWriter::new(Box::pin(wr) as _, Role::Server);
            serve_upgraded(reg, reader, writer, target).await;
        }
        Err(up) => {
            let (rd, wr) = tokio::io::split(TokioIo::new(up));
            let reader = FrameReader::new(rd, Role::Server, max, &[]).with_budget(share);
            let writer = FrameWriter::new(Box::pin(wr) as _, Role::Server);
            serve_upgraded(reg, reader, writer, target).await;
        }
    }
}

async fn serve_upgraded<R>(
    reg: std::sync::Arc<crate::registry::Registry>,
    reader: crate::wire::wsframe::FrameReader<R>,
    writer: crate::wire::outbox::SessionSink,
    target: Upgraded,
) where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    match target {
        Upgraded::Session(intro) => crate::session::run(reg, reader, writer, intro).await,
        Upgraded::Follow(session, name, buffers) => {
            crate::session::follow::run(reg, reader, writer, session, name, buffers).await
        }
    }
}

/// The `Sec-WebSocket-Key` of a WebSocket upgrade request, or why the request is not one.
pub fn websocket_key(h: &hyper::HeaderMap) -> Result<String, &'static str> {
    use hyper::header;
    let has = |name: header::HeaderName, want: &str| {
        h.get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|p| p.trim().eq_ignore_ascii_case(want)))
    };
    if !has(header::UPGRADE, "websocket") || !has(header::CONNECTION, "upgrade") {
        return Err("a WebSocket upgrade is needed (Upgrade: websocket)");
    }
    if h.get(header::SEC_WEBSOCKET_VERSION)
        .and_then(|v| v.to_str().ok())
        != Some("13")
    {
        return Err("Sec-WebSocket-Version must be 13");
    }
    h.get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
        .map(String::from)
        .ok_or("missing Sec-WebSocket-Key")
}

/// The 101 that completes a WebSocket upgrade with `key`, echoing subprotocol `mcp` when the
/// client offered it.
pub fn switching_protocols<B: Default>(key: &str, mcp: bool) -> hyper::Response<B> {
    use hyper::header::{self, HeaderValue};
    let mut r = hyper::Response::new(B::default());
    *r.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if mcp {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("mcp"),
        );
    }
    r
}

/// How long a connection that has given its handshake place back may wait between requests.
pub const KEEP_ALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// Serves one accepted connection over HTTP/1.1 (upgrades allowed), the same way on every
/// door: nothing at all unless it sends a first byte within [`limits::FIRST_BYTE`] (noted on
/// its handshake place through `heard`). Until it gives its handshake place back the door
/// closes it at [`limits::HANDSHAKE_DEADLINE`] (the place's `closer`); after that, a
/// keep-alive connection may idle [`KEEP_ALIVE_IDLE`] between requests (HTTP clients such
/// as Node's close theirs after 4 s idle: the client, not the broker, ends an idle one, so no
/// request races a close).
pub async fn serve_http<S, Svc, B>(
    stream: S,
    heard: &limits::Heard,
    svc: Svc,
) -> Result<(), hyper::Error>
where
    S: limits::Readable + tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    Svc: hyper::service::Service<
        hyper::Request<hyper::body::Incoming>,
        Response = hyper::Response<B>,
    >,
    Svc::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    Svc::Future: 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if !limits::first_byte(&stream, heard).await {
        return Ok(());
    }
    hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(KEEP_ALIVE_IDLE)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
        .with_upgrades()
        .await
}

/// Why a door refused a peer or a request: this layer's one error type. Its message is the
/// answer's body (`{"error": "…"}`) or the log line.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The peer's rights do not reach this (HTTP 403), or it may not connect at all.
    #[error("{0}")]
    Refused(String),
    /// The request is malformed (HTTP 400).
    #[error("{0}")]
    BadRequest(String),
    /// A dir the door publishes into is not private (the gemini door's discovery files).
    #[error("{0}")]
    Unsafe(String),
}

#[cfg(test)]
mod tests {
    use crate::sys::config::{Config, Section};

    /// `S`'s section of `config` and its defaults, as the same TOML.
    fn same_as_default<S: Section>(config: &Config) {
        let (parsed, default) = (config.section::<S>(), S::default());
        assert_eq!(
            toml::Value::try_from(&parsed).unwrap(),
            toml::Value::try_from(&default).unwrap(),
            "[{}] of config.example.toml",
            S::NAME
        );
    }

    /// Every door's section in `config.example.toml` is known, parses, and says the defaults.
    #[test]
    fn the_example_configs_door_sections_are_their_defaults() {
        let text = include_str!("../../config.example.toml");
        let config: Config = toml::from_str(text).unwrap();
        config.check_sections(&super::sections()).unwrap();
        let names: Vec<&str> = config.doors.keys().map(String::as_str).collect();
        assert_eq!(names, ["codex", "compat", "copilot", "gemini"]);
        same_as_default::<super::compat::CompatConfig>(&config);
        same_as_default::<super::gemini::GeminiConfig>(&config);
        same_as_default::<super::codex::CodexConfig>(&config);
        same_as_default::<super::copilot::CopilotConfig>(&config);
    }

    /// A misspelt section or key is refused with what the doors know, never ignored.
    #[test]
    fn an_unknown_section_or_key_is_refused() {
        let known = super::sections();
        let c: Config = toml::from_str("[copilt]\nenabled = true\n").unwrap();
        let e = c.check_sections(&known).unwrap_err();
        assert!(
            e.contains("unknown key `copilt`") && e.contains("copilot"),
            "{e}"
        );
        let c: Config = toml::from_str("[copilot]\nenabld = true\n").unwrap();
        let e = c.check_sections(&known).unwrap_err();
        assert!(
            e.starts_with("in [copilot]: ") && e.contains("enabld"),
            "{e}"
        );
        let c: Config = toml::from_str("sockt = \"/x\"\n").unwrap();
        assert!(c.check_sections(&known).is_err());
        let c: Config = toml::from_str("[copilot]\nenabled = true\n").unwrap();
        c.check_sections(&known).unwrap();
        assert!(c.section::<super::copilot::CopilotConfig>().enabled);
    }
}
