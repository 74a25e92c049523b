//! Editor families: what differs between a pi-ide editor and a Claude-family one, one file each.
//!
//! The core (links, sessions, routing) asks a family's [`Rules`] where editors differ and
//! never matches on the family itself: [`rules`] is the one place that does. The wire facts
//! of a family (its auth header, its subprotocol, the bridge between families) are the `protocol`
//! crate's; the decisions taken with them live here.

mod claude;
mod pi;

use crate::protocol::bridge::Bridge;
use crate::protocol::family::Family;
use serde_json::{Map, Value};

/// How one family of editors is served.
pub trait Rules: Sync {
    /// Whether a diff tab a dead daemon left open may be closed by its name.
    fn may_close_leftover(&self, tab: &str) -> bool;

    /// Whether a call of `tool` from a session of the editor's own family must leave the
    /// direct path (bytes passed through untouched) because the broker rewrites it.
    fn rewrites_call(&self, tool: &str) -> bool;

    /// Rewrites a call of the editor's own family before it goes to the editor (`session`:
    /// the caller's id); the bridge turns the answer back, if one is needed.
    fn rewrite_call(&self, session: u64, msg: &mut Map<String, Value>) -> Option<Bridge>;
}

/// The rules of `family`.
pub fn rules(family: Family) -> &'static dyn Rules {
    match family {
        Family::Pi => &pi::PiIde,
        Family::Claude => &claude::ClaudeFamily,
    }
}
