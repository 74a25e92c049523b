//! The command line: every command's arguments, and the dispatch of a parsed command.
//!
//! The clap tree is also `--help`, the completions and the man page; a parsed command goes to
//! its module.

use crate::cli::{self, service};
use crate::sys::config::Config;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// One daemon between your AI coding-agent sessions and your editors (pi-ide / Claude Code
/// editor protocol): finds every editor, keeps one healthy link to each, and routes each
/// agent session to the editor that has its project open.
#[derive(Parser)]
#[command(
    version = VERSION,
    propagate_version = true,
    after_help = "\
Environment:
  PI_IDE_LOCK_DIR        pi-family lock dir (default ~/.pi/ide)
  CLAUDE_CONFIG_DIR      Claude-family lock dir is $CLAUDE_CONFIG_DIR/ide (default ~/.claude/ide)
  PI_IDE_BROKER_SOCKET   the broker's socket (default $XDG_RUNTIME_DIR/pi-ide-broker/sock)
  PI_IDE_BROKER_CONFIG   the config file (same as --config)
  RUST_LOG               log filter (overrides the config's `log`)

Quick start: `pi-ide-broker daemon` in one terminal, `pi-ide-broker status` in another.
Something wrong? `pi-ide-broker doctor` checks everything and says what to fix.
First time? `pi-ide-broker setup` installs the service and the pi extension (which this binary
carries) and prints the MCP entries for Claude Code, Codex, OpenCode and Gemini CLI;
`pi-ide-broker stop` stops a running daemon. The published pi-ide extension reaches the broker with `PI_IDE_LOCK_DIR=~/.pi/ide-broker pi`."
)]
pub struct Cli {
    /// Config file (TOML). A missing file means defaults.
    /// [default: ~/.config/pi-ide-broker/config.toml]
    #[arg(long, global = true, value_name = "FILE", env = "PI_IDE_BROKER_CONFIG")]
    pub config: Option<PathBuf>,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The version and the commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("PI_IDE_BROKER_COMMIT"),
    ")"
);

