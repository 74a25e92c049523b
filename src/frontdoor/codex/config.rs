//! `[codex]`: the codex door's section of the config file.

use crate::sys::config::{expand_home, Config, Section};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The codex door: the broker serves Codex's `/ide` hub socket for the user's editors.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CodexConfig {
    /// Serve the hub at all.
    pub enabled: bool,
    /// The socket; `None` means Codex's own, `$TMPDIR/codex-ipc/ipc-<uid>.sock`.
    pub socket: Option<PathBuf>,
}

impl Default for CodexConfig {
    fn default() -> Self {
        CodexConfig {
            enabled: true,
            socket: None,
        }
    }
}

impl Section for CodexConfig {
    const NAME: &'static str = "codex";
}

impl CodexConfig {
    /// This door's section of `config`.
    pub fn of(config: &Config) -> CodexConfig {
        config.section()
    }

    /// Codex's `/ide` hub socket (`codex.socket`, default `$TMPDIR/codex-ipc/ipc-<uid>.sock`
    /// as Codex computes it: Rust's `temp_dir`; Windows' pipe `\\.\pipe\codex-ipc`).
    pub fn socket(&self) -> PathBuf {
        match &self.socket {
            Some(p) => expand_home(p),
            None if cfg!(windows) => PathBuf::from(r"\\.\pipe\codex-ipc"),
            None => std::env::temp_dir()
                .join("codex-ipc")
                .join(format!("ipc-{}.sock", crate::platform::user::uid())),
        }
    }
}
