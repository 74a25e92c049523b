//! The codex door as the daemon, `status` and `doctor` see it (`frontdoor::plugin`).

use super::{diagnose, hub_state, status_line, Health, HubState};
use crate::frontdoor::plugin::{AgentDoor, Check, DoorTask, Level};
use crate::registry::Registry;
use crate::sys::config::Config;
use serde_json::{Map, Value};
use std::sync::Arc;

/// The codex door: Codex's `/ide` hub socket, served when no Codex app or extension does.
pub struct CodexDoor;

/// The status member the door adds: who holds the hub socket.
const STATUS_KEY: &str = "codex_hub";

/// The hub state a status document's door members carry.
fn hub(doors: &Map<String, Value>) -> Option<HubState> {
    serde_json::from_value(doors.get(STATUS_KEY)?.clone()).ok()
}

impl AgentDoor for CodexDoor {
    fn name(&self) -> &'static str {
        "codex"
    }

    fn section(&self) -> Option<crate::sys::config::SectionCheck> {
        Some(crate::sys::config::SectionCheck::of::<super::CodexConfig>())
    }

    fn enabled(&self, config: &Config) -> bool {
        super::CodexConfig::of(config).enabled
    }

    fn run(&self, reg: Arc<Registry>) -> DoorTask {
        let socket = super::CodexConfig::of(&reg.config()).socket();
        Box::pin(super::run(reg, socket))
    }

    fn status(&self, reg: &Registry) -> Map<String, Value> {
        let mut m = Map::new();
        if let Some(h) = hub_state(&super::CodexConfig::of(&reg.config()).socket()) {
            m.insert(
                STATUS_KEY.into(),
                serde_json::to_value(h).unwrap_or_default(),
            );
        }
        m
    }

    fn status_text(&self, doors: &Map<String, Value>) -> Option<String> {
        hub(doors).map(|h| format!("\nCodex /ide: {}\n", status_line(&h)))
    }

    fn doctor(&self, config: &Config, doors: Option<&Map<String, Value>>) -> Vec<Check> {
        let hub = doors.and_then(hub);
        let section = super::CodexConfig::of(config);
        let (health, message, fix) = diagnose(section.enabled, &section.socket(), hub.as_ref());
        let level = match health {
            Health::Ok => Level::Ok,
            Health::Warn => Level::Warn,
            Health::Fail => Level::Fail,
        };
        let check = Check::new("codex", level, message);
        vec![match fix {
            Some(fix) => check.with_fix(fix),
            None => check,
        }]
    }
}
