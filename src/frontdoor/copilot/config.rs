//! `[copilot]`: the copilot door's section of the config file.

use crate::sys::config::{env_path, expand_home, home_dir, Config, Section};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The copilot family: the door (a Copilot CLI lockfile and a private socket per live
/// editor) and its editor side (Copilot Chat's VS Code servers linked as editors).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CopilotConfig {
    /// Publish lockfiles at all (on: nothing is published until Copilot CLI's home exists,
    /// and the door never creates that home).
    pub enabled: bool,
    /// Where they go; `None` means `$COPILOT_HOME/ide`, else `~/.copilot/ide`, where
    /// Copilot CLI looks.
    pub dir: Option<PathBuf>,
    /// Link every Copilot Chat VS Code server found in [`CopilotConfig::editor_dirs`] as an
    /// editor every session can use (`frontdoor::copilot::editor`).
    pub editors: bool,
    /// Where Copilot Chat writes its lockfiles; `None` means `$XDG_STATE_HOME/.copilot/ide`
    /// (when set), `~/.copilot/ide` and the door's dir.
    pub editor_dirs: Option<Vec<PathBuf>>,
}

impl Default for CopilotConfig {
    fn default() -> Self {
        CopilotConfig {
            enabled: true,
            dir: None,
            editors: true,
            editor_dirs: None,
        }
    }
}

impl Section for CopilotConfig {
    const NAME: &'static str = "copilot";
}

impl CopilotConfig {
    /// This door's section of `config`.
    pub fn of(config: &Config) -> CopilotConfig {
        config.section()
    }

    /// Copilot CLI's ide dir (`copilot.dir`, default `$COPILOT_HOME/ide`, else
    /// `~/.copilot/ide`; `COPILOT_HOME` is taken verbatim, as Copilot CLI takes it).
    pub fn dir(&self) -> PathBuf {
        if let Some(p) = &self.dir {
            return expand_home(p);
        }
        env_path("COPILOT_HOME")
            .unwrap_or_else(|| home_dir().join(".copilot"))
            .join("ide")
    }

    /// Where Copilot Chat's VS Code servers write their lockfiles (`copilot.editor_dirs`).
    pub fn editor_dirs(&self) -> Vec<PathBuf> {
        if let Some(dirs) = &self.editor_dirs {
            return dirs.iter().map(|d| expand_home(d)).collect();
        }
        let mut dirs: Vec<PathBuf> = Vec::new();
        let candidates = [
            env_path("XDG_STATE_HOME").map(|s| s.join(".copilot").join("ide")),
            Some(home_dir().join(".copilot").join("ide")),
            Some(self.dir()),
        ];
        for d in candidates.into_iter().flatten() {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        dirs
    }
}

/// The broker's private lock dir (0700) for the Claude-family lockfiles of its Copilot Chat
/// adapters: `copilot-editors/` beside the broker's socket. Watched as a lock dir.
pub fn editor_lock_dir(config: &Config) -> PathBuf {
    config
        .socket_path()
        .parent()
        .unwrap_or(Path::new("/"))
        .join("copilot-editors")
}

/// The private dir of the copilot door's sockets: `copilot/` beside the broker's socket.
pub fn socket_dir(config: &Config) -> PathBuf {
    config
        .socket_path()
        .parent()
        .unwrap_or(Path::new("/"))
        .join("copilot")
}
