//! The two editor families and what distinguishes them on the wire.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;

/// The tools the editors define, in either family (`tests/fixtures/recorded_editors.json` records them).
pub const KNOWN_TOOLS: [&str; 13] = [
    "openDiff",
    "close_tab",
    "closeAllDiffTabs",
    "getDiagnostics",
    "getCurrentSelection",
    "getLatestSelection",
    "getOpenEditors",
    "getOpenEditorTabs",
    "getWorkspaceFolders",
    "checkDocumentDirty",
    "saveDocument",
    "openFile",
    "executeCode",
];

/// A called tool's name as the broker keeps it while the call is in flight: borrowed for the
/// editors' own tools (no allocation per call), owned for any other.
pub fn tool_label(name: &str) -> Cow<'static, str> {
    match KNOWN_TOOLS.iter().find(|t| **t == name) {
        Some(t) => Cow::Borrowed(t),
        None => Cow::Owned(name.to_string()),
    }
}

/// Which family of the editor protocol an editor (or a lock dir) speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// pi-ide.nvim and friends: `~/.pi/ide`, header `x-pi-ide-authorization`.
    Pi,
    /// claudecode.nvim, VS Code, JetBrains: `~/.claude/ide`, header `x-claude-code-ide-authorization`.
    Claude,
}

impl Family {
    /// The header that carries the auth token when dialling an editor of this family.
    pub fn auth_header(self) -> &'static str {
        match self {
            Family::Pi => "x-pi-ide-authorization",
            Family::Claude => "x-claude-code-ide-authorization",
        }
    }

    /// The WebSocket subprotocol this family's own agents offer when dialling an editor:
    /// Claude Code dials every IDE with `mcp`, and JetBrains requires it.
    pub fn subprotocol(self) -> Option<&'static str> {
        match self {
            Family::Pi => None,
            Family::Claude => Some("mcp"),
        }
    }

    /// The lowercase name used in config, status and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Pi => "pi",
            Family::Claude => "claude",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_editors_tools_are_kept_without_a_copy() {
        assert!(matches!(
            tool_label("getDiagnostics"),
            Cow::Borrowed("getDiagnostics")
        ));
        assert!(matches!(tool_label("openDiff"), Cow::Borrowed("openDiff")));
        let other = tool_label("myTool");
        assert!(matches!(other, Cow::Owned(_)));
        assert_eq!(other, "myTool");
    }
}
