//! The CLI process: one module per command; may use every layer, nothing below uses it.
//!
//! The commands, one module each (`daemon` runs the broker in this process; every other one
//! is a client of it), the socket's HTTP client, the stdio MCP door (`mcp`), which dials the
//! daemon like any agent, and the ACP door (`acp`), which follows a pi session through it; the
//! two stdio doors share `lines`. May use every layer; nothing below uses it.

mod acp;
pub mod args;
mod daemon;
mod doctor;
pub mod hint;
mod mcp;
mod paths;
mod remote;
pub mod service;
pub mod setup;
mod status;
mod stop;

use crate::sys::config::Config;
use anyhow::Context as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// The config file (`--config`, else the default path) and what it says; a missing file is
/// the defaults.
pub fn load_config(path: &Option<PathBuf>) -> anyhow::Result<(Config, Option<PathBuf>)> {
    let path = path.clone().or_else(Config::default_path);
    let config = match &path {
        Some(p) => Config::load(p, &crate::frontdoor::sections())
            .context("fix the config file, or pass --config with another one")?,
        None => Config::default(),
    };
    Ok((crate::frontdoor::with_door_lock_dirs(config), path))
}

/// `--cwd` made absolute, else the current directory.
pub fn cwd_or_current(cwd: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match cwd {
        Some(c) => std::path::absolute(&c).with_context(|| format!("--cwd {}", c.display())),
        None => std::env::current_dir().context("cannot read the current directory; pass --cwd"),
    }
}

/// Says that no daemon answers and how to start one; exit status 3.
pub fn not_running(socket: &str) -> ExitCode {
    // Offer the service only where a service manager would take it (doctor says the same).
    let env = crate::cli::setup::Env::from_process(&Config::default(), None);
    let hint = crate::cli::hint::hint;
    let service = match crate::cli::setup::no_service_manager(&env) {
        None => format!(
            ", or install the service with `{}`",
            hint("service install")
        ),
        Some(_) => {
            " (no user service manager answers here, so there is no service to install)".into()
        }
    };
    eprintln!(
        "pi-ide-broker is not running (nothing answers on {socket}).\nStart it with `{}`{service}.",
        hint("daemon")
    );
    ExitCode::from(3)
}
