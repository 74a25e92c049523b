//! The two editor families and what distinguishes them on the wire.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Which dialect of the editor protocol an editor (or a lock dir) speaks.
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
