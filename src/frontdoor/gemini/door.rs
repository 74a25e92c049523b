//! The gemini door as the daemon, `status` and `doctor` see it (`frontdoor::plugin`).

use crate::frontdoor::plugin::{AgentDoor, Check, DoorTask, Level};
use crate::registry::session::Door;
use crate::registry::Registry;
use crate::sys::config::Config;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

/// How the gemini door's sessions are named: Gemini CLI cannot answer an editor's own
/// requests (`getSuggestions`), so none is handed to them.
pub const DOOR_ID: Door = Door::Plugged {
    name: "gemini",
    answers_editor_requests: false,
};

/// The gemini door: Gemini CLI's (and Qwen Code's) IDE companion protocol, per editor.
pub struct GeminiDoor;

/// A discovery file the gemini door published (`gemini_files` in the status document).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct GeminiFile {
    /// The file.
    pub path: PathBuf,
    /// The editor it stands for.
    pub editor: String,
}

/// The status member the door adds.
const STATUS_KEY: &str = "gemini_files";

impl AgentDoor for GeminiDoor {
    fn name(&self) -> &'static str {
        "gemini"
    }

    fn section(&self) -> Option<crate::sys::config::SectionCheck> {
        Some(crate::sys::config::SectionCheck::of::<super::GeminiConfig>())
    }

    fn enabled(&self, config: &Config) -> bool {
        super::GeminiConfig::of(config).enabled
    }

    fn run(&self, reg: Arc<Registry>) -> DoorTask {
        let section = super::GeminiConfig::of(&reg.config());
        let (dir, qwen) = (section.dir(), section.qwen_dir());
        Box::pin(super::run(reg, dir, qwen))
    }

    fn status(&self, reg: &Registry) -> Map<String, Value> {
        let dir = super::GeminiConfig::of(&reg.config()).dir();
        let files: Vec<GeminiFile> = super::list_files(&dir)
            .into_iter()
            .filter_map(|(name, editor)| {
                Some(GeminiFile {
                    path: dir.join(name),
                    editor: editor?,
                })
            })
            .collect();
        let mut m = Map::new();
        m.insert(
            STATUS_KEY.into(),
            serde_json::to_value(files).unwrap_or_default(),
        );
        m
    }

    fn status_text(&self, doors: &Map<String, Value>) -> Option<String> {
        let files: Vec<GeminiFile> = serde_json::from_value(doors.get(STATUS_KEY)?.clone()).ok()?;
        if files.is_empty() {
            return None;
        }
        let mut out = "\nGemini CLI discovery files:\n".to_string();
        for f in &files {
            let _ = writeln!(out, "  {} → {}", f.editor, f.path.display());
        }
        Some(out)
    }

    fn doctor(&self, config: &Config, _doors: Option<&Map<String, Value>>) -> Vec<Check> {
        let section = super::GeminiConfig::of(config);
        if !section.enabled {
            let off = "the gemini door is off ([gemini] enabled = false)";
            return vec![Check::new("gemini", Level::Ok, off)];
        }
        let dir = section.dir();
        let files = super::list_files(&dir);
        let ours = files.iter().filter(|(_, e)| e.is_some()).count();
        let mut checks = vec![Check::new(
            "gemini",
            Level::Ok,
            format!(
                "{} holds {ours} discovery file{} for Gemini CLI ({} from other programs)",
                dir.display(),
                if ours == 1 { "" } else { "s" },
                files.len() - ours
            ),
        )];
        let home = std::env::var_os("GEMINI_CLI_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(crate::sys::config::home_dir);
        let settings = home.join(".gemini").join("settings.json");
        let enabled = std::fs::read_to_string(&settings)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|v| v.pointer("/ide/enabled") == Some(&Value::Bool(true)));
        if !enabled {
            checks.push(
                Check::new(
                    "gemini",
                    Level::Ok,
                    format!("IDE mode is not on in {}", settings.display()),
                )
                .with_fix(
                    "run /ide enable in Gemini CLI, or set {\"ide\": {\"enabled\": true}} there",
                ),
            );
        }
        checks
    }
}
