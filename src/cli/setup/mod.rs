//! `setup`: the service, the pi extension and the MCP entries; recorded, and undone by `--undo`.
//!
//! `pi-ide-broker setup`: one idempotent command after `cargo install`. It installs and starts
//! the user service where a service manager answers, installs the pi extension through `pi
//! install`, prints (and with `--write` adds) the MCP entries for Claude Code, Codex, OpenCode
//! and Gemini CLI, and ends with `doctor`'s verdict. Every change is recorded in the state dir
//! so that `setup --undo` takes back exactly that. A failed step says why and what to do; the
//! others still run.

mod background;
mod command;
pub(crate) mod extension;
mod jsonedit;
pub mod mcp;
pub mod pi;
mod purge;
mod record;
mod steps;
mod undo;

pub use crate::cli::hint::hint;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The lowest pi the extension supports (its `peerDependencies`; the README says the same).
pub const MIN_PI: &str = "0.87.1";

/// What the user asked for.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Add the MCP entries to the clients' files (and run `claude mcp add`).
    pub write: bool,
    /// Show every step, change nothing.
    pub dry_run: bool,
    /// Take back what earlier runs did.
    pub undo: bool,
    /// The pi package source to install instead of the one this build came from.
    pub pi_source: Option<String>,
}

/// Where things are: from the process environment in the CLI, from a test's fresh HOME in tests.
#[derive(Debug, Clone)]
pub struct Env {
    /// `$HOME`.
    pub home: PathBuf,
    /// `$XDG_CONFIG_HOME` or `~/.config`.
    pub config_home: PathBuf,
    /// `$CODEX_HOME`, when set.
    pub codex_home: Option<PathBuf>,
    /// The broker's state dir (the record goes there).
    pub state_dir: PathBuf,
    /// This binary.
    pub exe: PathBuf,
    /// The broker's data dir (setup writes the pi extension there).
    pub data_dir: PathBuf,
    /// `$PATH`.
    pub path: Option<OsString>,
    /// The broker's socket (where a daemon setup starts listens).
    pub socket: PathBuf,
    /// The config file the daemon runs with, when there is one.
    pub config: Option<PathBuf>,
    /// The compat lock dir the daemon publishes its entries in (`~/.pi/ide-broker`).
    pub compat_dir: PathBuf,
    /// The socket the configuration names when no daemon runs (its dir holds the lock).
    pub default_socket: PathBuf,
}

impl Env {
    /// The environment of this process, with the broker's paths from `config` (read from
    /// `config_path`, when that file exists).
    pub fn from_process(config: &crate::sys::config::Config, config_path: Option<PathBuf>) -> Env {
        let state_dir = config.state_dir();
        let home = crate::sys::config::home_dir();
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("pi-ide-broker"));
        Env {
            config_home: var("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config")),
            codex_home: var("CODEX_HOME"),
            home,
            state_dir,
            // Windows' canonical form is verbatim (`\\?\C:\…`): written plainly for `cmd.exe`.
            exe: crate::protocol::winpath::plain_path(std::fs::canonicalize(&exe).unwrap_or(exe)),
            data_dir: config.data_dir(),
            path: std::env::var_os("PATH"),
            socket: config.socket_to_dial(),
            config: config_path.filter(|p| p.exists()),
            compat_dir: crate::frontdoor::compat::CompatConfig::of(config).dir(),
            default_socket: config.socket_path(),
        }
    }

    /// `name` resolved on `PATH`.
    pub fn which(&self, name: &str) -> Option<PathBuf> {
        self.which_all(name).into_iter().next()
    }

    /// Every executable `name` on `$PATH`, in `$PATH`'s order.
    pub fn which_all(&self, name: &str) -> Vec<PathBuf> {
        let Some(path) = self.path.as_ref() else {
            return Vec::new();
        };
        std::env::split_paths(path)
            .map(|d| d.join(name))
            .filter(|p| is_executable(p))
            .collect()
    }

    /// The command an MCP entry runs: `pi-ide-broker` when that is this binary on `PATH`,
    /// else this binary's full path.
    pub fn broker_command(&self) -> String {
        let on_path = self
            .which("pi-ide-broker")
            .and_then(|p| std::fs::canonicalize(p).ok());
        if on_path.as_deref() == Some(self.exe.as_path()) {
            "pi-ide-broker".to_string()
        } else {
            self.exe.display().to_string()
        }
    }

    fn homes(&self) -> mcp::Homes {
        mcp::Homes {
            home: self.home.clone(),
            config_home: self.config_home.clone(),
            codex_home: self.codex_home.clone(),
        }
    }
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| crate::platform::user::is_executable(&m))
}

