//! Claude-family editors (VS Code's Claude Code extension, JetBrains, claudecode.nvim, Emacs).
//!
//! Their quirks, as the broker serves them:
//! - claudecode.nvim's `close_tab` deletes any buffer the name matches, so a diff is opened
//!   under a name the broker marks as the session's (`protocol::bridge::mark_claude_tab`), and
//!   only marked names are ever closed on a session's behalf or after a crash;
//! - for that, `openDiff` and `close_tab` leave the direct path even for a Claude client.
//!
//! The quirks every family is served alike live with the link: JetBrains' `ping` requests
//! are answered there (`editor::inbound`), claudecode's relative `filePath` in `at_mentioned`
//! is made absolute there, Emacs's lockfile without a token is dialled without a header
//! (`editor::dial`), and the VS Code extension's one client at a time is `editor::taken`'s.

use super::Rules;
use crate::protocol::bridge::{is_marked, mark_claude_tab, Bridge};
use serde_json::{Map, Value};

/// The Claude family.
pub(super) struct ClaudeFamily;

impl Rules for ClaudeFamily {
    fn may_close_leftover(&self, tab: &str) -> bool {
        is_marked(tab)
    }

    fn rewrites_call(&self, tool: &str) -> bool {
        matches!(tool, "openDiff" | "close_tab")
    }

    fn rewrite_call(&self, session: u64, msg: &mut Map<String, Value>) -> Option<Bridge> {
        mark_claude_tab(session, msg)
    }
}

#[cfg(test)]
mod tests {
    use super::super::rules;
    use crate::protocol::family::Family;
    use serde_json::json;

    /// Only the diff tools are rewritten, only marked tabs closed, and the mark is the
    /// session's: what keeps claudecode from deleting a buffer a tab name matches.
    #[test]
    fn claude_editors_get_marked_diff_tabs_and_pi_editors_none() {
        let (claude, pi) = (rules(Family::Claude), rules(Family::Pi));
        assert!(claude.rewrites_call("openDiff") && claude.rewrites_call("close_tab"));
        assert!(!claude.rewrites_call("getDiagnostics"));
        assert!(!pi.rewrites_call("openDiff"));
        let mut call = json!({"params": {"name": "openDiff", "arguments": {"tab_name": "a.rs"}}});
        let call = call.as_object_mut().expect("object");
        assert!(claude.rewrite_call(7, call).is_some());
        let marked = call["params"]["arguments"]["tab_name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert_ne!(marked, "a.rs");
        assert!(claude.may_close_leftover(&marked));
        assert!(!claude.may_close_leftover("a.rs"));
        assert!(pi.may_close_leftover("a.rs"));
        let mut plain = json!({"params": {"name": "openDiff", "arguments": {"tab_name": "a.rs"}}});
        assert!(pi
            .rewrite_call(7, plain.as_object_mut().expect("object"))
            .is_none());
    }
}
