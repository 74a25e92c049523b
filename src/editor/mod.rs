//! One editor: the handle the broker shares and the task that keeps its one link alive.
//!
//! The handle the broker shares (`handle`) and the task that keeps its one link alive (`link`),
//! dialled to the endpoint a validated lockfile names (`lockfile`). Which lockfiles become
//! editors, and when, is the registry's (`registry::lifecycle`).
//!
//! The handle owns the link's outbound id space and its pending-request table; the link task
//! alone reads the editor's socket (dial, MCP handshake, health pings, redial with backoff).
//! Uses `wire`, `protocol` and `sys`.

mod dial;
pub mod family;
mod handle;
mod health;
mod inbound;
pub mod journal;
mod link;
pub mod lockfile;
mod parked;
pub(crate) mod taken;

pub use handle::{
    CallInFlight, Delegation, Editor, LinkInfo, LinkState, Owner, Pending, Succession,
};
pub use inbound::handle_editor_frame;
pub use journal::DiffJournal;
pub use link::{run, span};

use crate::sys::config::Config;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// How long a closing link waits for its Close to be written, and then for the editor to
/// close the connection.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// What the link task needs from the rest of the broker.
pub trait LinkHost: Send + Sync + 'static {
    /// The current config (it may be reloaded).
    fn config(&self) -> Arc<Config>;
    /// A strictly increasing, non-zero stamp ordering "who was touched last".
    fn stamp(&self) -> u64;
    /// Reads and validates `editor`'s lockfile again, as admission does (before every redial:
    /// a new token, or a file now gone or refused).
    fn read_lockfile(&self, editor: &Editor) -> Result<lockfile::Lockfile, Error>;
    /// The link state changed (status watchers wake up).
    fn state_changed(&self);
    /// The link became ready (sessions waiting for this editor can attach).
    fn editor_ready(&self, editor: &Arc<Editor>);
    /// The editor became routable without a link of ours (taken by another client): sessions
    /// waiting for an editor can attach to it.
    fn editor_routable(&self, editor: &Arc<Editor>);
    /// The editor is gone for good (pid dead or lockfile gone).
    fn editor_gone(&self, editor: &Arc<Editor>, reason: String);
    /// The editor's lockfile is refused as not the user's (its owner, mode, pid or port is
    /// another user's): the editor is gone, and the file listed as refused with `reason`
    /// until the lock dir watcher finds it valid again.
    fn lockfile_refused(&self, editor: &Arc<Editor>, reason: String);
    /// A notification other than `selection_changed` for every session on this editor.
    fn broadcast(&self, editor: &Arc<Editor>, text: &str);
    /// An editor-initiated request: hand it to the right session (recorded with
    /// [`Editor::track_delegated`] before the session can answer); false if there is none.
    fn delegate(&self, editor: &Arc<Editor>, id: &Value, msg: Map<String, Value>) -> bool;
    /// `request_cancelled` for a delegated request: forward to its session.
    fn cancel_delegated(&self, editor: &Arc<Editor>, d: &Delegation);
    /// Where the link's own tasks run (its socket's writer task), so a stop waits for them.
    fn tracker(&self) -> &tokio_util::task::TaskTracker;
}

/// Why an editor cannot be used: its lockfile refused (the reason `status` shows), or a call
/// not sent upstream. This layer's one error type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not a `*.lock` name, or a claudecode temp file: silently not ours to read.
    #[error("not a lockfile name")]
    NotALockfile,
    /// `<x>.lock` where x is not a port in 1..=65535.
    #[error("file name does not give a port in 1..65535")]
    BadPort,
    /// The path is a symlink (refused, never followed).
    #[error("is a symlink (refused)")]
    Symlink,
    /// A directory, FIFO, socket or device.
    #[error("is not a regular file")]
    NotRegular,
    /// Owned by someone else: a token in it cannot be trusted.
    #[error("is owned by uid {0}, not by us")]
    ForeignOwner(u32),
    /// Over [`lockfile::MAX_LOCKFILE_BYTES`].
    #[error("is {0} bytes, over the {max}-byte limit", max = lockfile::MAX_LOCKFILE_BYTES)]
    TooLarge(u64),
    /// Empty or cut off in the middle: probably being written; retried on the next event.
    #[error("is incomplete (still being written?)")]
    Incomplete,
    /// Not JSON, or JSON of the wrong shape.
    #[error("is not a valid lockfile: {0}")]
    Malformed(String),
    /// The pid in it is not running: a stale file left by a crash.
    #[error("names pid {0}, which is not running (stale lockfile)")]
    DeadPid(u32),
    /// The pid is alive but its process started after the file was written: the editor
    /// died and an unrelated process got its pid.
    #[error("names pid {0}, a process that started after the file was written (recycled pid; stale lockfile)")]
    RecycledPid(u32),
    /// Group or others may write it: whoever can may point the broker, and the editor's
    /// token, at a port of their own.
    #[error("is writable by group or others (mode {mode:04o}), so another user could rewrite it; make it yours alone: chmod 600 {}", path.display())]
    OthersMayWrite {
        /// Its permission bits.
        mode: u32,
        /// The file, for the fix.
        path: std::path::PathBuf,
    },
    /// The pid in it runs, but as another user: not the user's editor.
    #[error("names pid {pid}, but pid {pid} belongs to uid {uid}, not you: the lockfile's editor is not yours")]
    ForeignPid {
        /// The pid it names.
        pid: u32,
        /// Whose process that is (its real uid).
        uid: u32,
    },
    /// Its port is listened on by another user: the editor's token must not go there.
    #[error("port {port} is listened on by uid {uid}, not you: the lockfile's editor is not yours; the token was not sent")]
    ForeignListener {
        /// The port it names.
        port: u16,
        /// The listener's owner.
        uid: u32,
    },
    /// The file disappeared.
    #[error("no longer exists")]
    Gone,
    /// Another I/O error.
    #[error("cannot be read: {0}")]
    Io(std::io::Error),

    /// The link is down.
    #[error("editor {0} is not connected ({1}); it is being redialled, retry shortly")]
    Down(String, &'static str),
    /// The editor is not reading its socket fast enough.
    #[error("editor {0} is not keeping up (outbound queue full)")]
    Busy(String),
}
