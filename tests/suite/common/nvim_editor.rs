//! Real editors for the suite: pi-ide.nvim (the pi family) and claudecode.nvim (the Claude
//! family), each in a headless Neovim whose lockfile lands in the test broker's lock dir, for
//! the tests where a real editor does what a fake one would (a diff accepted or rejected as a
//! user does it, the selection, an editor that quits, restarts or dies). A fake stays where a
//! test needs what no real editor does (a wrong token, a half-written lockfile, pings left
//! unanswered, a misbehaving frame).
//!
//! Neovim and the plugins come from `.ci/run` (`PI_IDE_BROKER_NVIM`,
//! `PI_IDE_BROKER_PI_IDE_NVIM`, `PI_IDE_BROKER_CLAUDECODE_NVIM`); without them,
//! [`super::nvim_plugins::neovim_with`] says why and [`NvimEditor::start`] gives `None`.

use super::broker::TestBroker;
use super::nvim::{lua_str, Nvim};
use std::path::{Path, PathBuf};

/// Which plugin serves the editor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plugin {
    /// ldelossa/pi-ide.nvim: a pi-family editor (lockfile in `$PI_IDE_LOCK_DIR`).
    PiIde,
    /// coder/claudecode.nvim: a Claude-family editor (lockfile in `$CLAUDE_CONFIG_DIR/ide`).
    ClaudeCode,
}

impl Plugin {
    fn var(self) -> &'static str {
        match self {
            Plugin::PiIde => "PI_IDE_BROKER_PI_IDE_NVIM",
            Plugin::ClaudeCode => "PI_IDE_BROKER_CLAUDECODE_NVIM",
        }
    }

    fn driver(self) -> PathBuf {
        let dir = match self {
            Plugin::PiIde => "pi_ide_nvim",
            Plugin::ClaudeCode => "claudecode_nvim",
        };
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(dir)
            .join("driver.lua")
    }
}

/// A real editor: Neovim with [`Plugin`] serving, in its folder.
pub struct NvimEditor {
    /// The Neovim, to call its driver (`tests/fixtures/<plugin>/driver.lua`).
    pub nv: Nvim,
    /// The plugin serving it.
    pub plugin: Plugin,
    /// The port its server listens on (its lockfile's name).
    pub port: u16,
    /// What it was started with, to start it again.
    start: Start,
}

/// What [`NvimEditor::start`] was given.
struct Start {
    nvim: PathBuf,
    rtp: PathBuf,
    root: PathBuf,
    folder: PathBuf,
    name: String,
    env: Vec<(&'static str, PathBuf)>,
    /// How many times it was started: each run listens on a socket of its own.
    runs: u32,
}

impl NvimEditor {
    /// Neovim in `folder` with `plugin` serving, its lockfile in `b`'s lock dir of that
    /// family, once the plugin listens; `name` keeps its socket and files apart from other
    /// editors of the test. `None` (said) without Neovim or the plugin.
    pub async fn start(
        b: &TestBroker,
        plugin: Plugin,
        folder: &Path,
        name: &str,
    ) -> Option<NvimEditor> {
        let (nvim, mut rtp) = super::nvim_plugins::neovim_with("nvim_editor", &[plugin.var()])?;
        let root = b.dir.path().join(format!("nvim-{name}"));
        std::fs::create_dir_all(&root).expect("mkdir the editor's dir");
        let mut env = vec![
            ("HOME", root.join("home")),
            ("XDG_STATE_HOME", root.join("state")),
            ("XDG_CACHE_HOME", root.join("cache")),
            ("XDG_DATA_HOME", root.join("data")),
        ];
        match plugin {
            Plugin::PiIde => env.push(("PI_IDE_LOCK_DIR", b.pi_dir.clone())),
            Plugin::ClaudeCode => {
                let config = root.join("claude-config");
                std::fs::create_dir_all(&config).expect("mkdir CLAUDE_CONFIG_DIR");
                std::os::unix::fs::symlink(&b.claude_dir, config.join("ide"))
                    .expect("link the lock dir");
                env.push(("CLAUDE_CONFIG_DIR", config));
            }
        }
        let start = Start {
            nvim,
            rtp: rtp.pop()?,
            root,
            folder: folder.to_path_buf(),
            name: name.to_string(),
            env,
            runs: 0,
        };
        Some(Self::launch(plugin, start).await)
    }

