//! The copilot door as the daemon, `status` and `doctor` see it (`frontdoor::plugin`).

use crate::frontdoor::plugin::{AgentDoor, Check, DoorTask, Level};
use crate::registry::session::Door;
use crate::registry::Registry;
use crate::sys::config::Config;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How the copilot door's sessions are named: Copilot CLI cannot answer an editor's own
/// requests, so none is handed to them.
pub const DOOR_ID: Door = Door::Plugged {
    name: "copilot",
    answers_editor_requests: false,
};

/// The copilot door: GitHub Copilot CLI's IDE protocol, per editor.
pub struct CopilotDoor;

/// A lockfile the copilot door published (`copilot_lockfiles` in the status document): which
/// editor Copilot CLI sees through it, on which folders, and the Copilot CLI sessions on it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct CopilotLockfile {
    /// The file.
    pub path: PathBuf,
    /// The editor it stands for.
    pub editor: String,
    /// The editor's folders as the lockfile lists them (Copilot CLI connects by itself in
    /// these).
    #[serde(default)]
    pub folders: Vec<String>,
    /// Subfolders listed besides: the cwds of Copilot CLIs running below the editor's folders.
    #[serde(default)]
    pub subfolders: Vec<String>,
    /// The ids of the sessions connected through it (door `copilot`).
    #[serde(default)]
    pub sessions: Vec<u64>,
}

/// The status member the door adds.
const STATUS_KEY: &str = "copilot_lockfiles";
/// The status member naming Copilot CLI's home while it does not exist (nothing published).
const HOME_MISSING_KEY: &str = "copilot_home_missing";

/// What `status` and `doctor` say while Copilot CLI's home `home` does not exist.
fn home_missing(home: &str) -> String {
    format!("Copilot CLI has not run here ({home} does not exist): the copilot door publishes its lockfiles once it does")
}

/// The door's lockfiles in `dir` as `status` shows them: the folders each lists, split into
/// the editor's and the subfolders added for Copilot CLIs, and the sessions on its editor.
fn published(reg: &Registry, dir: &Path) -> Vec<CopilotLockfile> {
    let sessions = reg.sessions();
    super::list_ours(dir)
        .into_iter()
        .map(|(path, editor, listed)| {
            let own: Vec<String> = reg
                .editor(&editor)
                .map(|e| crate::frontdoor::per_editor::folders(&e, &e.lockfile()))
                .unwrap_or_default();
            let (folders, subfolders) = listed.into_iter().partition(|f| own.contains(f));
            let sessions = sessions
                .iter()
                .filter(|s| s.door == DOOR_ID && s.is_on(&editor))
                .map(|s| s.id)
                .collect();
            CopilotLockfile {
                path,
                editor,
                folders,
                subfolders,
                sessions,
            }
        })
        .collect()
}

/// The lines `status` prints of the door's lockfiles.
fn render(files: &[CopilotLockfile]) -> String {
    let mut out =
        "\nCopilot CLI sees these editors through the copilot door's lockfiles:\n".to_string();
    for f in files {
        let _ = writeln!(out, "  {} → {}", f.editor, f.path.display());
        let folders = if f.folders.is_empty() {
            "-".to_string()
        } else {
            f.folders.join(", ")
        };
        let _ = write!(out, "    folders {folders}");
        if !f.subfolders.is_empty() {
            let _ = write!(
                out,
                "; subfolders added for a Copilot CLI there: {}",
                f.subfolders.join(", ")
            );
        }
        out.push('\n');
        let ids: Vec<String> = f.sessions.iter().map(u64::to_string).collect();
        let _ = match ids.len() {
            0 => writeln!(out, "    no Copilot CLI connected"),
            1 => writeln!(out, "    Copilot CLI session {}", ids[0]),
            _ => writeln!(out, "    Copilot CLI sessions {}", ids.join(", ")),
        };
    }
    out
}

