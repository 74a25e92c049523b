//! The `pi-ide-broker` command: parses arguments and wires signals; the work is in the library.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use pi_ide_broker::{client, config::Config, control, daemon, logging};
use std::path::PathBuf;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

/// One daemon between your AI coding-agent sessions and your editors (pi-ide / Claude Code
/// editor protocol): finds every editor, keeps one healthy link to each, and routes each
/// agent session to the editor that has its project open.
#[derive(Parser)]
#[command(version, propagate_version = true)]
struct Cli {
    /// Config file (TOML). A missing file means defaults.
    /// [default: ~/.config/pi-ide-broker/config.toml]
    #[arg(long, global = true, value_name = "FILE", env = "PI_IDE_BROKER_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker in the foreground (what the systemd/launchd service runs).
    ///
    /// Watches the lock dirs (~/.pi/ide, ~/.claude/ide by default), links to every editor,
    /// and serves agent sessions on the Unix socket. SIGTERM/SIGINT stop it gracefully;
    /// SIGHUP reloads the config.
    Daemon,
    /// Show every editor, session and route of the running daemon.
    ///
    /// Exit status 3 when no daemon is running.
    Status {
        /// Print the raw JSON of GET /v1/status instead of the table.
        #[arg(long)]
        json: bool,
    },
}

fn load_config(path: &Option<PathBuf>) -> anyhow::Result<(Config, Option<PathBuf>)> {
    let path = path.clone().or_else(Config::default_path);
    let config = match &path {
        Some(p) => {
            Config::load(p).context("fix the config file, or pass --config with another one")?
        }
        None => Config::default(),
    };
    Ok((config, path))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let (config, config_path) = load_config(&cli.config)?;
    match cli.command {
        Command::Daemon => run_daemon(config, config_path).await,
        Command::Status { json } => {
            let socket = config.socket_path();
            match client::get_json(&socket, "/v1/status").await {
                Ok(status) => {
                    if json {
                        println!("{}", serde_json::to_string_pretty(&status)?);
                    } else {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_secs())
                            .unwrap_or(0);
                        print!("{}", control::render(&status, now));
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(client::ClientError::NotRunning(s)) => {
                    eprintln!(
                        "pi-ide-broker is not running (nothing answers on {s}).\nStart it with `pi-ide-broker daemon`, or install the service with `pi-ide-broker service install`."
                    );
                    Ok(ExitCode::from(3))
                }
                Err(e) => Err(e.into()),
            }
        }
    }
}

async fn run_daemon(config: Config, config_path: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let logs = logging::init(&config);
    let shutdown = CancellationToken::new();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let (handle_tx, mut handle_rx) = tokio::sync::oneshot::channel();
    let stop = shutdown.clone();
    let serving = tokio::spawn(daemon::serve(config, stop, move |_ready, handle| {
        let _ = handle_tx.send(handle);
    }));
    let mut handle: Option<daemon::Handle> = None;
    tokio::pin!(serving);
    loop {
        tokio::select! {
            r = &mut serving => {
                return match r {
                    Ok(Ok(())) => Ok(ExitCode::SUCCESS),
                    Ok(Err(daemon::ServeError::Socket(e @ pi_ide_broker::frontdoor::socket::SocketError::AlreadyRunning { .. }))) => {
                        eprintln!("error: {e}");
                        Ok(ExitCode::FAILURE)
                    }
                    Ok(Err(e)) => Err(e.into()),
                    Err(e) => Err(anyhow::anyhow!("the daemon task failed: {e}")),
                };
            }
            h = &mut handle_rx, if handle.is_none() => { handle = h.ok(); }
            _ = term.recv() => shutdown.cancel(),
            _ = int.recv() => shutdown.cancel(),
            _ = hup.recv() => {
                let Some(h) = &handle else { continue };
                let Some(path) = &config_path else { continue };
                match Config::load(path) {
                    Ok(c) => {
                        if let Err(e) = logs.set_filter(&c.log) {
                            tracing::warn!(error = %e, "log filter not changed");
                        }
                        h.reload(c).await;
                        tracing::info!(config = %path.display(), "config reloaded");
                    }
                    Err(e) => tracing::error!(error = %e, "config reload failed; keeping the running config"),
                }
            }
        }
    }
}