/// The commands.
#[derive(Subcommand)]
pub enum Command {
    /// Run the broker in the foreground (what the systemd/launchd service runs).
    ///
    /// Watches the lock dirs (~/.pi/ide, ~/.claude/ide by default), links to every editor,
    /// and serves agent sessions on the Unix socket (a named pipe on Windows). SIGTERM/SIGINT
    /// stop it gracefully (`stop`); SIGHUP reloads the config (`reload`). Exit status 4 when
    /// another daemon holds the socket (running, or still stopping), 75 when it stopped
    /// because its binary was replaced (the service manager starts the new one), 1 on any
    /// other failure.
    Daemon,
    /// Serve MCP over stdin/stdout for any MCP client (pi, Claude Code, Codex, OpenCode).
    ///
    /// Offers the tools of the editor that has the working directory open, plus
    /// `list_editors` and `editor_context`. Starts the daemon when none is running.
    Mcp {
        /// The session's working directory [default: the current directory].
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// Sticky key: sessions with the same key return to the same editor
        /// [default: the parent process id].
        #[arg(long, value_name = "KEY")]
        session: Option<String>,
        /// The protocol family the client speaks.
        #[arg(long, default_value = "pi", value_parser = ["pi", "claude"])]
        dialect: String,
        /// This client runs on the `[[remote]]` of that name (a container, a dev box): its
        /// paths are mapped to this machine's and back.
        #[arg(long, value_name = "NAME")]
        remote: Option<String>,
        /// Never start the daemon (fail if it is not running).
        #[arg(long, env = "PI_IDE_BROKER_NO_SPAWN", value_parser = clap::builder::BoolishValueParser::new(), num_args = 0, default_missing_value = "true", default_value = "false")]
        no_spawn: bool,
    },
    /// Serve the Agent Client Protocol on stdin/stdout: an ACP editor follows a running pi.
    ///
    /// For Zed (`agent_servers`), CodeCompanion.nvim, agentic.nvim and other ACP clients,
    /// which spawn it. A new thread follows the pi session working in the editor's folder
    /// (the most recently active; `session/load` picks another): pi's transcript streams
    /// into the thread, a message typed there is sent to pi as if typed in its terminal, and
    /// pi's writes are offered there for review while a turn is open. A first message
    /// `follow` opens a turn that only watches. Needs a running daemon and a pi session with
    /// the extension; it starts neither.
    Acp,
    /// Set everything up after an install: the service, the pi extension, the MCP entries.
    ///
    /// Installs and starts the user service where systemd or launchd answers; installs the pi
    /// extension when pi is on PATH (the one this binary carries, written to the data dir and
    /// installed from there; `pi --help` then shows whether pi loads it); prints the MCP entries for Claude Code, Codex, OpenCode and Gemini CLI
    /// (`--write` adds them, next to what is there); ends with `doctor`'s verdict. Safe to run
    /// again. What it changed is recorded in the state dir, and `--undo` takes back exactly that.
    Setup {
        /// Also add the MCP entries to the clients' config files (and run `claude mcp add`).
        #[arg(long)]
        write: bool,
        /// Show every step, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Take back what earlier `setup` runs did, and nothing else.
        #[arg(long, conflicts_with = "write")]
        undo: bool,
        /// The pi package to install instead of the one this binary carries (e.g.
        /// `npm:pi-ide-broker`, `git:<url>@<tag>`, a folder).
        #[arg(long, value_name = "SOURCE")]
        pi_source: Option<String>,
    },
    /// Install, remove or inspect the user service (systemd on Linux, launchd on macOS).
    Service {
        /// What to do with the service.
        #[command(subcommand)]
        action: ServiceAction,
        /// The service manager to write for and call: launchd on macOS, systemd elsewhere by
        /// default (another one prepares or shows a unit for another machine).
        #[arg(long, value_enum, global = true)]
        manager: Option<ManagerArg>,
    },
    /// Check everything between an agent and its editor, and say what to fix.
    ///
    /// The daemon, the service unit, the socket, the config file, every lock dir and every
    /// lockfile in it (with why a refused one is refused), the compat dir, and the route of a
    /// working directory: its candidates ranked with reasons, and the decision. Exit status 0
    /// when everything needed works, 1 otherwise.
    Doctor {
        /// The working directory whose route is explained [default: the current directory].
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// Explain the route for this sticky key too.
        #[arg(long, value_name = "KEY")]
        session: Option<String>,
        /// Print the report as JSON (for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    ///
    /// bash: `pi-ide-broker completions bash > ~/.local/share/bash-completion/completions/pi-ide-broker`;
    /// zsh: into a dir on $fpath as `_pi-ide-broker`; fish: `~/.config/fish/completions/pi-ide-broker.fish`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), generated from the same definitions as --help.
    ///
    /// `pi-ide-broker man > ~/.local/share/man/man1/pi-ide-broker.1`, then `man pi-ide-broker`.
    Man,
    /// Print how to reach this broker from a container or another machine.
    ///
    /// Each [[remote]] has a socket of its own that carries an agent's rights only (its own
    /// sessions, on the editor of its own folder): this prints it, with the `ssh -R` forward,
    /// the `docker run -v` mount of its dir, the devcontainer.json mount and the
    /// PI_IDE_BROKER_SOCKET to set on the other side. The main socket is never for another host
    /// or a container. Exit status 2 when no such [[remote]] is configured. See
    /// docs/configuration.md, "Agents in containers, WSL and over SSH".
    Remote {
        /// Only this `[[remote]]` (default: every one).
        name: Option<String>,
        /// The forwarded socket's path on the other host (`ssh -R`).
        #[arg(long, value_name = "PATH", default_value = "/tmp/pi-ide-broker.sock")]
        remote_socket: PathBuf,
        /// Where a container mounts the socket's dir.
        #[arg(long, value_name = "DIR", default_value = "/run/pi-ide-broker")]
        mount_dir: PathBuf,
    },
    /// Print where this configuration puts the socket, the state and the daemon log.
    ///
    /// For clients that start or dial the daemon themselves (the pi extension), so they
    /// resolve paths exactly as the daemon does.
    Paths {
        /// Print one JSON object instead of `name: path` lines.
        #[arg(long)]
        json: bool,
    },
    /// Stop the running daemon gracefully (SIGTERM; its stop event on Windows), however it was
    /// started.
    ///
    /// Pending diffs are answered and sessions told, as on any graceful stop; waits until
    /// nothing answers on the socket. A user service starts it again at the next login
    /// (`service uninstall` removes the service). Nothing running is not an error.
    Stop,
    /// Ask the running daemon to read its config file again (SIGHUP on Unix).
    ///
    /// The same as `systemctl --user reload pi-ide-broker`; on Windows the only way. The
    /// daemon's log says what changed or why the file was refused (the running config stays).
    /// Exit status 1 when no daemon is running.
    Reload,
    /// Show every editor, session and route of the running daemon.
    ///
    /// Exit status 3 when no daemon is running.
    Status {
        /// Print the raw JSON of GET /v1/status instead of the table.
        #[arg(long)]
        json: bool,
        /// Keep watching: redraw the table on every change (a terminal), or print one line
        /// per change (a pipe or file). Driven by GET /v1/events; Ctrl-C ends it.
        #[arg(long, conflicts_with = "json")]
        watch: bool,
    },
}

/// `--manager` of `service`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ManagerArg {
    /// systemd user units (Linux).
    Systemd,
    /// launchd LaunchAgents (macOS).
    Launchd,
    /// The user's Run key, at logon (Windows).
    RunKey,
}

