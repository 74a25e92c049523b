//! One editor: the handle the broker shares and the task that keeps its one link alive.
//!
//! The handle the broker shares (`handle`) and the task that keeps its one link alive (`link`),
//! with the lockfiles that announce editors and the lock dir watcher.
//!
//! The handle owns the link's outbound id space and its pending-request table; the link task
//! alone reads the editor's socket (dial, MCP handshake, health pings, redial with backoff).
//! Uses `wire`, `protocol` and `sys`.

mod dial;
mod handle;
pub mod health;
mod inbound;
mod link;
pub mod lockdir;
pub mod lockfile;
mod parked;
pub mod taken;

pub use handle::{
    CallInFlight, Delegation, Editor, LinkInfo, LinkState, Owner, Pending, SendError, Succession,
};
pub use inbound::handle_editor_frame;
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
    /// The link state changed (status watchers wake up).
    fn state_changed(&self);
    /// The link became ready (sessions waiting for this editor can attach).
    fn editor_ready(&self, editor: &Arc<Editor>);
    /// The editor became routable without a link of ours (taken by another client): sessions
    /// waiting for an editor can attach to it.
    fn editor_routable(&self, editor: &Arc<Editor>);
    /// The editor is gone for good (pid dead or lockfile gone).
    fn editor_gone(&self, editor: &Arc<Editor>, reason: String);
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