impl AgentDoor for CopilotDoor {
    fn name(&self) -> &'static str {
        "copilot"
    }

    fn section(&self) -> Option<crate::sys::config::SectionCheck> {
        Some(crate::sys::config::SectionCheck::of::<super::CopilotConfig>())
    }

    fn enabled(&self, config: &Config) -> bool {
        super::CopilotConfig::of(config).enabled
    }

    fn run(&self, reg: Arc<Registry>) -> DoorTask {
        let (dir, sockets) = (
            super::CopilotConfig::of(&reg.config()).dir(),
            super::socket_dir(&reg.config()),
        );
        Box::pin(super::run(reg, dir, sockets))
    }

    fn status(&self, reg: &Registry) -> Map<String, Value> {
        let dir = super::CopilotConfig::of(&reg.config()).dir();
        let files = published(reg, &dir);
        let mut m = Map::new();
        m.insert(
            STATUS_KEY.into(),
            serde_json::to_value(files).unwrap_or_default(),
        );
        let home = super::home_of(&dir);
        if !home.is_dir() {
            m.insert(HOME_MISSING_KEY.into(), home.display().to_string().into());
        }
        m
    }

    fn status_text(&self, doors: &Map<String, Value>) -> Option<String> {
        if let Some(home) = doors.get(HOME_MISSING_KEY).and_then(Value::as_str) {
            return Some(format!("\n{}\n", home_missing(home)));
        }
        let files: Vec<CopilotLockfile> =
            serde_json::from_value(doors.get(STATUS_KEY)?.clone()).ok()?;
        (!files.is_empty()).then(|| render(&files))
    }

    fn doctor(&self, config: &Config, doors: Option<&Map<String, Value>>) -> Vec<Check> {
        let section = super::CopilotConfig::of(config);
        if !section.enabled {
            let off = "the copilot door is off ([copilot] enabled = false): Copilot CLI lists no editor through the broker";
            return vec![Check::new("copilot", Level::Ok, off).with_fix(
                "set enabled = true under [copilot] in the config, then `pi-ide-broker reload`",
            )];
        }
        let dir = section.dir();
        let home = super::home_of(&dir);
        if !home.is_dir() {
            let said = home_missing(&home.display().to_string());
            return vec![Check::new("copilot", Level::Ok, said)];
        }
        let mut checks = vec![summary(&dir, doors)];
        checks.extend(stale(&dir));
        checks
    }
}

/// The door's line: its dir, its lockfiles, the sessions on them; a daemon that runs without
/// the door is a warning.
fn summary(dir: &Path, doors: Option<&Map<String, Value>>) -> Check {
    let all = super::lockfile::list(dir);
    let ours = all.iter().filter(|(_, v)| v.is_some()).count();
    let mut msg = format!(
        "{} holds {ours} lockfile{} of the copilot door for Copilot CLI ({} from other programs, such as Copilot Chat)",
        dir.display(),
        if ours == 1 { "" } else { "s" },
        all.len() - ours
    );
    let Some(doors) = doors else {
        return Check::new("copilot", Level::Ok, msg);
    };
    let Some(files) = doors.get(STATUS_KEY) else {
        return Check::new(
            "copilot",
            Level::Warn,
            "the copilot door is on in the config, but the running daemon does not serve it",
        )
        .with_fix(
            "restart the broker so it reads the config (`pi-ide-broker stop`, then start it)",
        );
    };
    let files: Vec<CopilotLockfile> = serde_json::from_value(files.clone()).unwrap_or_default();
    let sessions: usize = files.iter().map(|f| f.sessions.len()).sum();
    let _ = write!(
        msg,
        "; the daemon publishes {} (one per editor), {sessions} Copilot CLI session{} connected",
        files.len(),
        if sessions == 1 { "" } else { "s" }
    );
    Check::new("copilot", Level::Ok, msg)
}

