//! `[gemini]`: the gemini door's section of the config file.

use crate::sys::config::{expand_home, home_dir, node_tmpdir, Config, Section};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The gemini door: one discovery file + loopback MCP endpoint per editor for Gemini CLI.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct GeminiConfig {
    /// Publish discovery files at all.
    pub enabled: bool,
    /// Where they go; `None` means `os.tmpdir()/gemini/ide` as node computes it
    /// (`$TMPDIR`, else `/tmp`), where Gemini CLI looks.
    pub dir: Option<PathBuf>,
    /// Publish a Qwen Code lock file for each editor too (same endpoint).
    pub qwen: bool,
    /// Where Qwen Code looks; `None` means `~/.qwen/ide`.
    pub qwen_dir: Option<PathBuf>,
}

impl Default for GeminiConfig {
    fn default() -> Self {
        GeminiConfig {
            enabled: true,
            dir: None,
            qwen: true,
            qwen_dir: None,
        }
    }
}

impl Section for GeminiConfig {
    const NAME: &'static str = "gemini";
}

impl GeminiConfig {
    /// This door's section of `config`.
    pub fn of(config: &Config) -> GeminiConfig {
        config.section()
    }

    /// The discovery dir (`gemini.dir`, default `os.tmpdir()/gemini/ide`).
    pub fn dir(&self) -> PathBuf {
        match &self.dir {
            Some(p) => expand_home(p),
            None => node_tmpdir().join("gemini").join("ide"),
        }
    }

    /// Qwen Code's lock dir when its files are on (`gemini.qwen_dir`, default `~/.qwen/ide`).
    pub fn qwen_dir(&self) -> Option<PathBuf> {
        if !self.qwen {
            return None;
        }
        Some(match &self.qwen_dir {
            Some(p) => expand_home(p),
            None => home_dir().join(".qwen").join("ide"),
        })
    }
}
