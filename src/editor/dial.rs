//! Dialling an editor: the WebSocket upgrade, then the MCP handshake.
//!
//! The WebSocket upgrade (`wsupgrade`), then the MCP handshake (`initialize`, `tools/list`),
//! until the link is ready to carry calls.

use super::handle::*;
use super::inbound::handle_editor_frame;
use super::Editor;
use super::{LinkHost, CLOSE_WAIT};
use crate::platform::sync::lock;
use crate::protocol::handshake::{InitializeParams, INITIALIZE, INITIALIZED, PROTOCOL_VERSION};
use crate::protocol::jsonrpc::{self, Incoming};
use crate::sys::config::Config;
use crate::wire::wsframe::{Frame, FrameReader, FrameWriter, Out, Role};
use futures_util::SinkExt;

use serde_json::{json, Value};
use std::sync::Arc;
use std::time::SystemTime;
use tokio::net::TcpStream;

/// Why a dial failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum DialError {
    #[error("the editor refused our token (HTTP 400); will re-read its lockfile")]
    Refused,
    /// The editor closed the link (a Close frame, answered, or the end of the stream) before
    /// the handshake was done: the link `client_port` is not ready, whatever was answered.
    #[error("{why}")]
    Closed { why: String, client_port: u16 },
    /// The editor answered a handshake request with an error; the link itself is alive.
    #[error("{0}")]
    Answered(String),
    #[error("{0}")]
    Other(String),
    /// The port we reached is another user's (`lockfile::check_port`): the connection is
    /// dropped before the upgrade, so the token is never sent.
    #[error("{0}")]
    Foreign(super::Error),
}

/// A dialled link: both halves, and the socket's acknowledgement switch.
pub(super) struct Dialled {
    pub(super) reader: LinkReader,
    pub(super) writer: LinkSink,
    pub(super) quick_ack: crate::platform::tcp::QuickAck,
    /// The link's own local port (told apart from other clients of the editor).
    pub(super) client_port: u16,
}

/// The editor's loopback port: `127.0.0.1`, or for a Windows editor seen from WSL each of the
/// addresses Windows' loopback is reached at from here (`sys::wsl::windows_hosts`), in order.
async fn connect(lf: &crate::editor::lockfile::Lockfile) -> Result<TcpStream, DialError> {
    let hosts = match lf.wsl {
        Some(_) => crate::sys::wsl::windows_hosts(),
        None => vec![std::net::Ipv4Addr::LOCALHOST],
    };
    let mut last = String::new();
    for host in hosts {
        match TcpStream::connect((host, lf.port)).await {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("connect {host}:{}: {e}", lf.port),
        }
    }
    Err(DialError::Other(last))
}

/// Dial, upgrade with the family's auth header, `initialize`, `notifications/initialized`,
/// `tools/list`. On success the link info holds the cached results.
///
/// A dial for parked calls (a single-client editor taken back from its other client, which
/// comes back within a few ms and has the link closed) does not wait for round trips: right
/// after the upgrade it writes `initialize`, `notifications/initialized`, `tools/list` (only
/// while the editor's tools are unknown) and the parked calls back to back, then reads the
/// answers; a call's answer that comes meanwhile goes to its session at once.
///
/// A Close (answered) or the end of the stream before the handshake is done fails the dial
/// (`DialError::Closed`), even when `initialize` was answered: a link is never declared ready
/// on a `tools/list` that failed because the link died.
pub(super) async fn dial(
    editor: &Arc<Editor>,
    config: &Config,
    host: &dyn LinkHost,
) -> Result<Dialled, DialError> {
    let lf = editor.lockfile();
    let mut stream = connect(&lf).await?;
    let _ = stream.set_nodelay(true);
    let client_port = stream.local_addr().map(|a| a.port()).unwrap_or(0);
    // The last look before the token goes: the end we reached must be the user's. Checked on
    // the connection itself, so a listener of another user that took the port after the
    // lockfile was read (or that left once it accepted us) gets nothing.
    crate::editor::lockfile::check_port(&lf, Some(client_port)).map_err(DialError::Foreign)?;
    let read_ahead = crate::wire::wsupgrade::upgrade(
        &mut stream,
        crate::wire::wsupgrade::Dial {
            port: lf.port,
            auth_header: lf.family.auth_header(),
            token: lf.auth_token.as_ref().map(|t| t.expose()),
            subprotocol: lf.family.subprotocol(),
        },
    )
    .await
    .map_err(|e| match e {
        crate::wire::Error::Refused => DialError::Refused,
        e => DialError::Other(format!("upgrade: {e}")),
    })?;
    let quick_ack = crate::platform::tcp::QuickAck::new(&stream);
    let (rd, wr) = stream.into_split();
    let mut link = Handshake {
        editor,
        host,
        reader: FrameReader::new(rd, Role::Client, config.max_frame_bytes, &read_ahead),
        writer: FrameWriter::new(wr, Role::Client),
        client_port,
    };
    let init_params = InitializeParams::broker("pi-ide-broker", PROTOCOL_VERSION).to_value();
    let initialized = || Out::Text(jsonrpc::notification(INITIALIZED, json!({})));
    let parked = editor.parked_for_dial();
    let (init, tools) = if parked.is_empty() {
        let init = link.call(INITIALIZE, init_params).await?;
        link.write(&mut [initialized()].into_iter()).await?;
        let uid = link.request("tools/list").await?;
        (init, link.tools(uid).await?)
    } else {
        link.pipelined(init_params, initialized(), parked).await?
    };
    let Handshake { reader, writer, .. } = link;
    let mut l = lock(&editor.link);
    l.initialize = Some(init);
    l.tools = tools.or(Some(json!({"tools": []})));
    l.connected_since = Some(SystemTime::now());
    Ok(Dialled {
        client_port,
        reader,
        writer,
        quick_ack,
    })
}

