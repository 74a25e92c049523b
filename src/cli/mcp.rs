//! `mcp`: the stdio MCP door (`frontdoor::mcp`) run with the command line's options.

use crate::frontdoor::mcp;
use crate::sys::{config::Config, logging};
use std::path::PathBuf;

/// `mcp`: the stdio door for MCP clients (Claude Code, Codex, pi's MCP adapter), with the
/// command line's options; exit status 1 when no daemon could be reached.
pub(super) async fn command(
    config: Config,
    config_path: Option<PathBuf>,
    cwd: Option<PathBuf>,
    session: Option<String>,
    dialect: String,
    remote: Option<String>,
    no_spawn: bool,
) -> anyhow::Result<std::process::ExitCode> {
    // stdout is the protocol: logs go to stderr, quiet by default.
    let mut quiet = config.clone();
    if std::env::var_os("RUST_LOG").is_none() {
        quiet.log = "warn".into();
    }
    logging::init(&quiet);
    let cwd = super::cwd_or_current(cwd)?;
    let opts = mcp::Options {
        socket: config.socket_to_dial(),
        cwd: cwd.display().to_string(),
        key: Some(session.unwrap_or_else(mcp::default_key)),
        dialect,
        spawn: !no_spawn,
        config: config_path.filter(|p| p.exists()),
        log_dir: config.state_dir(),
        max_line: config.max_frame_bytes,
        remote,
    };
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());
    match mcp::run(opts, stdin, tokio::io::stdout()).await {
        Ok(()) => Ok(std::process::ExitCode::SUCCESS),
        Err(mcp::StdioError::Reported) => Ok(std::process::ExitCode::FAILURE),
        Err(e) => Err(e.into()),
    }
}
