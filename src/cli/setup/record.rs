//! What `setup` did, kept in the state dir (`setup.json`) so that `setup --undo` takes back
//! exactly that and nothing a user or another tool did.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Everything setup changed, over all its runs.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Record {
    /// The service unit setup wrote and enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_unit: Option<PathBuf>,
    /// The daemon setup started where no service manager could (its pid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_pid: Option<u32>,
    /// The pi package source setup installed (`pi install <source>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pi_source: Option<String>,
    /// Whether setup ran `claude mcp add` (user scope).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub claude_mcp: bool,
    /// The copy of an npm-installed binary setup made, for the service and MCP entries to run
    /// (a path no package update or `pi remove` touches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary_copy: Option<PathBuf>,
    /// The `pi-ide-broker` symlink setup put on the user's PATH (`~/.local/bin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_link: Option<PathBuf>,
    /// The dirs setup created (an empty `~/.local/bin` for the link): `--undo` removes each
    /// that is empty by then, and never one the user had.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub created_dirs: Vec<PathBuf>,
    /// The MCP entries setup added to config files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_files: Vec<McpFile>,
}

/// One MCP entry setup added to one file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct McpFile {
    /// The client (`codex`, `opencode`, `gemini`).
    pub client: String,
    /// The file.
    pub file: PathBuf,
    /// Setup created the file (undo removes it when nothing else is left in it).
    pub created_file: bool,
    /// Setup created the servers table or object the entry sits in.
    pub created_container: bool,
    /// The command the entry runs (what undo looks for).
    pub command: String,
}

/// `setup.json` in `state_dir`.
pub(super) fn path(state_dir: &Path) -> PathBuf {
    state_dir.join("setup.json")
}

impl Record {
    /// The record in `state_dir`, empty when there is none; an unreadable one is an error
    /// (undo must not guess).
    pub(super) fn load(state_dir: &Path) -> Result<Record, String> {
        let p = path(state_dir);
        match std::fs::read_to_string(&p) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                format!(
                    "{} is not a setup record ({e}); fix or remove it",
                    p.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Record::default()),
            Err(e) => Err(format!("cannot read {}: {e}", p.display())),
        }
    }

    /// Writes the record (removes the file when nothing is recorded).
    pub(super) fn save(&self, state_dir: &Path) -> Result<(), String> {
        let p = path(state_dir);
        if *self == Record::default() {
            return match std::fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(format!("cannot remove {}: {e}", p.display()))
                }
                _ => Ok(()),
            };
        }
        std::fs::create_dir_all(state_dir)
            .map_err(|e| format!("cannot create {}: {e}", state_dir.display()))?;
        let text = serde_json::to_string_pretty(self).unwrap_or_default();
        std::fs::write(&p, text + "\n").map_err(|e| format!("cannot write {}: {e}", p.display()))
    }
}
