//! pi-ide editors (pi-ide.nvim and the editors that speak its family): no quirk to serve.

use super::Rules;
use crate::protocol::bridge::Bridge;
use serde_json::{Map, Value};

/// The pi-ide family.
pub(super) struct PiIde;

impl Rules for PiIde {
    /// Its `close_tab` closes only the diff of that name.
    fn may_close_leftover(&self, _tab: &str) -> bool {
        true
    }

    fn rewrites_call(&self, _tool: &str) -> bool {
        false
    }

    fn rewrite_call(&self, _session: u64, _msg: &mut Map<String, Value>) -> Option<Bridge> {
        None
    }
}
