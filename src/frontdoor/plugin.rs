//! The interface an agent door plugs into the daemon by: one value per door, in one list.
//!
//! A door is a protocol family's way in for agents (Gemini CLI's discovery files, Codex's hub
//! socket, pi-ide's virtual lockfiles). It lives in its own folder and says, through
//! [`AgentDoor`], whether the config turns it on, what it serves, what `status` and `doctor`
//! show of it. The daemon starts every door of [`super::DOORS`] (and any a caller of
//! [`crate::broker::serve_with`] adds); nothing else in the core names a door. A door hands
//! each of its agents to the core as a session ([`open_session`]) and speaks its own protocol
//! on the other side.

use crate::registry::session::Intro;
use crate::registry::Registry;
use crate::sys::config::{Config, LockDirConfig, SectionCheck};
use crate::wire::wsframe::{Frame, FrameReader, FrameWriter, Out, Role};
use futures_util::SinkExt;
use serde::Serialize;
use serde_json::{Map, Value};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::{DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A door's task: serves until the registry's cancel token fires.
pub type DoorTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// One agent door, as the daemon, `status` and `doctor` see it.
pub trait AgentDoor: Send + Sync {
    /// Its name: the config section that turns it on, the name its `doctor` lines carry.
    fn name(&self) -> &'static str;

    /// Whether `config` turns it on.
    fn enabled(&self, config: &Config) -> bool;
    /// The lock dirs it writes editors' lockfiles into itself (an editor it serves through an
    /// adapter of its own), watched as the user's are while it is on.
    fn lock_dirs(&self, _config: &Config) -> Vec<LockDirConfig> {
        Vec::new()
    }
    /// Its section of the config file (its type is in its folder), if it has one.
    fn section(&self) -> Option<SectionCheck> {
        None
    }

    /// Its task, started once the registry has seen the lock dirs; it ends when
    /// `reg.cancel` fires.
    fn run(&self, reg: Arc<Registry>) -> DoorTask;

    /// Its part of the status document (`GET /v1/status`): members added at the top level
    /// (e.g. `gemini_files`). The owner sees them; an agent does not.
    fn status(&self, _reg: &Registry) -> Map<String, Value> {
        Map::new()
    }

    /// The lines `status` prints of its part of the document (`doors`: every door's members).
    fn status_text(&self, _doors: &Map<String, Value>) -> Option<String> {
        None
    }

    /// Its `doctor` checks, from the config, its files, and the daemon's status document
    /// when the daemon runs.
    fn doctor(&self, _config: &Config, _doors: Option<&Map<String, Value>>) -> Vec<Check> {
        Vec::new()
    }
}

/// How a `doctor` check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Works.
    Ok,
    /// Worth knowing, not in the way (a stale lockfile left by a crash, say).
    Warn,
    /// In the way: something a user needs does not work.
    Fail,
}

/// One line of the `doctor` report.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What was checked ("daemon", "socket", "lockfile /x/1234.lock", …).
    pub what: String,
    /// How it came out.
    pub level: Level,
    /// What was found.
    pub message: String,
    /// What to do, when something is to be done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    /// A check with nothing to do.
    pub fn new(what: impl Into<String>, level: Level, message: impl Into<String>) -> Check {
        Check {
            what: what.into(),
            level,
            message: message.into(),
            fix: None,
        }
    }

    /// The same check, with what to do.
    pub fn with_fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = Some(fix.into());
        self
    }
}

/// The door's end of a session: WebSocket text frames of the session's family, in memory.
pub struct SessionLink {
    /// What the session sends its agent.
    pub reader: FrameReader<ReadHalf<DuplexStream>>,
    /// What the agent sends the session.
    pub writer: FrameWriter<WriteHalf<DuplexStream>>,
}

/// The bytes in flight between a door and its session's task.
const PIPE_BYTES: usize = 256 * 1024;

/// Starts a session in the core for one of the door's agents (routing, stickiness, diffs and
/// notifications as for any session) and hands back the door's end of it. The session's side
/// reads under its realm's share of the budget for messages in flight (`Intro::realm`: the
/// owner's for the user's own local processes).
pub fn open_session(reg: &Arc<Registry>, intro: Intro) -> SessionLink {
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    let (srv_rd, srv_wr) = tokio::io::split(theirs);
    let max = reg.config().max_frame_bytes;
    let reader = FrameReader::new(srv_rd, Role::Server, max, &[])
        .with_budget(reg.frames.share(intro.realm.as_deref()));
    let writer = FrameWriter::new(Box::pin(srv_wr) as _, Role::Server);
    reg.tracker
        .spawn(crate::session::run(reg.clone(), reader, writer, intro));
    let (rd, wr) = tokio::io::split(ours);
    SessionLink {
        reader: FrameReader::new(rd, Role::Client, max, &[]),
        writer: FrameWriter::new(wr, Role::Client),
    }
}

/// A door's side of one of its sessions: what it makes of the session's frames and of its own
/// commands (from its HTTP side, say), each turned into frames for the session.
pub trait SessionAdapter {
    /// What the door's other side asks of it.
    type Command;
    /// A JSON frame from the session (an answer, a notification, an editor's request);
    /// frames for the session go into `out`.
    fn on_session(&mut self, frame: Value, out: &mut Vec<String>);
    /// A command of the door's; frames for the session go into `out`.
    fn on_command(&mut self, cmd: Self::Command, out: &mut Vec<String>);
}

impl SessionLink {
    /// Runs `adapter` on this link, `hello` (its `initialize`) sent first, until `ended`
    /// fires, the session closes, or the session stops reading; pings are answered. `door`
    /// names the door in its one log line for an unreadable frame.
    pub async fn drive<A: SessionAdapter>(
        mut self,
        adapter: &mut A,
        hello: String,
        mut cmds: mpsc::UnboundedReceiver<A::Command>,
        ended: &CancellationToken,
        door: &str,
    ) {
        let mut out = vec![hello];
        let mut pong: Option<Vec<u8>> = None;
        loop {
            let frames = pong
                .take()
                .map(Out::Pong)
                .into_iter()
                .chain(out.drain(..).map(Out::Text));
            for frame in frames.collect::<Vec<_>>() {
                if self.writer.send(frame).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                biased;
                _ = ended.cancelled() => return,
                frame = self.reader.next() => match frame {
                    Ok(Some(Frame::Text(t))) => match serde_json::from_str::<Value>(t) {
                        Ok(v) => adapter.on_session(v, &mut out),
                        Err(e) => tracing::warn!(error = %e, "{door} door: unreadable frame from its session"),
                    },
                    Ok(Some(Frame::Ping(p))) => pong = Some(p.to_vec()),
                    Ok(Some(Frame::Binary(_) | Frame::Pong(_))) => {}
                    Ok(Some(Frame::Close(_)) | None) | Err(_) => return,
                },
                Some(cmd) = cmds.recv() => adapter.on_command(cmd, &mut out),
            }
        }
    }
}