/// How one step went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Done, or nothing to do.
    Ok,
    /// Shown, not done (a dry run, or an entry to paste).
    Info,
    /// Not done, and that may be fine; the line says what to do.
    Warn,
    /// Failed; the line says why and what to do.
    Fail,
}

/// One line of setup's report.
#[derive(Debug, Clone)]
pub struct Line {
    /// How it went.
    pub level: Level,
    /// The step (`service`, `pi`, `codex`, …).
    pub step: String,
    /// What happened.
    pub message: String,
    /// What to do, when something is left to do.
    pub fix: Option<String>,
}

impl Line {
    fn new(level: Level, step: &str, message: impl Into<String>) -> Line {
        Line {
            level,
            step: step.to_string(),
            message: message.into(),
            fix: None,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Line {
        self.fix = Some(fix.into());
        self
    }

    /// The line as setup prints it.
    pub fn render(&self) -> String {
        let mark = match self.level {
            Level::Ok => "✓",
            Level::Info => "·",
            Level::Warn => "!",
            Level::Fail => "✗",
        };
        let mut s = format!("{mark} {}: {}", self.step, self.message);
        if let Some(f) = &self.fix {
            s.push_str(&format!("\n    → {f}"));
        }
        s
    }
}

/// Runs setup (or its undo); prints each line as it goes and returns them all.
pub fn run(opts: &Options, env: &Env) -> Vec<Line> {
    let mut rec = match record::Record::load(&env.state_dir) {
        Ok(r) => r,
        Err(e) => {
            let l = Line::new(Level::Fail, "record", e);
            println!("{}", l.render());
            return vec![l];
        }
    };
    let mut lines = Vec::new();
    let mut emit = |l: Line| {
        println!("{}", l.render());
        lines.push(l);
    };
    let mut created = Vec::new();
    if opts.undo {
        undo::undo(opts, env, &mut rec, &mut emit);
        created = std::mem::take(&mut rec.created_dirs);
        if rec != record::Record::default() {
            // Something setup did is still there: its record, and the dirs, stay for a rerun.
            rec.created_dirs = std::mem::take(&mut created);
        }
    } else {
        steps::apply(opts, env, &mut rec, &mut emit);
    }
    let saved = opts.dry_run || {
        let saved = rec.save(&env.state_dir);
        if let Err(e) = &saved {
            emit(Line::new(Level::Fail, "record", e.clone()).fix(
                "setup --undo cannot know what this run did; check the state dir's permissions",
            ));
        }
        saved.is_ok()
    };
    if opts.undo && saved && rec == record::Record::default() {
        purge::purge(opts, env, &created, &mut emit);
    }
    lines
}

/// Why no user service manager answers here (systemd's user instance, launchd), or `None`
/// when one does: for the hints that would offer `service install`.
pub fn no_service_manager(env: &Env) -> Option<String> {
    steps::no_manager(crate::cli::service::Manager::here(), env)
}

/// Whether every step went through (no [`Level::Fail`]).
pub fn all_ok(lines: &[Line]) -> bool {
    lines.iter().all(|l| l.level != Level::Fail)
}

/// `setup` (or its undo), then doctor's verdict after a setup; exit status 1 when a step failed.
pub async fn command(
    opts: &Options,
    config: &crate::sys::config::Config,
    config_path: Option<PathBuf>,
) -> anyhow::Result<std::process::ExitCode> {
    use crate::cli::doctor;
    let env = Env::from_process(config, config_path.clone());
    let lines = run(opts, &env);
    if !opts.undo {
        println!("\ndoctor:");
        // The route is explained for the current directory.
        let cwd = std::env::current_dir().unwrap_or_else(|_| env.home.clone());
        let report = doctor::run(&doctor::Options {
            config_path,
            cwd: cwd.clone(),
            key: None,
        })
        .await;
        print!("{}", doctor::render(&report));
        if !report.ok {
            println!("(The route is checked for {}: once an editor has a project open, `{}` there says whether an agent reaches it.)", cwd.display(), hint("doctor"));
        }
    }
    Ok(if all_ok(&lines) {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}