    async fn launch(plugin: Plugin, mut start: Start) -> NvimEditor {
        start.runs += 1;
        let env: Vec<(&str, PathBuf)> = start.env.iter().map(|(k, v)| (*k, v.clone())).collect();
        let nv = Nvim::start(
            &start.nvim,
            &start.root.join(format!("nvim-{}.sock", start.runs)),
            std::slice::from_ref(&start.rtp),
            &[plugin.driver()],
            &start.folder,
            &env,
        )
        .await;
        nv.until(&format!("{} started", start.name), "start()", |s| s == "ok")
            .await;
        let port = nv
            .until(&format!("{}'s port", start.name), "port()", |s| {
                !s.is_empty()
            })
            .await;
        let port = port.parse().unwrap_or_else(|_| panic!("a port: {port}"));
        NvimEditor {
            nv,
            plugin,
            port,
            start,
        }
    }

    /// Quits this Neovim as a user does (`:qa!`), then starts it again in the same folder:
    /// a new process on a new port (the next run's socket).
    pub async fn restart(self) -> NvimEditor {
        let NvimEditor {
            nv, plugin, start, ..
        } = self;
        nv.quit().await;
        Self::launch(plugin, start).await
    }

    /// Kills this Neovim at once (SIGKILL: the editor dies, its lockfile stays behind).
    pub async fn kill(self) {
        self.nv.kill().await;
    }

    /// Calls the driver's `pending()` until `done` holds for it (the waiting diffs).
    pub async fn pending_until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        self.nv.until(what, "pending()", done).await
    }

    /// Accepts the diff shown for `file` as a user does (pi-ide.nvim: the proposed buffer
    /// edited to `text` unless it is empty, then `:w`; claudecode.nvim: `:ClaudeCodeDiffAccept`
    /// on the diff whose tab name holds `tab`, as proposed).
    pub async fn accept(&self, file: &Path, tab: &str, text: &str) {
        let call = match self.plugin {
            Plugin::PiIde => format!(
                "accept({}, {})",
                lua_str(&file.display().to_string()),
                lua_str(text)
            ),
            Plugin::ClaudeCode => format!("decide({}, 'Accept')", lua_str(tab)),
        };
        assert_eq!(self.nv.call(&call).await, "ok", "{call}");
    }

    /// Rejects the diff shown for `file` as a user does (pi-ide.nvim: its window closed;
    /// claudecode.nvim: `:ClaudeCodeDiffDeny` on the diff whose tab name holds `tab`).
    pub async fn reject(&self, file: &Path, tab: &str) {
        let call = match self.plugin {
            Plugin::PiIde => format!("reject({})", lua_str(&file.display().to_string())),
            Plugin::ClaudeCode => format!("decide({}, 'Deny')", lua_str(tab)),
        };
        assert_eq!(self.nv.call(&call).await, "ok", "{call}");
    }

    /// Opens `file` and selects its line `line` (1-based); the plugin tells the selection.
    pub async fn select(&self, file: &Path, line: u32) {
        let call = format!("select({}, {line})", lua_str(&file.display().to_string()));
        assert_eq!(self.nv.call(&call).await, "ok", "{call}");
    }

    /// Opens `file` and selects the first word of its line `line` (1-based, charwise): the
    /// plugin tells its clients, the word as the selection's text (pi-ide.nvim sends only the
    /// first character of a linewise `V` line: [`NvimEditor::select`]).
    pub async fn select_word(&self, file: &Path, line: u32) {
        let call = format!(
            "select_word({}, {line})",
            lua_str(&file.display().to_string())
        );
        assert_eq!(self.nv.call(&call).await, "ok", "{call}");
    }

    /// Opens `file` with the cursor on line `line` (1-based), nothing selected; the plugin
    /// tells where the cursor is.
    pub async fn cursor(&self, file: &Path, line: u32) {
        let call = format!("cursor({}, {line})", lua_str(&file.display().to_string()));
        assert_eq!(self.nv.call(&call).await, "ok", "{call}");
    }

    /// Gives `file` a diagnostic on line `line` (1-based) as a language server would
    /// (`severity`: "ERROR", "WARN", "INFO", "HINT"); pi-ide.nvim only.
    pub async fn diagnose(&self, file: &Path, line: u32, message: &str, severity: &str) {
        let call = format!(
            "diagnose({}, {line}, {}, {})",
            lua_str(&file.display().to_string()),
            lua_str(message),
            lua_str(severity)
        );
        assert_eq!(self.nv.call(&call).await, "ok", "{call}");
    }

    /// What Neovim printed (the plugin's messages), for a failure's message.
    pub fn printed(&self) -> String {
        self.nv.printed()
    }
}