/// A warning per lockfile of ours a broker that is gone left (killed before it could remove
/// it): Copilot CLI lists it in `/ide`, and one connected through it would wait on a dead
/// socket.
fn stale(dir: &Path) -> Vec<Check> {
    super::lockfile::list(dir)
        .into_iter()
        .filter_map(|(name, v)| {
            let pid = super::lockfile::broker_pid(&v?);
            if crate::platform::process::alive(pid) {
                return None;
            }
            let path = dir.join(name);
            Some(
                Check::new(
                    format!("copilot lockfile {}", path.display()),
                    Level::Warn,
                    format!("left by a broker that is gone (pid {pid}): Copilot CLI still lists it in /ide, and a CLI on it waits on a dead socket"),
                )
                .with_fix("start the broker (it removes its dead predecessor's lockfiles at start), or delete the file"),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `status` prints of the door: per lockfile, the editor, the file, its folders (the
    /// subfolders added for Copilot CLIs apart) and the Copilot CLI sessions on it.
    #[test]
    fn status_lines_name_the_editor_its_lockfile_folders_and_sessions() {
        let doc = serde_json::json!({STATUS_KEY: [
            {"path": "/h/.copilot/ide/a.lock", "editor": "neovim-1", "folders": ["/p"],
             "subfolders": ["/p/src"], "sessions": [3, 4]},
            {"path": "/h/.copilot/ide/b.lock", "editor": "code-2", "folders": ["/q"]}
        ]});
        let doors = doc.as_object().unwrap();
        let t = CopilotDoor.status_text(doors).unwrap();
        assert_eq!(
            t,
            "
Copilot CLI sees these editors through the copilot door's lockfiles:
  neovim-1 → /h/.copilot/ide/a.lock
    folders /p; subfolders added for a Copilot CLI there: /p/src
    Copilot CLI sessions 3, 4
  code-2 → /h/.copilot/ide/b.lock
    folders /q
    no Copilot CLI connected
"
        );
        let none = serde_json::json!({STATUS_KEY: []});
        assert_eq!(CopilotDoor.status_text(none.as_object().unwrap()), None);
    }

    /// `doctor`: the door's dir and counts; a lockfile of ours whose broker is dead is a
    /// warning that says what to do; a live one, and another program's, are not.
    #[test]
    fn doctor_warns_of_a_dead_brokers_lockfile() {
        let dir = tempfile::tempdir().unwrap();
        let marker = crate::frontdoor::per_editor::MARKER;
        let dead = serde_json::json!({marker: {"pid": u32::MAX - 1, "editor": "e1"}});
        std::fs::write(dir.path().join("d.lock"), dead.to_string()).unwrap();
        let live = serde_json::json!({marker: {"pid": std::process::id(), "editor": "e2"}});
        std::fs::write(dir.path().join("l.lock"), live.to_string()).unwrap();
        std::fs::write(dir.path().join("f.lock"), r#"{"pid": 1}"#).unwrap();
        let mut config = Config::default();
        config.edit_section(|s: &mut super::super::CopilotConfig| {
            s.enabled = true;
            s.dir = Some(dir.path().to_path_buf());
        });
        let checks = CopilotDoor.doctor(&config, None);
        assert!(
            checks[0]
                .message
                .contains("holds 2 lockfiles of the copilot door")
                && checks[0].message.contains("1 from other programs"),
            "{checks:?}"
        );
        let warned: Vec<&Check> = checks.iter().filter(|c| c.level == Level::Warn).collect();
        assert_eq!(warned.len(), 1, "{checks:?}");
        assert!(warned[0].what.ends_with("d.lock"), "{warned:?}");
        assert!(warned[0]
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("start the broker")));
        let mut off = Config::default();
        off.edit_section(|s: &mut super::super::CopilotConfig| s.enabled = false);
        let checks = CopilotDoor.doctor(&off, None);
        assert!(checks[0].message.contains("off"), "{checks:?}");
    }
}