/// What `service` does.
#[derive(Subcommand)]
pub enum ServiceAction {
    /// Write the unit for this binary and start it now and at every login.
    Install {
        /// Print what would be written and run, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Have the service run with this config file (written into the unit; made absolute).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Stop the service and remove its unit.
    Uninstall {
        /// Print what would be removed and run, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show the service manager's view of the service.
    Status,
}

/// The command, dispatched to its module in `cli`.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // doctor reads the config itself: a broken file is one of the things it reports.
    if let Command::Doctor { cwd, session, json } = cli.command {
        let path = cli.config.clone().or_else(Config::default_path);
        return cli::doctor::command(path, cwd, session, json).await;
    }
    let (config, config_path) = cli::load_config(&cli.config)?;
    match cli.command {
        Command::Daemon => cli::daemon::run(config, config_path).await,
        Command::Mcp {
            cwd,
            session,
            dialect,
            remote,
            no_spawn,
        } => cli::mcp::command(config, config_path, cwd, session, dialect, remote, no_spawn).await,
        Command::Acp => cli::acp::command(config).await,
        Command::Service { action, manager } => service::command(
            match action {
                ServiceAction::Install { dry_run, config } => {
                    service::Action::Install { dry_run, config }
                }
                ServiceAction::Uninstall { dry_run } => service::Action::Uninstall { dry_run },
                ServiceAction::Status => service::Action::Status,
            },
            match manager {
                None => service::Manager::here(),
                Some(ManagerArg::Systemd) => service::Manager::Systemd,
                Some(ManagerArg::Launchd) => service::Manager::Launchd,
                Some(ManagerArg::RunKey) => service::Manager::RunKey,
            },
        ),
        Command::Setup {
            write,
            dry_run,
            undo,
            pi_source,
        } => {
            let opts = cli::setup::Options {
                write,
                dry_run,
                undo,
                pi_source,
            };
            cli::setup::command(&opts, &config, config_path).await
        }
        Command::Remote {
            name,
            remote_socket,
            mount_dir,
        } => Ok(cli::remote::command(
            &config,
            config_path.as_deref(),
            name.as_deref(),
            cli::remote::There {
                ssh: &remote_socket,
                mount: &mount_dir,
            },
        )),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "pi-ide-broker", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => man_cmd(),
        // Handled above, before the config is loaded.
        Command::Doctor { .. } => Ok(ExitCode::FAILURE),
        Command::Paths { json } => Ok(cli::paths::command(&config, config_path, json)),
        Command::Status { watch: true, .. } => cli::status::watch(&config.socket_to_dial()).await,
        Command::Status { json, .. } => cli::status::command(&config, json).await,
        Command::Stop => cli::stop::command(&config).await,
        Command::Reload => cli::stop::reload(&config).await,
    }
}

/// `man`: the man page on stdout (a closed pipe is no error).
fn man_cmd() -> anyhow::Result<ExitCode> {
    let cmd = <Cli as clap::CommandFactory>::command();
    match clap_mangen::Man::new(cmd).render(&mut std::io::stdout()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("cannot write the man page to stdout"))
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}