/// A link in its MCP handshake: requests written by the dial itself, answers read (and
/// whatever else comes meanwhile handled) until the ones it waits for.
pub(super) struct Handshake<'a> {
    editor: &'a Arc<Editor>,
    host: &'a dyn LinkHost,
    reader: LinkReader,
    writer: LinkSink,
    client_port: u16,
}

impl Handshake<'_> {
    /// The handshake of a dial for parked calls, without waiting for round trips: writes
    /// `initialize`, `notifications/initialized`, `tools/list` (only while the editor's tools
    /// are unknown) and the parked calls back to back, then reads the answers it needs.
    async fn pipelined(
        &mut self,
        init_params: Value,
        initialized: Out,
        parked: Vec<Out>,
    ) -> Result<(Value, Option<Value>), DialError> {
        let editor = self.editor;
        let known = editor.tool_names().is_some_and(|t| !t.is_empty());
        let init_uid = mint_id(&editor.next_id);
        let list_uid = (!known).then(|| mint_id(&editor.next_id));
        let mut frames = vec![
            Out::Text(jsonrpc::request(&init_uid.into(), INITIALIZE, init_params)),
            initialized,
        ];
        if let Some(uid) = list_uid {
            frames.push(Out::Text(jsonrpc::request(
                &uid.into(),
                "tools/list",
                json!({}),
            )));
        }
        frames.extend(parked);
        self.write(&mut frames.into_iter()).await?;
        let init = self.answer(init_uid, INITIALIZE).await?;
        let tools = match list_uid {
            Some(uid) => self.tools(uid).await?,
            None => lock(&editor.link).tools.clone(),
        };
        Ok((init, tools))
    }

    /// The dial fails: the editor closed the link.
    fn closed(&self, why: &str) -> DialError {
        DialError::Closed {
            why: why.to_string(),
            client_port: self.client_port,
        }
    }

    /// Writes `frames` back to back (one flush).
    async fn write(
        &mut self,
        frames: &mut (dyn Iterator<Item = Out> + Send),
    ) -> Result<(), DialError> {
        for f in frames {
            self.writer
                .feed(f)
                .await
                .map_err(|e| DialError::Other(e.to_string()))?;
        }
        self.writer
            .flush()
            .await
            .map_err(|e| DialError::Other(e.to_string()))
    }

    /// Writes the request `method` (no params) under a minted id, which it returns.
    async fn request(&mut self, method: &str) -> Result<u64, DialError> {
        let uid = mint_id(&self.editor.next_id);
        let frame = Out::Text(jsonrpc::request(&uid.into(), method, json!({})));
        self.write(&mut std::iter::once(frame)).await?;
        Ok(uid)
    }

    /// One request, and its answer.
    async fn call(&mut self, method: &str, params: Value) -> Result<Value, DialError> {
        let uid = mint_id(&self.editor.next_id);
        let frame = Out::Text(jsonrpc::request(&uid.into(), method, params));
        self.write(&mut std::iter::once(frame)).await?;
        self.answer(uid, method).await
    }

    /// The answer to `tools/list` (sent as `uid`), normalised; `None` when the editor answered
    /// it with an error (it still works; its tool list is just unknown). A link that died
    /// meanwhile fails the dial.
    async fn tools(&mut self, uid: u64) -> Result<Option<Value>, DialError> {
        match self.answer(uid, "tools/list").await {
            Ok(mut t) => {
                // Every client gets valid JSON-Schema objects (Lua editors send `[]` for `{}`).
                crate::protocol::schema::normalize_tools(&mut t);
                Ok(Some(t))
            }
            Err(DialError::Answered(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads until the answer to `uid`, handling whatever else comes meanwhile (pings, the
    /// answers to calls written in the same handshake, notifications). A Close is answered
    /// with its own code, and the editor given a bounded second to close the connection.
    async fn answer(&mut self, uid: u64, method: &str) -> Result<Value, DialError> {
        loop {
            let frame = match self.reader.next().await {
                Ok(Some(f)) => f,
                Ok(None) => return Err(self.closed("closed during handshake")),
                Err(e) => return Err(DialError::Other(e.to_string())),
            };
            let text = match frame {
                Frame::Ping(p) => {
                    let pong = Out::Pong(p.to_vec());
                    self.write(&mut std::iter::once(pong)).await?;
                    continue;
                }
                Frame::Close(c) => {
                    let code = c.unwrap_or(1000);
                    if self.writer.send(Out::Close(code)).await.is_ok() {
                        let reader = &mut self.reader;
                        let _ = tokio::time::timeout(CLOSE_WAIT, async {
                            while let Ok(Some(_)) = reader.next().await {}
                        })
                        .await;
                    }
                    let code = c.map_or_else(|| "no code".into(), |c| c.to_string());
                    return Err(self.closed(&format!("closed by editor during handshake ({code})")));
                }
                other => match frame_str(&other) {
                    Some(t) => t,
                    None => continue,
                },
            };
            if let Ok(Incoming::Response { id, msg }) = jsonrpc::classify(text) {
                if id.as_u64() == Some(uid) {
                    return match msg.get("result") {
                        Some(r) => Ok(r.clone()),
                        None => Err(DialError::Answered(format!(
                            "{method} failed: {}",
                            msg.get("error").cloned().unwrap_or(Value::Null)
                        ))),
                    };
                }
            }
            // Anything else: an answer to a call written in this handshake goes to its owner.
            handle_editor_frame(self.editor, self.host, text);
        }
    }
}

/// The text of a data frame, read in place (binary frames are treated as text, as the
/// editors do).
pub(super) fn frame_str<'a>(frame: &Frame<'a>) -> Option<&'a str> {
    match *frame {
        Frame::Text(t) => Some(t),
        Frame::Binary(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::editor::lockfile::Lockfile;
    use crate::editor::Error;
    use crate::platform::process::other_uid;

    /// An editor's port that another user's listener holds by the time of the dial (its
    /// lockfile passed when read): the dial drops the connection before the upgrade, and not
    /// one byte (the token least of all) reaches that listener.
    #[tokio::test]
    async fn a_dial_that_reaches_another_users_listener_sends_nothing() {
        let test = "a_dial_that_reaches_another_users_listener_sends_nothing";
        let Some((mut theirs, port)) = other_uid::accept_once(test) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let lock = Lockfile {
            path: dir.path().join(format!("{port}.lock")),
            family: crate::protocol::family::Family::Pi,
            port,
            pid: std::process::id(),
            workspace_folders: Vec::new(),
            ide_name: "test".into(),
            auth_token: Some(crate::sys::secret::Token::new("SECRET-TOKEN-61".into())),
            wsl: None,
        };
        let editor = Arc::new(Editor::new(
            "test".into(),
            lock,
            Vec::new(),
            crate::editor::Succession::default(),
            tokio_util::sync::CancellationToken::new(),
            Arc::new(crate::editor::DiffJournal::in_memory()),
        ));
        let config = Arc::new(Config::default());
        let host = NoHost(config.clone(), tokio_util::task::TaskTracker::new());
        let dialled = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            dial(&editor, &config, &host),
        )
        .await
        .expect("the dial came back");
        assert!(
            matches!(
                &dialled,
                Err(DialError::Foreign(Error::ForeignListener { uid: 65534, port: p }))
                    if *p == port
            ),
            "{:?}",
            dialled.as_ref().err()
        );
        // The connection is gone: the listener read it to its end, and got nothing.
        let seen = tokio::task::spawn_blocking(move || {
            let lines = [theirs.next_line(), theirs.next_line()];
            drop(theirs);
            lines
        })
        .await
        .unwrap();
        assert_eq!(
            seen,
            [Some("accepted".to_string()), Some("received".to_string())]
        );
    }

    /// A link host that does nothing (this layer may not name the registry, its real host).
    struct NoHost(Arc<Config>, tokio_util::task::TaskTracker);

    impl LinkHost for NoHost {
        fn config(&self) -> Arc<Config> {
            self.0.clone()
        }
        fn read_lockfile(&self, e: &Editor) -> Result<Lockfile, crate::editor::Error> {
            Ok(e.lockfile())
        }
        fn stamp(&self) -> u64 {
            1
        }
        fn state_changed(&self) {}
        fn editor_ready(&self, _: &Arc<Editor>) {}
        fn editor_routable(&self, _: &Arc<Editor>) {}
        fn editor_gone(&self, _: &Arc<Editor>, _: String) {}
        fn lockfile_refused(&self, _: &Arc<Editor>, _: String) {}
        fn broadcast(&self, _: &Arc<Editor>, _: &str) {}
        fn delegate(
            &self,
            _: &Arc<Editor>,
            _: &serde_json::Value,
            _: serde_json::Map<String, serde_json::Value>,
        ) -> bool {
            false
        }
        fn cancel_delegated(&self, _: &Arc<Editor>, _: &crate::editor::handle::Delegation) {}
        fn tracker(&self) -> &tokio_util::task::TaskTracker {
            &self.1
        }
    }
}
