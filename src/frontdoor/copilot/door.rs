//! The copilot door as the daemon, `status` and `doctor` see it (`frontdoor::plugin`).

use crate::frontdoor::plugin::{AgentDoor, Check, DoorTask, Level};
use crate::registry::session::Door;
use crate::registry::Registry;
use crate::sys::config::Config;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

/// How the copilot door's sessions are named: Copilot CLI cannot answer an editor's own
/// requests, so none is handed to them.
pub const DOOR_ID: Door = Door::Plugged {
    name: "copilot",
    answers_editor_requests: false,
};

/// The copilot door: GitHub Copilot CLI's IDE protocol, per editor.
pub struct CopilotDoor;

/// A lockfile the copilot door published (`copilot_lockfiles` in the status document).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopilotLockfile {
    /// The file.
    pub path: PathBuf,
    /// The editor it stands for.
    pub editor: String,
}

/// The status member the door adds.
const STATUS_KEY: &str = "copilot_lockfiles";

impl AgentDoor for CopilotDoor {
    fn name(&self) -> &'static str {
        "copilot"
    }

    fn enabled(&self, config: &Config) -> bool {
        config.copilot.enabled
    }

    fn run(&self, reg: Arc<Registry>) -> DoorTask {
        let (dir, sockets) = (
            reg.config().copilot_dir(),
            reg.config().copilot_socket_dir(),
        );
        Box::pin(super::run(reg, dir, sockets))
    }

    fn status(&self, reg: &Registry) -> Map<String, Value> {
        let files: Vec<CopilotLockfile> = super::list_ours(&reg.config().copilot_dir())
            .into_iter()
            .map(|(path, editor)| CopilotLockfile { path, editor })
            .collect();
        let mut m = Map::new();
        m.insert(
            STATUS_KEY.into(),
            serde_json::to_value(files).unwrap_or_default(),
        );
        m
    }

    fn status_text(&self, doors: &Map<String, Value>) -> Option<String> {
        let files: Vec<CopilotLockfile> =
            serde_json::from_value(doors.get(STATUS_KEY)?.clone()).ok()?;
        if files.is_empty() {
            return None;
        }
        let mut out = "\nCopilot CLI lockfiles:\n".to_string();
        for f in &files {
            let _ = writeln!(out, "  {} → {}", f.editor, f.path.display());
        }
        Some(out)
    }

    fn doctor(&self, config: &Config, _doors: Option<&Map<String, Value>>) -> Vec<Check> {
        if !config.copilot.enabled {
            let off = "the copilot door is off ([copilot] enabled = false)";
            return vec![Check::new("copilot", Level::Ok, off)];
        }
        let dir = config.copilot_dir();
        let ours = super::list_ours(&dir).len();
        vec![Check::new(
            "copilot",
            Level::Ok,
            format!(
                "{} holds {ours} lockfile{} for Copilot CLI",
                dir.display(),
                if ours == 1 { "" } else { "s" }
            ),
        )]
    }
}
